"""``ember export --format onnx``: what it writes, what it refuses (exit 2, a message saying what
to do, nothing written), the output-path rules every export keeps, and the runtime scoring with
neither torch nor ember's training code importable."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from torch import Tensor, nn

pytest.importorskip("onnx", reason="onnx is not installed: pip install 'ember[portable]' (make test installs it)")
pytest.importorskip("onnxruntime", reason="onnxruntime is not installed: pip install 'ember[portable]' (make test installs it)")

from ember.checkpoint.export import export_model  # noqa: E402
from ember.cli import main  # noqa: E402
from ember.embedding.config import FeatureConfig  # noqa: E402
from ember.embedding.init import InitializerConfig  # noqa: E402
from ember.errors import ConfigError  # noqa: E402
from ember.featurize.schema import Schema  # noqa: E402
from ember.serving import Predictor  # noqa: E402
from ember.source.config import DataConfig  # noqa: E402
from ember.testing.portable import ZOO, probe_records, train_and_export  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    """A trained DLRM run and its ONNX export (work/exports/dlrm)."""
    work = tmp_path_factory.mktemp("cli")
    train_and_export(work, "dlrm", ZOO["dlrm"], steps=3)
    return work


def _export(run: Path, out: Path, *flags: str) -> int:
    return main(["export", "--checkpoint", str(run / "runs" / "dlrm"), "--out", str(out), *flags])


def test_default_format_is_embers_own(run, tmp_path):
    assert _export(run, tmp_path / "plain") == 0
    assert not (tmp_path / "plain" / "model.onnx").exists()
    assert "onnx" not in json.loads((tmp_path / "plain" / "manifest.json").read_text())


def test_output_path_rules(run, tmp_path, capsys):
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    assert _export(run, other, "--format", "onnx") == 2
    assert "ember did not write" in capsys.readouterr().err
    assert [p.name for p in other.iterdir()] == ["notes.txt"]  # never deleted, with or without --overwrite
    assert _export(run, other, "--format", "onnx", "--overwrite") == 2
    assert (other / "notes.txt").read_text() == "mine"

    out = tmp_path / "exp"
    assert _export(run, out) == 0  # an earlier (ember format) export: replaced only with --overwrite
    assert _export(run, out, "--format", "onnx") == 2
    assert "--overwrite" in capsys.readouterr().err
    assert _export(run, out, "--format", "onnx", "--overwrite") == 0
    assert (out / "model.onnx").exists()

    assert _export(run, run / "runs" / "dlrm" / "x", "--format", "onnx") == 2  # inside what it reads
    assert not (run / "runs" / "dlrm" / "x").exists()


def test_missing_onnx_package_is_refused_before_work(run, tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "onnx", None)  # import onnx now raises ImportError
    assert _export(run, tmp_path / "exp", "--format", "onnx") == 2
    err = capsys.readouterr().err
    assert "needs the onnx package" in err and "pip install 'ember[portable]'" in err and "--format ember" in err
    assert not (tmp_path / "exp").exists()


def test_unknown_format_is_a_usage_error(run, tmp_path, capsys):
    assert _export(run, tmp_path / "exp", "--format", "tflite") == 2
    assert "invalid choice" in capsys.readouterr().err


class _Branchy(nn.Module):
    """A model ONNX cannot express faithfully: Python control flow on the data (tracing keeps the
    branch the probe took)."""

    def forward(self, dense: Tensor, pooled: list[Tensor], linear: list[Tensor] | None = None) -> Tensor:
        s = pooled[0].sum(1, keepdim=True)
        return s if bool(s.sum() > 0) else -s * 3


class _Table:
    def __init__(self) -> None:
        self.dim, self.seed = 2, 1
        self.config = SimpleNamespace(initializer=InitializerConfig(), min_count=1)

    def items(self):
        yield torch.tensor([3, 7]), torch.ones(2, 3)


def _parts():
    schema = Schema(labels=["y"], sparse=[{"name": "a"}])
    cfg = {"data": DataConfig(format="csv", eval="x.csv").model_dump(mode="json"),
           "schema": schema.model_dump(mode="json"), "model": {"type": "custom"}}
    return SimpleNamespace(tables={"a": _Table()}), cfg


def test_a_graph_that_differs_from_the_model_is_refused_and_the_old_export_kept(tmp_path):
    collection, cfg = _parts()
    out = export_model(_Branchy(), [collection], [FeatureConfig(name="a")], None, ["y"], cfg, tmp_path / "exp")
    before = sorted(p.name for p in out.iterdir())
    with pytest.raises(ConfigError, match="does not compute what the model does.*--format ember"):
        export_model(_Branchy(), [collection], [FeatureConfig(name="a")], None, ["y"], cfg, out, onnx=True)
    assert sorted(p.name for p in out.iterdir()) == before and not (out / "model.onnx").exists()
    assert not [p for p in tmp_path.iterdir() if p.name != "exp"]  # no temporary directory left


def test_sequence_features_are_refused_before_anything_is_written(tmp_path):
    collection, cfg = _parts()
    with pytest.raises(ConfigError, match="pooled as 'sequence'"):
        export_model(_Branchy(), [collection], [FeatureConfig(name="a", pooling="sequence", max_length=3)], None,
                     ["y"], cfg, tmp_path / "exp", onnx=True)
    assert not (tmp_path / "exp").exists()


_NO_TORCH = r"""
import importlib.abc, json, sys

class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("torch", "pyarrow", "pydantic") or (name.startswith("ember.") and not name.startswith("ember.portable")):
            raise ImportError(f"{name} is blocked: the portable runtime must not need it")
        return None

sys.meta_path.insert(0, Block())
from ember.portable import PortableModel
model = PortableModel.load(sys.argv[1])
csv = model.predict_csv(sys.argv[2])
rows = model.predict_records(json.loads(sys.argv[3]))
heavy = sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "pyarrow", "pydantic")
               or (m.startswith("ember") and m != "ember" and not m.startswith("ember.portable")))
print(json.dumps({"csv": csv.tolist(), "rows": rows.tolist(), "heavy": heavy}))
"""


def test_runtime_scores_without_torch_or_embers_training_code(run):
    export, csv = run / "exports" / "dlrm", run / "data" / "eval.csv"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])}
    proc = subprocess.run([sys.executable, "-c", _NO_TORCH, str(export), str(csv), json.dumps(probe_records())],
                          capture_output=True, text=True, timeout=120, env=env, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["heavy"] == []
    predictor = Predictor.load(export)
    np.testing.assert_allclose(got["csv"], predictor.predict_files([str(csv)]), rtol=0, atol=1e-6)
    np.testing.assert_allclose(got["rows"], predictor.predict_records(probe_records()), rtol=0, atol=1e-6)


def test_runtime_refuses_an_export_without_a_graph(run, tmp_path):
    from ember.portable import PortableModel

    assert _export(run, tmp_path / "plain") == 0
    with pytest.raises(ValueError, match="no ONNX graph.*--format onnx"):
        PortableModel.load(tmp_path / "plain")
