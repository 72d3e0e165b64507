"""Cache policies: which rows a bounded tier gives up (LRU / LFU) and which it takes in (admission).

Eviction scores are computed over the whole tier at once (one ``argpartition`` per batch of
victims), so eviction is batched and vectorised. Admission counts accesses of IDs that are *not*
in the fast tier in a count-min sketch: a fixed few MiB whatever the number of distinct IDs, and
aged by halving (TinyLFU) so yesterday's hot IDs do not stay hot forever.
"""

from __future__ import annotations

from typing import Literal, Sequence

import numpy as np

from ember import _native
from ember.tiers.key_index import _MAX_LOAD, _index_capacity

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
    """Exact per-ID counts (for ``min_count`` admission): an open-addressing table of IDs and
    their counts (``ember._native.count_ids``: one probe counts an ID, placing it when new).

    Costs 16-32 B per counted ID (12 B a bucket at a load of 3/8 to 3/4; up to 48 B just after
    a rehash that cleared removed IDs); IDs leave it once they are admitted. ``count`` serves
    several counters in one pass (a table group's).

    Example:
        >>> c = IdCounter()
        >>> c.add(np.array([4, 9])).tolist(), c.add(np.array([4])).tolist()
        ([1, 1], [2])
        >>> c.remove(np.array([4])); c.get(np.array([4, 9])).tolist()
        [0, 1]
    """

    def __init__(self, capacity: int = 1024) -> None:
        self._alloc(_index_capacity(capacity))
        self._size = 0

    def _alloc(self, cap: int) -> None:
        self._keys = np.zeros(cap, dtype=np.int64)
        self._counts = np.zeros(cap, dtype=np.int32)  # > 0 counted, 0 empty, -1 deleted
        self._used = 0  # counted + deleted buckets

    def __len__(self) -> int:
        return self._size

    @property
    def nbytes(self) -> int:
        return self._keys.nbytes + self._counts.nbytes

    @staticmethod
    def count(counters: Sequence["IdCounter"], ids: np.ndarray, bounds: np.ndarray, mode: str,
              adds: np.ndarray | None = None) -> np.ndarray:
        """``mode`` ("get", "add" or "remove", as ``ember._native.count_ids``) over several
        counters in one pass: counter j takes ``ids[bounds[j]:bounds[j+1]]`` (unique within it);
        returns each ID's count (after an add, before a remove), int64 [N]."""
        if mode == "add":
            for j, c in enumerate(counters):
                c._reserve(int(bounds[j + 1] - bounds[j]))
        out, stats = _native.count_ids([(c._keys, c._counts) for c in counters], ids, bounds, mode, adds)
        for c, (n, used) in zip(counters, stats.tolist()):
            c._size += -n if mode == "remove" else n
            c._used += used
        return out

    def get(self, ids: np.ndarray) -> np.ndarray:
        """Count of each ID (0 if never counted), int64 [N]."""
        return self.count([self], ids, np.array([0, len(ids)]), "get")

    def add(self, ids: np.ndarray, counts: np.ndarray | int = 1) -> np.ndarray:
        """Add ``counts`` (> 0) to each of the unique ``ids``; returns their new counts."""
        adds = None if np.isscalar(counts) and counts == 1 else np.broadcast_to(np.asarray(counts, dtype=np.int32), len(ids))
        return self.count([self], ids, np.array([0, len(ids)]), "add", adds)

    def remove(self, ids: np.ndarray) -> None:
        self.count([self], ids, np.array([0, len(ids)]), "remove")

    def items(self) -> tuple[np.ndarray, np.ndarray]:
        """All (ids, counts), sorted by ID (for checkpoints)."""
        ids, counts = self._live()
        order = np.argsort(ids, kind="stable")
        return ids[order], counts[order].astype(np.int64)

    def _live(self) -> tuple[np.ndarray, np.ndarray]:
        """The counted IDs and their counts (int32), in bucket order."""
        live = np.flatnonzero(self._counts > 0)
        return self._keys.take(live), self._counts.take(live)

    def _reserve(self, n: int) -> None:
        """Room for ``n`` more IDs within the load limit: when counted and deleted buckets would
        pass it, the counted IDs move to a new table, doubled from this one's size until they
        fit within the limit; one of the same size only when they fill at most half of it (at
        least a quarter is left to fill before the next move)."""
        cap, need = self._keys.size, self._size + n
        if self._used + n <= _MAX_LOAD * cap:
            return
        while need > _MAX_LOAD * cap or (cap == self._keys.size and 2 * need > cap):
            cap *= 2
        ids, counts = self._live()
        self._alloc(cap)
        self._size = 0
        if ids.size:
            self.count([self], ids, np.array([0, ids.size]), "add", counts)
