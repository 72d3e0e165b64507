"""ID -> slot map for arbitrary int64 IDs: open addressing, vectorised over a whole batch.

Two flat arrays of ``capacity`` buckets: ``keys`` (int64) and ``slots`` (int32; -1 empty,
-2 deleted). Linear probing; every probe round is a handful of numpy ops over all still-unresolved
IDs of the batch, so a lookup of U IDs costs O(U) work in ~1-2 rounds at our load factor and no
Python loop per ID. Overhead: 12 bytes per bucket, 16-32 bytes per stored ID (load 0.375-0.75).

When the native core is built (``ember._native``), the probe and insert loops run in C over
the same two arrays with the same hash and probing order, so either implementation can read
a table the other wrote; the numpy rounds are the fallback.
"""

from __future__ import annotations

import numpy as np

from ember.mix import mix64

from ember import _native

__all__ = ["KeyIndex"]

_EMPTY = -1
_DELETED = -2
_MAX_LOAD = 0.75
_WINDOW = 8
_STEPS = np.arange(_WINDOW, dtype=np.int64)


class KeyIndex:
    """Maps int64 IDs to int32 slots with no collisions and no pre-sized vocabulary.

    Args:
        capacity: IDs to hold before the first rehash.
        native: use the compiled probe/insert loops (None: when built; False: numpy only).

    Example:
        >>> idx = KeyIndex()
        >>> idx.insert(np.array([10, -3, 2**62]), np.array([0, 1, 2], dtype=np.int32))
        >>> idx.lookup(np.array([2**62, 7, 10])).tolist()
        [2, -1, 0]
    """

    def __init__(self, capacity: int = 1024, native: bool | None = None) -> None:
        self._core = _native.require() if native else (_native._core if native is None else None)
        cap = 1 << max(4, int(np.ceil(np.log2(max(capacity, 16) / _MAX_LOAD))))
        self._alloc(cap)
        self._size = 0

    def _alloc(self, cap: int) -> None:
        self._keys = np.zeros(cap, dtype=np.int64)
        self._slots = np.full(cap, _EMPTY, dtype=np.int32)
        self._mask = np.uint64(cap - 1)
        self._used = 0  # live + deleted buckets

    def __len__(self) -> int:
        return self._size

    @property
    def keys(self) -> np.ndarray:
        """The bucket keys array (int64), for kernels that probe it directly."""
        return self._keys

    @property
    def slots(self) -> np.ndarray:
        """The bucket slots array (int32; -1 empty, -2 deleted), for kernels."""
        return self._slots

    @property
    def nbytes(self) -> int:
        return self._keys.nbytes + self._slots.nbytes

    def _home(self, ids: np.ndarray) -> np.ndarray:
        return (mix64(ids.view(np.uint64)) & self._mask).astype(np.int64)

    def _probe(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Bucket of each ID (-1 when absent) and its slot (-1 when absent).

        Round one checks each ID's home bucket (most IDs end there); later rounds check a window
        of ``_WINDOW`` consecutive buckets per ID, so linear probing's long tail costs a few
        rounds instead of one round per bucket.
        """
        n = ids.shape[0]
        if self._core is not None:
            bucket = np.empty(n, dtype=np.int64)
            slots = np.empty(n, dtype=np.int32)
            self._core.probe(self._keys, self._slots, ids, bucket, slots)
            return bucket, slots
        bucket = np.full(n, -1, dtype=np.int64)
        mask = int(self._mask)
        home = self._home(ids)
        s = self._slots.take(home)
        hit = (s >= 0) & (self._keys.take(home) == ids)
        bucket[hit] = home[hit]
        active = np.flatnonzero(~hit & (s != _EMPTY))
        pos = home.take(active) + 1
        while active.size:
            win = (pos[:, None] + _STEPS) & mask  # [A, W]
            s = self._slots.take(win)
            hit = (s >= 0) & (self._keys.take(win) == ids.take(active)[:, None])
            stop = hit | (s == _EMPTY)
            first = stop.argmax(axis=1)
            rows = np.arange(active.size)
            stopped = stop[rows, first]
            is_hit = stopped & hit[rows, first]
            bucket[active[is_hit]] = win[rows, first][is_hit]
            active = active[~stopped]
            pos = (pos[~stopped] + _WINDOW) & mask
        slots = np.full(n, -1, dtype=np.int32)
        found = bucket >= 0
        slots[found] = self._slots.take(bucket[found])
        return bucket, slots

    def lookup(self, ids: np.ndarray) -> np.ndarray:
        """Slot of each ID, -1 where absent. ``ids``: int64 [N] (duplicates allowed)."""
        return self._probe(np.ascontiguousarray(ids, dtype=np.int64))[1]

    @property
    def native(self) -> bool:
        """Whether the compiled core runs this index's probes (and a memory tier's native reads)."""
        return self._core is not None

    def insert(self, ids: np.ndarray, slots: np.ndarray) -> None:
        """Add IDs known to be absent and unique, mapping ``ids[i] -> slots[i]``."""
        ids = np.ascontiguousarray(ids, dtype=np.int64)
        if ids.size == 0:
            return
        self.reserve(ids.size)
        self._place(ids, np.asarray(slots, dtype=np.int32))
        self._size += ids.size

    def reserve(self, n: int) -> None:
        """Make room for ``n`` more IDs within the load limit (rehashing into a bigger table)."""
        if self._used + n > _MAX_LOAD * self._keys.size:
            self._rehash(self._size + n)

    def placed(self, n: int, used: int) -> None:
        """Account for ``n`` IDs written into the arrays by a native call (after ``reserve(n)``),
        which filled ``used`` empty buckets."""
        self._size += n
        self._used += used

    def _place(self, ids: np.ndarray, slots: np.ndarray) -> None:
        if self._core is not None:
            self._used += self._core.place(self._keys, self._slots, ids, np.ascontiguousarray(slots, dtype=np.int32))
            return
        pos = self._home(ids)
        active = np.arange(ids.size)
        mask = int(self._mask)
        while active.size:
            win = (pos[active, None] + _STEPS) & mask
            free = self._slots[win] < 0  # empty or deleted: safe, the IDs are known absent
            first = free.argmax(axis=1)
            has_free = free[np.arange(active.size), first]
            target = win[np.arange(active.size), first]
            cand = np.flatnonzero(has_free)
            won = np.zeros(active.size, dtype=bool)
            if cand.size:
                ub, pick = np.unique(target[cand], return_index=True)  # one winner per bucket
                winners = active[cand[pick]]
                self._used += int(np.count_nonzero(self._slots[ub] == _EMPTY))
                self._slots[ub] = slots[winners]
                self._keys[ub] = ids[winners]
                won[cand[pick]] = True
            # losers of a bucket retry from the same window; IDs with a full window move on
            pos[active[~has_free]] = (pos[active[~has_free]] + _WINDOW) & mask
            active = active[~won]

    def remove(self, ids: np.ndarray) -> np.ndarray:
        """Delete IDs; returns the slots they held (-1 for IDs that were absent)."""
        bucket, slots = self._probe(np.ascontiguousarray(ids, dtype=np.int64))
        hit = bucket >= 0
        self._slots[bucket[hit]] = _DELETED
        self._size -= int(np.count_nonzero(hit))
        return slots

    def items(self) -> tuple[np.ndarray, np.ndarray]:
        """All (ids, slots), in bucket order."""
        live = self._slots >= 0
        return self._keys[live].copy(), self._slots[live].copy()

    def _rehash(self, need: int) -> None:
        ids, slots = self.items()
        cap = self._keys.size
        while need > _MAX_LOAD * cap:  # doubling keeps the load in [0.375, 0.75]
            cap *= 2
        self._alloc(cap)
        self._place(ids, slots)
