"""Exact ID counters (``_native.count_ids``, ``IdCounter``): several counters in one pass equal a
dict of counts per counter, compiled and numpy alike, in one part or several, through inserts,
removals and rehashes; a bad call is named."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ember import _native
from ember.tiers.policy import IdCounter

needs_core = pytest.mark.skipif(not _native.is_available(), reason="the native core is not built (or EMBER_NATIVE=0)")
KERNELS = [pytest.param(False, id="numpy"), pytest.param(True, id="native", marks=needs_core)]


@pytest.fixture
def core(request, monkeypatch):
    """The compiled kernel (param True) or its numpy fallback (False) behind ``count_ids``."""
    if not request.param:
        monkeypatch.setattr(_native, "_core", None)
    return request.param


def _empty(cap: int) -> tuple[np.ndarray, np.ndarray]:
    return np.zeros(cap, np.int64), np.zeros(cap, np.int32)


def _segments(rng: np.random.Generator, sizes: list[int], pool: int) -> tuple[list[np.ndarray], np.ndarray]:
    segs = [rng.choice(np.arange(-pool, pool, dtype=np.int64), n, replace=False) for n in sizes]
    return segs, np.cumsum([0] + sizes).astype(np.int64)


@pytest.mark.parametrize("core", KERNELS, indirect=True)
def test_counters_in_one_pass_equal_a_dict_per_counter(core):
    rng = np.random.default_rng(7)
    tables = [_empty(4096), _empty(8192), _empty(512), _empty(8192)]  # room for every ID of the pools
    ref: list[dict[int, int]] = [{} for _ in tables]
    for step in range(40):
        sizes = [0 if step % 5 == 0 else 20, 400, 6, 1500]  # one counter sometimes idle, one tiny
        segs, bounds = _segments(rng, sizes, 1500)
        ids = np.concatenate(segs)
        adds = rng.integers(1, 4, ids.size).astype(np.int32) if step % 2 else None
        out, stats = _native.count_ids(tables, ids, bounds, "add", adds)
        for j, seg in enumerate(segs):
            a = adds[bounds[j] : bounds[j + 1]] if adds is not None else np.ones(seg.size, np.int32)
            new = sum(int(i) not in ref[j] for i in seg)
            for i, n in zip(seg.tolist(), a.tolist()):
                ref[j][i] = ref[j].get(i, 0) + n
            assert out[bounds[j] : bounds[j + 1]].tolist() == [ref[j][i] for i in seg.tolist()]
            assert stats[j, 0] == new
        # remove the IDs counted at least 5 times: deleted buckets on later probe paths
        gone = [seg[out[bounds[j] : bounds[j + 1]] >= 5] for j, seg in enumerate(segs)]
        gb = np.cumsum([0] + [g.size for g in gone]).astype(np.int64)
        had, rstats = _native.count_ids(tables, np.concatenate(gone), gb, "remove")
        for j, g in enumerate(gone):
            assert had[gb[j] : gb[j + 1]].tolist() == [ref[j].pop(i) for i in g.tolist()]
            assert rstats[j, 0] == g.size
        q, qb = _segments(rng, [50, 300, 10, 800], 1600)
        got, _ = _native.count_ids(tables, np.concatenate(q), qb, "get")
        for j, seg in enumerate(q):
            assert got[qb[j] : qb[j + 1]].tolist() == [ref[j].get(i, 0) for i in seg.tolist()]
    for (keys, counts), want in zip(tables, ref):  # every counted ID once, with its count
        live = counts > 0
        assert dict(zip(keys[live].tolist(), counts[live].tolist())) == want
        assert ((counts >= -1)).all()


@pytest.mark.parametrize("core", KERNELS, indirect=True)
def test_counts_saturate_and_a_full_counter_raises(core):
    keys, counts = _empty(16)
    big = np.array([2**31 - 10], np.int32)
    _native.count_ids([(keys, counts)], np.array([5]), np.array([0, 1]), "add", big)
    out, _ = _native.count_ids([(keys, counts)], np.array([5]), np.array([0, 1]), "add", big)
    assert out.tolist() == [2**31 - 1]
    _native.count_ids([(keys, counts)], np.arange(100, 115), np.array([0, 15]), "add")
    with pytest.raises(RuntimeError, match="full"):  # 16 buckets, 16 IDs, one more
        _native.count_ids([(keys, counts)], np.arange(200, 202), np.array([0, 2]), "add")


@pytest.mark.parametrize("core", KERNELS, indirect=True)
def test_bad_calls_are_named(core):
    t = [_empty(16)]
    with pytest.raises(ValueError, match="mode"):
        _native.count_ids(t, np.array([1]), np.array([0, 1]), "bump")
    with pytest.raises(ValueError, match="above 0"):
        _native.count_ids(t, np.array([1]), np.array([0, 1]), "add", np.array([0], np.int32))
    with pytest.raises(ValueError, match="bounds"):
        _native.count_ids(t, np.array([1, 2]), np.array([0, 1]), "get")
    with pytest.raises(ValueError, match="power-of-two"):
        _native.count_ids([(np.zeros(12, np.int64), np.zeros(12, np.int32))], np.array([1]), np.array([0, 1]), "get")


@needs_core
def test_counters_in_parts_equal_one_part(monkeypatch):
    monkeypatch.setattr(torch, "get_num_threads", lambda: 3)
    monkeypatch.setattr(_native, "MIN_PART_ROWS", 64)
    rng = np.random.default_rng(11)
    segs, bounds = _segments(rng, [300, 0, 900, 64, 500], 2000)
    ids = np.concatenate(segs)
    assert _native.part_bounds(np.diff(bounds)) is not None  # the call splits
    runs = []
    for split in (True, False):
        if not split:
            monkeypatch.setattr(_native, "MIN_PART_ROWS", 10**9)
        tables = [_empty(2048) for _ in segs]
        out1, st1 = _native.count_ids(tables, ids, bounds, "add")
        out2, st2 = _native.count_ids(tables, ids, bounds, "add", np.full(ids.size, 2, np.int32))
        out3, st3 = _native.count_ids(tables, ids[::2].copy(), np.array([0, 150, 150, 600, 632, 882]), "remove")
        runs.append((out1, st1, out2, st2, out3, st3, [t[0].copy() for t in tables], [t[1].copy() for t in tables]))
    for a, b in zip(*runs):
        for x, y in (zip(a, b) if isinstance(a, list) else [(a, b)]):
            assert np.array_equal(x, y)


@pytest.mark.parametrize("core", KERNELS, indirect=True)
def test_id_counter_through_churn_and_rehashes(core):
    """Many IDs counted, some admitted (removed) every step: the counter grows and rehashes away
    its deleted buckets; it always answers as a dict would, and never fills."""
    rng = np.random.default_rng(5)
    c, ref, caps = IdCounter(16), {}, set()
    for step in range(120):
        ids = np.unique(rng.integers(0, 3000 if step < 60 else 600, 300))
        out = c.add(ids)
        for i in ids.tolist():
            ref[i] = ref.get(i, 0) + 1
        assert out.tolist() == [ref[i] for i in ids.tolist()]
        admitted = ids[out >= 2]
        c.remove(admitted)
        for i in admitted.tolist():
            del ref[i]
        caps.add(c._keys.size)
        assert len(c) == len(ref) and c._used <= 0.75 * c._keys.size
    ids, counts = c.items()
    assert ids.tolist() == sorted(ref) and counts.tolist() == [ref[i] for i in sorted(ref)]
    assert c.get(np.array([-1, *ids[:3]])).tolist() == [0, *counts[:3].tolist()]
    assert len(caps) >= 4 and c.nbytes == 12 * c._keys.size
    restored = IdCounter()  # a checkpoint's counts come back as adds
    restored.add(ids, counts.astype(np.int32))
    assert all(np.array_equal(a, b) for a, b in zip(restored.items(), c.items()))


@pytest.mark.parametrize("core", KERNELS, indirect=True)
def test_a_rehash_that_clears_deleted_buckets_leaves_a_quarter_to_fill(core):
    c = IdCounter(16)
    cap = c._keys.size  # 32 buckets
    c.add(np.arange(20))
    c.remove(np.arange(10))  # 10 counted, 20 buckets used
    c.add(np.arange(100, 108))  # 28 > 24 used: rehash; 18 counted > half of 32: the table doubles
    assert c._keys.size == 2 * cap and c._used == len(c) == 18
    c2 = IdCounter(16)
    c2.add(np.arange(20))
    c2.remove(np.arange(16))  # 4 counted
    c2.add(np.arange(100, 106))  # 26 > 24: rehash at the same size (10 IDs fill a third)
    assert c2._keys.size == cap and c2._used == len(c2) == 10
