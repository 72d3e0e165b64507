"""Staged pipeline throughput (issue 11): training from files vs from batches already in memory,
and what embedding staleness buys when a table's reads go to disk.

Workload: Criteo-shaped synthetic data (13 dense, 26 single-hot sparse features; C1 has
``--big-vocab`` IDs, the others 100,000; Zipf 1.1), written once by ``ember generate`` as
Parquet and CSV (``--rows``, into ``--data-dir``, reused while its parameters match); DLRM
bottom 13-512-256-16, dim 16, top 512-256-1, batch 4096, row-wise Adagrad 0.05 on the embeddings,
Adagrad 0.01 on the MLPs (bench_dlrm.py's model).

Variants, each in its own process (this script with ``--variant``), timed over ``--steps``
steps after ``--warmup`` steps:

  (a) files, pipeline on   ``train(cfg)`` from the Parquet (CSV) file, ``pipeline.enabled=true``
                           (``pipeline.engine`` from ``--engine``, default auto: on a CPU with
                           k = 0 reading and featurizing on threads, the embedding stages in line)
  (b) files, pipeline off  the same with ``pipeline.enabled=false`` (same stages, in line)
  (c) in-memory            ``train(cfg, batches=...)``: the same pipelined trainer and config on
                           warmup + steps batches read and featurized before the run (its
                           pipeline has no read/featurize work left: the target of (a))
  (d) dense-only           the same model's forward/backward/dense optimizer step with its
                           embedding outputs given as precomputed tensors (no lookup, no
                           sparse update): the ceiling of the model on this machine
  (e) disk, staleness k/0  (a) on Parquet with table C1 on a disk tier (its file holds every C1
                           ID of the data; no cache in front) whose pages are evicted from the
                           page cache right before the run, with ``pipeline.embedding_staleness``
                           = k and = 0

The data are streamed in file order (``data.shuffle_buffer: 0``): with the default buffer of a
million rows the whole file would be pooled, parsed and hashed before the first step, and the
timed steps would see no reading at all. A round runs a-parquet, b-parquet, a-csv, b-csv, c, d,
e-k, e-0 one after the other; the rounds alternate (A B C D A B C D ...) and every figure is the
median over rounds. Training runs (a, b, c, e) are timed from the run's ``metrics.jsonl`` records (``train.log_every`` = gcd of warmup and
steps; samples/s over the timed steps = timed samples / summed record windows, which leave out the
few milliseconds of each log write); (d) times its loop with ``perf_counter``.
Machine noise (../shared/BENCHMARKING.md) makes single absolute figures unreliable: compare
only ratios of figures taken in the same run.

    python bench/bench_pipeline.py [--rows 1000000] [--steps 30] [--warmup 5] [--rounds 2]
        [--batch 4096] [--data-dir DIR] [--staleness 2] [--big-vocab 10000000]
        [--disk-rows 4000000] [--timeout 600]

Tiny check: ``--rows 20000 --steps 5 --warmup 2 --rounds 1``. The last line is one JSON object:
parquet_vs_inmemory, csv_vs_inmemory, staleness2_vs_0 (targets >= 0.95, >= 0.9, >= 1.3),
the medians of every variant, the disk table's page-fault counts, and ``staleness2_ceiling``:
(a) over (e) with k = 0, the most that hiding the cold table's reads could win.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import math
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import benchkit  # first: it imports ember before torch (see ember/__init__.py)
import numpy as np
import pyarrow.parquet as pq
import torch

from ember import allocator
from ember.batch import Batch
from ember.config import from_dict
from ember.embedding import EmbeddingTable
from ember.pipeline.loader import make_batches
from ember.train.builder import Components
from ember.train.loop import prepare_run
from ember.tiers.storage import build_tier
from ember.train.loss import multitask_bce
from ember.train.precision import autocast

FORMATS = ("parquet", "csv")
DISK_TABLE = "C1"  # the table with --big-vocab IDs, the first placed on the disk tier in variant (e)


def disk_tables(args: argparse.Namespace) -> list[str]:
    """The tables on the disk tier in variant (e): C1 .. C<--disk-tables>."""
    return [f"C{i}" for i in range(1, args.disk_tables + 1)]
TARGETS = {"parquet_vs_inmemory": 0.95, "csv_vs_inmemory": 0.9, "staleness_vs_0": 1.3}


@dataclass(frozen=True)
class Run:
    """One variant process: what it trains on and how."""

    variant: str  # files | in-memory | dense-only | disk
    fmt: str = "parquet"
    pipeline: bool = True
    staleness: int = 0

    @property
    def key(self) -> str:
        """The name its results go under, e.g. ``files/csv/pipelined`` or ``disk/staleness2``."""
        if self.variant == "files":
            return f"files/{self.fmt}/{'pipelined' if self.pipeline else 'inline'}"
        if self.variant == "disk":
            return f"disk/staleness{self.staleness}"
        return self.variant

    def argv(self) -> list[str]:
        """The options that make a process of this script measure this run."""
        return ["--variant", self.variant, "--format", self.fmt, "--pipeline", "on" if self.pipeline else "off",
                "--staleness", str(self.staleness)]


def round_runs(staleness: int) -> list[Run]:
    """The variants of one round, in the order they run."""
    files = [Run("files", fmt, pipe) for fmt in FORMATS for pipe in (True, False)]
    return files + [Run("in-memory"), Run("dense-only"), Run("disk", staleness=staleness), Run("disk", staleness=0)]


# ---- configuration ------------------------------------------------------------------------------
def run_config(args: argparse.Namespace, run: Run) -> dict[str, Any]:
    """The raw run config of ``run``: the DLRM over ``args.data_dir/train.<fmt>``, stopping after
    warmup + steps (with as many epochs as that takes at ``--rows``), logging every
    gcd(warmup, steps) steps so that one record ends exactly where the warmup does."""
    total = args.warmup + args.steps
    per_epoch = max(args.rows // args.batch, 1)
    data = {"format": run.fmt, "train": str(args.data_dir / f"train.{run.fmt}"), "drop_last": True, "shuffle_buffer": 0,
            "synthetic": benchkit.criteo_synthetic_options(args.big_vocab)}
    raw = benchkit.dlrm_config(data, batch_size=args.batch)
    raw["train"].update(max_steps=total, epochs=math.ceil(total / per_epoch), log_every=math.gcd(args.warmup, args.steps),
                        seed=0)
    raw["pipeline"] = {"enabled": run.pipeline, "embedding_staleness": run.staleness,
                       **({"data_workers": args.data_workers, "engine": args.engine} if run.pipeline else {})}
    if run.variant == "disk":
        raw["tables"] = [{"name": t, "storage": {"disk_path": str(disk_root(args)),
                                                 "disk_rows": args.disk_rows if t == DISK_TABLE else 200_000}}
                         for t in disk_tables(args)]
    return raw


def disk_root(args: argparse.Namespace) -> Path:
    """``storage.disk_path`` of the disk table; the tier's files go to ``<it>/<table name>/``."""
    return args.data_dir / "disk-table"


