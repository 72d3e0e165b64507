"""What embedding staleness costs in model quality (issue 11): eval AUC with
``pipeline.embedding_staleness`` k = 1, 2, 4 against k = 0 (exact synchronous training), mean over
seeds, with the staged pipeline on.

- synthetic: configs/demo.yaml (DLRM bottom 13-64-16, top 128-64-1, dim 16, batch 2048, row-wise
  Adagrad 0.05, Adam 0.001) on the built-in Criteo-shaped generator (vocabulary 200,000 per
  feature, Zipf 1.1), which plants a signal: labels are Bernoulli(sigmoid(score)) of a hidden
  per-ID effect over 8 sparse features plus 3 dense ones (``ember/source/synthetic.py``); the
  AUC of that true score on the eval rows (the best any model can do) is printed as
  "planted". ``--rows`` training rows, one epoch, ``--eval-rows`` (>= 60,000) eval rows;
  seed s sets the data (``data.synthetic.seed``), the model and the tables (``train.seed``).
  Tolerance: |mean AUC(k) - mean AUC(0)| <= 0.002.
- criteo: configs/criteo.yaml on the shared Criteo sample (7,200 training rows, 800 eval rows).
- avazu: the same model and training settings on the shared Avazu sample (8,087 training rows,
  912 eval rows; 21 categorical features, no dense ones; the header line of train.csv is read as
  a bad row and skipped, since dev/test have none).
  The real samples are reported without a tolerance (the AUC's standard error on ~800 eval rows
  is ~0.02) and skipped when ``--shared-data`` lacks them.

Runs go in the order seed, then k, so that every k is compared with k = 0 on the same data and
initial weights; the table shows each mean, its difference to k = 0 and the per-seed values.

    python bench/bench_staleness_quality.py [--rows 300000] [--eval-rows 60000] [--seeds 3]
        [--ks 1,2,4] [--shared-data DIR] [--no-real]

Tiny check: ``--rows 20000 --eval-rows 60000 --seeds 1``. The last line is one JSON object:
synthetic_auc_k0, synthetic_auc_k<k> and synthetic_auc_delta_k<k> for each k, the same for
criteo_ and avazu_ (null when skipped), per-seed values and the planted score's AUC.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import benchkit  # first: it imports ember before torch (see ember/__init__.py)

from ember.source.config import SyntheticOptions
from ember.source.synthetic import synthetic_records, synthetic_score
from ember.train.metrics import auc

TOLERANCE = 0.002
ConfigFn = Callable[[int, int], dict[str, Any]]  # (seed, k) -> raw run config


def with_run(raw: dict[str, Any], seed: int, k: int) -> dict[str, Any]:
    """``raw`` with seed ``seed`` (data order, model, tables), staleness ``k``, the pipeline on."""
    out = {**raw, "data": {**raw["data"], "seed": seed},
           "pipeline": {**raw.get("pipeline", {}), "enabled": True, "embedding_staleness": k}}
    out["train"] = {**raw.get("train", {}), "seed": seed, "log_every": 1000}
    return out


def synthetic_config(args: argparse.Namespace) -> ConfigFn:
    """configs/demo.yaml with ``--rows`` / ``--eval-rows`` and the data seed set per run."""
    base = benchkit.yaml_config("demo.yaml")

    def make(seed: int, k: int) -> dict[str, Any]:
        syn = {**base["data"]["synthetic"], "rows": args.rows, "eval_rows": args.eval_rows, "seed": seed}
        return with_run({**base, "data": {**base["data"], "synthetic": syn}}, seed, k)

    return make


def criteo_config(root: Path) -> ConfigFn:
    """configs/criteo.yaml on the shared Criteo sample under ``root``."""
    raw = benchkit.criteo_sample_config(root)
    return lambda seed, k: with_run(raw, seed, k)


def avazu_config(root: Path) -> ConfigFn:
    """configs/criteo.yaml's model and training on the shared Avazu sample under ``root``."""
    raw = benchkit.avazu_sample_config(root)
    return lambda seed, k: with_run(raw, seed, k)


def planted_auc(args: argparse.Namespace, seed: int) -> float:
    """AUC of the generator's true score on the eval rows of data seed ``seed``."""
    opts = SyntheticOptions.model_validate({**benchkit.yaml_config("demo.yaml")["data"]["synthetic"],
                                            "rows": args.rows, "eval_rows": args.eval_rows, "seed": seed})
    labels = synthetic_records(opts, "eval", 0, args.eval_rows).column("label").to_numpy()
    return auc(labels, synthetic_score(opts, "eval", 0, args.eval_rows))


