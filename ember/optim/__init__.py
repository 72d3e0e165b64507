"""Sparse update rules (SGD, Adagrad, row-wise Adagrad, Adam, FTRL): pure row-wise updates of
the unique rows of a batch, with their state stored beside each row."""

from __future__ import annotations

from typing import Annotated, Union

from pydantic import Field

from ember.optim.adagrad import Adagrad, RowWiseAdagrad
from ember.optim.adam import Adam
from ember.optim.base import UpdateRule
from ember.optim.ftrl import FTRL
from ember.optim.schedule import ScheduleConfig, scheduled_lr
from ember.optim.sgd import SGD

SparseOptimizerConfig = Annotated[
    Union[SGD, Adagrad, RowWiseAdagrad, Adam, FTRL], Field(discriminator="type")
]

__all__ = ["SGD", "Adagrad", "RowWiseAdagrad", "Adam", "FTRL", "SparseOptimizerConfig", "UpdateRule", "ScheduleConfig", "scheduled_lr", "rule_lr"]


def rule_lr(rule: SparseOptimizerConfig, step: int) -> float | None:
    """The lr ``rule`` uses at global step ``step`` (0-based) when it has a schedule, else None
    (the rule then uses its own constant ``lr``; FTRL has none)."""
    schedule = getattr(rule, "schedule", None)
    return None if schedule is None else scheduled_lr(rule.lr, schedule, step)  # type: ignore[union-attr]  # FTRL (no lr) never has a schedule
