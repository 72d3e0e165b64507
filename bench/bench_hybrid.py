"""Persia's claim on two "nodes" joined by a slow link: hybrid training (dense part synchronous,
embeddings up to k batches stale) hides the embedding exchange behind the dense step.

The bench makes its own two network namespaces joined by a veth pair, each end shaped with tc's
``tbf`` qdisc (``--rate``, default 100 Mbit/s each way), runs one torchrun "node" in each (one rank
per node, gloo over the veth), and trains the same DLRM on the same synthetic data with
``pipeline.embedding_staleness`` 0 and ``--staleness`` (default 2). Reported: samples/s (median of
the train records after warm-up) and eval AUC of both.

Last line, one JSON object: hybrid_speedup (samples/s at k over k = 0; target >= 1.3),
hybrid_auc_delta (AUC at k minus AUC at 0; target |.| <= 0.002), the rates and AUCs, the link.
Without the rights to create namespaces (``ip netns add`` fails) it says so and skips (exit 0,
``"skipped"`` in the JSON line).

Usage: python bench/bench_hybrid.py [--rate 100mbit] [--steps 300] [--staleness 2] [--batch 4096] [--eval-rows 100000]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ADDR = ("10.77.0.1", "10.77.0.2")


def sh(*cmd: str) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True)


class Link:
    """Two network namespaces joined by a veth pair, each end limited to ``rate`` by tbf."""

    def __init__(self, rate: str) -> None:
        tag = f"{os.getpid() % 100000}"
        self.ns = (f"emb-a{tag}", f"emb-b{tag}")
        self.dev = (f"ea{tag}", f"eb{tag}")
        self.rate = rate

    def __enter__(self) -> "Link":
        a, b = self.ns
        da, db = self.dev
        steps = [("ip", "netns", "add", a), ("ip", "netns", "add", b),
                 ("ip", "link", "add", da, "type", "veth", "peer", "name", db),
                 ("ip", "link", "set", da, "netns", a), ("ip", "link", "set", db, "netns", b)]
        for ns, dev, addr in ((a, da, ADDR[0]), (b, db, ADDR[1])):
            steps += [("ip", "netns", "exec", ns, "ip", "addr", "add", f"{addr}/24", "dev", dev),
                      ("ip", "netns", "exec", ns, "ip", "link", "set", dev, "up"),
                      ("ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up"),
                      ("ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", dev, "root", "tbf", "rate", self.rate,
                       "burst", "64kb", "latency", "100ms")]
        for cmd in steps:
            r = sh(*cmd)
            if r.returncode:
                self.__exit__()
                raise PermissionError(f"{' '.join(cmd)}: {r.stderr.strip()}")
        return self

    def __exit__(self, *exc: object) -> None:
        for ns in self.ns:
            sh("ip", "netns", "del", ns)


def config(out: Path, batch: int, steps: int, eval_rows: int = 100_000) -> dict:
    return {
        "data": {"preset": "synthetic", "batch_size": batch,
                 "synthetic": {"rows": batch * steps, "eval_rows": eval_rows, "vocab_size": 200_000, "zipf": 1.1}},
        "embedding": {"dim": 32, "optimizer": {"type": "rowwise_adagrad", "lr": 0.05}},
        "model": {"type": "dlrm", "bottom_mlp": [64, 32], "top_mlp": [256, 128]},
        "train": {"epochs": 1, "dense_optimizer": {"type": "adam", "lr": 0.001}, "log_every": 10,
                  "out_dir": str(out), "progress": False, "threads": 1},
        "distributed": {"timeout_s": 600},
    }


def run(link: Link, cfg_path: Path, out: Path, k: int, timeout: float) -> dict:
    """Train on the two nodes with staleness ``k``; samples/s and eval AUC from the run's records."""
    port = 29000 + os.getpid() % 1000 + k
    procs = []
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    logs = []
    for node in range(2):
        cmd = ["ip", "netns", "exec", link.ns[node], sys.executable, "-m", "torch.distributed.run", "--nnodes=2",
               f"--node-rank={node}", f"--master-addr={ADDR[0]}", f"--master-port={port}", "--nproc-per-node=1",
               "-m", "ember", "train", "--config", str(cfg_path), "--overwrite",
               f"pipeline.embedding_staleness={k}", f"train.run_name=k{k}"]
        log = open(out / f"k{k}-node{node}.log", "w")
        logs.append(log)
        procs.append(subprocess.Popen(cmd, env={**env, "GLOO_SOCKET_IFNAME": link.dev[node]}, stdout=log,
                                      stderr=subprocess.STDOUT, cwd=REPO))
    deadline = time.monotonic() + timeout
    try:
        for p in procs:
            p.wait(timeout=max(deadline - time.monotonic(), 1))
    except subprocess.TimeoutExpired:
        for p in procs:
            p.kill()
        raise RuntimeError(f"staleness {k}: the nodes did not finish in {timeout} s (logs in {out})") from None
    finally:
        for log in logs:
            log.close()
    if any(p.returncode for p in procs):
        tail = (out / f"k{k}-node0.log").read_text()[-3000:]
        raise RuntimeError(f"staleness {k}: exit codes {[p.returncode for p in procs]}\n{tail}")
    records = [json.loads(line) for line in (out / f"k{k}" / "metrics.jsonl").read_text().splitlines() if line]
    speeds = [r["samples_per_s"] for r in records if r.get("kind") == "train"][2:]  # after warm-up
    summary = json.loads((out / f"k{k}" / "summary.json").read_text())
    auc = next(v for key, v in summary.items() if key.startswith("auc"))
    return {"samples_per_s": statistics.median(speeds), "auc": auc,
            "bytes_per_step": next((r["dist.sent_per_step"] for r in reversed(records) if "dist.sent_per_step" in r), None)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rate", default="100mbit", help="tbf rate of each end of the link")
    p.add_argument("--steps", type=int, default=300, help="training steps per run (300: ~11 min for both runs on 2 vCPUs)")
    p.add_argument("--batch", type=int, default=4096)
    p.add_argument("--staleness", type=int, default=2)
    p.add_argument("--eval-rows", type=int, default=100_000, help="synthetic eval rows (AUC's noise ~ 1/sqrt of it)")
    p.add_argument("--timeout", type=float, default=900)
    args = p.parse_args()
    out = Path(tempfile.mkdtemp(prefix="ember-hybrid-"))
    try:
        with Link(args.rate) as link:
            cfg = out / "hybrid.json"
            cfg.write_text(json.dumps(config(out, args.batch, args.steps, args.eval_rows)))
            base = run(link, cfg, out, 0, args.timeout)
            stale = run(link, cfg, out, args.staleness, args.timeout)
    except PermissionError as e:
        print(f"bench_hybrid: cannot create network namespaces here ({e}); skipped")
        from benchkit import json_line  # the machine (CPU model, bf16) in the final line
        print(json_line({"skipped": str(e)}))
        return
    finally:
        shutil.rmtree(out, ignore_errors=True)
    speedup = stale["samples_per_s"] / base["samples_per_s"]
    delta = stale["auc"] - base["auc"]
    print(f"link: 2 namespaces, veth, tbf {args.rate} each way; batch {args.batch}, {args.steps} steps, 1 rank per node")
    print(f"  staleness 0: {base['samples_per_s']:9.0f} samples/s  AUC {base['auc']:.4f}")
    print(f"  staleness {args.staleness}: {stale['samples_per_s']:9.0f} samples/s  AUC {stale['auc']:.4f}")
    print(f"  bytes sent per step and rank: {base['bytes_per_step'] or 0:,.0f} (k = 0)")
    print(f"  speedup {speedup:.2f}x (target >= 1.3), AUC delta {delta:+.4f} (target within 0.002)")
    from benchkit import json_line  # the machine (CPU model, bf16) in the final line
    print(json_line({"hybrid_speedup": round(speedup, 3), "hybrid_auc_delta": round(delta, 5),
                      "samples_per_s_k0": round(base["samples_per_s"]), f"samples_per_s_k{args.staleness}":
                      round(stale["samples_per_s"]), "auc_k0": base["auc"], f"auc_k{args.staleness}": stale["auc"],
                      "rate": args.rate, "batch": args.batch, "steps": args.steps}))


if __name__ == "__main__":
    main()
