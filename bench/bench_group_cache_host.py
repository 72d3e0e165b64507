"""The host half of a group cache's step: CPU ms of ``GroupCache.fetch`` and ``write_back``.

DLRM-26 as bench_gpu_cache.py (26 tables x 200 k IDs, dim 16, row-wise Adagrad, Zipf 1.05,
batch 4096), one table group with a cache of 1/4 of each table's IDs in front of host memory,
the arena in host memory (on a CPU the "device" is an arena in host memory; the host half is
the same code a GPU runs). Two collections train on the same batches in one process: one with
the group cache's native passes (``ember._native.gc_scan``, ``gc_requeue``, ``gc_reserve``, ``gc_insert``, ``gc_release``),
one with their numpy fallbacks (the reference); per step, in alternating order, the wall ms of
each one's fetch (all host work: probe, admission, victims, staging) and write_back (its host
bookkeeping plus one scatter of the rows into the arena). At the end the two caches' slot
arrays and arenas must be equal (the native passes are exact).

    PYTHONPATH=. python bench/bench_group_cache_host.py [--warmup 80] [--steps 20] [--batch 4096]
        [--profile-top K]

The last line is one JSON object: per side, median and mean ms of fetch and write_back (the
victim scan runs once per few steps: the mean counts it), and the ratios of the medians.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from contextlib import contextmanager
from typing import Any, Iterator

import ember  # noqa: F401  # first: before torch loads

import numpy as np
import torch

import bench_dlrm
from bench_dlrm import D, F, V, make_batches
from bench_gpu_cache import ZIPF, EmberVariant, cotangents
from ember import _native, allocator

# the group cache's native passes and their numpy references (what "fallback" swaps in)
PASSES = ("gc_scan", "gc_requeue", "gc_reserve", "gc_insert", "gc_release")


@contextmanager
def fallback(on: bool) -> Iterator[None]:
    """With ``on``: the group cache's native passes replaced by their numpy references."""
    saved = {p: getattr(_native, p) for p in PASSES if hasattr(_native, p)}
    if on:
        for p in saved:
            setattr(_native, p, getattr(_native, f"_{p}_py"))
    try:
        yield
    finally:
        for p, fn in saved.items():
            setattr(_native, p, fn)


class Timed:
    """Wall ms of a group cache's fetch and write_back, per call."""

    def __init__(self, cache: Any) -> None:
        self.ms: dict[str, list[float]] = {"fetch": [], "write_back": []}
        self.on = False
        for name in self.ms:
            setattr(cache, name, self._wrap(name, getattr(cache, name)))

    def _wrap(self, name: str, fn: Any) -> Any:
        def timed(*a: Any, **k: Any) -> Any:
            t0 = time.perf_counter()
            out = fn(*a, **k)
            if self.on:
                self.ms[name].append(1e3 * (time.perf_counter() - t0))
            return out
        return timed


def main() -> None:
    allocator.reexec_tuned([__file__, *sys.argv[1:]])  # as the ember command line runs (see ember/allocator.py)
    ap = argparse.ArgumentParser()
    ap.add_argument("--warmup", type=int, default=80, help="steps before timing (the 1/4 cache evicts from ~66 on)")
    ap.add_argument("--steps", type=int, default=20, help="timed steps")
    ap.add_argument("--batch", type=int, default=4096)
    ap.add_argument("--vocab", type=int, default=V)
    ap.add_argument("--frac", type=int, default=4, help="cache 1/frac of each table's IDs")
    ap.add_argument("--profile-top", type=int, default=0, help="cProfile's top functions (own time) of each side")
    ap.add_argument("--only", choices=("native", "fallback"), default=None, help="run one side only")
    args = ap.parse_args()
    torch.manual_seed(0)
    bench_dlrm.W = bench_dlrm.Workload([args.vocab] * F)
    batches = make_batches(args.warmup + args.steps, args.batch, zipf=ZIPF)
    dev = torch.device("cpu")
    sides = [s for s in ("native", "fallback") if args.only in (None, s)]
    var = {s: EmberVariant(f"cache-1/{args.frac}-{s}", max(args.vocab // args.frac, 1), dev) for s in sides}
    timers = {s: Timed(v.ec.groups[0].cache) for s, v in var.items()}
    cot = cotangents(var[sides[0]].keys, args.batch, dev)
    print(f"native core: {_native.is_available()}; {F} tables x {args.vocab} IDs, cache 1/{args.frac}, Zipf {ZIPF}, "
          f"batch {args.batch}; {args.warmup} warm-up + {args.steps} timed steps, sides {sides}")
    profs = {s: None for s in sides}
    if args.profile_top:
        import cProfile
        profs = {s: cProfile.Profile() for s in sides}
    for i, (ids, _, _) in enumerate(batches):
        timed = i >= args.warmup
        order = sides if i % 2 == 0 else sides[::-1]
        for s in order:
            sf = var[s].features(ids)
            timers[s].on = timed
            with fallback(s == "fallback"):
                if timed and profs[s] is not None:
                    profs[s].enable()
                var[s].embedding_path(sf, cot)
                if timed and profs[s] is not None:
                    profs[s].disable()
    out: dict[str, Any] = {"bench": "group_cache_host", "batch": args.batch, "vocab": args.vocab, "frac": args.frac,
                           "zipf": ZIPF, "steps": args.steps, "native_core": _native.is_available()}
    for s in sides:
        c = var[s].ec.groups[0].cache
        med = {k: statistics.median(v) for k, v in timers[s].ms.items()}
        mean = {k: statistics.fmean(v) for k, v in timers[s].ms.items()}
        out[s] = {f"{k}_ms": round(m, 2) for k, m in med.items()}
        out[s].update({f"{k}_mean_ms": round(m, 2) for k, m in mean.items()})
        print(f"{s:<9} fetch {med['fetch']:.2f} ms (mean {mean['fetch']:.2f}), write_back {med['write_back']:.2f} ms "
              f"(mean {mean['write_back']:.2f}); median of {args.steps}; arena rows {int(c.live.sum())}/{c.capacity}")
        if profs[s] is not None:
            import pstats
            print(f"cProfile of {s}, top {args.profile_top} by own time:")
            pstats.Stats(profs[s]).sort_stats("tottime").print_stats(args.profile_top)
    if len(sides) == 2:
        a, b = (var[s].ec.groups[0].cache for s in sides)
        differ = [n for n in ("live", "owner", "slot_id", "count", "last", "held")
                  if not np.array_equal(getattr(a, n), getattr(b, n))]
        # (not the trash row: the rows without a slot all land there, whichever last)
        differ += [] if torch.equal(a.arena[: a.capacity], b.arena[: b.capacity]) else ["arena"]
        same = not differ
        out["identical"] = same
        if differ:
            print(f"the caches differ in: {differ}")
        for k in ("fetch", "write_back"):
            out[f"{k}_speedup"] = round(out["fallback"][f"{k}_ms"] / out["native"][f"{k}_ms"], 2)
        print(f"native vs fallback: fetch x{out['fetch_speedup']}, write_back x{out['write_back_speedup']}; "
              f"caches identical: {same}")
    for v in var.values():
        v.ec.close()
    from benchkit import json_line  # the machine (CPU model, bf16, allocator) in the final line

    print(json_line(out))


if __name__ == "__main__":
    main()
