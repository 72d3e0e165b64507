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
