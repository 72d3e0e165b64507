"""export_model takes plain parts: any model, duck-typed table collections, the run config as JSON."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pyarrow as pa
import pytest
import torch
from torch import Tensor, nn

from ember.batch import Batch, SparseFeatures
from ember.checkpoint.export import export_model
from ember.embedding.config import FeatureConfig
from ember.embedding.init import InitializerConfig, init_rows
from ember.errors import CheckpointError
from ember.featurize.schema import Schema
from ember.serving import Predictor
from ember.source.config import DataConfig


class _SumModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.tensor(0.5))

    def forward(self, dense: Tensor, pooled: list[Tensor], linear: list[Tensor] | None = None) -> Tensor:
        return self.scale * torch.stack([p.sum(1) for p in pooled], 1).sum(1, keepdim=True)


class _Table:
    """What export reads of a table: items() chunks of (ids, records), dim, config."""

    def __init__(self, ids: list[int], dim: int, seed: int, effective_seed: int | None = None) -> None:
        self.dim = dim
        self.config = SimpleNamespace(seed=seed, initializer=InitializerConfig(), min_count=1)
        self._ids = torch.tensor(ids, dtype=torch.int64)
        self._records = torch.arange(len(ids) * (dim + 1), dtype=torch.float32).reshape(len(ids), dim + 1)  # + state
        self.seed = seed if effective_seed is None else effective_seed

    def items(self):
        yield self._ids, self._records


def _run_config() -> dict:
    schema = Schema(labels=["y"], sparse=[{"name": "a"}, {"name": "b"}])
    return {"data": DataConfig(preset="synthetic").model_dump(mode="json"), "schema": schema.model_dump(mode="json"),
            "model": {"type": "custom"}, "train": {"epochs": 1}}


def test_export_writes_tables_manifest_and_scores(tmp_path):
    tables = {"a": _Table([7, 3], dim=2, seed=1), "b": _Table([5], dim=2, seed=2, effective_seed=99)}
    collection = SimpleNamespace(tables=tables)
    features = [FeatureConfig(name="a"), FeatureConfig(name="b")]
    model = _SumModel()
    out = export_model(model, [collection], features, None, ["y"], _run_config(), tmp_path / "exp")

    manifest = json.loads((out / "manifest.json").read_text())
    assert [(t["name"], t["rows"], t["seed"]) for t in manifest["tables"]] == [("a", 2, 1), ("b", 1, 99)]
    assert manifest["tasks"] == ["y"] and manifest["model"] == {"type": "custom"} and manifest["linear_features"] is None
    assert manifest["features"] == [f.model_dump(mode="json") for f in features]
    assert np.fromfile(out / "tables" / "a.ids", dtype="<i8").tolist() == [3, 7]  # sorted, optimizer state dropped
    assert np.fromfile(out / "tables" / "a.weights", dtype="<f4").reshape(2, 2).tolist() == [[3, 4], [0, 1]]
    assert model.training  # put back as it was

    # a model of no built-in type has only its TorchScript, a program: served only when trusted explicitly
    with pytest.raises(CheckpointError, match=r"type 'custom', not one of ember's.*--trust-torchscript"):
        Predictor.load(out)
    # the Predictor serves it: known IDs read their weights, unseen ones their initial row (seeded per table)
    p = Predictor.load(out, trust_torchscript=True)
    sparse = SparseFeatures(["a", "b"], torch.tensor([3, 42, 5, 5]), torch.tensor([1, 1, 1, 1]))
    batch = Batch(dense=torch.zeros(2, 0), sparse=sparse, labels=torch.zeros(2, 1))
    unseen = init_rows(torch.tensor([42]), 2, InitializerConfig(), 1)[0]
    want = 0.5 * torch.tensor([3 + 4 + 0 + 1, float(unseen.sum()) + 0 + 1])
    np.testing.assert_allclose(p.predict_batch(batch)[:, 0], torch.sigmoid(want).numpy(), rtol=1e-6)


def test_export_needs_the_run_config_sections(tmp_path):
    with pytest.raises(ValueError, match="run_config lacks \\['schema'\\]"):
        export_model(_SumModel(), [], [], None, ["y"], {"data": {}, "model": {}}, tmp_path / "exp")
    assert not (tmp_path / "exp").exists()


def _csv_sum_export(out):
    """A custom model's export (only its TorchScript gives the model) of tables a (ID 7) and b
    (ID 5), whose data is CSV."""
    run_config = {**_run_config(), "data": DataConfig(format="csv", eval="unused.csv").model_dump(mode="json")}
    tables = {"a": _Table([7], dim=2, seed=1), "b": _Table([5], dim=2, seed=2)}
    return export_model(_SumModel(), [SimpleNamespace(tables=tables)], [FeatureConfig(name="a"), FeatureConfig(name="b")],
                        None, ["y"], run_config, out)


def test_predictor_reads_an_empty_field_as_the_export_recorded_it(tmp_path):
    from ember.featurize.hashing import hash_array

    out = _csv_sum_export(tmp_path / "exp")
    rows = tmp_path / "rows.csv"
    rows.write_text("a,b\n,x\n")
    empty_id, x_id = hash_array(pa.array([""]), "a")[0], hash_array(pa.array(["x"]), "b")[0]
    b_row = float(init_rows(torch.from_numpy(x_id), 2, InitializerConfig(), 2).sum())
    a_row = float(init_rows(torch.from_numpy(empty_id), 2, InitializerConfig(), 1).sum())
    # now: "" is a category (the schema's missing_values is [] by default): an unseen ID, its initial row
    got = Predictor.load(out, trust_torchscript=True).predict_files([str(rows)])[:, 0]  # a custom model
    np.testing.assert_allclose(got, torch.sigmoid(torch.tensor([0.5 * (a_row + b_row)])).numpy(), rtol=1e-6)
    # an export written before missing_values existed took "" as missing: it still does
    manifest = json.loads((out / "manifest.json").read_text())
    del manifest["schema"]["missing_values"]
    (out / "manifest.json").write_text(json.dumps(manifest))
    got = Predictor.load(out, trust_torchscript=True).predict_files([str(rows)])[:, 0]  # a custom model
    np.testing.assert_allclose(got, torch.sigmoid(torch.tensor([0.5 * b_row])).numpy(), rtol=1e-6)


def test_trust_torchscript_is_a_flag_of_the_commands_that_load_exports(tmp_path, monkeypatch):
    """``--trust-torchscript`` (never an environment variable) reaches the Predictor of ``ember
    predict`` and every export ``ember serve`` loads; without it nothing is trusted."""
    from ember.cli import main
    from ember.serving import predictor as predictor_mod
    from ember.serving.server import open_source

    out = _csv_sum_export(tmp_path / "exp")
    rows = tmp_path / "rows.csv"
    rows.write_text("a,b\n7,5\n")
    assert main(["predict", "--export", str(out), "--input", str(rows), "--output", str(tmp_path / "p.csv")]) == 2
    assert main(["predict", "--export", str(out), "--input", str(rows), "--output", str(tmp_path / "p.csv"),
                 "--trust-torchscript"]) == 0
    assert (tmp_path / "p.csv").read_text().splitlines()[0] == "p_y"
    with pytest.raises(CheckpointError, match="--trust-torchscript"):
        open_source(out)
    assert open_source(out, trust_torchscript=True).trust_torchscript
    seen = []

    def load(cls, path, verify=True, trust_torchscript=False):  # what ember serve asks for, then stop it there
        seen.append(trust_torchscript)
        raise CheckpointError("stopped here")

    monkeypatch.setattr(predictor_mod.Predictor, "load", classmethod(load))
    pytest.importorskip("fastapi")  # ember serve's own dependency (the serve extra)
    assert main(["serve", "--export", str(out), "--port", "0", "--trust-torchscript"]) == 2
    assert seen == [True]
