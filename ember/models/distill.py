"""Teacher distillation with an auxiliary head and a student adapter (ExFM-style).

A large teacher's scores (a column of probabilities in the data, ``schema.teacher``) supervise
a smaller, served student. Plain distillation adds ``BCE(student, teacher)`` to the student's
own loss on the true labels, so the teacher's bias and staleness flow straight into the served
scores. With ``aux_head`` (the default) the student grows a second head per task that shares
the whole body: the *serving* head learns from the true labels only, the *auxiliary* head from
the teacher; the body learns from both, the served scores stay calibrated to the labels.
With ``adapter`` a small model (a per-task affine map of the teacher's logit plus a linear term
over the dense features) learns from the true labels to correct the teacher's scores before they
supervise the student, which helps when the teacher was trained on older data.

Serving and evaluation see only the serving head: in eval mode (and in exports) the model
outputs ``[B, T]``; in training mode it outputs ``[B, 2T]`` (serving, then auxiliary) when it has
an auxiliary head. ``distill_loss`` turns those logits, the labels and the teacher's scores into
the training loss.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import Tensor, nn

from ember.config_base import ConfigModel

__all__ = ["DistillConfig", "Distilled", "distill_loss"]

_EPS = 1e-6


class DistillConfig(ConfigModel):
    """``model.distill``: learn from a teacher's scores (``schema.teacher`` columns).

    Example:
        >>> DistillConfig().aux_head, DistillConfig(adapter=True).teacher_weight
        (True, 1.0)
    """

    teacher_weight: float = Field(1.0, ge=0)
    """Weight of the teacher's loss (on the auxiliary head, or on the serving head without one)."""
    label_weight: float = Field(1.0, ge=0)
    """Weight of the true labels' loss on the serving head."""
    aux_head: bool = True
    """A second head per task for the teacher (shares the body); False: plain distillation."""
    adapter: bool = False
    """Correct the teacher's scores with a small model trained on the true labels first."""


class _Adapter(nn.Module):
    """Teacher logit -> corrected logit, per task: ``a * logit + b + dense @ w``."""

    def __init__(self, num_dense: int, num_tasks: int) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.ones(num_tasks))
        self.bias = nn.Parameter(torch.zeros(num_tasks))
        self.dense = nn.Linear(num_dense, num_tasks, bias=False) if num_dense else None
        if self.dense is not None:
            nn.init.zeros_(self.dense.weight)

    def forward(self, teacher_logit: Tensor, dense: Tensor) -> Tensor:
        out = teacher_logit * self.scale + self.bias
        if self.dense is not None:
            out = out + self.dense(dense)
        return out


class Distilled(nn.Module):
    """A student model with its serving head, optional auxiliary head and adapter.

    ``body`` is any zoo model built for ``2T`` tasks (``aux_head``) or ``T``: with an auxiliary
    head its last layer's first ``T`` outputs are the serving head, the next ``T`` the auxiliary
    one, so the two heads share everything below. ``forward`` gives ``[B, 2T]`` in training mode
    (with an auxiliary head) and the serving ``[B, T]`` otherwise.
    """

    def __init__(self, body: nn.Module, config: DistillConfig, num_tasks: int, num_dense: int) -> None:
        super().__init__()
        self.body = body
        self.num_tasks = num_tasks
        self.aux_head = config.aux_head
        self.wants_linear = bool(getattr(body, "wants_linear", False))
        self.adapter = _Adapter(num_dense, num_tasks) if config.adapter else None

    def forward(self, dense: Tensor, pooled: list[Tensor], linear: Optional[list[Tensor]] = None) -> Tensor:
        logits = self.body(dense, pooled, linear)
        if self.aux_head and not self.training:
            return logits[:, : self.num_tasks]
        return logits


def distill_loss(model: Distilled, logits: Tensor, labels: Tensor, teacher: Tensor | None, dense: Tensor,
                 config: DistillConfig, task_weights: Tensor | None = None, rows: int | None = None) -> Tensor:
    """The student's training loss from ``logits`` (``model`` in training mode), the true
    ``labels`` [B, T] and the teacher's probabilities ``teacher`` [B, T].

    ``label_weight * BCE(serving, labels) + teacher_weight * BCE(aux or serving, target)``, summed
    over tasks (each weighted by ``task_weights``), where ``target`` is the teacher's score, or
    with an adapter its corrected score (detached); the adapter adds ``BCE(adapter, labels)``.
    ``rows``: the means' denominator when the B rows are a rank's slice of a larger batch (as
    in ``multitask_bce``): the ranks' losses then sum to the one-process loss.
    """
    if teacher is None:
        raise ValueError("model.distill needs the teacher's scores: set schema.teacher to their columns")
    t = model.num_tasks
    serving = logits[:, :t]
    student = logits[:, t : 2 * t] if model.aux_head else serving
    target = teacher

    def mean(per_row: Tensor) -> Tensor:
        return per_row.mean(0) if rows is None or rows == per_row.shape[0] else per_row.sum(0) / rows

    per_task = config.label_weight * mean(F.binary_cross_entropy_with_logits(serving, labels, reduction="none"))
    if model.adapter is not None:
        teacher_logit = torch.logit(teacher.clamp(_EPS, 1 - _EPS))
        corrected = model.adapter(teacher_logit, dense)
        per_task = per_task + mean(F.binary_cross_entropy_with_logits(corrected, labels, reduction="none"))
        target = torch.sigmoid(corrected).detach()
    per_task = per_task + config.teacher_weight * mean(F.binary_cross_entropy_with_logits(
        student, target, reduction="none"))
    if task_weights is not None:
        per_task = per_task * task_weights
    return per_task.sum()
