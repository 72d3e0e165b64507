"""Featurizer: one arrow record batch -> :class:`Rows` (labels, transformed dense, hashed IDs).

Everything is vectorised over the batch; bad rows are found with masks, then either the
earliest one raises :class:`~ember.errors.DataError` (file, row, column, value, fix) or all are
dropped and counted per reason in a :class:`~ember.source.bad_rows.BadRowReport`.

The single-valued sparse columns (no separator, no weights: integer columns, string or binary
ones that are hashed, string ones of integer IDs) are featurized in one pass over their Arrow buffers,
``_native.featurize_ids``, into one values array that ``Rows.to_batch`` hands on as it is; every
other feature goes column by column (``Featurizer._sparse``, the reference the one pass is
tested against: ``Featurizer.one_pass = False``), and the reason is logged once per process.

Example:
    >>> import pyarrow as pa
    >>> from ember.featurize.schema import Schema
    >>> schema = Schema(labels=["y"], dense=[{"name": "n", "log1p": True}],
    ...                 sparse=[{"name": "tags", "separator": "|", "max_length": 2}])
    >>> rb = pa.record_batch({"y": ["1", "0"], "n": ["0", ""], "tags": ["a|b|c", None]})
    >>> b = Featurizer(schema)(rb).to_batch()
    >>> b.labels.tolist(), b.dense.tolist(), b.sparse.lengths.tolist()
    ([[1.0], [0.0]], [[0.0], [0.0]], [2, 0])
"""

from __future__ import annotations

import logging
import re
from typing import Mapping, NamedTuple, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ember import _native
from ember.errors import ConfigError, MissingColumnsError, SchemaError
from ember.featurize.canonical import canonical_array, type_in
from ember.featurize.hashing import hash_array, salt_key
from ember.featurize.rows import Rows
from ember.featurize.schema import DenseFeature, Schema, SparseFeature
from ember.featurize.transforms import (
    INTEGER,
    dense_runs,
    dense_transform,
    filter_jagged,
    is_listed,
    parse_floats,
    parse_ints,
    truncate_jagged,
)
from ember.source.bad_rows import BadRowReport, raise_bad_row
from ember.source.base import repeated
from ember import once

__all__ = ["Featurizer", "read_types"]

log = logging.getLogger("ember")


_NOT_PLAIN_TEXT = ("text that is not all plain integers and empty fields (decimals, blanks, signs, bad values): "
                   "parse_floats reads that block's column")  # why dense_floats left a text column


def _float_column(t: pa.DataType) -> tuple[int, int, bool] | None:
    """How ``_native.dense_floats`` takes a column of type ``t``: ``(kind, width, signed)`` for a
    (large_)string column (kind 1, its offsets' width) or an integer one (kind 0), else None."""
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return 1, 8 if pa.types.is_large_string(t) else 4, True
    if pa.types.is_integer(t):
        return 0, t.bit_width // 8, pa.types.is_signed_integer(t)
    return None


def _say_once(reason: str, feature: str, kind: str = "sparse", call: str = "featurize_ids") -> None:
    if once.first("featurizer.column_by_column", reason):
        log.info("featurizer: %s feature '%s' (and any other like it) is featurized column by column, not in the "
                 "one-pass native call (%s): %s", kind, feature, call, reason)


def _empty(n: int, dtype: type) -> np.ndarray:
    """A writable numpy array of ``n`` items in memory of Arrow's pool (64-byte aligned). A
    batch's sparse outputs are about 1 MB each, fresh every batch: glibc may hand such sizes out
    as new mmaps, whose pages then fault in on first write (bench_featurize: ~600 faults,
    ~0.9 ms per 4,096 Parquet rows), where Arrow's pool, which holds the batch's columns anyway,
    reuses freed memory."""
    dt = np.dtype(dtype)
    return np.frombuffer(pa.allocate_buffer(n * dt.itemsize), dt)


class _Native(NamedTuple):
    """How one sparse feature goes into ``_native.featurize_ids``: its position among the
    features, its column, and the column tuple's fixed parts."""

    index: int
    column: str
    kind: int  # 0 integers, 1 hashed strings
    width: int  # integer bytes, or string offset bytes
    signed: bool
    hashed: bool
    salt: int
    listed: tuple


