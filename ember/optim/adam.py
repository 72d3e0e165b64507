"""Lazy Adam: moments and bias correction advance only for rows a batch touched."""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field
from torch import Tensor

from ember.config_base import ConfigModel
from ember.optim.schedule import ScheduleConfig

__all__ = ["Adam"]

_BETAS: dict[tuple[float, float, torch.device], Tensor] = {}


def _betas(b1: float, b2: float, device: torch.device) -> Tensor:
    """The tensor [b1, b2] on ``device``, made once (not a copy to the device every step)."""
    key = (b1, b2, device)
    if key not in _BETAS:
        _BETAS[key] = torch.tensor([b1, b2], device=device)
    return _BETAS[key]


class Adam(ConfigModel):
    """Adam with a per-row step count ``t`` (stored in the row's state), as torch.optim.Adam per row.

    On each touch: ``t <- t + 1``; ``m <- b1*m + (1-b1)*g``; ``v <- b2*v + (1-b2)*g*g``;
    ``w <- w - (lr / (1 - b1^t)) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)``.
    State per row: m (D), v (D), t (1). Untouched rows keep w, m, v and t unchanged (lazy).

    Example:
        >>> Adam(lr=1e-3).state_dim(16)
        33
    """

    type: Literal["adam"] = "adam"
    """`adam`: lazy Adam with a per-row step count (2D + 1 state floats per row)."""
    lr: float = Field(1e-3, gt=0)
    """Learning rate."""
    beta1: float = Field(0.9, ge=0, lt=1)
    """Decay of the first-moment estimate."""
    beta2: float = Field(0.999, ge=0, lt=1)
    """Decay of the second-moment estimate."""
    eps: float = Field(1e-8, ge=0)
    """Added to the root of the second moment before dividing."""
    schedule: ScheduleConfig | None = None
    """Learning-rate warmup and decay over the global step."""

    def state_dim(self, dim: int) -> int:
        return 2 * dim + 1

    def init_state(self, rows: Tensor) -> Tensor:
        return rows.new_zeros(rows.shape[0], 2 * rows.shape[1] + 1)

    def constant_state(self, dim: int) -> list[float] | None:
        return [0.0] * (2 * dim + 1)

    def update(self, rows: Tensor, state: Tensor, grads: Tensor, step: int, lr: float | None = None) -> tuple[Tensor, Tensor]:
        lr = self.lr if lr is None else lr  # the scheduled rate of this step, when there is a schedule
        d = rows.shape[1]
        m, v, t = state[:, :d], state[:, d : 2 * d], state[:, 2 * d :]
        # 11 tensor operations whatever the rows (a GPU step's budget: ember.tiers.device_budget)
        t.add_(1.0)
        m.lerp_(grads, 1 - self.beta1)  # b1*m + (1-b1)*g
        v.mul_(self.beta2).addcmul_(grads, grads, value=1 - self.beta2)
        # both bias corrections in one power: [1 - b1^t, 1 - b2^t]; t is a float count, exact
        # for t < 2**24, i.e. 16 M touches of one row
        c = torch.rsub(torch.pow(_betas(self.beta1, self.beta2, rows.device), t), 1.0)
        denom = v.div(c[:, 1:]).sqrt_().add_(self.eps)  # sqrt(v / (1 - b2^t)) + eps
        rows.addcdiv_(m, denom.mul_(c[:, :1]), value=-lr)
        return rows, state
