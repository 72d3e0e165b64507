"""One protocol for every place training rows come from, and one registry of them by ``data.format``.

A source is listed as **units of work** (a file, a query's result, a table's data file), each
opened as a **stream of record batches** (``RecordChunk`` s) from a **position**. The loaders
(``ember.pipeline``) do the rest the same way for every source: the shuffle (the units' order,
then the rows' buffer), bad rows (the featurizer), sharding across ranks (each rank its units:
``data.shard: files``), the progress bar's total (``count``), preflight (``check``) and, online,
following new units as they appear (``follow``).

Positions. A loader resumes an epoch by its batch index: it re-reads the units in the epoch's
order and drops the batches trained (files). A source may add to that:

- ``start`` pins what an epoch reads before its first row (a SQL query's largest key, an
  Iceberg table's snapshot) and returns it as the epoch's position object, which the checkpoint
  stores (``to_dict``) and a resumed epoch hands back (so it reads the same rows);
- ``key`` names a column whose value in a batch's last row is the position after that batch
  (a SQL query read in key order): ``after(at, value)`` makes that position, and ``open`` reads
  from it (the rows after it), so a resumed run neither re-reads nor loses a row.

A new source (Kafka, Kudu, ...) is one module: a class with these methods, registered with
``register_source("kafka", "ember.source.kafka:KafkaSource")``, its options a section of
``DataConfig`` (see ``docs/your-data.md``, "Adding a source").

Example:
    >>> from ember.source.config import DataConfig
    >>> src = source_for(DataConfig(format="synthetic", synthetic={"rows": 5, "num_sparse": 2}))
    >>> [u.name for u in src.units("train")], [c.batch.num_rows for c in src.open(src.units("train")[0], [])]
    (['<synthetic train>'], [5])
"""

from __future__ import annotations

import contextlib
import importlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterator, Literal, Mapping, Protocol, Sequence

from ember.errors import ConfigError
from ember.source.bad_rows import BadRowReport
from ember.source.base import RecordChunk

if TYPE_CHECKING:
    from ember.source.config import DataConfig

__all__ = ["Unit", "RowCount", "Source", "register_source", "source_for", "registered_formats"]

Split = Literal["train", "eval"]


@dataclass(frozen=True)
class Unit:
    """One unit of work: ``name`` is what messages and a stream position call it (a file's path
    or URI, ``data.sql.query``, an Iceberg data file's URI), unique within its source; ``rows``
    its rows when known without reading them (a manifest's count); ``task`` the source's own
    handle to it (e.g. pyiceberg's ``FileScanTask``)."""

    name: str
    rows: int | None = None
    task: Any = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class RowCount:
    """An epoch's size as a source knows it without reading rows: ``rows`` exact (footers,
    manifests, the database's count), or only ``bytes`` of the units as stored (CSV: the
    progress bar estimates rows from the density read so far)."""

    rows: int | None = None
    bytes: int | None = None


class Source(Protocol):
    """What a loader needs of a place rows come from (see the module docstring)."""

    def units(self, split: Split, at: Any = None) -> list[Unit]:
        """``split``'s units in their stable order (sorted names, a table's commit order);
        ``at``: the epoch's pinned position (``start``). ConfigError when there is none."""
        ...

    def open(self, unit: Unit, columns: Sequence[str], report: BadRowReport | None = None, at: Any = None,
             consumed: list[int] | None = None, types: Mapping[str, Any] | None = None) -> Iterator[RecordChunk]:
        """``columns`` of ``unit``'s rows as record batches, from position ``at`` (None: the
        start); ``report`` counts rows skipped as bad while decoding; ``consumed[0]``: bytes
        of the unit read so far (CSV; progress); ``types``: a hint, arrow types a column may be
        read as where the source otherwise reads text (CSV; ``featurizer.read_types``): a
        source with typed columns ignores it."""
        ...

    def check(self, split: Split, columns: Sequence[str]) -> list[Unit]:
        """Preflight: ``split`` exists, has ``columns`` and a row, read from headers, footers,
        metadata or ``LIMIT 1`` only (MissingColumnsError, ConfigError, DataError); the units
        checked (none when they appear later: a watched ``data.train``)."""
        ...

    def count(self, split: Split, estimate: bool = False) -> RowCount:
        """``split``'s size without reading it; ``estimate``: rows extrapolated where only bytes
        are known (CSV: from each file's first 64 KiB)."""
        ...

    def start(self, split: Split, at: Any, ordered: bool, resumed: bool) -> Any:
        """The epoch's position before its first row: ``at`` (a resumed epoch's) checked, or
        what it pins now (None: nothing to pin). ``ordered``: rows read in the source's order
        (no shuffle buffer); ``resumed``: the epoch resumes mid-way."""
        ...

    def key(self, split: Split, ordered: bool) -> str | None:
        """The column whose last value in a batch is the position after it (None: positions
        count batches)."""
        ...

    def after(self, at: Any, value: Any) -> Any:
        """The position after a batch whose last row's ``key`` column holds ``value``."""
        ...

    def follow(self, resume: str | None, taken: set[str], stop: Callable[[], bool]) -> Iterator[Unit]:
        """Online (``train.mode: online``): the unit ``resume`` (being read when the checkpoint
        was written) first, then the units not in ``taken`` as they appear (``data.watch``) or
        as listed now, each once, until the stream ends or ``stop()``."""
        ...


# format -> "module:Class" (imported when first used: a source's library loads only when configured)
_REGISTRY: dict[str, str] = {
    "synthetic": "ember.source.synthetic:SyntheticSource",
    "csv": "ember.source.file_source:FileSource",
    "tsv": "ember.source.file_source:FileSource",
    "parquet": "ember.source.file_source:FileSource",
    "orc": "ember.source.file_source:FileSource",
    "sql": "ember.source.sql:SqlSource",
    "iceberg": "ember.source.iceberg:IcebergSource",
}


def register_source(format: str, target: str) -> None:
    """Make ``data.format: <format>`` read through ``target`` (``"package.module:Class"``, a
    class taking the ``DataConfig``)."""
    if ":" not in target:
        raise ValueError(f"register_source('{format}', '{target}'): give the class as 'package.module:Class'")
    _REGISTRY[format] = target


def registered_formats() -> list[str]:
    """The formats a source is registered for."""
    return sorted(_REGISTRY)


# inside ``one_source_per_config``: id(DataConfig) -> (the config, its source)
_shared: dict[int, tuple[Any, Source]] | None = None


@contextlib.contextmanager
def one_source_per_config() -> Iterator[None]:
    """Within it, ``source_for`` gives the same source for the same ``DataConfig`` object: a run's
    preflight, row count and epochs share one, so files are listed once a run (an object store's
    prefix is not listed once per use). Re-entrant; outside it every call makes a new source
    (a later run lists again and sees files added since)."""
    global _shared
    if _shared is not None:
        yield
        return
    _shared = {}
    try:
        yield
    finally:
        _shared = None


def source_for(data: "DataConfig") -> Source:
    """The source that reads ``data`` (by ``data.format``); ConfigError for an unknown format.
    Inside ``one_source_per_config``, one per config object."""
    shared = _shared
    if shared is not None and id(data) in shared and shared[id(data)][0] is data:
        return shared[id(data)][1]
    target = _REGISTRY.get(data.format)
    if target is None:
        raise ConfigError(f"data.format '{data.format}' has no source; give one of {registered_formats()}")
    module, name = target.split(":")
    src = getattr(importlib.import_module(module), name)(data)
    if shared is not None:
        shared[id(data)] = (data, src)  # (holds the config: its id is not reused while shared)
    return src
