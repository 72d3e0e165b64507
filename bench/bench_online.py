"""Online training and live serving: what a delta export costs, and a scoring server following
a training run's exports under load.

(a) Delta vs full export on one large table (default 10 M rows, dim 16, row-wise Adagrad),
    filled by direct inserts. Between exports 1 % of the rows is updated through the real
    lookup phases (fetch, update, write back: what training does, so the tables' change logs
    see exactly what they see in training). A full export, then deltas: their time and bytes,
    and the ratio (target: at most 5 %). Also the change log's cost per step, and what the
    server pays to build each version (full load, each delta applied) and the memory of its
    overlay against the full table's.
(b) Online: ``ember train`` (a subprocess) on Criteo-shaped generated files with
    ``export.every_steps``, ``ember serve --export RUN/exports`` (a subprocess on loopback)
    following its exports, and concurrent clients (bounded count and time) scoring rows while
    deltas arrive: p50 / p99 latency, requests/s, failed requests, and every response's scores
    compared with the offline Predictor on a full export of the checkpoint at that version's
    step (exact equality). By default (``--mode online``) it trains with ``train.mode: online``
    on a watched directory (``data.watch``) that the files are renamed into while it trains;
    ``--mode files`` trains offline on the same files written up front.

The last line is one JSON object: ``delta_time_ratio``, ``delta_bytes_ratio``,
``failed_requests``, ``p99_ms`` and the rest of the figures.

    python bench/bench_online.py                 # defaults: well under 10 minutes on 2 cores
    python bench/bench_online.py --rows 1000000 --train-steps 60   # quicker
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import shutil
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import ember  # noqa: F401  # before torch (OpenMP setting)
import numpy as np
import torch
import yaml
from torch import Tensor, nn

REPO = Path(__file__).resolve().parents[1]


# ---------------------------------------------------------------------------------------------
# (a) delta vs full export on a large table
# ---------------------------------------------------------------------------------------------
class _Top(nn.Module):
    """A small dense model over the one pooled feature (scripted into each export)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(dim, 64), nn.ReLU(), nn.Linear(64, 1))

    def forward(self, dense: Tensor, pooled: list[Tensor], linear: list[Tensor] | None = None) -> Tensor:
        return self.mlp(pooled[0])


