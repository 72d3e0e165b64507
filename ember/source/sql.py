"""Rows from a SQL database through ADBC (Arrow Database Connectivity): ``data.format: sql``.

A query's result streams as Arrow record batches (``cursor.fetch_record_batch()``: never the
whole result at once), cut into pieces of ``data.read_rows`` rows (so the pieces, and a shuffled
run's batches, do not depend on how the driver happens to batch its answer), and goes into the
same featurizer as a file's blocks.

Position: the training query is read ordered by ``data.sql.key`` (a unique column the user
names). Read in that order (``data.shuffle_buffer: 0``), the rows trained after a batch are
exactly those with a key up to the batch's last, so a resumed run reads
``SELECT * FROM (<query>) AS q WHERE key > :last AND key <= :max ORDER BY key`` (the keys
bound, never formatted into the SQL; for PostgreSQL in a statement of their own, see
``_bind``, so that the result still streams): no row twice, none lost, and rows appended since
(keys above the last) are read too. ``:max`` is the largest key when the epoch began or
resumed, taken once for every rank (``ember.train.train_data.pin_epoch``), so ranks that each
run the query read the same rows however they race with the writes. Shuffled, the rows
trained are no key range; the epoch's rows (``key <= :max``, the largest key when it began)
are re-read from its start on resume with the batches trained dropped, as files are.

Drivers: ``postgresql`` and ``sqlite`` (``adbc-driver-postgresql``, ``adbc-driver-sqlite``), or
any other ADBC driver by name: the Python package ``adbc_driver_<name>`` when installed (e.g.
``flightsql``, ``snowflake``), else the name as the driver manager resolves it (a shared
library such as ``libadbc_driver_duckdb.so``, or a driver manifest).

Example:
    >>> import tempfile, os, pyarrow as pa
    >>> db = os.path.join(tempfile.mkdtemp(), "clicks.db")
    >>> import adbc_driver_sqlite.dbapi
    >>> with adbc_driver_sqlite.dbapi.connect(db) as conn:
    ...     conn.cursor().adbc_ingest("clicks", pa.table({"id": [3, 1, 2], "y": [1, 0, 1]}))
    ...     conn.commit()
    3
    >>> sql = SqlOptions(driver="sqlite", uri=db, query="SELECT * FROM clicks", key="id")
    >>> [c.batch.column("id").to_pylist() for c in sql_chunks(sql, "train", read_rows=2)]
    [[1, 2], [3]]
    >>> [c.batch.column("id").to_pylist() for c in sql_chunks(sql, "train", read_rows=2, after=1)]
    [[2, 3]]
"""

from __future__ import annotations

import importlib
import inspect
import logging
import os
import re
from contextlib import closing, contextmanager
from dataclasses import dataclass
from typing import Any, Iterable, Iterator, Literal, Sequence

import numpy as np
import pyarrow as pa
from pydantic import Field, model_validator

from ember.config_base import ConfigModel
from ember.errors import ConfigError, DataError
from ember import once

__all__ = ["SqlOptions", "SqlSource", "SqlKey", "SqlPosition", "plain_key", "sql_check_columns", "sql_reader", "connect", "sql_chunks", "sql_columns", "sql_count", "sql_max_key",
           "query_label"]

log = logging.getLogger("ember")

Split = Literal["train", "eval"]
SqlKey = int | str
"""A key value as a checkpoint stores it: the key column holds integers or text."""

_PLACEHOLDERS = {"postgresql": "$1"}  # how a driver writes bound parameter 1; the rest use '?'


