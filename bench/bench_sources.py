"""Samples/s of the same training read from local Parquet, from object storage (a local S3 server)
and from a SQL database (issue 28 item 5): do the remote sources keep up with local files?

Workload: ``--rows`` Criteo-shaped synthetic rows (13 dense, 26 sparse, vocabulary 50,000) in
``--files`` Parquet files, DLRM bottom 13-64-16, dim 16, top 64-1, batch 2048, rows in source
order (``shuffle_buffer: 0``). Variants, one process, interleaved over ``--reps`` rounds with the
order rotated each round:

- ``local``: the Parquet files on local disk;
- ``s3``: the same files in a bucket of moto's S3 server on 127.0.0.1 (real HTTP, ranged
  reads), ``data.train: s3://bench/train/``. The server runs in a process of its own (``python -m
  moto.server``), as a real store would be outside the trainer: ``ember.testing.s3``'s server,
  the tests', serves from threads of the trainer's own process and so competes with it for the
  GIL (``--s3-in-process`` measures that one);
- ``sql``: the same rows in a PostgreSQL table with a primary key ``id`` (a private server,
  ``ember.testing.postgres``), ``data.format: sql`` in key order; SQLite when PostgreSQL cannot
  start (said so in the output and in the JSON line's ``sql_database``).

A run's figure is the median ``samples_per_s`` of its train records (the first left out); the
ratios are paired per round (``s3 / local`` and ``sql / local`` of the same round), then the
median over rounds (see shared/BENCHMARKING.md: absolute numbers move between runs on this box).

    python bench/bench_sources.py            # last line: one JSON object (s3_vs_local, sql_vs_local)
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import subprocess
import sys
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator

import pyarrow as pa
import pyarrow.parquet as pq

from ember.config import from_dict
from ember.source.config import SyntheticOptions
from ember.source.writer import write_synthetic
from ember.train.loop import train


def _raw(root: Path, name: str, data: dict[str, Any]) -> dict[str, Any]:
    return {"data": {"preset": "synthetic", "batch_size": 2048, "shuffle_buffer": 0, **data},
            "embedding": {"dim": 16}, "model": {"type": "dlrm", "bottom_mlp": [64, 16], "top_mlp": [64]},
            "train": {"out_dir": str(root / "runs"), "run_name": name, "progress": False, "log_every": 10}}


def _samples_per_s(raw: dict[str, Any]) -> tuple[float, float]:
    t0 = time.perf_counter()
    result = train(from_dict(raw))
    wall = time.perf_counter() - t0
    sps = [r["samples_per_s"] for r in result.history if r["kind"] == "train"][1:]
    shutil.rmtree(result.run_dir, ignore_errors=True)
    return statistics.median(sps), wall


def _database(stack: Any, table: pa.Table, root: Path) -> tuple[dict[str, Any], str]:
    """``data.sql`` for ``table`` in PostgreSQL (SQLite when PostgreSQL cannot start), and its name."""
    from ember.testing.postgres import PostgresServer, missing

    why = missing()
    if why is None:
        try:
            pg = stack.enter_context(PostgresServer())
            pg.load("clicks", table)
            pg.execute("ALTER TABLE clicks ADD PRIMARY KEY (id)", "ANALYZE clicks")
            return {"driver": "postgresql", "uri": pg.uri}, "postgresql"
        except Exception as e:  # noqa: BLE001  # said below, then SQLite
            why = str(e).splitlines()[0]
    print(f"PostgreSQL cannot start here ({why}); the sql variant reads SQLite instead")
    import adbc_driver_sqlite.dbapi as sqlite

    uri = str(root / "clicks.db")
    with sqlite.connect(uri) as conn, conn.cursor() as cur:
        cur.adbc_ingest("clicks", table)
        cur.execute("CREATE UNIQUE INDEX clicks_id ON clicks (id)")
        conn.commit()
    return {"driver": "sqlite", "uri": uri}, "sqlite"


@contextlib.contextmanager
def _moto_process() -> Iterator[Any]:
    """moto's S3 server in a process of its own on a free port of 127.0.0.1: a boto3 client and
    ``data.storage_options`` for it (moto checks no credentials unless asked)."""
    import boto3
    import requests

    from ember.testing.distributed import free_port

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(200):
            try:
                requests.get(url, timeout=1)
                break
            except requests.ConnectionError:
                time.sleep(0.05)
        client = boto3.client("s3", endpoint_url=url, region_name="us-east-1", aws_access_key_id="bench",
                              aws_secret_access_key="bench")
        options = {"endpoint_override": url, "access_key": "bench", "secret_key": "bench", "region": "us-east-1"}
        yield client, options
    finally:
        proc.terminate()
        proc.wait(10)


def main() -> None:

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=240_000)
    ap.add_argument("--files", type=int, default=4)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--s3-in-process", action="store_true", help="the tests' S3 server (threads of this process)")
    args = ap.parse_args()
    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # moto's request log
    root = Path(tempfile.mkdtemp(prefix="bench_sources-"))
    per_file = -(-args.rows // args.files)
    runs: dict[str, list[float]] = {"local": [], "s3": [], "sql": []}
    walls: dict[str, list[float]] = {k: [] for k in runs}
    try:
        with contextlib.ExitStack() as stack:
            local = root / "train"
            local.mkdir()
            parts = []
            for k in range(args.files):
                path = local / f"part-{k:03d}.parquet"
                write_synthetic(str(path), "parquet", per_file, SyntheticOptions(rows=per_file, seed=k, vocab_size=50_000))
                parts.append(pq.read_table(path))
            table = pa.concat_tables(parts)
            table = table.append_column("id", pa.array(range(table.num_rows), pa.int64()))
            if args.s3_in_process:
                from ember.testing.s3 import S3Server

                server = stack.enter_context(S3Server())
                server.bucket("bench")
                server.upload(local, "bench/train")
                s3_options = server.options()
            else:
                client, s3_options = stack.enter_context(_moto_process())
                client.create_bucket(Bucket="bench")
                for f in sorted(local.iterdir()):
                    client.upload_file(str(f), "bench", f"train/{f.name}")
            sql, database = _database(stack, table, root)
            variants = {
                "local": {"format": "parquet", "train": str(local)},
                "s3": {"format": "parquet", "train": "s3://bench/train/", "storage_options": s3_options},
                "sql": {"format": "sql", "sql": {**sql, "query": "SELECT * FROM clicks", "key": "id"}},
            }
            order = list(variants)
            for rep in range(args.reps):
                for name in order[rep % 3:] + order[:rep % 3]:  # rotate which goes first
                    sps, wall = _samples_per_s(_raw(root, f"{name}-{rep}", variants[name]))
                    runs[name].append(sps)
                    walls[name].append(wall)
                    print(f"round {rep} {name:<6} {sps:>10,.0f} samples/s ({wall:.1f} s)", flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    ratio = {k: statistics.median(a / b for a, b in zip(runs[k], runs["local"])) for k in ("s3", "sql")}
    print(f"\n{'variant':<8}{'samples/s median (min-max)':>32}{'run s median':>14}")
    for k, v in runs.items():
        print(f"{k:<8}{statistics.median(v):>16,.0f} ({min(v):,.0f}-{max(v):,.0f}){statistics.median(walls[k]):>12.1f}")
    print(f"s3 / local {ratio['s3']:.3f}   sql ({database}) / local {ratio['sql']:.3f}   (paired per round, median)")
    from benchkit import json_line  # the machine (CPU model, bf16) in the final line

    print(json_line({"s3_vs_local": round(ratio["s3"], 3), "sql_vs_local": round(ratio["sql"], 3),
                     "sql_database": database, "s3_server": "in-process" if args.s3_in_process else "own process", "rows": args.rows, "files": args.files, "reps": args.reps,
                     "samples_per_s": {k: {"median": round(statistics.median(v)), "min": round(min(v)),
                                           "max": round(max(v))} for k, v in runs.items()}}))


if __name__ == "__main__":
    main()
