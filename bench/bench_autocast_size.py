"""Where bf16 autocast starts to pay for the dense model: the measurements behind
``train.precision: auto``'s size rule (``ember.train.precision.BF16_MIN_MACS``).

A DLRM's dense step alone (forward on fixed pooled embeddings + binary cross-entropy + backward +
Adam), in fp32 and under bf16 autocast, alternating step by step in one process; per
configuration the median over ``--steps`` of the paired ratio fp32 time / bf16 time (> 1: bf16
is faster). Configurations: configs/criteo.yaml's model (bottom 32-4, top 16, dim 4),
configs/demo.yaml's (64-16 / 128-64, dim 16), a middle one (128-16 / 256-128) and bench_dlrm's
(512-256-16 / 512-256), each at several batch sizes, so the linear layers' multiply-adds per
batch (``dense_macs`` x batch, what auto weighs) span 0.8 M to 1.9 G. On a CPU without native bf16
the bf16 side is emulated (slower everywhere): the figures only mean something where auto would
consider bf16.

    python bench/bench_autocast_size.py [--steps 40] [--warmup 5] [--device cpu|cuda] [--threads N] [--wide]

``--wide`` adds wider dense models (up to the MLPerf DLRM's), ``--threads`` sets torch's CPU
threads (default: torch's own), ``--device cuda`` times the step on a GPU (synchronised).

The last line is one JSON object: per configuration its multiply-adds per batch and speed-up
(``speedups``), the smallest multiply-adds with a speed-up >= 1.05 and the largest with one < 1
(``pays_from_macs``, ``loses_up_to_macs``), the threshold auto uses (``bf16_min_macs``), what auto
picks on this machine per configuration (``auto_picks``: fp32 throughout on a CPU without native
bf16, whatever the size), and the machine.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Any

import benchkit  # first: it imports ember before torch (see ember/__init__.py)
import torch

from ember import allocator
from ember.models.base import ModelInputs
from ember.models.dlrm import DLRM, DLRMConfig
from ember.train.precision import AMX_MIN_MACS, AMX_MIN_MACS_PER_SAMPLE, BF16_MIN_MACS, dense_macs, resolve

# (name, bottom MLP, top MLP, embedding dim, batch sizes)
CONFIGS = [
    ("criteo.yaml", [32, 4], [16], 4, [128, 2048, 4096, 16384]),
    ("demo.yaml", [64, 16], [128, 64], 16, [256, 384, 512, 1024, 2048]),
    ("middle", [128, 16], [256, 128], 16, [512]),
    ("bench_dlrm", [512, 256, 16], [512, 256], 16, [64, 128, 4096]),
]
WIDE = [  # --wide: where width, not only multiply-adds, decides (AMX tiles are 16 x 32 bf16)
    ("wide-256", [256, 64, 16], [256, 256], 16, [512, 4096]),
    ("wide-1024", [512, 256, 64], [1024, 1024, 512], 64, [512, 4096]),
    ("mlperf", [512, 256, 128], [1024, 1024, 512, 256], 128, [2048]),
]
SPARSE, DENSE = 26, 13


def speedup(bottom: list[int], top: list[int], dim: int, batch: int, steps: int, warmup: int,
            device: torch.device = torch.device("cpu")) -> tuple[int, int, float]:
    """(linear multiply-adds per batch and per sample, median paired fp32 / bf16 step time) on
    ``device``."""
    torch.manual_seed(0)
    model = DLRM(DLRMConfig(bottom_mlp=bottom, top_mlp=top), ModelInputs(num_dense=DENSE, sparse_dims=[dim] * SPARSE,
                                                                         num_tasks=1)).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    dense = torch.rand(batch, DENSE, device=device)
    pooled = [torch.randn(batch, dim, requires_grad=True, device=device)  # as ember hands them over
              for _ in range(SPARSE)]
    labels = (torch.rand(batch, 1, device=device) < 0.25).float()
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    def step(bf16: bool) -> float:
        sync()
        t0 = time.perf_counter()
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            logits = model(dense, pooled, None)
        loss = torch.nn.functional.binary_cross_entropy_with_logits(logits.float(), labels)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sync()
        return time.perf_counter() - t0

    ratios = []
    for i in range(warmup + steps):
        order = (False, True) if i % 2 == 0 else (True, False)
        t = {bf16: step(bf16) for bf16 in order}
        if i >= warmup:
            ratios.append(t[False] / t[True])
    per_sample = dense_macs(model)
    return per_sample * batch, per_sample, statistics.median(ratios)


def main() -> None:
    allocator.reexec_tuned([__file__, *sys.argv[1:]])  # as the ember command line runs (see ember/allocator.py)
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=40, help="timed step pairs per configuration")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--device", default="cpu", help="cpu or cuda")
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    ap.add_argument("--wide", action="store_true", help="also wider dense models (up to the MLPerf DLRM's)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    rows: list[list[Any]] = []
    found: list[dict[str, Any]] = []
    for name, bottom, top, dim, batches in CONFIGS + (WIDE if args.wide else []):
        for batch in batches:
            macs, per_sample, s = speedup(bottom, top, dim, batch, args.steps, args.warmup, device)
            picks = resolve("auto", device, macs, per_sample)  # this device's bf16 support, then the size rules
            found.append({"model": name, "batch": batch, "macs": macs, "macs_per_sample": per_sample,
                          "speedup": round(s, 3), "auto_picks": picks})
            rows.append([name, batch, f"{macs / 1e6:.1f} M", f"{s:.3f}x", picks])
            print(f"{name:<12} batch {batch:>6}: {macs / 1e6:9.1f} M multiply-adds, bf16 speed-up {s:.3f}x", flush=True)
    print()
    benchkit.print_table(["model", "batch", "linear multiply-adds", "bf16 / fp32 speed", "auto picks here"], rows)
    pays = [r["macs"] for r in found if r["speedup"] >= 1.05]
    loses = [r["macs"] for r in found if r["speedup"] < 1]
    print(benchkit.json_line({"bench": "autocast_size", "steps": args.steps, "device": str(device),
                              "torch_threads": torch.get_num_threads(), "speedups": found,
                              "pays_from_macs": min(pays) if pays else None,
                              "loses_up_to_macs": max(loses) if loses else None, "bf16_min_macs": BF16_MIN_MACS,
                              "amx_min_macs": AMX_MIN_MACS, "amx_min_macs_per_sample": AMX_MIN_MACS_PER_SAMPLE}))


if __name__ == "__main__":
    main()
