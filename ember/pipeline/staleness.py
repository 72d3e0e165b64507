"""Bounded staleness: when a batch's rows may be fetched, and what its update must re-read.

Batches are numbered 0, 1, 2, ... in the order they train. With staleness ``k`` the rows of
batch ``b`` may be fetched once the updates of batches ``0 .. b-1-k`` are written: ``k = 0`` is
exact synchronous training (every read sees every earlier update), ``k > 0`` lets the fetch run
up to ``k`` batches ahead of the update, overlapping tier reads (a cold disk) with compute.
No update is ever lost: before batch ``b``'s update, the rows that batches fetched-before-but-
written-after wrote are re-read (``GroupLookup.refresh``), so each gradient lands on the
current row; a read is at most ``k`` updates behind.

Distributed (``lockstep``), every rank must fetch the same batches: a fetch is an all-to-all
with the other ranks. A stop request (agreed by the ranks after batch ``c``'s compute) then
ends the stream before batch ``c + 2 + k``, which no rank can have entered yet (its fetch needs
batch ``c + 1``'s update), rather than wherever each rank's fetch thread happens to be.

Barriers: the trainer checkpoints, evaluates and logs on a quiet engine. After a batch it marks
as a barrier, no later batch is fetched until ``release()``; a fetch's side effects (admission
counts, cache promotions) then never belong to a batch the checkpoint has not trained.
"""

from __future__ import annotations

import threading
from collections import deque
from typing import Callable, Sequence

import numpy as np

from ember.embedding.group import GroupLookup, pair_keys

__all__ = ["FetchGate", "WriteLog"]


class FetchGate:
    """Orders fetches against updates (see the module docstring).

    Args:
        staleness: ``k``, how many batches the fetch may run ahead of the written updates.
        barrier: ``barrier(b)`` is true when the trainer needs a quiet engine after batch ``b``.
        limit: batches to fetch at most (e.g. what is left of ``train.max_steps``); None: no limit.
    """

    def __init__(self, staleness: int, barrier: Callable[[int], bool] = lambda b: False, limit: int | None = None) -> None:
        if staleness < 0:
            raise ValueError(f"staleness must be >= 0, got {staleness}")
        self.staleness, self.barrier, self.limit = staleness, barrier, limit
        self._written = 0  # batches whose update is written (in order: 0 .. written-1)
        self._held: int | None = None  # a barrier batch awaiting release
        self._stopped = False
        self._computed = -1  # the last batch the trainer computed
        self.lockstep = False  # distributed: stop every rank's fetches at the same batch
        self._cv = threading.Condition()

    @property
    def written(self) -> int:
        """How many batches' updates are written (batches 0 .. written-1)."""
        return self._written

    def enter(self, b: int, ahead: int = 0) -> bool:
        """Wait until batch ``b`` may be fetched (``ahead``: its host half prepared, that many
        batches before the fetch itself may run); False when it never will be (stopped, or
        past ``limit``): the stream ends before it."""
        with self._cv:
            while not self._stopped and not self._past_limit(b) and (
                    self._held is not None or self._written < b - self.staleness - ahead):
                self._cv.wait(0.1)
            return not self._stopped and not self._past_limit(b)

    def _past_limit(self, b: int) -> bool:
        return self.limit is not None and b >= self.limit

    def end_at(self, b: int) -> None:
        """The stream ends before batch ``b`` (a limit learnt while training: e.g. the step
        from which no rank has rows under ``data.shard: files``)."""
        with self._cv:
            self.limit = b if self.limit is None else min(self.limit, b)
            self._cv.notify_all()

    def fetched(self, b: int) -> None:
        """Batch ``b`` was fetched; a barrier holds every later fetch until ``release``."""
        if self.barrier(b):
            with self._cv:
                self._held = b

    def wrote(self, b: int) -> None:
        """Batch ``b``'s update is written (updates are written in batch order)."""
        with self._cv:
            if b != self._written:
                raise RuntimeError(f"FetchGate: update of batch {b} written out of order (expected {self._written})")
            self._written = b + 1
            self._cv.notify_all()

    def release(self) -> None:
        """The trainer is done with its barrier: fetching may go on."""
        with self._cv:
            self._held = None
            self._cv.notify_all()

    def computed(self, b: int) -> None:
        """The trainer computed batch ``b`` (where a ``lockstep`` stop counts from)."""
        with self._cv:
            self._computed = b

    def stop(self) -> None:
        """Fetch no more batches (a stop request): ``enter`` returns False from now on. In
        ``lockstep`` (distributed) the stream ends before batch ``computed + 2 + staleness``
        instead: the batches before it, which some rank may have begun to fetch, are fetched
        everywhere; only where the trainer stands at the barrier batch itself (every rank's
        fetches wait there for its ``release``) does it stop at once."""
        with self._cv:
            at_barrier = self._held is not None and self._held <= self._computed
            if self.lockstep and not at_barrier and not self._stopped:
                end = self._computed + 2 + self.staleness
                self.limit = end if self.limit is None else min(self.limit, end)
            else:
                self._stopped = True
            self._cv.notify_all()


