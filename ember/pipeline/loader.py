"""Loaders: what the trainer reads batches from, and ``FileLoader``: config + schema -> an
iterator of :class:`~ember.batch.Batch`, resumable by index.

Every loader follows the ``Loader`` protocol: ``FileLoader`` (files or synthetic rows, by
epoch), ``BatchList`` (batches already in memory) and ``ember.pipeline.stream.StreamLoader``
(``train.mode: online``); the trainer opens the one a run needs with
``ember.train.train_data.open_train_loader``.

Stages: ``read`` record blocks (files) or generate rows (synthetic) -> ``featurize`` (parse,
hash, shuffle buffer (train), cut into ``batch_size`` batches). The trainer runs them as the
first two stages of its pipeline (``ember.pipeline.scheduler``); iterating a ``FileLoader`` runs
them alone, on threads when ``threaded``.

- Determinism: the file order and the shuffle depend only on ``(data.seed, epoch)``, so
  ``make_batches(..., start_batch=k)`` yields exactly batch ``k`` onwards of an uninterrupted
  run. Files are re-read and the first ``k`` batches dropped before they become tensors;
  synthetic data jumps straight to row ``k * batch_size``. Synthetic rows are i.i.d. draws, so
  every epoch replays the same rows in the same order and ``shuffle_buffer`` is not used.
- Shuffle buffer (``data.shuffle_buffer`` rows, train only): rows are pooled until the pool
  holds ``2 * shuffle_buffer`` rows, then a random half leaves. RAM: up to ``2 * shuffle_buffer``
  rows plus one read chunk; randomness: a row moves within a window of about that many rows
  (more buffer = better mixed, more RAM). With a buffer, the file order is shuffled too.
- Threads: the read and featurize stages each keep a bounded queue of their output
  (``pipeline.depth``); an error in either is re-raised to the consumer, naming the stage.

Example:
    >>> from ember.source.config import DataConfig
    >>> from ember.featurize.presets import preset_schema
    >>> data = DataConfig(batch_size=4, synthetic={"rows": 10, "num_dense": 2, "num_sparse": 3})
    >>> loader = make_batches(data, preset_schema("synthetic", data), "train")
    >>> [b.size for b in loader], loader.position, loader.bad_rows.total
    ([4, 4, 2], (0, 3), 0)
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Literal, Protocol, Sequence, TypeVar

import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset

from ember.batch import Batch
from ember.featurize.canonical import hashed_id_types
from ember.featurize.featurizer import Featurizer, read_types
from ember.featurize.rows import Rows
from ember.featurize.schema import Schema
from ember.pipeline.config import QueueDepths
from ember.pipeline.scheduler import Scheduler, Stage
from ember.pipeline.worker_process import WorkerEnv, worker_context
from ember.errors import ConfigError, MissingColumnsError
from ember.source.bad_rows import BadRowReport
from ember.source.base import RecordChunk
from ember.source.config import DataConfig
from ember.source.protocol import Source, source_for
from ember.source.synthetic import split_rows, synthetic_records
from ember.source.writer import write_synthetic

__all__ = ["BatchList", "FileLoader", "Loader", "ReadCounter", "make_batches", "write_synthetic", "shard_files",
           
           "empty_batch", "RankSlice", "slice_bounds", "worker_loader", "missing_keys_error"]

Split = Literal["train", "eval"]
T = TypeVar("T")
_KEEP_KEYS = 4096  # positions of batches cut but not yet checkpointed (far more than the pipeline holds)


@dataclass
class ReadCounter:
    """What the read stage has read of this epoch so far: rows, and bytes of the files as
    stored (complete files plus the part of the current one; CSV only; a compressed file's
    decompressor reads a bounded chunk ahead). A progress bar estimates a CSV epoch's rows
    from them (``ember.train.progress``)."""

    rows: int = 0
    bytes: int = 0
    finished: bool = False  # every file of the epoch read through


def _record_chunks(source: Source, data: DataConfig, schema: Schema, split: Split, rng: np.random.Generator,
                   report: BadRowReport, counter: ReadCounter | None = None,
                   part: tuple[int, int] | None = None, keys: Sequence[str] = (), at: Any = None) -> Iterator[RecordChunk]:
    """The record blocks of ``split``'s units as an epoch reads them: in the units' order, shuffled
    when training with a shuffle buffer, rank ``part[0]``'s units alone under ``part``."""
    counter = counter or ReadCounter()
    units = source.units(split, at)
    if split == "train" and data.shuffle_buffer > 0:
        units = [units[i] for i in rng.permutation(len(units))]
    if part is not None:
        units = shard_files(units, *part)
    cols = schema.columns
    cols = cols + [k for k in keys if k not in cols]
    types = read_types(schema, text=keys)  # key columns are carried as read
    done = 0  # bytes of the units read completely
    for unit in units:
        consumed = [0]
        for chunk in source.open(unit, cols, report, at, consumed, types=types):
            counter.rows, counter.bytes = counter.rows + chunk.batch.num_rows, done + consumed[0]
            yield chunk
        done += consumed[0]
        counter.bytes = done
    counter.finished = True


