"""A table group's records in pinned host memory, found and moved by the device alone.

The host-rows layout on a GPU (``storage`` without a device cache) has the host probe every ID
of a batch in its index, copy the rows into a staging buffer, and later write the updated rows
back: per-ID work on the host that the device waits for. ``MappedRows`` keeps the records in
page-locked host memory, as many as the table group has, and the map from (ID, table) to record
in device memory (``DeviceIndex``). A step then looks its IDs up, gathers their records and
scatters the updated ones back as device operations on a device view of the host memory
(``device_view``): the rows cross PCIe inside the gather and the scatter, and no host thread
touches an ID or a row. Records are numbered in order of first insertion, so record ``r``
lives in host row ``r``; the host rows double when the index's bound of numbered rows
(``DeviceIndex.bound``, known without waiting) could pass them, which waits for the device once.

New pairs get a record number but no contents: the caller writes their fresh rows (made on the
device, ``uniform01_tensor``) with the step's ``store``. An evaluation look-up (``find``) inserts
nothing. A removed pair's record number is reused by later inserts once no training lookup that
was open at the removal (``begin`` ... ``end``) can still write it back.

On a CPU device the view is the host tensor itself: the same code runs, and is tested, there.
"""

from __future__ import annotations

import logging
from typing import Iterator

import numpy as np
import torch
from torch import Tensor

from ember.errors import CapacityError
from ember.fileio import fmt_bytes
from ember.tiers.base import Tier, TierCounters
from ember.tiers.device_budget import mark_device
from ember.tiers.device_index import DeviceIndex
from ember.tiers.hot_rows import HotRows
from ember.tiers.mapped import device_view
from ember.tiers.storage import mem_available

__all__ = ["MappedRows", "MappedTier"]

log = logging.getLogger("ember.tiers")

_INSTEAD = ("Every row of such a table stays in host memory (storage.index: device, which storage.index: auto picks "
            "for a GPU run's tables without a host budget or disk tier): set storage.index: host to keep "
            "the rows in pageable memory, and for tables larger than RAM add a disk tier (storage.disk_path)")


