"""One device cache for a whole table group: one arena, decisions on the host, a fixed device sequence.

A table group whose tables each have a device cache (``storage.device_rows``) gets one
``GroupCache`` instead of one cache per table: a single arena of records ``[weights |
optimizer state]`` on the device for all of the group's tables, one host index per table from
ID to arena slot, one admission sketch and one eviction policy (LFU / LRU) over the group.
Each table's ``tier`` becomes a ``GroupCacheView``, a ``Tier`` over its share (checkpoints,
exports, serving and TTL sweeps read and write through it, unchanged).

A training lookup of the group takes the fast path (``fetch`` / ``load`` / ``write_back``):

- fetch (host only): probe the index; decide which misses to admit (seen ``admit_after``
  times; with LFU only if more often than the coldest rows they displace) and which rows they
  displace; read the misses from the slower tiers (host memory, disk) into one pinned staging
  buffer with every index the device needs; the group fills fresh rows for IDs seen first.
- load (device): one copy of that buffer to the device, one gather + one non-blocking copy to
  pinned host memory of the displaced rows (``send`` does these two ahead when the lookup is
  prepared before the write-back of the lookup before it), one gather of the batch's rows from
  the arena, one scatter of the staged rows into them.
- write_back (host first): the admitted rows enter the index and leave their slower tier. Then
  the device: one scatter of the updated rows into the arena, the rows not cached into the
  spill rows after the arena's slots, and one non-blocking copy of those to the host (to their
  slower tier).

A lookup prepared ahead (``GroupLookup.prepare``: fetch and ``send`` while the lookup before it
still computes) is brought up to that lookup's write-back before its load: the misses it stored
meanwhile are read again into the staged plan on the host (``stored_since``, ``reread``: from
the arena, the spill rows or the slower tier) and its ticket settled (``_settle``).

Nothing in either waits on the device: rows on their way to the host are "pending" until a
CUDA event says they arrived; a later read of such an ID waits for that event alone. The
number of device operations does not depend on the number of tables, and no operation reads
device data back to the host inside a step (``ember.tiers.device_budget`` counts both).

The chain stays exclusive: an ID lives in the arena or in its table's slower tier, never both.
"""

from __future__ import annotations

import logging
import weakref
from dataclasses import dataclass, field
from typing import Iterator, Sequence

import numpy as np
import torch
from torch import Tensor

from ember import _native, once
from ember.errors import CapacityError
from ember.fileio import fmt_bytes
from ember.tiers.base import Tier, TierCounters
from ember.tiers.device_budget import mark_device
from ember.tiers.key_index import KeyIndex
from ember.tiers.policy import CountMinSketch, Policy
from ember.tiers.segments import read_segments, remove_segments, write_segments

__all__ = ["GroupCache", "GroupCacheView", "CachePlan", "CacheTicket", "table_mix"]

log = logging.getLogger("ember.tiers")

_MIX = np.uint64(0x9E3779B97F4A7C15)


def table_mix(tables: int) -> np.ndarray:
    """int64 [tables]: the constant each table of a group mixes into its IDs (key = ID ^ mix[j]),
    so one index or key set holds every table's IDs apart."""
    return (np.arange(1, tables + 1, dtype=np.uint64) * _MIX).view(np.int64)


@dataclass
class CacheTicket:
    """What a training lookup's fetch decided, for its write_back.

    ``slots``: the arena slot each row is written to (a hit's, or the one reserved for an
    admitted miss; -1: a miss not admitted, stored in its slower tier). ``new``: positions of
    the admitted misses (they enter the index at write_back, and leave their slower tier then).
    ``held``: slots no other lookup may take until write_back. ``dev``: the write-back's index
    vector, already on the device (valid while every row is kept and nothing was re-placed).
    """

    slots: np.ndarray
    new: np.ndarray
    bypass: np.ndarray
    held: np.ndarray
    dev: tuple[Tensor, Tensor] | None = None  # (each row's slot, or the trash row; bypass positions), on the device
    inserts: int = 0  # the cache's admitting write-backs at this fetch
    writes: int = 0  # and its write-backs
    new_in_slow: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=bool))  # per ``new``: read from a slower tier
    spill: bool = False  # ``dev`` sends the bypassed rows to the spill rows (no bypass positions)
    released: bool = False
    _finalizer: weakref.finalize | None = field(default=None, repr=False)


@dataclass
class CachePlan:
    """One lookup's read through a ``GroupCache``, decided on the host (``GroupCache.fetch``)."""

    sizes: list[int]
    miss: np.ndarray  # positions of the rows not in the arena
    found: np.ndarray  # bool [U]: in the arena or a slower tier (the others are fresh)
    staged: Tensor  # [M, R] host rows of the misses (fresh ones filled by the caller), a view of ``buf``
    buf: Tensor  # the pinned bytes load copies to the device: the int64 indexes, then the staged rows
    lens: list[int]  # the indexes' lengths: gather slots (U + 1), miss positions, victims, extra..., write slots, bypass
    n_extra: int
    victims: np.ndarray  # arena slots of the rows it displaced
    evicted: tuple[np.ndarray, np.ndarray]  # their (tables, IDs), table after table
    ticket: CacheTicket | None
    sent: bool = False  # the displaced rows are on their way to the host (``send``, or ``load``)
    settle: bool = False  # ``reread`` brings the ticket up to the one write-back since (``stored_since``)


@dataclass
class _Pending:
    """Rows copied (non-blocking) from the arena to host memory, bound for the slower tiers."""

    ids: list[np.ndarray]  # per table
    rows: Tensor  # [N, R] host (pinned when the arena is on a GPU), table after table
    event: "torch.cuda.Event | None"


