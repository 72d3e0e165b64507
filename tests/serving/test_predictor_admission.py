"""Serving scores exactly as eval: IDs a ``min_count`` table held back read its all-zero row."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from ember.checkpoint.export import export_model
from ember.config import from_dict
from ember.errors import CheckpointError
from ember.pipeline.loader import make_batches
from ember.serving import Predictor
from ember.train.evaluate import predict_batches
from ember.train.loop import train


def _export(tmp_path, min_count: int):
    cfg = from_dict({
        "data": {"preset": "synthetic", "batch_size": 256,
                 "synthetic": {"rows": 3072, "eval_rows": 1024, "vocab_size": 3000, "num_dense": 3, "num_sparse": 4}},
        "tables": [{"name": f"C{i}", "dim": 4, "min_count": min_count} for i in range(1, 5)],
        "model": {"type": "dlrm", "bottom_mlp": [8, 4], "top_mlp": [8]},
        "train": {"dense_optimizer": {"type": "adam", "lr": 0.01}, "out_dir": str(tmp_path), "run_name": "mc",
                  "progress": False, "max_steps": 12},
    })
    parts = train(cfg).parts
    lin = parts.linear.features if parts.linear is not None else None
    out = export_model(parts.model, parts.collections(), parts.embeddings.features, lin, parts.task_names,
                       cfg.model_dump(mode="json", by_alias=True), tmp_path / "export")
    return cfg, parts, out


def test_predictor_scores_equal_eval_with_min_count(tmp_path):
    cfg, parts, out = _export(tmp_path, min_count=3)
    manifest = json.loads((out / "manifest.json").read_text())
    assert [t["min_count"] for t in manifest["tables"]] == [3, 3, 3, 3]

    probs_eval, _ = predict_batches(parts, make_batches(cfg.data, cfg.schema, "eval"))
    pred = Predictor.load(out)
    np.testing.assert_allclose(pred.predict_batches(make_batches(cfg.data, cfg.schema, "eval")), probs_eval,
                               rtol=1e-5, atol=1e-6)

    # the check has teeth: eval meets IDs held back (sighted in training, fewer than 3 times) ...
    table = parts.collections()[0].tables["C1"]
    held_back = table.admission_state()[0]
    eval_ids = torch.cat([b.sparse["C1"].values for b in make_batches(cfg.data, cfg.schema, "eval")])
    assert held_back.numel() > 0 and bool(torch.isin(eval_ids, held_back).any())
    # ... and serving them fresh initial rows (what exports without min_count did) scores differently
    for t in pred.tables.values():
        t.min_count = 1
    fresh = pred.predict_batches(make_batches(cfg.data, cfg.schema, "eval"))
    assert np.abs(fresh - probs_eval).max() > 1e-3


def test_predictor_refuses_an_unknown_export_version(tmp_path):
    _, _, out = _export(tmp_path, min_count=1)
    manifest = json.loads((out / "manifest.json").read_text())
    assert [t["min_count"] for t in manifest["tables"]] == [1, 1, 1, 1]
    (out / "manifest.json").write_text(json.dumps({**manifest, "format_version": 99}))
    with pytest.raises(CheckpointError, match="format_version 99 .*export it again"):
        Predictor.load(out, verify=False)
