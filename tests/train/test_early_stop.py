"""Early stopping: stops where patience runs out, records it, keeps and restores the best
checkpoint, and a resumed run counts on where it left off."""

from __future__ import annotations

import json

import pytest

from ember.checkpoint.load import read_manifest, resolve_checkpoint
from ember.config import from_dict
from ember.errors import ConfigError
from ember.pipeline.loader import make_batches
from ember.train.config import EarlyStoppingConfig
from ember.train.early_stop import EarlyStopping
from ember.train.evaluate import evaluate
from ember.train.loop import train
from tests.train.test_train_e2e import _assert_same_model

# min_delta 1: AUC can never improve by 1, so the first eval is the best and every later one is bad
NEVER_BETTER = {"metric": "auc", "patience": 2, "min_delta": 1.0}


def _raw(tmp_path, name, **train):
    return {
        "data": {"preset": "synthetic", "synthetic": {"rows": 6_000, "eval_rows": 1_000, "vocab_size": 2_000, "num_sparse": 4},
                 "batch_size": 256},
        "embedding": {"dim": 4, "optimizer": {"type": "adagrad", "lr": 0.05}},
        "model": {"type": "dlrm", "bottom_mlp": [8, 4], "top_mlp": [8]},
        "train": {"dense_optimizer": {"type": "adam", "lr": 0.003}, "out_dir": str(tmp_path), "run_name": name,
                  "progress": False, "log_every": 1, "deterministic": True, **train},
    }


def _cfg(tmp_path, name, **train):
    return from_dict(_raw(tmp_path, name, **train))


def test_observe_counts_bad_evals_with_min_delta_and_mode():
    es = EarlyStopping(EarlyStoppingConfig(metric="auc", patience=2, min_delta=0.01), ["label"])
    assert es.cfg.direction == "max"
    es.observe(1, {"auc/label": 0.70})
    assert es.observe(2, {"auc/label": 0.705})["early_stopping.bad_evals"] == 1  # below min_delta
    assert not es.stop_here(2)
    assert es.observe(3, {"auc/label": 0.72})["early_stopping.bad_evals"] == 0
    assert (es.best, es.best_step) == (0.72, 3)
    es.observe(4, {"auc/label": 0.6})
    es.observe(5, {"auc/label": 0.6})
    assert es.stop_here(5) and es.summary()["stopped_step"] == 5
    # mean over tasks; explicit mode wins
    mt = EarlyStopping(EarlyStoppingConfig(metric="logloss", mode="max", patience=1), ["a", "b"])
    assert mt.observe(1, {"logloss/a": 0.2, "logloss/b": 0.4})["early_stopping.best"] == pytest.approx(0.3)
    assert mt.observe(2, {"logloss/a": 0.3, "logloss/b": 0.4})["early_stopping.bad_evals"] == 0  # max: higher is better


@pytest.mark.parametrize("es, message", [
    ({"metric": "accuracy"}, "metric must be auc or logloss"),
    ({"metric": "auc/click"}, "names no task"),
    ({"restore_best": True, "save_best": False}, "restore_best needs save_best"),
    ({"patience": 0}, "patience"),
    ({"patience": 2, "paitence": 3}, "did you mean 'patience'"),
])
def test_bad_early_stopping_configs_are_errors(tmp_path, es, message):
    with pytest.raises(ConfigError, match=message):
        EarlyStopping.from_run(_cfg(tmp_path, "x", early_stopping=es))


def test_early_stopping_needs_eval_data(tmp_path):
    raw = _raw(tmp_path, "x", early_stopping={"metric": "auc"})
    raw["data"] = {"format": "csv", "train": str(tmp_path / "t.csv")}
    raw["schema"] = {"labels": ["y"], "sparse": [{"name": "a"}]}
    with pytest.raises(ConfigError, match="data.eval is not set"):
        EarlyStopping.from_run(from_dict(raw))


