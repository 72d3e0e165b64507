"""ID -> slot map for arbitrary int64 IDs: open addressing, vectorised over a whole batch.

Two flat arrays of ``capacity`` buckets: ``keys`` (int64) and ``slots`` (int32; -1 empty,
-2 deleted), a power of two long. Linear probing from the home bucket ``mix64(id) & (cap - 1)``.
Overhead: 12 bytes per bucket, 16-32 bytes per stored ID (load 0.375-0.75).

The probe and insert loops are ``ember._native.probe`` / ``place``: compiled when the native
core is built (and ``EMBER_NATIVE=0`` is not set), else numpy rounds over all still-unresolved
IDs of the batch (O(U) work in ~1-2 rounds at our load factor, no Python loop per ID). Both use
the same hash and probing order, so either can read and extend a table the other wrote.
"""

from __future__ import annotations

import numpy as np

from ember import _native

__all__ = ["KeyIndex"]

_EMPTY = -1
_DELETED = -2
_MAX_LOAD = 0.75


def _index_capacity(n: int) -> int:
    """Buckets of a new table for ``n`` IDs: the smallest power of two (at least 16) that holds
    them within the load limit."""
    return 1 << max(4, int(np.ceil(np.log2(max(n, 16) / _MAX_LOAD))))


class KeyIndex:
    """Maps int64 IDs to int32 slots with no collisions and no pre-sized vocabulary.

    Args:
        capacity: IDs to hold before the first rehash.

    Example:
        >>> idx = KeyIndex()
        >>> idx.insert(np.array([10, -3, 2**62]), np.array([0, 1, 2], dtype=np.int32))
        >>> idx.lookup(np.array([2**62, 7, 10])).tolist()
        [2, -1, 0]
    """

    def __init__(self, capacity: int = 1024) -> None:
        self._alloc(_index_capacity(capacity))
        self._size = 0

    def _alloc(self, cap: int) -> None:
        self._keys = np.zeros(cap, dtype=np.int64)
        self._slots = np.full(cap, _EMPTY, dtype=np.int32)
        self._used = 0  # live + deleted buckets

    def __len__(self) -> int:
        return self._size

    @property
    def nbytes(self) -> int:
        return self._keys.nbytes + self._slots.nbytes

    @property
    def keys(self) -> np.ndarray:
        """The bucket array of IDs (int64 [capacity]; meaningful where ``slots >= 0``).

        The live array, for kernels that probe or fill the table in place (``ember._native``,
        e.g. ``read_rows`` / ``write_rows``; after a ``write_rows`` insert, call ``placed``).
        Call ``reserve`` before such inserts; a rehash (any insert may cause one) replaces the
        array, so fetch it again rather than keep it.
        """
        return self._keys

    @property
    def slots(self) -> np.ndarray:
        """The bucket array of slots (int32 [capacity]; -1 empty, -2 deleted, else the slot of
        ``keys[b]``). The live array, as ``keys``."""
        return self._slots

    def _probe(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Bucket of each ID (-1 when absent) and its slot (-1 when absent)."""
        bucket = np.empty(ids.shape[0], dtype=np.int64)
        slots = np.empty(ids.shape[0], dtype=np.int32)
        _native.probe(self._keys, self._slots, ids, bucket, slots)
        return bucket, slots

    def lookup(self, ids: np.ndarray) -> np.ndarray:
        """Slot of each ID, -1 where absent. ``ids``: int64 [N] (duplicates allowed)."""
        return self._probe(np.ascontiguousarray(ids, dtype=np.int64))[1]

    @property
    def native(self) -> bool:
        """Whether the compiled core runs this index's probes: ``ember._native.is_available()``,
        the same for every index of the process (``EMBER_NATIVE=0`` turns it off)."""
        return _native.is_available()

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
        """Account for ``n`` IDs written into ``keys``/``slots`` by a kernel (``_native.write_rows``,
        after ``reserve(n)``), which filled ``used`` empty buckets."""
        self._size += n
        self._used += used

    def removed(self, n: int) -> None:
        """Account for ``n`` IDs a kernel took out of ``keys``/``slots`` (``_native.probe_rows``
        with ``remove``: their buckets marked deleted)."""
        self._size -= n

    def _place(self, ids: np.ndarray, slots: np.ndarray) -> None:
        self._used += _native.place(self._keys, self._slots, ids, np.ascontiguousarray(slots, dtype=np.int32))

    def remove(self, ids: np.ndarray) -> np.ndarray:
        """Delete IDs; returns the slots they held (-1 for IDs that were absent)."""
        bucket, slots = self._probe(np.ascontiguousarray(ids, dtype=np.int64))
        hit = bucket >= 0
        self._slots[bucket[hit]] = _DELETED
        self._size -= int(np.count_nonzero(hit))
        return slots

    def items(self) -> tuple[np.ndarray, np.ndarray]:
        """All (ids, slots), in bucket order."""
        live = np.flatnonzero(self._slots >= 0)  # ~5x faster than boolean-mask indexing at ~40 % live
        return self._keys.take(live), self._slots.take(live)

    def _rehash(self, need: int) -> None:
        old_keys, old_slots = self._keys, self._slots
        cap = self._keys.size
        while need > _MAX_LOAD * cap:  # doubling keeps the load in [0.375, 0.75]
            cap *= 2
        self._alloc(cap)
        self._used += _native.rehash(self._keys, self._slots, old_keys, old_slots)  # the live entries, in bucket order