def delta_vs_full(out: Path, rows: int, dim: int, touched: float, steps: int, deltas: int) -> dict[str, Any]:
    from ember.checkpoint.config import ExportConfig
    from ember.checkpoint.delta import DeltaExporter
    from ember.embedding import EmbeddingCollection, FeatureConfig, TableConfig
    from ember.embedding.group import GroupLookup
    from ember.featurize.schema import Schema
    from ember.serving.follow import SeriesSource
    from ember.source.config import DataConfig

    torch.manual_seed(0)
    ec = EmbeddingCollection([TableConfig(name="big", dim=dim, optimizer={"type": "rowwise_adagrad", "lr": 0.05})],
                             [FeatureConfig(name="big", table="big")], seed=0)
    table, group = ec.tables["big"], ec.groups[0]
    ids_all = np.random.default_rng(0).permutation(rows).astype(np.int64) * 7919 + 11  # arbitrary int64 IDs
    t0 = time.perf_counter()
    for s in range(0, rows, 1 << 20):
        ids = torch.from_numpy(ids_all[s : s + (1 << 20)])
        rec = torch.randn(ids.numel(), table.config.record_dim) * 0.05
        rec[:, dim:] = rec[:, dim:].abs()  # accumulator >= 0
        table.load(ids, rec)
    fill_s = time.perf_counter() - t0
    print(f"(a) filled {rows:,} rows in {fill_s:.1f} s", flush=True)

    schema = Schema(labels=["label"], sparse=[{"name": "big"}])
    run_config = {"data": DataConfig(preset="synthetic").model_dump(mode="json"),
                  "schema": schema.model_dump(mode="json"), "model": {"type": "custom"}}
    root = out / "exports"
    shutil.rmtree(root, ignore_errors=True)
    exporter = DeltaExporter(ExportConfig(every_steps=steps, full_every=1000, keep_full=2), root, _Top(dim), [ec],
                             [FeatureConfig(name="big", table="big")], None, ["label"], run_config)
    note_s = [0.0]
    log, note = table.changes, table.changes.note

    def timed_note(ids: np.ndarray) -> None:
        t = time.perf_counter()
        note(ids)
        note_s[0] += time.perf_counter() - t

    log.note = timed_note  # type: ignore[method-assign]
    exporter.export(0)  # the first export is full
    full = exporter.records[-1]
    print(f"(a) full export: {full['seconds']:.2f} s, {full['bytes'] / 2**20:.1f} MiB", flush=True)
    rng = np.random.default_rng(1)
    per_step = max(1, int(rows * touched) // steps)
    step, step_s = 0, []
    for d in range(deltas):
        pick = ids_all[rng.choice(rows, size=per_step * steps, replace=False)]  # 1 % distinct rows per interval
        for k in range(steps):
            ids = torch.from_numpy(np.sort(pick[k * per_step : (k + 1) * per_step]))
            t = time.perf_counter()
            lk = GroupLookup.of_ids(group, [ids], train=True).fetch()
            lk.backward(torch.randn(ids.numel(), dim) * 0.01)
            lk.update(step)
            lk.write_back()
            step_s.append(time.perf_counter() - t)
            step += 1
        exporter.export(step)
        r = exporter.records[-1]
        print(f"(a) delta {r['number']}: {r['rows']:,} rows, {r['seconds']:.3f} s, {r['bytes'] / 2**20:.2f} MiB", flush=True)
    dl = [r for r in exporter.records if r["kind"] == "delta"]
    res = {
        "table_rows": rows, "touched_per_delta": per_step * steps, "fill_s": round(fill_s, 1),
        "full_export_s": round(full["seconds"], 3), "full_export_bytes": full["bytes"],
        "delta_export_s": round(statistics.median(r["seconds"] for r in dl), 4),
        "delta_export_bytes": int(statistics.median(r["bytes"] for r in dl)),
        "update_step_ms": round(1e3 * statistics.median(step_s), 3),
        "changelog_us_per_step": round(1e6 * note_s[0] / max(step, 1), 1),
    }
    res["delta_time_ratio"] = round(res["delta_export_s"] / res["full_export_s"], 4)
    res["delta_bytes_ratio"] = round(res["delta_export_bytes"] / res["full_export_bytes"], 4)
    res["changelog_share_of_step"] = round(note_s[0] / max(sum(step_s), 1e-9), 4)
    # the server's side: load the full export, then apply each delta off to the side
    t0 = time.perf_counter()
    source = SeriesSource(root)
    builds = dict(source.history)
    t_all = time.perf_counter() - t0
    served = source.current.predictor.tables["big"]
    base_bytes = served.base.ids.nbytes + served.base.weights.numel() * 4
    res.update({
        "server_full_load_s": round(builds[f"{1:06d}-full"], 2),
        "server_delta_apply_s": round(statistics.median(v for k, v in builds.items() if k.endswith("delta")), 4),
        "server_overlay_bytes": served.overlay_bytes, "server_base_bytes": int(base_bytes),
        "server_overlay_share": round(served.overlay_bytes / base_bytes, 4), "server_follow_s": round(t_all, 2),
    })
    del source, served
    if not os.environ.get("BENCH_ONLINE_KEEP"):
        shutil.rmtree(root, ignore_errors=True)
    return res


# ---------------------------------------------------------------------------------------------
# (b) online training + a server following its exports, under load
# ---------------------------------------------------------------------------------------------
SYNTH = {"num_dense": 13, "num_sparse": 26, "vocab_size": 50_000}


def _generate(path: Path, rows: int, seed: int, split: str = "train") -> None:
    tmp = path.with_name("." + path.name)
    subprocess.run([sys.executable, "-m", "ember", "generate", "--out", str(tmp), "--rows", str(rows), "--seed",
                    str(seed), "--split", split, "--options", json.dumps(SYNTH)], check=True, stdout=subprocess.DEVNULL)
    tmp.rename(path)  # a watcher sees whole files only


def training_config(args: argparse.Namespace, work: Path, inputs: Path) -> dict[str, Any]:
    """The run's config. Online mode is a config change: ``train.mode: online`` reading the
    watched directory ``inputs`` (files arrive while it trains) instead of the files there at start."""
    cfg: dict[str, Any] = {
        "data": {"preset": "synthetic", "format": "parquet", "train": str(inputs), "eval": str(work / "eval.parquet"),
                 "synthetic": SYNTH, "batch_size": args.batch, "shuffle_buffer": 0},
        "embedding": {"dim": 16, "optimizer": {"type": "rowwise_adagrad", "lr": 0.05}},
        "model": {"type": "dlrm", "bottom_mlp": [64, 16], "top_mlp": [64]},
        "train": {"out_dir": str(work), "run_name": "online", "progress": False, "max_steps": args.train_steps,
                  "epochs": 100, "log_every": args.export_every, "threads": 1,
                  "dense_optimizer": {"type": "adam", "lr": 0.001}},
        "checkpoint": {"every": args.export_every, "keep": args.train_steps // args.export_every + 2},
        "pipeline": {"enabled": False},
        "export": {"every_steps": args.export_every, "full_every": args.full_every, "keep_full": 2},
    }
    if args.mode == "online":  # files are renamed into place whole: no need to wait for them to settle
        cfg["train"]["mode"] = "online"
        cfg["train"].pop("epochs")
        cfg["data"]["watch"] = {"poll_s": 0.5, "idle_timeout_s": 60, "ready": "settled", "settle_s": 0.5}
    return cfg


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(port: int, path: str) -> dict[str, Any]:
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        c.request("GET", path)
        return json.loads(c.getresponse().read())
    finally:
        c.close()


def online(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    import pyarrow.parquet as pq

    from ember.cli import main as ember_main
    from ember.serving import Predictor

    inputs = work / "inputs"
    shutil.rmtree(work / "online", ignore_errors=True)
    shutil.rmtree(inputs, ignore_errors=True)
    inputs.mkdir(parents=True)
    _generate(work / "eval.parquet", 2000, 99, "eval")
    _generate(work / "requests.parquet", args.pool_rows, 7, "eval")
    pool = pq.read_table(work / "requests.parquet").drop(["label"]).to_pylist()
    first = args.files if args.mode == "files" else 1
    for i in range(first):
        _generate(inputs / f"part-{i:04d}.parquet", args.file_rows, i)
    cfg_file = work / "online.yaml"
    cfg_file.write_text(yaml.safe_dump(training_config(args, work, inputs)))
    run = work / "online"
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    trainer = subprocess.Popen([sys.executable, "-m", "ember", "train", "--config", str(cfg_file), "--overwrite"],
                               env=env, stdout=subprocess.DEVNULL, stderr=open(work / "train.log", "w"))
    writer = None
    if args.mode == "online":  # the rest of the files arrive while it trains
        def write_rest() -> None:
            for i in range(1, args.files):
                time.sleep(2.0)
                _generate(inputs / f"part-{i:04d}.parquet", args.file_rows, i)
        writer = threading.Thread(target=write_rest, daemon=True)
        writer.start()
    deadline = time.time() + 300
    while not (run / "exports" / "000001-full" / "manifest.json").exists():
        if trainer.poll() is not None or time.time() > deadline:
            raise RuntimeError(f"training wrote no first export (see {work / 'train.log'})")
        time.sleep(0.1)
    port = _free_port()
    server = subprocess.Popen([sys.executable, "-m", "ember", "serve", "--export", str(run / "exports"), "--port",
                               str(port), "--poll-s", str(args.poll_s), "--threads", "1"], env=env, stdout=subprocess.DEVNULL,
                              stderr=open(work / "serve.log", "w"))
    try:
        deadline = time.time() + 120
        while True:
            try:
                _get(port, "/health")
                break
            except OSError:
                if server.poll() is not None or time.time() > deadline:
                    raise RuntimeError(f"the server did not start (see {work / 'serve.log'})")
                time.sleep(0.1)
        results, failures, health = _load_test(args, port, pool, trainer)
    finally:
        server.terminate()
        server.wait(timeout=30)
        trainer.wait(timeout=600)
    if trainer.returncode != 0:
        raise RuntimeError(f"training failed (see {work / 'train.log'})")
    # offline reference: a full export of the checkpoint at each served version's step
    offline: dict[str, np.ndarray] = {}
    mismatched = 0
    for version in sorted({v for v, _, _ in results}):
        step = int(version.split("-")[0]) * args.export_every  # export n follows step n * every_steps
        out = work / "offline" / version
        shutil.rmtree(out, ignore_errors=True)
        with _quiet():
            ember_main(["export", "--checkpoint", str(run / "checkpoints" / f"step-{step:08d}"), "--out", str(out)])
        offline[version] = Predictor.load(out).predict_records(pool).astype(np.float64)
    for version, start, scores in results:
        ref = offline[version][start : start + len(scores)]
        mismatched += int(not np.array_equal(np.array(scores), ref))
    lat = sorted(r for r in (h for h in health["latencies"]))
    span = health["span_s"]
    applies = [h["last_apply_s"] for h in health["versions"].values() if h.get("last_apply_s") is not None]
    return {
        "requests": len(lat) + len(failures), "failed_requests": len(failures),
        "failures": failures[:3], "p50_ms": round(1e3 * lat[len(lat) // 2], 2) if lat else None,
        "p99_ms": round(1e3 * lat[min(len(lat) - 1, int(0.99 * len(lat)))], 2) if lat else None,
        "requests_per_s": round(len(lat) / span, 1), "versions_served": len(offline),
        "versions": sorted(offline), "score_mismatches": mismatched, "scores_equal_offline": mismatched == 0,
        "server_apply_s_median": round(statistics.median(applies), 4) if applies else None,
        "clients": args.clients, "rows_per_request": args.rows_per_request,
    }


class _quiet:
    def __enter__(self) -> None:
        self._out = sys.stdout
        sys.stdout = open(os.devnull, "w")

    def __exit__(self, *exc: object) -> None:
        sys.stdout.close()
        sys.stdout = self._out


def _load_test(args: argparse.Namespace, port: int, pool: list[dict], trainer: subprocess.Popen
               ) -> tuple[list[tuple[str, int, list]], list[str], dict[str, Any]]:
    """``clients`` threads post requests until training ended and the server serves the last
    export (plus a short tail), ``max_requests`` or ``max_seconds``; a monitor records versions."""
    results: list[tuple[str, int, list]] = []
    latencies: list[float] = []
    failures: list[str] = []
    versions: dict[str, dict] = {}
    stop = threading.Event()
    lock = threading.Lock()
    count = [0]

    def client(seed: int) -> None:
        rnd = random.Random(seed)
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        while not stop.is_set():
            with lock:
                if count[0] >= args.max_requests:
                    return
                count[0] += 1
            start = rnd.randrange(0, len(pool) - args.rows_per_request + 1)
            body = json.dumps({"rows": pool[start : start + args.rows_per_request]})
            t = time.perf_counter()
            try:
                conn.request("POST", "/score", body, {"Content-Type": "application/json"})
                resp = conn.getresponse()
                data = resp.read()
                dt = time.perf_counter() - t
                if resp.status != 200:
                    raise RuntimeError(f"HTTP {resp.status}: {data[:200]!r}")
                out = json.loads(data)
                with lock:
                    latencies.append(dt)
                    results.append((out["version"], start, out["scores"]))
            except Exception as e:
                with lock:
                    failures.append(repr(e))
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        conn.close()

    def monitor() -> None:
        while not stop.is_set():
            try:
                h = _get(port, "/health")
                versions.setdefault(h["version"], h)
            except OSError:
                pass
            time.sleep(0.1)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(args.clients)]
    mon = threading.Thread(target=monitor, daemon=True)
    t0 = time.perf_counter()
    mon.start()
    for t in threads:
        t.start()
    deadline = time.time() + args.max_seconds
    while time.time() < deadline and count[0] < args.max_requests:
        if trainer.poll() is not None:
            final = max((p.name for p in (Path(args.work) / "online" / "exports").iterdir() if p.name[0].isdigit()),
                        default=None)
            if final is not None and final in versions:
                time.sleep(1.0)  # a short tail on the final version
                break
        time.sleep(0.1)
    stop.set()
    for t in threads:
        t.join()
    span = time.perf_counter() - t0
    return results, failures, {"latencies": latencies, "versions": versions, "span_s": span}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--work", default="/tmp/ember-bench-online", help="scratch directory")
    p.add_argument("--rows", type=int, default=10_000_000, help="(a) rows of the large table")
    p.add_argument("--dim", type=int, default=16)
    p.add_argument("--touched", type=float, default=0.01, help="(a) share of rows updated between exports")
    p.add_argument("--steps", type=int, default=10, help="(a) update steps between exports")
    p.add_argument("--deltas", type=int, default=3, help="(a) delta exports measured")
    p.add_argument("--mode", choices=["files", "online"], default="online",
                   help="(b) files: train on files written up front; online: train.mode online on a watched directory")
    p.add_argument("--files", type=int, default=3, help="(b) input files")
    p.add_argument("--file-rows", type=int, default=40_000)
    p.add_argument("--batch", type=int, default=1024)
    p.add_argument("--train-steps", type=int, default=100)
    p.add_argument("--export-every", type=int, default=10)
    p.add_argument("--full-every", type=int, default=5)
    p.add_argument("--poll-s", type=float, default=0.2)
    p.add_argument("--clients", type=int, default=4)
    p.add_argument("--rows-per-request", type=int, default=16)
    p.add_argument("--pool-rows", type=int, default=512, help="(b) distinct rows the clients draw requests from")
    p.add_argument("--max-requests", type=int, default=20_000)
    p.add_argument("--max-seconds", type=float, default=300)
    p.add_argument("--skip-a", action="store_true")
    p.add_argument("--skip-b", action="store_true")
    args = p.parse_args()
    if args.train_steps % args.export_every:
        p.error("--train-steps must be a multiple of --export-every (the final export is then a periodic one)")
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    res: dict[str, Any] = {}
    t0 = time.perf_counter()
    if not args.skip_a:
        res.update(delta_vs_full(work, args.rows, args.dim, args.touched, args.steps, args.deltas))
    if not args.skip_b:
        res.update(online(args, work))
    res["wall_s"] = round(time.perf_counter() - t0, 1)
    width = max(map(len, res))
    for k, v in res.items():
        print(f"{k.ljust(width)}  {v}")
    from benchkit import json_line  # the machine (CPU model, bf16) in the final line
    print(json_line(res))


if __name__ == "__main__":
    main()
