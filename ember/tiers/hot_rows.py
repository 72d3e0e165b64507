"""The most-read records of a ``MappedRows`` kept in device memory: the device tier under the device index.

``storage.index: device`` keeps every record of a table group in pinned host memory and has the
GPU gather and scatter them over PCIe. With a device budget (``storage.device_rows`` /
``device_bytes``, summed over the group's tables) ``HotRows`` also keeps copies of the records
read most often in an arena in device memory, so that a step's reads and writes of those rows
stay on the device:

- a map ``slot`` [record numbers] -> arena slot (-1: not hot), and per record an access count;
- a step's ``gather`` reads each record from the arena where it is hot and from the host rows
  elsewhere; ``scatter`` writes each to where it lives (the other copy is stale until the next
  ``rebalance``): on a GPU one masked kernel each (``ember.tiers.hot_kernels``: only the cold
  records cross PCIe), else two gathers and a select, two scatters (fixed shapes: a hot
  record's host-side access goes to the scratch row); ``count`` adds the step's reads;
- every ``every`` training fetches, ``rebalance`` writes the arena's rows home, picks the records
  read most since (the counts, halved at each rebalance: recent reads weigh more) and loads
  them into the arena.

Every operation has a fixed shape (no device->host synchronisation, no data-dependent shape),
so the step stays one CUDA graph (``ember.embedding.mapped_fetch``) and the budgets of
``ember.tiers.device_budget`` hold. Values are copied word for word: a run trains bit for bit as
without the arena. Readers outside the step (checkpoints, exports: ``MappedRows.items``) see
the arena's rows after ``flush``.

On a CPU device the arena is host memory: the same code runs, and is tested, there.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ember.tiers import hot_kernels
from ember.tiers.device_budget import mark_device

__all__ = ["HotRows"]


class HotRows:
    """Copies of up to ``capacity`` records of ``records`` host rows (the last one the scratch
    row no record is numbered to) in ``device`` memory.

    Args:
        capacity: arena rows.
        record_dim: 4-byte words per record.
        records: host rows (record numbers, the scratch row included) the map covers.
        device: where the arena lives.
        every: training fetches between rebalances.

    Example:
        >>> host = torch.arange(12.0).view(6, 2)  # records 0..4, scratch row 5
        >>> hot = HotRows(2, 2, 6, "cpu", every=1)
        >>> hot.count(torch.tensor([3, 1])); hot.count(torch.tensor([3]))
        >>> hot.rebalance(host, 5)
        >>> hot.slot.tolist()
        [-1, 1, -1, 0, -1, -1]
        >>> hot.scatter(host, torch.tensor([3, 0]), torch.tensor([[-1.0, -1.0], [-2.0, -2.0]]), 5)
        >>> hot.gather(host, torch.tensor([3, 0]), 5).tolist(), host[3].tolist()
        ([[-1.0, -1.0], [-2.0, -2.0]], [6.0, 7.0])
        >>> hot.flush(host, 5); host[3].tolist()
        [-1.0, -1.0]
    """

    def __init__(self, capacity: int, record_dim: int, records: int, device: str | torch.device, every: int = 64) -> None:
        if capacity < 1 or every < 1:
            raise ValueError(f"HotRows: capacity and every must be >= 1, got {capacity} and {every}")
        self.capacity, self.every = capacity, every
        self.device = torch.device(device)
        self.arena = torch.zeros(capacity + 1, record_dim, device=self.device)  # the last row: padding's writes
        self.held = torch.full((capacity,), -1, dtype=torch.int64, device=self.device)  # slot -> record (-1: none)
        self.slot = torch.full((records,), -1, dtype=torch.int32, device=self.device)  # record -> slot (-1: not hot)
        self.counts = torch.zeros(records, dtype=torch.int32, device=self.device)  # reads since the last rebalances
        self._iota = torch.arange(capacity, dtype=torch.int32, device=self.device)
        self.reads = torch.zeros(2, dtype=torch.int64, device=self.device)  # training reads: (of hot rows, all), ever
        self._reads_seen: tuple[int, int] | None = None  # ``reads`` downloaded since the last count
        self.fetches = 0  # training fetches since the last rebalance
        self.rebalances = 0
        mark_device(*self.tensors())

    def tensors(self) -> list[Tensor]:
        """Its device memory (for ``DeviceBudget``'s ``mark_device``)."""
        return [self.arena, self.held, self.slot, self.counts, self._iota, self.reads]

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors())

    def _where(self, rows: Tensor) -> tuple[Tensor, Tensor]:
        """(hot bool [N], arena slot int64 [N]: the arena's last row where not hot) of record numbers ``rows``."""
        s = self.slot.index_select(0, rows).to(torch.int64)
        hot = s >= 0
        return hot, torch.where(hot, s, self.capacity)

    def gather(self, host_rows: Tensor, rows: Tensor, scratch: int) -> Tensor:
        """Records [N, record_dim] of record numbers ``rows``: from the arena where hot, else from
        ``host_rows``. On a GPU one masked kernel (``ember.tiers.hot_kernels``); the tensor
        operations here (the reference) read the scratch row in a hot record's place."""
        if hot_kernels.usable(self.device):
            try:
                return hot_kernels.gather(host_rows, self.arena, rows, self.slot)
            except Exception as e:  # noqa: BLE001  (a build or launch failure: said once, the reference from here on)
                hot_kernels.disable(f"{type(e).__name__}: {e}")
        hot, at = self._where(rows)
        far = host_rows.index_select(0, torch.where(hot, scratch, rows))
        near = self.arena.index_select(0, at)
        return torch.where(hot.unsqueeze(1), near, far)

    def scatter(self, host_rows: Tensor, rows: Tensor, records: Tensor, scratch: int) -> None:
        """Write ``records`` to record numbers ``rows`` (distinct but for the scratch row) where
        each lives: the arena for hot ones, ``host_rows`` for the others (on a GPU one masked
        kernel; the reference writes a hot record's host-side copy to the scratch row)."""
        if hot_kernels.usable(self.device):
            try:
                hot_kernels.scatter(host_rows, self.arena, rows, self.slot, records)
                return
            except Exception as e:  # noqa: BLE001
                hot_kernels.disable(f"{type(e).__name__}: {e}")
        hot, at = self._where(rows)
        host_rows.index_copy_(0, torch.where(hot, scratch, rows), records)
        self.arena.index_copy_(0, at, records)

    def count(self, rows: Tensor, scratch: int | None = None) -> None:
        """A training fetch read ``rows`` (distinct but for the ``scratch`` row, never made hot,
        whose reads are the padding's: not counted in ``reads``)."""
        seen = self.counts.index_select(0, rows)
        self.counts.index_copy_(0, rows, seen + 1)
        hot = self.slot.index_select(0, rows) >= 0
        real = rows != scratch if scratch is not None else torch.ones_like(hot)
        self.reads += torch.stack(((hot & real).sum(), real.sum()))
        self._reads_seen = None

    def hit_reads(self) -> tuple[int, int]:
        """(training reads of hot rows, all training reads) so far: downloaded once after a count
        (waits for the device), then as downloaded, so a log record's tables sharing these hot rows
        wait once, not once each."""
        if self._reads_seen is None:
            hits, reads = self.reads.tolist()
            self._reads_seen = (hits, reads)
        return self._reads_seen

    def due(self) -> bool:
        """One more training fetch; whether the hot set is due to be chosen again before it: after
        2, 4, 8, ... fetches at first (a run's first hot set soon), then every ``every``."""
        self.fetches += 1
        return self.fetches > min(self.every, 2 << min(self.rebalances, 30))

    def flush(self, host_rows: Tensor, scratch: int) -> None:
        """Write the arena's rows home (they stay hot): ``host_rows`` is whole again."""
        h = self.held
        host_rows.index_copy_(0, torch.where(h >= 0, h, scratch), self.arena[: self.capacity])

    def rebalance(self, host_rows: Tensor, scratch: int) -> None:
        """Choose the hot records again: the arena's rows written home, the ``capacity`` records
        read most (counts halved after: recent reads weigh more) loaded into it."""
        self.flush(host_rows, scratch)
        self.counts[scratch:].zero_()  # (the padding's reads; the scratch row is the last)
        k = min(self.capacity, self.counts.numel())
        top = torch.topk(self.counts, k).indices  # (most read first: slot 0)
        keep = self.counts.index_select(0, top) > 0  # (never read: not worth a slot)
        src = torch.where(keep, top, scratch)
        self.held[:k].copy_(torch.where(keep, top, -1))  # (k only grows: slots past it were never used)
        self.slot.fill_(-1)
        self.slot.index_copy_(0, src, self._iota[:k])
        self.slot[scratch:].fill_(-1)
        torch.index_select(host_rows, 0, src, out=self.arena[:k])
        self.counts.bitwise_right_shift_(1)
        self.fetches, self.rebalances = 0, self.rebalances + 1

    def grow(self, records: int) -> None:
        """The host rows grew to ``records`` (the scratch row moved to the new last row): the
        map and counts grow with them; the arena keeps its rows (record numbers do not change)."""
        old = self.slot.numel() - 1  # (the old scratch row: a record number from now on, never hot)
        slot = torch.full((records,), -1, dtype=torch.int32, device=self.device)
        counts = torch.zeros(records, dtype=torch.int32, device=self.device)
        slot[:old].copy_(self.slot[:old])
        counts[:old].copy_(self.counts[:old])
        self.slot, self.counts = slot, counts
        mark_device(self.slot, self.counts)
