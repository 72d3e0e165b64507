"""train.tensorboard: every metrics.jsonl record is also in the TensorBoard event file, with the
same values; without the package the run fails up front naming the pip command."""

from __future__ import annotations

import builtins
import json

import pytest

from ember.config import from_dict
from ember.errors import ConfigError
from ember.train.loop import train
from ember.train.tensorboard import scalars


def _cfg(tmp_path, name, **train):
    return from_dict({
        "data": {"preset": "synthetic", "synthetic": {"rows": 3_000, "eval_rows": 500, "vocab_size": 1_000, "num_sparse": 3},
                 "batch_size": 256},
        "embedding": {"dim": 4, "optimizer": {"type": "sgd", "lr": 0.05, "schedule": {"warmup_steps": 4}}},
        "model": {"type": "dlrm", "bottom_mlp": [8, 4], "top_mlp": [8]},
        "train": {"out_dir": str(tmp_path), "run_name": name, "progress": False, "log_every": 3, "eval_every": 6,
                  "max_steps": 12, **train},
    })


def test_scalars_keep_numbers_only():
    rec = {"kind": "eval", "step": 4, "auc/label": 0.7, "rows": 500.0, "note": "x", "best": None, "stopped": True}
    assert scalars(rec) == {"eval/auc/label": 0.7, "eval/rows": 500.0, "eval/stopped": 1.0}


def test_event_file_holds_every_metrics_record(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    result = train(_cfg(tmp_path, "tb", tensorboard=True))
    records = [json.loads(line) for line in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    expected: dict[str, list[tuple[int, float]]] = {}
    for r in records:
        for tag, value in scalars(r).items():
            expected.setdefault(tag, []).append((r["step"], value))
    assert {"train/loss", "train/lr", "train/C1/lr", "eval/auc/label", "eval/logloss/label"} <= expected.keys()
    assert any(t.startswith("train/pipeline.stage.") for t in expected)
    acc = EventAccumulator(str(result.run_dir / "tensorboard"), size_guidance={"scalars": 0})
    acc.Reload()
    assert set(acc.Tags()["scalars"]) == set(expected)
    for tag, points in expected.items():
        got = [(e.step, e.value) for e in acc.Scalars(tag)]
        assert [s for s, _ in got] == [s for s, _ in points], tag
        assert [v for _, v in got] == pytest.approx([v for _, v in points], rel=1e-6), tag  # stored as float32
    assert [v for _, v in expected["train/C1/lr"]] == pytest.approx([0.05 * 3 / 4, 0.05, 0.05, 0.05])


def test_missing_tensorboard_is_a_config_error_naming_the_install(tmp_path, monkeypatch):
    real_import = builtins.__import__

    def no_tensorboard(name, *args, **kwargs):  # type: ignore[no-untyped-def]
        if name == "tensorboard" or name.startswith("tensorboard."):
            raise ImportError(f"No module named '{name}'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_tensorboard)
    with pytest.raises(ConfigError, match=r"pip install 'ember\[tensorboard\]'"):
        train(_cfg(tmp_path, "no-tb", tensorboard=True))
    assert not (tmp_path / "no-tb").exists()  # failed up front: nothing left behind
