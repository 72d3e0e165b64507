"""The CLI end to end: generate -> train (--export) -> eval -> export -> predict."""

from __future__ import annotations

import json

import numpy as np
import yaml

from ember.cli import main


def test_cli_workflow(tmp_path, capsys):
    data = tmp_path / "eval.parquet"
    assert main(["generate", "--out", str(data), "--format", "parquet", "--rows", "2000", "--split", "eval",
                 "--options", json.dumps({"num_sparse": 4, "vocab_size": 3000})]) == 0
    cfg = tmp_path / "run.yaml"
    cfg.write_text(yaml.safe_dump({
        "data": {"preset": "synthetic", "synthetic": {"rows": 8000, "eval_rows": 2000, "num_sparse": 4, "vocab_size": 3000},
                 "batch_size": 512},
        "embedding": {"dim": 4},
        "model": {"type": "wdl", "deep_mlp": [16]},
        "train": {"out_dir": str(tmp_path), "run_name": "cli", "progress": False},
    }))
    assert main(["train", "--config", str(cfg), "--export", str(tmp_path / "exp1"), "train.max_steps=10"]) == 0
    assert "eval auc/label" in capsys.readouterr().out
    assert main(["eval", "--checkpoint", str(tmp_path / "cli")]) == 0
    metrics = json.loads(capsys.readouterr().out)
    assert 0.5 < metrics["auc/label"] <= 1.0
    assert main(["export", "--checkpoint", str(tmp_path / "cli"), "--out", str(tmp_path / "exp2")]) == 0
    out = tmp_path / "p.csv"
    assert main(["predict", "--export", str(tmp_path / "exp2"), "--input", str(data), "--output", str(out)]) == 0
    probs = np.loadtxt(out, delimiter=",", skiprows=1)
    assert probs.shape == (2000,) and ((probs > 0) & (probs < 1)).all()
    # the export written by `train --export` and the one by `export` score the file identically
    from ember.serving import Predictor

    p = Predictor.load(tmp_path / "exp1")
    np.testing.assert_allclose(p.predict_files([str(data)])[:, 0], probs, atol=2e-6)
    # raw rows to score need no label column
    import pyarrow.parquet as pq

    pq.write_table(pq.read_table(data).drop(["label"]), tmp_path / "unlabeled.parquet")
    np.testing.assert_allclose(p.predict_files([str(tmp_path / "unlabeled.parquet")])[:, 0], probs, atol=2e-6)


def test_cli_bad_config_is_a_clean_error(tmp_path, capsys):
    cfg = tmp_path / "bad.yaml"
    cfg.write_text("data: {preset: synthetic}\nmodel: {type: dlrm}\ntrain: {epoch: 2}\n")
    assert main(["train", "--config", str(cfg)]) == 2
    assert "did you mean 'epochs'" in capsys.readouterr().err


def test_a_checkpoint_from_before_missing_values_reads_empty_categories_as_missing(tmp_path):
    import argparse

    from ember.checkpoint.load import resolve_checkpoint
    from ember.cli import _restore

    cfg = tmp_path / "run.yaml"
    cfg.write_text(yaml.safe_dump({
        "data": {"preset": "synthetic", "synthetic": {"rows": 256, "eval_rows": 64, "num_sparse": 2, "vocab_size": 50},
                 "batch_size": 64},
        "model": {"type": "lr"},
        "train": {"out_dir": str(tmp_path), "run_name": "old", "progress": False, "max_steps": 2},
    }))
    assert main(["train", "--config", str(cfg)]) == 0
    args = argparse.Namespace(checkpoint=str(tmp_path / "old"), config=None, overrides=[])
    assert _restore(args)[0].schema.missing_values == []  # recorded now: as trained
    manifest_path = resolve_checkpoint(tmp_path / "old") / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    del manifest["config"]["schema"]["missing_values"]  # as a checkpoint written before the key
    manifest_path.write_text(json.dumps(manifest))
    assert _restore(args)[0].schema.missing_values == [""]
