"""The core's own parts (OpenMP): a kernel split into parts gives the bits of one part, runs them
on torch's libgomp, and runs in line in a forked child (where GNU libgomp's threads are gone)."""

from __future__ import annotations

import logging
import os
import time

import numpy as np
import pytest
import torch

from ember import _native, once

native = pytest.mark.skipif(not _native.is_available(), reason="ember native core not available (not built, or EMBER_NATIVE=0)")
openmp = pytest.mark.skipif(not _native.native_parts(), reason="the native core was built without OpenMP")


@native
def test_part_bounds_keep_items_that_must_stay_together(monkeypatch):
    monkeypatch.setattr(torch, "get_num_threads", lambda: 4)
    monkeypatch.setattr(_native, "MIN_PART_ROWS", 10)
    if not _native.native_parts():
        assert _native.part_bounds([50] * 8) is None and _native.part_count(400) == 1
        return
    bounds = _native.part_bounds([50] * 8, [True, False, True, False, True, False, True, False])
    assert bounds.tolist() == [0, 2, 4, 6, 8]
    assert _native.part_bounds([50] * 8, [True] + [False] * 7) is None  # one item run: one part
    assert _native.part_count(400) == 4 and _native.part_count(25) == 2 and _native.part_count(19) == 1
    monkeypatch.setattr(_native, "MIN_PART_ROWS", 1000)
    assert _native.part_bounds([50] * 8) is None and _native.part_count(400) == 1  # too small to split


@native
def test_no_parts_on_a_pool_thread(monkeypatch):
    """A kernel called from a task of ``run_each`` (a group's tables at once) runs as one part:
    the pool's threads are busy with the other tasks already."""
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    monkeypatch.setattr(_native, "MIN_PART_ROWS", 10)
    seen = _native.run_each([lambda: _native.part_count(1000), lambda: _native.part_count(1000)])
    assert seen == [1, 1]
    assert _native.part_count(1000) == (2 if _native.native_parts() else 1)


@native
def test_fresh_rows_in_parts_equal_one_part():
    rng = np.random.default_rng(5)
    n, width, dim = 9000, 6, 5
    ids = rng.integers(-(2**62), 2**62, n)
    keys = rng.integers(0, 2**63, n).astype(np.uint64)
    at = rng.permutation(n + 100)[:n]
    mul, add = rng.random(n).astype(np.float32), rng.random(n).astype(np.float32)
    fill = np.array([0.25], dtype=np.float32)
    outs = []
    for parts in (1, 2, 3, 7):
        out = np.full((n + 100, width), -1.0, dtype=np.float32)
        _native._core.fresh_uniform(ids, keys, at, out, width, dim, mul, add, fill, False, parts)
        outs.append(out)
    want = np.full((n + 100, width), -1.0, dtype=np.float32)
    _native._fresh_uniform_py(ids, keys, at, want, dim, mul, add, fill, False)
    for out in outs:
        np.testing.assert_array_equal(out.view(np.uint32), want.view(np.uint32))


@native
def test_unique_segments_in_uneven_parts_equal_one_part():
    rng = np.random.default_rng(6)
    sizes = [0, 5000, 1, 0, 3000, 7000, 0]
    ids = rng.integers(0, 900, sum(sizes))
    bounds = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    want = _native._unique_segments_py(ids, bounds)
    for parts in (None, [0, 7], [0, 2, 7], [0, 1, 3, 5, 6, 7], [0, 0, 4, 4, 7]):
        uniq, inverse, counts = (np.empty_like(ids), np.empty_like(ids), np.empty(len(sizes), np.int64))
        p = None if parts is None else np.array(parts, dtype=np.int64)
        total = _native._core.unique_segments(ids, bounds, uniq, inverse, counts, p)
        for x, y in zip((uniq[:total], inverse, counts), want):
            np.testing.assert_array_equal(x, y)
    with pytest.raises(ValueError, match="parts must rise from 0 to 7"):
        _native._core.unique_segments(ids, bounds, uniq, inverse, counts, np.array([0, 5, 3, 7], dtype=np.int64))


@openmp
def test_the_core_shares_torchs_openmp_runtime():
    """One libgomp answers to the name the extension asks for (``libgomp.so.1``): its parts run on
    the threads torch's operations use (a second runtime would keep a second pool of threads
    spinning beside torch's). Libraries that bring their own renamed copy (scikit-learn's
    ``libgomp-<hash>.so``) keep it to themselves."""
    maps = open("/proc/self/maps").read().splitlines() if os.path.exists("/proc/self/maps") else []
    if not maps:
        pytest.skip("no /proc/self/maps here")
    gomp = {line.split()[-1] for line in maps if os.path.basename(line.split()[-1]).startswith("libgomp.so")}
    assert len(gomp) == 1, gomp


