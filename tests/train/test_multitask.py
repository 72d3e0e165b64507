"""A multi-task model (MMoE) trains on two labels at once from Parquet files."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from ember.config import from_dict
from ember.featurize.presets import preset_schema
from ember.pipeline.loader import write_synthetic
from ember.source.config import SyntheticOptions
from ember.train.loop import train


def _with_second_label(path, seed):
    t = pq.read_table(path)
    y = t.column("label").to_numpy()
    flip = np.random.default_rng(seed).random(len(y)) < 0.15
    t = t.append_column("label2", pa.array(np.where(flip, 1 - y, y).astype(np.int64)))
    pq.write_table(t, path)


def test_mmoe_learns_two_tasks(tmp_path):
    opts = SyntheticOptions(num_sparse=6, vocab_size=5_000, rows=30_000, eval_rows=6_000)
    train_p = write_synthetic(str(tmp_path / "train.parquet"), "parquet", 30_000, opts, split="train")[0]
    eval_p = write_synthetic(str(tmp_path / "eval.parquet"), "parquet", 6_000, opts, split="eval")[0]
    _with_second_label(train_p, 0)
    _with_second_label(eval_p, 1)
    schema = preset_schema("synthetic", opts).model_dump(mode="json")
    schema["labels"] = ["label", "label2"]
    cfg = from_dict({
        "data": {"format": "parquet", "train": str(train_p), "eval": str(eval_p), "batch_size": 512},
        "schema": schema,
        "embedding": {"dim": 8, "optimizer": {"type": "adagrad", "lr": 0.05}},
        "model": {"type": "mmoe", "num_experts": 3, "expert_mlp": [32], "tower_mlp": [16]},
        "train": {"epochs": 2, "out_dir": str(tmp_path), "run_name": "mt", "progress": False,
                  "dense_optimizer": {"type": "adam", "lr": 0.003}},
    })
    result = train(cfg)
    assert result.metrics["auc/label"] > 0.68, result.metrics
    assert result.metrics["auc/label2"] > 0.62, result.metrics
