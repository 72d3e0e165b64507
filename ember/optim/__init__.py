"""Sparse optimizers: pure row-wise updates applied to the unique rows of a batch."""

from __future__ import annotations

from typing import Annotated, Union

from pydantic import Field

from ember.optim.adagrad import Adagrad, RowWiseAdagrad
from ember.optim.adam import Adam
from ember.optim.base import SparseOptimizer
from ember.optim.ftrl import FTRL
from ember.optim.sgd import SGD

SparseOptimizerConfig = Annotated[
    Union[SGD, Adagrad, RowWiseAdagrad, Adam, FTRL], Field(discriminator="type")
]

__all__ = ["SGD", "Adagrad", "RowWiseAdagrad", "Adam", "FTRL", "SparseOptimizer", "SparseOptimizerConfig"]
