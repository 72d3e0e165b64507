"""Read + featurize of Criteo-shaped batches (issue 29, item 3): milliseconds per 4,096 rows from
Parquet and from CSV, the buffer path (categorical values hashed straight from Arrow's buffers in
the native core, all single-valued sparse columns in one call, ``_native.featurize_ids``, and
integer columns without copies) against the reference path, paired.

Two workloads, each written once as Parquet and as CSV (``--rows`` rows, into ``--data-dir``):

- ``ids``: ``ember generate``'s Criteo-shaped data, the workload of bench_pipeline.py (13 integer
  counts, 26 categorical columns that are already integer IDs: ``hash_ids: false``);
- ``hex``: the same rows with every categorical value written as Kaggle Criteo writes it, an
  8-hex-digit string (3 % of them empty: missing), read with the ``criteo`` preset's schema
  (hashed, ``missing_values: [""]``), and the label and I columns as in the ``ids`` files.

Each variant reads the file with ember's own readers (``Source.open`` of ``ember.source.protocol``:
Parquet ``read_rows`` 4,096, CSV blocks of about 4,096 rows) and featurizes every block with
``Featurizer``; the reference variant has the featurizer call the reference functions
(``hash_array_reference``, Arrow's casts for string IDs and counts, and the transforms'
general paths, column by column: ``Featurizer.one_pass = False``) on CSV read as text by pyarrow.
The buffer path reads CSV as the loader does: plain blocks split by ember's native splitter
(``csv_split``, every column text), others by pyarrow with typed columns
(``featurizer.read_types``); for CSV a third variant, ``text``, is the buffer featurizer on CSV
read as text by pyarrow (no native split, no typed columns: the reader before both). The variants
run in this one process on the same blocks, step by step, the first of each step rotating; per block, time =
its read + its featurize, scaled to 4,096 rows (a block under 2,048 rows, a file's
last, is left out). Reported: the median over blocks and rounds,
min-max, the median of the per-block ratio reference / buffer path, and for CSV of text / buffer
path (``typed_speedup``: what the reader gains over pyarrow's text read, by the native split or
typed columns).

    python bench/bench_featurize.py [--rows 40960] [--rounds 3] [--data-dir DIR]

The last line is one JSON object with, per workload and format, ``ms_per_4096`` (median, min,
max) of each variant, its read and featurize parts, ``speedup`` (paired median), and the machine.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator

import benchkit  # first: it imports ember before torch (see ember/__init__.py)
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

import ember.featurize.featurizer as featurizer_module
import ember.featurize.transforms as transforms_module
import ember.source.csv as csv_module
from ember import allocator
from ember.config import from_dict
from ember.featurize.featurizer import Featurizer, read_types
from ember.featurize.hashing import hash_array_reference
from ember.featurize.transforms import parse_floats, parse_ints, row_of
from ember.source.protocol import Unit, source_for
from ember.source.bad_rows import BadRowReport

BATCH = 4096


def _parse_ints_reference(arr: pa.Array) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    if pa.types.is_integer(arr.type):  # the general path: fill, cast, copy
        missing = np.asarray(arr.is_null(), dtype=bool)
        return arr.fill_null(0).cast(pa.int64()).to_numpy(zero_copy_only=False), missing, np.zeros_like(missing)
    return parse_ints(arr)


def _parse_floats_reference(arr: pa.Array) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return parse_floats(arr.cast(pa.float64()) if pa.types.is_integer(arr.type) else arr)


def _filter_jagged_reference(lengths: np.ndarray, keep: np.ndarray) -> np.ndarray:
    return np.bincount(row_of(lengths)[keep], minlength=lengths.size).astype(np.int64)


REFERENCE = {"hash_array": hash_array_reference, "parse_ints": _parse_ints_reference,
             "parse_floats": _parse_floats_reference, "filter_jagged": _filter_jagged_reference}


@contextlib.contextmanager
def reference_paths() -> Iterator[None]:
    """The featurizer module calling the reference functions instead of the buffer paths."""
    saved = {k: getattr(featurizer_module, k) for k in REFERENCE}
    buffer_paths = {k: getattr(transforms_module, k) for k in ("_buffer_ints", "_buffer_int_floats")}
    for k, fn in REFERENCE.items():
        setattr(featurizer_module, k, fn)
    for k in buffer_paths:  # string columns: the general paths (Arrow's casts)
        setattr(transforms_module, k, lambda arr: None)
    Featurizer.one_pass = False  # column by column
    try:
        with pyarrow_reads():
            yield
    finally:
        Featurizer.one_pass = True
        for k, fn in saved.items():
            setattr(featurizer_module, k, fn)
        for k, fn in buffer_paths.items():
            setattr(transforms_module, k, fn)


@contextlib.contextmanager
def pyarrow_reads() -> Iterator[None]:
    """CSV blocks read by pyarrow (typed where asked), none split by ember's native splitter."""
    csv_module._SPLIT = False
    try:
        yield
    finally:
        csv_module._SPLIT = True