# ---- the disk table: filled once, evicted from the page cache before each run -------------------
def prepare_disk_table(args: argparse.Namespace) -> None:
    """Fill the disk tier of table C1 with a fresh record for every C1 ID of the Parquet file,
    close it (tags + clean ``meta.json``) and keep a copy of those two small files, so that each
    run can start from this state (``reset_disk_table``). Reused while its parameters match."""
    root = disk_root(args)
    stamp = {"data": json.loads((args.data_dir / "data.json").read_text()), "disk_rows": args.disk_rows,
             "tables": disk_tables(args)}
    stamp_file = root / "table.json"
    if stamp_file.exists() and json.loads(stamp_file.read_text()) == stamp:
        return
    shutil.rmtree(root, ignore_errors=True)
    t0 = time.perf_counter()
    cfg = from_dict(run_config(args, Run("disk")))
    for name in disk_tables(args):
        tcfg = next(t for t in cfg.table_configs() if t.name == name)
        ids = np.unique(pq.read_table(args.data_dir / "train.parquet", columns=[name]).column(0).to_numpy())
        tier = build_tier(tcfg.storage, tcfg.stored_words, tcfg.name)
        table = EmbeddingTable(tcfg, seed=cfg.train.seed, tier=tier)
        for s in range(0, ids.size, 1 << 16):
            chunk = torch.from_numpy(ids[s : s + (1 << 16)].copy())
            table.load(chunk, table.new_records(chunk))
        table.close()
        files = root / name
        for f in ("tags.npy", "meta.json"):
            shutil.copy2(files / f, root / f"pristine.{name}.{f}")
        size = (files / "slots.bin").stat().st_size
        print(f"disk table {files}: {ids.size:,} rows in a {size / 2**20:.0f} MiB file", flush=True)
    stamp_file.write_text(json.dumps(stamp))
    print(f"disk tables filled in {time.perf_counter() - t0:.1f} s", flush=True)


