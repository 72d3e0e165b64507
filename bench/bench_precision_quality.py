"""What reduced precision costs in model quality (issues 13 and 29): eval AUC of bf16 dense compute
(``train.precision: bf16``, what ``auto`` picks on a CPU with AMX-BF16 / AVX512-BF16), of bf16
rows (stochastic rounding) alone and of both, against fp32, mean over seeds, on three datasets:

- synthetic: configs/demo.yaml's DLRM and training on the built-in Criteo-shaped generator
  (planted signal), ``--rows`` training rows (one epoch), ``--eval-rows`` (>= 60,000) eval rows;
- criteo: configs/criteo.yaml on the shared Criteo sample (7,200 training rows, 800 eval rows);
- avazu: the same model and training on the shared Avazu sample (8,087 training rows, 912 eval).

The samples' own eval sets are small (800-900 rows: a seed moves AUC by +-0.003-0.005), so
``--folds K`` (default 10) pools each sample's files and cross-validates: row i is in fold
i mod K, each fold is scored by a model trained on the other K - 1 (every row is scored once
per seed), and a seed's AUC is the mean over its K folds. ``--folds 1`` keeps the files' own
train / eval split.

Seed s sets the data order, the model and the tables; every variant of seed s starts from the
same weights and data, so the per-seed differences are paired. Tolerance: |mean AUC - mean
AUC(fp32)| <= 0.001 per dataset (issue 29's bar for making bf16 dense the default where it is
native). The real samples are skipped when ``--shared-data`` lacks them. On a CPU without bf16
math the bf16 dense variants are slow (the matmuls are emulated) but their quality is what is
measured here.

    python bench/bench_precision_quality.py [--rows 200000] [--eval-rows 60000] [--seeds 5]
        [--folds 10] [--datasets synthetic,criteo,avazu] [--variants ...] [--shared-data DIR]

The last line is one JSON object: per dataset, the mean AUC per variant, its difference to fp32
with the standard error of the paired per-seed differences, the per-seed values, whether every
variant is within the tolerance and whether it is so beyond two standard errors
(``shown_within``: |delta| + 2 SE <= tolerance; null with one seed); and the machine.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import benchkit  # first: it imports ember before torch (see ember/__init__.py)

TOLERANCE = 0.001
VARIANTS: dict[str, dict[str, Any]] = {
    "fp32": {"train": {"precision": "fp32"}},
    "bf16 dense": {"train": {"precision": "bf16"}},
    "bf16 rows": {"embedding": {"dtype": "bf16"}, "train": {"precision": "fp32"}},
    "bf16 rows + bf16 dense": {"embedding": {"dtype": "bf16"}, "train": {"precision": "bf16"}},
}
ConfigFn = Callable[[int], dict[str, Any]]  # seed -> raw run config without the variant


def synthetic(args: argparse.Namespace) -> ConfigFn:
    base = benchkit.yaml_config("demo.yaml")

    def make(seed: int) -> dict[str, Any]:
        syn = {**base["data"]["synthetic"], "rows": args.rows, "eval_rows": args.eval_rows, "seed": seed}
        return {**base, "data": {**base["data"], "synthetic": syn}}

    return make


def with_variant(raw: dict[str, Any], seed: int, variant: dict[str, Any]) -> dict[str, Any]:
    out = {**raw, "data": {**raw["data"], "seed": seed}}
    out["embedding"] = {**raw["embedding"], **variant.get("embedding", {})}
    out["train"] = {**raw.get("train", {}), "seed": seed, "log_every": 1000, **variant.get("train", {})}
    return out


def folds(raw: dict[str, Any], k: int, out_dir: Path, header: bool) -> list[dict[str, Any]]:
    """``raw`` once per fold of ``k``: the rows of its train and eval files pooled (a header line
    of the first file dropped when ``header``), row i in fold i mod k; fold f's config trains on
    the other folds' rows and evaluates on its own (files written under ``out_dir``)."""
    data = raw["data"]
    lines: list[str] = []
    for i, path in enumerate([data["train"], *data["eval"]]):
        with open(path, encoding="utf-8") as fh:
            rows = fh.read().splitlines()
        lines += rows[1:] if header and i == 0 else rows
    suffix = Path(data["train"]).suffix
    out = []
    for f in range(k):
        train, held = out_dir / f"fold{f}-train{suffix}", out_dir / f"fold{f}-eval{suffix}"
        train.write_text("".join(x + "\n" for i, x in enumerate(lines) if i % k != f), encoding="utf-8")
        held.write_text("".join(x + "\n" for i, x in enumerate(lines) if i % k == f), encoding="utf-8")
        out.append({**raw, "data": {**data, "train": str(train), "eval": [str(held)]}})
    return out