def shard_files(files: Sequence[T], rank: int, world_size: int) -> list[T]:
    """Rank ``rank``'s files under ``data.shard: files``: files ``rank, rank + N, ...`` of the
    epoch's ordered list. Raises ConfigError when there are fewer files than ranks.

    Example:
        >>> shard_files(["a", "b", "c"], 0, 2), shard_files(["a", "b", "c"], 1, 2)
        (['a', 'c'], ['b'])
    """
    if len(files) < world_size:
        raise ConfigError(f"data.shard: files gives each of the {world_size} ranks its own training files, but "
                          f"data.train has {len(files)} file(s); split the data into at least {world_size} files "
                          "(more, of similar sizes, balance the ranks), or use data.shard: rows")
    return list(files[rank::world_size])


def empty_batch(schema: Schema) -> Batch:
    """A batch of no rows laid out as ``schema``'s batches (what a rank with no rows left
    trains under ``data.shard: files`` while the others still have some)."""
    keys = schema.feature_names
    rows = Rows(np.zeros((0, len(schema.dense)), np.float32), np.zeros((0, len(schema.labels)), np.float32), keys,
                [np.zeros(0, np.int64) for _ in keys], [np.zeros(1, np.int64) for _ in keys],
                [None if f.weight_column is None else np.zeros(0, np.float32) for f in schema.sparse],
                np.zeros((0, len(schema.teacher)), np.float32) if schema.teacher and not schema.score_only else None)
    return rows.to_batch()


class _Batcher:
    """Featurized rows in, batches out: the shuffle buffer and the cut into ``batch_size``
    batches, pushed one part at a time (so it can run as a stage), dropping the first ``skip``.

    Shuffle buffer: rows are pooled until the pool holds ``2 * buffer`` rows, then a random
    half leaves; at the end the rest leaves shuffled.
    """

    def __init__(self, batch_size: int, buffer: int, rng: np.random.Generator, drop_last: bool, skip: int) -> None:
        self.batch_size, self.buffer, self.rng = batch_size, buffer, rng
        self.drop_last, self.skip = drop_last, skip
        self._pool: list[Rows] = []
        self._pooled = 0
        self._pending: list[Rows] = []
        self._n = 0
        self._cut = 0  # batches cut so far (skipped ones included)

    def push(self, rows: Rows) -> list[Rows]:
        if not self.buffer:
            return self._rebatch(rows)
        self._pool.append(rows)
        self._pooled += len(rows)
        if self._pooled < 2 * self.buffer:
            return []
        everything = Rows.concat(self._pool)
        perm = self.rng.permutation(self._pooled)
        self._pool, self._pooled = [everything.take(perm[self._pooled - self.buffer :])], self.buffer
        return self._rebatch(everything.take(perm[: len(perm) - self.buffer]))

    def finish(self) -> list[Rows]:
        out = []
        if self._pooled:
            everything = Rows.concat(self._pool)
            out = self._rebatch(everything.take(self.rng.permutation(self._pooled)))
            self._pool, self._pooled = [], 0
        if self._n and not self.drop_last:
            out += self._keep(Rows.concat(self._pending))
            self._pending, self._n = [], 0
        return out

    def _rebatch(self, rows: Rows) -> list[Rows]:
        if not len(rows):
            return []
        self._pending.append(rows)
        self._n += len(rows)
        out: list[Rows] = []
        if self._n >= self.batch_size:
            everything = Rows.concat(self._pending)
            i = 0
            while self._n - i >= self.batch_size:
                out += self._keep(everything.slice(i, i + self.batch_size))
                i += self.batch_size
            self._pending = [everything.slice(i, self._n)] if i < self._n else []
            self._n -= i
        return out

    def _keep(self, batch: Rows) -> list[Rows]:
        self._cut += 1
        return [batch] if self._cut > self.skip else []  # skipped batches never become tensors


