"""``data.shard: files`` in a distributed run: each rank trains batches of its own files.

Rank r reads training files r, r + N, ... (``ember.pipeline.loader.shard_files``) in batches of
``batch_size / N`` rows and trains them whole at every step; the step's global batch is the
ranks' batches together. Ranks run out of rows at different steps, and every rank must take
part in every step's collectives (embedding all-to-alls, DDP's all-reduce) until all are done:
a rank with no rows left trains empty batches. The ranks learn each other's rows two steps
ahead through the per-step agreement the loop already makes (``DistributedRun.agree``, a
max over one slot per rank), so before any rank fetches step ``j`` every rank knows the
global rows of ``j`` (the loss's denominator) and whether any rank has rows there (else the
pass ends before ``j`` on every rank, through the fetch gate).

Position: each rank's batch index in its own files (``ember.train.run_state.ShardPositions``,
``rank_batches`` in a checkpoint's position); a checkpoint taken mid-epoch resumes on the same
world size only (at an epoch's start, any world size: ``RunState.rank_starts``).
"""

from __future__ import annotations

from collections import deque
from typing import Iterator

from ember.batch import Batch
from ember.config import RunConfig
from ember.distributed.process_group import DistributedRun
from ember.errors import ConfigError
from ember.pipeline.loader import shard_files
from ember.pipeline.scheduler import Stage
from ember.source.protocol import source_for

__all__ = ["FileShards", "LookAhead", "check_file_shards", "AHEAD", "ahead_of"]

AHEAD = 2
"""Batches the ``shard`` stage holds back at staleness 0: after step i the ranks agree on step
i + AHEAD's rows, and no rank fetches step i + 2 before its update of step i + 1, which follows
that agreement (the fetch gate)."""


def ahead_of(staleness: int) -> int:
    """How many steps ahead the ranks must agree (on rows, stream batches, time-based reports)
    with ``pipeline.embedding_staleness`` k: the fetch of step b waits for the update of step
    b - k - 1, which follows the compute of that step, which follows the agreement after step
    b - k - 2; so the agreement after step i must settle step i + k + 2 (``AHEAD`` at k = 0)."""
    return AHEAD + staleness


def check_file_shards(cfg: RunConfig, world_size: int) -> None:
    """Raise ConfigError (on every rank alike) for a ``data.shard: files`` run that cannot
    shard its files among ``world_size`` ranks (the dense ranks: embedding ranks read none): an
    online stream, or fewer training files than ranks."""
    if cfg.data.shard != "files":
        return
    if cfg.train.mode == "online":
        raise ConfigError("data.shard: files is not supported with train.mode: online: every rank reads the whole "
                          "stream and trains its slice of each batch (data.shard: rows), so that the ranks cut the "
                          "same batches as one process and the stream position stays one list of files; dealing "
                          "files that arrive to ranks would need the ranks to agree on each file first. Use data.shard: rows")
    shard_files(source_for(cfg.data).units("train"), 0, world_size)  # fewer units (files, data files) than ranks: raises


