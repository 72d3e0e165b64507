"""Memory tier: an arena of records addressed through a KeyIndex, optionally bounded, with a policy."""

from __future__ import annotations

from typing import Iterator, Sequence

import numpy as np
import torch
from torch import Tensor

from ember import _native
from ember.errors import CapacityError
from ember.tiers.base import Tier, TierCounters
from ember.tiers.growable import Growable, max_rows_in_memory
from ember.tiers.key_index import KeyIndex
from ember.tiers.policy import Policy, smallest, victim_score

__all__ = ["HostTier", "META_BYTES_PER_ROW"]

META_BYTES_PER_ROW = 21  # per slot: last access (int64), access count (int32), ID (int64), held (bool)


class HostTier(TierCounters, Tier):
    """Rows in memory: ``arena[slot] = [weights | optimizer state]``; ID -> slot via a KeyIndex.

    The arena grows by doubling (up to ``capacity`` if one is given); freed slots are reused.
    In a bounded tier each slot also keeps its last access (a clock advanced by every ``get``)
    and an access count, so it can ``evict`` by LRU or LFU; an unbounded tier never evicts and
    does not update them on reads. ``get`` remembers the slots of the
    last IDs it served, so the ``put`` of the same IDs after the optimizer step (the common
    read-modify-write of one batch) skips a second index probe.

    Args:
        record_dim: floats per record.
        capacity: most rows held (None: unbounded); a ``put`` beyond it raises CapacityError
            (a CachedTier makes room first by evicting).
        policy: which rows ``evict`` picks: ``lru`` or ``lfu``.
        device: where the arena lives (the index and the policy metadata stay in host memory).

    Example:
        >>> t = HostTier(record_dim=3)
        >>> t.put(torch.tensor([7, 42]), torch.ones(2, 3))
        >>> rows = torch.zeros(2, 3)
        >>> found = t.get_into(torch.tensor([42, 5]), rows)
        >>> found.tolist(), rows[0].tolist()
        ([True, False], [1.0, 1.0, 1.0])
    """

    name = "host"

    table: str | None = None
    """The table whose rows the tier holds, named in its errors (``build_tier`` sets it)."""

    def __init__(
        self,
        record_dim: int,
        capacity: int | None = None,
        initial_rows: int = 1024,
        policy: Policy = "lru",
        device: str | torch.device = "cpu",
    ) -> None:
        if capacity is not None and capacity <= 0:
            raise ValueError(f"{type(self).__name__}: capacity must be > 0 rows, got {capacity}")
        self.record_dim = record_dim
        self.capacity = capacity
        self.policy: Policy = policy
        self.device = torch.device(device)
        first = max(1, initial_rows if capacity is None else min(initial_rows, capacity))
        # arena and slot metadata grow in place up to the most rows this tier may hold (its
        # capacity, else what memory could hold): no copy of the rows, no 3x transient (growable.py)
        most = capacity if capacity is not None else max_rows_in_memory(record_dim * 4 + META_BYTES_PER_ROW)
        self._grown = {
            "arena": Growable(first, record_dim, np.float32, most) if self.device.type == "cpu" else None,
            "last": Growable(first, None, np.int64, most),
            "count": Growable(first, None, np.int32, most),
            "ids": Growable(first, None, np.int64, most),  # slot -> ID, so eviction never scans the index
            "held": Growable(first, None, bool, most),  # slot holds a row (not free)
        }
        arena = self._grown["arena"]
        self._set_arena(torch.from_numpy(arena.array) if arena is not None else torch.zeros(first, record_dim, device=self.device))
        self._last, self._count = self._grown["last"].array, self._grown["count"].array
        self._ids, self._held = self._grown["ids"].array, self._grown["held"].array
        self._index = KeyIndex(first)
        self._next = 0  # slots [0, _next) have been handed out at least once
        self._free = np.empty(0, dtype=np.int32)
        # (ids, slots) of the last two distinct ID tensors probed: a batch's put after its get
        # skips the probe even when the next batch's get (prefetched) came in between
        self._memo: list[tuple[Tensor, np.ndarray]] = []  # (IDs tensor, its slots): see _memoized
        # victims ranked by the last full scan: (slots, ids, scores), see _victim_slots
        self._queue: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
        self.victim_batch = max(1024, (capacity or 0) // 16)
        self.clock = 0
        self.reset_step_stats()

    @property
    def _tracks(self) -> bool:
        """Whether reads note each row's last access and count: only a bounded tier evicts by them
        (an unbounded one skips two random writes per row read)."""
        return self.capacity is not None

    def _set_arena(self, arena: Tensor) -> None:
        """The arena, with what every read and write asks of it made once: ``_native_cpu``,
        whether the row kernels (``_native.read_rows`` / ``write_rows``: C, or their numpy
        fallback with ``EMBER_NATIVE=0``) can serve this tier in place (a CPU float32 arena),
        and then ``_arena_np``, its numpy view (the same memory)."""
        self._arena = arena
        self._native_cpu = arena.device.type == "cpu" and arena.dtype == torch.float32
        self._arena_np = arena.numpy() if self._native_cpu else None

    # ---- size -------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._index)

    @property
    def nbytes(self) -> int:
        meta = self._last.nbytes + self._count.nbytes + self._ids.nbytes + self._held.nbytes
        return self._arena.numel() * 4 + self._index.nbytes + meta

    @property
    def index_bytes(self) -> int:
        return self._index.nbytes

    @property
    def free_rows(self) -> int | None:
        """Rows that can still be inserted without an eviction (None: unbounded)."""
        return None if self.capacity is None else self.capacity - len(self)

    # ---- reads ------------------------------------------------------------------------
    def slots_of(self, ids: Tensor) -> Tensor:
        """Slot of each ID (-1 if absent), int64 [N] on CPU."""
        memo = self._memoized(ids)
        if memo is not None:
            return torch.from_numpy(memo)
        slots = self._index.lookup(ids.numpy()).astype(np.int64)
        self._memo = [(ids, slots)] + self._memo[:1]
        return torch.from_numpy(slots)

    def _memoized(self, ids: Tensor) -> np.ndarray | None:
        """The slots of ``ids`` (this very tensor) as the last probes or writes left them, or None
        (numpy: the native passes take them so, and a group's read slices one array per tier)."""
        for memo_ids, memo_slots in self._memo:
            if memo_ids is ids:
                return memo_slots
        return None

    def remember(self, ids: Tensor, slots: np.ndarray) -> None:
        """Note that ``ids`` sit in ``slots`` (-1: absent) right now, as a caller that has just
        established it (a CachedTier, from its own probes and moves) knows: the next
        ``slots_of(ids)`` (the same tensor) then skips the index probe. Must be exact."""
        self._memo = [(ids, np.asarray(slots, dtype=np.int64))] + self._memo[:1]

    def still_held(self, ids: Tensor, slots: np.ndarray) -> np.ndarray:
        """``slots`` where each still holds its ID of ``ids``, else -1: what ``slots_of`` would
        give for IDs known to have been at ``slots`` (or absent, -1) before some evictions, when
        no absent one of them was inserted since (one slot holds one ID, one ID one slot)."""
        s = np.asarray(slots, dtype=np.int64)
        at = np.maximum(s, 0)
        ok = (s >= 0) & self._held.take(at) & (self._ids.take(at) == ids.numpy())
        return np.where(ok, s, -1)

    def contains(self, ids: Tensor) -> Tensor:
        """Found mask [N], without counting an access."""
        return self.slots_of(ids) >= 0

    def get_into(self, ids: Tensor, out: Tensor) -> Tensor:
        """Write the records of found ``ids`` into ``out`` [N, R] (others untouched); returns the
        found mask [N]. Counts an access of each found ID.

        With the C core, a CPU arena and a CPU float32 ``out`` this is one pass (probe, copy,
        policy counters), e.g. straight into a row range of a table group's buffer; else a
        probe and one gather on the arena's device (rows cross devices only when ``out`` lives
        elsewhere, and are counted in ``transfer_bytes``).
        """
        _check_rows([self], [ids.numel()], out, "out")
        if self.reads_natively_into(out):
            return HostTier.read_native([self], [ids], out)
        s = self.slots_of(ids).numpy()
        found = s >= 0
        self.clock += 1
        hit = np.flatnonzero(found)
        if self._tracks:
            self._last[s[hit]] = self.clock
            self._count[s[hit]] += 1
        self.requests += s.size
        self.hits += hit.size
        if hit.size:
            rows = self._arena.index_select(0, torch.from_numpy(s[hit]).to(self.device))
            self.count_transfer(hit.size, out.device)
            out.index_copy_(0, torch.from_numpy(hit).to(out.device), rows.to(out.device, out.dtype))
        return torch.from_numpy(found)

    def reads_natively_into(self, out: Tensor) -> bool:
        """Whether the C core can read this tier's rows straight into ``out`` (CPU float32 arena
        and buffer)."""
        return self._native_cpu and HostTier.native_buffer(out)

    @staticmethod
    def native_tiers(tiers: Sequence["Tier"]) -> bool:
        """Whether every tier is a HostTier whose arena the row kernels serve in place."""
        return all(isinstance(t, HostTier) and t._native_cpu for t in tiers)

    @staticmethod
    def native_buffer(rows: Tensor) -> bool:
        """Whether the row kernels read into (or write from) ``rows`` in place: CPU float32, contiguous."""
        return rows.device.type == "cpu" and rows.dtype == torch.float32 and rows.is_contiguous()

    @staticmethod
    def write_segments_native(tiers: Sequence["Tier"], ids: Sequence[Tensor], records: Tensor,
                              bf16: tuple[int, np.ndarray, np.ndarray] | None = None,
                              adagrad: tuple[np.ndarray, np.ndarray] | None = None,
                              skip: np.ndarray | None = None) -> bool:
        """``write_native`` when the C core can write every segment in one pass (returns True):
        every tier a HostTier with a CPU float32 arena, ``records`` CPU float32 and contiguous,
        and a bounded tier's new IDs within its capacity (new IDs take freed slots first, as
        ``_allocate`` gives them); else nothing written, nothing updated (False: ``put`` runs in
        numpy, and raises the capacity error). ``adagrad``, ``skip``: see ``write_native``."""
        if not (HostTier.native_buffer(records) and HostTier.native_tiers(tiers)):
            return False
        if len(ids) != len(tiers):
            _check_rows(tiers, [i.numel() for i in ids], records, "records")  # names the mismatch
        slots: list[np.ndarray | None] = []  # each tier's slots of its IDs: as its read left them (this
        for t, i in zip(tiers, ids):        # lookup's own IDs), else probed below
            slots.append(t._memoized(i))  # type: ignore[union-attr]
        need = [j for j, x in enumerate(slots) if x is None]
        if need:  # the other tiers' probes in one pass (the write needs them anyway)
            _, bounds, flat = _segments([ids[j] for j in need])
            probed = np.empty(flat.size, dtype=np.int64)
            _native.probe_rows([(tiers[j]._index.keys, tiers[j]._index.slots) for j in need], flat, bounds,  # type: ignore[union-attr]
                               probed, False)
            for j, x in zip(need, np.split(probed, bounds[1:-1])):
                slots[j] = x
        at = 0
        for t, x in zip(tiers, slots):  # new IDs beyond a bounded tier's room: put raises its error
            n, at = x.size, at + x.size  # type: ignore[union-attr]
            if t.capacity is not None:
                new = x < 0 if skip is None else (x < 0) & ~skip[at - n : at]  # type: ignore[operator]
                m = int(np.count_nonzero(new))
                if m and len(t) + m > t.capacity:
                    return False
        HostTier.write_native(tiers, ids, records, slots, bf16, adagrad, skip)  # type: ignore[arg-type]
        return True

    @staticmethod
    def read_native(tiers: Sequence["HostTier"], ids: Sequence[Tensor], out: Tensor, bf16_dim: int = 0) -> Tensor:
        """One native pass over several tiers (a table group's): probe, copy into the rows of
        ``out`` [N, R] (the tiers' segments back to back), policy counters; returns the found
        mask [N]. Every tier must ``reads_natively_into(out)``. ``bf16_dim`` > 0: the tiers hold
        a bf16 table's packed rows (``dim`` weights) and ``out`` is [N, width], their fp32
        records, widened on the way (``_native.read_rows``)."""
        sizes, bounds, flat = _segments(ids)
        _check_rows(tiers, sizes, out, "out", bf16_dim)  # the kernel trusts the width
        slots = np.empty(flat.size, dtype=np.int64)
        clocks = np.empty(len(tiers), dtype=np.int64)
        for j, t in enumerate(tiers):
            t.clock += 1
            clocks[j] = t.clock if t._tracks else -1
        hits = np.empty(len(tiers), dtype=np.int64)
        _native.read_rows([t.buffers(writes=False) for t in tiers], flat, bounds, out.numpy(), slots, clocks, hits,
                          tiers[0].record_dim if tiers else out.shape[1], bf16_dim)
        at = bounds.tolist()
        for j, (t, h) in enumerate(zip(tiers, hits.tolist())):
            t.requests += sizes[j]
            t.hits += h
            t._memo = [(ids[j], slots[at[j] : at[j + 1]])] + t._memo[:1]
        return torch.from_numpy(slots >= 0)

    @staticmethod
    def write_native(tiers: Sequence["HostTier"], ids: Sequence[Tensor], records: Tensor,
                     slots: Sequence[np.ndarray] | None = None, bf16: tuple[int, np.ndarray, np.ndarray] | None = None,
                     adagrad: tuple[np.ndarray, np.ndarray] | None = None, skip: np.ndarray | None = None) -> None:
        """One native pass over several tiers: inserts the new IDs (index, slot, policy metadata)
        and writes every record of ``records`` [N, R] (segments back to back). The C core must be
        able to write every segment (``write_segments_native`` decides); ``slots``: each
        segment's ``slots_of`` when known.
        ``bf16`` = (dim, seeds, steps): ``records`` are a bf16 table's fp32 records [N, width],
        packed on the way with tier j's rounding noise (``seeds[j]``, ``steps[j]``, int64 [T]),
        the bits ``RowCodec.encode`` gives them.
        ``adagrad`` = (grads float32 [N, dim], hyper float64 [T, 2]: tier j's lr and eps): each
        record is first updated in place by row-wise Adagrad (``_native.write_rows``), the
        sparse optimizer's step in the same pass.
        ``skip`` (bool [N]): rows left out, neither updated nor written, their IDs still absent
        (rows held back by ``min_count``: written around rather than gathered out)."""
        sizes, bounds, flat = _segments(ids)
        dim, seeds, steps = bf16 if bf16 is not None else (0, None, None)
        _check_rows(tiers, sizes, records, "records", dim)
        per_tier = [t.slots_of(i).numpy() for t, i in zip(tiers, ids)] if slots is None else slots
        slot = np.concatenate(per_tier).astype(np.int64) if per_tier else np.empty(0, np.int64)  # a copy: memos stay
        if skip is not None:
            slot[skip] = _native.SKIP_ROW
        absent = np.concatenate([[0], np.cumsum(slot == -1)])
        fresh = (absent[bounds[1:]] - absent[bounds[:-1]]).tolist()  # new IDs per tier
        for t, m in zip(tiers, fresh):
            if m:
                t._reserve(t._next + max(m - t._free.size, 0))  # freed slots are taken first
                t._index.reserve(m)
        nxt = np.array([t._next for t in tiers], dtype=np.int64)
        clocks = np.array([t.clock for t in tiers], dtype=np.int64)
        used = np.zeros(len(tiers), dtype=np.int64)
        free_at = np.zeros(len(tiers), dtype=np.int64)
        _native.write_rows([t.buffers(writes=True) for t in tiers], flat, bounds, slot, records.numpy(), nxt, clocks,
                           used, free_at, tiers[0].record_dim if tiers else records.shape[1], dim,
                           None if seeds is None else np.ascontiguousarray(seeds, dtype=np.int64),
                           None if steps is None else np.ascontiguousarray(steps, dtype=np.int64), adagrad=adagrad)
        if skip is not None:
            slot[skip] = -1  # (absent still, as the tiers' memos say below)
        for j, (t, m) in enumerate(zip(tiers, fresh)):
            if m:
                t._free = t._free[int(free_at[j]) :]
                t._next = int(nxt[j])
                t._index.placed(m, int(used[j]))
                t.inserts += m
                t._memo = [(ids[j], slot[bounds[j] : bounds[j + 1]])]

    def buffers(self, writes: bool) -> tuple[np.ndarray, ...]:
        """The arrays the native read (``writes`` False) or write kernel works on, explicitly:
        index keys and slots, arena, last access, access count (+ slot IDs, held flags and the
        free list)."""
        base = (self._index.keys, self._index.slots, self._arena_np, self._last, self._count)
        return base + (self._ids, self._held, np.ascontiguousarray(self._free, dtype=np.int32)) if writes else base

    def put(self, ids: Tensor, records: Tensor, counts: np.ndarray | None = None) -> None:
        """Insert or overwrite the records of unique ``ids``.

        ``counts`` (optional, int [N]) seeds the access count of newly inserted IDs, so an LFU
        cache does not evict a row promoted for being frequent on its first eviction.
        """
        _check_rows([self], [ids.numel()], records, "records")
        if counts is None and HostTier.write_segments_native([self], [ids], records):
            return
        slots = self.slots_of(ids)
        # numpy for the bookkeeping: on these small per-table arrays each torch op costs
        # several times its numpy twin, and put runs once per table per step
        miss = np.flatnonzero(slots.numpy() < 0)
        if miss.size:
            new_ids = ids.numpy()[miss]
            new_slots = self._allocate(miss.size)
            self._index.insert(new_ids, new_slots)
            self._ids[new_slots] = new_ids
            self._held[new_slots] = True
            self._last[new_slots] = self.clock
            self._count[new_slots] = 1 if counts is None else np.maximum(np.asarray(counts)[miss], 1)
            self.inserts += new_slots.size
            slots_np = slots.numpy().copy()
            slots_np[miss] = new_slots
            slots = torch.from_numpy(slots_np)
            self._memo = [(ids, slots_np)]  # the other entry may list these IDs as absent
        self.count_transfer(ids.numel(), records.device)
        self._arena.index_copy_(0, slots.to(self.device), records.to(self.device, self._arena.dtype))

    def remove(self, ids: Tensor) -> Tensor:
        """Delete unique ``ids``; returns the found mask [N]."""
        return torch.from_numpy(HostTier.remove_native([self], [ids]))

    @staticmethod
    def remove_native(tiers: Sequence["HostTier"], ids: Sequence[Tensor]) -> np.ndarray:
        """Delete each tier's unique ``ids[j]``, in one pass over their indexes
        (``_native.probe_rows``: a table group's removals, not one probe per tier); returns the
        found mask [N], the segments back to back."""
        sizes, bounds, flat = _segments(ids)
        slot = np.empty(flat.size, dtype=np.int64)
        _native.probe_rows([(t._index.keys, t._index.slots) for t in tiers], flat, bounds, slot, True)
        found = slot >= 0
        for j, t in enumerate(tiers):
            if sizes[j]:
                s = slot[bounds[j] : bounds[j + 1]]
                s = s[s >= 0].astype(np.int32)
                t._memo = []
                t._index.removed(s.size)
                t._free = np.concatenate([t._free, s])
                t._held[s] = False
        return found

    def _victim_slots(self, n: int, take: bool) -> tuple[np.ndarray, np.ndarray]:
        """The ``n`` best victims (ids, slots), best first; ``take`` drops them from the queue.

        Scoring the whole tier is O(rows), so one scan ranks a queue of several batches' worth
        of victims (``victim_batch``) and later calls take the queue's rows that are still
        valid (same ID, untouched since: same score). Rows inserted after the scan only become
        candidates at the next one; they entered for being frequent, so LFU rarely wants them.
        """
        n = min(n, len(self))
        q = self._queue
        if q is not None:
            qs, qid, qscore = q
            live = self._held[qs] & (self._ids[qs] == qid)
            live &= victim_score(self.policy, self._last[qs], self._count[qs]) == qscore
            ok = np.flatnonzero(live)
            if ok.size >= n:
                if take:
                    self._queue = (qs[ok[n:]], qid[ok[n:]], qscore[ok[n:]])
                return qid[ok[:n]], qs[ok[:n]]
        end = self._next
        score = victim_score(self.policy, self._last[:end], self._count[:end])
        score[~self._held[:end]] = np.iinfo(np.int64).max  # free slots last
        order = smallest(score, min(max(n, self.victim_batch), len(self))).astype(np.int32)
        keep = order[n:] if take else order
        self._queue = (keep, self._ids[keep], score[keep])
        return self._ids.take(order[:n]), order[:n]

    def victims(self, n: int) -> tuple[Tensor, np.ndarray]:
        """The ``n`` IDs ``evict(n)`` would take, best victim first, with their access counts."""
        ids, slots = self._victim_slots(n, take=False)
        return torch.from_numpy(ids), self._count.take(slots).astype(np.int64)

    def evict(self, n: int) -> tuple[Tensor, Tensor]:
        """Remove up to ``n`` rows chosen by the policy (LRU or LFU); returns their (ids, records)."""
        ids, slots = self._victim_slots(n, take=True)
        rows = self._arena.index_select(0, torch.from_numpy(slots.astype(np.int64)).to(self.device))
        self._memo = []
        self._index.remove(ids)
        self._free = np.concatenate([self._free, slots])
        self._held[slots] = False
        self.evictions += ids.size
        return torch.from_numpy(ids), rows

    def decay_counts(self) -> None:
        """Halve every access count (ages LFU so the cache follows a drifting distribution)."""
        self._count >>= 1

    def items(self, chunk_rows: int = 1 << 20) -> Iterator[tuple[Tensor, Tensor]]:
        """Every (ids, records) held, sorted by ID, in chunks (records on CPU)."""
        ids, slots = self._index.items()
        order = np.argsort(ids, kind="stable")  # sorted by ID: same file for the same table
        for start in range(0, ids.size, chunk_rows):
            sel = order[start : start + chunk_rows]
            idx = torch.from_numpy(slots[sel].astype(np.int64)).to(self.device)
            yield torch.from_numpy(ids[sel]), self._arena.index_select(0, idx).cpu()

    def flush(self) -> None:
        """Nothing is buffered in memory tiers."""

    # ---- internals --------------------------------------------------------------------------
    def _allocate(self, n: int) -> np.ndarray:
        if self.capacity is not None and len(self) + n > self.capacity:
            of = "" if self.table is None else f" of table '{self.table}'"
            raise CapacityError(
                f"{type(self).__name__}{of}: {len(self) + n} rows would exceed its capacity of "
                f"{self.capacity}; raise storage.{self.name}_rows (or _bytes) or add a disk tier behind it"
            )
        reuse = min(n, self._free.size)
        out = self._free[:reuse]
        self._free = self._free[reuse:]
        fresh = n - reuse
        if fresh:
            end = self._next + fresh
            self._reserve(end)
            out = np.concatenate([out, np.arange(self._next, end, dtype=np.int32)])
            self._next = end
        return out

    def _reserve(self, end: int) -> None:
        """Grow the arena and slot metadata (doubling, up to ``capacity``) to hold ``end`` slots."""
        if end <= self._arena.shape[0]:
            return
        grow = max(end, 2 * self._arena.shape[0])
        if self.capacity is not None:
            grow = min(grow, self.capacity)
        g = self._grown
        arena = g["arena"]
        if arena is not None:  # in place (Growable): the rows keep their address
            self._set_arena(torch.from_numpy(arena.grow(grow)))
        else:  # an arena on a GPU: a bigger one, the rows copied
            bigger = torch.empty(grow, self.record_dim, device=self.device)
            bigger[: self._next] = self._arena[: self._next]
            self._set_arena(bigger)
        self._last, self._count = g["last"].grow(grow), g["count"].grow(grow)
        self._ids, self._held = g["ids"].grow(grow), g["held"].grow(grow)


class SegmentIds(tuple):
    """Several tiers' IDs made by splitting one CPU int64 tensor (a table group's unique IDs,
    table by table): a tuple of the segments' tensors that also holds what the native passes
    take (``_segments``: sizes, bounds, the IDs back to back), made once, so a batch's read and
    write do not concatenate the segments again. A tuple: its segments cannot be replaced."""

    sizes: list[int]
    bounds: np.ndarray
    flat: np.ndarray

    @classmethod
    def split(cls, ids: Tensor, sizes: Sequence[int]) -> "SegmentIds":
        """``ids`` (CPU int64, contiguous) cut into segments of ``sizes`` (summing to its length)."""
        if ids.device.type != "cpu" or ids.dtype != torch.int64 or ids.dim() != 1 or not ids.is_contiguous():
            raise ValueError(f"SegmentIds: ids must be a contiguous CPU int64 vector, got {ids.dtype} {list(ids.shape)} on {ids.device}")
        sizes = [int(n) for n in sizes]
        if sum(sizes) != ids.numel():
            raise ValueError(f"SegmentIds: segments of {sum(sizes)} IDs in all for {ids.numel()} IDs")
        out = cls(ids.split(sizes))
        out.sizes = sizes
        out.bounds = np.concatenate([[0], np.cumsum(sizes, dtype=np.int64)]).astype(np.int64)
        out.flat = ids.numpy()
        return out


def _segments(ids: Sequence[Tensor]) -> tuple[list[int], np.ndarray, np.ndarray]:
    """Several tiers' IDs as the native passes take them: each segment's size, the bounds
    (int64 [T+1] from 0) and the IDs back to back (int64 [N]); a ``SegmentIds`` has them made."""
    if isinstance(ids, SegmentIds):
        return ids.sizes, ids.bounds, ids.flat
    sizes = [i.numel() for i in ids]
    flat = np.concatenate([i.numpy() for i in ids]).astype(np.int64, copy=False) if ids else np.empty(0, np.int64)
    return sizes, np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64), flat


def _check_rows(tiers: Sequence[Tier], sizes: list[int], rows: Tensor, what: str, bf16_dim: int = 0) -> None:
    """``rows`` must be [sum(sizes), record_dim] (``bf16_dim`` > 0: [sum(sizes), a bf16 table's
    decoded width]): the native passes trust its shape."""
    try:
        width = _native.record_width(tiers[0].record_dim, bf16_dim) if tiers else None
    except ValueError:  # the weights do not fit the words: no width fits
        width = None
    if len(sizes) != len(tiers) or rows.dim() != 2 or rows.shape[0] != sum(sizes) or (
        tiers and rows.shape[1] != width
    ):
        raise ValueError(
            f"{type(tiers[0]).__name__ if tiers else 'tier'}: {what} must be [{sum(sizes)}, {width if tiers else '?'}] for "
            f"{len(tiers)} tiers and {len(sizes)} ID tensors, got {list(rows.shape)}"
        )