_OFFSET_WIDTH = {t.id: w for t, w in ((pa.string(), 4), (pa.binary(), 4), (pa.large_string(), 8), (pa.large_binary(), 8))}
_MAX_LISTED = 16  # featurize_ids compares at most this many missing_values per column


class _Checks:
    """Bad-row masks in column order; a row counts under its first reason."""

    def __init__(self, batch: pa.RecordBatch) -> None:
        self.batch = batch
        self.items: list[tuple[str, str, str, np.ndarray]] = []  # column, problem, value col, mask

    def add(self, column: str, problem: str, mask: np.ndarray, value_column: str | None = None) -> None:
        if mask.any():
            self.items.append((column, problem, value_column or column, mask))

    def resolve(self, report: BadRowReport, file: str, first_row: int | np.ndarray) -> np.ndarray | None:
        """Raise on the earliest bad row (error mode) or count and return the keep mask."""
        if not self.items:
            return None
        if not report.skip:
            firsts = [int(np.argmax(m)) for *_, m in self.items]
            k = int(np.argmin(firsts))
            column, problem, vcol, _ = self.items[k]
            row = firsts[k]
            raise_bad_row(file, row_number(first_row, row), column, self.batch.column(vcol)[row].as_py(), problem)
        taken = np.zeros(self.batch.num_rows, dtype=bool)
        for column, problem, _, mask in self.items:
            new = mask & ~taken
            report.add(f"{column}: {problem}", int(new.sum()))
            taken |= new
        return ~taken


def _jagged(arr: pa.Array, separator: str | None) -> tuple[pa.Array, np.ndarray, bool]:
    """Flat values, per-row lengths, and whether the column holds one value per row (neither a
    list column nor strings split on ``separator``: its lengths are all 1)."""
    if pa.types.is_dictionary(arr.type):
        arr = arr.cast(arr.type.value_type)
    if separator is not None and (pa.types.is_string(arr.type) or pa.types.is_large_string(arr.type)):
        arr = pc.split_pattern(arr, separator)
    if pa.types.is_list(arr.type) or pa.types.is_large_list(arr.type) or pa.types.is_fixed_size_list(arr.type):
        lengths = pc.fill_null(pc.list_value_length(arr), 0).to_numpy(zero_copy_only=False).astype(np.int64)
        return pc.list_flatten(arr), lengths, False
    return arr, np.ones(len(arr), dtype=np.int64), True


def _key_values(arr: pa.Array | pa.ChunkedArray, file: str, column: str) -> np.ndarray:
    """A carried column's values, one per row: numbers as a numeric array, text (and integers
    with nulls) as objects, a null as None (NaN in a float column)."""
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    if pa.types.is_dictionary(arr.type):
        arr = arr.cast(arr.type.value_type)
    if pa.types.is_nested(arr.type):
        raise ConfigError(f"{file}: column '{column}' holds {arr.type} values; a key column (eval.group_by, "
                          "eval.slices, predict --keep) needs one plain value per row: name another column")
    if arr.null_count and pa.types.is_integer(arr.type):  # to_numpy would turn the integers into floats
        return np.array(arr.to_pylist(), dtype=object)
    return arr.to_numpy(zero_copy_only=False)


def _type_error(file: str, role: str, column: str, error: TypeError) -> SchemaError:
    """The SchemaError for a column whose arrow type cannot hold what ``role`` needs (e.g. a
    list where a label is expected): a property of the file, so it names file and column."""
    return SchemaError(f"{file}: {role} (column '{column}'): {error}; write one number (or number string) per "
                       "row in that column, or point the schema at another column")