@dataclass(frozen=True)
class RankSlice:
    """One rank's slice of a global batch, made by the loader itself (``FileLoader(rank_slice=...)``:
    only the slice's rows were generated and featurized); ``rows``: the global batch's rows."""

    batch: Batch
    rows: int


# what asks the training stream for key columns: the rolling window's GAUC and slices
WINDOW_KEYS = "eval.group_by / eval.slices (with eval.window_rows, over the training rows too)"


def missing_keys_error(error: MissingColumnsError, keys: Sequence[str], why: str) -> Exception:
    """The error for a read that lacked columns: a ConfigError naming ``why`` (what asked for
    them) when key columns are among them, else ``error`` itself (a schema column is missing)."""
    import difflib

    lost = [c for c in error.missing if c in keys]
    if not lost:
        return error
    lower = {c.lower(): c for c in error.available}  # case ignored: ``ID`` finds ``id``
    hints = {c: difflib.get_close_matches(c.lower(), list(lower), n=1) for c in lost}
    hint = "".join(f"; did you mean '{lower[h[0]]}' for '{c}'?" for c, h in hints.items() if h)
    return ConfigError(f"{why} names column(s) {lost}, which the data does not have (its columns: "
                       f"{error.available}){hint}; name columns of the data (features or not), or add them to it")


def _keys_checked(chunks: Iterator[RecordChunk], keys: Sequence[str], why: str) -> Iterator[RecordChunk]:
    """``chunks``, a file without a key column reported as ``missing_keys_error`` says."""
    try:
        yield from chunks
    except MissingColumnsError as e:
        raise missing_keys_error(e, keys, why) from None


def slice_bounds(rows: int, rank: int, world_size: int) -> tuple[int, int]:
    """[start, stop) of rank ``rank``'s slice of a global batch of ``rows`` rows: slice r of N
    nearly equal slices, in order (``DistributedRun.local_rows``)."""
    return rows * rank // world_size, rows * (rank + 1) // world_size


class Loader(Protocol):
    """What the trainer reads batches from: ``stages()`` (the stages that read and featurize,
    which the trainer chains with its own), or iterating them alone; ``position`` is ``(epoch,
    index of the next batch)``; ``num_batches`` the epoch's batches when known (else None);
    ``bad_rows`` the rows skipped under ``on_bad_rows: skip`` (complete once iteration ends)."""

    bad_rows: BadRowReport

    @property
    def position(self) -> tuple[int, int]: ...

    @property
    def num_batches(self) -> int | None: ...

    def stages(self) -> list[Stage]: ...

    def __iter__(self) -> Iterator[Any]: ...


