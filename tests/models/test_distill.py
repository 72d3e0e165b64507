"""Teacher distillation: the auxiliary head keeps the teacher's loss off the serving head,
serving and exports see the serving head only, the adapter learns to correct a biased teacher,
and bad teacher columns are named."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from ember.config import from_dict
from ember.errors import ConfigError, DataError
from ember.models.distill import DistillConfig, Distilled, distill_loss
from ember.models.registry import ModelInputs, build_model
from ember.source.writer import write_synthetic
from ember.source.config import DataConfig

SYN = {"num_dense": 2, "num_sparse": 3, "vocab_size": 200}


def _with_teacher(tmp_path: Path, split: str, rows: int, bias: float = 0.0, seed: int = 0) -> str:
    """Synthetic rows plus a ``teacher`` column: a noisy probability that knows the label,
    shifted by ``bias`` on the logit scale (a teacher trained on other data)."""
    path = str(tmp_path / f"{split}.parquet")
    opts = DataConfig(synthetic={**SYN, "rows": rows, "eval_rows": rows}).synthetic
    write_synthetic(path, "parquet", rows, opts, split=split)
    table = pq.read_table(path)
    y = table.column("label").to_numpy().astype(np.float64)
    rng = np.random.default_rng(seed)
    logit = np.where(y > 0.5, 1.5, -1.5) + rng.normal(0, 1.0, len(y)) + bias
    pq.write_table(table.append_column("teacher", pa.array(1 / (1 + np.exp(-logit)), pa.float32())), path)
    return path


def _raw(tmp_path: Path, name: str, distill: dict | None, bias: float = 0.0, **train_kw) -> dict:
    schema = {"labels": ["label"], "teacher": ["teacher"], "dense": [{"name": "I1"}, {"name": "I2"}],
              "sparse": [{"name": f"C{i}", "hash_ids": False} for i in (1, 2, 3)]}
    return {
        "data": {"format": "parquet", "train": _with_teacher(tmp_path, "train", 6000, bias),
                 "eval": _with_teacher(tmp_path, "eval", 2000, bias, seed=1), "batch_size": 200, "shuffle_buffer": 0},
        "schema": schema, "embedding": {"dim": 4},
        "model": {"type": "dlrm", "bottom_mlp": [8, 4], "top_mlp": [8], **({"distill": distill} if distill is not None else {})},
        "train": {"out_dir": str(tmp_path), "run_name": name, "progress": False, "threads": 1, **train_kw},
    }


def test_aux_head_shares_the_body_and_serving_sees_the_serving_head_only():
    inputs = ModelInputs(num_dense=2, sparse_dims=[4, 4], num_tasks=1)
    model = build_model({"type": "dlrm", "bottom_mlp": [8, 4], "top_mlp": [8], "distill": {}}, inputs)
    assert isinstance(model, Distilled)
    dense, pooled = torch.randn(5, 2), [torch.randn(5, 4), torch.randn(5, 4)]
    model.train(True)
    both = model(dense, pooled)
    model.train(False)
    assert both.shape == (5, 2) and torch.equal(model(dense, pooled), both[:, :1])
    # label_weight 0: the teacher's loss reaches the body and the aux head, never the serving head
    model.train(True)
    labels, teacher = torch.randint(0, 2, (5, 1)).float(), torch.rand(5, 1)
    cfg = DistillConfig(label_weight=0.0)
    distill_loss(model, model(dense, pooled), labels, teacher, dense, cfg).backward()
    last = [m for m in model.body.modules() if isinstance(m, torch.nn.Linear)][-1]
    assert torch.all(last.weight.grad[0] == 0) and torch.any(last.weight.grad[1] != 0)
    first = [m for m in model.body.modules() if isinstance(m, torch.nn.Linear)][0]
    assert torch.any(first.weight.grad != 0)  # the shared body learns from the teacher
    # plain distillation (no aux head): the teacher's loss lands on the serving head itself
    plain = build_model({"type": "dlrm", "bottom_mlp": [8, 4], "top_mlp": [8], "distill": {"aux_head": False}}, inputs)
    plain.train(True)
    assert plain(dense, pooled).shape == (5, 1)
    distill_loss(plain, plain(dense, pooled), labels, teacher, dense, cfg).backward()
    assert torch.any([m for m in plain.body.modules() if isinstance(m, torch.nn.Linear)][-1].weight.grad != 0)


def test_distilled_run_trains_resumes_and_exports_the_serving_head(tmp_path):
    from ember.cli import main
    from ember.serving.predictor import Predictor

    raw = _raw(tmp_path, "student", {"adapter": True}, max_steps=40)
    whole = from_dict(raw)
    from ember.train.loop import train

    res = train(whole)
    assert res.metrics["auc/label"] > 0.6  # it learned (the synthetic signal is weak at 40 steps)
    assert "adapter.scale" in {k for k in res.parts.model.state_dict()}
    part = train(from_dict(_raw(tmp_path, "part", {"adapter": True}, max_steps=20)))
    resumed = train(from_dict(_raw(tmp_path, "part", {"adapter": True}, max_steps=40, resume=str(part.run_dir))))
    for k, v in res.parts.model.state_dict().items():
        torch.testing.assert_close(resumed.parts.model.state_dict()[k], v)
    import yaml

    cfg_file = tmp_path / "student.yaml"
    cfg_file.write_text(yaml.safe_dump(raw))
    assert main(["train", "--config", str(cfg_file), "--overwrite", "--export", str(tmp_path / "export")]) == 0
    scores = Predictor.load(tmp_path / "export").predict_files([raw["data"]["eval"]])
    assert scores.shape == (2000, 1)  # the serving head only
    import json

    from ember.train.metrics import evaluate_predictions

    summary = json.loads((tmp_path / "student" / "summary.json").read_text())
    labels = pq.read_table(raw["data"]["eval"]).column("label").to_numpy().reshape(-1, 1).astype(np.float32)
    served = evaluate_predictions(labels, scores, ["label"])
    assert served["auc/label"] == pytest.approx(summary["auc/label"], abs=1e-6)  # serving scores as eval did


def test_the_adapter_learns_to_undo_a_biased_teacher(tmp_path):
    from ember.train.loop import train

    shifts = {}
    for bias in (2.0, -2.0):
        raw = _raw(tmp_path, f"biased{bias}", {"adapter": True}, bias=bias, epochs=2,
                   dense_optimizer={"type": "adam", "lr": 0.05})
        adapter = train(from_dict(raw)).parts.model.adapter
        shifts[bias] = float(adapter.bias) / float(adapter.scale)  # the logit shift it applies
    assert shifts[2.0] < -1.0 and shifts[-2.0] > 1.0, shifts  # each teacher's shift mostly taken back


def test_teacher_config_and_data_errors_name_the_problem(tmp_path):
    raw = _raw(tmp_path, "x", {})
    raw["schema"]["teacher"] = []
    with pytest.raises(ConfigError, match="model.distill needs the teacher's scores"):
        from_dict(raw)
    raw["schema"]["teacher"] = ["teacher", "teacher2"]
    with pytest.raises(ConfigError, match="one teacher score column per label"):
        from_dict(raw)
    bad = tmp_path / "bad.parquet"
    t = pq.read_table(_raw(tmp_path, "y", {})["data"]["train"])
    scores = t.column("teacher").to_numpy().copy()
    scores[7] = 1.5
    pq.write_table(t.set_column(t.schema.get_field_index("teacher"), "teacher", pa.array(scores)), bad)
    raw = _raw(tmp_path, "z", {}, max_steps=3)
    raw["data"]["train"] = str(bad)
    from ember.train.loop import train

    with pytest.raises(DataError, match=r"bad\.parquet.*row 8.*teacher.*not a probability"):
        train(from_dict(raw))
