"""Plain SGD on the touched rows."""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field
from torch import Tensor

from ember.config_base import ConfigModel
from ember.optim.schedule import ScheduleConfig

__all__ = ["SGD"]


class SGD(ConfigModel):
    """``w <- w - lr * g`` (g: gradient summed over the row's occurrences in the batch).

    Example:
        >>> SGD(lr=0.1).state_dim(16)
        0
    """

    type: Literal["sgd"] = "sgd"
    """`sgd`: plain stochastic gradient descent, no state."""
    lr: float = Field(0.01, gt=0)
    """Learning rate."""
    schedule: ScheduleConfig | None = None
    """Learning-rate warmup and decay over the global step."""

    def state_dim(self, dim: int) -> int:
        return 0

    def init_state(self, rows: Tensor) -> Tensor:
        return rows.new_zeros(rows.shape[0], 0)

    def constant_state(self, dim: int) -> list[float] | None:
        return []

    def update(self, rows: Tensor, state: Tensor, grads: Tensor, step: int, lr: float | None = None) -> tuple[Tensor, Tensor]:
        lr = self.lr if lr is None else lr  # the scheduled rate of this step, when there is a schedule
        rows.add_(grads, alpha=-lr)
        return rows, state
