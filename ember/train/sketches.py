"""Bounded-memory summaries of a data stream, vectorised over numpy arrays: what ``ember
profile`` keeps per feature while it reads rows (``ember.train.profile``).

- :class:`DistinctCounter`: distinct IDs and how often each was seen. Exact (every ID with its
  count) up to ``bound`` distinct IDs; past that, *adaptive distinct sampling* (Wegman's
  adaptive sampling, analysed by Flajolet 1990; Gibbons, "Distinct sampling for highly-accurate
  answers to distinct values queries", VLDB 2001): an ID is kept, with its exact count, when the
  low ``level`` bits of its splitmix64 hash are zero, so each distinct ID is in the sample with
  probability ``p = 2**-level``, independently of how often it occurs. The distinct count is
  ``|sample| / p``, with standard error ``sqrt(|sample| (1 - p)) / p`` (binomial), i.e. about
  ``1 / sqrt(|sample|)`` relative: 0.4 % at the default bound. Unlike HyperLogLog, the sample
  also answers "how many IDs were seen at least k times", what a table's ``min_count`` keeps,
  and two counters of one level merge exactly (a table shared by several features).
- :class:`HeavyHitters`: the most frequent values, a mergeable Misra-Gries summary (Agarwal et
  al., "Mergeable summaries", PODS 2012): each count is at most ``error`` below the true one.
- :class:`BottomK`: a uniform sample of ``k`` values (the ``k`` smallest random keys), for
  quantiles: exact while fewer than ``k`` values were seen.
"""

from __future__ import annotations

import math

import numpy as np

from ember.distributed.sharding import splitmix64

__all__ = ["DistinctCounter", "HeavyHitters", "BottomK"]

_LOW_BITS = np.uint64(0xFFFFFFFF)


