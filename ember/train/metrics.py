"""Evaluation metrics: ROC AUC (ties handled by average ranks) and log loss, per task.

AUC is undefined when the labels hold one class only (no positive/negative pair to rank): it
is then NaN in the metrics (``null`` in JSON files, see :func:`json_safe`), with a warning naming
the task, once per task and process; logloss is still reported.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import numpy as np

from ember import once

__all__ = ["auc", "logloss", "evaluate_predictions", "json_safe"]

log = logging.getLogger("ember")


def auc(labels: np.ndarray, scores: np.ndarray) -> float:
    """ROC AUC by the rank-sum (Mann-Whitney) formula; NaN when only one class is present
    (undefined: ``evaluate_predictions`` warns about it).

    Example:
        >>> auc(np.array([0, 0, 1, 1]), np.array([0.1, 0.4, 0.35, 0.8]))
        0.75
    """
    labels = np.asarray(labels, dtype=np.float64).ravel()
    scores = np.asarray(scores, dtype=np.float64).ravel()
    pos = labels > 0.5
    n_pos, n_neg = int(pos.sum()), int((~pos).sum())
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    order = np.argsort(scores, kind="mergesort")
    sorted_scores = scores[order]
    # average rank of each run of tied scores
    boundaries = np.flatnonzero(np.diff(sorted_scores)) + 1
    starts = np.concatenate([[0], boundaries])
    ends = np.concatenate([boundaries, [scores.size]])
    avg_rank = (starts + ends + 1) / 2.0  # 1-based ranks
    ranks = np.empty(scores.size)
    ranks[order] = np.repeat(avg_rank, ends - starts)
    return float((ranks[pos].sum() - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg))


def logloss(labels: np.ndarray, probs: np.ndarray, eps: float = 1e-7) -> float:
    """Mean binary cross-entropy of probabilities ``probs`` (clipped to [eps, 1-eps]).

    Example:
        >>> round(logloss(np.array([1, 0]), np.array([0.9, 0.2])), 4)
        0.1643
    """
    y = np.asarray(labels, dtype=np.float64).ravel()
    p = np.clip(np.asarray(probs, dtype=np.float64).ravel(), eps, 1 - eps)
    return float(-(y * np.log(p) + (1 - y) * np.log(1 - p)).mean())


def evaluate_predictions(labels: np.ndarray, probs: np.ndarray, task_names: list[str]) -> dict[str, float]:
    """AUC and logloss per task: keys ``auc/<task>`` and ``logloss/<task>`` (labels, probs: [N, T])."""
    out: dict[str, float] = {}
    for t, name in enumerate(task_names):
        out[f"auc/{name}"] = auc(labels[:, t], probs[:, t])
        out[f"logloss/{name}"] = logloss(labels[:, t], probs[:, t])
        if math.isnan(out[f"auc/{name}"]) and len(labels):
            _warn_one_class(name, labels[:, t])
    return out


def _warn_one_class(task: str, labels: np.ndarray) -> None:
    """Say once per task why its AUC is NaN: every eval label is of one class."""
    if not once.first("metrics.one_class", task):
        return
    cls = "positive (1)" if bool((labels > 0.5).all()) else "negative (0)"
    log.warning("eval task '%s': AUC is undefined (recorded as NaN / null): all %d eval labels are %s, so no "
                "positive/negative pair can be ranked; logloss is still reported. Evaluate on data with both "
                "classes for an AUC", task, len(labels), cls)


def json_safe(metrics: dict[str, Any]) -> dict[str, Any]:
    """``metrics`` with NaN / infinite floats as None, so JSON files hold ``null`` (valid JSON)
    instead of ``NaN``, which strict JSON readers reject.

    Example:
        >>> json_safe({"auc/y": float("nan"), "logloss/y": 0.5, "rows": 3.0})
        {'auc/y': None, 'logloss/y': 0.5, 'rows': 3.0}
    """
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in metrics.items()}
