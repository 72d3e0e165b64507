"""KeyIndex against a Python dict over random inserts, lookups and removals."""

from __future__ import annotations

import numpy as np
import pytest

from ember.tiers.key_index import KeyIndex


def test_random_ops_match_dict():
    rng = np.random.default_rng(1)
    idx, ref = KeyIndex(16), {}
    next_slot = 0
    pool = rng.integers(-(2**63), 2**63 - 1, size=20000)
    for step in range(60):
        batch = np.unique(rng.choice(pool, size=700))
        got = idx.lookup(batch)
        want = np.array([ref.get(int(k), -1) for k in batch])
        np.testing.assert_array_equal(got, want)
        new = batch[got < 0]
        idx.insert(new, np.arange(next_slot, next_slot + new.size))
        for k in new:
            ref[int(k)] = next_slot
            next_slot += 1
        if step % 5 == 4:
            victims = rng.choice(np.array(list(ref.keys()), dtype=np.int64), size=200, replace=False)
            slots = idx.remove(victims)
            np.testing.assert_array_equal(slots, [ref.pop(int(v)) for v in victims])
        assert len(idx) == len(ref)
    keys, slots = idx.items()
    assert dict(zip(keys.tolist(), slots.tolist())) == ref


def test_overhead_per_row_at_most_32_bytes():
    idx = KeyIndex()
    for n in [1000, 50_000, 200_000, 400_000]:
        have = len(idx)
        idx.insert(np.arange(have, n, dtype=np.int64) * 7919, np.arange(have, n))
        assert idx.nbytes / len(idx) <= 32.0


def test_extreme_ids():
    idx = KeyIndex()
    ids = np.array([np.iinfo(np.int64).min, -1, 0, np.iinfo(np.int64).max])
    idx.insert(ids, np.arange(4))
    assert idx.lookup(ids[::-1]).tolist() == [3, 2, 1, 0]


def test_keys_and_slots_are_the_live_arrays_kernels_fill():
    """``keys``/``slots`` (read-only properties) are the arrays themselves: a kernel that inserts
    into them (after ``reserve``, accounted by ``placed``) extends the index in place."""
    from ember import _native

    idx = KeyIndex(16)
    idx.insert(np.array([3, 4]), np.array([0, 1]))
    ids = np.array([5, -7, 2**62], dtype=np.int64)
    idx.reserve(ids.size)
    used = _native.place(idx.keys, idx.slots, ids, np.array([2, 3, 4], dtype=np.int32))
    idx.placed(ids.size, used)
    assert idx.lookup(np.array([2**62, 3, 5, -7, 9])).tolist() == [4, 0, 2, 3, -1] and len(idx) == 5
    assert idx.keys.dtype == np.int64 and idx.slots.dtype == np.int32 and idx.keys.size == idx.slots.size
    with pytest.raises(AttributeError):
        idx.keys = np.zeros(16, dtype=np.int64)  # type: ignore[misc]