class SqlOptions(ConfigModel):
    """Where ``data.format: sql`` reads its rows: an ADBC driver, the database's URI, the
    training query ordered by ``key`` and an optional evaluation query.

    Example:
        >>> SqlOptions(driver="sqlite", uri="clicks.db", query="SELECT * FROM t", key="id").placeholder_for()
        '?'
    """

    driver: str = Field(min_length=1)
    """ADBC driver: `postgresql` or `sqlite` (`pip install ember[sql]`), or another ADBC driver by name (the Python
    package `adbc_driver_<name>` when installed, else a name or path the ADBC driver manager loads)."""
    uri: str = Field(min_length=1)
    """The database, as the driver takes it: `postgresql://user@host:5432/db` (a password is best left to
    `PGPASSWORD` or `~/.pgpass`), or a SQLite file path."""
    query: str | None = None
    """The training rows: one `SELECT` (no trailing `;` needed). It is read ordered by `key`, wrapped as
    `SELECT * FROM (<query>) AS q ... ORDER BY key`; a resumed run reads only the rows after the last key trained."""
    eval_query: str | None = None
    """The evaluation rows: one `SELECT`, read as it is (its own order)."""
    key: str | None = None
    """Column of the training query whose values are unique and orderable (integers or text, no NULL: a primary
    key, an event id, a timestamp in microseconds): the training order and the checkpoint's position (the last key
    trained). Required with `query`."""
    driver_path: str | None = None
    """A shared library of the same ADBC driver to load in place of the one in the driver's Python package, e.g.
    one built with optimisation: adbc-driver-postgresql 1.13's wheel decodes a result ~2.5x slower than a
    `-DCMAKE_BUILD_TYPE=Release` build of the same driver (docs: your-data, "Driver build"). `driver` still names the
    driver (SQL dialect, key binding); a file that does not load stops the run naming it (no fallback)."""
    placeholder: str | None = None
    """How the driver writes bound parameter 1 in SQL (`?`, `$1`, `:1`; a `1` in it counts up for parameter 2: the
    epoch's key bounds); unset: `?` (postgresql: the keys are bound in a statement of their own, `set_config`, since
    its driver streams only queries without parameters; setting `$1` binds them in the query, whose whole result
    the driver then holds in memory)."""
    db_kwargs: dict[str, str] = Field(default_factory=dict)
    """More database options handed to the driver as they are when it connects (driver-specific names; a name the
    driver does not know stops the run naming it)."""
    statement_kwargs: dict[str, str] = Field(default_factory=dict)
    """Statement options handed to the driver as they are for each query, e.g. `adbc.postgresql.batch_size_hint_bytes`
    (bytes per record batch PostgreSQL's driver decodes at once, 16 MiB by default: more RAM per batch held, no faster
    here) or `adbc.sqlite.query.batch_rows`; an option the driver does not take stops the run naming it."""

    @model_validator(mode="after")
    def _check(self) -> "SqlOptions":
        if self.query is None and self.eval_query is None:
            raise ValueError("give data.sql.query (training rows) and/or data.sql.eval_query (evaluation rows)")
        if self.query is not None and not self.key:
            raise ValueError("data.sql.query needs data.sql.key: a unique, orderable column of its rows (e.g. the "
                             "table's primary key) that orders training and marks how far a checkpoint got")
        return self

    def placeholder_for(self) -> str:
        """The SQL text of bound parameter 1 for this driver."""
        return self.placeholder or _PLACEHOLDERS.get(self.driver, "?")

    def query_of(self, split: Split) -> str | None:
        return self.query if split == "train" else self.eval_query


def query_label(split: Split) -> str:
    """What messages call a split's rows (in place of a file name)."""
    return "data.sql.query" if split == "train" else "data.sql.eval_query"


def _redacted(uri: str) -> str:
    """``uri`` without the password of ``user:password@`` (messages and logs never show it)."""
    return re.sub(r"(//[^:/@]+:)[^@/]*@", r"\1***@", uri)


def _sqlite_path(uri: str) -> str | None:
    """The file a SQLite URI names, when it is a plain path (None for ``file:`` URIs and memory)."""
    if uri.startswith("file:") or uri == ":memory:" or "mode=memory" in uri:
        return None
    return uri


def _is_sqlite(path: str) -> bool:
    """Whether ``path`` holds a SQLite database: its 16-byte header, or no byte yet (SQLite
    takes an empty file as an empty database)."""
    try:
        with open(path, "rb") as f:
            head = f.read(16)
    except OSError:
        return True  # (unreadable: the driver names why)
    return not head or head == b"SQLite format 3\x00"


