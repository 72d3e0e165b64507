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


@pytest.mark.parametrize("fn", [_native.probe_rows, _native._probe_rows_py])
def test_probe_rows_removing_takes_the_found_ids_out_of_each_index(fn):
    if fn is _native.probe_rows and not _native.is_available():
        pytest.skip("the native core is not built (or EMBER_NATIVE=0)")
    idx, queries, flat, bounds = _tiers(np.random.default_rng(5))
    before = np.concatenate([ix.lookup(q).astype(np.int64) for ix, q in zip(idx, queries)])
    out = np.full(flat.size, -7, np.int64)
    found = fn([(ix.keys, ix.slots) for ix in idx], flat, bounds, out, True)
    assert np.array_equal(out, before) and found == int((before >= 0).sum())  # the slots they held
    for ix, q in zip(idx, queries):
        assert (ix.lookup(q) == -1).all()  # gone from every index


def test_host_tiers_removed_in_one_pass_equal_one_remove_each():
    """HostTier.remove_native (a group cache's admissions leaving the slower tiers) leaves every
    tier as its own remove does: index, free slots, held flags, size; and a later insert reuses
    the freed slots the same way."""
    import torch

    from ember.tiers.host import HostTier

    states = []
    for one_pass in (False, True):
        rng = np.random.default_rng(6)  # the same tiers and IDs both times
        tiers = [HostTier(record_dim=3) for _ in range(3)]
        keep = []
        for j, t in enumerate(tiers):
            ids = torch.from_numpy(np.arange(j * 1000, j * 1000 + 200, dtype=np.int64))
            t.put(ids, torch.full((200, 3), float(j)))
            keep.append(torch.from_numpy(np.sort(rng.permutation(ids.numpy())[: 20 * j + 5])))
        gone = [k[: k.numel() // 2] for k in keep]
        gone[1] = torch.cat([gone[1], torch.tensor([-5, 10**9])])  # absent IDs too
        if one_pass:
            found = HostTier.remove_native(tiers, gone)
        else:
            found = np.concatenate([t.remove(i).numpy() for t, i in zip(tiers, gone)])
        for t in tiers:
            t.put(torch.tensor([7_000_001, 7_000_002]), torch.ones(2, 3))  # reuses freed slots
        states.append((found, [(len(t), t._free.tolist(), t._held.copy(), t.slots_of(torch.arange(-5, 3000)).numpy())
                               for t in tiers]))
    (f1, s1), (f2, s2) = states
    assert np.array_equal(f1, f2) and f1.sum() == sum(k.numel() // 2 for k in keep)
    for a, b in zip(s1, s2):
        assert a[0] == b[0] and a[1] == b[1] and np.array_equal(a[2], b[2]) and np.array_equal(a[3], b[3])


def test_a_write_after_its_read_probes_no_tier_again(monkeypatch):
    """A lookup's write-back (the IDs its read probed, the same tensors) takes the slots the read
    left; only tiers whose IDs were not read are probed (one pass for them)."""
    import torch

    from ember.tiers.host import HostTier

    tiers = [HostTier(record_dim=2) for _ in range(3)]
    ids = [torch.arange(j * 100, j * 100 + 50) for j in range(3)]
    for t, i in zip(tiers, ids):
        t.put(i[:30], torch.zeros(30, 2))
    out = torch.empty(150, 2)
    HostTier.read_native(tiers, ids, out)
    calls = []
    real = _native.probe_rows
    monkeypatch.setattr(_native, "probe_rows", lambda tables, *a: calls.append(len(tables)) or real(tables, *a))
    assert HostTier.write_segments_native(tiers, ids, torch.ones(150, 2))
    assert calls == []
    other = [torch.arange(j * 100 + 40, j * 100 + 60) for j in range(3)]
    other[1] = ids[1]  # read before: its slots are known
    assert HostTier.write_segments_native(tiers, other, torch.full((90, 2), 2.0))
    assert calls == [2]
    for t, i in zip(tiers, other):
        got = torch.empty(i.numel(), 2)
        assert t.get_into(i, got).all() and (got == 2.0).all()
