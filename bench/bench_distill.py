"""Distillation and multi-tower quality (issue 15): student AUC without a teacher, with plain
distillation, with the auxiliary head, and with head + adapter, when the teacher was trained on
older data than the student; and DMT against DLRM at (about) equal parameter count.

Synthetic drift: the built-in generator's labels are Bernoulli(sigmoid(score)) of hidden per-ID
effects over the first ``signal_features`` sparse features plus a dense part
(``ember/source/synthetic.py``). The *old* world (the teacher's training rows) has 6 signal
features; the *new* world (the student's training and eval rows) has 10: the teacher knows 6 of
the 10 effects and has the old base rate. Both come from the same seed, so the effects the teacher
learned are the new world's too. Seed s sets the data and every model's initial weights.

- Teacher: DLRM, dim 16, bottom 13-64-16, top 128-64, one epoch on ``--rows`` old rows.
- Students (dim 8, bottom 13-32-8, top 64): one epoch on ``--rows`` new rows, scored on
  ``--eval-rows`` (>= 60,000) new eval rows: ``none`` (labels only), ``plain``
  (``distill: {aux_head: false}``), ``aux`` (``distill: {}``), ``aux+adapter``.
- DMT vs DLRM: DLRM dim 8 (bottom 13-32-8, top 64) against DMT with 4 towers on the same
  new rows, no teacher, its ``tower_mlp`` chosen so the dense parameters match DLRM's within 15 %.

    python bench/bench_distill.py [--rows 200000] [--eval-rows 60000] [--seeds 3] [--data-dir DIR]
        [--shared-data DIR] [--no-real] [--no-synthetic]

Real samples (reported without a tolerance; skipped when absent): Criteo and Avazu from
``--shared-data``, with configs/criteo.yaml's model and training (bench_staleness_quality's data
settings for Avazu); the first half of each training file is the teacher's (older) world, the
second half the students'; eval on their dev + test files.

Tiny check: ``--rows 20000 --eval-rows 60000 --seeds 1``. The last line is one JSON object with
the mean AUC of each variant (``student_<variant>_auc``), ``dmt_auc``, ``dlrm_auc``, their
parameter counts and the per-seed values.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import benchkit  # first: it imports ember before torch (see ember/__init__.py)
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from ember.config import from_dict
from ember.pipeline.loader import make_batches
from ember.source.config import SyntheticOptions
from ember.source.writer import write_synthetic
from ember.train.evaluate import predict_batches
from ember.train.loop import train

VOCAB = 50_000
STUDENTS = {"none": None, "plain": {"aux_head": False}, "aux": {}, "aux+adapter": {"adapter": True}}


def schema(teacher: bool) -> dict[str, Any]:
    return {"labels": ["label"], **({"teacher": ["teacher"]} if teacher else {}),
            "dense": [{"name": f"I{i}", "log1p": True} for i in range(1, 14)],
            "sparse": [{"name": f"C{i}", "hash_ids": False} for i in range(1, 27)]}


def run_config(train_file: Path, eval_file: Path, out: Path, name: str, seed: int, dim: int,
               model: dict[str, Any], teacher: bool) -> dict[str, Any]:
    return {
        "data": {"format": "parquet", "train": str(train_file), "eval": str(eval_file), "batch_size": 1024,
                 "seed": seed, "shuffle_buffer": 100_000},
        "schema": schema(teacher),
        "embedding": {"dim": dim, "optimizer": {"type": "rowwise_adagrad", "lr": 0.05}},
        "model": model,
        "train": {"out_dir": str(out), "run_name": name, "progress": False, "seed": seed, "epochs": 1,
                  "dense_optimizer": {"type": "adam", "lr": 0.001}, "log_every": 100},
    }


def with_teacher_scores(parts: Any, cfg: Any, src: Path, dst: Path) -> None:
    """``src`` plus a ``teacher`` column of ``parts``' probabilities for its rows (in order)."""
    data = cfg.data.model_copy(update={"eval": str(src), "format": "parquet"})
    probs, _ = predict_batches(parts, make_batches(data, cfg.schema, "eval"))
    table = pq.read_table(src)
    pq.write_table(table.append_column("teacher", pa.array(probs[:, 0].astype(np.float32))), dst)


def dense_params(result: Any) -> int:
    return sum(p.numel() for p in result.parts.model.parameters())


