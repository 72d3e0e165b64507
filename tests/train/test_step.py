"""One step definition: ``train_step`` (the plain form) trains exactly as the trainer's stages."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from ember.config import from_dict
from ember.pipeline.loader import make_batches
from ember.testing import assert_identical, run_state
from ember.train.builder import build_components
from ember.train.loop import train, train_step


def _cfg(tmp_path, name: str, enabled: bool):
    return from_dict({
        "data": {"preset": "synthetic", "synthetic": {"rows": 2_000, "eval_rows": 500, "vocab_size": 3_000, "num_sparse": 4},
                 "batch_size": 128},
        "embedding": {"dim": 8, "optimizer": {"type": "adam", "lr": 0.01, "schedule": {"warmup_steps": 5}}},
        "model": {"type": "dlrm", "bottom_mlp": [16, 8], "top_mlp": [16]},
        "pipeline": {"enabled": enabled},
        "train": {"dense_optimizer": {"type": "adam", "lr": 0.003, "schedule": {"warmup_steps": 5}}, "out_dir": str(tmp_path),
                  "run_name": name, "progress": False, "log_every": 4, "epochs": 2, "device": "cpu"},
    })


@pytest.mark.parametrize("enabled", [True, False])
def test_train_step_is_the_step_the_trainer_runs(tmp_path, enabled):
    cfg = _cfg(tmp_path, f"run{enabled}", enabled)
    batches = list(make_batches(cfg.data, cfg.schema, "train"))
    trained = train(cfg, batches=batches)  # the pipeline of stages (threaded or in line), two epochs
    parts = build_components(cfg)  # seeded as the run's
    parts.train(True)
    losses = [float(train_step(parts, b)) for _ in range(2) for b in batches]
    assert trained.step == len(losses) == 2 * len(batches)
    assert_identical(run_state(trained), run_state(SimpleNamespace(parts=parts)))
    logged = {r["step"]: r["loss"] for r in trained.history if r["kind"] == "train"}
    assert logged[4] == pytest.approx(sum(losses[:4]) / 4, rel=1e-6)  # the loss it logs is the steps' loss
