"""Cache policies: which rows a bounded tier gives up (LRU / LFU) and which it takes in (admission).

Eviction scores are computed over the whole tier at once (one ``argpartition`` per batch of
victims), so eviction is batched and vectorised. Admission counts accesses of IDs that are *not*
in the fast tier in a count-min sketch: a fixed few MiB whatever the number of distinct IDs, and
aged by halving (TinyLFU) so yesterday's hot IDs do not stay hot forever.
"""

from __future__ import annotations

from typing import Literal

import numpy as np

from ember import _native
from ember.tiers.key_index import KeyIndex

__all__ = ["Policy", "CountMinSketch", "IdCounter", "smallest", "victim_order", "victim_score"]

Policy = Literal["lru", "lfu"]
_COUNT_MAX = np.iinfo(np.uint16).max

_SEEDS = np.array(
    [0x9E3779B97F4A7C15, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9, 0xD6E8FEB86659FD93], dtype=np.uint64
)


def victim_order(policy: Policy, last: np.ndarray, count: np.ndarray, n: int) -> np.ndarray:
    """Indices (into ``last``/``count``) of the ``n`` rows to evict first, best victim first.

    LRU: oldest ``last`` access first. LFU: fewest accesses first, ties broken by age.
    """
    return smallest(victim_score(policy, last, count), n)


def victim_score(policy: Policy, last: np.ndarray, count: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """int64 eviction score per row, lowest evicted first (LFU: count, then age; LRU: age).
    ``out`` (int64, the rows' length): written in place and returned. One formula with the
    group cache's C scan and its reference: ``ember._native.victim_keys``."""
    return _native.victim_keys(last, count, policy == "lru", out)


def smallest(score: np.ndarray, n: int) -> np.ndarray:
    """Indices of the ``n`` smallest scores, ascending (one argpartition, then a sort of n)."""
    n = min(n, score.size)
    if n <= 0:
        return np.empty(0, dtype=np.int64)
    if n < score.size:
        part = np.argpartition(score, n - 1)[:n]
    else:
        part = np.arange(score.size)
    return part[np.argsort(score[part], kind="stable")]


class CountMinSketch:
    """Approximate access counts of arbitrary int64 IDs in ``depth * width * 2`` bytes.

    Estimates never under-count (up to the counters' ceiling of 65,535, where they saturate:
    admission only compares small counts); with ``width`` ≥ 4× the number of IDs that matter
    the over-count is small. ``halve()`` ages every counter (TinyLFU reset).

    Example:
        >>> s = CountMinSketch(width=1024)
        >>> s.add(np.array([5, 5, 9])).tolist()
        [2, 2, 1]
        >>> s.estimate(np.array([5, 9, 11])).tolist()
        [2, 1, 0]
    """

    def __init__(self, width: int = 1 << 16, depth: int = 4) -> None:
        if not 1 <= depth <= len(_SEEDS):
            raise ValueError(f"CountMinSketch: depth must be in 1..{len(_SEEDS)}, got {depth}")
        self.width = 1 << max(4, int(np.ceil(np.log2(max(width, 16)))))
        self.depth = depth
        self.table = np.zeros((depth, self.width), dtype=np.uint16)
        self.added = 0  # total count added since the last halving

    @property
    def nbytes(self) -> int:
        return self.table.nbytes

    def add(self, ids: np.ndarray, counts: np.ndarray | int = 1) -> np.ndarray:
        """Count each ID ``counts`` more times (IDs may repeat); returns the estimates after
        adding (int64 [N], what ``estimate`` would return, without hashing the IDs again)."""
        est = np.empty(ids.size, dtype=np.int64)
        if ids.size == 0:
            return est
        c = np.broadcast_to(np.asarray(counts, dtype=np.int64), ids.shape)
        _native.cms(self.table, ids, c, _SEEDS[: self.depth], est)
        self.added += int(c.sum())
        return est

    def estimate(self, ids: np.ndarray) -> np.ndarray:
        """Estimated count of each ID (int64 [N])."""
        est = np.empty(ids.size, dtype=np.int64)
        if ids.size:
            _native.cms(self.table, ids, None, _SEEDS[: self.depth], est)
        return est

    def halve(self) -> None:
        self.table >>= 1
        self.added //= 2


class IdCounter:
    """Exact per-ID counts (for ``min_count`` admission): a KeyIndex into a growable count array.

    Costs 16-32 B of index + 4 B per counted ID; IDs leave it once they are admitted.

    Example:
        >>> c = IdCounter()
        >>> c.add(np.array([4, 9])).tolist(), c.add(np.array([4])).tolist()
        ([1, 1], [2])
        >>> c.remove(np.array([4])); c.get(np.array([4, 9])).tolist()
        [0, 1]
    """

    def __init__(self) -> None:
        self._index = KeyIndex(1024)
        self._counts = np.zeros(1024, dtype=np.int32)
        self._next = 0
        self._free = np.empty(0, dtype=np.int32)

    def __len__(self) -> int:
        return len(self._index)

    @property
    def nbytes(self) -> int:
        return self._index.nbytes + self._counts.nbytes

    def get(self, ids: np.ndarray) -> np.ndarray:
        """Count of each ID (0 if never counted), int64 [N]."""
        s = self._index.lookup(ids)
        return np.where(s >= 0, self._counts.take(np.maximum(s, 0)), 0).astype(np.int64)

    def add(self, ids: np.ndarray, counts: np.ndarray | int = 1) -> np.ndarray:
        """Add ``counts`` to each of the unique ``ids``; returns their new counts."""
        ids = np.ascontiguousarray(ids, dtype=np.int64)
        s = self._index.lookup(ids)
        new = s < 0
        if new.any():
            n = int(new.sum())
            reuse = min(n, self._free.size)
            slots = np.concatenate([self._free[:reuse], np.arange(self._next, self._next + n - reuse, dtype=np.int32)])
            self._free = self._free[reuse:]
            self._next += n - reuse
            if self._next > self._counts.size:
                grow = max(self._next, 2 * self._counts.size)
                self._counts = np.concatenate([self._counts, np.zeros(grow - self._counts.size, np.int32)])
            self._counts[slots] = 0
            self._index.insert(ids[new], slots)
            s = s.copy()
            s[new] = slots
        self._counts[s] += np.asarray(counts, dtype=np.int32)
        return self._counts.take(s).astype(np.int64)

    def remove(self, ids: np.ndarray) -> None:
        s = self._index.remove(np.ascontiguousarray(ids, dtype=np.int64))
        self._free = np.concatenate([self._free, s[s >= 0]])

    def items(self) -> tuple[np.ndarray, np.ndarray]:
        """All (ids, counts), sorted by ID (for checkpoints)."""
        ids, slots = self._index.items()
        order = np.argsort(ids, kind="stable")
        return ids[order], self._counts.take(slots[order]).astype(np.int64)
