"""Where a run stands: ``RunState`` (step, epoch, batch of the epoch, and the data position) is
what the loop advances and what a checkpoint's manifest records (``step`` and ``position``).

The data position says where the next batch comes from beyond ``epoch`` and ``batch``:
- files read in epochs (``data.shard: rows``, or one process): nothing more (``None``);
- ``train.mode: online``: a ``StreamPosition`` (``ember.pipeline.stream``: files done, the
  file being read and its rows trained);
- distributed ``data.shard: files``: ``ShardPositions``, each rank's batch index in its own
  files (``ember.train.shards``), with what the source pinned for the epoch (an Iceberg
  snapshot) where it pins something;
- ``data.format: sql``: a ``SqlPosition`` (``ember.source.sql``: the epoch's key bound and, read
  in key order, the last key trained);
- ``data.format: iceberg``: an ``IcebergPosition`` (``ember.source.iceberg``: the snapshot the
  epoch reads).

On disk the position is one flat dict, ``{"epoch", "batch"}`` plus the data position's keys
(``files_done``, ``file``, ``file_rows``; or ``shard: files``, ``world_size``,
``rank_batches``; ``sql_key``, ``sql_key_max``; ``iceberg_snapshot``), so checkpoints written before this type existed parse unchanged.

Example:
    >>> s = RunState.from_dict({"step": 7, "position": {"epoch": 1, "batch": 3}})
    >>> s.step, s.epoch, s.batch, s.data
    (7, 1, 3, None)
    >>> RunState.from_dict(s.to_dict()) == s
    True
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Union

from ember.errors import CheckpointError, ConfigError
from ember.pipeline.stream import StreamPosition
from ember.source.iceberg import IcebergPosition
from ember.source.sql import SqlPosition

__all__ = ["RunState", "ShardPositions", "DataPosition", "SOURCE_POSITIONS", "data_position"]


@dataclass(frozen=True)
class ShardPositions:
    """``data.shard: files``: each rank's batch index in its own files (``rank_batches``), on
    as many ranks as it has entries; ``pinned``: what the source pinned for the epoch (an
    ``IcebergPosition``: the snapshot whose files the ranks share out), None for files."""

    rank_batches: tuple[int, ...]
    pinned: SqlPosition | IcebergPosition | None = None

    @classmethod
    def start(cls, world_size: int) -> "ShardPositions":
        """An epoch's start: every rank at its files' first batch."""
        return cls((0,) * world_size)

    @property
    def world_size(self) -> int:
        return len(self.rank_batches)

    def to_dict(self) -> dict[str, Any]:
        """The checkpoint's fields (merged into its ``position``)."""
        return {"shard": "files", "world_size": self.world_size, "rank_batches": list(self.rank_batches),
                **(self.pinned.to_dict() if self.pinned is not None else {})}


DataPosition = Union[StreamPosition, ShardPositions, SqlPosition, IcebergPosition, None]
"""What a data source adds to ``epoch`` and ``batch`` (see the module docstring)."""
SOURCE_POSITIONS = (SqlPosition, IcebergPosition)
"""Positions a source pins for one epoch (``Source.start``): the same on every rank, dropped at a new epoch."""


def data_position(position: dict[str, Any]) -> DataPosition:
    """The data position in a checkpoint's ``position`` dict (None when it holds none)."""
    if "files_done" in position:
        return StreamPosition.from_position(position, "the checkpoint")
    pinned = SqlPosition.from_position(position) if "sql_key" in position or "sql_key_max" in position else \
        IcebergPosition.from_position(position) if "iceberg_snapshot" in position else None
    if position.get("shard") == "files":
        return ShardPositions(tuple(int(b) for b in position["rank_batches"]), pinned)
    return pinned


