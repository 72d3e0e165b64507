"""FTRL-proximal (McMahan et al., 2013, "Ad Click Prediction: a View from the Trenches")."""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field
from torch import Tensor

from ember.config_base import ConfigModel, removed_key

__all__ = ["FTRL"]


class FTRL(ConfigModel):
    """Per-coordinate FTRL-proximal with L1 and L2 regularisation.

    With the current weight ``w`` and gradient ``g``:
    ``sigma = (sqrt(n + g^2) - sqrt(n)) / alpha``; ``z <- z + g - sigma * w``; ``n <- n + g^2``;
    ``w <- 0 if |z| <= l1 else -(z - sign(z) * l1) / ((beta + sqrt(n)) / alpha + l2)``.
    State per row: z (D), n (D). L1 drives rarely useful coordinates to exactly zero.

    Example:
        >>> FTRL(alpha=0.05, l1=1.0).state_dim(8)
        16
    """

    type: Literal["ftrl"] = "ftrl"
    """`ftrl`: FTRL-proximal (2D state floats per row)."""
    alpha: float = Field(0.05, gt=0)
    """Learning-rate scale of the per-coordinate rate."""
    beta: float = Field(1.0, ge=0)
    """Smoothing term of the per-coordinate rate."""
    l1: float = Field(0.0, ge=0)
    """L1 regularisation strength (drives weights to exactly zero)."""
    l2: float = Field(0.0, ge=0)
    """L2 regularisation strength."""
    # FTRL's per-coordinate rate (alpha / sqrt(n)) is folded into z; changing alpha mid-run would
    # break that invariant, so a schedule is refused rather than silently ignored
    schedule: None = None
    """Not available: FTRL's per-coordinate rate already decays; setting one is an error."""

    _no_schedule = removed_key("schedule", "ftrl takes no lr schedule: its per-coordinate rate alpha / (beta + sqrt(n)) "
                               "already decays; use sgd, adagrad, rowwise_adagrad or adam for a scheduled lr")

    def state_dim(self, dim: int) -> int:
        return 2 * dim

    def constant_state(self, dim: int) -> list[float] | None:
        return None  # z depends on the initial weights (init_state)

    def init_state(self, rows: Tensor) -> Tensor:
        # z chosen so that the closed form reproduces the initial weights when l1 == 0.
        z = -rows * (self.beta / self.alpha + self.l2)
        return torch.cat([z, torch.zeros_like(rows)], dim=1)

    def update(self, rows: Tensor, state: Tensor, grads: Tensor, step: int, lr: float | None = None) -> tuple[Tensor, Tensor]:
        assert lr is None, "ftrl has no lr to schedule"
        d = rows.shape[1]
        z, n = state[:, :d], state[:, d:]
        # at most 10 tensor operations whatever the rows (a GPU step's budget: ember.tiers.device_budget)
        root = n.sqrt()
        n.addcmul_(grads, grads)
        new_root = n.sqrt()
        z.add_(grads).addcmul_(new_root - root, rows, value=-1.0 / self.alpha)  # z + g - sigma * w
        # -((beta + sqrt(n)) / alpha + l2): the weight is shrunk / denom, its sign folded in here
        denom = new_root.mul_(-1.0 / self.alpha).sub_(self.beta / self.alpha + self.l2)
        # z - sign(z) * l1 where |z| > l1, exactly 0 elsewhere: z minus z clamped to [-l1, l1]
        shrunk = z - z.clamp(-self.l1, self.l1) if self.l1 else z
        torch.div(shrunk, denom, out=rows)
        return rows, state
