"""Loss: binary cross-entropy per task, weighted sum over tasks."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["multitask_bce"]


def multitask_bce(logits: Tensor, labels: Tensor, task_weights: Tensor | None = None, rows: int | None = None) -> Tensor:
    """Sum over tasks of (weight x mean BCE-with-logits). logits, labels: [B, T].

    ``rows``: the mean's denominator when the B rows are part of a larger batch (a rank's slice
    of the global batch): the loss is then their share of the global mean, and the ranks'
    losses (and gradients) sum to the one-process figure.

    Example:
        >>> round(multitask_bce(torch.zeros(2, 1), torch.tensor([[1.0], [0.0]])).item(), 4)
        0.6931
    """
    per_row = F.binary_cross_entropy_with_logits(logits, labels, reduction="none")
    per_task = per_row.mean(dim=0) if rows is None or rows == per_row.shape[0] else per_row.sum(dim=0) / rows
    if task_weights is not None:
        per_task = per_task * task_weights
    return per_task.sum()
