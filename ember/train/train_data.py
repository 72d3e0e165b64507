"""A run's training data: ``open_train_loader`` opens one pass's loader for any source (files,
synthetic rows, batches held in memory, an online stream) and shard mode (one process,
``data.shard: rows`` or ``files``) from the ``RunState`` it starts at, and says the data
position a checkpoint after any of its batches records.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Iterator, Sequence

from ember.batch import Batch
from ember.config import RunConfig
from ember.distributed.process_group import DistributedRun
from ember.errors import ConfigError
from ember.pipeline.loader import WINDOW_KEYS, BatchList, FileLoader, Loader, empty_batch, make_batches
from ember.pipeline.scheduler import Stage
from ember.pipeline.stream import StreamLoader, StreamPosition
from ember.source.protocol import Source, source_for
from ember.train.run_state import DataPosition, RunState, ShardPositions
from ember.train.shards import FileShards, ahead_of
from ember.train.stream_ranks import StreamRanks

__all__ = ["TrainLoader", "open_train_loader", "pin_epoch", "check_train_data", "start_data", "shards_files", "window_keys"]


def shards_files(cfg: RunConfig, dist: DistributedRun | None) -> bool:
    """Whether each rank trains its own files (distributed, ``data.shard: files``)."""
    return dist is not None and cfg.data.shard == "files"


def check_train_data(cfg: RunConfig, dist: DistributedRun | None, batches: Sequence[Batch] | None) -> None:
    """ConfigError for batches held in memory in a run whose data must come from files."""
    if batches is None:
        return
    if cfg.train.mode == "online":
        raise ConfigError("train.mode: online streams data.train; batches held in memory have no stream: pass "
                          "batches with train.mode: offline, or data.train files without them")
    if shards_files(cfg, dist):
        raise ConfigError("data.shard: files gives each rank its own data.train files; batches held in memory have "
                          "none: use data.shard: rows with them")


def start_data(cfg: RunConfig, dist: DistributedRun | None) -> DataPosition:
    """A fresh run's data position: an online stream's start, every rank at its files' start, or None."""
    if cfg.train.mode == "online":
        return StreamPosition()
    if shards_files(cfg, dist):
        assert dist is not None
        return ShardPositions.start(dist.world_size)
    return None


class TrainLoader:
    """One pass's loader (a ``Loader``) and, distributed, the ranks' agreement on each other's
    batches two steps ahead (``ahead``, whose stage follows the loader's stages): under
    ``data.shard: files`` their rows (``shards``), online the stream's batches (``StreamRanks``)."""

    def __init__(self, loader: Loader, shards: FileShards | None = None, shard_depth: int = 1,
                 closing: threading.Event | None = None, stream_ranks: StreamRanks | None = None,
                 pinned: Any = None) -> None:
        self.loader, self.shards, self._shard_depth = loader, shards, shard_depth
        self.pinned = pinned  # what the source pinned for the epoch (``pin_epoch``), kept in file shards' positions
        self.ahead: FileShards | StreamRanks | None = shards if shards is not None else stream_ranks
        self.closing = closing or threading.Event()  # set when the pass is over: a watched stream stops waiting

    @property
    def bad_rows(self) -> Any:
        return self.loader.bad_rows

    @property
    def position(self) -> tuple[int, int]:
        return self.loader.position

    @property
    def num_batches(self) -> int | None:
        return self.loader.num_batches

    def stages(self) -> list[Stage]:
        return self.loader.stages() + ([self.ahead.stage(self._shard_depth)] if self.ahead is not None else [])

    def __iter__(self) -> Iterator[Any]:
        return iter(self.loader)

    def close(self) -> None:
        """The pass is over (an online stream ends now)."""
        self.closing.set()

    def data_position(self, batch: int) -> DataPosition:
        """The data position once ``batch`` batches of the epoch are trained."""
        if isinstance(self.loader, StreamLoader):
            return self.loader.stream_position(batch)
        if self.shards is not None:  # each rank's batch index in its own files (0 at an epoch's start)
            if not batch:
                return ShardPositions.start(self.shards.world_size)
            return ShardPositions(tuple(self.shards.positions(batch - self.shards.first_batch)), self.pinned)
        if isinstance(self.loader, FileLoader) and self.loader.split == "train":
            return self.loader.source_position(batch)  # e.g. a query's last key trained, an Iceberg snapshot
        return None


