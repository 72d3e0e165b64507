"""The README's "your own data in five minutes" runs as written: every shell block of that
section, in a fresh directory, with ``ember`` on the PATH; ``ember serve`` gets ``--port 0`` (a
free port) in a subprocess and the ``curl`` line becomes one POST to it."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.doc_blocks import REPO, blocks

pytestmark = pytest.mark.slow


def walkthrough() -> list[str]:
    """The shell blocks of the README section, in order."""
    text = (REPO / "README.md").read_text()
    start = text.index("## Your own data in five minutes")
    end = text.index("\n## ", start + 1)
    section = [b for b in blocks(REPO / "README.md") if b.lang == "sh"]
    lines_before = text.count("\n", 0, start) + 1, text.count("\n", 0, end) + 1
    return [b.code for b in section if lines_before[0] < b.line < lines_before[1] and b.not_run is None]


def _env(tmp: Path) -> dict[str, str]:
    bin_dir = tmp / "bin"
    bin_dir.mkdir()
    shim = bin_dir / "ember"
    shim.write_text(f"#!/bin/sh\nexec {shlex.quote(sys.executable)} -m ember \"$@\"\n")
    shim.chmod(0o755)
    return {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "PYTHONPATH": str(REPO),
            "EMBER_MALLOC": "default"}


def _serve_and_post(block: str, cwd: Path, env: dict[str, str]) -> dict:
    serve = next(line for line in block.splitlines() if line.startswith("ember serve"))
    curl = next(line for line in block.splitlines() if line.startswith("curl"))
    argv = shlex.split(serve.rstrip("&").strip())
    argv[argv.index("--port") + 1] = "0"
    proc = subprocess.Popen([sys.executable, "-m", "ember", *argv[1:]], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 120
        port = None
        while port is None and time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line and proc.poll() is not None:
                break
            m = re.search(r"http://[^:]+:(\d+)", line)
            port = int(m.group(1)) if m else None
        assert port, f"ember serve did not announce a port (exit {proc.poll()})"
        words = shlex.split(curl)
        path = re.sub(r"^[^/]*", "", words[2])
        body = words[words.index("-d") + 1].encode()
        req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=body, method="POST")
        with urllib.request.urlopen(req, timeout=60) as r:
            return json.loads(r.read())
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()


def test_the_readme_walkthrough_runs(tmp_path: Path) -> None:
    shell_blocks = walkthrough()
    assert len(shell_blocks) == 4 and "ember serve" in shell_blocks[-1]
    env = _env(tmp_path)
    work = tmp_path / "work"
    work.mkdir()
    for block in shell_blocks[:-1]:
        run = subprocess.run(["bash", "-euo", "pipefail", "-c", block], cwd=work, env=env, capture_output=True,
                             text=True, timeout=600)
        assert run.returncode == 0, f"{block}\n--- exit {run.returncode}\n{run.stdout}\n{run.stderr}"
    scores = (work / "scores.csv").read_text().splitlines()
    assert scores[0] == "p_label" and len(scores) == 5001
    assert all(0.0 < float(p) < 1.0 for p in scores[1:])
    answer = _serve_and_post(shell_blocks[-1], work, env)
    assert answer["tasks"] == ["label"] and len(answer["scores"]) == 1 and 0.0 < answer["scores"][0][0] < 1.0