def test_stops_when_patience_runs_out_and_keeps_the_best_checkpoint(tmp_path):
    result = train(_cfg(tmp_path, "es", max_steps=40, eval_every=2, keep_checkpoints=1, early_stopping=NEVER_BETTER))
    assert result.step == 6  # evals at 2 (best), 4 and 6 (no improvement: patience 2)
    summary = json.loads((result.run_dir / "summary.json").read_text())
    es = summary["early_stopping"]
    assert es["stopped_early"] and es["stopped_step"] == 6 and es["best_step"] == 2 and es["metric"] == "auc"
    evals = [r for r in result.history if r["kind"] == "eval"]
    assert [r["step"] for r in evals] == [2, 4, 6]
    assert es["best"] == evals[0]["auc/label"] and [r["early_stopping.bad_evals"] for r in evals] == [0, 1, 2]
    assert result.history[-1]["kind"] == "early_stopping" and result.history[-1]["stopped_step"] == 6
    ckpts = result.run_dir / "checkpoints"
    # the final checkpoint is written as on a normal end, and the best one survives keep_checkpoints: 1
    assert (ckpts / "LATEST").read_text() == "step-00000006" and (ckpts / "BEST").read_text() == "step-00000002"
    assert es["best_checkpoint"] == str(ckpts / "step-00000002")
    assert sorted(p.name for p in ckpts.glob("step-*")) == ["step-00000002", "step-00000006"]
    assert read_manifest(resolve_checkpoint(result.run_dir))["position"] == {"epoch": 0, "batch": 6}
    assert summary["auc/label"] == evals[-1]["auc/label"]  # without restore_best: the last model's metrics


def test_restore_best_makes_the_best_eval_the_runs_model(tmp_path):
    es = {**NEVER_BETTER, "restore_best": True}
    cfg = _cfg(tmp_path, "best", max_steps=40, eval_every=2, early_stopping=es)
    result = train(cfg)
    evals = [r for r in result.history if r["kind"] == "eval"]
    assert evals[0]["auc/label"] != evals[-1]["auc/label"]
    assert result.metrics["auc/label"] == evals[0]["auc/label"]
    # the returned parts are the step-2 model: scoring them again gives the step-2 eval
    again = evaluate(result.parts, make_batches(cfg.data, cfg.schema, "eval"))
    assert again["auc/label"] == pytest.approx(evals[0]["auc/label"], abs=1e-9)
    assert again["logloss/label"] == pytest.approx(evals[0]["logloss/label"], abs=1e-7)
    assert json.loads((result.run_dir / "summary.json").read_text())["early_stopping"]["restored_best"]


def test_stop_at_an_epoch_end_resumes_from_the_next_epoch(tmp_path):
    raw = _raw(tmp_path, "epochs", epochs=6, early_stopping={**NEVER_BETTER, "patience": 1})
    raw["data"]["synthetic"]["rows"] = 1024  # 4 steps per epoch
    result = train(from_dict(raw))
    assert result.step == 8  # evals after epoch 1 (best) and epoch 2 (patience 1)
    assert read_manifest(resolve_checkpoint(result.run_dir))["position"] == {"epoch": 2, "batch": 0}


def test_resume_keeps_the_early_stopping_state(tmp_path):
    es = {**NEVER_BETTER, "patience": 3}
    full = train(_cfg(tmp_path, "full", max_steps=40, eval_every=2, early_stopping=es))
    assert full.step == 8
    first = train(_cfg(tmp_path, "part", max_steps=5, eval_every=2, early_stopping=es))  # evals at 2, 4: one bad
    resumed = train(_cfg(tmp_path, "part", max_steps=40, eval_every=2, early_stopping=es, resume=str(first.run_dir)))
    assert resumed.step == 8  # counted on: without the saved state it would stop only at 12
    _assert_same_model(full, resumed)
    s = json.loads((resumed.run_dir / "summary.json").read_text())["early_stopping"]
    assert s["best_step"] == 2 and s["best_checkpoint"].endswith("step-00000002")


def test_cli_train_reports_the_early_stop(tmp_path, capsys):
    import yaml

    from ember.cli import main

    raw = _raw(tmp_path, "cli", max_steps=40, eval_every=2, early_stopping=NEVER_BETTER)
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(raw))
    assert main(["train", "--config", str(tmp_path / "c.yaml")]) == 0
    out = capsys.readouterr().out
    assert "early stopping: stopped early at step 6; best auc" in out and "at step 2 (" in out and "step-00000002" in out


def test_an_eval_at_max_steps_is_not_an_early_stop(tmp_path):
    result = train(_cfg(tmp_path, "end", max_steps=6, eval_every=2, early_stopping=NEVER_BETTER))
    s = json.loads((result.run_dir / "summary.json").read_text())["early_stopping"]
    assert result.step == 6 and not s["stopped_early"] and s["stopped_step"] is None and s["best_step"] == 2
