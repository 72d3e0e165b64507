"""What reduced precision costs in model quality (issue 13): eval AUC of bf16 rows (stochastic
rounding) with bf16 dense compute, and of bf16 rows alone, against fp32, mean over seeds.

Synthetic data with a planted signal: configs/demo.yaml's DLRM and training on the built-in
Criteo-shaped generator, ``--rows`` training rows (one epoch), ``--eval-rows`` (>= 60,000) eval
rows; seed s sets the data, the model and the tables. Tolerance: |mean AUC - mean AUC(fp32)|
<= 0.002. On a CPU without bf16 math (no AVX512-BF16 / AMX) the bf16 dense variant is slow (the
matmuls are emulated) but its quality is what is measured here.

    python bench/bench_precision_quality.py [--rows 200000] [--eval-rows 60000] [--seeds 3]

The last line is one JSON object: the mean AUC per variant, its difference to fp32 and the
per-seed values.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path
from typing import Any

import benchkit  # first: it imports ember before torch (see ember/__init__.py)

TOLERANCE = 0.002
VARIANTS: dict[str, dict[str, Any]] = {
    "fp32": {},
    "bf16 rows": {"embedding": {"dtype": "bf16"}},
    "bf16 rows + bf16 dense": {"embedding": {"dtype": "bf16"}, "train": {"precision": "bf16"}},
}


def config(args: argparse.Namespace, seed: int, variant: dict[str, Any]) -> dict[str, Any]:
    base = benchkit.yaml_config("demo.yaml")
    syn = {**base["data"]["synthetic"], "rows": args.rows, "eval_rows": args.eval_rows, "seed": seed}
    raw = {**base, "data": {**base["data"], "synthetic": syn, "seed": seed}}
    raw["embedding"] = {**raw["embedding"], **variant.get("embedding", {})}
    raw["train"] = {**raw.get("train", {}), "seed": seed, "log_every": 1000, **variant.get("train", {})}
    return raw


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--eval-rows", type=int, default=60_000)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--out", type=Path, default=Path(tempfile.gettempdir()) / "ember-bench-precision")
    args = ap.parse_args()
    if args.eval_rows < 60_000:
        ap.error("--eval-rows must be >= 60000")
    aucs: dict[str, list[float]] = {v: [] for v in VARIANTS}
    for seed in range(args.seeds):
        for name, variant in VARIANTS.items():
            res = benchkit.run_training(config(args, seed, variant), args.out, f"s{seed}-{name.replace(' ', '_')}")
            aucs[name].append(res.metrics["auc/label"])
            print(f"seed {seed}  {name:<24} AUC {aucs[name][-1]:.4f}", flush=True)
    mean = {k: statistics.fmean(v) for k, v in aucs.items()}
    print(f"\nmean over {args.seeds} seed(s), {args.rows:,} training rows, {args.eval_rows:,} eval rows:")
    benchkit.print_table(["variant", "AUC", "minus fp32", "per seed"],
                         [[k, f"{mean[k]:.4f}", f"{mean[k] - mean['fp32']:+.4f}", " ".join(f"{x:.4f}" for x in v)]
                          for k, v in aucs.items()])
    ok = all(abs(mean[k] - mean["fp32"]) <= TOLERANCE for k in mean)
    print(f"within {TOLERANCE} of fp32: {ok}")
    print(json.dumps({"bench": "precision_quality", "auc": mean, "delta": {k: mean[k] - mean["fp32"] for k in mean},
                      "per_seed": aucs, "within_tolerance": ok, "rows": args.rows, "eval_rows": args.eval_rows}))


if __name__ == "__main__":
    main()
