"""What one rank of N=2 spends reading and featurizing the training data, against one process
reading all of it (issue 10 item 4): ``data.shard: files`` (rank 0's files only, in batches of
B/N) and synthetic data under ``data.shard: rows`` (rank 0's slice of each global batch).

Runs the loaders alone (no training), interleaved, in one process; prints the median seconds
per pass of each and their ratio, then a JSON object. Speeds on a shared box drift: compare the
ratios, not the seconds.

    python bench/bench_shard_read.py [--rows 200000] [--files 4] [--rounds 3]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from ember.featurize.presets import preset_schema
from ember.pipeline.loader import make_batches, write_synthetic
from ember.source.config import DataConfig, SyntheticOptions


def _seconds(make) -> float:
    t = time.perf_counter()
    for _ in make():
        pass
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--files", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=4096)
    args = ap.parse_args()
    opts = SyntheticOptions(rows=args.rows)  # Criteo-shaped: 13 dense, 26 sparse
    schema = preset_schema("synthetic", opts)
    with tempfile.TemporaryDirectory() as tmp:
        per = args.rows // args.files
        for f in range(args.files):
            write_synthetic(str(Path(tmp) / f"part-{f}.parquet"), "parquet", per,
                            SyntheticOptions(rows=per, seed=f))
        files = DataConfig(format="parquet", train=tmp, batch_size=args.batch_size, shuffle_buffer=0, synthetic=opts)
        synth = DataConfig(batch_size=args.batch_size, synthetic=opts)
        cases = {
            "parquet_all": lambda: make_batches(files, schema, "train"),
            "parquet_files_rank0_of_2": lambda: make_batches(files, schema, "train", part=(0, 2)),
            "synthetic_all": lambda: make_batches(synth, schema, "train"),
            "synthetic_slice_rank0_of_2": lambda: make_batches(synth, schema, "train", rank_slice=(0, 2)),
        }
        times: dict[str, list[float]] = {k: [] for k in cases}
        for _ in range(args.rounds):  # interleaved rounds: drift hits every case alike
            for name, make in cases.items():
                times[name].append(_seconds(make))
    med = {k: statistics.median(v) for k, v in times.items()}
    out = {"rows": args.rows, "files": args.files, "rounds": args.rounds, "median_s": med,
           "ratio_files_rank0_vs_all": med["parquet_files_rank0_of_2"] / med["parquet_all"],
           "ratio_slice_rank0_vs_all": med["synthetic_slice_rank0_of_2"] / med["synthetic_all"]}
    for k, v in med.items():
        print(f"{k:30s} {v:7.3f} s")
    from benchkit import json_line  # the machine (CPU model, bf16) in the final line
    print(json_line(out))


if __name__ == "__main__":
    main()
