"""Canonical input values: what a value given at scoring time (a JSON number, a CSV field, a
Parquet cell) is for the column it feeds, so that it hashes to the ID it had in training.

The featurizer hashes an ID by its arrow type: the integer 4 and the string ``"4"`` are two
different IDs (:mod:`ember.featurize.hashing`). Training sees one type per column (every CSV
column is text; a Parquet / ORC column has its stored type), and an export records it
(:func:`training_types`). At scoring time every value is brought to that type first
(:func:`canonicalize`), whatever format it came in, so the same row scores the same from JSON,
CSV, Parquet or ORC.

Column types:

- ``"int"``: integer IDs (a Parquet / ORC integer column; any ``hash_ids: false`` column), hashed
  as int64. ``4``, ``4.0``, ``"4"`` and ``" 4 "`` are all the ID 4; text is read as training reads
  a file's text (decimal digits: ``"4.0"``, ``"+4"``, ``"NaN"`` are errors there and here). A
  non-integral number (``4.5``), a float beyond 2**53 (no longer exactly one integer: send such
  IDs as integers or strings) or an integer outside int64 is an error.
- ``"string"``: text IDs (every CSV column; a Parquet / ORC string column), hashed as UTF-8. A
  string is the ID as it is (``"4.0"`` and ``"4"`` differ, as they do in a CSV file). A number
  becomes the text a CSV file holds for it: an integer (or an integral float up to 2**53) its
  decimal digits (``4`` and ``4.0`` are both ``"4"``); another float its shortest round-trip
  decimal (Python's ``repr``: ``4.5`` is ``"4.5"``).
- ``"bool"``: a boolean column (hashed as 0 / 1): only booleans.
- ``"float"``: numbers (dense features, labels, teacher scores, weights): a number, or a string
  the CSV reader reads as one (``"2.5"``, ``"nan"`` is missing); not infinite.
- ``"list<int>"``, ``"list<string>"``, ``"list<bool>"``, ``"list<float>"``: a list column
  (multi-hot from Parquet / ORC): a list of values of that type.
- ``"unknown"``: an export made before types were recorded, trained on Parquet / ORC files no
  longer readable: values are read as before (file values as stored, JSON values as text).

Everywhere: null is a missing value, and so is an absent key of a JSON row (as a null in a
training file: an empty bag for a sparse feature, ``fill`` for a dense one); a string the schema
lists in ``missing_values`` is missing too. A boolean, list or object where a scalar belongs,
and a JSON key the schema does not read (did-you-mean), are errors (:class:`BadValue`).

Example:
    >>> [canonical_value(v, "int") for v in (4, 4.0, "4", " 4 ", None)]
    [4, 4, 4, 4, None]
    >>> [canonical_value(v, "string") for v in (4, 4.0, "4.0", 4.5)]
    ['4', '4', '4.0', '4.5']
    >>> canonical_value(4.5, "int")
    Traceback (most recent call last):
    ...
    ValueError: 4.5 is not an integer, and this column holds integer IDs
"""

from __future__ import annotations

import difflib
from typing import Any, Mapping, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ember.errors import DataError
from ember.featurize.schema import Schema
from ember.featurize.transforms import parse_ints
from ember.portable.values import canonical_value, shown  # the one definition: the portable runtime scores with it too

__all__ = ["BadValue", "canonical_value", "canonical_array", "canonicalize", "column_roles", "training_types",
           "hashed_id_types", "type_in", "COLUMN_TYPES"]

COLUMN_TYPES = ("int", "string", "bool", "float", "list<int>", "list<string>", "list<bool>", "list<float>", "unknown")

_ARROW = {"int": pa.int64(), "string": pa.string(), "bool": pa.bool_(), "float": pa.float64()}


class BadValue(DataError):
    """A value that cannot be brought to its column's training type: names where (file and
    1-based row, or a request's 0-based row index), the column and the reason."""

    def __init__(self, message: str, row: int, column: str, reason: str) -> None:
        super().__init__(message)
        self.row, self.column, self.reason = row, column, reason


def _is_text(t: pa.DataType) -> bool:
    return pa.types.is_string(t) or pa.types.is_large_string(t)