def measure(name: str, make: ConfigFn, seeds: list[int], variants: list[str], out_dir: Path,
            fold_raws: list[dict[str, Any]] | None = None) -> dict[str, list[float]]:
    """Eval AUC of every (seed, variant): variant -> AUCs in seed order (with ``fold_raws``, the
    mean over the folds' configs, each trained from the same seed)."""
    aucs: dict[str, list[float]] = {v: [] for v in variants}
    for seed in seeds:
        for v in variants:
            t0 = time.perf_counter()
            per_fold = []
            for f, raw in enumerate(fold_raws or [make(seed)]):
                res = benchkit.run_training(with_variant(raw, seed, VARIANTS[v]), out_dir,
                                            f"{name}-s{seed}-f{f}-{v.replace(' ', '_').replace('+', '')}")
                per_fold.append(next(x for m, x in res.metrics.items() if m.startswith("auc/")))
            aucs[v].append(statistics.fmean(per_fold))
            print(f"{name:<10} seed {seed}  {v:<24} AUC {aucs[v][-1]:.4f}"
                  f"{f' (mean of {len(per_fold)} folds)' if fold_raws else ''}  ({time.perf_counter() - t0:.0f} s)",
                  flush=True)
    return aucs


def stderr(xs: list[float]) -> float:
    """Standard error of the mean of ``xs`` (0 for fewer than two)."""
    return statistics.stdev(xs) / len(xs) ** 0.5 if len(xs) > 1 else 0.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=200_000, help="synthetic training rows (one epoch)")
    ap.add_argument("--eval-rows", type=int, default=60_000, help="synthetic eval rows (>= 60,000)")
    ap.add_argument("--seeds", type=int, default=5, help="seeds 0..N-1, for every dataset")
    ap.add_argument("--folds", type=int, default=10, help="cross-validation folds of the real samples (1: their own split)")
    ap.add_argument("--datasets", default="synthetic,criteo,avazu")
    ap.add_argument("--variants", default=",".join(VARIANTS), help="compared with fp32 (always run)")
    ap.add_argument("--shared-data", type=Path, default=benchkit.shared_data_dir(),
                    help="folder with criteo/ and avazu/ (default: $EMBER_DATA_DIR or ../shared/data)")
    args = ap.parse_args()
    if args.eval_rows < 60_000:
        ap.error("--eval-rows must be >= 60000")
    if args.folds < 1:
        ap.error("--folds must be >= 1")
    variants = ["fp32"] + [v for v in args.variants.split(",") if v and v != "fp32"]
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        ap.error(f"unknown variant(s) {unknown}; choose from {list(VARIANTS)}")
    makers: dict[str, Callable[[], ConfigFn]] = {
        "synthetic": lambda: synthetic(args),
        "criteo": lambda: (lambda seed, raw=benchkit.criteo_sample_config(args.shared_data / "criteo"): raw),
        "avazu": lambda: (lambda seed, raw=benchkit.avazu_sample_config(args.shared_data / "avazu"): raw),
    }
    needs = {"criteo": ("train.tsv", "dev.tsv", "test.tsv"), "avazu": ("train.csv", "dev.csv", "test.csv")}
    seeds = list(range(args.seeds))
    t0 = time.perf_counter()
    results: dict[str, dict[str, list[float]] | None] = {}
    with tempfile.TemporaryDirectory(prefix="ember-precision-") as tmp:
        for name in args.datasets.split(","):
            root = args.shared_data / name
            if name in needs and not all((root / f).exists() for f in needs[name]):
                print(f"{name}: skipped (no sample at {root})")
                results[name] = None
                continue
            make = makers[name]()
            fold_raws = None
            if name in needs and args.folds > 1:
                (Path(tmp) / name).mkdir()
                fold_raws = folds(make(0), args.folds, Path(tmp) / name, header=name == "avazu")
            results[name] = measure(name, make, seeds, variants, Path(tmp), fold_raws)
    print(f"\neval AUC, mean over seeds {seeds}{f' (real samples: {args.folds}-fold cross-validation)' if args.folds > 1 else ''}; "
          f"tolerance |delta| <= {TOLERANCE}:")
    rows, out = [], {}
    for name, aucs in results.items():
        if aucs is None:
            out[name] = None
            continue
        mean = {v: statistics.fmean(a) for v, a in aucs.items()}
        delta = {v: mean[v] - mean["fp32"] for v in mean}
        paired = {v: [x - y for x, y in zip(a, aucs["fp32"])] for v, a in aucs.items()}
        se = {v: stderr(p) for v, p in paired.items()}
        for v in variants:
            rows.append([name, v, f"{mean[v]:.4f}", f"{delta[v]:+.5f}", "" if v == "fp32" else f"{se[v]:.5f}",
                         "" if v == "fp32" else ("yes" if abs(delta[v]) <= TOLERANCE else "NO"),
                         " ".join(f"{x:+.4f}" for x in paired[v])])
        out[name] = {"auc": mean, "delta": delta, "delta_se": se, "per_seed": aucs,
                     "within_tolerance": {v: abs(d) <= TOLERANCE for v, d in delta.items() if v != "fp32"},
                     "shown_within": {v: abs(d) + 2 * se[v] <= TOLERANCE if len(seeds) > 1 else None
                                      for v, d in delta.items() if v != "fp32"}}
    benchkit.print_table(["data", "variant", "AUC", "minus fp32", "SE", "within tol.", "per seed minus fp32"], rows)
    print(benchkit.json_line({"bench": "precision_quality", "tolerance": TOLERANCE, "seeds": seeds, "folds": args.folds, **out,
                              "rows": args.rows, "eval_rows": args.eval_rows, "seconds": time.perf_counter() - t0}))


if __name__ == "__main__":
    main()
