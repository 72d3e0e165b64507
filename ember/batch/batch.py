"""The in-memory contract between the data side and the model side."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from ember.batch.sparse import SparseFeatures

__all__ = ["Batch"]


@dataclass(frozen=True)
class Batch:
    """One mini-batch: ``dense`` [B, Dd] float32, ``sparse`` jagged IDs, ``labels`` [B, T] float32,
    ``teacher`` [B, T] float32 a teacher's scores (``schema.teacher``) or None.

    Examples:
        >>> sparse = SparseFeatures(["a"], torch.tensor([3, 4, 5]), torch.tensor([2, 1]))
        >>> b = Batch(torch.zeros(2, 1), sparse, torch.tensor([[1.0], [0.0]]))
        >>> b.size, b.slice_rows(1, 2).labels.tolist()
        (2, [[0.0]])
    """

    dense: Tensor
    sparse: SparseFeatures
    labels: Tensor
    teacher: Tensor | None = None

    @property
    def size(self) -> int:
        return int(self.labels.shape[0])

    def slice_rows(self, start: int, stop: int) -> "Batch":
        """Rows ``start .. stop-1`` of the batch (dense, sparse and labels)."""
        return Batch(self.dense[start:stop], self.sparse.slice_rows(start, stop), self.labels[start:stop])

    def to(self, device: torch.device | str, non_blocking: bool = False) -> "Batch":
        return Batch(
            self.dense.to(device, non_blocking=non_blocking),
            self.sparse.to(device, non_blocking=non_blocking),
            self.labels.to(device, non_blocking=non_blocking),
            None if self.teacher is None else self.teacher.to(device, non_blocking=non_blocking),
        )

    def pin_memory(self) -> "Batch":
        return Batch(self.dense.pin_memory(), self.sparse.pin_memory(), self.labels.pin_memory(),
                     None if self.teacher is None else self.teacher.pin_memory())