def reset_disk_table(args: argparse.Namespace) -> None:
    """Back to the filled state (a run rewrites rows in place and leaves the tier marked
    unclean), then drop the slot file's pages from the page cache."""
    root = disk_root(args)
    for name in disk_tables(args):
        for f in ("tags.npy", "meta.json"):
            shutil.copy2(root / f"pristine.{name}.{f}", root / name / f)
        evict_page_cache(root / name / "slots.bin")


def evict_page_cache(path: Path) -> None:
    """Write back and drop ``path``'s pages from the page cache (pages some process still maps
    stay: call it before the file is mapped)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


@contextlib.contextmanager
def reopened_disk_tiers() -> Iterator[None]:
    """Disk tiers built from a config reopen the files a closed tier left instead of starting
    empty. ``StorageConfig`` has no key for that (a run's disk tier always starts empty), so the
    bench swaps the name ``build_tier`` calls."""
    import ember.tiers.storage as storage

    original = storage.DiskTier
    storage.DiskTier = functools.partial(original, reopen=True)  # type: ignore[misc]  # same call signature
    try:
        yield
    finally:
        storage.DiskTier = original  # type: ignore[misc]


# ---- variant processes ----------------------------------------------------------------------------
def timed_rate(history: list[dict[str, Any]], warmup: int) -> tuple[float, int]:
    """Samples/s over the records after step ``warmup`` (equal windows: timed samples over the
    summed window times) and the number of timed steps they cover."""
    recs = [h for h in history if h.get("kind") == "train" and h["step"] > warmup]
    if not recs:
        raise RuntimeError(f"no train records after step {warmup}: does the data hold warmup + steps batches?")
    steps = recs[-1]["step"] - warmup
    return len(recs) / sum(1.0 / h["samples_per_s"] for h in recs), steps


def measure_training(args: argparse.Namespace, run: Run) -> dict[str, Any]:
    """Variants (a), (b), (e): ``train(cfg)`` from the files; (e) first resets its disk table."""
    extra: dict[str, Any] = {}
    guard: contextlib.AbstractContextManager[None] = contextlib.nullcontext()
    if run.variant == "disk":
        reset_disk_table(args)
        guard = reopened_disk_tiers()
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_majflt
    with guard:
        result = benchkit.run_training(run_config(args, run), args.data_dir / "runs", run.key.replace("/", "-"))
    if run.variant == "disk":
        timed = [h for h in result.history if h.get("kind") == "train" and h["step"] > args.warmup]
        extra = {  # slot reads: rows read from the file while timed; faults: the whole run's page-ins
            "slot_reads": int(sum(h.get(f"{t}/tier.disk.slot_reads", 0) for h in timed for t in disk_tables(args))),
            "disk_hit_rate": float(np.mean([h.get(f"{DISK_TABLE}/tier.disk.hit_rate", np.nan) for h in timed])),
            "major_faults": resource.getrusage(resource.RUSAGE_SELF).ru_majflt - faults,
        }
    rate, steps = timed_rate(result.history, args.warmup)
    return {"samples_per_s": rate, "timed_steps": steps, **extra}


def prebuilt(args: argparse.Namespace) -> tuple[Components, list[Batch]]:
    """The parts of the Parquet run (a) and warmup + steps of its batches, read and featurized
    (cycling over epochs if the file holds fewer)."""
    raw = run_config(args, Run("in-memory"))
    raw["train"].update(out_dir=str(args.data_dir / "runs"), run_name="prebuilt", progress=False)
    cfg = from_dict(raw)
    parts, run_dir = prepare_run(cfg)  # seeds, threads and parts exactly as train() sets them up
    shutil.rmtree(run_dir, ignore_errors=True)
    need, batches, epoch = args.warmup + args.steps, [], 0
    while len(batches) < need:
        for batch in make_batches(cfg.data, cfg.schema, "train", epoch=epoch):
            batches.append(batch.to(parts.device))
            if len(batches) == need:
                break
        epoch += 1
    return parts, batches


def measure_in_memory(args: argparse.Namespace) -> dict[str, Any]:
    """Variant (c): the pipelined trainer (``train(cfg, batches=...)``) on the Parquet run's
    batches, read and featurized beforehand."""
    raw = run_config(args, Run("in-memory"))
    raw["train"]["epochs"] = 1
    _, batches = prebuilt(args)
    result = benchkit.run_training(raw, args.data_dir / "runs", "in-memory", batches=batches)
    rate, steps = timed_rate(result.history, args.warmup)
    return {"samples_per_s": rate, "timed_steps": steps}


def measure_dense_only(args: argparse.Namespace) -> dict[str, Any]:
    """Variant (d): the model's step on embedding outputs computed beforehand (eval-mode lookups
    of the same batches, held as plain tensors), dense optimizer only; in the precision the
    ember runs train in (``train.precision``, as resolved)."""
    parts, batches = prebuilt(args)
    parts.train(False)
    inputs = []
    with torch.no_grad():
        for b in batches:
            emb = parts.embeddings(b.sparse)
            lin = parts.linear(b.sparse) if parts.linear is not None else None
            inputs.append((b.dense, [emb[f.name] for f in parts.embeddings.features],
                           [lin[f.name] for f in parts.linear.features] if lin is not None else None, b.labels))
    parts.train(True)
    opt = parts.dense_optimizer
    times = []
    for dense, pooled, linear, labels in inputs:
        t0 = time.perf_counter()
        with autocast(parts.device, parts.precision):
            logits = parts.model(dense, pooled, linear)
        loss = multitask_bce(logits.float(), labels)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        float(loss)
        times.append(time.perf_counter() - t0)
    return {"samples_per_s": args.batch * args.steps / sum(times[args.warmup :]), "timed_steps": args.steps}


def run_variant(args: argparse.Namespace) -> None:
    """Child process: measure one variant and print its result as the last line."""
    run = Run(args.variant, args.format, args.pipeline == "on", args.staleness)
    if args.arrow_threads:
        import pyarrow

        pyarrow.set_cpu_count(args.arrow_threads)
    if run.variant in ("files", "disk"):
        out = measure_training(args, run)
    elif run.variant == "in-memory":
        out = measure_in_memory(args)
    else:
        out = measure_dense_only(args)
    print(json.dumps({"key": run.key, **out}))


def spawn(args: argparse.Namespace, run: Run) -> dict[str, Any]:
    """Run one variant in a fresh process of this script; its last stdout line is its result."""
    cmd = [sys.executable, str(Path(__file__).resolve()), *run.argv(), *shared_argv(args)]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout[-4000:] + proc.stderr[-4000:])
        raise RuntimeError(f"variant {run.key} failed (exit {proc.returncode}): {' '.join(cmd)}")
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    out["process_s"] = time.perf_counter() - t0
    return out


def shared_argv(args: argparse.Namespace) -> list[str]:
    """The options every variant process takes from the parent."""
    return ["--rows", str(args.rows), "--steps", str(args.steps), "--warmup", str(args.warmup),
            "--batch", str(args.batch), "--data-dir", str(args.data_dir), "--big-vocab", str(args.big_vocab),
            "--disk-rows", str(args.disk_rows), "--disk-tables", str(args.disk_tables),
            "--data-workers", str(args.data_workers), "--engine", args.engine, "--arrow-threads", str(args.arrow_threads)]


# ---- parent ---------------------------------------------------------------------------------------
def report(args: argparse.Namespace, results: dict[str, list[dict[str, Any]]], seconds: float) -> dict[str, Any]:
    """Print the table and ratios; return the JSON summary."""
    rates = {k: [r["samples_per_s"] for r in v] for k, v in results.items()}
    med = {k: benchkit.spread(v) for k, v in rates.items()}
    print(f"\nsamples/s over {args.steps} timed steps (after {args.warmup} warm-up), batch {args.batch}, "
          f"{args.rounds} round(s); median (min-max) over rounds:")
    benchkit.print_table(["variant", "median", "min", "max", "ms/step"],
                         [[k, f"{m['median']:,.0f}", f"{m['min']:,.0f}", f"{m['max']:,.0f}",
                           f"{args.batch / m['median'] * 1e3:.1f}"] for k, m in med.items()])
    m = {k: v["median"] for k, v in med.items()}
    k = args.staleness
    pairs = {"parquet_vs_inmemory": ("files/parquet/pipelined", "in-memory"),
             "csv_vs_inmemory": ("files/csv/pipelined", "in-memory"),
             f"staleness{k}_vs_0": (f"disk/staleness{k}", "disk/staleness0")}
    extra = {**{f"{f}_pipelined_vs_inline": (f"files/{f}/pipelined", f"files/{f}/inline") for f in FORMATS},
             "inmemory_vs_dense": ("in-memory", "dense-only"),
             # what staleness could win at most: the cold table's whole cost at k = 0 (the same
             # run, (a), with every row in memory, over the disk run with k = 0)
             f"staleness{k}_ceiling": ("files/parquet/pipelined", "disk/staleness0")}

    def ratio(a: str, b: str) -> float | None:  # None when --only left a variant out
        return m[a] / m[b] if a in m and b in m else None

    out: dict[str, Any] = {name: ratio(a, b) for name, (a, b) in {**pairs, **extra}.items()}
    per_round = {name: [x / y for x, y in zip(rates[a], rates[b])] for name, (a, b) in pairs.items()
                 if a in rates and b in rates}
    print("\nratios of medians (in brackets: the same ratio within each round):")
    for name, target in zip(pairs, TARGETS.values()):
        if out[name] is not None:
            rounds = ", ".join(f"{x:.3f}" for x in per_round[name])
            print(f"  {name:<24} {out[name]:.3f}  [{rounds}]  (target >= {target})")
    for name in extra:
        if out[name] is not None:
            print(f"  {name:<24} {out[name]:.3f}")
    fields = ("slot_reads", "disk_hit_rate", "major_faults")
    disk = {key: {f: [r[f] for r in v] for f in fields} for key, v in results.items() if key.startswith("disk/")}
    for key, d in disk.items():
        print(f"{key}: per run, rows read from the disk tier while timed {d['slot_reads']}, its hit rate "
              f"{[round(x, 3) for x in d['disk_hit_rate']]}, major page faults of the whole process {d['major_faults']}")
    return {
        "bench": "pipeline", **out, "targets": {**TARGETS}, "per_round": per_round, "samples_per_s": med, "runs": rates,
        "disk": disk,
        "rows": args.rows, "batch": args.batch, "steps": args.steps, "warmup": args.warmup, "rounds": args.rounds, "engine": args.engine,
        "arrow_threads": args.arrow_threads,
        "big_vocab": args.big_vocab, "disk_rows": args.disk_rows, "torch_threads": torch.get_num_threads(),
        "seconds": seconds,
    }


def main() -> None:
    allocator.reexec_tuned([__file__, *sys.argv[1:]])  # as the ember command line runs (see ember/allocator.py)
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=1_000_000, help="rows of the generated data files")
    ap.add_argument("--steps", type=int, default=30, help="timed steps per process")
    ap.add_argument("--warmup", type=int, default=5, help="steps before timing starts (>= 1)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--batch", type=int, default=4096)
    ap.add_argument("--data-dir", type=Path, default=Path(tempfile.gettempdir()) / "ember-bench-pipeline",
                    help="data files, disk table and scratch runs (reused while their parameters match)")
    ap.add_argument("--staleness", type=int, default=2, help="pipeline.embedding_staleness compared with 0")
    ap.add_argument("--big-vocab", type=int, default=10_000_000, help="IDs of C1, the table put on disk")
    ap.add_argument("--disk-rows", type=int, default=4_000_000,
                    help="rows C1's disk file is sized for (spreads its rows over more pages)")
    ap.add_argument("--disk-tables", type=int, default=1,
                    help="tables on the disk tier in variant (e): C1 (--big-vocab IDs) .. C<N> (100,000 IDs each)")
    ap.add_argument("--timeout", type=float, default=600, help="seconds one variant process may take")
    ap.add_argument("--data-workers", type=int, default=0, choices=[0, 1],
                    help="pipeline.data_workers of the pipelined runs (1: read and featurize in a worker process)")
    ap.add_argument("--engine", choices=["auto", "threads", "inline"], default="auto",
                    help="pipeline.engine of the pipelined variants (a, c, e)")
    ap.add_argument("--arrow-threads", type=int, default=0,
                    help="pyarrow's CPU thread pool in each variant process (0: pyarrow's default, one per core): "
                         "whether decoding threads beside the trainer's own oversubscribe a GPU host")
    ap.add_argument("--only", choices=["files", "disk"], help="run only these variants (files: a-d; disk: e)")
    ap.add_argument("--variant", choices=["files", "in-memory", "dense-only", "disk"], help=argparse.SUPPRESS)
    ap.add_argument("--format", choices=FORMATS, default="parquet", help=argparse.SUPPRESS)
    ap.add_argument("--pipeline", choices=["on", "off"], default="on", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.warmup < 1 or args.steps < 1:
        ap.error("--warmup and --steps must be >= 1 (the first log window includes start-up)")
    args.data_dir = args.data_dir.resolve()
    if args.variant is not None:
        run_variant(args)
        return
    t0 = time.perf_counter()
    benchkit.ensure_synthetic_files(args.data_dir, args.rows, FORMATS, benchkit.criteo_synthetic_options(args.big_vocab))
    prepare_disk_table(args)
    print(f"data in {args.data_dir} ready after {time.perf_counter() - t0:.0f} s; "
          f"torch threads {torch.get_num_threads()}, GOMP_SPINCOUNT={os.environ.get('GOMP_SPINCOUNT')}", flush=True)
    results: dict[str, list[dict[str, Any]]] = {}
    for r in range(args.rounds):
        for run in round_runs(args.staleness):
            if args.only == "disk" and run.variant != "disk" or args.only == "files" and run.variant == "disk":
                continue
            out = spawn(args, run)
            results.setdefault(run.key, []).append(out)
            extra = f", {out['slot_reads']:,} disk rows read" if "slot_reads" in out else ""
            print(f"round {r + 1}/{args.rounds}  {run.key:<26} {out['samples_per_s']:>9,.0f} samples/s  "
                  f"(process {out['process_s']:.1f} s{extra})", flush=True)
    shutil.rmtree(args.data_dir / "runs", ignore_errors=True)
    from benchkit import json_line  # the machine (CPU model, bf16) in the final line
    print(json_line(report(args, results, time.perf_counter() - t0)))


if __name__ == "__main__":
    main()
