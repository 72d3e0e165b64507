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
    lines = [r.getMessage() for r in caplog.records if "row kernels run on one thread" in r.getMessage()]
    assert len(lines) == 1 and ("forked" in lines[0] or "without OpenMP" in lines[0])
    once.forget("native.parts")