def canonical_array(arr: pa.Array, type: str, missing: Sequence[str] = (), separator: str | None = None
                    ) -> tuple[pa.Array, np.ndarray, dict[int, str]]:
    """``arr`` (a file's column) as a column of ``type``: ``(array, bad mask, {row: reason})``.

    The vectorised form of :func:`canonical_value`: arrays already of the type pass as they
    are, integers go to text by their digits, decimal strings to integers by one cast; every
    other element goes through :func:`canonical_value` itself, so the rule is stated once.
    """
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    if pa.types.is_dictionary(arr.type):
        arr = arr.cast(arr.type.value_type)
    if type.startswith("list<") and separator is not None and _is_text(arr.type):  # joined lists (CSV)
        arr = pc.split_pattern(arr, separator)
    n, t = len(arr), arr.type
    none: dict[int, str] = {}
    ok = np.zeros(n, bool)
    if type == "unknown":
        return arr, ok, none
    if type == "float" and (pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_decimal(t)
                            or pa.types.is_boolean(t) or _is_text(t)):
        return arr, ok, none  # the featurizer's number parser reads these exactly as in training
    if type == "int" and pa.types.is_integer(t) and t != pa.uint64():
        return arr.cast(pa.int64()), ok, none
    if type == "string" and (_is_text(t) or pa.types.is_binary(t) or pa.types.is_large_binary(t)):
        return arr, ok, none
    if type == "string" and pa.types.is_integer(t) and t != pa.uint64():
        return arr.cast(pa.string()), ok, none  # arrow's digits are str(int)'s
    if type == "bool" and pa.types.is_boolean(t):
        return arr, ok, none
    if type == "int" and _is_text(t):
        ids, miss, bad = parse_ints(arr)  # decimal integers in one cast; the rest, if any, one by one below
        if not bad.any():
            return pa.array(ids, pa.int64(), mask=miss), ok, none
    if type.startswith("list<") and (pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t)):
        flat, bad_e, why = canonical_array(arr.flatten(), type[5:-1], missing)  # flatten: this slice's non-null lists
        lengths = pc.fill_null(pc.list_value_length(arr), 0).to_numpy(zero_copy_only=False).astype(np.int64)
        off = np.zeros(n + 1, np.int64)
        np.cumsum(lengths, out=off[1:])
        bad, reasons = np.zeros(n, bool), {}
        for e in np.flatnonzero(bad_e)[::-1]:  # the first bad element of each row gives its reason
            r = int(np.searchsorted(off, e, side="right") - 1)
            bad[r], reasons[r] = True, why[int(e)]
        mask = arr.is_null() if arr.null_count else None
        return pa.ListArray.from_arrays(pa.array(off, pa.int32()), flat, mask=mask), bad, reasons
    values, bad, reasons = [], np.zeros(n, bool), {}
    for i, v in enumerate(arr.to_pylist()):
        try:
            values.append(canonical_value(v, type, missing, separator))
        except ValueError as e:
            values.append(None)
            bad[i] = True
            reasons[i] = str(e)
    return _to_arrow(values, type), bad, reasons


def _to_arrow(values: list[Any], type: str) -> pa.Array:
    if type.startswith("list<"):
        return pa.array(values, pa.list_(_ARROW[type[5:-1]]))
    return pa.array(values, _ARROW.get(type, pa.string()))


def column_roles(schema: Schema) -> dict[str, str]:
    """Each column the schema reads and its role: ``sparse``, ``dense``, ``weight``, ``label``
    or ``teacher`` (a column in two roles: the first of these)."""
    roles: dict[str, str] = {}
    for col, role in [*((s.source_column, "sparse") for s in schema.sparse), *((d.source_column, "dense") for d in schema.dense),
                      *((s.weight_column, "weight") for s in schema.sparse if s.weight_column),
                      *((c, "label") for c in schema.labels), *((c, "teacher") for c in schema.teacher)]:
        roles.setdefault(col, role)
    return roles


