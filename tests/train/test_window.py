"""RollingWindow: the ring buffer holds exactly the last `rows` pairs whatever the batch sizes
(smaller, equal or larger than the window, wrapping), and its metrics are the reference
metrics of those pairs."""

from __future__ import annotations

import numpy as np
import pytest

from ember.train.metrics import auc, logloss
from ember.train.window import RollingWindow


@pytest.mark.parametrize("rows", [1, 7, 64])
def test_window_holds_exactly_the_last_rows_pairs(rows):
    rng = np.random.default_rng(rows)
    w = RollingWindow(rows, ["a", "b"])
    assert w.metrics() == {}
    probs, labels = np.zeros((0, 2), np.float32), np.zeros((0, 2), np.float32)
    for size in [3, 1, 64, 5, 130, 7, 7, 2]:
        p = rng.random((size, 2)).astype(np.float32)
        y = (rng.random((size, 2)) < 0.4).astype(np.float32)
        w.add(p, y)
        probs, labels = np.concatenate([probs, p]), np.concatenate([labels, y])
        got_p, got_y = w.pairs()
        np.testing.assert_array_equal(got_p, probs[-rows:])
        np.testing.assert_array_equal(got_y, labels[-rows:])
    m = w.metrics()
    assert m["window_rows"] == rows
    for t, name in enumerate(["a", "b"]):
        np.testing.assert_equal(m[f"auc/{name}"], auc(labels[-rows:, t], probs[-rows:, t]))  # NaN for one row
        assert m[f"logloss/{name}"] == pytest.approx(logloss(labels[-rows:, t], probs[-rows:, t]), abs=1e-12)


def test_window_rows_must_be_positive():
    with pytest.raises(ValueError, match="window rows must be >= 1"):
        RollingWindow(0, ["y"])


def test_key_columns_wrap_with_their_rows_and_the_report_is_evals():
    from ember.train.config import EvalConfig
    from ember.train.ranking_metrics import ranking_report
    from ember.train.metrics import evaluate_predictions

    rng = np.random.default_rng(3)
    config = EvalConfig(group_by="user", slices=["country"], slice_top=2, calibration_bins=4)
    w = RollingWindow(50, ["y"], config)
    p_all, y_all, u_all, c_all = [], [], [], []
    for size in [7, 30, 64, 5, 21]:
        p = rng.random((size, 1)).astype(np.float32)
        y = (rng.random((size, 1)) < 0.4).astype(np.float32)
        u = rng.integers(0, 6, size)
        c = rng.choice(["US", "DE", "FR", None], size)
        w.add(p, y, keys={"user": u, "country": c})
        p_all.append(p), y_all.append(y), u_all.append(u), c_all.append(c)
    p, y = np.concatenate(p_all)[-50:], np.concatenate(y_all)[-50:]
    u, c = np.concatenate(u_all)[-50:], np.concatenate(c_all)[-50:]
    _, _, _, keys = w.tagged()
    assert keys["user"].tolist() == u.tolist() and keys["country"].tolist() == c.tolist()
    want = {**evaluate_predictions(y, p, ["y"]),
            **ranking_report(y, p, ["y"], {"user": u, "country": c}, "user", bins=4, slices=["country"], slice_top=2),
            "window_rows": 50}
    got = w.metrics()
    assert got.keys() == want.keys()
    for k in want:
        np.testing.assert_equal(got[k], want[k])
    with pytest.raises(Exception, match="column 'user', which the training batches do not carry"):
        w.add(p[:2], y[:2], keys={"country": c[:2]})


def test_ranks_windows_merged_equal_one_window_with_keys():
    from ember.train.config import EvalConfig
    from ember.train.window import merged

    rng = np.random.default_rng(5)
    config = EvalConfig(group_by="g")
    one, ranks = RollingWindow(40, ["y"], config), [RollingWindow(40, ["y"], config) for _ in range(2)]
    for step in range(6):
        for r, w in enumerate(ranks):  # a global batch of 16 rows: rank r holds slice r
            p = rng.random((8, 1)).astype(np.float32)
            y = (rng.random((8, 1)) < 0.5).astype(np.float32)
            g = rng.integers(0, 3, 8)
            w.add(p, y, step, {"g": g})
            one.add(p, y, step, {"g": g})
    both = merged([w.tagged() for w in ranks], 40, ["y"], config)
    assert both == one.metrics() and "gauc/y" in both