class _Written:
    """The IDs one lookup stored, per table (not the lookup: its rows are not kept); their keys
    (``GroupLookup.keys``) made when first asked for."""

    def __init__(self, lookup: GroupLookup) -> None:
        self.group, self._written = lookup.group, list(lookup.written)
        self._keys: np.ndarray | None = None

    def keys(self) -> np.ndarray:
        if self._keys is None:
            self._keys = pair_keys(self._written)
        return self._keys


class WriteLog:
    """The IDs each of the last ``staleness + ahead`` batches wrote, per table group, to refresh
    stale reads from (IDs only: the batches' row buffers are not kept; their keys made only
    when a read needs them). ``ahead``: batches a device cache's host half is prepared before
    its fetch (``GroupLookup.prepare``); the rows its groups' write-backs store in between are
    re-read into the prepared plans (``reread``)."""

    def __init__(self, staleness: int, ahead: int = 0) -> None:
        self.staleness, self.ahead = staleness, ahead
        self._recent: deque[tuple[int, list[_Written]]] = deque(maxlen=max(staleness + ahead, 1))
        self.refreshed_rows = 0
        self.reread_rows = 0

    def _newer(self, lo: int, hi: int) -> list[_Written]:
        return [w for i, writes in self._recent if lo <= i < hi for w in writes]

    def refresh(self, b: int, fetched_after: int, lookups: Sequence[GroupLookup]) -> None:
        """Before batch ``b``'s update: its ``lookups`` were fetched when ``fetched_after``
        batches were written; re-read what batches ``fetched_after .. b-1`` wrote since."""
        if not self.staleness:
            return
        newer = self._newer(fetched_after, b)
        if newer:
            for lk in lookups:
                mine = [w.keys() for w in newer if w.group is lk.group]
                if mine:
                    self.refreshed_rows += lk.refresh(mine)

    def reread(self, prepared_after: int, fetched_after: int, lookups: Sequence[GroupLookup]) -> None:
        """Before a fetch (when ``fetched_after`` batches are written) whose host half was
        prepared when ``prepared_after`` were: re-read into the prepared plans what the
        batches in between wrote outside the caches' arenas (``GroupLookup.reread``; the keys
        of what they wrote only where the cache cannot tell by itself)."""
        newer = self._newer(prepared_after, fetched_after) if fetched_after > prepared_after else []
        for lk in lookups:
            mine = [w for w in newer if w.group is lk.group]
            if mine:
                self.reread_rows += lk.reread(lambda: [w.keys() for w in mine])

    def record(self, b: int, lookups: Sequence[GroupLookup]) -> None:
        """Batch ``b``'s ``lookups`` are written (the groups a fetch prepares ahead only, at
        staleness 0: only they re-read)."""
        if self.staleness or self.ahead:
            self._recent.append((b, [_Written(lk) for lk in lookups if lk.written and (self.staleness or lk.preparable)]))