class FileLoader:
    """Iterable of batches of one split and epoch, starting at batch ``start_batch``.

    Two stages (``stages()``): ``read`` (record blocks from files, or row ranges of the
    generator) and ``featurize`` (parse, hash, shuffle, cut into batches, to tensors).
    Iterating runs them on two threads with bounded queues (``threaded=True``) or in line;
    a trainer chains them with its own stages instead. ``part=(r, N)`` (training files under
    ``data.shard: files``): only files ``r, r + N, ...`` (``shard_files``), in batches of
    ``batch_size / N`` rows. ``rank_slice=(r, N)`` (synthetic training data under
    ``data.shard: rows``): each global batch's slice r alone is generated and featurized,
    yielded as a :class:`RankSlice` (the same rows as slicing the whole batch, at 1/N the cost). ``bad_rows`` counts rows skipped under
    ``on_bad_rows: skip`` (complete once iteration ends); ``position`` is ``(epoch, index of
    the next batch)``, what a checkpoint stores. ``keys``: raw columns each batch also carries,
    as ``Batch.keys`` (see :meth:`carry`).
    """

    def __init__(self, data: DataConfig, schema: Schema, split: Split = "train", epoch: int = 0,
                 start_batch: int = 0, threaded: bool = False, depth: QueueDepths | None = None,
                 workers: int = 0, part: tuple[int, int] | None = None,
                 rank_slice: tuple[int, int] | None = None, keys: Sequence[str] = (),
                 at: Any = None, pinned: bool = False, source: Source | None = None) -> None:
        if split not in ("train", "eval"):
            raise ValueError(f"split must be 'train' or 'eval', got {split!r}")
        if not isinstance(data, DataConfig) or not isinstance(schema, Schema):
            raise TypeError(f"FileLoader takes a DataConfig and a Schema (cfg.data, cfg.schema), got "
                            f"{type(data).__name__} and {type(schema).__name__}")
        if epoch < 0:
            raise ValueError(f"epoch must be >= 0, got {epoch}")
        if start_batch < 0:
            raise ValueError(f"start_batch must be >= 0, got {start_batch}")
        self.data, self.schema, self.split = data, schema, split
        self.epoch, self.start_batch = epoch, start_batch
        self.threaded = threaded
        self.depth = depth or QueueDepths()
        self.part = part
        if rank_slice is not None and data.format != "synthetic":
            raise ValueError("FileLoader: rank_slice is for synthetic data (files are cut into batches after featurizing)")
        self.rank_slice = rank_slice
        self.batch_size = data.split_batch_size(split) // (part[1] if part else 1)
        self.bad_rows = BadRowReport(data.on_bad_rows)
        self.read = ReadCounter()  # rows and bytes read so far this epoch (progress estimates)
        self.workers = workers  # 1: read and featurize in a worker process (``_in_worker``)
        self._next = start_batch
        self.keys: list[str] = list(keys)
        self.keys_for = "a key column request"  # what asked for ``keys``, for the error when the data lacks one
        self.source = source if source is not None else source_for(data)  # (given: the one that pinned ``at``)
        self.at = at  # the epoch's position as its source pinned it (``Source.start``), or a checkpoint's
        self.pinned = pinned  # ``at`` is settled already (``pin_epoch``: the ranks' one pin): used as it is
        self._after: dict[int, Any] = {start_batch: at}  # batches cut -> the position after them (keyed sources)

    def carry(self, columns: Sequence[str], why: str) -> None:
        """From the next iteration on, also carry the raw ``columns`` into each batch's ``keys``
        (e.g. what eval groups by). ``why`` names what asked for them (``eval.group_by``): the
        ConfigError when the data lacks one says so."""
        self.keys = list(dict.fromkeys([*self.keys, *columns]))
        self.keys_for = why

    @property
    def position(self) -> tuple[int, int]:
        return (self.epoch, self._next)

    @property
    def _ordered(self) -> bool:
        """Rows read in the source's order: evaluation, or training without a shuffle buffer."""
        return self.split != "train" or not self.data.shuffle_buffer

    def source_position(self, batch: int) -> Any:
        """The source's position once ``batch`` batches of this epoch are trained (a SQL query's
        last key trained, or what the epoch pinned: a shuffled query's key bound, an Iceberg
        snapshot); None at the epoch's start or for sources whose batch index is the position."""
        if not batch:
            return None
        if self.source.key(self.split, self._ordered) is None:
            return self.at
        if batch not in self._after:
            raise RuntimeError(f"FileLoader: no position recorded after batch {batch}")  # internal invariant
        for k in [k for k in self._after if k < batch]:
            del self._after[k]  # earlier batches are never asked for again
        return self._after[batch]

    @property
    def num_batches(self) -> int | None:
        """Batches in this epoch (synthetic data only; None for files)."""
        if self.data.format != "synthetic":
            return None
        n = split_rows(self.data.synthetic, self.split)
        drop = self.data.drop_last and self.split == "train"
        return n // self.batch_size if drop else -(-n // self.batch_size)

    def stages(self) -> list[Stage]:
        """The ``read`` and ``featurize`` stages of this epoch (fresh state each call); with
        ``workers``, one ``read`` stage handing out the batches a worker process made."""
        key = self._start()
        if self.workers:
            return self._recorded([Stage("read", self._in_worker, self.depth.featurize, expand=True)], key)
        keys, why = list(self.keys), self.keys_for
        if key is not None and key not in keys:
            keys.append(key)  # each batch's last key is its position (dropped again in _recorded)
        featurize_all = Featurizer(self.schema, self.bad_rows, keys, self.id_types)

        def featurize_keyed(*args: Any) -> Rows:  # data without a key column: say what asked for it
            try:
                return featurize_all(*args)
            except MissingColumnsError as e:
                raise missing_keys_error(e, keys, why) from None

        featurize = featurize_keyed if keys else featurize_all
        if self.data.format == "synthetic":
            n, b = split_rows(self.data.synthetic, self.split), self.batch_size

            def read_synthetic(_: None) -> Iterator[tuple]:
                for k in range(self.start_batch, self.num_batches or 0):
                    start, stop = k * b, min((k + 1) * b, n)
                    lo, hi = (0, stop - start) if self.rank_slice is None else slice_bounds(stop - start, *self.rank_slice)
                    yield (synthetic_records(self.data.synthetic, self.split, start + lo, start + hi),
                           f"<synthetic {self.split}>", start + lo + 1, stop - start)

            def one_batch(part: tuple) -> Batch | RankSlice:
                batch = featurize(*part[:3]).to_batch()
                return batch if self.rank_slice is None else RankSlice(batch, part[3])

            return [Stage("read", read_synthetic, self.depth.read, expand=True),
                    Stage("featurize", one_batch, self.depth.featurize)]
        rng = np.random.default_rng([self.data.seed, self.epoch, 0 if self.split == "train" else 1])
        shuffle = self.data.shuffle_buffer if self.split == "train" else 0
        drop_last = self.data.drop_last and self.split == "train"
        skip = 0 if key is not None else self.start_batch  # by key, the source starts after the batches trained
        batcher = _Batcher(self.batch_size, shuffle, rng, drop_last, skip)

        def read(_: None) -> Iterator[RecordChunk]:
            # the file order is drawn here, before the first block, so the shuffle's draws from
            # the same generator (featurize stage) always come after it
            self.read = ReadCounter()
            chunks = _record_chunks(self.source, self.data, self.schema, self.split, rng, self.bad_rows, self.read,
                                    self.part, keys, self.at)
            return _keys_checked(chunks, keys, why) if keys else chunks

        def parse(chunk: RecordChunk) -> list[Batch]:
            return [rows.to_batch() for rows in batcher.push(featurize(chunk.batch, chunk.file, chunk.row_numbers))]

        def finish() -> list[Batch]:
            return [rows.to_batch() for rows in batcher.finish()]

        return self._recorded([Stage("read", read, self.depth.read, expand=True),
                               Stage("featurize", parse, self.depth.featurize, expand=True, finish=finish)], key)

    @functools.cached_property
    def id_types(self) -> tuple[dict[str, str], str | None]:
        """The hashed ID columns' types in the first training file, which every file's IDs are
        brought to (``Featurizer``'s ``id_types``): read once per loader, from one footer."""
        return hashed_id_types(self.schema, self.data)

    def _start(self) -> str | None:
        """Settle where this epoch reads from (``Source.start``: what it pins, e.g. a shuffled
        query's key bound or an Iceberg snapshot, is taken here, in the trainer's process, so a
        worker reads the same rows) and return the column whose last value per batch is the
        position (``Source.key``), or None. ``pinned``: ``at`` is used as it is."""
        if not self.pinned:
            self.at = self.source.start(self.split, self.at, self._ordered, self.start_batch > 0)
        self._after[self.start_batch] = self.at
        return self.source.key(self.split, self._ordered)

    def _recorded(self, stages: list[Stage], key: str | None) -> list[Stage]:
        """``stages`` with the last one noting each batch's last ``key`` value (the position
        after it) and dropping that column from the batch unless asked for by ``carry``."""
        if key is None:
            return stages
        last, cut, drop = stages[-1], [self.start_batch], key not in self.keys

        def note(batch: Any) -> Any:
            cut[0] += 1
            self._after[cut[0]] = self.source.after(self.at, batch.keys[key][-1])
            while len(self._after) > _KEEP_KEYS:  # no checkpoint for a long while: forget the oldest
                del self._after[next(iter(self._after))]
            if drop:
                rest = {k: v for k, v in batch.keys.items() if k != key}
                batch = dataclasses.replace(batch, keys=rest or None)
            return batch

        def noted(item: Any) -> Iterator[Any]:
            for batch in last.fn(item):
                yield note(batch)

        finish = (lambda: [note(b) for b in last.finish()]) if last.finish is not None else None  # type: ignore[misc]  # checked
        return [*stages[:-1], dataclasses.replace(last, fn=noted, finish=finish)]

    def _in_worker(self, _: None) -> Iterator[Batch]:
        """This loader's batches, read and featurized by a worker process; its bad-row counts
        are added here at the end, its error is raised here (the same exception)."""
        key = self.source.key(self.split, self._ordered)
        more = (key,) if key is not None and key not in self.keys else ()  # kept by the worker: positions are noted here
        job = _WorkerJob(self.data, self.schema, self.split, self.epoch, self.start_batch, self.depth, self.part,
                         self.rank_slice, (tuple(self.keys) + more, self.keys_for), self.at)
        loader = worker_loader(job, self.depth.featurize, worker_context(), (self.data.seed, self.epoch))
        yield from receive_batches(loader, self.bad_rows)

    def __iter__(self) -> Iterator[Batch]:
        self._next = self.start_batch
        with Scheduler(self.stages(), threaded=self.threaded) as run:
            for batch in run:
                self._next += 1
                yield batch