def _type_of(schema: Schema, column: str, role: str, t: pa.DataType | None) -> str:
    """The canonical type of ``column`` read as arrow type ``t`` in training (None: not known)."""
    feature = next((s for s in schema.sparse if s.source_column == column), None) if role == "sparse" else None
    if t is not None and pa.types.is_dictionary(t):
        t = t.value_type
    listed = t is not None and (pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t))
    elem = t.value_type if listed else t  # type: ignore[union-attr]  # listed: a list type
    if feature is None:  # dense, weight, label, teacher: numbers
        return "list<float>" if listed else "float"
    if not feature.hash_ids:  # IDs parsed as integers (joined ones split first)
        return "list<int>" if listed else "string" if feature.separator is not None and (elem is None or _is_text(elem)) else "int"
    if elem is None:
        return "unknown"
    base = ("int" if pa.types.is_integer(elem) else "bool" if pa.types.is_boolean(elem)
            else "string" if _is_text(elem) or pa.types.is_binary(elem) or pa.types.is_large_binary(elem) else "unknown")
    return f"list<{base}>" if listed and base != "unknown" else base


def training_types(schema: Schema, data: Mapping[str, Any], read_files: bool = True) -> tuple[dict[str, dict[str, str]], str]:
    """``({column: {"role", "type"}}, how they were found)`` of the columns ``schema`` reads,
    as the training data ``data`` (a data config as JSON) gave them to the featurizer: text for
    CSV / TSV, the generator's types for synthetic data, the first training file's stored types
    for Parquet / ORC (``read_files``; when False or unreadable, hashed ID columns are
    ``"unknown"``).

    Example:
        >>> s = Schema.parse({"labels": ["y"], "dense": [{"name": "n"}], "sparse": [{"name": "c"}]})
        >>> training_types(s, {"format": "csv"})[0]["c"]
        {'role': 'sparse', 'type': 'string'}
    """
    roles = column_roles(schema)
    fmt = data.get("format")
    arrow: dict[str, pa.DataType] = {}
    if fmt in ("csv", "tsv"):
        arrow = {c: pa.string() for c in roles}
        how = f"{fmt} training data (every column is text)"
    elif fmt == "synthetic":
        from ember.source.config import SyntheticOptions
        from ember.source.synthetic import synthetic_records

        sample = synthetic_records(SyntheticOptions.model_validate(data.get("synthetic") or {}), "train", 0, 1)
        arrow = {c: sample.schema.field(c).type for c in roles if c in sample.schema.names}
        how = "the synthetic generator's columns"
    else:
        how = f"{fmt} training data: stored types unknown"
        if read_files:
            first, arrow = _stored_types(data, fmt)
            how = f"the stored types of {first}" if first else f"{how} (no training file could be read)"
    return {c: {"role": r, "type": _type_of(schema, c, r, arrow.get(c))} for c, r in roles.items()}, how


def hashed_id_types(schema: Schema, data: Any) -> tuple[dict[str, str], str | None]:
    """``({column: type}, first file)``: the type each hashed ID column has in the first training
    file of ``data`` (a DataConfig), for the featurizer to bring every other file's IDs to it as
    serving does (the integer 4 and the text "4" are one ID, as ``predict`` and ``serve`` score
    them). Parquet / ORC only: CSV is text throughout, a query or generator has one type; ``{}``
    when the first file cannot be read (each file's IDs are then hashed as stored)."""
    if data.format not in ("parquet", "orc") or not data.train:
        return {}, None
    first, arrow = _stored_types({"train": data.train, "storage_options": data.storage_options}, data.format)
    hashed = {s.source_column for s in schema.sparse if s.hash_ids}
    types = {c: _type_of(schema, c, "sparse", t) for c, t in arrow.items() if c in hashed}
    return {c: t for c, t in types.items() if t in _BRINGABLE}, first


def type_in(schema: Schema, column: str, t: pa.DataType) -> str:
    """The canonical type of sparse ``column`` read as arrow type ``t`` (``training_types``' rule)."""
    return _type_of(schema, column, "sparse", t)


_BRINGABLE = ("int", "string", "bool", "list<int>", "list<string>", "list<bool>")  # types one file's IDs are brought to