class GroupCache:
    """The device cache of a table group (see the module docstring).

    Args:
        slow: each table's slower tier (the rest of its chain: host memory, disk, ...).
        capacity: arena rows for the whole group.
        record_dim: 4-byte words per record (all tables of a group share it).
        device: where the arena lives (a GPU, or host memory: the same logic, tested on CPU).
        policy: what to evict: ``lfu`` or ``lru``.
        admit_after: misses before an ID is admitted.
        names: the tables' names (error messages and stats).
    """

    # a victim scan ranks this many times the rows asked for; the rest wait in a queue for later
    # calls (re-checked there: still live, unheld, not accessed since). DLRM-26, 1/4 cache, Zipf
    # 1.05: 16 scans 3.5x less often than 4 (2 vs 7 in 40 steps), the victims' time 1.4 vs 2.1 ms
    # a step, the hit rate the same (0.7567); 32 re-checks too long a queue (4.4 ms a step)
    queue_factor = 16
    # spill rows: a write-back bypassing more rows sends them from a gather, and a lookup
    # re-reading one waits for its copy to the host (said once). 65,536 rows: 17 MiB of device
    # memory at 68 words a record; DLRM-26 at batch 4,096 bypasses ~10 k rows a step
    spill_at_most = 1 << 16

    def __init__(self, slow: Sequence[Tier], capacity: int, record_dim: int, device: torch.device,
                 policy: Policy = "lfu", admit_after: int = 1, names: Sequence[str] | None = None) -> None:
        if capacity <= 0:
            raise ValueError(f"GroupCache: capacity must be > 0 rows, got {capacity}")
        self.slow = list(slow)
        self.names = list(names) if names is not None else [f"t{j}" for j in range(len(self.slow))]
        self.check_room(capacity, record_dim, torch.device(device), self.names)
        self.capacity = capacity
        self.record_dim = record_dim
        self.device = torch.device(device)
        self.policy: Policy = policy
        self.admit_after = admit_after
        # one row more than the slots: the write-back scatters every row of a lookup at once, the
        # rows without a slot into this last one, which nothing reads (one operation, not two);
        # then the spill rows: a write-back's rows that bypass the cache land there, are copied to
        # the host from there, and the next lookup's re-read takes them from there (``reread``)
        # (left uninitialised: in host memory a spill row takes memory only once written)
        self.spill_rows = self.spill_at_most
        self.arena = torch.empty(capacity + 1 + self.spill_rows, record_dim, device=self.device)
        self.arena[: capacity + 1].zero_()
        self.trash = capacity
        # the last write-back's spill: its rows' keys (sorted), spill slots, tables and IDs
        self._spilled: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None = None
        self._spill_event: "torch.cuda.Event | None" = None  # when its copy to the host has read them
        # one index for the group: key = ID ^ a per-table constant; a hit is checked against the
        # slot's (table, ID), so two pairs that share a key never mix (the second is not cached)
        # ... sized for twice the slots it can hold: every eviction leaves a deleted bucket, and
        # at a load of <= 0.375 the rehash that clears them runs once per ~capacity admissions,
        # not every few batches (a steady-state cache admits and evicts thousands per batch)
        self.index = KeyIndex(2 * capacity)
        self.live = np.zeros(capacity, dtype=bool)  # slot is in the index (not free, not only reserved)
        self.rows_of = np.zeros(len(self.slow), dtype=np.int64)  # arena rows per table
        self.owner = np.full(capacity, -1, dtype=np.int32)  # table of each slot (-1: free)
        self.slot_id = np.zeros(capacity, dtype=np.int64)
        self.count = np.zeros(capacity, dtype=np.int64)  # accesses (LFU)
        self.last = np.zeros(capacity, dtype=np.int64)  # last access (LRU, LFU ties)
        self.held = np.zeros(capacity, dtype=np.int32)  # in-flight training lookups using the slot
        self._free = np.arange(capacity - 1, -1, -1, dtype=np.int64)  # a stack: slot 0 first
        self._nfree = capacity
        self.clock = 0
        # 8 counters per slot as a per-table cache has, up to 4 M per row (32 MiB in all): a whole
        # group's sketch sized like that would be touched at random by every miss of every step
        self.sketch = CountMinSketch(min(8 * capacity, 1 << 22))
        self.decay_every = 16 * self.sketch.width
        self.evict_slack = max(1, capacity // 64)  # rows demoted beyond need: amortises the O(capacity) victim scan
        self.pending: list[_Pending] = []
        self._queue: tuple[np.ndarray, np.ndarray] | None = None  # victims ranked by the last scan
        self._score: np.ndarray | None = None  # _scan_scores' buffer (allocated at the first scan)
        self.orphans: list[tuple[np.ndarray, np.ndarray]] = []  # (held, reserved) slots of tickets dropped without a write_back
        self.inserts = 0  # write-backs that admitted rows (a lookup fetched before one re-checks its misses)
        self.writes = 0  # write-backs
        self._mix = table_mix(len(self.slow))
        self.cuda = self.device.type == "cuda"
        self._copies = torch.cuda.Stream(self.device) if self.cuda else None  # host<->device copies
        self.views = [GroupCacheView(self, j) for j in range(len(self.slow))]

    @classmethod
    def check_room(cls, capacity: int, record_dim: int, device: torch.device, names: Sequence[str]) -> None:
        """Raise CapacityError, before allocating, when a GPU has no room for the arena
        (``capacity`` rows, the trash row and the spill rows, of ``record_dim`` words): each
        table's own check counts its ``device_rows`` only."""
        if device.type != "cuda":
            return
        need = (capacity + 1 + cls.spill_at_most) * record_dim * 4
        free, _ = torch.cuda.mem_get_info(device)
        # + what torch's allocator holds unused (the tables' own caches just freed): it gives that back on demand
        free += torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
        if need > free:
            raise CapacityError(
                f"table group {list(names)}: its device cache needs {fmt_bytes(need)} of GPU memory ({capacity:,} rows "
                f"and {cls.spill_at_most:,} spill rows of {record_dim * 4} B) but {fmt_bytes(free)} is free; lower "
                "storage.device_rows/device_bytes of its tables")

    # ---- host helpers ------------------------------------------------------------------
    def _host(self, rows: int, cols: int, dtype: torch.dtype = torch.float32) -> Tensor:
        return torch.empty(rows, cols, dtype=dtype, pin_memory=self.cuda)

    def _upload(self, host: Tensor) -> Tensor:
        """One host->device copy (non-blocking from pinned memory). On a GPU it runs on the
        cache's copy stream: it may overlap work queued before it (the step a pipeline computes
        while this batch is fetched); what is queued after it waits for it."""
        if not self.cuda:
            dst = torch.empty(host.shape, dtype=host.dtype, device=self.device)
            mark_device(dst)
            return dst.copy_(host, non_blocking=True)  # (as on a GPU: from pinned memory, no wait)
        if not host.is_pinned():
            host = host.pin_memory()
        current = torch.cuda.current_stream(self.device)
        with torch.cuda.stream(self._copies):
            dst = torch.empty(host.shape, dtype=host.dtype, device=self.device)
            dst.copy_(host, non_blocking=True)
        current.wait_stream(self._copies)
        dst.record_stream(current)
        return dst

    def _download(self, rows: Tensor, ids: list[np.ndarray]) -> None:
        """One non-blocking device->host copy of ``rows``, bound for the slower tiers (on a GPU
        on the copy stream, after the work that made ``rows``; an event says when it landed)."""
        if rows.shape[0] == 0:
            return
        host = self._host(rows.shape[0], self.record_dim)
        if not self.cuda:
            host.copy_(rows, non_blocking=True)  # (the same call as on a GPU: a download, not a wait)
            self.pending.append(_Pending(ids, host, None))
            self.drain()
            return
        self._copies.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self._copies):
            host.copy_(rows, non_blocking=True)
            event = torch.cuda.Event()
            event.record(self._copies)
        rows.record_stream(self._copies)
        self.pending.append(_Pending(ids, host, event))

    def _moved(self, rows_per_table: np.ndarray) -> None:
        """Count records that crossed between host and device memory, per table (none when
        the arena is in host memory)."""
        if self.device.type != "cpu":
            for v, n in zip(self.views, rows_per_table.tolist()):
                v.transfer_bytes += 4 * self.record_dim * n

    def _mark(self) -> None:
        mark_device(self.arena)

    def drain(self, wait: bool = True, needed: Sequence[np.ndarray] | None = None) -> None:
        """Store arrived pending rows in their slower tiers, oldest first. ``wait``: wait for
        every copy; else for the copies up to the last one holding an ID of ``needed`` (per
        table), and the rest as far as they have arrived (in order: a later copy of an ID
        must land after an earlier one)."""
        if not self.pending:
            return
        last = len(self.pending) - 1 if wait else max(
            (i for i, p in enumerate(self.pending) if needed is not None and _overlaps(p.ids, needed, self._mix)), default=-1)
        done = 0
        for i, p in enumerate(self.pending):
            if p.event is not None and not p.event.query():
                if i > last:
                    break
                p.event.synchronize()
            write_segments(self.slow, [torch.from_numpy(ids) for ids in p.ids], p.rows)  # one native pass
            done = i + 1
        del self.pending[:done]

    def find(self, tables: np.ndarray, ids: np.ndarray, touch: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """Arena slot of each unique (table, ID) (-1 where absent), int64, and whether its key is
        taken by another pair (a collision: that pair is not cached). ``touch``: count an access
        of each hit (LFU count, LRU time) and hold its slot for the caller's write_back. One
        native pass (``_native.pair_find``)."""
        out = np.empty(ids.size, dtype=np.int64)
        _native.pair_find(self.index.keys, self.index.slots, ids, self._mix[tables], self.slot_id,
                          self.count if touch and self.policy == "lfu" else None, self.last if touch else None,
                          self.held if touch else None, self.clock, out)
        taken = out == -2
        out[taken] = -1
        return out, taken

    def _insert(self, tables: np.ndarray, ids: np.ndarray, slots: np.ndarray) -> None:
        """Admitted (table, ID) pairs enter the index at ``slots``, and the slot arrays: one
        pass (``_native.gc_insert``)."""
        self.index.reserve(ids.size)
        used = _native.gc_insert(self.index.keys, self.index.slots, ids, tables, slots, self._mix, self.slot_id,
                                 self.owner, self.live, self.rows_of)
        self.index.placed(ids.size, used)

    def remove_slots(self, slots: np.ndarray) -> None:
        """Take live ``slots`` out of the index and free them (their rows are the caller's)."""
        tables = self.owner[slots].astype(np.int64)
        self.index.remove(self.slot_id[slots] ^ self._mix[tables])
        self.live[slots] = False
        self.rows_of -= np.bincount(tables, minlength=len(self.slow))
        self._free_slots(slots)

    def table_slots(self, j: int) -> np.ndarray:
        """The live slots of table ``j`` (a scan of the slot arrays: for checkpoints, not steps)."""
        return np.flatnonzero(self.live & (self.owner == j))

    def _free_slots(self, slots: np.ndarray) -> None:
        self.owner[slots] = -1
        self.count[slots] = 0
        self._free[self._nfree : self._nfree + slots.size] = slots[::-1]
        self._nfree += slots.size

    def _victims(self, n: int) -> np.ndarray:
        """The ``n`` best victims among live, unheld slots (fewer if not that many), best first.

        A scan of every slot ranks ``queue_factor`` x more than asked (ties: the lower slot first) and keeps
        the rest in a queue; later calls take from the queue the entries whose score has not
        changed since (still live, unheld, not accessed), and scan again only when it runs
        short. Both are one pass in C (``_native.gc_requeue``, ``gc_scan``: a radix select,
        not a sort of the whole arena's scores)."""
        lru = self.policy == "lru"
        if self._queue is not None:
            q_slots, q_score = self._queue
            kept = _native.gc_requeue(self.last, self.count, self.live, self.held, lru, q_slots, q_score)
            q_slots, q_score = q_slots[:kept], q_score[:kept]
            if kept >= n:
                self._queue = (q_slots[n:], q_score[n:])
                return q_slots[:n]
        if self._score is None:  # the scan's scores: a buffer kept for it (no temporaries)
            self._score = np.empty(self.capacity, dtype=np.int64)
        k = min(self.queue_factor * n, self.capacity)
        pick, score = np.empty(k, dtype=np.int64), np.empty(k, dtype=np.int64)
        found = _native.gc_scan(self.last, self.count, self.live, self.held, lru, self._score, pick, score)
        self._queue = (pick[n:found], score[n:found])
        return pick[: min(n, found)]

    def _count(self, keys: np.ndarray) -> np.ndarray:
        est = self.sketch.add(keys)
        if self.sketch.added >= self.decay_every:
            self.sketch.halve()
            self.count >>= 1
            est >>= 1
        return est

    # ---- the fast path -----------------------------------------------------------------
    def fetch(self, ids: np.ndarray, sizes: Sequence[int], train: bool, extra: Sequence[Tensor] = (),
              stats: bool = True) -> "CachePlan":
        """The host half of a lookup's read of ``ids`` (int64: each table's unique IDs, table
        after table, ``sizes`` of them): probe, (training) decide admissions and victims, and
        read the misses from the slower tiers straight into the pinned buffer ``load`` copies to
        the device (with the indexes and ``extra``: int64 host tensors the step needs there, the
        lookup's pooling indexes). The caller fills the fresh rows of misses not ``found`` into
        ``plan.staged``, then calls ``load``. ``stats`` False: the read is no request of the
        tables' hit-rate counters (a pipeline's re-read of rows written since a fetch)."""
        sizes = list(sizes)
        self._adopt_orphans()
        self.drain(wait=False)
        owner = np.repeat(np.arange(len(sizes), dtype=np.int64), sizes)
        self.clock += 1
        slots, taken = self.find(owner, ids, touch=train)
        hit = slots >= 0
        miss = np.flatnonzero(~hit)
        ends = np.searchsorted(miss, np.cumsum(sizes))  # each table's misses end here (positions ascend)
        missed = np.diff(ends, prepend=0).tolist()
        if stats:
            for v, n, m in zip(self.views, sizes, missed):
                v.requests += n
                v.hits += n - m
        none = np.empty(0, np.int64)
        ticket, victims, evicted = None, none, (none, none)
        if train:  # (find counted the hits' accesses and holds their slots until write_back: no one's victims)
            ticket, victims, evicted = self._plan_admission(ids, owner, slots, taken, miss)
        # one pinned buffer for the upload: the indexes (int64, aligned first), then the staged rows
        # (the gather takes one spare row more, slot 0, for ``reread``'s redirected misses); each
        # index written in its place
        extra_np = [x.numpy() for x in extra]
        spill = ticket is not None and self._spills(ticket.bypass)
        lens = [ids.size + 1, miss.size, victims.size, *(x.size for x in extra_np)]
        if ticket is not None:
            lens += [ids.size, 0 if spill else ticket.bypass.size]
        floats = miss.size * self.record_dim
        head = 8 * sum(lens)
        buf = self._host(1, head + 4 * floats, torch.uint8).view(-1)
        parts = np.split(buf[:head].view(torch.int64).numpy(), np.cumsum(lens)[:-1])
        np.maximum(slots, 0, out=parts[0][:-1])  # a miss gathers slot 0, overwritten by its staged row
        parts[0][-1] = 0
        for part, x in zip(parts[1:], [miss, victims, *extra_np]):
            part[:] = x
        if ticket is not None:
            w = parts[3 + len(extra_np)]
            np.copyto(w, ticket.slots)
            w[ticket.slots < 0] = self.trash
            ticket.spill = self._to_spill(w, ticket.bypass)
            parts[-1][:] = ticket.bypass[: parts[-1].size]
        staged = buf[head:].view(torch.float32).view(miss.size, self.record_dim)
        found = hit.copy()
        if miss.size:
            per_table = [torch.from_numpy(x) for x in np.split(ids[miss], ends[:-1])]  # (positions ascend: table after table)
            if self.pending:
                self.drain(wait=False, needed=[t.numpy() for t in per_table])
            found[miss] = read_segments(self.slow, per_table, staged).numpy()
            self._moved(np.asarray(missed))
        if ticket is not None:
            ticket.new_in_slow = found[ticket.new]  # the others were first sightings: in no slower tier
        return CachePlan(sizes=sizes, miss=miss, found=found, staged=staged, buf=buf, lens=lens, n_extra=len(extra),
                         victims=victims, evicted=evicted, ticket=ticket)

    def _plan_admission(self, ids: np.ndarray, owner: np.ndarray, slots: np.ndarray, taken: np.ndarray,
                        miss: np.ndarray) -> tuple[CacheTicket, np.ndarray, tuple[np.ndarray, np.ndarray]]:
        """A training lookup's misses: which are admitted (a reserved slot each) and which rows
        they displace (their slots, and their (tables, IDs)); the ticket its write_back takes."""
        est = np.empty(0, np.int64)
        if miss.size and self.admit_after == 1 and miss.size <= self._nfree:
            # room for every miss, admitted at first sight: no count decides anything yet
            est = np.ones(miss.size, dtype=np.int64)
            est[taken[miss]] = 0
        elif miss.size:
            est = self._count(ids[miss] ^ self._mix[owner[miss]])
            est[taken[miss]] = 0  # its key belongs to another (table, ID): it stays in its slower tier
        admitted, victims, evicted = self._admit(est)
        new = miss[admitted]
        w_slots = np.where(slots >= 0, slots, -1)
        if new.size:  # slots off the free stack, held for the write_back (one pass: _native.gc_reserve)
            _native.gc_reserve(self._free, self._nfree, new, owner[new], est[admitted], self.clock, self.owner,
                               self.count, self.last, self.held, w_slots)
            self._nfree -= new.size
        not_new = np.ones(miss.size, dtype=bool)
        not_new[admitted] = False
        ticket = CacheTicket(w_slots, new, miss[not_new], w_slots[w_slots >= 0])
        self._watch(ticket)
        ticket.inserts, ticket.writes = self.inserts, self.writes
        return ticket, victims, evicted

    def _watch(self, ticket: CacheTicket) -> None:
        """Give back the ticket's held and reserved slots if it is dropped without its
        write-back or release (``_orphaned``); called again whenever they change."""
        if ticket._finalizer is not None:
            ticket._finalizer.detach()
        ticket._finalizer = weakref.finalize(ticket, _orphaned, weakref.ref(self), ticket.held, ticket.slots[ticket.new])

    def _spills(self, bypass: np.ndarray) -> bool:
        """Whether the rows that bypass the cache (positions ``bypass``) go to the spill rows."""
        return 0 < bypass.size <= self.spill_rows

    def _to_spill(self, w_slots: np.ndarray, bypass: np.ndarray) -> bool:
        """Write slots of a lookup's rows that bypass the cache (positions ``bypass``): the
        spill rows, in their order (the write-back's ``_spilled`` and its copy to the host read
        them so), when there are some and they fit; True then. Else ``w_slots`` is left as is
        (the trash row) and the rows go to the host from a gather of their positions."""
        if not self._spills(bypass):
            return False
        w_slots[bypass] = self.trash + 1 + np.arange(bypass.size)
        return True

    def _send_victims(self, plan: "CachePlan", slots: Tensor) -> None:
        """The displaced rows (at ``slots`` on the device) gathered and copied towards the host."""
        tables, ids = plan.evicted
        self._download(self.arena.index_select(0, slots), _split_by_table(ids, tables, len(plan.sizes)))

    def send(self, plan: "CachePlan") -> None:
        """A lookup prepared ahead of its load: its displaced rows gathered and copied (non-
        blocking) towards the host now, right after ``fetch`` took them out of the index, so
        they are on their way before any later write-back stores rows of the same IDs (the
        lookup before it writes back between this and ``load``). One upload of their slots;
        ``load`` sends a plan not sent yet with the rest, in its one upload."""
        if plan.sent:
            return
        plan.sent = True
        if plan.victims.size:
            self._mark()
            self._send_victims(plan, self._upload(torch.from_numpy(plan.victims)))

    def stored_since(self, plan: "CachePlan", ids: np.ndarray) -> np.ndarray | None:
        """Positions among ``plan.miss`` (ascending) that a write-back stored since the plan's
        ``fetch``, from the cache's own state, when exactly one write-back ran since and its
        bypassed rows are in the spill rows: a miss then is now in the arena (that write-back
        admitted it) or in the spill rows (it bypassed it). A hit of that write-back's lookup
        was held in the arena, so it was a hit of this plan too. None when the cache cannot
        tell (the caller intersects with the keys of what was written)."""
        t = plan.ticket
        if t is None or self.writes - t.writes != 1 or self._spilled is None:
            return None
        miss = plan.miss
        owner = np.repeat(np.arange(len(plan.sizes), dtype=np.int64), plan.sizes)[miss]
        slots, taken = self.find(owner, ids[miss])
        now = slots >= 0
        if self._spilled[0].size:
            now |= self._spill_slots(owner, ids[miss]) >= 0
        # ``reread`` may settle the ticket then (see ``_settle``): unless an admission's key is
        # now another pair's, or bypassed rows go to the host from a gather (a fixed list)
        is_new = np.zeros(t.slots.size, dtype=bool)
        is_new[t.new] = True
        plan.settle = not (taken & is_new[miss]).any() and (t.spill or not t.bypass.size)
        return miss[now]

    def reread(self, plan: "CachePlan", ids: np.ndarray, at: np.ndarray) -> int:
        """Before ``load``: the rows at positions ``at`` (ascending, among ``plan.miss``) were
        stored by a write-back since ``fetch`` read them from the slower tiers (or found them
        nowhere): read them again into the plan, on the host, before it goes to the device.
        Those in the arena or its spill rows now are gathered from there (their miss rows are
        sent to the spare row ``load`` gathers, which nothing reads); the others are read from
        their slower tier into the staged rows. No device operation. Returns the rows re-read."""
        if not at.size:
            return 0
        owner = np.repeat(np.arange(len(plan.sizes), dtype=np.int64), plan.sizes)
        slots, _ = self.find(owner[at], ids[at])
        hit = slots >= 0
        on_device = slots.copy()  # the arena row each is gathered from: its slot, or its spill row
        if self._spilled is not None and not hit.all():  # bypassed by the last write-back: in the spill rows
            on_device[~hit] = self._spill_slots(owner[at[~hit]], ids[at[~hit]])
        there = on_device >= 0
        k = np.searchsorted(plan.miss, at)  # their rows of ``staged``
        ints = plan.buf[: 8 * sum(plan.lens)].view(torch.int64).numpy()
        ints[at[there]] = on_device[there]
        ints[plan.lens[0] + k[there]] = plan.lens[0] - 1
        plan.found[at[there]] = True
        outside = [at[there & ~hit]]  # re-read from outside the arena (spill rows, slower tier)
        rest = np.flatnonzero(~there)
        if rest.size:
            per_table = _split_by_table(ids[at[rest]], owner[at[rest]], len(plan.sizes))
            if self.pending:
                self.drain(wait=False, needed=per_table)
            rows = torch.empty(rest.size, self.record_dim)
            found = read_segments(self.slow, [torch.from_numpy(x) for x in per_table], rows).numpy()
            if found.any():
                plan.staged[torch.from_numpy(k[rest[found]])] = rows[torch.from_numpy(np.flatnonzero(found))]
                plan.found[at[rest[found]]] = True
                self._moved(np.bincount(owner[at[rest[found]]], minlength=len(plan.sizes)))
                outside.append(at[rest[found]])
        if plan.settle:
            self._settle(plan, at[hit], slots[hit], np.concatenate(outside))
        return int(there.sum()) + int(found.sum() if rest.size else 0)

    def _settle(self, plan: "CachePlan", in_arena: np.ndarray, arena_slots: np.ndarray, outside: np.ndarray) -> None:
        """``reread``, after the one write-back since the plan's ``fetch`` (``stored_since``):
        bring its ticket up to that write-back, so that its own write-back finds nothing to
        re-check (no probe of its misses, no second upload of its write slots). Misses now in
        the arena (``in_arena``, at ``arena_slots``) are written there, and held until then;
        the slots reserved for those it would have admitted go back to the free ones (held
        until its release); misses now in a slower tier or the spill rows (``outside``) are
        removed from there if admitted; the write slots in the plan's buffer follow."""
        t = plan.ticket
        assert t is not None
        n = t.slots.size
        is_new = np.zeros(n, dtype=bool)
        is_new[t.new] = True
        is_bypass = np.zeros(n, dtype=bool)
        is_bypass[t.bypass] = True
        if in_arena.size:
            self._free_slots(t.slots[in_arena[is_new[in_arena]]])  # (in t.held: given back at its release)
            t.slots[in_arena] = arena_slots
            self.held[arena_slots] += 1
            t.held = np.concatenate([t.held, arena_slots])
            is_new[in_arena] = is_bypass[in_arena] = False
        in_slow = np.zeros(n, dtype=bool)
        in_slow[t.new] = t.new_in_slow
        in_slow[outside] = True
        t.new = t.new[is_new[t.new]]
        t.new_in_slow = in_slow[t.new]
        t.bypass = t.bypass[is_bypass[t.bypass]]
        at = sum(plan.lens[: 3 + plan.n_extra])  # the write slots' place in the buffer
        w = plan.buf[: 8 * sum(plan.lens)].view(torch.int64).numpy()[at : at + n]
        w[in_arena] = arena_slots
        if t.spill:  # (fewer bypassed rows now: they still fit)
            self._to_spill(w, t.bypass)
        t.inserts, t.writes = self.inserts, self.writes
        self._watch(t)

    def _spill_slots(self, tables: np.ndarray, ids: np.ndarray) -> np.ndarray:
        """The spill row of each (table, ID) the last write-back bypassed, else -1."""
        assert self._spilled is not None
        keys, slots, s_tables, s_ids = self._spilled
        out = np.full(ids.size, -1, dtype=np.int64)
        if not keys.size:
            return out
        i = np.minimum(np.searchsorted(keys, ids ^ self._mix[tables]), keys.size - 1)
        same = (s_ids[i] == ids) & (s_tables[i] == tables)
        out[same] = slots[i[same]]
        return out

    def load(self, plan: "CachePlan") -> tuple[Tensor, list[Tensor]]:
        """The device half of a lookup's read, a fixed few operations: one host->device copy
        (staged rows, indexes and the ``extra`` tensors in one buffer), the displaced rows
        gathered and copied (non-blocking) towards the host (unless ``send`` did), the rows
        gathered from the arena and the staged ones put in place. Returns the rows [U, R] and
        ``extra`` on the device."""
        t, lens, m = plan.ticket, plan.lens, plan.miss.size
        head = 8 * sum(lens)
        self._mark()
        dev = self._upload(plan.buf)
        dint = dev[:head].view(torch.int64).split(lens)
        if not plan.sent:
            plan.sent = True
            if plan.victims.size:  # read before anything reuses their slots (one stream: in order)
                self._send_victims(plan, dint[2])
        rows = self.arena.index_select(0, dint[0])  # (one spare row at the end: see ``reread``)
        if m:
            rows.index_copy_(0, dint[1], dev[head:].view(torch.float32).view(m, self.record_dim))
        k = 3 + plan.n_extra
        if t is not None:
            t.dev = (dint[k], dint[k + 1])
        return rows[:-1], list(dint[3:k])

    def write_back(self, ticket: CacheTicket, ids: np.ndarray, sizes: Sequence[int], rows: Tensor,
                   keep: np.ndarray) -> None:
        """Store the rows of positions ``keep`` (bool [U]; the rest are dropped: tables not
        updated, IDs below ``min_count``) of the lookup's ``ids`` (as ``fetch`` had them): into
        the arena where they have a slot, the others (non-blocking) towards their slower tier.
        Admitted rows enter the index now."""
        sizes = list(sizes)
        owner = np.repeat(np.arange(len(sizes), dtype=np.int64), sizes)
        slots = ticket.slots.copy()
        changed = not keep.all()
        new = ticket.new
        bypass = ticket.bypass[keep[ticket.bypass]]
        self._adopt_orphans()
        others = self.inserts != ticket.inserts  # another lookup admitted rows since this one's fetch: maybe our misses
        if others and bypass.size:  # admitted by another lookup meanwhile: its row is in the arena now
            again_b, _ = self.find(owner[bypass], ids[bypass])
            moved = again_b >= 0
            if moved.any():
                changed = True
                slots[bypass[moved]] = again_b[moved]
                bypass = bypass[~moved]
        if new.size:
            # admitted meanwhile by another lookup (or its key taken by another pair), or not stored at all
            again, taken = self.find(owner[new], ids[new]) if others else (np.full(new.size, -1, np.int64), np.zeros(new.size, bool))
            dup = (again >= 0) | taken | ~keep[new]
            if dup.any():
                changed = True
                gone = slots[new[dup]]  # (still in ticket.held: the release below gives them back; no
                self._free_slots(gone)  # one reserves a free slot before it, under the same lock)
                slots[new[dup]] = again[dup]
                clash = new[taken & keep[new]]  # kept, but no slot to go to: to its slower tier
                if clash.size:
                    bypass = np.sort(np.concatenate([bypass, clash]))
            stored = np.zeros(slots.size, dtype=bool)  # positions, table after table (admission ranked them by
            stored[new[~dup]] = True                    # frequency): a mask's scan, not a sort
            ok = np.flatnonzero(stored)
            if ok.size:
                self._insert(owner[ok], ids[ok], slots[ok])
                self.inserts += 1
                cut = np.searchsorted(owner[ok], np.arange(1, len(sizes)))
                if self.pending:  # an older copy of one of them on its way to the slower tier lands first
                    self.drain(wait=False, needed=[ids[sel] for sel in np.split(ok, cut)])
                # exclusive: it now lives in the arena. A first sighting is in no slower tier unless
                # another lookup wrote it there since this one's fetch
                in_slow = np.zeros(slots.size, dtype=bool)
                in_slow[new] = ticket.new_in_slow
                there = ok if self.writes != ticket.writes else ok[in_slow[ok]]
                if there.size:  # one pass over the slower tiers' indexes (segments table after table)
                    remove_segments(self.slow, [torch.from_numpy(x) for x in _split_by_table(ids[there], owner[there], len(sizes))])
                for v, c in zip(self.views, np.bincount(owner[ok], minlength=len(sizes)).tolist()):
                    v.inserts += c
        self._mark()
        if changed or ticket.dev is None:
            w_slots = np.where(keep & (slots >= 0), slots, self.trash)
            spill = self._to_spill(w_slots, bypass)
            b = bypass[:0] if spill else bypass
            dev = self._upload(torch.from_numpy(np.concatenate([w_slots, b]).astype(np.int64))).split([slots.size, b.size])
            c_slots, b_pos = dev[0], dev[1]
        else:
            spill = ticket.spill
            c_slots, b_pos = ticket.dev
        if spill and self._spill_event is not None:  # (a GPU: the last spill's copy to the host has read it)
            torch.cuda.current_stream(self.device).wait_event(self._spill_event)
        if c_slots.numel():
            self.arena.index_copy_(0, c_slots, rows)
        if not bypass.size:
            none = np.empty(0, np.int64)
            self._spilled = (none, none, none, none)  # (nothing bypassed)
        else:
            split = _split_by_table(ids[bypass], owner[bypass], len(sizes))
            if spill:
                self._download(self.arena[self.trash + 1 : self.trash + 1 + bypass.size], split)
                self._spill_event = self.pending[-1].event if self.pending else None
                keys = ids[bypass] ^ self._mix[owner[bypass]]
                order = np.argsort(keys, kind="stable")
                self._spilled = (keys[order], self.trash + 1 + order, owner[bypass][order], ids[bypass][order])
            else:
                self._spilled = None
                if once.first("group_cache.spill", self.names[0]):
                    log.info("table group of '%s': a write-back bypassed the device cache with %d rows, more than its "
                             "%d spill rows: they go to the host from a gather, and a later batch that reads one of "
                             "them before its copy lands waits for it", self.names[0], bypass.size, self.spill_rows)
                self._download(rows.index_select(0, b_pos), split)
            n = np.bincount(owner[bypass], minlength=len(sizes))
            for j, c in enumerate(n.tolist()):
                self.views[j].bypasses += c
            self._moved(n)
        self._release(ticket)
        self.writes += 1

    def _admit(self, est: np.ndarray) -> tuple[np.ndarray, np.ndarray, tuple[np.ndarray, np.ndarray]]:
        """Which candidates (indices into ``est``) get a slot, most frequent first, and the
        slots emptied for them with their (tables, IDs), table after table (their IDs leave the
        index now; ``load`` sends their rows on):
        free slots go to candidates seen ``admit_after`` times; beyond them a candidate must
        (LFU) be seen more often than the resident it displaces. Emptying makes room for
        ``evict_slack`` more rows than needed, so the O(capacity) victim scan runs once per
        several batches."""
        none = np.empty(0, np.int64)
        ok = np.flatnonzero(est >= self.admit_after)
        if ok.size == 0:
            return ok, none, (none, none)
        ok = ok[np.argsort(-est[ok], kind="stable")][: self.capacity]
        free = self._nfree
        if ok.size <= free:
            return ok, none, (none, none)
        rest = ok.size - free
        victims = self._victims(rest + self.evict_slack)
        m = min(rest, victims.size)
        if self.policy == "lfu":
            beats = est[ok[free : free + m]] > self.count[victims[:m]]
            n_beat = m if beats.all() else int(np.argmin(beats))
        else:
            n_beat = m
        if n_beat == 0:
            return ok[:free], none, (none, none)
        victims = victims[: n_beat + self.evict_slack]
        victims = victims[np.argsort(self.owner[victims], kind="stable")]  # table after table, as the pending rows
        tables, ids = self.owner[victims].astype(np.int64), self.slot_id[victims].copy()
        per_table = np.bincount(tables, minlength=len(self.slow))
        for v, n in zip(self.views, per_table.tolist()):
            v.evictions += n
        self._moved(per_table)
        self.remove_slots(victims)
        return ok[: free + n_beat], victims, (tables, ids)

    def _adopt_orphans(self) -> None:
        while self.orphans:
            held, reserved = self.orphans.pop()
            _native.gc_release(self.held, held)
            self._free_slots(reserved)  # (never inserted: only its write-back would have)

    def _release(self, ticket: CacheTicket) -> None:
        if ticket.released:
            return
        ticket.released = True
        if ticket._finalizer is not None:
            ticket._finalizer.detach()
        _native.gc_release(self.held, ticket.held)

    def release(self, ticket: CacheTicket | None) -> None:
        """A training lookup that will not write back (no table of it reached the loss, a
        skipped step, a stream stopped after its fetch) gives its slots back for eviction, and
        the slots it reserved for admissions back to the free ones (they never entered the index)."""
        if ticket is None or ticket.released:
            return
        self._release(ticket)
        self._free_slots(ticket.slots[ticket.new])


def _orphaned(ref: "weakref.ref[GroupCache]", held: np.ndarray, reserved: np.ndarray) -> None:
    """A ticket dropped without its write_back (its lookup garbage-collected, on whatever thread
    that happens): its slots are given back by the cache's next fetch or write_back, which run
    under the trainer's tiers lock (``list.append`` is atomic; the slot arrays are not), and
    the slots it reserved for admissions go back to the free ones."""
    cache = ref()
    if cache is not None:
        cache.orphans.append((held, reserved))


def _overlaps(a: list[np.ndarray], b: Sequence[np.ndarray], mix: np.ndarray) -> bool:
    """Whether table j's IDs ``a[j]`` and ``b[j]`` share one, for some j: one sorted search over
    every table, each ID salted by its table's ``mix`` (two pairs that share a key answer yes:
    at worst a wait that was not needed, never a missed one)."""
    x = np.concatenate([ids ^ mix[j] for j, ids in enumerate(a) if ids.size] or [np.empty(0, np.int64)])
    y = np.concatenate([ids ^ mix[j] for j, ids in enumerate(b[: len(a)]) if ids.size] or [np.empty(0, np.int64)])
    if x.size == 0 or y.size == 0:
        return False
    x.sort()
    at = np.minimum(np.searchsorted(x, y), x.size - 1)
    return bool((x[at] == y).any())


def _split_by_table(ids: np.ndarray, owner: np.ndarray, n: int) -> list[np.ndarray]:
    """``ids`` as one array per table, in table order (views). ``owner`` ascends: the rows they
    go with are ordered table after table, and stay in that order."""
    return np.split(ids, np.searchsorted(owner, np.arange(1, n)))


class GroupCacheView(TierCounters, Tier):
    """Table ``j``'s rows of a ``GroupCache`` as a ``Tier`` (its arena share + its slower tier)."""

    name = "device"

    def __init__(self, cache: GroupCache, j: int) -> None:
        self.cache = cache
        self.j = j
        self.record_dim = cache.record_dim
        self.device = cache.device
        self.policy = cache.policy
        self.reset_step_stats()

    @property
    def slow(self) -> Tier:
        return self.cache.slow[self.j]

    @property
    def capacity(self) -> int | None:  # type: ignore[override]
        return self.slow.capacity

    @property
    def arena_rows(self) -> int:
        """This table's rows in the group's arena."""
        return int(self.cache.rows_of[self.j])

    def __len__(self) -> int:
        self.cache.drain()
        return self.arena_rows + len(self.slow)

    @property
    def nbytes(self) -> int:
        c = self.cache
        n = max(len(c.slow), 1)
        return (c.arena.numel() * 4 + c.index.nbytes) // n + self.slow.nbytes

    def _slots(self, ids: Tensor) -> np.ndarray:
        ids_np = ids.numpy()
        return self.cache.find(np.full(ids_np.size, self.j, dtype=np.int64), ids_np)[0]

    def _table_rows(self, take: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        slots = self.cache.table_slots(self.j)[:take]
        return self.cache.slot_id[slots].copy(), slots

    def _gather(self, slots: np.ndarray) -> Tensor:
        return self.cache.arena.index_select(0, torch.from_numpy(slots).to(self.device)).cpu()
    def contains(self, ids: Tensor) -> Tensor:
        self.cache.drain()
        inc = torch.from_numpy(self._slots(ids) >= 0)
        if bool(inc.all()):
            return inc
        rest = ~inc
        inc[rest] = self.slow.contains(ids[rest])
        return inc

    def get_into(self, ids: Tensor, out: Tensor) -> Tensor:
        """Records of found ``ids`` into ``out`` (no admission: the fast path admits)."""
        self.cache.drain()
        slots = self._slots(ids)
        hit = slots >= 0
        found = torch.from_numpy(hit.copy())
        if hit.any():
            pos = torch.from_numpy(np.flatnonzero(hit)).to(out.device)
            rows = self.cache.arena.index_select(0, torch.from_numpy(slots[hit]).to(self.device))
            out.index_copy_(0, pos, rows.to(out.device))
        if not hit.all():
            rest = np.flatnonzero(~hit)
            buf = out.new_empty(rest.size, self.record_dim)
            f = self.slow.get_into(ids[torch.from_numpy(rest)], buf)
            keep = torch.from_numpy(rest[f.numpy()])
            out.index_copy_(0, keep.to(out.device), buf[f.to(buf.device)])
            found[keep] = True
        return found

    def put(self, ids: Tensor, records: Tensor, counts: np.ndarray | None = None) -> None:
        """Overwrite rows where they live; new IDs go to the slower tier (the fast path admits)."""
        self.cache.drain()
        slots = self._slots(ids)
        hit = slots >= 0
        if hit.any():
            pos = torch.from_numpy(np.flatnonzero(hit))
            self.cache.arena.index_copy_(0, torch.from_numpy(slots[hit]).to(self.device),
                                         records.index_select(0, pos.to(records.device)).to(self.device))
        if not hit.all():
            rest = torch.from_numpy(np.flatnonzero(~hit))
            self.slow.put(ids[rest], records.index_select(0, rest.to(records.device)))

    def remove(self, ids: Tensor) -> Tensor:
        self.cache.drain()
        slots = self._slots(ids)
        hit = slots >= 0
        if hit.any():
            self.cache.remove_slots(slots[hit])
        found = torch.from_numpy(hit.copy())
        if not hit.all():
            rest = torch.from_numpy(np.flatnonzero(~hit))
            found[rest] = self.slow.remove(ids[rest])
        return found

    def evict(self, n: int) -> tuple[Tensor, Tensor]:
        """Up to ``n`` rows out of the chain, from the slower tier first."""
        self.cache.drain()
        ids, rows = self.slow.evict(n)
        if ids.numel() < n:
            a_ids, slots = self._table_rows(n - ids.numel())
            if slots.size:
                recs = self._gather(slots)
                self.cache.remove_slots(slots)
                ids, rows = torch.cat([ids, torch.from_numpy(a_ids)]), torch.cat([rows, recs.to(rows.device)])
        return ids, rows

    def items(self, chunk_rows: int = 1 << 20) -> Iterator[tuple[Tensor, Tensor]]:
        """Every (ids, records) of the table once: its arena rows, then its slower tier's."""
        self.cache.drain()
        ids, slots = self._table_rows()
        for a in range(0, ids.size, chunk_rows):
            yield torch.from_numpy(ids[a : a + chunk_rows]), self._gather(slots[a : a + chunk_rows])
        yield from self.slow.items(chunk_rows)

    def warm_start(self, ids: Tensor, counts: Tensor) -> int:
        """Seed the group's admission counts with a data sample's ID frequencies (rows enter
        the arena as training first reads them)."""
        keys = ids.numpy() ^ self.cache._mix[self.j]
        self.cache.sketch.add(keys, counts.to(torch.int64).numpy())
        return self.slow.warm_start(ids, counts)

    def flush(self) -> None:
        self.cache.drain()
        self.slow.flush()

    def close(self) -> None:
        """Move this table's arena rows to its slower tier, then close that (a disk tier
        reopened later holds every row)."""
        self.cache.drain()
        ids, slots = self._table_rows()
        if ids.size:
            recs = self._gather(slots)
            self.cache.remove_slots(slots)
            self.slow.put(torch.from_numpy(ids), recs)
        self.slow.close()

    def reset_step_stats(self) -> None:
        super().reset_step_stats()
        self.bypasses = 0
        if hasattr(self, "cache"):
            self.slow.reset_step_stats()

    def extra_stats(self) -> dict[str, float]:
        """A cache's names for its inserts and evictions (rows admitted, rows displaced), as a
        per-table cache reports them, and the rows sent past it."""
        return {"promotions": self.inserts, "demotions": self.evictions, "bypasses": self.bypasses,
                "group_tables": len(self.cache.slow), "group_rows": self.cache.capacity}

    def stat_rows(self) -> int:
        return self.arena_rows  # (len() would wait for the copies on their way to the slower tier)

    def stats(self) -> dict[str, float]:
        """``tier.device.*`` counters of this table's share, then its slower tier's."""
        out = super().stats()
        out.update(self.slow.stats())
        return out