@openmp
def test_a_forked_child_runs_the_parts_in_line():
    """After the parent ran parts on OpenMP's threads, a forked child's kernel neither waits on
    threads that do not exist there (it would hang) nor differs: it runs its parts in line, and
    the wrappers say once that the kernels run on one thread."""
    rng = np.random.default_rng(7)
    src = rng.standard_normal((5000, 9)).astype(np.float32)
    slots = rng.integers(0, 5000, 40_000)
    out = np.empty((40_000, 9), dtype=np.float32)
    _native._core.gather_rows(src, slots, out, 9, 9, 2)  # the parent's OpenMP threads started
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: no pytest machinery, an exit status only
        ok = False
        try:
            mine = np.empty_like(out)
            _native._core.gather_rows(src, slots, mine, 9, 9, 2)
            ok = np.array_equal(mine, src[slots]) and not _native.native_parts() and _native.part_count(10**6) == 1
        finally:
            os.write(w, b"1" if ok else b"0")
            os._exit(0)
    os.close(w)
    deadline = time.monotonic() + 60
    while os.waitpid(pid, os.WNOHANG) == (0, 0):
        if time.monotonic() > deadline:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            pytest.fail("a forked child's kernel hung on its parent's OpenMP threads")
        time.sleep(0.05)
    assert os.read(r, 1) == b"1"
    os.close(r)
    np.testing.assert_array_equal(out, src[slots])


@native
def test_forked_state_is_said_once(monkeypatch, caplog):
    monkeypatch.setattr(_native, "_forked", True)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    once.forget("native.parts")
    with caplog.at_level(logging.WARNING, logger="ember"):
        assert _native.part_count(10**6) == 1 and _native.part_bounds([10**5] * 4) is None
    lines = [r.getMessage() for r in caplog.records if "kernels run on one thread" in r.getMessage()]
    assert len(lines) == 1 and ("forked" in lines[0] or "without OpenMP" in lines[0])
    once.forget("native.parts")


PARTS = (1, 2, 3, 7)  # one part, even and uneven splits, more parts than threads


def _same(runs: list) -> None:
    """Every run's outputs (tuples of arrays and numbers) equal the first's, bit for bit."""
    for run in runs[1:]:
        for a, b in zip(runs[0], run):
            if isinstance(a, np.ndarray):
                assert a.dtype == b.dtype and np.array_equal(a.view(np.uint8), b.view(np.uint8))
            else:
                assert a == b


