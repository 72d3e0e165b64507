"""How fast the survivors of a distributed run stop when one rank dies or hangs.

Starts 2 bare ranks (gloo, CPU; rank 0 holds the rendezvous store) training a small synthetic
config, waits for their first checkpoint, then hits rank 1: ``kill`` (SIGKILL: its process is
gone, rank 0's watchdog sees it at its next beat) or ``hang`` (SIGSTOP: rank 0 blocks in its
next collective; its watchdog sees no heartbeat for ``distributed.heartbeat_timeout_s`` and
ends the process after a grace of 3 s). Reports the seconds from the signal to rank 0's exit,
and ends with a JSON object.

    python bench/bench_faults.py [--repeats 2] [--heartbeat-timeout-s 5]
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import tempfile
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ember.testing.distributed import ember_start, finish, free_port  # noqa: E402

CONFIG = {
    "data": {"preset": "synthetic", "batch_size": 24,
             "synthetic": {"num_dense": 3, "num_sparse": 3, "rows": 96000, "eval_rows": 48, "vocab_size": 40}},
    "embedding": {"dim": 4},
    "model": {"type": "deepfm", "deep_mlp": [8]},
    "train": {"epochs": 1, "log_every": 50, "progress": False, "threads": 1, "checkpoint_every": 4},
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--heartbeat-timeout-s", type=float, default=5.0)
    args = ap.parse_args()
    out: dict[str, object] = {"heartbeat_timeout_s": args.heartbeat_timeout_s}
    with tempfile.TemporaryDirectory() as tmp:
        for how in ("kill", "hang"):
            out[f"{how}_s"] = [round(one(Path(tmp), how, args.heartbeat_timeout_s, n), 2) for n in range(args.repeats)]
    print(json.dumps(out))


if __name__ == "__main__":
    main()