@dataclass
class RunState:
    """The run's place: ``step`` (global steps taken), ``epoch``, ``batch`` (global batches of
    the epoch trained: where a resumed run starts) and ``data`` (see the module docstring)."""

    step: int = 0
    epoch: int = 0
    batch: int = 0
    data: DataPosition = None

    def position(self) -> dict[str, Any]:
        """The manifest's ``position``: epoch and batch, with the data position's keys."""
        return {"epoch": self.epoch, "batch": self.batch, **(self.data.to_dict() if self.data is not None else {})}

    def to_dict(self) -> dict[str, Any]:
        """``step`` and ``position``, as a checkpoint's manifest holds them."""
        return {"step": self.step, "position": self.position()}

    @classmethod
    def from_dict(cls, manifest: dict[str, Any]) -> "RunState":
        """From a checkpoint's manifest (``step`` and ``position``): the one parser of positions."""
        p = manifest["position"]
        return cls(int(manifest["step"]), int(p["epoch"]), int(p["batch"]), data_position(p))

    def next_epoch(self) -> None:
        """Move to the next epoch's first batch (file shards: every rank at its files' start)."""
        self.epoch, self.batch = self.epoch + 1, 0
        if isinstance(self.data, ShardPositions):
            self.data = ShardPositions.start(self.data.world_size)
        elif isinstance(self.data, SOURCE_POSITIONS):
            self.data = None  # a new epoch reads the query (the table's newest snapshot) from its start

    def stream_start(self, where: str) -> StreamPosition:
        """Where an online run resumed from this state starts its stream; CheckpointError naming
        ``where`` (the checkpoint) when the state holds no stream position (an offline run's)."""
        if not isinstance(self.data, StreamPosition):
            raise CheckpointError(f"{where} holds no stream position (written by a train.mode: offline run); resume it "
                                  "with train.mode: offline, or start the online run from its weights with "
                                  f"train.init_from={where} instead of train.resume")
        return self.data

    def resumed(self, where: str, online: bool, world_size: int, files: bool) -> "RunState":
        """This state (a checkpoint's, at ``where``) as the start of a run that is ``online`` or
        not, on ``world_size`` ranks that shard ``files`` or not: its data position checked
        against the run's and put in the run's terms. Raises CheckpointError for an online
        checkpoint resumed offline or the reverse, ConfigError for a mid-epoch position that
        does not map to this run's ranks (see ``rank_starts``)."""
        if online:
            return RunState(self.step, self.epoch, self.batch, self.stream_start(where))
        if isinstance(self.data, StreamPosition):
            raise CheckpointError(f"{where} was written by a train.mode: online run (its position is in a stream of "
                                  "files); resume it with train.mode: online, or start an offline run from its weights "
                                  f"with train.init_from={where}")
        starts = self.rank_starts(world_size, files)
        if isinstance(self.data, SOURCE_POSITIONS):  # a query's or snapshot's position: the same on every rank
            return RunState(self.step, self.epoch, self.batch, self.data if self.batch else None)
        pinned = self.data.pinned if isinstance(self.data, ShardPositions) and self.batch else None
        return RunState(self.step, self.epoch, self.batch, ShardPositions(tuple(starts), pinned) if files else None)

    @property
    def pinned(self) -> SqlPosition | IcebergPosition | None:
        """What the source pinned for this state's epoch (``Source.start``), None if nothing."""
        if isinstance(self.data, ShardPositions):
            return self.data.pinned
        return self.data if isinstance(self.data, SOURCE_POSITIONS) else None

    def rank_starts(self, world_size: int, files: bool) -> list[int]:
        """Each rank's first batch in its own files where this state's epoch resumes.

        ``files``: the resuming run shards files (distributed, ``data.shard: files``). At an
        epoch's start (batch 0) any run resumes any checkpoint (every rank at 0). Mid-epoch, a
        files-sharded state resumes only with files sharding on as many ranks (each rank's
        position is in its own files), and a state counted in global batches only without it
        (then every rank starts at ``batch``); else ConfigError."""
        shards = self.data if isinstance(self.data, ShardPositions) else None
        if self.batch == 0:
            return [0] * world_size
        if shards is not None and not files:
            raise ConfigError(f"the checkpoint was written mid-epoch by a data.shard: files run on {shards.world_size} "
                              f"ranks (each rank's position is in its own files); resume it with data.shard: files on "
                              f"{shards.world_size} ranks, or resume from a checkpoint at an epoch's start")
        if files and shards is None:
            raise ConfigError("the checkpoint's data position counts global batches (data.shard: rows), which do not map "
                              "to each rank's own files; resume it with data.shard: rows, or switch to data.shard: files "
                              "at an epoch's start")
        if shards is None:
            return [self.batch] * world_size
        if shards.world_size != world_size:
            raise ConfigError(f"the checkpoint was written mid-epoch by a data.shard: files run on {shards.world_size} "
                              f"ranks; this run has {world_size}, whose ranks would read other files: resume it on "
                              f"{shards.world_size} ranks, or from a checkpoint at an epoch's start (any world size)")
        return list(shards.rank_batches)
