"""Loader: config + schema -> an iterator of :class:`~ember.batch.Batch`, resumable by index.

Stages (one thread when ``data.prefetch > 0``): read record batches (files) or generate rows
(synthetic) -> featurize -> shuffle buffer (train) -> cut into ``batch_size`` batches.

- Determinism: the file order and the shuffle depend only on ``(data.seed, epoch)``, so
  ``make_batches(..., start_batch=k)`` yields exactly batch ``k`` onwards of an uninterrupted
  run. Files are re-read and the first ``k`` batches dropped before they become tensors;
  synthetic data jumps straight to row ``k * batch_size``. Synthetic rows are i.i.d. draws, so
  every epoch replays the same rows in the same order and ``shuffle_buffer`` is not used.
- Shuffle buffer (``data.shuffle_buffer`` rows, train only): rows are pooled until the pool
  holds ``2 * shuffle_buffer`` rows, then a random half leaves. RAM: up to ``2 * shuffle_buffer``
  rows plus one read chunk; randomness: a row moves within a window of about that many rows
  (more buffer = better mixed, more RAM). With a buffer, the file order is shuffled too.
- Prefetch (``data.prefetch`` batches): a background thread keeps that many finished batches in
  a bounded queue, so reading and hashing overlap training; RAM: ``prefetch`` batches more.
  Errors in the thread are re-raised in the consumer.

Example:
    >>> from ember.source.config import DataConfig
    >>> from ember.featurize.presets import preset_schema
    >>> data = DataConfig(batch_size=4, synthetic={"rows": 10, "num_dense": 2, "num_sparse": 3})
    >>> loader = make_batches(data, preset_schema("synthetic", data), "train")
    >>> [b.size for b in loader], loader.position, loader.bad_rows.total
    ([4, 4, 2], (0, 3), 0)
"""

from __future__ import annotations

import queue
import threading
from typing import Callable, Iterator, Literal

import numpy as np

from ember.batch import Batch
from ember.featurize.featurizer import Featurizer
from ember.featurize.rows import Rows
from ember.featurize.schema import Schema
from ember.source.bad_rows import BadRowReport
from ember.source.base import RecordChunk
from ember.source.config import DataConfig
from ember.source.csv import read_csv
from ember.source.files import expand_paths
from ember.source.orc import read_orc
from ember.source.parquet import read_parquet
from ember.source.synthetic import split_rows, synthetic_records
from ember.source.writer import write_synthetic

__all__ = ["Loader", "make_batches", "write_synthetic"]

Split = Literal["train", "eval"]


def _record_chunks(data: DataConfig, schema: Schema, split: Split, rng: np.random.Generator,
                   report: BadRowReport) -> Iterator[RecordChunk]:
    files = expand_paths(data.paths(split), data.format)
    if not files:
        raise ValueError(f"data.{split} is not set; give the {split} files (format {data.format})")
    if split == "train" and data.shuffle_buffer > 0:
        files = [files[i] for i in rng.permutation(len(files))]
    cols = schema.columns
    for path in files:
        if data.format in ("csv", "tsv"):
            yield from read_csv(path, cols, delimiter=data.delimiter, header=data.csv.header,
                                column_names=data.csv.column_names, block_bytes=data.csv.block_bytes, report=report)
        elif data.format == "parquet":
            yield from read_parquet(path, cols, read_rows=data.read_rows)
        else:
            yield from read_orc(path, cols, read_rows=data.read_rows)


def _shuffled(parts: Iterator[Rows], buffer: int, rng: np.random.Generator) -> Iterator[Rows]:
    pool: list[Rows] = []
    size = 0
    for rows in parts:
        pool.append(rows)
        size += len(rows)
        if size >= 2 * buffer:
            everything = Rows.concat(pool)
            perm = rng.permutation(size)
            yield everything.take(perm[: size - buffer])
            pool, size = [everything.take(perm[size - buffer :])], buffer
    if size:
        everything = Rows.concat(pool)
        yield everything.take(rng.permutation(size))


