"""Host-memory tier: a growable arena of records addressed through a KeyIndex."""

from __future__ import annotations

from typing import Iterator

import numpy as np
import torch
from torch import Tensor

from ember.errors import CapacityError
from ember.tiers.key_index import KeyIndex

__all__ = ["HostTier"]


class HostTier:
    """All rows in host RAM: ``arena[slot] = [weights | optimizer state]``.

    The arena doubles when full (amortised O(1) per insert); freed slots are reused. ``get`` remembers
    the slots of the last IDs it served, so the ``put`` of the same IDs after the optimizer step
    (the common read-modify-write of one batch) skips a second index probe.

    Example:
        >>> t = HostTier(record_dim=3)
        >>> t.put(torch.tensor([7, 42]), torch.ones(2, 3))
        >>> rows, found = t.get(torch.tensor([42, 5]))
        >>> found.tolist(), rows[0].tolist()
        ([True, False], [1.0, 1.0, 1.0])
    """

    def __init__(self, record_dim: int, capacity: int | None = None, initial_rows: int = 1024) -> None:
        self.record_dim = record_dim
        self.capacity = capacity
        first = initial_rows if capacity is None else min(initial_rows, capacity)
        self._arena = torch.zeros(max(first, 1), record_dim)
        self._index = KeyIndex(first)
        self._next = 0  # slots [0, _next) have been handed out at least once
        self._free = np.empty(0, dtype=np.int32)
        self._memo: tuple[Tensor, Tensor] | None = None

    def __len__(self) -> int:
        return len(self._index)

    @property
    def nbytes(self) -> int:
        return self._arena.numel() * 4 + self._index.nbytes

    @property
    def index_bytes(self) -> int:
        return self._index.nbytes

    def slots_of(self, ids: Tensor) -> Tensor:
        """Slot of each ID (-1 if absent), int64 [N]."""
        memo = self._memo
        if memo is not None and memo[0] is ids:
            return memo[1]
        slots = torch.from_numpy(self._index.lookup(ids.numpy()).astype(np.int64))
        self._memo = (ids, slots)
        return slots

    def get(self, ids: Tensor) -> tuple[Tensor, Tensor]:
        slots = self.slots_of(ids)
        found = slots >= 0
        rows = self._arena.index_select(0, slots.clamp(min=0))
        return rows, found

    def put(self, ids: Tensor, records: Tensor) -> None:
        slots = self.slots_of(ids)
        missing = slots < 0
        if bool(missing.any()):
            new_ids = ids[missing]
            new_slots = self._allocate(new_ids.numel())
            self._index.insert(new_ids.numpy(), new_slots)
            slots = slots.clone()
            slots[missing] = torch.from_numpy(new_slots.astype(np.int64))
            self._memo = (ids, slots)
        self._arena.index_copy_(0, slots, records.to(self._arena.dtype))

    def remove(self, ids: Tensor) -> Tensor:
        self._memo = None
        slots = self._index.remove(ids.numpy())
        found = slots >= 0
        self._free = np.concatenate([self._free, slots[found]])
        return torch.from_numpy(found)

    def evict(self, n: int) -> tuple[Tensor, Tensor]:
        """Remove ``n`` rows in slot order (the host tier has no access policy of its own)."""
        ids, slots = self._index.items()
        take = np.argsort(slots, kind="stable")[:n]
        victims = torch.from_numpy(ids[take])
        rows = self._arena.index_select(0, torch.from_numpy(slots[take].astype(np.int64)))
        self.remove(victims)
        return victims, rows

    def items(self, chunk_rows: int = 1 << 20) -> Iterator[tuple[Tensor, Tensor]]:
        ids, slots = self._index.items()
        order = np.argsort(ids, kind="stable")  # sorted by ID: same file for the same table
        for start in range(0, ids.size, chunk_rows):
            sel = order[start : start + chunk_rows]
            yield (
                torch.from_numpy(ids[sel]),
                self._arena.index_select(0, torch.from_numpy(slots[sel].astype(np.int64))),
            )

    def _allocate(self, n: int) -> np.ndarray:
        reuse = min(n, self._free.size)
        out = self._free[:reuse]
        self._free = self._free[reuse:]
        fresh = n - reuse
        if fresh:
            if self.capacity is not None and len(self) + n > self.capacity:
                raise CapacityError(
                    f"HostTier: {len(self) + n} rows would exceed its capacity of {self.capacity}; "
                    "raise the host tier's capacity or add a disk tier behind it"
                )
            end = self._next + fresh
            if end > self._arena.shape[0]:
                grow = max(end, 2 * self._arena.shape[0])
                if self.capacity is not None:
                    grow = min(grow, self.capacity)
                bigger = torch.empty(grow, self.record_dim)
                bigger[: self._next] = self._arena[: self._next]
                self._arena = bigger
            out = np.concatenate([out, np.arange(self._next, end, dtype=np.int32)])
            self._next = end
        return out
