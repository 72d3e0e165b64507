"""Communication of distributed training (issue 10 item 8): bytes per step and rank on 1, 2 and
4 processes (torchrun, gloo, CPU), split into split counts, IDs, rows, embedding gradients and
the dense all-reduce, against the communication model's prediction (``ember.distributed.traffic``,
docs/distributed.md "Communication model"); on a machine with GPUs also samples/s per GPU with NCCL.

Workload: a Criteo-shaped DLRM (13 dense, 26 single-hot sparse features of 100,000 IDs each,
Zipf 1.1, dim 16, bottom 13-64-16, top 128-64), synthetic data, global batch ``--batch``,
row-wise sharding. Each world size trains ``--steps`` steps logging every ``--steps/2``; the
figures are the last interval's (``metrics.jsonl``: ``dist.<kind>.sent_per_step``, mean over
ranks, and ``dist.sent_per_step_max``, the busiest rank's). The all-to-all bytes are counted by
``Exchange`` as they are sent; the dense all-reduce's are measured with a DDP communication hook
(the bucket bytes each rank hands to the all-reduce) times a ring all-reduce's 2(N-1)/N.

Speed on this machine's 2 CPU cores (shared) is not the point: processes compete for the cores,
so samples/s here says nothing about scaling; bytes do not depend on speed.

    python bench/bench_distributed.py [--batch 1024] [--steps 8] [--out DIR] [--no-towers]

The last line is one JSON object: ``bytes_per_step`` per world size (measured, mean over ranks,
by kind and in total), ``predicted_bytes_per_step`` (the model's), ``samples_per_s_per_gpu``
(empty without GPUs) and the tower-placement figures (``towers``, issue 15 item 4).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

import ember  # noqa: F401  # before torch (see benchkit)
import torch
from benchkit import REPO, criteo_synthetic_options, dlrm_config, print_table

from ember.config import from_dict
from ember.distributed.traffic import Network, TableLoad, cross_node_fraction, predict_bytes, predict_step_time
from ember.testing.distributed import torchrun_train
from ember.train.traffic import predicted_bytes

KINDS = ("counts", "ids", "rows", "grads", "dense")


def run_config(args: argparse.Namespace, out: Path, device: str = "cpu") -> dict[str, Any]:
    synth = {**criteo_synthetic_options(), "rows": args.batch * args.steps, "eval_rows": args.batch}
    raw = dlrm_config({"synthetic": synth}, batch_size=args.batch, bottom_mlp=(64, 16), top_mlp=(128, 64))
    raw["train"].update({"max_steps": args.steps, "log_every": args.steps // 2, "progress": False, "threads": 1,
                         "out_dir": str(out), "device": device})
    raw["eval"] = {"max_batches": 1}
    raw["pipeline"] = {"enabled": False}
    raw["distributed"] = {"sharding": "row_wise"}
    return raw


def measure(raw: dict[str, Any], out: Path, world: int, name: str) -> dict[str, Any]:
    """Train on ``world`` processes (torchrun); the last train record of its metrics."""
    path = out / f"{name}.yaml"
    path.write_text(yaml.safe_dump(raw))
    done = torchrun_train(path, world, [f"train.run_name={name}"], timeout=900)
    if done.returncode != 0:
        raise SystemExit(f"torchrun ({world} processes) exited {done.returncode}:\n{done.stderr[-4000:]}")
    recs = [json.loads(line) for line in (out / name / "metrics.jsonl").read_text().splitlines()]
    return [r for r in recs if r["kind"] == "train"][-1]


def per_step(rec: dict[str, Any]) -> dict[str, float]:
    """Measured bytes sent per step, mean over ranks, by kind (0 for one process)."""
    out = {k: float(rec.get(f"dist.{k}.sent_per_step", 0.0)) for k in KINDS}
    out["total"] = float(rec.get("dist.sent_per_step", 0.0))
    out["busiest_rank_total"] = float(rec.get("dist.sent_per_step_max", 0.0))
    return out


def print_scaling_model() -> None:
    """The docs' prediction for 8 GPUs x M nodes (Criteo-like: B = 65,536, 26 single-hot
    tables of dim 128, no dedupe, 2.6 M dense parameters; ``Network()``'s bandwidths)."""
    batch, feats, dim, params = 65_536, 26, 128, 2_600_000
    rows = []
    for m in (1, 2, 4, 8):
        n = 8 * m
        b = predict_bytes([[TableLoad(batch / n, dim)] * feats], n, params)
        t = predict_step_time(b, n, 8, Network(), collectives=5)
        a2a = sum(b[k] for k in ("counts", "ids", "rows", "grads"))
        rows.append([m, n, f"{a2a / 1e6:.1f}", f"{b['dense'] / 1e6:.1f}", f"{cross_node_fraction(n, 8):.3f}",
                     f"{t['all_to_all'] * 1e3:.2f}", f"{t['all_reduce'] * 1e3:.2f}", f"{t['latency'] * 1e3:.2f}",
                     f"{t['total'] * 1e3:.2f}"])
    print("predicted communication per step, 8 GPUs x M nodes (model only, docs/distributed.md 'Communication model'):")
    print_table(["M", "N", "a2a MB/rank", "dense MB/rank", "cross share", "a2a ms", "all-reduce ms", "latency ms",
                 "total ms"], rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--worlds", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--no-towers", action="store_true", help="skip the tower-placement measurement (issue 15)")
    args = ap.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="bench_distributed-"))
    out.mkdir(parents=True, exist_ok=True)
    raw = run_config(args, out)
    cfg = from_dict(raw)
    first, stop = args.steps // 2, args.steps  # the last log interval: steps first+1 .. stop
    measured: dict[str, dict[str, float]] = {}
    predicted: dict[str, dict[str, float]] = {}
    rows = []
    for n in args.worlds:
        rec = measure(raw, out, n, f"w{n}")
        measured[str(n)] = per_step(rec)
        predicted[str(n)] = predicted_bytes(cfg, n, first, stop) if n > 1 else {k: 0.0 for k in (*KINDS, "total")}
        for k in (*KINDS, "total"):
            m, p = measured[str(n)][k], predicted[str(n)][k]
            rows.append([f"{n} ranks", k, f"{m:,.0f}", f"{p:,.0f}", f"{m / p:.3f}" if p else "-"])
        rows.append([f"{n} ranks", "busiest rank", f"{measured[str(n)]['busiest_rank_total']:,.0f}", "", ""])
    print(f"bytes sent per step and rank (mean over ranks), global batch {args.batch}, 26 tables of dim 16:")
    print_table(["world", "kind", "measured", "predicted", "measured/predicted"], rows)
    print_scaling_model()

    gpu: dict[str, float] = {}
    if torch.cuda.device_count() > 0:
        graw = run_config(args, out, "cuda")
        graw["train"]["threads"] = None
        for n in [w for w in args.worlds if w <= torch.cuda.device_count()]:
            rec = measure(graw, out, n, f"gpu{n}")
            gpu[str(n)] = float(rec["samples_per_s"]) / n
        print("samples/s per GPU (NCCL):", gpu)
    else:
        print("no GPU here: samples/s per GPU not measured")

    towers: dict[str, Any] = {}
    if not args.no_towers:
        from bench_towers import measure_towers  # issue 15 item 4: two torchrun "nodes" on 127.0.0.1

        towers = measure_towers(out)
    if args.out is None:
        shutil.rmtree(out, ignore_errors=True)
    from benchkit import json_line  # the machine (CPU model, bf16) in the final line
    print(json_line({"bytes_per_step": measured, "predicted_bytes_per_step": predicted,
                      "samples_per_s_per_gpu": gpu, "batch_size": args.batch, **towers}))


if __name__ == "__main__":
    sys.path.insert(0, str(REPO / "bench"))
    main()
