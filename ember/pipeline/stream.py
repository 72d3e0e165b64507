"""StreamLoader: ``train.mode: online``'s loader. One pass over ``data.train`` as a stream of
files, in order, each once (a watched directory or glob: ``data.watch``, see
``ember.source.watch``; else the files listed at start), cut into ``batch_size`` batches that
may span files; resumable at any batch by its stream position.

Stream position (what a checkpoint stores beside ``epoch`` and ``batch``): ``files_done``, the
files whose rows are all in trained batches, in the order read; ``file``, the file the next
row comes from, and ``file_rows``, its rows already trained (counted after bad-row filtering,
so resuming re-reads the file and drops that many featurized rows). Rows never cross a batch
boundary twice: the position of batch ``k`` is where its last row came from, so a run resumed
from the checkpoint after batch ``k`` trains exactly the rows after it.

Batches are cut at a fixed ``batch_size`` whatever the files' sizes and arrival times (a
partial batch waits for the next file), so the batches, and a deterministic run's weights,
do not depend on when files arrived; the rows of a last partial batch train when the stream
ends (idle timeout, unless ``data.drop_last``), not when a signal stops it (they stay for the
resumed run).

Distributed (``ember.train.stream_ranks``): every rank reads the whole stream and trains its
slice of each batch; the ranks agree on each batch (``cut_after``: where it ended) and on where
the stream ends, so the position is the same on every rank and rank 0 writes it.

Example:
    >>> import tempfile, pathlib
    >>> from ember.source.config import DataConfig
    >>> from ember.featurize.schema import Schema
    >>> d = pathlib.Path(tempfile.mkdtemp())
    >>> for name, n in (("a.csv", 3), ("b.csv", 4)):
    ...     _ = (d / name).write_text("y,c\\n" + "".join(f"1,x{i}\\n" for i in range(n)))
    >>> data = DataConfig(format="csv", train=str(d), batch_size=2, shuffle_buffer=0)
    >>> loader = StreamLoader(data, Schema(labels=["y"], sparse=[{"name": "c"}]))
    >>> [b.size for b in loader]
    [2, 2, 2, 1]
    >>> p = loader.stream_position(2)
    >>> [pathlib.Path(f).name for f in p.done], pathlib.Path(p.file).name, p.rows
    (['a.csv'], 'b.csv', 1)
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence

from torch.utils.data import IterableDataset

from ember.batch import Batch
from ember.errors import CheckpointError, MissingColumnsError
from ember.featurize.canonical import hashed_id_types
from ember.featurize.featurizer import Featurizer, read_types
from ember.featurize.rows import Rows
from ember.featurize.schema import Schema
from ember.pipeline.config import QueueDepths
from ember.pipeline.loader import (WINDOW_KEYS, ReadCounter, missing_keys_error, receive_batches, send_batches,
                                   worker_loader)
from ember.pipeline.scheduler import Scheduler, Stage
from ember.pipeline.worker_process import WorkerEnv, worker_context
from ember.source.bad_rows import BadRowReport
from ember.source.config import DataConfig
from ember.source.protocol import Unit, source_for

__all__ = ["StreamLoader", "StreamPosition"]

_KEEP_POSITIONS = 4096  # positions of batches cut but not yet checkpointed (far more than the pipeline holds)


@dataclass(frozen=True)
class StreamPosition:
    """Where a stream stands: ``done`` files finished (in the order read), then ``rows`` rows of
    ``file`` trained (None: the next row starts a new file)."""

    done: tuple[str, ...] = ()
    file: str | None = None
    rows: int = 0

    def to_dict(self) -> dict[str, Any]:
        """The checkpoint's fields (merged into its ``position``)."""
        return {"files_done": list(self.done), "file": self.file, "file_rows": self.rows}

    @classmethod
    def from_position(cls, position: dict[str, Any], where: str) -> "StreamPosition":
        """From a checkpoint's ``position``; CheckpointError naming ``where`` when it has none
        (written by an offline run)."""
        if "files_done" not in position:
            raise CheckpointError(f"{where} holds no stream position (written by a train.mode: offline run); resume it "
                                  "with train.mode: offline, or start the online run from its weights with "
                                  f"train.init_from={where} instead of train.resume")
        return cls(tuple(position["files_done"]), position.get("file"), int(position.get("file_rows", 0)))


