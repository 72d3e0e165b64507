"""Ranking metrics (``ember.train.ranking_metrics``) against references on random data:
scikit-learn's ``roc_auc_score`` per group (GAUC) and ``log_loss`` (NE), hand formulas for
calibration and ECE, all to 1e-9; undefined metrics are null with a warning, never NaN in JSON
or a crash; the eval data's key columns reach the metrics through the loader and ``evaluate``,
in the run's metrics.jsonl, summary.json and ``ember eval``'s JSON."""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
import yaml

sklearn_metrics = pytest.importorskip("sklearn.metrics")

from ember.batch import Batch, SparseFeatures  # noqa: E402
from ember.cli import main  # noqa: E402
from ember.config import from_dict, load  # noqa: E402
from ember.errors import ConfigError  # noqa: E402
from ember.pipeline.loader import make_batches  # noqa: E402
from ember.train.loop import train  # noqa: E402
from ember.train.metrics import json_safe  # noqa: E402
from ember import once
from ember.train.ranking_metrics import (  # noqa: E402
    calibration,
    expected_calibration_error,
    group_auc,
    normalized_entropy,
    ranking_report,
    top_values,
)

TOL = 1e-9


@pytest.fixture(autouse=True)
def _fresh_warnings(monkeypatch):
    once.forget("ranking_metrics.undefined")


def _data(seed: int, n: int = 3000, groups: int = 120):
    rng = np.random.default_rng(seed)
    g = np.where(rng.random(n) < 0.7, rng.integers(0, groups, n), rng.integers(groups, 10 * groups, n))  # tiny groups too
    p = np.round(rng.random(n), 2)  # rounded: many tied scores, within groups too
    y = (rng.random(n) < p * 0.8 + 0.05).astype(np.float64)
    return y, p, g


def _ref_gauc(y, p, g, weight):
    y, p = np.asarray(y, np.float64), np.asarray(p, np.float64)
    num = den = 0.0
    skipped = 0
    for k in np.unique(g):
        m = g == k
        if len(np.unique(y[m])) < 2:
            skipped += 1
            continue
        w = m.sum() if weight == "rows" else y[m].sum()
        num += w * sklearn_metrics.roc_auc_score(y[m], p[m])
        den += w
    return num / den, skipped