def worker_loader(job: IterableDataset, prefetch: int, context: Any, seed: tuple[int, ...]) -> DataLoader:
    """A DataLoader running ``job`` in one worker process, holding ``prefetch`` items ahead.

    It draws its workers' base seed from a ``torch.Generator`` of its own, seeded from
    ``seed`` (the config's), never from torch's global generator: DataLoader draws that seed
    on the thread that starts it (the read stage's), so with the global generator a run with
    ``pipeline.data_workers: 1`` took a number out of the stream dropout draws from, at a moment
    that depends on thread timing, and a deterministic run changed with the worker setting.
    """
    generator = torch.Generator()
    generator.manual_seed(int(np.random.SeedSequence(list(seed)).generate_state(1, np.uint64)[0] >> 1))
    return DataLoader(job, batch_size=None, num_workers=1, prefetch_factor=prefetch,
                      multiprocessing_context=context, generator=generator)


class _WorkerJob(IterableDataset):
    """A loader's work for a worker process: ``("batch", b)`` per batch, then ``("end", bad-row
    counts)``, or ``("error", exception)`` (so the trainer raises the error itself, message
    intact, instead of DataLoader's re-wrapped copy)."""

    def __init__(self, data: DataConfig, schema: Schema, split: Split, epoch: int, start_batch: int,
                 depth: QueueDepths, part: tuple[int, int] | None = None,
                 rank_slice: tuple[int, int] | None = None, keys: tuple[tuple[str, ...], str] = ((), ""),
                 at: Any = None) -> None:
        self.args = (data, schema, split, epoch, start_batch)
        self.depth, self.part, self.rank_slice, self.keys, self.at = depth, part, rank_slice, keys, at
        self.env = WorkerEnv()

    def __iter__(self) -> Iterator[tuple[str, object]]:
        self.env.apply()
        loader = FileLoader(*self.args, threaded=True, depth=self.depth, part=self.part, rank_slice=self.rank_slice,
                            at=self.at, pinned=True)  # read and featurize overlap in the worker; the trainer pinned ``at``
        if self.keys[0]:
            loader.carry(*self.keys)
        return send_batches(iter(loader), lambda: loader.bad_rows.counts)


