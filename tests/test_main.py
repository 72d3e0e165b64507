"""``python -m ember`` is the command line (and ``python -m ember.cli`` still is)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import ember

ROOT = Path(ember.__file__).resolve().parents[1]


def _ember(*args: str, module: str = "ember") -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
    return subprocess.run([sys.executable, "-m", module, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


def test_python_m_ember_help():
    for module in ("ember", "ember.cli"):
        r = _ember("--help", module=module)
        assert r.returncode == 0, r.stderr
        assert "usage: ember" in r.stdout and "{train,eval,export,towers,serve,predict,profile,plan,generate}" in r.stdout


def test_python_m_ember_trains_the_demo_config(tmp_path):
    r = _ember("train", "--config", "configs/demo.yaml", "train.max_steps=2", "train.progress=false",
               f"train.out_dir={tmp_path}", "data.synthetic.rows=8192", "data.synthetic.eval_rows=2048")
    assert r.returncode == 0, r.stderr
    assert "steps: 2" in r.stdout and (tmp_path / "demo").is_dir()


def test_the_cli_says_how_tables_were_grouped(tmp_path):
    # one table of another dim: the collection splits into two groups and says why, once
    r = _ember("train", "--config", "configs/demo.yaml", "train.max_steps=1", "train.progress=false",
               f"train.out_dir={tmp_path}", "data.synthetic.rows=4096", "data.synthetic.eval_rows=1024",
               "tables=[{name: C1, dim: 8}]", "model={type: wdl}")
    assert r.returncode == 0, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if "table groups" in ln]
    assert len(lines) == 1 and "differs in dim, record width" in lines[0], r.stderr


def test_python_m_ember_reports_errors_cleanly(tmp_path):
    r = _ember("train", "--config", str(tmp_path / "missing.yaml"))
    assert r.returncode == 2 and "does not exist" in r.stderr and "Traceback" not in r.stderr


def test_make_demo_uses_python_m_ember():
    assert "\t$(PYTHON) -m ember train --config configs/demo.yaml --overwrite\n" in (ROOT / "Makefile").read_text()
