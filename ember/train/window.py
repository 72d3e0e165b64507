"""Rolling evaluation by progressive validation (``eval.window_rows``).

The training forward scores every batch before that batch's update, so its scores are honest
out-of-sample predictions (the model has not yet learned from those rows), the standard
online-learning metric (McMahan et al., "Ad Click Prediction: a View from the Trenches", 2013).
``RollingWindow`` keeps the last ``rows`` (probability, label) pairs per task in a ring buffer
and reports AUC and logloss over them: no extra forward, no held-out data, and it follows the
stream (the window holds the most recent rows only).

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

from ember.train.metrics import evaluate_predictions

__all__ = ["RollingWindow", "merged"]


class RollingWindow:
    """The most recent ``rows`` (probability, label) pairs of ``tasks`` (ring buffers of
    float32 [rows, T]: 8 bytes per row and task, and the step of each pair: 8 bytes). ``add``
    may run on a pipeline thread while ``metrics`` runs on the trainer's (a lock)."""

    def __init__(self, rows: int, tasks: list[str]) -> None:
        if rows < 1:
            raise ValueError(f"window rows must be >= 1, got {rows}")
        self.rows, self.tasks = rows, list(tasks)
        self._probs = np.zeros((rows, len(tasks)), np.float32)
        self._labels = np.zeros((rows, len(tasks)), np.float32)
        self._steps = np.zeros(rows, np.int64)
        self._next = 0  # where the next pair goes
        self._filled = 0
        self._lock = threading.Lock()

    def add(self, probs: np.ndarray, labels: np.ndarray, step: int = 0) -> None:
        """Append a batch's pairs (probs, labels: [B, T]) of ``step``; the oldest leave once the
        window is full."""
        probs = np.asarray(probs, np.float32).reshape(-1, len(self.tasks))[-self.rows:]
        labels = np.asarray(labels, np.float32).reshape(-1, len(self.tasks))[-self.rows:]
        n = len(probs)
        with self._lock:
            first = min(n, self.rows - self._next)  # up to the buffer's end, then wrap to its start
            self._probs[self._next:self._next + first] = probs[:first]
            self._labels[self._next:self._next + first] = labels[:first]
            self._probs[:n - first] = probs[first:]
            self._labels[:n - first] = labels[first:]
            self._steps[self._next:self._next + first] = step
            self._steps[:n - first] = step
            self._next = (self._next + n) % self.rows
            self._filled = min(self.rows, self._filled + n)

    def pairs(self) -> tuple[np.ndarray, np.ndarray]:
        """(probs, labels) of the window, oldest first, both [n, T]."""
        probs, labels, _ = self.tagged()
        return probs, labels

    def tagged(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(probs, labels, steps [n]) of the window, oldest first."""
        with self._lock:
            if self._filled < self.rows:
                n = self._filled
                return self._probs[:n].copy(), self._labels[:n].copy(), self._steps[:n].copy()
            order = np.r_[self._next:self.rows, 0:self._next]
            return self._probs[order], self._labels[order], self._steps[order]

    def metrics(self) -> dict[str, Any]:
        """``auc/<task>`` and ``logloss/<task>`` over the window, and ``window_rows`` (the pairs
        it holds, fewer than ``rows`` until it fills); empty before the first batch."""
        return _metrics(*self.pairs(), self.tasks)


def merged(windows: list[tuple[np.ndarray, np.ndarray, np.ndarray]], rows: int, tasks: list[str]) -> dict[str, Any]:
    """``RollingWindow.metrics`` of the window that holds every rank's pairs: ``windows`` are
    the ranks' ``tagged()`` in rank order; the last ``rows`` pairs by (step, rank, order)."""
    probs = np.concatenate([w[0] for w in windows])
    labels = np.concatenate([w[1] for w in windows])
    order = np.argsort(np.concatenate([w[2] for w in windows]), kind="stable")[-rows:]
    return _metrics(probs[order], labels[order], tasks)


def _metrics(probs: np.ndarray, labels: np.ndarray, tasks: list[str]) -> dict[str, Any]:
    if not len(probs):
        return {}
    return {**evaluate_predictions(labels, probs, tasks), "window_rows": len(probs)}