@pytest.mark.parametrize("weight", ["rows", "clicks"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_gauc_is_sklearn_auc_per_group_weighted_and_counts_one_class_groups(seed, weight):
    y, p, g = _data(seed)
    value, skipped = group_auc(y, p, g, weight)
    ref, ref_skipped = _ref_gauc(y, p, g, weight)
    assert ref_skipped > 0  # small groups of one class exist in this data: the skip is exercised
    assert skipped == ref_skipped
    assert abs(value - ref) < TOL
    # group codes of any type: strings give the same result
    assert abs(group_auc(y, p, np.array([f"u{k}" for k in g]), weight)[0] - ref) < TOL


def test_gauc_of_one_group_is_the_auc_and_none_with_both_classes_is_nan():
    y, p, _ = _data(3)
    assert abs(group_auc(y, p, np.zeros(len(y)))[0] - sklearn_metrics.roc_auc_score(y, p)) < TOL
    value, skipped = group_auc(np.array([1.0, 1, 0, 0]), np.array([.1, .2, .3, .4]), np.array([0, 0, 1, 1]))
    assert math.isnan(value) and skipped == 2


@pytest.mark.parametrize("seed", [0, 1])
def test_calibration_ece_and_ne_match_hand_formulas(seed):
    y, p, _ = _data(seed, n=1003)
    assert abs(calibration(y, p) - p.mean() / y.mean()) < TOL
    for bins in (1, 7, 10, 1003, 2000):
        order = np.argsort(p, kind="stable")
        n, ece, start = len(y), 0.0, 0
        for b in range(bins):  # equal mass: the first n % bins bins hold one row more
            size = n // bins + (1 if b < n % bins else 0)
            idx = order[start:start + size]
            start += size
            if size:
                ece += size / n * abs(p[idx].mean() - y[idx].mean())
        assert abs(expected_calibration_error(y, p, bins) - ece) < TOL, bins
    r = y.mean()
    entropy = -(r * np.log(r) + (1 - r) * np.log(1 - r))
    assert abs(normalized_entropy(y, p) - sklearn_metrics.log_loss(y, np.clip(p, 1e-7, 1 - 1e-7)) / entropy) < TOL
    assert abs(normalized_entropy(y, np.full(len(y), r)) - 1.0) < TOL  # predicting the base rate: NE 1


def test_top_values_keep_the_most_frequent_and_pool_the_rest_as_other():
    values = np.array(["US"] * 5 + ["DE"] * 3 + ["FR"] * 3 + ["JP"] + [None] * 2, dtype=object)
    got = [(v, int(m.sum())) for v, m in top_values(values, 2)]
    assert got == [("US", 5), ("DE", 3), ("other", 6)]  # DE before FR: ties by name
    assert [(v, int(m.sum())) for v, m in top_values(values, 10)] == [("US", 5), ("DE", 3), ("FR", 3), ("null", 2),
                                                                      ("JP", 1)]
    assert [v for v, _ in top_values(np.array([2.0, np.nan, 2.0]), 5)] == ["2.0", "null"]
    clash = np.array(["other", "other", "a", "b"], dtype=object)
    assert [(v, int(m.sum())) for v, m in top_values(clash, 1)] == [("other", 2), ("other#2", 2)]  # no key lost


def test_report_gives_every_metric_per_slice_value_as_on_that_subset():
    y, p, g = _data(4, n=2000)
    rng = np.random.default_rng(4)
    country = rng.choice(["US", "DE", "FR", "JP", "BR"], len(y), p=[.4, .25, .2, .1, .05])
    labels, probs = np.stack([y, 1 - y], 1), np.stack([p, 1 - p], 1)
    out = ranking_report(labels, probs, ["click", "skip"], {"user": g, "country": country}, group_by="user",
                         weight="rows", bins=5, slices=["country"], slice_top=2)
    assert out["rows/country=US"] + out["rows/country=DE"] + out["rows/country=other"] == len(y)
    for name, mask in (("US", country == "US"), ("other", ~np.isin(country, ["US", "DE"]))):
        for t, task in enumerate(["click", "skip"]):
            yy, pp = labels[mask, t], probs[mask, t]
            s = f"/country={name}"
            assert abs(out[f"auc/{task}{s}"] - sklearn_metrics.roc_auc_score(yy, pp)) < TOL
            assert abs(out[f"logloss/{task}{s}"] - sklearn_metrics.log_loss(yy, np.clip(pp, 1e-7, 1 - 1e-7))) < TOL
            assert abs(out[f"calibration/{task}{s}"] - calibration(yy, pp)) < TOL
            assert abs(out[f"ece/{task}{s}"] - expected_calibration_error(yy, pp, 5)) < TOL
            assert abs(out[f"ne/{task}{s}"] - normalized_entropy(yy, pp)) < TOL
            ref, skipped = _ref_gauc(yy, pp, g[mask], "rows")
            assert abs(out[f"gauc/{task}{s}"] - ref) < TOL and out[f"gauc_groups_skipped/{task}{s}"] == skipped
    assert "auc/click" not in out  # the whole set's auc and logloss are evaluate_predictions'
    assert abs(out["gauc/click"] - _ref_gauc(y, p, g, "rows")[0]) < TOL
    assert not any(k.startswith("rows/") and "FR" in k for k in out)  # FR is under other


def test_undefined_metrics_are_null_with_one_warning_line_never_a_crash(caplog):
    y = np.zeros(40)
    p = np.linspace(0.1, 0.9, 40)
    with caplog.at_level(logging.WARNING, logger="ember"):
        out = ranking_report(y[:, None], p[:, None], ["y"], {"u": np.arange(40) % 4}, group_by="u")
        again = ranking_report(y[:, None], p[:, None], ["y"], {"u": np.arange(40) % 4}, group_by="u")
    for key in ("calibration/y", "ne/y", "gauc/y"):
        assert math.isnan(out[key]) and math.isnan(again[key])
    assert out["gauc_groups_skipped/y"] == 4 and math.isfinite(out["ece/y"])
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 1  # once, not at every evaluation
    assert "calibration/y (no positive label)" in warned[0] and "gauc/y (no group with both classes)" in warned[0]
    text = json.dumps(json_safe(out))
    assert "NaN" not in text and json.loads(text)["gauc/y"] is None


# --- through the loader, evaluate, the run's files and `ember eval` --------------------------


def _write(tmp_path: Path) -> dict[str, str]:
    rng = np.random.default_rng(0)
    n = 600
    x = rng.normal(size=n)
    y = (rng.random(n) < 1 / (1 + np.exp(-2 * x))).astype(np.int64)
    table = pa.table({"y": y, "x": x, "c": [f"v{i % 7}" for i in range(n)], "user_id": rng.integers(0, 30, n),
                      "country": rng.choice(["US", "DE", "FR", "JP"], n)})
    pq.write_table(table, tmp_path / "train.parquet")
    pq.write_table(table.slice(0, 400), tmp_path / "eval.parquet")
    return {"train": str(tmp_path / "train.parquet"), "eval": str(tmp_path / "eval.parquet")}


def _config(tmp_path: Path, eval_cfg: dict) -> Path:
    files = _write(tmp_path)
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump({
        "data": {"format": "parquet", "train": files["train"], "eval": files["eval"], "batch_size": 64},
        "schema": {"labels": ["y"], "dense": [{"name": "x"}], "sparse": [{"name": "c"}]},
        "embedding": {"dim": 2}, "model": {"type": "lr"},
        "train": {"progress": False, "threads": 1, "out_dir": str(tmp_path / "runs"), "run_name": "r"},
        "eval": eval_cfg,
    }))
    return path


def _strict(text: str):
    return json.loads(text, parse_constant=lambda c: pytest.fail(f"{c} in JSON"))


def test_run_reports_gauc_and_slices_in_its_files_and_ember_eval(tmp_path, capsys):
    path = _config(tmp_path, {"group_by": "user_id", "gauc_weight": "clicks", "slices": ["country"], "slice_top": 2,
                              "calibration_bins": 4})
    cfg = load(path, ["train.tensorboard=true"])
    result = train(cfg)
    m = result.metrics
    # the reference: the trained model's eval predictions, with the key columns read directly
    from ember.train.evaluate import predict_batches

    probs, labels = predict_batches(result.parts, make_batches(cfg.data, cfg.schema, "eval"))
    table = pq.read_table(tmp_path / "eval.parquet")
    users, country = table["user_id"].to_numpy(), table["country"].to_numpy(zero_copy_only=False)
    ref, skipped = _ref_gauc(labels[:, 0], probs[:, 0], users, "clicks")
    assert abs(m["gauc/y"] - ref) < TOL and m["gauc_groups_skipped/y"] == skipped
    assert abs(m["ece/y"] - expected_calibration_error(labels[:, 0], probs[:, 0], 4)) < TOL
    top = [v for v, _ in top_values(country, 2)]
    assert top[-1] == "other" and m[f"rows/country={top[0]}"] == (country == top[0]).sum()
    us = country == top[0]
    assert abs(m[f"auc/y/country={top[0]}"] - sklearn_metrics.roc_auc_score(labels[us, 0], probs[us, 0])) < TOL

    run = tmp_path / "runs" / "r"
    evals = [r for r in map(_strict, (run / "metrics.jsonl").read_text().splitlines()) if r["kind"] == "eval"]
    assert evals[-1]["gauc/y"] == pytest.approx(m["gauc/y"], abs=TOL)
    assert f"ne/y/country={top[0]}" in evals[-1]
    summary = _strict((run / "summary.json").read_text())
    assert summary["calibration/y"] == pytest.approx(m["calibration/y"], abs=TOL)
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run / "tensorboard"), size_guidance={"scalars": 0})
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    assert {"eval/gauc/y", "eval/ne/y", f"eval/auc/y/country={top[0]}", f"eval/rows/country={top[0]}"} <= tags
    assert acc.Scalars("eval/gauc/y")[-1].value == pytest.approx(m["gauc/y"], rel=1e-6)

    capsys.readouterr()
    assert main(["eval", "--config", str(path), "--checkpoint", str(run)]) == 0
    out = _strict(capsys.readouterr().out)
    assert out["gauc/y"] == pytest.approx(m["gauc/y"], abs=1e-6)
    assert out[f"rows/country={top[0]}"] == m[f"rows/country={top[0]}"]
    # a checkpoint scored another way: eval.* overrides on `ember eval`
    assert main(["eval", "--checkpoint", str(run), "eval.gauc_weight=rows", "eval.slices=[]"]) == 0
    out = _strict(capsys.readouterr().out)
    assert out["gauc/y"] == pytest.approx(_ref_gauc(labels[:, 0], probs[:, 0], users, "rows")[0], abs=1e-6)
    assert not any(k.startswith("rows/") for k in out)