@native
@pytest.mark.parametrize("n", [0, 5, 5000])
def test_row_range_kernels_in_parts_equal_one_part_and_the_fallback(n):
    """The kernels that split a call into equal row ranges (here the optimizer, the initialisers
    and the bf16 packing; Arrow hashing and the disk tier below; the group cache's probe and
    victim scores in test_pair_find.py and test_group_cache_passes.py) give the bits of one part
    for any part count, fewer rows than parts included, and (where the fallback is exact) the
    fallback's."""
    core, rng = _native._core, np.random.default_rng(n)
    ids = rng.integers(-(2**62), 2**62, n)
    keys = rng.integers(0, 2**63, n).astype(np.uint64)
    base = rng.standard_normal((n, 9)).astype(np.float32)  # 8 weights and the accumulator
    base[:, 8] = np.abs(base[:, 8])
    grads = rng.standard_normal((n, 8)).astype(np.float32)
    runs: dict[str, list] = {}
    for parts in PARTS:
        rec = base.copy()
        flat = rec.reshape(-1)  # weights every 9 floats from 0, the accumulator from 8
        core.rowwise_adagrad(flat, flat[8:], grads.reshape(-1), n, 8, 9, 9, 8, 0.05, 1e-8, parts)
        runs.setdefault("adagrad", []).append((rec,))
        out = np.empty((n, 5), np.float32)
        core.uniform01(ids, keys, 5, out, np.full(n, 2.0, np.float32), np.full(n, -1.0, np.float32), parts)
        runs.setdefault("uniform01", []).append((out,))
        out = np.empty((n, 70), np.float32)  # > one block of the normal rows' scratch (64)
        core.normal01(ids, keys, keys[::-1].copy(), 70, out, 0.3, parts)
        runs.setdefault("normal01", []).append((out,))
        src = np.random.default_rng(2).standard_normal((n, 7)).astype(np.float32)
        out = np.empty((n, 5), np.float32)
        seeds, steps = np.arange(n) // 1000, np.full(n, 9)
        core.bf16_pack_sr(src, ids, seeds, steps, out, 4, 7, parts)
        runs.setdefault("bf16_pack_sr", []).append((out,))
    for name, run in runs.items():
        _same(run)
    ref = np.empty((n, 5), np.float32)
    _native._uniform01_py(ids, keys, 5, ref, np.full(n, 2.0, np.float32), np.full(n, -1.0, np.float32))
    _same([runs["uniform01"][0], (ref,)])
    ref = np.empty((n, 70), np.float32)
    _native._normal01_py(ids, keys, keys[::-1].copy(), 70, ref, 0.3)
    _same([runs["normal01"][0], (ref,)])
    src = np.random.default_rng(2).standard_normal((n, 7)).astype(np.float32)
    ref = np.empty((n, 5), np.float32)
    _native._bf16_pack_sr_py(src, ids, np.arange(n) // 1000, np.full(n, 9), 4, ref)
    _same([runs["bf16_pack_sr"][0], (ref,)])


@native
@pytest.mark.parametrize("n", [0, 5, 5000])
def test_arrow_hashing_in_parts_equals_one_part_and_the_fallback(n):
    pa = pytest.importorskip("pyarrow")
    rng = np.random.default_rng(n)
    strings = pa.array([None if i % 7 == 3 else "v" * (i % 19) + str(i) for i in range(n + 3)]).slice(3)
    ints = pa.array([None if i % 5 == 1 else int(v) for i, v in enumerate(rng.integers(-(2**40), 2**40, n + 2))],
                    pa.int64()).slice(2)
    got = []
    for parts in (*PARTS, None):  # None: the fallback
        h, ok = np.empty(n, np.int64), np.empty(n, bool)
        h2, ok2 = np.empty(n, np.int64), np.empty(n, bool)
        sb, ib = strings.buffers(), ints.buffers()
        sargs = (sb[1], sb[2] or b"", sb[0] or b"", strings.offset, n, 4, 77)
        iargs = (ib[1], ib[0] or b"", ints.offset, n, 8, True, 77)
        if parts is None:
            nulls = (_native._arrow_hash_strings_py(*sargs, h, ok), _native._arrow_hash_ints_py(*iargs, h2, ok2))
        else:
            nulls = (_native._core.arrow_hash_strings(*sargs, h, ok, parts), _native._core.arrow_hash_ints(*iargs, h2, ok2, parts))
        got.append((h, ok, h2, ok2, *nulls))
    _same(got)
    assert n == 0 or got[0][4] > 0 and got[0][5] > 0  # nulls were counted


@native
def test_a_bad_offset_is_named_by_its_value_in_any_part():
    """The first value whose offsets leave the data is the one named, whichever part finds it."""
    offs = np.arange(0, 9001, dtype=np.int32)
    offs[6001:] += 10**6  # value 6000 ends past the data
    for parts in PARTS:
        with pytest.raises(ValueError, match="offsets of value 6000 out"):
            _native._core.arrow_hash_strings(offs, b"x" * 9000, b"", 0, 9000, 4, 1, np.empty(9000, np.int64),
                                             np.empty(9000, bool), parts)


@native
def test_disk_probe_and_write_in_parts_equal_one_part_and_the_fallback(tmp_path):
    from ember.tiers.disk import DiskTier

    g = torch.Generator().manual_seed(4)
    d = DiskTier(tmp_path / "d", record_dim=6, rows=8000)
    held = torch.randperm(1 << 20, generator=g)[:5000].to(torch.int64) * 7919
    d.put(held, torch.randn(5000, 6, generator=g))
    absent = torch.randperm(1 << 20, generator=g)[:1000] + (1 << 33)
    query = torch.cat([held[torch.randperm(5000, generator=g)[:3000]], absent]).numpy()
    table = np.asarray(d._mm)
    runs = []
    for parts in (*PARTS, None):
        slot, rows = np.empty(query.size, np.int64), np.full((query.size, 6), -1.0, np.float32)
        args = (d._tags, table, query, slot, rows)
        read = _native._disk_find_py(*args) if parts is None else _native._core.disk_find(*args, 8, parts)
        runs.append((read, slot, rows))
    _same(runs)
    assert (runs[0][1] >= 0).sum() == 3000
    slots = np.random.default_rng(5).permutation(table.shape[0])[:4000]
    recs = np.random.default_rng(6).standard_normal((4000, 6)).astype(np.float32)
    files = []
    for parts in (*PARTS, None):
        t = table.copy()
        if parts is None:
            _native._disk_write_py(t, slots, query[:4000], recs)
        else:
            _native._core.disk_write(t, slots, query[:4000], recs, 8, parts)
        files.append((t,))
    _same(files)