def open_train_loader(cfg: RunConfig, state: RunState, dist: DistributedRun | None = None,
                      batches: Sequence[Batch] | None = None, stop: Callable[[], bool] = lambda: False) -> TrainLoader:
    """The loader of the pass that starts at ``state`` (its epoch, batch and data position):
    ``batches`` held in memory, an online stream (``stop``: true when it must end now), this
    rank's own files (``data.shard: files``), or the epoch's global batches (distributed
    synthetic data: this rank's slice of each, generated alone). Distributed online: every
    rank reads the whole stream and the ranks agree on its batches (``StreamRanks``)."""
    pipe, d = cfg.pipeline, cfg.data
    rank, world = (0, 1) if dist is None else (dist.rank, dist.world_size)
    keys = window_keys(cfg)
    if batches is not None:
        return TrainLoader(BatchList(batches, state.epoch, state.batch, pipe.depth))
    if cfg.train.mode == "online":
        assert isinstance(state.data, StreamPosition)
        closing = threading.Event()
        stream = StreamLoader(d, cfg.schema, state.data, state.batch, pipe.depth,
                              stop=lambda: stop() or closing.is_set(), workers=pipe.data_workers, keys=keys)
        ranks = StreamRanks(stream, state.batch, ahead_of(pipe.embedding_staleness)) if dist is not None else None
        return TrainLoader(stream, shard_depth=pipe.depth.featurize, closing=closing, stream_ranks=ranks)
    source = source_for(d)
    at = pin_epoch(cfg, state, dist, source)  # a query's key bound, a table's snapshot: one for every rank
    if shards_files(cfg, dist):
        assert isinstance(state.data, ShardPositions)
        starts = list(state.data.rank_batches)
        shards = FileShards(rank, world, empty_batch(cfg.schema), starts, state.batch, ahead_of(pipe.embedding_staleness))
        part = dist.data_slice  # (this dense rank among the dense ranks, how many); None: an embedding rank
        if part is None:  # it reads no file: the shard stage hands it empty batches until the pass ends
            return TrainLoader(BatchList([], state.epoch, 0, pipe.depth), shards, pipe.depth.featurize, pinned=at)
        loader = make_batches(d, cfg.schema, "train", epoch=state.epoch, start_batch=starts[rank], depth=pipe.depth,
                              workers=pipe.data_workers, part=part, at=at, pinned=True, source=source)
        if keys:
            loader.carry(keys, WINDOW_KEYS)
        return TrainLoader(loader, shards, pipe.depth.featurize, pinned=at)
    # embedding ranks (no rows of their own) and their dense ranks: dist.data_slice
    mine = dist.data_slice if dist is not None and d.format == "synthetic" else None
    loader = make_batches(d, cfg.schema, "train", epoch=state.epoch, start_batch=state.batch, depth=pipe.depth,
                          workers=pipe.data_workers, rank_slice=mine, at=at, pinned=True, source=source)
    if keys:
        loader.carry(keys, WINDOW_KEYS)
    return TrainLoader(loader)


def pin_epoch(cfg: RunConfig, state: RunState, dist: DistributedRun | None, source: Source | None = None) -> Any:
    """What the training source (``source``, else a new one) pins for the epoch ``state`` is in
    (``Source.start``: a SQL query's key bound, an Iceberg snapshot; None for files): a resumed
    epoch's pin, checked, or one taken now. Distributed, every rank asks its own source (a
    resumed position is checked on each alike) and all take rank 0's answer, so rows committed
    between the ranks' asks never give the ranks different epochs."""
    d = cfg.data
    at = (source if source is not None else source_for(d)).start("train", state.pinned, not d.shuffle_buffer, state.batch > 0)
    return at if dist is None else dist.broadcast(at)


def window_keys(cfg: RunConfig) -> list[str]:
    """The raw columns the training batches carry for the rolling window (``eval.window_rows``):
    its GAUC groups by ``eval.group_by`` and it reports per ``eval.slices`` value, as eval does."""
    return cfg.eval.key_columns if cfg.eval.window_rows is not None else []
