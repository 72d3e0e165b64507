"""ChangeLog: the IDs of a table whose rows changed since the last delta export.

A table with a change log notes every ID its write-back stored (updated or newly admitted
rows), every ID a bulk ``load`` imported and every ID the TTL sweep removed. A delta export
takes the log and reads those IDs' current rows through the table's own read path: an ID found
live is a changed row, one absent (or expired) was removed. So the log needs no per-tier hook
and no row copies: it is an ID buffer, deduplicated when it grows (amortised O(n log n) in the
IDs written; a step's cost is one small array copy and a list append).
"""

from __future__ import annotations

import threading

import numpy as np

__all__ = ["ChangeLog"]


class ChangeLog:
    """IDs noted since the last ``take``, deduplicated lazily.

    Args:
        compact_at: IDs noted before the buffer is first deduplicated; later it is deduplicated
            whenever the raw IDs outnumber the distinct ones already held (memory stays within
            about twice the distinct IDs, or ``compact_at``).

    Example:
        >>> log = ChangeLog()
        >>> log.note(np.array([5, 3, 5])); log.note(np.array([9, 3]))
        >>> log.take().tolist(), len(log)
        ([3, 5, 9], 0)
    """

    def __init__(self, compact_at: int = 1 << 20) -> None:
        self.compact_at = compact_at
        self._unique = np.empty(0, np.int64)
        self._parts: list[np.ndarray] = []
        self._pending = 0
        self._lock = threading.Lock()  # write-back may run on the pipeline's update thread

    def note(self, ids: np.ndarray) -> None:
        """Remember ``ids`` (int64, any order, duplicates allowed); copied, so the caller's
        buffer may be reused."""
        if not ids.size:
            return
        with self._lock:
            self._parts.append(np.array(ids, dtype=np.int64, copy=True))
            self._pending += ids.size
            if self._pending > max(self.compact_at, self._unique.size):
                self._compact()

    def _compact(self) -> None:
        if self._parts:
            self._unique = np.unique(np.concatenate([self._unique, *self._parts]))
            self._parts, self._pending = [], 0

    def take(self) -> np.ndarray:
        """The distinct IDs noted since the last ``take``, sorted; the log starts empty again."""
        with self._lock:
            self._compact()
            out, self._unique = self._unique, np.empty(0, np.int64)
            return out

    def __len__(self) -> int:
        """Distinct IDs noted so far (deduplicates the buffer)."""
        with self._lock:
            self._compact()
            return int(self._unique.size)