def _numbers(batch: pa.RecordBatch, column: str, file: str, role: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``parse_floats`` of ``column``; a column of a non-numeric type (list, struct, ...) is a
    SchemaError naming the file and column, not a bare TypeError from deep in the parser."""
    try:
        return parse_floats(batch.column(column))
    except TypeError as e:
        raise _type_error(file, role, column, e) from None


_TEXT_SHOWN = 5  # distinct text labels named in the error


def row_number(first_row: int | np.ndarray, i: int) -> int:
    """The file row of batch row ``i``: ``first_row + i``, or ``first_row[i]`` given each row's."""
    return int(first_row) + i if np.ndim(first_row) == 0 else int(first_row[i])


def _one_batch(table: pa.Table) -> pa.RecordBatch:
    """``table``'s rows as one record batch (its chunks joined; none for an empty table)."""
    table = table.combine_chunks()  # one chunk per column (none when empty)
    return pa.RecordBatch.from_arrays([c.chunk(0) if c.num_chunks else pa.array([], type=c.type) for c in table.columns],
                                      schema=table.schema)


def _refuse_repeated(file: str, names: Sequence[str], read: Sequence[str]) -> None:
    """Raise SchemaError when a column the schema reads is named twice in the data: which copy
    holds the values would be a guess. A repeated name nothing reads is harmless."""
    found = repeated(names, read)
    if found is not None:
        c, at = found
        raise SchemaError(f"{file}: column '{c}' appears {len(at)} times (columns {', '.join(map(str, at))}); "
                          "name each column once in the data (or the query)")


def _refuse_text_labels(column: pa.Array, name: str, file: str, first_row: int | np.ndarray, missing: np.ndarray,
                        bad: np.ndarray) -> None:
    """Raise SchemaError when label column ``name`` holds words ("yes"/"no", "click"), not
    numbers: at least two of the block's labels, and at least half of those present, are text.

    Such a column is a layout problem, not a few bad rows: under ``on_bad_rows: skip`` its rows
    would all be dropped (or its NaNs trained on), so it is refused under either policy, naming
    the file, the column and the values seen. A stray word among numeric labels stays a bad row.
    """
    if not (pa.types.is_string(column.type) or pa.types.is_large_string(column.type)) or int(bad.sum()) < 2:
        return  # numbers out of range (inf, 2.5) are bad rows, not a column of words
    text = bad.copy()
    for i in np.flatnonzero(bad):  # "inf", "1e999", "nan" are numbers (bad ones), not words
        try:
            float(column[int(i)].as_py())
            text[i] = False
        except (TypeError, ValueError):
            pass
    n_text = int(text.sum())
    if n_text < 2 or 2 * n_text < int((~missing).sum()):
        return
    bad = text
    words = pc.unique(column.filter(pa.array(bad))).to_pylist()
    shown = ", ".join(repr(w) for w in words[:_TEXT_SHOWN]) + (", ..." if len(words) > _TEXT_SHOWN else "")
    row = row_number(first_row, int(np.argmax(bad)))
    raise SchemaError(f"{file}: label column '{name}' holds text, not numbers: {shown} ({n_text} of the "
                      f"{int((~missing).sum())} labels of rows {row_number(first_row, 0)}-{row_number(first_row, len(bad) - 1)}, the first in "
                      f"row {row}); a label must be a number in [0, 1]: write the labels as 0/1 (e.g. yes -> 1, "
                      "no -> 0), or point schema.labels at a 0/1 column")


def read_types(schema: Schema, text: Sequence[str] = ()) -> dict[str, pa.DataType]:
    """The columns a text source may read typed, and as what, so that the featurizer turns them
    into exactly what it makes of their text (``ember.source.csv``'s typed reads): integer IDs
    (``hash_ids: false``, no ``separator``) as int64, unless ``missing_values`` lists an integer
    (``"-1"`` is missing as text, but ``"-01"`` is not, and int64 cannot tell them apart).
    Numbers stay text: pyarrow's float64 conversion measured slower than the featurizer's own
    parse of integer counts (bench_featurize, hex/csv: 0.97x), and a bad label is named by its
    text. So do a column in two roles that differ, a hashed or separated one, and any of
    ``text`` (key columns carried as read).

    Example:
        >>> s = Schema.parse({"labels": ["y"], "dense": [{"name": "n"}],
        ...                   "sparse": [{"name": "c", "hash_ids": False}, {"name": "h"}]})
        >>> {c: str(t) for c, t in read_types(s).items()}
        {'c': 'int64'}
    """
    wanted: list[tuple[str, pa.DataType | None]] = []
    if not schema.score_only:
        wanted += [(c, None) for c in [*schema.labels, *schema.teacher]]
    wanted += [(d.source_column, None) for d in schema.dense]
    for f in schema.sparse:
        listed_int = any(re.fullmatch(INTEGER, v.strip()) for v in schema.missing_values_of(f))
        plain = f.separator is None
        wanted.append((f.source_column, pa.int64() if plain and not f.hash_ids and not listed_int else None))
        if f.weight_column:
            wanted.append((f.weight_column, None))
    types: dict[str, pa.DataType | None] = {}
    for column, t in wanted:
        types[column] = t if types.get(column, t) == t else None  # two roles, two types: text
    return {c: t for c, t in types.items() if t is not None and c not in text}


class Featurizer:
    """Turns record batches into :class:`Rows` following ``schema``.

    Args:
        schema: the columns and their transforms.
        report: where skipped rows are counted; its ``policy`` decides error vs skip.
        keys: raw columns carried into ``Rows.key_columns`` as they are (feature or not): what
            eval groups and slices by, what ``predict --keep`` copies out.
        id_types: ``({column: type}, where)``: the type of each hashed ID column in the first
            training file (``canonical.hashed_id_types``); a batch whose column has another type
            (int64 in one Parquet file, text in the next) is brought to it first, as serving
            does, so 4 and "4" are one ID in every file; said once per column and type.
    """

    one_pass = True
    """Featurize the single-valued sparse columns in one ``_native.featurize_ids`` call and each
    run of dense features with one transform at once; False: column by column (``_sparse``, one
    ``dense_transform`` per feature), the reference the one-pass path is tested against."""

    def __init__(self, schema: Schema, report: BadRowReport | None = None, keys: Sequence[str] = (),
                 id_types: tuple[Mapping[str, str], str | None] = ({}, None)) -> None:
        self.schema = schema
        self.id_types, self._id_source = dict(id_types[0]), id_types[1]
        self._brought: tuple[pa.Schema, list[tuple[str, str]]] | None = None  # (batch schema, columns to bring)
        self.report = report or BadRowReport()
        self.keys = list(keys)
        self._planned: tuple[pa.Schema, list[_Native]] | None = None  # (batch schema, its plan)
        self._children: list[tuple] | None = None  # the plan's columns by position in that schema (None: a name twice)
        self._float_plans: dict[tuple[str, ...], tuple[list[tuple], list[int]]] = {}  # _native_floats', that schema
        self._runs: list[tuple[int, int, DenseFeature]] | None = None
        self._columns = schema.columns  # the schema is frozen: its columns, once

    def __call__(self, batch: pa.RecordBatch | pa.Table, file: str = "<batch>", first_row: int | np.ndarray = 1) -> Rows:
        """Featurize ``batch`` (a Table is read as one record batch); row 0 is row ``first_row`` of
        ``file``, or row i row ``first_row[i]`` given an array (``RecordChunk.row_numbers``: CSV rows
        that span lines), for messages."""
        if isinstance(batch, pa.Table):
            batch = _one_batch(batch)
        n = batch.num_rows
        names = batch.schema.names
        have = set(names)  # (a list's `in` made this check O(columns^2): 26 us for Criteo's 40)
        if len(have) != len(names):
            _refuse_repeated(file, names, [*self._columns, *self.keys])
        missing_cols = [c for c in self._columns if c not in have]
        if missing_cols:
            raise SchemaError(f"{file}: column(s) {missing_cols} not found; the data has {names}")
        missing_keys = [c for c in self.keys if c not in have]
        if missing_keys:
            raise MissingColumnsError(f"{file}: column(s) {missing_keys} not found; the data has {names}",
                                      missing_keys, list(names))
        checks = _Checks(batch)  # (bad values are named as the file has them)
        if self.id_types:
            batch = self.bring_ids(batch, checks)
        self.report.rows_read += n
        exported = None  # the batch through the Arrow C data interface, once for the native calls below
        if self.one_pass:  # this batch's schema checked once: the plans below read it
            self._plan(batch.schema)
            if isinstance(batch, pa.RecordBatch) and self._children is not None and _native.is_available():
                exported = batch.__arrow_c_array__()

        labels = np.empty((n, len(self.schema.labels)), dtype=np.float32)
        parsed = np.empty((len(self.schema.labels), n), dtype=np.float64)
        native = [False] * len(self.schema.labels) if self.schema.score_only else self._native_floats(
            batch, self.schema.labels, parsed, "label", exported=exported)
        for j, name in enumerate(self.schema.labels):
            if self.schema.score_only:
                labels[:, j] = 0.0
                continue
            if native[j]:  # plain integers and empty fields, parsed as parse_floats would (none bad)
                x = parsed[j]
                missing, bad = np.isnan(x), np.zeros(n, dtype=bool)
            else:
                x, missing, bad = _numbers(batch, name, file, "label")
            _refuse_text_labels(batch.column(name), name, file, first_row, missing, bad)
            checks.add(name, "label is missing", missing)
            checks.add(name, "label is not a number", bad)
            checks.add(name, "label is not in [0, 1]", ~missing & ~bad & ((x < 0) | (x > 1)))
            labels[:, j] = np.nan_to_num(x)

        teacher = None
        if self.schema.teacher and not self.schema.score_only:
            teacher = np.empty((n, len(self.schema.teacher)), dtype=np.float32)
            for j, name in enumerate(self.schema.teacher):
                x, missing, bad = parse_floats(batch.column(name))
                checks.add(name, "teacher score is missing", missing)
                checks.add(name, "teacher score is not a number", bad)
                checks.add(name, "teacher score is not a probability in [0, 1]", ~missing & ~bad & ((x < 0) | (x > 1)))
                teacher[:, j] = np.nan_to_num(x)

        # dense: the parsed columns side by side, then each run of features with the same
        # transform in one dense_transform call (elementwise: the same values as per column)
        raw = np.empty((len(self.schema.dense), n), dtype=np.float64)
        done = self._native_floats(batch, [f.source_column for f in self.schema.dense], raw, "dense",
                                   [f.name for f in self.schema.dense], exported)
        for j, f in enumerate(self.schema.dense):
            if done[j]:
                continue
            x, _, bad = _numbers(batch, f.source_column, file, f"dense feature '{f.name}'")
            checks.add(f.source_column, "not a number", bad)
            raw[j] = x
        if self.one_pass:  # each run in two native passes, numpy's log1p past its table
            runs = self._dense_runs()
            dense, declined = dense_runs(raw, [(a, b, f.fill, f.clip, f.log1p, f.standardize, f.sign_log1p)
                                               for a, b, f in runs])
            for r in declined:
                _say_once("a -0.0 value, or a NaN fill or clip bound or a -0.0 one: numpy's dense_transform takes the run",
                          runs[r][2].name, "dense", "dense_prepare")
        else:
            for a, b, f in self._dense_runs():
                raw[a:b] = dense_transform(raw[a:b], f.fill, f.log1p, f.clip, f.standardize, f.sign_log1p)
            dense = np.ascontiguousarray(raw.T, dtype=np.float32)

        nf = len(self.schema.sparse)
        values: list[np.ndarray] = [None] * nf  # type: ignore[list-item]  # every entry set below
        offsets: list[np.ndarray] = [None] * nf  # type: ignore[list-item]
        weights: list[np.ndarray | None] = [None] * nf
        packed = self._native_sparse(batch, values, offsets, exported)
        for i, f in enumerate(self.schema.sparse):
            if values[i] is None:
                values[i], offsets[i], weights[i] = self._sparse(f, batch, checks, file)

        key_columns = {c: _key_values(batch.column(c), file, c) for c in self.keys} if self.keys else None
        rows = Rows(dense, labels, self.schema.feature_names, values, offsets, weights, teacher, key_columns, packed)
        keep = checks.resolve(self.report, file, first_row)
        return rows if keep is None else rows.take(np.flatnonzero(keep))

    def bring_ids(self, batch: pa.RecordBatch, checks: _Checks | None = None) -> pa.RecordBatch:
        """``batch`` with each hashed ID column whose type differs from ``id_types`` brought to
        that type (``canonical_array``: integers to their digits, decimal text to integers; a
        value that is neither is a bad row of ``checks``, or a null without them)."""
        if self._brought is None or not self._brought[0].equals(batch.schema):
            todo = []
            for c, want in self.id_types.items():
                got = type_in(self.schema, c, batch.schema.field(c).type)
                if got != want:
                    todo.append((c, want))
                    if once.first("featurizer.id_type", (c, got, want)):
                        log.warning("featurizer: ID column '%s' is %s in some files but %s in the first training file "
                                    "(%s); its values are brought to %s before hashing, as predict and serve do, so "
                                    "4 and \"4\" are one ID", c, got, want, self._id_source, want)
            self._brought = (batch.schema, todo)
        if not self._brought[1]:
            return batch
        arrays, fields = list(batch.columns), list(batch.schema)
        for c, want in self._brought[1]:
            f = next(s for s in self.schema.sparse if s.source_column == c)
            i = batch.schema.get_field_index(c)
            arrays[i], bad, _ = canonical_array(arrays[i], want, self.schema.missing_values_of(f), f.separator)
            fields[i] = pa.field(c, arrays[i].type)
            if checks is not None:
                checks.add(c, f"ID cannot be read as {want}, this column's type in the first training file", bad)
        return pa.RecordBatch.from_arrays(arrays, schema=pa.schema(fields))

    def _native_floats(self, batch: pa.RecordBatch, columns: Sequence[str], raw: np.ndarray, kind: str,
                       names: Sequence[str] | None = None, exported: tuple[object, object] | None = None) -> list[bool]:
        """Which of ``columns`` (dense features' or labels') ``_native.dense_floats`` parsed into
        the rows of ``raw`` in one call that reads the columns' buffers from the batch in place
        (their positions and types planned once per schema, ``_float_plans``; ``_plan`` has seen
        this batch's schema): integer columns without nulls, and string columns (CSV text) whose
        values are all plain integers or empty. The others (floats, integers with nulls, decimals,
        blanks, bad values) go through ``parse_floats``, said once per reason; all of them when the
        batch cannot be read by position (a column named twice: the per-column parse names it).
        ``exported``: the batch's ``__arrow_c_array__()``, made once for the native calls."""
        done = [False] * len(columns)
        if not self.one_pass or not columns or not isinstance(batch, pa.RecordBatch) or self._children is None:
            return done
        names = list(columns) if names is None else names
        key = tuple(columns)
        if key not in self._float_plans:
            schema, cols, which = batch.schema, [], []
            for j, c in enumerate(columns):
                k = schema.get_field_index(c)
                t = schema.field(k).type if k >= 0 else None
                how = _float_column(t) if t is not None else None
                if how is not None:  # integers with nulls: declined per batch (Arrow's cast decides)
                    cols.append((how[0], k, *how[1:], j))
                else:
                    if t is not None and (not pa.types.is_floating(t) or kind != "label"):  # float labels: parse_floats
                        _say_once(f"a {t} column", names[j], kind, "dense_floats")
                    continue
                which.append(j)
            self._float_plans[key] = (cols, which)
        cols, which = self._float_plans[key]
        if cols:
            ok = np.empty(len(cols), np.uint8)
            _native.dense_floats(cols, batch.num_rows, raw, ok, batch, exported)
            for (typ, *_), j, k in zip(cols, which, ok.tolist()):
                done[j] = bool(k)
                if k:
                    continue
                if typ == 0:
                    _say_once(f"a {batch.schema.field(columns[j]).type} column with nulls", names[j], kind, "dense_floats")
                else:
                    _say_once(_NOT_PLAIN_TEXT, names[j], kind, "dense_floats")
        return done

    def _dense_runs(self) -> list[tuple[int, int, DenseFeature]]:
        """``(start, stop, first feature)`` of each run of consecutive dense features that share
        one transform (fill, clip, log1p, standardize, sign_log1p)."""
        if not self.one_pass:
            return [(j, j + 1, f) for j, f in enumerate(self.schema.dense)]
        if self._runs is None:
            runs: list[tuple[int, int, DenseFeature]] = []
            def same(f: DenseFeature, g: DenseFeature) -> bool:
                return (f.fill, f.clip, f.log1p, f.standardize, f.sign_log1p) == (g.fill, g.clip, g.log1p, g.standardize, g.sign_log1p)
            for j, f in enumerate(self.schema.dense):
                if runs and same(runs[-1][2], f):
                    runs[-1] = (runs[-1][0], j + 1, runs[-1][2])
                else:
                    runs.append((j, j + 1, f))
            self._runs = runs
        return self._runs

    def _plan(self, schema: pa.Schema) -> list[_Native]:
        """The sparse features that ``_native.featurize_ids`` takes for batches of ``schema``:
        one value per row (no separator), no weights, a plain integer column, a string or binary
        one that is hashed, or a string one of integer IDs (``hash_ids: false``; a block whose
        column holds a value that is no plain ID is declined, and that column goes through
        ``_sparse``). The others go through ``_sparse`` (logged once per reason)."""
        if self._planned is not None and self._planned[0].equals(schema):
            return self._planned[1]
        plan = []
        for i, f in enumerate(self.schema.sparse):
            t = schema.field(f.source_column).type
            listed = self.schema.missing_values_of(f)
            width = _OFFSET_WIDTH.get(t.id)
            reason = None
            if f.separator is not None or f.weight_column is not None:
                reason = "a separator or a weight column (several values a row)"
            elif len(listed) > _MAX_LISTED:
                reason = f"more than {_MAX_LISTED} missing_values"
            elif width is not None and not f.hash_ids and not (pa.types.is_string(t) or pa.types.is_large_string(t)):
                reason = f"IDs in a {t} column with hash_ids: false (a SchemaError, raised column by column)"
            elif width is None and not pa.types.is_integer(t):
                reason = f"a column of type {t} (not an integer, string or binary one)"
            elif width is None and not f.hash_ids and t.bit_width == 64 and not pa.types.is_signed_integer(t):
                reason = "uint64 IDs with hash_ids: false (parse_ints' int64 cast decides)"
            if reason is not None:
                _say_once(reason, f.name)
                continue
            if width is not None:  # hashed strings (1), or integer IDs as text (2)
                plan.append(_Native(i, f.source_column, 1 if f.hash_ids else 2, width, True, f.hash_ids,
                                    int(salt_key(f.salt_value)) if f.hash_ids else 0, tuple(v.encode("utf-8") for v in listed)))
            else:  # is_listed's integers: the listed values that are integers within the column's type
                info = np.iinfo(t.to_pandas_dtype())
                ints = tuple(int(v) & (2**64 - 1) for v in listed
                             if re.fullmatch(INTEGER, v.strip()) and info.min <= int(v) <= info.max)
                plan.append(_Native(i, f.source_column, 0, t.bit_width // 8, pa.types.is_signed_integer(t), f.hash_ids,
                                    int(salt_key(f.salt_value)) if f.hash_ids else 0, ints))
        if plan and not _native.is_available():
            _say_once("the native core is not loaded (EMBER_NATIVE=0 or not built): featurize_ids runs its numpy fallback",
                      self.schema.sparse[plan[0].index].name)
        children = [schema.get_field_index(p.column) for p in plan]
        self._planned = (schema, plan)
        self._children = None if -1 in children else [  # the columns by position: one native call reads them all
            (p.kind, k, p.width, p.signed, p.hashed, p.salt, p.listed) for p, k in zip(plan, children)]
        self._float_plans = {}
        return plan

    def _native_sparse(self, batch: pa.RecordBatch, values: list, offsets: list,
                       exported: tuple[object, object] | None = None) -> tuple[np.ndarray, np.ndarray] | None:
        """The planned features' values and offsets from one ``featurize_ids`` call that reads
        their columns from the batch in place (``_plan`` has seen this batch's schema), filled
        into ``values`` / ``offsets``; returns ``(values, lengths)`` of all features, laid out as
        ``SparseFeatures`` takes them, when the call made every feature, else None. None, and
        every feature column by column, when the batch cannot be read by position (a column
        named twice)."""
        plan = self._planned[1] if self.one_pass and self._planned is not None else []
        if not plan or not isinstance(batch, pa.RecordBatch) or self._children is None:
            return None
        n, c = batch.num_rows, len(plan)
        out = _empty(c * n, np.int64)
        lengths = _empty(c * n, np.int64)
        offs = _empty(c * (n + 1), np.int64).reshape(c, n + 1)
        counts = np.empty(c, np.int64)
        total = _native.featurize_ids(self._children, n, out, lengths, offs, counts, batch, exported)  # in place, in C
        start, declined = 0, False
        for j, (p, k) in enumerate(zip(plan, counts.tolist())):
            if k < 0:  # a value that is no plain integer ID: parse_ints judges it (and names bad rows)
                _say_once("integer IDs as text with a value that is not one (blanks, signs, text, a bad ID): that "
                          "block's column", self.schema.sparse[p.index].name)
                declined = True
                continue
            values[p.index] = out[start : start + k]
            offsets[p.index] = offs[j]
            start += k
        if c == len(self.schema.sparse) and not declined:
            return out[:total], lengths
        return None

    def _sparse(
        self, f: SparseFeature, batch: pa.RecordBatch, checks: _Checks, file: str
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        col = f.source_column
        flat, lengths, single = _jagged(batch.column(col), f.separator)
        if isinstance(flat, pa.ChunkedArray):
            flat = flat.combine_chunks()
        # one value per row: element i is row i (no element -> row map to build), and a row's
        # length is whether its value is kept (the same result as the general path, less work);
        # the map is built only for what needs it (bad values, weights)
        n = batch.num_rows
        def elem_row() -> np.ndarray:
            return np.arange(n) if single else np.repeat(np.arange(n), lengths)

        is_str = pa.types.is_string(flat.type) or pa.types.is_large_string(flat.type)
        if f.hash_ids:
            try:
                ids, valid = hash_array(flat, f.salt_value)
            except TypeError as e:
                raise SchemaError(f"{file}: sparse feature '{f.name}' (column '{col}'): {e}") from None
            if is_str and f.separator is not None:  # an empty token ("a||b", "a|", "") is no value
                valid &= np.asarray(pc.fill_null(pc.not_equal(flat, ""), False), dtype=bool)
            try:
                valid &= ~is_listed(flat, self.schema.missing_values_of(f))
            except TypeError as e:
                raise _type_error(file, f"sparse feature '{f.name}'", col, e) from None
        else:
            try:
                ids, missing, bad = parse_ints(flat)
            except TypeError as e:
                raise SchemaError(f"{file}: sparse feature '{f.name}' (column '{col}', hash_ids: false): {e}") from None
            missing |= is_listed(flat, self.schema.missing_values_of(f))
            bad &= ~missing
            if bad.any():
                wide = np.zeros_like(bad)  # the bad values that are integers, only past int64
                for i in np.flatnonzero(bad):
                    wide[i] = re.fullmatch(r"-?\d+", str(flat[int(i)].as_py()).strip()) is not None
                for mask, problem in ((bad & ~wide, "not an integer ID"),
                                      (wide, "an integer ID outside the int64 range (hash_ids: true takes IDs of any "
                                             "length)")):
                    checks.add(col, problem, mask if single else np.bincount(elem_row()[mask], minlength=n) > 0)
            valid = ~missing & ~bad

        w = None
        if f.weight_column is not None:
            rows_of = elem_row()
            wflat, wlen, _ = _jagged(batch.column(f.weight_column), f.separator)
            if isinstance(wflat, pa.ChunkedArray):
                wflat = wflat.combine_chunks()
            mismatch = wlen != lengths
            checks.add(f.weight_column, f"weights do not match the values of '{col}'", mismatch)
            if mismatch.any():  # those rows are dropped or raise; give them no values
                valid &= ~mismatch[rows_of]
                wflat = wflat.filter(pa.array(~mismatch[np.repeat(np.arange(len(wlen)), wlen)]))
            try:
                wx, wmissing, wbad = parse_floats(wflat)
            except TypeError as e:
                raise _type_error(file, f"weight column of sparse feature '{f.name}'", f.weight_column, e) from None
            checks.add(f.weight_column, "weight is not a number",
                       np.bincount(rows_of[~mismatch[rows_of]][wbad], minlength=batch.num_rows) > 0)
            w = np.where(wmissing | wbad, 1.0, wx).astype(np.float32)  # a missing weight counts as 1
            if mismatch.any():
                full = np.ones(ids.size, np.float32)
                full[~mismatch[rows_of]] = w
                w = full

        if single and w is None and valid.all():  # every row one value: offsets 0..n
            return ids.astype(np.int64, copy=False), np.arange(n + 1, dtype=np.int64), None
        if single:
            new_len = valid.astype(np.int64)
        else:
            new_len = filter_jagged(lengths, valid)
        if not valid.all():
            ids = ids[valid]
            w = None if w is None else w[valid]
        if f.max_length is not None and new_len.size and new_len.max() > f.max_length:
            keep = truncate_jagged(new_len, f.max_length)
            ids = ids[keep]
            w = None if w is None else w[keep]
            new_len = np.minimum(new_len, f.max_length)
        off = np.zeros(new_len.size + 1, dtype=np.int64)
        np.cumsum(new_len, out=off[1:])
        return ids.astype(np.int64, copy=False), off, w
