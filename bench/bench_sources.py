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
  start (said so in the output and in the JSON line's ``sql_database``);
- ``sql_build`` (with ``--pg-driver PATH``): ``sql`` through another build of PostgreSQL's ADBC
  driver, ``data.sql.driver_path: PATH`` (e.g. one built with ``-DCMAKE_BUILD_TYPE=Release``:
  the PyPI wheel's decode is most of the ``sql`` variant's CPU), ratio ``sql_build_vs_local``.

A run's figure is the median ``samples_per_s`` of its train records (the first left out); the
ratios are paired per round (``s3 / local`` and ``sql / local`` of the same round), then the
median over rounds (see shared/BENCHMARKING.md: absolute numbers move between runs on this box).

Before the rounds, ``--warmup`` untimed runs of each variant: the process's first training
(imports, first allocations, the first connection) otherwise fell on round 0's first variant,
always ``local``, and made round 0 favour the remote sources (local 58,176 samples/s there
against 99,316-115,338 in rounds 1-2 of one run). ``--reps`` is 6 (two full rotations of the
order; it was 3): on the loaded 2-vCPU box one round's ``sql / local`` ranged 0.64-1.31 and
3-round medians 0.80-1.20 between runs, so more rounds, not fewer rows, steady the median.

Also per run: CPU seconds of the trainer's process and of the server's processes (the
PostgreSQL postmaster and its backends; moto's process), medians in the JSON line's
``cpu_s``: what each source costs the 2 shared cores, steadier than samples/s under load.

    python bench/bench_sources.py            # last line: one JSON object (s3_vs_local, sql_vs_local)
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
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


def _samples_per_s(raw: dict[str, Any], server: int | None) -> tuple[float, float, float, float]:
    """Median samples/s of a run of ``raw``, its wall seconds and the CPU seconds of this
    process and of the process ``server`` (with its children; 0 without one) during it."""
    s0, c0, t0 = _cpu_seconds(server), time.process_time(), time.perf_counter()
    result = train(from_dict(raw))
    wall, cpu, server_cpu = time.perf_counter() - t0, time.process_time() - c0, _cpu_seconds(server) - s0
    sps = [r["samples_per_s"] for r in result.history if r["kind"] == "train"][1:]
    shutil.rmtree(result.run_dir, ignore_errors=True)
    return statistics.median(sps), wall, cpu, server_cpu


def _cpu_seconds(pid: int | None) -> float:
    """CPU seconds of process ``pid`` so far: its own, its exited children's and its live
    children's (PostgreSQL's backends, one per connection, are the postmaster's children)."""
    if pid is None:
        return 0.0
    hz = os.sysconf("SC_CLK_TCK")

    def fields(p: str) -> list[str]:
        with open(f"/proc/{p}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()  # after "pid (comm)": state ppid ...

    own = fields(str(pid))
    ticks = sum(int(x) for x in own[11:15])  # utime stime cutime cstime
    for p in os.listdir("/proc"):
        if p.isdigit() and p != str(pid):
            try:
                f = fields(p)
            except OSError:  # gone meanwhile
                continue
            if f[1] == str(pid):
                ticks += int(f[11]) + int(f[12])
    return ticks / hz


def _database(stack: Any, table: pa.Table, root: Path) -> tuple[dict[str, Any], str, int | None]:
    """``data.sql`` for ``table`` in PostgreSQL (SQLite when PostgreSQL cannot start), its name
    and the server's process id (the postmaster; None for SQLite, in this process)."""
    from ember.testing.postgres import PostgresServer, missing

    why = missing()
    if why is None:
        try:
            pg = stack.enter_context(PostgresServer())
            pg.load("clicks", table)
            pg.execute("ALTER TABLE clicks ADD PRIMARY KEY (id)", "ANALYZE clicks")
            postmaster = int((pg.data / "postmaster.pid").read_text().split()[0])
            return {"driver": "postgresql", "uri": pg.uri}, "postgresql", postmaster
        except Exception as e:  # noqa: BLE001  # said below, then SQLite
            why = str(e).splitlines()[0]
    print(f"PostgreSQL cannot start here ({why}); the sql variant reads SQLite instead")
    import adbc_driver_sqlite.dbapi as sqlite

    uri = str(root / "clicks.db")
    with sqlite.connect(uri) as conn, conn.cursor() as cur:
        cur.adbc_ingest("clicks", table)
        cur.execute("CREATE UNIQUE INDEX clicks_id ON clicks (id)")
        conn.commit()
    return {"driver": "sqlite", "uri": uri}, "sqlite", None


@contextlib.contextmanager
def _moto_process() -> Iterator[Any]:
    """moto's S3 server in a process of its own on a free port of 127.0.0.1: a boto3 client,
    ``data.storage_options`` for it (moto checks no credentials unless asked) and its pid."""
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
        yield client, options, proc.pid
    finally:
        proc.terminate()
        proc.wait(10)


def main() -> None:

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=240_000)
    ap.add_argument("--files", type=int, default=4)
    ap.add_argument("--reps", type=int, default=6, help="rounds (each variant once per round, order rotated)")
    ap.add_argument("--warmup", type=int, default=1, help="untimed runs of each variant before the rounds")
    ap.add_argument("--pg-driver", metavar="PATH", help="also a sql_build variant: PostgreSQL through this driver "
                    "library (data.sql.driver_path), e.g. an optimised build of libadbc_driver_postgresql.so")
    ap.add_argument("--s3-in-process", action="store_true", help="the tests' S3 server (threads of this process)")
    args = ap.parse_args()
    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # moto's request log
    root = Path(tempfile.mkdtemp(prefix="bench_sources-"))
    per_file = -(-args.rows // args.files)
    runs: dict[str, list[float]] = {"local": [], "s3": [], "sql": [], **({"sql_build": []} if args.pg_driver else {})}
    walls: dict[str, list[float]] = {k: [] for k in runs}
    cpus: dict[str, list[tuple[float, float]]] = {k: [] for k in runs}  # (trainer, server) CPU seconds
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
                s3_options, s3_pid = server.options(), None  # its threads: counted in this process
            else:
                client, s3_options, s3_pid = stack.enter_context(_moto_process())
                client.create_bucket(Bucket="bench")
                for f in sorted(local.iterdir()):
                    client.upload_file(str(f), "bench", f"train/{f.name}")
            sql, database, sql_pid = _database(stack, table, root)
            servers = {"local": None, "s3": s3_pid, "sql": sql_pid, "sql_build": sql_pid}
            variants = {
                "local": {"format": "parquet", "train": str(local)},
                "s3": {"format": "parquet", "train": "s3://bench/train/", "storage_options": s3_options},
                "sql": {"format": "sql", "sql": {**sql, "query": "SELECT * FROM clicks", "key": "id"}},
            }
            if args.pg_driver and database == "postgresql":
                variants["sql_build"] = {"format": "sql", "sql": {**variants["sql"]["sql"], "driver_path": args.pg_driver}}
            runs, walls, cpus = ({k: v for k, v in d.items() if k in variants} for d in (runs, walls, cpus))  # type: ignore[assignment]  # same types, fewer keys
            order = list(variants)
            for w in range(args.warmup):
                for name in order:
                    sps, wall, _, _ = _samples_per_s(_raw(root, f"{name}-warmup{w}", variants[name]), servers[name])
                    print(f"warm-up {name:<6} {sps:>10,.0f} samples/s ({wall:.1f} s, not counted)", flush=True)
            for rep in range(args.reps):
                for name in order[rep % len(order):] + order[:rep % len(order)]:  # rotate which goes first
                    sps, wall, cpu, server_cpu = _samples_per_s(_raw(root, f"{name}-{rep}", variants[name]), servers[name])
                    runs[name].append(sps)
                    walls[name].append(wall)
                    cpus[name].append((cpu, server_cpu))
                    print(f"round {rep} {name:<6} {sps:>10,.0f} samples/s ({wall:.1f} s; CPU s: trainer {cpu:.2f}, "
                          f"server {server_cpu:.2f})", flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    ratio = {k: statistics.median(a / b for a, b in zip(runs[k], runs["local"])) for k in runs if k != "local"}
    cpu_s = {k: {"trainer": round(statistics.median(c for c, _ in v), 2), "server": round(statistics.median(s for _, s in v), 2)}
             for k, v in cpus.items()}
    print(f"\n{'variant':<8}{'samples/s median (min-max)':>32}{'run s median':>14}{'CPU s trainer / server':>26}")
    for k, v in runs.items():
        print(f"{k:<8}{statistics.median(v):>16,.0f} ({min(v):,.0f}-{max(v):,.0f}){statistics.median(walls[k]):>12.1f}"
              f"{cpu_s[k]['trainer']:>16.2f} / {cpu_s[k]['server']:.2f}")
    build = f"   sql_build / local {ratio['sql_build']:.3f}" if "sql_build" in ratio else ""
    print(f"s3 / local {ratio['s3']:.3f}   sql ({database}) / local {ratio['sql']:.3f}{build}   (paired per round, median)")
    from benchkit import json_line  # the machine (CPU model, bf16) in the final line

    print(json_line({"s3_vs_local": round(ratio["s3"], 3), "sql_vs_local": round(ratio["sql"], 3),
                     "sql_database": database, "s3_server": "in-process" if args.s3_in_process else "own process", "rows": args.rows, "files": args.files, "reps": args.reps, "warmup": args.warmup, "cpu_s": cpu_s,
                     "sql_vs_local_rounds": [round(a / b, 3) for a, b in zip(runs["sql"], runs["local"])],
                     "s3_vs_local_rounds": [round(a / b, 3) for a, b in zip(runs["s3"], runs["local"])],
                     **({"sql_build_vs_local": round(ratio["sql_build"], 3), "sql_build_driver": args.pg_driver,
                         "sql_build_vs_local_rounds": [round(a / b, 3) for a, b in zip(runs["sql_build"], runs["local"])]}
                        if "sql_build" in ratio else {}),
                     "samples_per_s": {k: {"median": round(statistics.median(v)), "min": round(min(v)),
                                           "max": round(max(v))} for k, v in runs.items()}}))


if __name__ == "__main__":
    main()