def _sum_by_id(ids: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Unique ``ids`` (sorted) with the ``counts`` of equal IDs added."""
    uniq, inverse = np.unique(ids, return_inverse=True)
    return uniq, np.bincount(inverse, weights=counts, minlength=uniq.size).astype(np.int64)


def _merge(held: np.ndarray, held_counts: np.ndarray, ids: np.ndarray,
           counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Sorted unique ``held`` IDs (with counts) plus sorted unique ``ids`` (with counts): sorted
    unique IDs with the counts added. A stable sort (timsort) of two sorted runs is a linear merge."""
    all_ids = np.concatenate([held, ids])
    order = np.argsort(all_ids, kind="stable")
    all_ids, all_counts = all_ids[order], np.concatenate([held_counts, counts])[order]
    start = np.ones(all_ids.size, dtype=bool)
    start[1:] = all_ids[1:] != all_ids[:-1]
    return all_ids[start], np.add.reduceat(all_counts, np.flatnonzero(start)) if all_ids.size else all_counts


class DistinctCounter:
    """Distinct int64 IDs and their counts, exact up to ``bound`` IDs, then a hash sample.

    Example:
        >>> c = DistinctCounter(bound=1000)
        >>> c.add(np.array([5, 5, 7, 9]))
        >>> c.distinct(), c.distinct(min_count=2), c.exact
        (3.0, 1.0, True)
        >>> big = DistinctCounter(bound=4096)
        >>> big.add(np.arange(100_000))
        >>> big.exact, abs(big.distinct() - 100_000) < 4 * big.stderr()
        (False, True)
    """

    def __init__(self, bound: int = 1 << 16) -> None:
        if bound < 16:
            raise ValueError(f"DistinctCounter: bound must be >= 16 IDs, got {bound}")
        self.bound = bound
        self.level = 0
        self.ids = np.zeros(0, np.int64)
        self.counts = np.zeros(0, np.int64)

    @property
    def exact(self) -> bool:
        """Whether every ID seen is held (no sampling yet)."""
        return self.level == 0

    @property
    def rate(self) -> float:
        """The probability ``p`` that an ID is in the sample."""
        return 2.0 ** -self.level

    def _kept(self, ids: np.ndarray, level: int) -> np.ndarray:
        if level == 0:
            return np.ones(ids.size, dtype=bool)
        h = splitmix64(ids.astype(np.int64, copy=False).view(np.uint64)) & _LOW_BITS
        return (h & np.uint64((1 << level) - 1)) == 0

    def add(self, ids: np.ndarray, counts: np.ndarray | None = None, unique: bool = False) -> None:
        """Count ``ids`` (each once, or ``counts[i]`` times); ``unique``: ``ids`` are already sorted
        and unique (``np.unique(..., return_counts=True)``: one sort shared by several summaries)."""
        ids = np.asarray(ids, dtype=np.int64)
        counts = np.ones(ids.size, np.int64) if counts is None else np.asarray(counts, np.int64)
        if not unique:
            ids, counts = _sum_by_id(ids, counts)
        if self.level:
            keep = self._kept(ids, self.level)
            ids, counts = ids[keep], counts[keep]
        if ids.size == 0:
            return
        self.ids, self.counts = _merge(self.ids, self.counts, ids, counts)
        while self.ids.size > self.bound and self.level < 32:
            self.level += 1
            keep = self._kept(self.ids, self.level)
            self.ids, self.counts = self.ids[keep], self.counts[keep]

    def merge(self, other: "DistinctCounter") -> None:
        """Add ``other``'s IDs (the union, counts added); the coarser sample's level wins."""
        if other.level > self.level:
            self.level = other.level
            keep = self._kept(self.ids, self.level)
            self.ids, self.counts = self.ids[keep], self.counts[keep]
        self.add(other.ids, other.counts, unique=True)

    def distinct(self, min_count: int = 1) -> float:
        """Estimated distinct IDs seen at least ``min_count`` times (exact while ``exact``)."""
        return float(np.count_nonzero(self.counts >= min_count)) / self.rate

    def stderr(self, min_count: int = 1) -> float:
        """Standard error of ``distinct(min_count)`` (0 while exact)."""
        n = np.count_nonzero(self.counts >= min_count)
        p = self.rate
        return math.sqrt(n * (1 - p)) / p

    def frequencies(self, cap: int = 64) -> dict[int, int]:
        """Sampled IDs by how often each was seen: ``{count: ids}``, counts above ``cap`` under ``cap``
        (scale by ``1 / rate`` for all IDs): enough to answer ``distinct(min_count)`` for any
        ``min_count <= cap`` later (``ember plan``, with the run's epochs)."""
        c, n = np.unique(np.minimum(self.counts, cap), return_counts=True)
        return {int(k): int(v) for k, v in zip(c, n)}

    def top(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        """The ``k`` most frequent IDs held, and their counts (exact while ``exact``)."""
        order = np.lexsort((self.ids, -self.counts))[:k]
        return self.ids[order], self.counts[order]


class HeavyHitters:
    """The most frequent IDs of a stream in ``capacity`` counters (mergeable Misra-Gries): an ID
    seen more than ``total / (capacity + 1)`` times is always held, and each held count is at
    most ``error`` below its true count.

    Example:
        >>> h = HeavyHitters(capacity=2)
        >>> h.add(np.array([1, 1, 1, 1, 2, 2, 3, 4]))
        >>> h.top(1), h.error
        ([(1, 3)], 1)
    """

    def __init__(self, capacity: int = 256) -> None:
        self.capacity = capacity
        self.ids = np.zeros(0, np.int64)
        self.counts = np.zeros(0, np.int64)
        self.error = 0  # the most any held count is below the truth

    def add(self, ids: np.ndarray, counts: np.ndarray | None = None, unique: bool = False) -> None:
        """Count ``ids`` (each once, or ``counts[i]`` times); ``unique`` as in ``DistinctCounter.add``."""
        ids = np.asarray(ids, dtype=np.int64)
        counts = np.ones(ids.size, np.int64) if counts is None else np.asarray(counts, np.int64)
        if not unique:
            ids, counts = _sum_by_id(ids, counts)
        ids, counts = _merge(self.ids, self.counts, ids, counts)
        if ids.size > self.capacity:  # subtract the (capacity+1)-th largest count from all, drop the rest
            cut = int(np.partition(counts, ids.size - self.capacity - 1)[ids.size - self.capacity - 1])
            keep = counts > cut
            ids, counts = ids[keep], counts[keep] - cut
            self.error += cut
        self.ids, self.counts = ids, counts

    def top(self, k: int) -> list[tuple[int, int]]:
        """``[(id, count lower bound)]`` of the ``k`` largest held counts, largest first."""
        order = np.lexsort((self.ids, -self.counts))[:k]
        return [(int(self.ids[i]), int(self.counts[i])) for i in order]


class BottomK:
    """A uniform random sample of at most ``k`` float values of a stream (each value gets a
    random key; the ``k`` smallest keys stay), for quantiles.

    Example:
        >>> s = BottomK(k=1000, seed=0)
        >>> s.add(np.arange(10.0))
        >>> s.quantiles([0.0, 0.5, 1.0]).tolist()
        [0.0, 4.5, 9.0]
    """

    def __init__(self, k: int = 100_000, seed: int = 0) -> None:
        self.k = k
        self.rng = np.random.default_rng(seed)
        self.values = np.zeros(0, np.float64)
        self.keys = np.zeros(0, np.float64)
        self.seen = 0

    @property
    def exact(self) -> bool:
        """Whether every value seen is held."""
        return self.seen <= self.k

    def add(self, values: np.ndarray) -> None:
        values = np.asarray(values, dtype=np.float64)
        self.seen += values.size
        self.values = np.concatenate([self.values, values])
        self.keys = np.concatenate([self.keys, self.rng.random(values.size)])
        if self.values.size > self.k:
            keep = np.argpartition(self.keys, self.k - 1)[: self.k]
            self.values, self.keys = self.values[keep], self.keys[keep]

    def quantiles(self, qs: list[float]) -> np.ndarray:
        """The quantiles ``qs`` of the sample (numpy's linear interpolation); NaN when empty."""
        if self.values.size == 0:
            return np.full(len(qs), np.nan)
        return np.quantile(self.values, qs)