def connect(sql: SqlOptions) -> Any:
    """A DB-API connection (``adbc_driver_manager.dbapi.Connection``) to ``sql.uri`` through
    ``sql.driver``; ConfigError naming the driver and URI when the driver is not installed or
    the database cannot be reached (with what to check)."""
    where = f"data.sql: {sql.driver} database {_redacted(sql.uri)}"
    if sql.driver == "sqlite":  # the driver would create a missing file (and then find no table)
        path = _sqlite_path(sql.uri)
        if path is not None and not os.path.isfile(path):
            raise ConfigError(f"{where}: no such SQLite file; check data.sql.uri (a path to an existing database)")
        if path is not None and not _is_sqlite(path):  # the driver would say "file is not a database" per query
            raise ConfigError(f"{where}: the file is not a SQLite database (no 'SQLite format 3' header); check "
                              "data.sql.uri")
    if sql.driver_path is not None:
        return _connect_path(sql, where)
    try:
        module = importlib.import_module(f"adbc_driver_{sql.driver}.dbapi")
    except (ImportError, ValueError, TypeError) as e:  # not installed, or a name no module can have
        module = None
        if sql.driver in ("postgresql", "sqlite"):
            raise ConfigError(f"data.sql.driver '{sql.driver}' needs the package adbc-driver-{sql.driver} ({e}); "
                              "pip install 'ember[sql]'") from None
    if module is not None and sql.db_kwargs and "db_kwargs" not in inspect.signature(module.connect).parameters:
        raise ConfigError(f"data.sql.db_kwargs: the {sql.driver} driver's package (adbc_driver_{sql.driver}) takes no "
                          "database options when it connects; remove data.sql.db_kwargs (statement options go in "
                          "data.sql.statement_kwargs)")
    if module is not None and sql.driver == "postgresql":
        _say_driver_build(module)
    try:
        if module is not None:
            kw = {"db_kwargs": dict(sql.db_kwargs)} if sql.db_kwargs else {}
            return module.connect(sql.uri, **kw)
    except Exception as e:  # noqa: BLE001  # the driver's own error types: named below
        if sql.db_kwargs and "option" in str(e).lower():
            raise ConfigError(f"data.sql.db_kwargs: the {sql.driver} driver refuses a database option "
                              f"({_first_line(e)}); remove it or fix its name or value (statement options such as "
                              "batch sizes go in data.sql.statement_kwargs)") from None
        raise ConfigError(f"{where}: cannot connect ({_first_line(e)}); check data.sql.uri, that the server is "
                          "running and reachable from here, and the user's rights") from None
    try:
        from adbc_driver_manager import dbapi
    except ImportError as e:
        raise ConfigError(f"data.sql.driver '{sql.driver}': the ADBC driver manager is not installed ({e}); "
                          "pip install 'ember[sql]' (and the driver's package)") from None
    try:
        return dbapi.connect(driver=sql.driver, db_kwargs={"uri": sql.uri, **sql.db_kwargs})
    except Exception as e:  # noqa: BLE001
        text = _first_line(e)
        if "load" in text.lower() or "not found" in text.lower() or "manifest" in text.lower():
            raise ConfigError(f"data.sql.driver '{sql.driver}': no such ADBC driver (no package adbc_driver_"
                              f"{sql.driver}, and the driver manager could not load it: {text}); give postgresql or "
                              f"sqlite, or install the driver (e.g. pip install adbc-driver-{sql.driver})") from None
        raise ConfigError(f"{where}: cannot connect ({text}); check data.sql.uri, that the server is running and "
                          "reachable from here, and the user's rights") from None