class LookAhead:
    """What ``FileShards`` and the online ``StreamRanks`` share: a stage that notes each batch
    (``_record``) and holds ``AHEAD`` batches back, so that after step i every rank can tell
    the others about its batch of step i + AHEAD through the loop's per-step agreement (a max
    over ranks of ``width`` slots: ``ask`` / ``hear``, and ``start`` for the pass's first
    steps). Subclasses say what a batch's record is, its slots, and what an agreement means."""

    width: int  # slots per step in the agreement

    def __init__(self, ahead: int = AHEAD) -> None:
        self.ahead = ahead  # steps held back and agreed on ahead (``ahead_of``)
        self._records: list = []  # per step of the pass, what the stage noted (its thread appends)
        self._read_through = False  # the stage saw the pass's last batch

    def _record(self, batch: Batch) -> object:
        raise NotImplementedError

    def _slots(self, step: int) -> list[int]:
        raise NotImplementedError

    def _note(self, step: int, agreed: list[int]) -> None:
        raise NotImplementedError

    def _recorded(self, step: int, what: str) -> object | None:
        """The record of ``step``; None past the pass's last batch."""
        if step < len(self._records):
            return self._records[step]
        assert self._read_through, f"{what} of step {step} asked before the stage saw it"
        return None

    def _stage(self, name: str, depth: int, tail: Batch | None = None) -> Stage:
        """The holding stage; at the end it yields the held batches, then ``tail`` without end
        when given (the fetch gate ends the pass)."""
        held: deque[Batch] = deque()

        def hold(batch: Batch) -> list[Batch]:
            self._records.append(self._record(batch))
            held.append(batch)
            return [held.popleft()] if len(held) > self.ahead else []

        def finish() -> Iterator[Batch]:
            self._read_through = True
            while held:
                yield held.popleft()
            while tail is not None:
                yield tail

        return Stage(name, hold, depth, expand=True, finish=finish)

    def start(self, dist: DistributedRun) -> None:
        """At the pass's first step (before it trains): agree on steps 0 .. ahead-1."""
        agreed = dist.agree([v for s in range(self.ahead) for v in self._slots(s)])
        for s in range(self.ahead):
            self._note(s, agreed[s * self.width:(s + 1) * self.width])

    def ask(self, step: int) -> list[int]:
        """This rank's values for the agreement after ``step``: its batch of step + ahead."""
        return self._slots(step + self.ahead)

    def hear(self, step: int, agreed: list[int]) -> None:
        """The agreement after ``step`` (``ask``'s slots, maxed over ranks)."""
        self._note(step + self.ahead, agreed)


class FileShards(LookAhead):
    """One pass over a files-sharded epoch (from its start, or the rest of it after a resume)
    on one rank: the ``shard`` stage that follows the loader's stages, and what the ranks
    agreed on (see the module docstring).

    Args:
        rank, world_size: this rank's place.
        empty: the batch of no rows a rank trains once its files are read through.
        starts: each rank's batch index in its own files where the pass starts.
        first_batch: the pass's first step in the epoch (what a checkpoint's ``batch`` counts).
        ahead: steps agreed on ahead (``ahead_of`` the run's staleness).
    """

    def __init__(self, rank: int, world_size: int, empty: Batch, starts: list[int], first_batch: int = 0,
                 ahead: int = AHEAD) -> None:
        super().__init__(ahead)  # records: the rows of this rank's batches of the pass
        self.rank, self.world_size, self.empty, self.starts = rank, world_size, empty, list(starts)
        self.width = world_size
        self.first_batch = first_batch
        self._rows: dict[int, list[int]] = {}  # step of the pass -> each rank's rows, agreed
        self._ended: list[int | None] = [None] * world_size  # first step where a rank had no rows
        self.end: int | None = None  # the first step where no rank has rows: the pass ends before it

    def stage(self, depth: int) -> Stage:
        """The ``shard`` stage: notes each batch's rows, holds ``ahead`` batches back (so the
        rows of step i + ahead are known when step i trains), then yields empty batches
        without end (the fetch gate ends the pass)."""
        return self._stage("shard", depth, tail=self.empty)

    def _record(self, batch: Batch) -> int:
        return batch.size

    def _mine(self, step: int) -> int:
        return self._recorded(step, "rows") or 0  # type: ignore[return-value]

    def _slots(self, step: int) -> list[int]:
        out = [0] * self.world_size
        out[self.rank] = self._mine(step)
        return out

    def _note(self, step: int, rows: list[int]) -> None:
        self._rows[step] = rows
        for r, n in enumerate(rows):
            if n == 0 and self._ended[r] is None:
                self._ended[r] = step
        if not any(rows) and self.end is None:
            self.end = step

    def global_rows(self, step: int) -> int:
        """Rows of step ``step``'s global batch (every rank's together)."""
        return sum(self._rows.pop(step))

    def positions(self, steps: int) -> list[int]:
        """Each rank's batch index in its own files after ``steps`` steps of this pass."""
        return [s + min(steps, e if e is not None else steps) for s, e in zip(self.starts, self._ended)]