def test_a_named_column_the_eval_data_lacks_is_a_config_error_with_a_hint(tmp_path):
    cfg = load(_config(tmp_path, {"group_by": "userid"}))
    with pytest.raises(ConfigError, match=r"eval.group_by / eval.slices names column\(s\) \['userid'\].*did you mean "
                                          r"'user_id'"):
        train(cfg)
    assert not (tmp_path / "runs" / "r").exists()  # refused before training (preflight), not after it
    synthetic = from_dict({"data": {"preset": "synthetic", "synthetic": {"rows": 64, "eval_rows": 32}},
                           "model": {"type": "lr"}, "eval": {"slices": ["country"]},
                           "train": {"out_dir": str(tmp_path / "runs"), "progress": False}})
    with pytest.raises(ConfigError, match=r"names column\(s\) \['country'\].*its columns: \['label', 'I1'"):
        train(synthetic)
    # a column that holds lists (an ID bag) cannot group rows
    from ember.featurize.featurizer import Featurizer
    from ember.featurize.schema import Schema

    rb = pa.record_batch({"y": ["1", "0"], "a": ["p", "q"], "bag": pa.array([[1, 2], [3]])})
    with pytest.raises(ConfigError, match=r"column 'bag' holds list<item: int64> values"):
        Featurizer(Schema(labels=["y"], sparse=[{"name": "a"}]), keys=["bag"])(rb)
    kept = Featurizer(Schema(labels=["y"], sparse=[{"name": "a"}]), keys=["a"])(rb).to_batch().keys
    assert kept is not None and kept["a"].tolist() == ["p", "q"]  # a feature column may be a key column too


