"""Rolling evaluation by progressive validation (``eval.window_rows``).

The training forward scores every batch before that batch's update, so its scores are honest
out-of-sample predictions (the model has not yet learned from those rows), the standard
online-learning metric (McMahan et al., "Ad Click Prediction: a View from the Trenches", 2013).
``RollingWindow`` keeps the last ``rows`` (probability, label) pairs per task in a ring buffer
and reports over them what held-out evaluation reports (``ember.train.ranking_metrics``): AUC,
logloss, calibration, ECE and NE per task, with ``eval.group_by`` GAUC and with ``eval.slices``
every metric per slice value (the window then also keeps each row's key columns, which the
training batches carry). No extra forward, no held-out data, and it follows the stream (the
window holds the most recent rows only).

Distributed, each rank's window holds its own slices' pairs, each tagged with its step;
``merged`` puts every rank's window together at report time (one gather, not one per step):
ordered by step, then rank (a global batch's slices in rank order), its last ``rows`` pairs
are the ones one process's window holds after the same global batches.

Example:
    >>> import numpy as np
    >>> w = RollingWindow(3, ["y"])
    >>> w.add(np.array([[0.875], [0.25]]), np.array([[1.0], [0.0]]))
    >>> w.add(np.array([[0.375], [0.625]]), np.array([[0.0], [1.0]]))  # the first pair leaves
    >>> w.pairs()[0].ravel().tolist(), w.metrics()["window_rows"], w.metrics()["auc/y"]
    ([0.25, 0.375, 0.625], 3, 1.0)
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from ember.errors import ConfigError
from ember.train.config import EvalConfig
from ember.train.metrics import evaluate_predictions
from ember.train.ranking_metrics import ranking_report

__all__ = ["RollingWindow", "merged"]

Tagged = tuple[np.ndarray, np.ndarray, np.ndarray, dict[str, np.ndarray]]  # probs, labels, steps, key columns


class RollingWindow:
    """The most recent ``rows`` (probability, label) pairs of ``tasks`` (ring buffers of
    float32 [rows, T]: 8 bytes per row and task, and the step of each pair: 8 bytes), and with
    ``config``'s ``group_by`` / ``slices`` each row's value of those columns (a reference per row
    and column). ``config`` (default: ``EvalConfig()``) says what is reported, as for eval.
    ``add`` may run on a pipeline thread while ``metrics`` runs on the trainer's (a lock)."""

    def __init__(self, rows: int, tasks: list[str], config: EvalConfig | None = None) -> None:
        if rows < 1:
            raise ValueError(f"window rows must be >= 1, got {rows}")
        self.rows, self.tasks, self.config = rows, list(tasks), config or EvalConfig()
        self._probs = np.zeros((rows, len(tasks)), np.float32)
        self._labels = np.zeros((rows, len(tasks)), np.float32)
        self._steps = np.zeros(rows, np.int64)
        self._keys = {k: np.empty(rows, object) for k in self.config.key_columns}
        self._next = 0  # where the next pair goes
        self._filled = 0
        self._lock = threading.Lock()

    def add(self, probs: np.ndarray, labels: np.ndarray, step: int = 0,
            keys: dict[str, np.ndarray] | None = None) -> None:
        """Append a batch's pairs (probs, labels: [B, T]) of ``step``, with its rows' key columns
        (``Batch.keys``) when the window groups or slices; the oldest leave once the window is full."""
        probs = np.asarray(probs, np.float32).reshape(-1, len(self.tasks))[-self.rows:]
        labels = np.asarray(labels, np.float32).reshape(-1, len(self.tasks))[-self.rows:]
        n = len(probs)
        columns = {}
        for k in self._keys:
            if keys is None or k not in keys:
                raise ConfigError(f"the rolling window (eval.window_rows) reports by eval.group_by / eval.slices "
                                  f"column '{k}', which the training batches do not carry (they hold "
                                  f"{sorted(keys or {})}): train from data files holding it, or give batches with "
                                  f"Batch.keys['{k}']")
            columns[k] = np.asarray(keys[k], object).reshape(-1)[-self.rows:]
        with self._lock:
            first = min(n, self.rows - self._next)  # up to the buffer's end, then wrap to its start
            for buf, new in [(self._probs, probs), (self._labels, labels),
                             *((self._keys[k], v) for k, v in columns.items())]:
                buf[self._next:self._next + first] = new[:first]
                buf[:n - first] = new[first:]
            self._steps[self._next:self._next + first] = step
            self._steps[:n - first] = step
            self._next = (self._next + n) % self.rows
            self._filled = min(self.rows, self._filled + n)

    def pairs(self) -> tuple[np.ndarray, np.ndarray]:
        """(probs, labels) of the window, oldest first, both [n, T]."""
        probs, labels, _, _ = self.tagged()
        return probs, labels

    def tagged(self) -> Tagged:
        """(probs, labels, steps [n], key columns {name: [n]}) of the window, oldest first."""
        with self._lock:
            if self._filled < self.rows:
                order = np.arange(self._filled)
            else:
                order = np.r_[self._next:self.rows, 0:self._next]
            return (self._probs[order], self._labels[order], self._steps[order],
                    {k: v[order] for k, v in self._keys.items()})

    def metrics(self) -> dict[str, Any]:
        """Over the window: ``auc/<task>``, ``logloss/<task>``, ``calibration/<task>``,
        ``ece/<task>``, ``ne/<task>`` (GAUC and per-slice metrics as ``config`` asks), and
        ``window_rows`` (the pairs it holds, fewer than ``rows`` until it fills); empty before
        the first batch."""
        probs, labels, _, keys = self.tagged()
        return _metrics(probs, labels, keys, self.tasks, self.config)


def merged(windows: list[Tagged], rows: int, tasks: list[str], config: EvalConfig | None = None) -> dict[str, Any]:
    """``RollingWindow.metrics`` of the window that holds every rank's pairs: ``windows`` are
    the ranks' ``tagged()`` in rank order; the last ``rows`` pairs by (step, rank, order)."""
    probs = np.concatenate([w[0] for w in windows])
    labels = np.concatenate([w[1] for w in windows])
    order = np.argsort(np.concatenate([w[2] for w in windows]), kind="stable")[-rows:]
    keys = {k: np.concatenate([w[3][k] for w in windows])[order] for k in windows[0][3]}
    return _metrics(probs[order], labels[order], keys, tasks, config or EvalConfig())


def _metrics(probs: np.ndarray, labels: np.ndarray, keys: dict[str, np.ndarray], tasks: list[str],
             config: EvalConfig) -> dict[str, Any]:
    if not len(probs):
        return {}
    out = evaluate_predictions(labels, probs, tasks)
    out.update(ranking_report(labels, probs, tasks, keys, config.group_by, config.gauc_weight, config.calibration_bins,
                              config.slices, config.slice_top))
    out["window_rows"] = len(probs)
    return out
