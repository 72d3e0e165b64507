"""The in-memory contract between the data side and the model side."""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any, Callable

import numpy as np
import torch
from torch import Tensor

from ember.batch.sparse import SparseFeatures, pinned

__all__ = ["Batch"]


@dataclass(frozen=True)
class Batch:
    """One mini-batch: ``dense`` [B, Dd] float32, ``sparse`` jagged IDs, ``labels`` [B, T] float32,
    ``teacher`` [B, T] float32 a teacher's scores (``schema.teacher``) or None; ``keys``: raw
    columns carried beside the features, column -> [B] numpy values (what eval groups and
    slices by, ``eval.group_by`` / ``eval.slices``, and ``predict --keep`` copies out), or None.
    They stay on the host: the model never reads them.

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
    keys: dict[str, np.ndarray] | None = None

    @property
    def size(self) -> int:
        return int(self.labels.shape[0])

    def slice_rows(self, start: int, stop: int) -> "Batch":
        """Rows ``start .. stop-1`` of every field (a distributed rank's slice of the batch).

        Built with ``dataclasses.replace`` from the fields' own slices, so a field added to
        ``Batch`` can never be dropped here silently (``_map`` refuses a field it cannot map).
        """
        return self._map(lambda t: t[start:stop], lambda s: s.slice_rows(start, stop),
                         lambda keys: {k: v[start:stop] for k, v in keys.items()})

    def to(self, device: torch.device | str, non_blocking: bool = False) -> "Batch":
        return self._map(lambda t: t.to(device, non_blocking=non_blocking),
                         lambda s: s.to(device, non_blocking=non_blocking))

    def pin_memory(self) -> "Batch":
        """A copy whose host tensors are in pinned memory (tensors already on a device stay)."""
        return self._map(pinned, lambda s: s.pin_memory())

    def _map(self, tensor: Callable[[Tensor], Tensor], sparse: Callable[[SparseFeatures], SparseFeatures],
             keys: Callable[[dict], dict] = lambda k: k) -> "Batch":
        """A copy with ``tensor`` applied to every tensor field, ``sparse`` to the sparse one and
        ``keys`` to the key columns (host arrays: they stay on the host); None fields stay None."""
        changes: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if value is None:
                continue
            if f.name == "keys":
                changes[f.name] = keys(value)
            elif isinstance(value, SparseFeatures):
                changes[f.name] = sparse(value)
            elif isinstance(value, Tensor):
                changes[f.name] = tensor(value)
            else:
                raise TypeError(f"Batch.{f.name}: a {type(value).__name__} field has no row-wise map; "
                                "teach Batch._map about it")
        return replace(self, **changes)
