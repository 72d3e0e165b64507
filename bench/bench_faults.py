"""How fast the survivors of a distributed run stop when one rank dies or hangs.

Starts 2 bare ranks (gloo, CPU; rank 0 holds the rendezvous store) training a small synthetic
config, waits for their first checkpoint, then hits rank 1: ``kill`` (SIGKILL: its process is
gone, rank 0's watchdog sees it at its next beat) or ``hang`` (SIGSTOP: rank 0 blocks in its
next collective; its watchdog sees no heartbeat for ``distributed.heartbeat_timeout_s`` and
ends the process after a grace of 3 s). Reports the seconds from the signal to rank 0's exit,
and first what the per-step stop agreement costs (an all-reduce of two int64 between 2 gloo
processes); ends with a JSON object.

    python bench/bench_faults.py [--repeats 2] [--heartbeat-timeout-s 5]
"""

from __future__ import annotations

import argparse
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ember.testing.distributed import ember_start, finish, free_port  # noqa: E402

CONFIG = {
    "data": {"preset": "synthetic", "batch_size": 24,
             "synthetic": {"num_dense": 3, "num_sparse": 3, "rows": 96000, "eval_rows": 48, "vocab_size": 40}},
    "embedding": {"dim": 4},
    "model": {"type": "deepfm", "deep_mlp": [8]},
    "train": {"epochs": 1, "log_every": 50, "progress": False, "threads": 1},
    "checkpoint": {"every": 4},
    "pipeline": {"enabled": False},
}


def one(root: Path, how: str, heartbeat_s: float, n: int) -> float:
    """Seconds from hitting rank 1 to rank 0's exit (which must name rank 1)."""
    path = root / "cfg.yaml"
    path.write_text(yaml.safe_dump({**CONFIG, "train": {**CONFIG["train"], "out_dir": str(root / "runs")}}))
    port = free_port()
    ranks = [ember_start(path, r, 2, port, [f"train.run_name={how}{n}", f"distributed.heartbeat_timeout_s={heartbeat_s}"])
             for r in (0, 1)]
    latest = root / "runs" / f"{how}{n}" / "checkpoints" / "LATEST"
    while not latest.exists():
        if ranks[0].poll() is not None:
            raise SystemExit(finish(ranks[0], 5).stderr[-3000:])
        time.sleep(0.02)
    ranks[1].send_signal(signal.SIGKILL if how == "kill" else signal.SIGSTOP)
    t0 = time.monotonic()
    done = finish(ranks[0], 120)
    elapsed = time.monotonic() - t0
    ranks[1].kill()
    finish(ranks[1], 30)
    if done.returncode != 1 or "rank 1 (" not in done.stderr:
        raise SystemExit(f"rank 0 exited {done.returncode} without naming rank 1:\n{done.stderr[-3000:]}")
    line = next(x for x in done.stderr.splitlines() if "rank 1 (" in x)
    print(f"{how}: rank 0 stopped {elapsed:.1f} s after the signal: {line[:160]}", flush=True)
    return elapsed


def _agree_worker(rank: int, port: int, calls: int, out: "Any") -> None:
    import datetime

    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2,
                            timeout=datetime.timedelta(seconds=60))
    t = torch.zeros(2, dtype=torch.int64)
    for _ in range(50):
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
    t0 = time.perf_counter()
    for _ in range(calls):
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
    if rank == 0:
        out.put((time.perf_counter() - t0) / calls)
    dist.destroy_process_group()


def agree_cost(calls: int = 2000) -> float:
    """Seconds per call of the per-step agreement (an all-reduce of two int64, gloo, 2 ranks)."""
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_agree_worker, args=(r, port, calls, out)) for r in (0, 1)]
    for p in procs:
        p.start()
    result = float(out.get(timeout=120))
    for p in procs:
        p.join()
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--heartbeat-timeout-s", type=float, default=5.0)
    args = ap.parse_args()
    out: dict[str, object] = {"heartbeat_timeout_s": args.heartbeat_timeout_s}
    out["agree_us"] = round(agree_cost() * 1e6, 1)
    print(f"the per-step stop agreement (all-reduce of 2 int64, gloo, 2 ranks): {out['agree_us']} us per call", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        for how in ("kill", "hang"):
            out[f"{how}_s"] = [round(one(Path(tmp), how, args.heartbeat_timeout_s, n), 2) for n in range(args.repeats)]
    from benchkit import json_line  # the machine (CPU model, bf16) in the final line
    print(json_line(out))


if __name__ == "__main__":
    main()
