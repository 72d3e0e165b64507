"""The group cache's probe kernel (_native.pair_find) equals its numpy fallback."""

from __future__ import annotations

import numpy as np
import pytest

from ember import _native
from ember.tiers.key_index import KeyIndex

pytestmark = pytest.mark.skipif(not _native.is_available(), reason="the native core is not built (or EMBER_NATIVE=0)")


def test_native_pair_find_equals_the_numpy_one():
    rng = np.random.default_rng(0)
    m = 500
    idx = KeyIndex(64)
    ids = rng.choice(np.arange(-10_000, 10_000), 400, replace=False).astype(np.int64)
    salt = rng.integers(0, 3, 400).astype(np.int64) * np.int64(0x9E3779B97F4A7C15 - 2**64)
    slot_id = np.zeros(m, np.int64)
    slots = rng.choice(m, 300, replace=False).astype(np.int64)
    idx.insert(ids[:300] ^ salt[:300], slots.astype(np.int32))
    slot_id[slots] = ids[:300]
    slot_id[slots[:20]] += 1  # these keys now belong to another pair: -2
    query = np.concatenate([ids, rng.integers(20_000, 30_000, 50)])
    qsalt = np.concatenate([salt, np.zeros(50, np.int64)])
    outs, states = [], []
    for fn in (_native.pair_find, _native._pair_find_py):
        count, last, held = np.zeros(m, np.int64), np.zeros(m, np.int64), np.zeros(m, np.int32)
        out = np.empty(query.size, np.int64)
        hits = fn(idx.keys, idx.slots, query, qsalt, slot_id, count, last, held, 7, out)
        outs.append((hits, out))
        states.append((count, last, held))
    assert outs[0][0] == outs[1][0] == 280
    assert np.array_equal(outs[0][1], outs[1][1])
    assert (outs[0][1][:20] == -2).all() and (outs[0][1][300:] == -1).all()
    for a, b in zip(*states):
        assert np.array_equal(a, b)
    assert states[0][0].sum() == 280 and (states[0][1][states[0][2] > 0] == 7).all()


def test_pair_find_split_over_threads_equals_one_call(monkeypatch):
    """Many keys are probed in ranges on several threads: the same slots, hits and counters as
    one call over all of them (each hit's slot is touched by the one thread that owns its key)."""
    rng = np.random.default_rng(1)
    m = 5_000
    idx = KeyIndex(2 * m)
    ids = rng.choice(10**9, m, replace=False).astype(np.int64)
    slot_of = rng.permutation(m).astype(np.int64)
    idx.insert(ids, slot_of.astype(np.int32))
    slot_id = np.zeros(m, np.int64)
    slot_id[slot_of] = ids
    slot_id[slot_of[:50]] += 1  # taken by another pair: -2
    query = np.concatenate([rng.permutation(ids)[:3_000], rng.integers(2 * 10**9, 3 * 10**9, 1_000)])
    salt = np.zeros(query.size, np.int64)
    runs = []
    for least in (10**9, 64):  # one part; ranges of >= 64 keys on every thread torch may use
        monkeypatch.setattr(_native, "MIN_PART_ROWS", least)
        count, last, held = np.zeros(m, np.int64), np.zeros(m, np.int64), np.zeros(m, np.int32)
        out = np.full(query.size, -7, np.int64)
        hits = _native.pair_find(idx.keys, idx.slots, query, salt, slot_id, count, last, held, 5, out)
        runs.append((hits, out, count, last, held))
    assert _native.part_count(query.size) > 1 or _native.torch.get_num_threads() == 1 or not _native.native_parts()
    (h1, o1, *s1), (h2, o2, *s2) = runs
    assert h1 == h2 == int((o1 >= 0).sum()) > 2_000
    assert np.array_equal(o1, o2) and (o1 >= -2).all()
    for a, b in zip(s1, s2):
        assert np.array_equal(a, b)
