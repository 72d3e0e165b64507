"""How a row kernel's call splits over threads: one part, two parts on the Python pool of
``run_chunks`` (how every kernel split before the twenty-seventh session), and the core's own
parts on OpenMP's threads (``part_count``: the row kernels of a training step now). The kernel is
``gather_rows`` (the single-hot pooling's gather: random rows of a table of 17-float records,
their 16 weights copied), at the sizes a step calls it with; each variant alternates with the
others call by call, medians over ``--calls``.

    python bench/bench_kernel_parts.py [--calls 300] [--threads 2]

Last line: one JSON object; ``openmp_vs_one`` and ``pool_vs_one`` per call size (rows), the
speed-up of two parts over one; ``handoff_us``: ``run_chunks``' own cost of two empty parts.
"""

from __future__ import annotations

import argparse
import statistics
import time

import ember  # noqa: F401  # first: before torch loads (GOMP_SPINCOUNT, as the ember command sets it)
import numpy as np
import torch

from ember import _native
from benchkit import json_line

SIZES = [2048, 4096, 8192, 16384, 41_500, 106_496]  # rows: a DLRM-26 step's ~41.5 k unique rows, 106 k pooled


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

    def pool(idx, out):  # (equal ranges, one per thread: torch's threads are k)
        _native.run_chunks(lambda lo, hi: core.gather_rows(flat, idx[lo:hi], out[lo:hi], 16, 17),
                           _native.even_chunks(idx.size, 1))

    def openmp(idx, out):
        core.gather_rows(flat, idx, out, 16, 17, k)

    variants = {"one": one, "pool": pool, "openmp": openmp}
    out: dict = {"openmp_vs_one": {}, "pool_vs_one": {}, "us": {}}
    for n in SIZES:
        idx = rng.integers(0, src.shape[0], n)
        buf = np.empty((n, 16), dtype=np.float32)
        t: dict[str, list[float]] = {v: [] for v in variants}
        for c in range(args.calls + 5):
            names = list(variants)
            for name in names[c % 3:] + names[: c % 3]:
                s = time.perf_counter()
                variants[name](idx, buf)
                if c >= 5:
                    t[name].append(time.perf_counter() - s)
        us = {v: statistics.median(x) * 1e6 for v, x in t.items()}
        out["us"][n] = us
        out["openmp_vs_one"][n] = us["one"] / us["openmp"]
        out["pool_vs_one"][n] = us["one"] / us["pool"]
        print(f"{n:>8} rows: one part {us['one']:8.1f} us; two on the Python pool {us['pool']:8.1f} "
              f"({out['pool_vs_one'][n]:.2f}x); two on OpenMP's threads {us['openmp']:8.1f} ({out['openmp_vs_one'][n]:.2f}x)")
    empty = []
    for _ in range(args.calls):
        s = time.perf_counter()
        _native.run_chunks(lambda lo, hi: None, [(0, 1), (1, 2)])
        empty.append(time.perf_counter() - s)
    out["handoff_us"] = statistics.median(empty) * 1e6
    print(f"run_chunks of two empty parts: {out['handoff_us']:.1f} us")
    print(json_line({"bench": "kernel_parts", "threads": args.threads, **out}))


if __name__ == "__main__":
    main()