def _connect_path(sql: SqlOptions, where: str) -> Any:
    """A connection through the driver library ``sql.driver_path`` (the ADBC driver manager
    loads it); ConfigError naming the file when it is missing or does not load as an ADBC
    driver, never a quiet fall back to the package's build."""
    path = os.path.expanduser(sql.driver_path or "")
    if not os.path.isfile(path):
        raise ConfigError(f"data.sql.driver_path: no such file {path!r}; give the path of the driver's shared library "
                          f"(e.g. libadbc_driver_{sql.driver}.so), or remove data.sql.driver_path to use the "
                          f"adbc_driver_{sql.driver} package's")
    try:
        from adbc_driver_manager import dbapi
    except ImportError as e:
        raise ConfigError(f"data.sql.driver_path: the ADBC driver manager is not installed ({e}); "
                          "pip install 'ember[sql]'") from None
    try:
        return dbapi.connect(driver=path, db_kwargs={"uri": sql.uri, **sql.db_kwargs})
    except Exception as e:  # noqa: BLE001  # the driver manager's error types: named below
        text = _first_line(e)
        if "could not load" in text.lower() or "dlopen" in text.lower() or "entrypoint" in text.lower():
            raise ConfigError(f"data.sql.driver_path: {path!r} does not load as an ADBC driver ({text}); give a "
                              f"build of libadbc_driver_{sql.driver} for this machine") from None
        raise ConfigError(f"{where}: cannot connect through {path} ({text}); check data.sql.uri, that the server is "
                          "running and reachable from here, and the user's rights") from None


def _say_driver_build(module: Any) -> None:
    """Log once per process which build of PostgreSQL's driver decodes the rows: its decode is
    most of a PostgreSQL source's CPU (bench_sources), and the PyPI wheel's build is ~2.5x slower
    at it than an optimised build given as ``data.sql.driver_path``."""
    if not once.first("sql.driver_build", "postgresql"):
        return
    package = getattr(module, "__name__", "adbc_driver_postgresql").rsplit(".", 1)[0]
    try:
        from importlib.metadata import version

        built = f"{package} {version(package.replace('_', '-'))}"
    except Exception:  # noqa: BLE001  # a version is only for the message
        built = package
    log.info("data.sql: PostgreSQL results are decoded by the driver in the %s package (its PyPI build decodes "
             "~65 ns per value here, an optimised build ~25 ns); to use another build of the same driver, set "
             "data.sql.driver_path (docs: your-data, \"Driver build\")", built)


def _first_line(e: BaseException) -> str:
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    return " ".join(lines[:2]) if lines else type(e).__name__


def _quoted(column: str) -> str:
    """``column`` as a SQL identifier (ANSI double quotes: the name exactly as the result has it)."""
    return '"' + column.replace('"', '""') + '"'


def _body(query: str) -> str:
    return query.strip().rstrip(";").rstrip()


Statement = tuple[str, tuple]  # SQL text and its bound parameters


def _wrapped(sql: SqlOptions, split: Split, after: SqlKey | None, upto: SqlKey | None,
             select: str = "*") -> list[Statement]:
    """The statements that read ``split``'s rows, the last one giving them: the training query
    in key order (its columns ``select``), from after ``after`` or up to ``upto``; the eval
    query as it is."""
    query = sql.query_of(split)
    if query is None:
        raise ConfigError(f"{query_label(split)} is not set; give the {split} rows' SELECT")
    if split == "eval":
        return [(_body(query), ())]
    key = _quoted(sql.key or "")
    bounds = [(op, v) for op, v in ((">", after), ("<=", upto)) if v is not None]
    if not bounds:
        return [(f"SELECT {select} FROM ({_body(query)}) AS q ORDER BY {key}", ())]
    before, marks, params = _bind(sql, [v for _, v in bounds])
    where = " AND ".join(f"{key} {op} {mark}" for (op, _), mark in zip(bounds, marks))
    return [*before, (f"SELECT {select} FROM ({_body(query)}) AS q WHERE {where} ORDER BY {key}", params)]


