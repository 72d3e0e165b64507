"""``train.mode: online`` in a distributed run: every rank reads the whole stream and trains its
slice of each global batch (``data.shard: rows``, as offline), so the ranks must agree, batch
by batch, that they cut the same batches and where the stream ends.

Each rank watches ``data.train`` on its own (``ember.pipeline.stream``: the batches are cut at
a fixed ``batch_size`` whatever the files' arrival times), so the ranks' streams hold the same
batches up to where one of them ends: its idle timeout may fire before a late file that
another rank has already taken, and its last batch is then partial where another's is full.
The ranks learn each other's next batches two steps ahead through the per-step agreement the
loop already makes (``DistributedRun.agree``, a max over ranks), as ``data.shard: files`` does
(``ember.train.shards``): for step ``i + AHEAD`` each rank sends its batch's size and a
fingerprint of where the batch ended (file and rows), and the negated pair, so that the max
gives both the largest and the smallest value. The pass ends before the first step that some
rank lacks, or whose batch differs in size (one rank's last, partial batch): every rank stops
after the same step, and the rows after it stay for a resumed run (the checkpoint's stream
position is rank 0's, the same on every rank up to there). Batches of equal size that end at
different places mean the ranks read the files in different orders: DataError.

The cost: a batch trains once the stream has cut the ``AHEAD`` batches after it (or ended).
"""

from __future__ import annotations

import zlib

from ember.batch import Batch
from ember.errors import DataError
from ember.pipeline.scheduler import Stage
from ember.pipeline.stream import StreamLoader
from ember.train.shards import AHEAD, LookAhead

__all__ = ["StreamRanks"]

_SLOTS = 4  # size, -size, fingerprint, -fingerprint


class StreamRanks(LookAhead):
    """One online pass on one rank of a distributed run (see the module docstring): the
    ``agree`` stage that follows the stream's stages, and what the ranks agreed on.

    Args:
        stream: this rank's stream (every rank reads all of it).
        first_batch: the stream's batch number where the pass starts (a resumed run's ``batch``).
        ahead: steps agreed on ahead (``ember.train.shards.ahead_of`` the run's staleness).
    """

    def __init__(self, stream: StreamLoader, first_batch: int, ahead: int = AHEAD) -> None:
        super().__init__(ahead)  # records: per step of the pass, (rows, fingerprint of where the batch ended)
        self.stream, self.first_batch = stream, first_batch
        self.width = _SLOTS
        self.end: int | None = None  # the first step some rank lacks: the pass ends before it

    def stage(self, depth: int) -> Stage:
        """The ``agree`` stage: notes each batch's size and where it ended, and holds ``ahead``
        batches back (so step i + ahead is known when step i trains)."""
        return self._stage("agree", depth)

    def _record(self, batch: Batch) -> tuple[int, int]:
        file, rows = self.stream.cut_after(self.first_batch + len(self._records) + 1)
        return batch.size, zlib.crc32(f"{file}\0{rows}\0{batch.size}".encode()) + 1  # > 0: 0 is "no batch"

    def _slots(self, step: int) -> list[int]:
        rows, mark = self._recorded(step, "batch") or (0, 0)  # type: ignore[misc]
        return [rows, -rows, mark, -mark]

    def _note(self, step: int, agreed: list[int]) -> None:
        most, least, mark_hi, mark_lo = agreed[0], -agreed[1], agreed[2], -agreed[3]
        if self.end is not None:
            return
        if least == 0 or most != least:  # some rank's stream ended before this batch, or cut it short
            self.end = step
        elif mark_hi != mark_lo:
            batch = self.first_batch + step
            raise DataError(f"the ranks cut different batches from the watched data.train (batch {batch}: the same "
                            "size, ending in other files or rows): each rank lists the files itself, and they took "
                            "them in different orders. Make files appear complete in the order they are to be read "
                            "(write under a hidden name and rename into place, data.watch.order: mtime), then resume "
                            "from the last checkpoint (train.resume)")