def one_seed(args: argparse.Namespace, seed: int) -> dict[str, Any]:
    d = args.data_dir / f"seed{seed}"
    d.mkdir(parents=True, exist_ok=True)
    base = {"num_dense": 13, "num_sparse": 26, "vocab_size": VOCAB, "seed": seed}
    old, new = SyntheticOptions(**base, signal_features=6), SyntheticOptions(**base, signal_features=10)
    files = {"old": d / "old_train.parquet", "new": d / "new_train.parquet", "eval": d / "new_eval.parquet"}
    write_synthetic(str(files["old"]), "parquet", args.rows, old, split="train")
    write_synthetic(str(files["new"]), "parquet", args.rows, new, split="train")
    write_synthetic(str(files["eval"]), "parquet", args.eval_rows, new, split="eval")
    runs = d / "runs"
    t0 = time.perf_counter()
    teacher_cfg = from_dict(run_config(files["old"], files["eval"], runs, "teacher", seed, 16,
                                       {"type": "dlrm", "bottom_mlp": [64, 16], "top_mlp": [128, 64]}, False))
    teacher = train(teacher_cfg)
    out: dict[str, Any] = {"teacher_on_new_eval_auc": teacher.metrics["auc/label"]}
    taught = {k: d / f"{k}_with_teacher.parquet" for k in ("new", "eval")}
    for k, path in taught.items():
        with_teacher_scores(teacher.parts, teacher_cfg, files[k], path)
    student_model = {"type": "dlrm", "bottom_mlp": [32, 8], "top_mlp": [64]}
    students = {}
    for name, distill in STUDENTS.items():
        model = {**student_model, **({"distill": distill} if distill is not None else {})}
        students[name] = train(from_dict(run_config(taught["new"], taught["eval"], runs, f"student-{name}", seed, 8,
                                                    model, distill is not None)))
        out[f"student_{name}_auc"] = students[name].metrics["auc/label"]
    dlrm = students["none"]  # the DLRM DMT is compared with: the student trained on the labels alone
    dmt_model = {"type": "dmt", "num_towers": 4, "tower_mlp": [args.tower_width], "tower_vectors": 2,
                 "bottom_mlp": [32, 8], "top_mlp": [64]}
    dmt = train(from_dict(run_config(files["new"], files["eval"], runs, "dmt", seed, 8, dmt_model, False)))
    out.update(dlrm_auc=dlrm.metrics["auc/label"], dmt_auc=dmt.metrics["auc/label"],
               dlrm_params=dense_params(dlrm), dmt_params=dense_params(dmt), seconds=time.perf_counter() - t0)
    shutil.rmtree(d, ignore_errors=True)
    return out


# ---- the real samples: a time split of their training rows ---------------------------------------
def real_worlds(name: str, root: Path) -> tuple[dict[str, Any], pa.Table, pa.Table, pa.Table]:
    """``name``'s run config (configs/criteo.yaml's model and training; bench_staleness_quality's
    data settings) and its rows as string tables: the first half of the training file (old
    world: the teacher's), the second half (new world: the students'), the eval files."""
    import pyarrow.csv as pacsv
    from bench_staleness_quality import avazu_config, criteo_config

    from ember.source.config import CRITEO_COLUMNS

    raw = (criteo_config if name == "criteo" else avazu_config)(root)(0, 0)
    if name == "criteo":
        names, delim, files = CRITEO_COLUMNS, "\t", ("train.tsv", "dev.tsv", "test.tsv")
        raw["schema"] = __import__("ember.featurize.presets", fromlist=["preset_schema"]).preset_schema(
            "criteo", from_dict(raw).data).model_dump(mode="json", exclude={"score_only"})
    else:
        names, delim, files = raw["data"]["csv"]["column_names"], ",", ("train.csv", "dev.csv", "test.csv")

    def read(f: str) -> pa.Table:
        t = pacsv.read_csv(root / f, read_options=pacsv.ReadOptions(column_names=names),
                           parse_options=pacsv.ParseOptions(delimiter=delim),
                           convert_options=pacsv.ConvertOptions(column_types={c: pa.string() for c in names},
                                                                strings_can_be_null=False))
        label = raw["schema"]["labels"][0]
        return t.filter(pa.compute.is_in(t.column(label), pa.array(["0", "1"])))  # Avazu's header line

    train_rows = read(files[0])
    half = train_rows.num_rows // 2
    return raw, train_rows.slice(0, half), train_rows.slice(half), pa.concat_tables([read(f) for f in files[1:]])