class StreamLoader:
    """Batches of ``data.train`` read once as a stream of files (see the module docstring),
    from ``start`` (batch number ``start_batch``).

    Two stages (``stages()``): ``read`` (the next file's record blocks, waiting for new files
    when watched) and ``featurize`` (parse, hash, cut into batches, recording each batch's
    stream position). ``stop()``: true when the stream must end now (a signal, the trainer
    closing): a watched stream stops waiting, and the rows of an unfinished batch are dropped
    (the resumed run trains them). ``position`` is ``(0, next batch)`` like a ``FileLoader``'s.
    ``workers=1``: both stages run in a worker process (``pipeline.data_workers``), which hands
    over each batch with its stream position; ``stop()`` reaches it through an event.
    """

    def __init__(self, data: DataConfig, schema: Schema, start: StreamPosition = StreamPosition(),
                 start_batch: int = 0, depth: QueueDepths | None = None,
                 stop: Callable[[], bool] = lambda: False, workers: int = 0, keys: Sequence[str] = ()) -> None:
        if start_batch < 0:
            raise ValueError(f"start_batch must be >= 0, got {start_batch}")
        self.data, self.schema, self.start, self.start_batch = data, schema, start, start_batch
        self.keys = list(keys)  # raw columns each batch also carries (``Batch.keys``)
        self.depth = depth or QueueDepths()
        self.stop, self.workers = stop, workers
        self.bad_rows = BadRowReport(data.on_bad_rows)
        self.source = source_for(data)
        self.read = ReadCounter()  # rows read so far (progress)
        self.epoch = 0
        self._order: list[str] = list(start.done)  # every file taken, in the order read
        self._lock = threading.Lock()
        self._after: dict[int, tuple[int, str | None, int]] = {start_batch: (len(start.done), start.file, start.rows)}
        self._next = start_batch

    @property
    def position(self) -> tuple[int, int]:
        return (0, self._next)

    @property
    def num_batches(self) -> None:
        """Unknown: a stream."""
        return None

    def stream_position(self, batches: int) -> StreamPosition:
        """The stream position once ``batches`` batches (counted from the stream's start) are
        trained: the checkpoint after them stores it."""
        with self._lock:
            if batches not in self._after:
                raise RuntimeError(f"StreamLoader: no position recorded after batch {batches}")  # internal invariant
            done, file, rows = self._after[batches]
            for k in [k for k in self._after if k < batches]:
                del self._after[k]  # earlier batches are never asked for again
            return StreamPosition(tuple(self._order[:done]), file, rows)

    def cut_after(self, batches: int) -> tuple[str | None, int]:
        """Where batch ``batches`` (counted from the stream's start) ended: (file, rows of it),
        without forgetting earlier positions (``stream_position`` does); ``(None, 0)`` when
        that batch was not cut (yet)."""
        with self._lock:
            if batches not in self._after:
                return None, 0
            _, file, rows = self._after[batches]
            return file, rows

    def _units(self) -> Iterator[Unit]:
        """The resumed unit first (if any), then the units not taken yet, in order (``Source.follow``)."""
        start = self.start
        taken = set(start.done) | ({start.file} if start.file is not None else set())
        return self.source.follow(start.file, taken, self.stop)

    def stages(self) -> list[Stage]:
        """The ``read`` and ``featurize`` stages of this pass; with ``workers``, one ``read``
        stage handing out the batches a worker process made."""
        if self.workers:
            return [Stage("read", self._in_worker, self.depth.featurize, expand=True)]
        featurize = Featurizer(self.schema, self.bad_rows, self.keys, hashed_id_types(self.schema, self.data))
        columns = self.schema.columns
        types = read_types(self.schema, text=self.keys)  # key columns are carried as read
        cutter = _Cutter(self.data.batch_size, self.start_batch, self._record)
        skip = [self.start.rows]  # rows of the resumed file already trained

        def read(_: None) -> Iterator[tuple[int, Any]]:
            self.read = ReadCounter()
            for unit in self._units():
                with self._lock:
                    index = len(self._order)
                    self._order.append(unit.name)
                for chunk in self.source.open(unit, columns, self.bad_rows, types=types):
                    self.read.rows += chunk.batch.num_rows
                    yield index, chunk
            self.read.finished = True

        def parse(item: tuple[int, Any]) -> list[Batch]:
            index, chunk = item
            try:
                rows = featurize(chunk.batch, chunk.file, chunk.row_numbers)
            except MissingColumnsError as e:  # a key column the window asked for: say so
                raise missing_keys_error(e, self.keys, WINDOW_KEYS) from None
            first = 0
            if skip[0] and chunk.file == self.start.file:
                first = min(skip[0], len(rows))
                skip[0] -= first
                rows = rows.slice(first, len(rows))
            return [r.to_batch() for r in cutter.push(rows, index, first)]

        def finish() -> list[Batch]:
            if self.stop():  # stopped, not ended: a partial batch's rows wait for the resumed run
                return []
            return [r.to_batch() for r in cutter.finish(self.data.drop_last)]

        return [Stage("read", read, self.depth.read, expand=True),
                Stage("featurize", parse, self.depth.featurize, expand=True, finish=finish)]

    def _record(self, batches: int, index: int, rows: int) -> None:
        """After ``batches`` batches the stream stands at row ``rows`` of file ``index``."""
        with self._lock:
            self._after[batches] = (index, self._order[index], rows)
            while len(self._after) > _KEEP_POSITIONS:
                del self._after[next(iter(self._after))]

    def _in_worker(self, _: None) -> Iterator[Batch]:
        """This stream's batches, read and featurized by a worker process (``_StreamJob``):
        each comes with the files taken since the last one and its position, recorded here;
        the worker's bad-row counts are added at the end, its error is raised here."""
        ctx = worker_context()
        stopped = ctx.Event()
        over = threading.Event()

        def relay() -> None:  # stop() is this process's (a signal flag): the worker sees the event
            while not over.wait(0.05):
                if self.stop():
                    stopped.set()
                    return

        if self.stop():  # asked already: the worker sees it before it reads anything
            stopped.set()
        else:
            threading.Thread(target=relay, name="ember-stream-stop", daemon=True).start()
        job = _StreamJob(self.data, self.schema, self.start, self.start_batch, self.depth, stopped, self.keys)
        loader = worker_loader(job, self.depth.featurize, ctx, (self.data.seed, self.start_batch))
        try:
            for batch, taken, (k, index, rows) in receive_batches(loader, self.bad_rows):
                with self._lock:
                    self._order.extend(taken)
                self._record(k, index, rows)
                yield batch
        finally:
            over.set()
            stopped.set()  # the pipeline closed: a waiting worker ends

    def __iter__(self) -> Iterator[Batch]:
        self._next = self.start_batch
        with Scheduler(self.stages(), threaded=False) as run:
            for batch in run:
                self._next += 1
                yield batch