def measure(name: str, make: ConfigFn, seeds: list[int], ks: list[int], out_dir: Path) -> dict[int, list[float]]:
    """Eval AUC of every (seed, k): k -> AUCs in seed order."""
    aucs: dict[int, list[float]] = {k: [] for k in ks}
    for seed in seeds:
        for k in ks:
            t0 = time.perf_counter()
            result = benchkit.run_training(make(seed, k), out_dir, f"{name}-s{seed}-k{k}")
            value = next(v for m, v in result.metrics.items() if m.startswith("auc/"))
            aucs[k].append(value)
            print(f"{name:<10} seed {seed}  k={k}  AUC {value:.4f}  ({result.step} steps, "
                  f"{time.perf_counter() - t0:.0f} s)", flush=True)
    return aucs


def summarize(name: str, aucs: dict[int, list[float]] | None, ks: list[int]) -> dict[str, Any]:
    """``<name>_auc_k<k>`` (mean over seeds) and ``<name>_auc_delta_k<k>`` (vs k = 0) for every
    k; nulls when the dataset was skipped."""
    out: dict[str, Any] = {}
    for k in ks:
        mean = statistics.fmean(aucs[k]) if aucs else None
        out[f"{name}_auc_k{k}"] = mean
        if k:
            out[f"{name}_auc_delta_k{k}"] = None if aucs is None else mean - statistics.fmean(aucs[0])
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=300_000, help="synthetic training rows (one epoch)")
    ap.add_argument("--eval-rows", type=int, default=60_000, help="synthetic eval rows (>= 60,000)")
    ap.add_argument("--seeds", type=int, default=3, help="seeds 0..N-1, for every dataset")
    ap.add_argument("--ks", default="1,2,4", help="staleness values compared with 0")
    ap.add_argument("--shared-data", type=Path, default=benchkit.shared_data_dir(),
                    help="folder with criteo/ and avazu/ (default: $EMBER_DATA_DIR or ../shared/data)")
    ap.add_argument("--no-real", action="store_true", help="synthetic data only")
    args = ap.parse_args()
    if args.eval_rows < 60_000:
        ap.error("--eval-rows must be >= 60,000 (the AUC difference to resolve is 0.002)")
    ks = [0] + sorted({int(k) for k in args.ks.split(",") if int(k) != 0})
    seeds = list(range(args.seeds))
    t0 = time.perf_counter()
    datasets: dict[str, ConfigFn | None] = {"synthetic": synthetic_config(args)}
    real = {"criteo": (criteo_config, ("train.tsv", "dev.tsv", "test.tsv")),
            "avazu": (avazu_config, ("train.csv", "dev.csv", "test.csv"))}
    for name, (make, files) in real.items():
        root = args.shared_data / name
        present = not args.no_real and all((root / f).exists() for f in files)
        datasets[name] = make(root) if present else None
        if not present:
            print(f"{name}: skipped ({'--no-real' if args.no_real else f'no {name} sample at {root}'})")
    planted = [planted_auc(args, s) for s in seeds]
    print(f"synthetic: planted signal, AUC of the true score on the eval rows: {statistics.fmean(planted):.4f} "
          f"(seeds {seeds}: {', '.join(f'{p:.4f}' for p in planted)})", flush=True)
    results: dict[str, dict[int, list[float]] | None] = {}
    with tempfile.TemporaryDirectory(prefix="ember-staleness-") as tmp:
        for name, make_fn in datasets.items():
            results[name] = measure(name, make_fn, seeds, ks, Path(tmp)) if make_fn is not None else None
    print(f"\neval AUC, mean over seeds {seeds}; pipeline on; tolerance on synthetic |delta| <= {TOLERANCE}:")
    rows = []
    for name, aucs in results.items():
        for k in ks:
            if aucs is None:
                rows.append([name, k, "skipped", "", "", ""])
                continue
            mean, delta = statistics.fmean(aucs[k]), statistics.fmean(aucs[k]) - statistics.fmean(aucs[0])
            ok = "" if name != "synthetic" or not k else ("yes" if abs(delta) <= TOLERANCE else "NO")
            rows.append([name, k, f"{mean:.4f}", "" if not k else f"{delta:+.4f}", ok,
                         " ".join(f"{a:.4f}" for a in aucs[k])])
    benchkit.print_table(["data", "k", "AUC", "delta vs k=0", "within tol.", "per seed"], rows)
    out: dict[str, Any] = {"bench": "staleness_quality", "tolerance": TOLERANCE, "seeds": seeds, "ks": ks}
    for name, aucs in results.items():
        out.update(summarize(name, aucs, ks))
    out["synthetic_within_tolerance"] = {
        f"k{k}": abs(out[f"synthetic_auc_delta_k{k}"]) <= TOLERANCE for k in ks if k}
    out["synthetic_planted_auc"] = statistics.fmean(planted)
    out["per_seed"] = {name: ({f"k{k}": v for k, v in aucs.items()} if aucs else None) for name, aucs in results.items()}
    out["rows"], out["eval_rows"], out["seconds"] = args.rows, args.eval_rows, time.perf_counter() - t0
    print(benchkit.json_line(out))


if __name__ == "__main__":
    main()
