"""Adagrad, element-wise and row-wise."""

from __future__ import annotations

from typing import Literal

from pydantic import Field
from torch import Tensor

from ember import _native
from ember.config_base import ConfigModel
from ember.optim.schedule import ScheduleConfig

__all__ = ["Adagrad", "RowWiseAdagrad"]


class _AdagradFamily(ConfigModel):
    """The settings both Adagrads share: step size, epsilon, the accumulator's start."""

    lr: float = Field(0.01, gt=0)
    """Learning rate."""
    eps: float = Field(1e-10, ge=0)
    """Added to the root of the accumulator before dividing."""
    initial_accumulator_value: float = Field(0.0, ge=0)
    """Starting value of the squared-gradient accumulator."""
    schedule: ScheduleConfig | None = None
    """Learning-rate warmup and decay over the global step."""


class Adagrad(_AdagradFamily):
    """Element-wise Adagrad, as ``torch.optim.Adagrad`` (no lr decay, no weight decay).

    ``G <- G + g*g``;  ``w <- w - lr * g / (sqrt(G) + eps)``.  State: G, one value per weight.

    Example:
        >>> Adagrad(lr=0.05).state_dim(16)
        16
    """

    type: Literal["adagrad"] = "adagrad"
    """`adagrad`: one accumulator per weight (D state floats per row)."""

    def state_dim(self, dim: int) -> int:
        return dim

    def init_state(self, rows: Tensor) -> Tensor:
        return rows.new_full(rows.shape, self.initial_accumulator_value)

    def constant_state(self, dim: int) -> list[float] | None:
        return [self.initial_accumulator_value] * dim

    def update(self, rows: Tensor, state: Tensor, grads: Tensor, step: int, lr: float | None = None) -> tuple[Tensor, Tensor]:
        lr = self.lr if lr is None else lr  # the scheduled rate of this step, when there is a schedule
        state.addcmul_(grads, grads)
        rows.addcdiv_(grads, state.sqrt().add_(self.eps), value=-lr)
        return rows, state


class RowWiseAdagrad(_AdagradFamily):
    """Row-wise Adagrad (one accumulator per row, as FBGEMM's ROWWISE_ADAGRAD).

    ``G <- G + mean_j(g_j^2)``;  ``w <- w - lr * g / (sqrt(G) + eps)``.  State: 1 value per row,
    so a dim-16 row costs 17 floats instead of 32.

    Example:
        >>> RowWiseAdagrad(lr=0.05).state_dim(16)
        1
    """

    type: Literal["rowwise_adagrad"] = "rowwise_adagrad"
    """`rowwise_adagrad`: one accumulator per row (1 state float per row)."""

    def state_dim(self, dim: int) -> int:
        return 1

    def init_state(self, rows: Tensor) -> Tensor:
        return rows.new_full((rows.shape[0], 1), self.initial_accumulator_value)

    def constant_state(self, dim: int) -> list[float] | None:
        return [self.initial_accumulator_value]

    def update(self, rows: Tensor, state: Tensor, grads: Tensor, step: int, lr: float | None = None) -> tuple[Tensor, Tensor]:
        lr = self.lr if lr is None else lr  # the scheduled rate of this step, when there is a schedule
        if _native.rowwise_adagrad_(rows, state, grads, lr, self.eps):  # one pass per row
            return rows, state
        state.add_(grads.square().mean(dim=1, keepdim=True))
        rows.addcdiv_(grads, state.sqrt().add_(self.eps), value=-lr)
        return rows, state
