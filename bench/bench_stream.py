"""Online training's own costs (issue 14 item 1): a watched stream against an offline pass over
the same files, and the rolling window's add and report.

Workload: ``--files`` Parquet files of ``--rows`` Criteo-shaped synthetic rows each (13 dense,
26 sparse, vocabulary 50,000, each file its own seed), DLRM bottom 13-64-16, dim 16, top 64-1,
batch 2048, one thread. Variants, alternating over ``--reps`` rounds in this one process:
``offline`` (file order, ``shuffle_buffer: 0``), ``online`` (``train.mode: online`` with
``data.watch``, the files present from the start) and ``online+window`` (with
``eval.window_rows: 100000`` reported every 10 steps). Each figure is the median over rounds of
the median ``samples_per_s`` of the run's train records (the first record, and the watcher's
idle tail, left out). Then the window alone: ``add`` of a 4096-row batch into a 1,000,000-row
window, and one report (AUC sorts the window) over it.

    python bench/bench_stream.py            # last line: one JSON object
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from ember.config import from_dict
from ember.source.config import SyntheticOptions
from ember.source.writer import write_synthetic
from ember.train.loop import train
from ember.train.window import RollingWindow


def _cfg(root: Path, name: str, online: bool, window: int | None):  # type: ignore[no-untyped-def]
    data = {"preset": "synthetic", "format": "parquet", "train": str(root / "in"), "batch_size": 2048}
    t = {"out_dir": str(root), "run_name": name, "progress": False, "log_every": 10, "threads": 1}
    if online:
        t["mode"] = "online"
        data["watch"] = {"poll_s": 0.1, "idle_timeout_s": 0.2, "settle_s": 0}
    else:
        data["shuffle_buffer"] = 0
    raw = {"data": data, "embedding": {"dim": 16}, "model": {"type": "dlrm", "bottom_mlp": [64, 16], "top_mlp": [64]},
           "train": t}
    if window:
        raw["eval"] = {"window_rows": window, "window_every": 10}
    return from_dict(raw)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--files", type=int, default=8)
    ap.add_argument("--rows", type=int, default=25_000)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="bench_stream-"))
    try:
        (root / "in").mkdir()
        for k in range(args.files):
            write_synthetic(str(root / "in" / f"part-{k:03d}.parquet"), "parquet", args.rows,
                            SyntheticOptions(rows=args.rows, seed=k, vocab_size=50_000))
        variants = {"offline": (False, None), "online": (True, None), "online+window": (True, 100_000)}
        runs: dict[str, list[float]] = {k: [] for k in variants}
        for rep in range(args.reps):
            for name, (online, window) in variants.items():
                result = train(_cfg(root, f"{name}-{rep}", online, window))
                sps = [r["samples_per_s"] for r in result.history if r["kind"] == "train"][1:]
                runs[name].append(statistics.median(sps))
        med = {k: statistics.median(v) for k, v in runs.items()}
        w = RollingWindow(1_000_000, ["y"])
        rng = np.random.default_rng(0)
        p, y = rng.random((4096, 1)).astype(np.float32), (rng.random((4096, 1)) < 0.3).astype(np.float32)
        t0 = time.perf_counter()
        for _ in range(300):
            w.add(p, y)
        add_us = (time.perf_counter() - t0) / 300 * 1e6
        t0 = time.perf_counter()
        w.metrics()
        report_ms = (time.perf_counter() - t0) * 1e3
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(f"{'variant':<16}{'samples/s (median)':>20}")
    for k, v in med.items():
        print(f"{k:<16}{v:>20,.0f}")
    print(f"window add (4096 rows): {add_us:.0f} us; report over 1,000,000 rows: {report_ms:.0f} ms")
    from benchkit import json_line  # the machine (CPU model, bf16) in the final line
    print(json_line({"samples_per_s": {k: round(v) for k, v in med.items()},
                      "online_over_offline": round(med["online"] / med["offline"], 3),
                      "window_over_online": round(med["online+window"] / med["online"], 3),
                      "window_add_us": round(add_us), "window_report_ms_1m_rows": round(report_ms)}))


if __name__ == "__main__":
    main()