def _bind(sql: SqlOptions, values: Sequence[SqlKey]) -> tuple[list[Statement], list[str], tuple]:
    """How the streaming query takes the key ``values``, bound, never formatted into SQL:
    statements to run first, the SQL expressions standing for them, and their parameters.

    PostgreSQL's ADBC driver streams a result (COPY) only for a statement without parameters;
    with one it holds the whole result in memory. So for PostgreSQL the values are bound in a
    statement of their own (``set_config``, session settings) and the query reads them back with
    ``current_setting``, as bigint or text. Other drivers (SQLite's streams either way) take
    them as parameters (``data.sql.placeholder``, its ``1`` counting up for the second;
    setting it for PostgreSQL does the same there).
    """
    if sql.driver == "postgresql" and sql.placeholder is None:
        names = [f"ember.sql_key{i}" for i in range(len(values))]
        sets = ", ".join(f"set_config('{n}', ${i + 1}, false)" for i, n in enumerate(names))
        marks = [f"CAST(current_setting('{n}') AS {'bigint' if isinstance(v, int) else 'text'})"
                 for n, v in zip(names, values)]
        return [(f"SELECT {sets}", tuple(str(v) for v in values))], marks, ()
    mark = sql.placeholder_for()
    return [], [mark.replace("1", str(i + 1)) for i in range(len(values))], tuple(values)


def _execute(cursor: Any, sql: SqlOptions, split: Split, text: str, params: tuple) -> None:
    """Run ``text``; ConfigError quoting the database's answer when it refuses the query."""
    try:
        cursor.execute(text, params or None)
    except Exception as e:  # noqa: BLE001  # the driver's error types vary: all named as the query's fault
        raise ConfigError(f"{query_label(split)}: the {sql.driver} database refused the query ({_first_line(e)}); "
                          f"fix the SQL (it ran as: {text})") from None


def _null_keys(key: str, rows: int) -> str:
    return (f"data.sql.key '{key}' is NULL in {rows} row(s) of the training query; NULL keys cannot be ordered or "
            "resumed after: name a column without NULLs (a primary key) as data.sql.key, or filter them out in "
            "data.sql.query")


class _KeyOrder:
    """Checks that the key column read in key order never repeats (and, for integers, only
    rises) and holds no NULL: a repeated key would make 'after the last key' lose rows."""

    def __init__(self, key: str, after: SqlKey | None) -> None:
        self.key, self.last = key, after

    def check(self, batch: pa.RecordBatch, first_row: int) -> None:
        col = batch.column(self.key)
        if col.null_count:
            raise DataError(_null_keys(self.key, col.null_count))
        values = col.to_numpy(zero_copy_only=False)
        if not len(values):
            return
        whole = values if self.last is None else np.concatenate([np.array([self.last], dtype=values.dtype), values])
        same = whole[1:] == whole[:-1]
        if pa.types.is_integer(col.type):
            same |= whole[1:] < whole[:-1]  # text order is the database's collation; numbers' is ours too
        if same.any():
            i = int(np.flatnonzero(same)[0]) + 1  # index in ``whole`` of the offending value
            row = first_row + i - int(self.last is not None)
            raise DataError(f"data.sql.key '{self.key}': the value {plain_key(whole[i])!r} (row {row} of "
                            "the training query in key order) repeats or breaks the order; the key must be unique: "
                            "name a unique column (a primary key) as data.sql.key")
        self.last = values[-1].item() if hasattr(values[-1], "item") else values[-1]


def sql_chunks(sql: SqlOptions, split: Split, read_rows: int = 65536, after: SqlKey | None = None,
               upto: SqlKey | None = None, columns: Sequence[str] | None = None) -> Iterator[Any]:
    """The ``RecordChunk`` s of ``split``'s rows, ``read_rows`` rows each (the last fewer): the
    training query in key order, after key ``after`` or up to key ``upto`` when given; streamed
    batch by batch from the driver. ``columns``: the training query's columns to read (see
    ``sql_reader``); None: all."""
    from ember.source.base import RecordChunk

    label = query_label(split)
    with sql_reader(sql, split, after, upto, columns) as reader:
        order = _KeyOrder(sql.key, after) if split == "train" and sql.key else None
        if order is not None and sql.key not in reader.schema.names:
            raise ConfigError(f"data.sql.key '{sql.key}' is not a column of data.sql.query (its columns: "
                              f"{reader.schema.names}); name one of them")
        row = 1
        for batch in _rechunked(reader, read_rows):
            if order is not None:
                order.check(batch, row)
            yield RecordChunk(batch, label, row)
            row += batch.num_rows


