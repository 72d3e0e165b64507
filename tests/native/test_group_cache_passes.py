"""The group cache's native passes (_native.gc_scan = gc_scores + gc_select, gc_requeue /
gc_reserve / gc_insert / gc_release) equal their numpy fallbacks on random slot arrays: the same
victims in the same order, the same queue, the same index buckets and slot arrays."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ember import _native
from ember import once
from ember.tiers.key_index import KeyIndex

native = pytest.mark.skipif(not _native.is_available(), reason="the native core is not built (or EMBER_NATIVE=0)")


def _slots(rng: np.random.Generator, m: int, spread: int) -> tuple[np.ndarray, ...]:
    """last / count / live / held of m slots; ``spread``: how many distinct counts and times
    (few: many tied scores)."""
    last = rng.integers(0, spread, m).astype(np.int64)
    count = rng.integers(0, spread, m).astype(np.int64)
    if spread > 1000:  # large values too: the LFU score's shift and the low 32 bits of last
        last[: m // 4] += np.int64(1) << 33
        count[: m // 8] = rng.integers(0, 1 << 20, m // 8)
    live = rng.random(m) < 0.9
    held = (rng.random(m) < 0.1).astype(np.int32) * rng.integers(1, 3, m).astype(np.int32)
    return last, count, live, held


@native
@pytest.mark.parametrize("lru", [False, True])
@pytest.mark.parametrize("spread", [1, 3, 50, 1 << 40])
@pytest.mark.parametrize("k", [0, 1, 7, 300, 5000, 20000])
@pytest.mark.parametrize("share", [1 << 17, 1000])  # least slots of a part of the scores pass: one part; three
def test_native_gc_scan_equals_the_numpy_one(lru, spread, k, share, monkeypatch):
    monkeypatch.setattr(_native, "MIN_PART_ROWS", share)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 3)
    assert _native.part_count(10_000) == (1 if share > 5000 or not _native.native_parts() else 3)
    rng = np.random.default_rng(k + spread)
    m = 10_000
    last, count, live, held = _slots(rng, m, spread)
    got = []
    for fn in (_native.gc_scan, _native._gc_scan_py):
        score, slot, sc = np.empty(m, np.int64), np.full(k, -7, np.int64), np.full(k, -7, np.int64)
        n = fn(last, count, live, held, lru, score, slot, sc)
        got.append((n, score, slot, sc))
    (n, score, slot, sc), (n2, score2, slot2, sc2) = got
    assert n == n2 == min(k, int((live & (held == 0)).sum()))
    assert np.array_equal(score, score2) and np.array_equal(slot, slot2) and np.array_equal(sc, sc2)
    # the n lowest (score, slot) pairs of the qualifying slots, ascending
    ok = np.flatnonzero(live & (held == 0))
    want = ok[np.lexsort((ok, score[ok]))][:n]
    assert np.array_equal(slot[:n], want) and np.array_equal(sc[:n], score[want])


@native
@pytest.mark.parametrize("lru", [False, True])
def test_native_gc_requeue_equals_the_numpy_one(lru):
    rng = np.random.default_rng(1)
    m = 3000
    last, count, live, held = _slots(rng, m, 40)
    score, q, qs = np.empty(m, np.int64), np.empty(1000, np.int64), np.empty(1000, np.int64)
    n = _native._gc_scan_py(last, count, live, held, lru, score, q, qs)
    last[q[::3]] += 1  # accessed since the scan
    live[q[1::7]] = False
    held[q[2::11]] = 1
    got = []
    for fn in (_native.gc_requeue, _native._gc_requeue_py):
        a, b = q[:n].copy(), qs[:n].copy()
        got.append((fn(last, count, live, held, lru, a, b), a, b))
    (k, a, b), (k2, a2, b2) = got
    assert k == k2 and 0 < k < n
    assert np.array_equal(a[:k], a2[:k]) and np.array_equal(b[:k], b2[:k])


@native
def test_native_gc_reserve_equals_the_numpy_one():
    rng = np.random.default_rng(5)
    m, u, n = 2000, 600, 150
    free = rng.permutation(m).astype(np.int64)
    new = np.sort(rng.choice(u, n, replace=False)).astype(np.int64)
    tables, est = rng.integers(0, 7, n).astype(np.int64), rng.integers(1, 50, n).astype(np.int64)
    count0, held0 = rng.integers(0, 9, m).astype(np.int64), rng.integers(0, 2, m).astype(np.int32)
    states = []
    for fn in (_native.gc_reserve, _native._gc_reserve_py):
        owner, count, last, held = np.full(m, -1, np.int32), count0.copy(), np.zeros(m, np.int64), held0.copy()
        w = np.full(u, -1, np.int64)
        fn(free, 1500, new, tables, est, 42, owner, count, last, held, w)
        states.append((owner, count, last, held, w))
    for a, b in zip(*states):
        assert np.array_equal(a, b)
    assert np.array_equal(states[0][4][new], free[1500 - n : 1500][::-1])
    with pytest.raises(ValueError, match="nfree"):
        _native.gc_reserve(free, n - 1, new, tables, est, 1, *states[0])


@native
def test_native_gc_insert_equals_the_numpy_one():
    rng = np.random.default_rng(2)
    m, t = 4000, 5
    mix = (np.arange(1, t + 1, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)).view(np.int64)
    states = []
    for fn in (_native.gc_insert, _native._gc_insert_py):
        idx = KeyIndex(2 * m)
        slot_id, owner = np.zeros(m, np.int64), np.full(m, -1, np.int32)
        live, rows_of = np.zeros(m, bool), np.zeros(t, np.int64)
        free = np.random.default_rng(3).permutation(m)
        for step in range(3):  # inserts after removals: deleted buckets are reused alike
            r = np.random.default_rng(10 + step)
            n = 900
            tables = r.integers(0, t, n).astype(np.int64)
            ids = r.choice(1 << 40, n, replace=False).astype(np.int64)
            at = free[step * n : (step + 1) * n].astype(np.int64)
            idx.reserve(n)
            used = fn(idx.keys, idx.slots, ids, tables, at, mix, slot_id, owner, live, rows_of)
            idx.placed(n, used)
            gone = at[::4]
            idx.remove(slot_id[gone] ^ mix[owner[gone]])
        states.append((idx.keys.copy(), idx.slots.copy(), slot_id, owner, live, rows_of, len(idx)))
    for a, b in zip(*states):
        assert np.array_equal(a, b)
    assert states[0][5].sum() == 2700


@native
def test_native_gc_release_equals_the_numpy_one_and_checks_its_slots():
    rng = np.random.default_rng(4)
    held = rng.integers(0, 3, 1000).astype(np.int32)
    at = rng.choice(1000, 300, replace=False).astype(np.int64)
    a, b = held.copy(), held.copy()
    _native.gc_release(a, at)
    _native._gc_release_py(b, at)
    assert np.array_equal(a, b)
    with pytest.raises(ValueError, match="out of range"):
        _native.gc_release(a, np.array([1000], np.int64))


def test_without_the_core_each_pass_says_once_that_its_fallback_runs(monkeypatch, caplog):
    monkeypatch.setattr(_native, "_core", None)
    once.forget("native.fallback")
    held = np.ones(4, np.int32)
    with caplog.at_level("INFO", logger="ember"):
        _native.gc_release(held, np.array([1, 2], np.int64))
        _native.gc_release(held, np.array([3], np.int64))
    assert held.tolist() == [1, 0, 0, 0]
    said = [r.getMessage() for r in caplog.records if "gc_release" in r.getMessage()]
    assert len(said) == 1 and "numpy fallback" in said[0]