class MappedRows:
    """(ID, table) -> record map of a table group: records in pinned host memory, index on the device.

    Args:
        record_dim: 4-byte words per record (weights + optimizer state).
        device: where the index lives and the step runs (``cuda``, or ``cpu`` for the same code on
            a CPU).
        capacity: records (and index pairs) before the first growth.
        hot_rows: records also kept in device memory, the ones read most (``HotRows``; 0: none).

    Example:
        >>> m = MappedRows(3, "cpu", capacity=4)
        >>> rows, new, rec = m.lookup(torch.tensor([10, 11]), torch.tensor([0, 0]))
        >>> new.tolist()
        [True, True]
        >>> m.store(rows, torch.tensor([[1., 2., 3.], [4., 5., 6.]]))
        >>> m.lookup(torch.tensor([11]), torch.tensor([0]))[2].tolist()
        [[4.0, 5.0, 6.0]]
    """

    def __init__(self, record_dim: int, device: str | torch.device, capacity: int = 1 << 16, hot_rows: int = 0) -> None:
        if record_dim < 1 or capacity < 1 or hot_rows < 0:
            raise ValueError(f"MappedRows: record_dim and capacity must be >= 1 and hot_rows >= 0, got {record_dim}, "
                             f"{capacity} and {hot_rows}")
        self.device = torch.device(device)
        self.record_dim = record_dim
        self.index = DeviceIndex(capacity, self.device)
        self.host = self._alloc(capacity)
        self.rows = device_view(self.host, self.device)
        mark_device(self.rows)
        self.hot: HotRows | None = None  # the records read most, copied into device memory (storage.device_rows)
        self.keep_hot(hot_rows)
        self.generation = 0  # changes when the rows are replaced (growth): a CUDA graph over them is stale
        self.version = 0  # changes with every call that may insert or remove (``table_counts``' cache)
        self._counts: tuple[int, np.ndarray] | None = None
        # training lookups between their fetch and their write-back (``begin`` / ``end``): a removed
        # pair's row waits (``_held``, with the lookups open when it was removed) until none of them
        # can still write it, then goes back to the index's free stack
        self._open: set[int] = set()
        self._seq = 0
        self._held: list[tuple[Tensor, set[int]]] = []
        self._dropped: list[int] = []  # lookups garbage-collected without an end (``end_later``)

    def _alloc(self, rows: int) -> Tensor:
        """``rows`` records and one scratch row after them (``scratch``: a padded call's writes)."""
        pinned = self.device.type == "cuda"
        try:
            return torch.empty(rows + 1, self.record_dim, pin_memory=pinned)
        except RuntimeError as e:  # (page-locking that much host memory can fail where plain memory would not)
            raise CapacityError(
                f"storage.index: device: could not allocate {fmt_bytes(rows * self.record_dim * 4)} of "
                f"{'pinned ' if pinned else ''}host memory for {rows:,} rows ({e}). {_INSTEAD}") from e

    @property
    def capacity(self) -> int:
        return self.host.shape[0] - 1

    @property
    def scratch(self) -> int:
        """The row no record is numbered to: where a padded call's padding writes (never read)."""
        return self.host.shape[0] - 1

    @property
    def nbytes(self) -> int:
        """Host bytes (the records) + device bytes (the index, the hot rows)."""
        return self.host.numel() * 4 + self.index.nbytes + (self.hot.nbytes if self.hot is not None else 0)

    def _room(self, n: int) -> None:
        """Host rows for every record numbered after ``n`` more inserts: a growth (doubling, the
        old rows copied once the device has finished with them) only when the index's bound,
        known without waiting, could pass them."""
        if self.index.bound(n) <= self.capacity:
            return
        need = self.index.check() + n  # (waits for the device: its writes to the old rows are done)
        if need <= self.capacity:
            return
        rows = max(2 * self.capacity, need)
        size = rows * self.record_dim * 4
        free = mem_available()
        if free is not None and size > free:
            raise CapacityError(
                f"storage.index: device: the table group's rows need {fmt_bytes(size)} of host memory to grow to "
                f"{rows:,} rows (beside the {fmt_bytes(self.host.numel() * 4)} they have), but {fmt_bytes(free)} is "
                f"available. {_INSTEAD}")
        log.info("storage.index: device: a table group's rows grow to %s rows (%s of %shost memory; the step waits "
                 "for the device once)", f"{rows:,}", fmt_bytes(size), "pinned " if self.device.type == "cuda" else "")
        host = self._alloc(rows)
        host[: self.capacity].copy_(self.host[: self.capacity])
        self.host = host
        self.rows = device_view(host, self.device)
        if self.hot is not None:
            self.hot.grow(host.shape[0])
        self.generation += 1
        mark_device(self.rows)

    def device_tensors(self) -> list[Tensor]:
        """The device memory it keeps between calls (the rows' view, the index's planes, the hot
        rows): what a ``DeviceBudget`` on a CPU "device" is told is the device's (``mark_device``)."""
        return [self.rows, *self.index.device_tensors(), *(self.hot.tensors() if self.hot is not None else ())]

    def keep_hot(self, rows: int) -> None:
        """Keep copies of the ``rows`` records read most in device memory from now on (``HotRows``;
        before the first step: a table group's budget, its tables' summed)."""
        if rows > 0 and self.hot is None:
            self.hot = HotRows(rows, self.record_dim, self.host.shape[0], self.device)

    def gather(self, rows: Tensor) -> Tensor:
        """The records [N, record_dim] of record numbers ``rows`` (the scratch row allowed), from
        device memory where they are hot, else from the host rows."""
        if self.hot is None:
            return self.rows.index_select(0, rows)
        return self.hot.gather(self.rows, rows, self.scratch)

    def scatter(self, rows: Tensor, records: Tensor) -> None:
        """Write ``records`` [N, record_dim] to record numbers ``rows`` (distinct but for the
        scratch row), where each lives."""
        if self.hot is None:
            self.rows.index_copy_(0, rows, records)
        else:
            self.hot.scatter(self.rows, rows, records, self.scratch)

    def read_by_training(self, rows: Tensor) -> None:
        """A training fetch's record numbers (the hot rows' access counts; nothing without them)."""
        if self.hot is not None:
            self.hot.count(rows, self.scratch)

    def lookup(self, keys: Tensor, tables: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """A training step's records of unique (ID, table) pairs: (record numbers int64 [N], new
        bool [N], records float32 [N, record_dim] on the device). New pairs are inserted; their
        records hold nothing yet (the caller makes fresh rows and ``store``s them)."""
        mark_device(*self.device_tensors())  # (nothing unless a DeviceBudget is active)
        self.prepare(keys.numel())
        rows, new = self.index.insert(*self.index.pairs(keys, tables))
        self.inserted(keys.numel())
        return rows, new, self.gather(rows)

    def prepare(self, n: int, training: bool = False) -> None:
        """The host's part of a lookup of up to ``n`` pairs, before its device work: host rows and
        index room for them (a growth, rarely: it waits for the device once); before a training
        fetch, the hot rows chosen again when due (device work outside the fetch's graph)."""
        self._room(n)
        self.index.prepare(n)
        if training and self.hot is not None and self.hot.due():
            self.hot.rebalance(self.rows, self.scratch)

    def inserted(self, n: int, download: tuple[Tensor, "torch.cuda.Event | None"] | None = None) -> None:
        """After the device work of a lookup of ``n`` pairs (``index.insert``): the index's count
        is downloaded without a wait (its bound of rows numbered; ``download``: on its way,
        ``DeviceIndex.count_inserted``)."""
        self.version += 1
        self.index.count_inserted(n, download)

    def find(self, keys: Tensor, tables: Tensor) -> tuple[Tensor, Tensor]:
        """An evaluation's records: (found bool [N], records [N, record_dim]; rows of absent
        pairs are meaningless). Inserts nothing."""
        mark_device(*self.device_tensors())
        rows = self.index.find(keys, tables)
        found = rows >= 0
        return found, self.gather(torch.where(found, rows, self.scratch))

    def store(self, rows: Tensor, records: Tensor) -> None:
        """Write ``records`` [N, record_dim] into the record numbers ``rows`` (distinct)."""
        self.scatter(rows.to(self.device), records.to(self.device))

    def put(self, keys: Tensor, tables: Tensor, records: Tensor) -> None:
        """Insert or overwrite the records of unique pairs (a checkpoint's restore)."""
        rows, _, _ = self.lookup(keys, tables)
        self.store(rows, records)

    def contains(self, keys: Tensor, tables: Tensor) -> Tensor:
        """Found mask [N] (on the device)."""
        return self.index.find(keys, tables) >= 0

    def begin(self) -> int:
        """A training lookup fetched (its rows may be written back later): its number for ``end``."""
        self._adopt()
        self._seq += 1
        self._open.add(self._seq)
        return self._seq

    def end(self, seq: int) -> None:
        """That lookup wrote back or was discarded: rows removed while it was open may be reused."""
        self._open.discard(seq)
        self._adopt()
        self._recycle()

    def end_later(self, seq: int) -> None:
        """``end`` for a lookup garbage-collected without one (any thread): done at the next call."""
        self._dropped.append(seq)

    def _adopt(self) -> None:
        while self._dropped:
            self._open.discard(self._dropped.pop())

    def _recycle(self) -> None:
        keep = []
        for rows, blockers in self._held:
            blockers &= self._open
            if blockers:
                keep.append((rows, blockers))
            else:
                self.index.release(rows.clamp(min=0), rows >= 0)
        self._held = keep

    def remove(self, keys: Tensor, tables: Tensor) -> Tensor:
        """Take pairs out (found bool [N]); their rows are reused once no open lookup can write them."""
        self.version += 1
        self._adopt()
        rows = self.index.remove(keys, tables)
        self._held.append((rows, set(self._open)))
        self._recycle()
        return rows >= 0

    def items(self, chunk_rows: int = 1 << 20, table: int | None = None) -> Iterator[tuple[Tensor, Tensor, Tensor]]:
        """Every stored (IDs, tables, records) on the host (of one ``table``, when given),
        ``chunk_rows`` at a time (waits for the device)."""
        idx = self.index
        if self.hot is not None:  # (the hot rows' newest values, home)
            self.hot.flush(self.rows, self.scratch)
        live = idx.tags[: idx.buckets * idx.ways]
        live = torch.nonzero(live >= 0 if table is None else live == table).squeeze(1)  # (a sync: queued writes have landed)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        keys, tables, rows = idx.keys[live].cpu(), idx.tags[live].cpu(), idx.rows[live].cpu()
        for a in range(0, rows.numel(), chunk_rows):
            yield keys[a:a + chunk_rows], tables[a:a + chunk_rows], self.host[rows[a:a + chunk_rows]]

    def table_counts(self, tables: int) -> np.ndarray:
        """Pairs stored per table (int64 [tables]; waits for the device, unless nothing was
        inserted or removed since the last call)."""
        if self._counts is None or self._counts[0] != self.version or self._counts[1].size != tables:
            tags = self.index.tags[: self.index.buckets * self.index.ways]
            live = tags[tags >= 0].to(torch.int64)
            self._counts = (self.version, torch.bincount(live, minlength=tables).cpu().numpy()[:tables])
        return self._counts[1]

    def __len__(self) -> int:
        """Pairs stored (waits for the device)."""
        return self.index.live()


class MappedTier(TierCounters, Tier):
    """Table ``j``'s rows of a ``MappedRows`` as a ``Tier`` (checkpoints, exports, serving and
    evaluation read and write through it; a training step's group takes the device path).
    Unbounded: every row stays in host memory."""

    name = "host"
    capacity = None

    def __init__(self, rows: MappedRows, j: int = 0, tables: int = 1) -> None:
        self.rows, self.j, self.tables = rows, j, tables
        self.hot_rows = 0  # this table's device budget (storage.device_rows): its share of the group's hot rows
        self._hot_seen = (0, 0)  # the group's hot-row reads at this table's last stats
        self.record_dim = rows.record_dim
        self.device = rows.device
        self.expired: Tensor | None = None  # the group's reads of expired rows per table (a TTL), on the device
        self.reset_step_stats()

    def take_expired_reads(self) -> int:
        """Reads of this table's expired rows since the last call (waits for the device)."""
        if self.expired is None:
            return 0
        n = int(self.expired[self.j])
        self.expired[self.j] = 0
        return n

    def _pairs(self, ids: Tensor) -> tuple[Tensor, Tensor]:
        keys = ids.to(self.device, torch.int64)
        return keys, torch.full_like(keys, self.j, dtype=torch.int32)

    def get_into(self, ids: Tensor, out: Tensor) -> Tensor:
        found, rec = self.rows.find(*self._pairs(ids))
        found = found.cpu()
        self.requests += ids.numel()
        self.hits += int(found.sum())
        at = torch.nonzero(found).squeeze(1)
        if at.numel():
            out.index_copy_(0, at.to(out.device), rec.index_select(0, at.to(rec.device)).to(out.device))
        return found

    def put(self, ids: Tensor, records: Tensor, counts: np.ndarray | None = None) -> None:
        if ids.numel():
            self.rows.put(*self._pairs(ids), records.to(self.device, torch.float32))
            self.inserts += ids.numel()

    def remove(self, ids: Tensor) -> Tensor:
        return self.rows.remove(*self._pairs(ids)).cpu()

    def contains(self, ids: Tensor) -> Tensor:
        return self.rows.contains(*self._pairs(ids)).cpu()

    def evict(self, n: int) -> tuple[Tensor, Tensor]:
        """Nothing: the rows are unbounded (host memory holds every one)."""
        return torch.empty(0, dtype=torch.int64), torch.empty(0, self.record_dim)

    def items(self, chunk_rows: int = 1 << 20) -> Iterator[tuple[Tensor, Tensor]]:
        for keys, _, rec in self.rows.items(chunk_rows, table=self.j):
            yield keys, rec

    def stats(self) -> dict[str, float]:
        """``tier.host.*``, and with hot rows ``tier.device.*``: the group's training reads since
        this table's last stats and the share of them served from device memory (one figure for
        the group's tables, which share the hot rows; waits for the device)."""
        out = super().stats()
        hot = self.rows.hot
        if hot is not None:
            hits, reads = hot.hit_reads()
            dh, dr = hits - self._hot_seen[0], reads - self._hot_seen[1]
            self._hot_seen = (hits, reads)
            out.update({"tier.device.hit_rate": dh / dr if dr else float("nan"), "tier.device.hits": float(dh),
                        "tier.device.requests": float(dr), "tier.device.rows": float(hot.capacity),
                        "tier.device.bytes": float(hot.nbytes)})
        return out

    def __len__(self) -> int:
        return int(self.rows.table_counts(self.tables)[self.j])

    @property
    def nbytes(self) -> int:
        """This table's share of the group's host rows and device index."""
        return self.rows.nbytes // self.tables