@contextmanager
def sql_reader(sql: SqlOptions, split: Split, after: SqlKey | None = None, upto: SqlKey | None = None,
               columns: Sequence[str] | None = None) -> Iterator[pa.RecordBatchReader]:
    """The driver's stream of ``split``'s rows (its own batch sizes) for the with-block, on a
    connection of its own: the training query in key order, after ``after`` or up to ``upto``.

    ``columns`` (training query): only those of its columns, and the key, are read, as a
    Parquet file reads only the columns the schema uses; every value read costs the server an
    encoding and the driver a decoding (PostgreSQL: ~45 ns and ~65 ns per value here). Names
    the query lacks are left out (the featurizer names what is missing, as for a file), so the
    query's columns are asked first (``LIMIT 0``). The eval query is read as it is (its own
    order; a projection around it need not keep that).
    """
    with closing(connect(sql)) as conn, closing(_cursor(conn, sql, split)) as cur:
        select = "*"
        if columns is not None and split == "train":
            _execute(cur, sql, split, f"SELECT * FROM ({_body(sql.query or '')}) AS q LIMIT 0", ())
            have = cur.fetch_arrow_table().schema.names
            wanted = set(columns) | {sql.key}
            select = ", ".join(_quoted(c) for c in have if c in wanted) or "*"
        *before, (text, params) = _wrapped(sql, split, after, upto, select)
        for pre, pre_params in before:
            _execute(cur, sql, split, pre, pre_params)
        _execute(cur, sql, split, text, params)
        yield cur.fetch_record_batch()


def _cursor(conn: Any, sql: SqlOptions, split: Split) -> Any:
    """A cursor of ``conn`` with ``data.sql.statement_kwargs`` set; ConfigError naming an option
    the driver refuses (an unknown name or a bad value), never dropped silently."""
    cur = conn.cursor()
    for name, value in sql.statement_kwargs.items():
        try:
            cur.adbc_statement.set_options(**{name: value})
        except Exception as e:  # noqa: BLE001  # the driver's error types vary: all named as the option's fault
            cur.close()
            raise ConfigError(f"data.sql.statement_kwargs: the {sql.driver} driver refuses {name}={value!r} "
                              f"({_first_line(e)}); remove it or fix its name or value (see the driver's "
                              "documentation of its statement options)") from None
    return cur


def _rechunked(reader: Iterable[pa.RecordBatch], rows: int) -> Iterator[pa.RecordBatch]:
    """``reader``'s rows in record batches of ``rows`` rows (the last fewer), whatever the
    driver's batches were (they follow its byte budget, not a row count). A piece within one
    driver batch is a slice of it (no copy; it keeps that batch's memory alive while queued);
    only a piece spanning two or more is copied into one."""
    held: list[pa.RecordBatch] = []  # the start of the next piece: slices of the batches so far
    count = 0
    for b in reader:
        start, n = 0, b.num_rows
        if held and n:
            start = min(rows - count, n)
            held.append(b.slice(0, start))
            count += start
            if count < rows:
                continue
            yield _joined(held)
            held, count = [], 0
        while n - start >= rows:
            yield b.slice(start, rows)
            start += rows
        if start < n:
            held, count = [b.slice(start)], n - start
    if held:
        yield _joined(held)


def _joined(parts: list[pa.RecordBatch]) -> pa.RecordBatch:
    if len(parts) == 1:
        return parts[0]
    return pa.Table.from_batches(parts).combine_chunks().to_batches()[0]


