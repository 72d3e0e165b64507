"""ember's own work per DLRM-26 step (bench_dlrm's workload: plan + fetch, the pooling's forward
and backward on a fixed gradient, the sparse step: no dense model), at torch thread counts
alternating step by step, fitted as t(threads) = serial + parallel / threads per part: what more
cores cannot shorten (``serial_ms``) and what they divide (``parallel_ms``), and so the part's
predicted time on a host with more cores (``predicted_ms`` at ``--predict`` threads).

    python bench/bench_own_work.py [--steps 60] [--warmup 20] [--threads 1 2] [--predict 16] [--min-count N]

``--min-count N``: every table with ``min_count`` N (an ID gets its own row once seen N times;
until then it reads a shared all-zero row and takes no update): the counter filter's own cost,
against the same command without it (the workload's IDs keep arriving: at N = 2 a step holds
back 24-34 % of its unique IDs over steps 20-80).

Last line: one JSON object (``ms`` per part and thread count, ``serial_ms``, ``parallel_ms``,
``predicted_ms``, each by part and in ``total``).
"""

from __future__ import annotations

import argparse
import statistics
import time

import ember  # noqa: F401  # first: before torch loads (GOMP_SPINCOUNT, as the ember command sets it)
import numpy as np
import torch

import bench_dlrm as b
from benchkit import json_line

PARTS = ("plan+fetch", "pooling", "sparse step")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--batch", type=int, default=4096)
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--predict", type=int, default=16)
    ap.add_argument("--min-count", type=int, default=1, help="every table's min_count (1: none)")
    args = ap.parse_args()
    batches = b.make_batches(args.warmup + args.steps * len(args.threads), args.batch)
    run = b.Ember(min_count=args.min_count)
    cot = torch.full((args.batch, b.D), 1e-3)
    ms: dict[int, dict[str, list[float]]] = {t: {p: [] for p in PARTS} for t in args.threads}
    for i, (ids, _, _) in enumerate(batches):
        threads = args.threads[i % len(args.threads)]
        torch.set_num_threads(threads)
        sf = run.features(ids)
        t0 = time.perf_counter()
        lk = run.ec.plan(sf).fetch()
        t1 = time.perf_counter()
        emb = run.ec(sf, lk)
        torch.autograd.backward([emb[k] for k in sf.keys], [cot] * len(sf.keys))
        t2 = time.perf_counter()
        run.sparse_opt.step()
        t3 = time.perf_counter()
        if i >= args.warmup:
            for p, dt in zip(PARTS, (t1 - t0, t2 - t1, t3 - t2)):
                ms[threads][p].append(dt * 1e3)
    med = {t: {p: statistics.median(v) for p, v in d.items()} for t, d in ms.items()}
    x = np.array([1.0 / t for t in args.threads])
    fit: dict[str, dict[str, float]] = {"serial_ms": {}, "parallel_ms": {}, "predicted_ms": {}}
    for p in (*PARTS, "total"):
        y = np.array([sum(med[t].values()) if p == "total" else med[t][p] for t in args.threads])
        parallel, serial = np.polyfit(x, y, 1)  # t = serial + parallel / threads
        fit["serial_ms"][p], fit["parallel_ms"][p] = float(serial), float(parallel)
        fit["predicted_ms"][p] = float(serial + parallel / args.predict)
        print(f"{p:<12} " + "  ".join(f"{t} thr {y[j]:6.2f} ms" for j, t in enumerate(args.threads))
              + f"  -> serial {serial:5.2f} + parallel {parallel:5.2f} / threads; at {args.predict}: {fit['predicted_ms'][p]:5.2f} ms")
    print(json_line({"bench": "own_work", "batch": args.batch, "threads": args.threads, "predict": args.predict,
                     "min_count": args.min_count,
                     "ms": {str(t): d for t, d in med.items()}, **fit}))


if __name__ == "__main__":
    main()
