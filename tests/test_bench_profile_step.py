"""Smoke test of bench/gpu/profile_step.py (storage.index: device's full step against a dense-only
step, the profiler's tables, the pipelined trainer's stages, both steps compiled) with tiny arguments on the CPU, so
that the GPU session's script cannot rot: its final JSON line holds a positive paired ratio, both
times, the step's parts and the trainer's figures."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO


@pytest.mark.slow
def test_profile_step_smoke(tmp_path: Path) -> None:
    cmd = [sys.executable, str(REPO / "bench" / "gpu" / "profile_step.py"), "--steps", "2", "--warmup", "1",
           "--profile", "1", "--batch", "64", "--trainer", "2", "--compile", "reduce-overhead"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    record = json.loads(out.stdout.strip().splitlines()[-1])
    assert record["device_index_vs_dense"] > 0
    assert set(record["ms_per_step"]) == {"ember-device-index", "dense-only", "ember-device-index-compiled", "dense-only-compiled"}
    assert record["compile_mode"] == "reduce-overhead" and record["compiled_vs_eager"] > 0 and record["dense_compiled_vs_eager"] > 0
    assert set(record["parts_ms"]) == {"embedding forward", "dense forward+backward", "dense optimizer", "sparse step"}
    assert record["cuda_ms_per_step"] is None and record["batch"] == 64
    assert record["trainer_ms_per_step"] > 0 and record["trainer_pipeline"]["stage.compute.busy"] > 0
