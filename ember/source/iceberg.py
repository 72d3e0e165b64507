"""Apache Iceberg tables through pyiceberg: ``data.format: iceberg``.

``data.iceberg`` names the catalog (its properties as pyiceberg takes them: a SQL catalog
``{type: sql, uri: sqlite:///catalog.db, warehouse: file:///data/wh}``, a REST catalog
``{type: rest, uri: https://...}``, a Hive metastore ``{type: hive, uri: thrift://...}``; unset,
pyiceberg's own ``~/.pyiceberg.yaml`` and ``PYICEBERG_CATALOG__<NAME>__*`` variables), the
table, an optional row filter (pyiceberg's expression syntax, e.g. ``"day >= '2024-05-01'"``)
and an optional snapshot.

Units are the data files a scan of the snapshot plans (sorted by URI), each read through
pyiceberg's Arrow reader (so delete files, schema evolution and the row filter's residual apply);
files in object storage are read where they lie. An epoch reads one snapshot: ``data.iceberg.
snapshot`` when set, else the table's current snapshot when the epoch starts, which the
checkpoint stores (``IcebergPosition``): a resumed epoch reads the same files and drops the
batches trained, even after commits since.

Online (``train.mode: online``): the table's appended data files, snapshot by snapshot in commit
order, each trained once (a stream position names the data files done); with ``data.watch`` new
snapshots are polled every ``data.watch.poll_s``. Only data files that append snapshots added
are streamed: an overwrite's or delete's changes to rows already trained are not replayed
(logged once).

Example:
    >>> IcebergOptions(table="db.clicks", catalog={"type": "sql", "uri": "sqlite:///c.db"}).table_of("train")
    'db.clicks'
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence

from pydantic import Field, model_validator

from ember.config_base import ConfigModel
from ember.errors import ConfigError, DataError
from ember.source.base import RecordChunk, check_columns
from ember.source.protocol import RowCount, Split, Unit

__all__ = ["IcebergOptions", "IcebergPosition", "IcebergSource"]

log = logging.getLogger("ember")


class IcebergOptions(ConfigModel):
    """Where ``data.format: iceberg`` reads its rows: a catalog, the training and evaluation
    tables, a row filter and a snapshot."""

    catalog: dict[str, str] = Field(default_factory=dict)
    """The catalog's properties as pyiceberg takes them: `{type: sql, uri: 'sqlite:///catalog.db', warehouse:
    'file:///data/warehouse'}`, `{type: rest, uri: 'https://catalog.example/api'}`, `{type: hive, uri:
    'thrift://metastore:9083'}` (plus `s3.endpoint`, credentials, ...); empty: pyiceberg's `~/.pyiceberg.yaml` and
    `PYICEBERG_CATALOG__<NAME>__<KEY>` variables for `catalog_name`."""
    catalog_name: str = Field("default", min_length=1)
    """The catalog's name (which section of `~/.pyiceberg.yaml` or the environment configures it)."""
    table: str | None = None
    """The training table, `namespace.table`."""
    eval_table: str | None = None
    """The evaluation table, `namespace.table` (the same table with `eval_row_filter` for a split of one table)."""
    row_filter: str | None = None
    """Which training rows: a pyiceberg filter expression, e.g. `"day >= '2024-05-01' AND country = 'DE'"`
    (files whose statistics rule it out are never opened)."""
    eval_row_filter: str | None = None
    """Which rows of `eval_table` evaluate, as `row_filter` (needs `eval_table`)."""
    snapshot: int | None = None
    """Training snapshot id (time travel); unset: the table's current snapshot when each epoch starts (stored in
    the checkpoint: a resumed epoch reads the same one)."""
    eval_snapshot: int | None = None
    """Evaluation snapshot id; unset: the current one."""

    @model_validator(mode="after")
    def _check(self) -> "IcebergOptions":
        if self.table is None and self.eval_table is None:
            raise ValueError("give data.iceberg.table (training rows) and/or data.iceberg.eval_table (evaluation rows)")
        for name in (self.table, self.eval_table):
            if name is not None and "." not in name:
                raise ValueError(f"data.iceberg table '{name}': give it as namespace.table (e.g. db.{name})")
        for key, table in (("row_filter", "table"), ("snapshot", "table"), ("eval_row_filter", "eval_table"),
                           ("eval_snapshot", "eval_table")):
            if getattr(self, key) is not None and getattr(self, table) is None:  # it would apply to no rows
                same = " (for evaluation rows of the training table, that table again)" if table == "eval_table" else ""
                raise ValueError(f"data.iceberg.{key} is set but data.iceberg.{table} is not, so it would apply to no "
                                 f"rows; set data.iceberg.{table}{same}, or remove data.iceberg.{key}")
        return self

    def table_of(self, split: Split) -> str | None:
        return self.table if split == "train" else self.eval_table

    def filter_of(self, split: Split) -> str | None:
        return self.row_filter if split == "train" else self.eval_row_filter

    def snapshot_of(self, split: Split) -> int | None:
        return self.snapshot if split == "train" else self.eval_snapshot


@dataclass(frozen=True)
class IcebergPosition:
    """The snapshot a training epoch reads (``None``: the table had none, no rows), stored as
    ``iceberg_snapshot`` in the checkpoint's position.

    Example:
        >>> p = IcebergPosition(42)
        >>> p.to_dict(), IcebergPosition.from_position(p.to_dict()) == p
        ({'iceberg_snapshot': 42}, True)
    """

    snapshot: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"iceberg_snapshot": self.snapshot}

    @classmethod
    def from_position(cls, position: dict[str, Any]) -> "IcebergPosition":
        value = position.get("iceberg_snapshot")
        return cls(None if value is None else int(value))


def _pyiceberg() -> None:
    try:
        import pyiceberg  # noqa: F401
    except ImportError as e:
        raise ConfigError(f"data.format: iceberg needs the package pyiceberg ({e}); pip install 'ember[iceberg]'") from None


def _check_sqlite_catalog(catalog: dict[str, str]) -> None:
    """ConfigError when a SQL catalog's SQLite database file does not exist: pyiceberg would
    create it, empty (a mistyped path then reads as a missing table)."""
    import re

    uri = catalog.get("uri", "")
    m = re.match(r"sqlite(\+\w+)?:///([^?]*)", uri)
    if catalog.get("type", "sql") != "sql" or m is None or m.group(2) in ("", ":memory:") or m.group(2).startswith("file:"):
        return
    path = m.group(2)
    if not os.path.isfile(path):
        raise ConfigError(f"data.iceberg.catalog.uri '{uri}': the catalog database {path} does not exist "
                          f"(cwd: {os.getcwd()}); check the path (sqlite:///relative/path.db, "
                          "sqlite:////absolute/path.db)")


def _first_line(e: BaseException) -> str:
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    return " ".join(lines[:2]) if lines else type(e).__name__


class IcebergSource:
    """An Iceberg table as a source (see the module docstring)."""

    def __init__(self, data: Any) -> None:
        if data.iceberg is None:  # DataConfig checks it
            raise ConfigError("data.format: iceberg needs data.iceberg: {catalog: {...}, table: namespace.table}")
        _pyiceberg()
        self.data, self.options = data, data.iceberg
        self._catalog: Any = None
        self._tables: dict[str, Any] = {}
        self._said_skipped = False

    # -- the catalog and its tables -------------------------------------------------------
    def _where(self, split: Split) -> str:
        key = "table" if split == "train" else "eval_table"
        return f"data.iceberg.{key} '{self.options.table_of(split)}'"

    def table(self, split: Split, refresh: bool = False) -> Any:
        """``split``'s pyiceberg ``Table`` (ConfigError naming the catalog or table that is missing)."""
        name = self.options.table_of(split)
        if name is None:
            key = "table" if split == "train" else "eval_table"
            raise ConfigError(f"data.iceberg.{key} is not set; give the {split} rows' table as namespace.table")
        if name in self._tables:
            if refresh:
                self._tables[name] = self._tables[name].refresh()
            return self._tables[name]
        from pyiceberg.catalog import load_catalog
        from pyiceberg.exceptions import NoSuchNamespaceError, NoSuchTableError

        if self._catalog is None:
            _check_sqlite_catalog(self.options.catalog)
            try:
                self._catalog = load_catalog(self.options.catalog_name, **self.options.catalog)
            except Exception as e:  # noqa: BLE001  # pyiceberg's and the catalog's own errors: named here
                raise ConfigError(f"data.iceberg.catalog ('{self.options.catalog_name}'): cannot open the catalog "
                                  f"({_first_line(e)}); check data.iceberg.catalog (type, uri, warehouse) or "
                                  "~/.pyiceberg.yaml") from None
        try:
            table = self._catalog.load_table(name)
        except (NoSuchTableError, NoSuchNamespaceError):
            try:
                known = [".".join(t) for ns in self._catalog.list_namespaces() for t in self._catalog.list_tables(ns)]
            except Exception:  # noqa: BLE001  # listing is a courtesy
                known = []
            raise ConfigError(f"{self._where(split)}: no such table in catalog '{self.options.catalog_name}'"
                              + (f" (it has: {', '.join(sorted(known)[:10])})" if known else "")
                              + "; check the name (namespace.table) and data.iceberg.catalog") from None
        except Exception as e:  # noqa: BLE001
            raise ConfigError(f"{self._where(split)}: the catalog cannot load it ({_first_line(e)}); check "
                              "data.iceberg.catalog and that the catalog is reachable") from None
        self._tables[name] = table
        return table

    def _filter(self, split: Split) -> Any:
        """``split``'s row filter, parsed and checked against its table's columns (ConfigError
        naming the filter, and the columns and their types when it does not fit them, rather
        than pyiceberg's error when the scan is planned)."""
        from pyiceberg.expressions import AlwaysTrue
        from pyiceberg.expressions.parser import parse
        from pyiceberg.expressions.visitors import bind

        text = self.options.filter_of(split)
        if text is None:
            return AlwaysTrue()
        key = "row_filter" if split == "train" else "eval_row_filter"
        try:
            expr = parse(text)
        except Exception as e:  # noqa: BLE001  # the parser's errors
            raise ConfigError(f"data.iceberg.{key} '{text}': not a filter expression ({_first_line(e)}); write it "
                              "as pyiceberg does, e.g. \"day >= '2024-05-01' AND country = 'DE'\"") from None
        schema = self.table(split).schema()
        try:
            bind(schema, expr, case_sensitive=True)
        except Exception as e:  # noqa: BLE001  # an unknown column, a literal of another type
            columns = ", ".join(f"{f.name} ({f.field_type})" for f in schema.fields)
            raise ConfigError(f"data.iceberg.{key} '{text}' does not fit iceberg table {self.options.table_of(split)} "
                              f"({_first_line(e)}); its columns: {columns}; name one of them, compared with a value "
                              "of its type (text quoted: c = '3'; numbers bare: n > 3)") from None
        return expr

    def _snapshot(self, split: Split, at: Any) -> int | None:
        if split == "train" and isinstance(at, IcebergPosition):
            return at.snapshot
        given = self.options.snapshot_of(split)
        if given is not None:
            return given
        current = self.table(split).current_snapshot()
        return None if current is None else current.snapshot_id

    def _scan(self, split: Split, snapshot: int | None) -> Any:
        table = self.table(split)
        if snapshot is not None and table.snapshot_by_id(snapshot) is None:
            key = "snapshot" if split == "train" else "eval_snapshot"
            raise ConfigError(f"{self._where(split)}: no snapshot {snapshot} (data.iceberg.{key}, or the checkpoint's "
                              f"iceberg_snapshot: expired since?); its snapshots: "
                              f"{[s.snapshot_id for s in table.snapshots()][-5:]}")
        try:
            return table.scan(row_filter=self._filter(split), snapshot_id=snapshot)
        except ConfigError:
            raise
        except Exception as e:  # noqa: BLE001  # a filter naming an unknown column, a bad literal
            raise ConfigError(f"{self._where(split)}: the scan was refused ({_first_line(e)}); check "
                              "data.iceberg's row filter against the table's columns") from None

    # -- the protocol ----------------------------------------------------------------------
    def units(self, split: Split, at: Any = None) -> list[Unit]:
        snapshot = self._snapshot(split, at)
        if snapshot is None:
            return []  # no snapshot: the table has no rows yet
        tasks = sorted(self._scan(split, snapshot).plan_files(), key=lambda t: t.file.file_path)
        return [Unit(t.file.file_path, rows=t.file.record_count if not t.delete_files else None, task=(split, t))
                for t in tasks]

    def open(self, unit: Unit, columns: Sequence[str], report: Any = None, at: Any = None,
             consumed: list[int] | None = None, types: Any = None) -> Iterator[RecordChunk]:  # types: a hint for text (CSV)
        from pyiceberg.io.pyarrow import ArrowScan
        from pyiceberg.table import FileScanTask

        split, task = unit.task if unit.task is not None else ("train", None)
        table = self.table(split)
        schema = table.schema()
        check_columns(f"iceberg table {self.options.table_of(split)}", [f.name for f in schema.fields], columns)
        task = task if task is not None else FileScanTask(unit_file(table, unit.name))
        scan = ArrowScan(table.metadata, table.io, schema.select(*columns), self._filter(split))
        row, read_rows = 1, self.data.read_rows
        try:
            for batch in scan.to_record_batches([task]):
                for start in range(0, batch.num_rows, read_rows):
                    piece = batch.slice(start, read_rows)
                    yield RecordChunk(piece, unit.name, row)
                    row += piece.num_rows
        except FileNotFoundError as e:
            raise DataError(f"{unit.name} (a data file of iceberg table {self.options.table_of(split)}): not found "
                            f"({_first_line(e)}); the snapshot's files were removed (expired snapshots?): restore "
                            "them, or start the epoch over") from None

    def check(self, split: Split, columns: Sequence[str]) -> list[Unit]:
        if self.options.table_of(split) is None:
            return []
        table = self.table(split)
        check_columns(f"iceberg table {self.options.table_of(split)}", [f.name for f in table.schema().fields], columns)
        if split == "train" and self.data.watch is not None:
            return []  # snapshots arrive later
        units = self.units(split)
        if not units or not sum(u.rows if u.rows is not None else 1 for u in units):
            raise DataError(f"{self._where(split)} holds no rows"
                            + (f" that data.iceberg's row filter keeps" if self.options.filter_of(split) else "")
                            + "; append rows to it, or check the table name and filter")
        return units

    def count(self, split: Split, estimate: bool = False) -> RowCount:
        if self.options.table_of(split) is None or (split == "train" and self.data.watch is not None):
            return RowCount()
        units = self.units(split)
        rows = [u.rows for u in units]
        if self.options.filter_of(split) and not estimate or any(r is None for r in rows):
            return RowCount()  # a filter's or delete files' rows are known only once read
        return RowCount(rows=sum(r or 0 for r in rows))

    def start(self, split: Split, at: Any, ordered: bool, resumed: bool) -> Any:
        if split != "train":
            return None
        if isinstance(at, IcebergPosition):
            return at
        return IcebergPosition(self._snapshot(split, None))

    def key(self, split: Split, ordered: bool) -> str | None:
        return None

    def after(self, at: Any, value: Any) -> Any:
        return at

    def follow(self, resume: str | None, taken: set[str], stop: Callable[[], bool]) -> Iterator[Unit]:
        from ember.source.watch import polled

        seen = set(taken)
        first = True

        def poll() -> list[Unit]:
            nonlocal first
            table = self.table("train", refresh=not first)
            first = False
            out = []
            for path, data_file in self._appended(table):
                if path not in seen:
                    seen.add(path)
                    out.append(Unit(path, rows=data_file.record_count, task=("train", _task(data_file))))
            return out

        if resume is not None:
            table = self.table("train")
            files = dict(self._appended(table))
            if resume not in files:
                raise DataError(f"the checkpoint's stream position is in {resume}, which no snapshot of iceberg table "
                                f"{self.options.table} appended (expired?); start a new run from the checkpoint's "
                                "weights (train.init_from)")
            seen.add(resume)
            yield Unit(resume, rows=files[resume].record_count, task=("train", _task(files[resume])))
        if self.data.watch is None:
            yield from poll()
            return
        yield from polled(poll, self.data.watch, stop, what="appended data file")

    def _appended(self, table: Any) -> list[tuple[str, Any]]:
        """(URI, DataFile) of each data file an append snapshot of ``table`` added, in commit order."""
        from pyiceberg.manifest import ManifestContent, ManifestEntryStatus

        out = []
        skipped = []
        for snap in sorted(table.snapshots(), key=lambda s: s.sequence_number or 0):
            operation = getattr(snap.summary, "operation", None)
            if operation is not None and operation.value != "append":
                skipped.append(f"{snap.snapshot_id} ({operation.value})")
                continue
            for manifest in snap.manifests(table.io):
                if manifest.added_snapshot_id != snap.snapshot_id or manifest.content != ManifestContent.DATA:
                    continue
                entries = manifest.fetch_manifest_entry(table.io, discard_deleted=True)
                for e in sorted(entries, key=lambda e: e.data_file.file_path):
                    if e.status == ManifestEntryStatus.ADDED and e.snapshot_id == snap.snapshot_id:
                        out.append((e.data_file.file_path, e.data_file))
        if skipped and not self._said_skipped:
            self._said_skipped = True
            log.info("iceberg table %s: snapshot(s) %s are not appends; online training streams appended data files "
                     "only (rows those snapshots changed or deleted are not replayed)", self.options.table,
                     ", ".join(skipped[:5]))
        return out


def _task(data_file: Any) -> Any:
    from pyiceberg.table import FileScanTask

    return FileScanTask(data_file)


def unit_file(table: Any, path: str) -> Any:
    """The ``DataFile`` of ``table`` whose URI is ``path`` (any snapshot); DataError when none is."""
    for snap in table.snapshots():
        for manifest in snap.manifests(table.io):
            for e in manifest.fetch_manifest_entry(table.io, discard_deleted=True):
                if e.data_file.file_path == path:
                    return e.data_file
    raise DataError(f"{path}: no data file of iceberg table {table.name()} (expired?)")

