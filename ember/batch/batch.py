"""The in-memory contract between the data side and the model side."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from ember.batch.sparse import SparseFeatures

__all__ = ["Batch"]


@dataclass(frozen=True)
class Batch:
    """One mini-batch: ``dense`` [B, Dd] float32, ``sparse`` jagged IDs, ``labels`` [B, T] float32,
    ``teacher`` [B, T] float32 a teacher's scores (``schema.teacher``) or None; ``keys``: raw
    columns carried beside the features, column -> [B] numpy values (what eval groups and
    slices by, ``eval.group_by`` / ``eval.slices``, and ``predict --keep`` copies out), or None.
    They stay on the host: the model never reads them."""

    dense: Tensor
    sparse: SparseFeatures
    labels: Tensor
    teacher: Tensor | None = None
    keys: dict[str, np.ndarray] | None = None

    @property
    def size(self) -> int:
        return int(self.labels.shape[0])

    def slice_rows(self, start: int, stop: int) -> "Batch":
        """Rows ``start .. stop-1`` of the batch (dense, sparse, labels and the key columns)."""
        keys = None if self.keys is None else {k: v[start:stop] for k, v in self.keys.items()}
        return Batch(self.dense[start:stop], self.sparse.slice_rows(start, stop), self.labels[start:stop], keys=keys)

    def to(self, device: torch.device | str, non_blocking: bool = False) -> "Batch":
        return Batch(
            self.dense.to(device, non_blocking=non_blocking),
            self.sparse.to(device, non_blocking=non_blocking),
            self.labels.to(device, non_blocking=non_blocking),
            None if self.teacher is None else self.teacher.to(device, non_blocking=non_blocking),
            self.keys,
        )

    def pin_memory(self) -> "Batch":
        return Batch(self.dense.pin_memory(), self.sparse.pin_memory(), self.labels.pin_memory(),
                     None if self.teacher is None else self.teacher.pin_memory(), self.keys)
