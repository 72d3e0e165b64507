"""Several tiers' probe in one pass (_native.probe_rows, a table group's write) equals each tier's
own probe, compiled and numpy alike, and names a bad call."""

from __future__ import annotations

import numpy as np
import pytest

from ember import _native
from ember.tiers.key_index import KeyIndex


def _tiers(rng: np.random.Generator) -> tuple[list[KeyIndex], list[np.ndarray], np.ndarray, np.ndarray]:
    idx, queries = [], []
    for size in (0, 300, 5, 1200):  # one tier empty, one tiny
        ix = KeyIndex(max(2 * size, 8))
        held = rng.choice(10**6, size, replace=False).astype(np.int64)
        if size:
            ix.insert(held, rng.permutation(size).astype(np.int32))
            ix.remove(held[: size // 10])  # deleted buckets on the probe paths
        q = np.concatenate([held, rng.integers(-10**6, 0, size // 2 + 3)])  # + absent IDs (negative too)
        idx.append(ix)
        queries.append(rng.permutation(q))
    bounds = np.concatenate([[0], np.cumsum([q.size for q in queries])]).astype(np.int64)
    return idx, queries, np.concatenate(queries), bounds


@pytest.mark.parametrize("fn", [_native.probe_rows, _native._probe_rows_py])
def test_probe_rows_equals_each_tiers_own_lookup(fn):
    if fn is _native.probe_rows and not _native.is_available():
        pytest.skip("the native core is not built (or EMBER_NATIVE=0)")
    idx, queries, flat, bounds = _tiers(np.random.default_rng(3))
    out = np.full(flat.size, -7, np.int64)
    found = fn([(ix.keys, ix.slots) for ix in idx], flat, bounds, out)
    want = np.concatenate([ix.lookup(q).astype(np.int64) for ix, q in zip(idx, queries)])
    assert np.array_equal(out, want) and found == int((want >= 0).sum()) > 1000
    assert (want[bounds[1] : bounds[2]] == -1).sum() > 0  # absent and removed IDs answer -1


@pytest.mark.parametrize("fn", [_native.probe_rows, _native._probe_rows_py])
def test_probe_rows_bad_calls_raise(fn):
    if fn is _native.probe_rows and not _native.is_available():
        pytest.skip("the native core is not built (or EMBER_NATIVE=0)")
    idx, _, flat, bounds = _tiers(np.random.default_rng(4))
    tables = [(ix.keys, ix.slots) for ix in idx]
    with pytest.raises(ValueError, match="bounds"):
        fn(tables, flat, bounds[:-1], np.empty(flat.size, np.int64))
    with pytest.raises(ValueError, match="out_slot"):
        fn(tables, flat, bounds, np.empty(flat.size - 1, np.int64))
