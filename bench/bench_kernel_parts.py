"""How a kernel's call splits over threads: one part, parts on a Python thread pool (how
every kernel split before the twenty-seventh session), and the core's own parts on OpenMP's
threads (``part_count``: every kernel since the twenty-eighth). The first kernel is
``gather_rows`` (the single-hot pooling's gather: random rows of a table of 17-float records,
their 16 weights copied), at the sizes a step calls it with, in one part, on the pool and on
OpenMP's threads (``--threads`` parts each); then each kernel that moved from the
pool to OpenMP in the twenty-eighth session, one part against its parts, at three sizes. Each
variant alternates with the others call by call, medians over ``--calls``.

    python bench/bench_kernel_parts.py [--calls 300] [--threads 2]

Last line: one JSON object; ``openmp_vs_one`` and ``pool_vs_one`` per call size (rows), the
speed-up of ``--threads`` parts over one; ``handoff_us``: the pool's own cost of ``--threads``
empty parts;
``kernel_vs_one``: per moved kernel and size, the speed-up of its parts over one part.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

import ember  # noqa: F401  # first: before torch loads (GOMP_SPINCOUNT, as the ember command sets it)
import numpy as np
import torch

from ember import _native
from benchkit import json_line

SIZES = [2048, 4096, 8192, 16384, 41_500, 106_496]  # rows: a DLRM-26 step's ~41.5 k unique rows, 106 k pooled
MOVED_SIZES = [4096, 16384, 106_496]


def _alternate(variants: dict[str, Callable[[], object]], calls: int) -> dict[str, float]:
    """Median microseconds of each variant, called in turn (the order rotating) ``calls`` times
    after five warm-up rounds."""
    t: dict[str, list[float]] = {v: [] for v in variants}
    names = list(variants)
    for c in range(calls + 5):
        for name in names[c % len(names):] + names[: c % len(names)]:
            s = time.perf_counter()
            variants[name]()
            if c >= 5:
                t[name].append(time.perf_counter() - s)
    return {v: statistics.median(x) * 1e6 for v, x in t.items()}


def _moved_kernels(core, n: int, tmp: str) -> dict[str, Callable[[int], object]]:
    """Each moved kernel on ``n`` rows of a training step's shape, as a function of its parts."""
    rng = np.random.default_rng(n)
    ids = rng.integers(0, 2**62, n)
    keys = rng.integers(0, 2**63, n).astype(np.uint64)
    rec = rng.standard_normal((n, 17)).astype(np.float32)
    flat, grads = rec.reshape(-1), rng.standard_normal((n, 16)).astype(np.float32).reshape(-1)
    out16, out9 = np.empty((n, 16), np.float32), np.empty((n, 9), np.float32)  # 16 weights; bf16: 8 words + 1
    seeds, steps = np.zeros(n, np.int64), np.ones(n, np.int64)
    h, ok = np.empty(n, np.int64), np.empty(n, bool)
    words = rng.integers(0, 10**9, n).astype(np.int64)
    from ember.tiers.key_index import KeyIndex
    from ember.tiers.disk import DiskTier
    idx = KeyIndex(2 * n)
    slot_of = rng.permutation(n).astype(np.int64)
    idx.insert(ids, slot_of.astype(np.int32))
    slot_id = np.empty(n, np.int64)
    slot_id[slot_of] = ids
    salt, count, last, held, found = np.zeros(n, np.int64), np.zeros(n, np.int64), np.zeros(n, np.int64), np.zeros(n, np.int32), np.empty(n, np.int64)
    m = 16 * n  # a victim scan's slots: a cache larger than a batch
    s_last, s_count, s_live, s_held, score = (rng.integers(0, 1000, m), rng.integers(0, 50, m), np.ones(m, bool),
                                              np.zeros(m, np.int32), np.empty(m, np.int64))
    disk = DiskTier(f"{tmp}/d{n}", record_dim=17, rows=2 * n)
    disk.put(torch.from_numpy(ids), torch.from_numpy(rec))
    table, slots, rows = np.asarray(disk._mm), np.empty(n, np.int64), np.empty((n, 17), np.float32)
    w, copy = table.shape[1], table.copy()  # the writes go to a copy of the tier's file
    write_slots = rng.permutation(table.shape[0])[:n]
    return {
        "rowwise_adagrad": lambda p: core.rowwise_adagrad(flat, flat[16:], grads, n, 16, 17, 17, 16, 1e-9, 1e-8, p),
        "uniform01": lambda p: core.uniform01(ids, keys, 16, out16, 2.0, -1.0, p),
        "normal01": lambda p: core.normal01(ids, keys, keys, 16, out16, 0.1, p),
        "bf16_pack_sr": lambda p: core.bf16_pack_sr(rec, ids, seeds, steps, out9, 16, 17, p),
        "arrow_hash_ints": lambda p: core.arrow_hash_ints(words, b"", 0, n, 8, True, 5, h, ok, p),
        "pair_find": lambda p: core.pair_find(idx.keys, idx.slots, ids, salt, slot_id, count, last, held, 1, found, p),
        "gc_scores": lambda p: core.gc_scores(s_last, s_count, s_live, s_held, False, score, 0, m, p),
        "disk_find": lambda p: core.disk_find(disk._tags, table, ids, slots, rows, w, p),
        "disk_write": lambda p: core.disk_write(copy, write_slots, ids, rec, w, p),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=300)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    core = _native.require()
    if not _native.native_parts():
        raise SystemExit("the native core was built without OpenMP: nothing to compare")
    rng = np.random.default_rng(0)
    src = rng.standard_normal((800_000, 17)).astype(np.float32)
    flat = src.reshape(-1)
    k = args.threads

    def one(idx, out):
        core.gather_rows(flat, idx, out, 16, 17, 1)

    pool_threads = ThreadPoolExecutor(max_workers=k - 1)  # as the kernels' pool was: this thread runs the first part

    def run_pool(fn, n):  # fn(lo, hi) over k equal ranges
        bounds = [n * j // k for j in range(k + 1)]
        futures = [pool_threads.submit(fn, lo, hi) for lo, hi in zip(bounds[1:-1], bounds[2:])]
        fn(bounds[0], bounds[1])
        for f in futures:
            f.result()

    def pool(idx, out):
        run_pool(lambda lo, hi: core.gather_rows(flat, idx[lo:hi], out[lo:hi], 16, 17), idx.size)

    def openmp(idx, out):
        core.gather_rows(flat, idx, out, 16, 17, k)

    variants = {"one": one, "pool": pool, "openmp": openmp}
    out: dict = {"openmp_vs_one": {}, "pool_vs_one": {}, "us": {}}
    for n in SIZES:
        idx = rng.integers(0, src.shape[0], n)
        buf = np.empty((n, 16), dtype=np.float32)
        us = _alternate({v: (lambda f=f: f(idx, buf)) for v, f in variants.items()}, args.calls)
        out["us"][n] = us
        out["openmp_vs_one"][n] = us["one"] / us["openmp"]
        out["pool_vs_one"][n] = us["one"] / us["pool"]
        print(f"{n:>8} rows: one part {us['one']:8.1f} us; {k} on the Python pool {us['pool']:8.1f} "
              f"({out['pool_vs_one'][n]:.2f}x); {k} on OpenMP's threads {us['openmp']:8.1f} ({out['openmp_vs_one'][n]:.2f}x)")
    empty = []
    for _ in range(args.calls):
        s = time.perf_counter()
        run_pool(lambda lo, hi: None, k)
        empty.append(time.perf_counter() - s)
    out["handoff_us"] = statistics.median(empty) * 1e6
    print(f"the pool's hand-off of {k} empty parts: {out['handoff_us']:.1f} us")
    out["kernel_vs_one"] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for n in MOVED_SIZES:
            for name, fn in _moved_kernels(core, n, tmp).items():
                us = _alternate({"one": lambda f=fn: f(1), "parts": lambda f=fn: f(k)}, max(args.calls // 3, 1))
                out["kernel_vs_one"].setdefault(name, {})[n] = us["one"] / us["parts"]
                print(f"{name:>16} {n:>7} rows: one part {us['one']:8.1f} us, {k} parts {us['parts']:8.1f} us "
                      f"({us['one'] / us['parts']:.2f}x)")
    print(json_line({"bench": "kernel_parts", "threads": args.threads, **out}))


if __name__ == "__main__":
    main()
