"""Smoke test of bench/bench_interaction.py (the interaction's own backward vs autograd's in the
DLRM dense step) with tiny arguments, so that the script cannot rot: its final JSON line holds a
positive paired ratio and times for both shapes. The speeds themselves are not checked."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO


@pytest.mark.slow
def test_bench_interaction_smoke(tmp_path: Path) -> None:
    cmd = [sys.executable, str(REPO / "bench" / "bench_interaction.py"), "--steps", "2", "--mlperf-steps", "1",
           "--batch", "64", "--mlperf-batch", "32"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    record = json.loads(out.stdout.strip().splitlines()[-1])
    for shape in ("dlrm26", "mlperf"):
        assert record[f"{shape}_own_vs_autograd"] > 0
        assert set(record["ms_per_step"][shape]) == {"own", "autograd"}
    assert record["batch"] == {"dlrm26": 64, "mlperf": 32}
    assert record["machine"]["cpu"]