def _stored_types(data: Mapping[str, Any], fmt: str | None) -> tuple[str | None, dict[str, pa.DataType]]:
    """The first training file's path and column types (Parquet / ORC footers), or (None, {})."""
    from ember.source import storage
    from ember.source.files import expand_paths

    train = data.get("train") or []
    train = [train] if isinstance(train, str) else list(train)[:1]  # the first file is the first path's first match
    try:
        given = data.get("storage_options")  # JSON (a recorded config), or a DataConfig's own (credentials kept)
        options = given if isinstance(given, storage.StorageOptions) else storage.StorageOptions.model_validate(given or {})
        files = expand_paths(train, str(fmt), options)
        if not files:
            return None, {}
        with storage.opened(files[0], options) as source:
            if fmt == "parquet":
                import pyarrow.parquet as pq

                schema = pq.read_schema(source)
            else:
                import pyarrow.orc as orc

                schema = orc.ORCFile(source).schema
    except (OSError, ValueError, pa.ArrowException):  # gone, moved or unreadable: the types stay unknown
        return None, {}
    return files[0], {f.name: f.type for f in schema}


def _did_you_mean(name: str, known: Sequence[str]) -> str:
    close = difflib.get_close_matches(name, known, n=1)
    return f"did you mean '{close[0]}'? " if close else ""


def canonicalize(data: pa.RecordBatch | Sequence[Mapping[str, Any]], schema: Schema, types: Mapping[str, str],
                 where: str = "<request>", first_row: int = 1, skip: Any = None,
                 passthrough: Sequence[str] = ()) -> pa.RecordBatch:
    """The columns ``schema`` reads, every value brought to its column's ``types`` entry, and
    a record batch's ``passthrough`` columns that the schema does not read, as they are (e.g.
    ``ember predict --keep``: an ID column to join the scores back on).

    ``data``: a file's record batch (row 0 is row ``first_row`` of file ``where``), or rows
    given as mappings of column -> value (e.g. parsed JSON; a request's rows are named by their
    0-based index). A value that cannot be brought raises :class:`BadValue` (the first bad row),
    or with ``skip`` (a BadRowReport in skip mode) the bad rows are dropped and counted.
    """
    cols = schema.columns
    missing = {s.source_column: schema.missing_values_of(s) for s in schema.sparse}
    separator = {s.source_column: s.separator for s in schema.sparse}
    if isinstance(data, pa.RecordBatch):
        out, bad_rows = {}, np.zeros(data.num_rows, bool)
        first: tuple[int, str, str] | None = None
        for c in cols:
            arr, bad, reasons = canonical_array(data.column(c), types.get(c, "unknown"), missing.get(c, ()),
                                                separator.get(c))
            out[c] = arr
            if bad.any():
                i = int(np.argmax(bad))
                if first is None or i < first[0]:
                    first = (i, c, reasons[i])
                if skip is not None:
                    skip.add(f"{c}: not a value of its training type ({types.get(c)})", int((bad & ~bad_rows).sum()))
                bad_rows |= bad
        if first is not None and skip is None:
            i, c, reason = first
            value = data.column(c)[i].as_py()
            raise BadValue(f"{where} row {first_row + i}, column '{c}': {reason} (got {shown(value)}); fix the file, or "
                           "set data.on_bad_rows=skip to count and skip such rows", first_row + i, c, reason)
        for c in passthrough:
            if c not in out:
                out[c] = data.column(c)
        batch = pa.record_batch(out)
        return batch.filter(pa.array(~bad_rows)) if bad_rows.any() else batch
    known = list(dict.fromkeys([*cols, *schema.labels, *schema.teacher]))
    known_set = set(known)
    values: dict[str, list[Any]] = {c: [] for c in cols}
    for i, row in enumerate(data):
        for k in row:
            if k not in known_set:
                reason = f"unknown column; {_did_you_mean(str(k), known)}the export reads {known}"
                raise BadValue(f"rows[{i}], column {shown(k)}: {reason}", i, str(k), reason)
        for c in cols:
            try:
                values[c].append(canonical_value(row.get(c), types.get(c, "unknown"), missing.get(c, ()),
                                                 separator.get(c)))
            except ValueError as e:
                raise BadValue(f"rows[{i}], column '{c}': {e} (got {shown(row.get(c))})", i, c, str(e)) from None
    return pa.record_batch({c: _to_arrow(v, types.get(c, "unknown")) for c, v in values.items()})
