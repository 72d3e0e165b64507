"""read_rows / write_rows (a table group's memory tiers in one call) against their numpy fallbacks."""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest
import torch

from ember import _native
from ember.mix import mix64

native = pytest.mark.skipif(not _native.is_available(), reason="ember native core not available (not built, or EMBER_NATIVE=0)")
R = 3


def _copy(tables: list[tuple[np.ndarray, ...]]) -> list[tuple[np.ndarray, ...]]:
    return [tuple(a.copy() for a in t) for t in tables]


def _lookup(keys: np.ndarray, slots: np.ndarray, ids: np.ndarray) -> np.ndarray:
    slot = np.empty(ids.size, dtype=np.int32)
    _native._probe_py(keys, slots, ids, np.empty(ids.size, dtype=np.int64), slot)
    return slot.astype(np.int64)


def _group(seed: int, tiers: int = 5, cap: int = 2048, r: int = R) -> dict:
    """The memory tiers of a table group as HostTier holds them (index, arena [rows, R], last,
    count, slot -> ID, held, free list), each with rows already in and some deleted (tombstones
    in the index, some of their slots free) and room reserved for the new ones; a write batch (per tier unique IDs: present,
    deleted and new, tier 1 empty) with the slots a probe gives; a read query over present,
    deleted and never-seen IDs with repeats; clocks, -1 ("keep no statistics") for tier 2."""
    rng = np.random.default_rng(seed)
    tables, seg, query, nexts = [], [], [], []
    for j in range(tiers):
        held_ids = np.unique(rng.integers(-(2**62), 2**62, size=int(rng.integers(0, 400))))
        n0 = held_ids.size
        rows = n0 + 400 + int(rng.integers(0, 5))  # growth reserved: the arena holds every new row
        keys, slots = np.zeros(cap, dtype=np.int64), np.full(cap, -1, dtype=np.int32)
        _native._place_py(keys, slots, held_ids, np.arange(n0, dtype=np.int32))
        arena = rng.standard_normal((rows, r)).astype(np.float32)
        last = rng.integers(0, 1000, size=rows)
        count = rng.integers(0, 100, size=rows).astype(np.int32)
        slot_ids = np.zeros(rows, dtype=np.int64)
        slot_ids[:n0] = held_ids
        held = np.zeros(rows, dtype=bool)
        held[:n0] = True
        gone, present = held_ids[: n0 // 5], held_ids[n0 // 5 :]
        bucket = np.empty(gone.size, dtype=np.int64)
        _native._probe_py(keys, slots, gone, bucket, np.empty(gone.size, dtype=np.int32))
        slots[bucket] = -2
        held[: n0 // 5] = False
        # the free list: the deleted rows' slots, shuffled, some of them (fewer or more than the
        # new rows: new rows take them first, then slots from next)
        free = rng.permutation(np.arange(n0 // 5, dtype=np.int32))[: int(rng.integers(0, n0 // 5 + 1))]
        tables.append((keys, slots, arena, last, count, slot_ids, held, free))
        nexts.append(n0)
        fresh = np.setdiff1d(rng.integers(-(2**62), 2**62, size=int(rng.integers(0, 300))), held_ids)
        ids = np.concatenate([rng.choice(present, size=present.size // 2, replace=False), gone[: gone.size // 2], fresh])
        ids = rng.permutation(np.unique(ids)) if j != 1 else np.empty(0, dtype=np.int64)
        seg.append(ids)
        pool = np.concatenate([ids, present, gone, rng.integers(-(2**62), 2**62, size=50)])
        query.append(rng.choice(pool, size=int(rng.integers(0, 600))) if pool.size else pool)
    ids = np.concatenate(seg).astype(np.int64)
    return {
        "tables": tables,
        "ids": ids,
        "bounds": np.concatenate([[0], np.cumsum([s.size for s in seg])]).astype(np.int64),
        "slot": np.concatenate([_lookup(t[0], t[1], s) for t, s in zip(tables, seg)]).astype(np.int64),
        "records": rng.standard_normal((ids.size, r)).astype(np.float32),
        "next": np.array(nexts, dtype=np.int64),
        "clocks": np.array([7, 3, -1, 12, 5][:tiers], dtype=np.int64),
        "query": np.concatenate(query).astype(np.int64),
        "qbounds": np.concatenate([[0], np.cumsum([q.size for q in query])]).astype(np.int64),
    }


def _write(fn, g: dict, tables: list) -> tuple:
    slot, nxt, used = g["slot"].copy(), g["next"].copy(), np.full(len(tables), -9, dtype=np.int64)
    free_at = np.zeros(len(tables), dtype=np.int64)
    inserted = fn(tables, g["ids"], g["bounds"], slot, g["records"], nxt, g["clocks"], used, free_at, R)
    return inserted, slot, nxt, used, free_at


def _read(fn, g: dict, tables: list) -> tuple:
    n, t = g["query"].size, len(tables)
    out, slot, hits = np.full((n, R), -7.0, dtype=np.float32), np.full(n, -9, dtype=np.int64), np.full(t, -9, dtype=np.int64)
    found = fn([tb[:5] for tb in tables], g["query"], g["qbounds"], out, slot, g["clocks"], hits, R)
    return found, out, slot, hits


def _same_index(a: tuple, b: tuple) -> None:
    """Two KeyIndex arrays hold the same ID -> slot map in the same buckets (IDs of one insert
    may sit in each other's bucket: the compiled place goes ID by ID, the fallback in rounds)."""
    np.testing.assert_array_equal(a[1] >= 0, b[1] >= 0)
    np.testing.assert_array_equal(np.minimum(a[1], -1), np.minimum(b[1], -1))  # same empty / deleted marks
    live = a[1] >= 0
    assert dict(zip(a[0][live].tolist(), a[1][live].tolist())) == dict(zip(b[0][live].tolist(), b[1][live].tolist()))


@native
@pytest.mark.parametrize("seed,cap", [(0, 2048), (1, 2048), (2, 1024), (3, 1024)])
def test_write_rows_matches_its_fallback(seed, cap):
    g = _group(seed, cap=cap)
    a, b = _copy(g["tables"]), _copy(g["tables"])
    got, want = _write(_native.write_rows, g, a), _write(_native._write_rows_py, g, b)
    assert got[0] == want[0] == int(np.count_nonzero(g["slot"] < 0)) > 0
    for x, y in zip(got[1:], want[1:]):
        np.testing.assert_array_equal(x, y)
    for ta, tb in zip(a, b):
        _same_index(ta, tb)
        for x, y in zip(ta[2:], tb[2:]):  # arena, last, count, slot_ids, held
            np.testing.assert_array_equal(x, y)
    inserted, slot, nxt, used, free_at = want
    assert any(0 < free_at[j] < int((g["slot"][g["bounds"][j] : g["bounds"][j + 1]] < 0).sum()) for j in range(len(b)))
    for j, t in enumerate(b):  # the semantics, spelt out
        lo, hi = g["bounds"][j], g["bounds"][j + 1]
        new = g["slot"][lo:hi] < 0
        np.testing.assert_array_equal(slot[lo:hi][~new], g["slot"][lo:hi][~new])
        free = g["tables"][j][7]
        k = min(int(new.sum()), free.size)  # freed slots first, in their order, then next
        assert free_at[j] == k
        np.testing.assert_array_equal(slot[lo:hi][new], np.concatenate([free[:k], g["next"][j] + np.arange(new.sum() - k)]))
        np.testing.assert_array_equal(t[2][slot[lo:hi]], g["records"][lo:hi])
        np.testing.assert_array_equal(_lookup(t[0], t[1], g["ids"][lo:hi]), slot[lo:hi])
        s = slot[lo:hi][new]
        assert (t[5][s] == g["ids"][lo:hi][new]).all() and t[6][s].all() and (t[4][s] == 1).all() and (t[3][s] == g["clocks"][j]).all()
        assert nxt[j] == g["next"][j] + new.sum() - k and used[j] == np.count_nonzero((g["tables"][j][1] == -1) & (t[1] >= 0))


@native
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_read_rows_matches_its_fallback_on_tables_either_wrote(seed):
    g = _group(seed)
    written = {fn: _copy(g["tables"]) for fn in (_native.write_rows, _native._write_rows_py)}
    for fn, tables in written.items():
        _write(fn, g, tables)
    results = []
    for tables in written.values():
        for fn in (_native.read_rows, _native._read_rows_py):
            t = _copy(tables)
            results.append((_read(fn, g, t), [x for tb in t for x in tb[2:]]))
    (first, meta), others = results[0], results[1:]
    for res, m in others:
        assert res[0] == first[0]
        for x, y in zip(res[1:] + tuple(m), first[1:] + tuple(meta)):
            np.testing.assert_array_equal(x, y)
    found, out, slot, hits = first
    assert 0 < found < g["query"].size and found == hits.sum() == np.count_nonzero(slot >= 0)
    assert (out[slot < 0] == -7).all()  # rows of absent IDs left as they were
    tables = written[_native._write_rows_py]
    for j, t in enumerate(tables):
        lo, hi = g["qbounds"][j], g["qbounds"][j + 1]
        s = slot[lo:hi]
        np.testing.assert_array_equal(s, _lookup(t[0], t[1], g["query"][lo:hi]))
        np.testing.assert_array_equal(out[lo:hi][s >= 0], t[2][s[s >= 0]])
        last, count = meta[6 * j + 1], meta[6 * j + 2]  # after the read (6 arrays per tier from the arena on)
        if g["clocks"][j] < 0:  # a tier that keeps no statistics
            np.testing.assert_array_equal(last, t[3])
            np.testing.assert_array_equal(count, t[4])
        else:
            np.testing.assert_array_equal(count - t[4], np.bincount(s[s >= 0], minlength=t[4].size))  # repeats count
            np.testing.assert_array_equal(last, np.where(count > t[4], g["clocks"][j], t[3]))


@native
def test_read_write_rows_split_over_threads_equal_one_thread(monkeypatch):
    monkeypatch.setattr(torch, "get_num_threads", lambda: 3)
    monkeypatch.setattr(_native, "MIN_PART_ROWS", 1)  # the core's parts: runs of tiers on OpenMP's threads
    assert len(_native.chunks(np.diff(_group(4)["bounds"]))) == 3
    assert _native.part_bounds(np.diff(_group(4)["bounds"])).size == 4 or not _native.native_parts()
    g = _group(4)
    split, one = _copy(g["tables"]), _copy(g["tables"])
    results = [(_write(fn, g, t), _read(fn2, g, t)) for fn, fn2, t in (
        (_native.write_rows, _native.read_rows, split), (_native._write_rows_py, _native._read_rows_py, one))]
    for x, y in zip(results[0][0] + results[0][1], results[1][0] + results[1][1]):
        np.testing.assert_array_equal(x, y)
    for ta, tb in zip(split, one):
        _same_index(ta, tb)
        for x, y in zip(ta[2:], tb[2:]):
            np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize("dim,width", [(4, 5), (5, 7), (16, 17)])
def test_bf16_rows_packed_on_write_and_widened_on_read_as_the_codec_does(dim, width, monkeypatch):
    """``dim`` > 0: write_rows packs a bf16 table's fp32 records on the way into the arenas with
    each tier's noise, read_rows widens them on the way out: the same arena bits as packing the
    batch first (``bf16_pack_sr``, per-row seeds and steps of the row's tier) and writing the
    words, the same records as reading the words and decoding them; absent rows untouched.
    Compiled (split over three threads: each run of tiers its seeds and steps) and fallback
    alike, specials (NaN, infinities, subnormals) included."""
    monkeypatch.setattr(torch, "get_num_threads", lambda: 3)
    monkeypatch.setattr(_native, "MIN_PART_ROWS", 1)  # the core's parts: runs of tiers on OpenMP's threads
    words = (dim + 1) // 2 + width - dim
    g = _group(11, r=words)
    rng = np.random.default_rng(3)
    n, t = g["ids"].size, len(g["tables"])
    records = (rng.standard_normal((n, width)) * 10.0 ** rng.integers(-40, 38, size=(n, width))).astype(np.float32)
    records.flat[rng.choice(records.size, 20, replace=False)] = [np.nan, np.inf, -np.inf, 1e-45, -0.0] * 4
    seeds, steps = rng.integers(0, 2**40, size=t), rng.integers(0, 10**6, size=t)
    sizes = np.diff(g["bounds"])
    packed = np.empty((n, words), dtype=np.float32)
    _native._bf16_pack_sr_py(records, g["ids"], np.repeat(seeds, sizes), np.repeat(steps, sizes), dim, packed)
    for write, read in zip(_kernels("write_rows"), _kernels("read_rows")):
        fused, plain = _copy(g["tables"]), _copy(g["tables"])
        args = (g["ids"], g["bounds"])
        def state():
            return g["slot"].copy(), g["next"].copy(), g["clocks"], np.zeros(t, np.int64), np.zeros(t, np.int64)
        slot_f, *rest_f = state()
        slot_p, *rest_p = state()
        assert write(fused, *args, slot_f, records, *rest_f, words, dim, seeds, steps) == \
            write(plain, *args, slot_p, packed, *rest_p, words) > 0
        np.testing.assert_array_equal(slot_f, slot_p)
        for ta, tb in zip(fused, plain):
            _same_index(ta, tb)
            np.testing.assert_array_equal(ta[2].view(np.uint32), tb[2].view(np.uint32))  # the arena, bit for bit
        q = g["query"].size
        out, got_slot = np.full((q, width), -7.0, dtype=np.float32), np.full(q, -9, np.int64)
        raw, raw_slot = np.full((q, words), -7.0, dtype=np.float32), np.full(q, -9, np.int64)
        clocks = np.full(t, -1, np.int64)
        assert read([tb[:5] for tb in fused], g["query"], g["qbounds"], out, got_slot, clocks, np.zeros(t, np.int64),
                    words, dim) == read([tb[:5] for tb in plain], g["query"], g["qbounds"], raw, raw_slot, clocks,
                                        np.zeros(t, np.int64), words) > 0
        np.testing.assert_array_equal(got_slot, raw_slot)
        hit = raw_slot >= 0
        assert 0 < hit.sum() < q
        want = np.full((q, width), -7.0, dtype=np.float32)
        want[hit, :dim] = torch.from_numpy(raw[hit].copy()).view(torch.int16)[:, :dim].view(torch.bfloat16).float().numpy()
        want[hit, dim:] = raw[hit, (dim + 1) // 2 :]
        np.testing.assert_array_equal(out.view(np.uint32), want.view(np.uint32))


@pytest.mark.parametrize("dim,width", [(0, 5), (0, 17), (16, 17), (5, 6)])
def test_write_rows_with_adagrad_equals_the_optimizer_then_the_write(dim, width, monkeypatch):
    """``adagrad``: each record gets row-wise Adagrad in place (tier j's lr and eps), then the
    write: records, arenas (bit for bit) and index equal ``rowwise_adagrad_`` on each tier's
    segment followed by the plain write, compiled (split over three threads: each run of tiers
    its own lr) and fallback (the torch ops) alike; fp32 records and a bf16 table's (``dim``)."""
    monkeypatch.setattr(torch, "get_num_threads", lambda: 3)
    monkeypatch.setattr(_native, "MIN_PART_ROWS", 1)  # the core's parts: runs of tiers on OpenMP's threads
    words = width if dim == 0 else (dim + 1) // 2 + width - dim
    gdim = width - 1  # weights, then the accumulator
    g = _group(13, r=words)
    rng = np.random.default_rng(4)
    n, t = g["ids"].size, len(g["tables"])
    records = rng.standard_normal((n, width)).astype(np.float32)
    records[:, gdim] = rng.random(n).astype(np.float32)  # accumulators >= 0
    grads = (rng.standard_normal((n, gdim)) * 10.0 ** rng.integers(-25, 2, size=(n, 1))).astype(np.float32)
    hyper = np.stack([rng.uniform(0.01, 0.5, t), 10.0 ** rng.integers(-10, -3, t)], axis=1)
    seeds, steps = rng.integers(0, 2**40, size=t), rng.integers(0, 10**6, size=t)
    bf16 = (seeds, steps) if dim else ()
    for write, step in zip(_kernels("write_rows"), [_native.rowwise_adagrad_, _native._rowwise_adagrad_py][-len(_kernels("write_rows")):]):
        fused, plain = _copy(g["tables"]), _copy(g["tables"])
        rec_f, rec_p = records.copy(), records.copy()
        for j in range(t):  # the reference: the optimizer on each tier's rows, then the write
            a, b = g["bounds"][j], g["bounds"][j + 1]
            r = torch.from_numpy(rec_p)[a:b]
            step(r[:, :gdim], r[:, gdim:], torch.from_numpy(grads[a:b]), float(hyper[j, 0]), float(hyper[j, 1]))
        def state():
            return g["slot"].copy(), g["next"].copy(), g["clocks"], np.zeros(t, np.int64), np.zeros(t, np.int64)
        slot_f, *rest_f = state()
        slot_p, *rest_p = state()
        assert write(fused, g["ids"], g["bounds"], slot_f, rec_f, *rest_f, words, dim, *bf16, adagrad=(grads, hyper)) == \
            write(plain, g["ids"], g["bounds"], slot_p, rec_p, *rest_p, words, dim, *bf16) > 0
        np.testing.assert_array_equal(rec_f.view(np.uint32), rec_p.view(np.uint32))  # the records updated in place
        assert not np.array_equal(rec_f, records)
        np.testing.assert_array_equal(slot_f, slot_p)
        for ta, tb in zip(fused, plain):
            _same_index(ta, tb)
            np.testing.assert_array_equal(ta[2].view(np.uint32), tb[2].view(np.uint32))


@pytest.mark.parametrize("adagrad", [False, True])
def test_write_rows_leaves_out_skipped_rows_as_a_write_of_the_others(adagrad, monkeypatch):
    """Rows whose slot is ``SKIP_ROW`` (rows held back by ``min_count``) are neither updated nor
    written: tables, records and slots equal a write of the other rows gathered out, compiled
    (in parts) and fallback alike; a skipped new ID stays absent."""
    monkeypatch.setattr(torch, "get_num_threads", lambda: 3)
    monkeypatch.setattr(_native, "MIN_PART_ROWS", 1)
    g = _group(21)
    rng = np.random.default_rng(8)
    n, t = g["ids"].size, len(g["tables"])
    skip = rng.random(n) < 0.3
    assert (skip & (g["slot"] < 0)).any() and (skip & (g["slot"] >= 0)).any()
    keep = np.flatnonzero(~skip)
    grads = rng.standard_normal((n, R - 1)).astype(np.float32)
    hyper = np.stack([rng.uniform(0.01, 0.5, t), np.full(t, 1e-8)], axis=1)
    records = g["records"].copy()
    records[:, R - 1] = rng.random(n).astype(np.float32)
    for write in _kernels("write_rows"):
        skipped, gathered = _copy(g["tables"]), _copy(g["tables"])
        rec_s, rec_g = records.copy(), np.ascontiguousarray(records[keep])
        slot_s, slot_g = g["slot"].copy(), g["slot"][keep].copy()
        slot_s[skip] = _native.SKIP_ROW
        kb = np.searchsorted(keep, g["bounds"]).astype(np.int64)
        state_s = [g["next"].copy(), g["clocks"], np.zeros(t, np.int64), np.zeros(t, np.int64)]
        state_g = [g["next"].copy(), g["clocks"], np.zeros(t, np.int64), np.zeros(t, np.int64)]
        ada_s = (grads, hyper) if adagrad else None
        ada_g = (np.ascontiguousarray(grads[keep]), hyper) if adagrad else None
        got = write(skipped, g["ids"], g["bounds"], slot_s, rec_s, *state_s, R, adagrad=ada_s)
        want = write(gathered, g["ids"][keep], kb, slot_g, rec_g, *state_g, R, adagrad=ada_g)
        assert got == want > 0
        np.testing.assert_array_equal(rec_s[keep].view(np.uint32), rec_g.view(np.uint32))
        np.testing.assert_array_equal(rec_s[skip].view(np.uint32), records[skip].view(np.uint32))  # untouched
        np.testing.assert_array_equal(slot_s[keep], slot_g)
        assert (slot_s[skip] == _native.SKIP_ROW).all()
        for a, b in zip(state_s, state_g):
            np.testing.assert_array_equal(a, b)
        for j, (ta, tb) in enumerate(zip(skipped, gathered)):
            _same_index(ta, tb)
            for x, y in zip(ta[2:], tb[2:]):
                np.testing.assert_array_equal(x, y)
            lo, hi = g["bounds"][j], g["bounds"][j + 1]
            new_skipped = g["ids"][lo:hi][skip[lo:hi] & (g["slot"][lo:hi] < 0)]
            assert (_lookup(ta[0], ta[1], new_skipped) == -1).all()


def test_write_rows_refuses_bad_adagrad_arguments():
    g = _group(2)
    t = len(g["tables"])
    for grads, hyper in [(np.zeros((g["ids"].size, R), np.float32), np.zeros((t, 2))),  # no accumulator column left
                         (np.zeros((g["ids"].size - 1, R - 1), np.float32), np.zeros((t, 2))),  # a row short
                         (np.zeros((g["ids"].size, R - 1), np.float32), np.zeros((t + 1, 2))),  # a tier too many
                         (np.zeros((g["ids"].size, R - 1), np.float64), np.zeros((t, 2)))]:  # float64 grads
        for write in _kernels("write_rows"):
            with pytest.raises(ValueError, match="adagrad"):
                _write(lambda *a: write(*a, adagrad=(grads, hyper)), g, _copy(g["tables"]))


def _kernels(name: str) -> list:
    py = getattr(_native, f"_{name}_py")
    return [getattr(_native, name), py] if _native.is_available() else [py]


def test_bad_calls_raise_the_same_errors():
    g = _group(5)
    for write in _kernels("write_rows"):
        bad = dict(g, bounds=g["bounds"][::-1].copy())
        with pytest.raises(ValueError, match="bounds"):
            _write(write, bad, _copy(g["tables"]))
        with pytest.raises(ValueError, match="no room"):  # (no free slots: every new row at next)
            _write(write, dict(g, next=g["next"] + 400), [t[:7] + (np.empty(0, np.int32),) for t in _copy(g["tables"])])
        with pytest.raises(ValueError, match="free_at"):
            tables = _copy(g["tables"])
            free_at = np.full(len(tables), 10**6, dtype=np.int64)
            write(tables, g["ids"], g["bounds"], g["slot"].copy(), g["records"], g["next"].copy(), g["clocks"],
                  np.zeros(len(tables), dtype=np.int64), free_at, R)
        with pytest.raises(IndexError, match="free slot lies outside"):
            tables = _copy(g["tables"])
            for t in tables:
                t[7][:] = 10**6
            _write(write, g, tables)
        outside = g["slot"].copy()
        outside[0] = 10**6
        with pytest.raises(IndexError, match="outside the arena"):
            _write(write, dict(g, slot=outside), _copy(g["tables"]))
        with pytest.raises(ValueError, match="tuple of 8"):
            _write(write, g, [t[:5] for t in _copy(g["tables"])])
    t, n = len(g["tables"]), g["ids"].size
    for write in _kernels("write_rows"):  # bf16 mode: weights that do not fit R words, seeds not one per tier
        for dim, seeds in ((2 * R + 1, np.zeros(t, np.int64)), (2, np.zeros(t - 1, np.int64))):
            width = max(dim + R - (dim + 1) // 2, 1)
            with pytest.raises(ValueError, match="dim|seeds"):
                write(_copy(g["tables"]), g["ids"], g["bounds"], g["slot"].copy(), np.zeros((n, width), np.float32),
                      g["next"].copy(), g["clocks"], np.zeros(t, np.int64), np.zeros(t, np.int64), R, dim, seeds,
                      np.zeros(t, np.int64))
    for read in _kernels("read_rows"):
        with pytest.raises(ValueError, match="dim"):
            q = g["query"].size
            read([tb[:5] for tb in _copy(g["tables"])], g["query"], g["qbounds"], np.zeros((q, 2 * R), np.float32),
                 np.zeros(q, np.int64), g["clocks"], np.zeros(t, np.int64), R, 2 * R + 1)
        with pytest.raises(ValueError, match="bounds"):
            _read(read, dict(g, qbounds=g["qbounds"][:-1].copy()), _copy(g["tables"]))
        tables = _copy(g["tables"])
        tables[0][1][tables[0][1] >= 0] = 10**6  # an index pointing past its arena
        with pytest.raises(IndexError, match="outside the arena"):
            held = g["tables"][0][5][g["tables"][0][6]][:5]
            _read(read, dict(g, query=held, qbounds=np.array([0, 5, 5, 5, 5, 5])), tables)


@native
@pytest.mark.parametrize("seed", range(3))
def test_gather_and_scatter_rows_match_their_fallbacks(seed, tmp_path):
    """The disk tier's row copies (GIL released) against numpy's indexing, on a memory map as
    the disk tier holds it: unsorted and repeated slots, first and last row; a repeated slot's
    last write wins in both."""
    rng = np.random.default_rng(seed)
    s, w = 500, 19
    mm = np.memmap(tmp_path / "slots.bin", dtype=np.float32, mode="w+", shape=(s, w))
    mm[:] = rng.standard_normal((s, w))
    slots = np.concatenate([[0, s - 1], rng.integers(0, s, size=300), [7, 7]]).astype(np.int64)
    got, ref = np.empty((slots.size, w), np.float32), np.empty((slots.size, w), np.float32)
    _native.gather_rows(mm, slots, got)
    _native._gather_rows_py(mm, slots, ref)
    assert np.array_equal(got, ref)
    rows = rng.standard_normal((slots.size, w)).astype(np.float32)
    ref_table = np.array(mm)
    _native._scatter_rows_py(ref_table, slots, rows)
    _native.scatter_rows(mm, slots, rows)
    assert np.array_equal(np.asarray(mm), ref_table)
    with pytest.raises(IndexError, match="slot out of range"):
        _native.gather_rows(mm, np.array([s], dtype=np.int64), np.empty((1, w), np.float32))


@native
def test_willneed_advises_each_page_of_the_rows_once(tmp_path):
    """The read-ahead hint covers every page of the requested rows (a row across a page
    boundary: both), each page once, as its fallback counts them; rows read after it are the
    same."""
    w = 19  # 76-byte rows: some straddle two 4 KiB pages
    mm = np.memmap(tmp_path / "slots.bin", dtype=np.float32, mode="w+", shape=(20_000, w))
    mm[:] = np.arange(20_000, dtype=np.float32)[:, None]
    rng = np.random.default_rng(0)
    for slots in [np.array([0, 1, 53, 54, 19_999]), np.sort(rng.choice(20_000, 500, replace=False))]:
        slots = slots.astype(np.int64)
        pages = np.unique(np.concatenate([slots * w * 4 // 4096, ((slots + 1) * w * 4 - 1) // 4096]))
        assert _native.willneed(mm, slots) == _native._willneed_py(mm, slots) == pages.size
        out = np.empty((slots.size, w), np.float32)
        _native.gather_rows(mm, slots, out)
        assert np.array_equal(out[:, 0], slots.astype(np.float32))
    assert _native._willneed_py(np.zeros((4, w), np.float32), np.array([1])) == 0  # not a memory map: nothing


@native
def test_willneed_cold_advises_only_the_pages_not_in_memory(tmp_path):
    """The residency-checked hint advises the requested rows' pages that are not in the page
    cache (all of them in a freshly reserved file, none once they were written), never a page
    outside the rows (windows span gaps between rows, advice does not), and the rows read after
    it are the same."""
    w = 19
    n = 200_000  # 3,711 pages: several mincore windows with far-apart rows
    f = tmp_path / "slots.bin"
    fd = os.open(f, os.O_RDWR | os.O_CREAT, 0o644)
    os.posix_fallocate(fd, 0, n * w * 4)
    os.close(fd)
    mm = np.memmap(f, dtype=np.float32, mode="r+", shape=(n, w))
    rng = np.random.default_rng(1)
    for slots in [np.array([0, 1, 53, 54, n - 1]), np.sort(rng.choice(n, 700, replace=False)),
                  np.array([5, 5, 6, 100_000, 100_001])]:
        slots = slots.astype(np.int64)
        pages = np.unique(np.concatenate([slots * w * 4 // 4096, ((slots + 1) * w * 4 - 1) // 4096]))
        cold = _native.willneed_cold(mm, slots)
        assert 0 <= cold <= pages.size
        _native.scatter_rows(mm, slots, np.repeat(slots.astype(np.float32)[:, None], w, 1))
        assert _native.willneed_cold(mm, slots) == 0  # written: in the page cache now
        out = np.empty((slots.size, w), np.float32)
        _native.gather_rows(mm, slots, out)
        assert np.array_equal(out[:, 0], slots.astype(np.float32))
    fresh = np.memmap(tmp_path / "fresh.bin", dtype=np.float32, mode="w+", shape=(n, w))
    fresh.flush()
    fd = os.open(tmp_path / "fresh.bin", os.O_RDONLY)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)
    s = np.array([10, 50_000, 150_000], dtype=np.int64)
    assert _native.willneed_cold(fresh, s) == 3  # dropped from the cache: every page is cold
    with pytest.raises(IndexError, match="not sorted"):
        _native.willneed_cold(mm, np.array([3, 1], dtype=np.int64))


def _disk_layout(n_slots: int, w: int) -> tuple[np.ndarray, np.ndarray]:
    return np.zeros(n_slots, np.uint16), np.zeros((n_slots, w), np.float32)


def _home_tag(i: int, n_slots: int) -> tuple[int, int]:
    h = int(mix64(np.array([i], dtype=np.int64).view(np.uint64))[0])
    return ((h >> 32) * n_slots) >> 32, (h & 0xFFFF) % 65534 + 2


@native
@pytest.mark.parametrize("want_rows", [True, False])
def test_disk_find_equals_its_fallback_through_tag_collisions(want_rows):
    """The one-pass disk probe finds the slots (and copies the records) its numpy reference
    finds, and reads as many slots: IDs behind colliding tags, deleted slots and a wrap-around,
    an absent ID whose tag collides, absent IDs, and a random fill."""
    w, n_slots = 6, 64
    tags, table = _disk_layout(n_slots, w)
    x, y = 1234567, -98765
    hx, tx = _home_tag(x, n_slots)
    for k, other in enumerate([11, 12, 13]):  # three other IDs wearing x's tag, one deleted slot, then x
        s = (hx + k) % n_slots
        tags[s] = tx
        table[s, :2] = np.array([other], np.int64).view(np.float32)
    tags[(hx + 3) % n_slots] = 1
    sx = (hx + 4) % n_slots
    tags[sx] = tx
    table[sx, :2] = np.array([x], np.int64).view(np.float32)
    table[sx, 2:] = [1, 2, 3, 4]
    hy, ty = _home_tag(y, n_slots)
    sy = (hy + 7) % n_slots  # may land inside x's run: then y's probe starts there
    if tags[sy] == 0:
        tags[sy] = ty  # a tag like y's, another ID stored: y is absent
        table[sy, :2] = np.array([77], np.int64).view(np.float32)
    rng = np.random.default_rng(3)
    cases = [np.array([x, y, 5, x + 1], np.int64)]
    for _ in range(3):
        n_big = 4096
        t2, tb2 = _disk_layout(n_big, w)
        present = rng.integers(-2**62, 2**62, 3000)
        for i in present:  # insert by linear probing
            h, t = _home_tag(int(i), n_big)
            while t2[h] > 1:
                h = (h + 1) % n_big
            t2[h] = t
            tb2[h, :2] = np.array([i], np.int64).view(np.float32)
            tb2[h, 2:] = rng.standard_normal(w - 2)
        q = np.concatenate([present[:1000], rng.integers(-2**62, 2**62, 500)])
        cases.append((t2, tb2, q))
    for case in cases:
        t_, tb_, q = (tags, table, case) if isinstance(case, np.ndarray) else case
        outs = []
        for fn in (_native.disk_find, _native._disk_find_py):
            slot = np.full(q.size, 99, np.int64)
            rows = np.full((q.size, w - 2), 7.0, np.float32) if want_rows else None
            read = fn(t_, tb_, q, slot, rows)
            outs.append((slot, rows, read))
        (s1, r1, n1), (s2, r2, n2) = outs
        assert np.array_equal(s1, s2) and n1 == n2
        if want_rows:
            assert np.array_equal(r1, r2)
    s = np.empty(4, np.int64)
    assert _native.disk_find(tags, table, cases[0], s, None) >= 4  # x's three collisions, then x
    assert s[0] == sx and s[1] == -1 and s[2] == -1


@native
def test_disk_write_equals_its_fallback(tmp_path):
    """The one-pass disk write leaves the memory-mapped file as its numpy reference does:
    each slot [ID | record], a later duplicate slot winning; slots out of range raise."""
    w, n = 6, 5000
    rng = np.random.default_rng(4)
    files = []
    for name in ("native", "ref"):
        mm = np.memmap(tmp_path / f"{name}.bin", dtype=np.float32, mode="w+", shape=(n, w))
        mm[:] = 1.5
        files.append(mm)
    for _ in range(3):
        slots = rng.integers(0, n, 900).astype(np.int64)  # duplicates among them
        ids = rng.integers(-2**62, 2**62, 900)
        recs = rng.standard_normal((900, w - 2)).astype(np.float32)
        _native.disk_write(files[0], slots, ids, recs)
        _native._disk_write_py(files[1], slots, ids, recs)
        assert np.array_equal(np.asarray(files[0]).view(np.int32), np.asarray(files[1]).view(np.int32))  # IDs: NaN words
    last = {int(s): i for i, s in enumerate(slots)}
    s0, i0 = next(iter(last.items()))
    assert np.ascontiguousarray(files[0][s0, :2]).view(np.int64)[0] == ids[i0]
    with pytest.raises(IndexError, match="slot out of range"):
        _native.disk_write(files[0], np.array([n], np.int64), np.array([1], np.int64), np.zeros((1, w - 2), np.float32))


@native
def test_read_and_write_rows_release_every_table_array_they_borrow():
    """The compiled calls take each table's arrays as buffers and must give every one back: a
    buffer kept holds its array (memory never freed, an array that cannot be resized)."""
    g = _group(9)
    tables = _copy(g["tables"])
    before = [[sys.getrefcount(a) for a in t] for t in tables]
    n, t = g["query"].size, len(tables)
    _native._core.write_rows(tables, g["ids"], g["bounds"], g["slot"].copy(), g["records"], np.empty(0, np.float32),
                             g["next"].copy(), g["clocks"], np.zeros(t, np.int64), np.zeros(t, np.int64),
                             np.empty(0, np.int64), np.empty(0, np.int64), np.empty(0), R, 0)  # one call, no thread split
    _native._core.read_rows([tb[:5] for tb in tables], g["query"], g["qbounds"], np.zeros((n, R), np.float32),
                            np.zeros(n, np.int64), g["clocks"], np.zeros(t, np.int64), R, 0)
    assert [[sys.getrefcount(a) for a in t] for t in tables] == before