def _rebatched(parts: Iterator[Rows], batch_size: int, drop_last: bool) -> Iterator[Rows]:
    pending: list[Rows] = []
    n = 0
    for rows in parts:
        if not len(rows):
            continue
        pending.append(rows)
        n += len(rows)
        if n >= batch_size:
            everything = Rows.concat(pending)
            i = 0
            while n - i >= batch_size:
                yield everything.slice(i, i + batch_size)
                i += batch_size
            pending = [everything.slice(i, n)] if i < n else []
            n -= i
    if n and not drop_last:
        yield Rows.concat(pending)


def _prefetched(make: Callable[[], Iterator[Batch]], depth: int) -> Iterator[Batch]:
    q: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def put(item: tuple) -> bool:
        while not stop.is_set():
            try:
                q.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def work() -> None:
        try:
            for batch in make():
                if not put(("batch", batch)):
                    return
            put(("end", None))
        except BaseException as e:  # handed to the consumer, who re-raises it
            put(("error", e))

    thread = threading.Thread(target=work, name="ember-loader", daemon=True)
    thread.start()
    try:
        while True:
            kind, item = q.get()
            if kind == "batch":
                yield item
            elif kind == "error":
                raise item
            else:
                return
    finally:
        stop.set()


class Loader:
    """Iterable of batches of one split and epoch, starting at batch ``start_batch``.

    ``bad_rows`` counts rows skipped under ``on_bad_rows: skip`` (complete once iteration
    ends); ``position`` is ``(epoch, index of the next batch)``, what a checkpoint stores.
    """

    def __init__(self, data: DataConfig, schema: Schema, split: Split = "train", epoch: int = 0,
                 start_batch: int = 0, threaded: bool = False) -> None:
        self.threaded = threaded
        if split not in ("train", "eval"):
            raise ValueError(f"split must be 'train' or 'eval', got {split!r}")
        if start_batch < 0:
            raise ValueError(f"start_batch must be >= 0, got {start_batch}")
        self.data, self.schema, self.split = data, schema, split
        self.epoch, self.start_batch = epoch, start_batch
        self.batch_size = data.split_batch_size(split)
        self.bad_rows = BadRowReport(data.on_bad_rows)
        self._next = start_batch

    @property
    def position(self) -> tuple[int, int]:
        return (self.epoch, self._next)

    @property
    def num_batches(self) -> int | None:
        """Batches in this epoch (synthetic data only; None for files)."""
        if self.data.format != "synthetic":
            return None
        n = split_rows(self.data.synthetic, self.split)
        drop = self.data.drop_last and self.split == "train"
        return n // self.batch_size if drop else -(-n // self.batch_size)

    def _rows(self) -> Iterator[Rows]:
        featurize = Featurizer(self.schema, self.bad_rows)
        if self.data.format == "synthetic":
            n, b = split_rows(self.data.synthetic, self.split), self.batch_size
            for k in range(self.start_batch, self.num_batches or 0):
                records = synthetic_records(self.data.synthetic, self.split, k * b, min((k + 1) * b, n))
                yield featurize(records, f"<synthetic {self.split}>", k * b + 1)
            return
        rng = np.random.default_rng([self.data.seed, self.epoch, 0 if self.split == "train" else 1])
        parts = (featurize(c.batch, c.file, c.first_row)
                 for c in _record_chunks(self.data, self.schema, self.split, rng, self.bad_rows))
        if self.split == "train" and self.data.shuffle_buffer > 0:
            parts = _shuffled(parts, self.data.shuffle_buffer, rng)
        drop_last = self.data.drop_last and self.split == "train"
        for k, rows in enumerate(_rebatched(parts, self.batch_size, drop_last)):
            if k >= self.start_batch:  # earlier batches never become tensors
                yield rows

    def _batches(self) -> Iterator[Batch]:
        for rows in self._rows():
            yield rows.to_batch()

    def __iter__(self) -> Iterator[Batch]:
        self._next = self.start_batch
        source = _prefetched(self._batches, 2) if self.threaded else self._batches()
        try:
            for batch in source:
                self._next += 1
                yield batch
        finally:
            close = getattr(source, "close", None)
            if close is not None:
                close()  # stops the prefetch thread when the consumer leaves early


def make_batches(data: DataConfig, schema: Schema, split: Split = "train", epoch: int = 0,
                 start_batch: int = 0, threaded: bool = False) -> Loader:
    """The batches of ``split`` for ``epoch`` from batch ``start_batch`` on (see :class:`Loader`)."""
    return Loader(data, schema, split, epoch, start_batch, threaded)