def send_batches(items: Iterator[Any], counts: Callable[[], dict[str, int]]) -> Iterator[tuple[str, object]]:
    """A worker process's side of the hand-over: ``("batch", item)`` per item, then ``("end",
    counts())`` (its bad-row counts), or ``("error", exception)`` when ``items`` raised (so the
    trainer raises the error itself, message intact, instead of DataLoader's re-wrapped copy)."""
    try:
        for item in items:
            yield "batch", item
    except Exception as e:  # noqa: BLE001  # handed to the trainer, which raises it
        yield "error", e
        return
    yield "end", counts()


def receive_batches(messages: Iterable[tuple[str, Any]], bad_rows: BadRowReport) -> Iterator[Any]:
    """The trainer's side of ``send_batches``: each item yielded, the worker's bad-row counts
    added to ``bad_rows``, its error raised here."""
    for kind, item in messages:
        if kind == "batch":
            yield item
        elif kind == "end":
            for reason, n in item.items():
                bad_rows.add(reason, n)
        else:
            raise item


class BatchList:
    """Batches already in memory, served as a loader: one ``read`` stage hands them out in
    order from ``start_batch`` (every epoch replays the same list). Lets ``train`` run its
    whole pipeline on data built beforehand (by ``make_batches`` or your own code), and the
    benchmarks measure what reading and featurizing cost against it.
    """

    def __init__(self, batches: Sequence[Batch], epoch: int = 0, start_batch: int = 0,
                 depth: QueueDepths | None = None) -> None:
        if start_batch < 0:
            raise ValueError(f"start_batch must be >= 0, got {start_batch}")
        self.batches, self.epoch, self.start_batch = batches, epoch, start_batch
        self.depth = depth or QueueDepths()
        self.bad_rows = BadRowReport()
        self._next = start_batch

    @property
    def position(self) -> tuple[int, int]:
        return (self.epoch, self._next)

    @property
    def num_batches(self) -> int:
        return len(self.batches)

    def stages(self) -> list[Stage]:
        def read(_: None) -> Iterator[Batch]:
            return iter(self.batches[self.start_batch :])

        return [Stage("read", read, self.depth.read, expand=True)]

    def __iter__(self) -> Iterator[Batch]:
        for self._next, batch in enumerate(self.batches[self.start_batch :], self.start_batch + 1):
            yield batch


def make_batches(data: DataConfig, schema: Schema, split: Split = "train", epoch: int = 0,
                 start_batch: int = 0, threaded: bool = False, depth: QueueDepths | None = None,
                 workers: int = 0, part: tuple[int, int] | None = None,
                 rank_slice: tuple[int, int] | None = None, keys: Sequence[str] = (),
                 at: Any = None, pinned: bool = False, source: Source | None = None) -> FileLoader:
    """The batches of ``split`` for ``epoch`` from batch ``start_batch`` on (see :class:`FileLoader`);
    ``at``: where the source's epoch resumes (a checkpoint's position, e.g. a ``SqlPosition``);
    ``pinned``: ``at`` is the epoch's settled position (``Source.start`` already asked);
    ``source``: the data's source to read through (e.g. the one that pinned ``at``, its catalog
    and table loaded already), else a new one."""
    return FileLoader(data, schema, split, epoch, start_batch, threaded, depth, workers, part, rank_slice, keys, at,
                      pinned, source)