def write_hex(ids_parquet: Path, out_dir: Path) -> dict[str, Path]:
    """The ``ids`` rows with 8-hex-digit categorical strings (3 % empty), as Parquet and TSV."""
    paths = {"parquet": out_dir / "hex.parquet", "csv": out_dir / "hex.tsv"}
    if all(p.exists() and p.stat().st_mtime >= ids_parquet.stat().st_mtime for p in paths.values()):
        return paths
    t = pq.read_table(ids_parquet)
    rng = np.random.default_rng(0)
    cols = {}
    for name in t.column_names:
        col = t.column(name)
        if name.startswith("C"):
            low = pc.bit_wise_and(col, pa.scalar(0xFFFFFFFF, pa.int64())).to_numpy()
            text = np.char.mod("%08x", low).astype(object)
            text[rng.random(len(text)) < 0.03] = ""
            col = pa.array(text, pa.string())
        cols[name] = col
    hexed = pa.table(cols)
    pq.write_table(hexed, paths["parquet"], row_group_size=BATCH)
    pacsv.write_csv(hexed, paths["csv"], pacsv.WriteOptions(include_header=False, delimiter="\t", quoting_style="none"))
    return paths


def configs(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """(workload, format) -> raw config whose ``data`` reads that file."""
    opts = benchkit.criteo_synthetic_options()
    ids = benchkit.ensure_synthetic_files(args.data_dir, args.rows, ("parquet", "csv"), opts)
    hexed = write_hex(ids["parquet"], args.data_dir)
    model = {"model": {"type": "dlrm", "bottom_mlp": [16], "top_mlp": [16]}, "embedding": {"dim": 16}}
    csv_block = {"block_bytes": int(ids["csv"].stat().st_size / args.rows * BATCH)}
    hex_block = {"block_bytes": int(hexed["csv"].stat().st_size / args.rows * BATCH)}
    return {
        "ids/parquet": {"data": {"preset": "synthetic", "synthetic": opts, "format": "parquet", "train": str(ids["parquet"]),
                                 "read_rows": BATCH}, **model},
        "ids/csv": {"data": {"preset": "synthetic", "synthetic": opts, "format": "csv", "train": str(ids["csv"]),
                             "csv": csv_block}, **model},
        "hex/parquet": {"data": {"preset": "criteo", "format": "parquet", "train": str(hexed["parquet"]), "read_rows": BATCH},
                        **model},
        "hex/csv": {"data": {"preset": "criteo", "format": "tsv", "train": str(hexed["csv"]), "csv": hex_block}, **model},
    }


def timed_blocks(raw: dict[str, Any], variant: str) -> Iterator[tuple[float, float, int]]:
    """(read s, featurize s, rows) of each block of the file, the featurizer on the chosen path."""
    cfg = from_dict(raw)
    reference = variant == "reference"
    featurize = Featurizer(cfg.schema, BadRowReport())
    path = cfg.data.train[0] if isinstance(cfg.data.train, list) else cfg.data.train
    types = read_types(cfg.schema) if variant == "buffers" else None
    it = source_for(cfg.data).open(Unit(path), cfg.schema.columns, BadRowReport(), types=types)
    while True:
        with reference_paths() if reference else pyarrow_reads() if variant == "text" else contextlib.nullcontext():
            t0 = time.perf_counter()
            try:
                chunk = next(it)
            except StopIteration:
                return
            t1 = time.perf_counter()
            featurize(chunk.batch, chunk.file, chunk.row_numbers).to_batch()
            t2 = time.perf_counter()
        yield t1 - t0, t2 - t1, chunk.batch.num_rows


def measure(raw: dict[str, Any], rounds: int) -> dict[str, Any]:
    """The variants step by step over the file's blocks, rotating which goes first."""
    variants = ["reference", "buffers"] + (["text"] if raw["data"]["format"] in ("csv", "tsv") else [])
    times: dict[str, dict[str, list[float]]] = {v: {"total": [], "read": [], "featurize": []} for v in variants}
    ratios: list[float] = []
    typed_ratios: list[float] = []
    step = 0
    for _ in range(rounds):
        its = {v: timed_blocks(raw, v) for v in variants}
        while True:
            order = variants[step % len(variants):] + variants[:step % len(variants)]
            got = {v: next(its[v], None) for v in order}
            step += 1
            if any(g is None for g in got.values()):
                break
            if any(g[2] < BATCH // 2 for g in got.values()):  # a file's short last block: its fixed costs scaled up
                continue
            per = {}
            for v, (r, f, n) in got.items():  # type: ignore[misc]
                scale = 1e3 * BATCH / n
                times[v]["read"].append(r * scale)
                times[v]["featurize"].append(f * scale)
                times[v]["total"].append((r + f) * scale)
                per[v] = r + f
            ratios.append(per["reference"] / per["buffers"])
            if "text" in per:
                typed_ratios.append(per["text"] / per["buffers"])
    out: dict[str, Any] = {v: {part: benchkit.spread(x) for part, x in t.items()} for v, t in times.items()}
    out["speedup"] = statistics.median(ratios)
    if typed_ratios:
        out["typed_speedup"] = statistics.median(typed_ratios)
    out["blocks"] = len(ratios)
    return out


def main() -> None:
    allocator.reexec_tuned([__file__, *sys.argv[1:]])  # as the ember command line runs (see ember/allocator.py)
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=40_960)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--data-dir", type=Path, default=Path(tempfile.gettempdir()) / "ember-bench-featurize")
    args = ap.parse_args()
    results = {key: measure(raw, args.rounds) for key, raw in configs(args).items()}
    rows = []
    for key, r in results.items():
        for v in ("reference", "text", "buffers"):
            if v not in r:
                continue
            t = r[v]
            gain = f"{r['speedup']:.2f}x" + (f" ({r['typed_speedup']:.2f}x vs text)" if "typed_speedup" in r else "")
            rows.append([f"{key} {v}", f"{t['total']['median']:.2f}", f"{t['total']['min']:.2f}-{t['total']['max']:.2f}",
                         f"{t['read']['median']:.2f}", f"{t['featurize']['median']:.2f}", gain if v == "buffers" else ""])
    print(f"ms per {BATCH:,} rows (median over {args.rounds} rounds of the file's blocks; paired speed-up):")
    benchkit.print_table(["workload/format variant", "read+featurize", "min-max", "read", "featurize", "speed-up"], rows)
    print(benchkit.json_line({"bench": "featurize", "rows": args.rows, "rounds": args.rounds, **{
        key: {"ms_per_4096": {v: r[v] for v in ("reference", "text", "buffers") if v in r}, "speedup": r["speedup"],
              **({"typed_speedup": r["typed_speedup"]} if "typed_speedup" in r else {}), "blocks": r["blocks"]}
        for key, r in results.items()}}))


if __name__ == "__main__":
    main()
