"""LR schedules in the trainer: logged rates follow the schedule, the dense optimizer uses it,
and a resumed run equals an uninterrupted one."""

from __future__ import annotations

import pytest
import torch

from ember.config import from_dict
from ember.train.loop import train
from tests.train.test_train_e2e import _assert_same_model

SPARSE = {"warmup_steps": 4, "decay": "cosine", "decay_steps": 12, "final_ratio": 0.1}
DENSE = {"warmup_steps": 3, "decay": "step", "decay_steps": 5, "gamma": 0.5}


def _cfg(tmp_path, name, **train):
    return from_dict({
        "data": {"preset": "synthetic", "synthetic": {"rows": 6_000, "eval_rows": 1_000, "vocab_size": 2_000, "num_sparse": 4},
                 "batch_size": 256},
        "embedding": {"dim": 4, "optimizer": {"type": "adagrad", "lr": 0.05, "schedule": SPARSE}},
        "model": {"type": "dlrm", "bottom_mlp": [8, 4], "top_mlp": [8]},
        "train": {"dense_optimizer": {"type": "sgd", "lr": 0.1, "schedule": DENSE}, "out_dir": str(tmp_path), "run_name": name,
                  "progress": False, "log_every": 1, "deterministic": True, **train},
    })


def test_logged_rates_follow_the_schedules(tmp_path):
    import math

    result = train(_cfg(tmp_path, "lr", max_steps=20))
    recs = [r for r in result.history if r["kind"] == "train"]
    assert [r["step"] for r in recs] == list(range(1, 21))
    for r in recs:
        s = r["step"] - 1  # the step these rates were used at (0-based)
        dense = 0.1 * ((s + 1) / 3 if s < 3 else 0.5 ** ((s - 3) // 5))
        p = min((s - 4) / 12, 1.0)
        sparse = 0.05 * ((s + 1) / 4 if s < 4 else 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * p)))
        assert r["lr"] == pytest.approx(dense), r["step"]
        assert r["C1/lr"] == pytest.approx(sparse), r["step"]
    # the dense optimizer holds the rate of the last step
    assert result.parts.dense_optimizer.param_groups[0]["lr"] == pytest.approx(recs[-1]["lr"])


def test_dense_step_uses_the_scheduled_lr(tmp_path, monkeypatch):
    """Record the lr each dense optimizer.step() sees."""
    seen: list[float] = []
    orig = torch.optim.SGD.step

    def spy(self, *a, **kw):
        seen.append(self.param_groups[0]["lr"])
        return orig(self, *a, **kw)

    monkeypatch.setattr(torch.optim.SGD, "step", spy)
    train(_cfg(tmp_path, "dense", max_steps=10))
    # warmup (s+1)/3, then 0.5 ** floor((s - 3) / 5): the drop comes at s = 8
    assert seen == pytest.approx([0.1 / 3, 0.2 / 3, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.05, 0.05])


def test_resume_with_schedules_equals_uninterrupted(tmp_path):
    full = train(_cfg(tmp_path, "full", max_steps=18))
    first = train(_cfg(tmp_path, "part", max_steps=7))
    resumed = train(_cfg(tmp_path, "part", max_steps=18, resume=str(first.run_dir)))
    assert resumed.step == full.step == 18
    _assert_same_model(full, resumed)
    lr_full = [(r["step"], r["lr"], r["C1/lr"]) for r in full.history if r["kind"] == "train"]
    lr_resumed = [(r["step"], r["lr"], r["C1/lr"]) for r in resumed.history if r["kind"] == "train"]
    assert lr_full == lr_resumed
