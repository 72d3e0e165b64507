"""Exact counts of (ID, table) pairs on the device: ``min_count`` admission for ``storage.index: device``.

``IdCounter`` counts a table's sightings of IDs without a row on the host, where the host index
tells it which IDs have one. With the index on the device the host does not know that without
waiting, so the counts live there too: a ``DeviceIndex`` from (key, tag) to a slot, and an int32
count per slot, counted, tested and cleared by tensor operations inside the fetch (no sync, a
fixed sequence a CUDA graph replays). A pair leaves when it is admitted (its entry dropped, its
count zeroed and its slot given to the next pair counted), as it leaves ``IdCounter``: the index
holds the pairs still counting, ~44 bytes of device memory each (and the ways of those that left
until the next rehash frees them).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from ember.tiers.device_budget import mark_device
from ember.tiers.device_index import DeviceIndex

__all__ = ["DeviceAdmission", "DeviceCounts"]


class DeviceCounts:
    """int32 counts of (int64 key, int32 tag) pairs, in device memory.

    Args:
        device: where the counts live.
        capacity: pairs before the first growth.

    Example:
        >>> c = DeviceCounts("cpu")
        >>> c.prepare(2); slot, n, entry = c.count(torch.tensor([4, 9]), torch.tensor([0, 0], dtype=torch.int32), None)
        >>> c.admit(slot, entry, torch.tensor([False, True])); c.inserted(2)
        >>> n.tolist(), c.get(torch.tensor([4, 9]), torch.tensor([0, 0])).tolist(), len(c)
        ([1, 1], [1, 0], 1)
    """

    def __init__(self, device: str | torch.device, capacity: int = 1 << 16) -> None:
        self.device = torch.device(device)
        self.index = DeviceIndex(capacity, self.device)
        self.index.prepare_release(capacity)  # (the free stack sized once for the pairs it starts with)
        self.counts = torch.zeros(capacity + 1, dtype=torch.int32, device=self.device)  # (the last: scratch)
        mark_device(self.counts)
        self.generation = 0  # changes when ``counts`` is replaced (a CUDA graph over it is stale)

    @property
    def scratch(self) -> int:
        """The slot no pair is numbered to: where uncounted pairs read and write."""
        return self.counts.numel() - 1

    def device_tensors(self) -> list[Tensor]:
        return [self.counts, *self.index.device_tensors()]

    def __len__(self) -> int:
        """Pairs counting (in the index; waits for the device)."""
        return self.index.live()

    def prepare(self, n: int) -> None:
        """The host's part of a ``count`` and ``admit`` of up to ``n`` pairs, before their device
        work: room in the index, its free stack and the counts (a growth, rarely)."""
        self.index.prepare(n)
        self.index.prepare_release(n)
        need = self.index.bound(n)
        if need > self.scratch:
            grown = torch.zeros(max(2 * self.scratch, need) + 1, dtype=torch.int32, device=self.device)
            grown[: self.scratch].copy_(self.counts[: self.scratch])
            self.counts = grown
            self.generation += 1
            mark_device(self.counts)

    def inserted(self, n: int, download: tuple[Tensor, "torch.cuda.Event | None"] | None = None) -> None:
        """After the device work of a ``count`` and ``admit`` of ``n`` pairs: the index's count is
        downloaded without a wait (what ``prepare`` sizes by; ``download``: on its way,
        ``DeviceIndex.count_inserted``)."""
        self.index.released(n)
        self.index.count_inserted(n, download)

    def count(self, keys: Tensor, tags: Tensor, want: Tensor | None) -> tuple[Tensor, Tensor, Tensor]:
        """Add one to the count of each unique pair ``want`` picks (None: all); returns (slot [N],
        the new counts int32 [N], entry [N]: what ``admit`` takes; the others': their slot is
        ``scratch``, their count meaningless). Device work alone, after ``prepare``."""
        slot, _, entry = self.index.insert_entries(keys, tags, want)
        if want is not None:
            slot = torch.where(want, slot, self.scratch)
        n = self.counts[slot] + 1
        self.counts[slot] = n  # (the unwanted all write the scratch slot: never read)
        return slot, n, entry

    def admit(self, slot: Tensor, entry: Tensor, mask: Tensor) -> None:
        """The pairs ``mask`` picks of a ``count`` (admitted: they got a row) leave: their
        entries dropped, their counts zeroed and their slots on the free stack (a pair counted
        later starts from zero). Device work alone, after ``prepare``; ``inserted`` follows."""
        self._zero(slot, mask)
        self.index.drop(entry, mask)
        self.index.push_free(slot, mask)

    def _zero(self, slot: Tensor, mask: Tensor) -> None:
        """Zero the counts of ``slot[mask]`` (the others write the scratch slot)."""
        self.counts[torch.where(mask, slot, self.scratch)] = 0

    def get(self, keys: Tensor, tags: Tensor) -> Tensor:
        """int64 [N]: each pair's count (0: never counted, or admitted)."""
        slot = self.index.find(keys, tags)
        return torch.where(slot >= 0, self.counts[slot.clamp(min=0)], 0).to(torch.int64)

    def remove(self, keys: Tensor, tags: Tensor) -> None:
        """These pairs leave (they got a row some other way, e.g. a checkpoint's): entries
        dropped, counts zeroed, slots reused."""
        slot = self.index.remove(keys, tags)
        self._zero(slot, slot >= 0)
        self.index.release(slot.clamp(min=0), slot >= 0)

    def add(self, keys: Tensor, tags: Tensor, counts: Tensor) -> None:
        """Add ``counts`` to unique pairs (a checkpoint's restore)."""
        keys, tags = self.index.pairs(keys, tags)
        self.prepare(keys.numel())
        slot, _ = self.index.insert(keys, tags)
        self.inserted(keys.numel())
        self.counts[slot] += counts.to(self.device, torch.int32)

    def items(self, tag: int) -> tuple[np.ndarray, np.ndarray]:
        """Every (key, count) of ``tag`` with a count, sorted by key (waits for the device)."""
        keys, tags, slots = self.index.items()
        counts = self.counts[slots]
        mine = torch.nonzero((tags == tag) & (counts > 0)).squeeze(1)
        keys, counts = keys[mine].cpu().numpy(), counts[mine].cpu().numpy().astype(np.int64)
        order = np.argsort(keys, kind="stable")
        return keys[order], counts[order]

    def table_counts(self, tags: int) -> np.ndarray:
        """Pairs with a count, per tag (int64 [tags]; waits for the device)."""
        keys, t, slots = self.index.items()
        live = t[self.counts[slots] > 0].to(torch.int64)
        return torch.bincount(live, minlength=tags).cpu().numpy()[:tags]