def test_batches_not_from_a_loader_must_carry_the_columns(tmp_path):
    from ember.train.builder import build_components
    from ember.train.config import EvalConfig
    from ember.train.evaluate import evaluate

    cfg = load(_config(tmp_path, {}))
    parts = build_components(cfg, announce=False)
    batches = list(make_batches(cfg.data, cfg.schema, "eval", keys=["user_id"]))
    assert batches[0].keys is not None and batches[0].keys["user_id"].shape == (batches[0].size,)
    m = evaluate(parts, batches, config=EvalConfig(group_by="user_id"))
    assert math.isfinite(m["gauc/y"])
    plain = list(make_batches(cfg.data, cfg.schema, "eval"))
    with pytest.raises(ConfigError, match=r"do not carry them"):
        evaluate(parts, plain, config=EvalConfig(group_by="user_id"))


def test_key_columns_survive_slicing_and_device_moves():
    sparse = SparseFeatures(["a"], torch.tensor([1, 2, 3]), torch.tensor([1, 1, 1]))
    b = Batch(torch.zeros(3, 1), sparse, torch.zeros(3, 1), keys={"u": np.array(["x", "y", "z"], dtype=object)})
    assert b.slice_rows(1, 3).keys["u"].tolist() == ["y", "z"]
    assert b.to("cpu").keys is b.keys


def test_eval_config_rejects_a_slice_listed_twice():
    from ember.train.config import EvalConfig

    with pytest.raises(ValueError, match="twice"):
        EvalConfig(slices=["country", "country"])
    assert EvalConfig(group_by="u", slices=["c", "u"]).key_columns == ["u", "c"]


@pytest.mark.dist
@pytest.mark.slow
def test_two_ranks_gather_the_key_columns_and_report_what_one_process_does(tmp_path):
    """Distributed eval scores each rank's slice of every eval batch; the key columns are
    gathered with the predictions, so GAUC and slices are of all rows, as in one process."""
    from tests.distributed.ranks import run_ranks, train_config  # spawned ranks: the launch is not under test

    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump({
        "data": {"preset": "synthetic", "batch_size": 24,
                 "synthetic": {"num_dense": 2, "num_sparse": 3, "rows": 96, "eval_rows": 90, "vocab_size": 12}},
        "embedding": {"dim": 4}, "model": {"type": "dlrm", "bottom_mlp": [4], "top_mlp": [4]},
        "train": {"progress": False, "precision": "fp32", "threads": 1, "out_dir": str(tmp_path / "runs")},
        "pipeline": {"enabled": False},
        "eval": {"group_by": "C1", "slices": ["C2"], "slice_top": 3},
    }))
    one = train(load(path, ["train.run_name=one"])).metrics
    run_ranks(train_config, 2, (path, ["train.run_name=two"]), timeout=240)
    two = _strict((tmp_path / "runs" / "two" / "summary.json").read_text())
    keys = [k for k in one if k.startswith(("gauc", "rows/", "auc/label/", "ece/label/"))]
    assert len(keys) >= 10 and one["rows"] == two["rows"] == 90
    for k in keys:
        assert two[k] == pytest.approx(one[k], abs=1e-6), k


def test_train_prints_counts_whole_and_undefined_metrics_said_so():
    from ember.cli import _metric

    assert _metric("gauc_groups_skipped/y", 3.0) == "3" and _metric("rows/country=US", 120.0) == "120"
    assert _metric("gauc/y/country=US", 0.71234) == "0.7123"
    assert _metric("ne/y", float("nan")) == "nan (undefined: see the warning above)"
