"""Evaluation that cannot give every number: an eval set of one class has no AUC (NaN, said once
per task with the reason, ``null`` in every JSON file, logloss still reported); rows skipped as
bad under ``on_bad_rows: skip`` are counted beside the metrics they are missing from; ``predict``
never drops a row unless asked, and then says how many."""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path

import numpy as np
import pytest
import yaml

from ember.cli import main
from ember import once
from ember.train.metrics import evaluate_predictions


def _strict(text: str):
    """json.loads that refuses NaN / Infinity, as strict JSON readers (jq, JavaScript) do."""
    return json.loads(text, parse_constant=lambda c: pytest.fail(f"{c} in JSON"))


@pytest.fixture(autouse=True)
def _fresh_warnings(monkeypatch):
    once.forget("metrics.one_class")


def test_one_class_auc_is_nan_with_one_warning_naming_task_and_reason(caplog):
    labels = np.zeros((50, 2))
    labels[::2, 1] = 1  # task b has both classes
    probs = np.random.default_rng(0).random((50, 2))
    with caplog.at_level(logging.WARNING, logger="ember"):
        out = evaluate_predictions(labels, probs, ["a", "b"])
        again = evaluate_predictions(labels, probs, ["a", "b"])
    assert math.isnan(out["auc/a"]) and math.isnan(again["auc/a"]) and 0 < out["auc/b"] < 1
    assert math.isfinite(out["logloss/a"]) and out["logloss/a"] > 0
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 1  # once per task, not at every evaluation
    assert "task 'a'" in warned[0] and "AUC is undefined" in warned[0] and "all 50 eval labels are negative" in warned[0]


def _files(tmp_path: Path) -> dict[str, str]:
    rows = "".join(f"{i % 2},v{i % 7}\n" for i in range(64))
    (tmp_path / "train.csv").write_text("y,a\n" + rows)
    (tmp_path / "ones.csv").write_text("y,a\n" + "".join(f"1,v{i % 7}\n" for i in range(40)))
    (tmp_path / "some_bad.csv").write_text("y,a\n" + rows + "1,x,extra\n0,y,extra\n1,z,extra\n")
    return {p.stem: str(p) for p in tmp_path.glob("*.csv")}


def _config(tmp_path: Path, eval_path: str, name: str, on_bad_rows: str = "error") -> str:
    cfg = tmp_path / f"{name}.yaml"
    cfg.write_text(yaml.safe_dump({
        "data": {"format": "csv", "train": str(tmp_path / "train.csv"), "eval": eval_path, "batch_size": 16,
                 "on_bad_rows": on_bad_rows},
        "schema": {"labels": ["y"], "sparse": [{"name": "a"}]},
        "embedding": {"dim": 2}, "model": {"type": "lr"},
        "train": {"out_dir": str(tmp_path / "runs"), "run_name": name, "progress": False, "threads": 1},
    }))
    return str(cfg)


def test_train_and_eval_on_one_class_report_null_auc_and_logloss(tmp_path, capsys, caplog):
    f = _files(tmp_path)
    with caplog.at_level(logging.WARNING, logger="ember"):
        assert main(["train", "--config", _config(tmp_path, f["ones"], "one")]) == 0
    out = capsys.readouterr().out
    assert "eval auc/y: nan (undefined: the eval labels hold one class)" in out and "eval logloss/y: 0." in out
    assert any("task 'y': AUC is undefined" in r.getMessage() and "positive" in r.getMessage()
               for r in caplog.records)
    run = tmp_path / "runs" / "one"
    summary = _strict((run / "summary.json").read_text())
    assert summary["auc/y"] is None and summary["logloss/y"] > 0 and summary["rows"] == 40
    evals = [_strict(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["auc/y"] for r in evals if r["kind"] == "eval"] == [None]

    assert main(["eval", "--checkpoint", str(run)]) == 0
    printed = _strict(capsys.readouterr().out)
    assert printed["auc/y"] is None and printed["logloss/y"] == pytest.approx(summary["logloss/y"])


def test_rows_skipped_from_evaluation_are_counted_with_the_metrics(tmp_path, capsys):
    f = _files(tmp_path)
    assert main(["train", "--config", _config(tmp_path, f["some_bad"], "skip", "skip")]) == 0
    out = capsys.readouterr().out
    assert "eval rows: 64" in out and "eval skipped_rows: 3" in out
    run = tmp_path / "runs" / "skip"
    assert _strict((run / "summary.json").read_text())["skipped_rows"] == 3
    assert main(["eval", "--checkpoint", str(run)]) == 0
    captured = capsys.readouterr()
    assert _strict(captured.out)["skipped_rows"] == 3
    assert "skipped 3 bad rows: <row>: wrong number of fields x3 (left out of the metrics)" in captured.err


def test_predict_refuses_bad_rows_unless_told_to_skip_them_then_counts(tmp_path, capsys):
    """The training run skipped bad rows; predict must not: one output line per input row."""
    f = _files(tmp_path)
    export = tmp_path / "export"
    assert main(["train", "--config", _config(tmp_path, f["train"], "p", "skip"), "--export", str(export)]) == 0
    capsys.readouterr()
    assert main(["predict", "--export", str(export), "--input", f["some_bad"]]) == 2
    assert "some_bad.csv row 66, column '<row>': expected 2 fields" in capsys.readouterr().err
    out = tmp_path / "p.csv"
    assert main(["predict", "--export", str(export), "--input", f["some_bad"], "--output", str(out),
                 "data.on_bad_rows=skip"]) == 0
    err = capsys.readouterr().err
    assert "skipped 3 bad rows" in err and "the output has 3 line(s) fewer than the input has rows" in err
    assert len(out.read_text().splitlines()) == 1 + 64