class DeviceAdmission:
    """Table ``j``'s ``min_count`` sightings in a group's ``DeviceCounts``, with ``IdCounter``'s
    methods (checkpoints, restores and stats go through it; a training fetch counts on the device).
    ``filtered``: the group's reads of IDs held back, per table, on the device."""

    def __init__(self, counts: DeviceCounts, j: int, tables: int, filtered: Tensor) -> None:
        self.counts, self.j, self.tables, self.filtered = counts, j, tables, filtered

    def _pairs(self, ids: np.ndarray) -> tuple[Tensor, Tensor]:
        keys = torch.from_numpy(np.ascontiguousarray(ids, dtype=np.int64)).to(self.counts.device)
        return keys, torch.full_like(keys, self.j, dtype=torch.int32)

    def __len__(self) -> int:
        return int(self.counts.table_counts(self.tables)[self.j])

    def get(self, ids: np.ndarray) -> np.ndarray:
        return self.counts.get(*self._pairs(ids)).cpu().numpy()

    def add(self, ids: np.ndarray, counts: np.ndarray | int = 1) -> None:
        keys, tags = self._pairs(ids)
        if keys.numel():
            self.counts.add(keys, tags, torch.as_tensor(np.broadcast_to(np.asarray(counts, dtype=np.int32), keys.shape).copy()))

    def remove(self, ids: np.ndarray) -> None:
        if np.asarray(ids).size:
            self.counts.remove(*self._pairs(ids))

    def items(self) -> tuple[np.ndarray, np.ndarray]:
        return self.counts.items(self.j)

    def take_filtered_reads(self) -> int:
        """Reads of this table's held-back IDs since the last call (waits for the device)."""
        n = int(self.filtered[self.j])
        self.filtered[self.j] = 0
        return n