def _row(sql: SqlOptions, split: Split, text: str) -> tuple | None:
    """The first row of query ``text`` (None: no row), on a connection of its own."""
    with closing(connect(sql)) as conn, closing(_cursor(conn, sql, split)) as cur:
        _execute(cur, sql, split, text, ())
        row = cur.fetchone()
        return None if row is None else tuple(row)


def _scalar(sql: SqlOptions, split: Split, text: str) -> Any:
    row = _row(sql, split, text)
    return None if row is None else row[0]


def sql_max_key(sql: SqlOptions) -> SqlKey | None:
    """The largest key of the training query now (None: no rows): the epoch's bound. DataError
    when a row's key is NULL: the bound (``key <= :max``) never holds for NULL, so such a row
    would be dropped silently, before the read's own check (``_KeyOrder``) could see it."""
    key, body = _quoted(sql.key or ""), _body(sql.query or "")
    # one pass over the query: its largest key, and its rows whose key is NULL (COUNT(key) skips them)
    value, nulls = _row(sql, "train", f"SELECT MAX({key}), COUNT(*) - COUNT({key}) FROM ({body}) AS q") or (None, 0)
    if nulls:
        raise DataError(_null_keys(sql.key or "", int(nulls)))
    return value.item() if hasattr(value, "item") else value


def sql_count(sql: SqlOptions, split: Split) -> int:
    """Rows of ``split``'s query now (the progress bar's total; the database counts them)."""
    return int(_scalar(sql, split, f"SELECT COUNT(*) FROM ({_body(sql.query_of(split) or '')}) AS q") or 0)


def sql_columns(sql: SqlOptions, split: Split) -> tuple[list[str], bool]:
    """The columns of ``split``'s query and whether it has a row, asked of the database without
    reading the rows (preflight). For training, ConfigError when the key is not a column or not
    of integers or text."""
    body = _body(sql.query_of(split) or "")
    with closing(connect(sql)) as conn, closing(_cursor(conn, sql, split)) as cur:
        _execute(cur, sql, split, f"SELECT * FROM ({body}) AS q LIMIT 1", ())
        table = cur.fetch_arrow_table()
    names = list(table.schema.names)
    if split == "train" and sql.key:
        if sql.key not in names:
            import difflib

            hint = difflib.get_close_matches(sql.key, names, n=1)
            raise ConfigError(f"data.sql.key '{sql.key}' is not a column of data.sql.query (its columns: {names})"
                              + (f"; did you mean '{hint[0]}'?" if hint else "; name one of them"))
        kind = table.schema.field(sql.key).type
        if not (pa.types.is_integer(kind) or pa.types.is_string(kind) or pa.types.is_large_string(kind)):
            raise ConfigError(f"data.sql.key '{sql.key}' holds {kind} values; the key must be integers or text (unique, "
                              "no NULL): name such a column, or select one in data.sql.query (e.g. a timestamp as "
                              "microseconds since the epoch)")
    return names, table.num_rows > 0


def sql_check_columns(sql: SqlOptions, split: Split, wanted: Sequence[str]) -> None:
    """Preflight: ``split``'s query runs, has the ``wanted`` columns (MissingColumnsError), the
    training key fits, and it has at least one row (DataError)."""
    from ember.source.base import check_columns

    names, has_rows = sql_columns(sql, split)
    check_columns(query_label(split), names, wanted)
    if not has_rows:
        raise DataError(f"{query_label(split)} returns no rows; check its WHERE clause and the table")