class _StreamJob(IterableDataset):
    """A stream's work for a worker process: ``("batch", (batch, files taken since the last
    batch, (batches cut, file index, file rows)))`` per batch, then ``("end", bad-row counts)``,
    or ``("error", exception)`` (raised by the trainer itself, message intact)."""

    def __init__(self, data: DataConfig, schema: Schema, start: StreamPosition, start_batch: int,
                 depth: QueueDepths, stopped: Any, keys: Sequence[str] = ()) -> None:
        self.args = (data, schema, start, start_batch, depth)
        self.stopped, self.keys = stopped, list(keys)
        self.env = WorkerEnv()

    def __iter__(self) -> Iterator[tuple[str, object]]:
        self.env.apply()
        loader = StreamLoader(*self.args, stop=self.stopped.is_set, keys=self.keys)

        def batches() -> Iterator[tuple[Batch, list[str], tuple[int, int, int]]]:
            sent = len(loader._order)
            k = loader.start_batch
            with Scheduler(loader.stages(), threaded=True) as run:  # read and featurize overlap in the worker
                for batch in run:
                    k += 1
                    with loader._lock:
                        index, _, rows = loader._after[k]
                        taken, sent = loader._order[sent:], len(loader._order)
                    yield batch, taken, (k, index, rows)

        return send_batches(batches(), lambda: loader.bad_rows.counts)


class _Cutter:
    """Featurized rows of the stream in, ``batch_size`` batches out (spanning files), reporting
    for each batch where its last row came from (``record(batches cut, file index, rows of
    that file up to it)``)."""

    def __init__(self, batch_size: int, first_batch: int, record: Callable[[int, int, int], None]) -> None:
        self.batch_size, self.cut, self.record = batch_size, first_batch, record
        self._pending: list[tuple[Rows, int, int]] = []  # rows, file index, file rows up to their last
        self._n = 0
        self._file_rows: dict[int, int] = {}

    def push(self, rows: Rows, index: int, skipped: int = 0) -> list[Rows]:
        """Rows of file ``index`` (following its earlier rows; ``skipped`` more rows of it before
        them were trained already); the batches now complete."""
        end = self._file_rows.get(index, 0) + skipped + len(rows)
        self._file_rows = {index: end}  # files arrive in order: only the current one is counted
        if len(rows):
            self._pending.append((rows, index, end))
            self._n += len(rows)
        out = []
        while self._n >= self.batch_size:
            out.append(self._take(self.batch_size))
        return out

    def finish(self, drop_last: bool) -> list[Rows]:
        """The last partial batch (none with ``drop_last``)."""
        if not self._n or drop_last:
            return []
        return [self._take(self._n)]

    def _take(self, n: int) -> Rows:
        parts: list[Rows] = []
        need = n
        last = (0, 0)
        while need:
            rows, index, end = self._pending[0]
            if len(rows) <= need:
                parts.append(rows)
                self._pending.pop(0)
                need -= len(rows)
                last = (index, end)
            else:
                parts.append(rows.slice(0, need))
                self._pending[0] = (rows.slice(need, len(rows)), index, end)
                last = (index, end - (len(rows) - need))
                need = 0
        self._n -= n
        self.cut += 1
        self.record(self.cut, *last)
        return parts[0] if len(parts) == 1 else Rows.concat(parts)
