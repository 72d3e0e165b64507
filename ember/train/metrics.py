"""Evaluation metrics: ROC AUC (ties handled by average ranks) and log loss, per task."""

from __future__ import annotations

import numpy as np

__all__ = ["auc", "logloss", "evaluate_predictions"]


def auc(labels: np.ndarray, scores: np.ndarray) -> float:
    """ROC AUC by the rank-sum (Mann-Whitney) formula; NaN when only one class is present.

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
    return out
