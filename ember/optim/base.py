"""Update-rule protocol: a declared state width plus a pure row-wise update (what a table's
``optimizer`` config is; ``ember.embedding.SparseOptimizer`` applies it to a batch's rows)."""

from __future__ import annotations

from typing import Protocol

from torch import Tensor

__all__ = ["UpdateRule"]


class UpdateRule(Protocol):
    """Updates only the rows a batch touched; state lives beside each row in its record.

    ``update`` receives freshly gathered copies of the unique rows of one batch, their state and
    their summed gradients; it may modify them in place and returns the new (rows, state).
    ``lr``: the learning rate of this step when the rule has a ``schedule`` (None: its ``lr``).
    """

    type: str

    def state_dim(self, dim: int) -> int: ...

    def init_state(self, rows: Tensor) -> Tensor: ...

    def constant_state(self, dim: int) -> list[float] | None:
        """A new row's state when it does not depend on the row's weights (what ``init_state``
        gives every row), else None: lets new rows be written in one native pass."""
        ...

    def update(self, rows: Tensor, state: Tensor, grads: Tensor, step: int, lr: float | None = None) -> tuple[Tensor, Tensor]: ...
