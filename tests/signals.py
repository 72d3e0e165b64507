"""``ember train`` in a child process, signalled once it has logged: the signal tests' one way to run it."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any


def train_until_signal(cfg: dict[str, Any], tmp_path: Path, sig: int, records: int = 1,
                       timeout_s: float = 120) -> tuple[int, str, str]:
    """Run ``ember train`` on ``cfg`` (its ``train.run_name`` under ``tmp_path``), send ``sig``
    once its metrics file holds ``records`` lines; returns (exit code, stdout, stderr)."""
    path = tmp_path / "c.json"
    path.write_text(json.dumps(cfg))
    proc = subprocess.Popen([sys.executable, "-m", "ember", "train", "--config", str(path)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    metrics = tmp_path / cfg["train"]["run_name"] / "metrics.jsonl"
    deadline = time.time() + timeout_s
    while time.time() < deadline and not (metrics.exists() and len(metrics.read_text().splitlines()) >= records):
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.2)
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=60)
    return proc.returncode, out, err