@dataclass(frozen=True)
class SqlPosition:
    """Where a SQL training epoch stands (a checkpoint's data position): ``upto``, the largest
    key when the epoch began (its rows are those up to it, on every rank), and ``after``, the
    last key trained (rows read in key order: a resumed run reads the keys above it, up to the
    largest then; shuffled: None, a resumed run re-reads the epoch's rows and drops the batches
    trained). Stored as ``sql_key`` / ``sql_key_max`` in the checkpoint's position.

    Example:
        >>> p = SqlPosition(after=41)
        >>> p.to_dict(), SqlPosition.from_position(p.to_dict()) == p
        ({'sql_key': 41, 'sql_key_max': None}, True)
    """

    after: SqlKey | None = None
    upto: SqlKey | None = None

    def to_dict(self) -> dict[str, Any]:
        """The checkpoint's fields (merged into its ``position``)."""
        return {"sql_key": self.after, "sql_key_max": self.upto}

    @classmethod
    def from_position(cls, position: dict[str, Any]) -> "SqlPosition":
        """From a checkpoint's ``position`` dict."""
        return cls(position.get("sql_key"), position.get("sql_key_max"))


def plain_key(value: Any) -> SqlKey:
    """A key value read from the data as a plain int or str (what JSON and the driver take)."""
    value = value.item() if hasattr(value, "item") else value
    if isinstance(value, bytes):
        value = value.decode()
    return value


class SqlSource:
    """A SQL query as a source (``data.format: sql``, see the module docstring): one unit per
    split (the query's result, streamed); the training query's position is its last key trained
    (read in key order) or, shuffled, the largest key when the epoch began (``SqlPosition``)."""

    def __init__(self, data: Any) -> None:
        if data.sql is None:  # DataConfig checks it
            raise ConfigError("data.format: sql needs data.sql")
        self.data, self.sql = data, data.sql

    def units(self, split: Split, at: Any = None) -> list[Any]:
        from ember.source.protocol import Unit

        if self.sql.query_of(split) is None:
            raise ConfigError(f"{query_label(split)} is not set; give the {split} rows' SELECT")
        return [Unit(query_label(split))]

    def open(self, unit: Any, columns: Sequence[str], report: Any = None, at: Any = None,
             consumed: list[int] | None = None, types: Any = None) -> Iterator[Any]:  # types: a hint for text (CSV)
        split: Split = "train" if unit.name == query_label("train") else "eval"
        at = at if isinstance(at, SqlPosition) and split == "train" else SqlPosition()
        return sql_chunks(self.sql, split, self.data.read_rows, at.after, at.upto, columns)

    def check(self, split: Split, columns: Sequence[str]) -> list[Any]:
        if self.sql.query_of(split) is None:
            return []
        sql_check_columns(self.sql, split, columns)
        return self.units(split)

    def count(self, split: Split, estimate: bool = False) -> Any:
        from ember.source.protocol import RowCount

        return RowCount(rows=sql_count(self.sql, split) if self.sql.query_of(split) is not None else 0)

    def start(self, split: Split, at: Any, ordered: bool, resumed: bool) -> Any:
        if split != "train":
            return None
        at = at if isinstance(at, SqlPosition) else SqlPosition()
        if resumed and (at.after is None if ordered else (at.upto is None or at.after is not None)):
            written = "in key order (data.shuffle_buffer: 0)" if at.after is not None else \
                "shuffled (data.shuffle_buffer > 0)" if at.upto is not None else "without a SQL position"
            raise ConfigError(f"the checkpoint was written mid-epoch {written}, and this run reads the query "
                              f"{'in key order' if ordered else 'shuffled'}: resume with the data.shuffle_buffer it "
                              "was written with, or from a checkpoint at an epoch's start")
        if not ordered and at.upto is not None:
            return at  # a shuffled epoch resumes on the rows it began with
        # the rows there now (None: an empty table), in key order after the last trained: keys
        # appended later wait for the next epoch or resume
        return SqlPosition(after=at.after, upto=sql_max_key(self.sql))

    def key(self, split: Split, ordered: bool) -> str | None:
        return self.sql.key if split == "train" and ordered else None

    def after(self, at: Any, value: Any) -> Any:
        return SqlPosition(after=plain_key(value), upto=at.upto if isinstance(at, SqlPosition) else None)

    def follow(self, resume: str | None, taken: set[str], stop: Any) -> Iterator[Any]:
        raise ConfigError("train.mode: online streams files or an Iceberg table's snapshots; data.format: sql reads "
                          "a query in epochs: use train.mode: offline")