def real_seed(name: str, root: Path, seed: int, work: Path) -> dict[str, float]:
    """Teacher on the old half, students on the new half (same variants as synthetic)."""
    raw, old, new, ev = real_worlds(name, root)
    work.mkdir(parents=True, exist_ok=True)
    paths = {k: work / f"{k}.parquet" for k in ("old", "new", "eval")}
    for k, t in (("old", old), ("new", new), ("eval", ev)):
        pq.write_table(t, paths[k])

    def config(train_file: Path, eval_file: Path, run: str, model: dict[str, Any], teacher: bool) -> Any:
        sch = {**raw["schema"], **({"teacher": ["teacher"]} if teacher else {})}
        data = {"format": "parquet", "train": str(train_file), "eval": str(eval_file), "seed": seed,
                **{k: raw["data"][k] for k in ("batch_size", "eval_batch_size", "shuffle_buffer")}}
        train_kw = {**raw["train"], "out_dir": str(work / "runs"), "run_name": run, "progress": False, "seed": seed}
        return from_dict({**raw, "data": data, "schema": sch, "model": model, "train": train_kw})

    teacher_cfg = config(paths["old"], paths["eval"], "teacher", raw["model"], False)
    teacher = train(teacher_cfg)
    taught = {k: work / f"{k}_taught.parquet" for k in ("new", "eval")}
    for k in taught:
        with_teacher_scores(teacher.parts, teacher_cfg, paths[k], taught[k])
    out = {"teacher_auc": teacher.metrics[f"auc/{raw['schema']['labels'][0]}"]}
    for variant, distill in STUDENTS.items():
        model = {**raw["model"], **({"distill": distill} if distill is not None else {})}
        res = train(config(taught["new"], taught["eval"], f"s-{variant}", model, distill is not None))
        out[f"student_{variant}_auc"] = res.metrics[f"auc/{raw['schema']['labels'][0]}"]
    shutil.rmtree(work, ignore_errors=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=200_000, help="training rows of each world")
    ap.add_argument("--eval-rows", type=int, default=60_000)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--tower-width", type=int, default=56, help="DMT's tower_mlp width (sized to match DLRM)")
    ap.add_argument("--data-dir", type=Path, default=Path(tempfile.gettempdir()) / "ember-bench-distill")
    ap.add_argument("--shared-data", type=Path, default=benchkit.shared_data_dir(),
                    help="folder with criteo/ and avazu/ (default: $EMBER_DATA_DIR or ../shared/data)")
    ap.add_argument("--no-real", action="store_true", help="skip the Criteo and Avazu samples")
    ap.add_argument("--no-synthetic", action="store_true", help="only the real samples")
    args = ap.parse_args()
    if args.eval_rows < 60_000:
        ap.error("--eval-rows must be >= 60000 (the AUC's standard error must stay well under the differences)")
    summary: dict[str, Any] = {"bench": "distill", "rows": args.rows, "eval_rows": args.eval_rows, "seeds": args.seeds}
    if not args.no_synthetic:
        per_seed = [one_seed(args, s) for s in range(args.seeds)]
        keys = [k for k in per_seed[0] if k != "seconds"]
        mean = {k: statistics.fmean(r[k] for r in per_seed) for k in keys}
        print(f"\nsynthetic, mean over {args.seeds} seed(s), {args.rows:,} training rows per world, "
              f"{args.eval_rows:,} eval rows:")
        benchkit.print_table(["variant", "AUC", "per seed"],
                             [[k.removesuffix("_auc"), f"{mean[k]:.4f}", " ".join(f"{r[k]:.4f}" for r in per_seed)]
                              for k in keys if k.endswith("_auc")])
        print(f"dense parameters: DLRM {mean['dlrm_params']:.0f}, DMT {mean['dmt_params']:.0f} "
              f"({mean['dmt_params'] / mean['dlrm_params']:.2f}x)")
        summary.update(mean, per_seed=per_seed)
    for name in ("criteo", "avazu"):
        root = args.shared_data / name
        if args.no_real or not root.is_dir():
            print(f"{name}: skipped ({'--no-real' if args.no_real else f'{root} not found'})")
            summary[name] = None
            continue
        runs = [real_seed(name, root, s, args.data_dir / f"{name}{s}") for s in range(args.seeds)]
        mean = {k: statistics.fmean(r[k] for r in runs) for k in runs[0]}
        print(f"\n{name} (first half of train.* teaches, second half trains the students; AUC standard error ~0.02):")
        benchkit.print_table(["variant", "AUC", "per seed"],
                             [[k.removesuffix("_auc"), f"{mean[k]:.4f}", " ".join(f"{r[k]:.4f}" for r in runs)]
                              for k in mean])
        summary[name] = {**mean, "per_seed": runs}
    from benchkit import json_line  # the machine (CPU model, bf16) in the final line
    print(json_line(summary))


if __name__ == "__main__":
    main()
