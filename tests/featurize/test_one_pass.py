"""The featurizer's one-pass path (``_native.featurize_ids`` for the single-valued sparse columns,
one ``dense_transform`` per run of like dense features) gives bit-identical batches to the
column-by-column reference (``Featurizer.one_pass = False``) on fuzzed record batches: every
integer width, (large_)string and binary columns, nulls, empty strings, listed missing values,
sliced arrays, bad rows (raised or skipped) and features the one pass does not take. Runs on the
native core, and on its numpy fallback under EMBER_NATIVE=0."""

from __future__ import annotations

import logging

import numpy as np
import pyarrow as pa
import pytest

from ember import _native
from ember.errors import DataError
from ember.featurize.featurizer import Featurizer
from ember.featurize.schema import Schema
from ember import once
from ember.source.bad_rows import BadRowReport

INT_TYPES = [pa.int8(), pa.int16(), pa.int32(), pa.int64(), pa.uint8(), pa.uint16(), pa.uint32(), pa.uint64()]
STRING_TYPES = [pa.string(), pa.large_string(), pa.binary(), pa.large_binary()]
MISSING = ["", "-1", "0", "abc", "7", "18446744073709551615", " 3"]


def _ints(rng: np.random.Generator, typ: pa.DataType, n: int) -> pa.Array:
    info = np.iinfo(typ.to_pandas_dtype())
    small = rng.integers(-3, 10, n)  # hits the listed integers
    wide = rng.integers(max(info.min, -(2**63)), min(info.max, 2**63 - 1), n, endpoint=True, dtype=np.int64)
    vals = np.where(rng.random(n) < 0.5, small, wide)
    vals = np.clip(vals, info.min, min(info.max, 2**63 - 1)).astype(typ.to_pandas_dtype())
    if typ == pa.uint64():
        vals[rng.random(n) < 0.1] = info.max  # past int64
    return pa.array(vals, typ, mask=rng.random(n) < (0.15 if rng.random() < 0.5 else 0.0))  # (no nulls: no validity)


def _strings(rng: np.random.Generator, typ: pa.DataType, n: int) -> pa.Array:
    out: list[object] = []
    for _ in range(n):
        r = rng.random()
        if r < 0.12:
            out.append(None)
        elif r < 0.25:
            out.append("")
        elif r < 0.35:
            out.append(str(rng.choice(MISSING)))
        else:
            k = int(rng.choice([1, 7, 8, 9, 16, 17, 40]))
            out.append("".join(rng.choice(list("abc0123456789é"), size=k)))
    if pa.types.is_binary(typ) or pa.types.is_large_binary(typ):
        out = [v if v is None else str(v).encode() for v in out]
    return pa.array(out, typ)


def _numbers(rng: np.random.Generator, n: int, bad: bool) -> pa.Array:
    words = ["1", "0", "", "3", "12", "-2", "5.5", "nan"] + (["oops", "inf"] if bad else [])
    return pa.array([str(rng.choice(words)) for _ in range(n)])


def _case(seed: int, bad: bool) -> tuple[Schema, pa.RecordBatch]:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 300))
    cols: dict[str, pa.Array] = {"y": pa.array(rng.integers(0, 2, n).astype(str).tolist())}
    if bad:  # out of range, missing (empty, null) and decimal labels (the one pass declines "0.5" and "1.0")
        odd = ["2", "", None, "-1"] + (["0.5", "1.0"] if seed % 2 else [])
        cols["y"] = pa.array([v if rng.random() > 0.05 else odd[int(rng.integers(len(odd)))] for v in cols["y"].to_pylist()])
    elif seed % 3 == 1:  # labels as integers (Parquet): the one pass reads the column's buffer
        cols["y"] = pa.array(rng.integers(0, 2, n), pa.int8() if seed % 2 else pa.int64())
    sparse: list[dict] = []
    for k, typ in enumerate(INT_TYPES + STRING_TYPES):
        name = f"c{k}"
        is_int = pa.types.is_integer(typ)
        cols[name] = _ints(rng, typ, n) if is_int else _strings(rng, typ, n)
        f: dict = {"name": name}
        if is_int and typ != pa.uint64() and rng.random() < 0.5:  # uint64 IDs past int64: parse_ints raises
            f["hash_ids"] = False
        if rng.random() < 0.6:
            f["missing_values"] = [str(v) for v in rng.choice(MISSING, size=int(rng.integers(1, 4)), replace=False)]
        if rng.random() < 0.3:
            f["salt"] = f"s{k}"
        sparse.append(f)
    # features the one pass leaves to the column-by-column path
    cols["sep"] = pa.array(["a|b", "", None, "c||d"] * (n // 4) + ["x"] * (n % 4))
    sparse.append({"name": "sep", "separator": "|", "max_length": 1})
    words = ["", "-1", "007", "-0", "9223372036854775807", "-9223372036854775808"]
    if bad:  # no plain ID: the block's column goes column by column (a bad row, or what blanks say)
        words += [" 5", "+3", "9223372036854775808", "5-", "x1"]
    for k, typ in enumerate([pa.string(), pa.large_string()]):  # integer IDs as text (hash_ids: false)
        ids_text = [str(v) for v in rng.integers(-(2**40), 2**40, n)]
        cols[f"txt{k}"] = pa.array([str(rng.choice(words)) if rng.random() < 0.2 else v for v in ids_text], typ,
                                   mask=rng.random(n) < 0.1)
        sparse.append({"name": f"txt{k}", "hash_ids": False, **({"missing_values": ["-1", "x1"]} if k else {})})
    cols["dic"] = pa.array(rng.choice(["p", "q", ""], n)).dictionary_encode()
    sparse.append({"name": "dic"})
    dense = []
    for j in range(5):
        cols[f"d{j}"] = _numbers(rng, n, bad and j == 2) if j % 2 else _ints(rng, pa.int32(), n)
        if j == 4:  # an integer column without nulls (dense_floats), as Parquet's counts
            cols[f"d{j}"] = pa.array(rng.integers(-(2**62), 2**62, n) // rng.choice([1, 2**40], n), pa.int64())
        dense.append({"name": f"d{j}", "log1p": j < 3, "fill": float(j == 4), "clip": [None, 50] if j == 3 else None})
    for j in range(5, 8):  # counts as text: plain integers and empty fields (dense_floats), now and then not
        words = ["", "0", "-0", "-00", "7", "-3", "007", "123456789012345678", "9223372036854775807"]
        if rng.random() < 0.4:
            words += [str(rng.choice(["1.5", " 2", "+4", "99999999999999999999"] + (["x", "inf"] if bad else [])))]
        cols[f"d{j}"] = pa.array([str(rng.choice(words)) for _ in range(n)], pa.large_string() if j == 6 else pa.string(),
                                 mask=rng.random(n) < 0.1)
        dense.append({"name": f"d{j}", "log1p": j == 5, "sign_log1p": j == 6})
    schema = Schema.parse({"labels": ["y"], "dense": dense, "sparse": sparse})
    batch = pa.record_batch(cols)
    if rng.random() < 0.5 and n > 2:  # an offset into shared buffers, validity bits not byte-aligned
        a = int(rng.integers(1, n))
        batch = batch.slice(a, n - a)
    return schema, batch


def _both(schema: Schema, batch: pa.RecordBatch, policy: str = "error"):
    reference = Featurizer(schema, BadRowReport(policy))
    reference.one_pass = False
    fast = Featurizer(schema, BadRowReport(policy))
    return fast, reference


def _assert_same(a, b) -> None:
    assert a.dense.numpy().tobytes() == b.dense.numpy().tobytes()
    assert a.labels.numpy().tobytes() == b.labels.numpy().tobytes()
    assert a.sparse.keys == b.sparse.keys
    assert a.sparse.values.dtype == b.sparse.values.dtype and a.sparse.lengths.dtype == b.sparse.lengths.dtype
    np.testing.assert_array_equal(a.sparse.values.numpy(), b.sparse.values.numpy())
    np.testing.assert_array_equal(a.sparse.lengths.numpy(), b.sparse.lengths.numpy())
    assert (a.sparse.weights is None) == (b.sparse.weights is None)
    if a.sparse.weights is not None:
        assert a.sparse.weights.numpy().tobytes() == b.sparse.weights.numpy().tobytes()


@pytest.mark.parametrize("seed", range(12))
def test_one_pass_equals_the_column_by_column_reference(seed):
    schema, batch = _case(seed, bad=False)
    fast, reference = _both(schema, batch)
    rows, ref_rows = fast(batch), reference(batch)
    _assert_same(rows.to_batch(), ref_rows.to_batch())
    for v, o, rv, ro in zip(rows.values, rows.offsets, ref_rows.values, ref_rows.offsets):  # Rows' own layout too
        np.testing.assert_array_equal(v, rv)
        np.testing.assert_array_equal(o, ro)
    idx = np.random.default_rng(seed).permutation(len(rows))  # row operations on the packed rows
    _assert_same(rows.take(idx).to_batch(), ref_rows.take(idx).to_batch())
    _assert_same(rows.slice(1, 5).to_batch(), ref_rows.slice(1, 5).to_batch())


@pytest.mark.parametrize("seed", range(6))
def test_bad_rows_skip_and_raise_alike(seed):
    schema, batch = _case(100 + seed, bad=True)
    fast, reference = _both(schema, batch, "skip")
    _assert_same(fast(batch).to_batch(), reference(batch).to_batch())
    assert fast.report.counts == reference.report.counts
    fast, reference = _both(schema, batch, "error")
    errors = []
    for f in (fast, reference):
        try:
            f(batch, "f.csv")
            errors.append(None)
        except DataError as e:
            errors.append(str(e))
    assert errors[0] == errors[1]


def test_all_single_valued_columns_pack_and_the_batch_takes_them_without_a_copy():
    schema = Schema.parse({"labels": ["y"], "sparse": [{"name": "a"}, {"name": "b", "hash_ids": False}],
                           "missing_values": ["", "-1"]})
    batch = pa.record_batch({"y": pa.array([1, 0, 1], pa.int8()), "a": pa.array(["x", "", None]),
                             "b": pa.array([5, -1, None], pa.int64())})
    rows = Featurizer(schema)(batch)
    assert rows.packed is not None
    b = rows.to_batch()
    assert b.sparse.lengths.tolist() == [1, 0, 0, 1, 0, 0] and b.sparse.values.tolist()[1:] == [5]
    assert b.sparse.values.numpy().ctypes.data == rows.packed[0].ctypes.data
    assert rows.take(np.array([0])).packed is None


def test_columns_the_one_pass_leaves_are_logged_once(caplog):
    once.forget("featurizer.column_by_column")
    schema = Schema.parse({"labels": ["y"], "sparse": [{"name": "t", "separator": "|"}, {"name": "u", "separator": ","}]})
    batch = pa.record_batch({"y": ["1"], "t": ["a|b"], "u": ["c"]})
    with caplog.at_level(logging.INFO, logger="ember"):
        Featurizer(schema)(batch)
        Featurizer(schema)(batch)
    said = [r.getMessage() for r in caplog.records if "column by column" in r.getMessage()]
    assert len(said) == 1 and "'t'" in said[0] and "separator" in said[0]


def hashed_strings(typ: pa.DataType, rng: np.random.Generator) -> bool:
    """A string column hashed (kind 1), or read as integer IDs (kind 2, string types only)."""
    return pa.types.is_binary(typ) or pa.types.is_large_binary(typ) or bool(rng.random() < 0.5)


def _fuzz_columns(rng: np.random.Generator, n: int) -> list[tuple]:
    cols = []
    for typ in INT_TYPES + STRING_TYPES:
        arr = _ints(rng, typ, n + 3) if pa.types.is_integer(typ) else _strings(rng, typ, n + 3)
        arr = arr.slice(3)
        bufs = arr.buffers()
        validity = bufs[0] if bufs[0] is not None and arr.null_count else b""
        hashed = not pa.types.is_integer(typ) or bool(rng.random() < 0.5)
        if not pa.types.is_integer(typ) and not hashed_strings(typ, rng):
            words = ["", "12", "-3", "007", "-0", "9223372036854775807", "-9223372036854775808", "-1", " 4", "5-"]
            if rng.random() < 0.5:  # no ID: the column is declined (but a listed one is missing)
                words += ["99999999999999999999", "9223372036854775808", "-", "+1", "1 "]
            words += ["".join(rng.choice(list("0123456789"), size=int(k))) for k in rng.integers(1, 21, 8)]
            words += ["-" + "".join(rng.choice(list("0123456789"), size=int(k))) for k in rng.integers(1, 21, 4)]
            texts = [None if rng.random() < 0.1 else str(rng.choice(words)) for _ in range(n + 3)]
            arr = pa.array(texts, pa.large_string() if pa.types.is_large_string(typ) else pa.string()).slice(3)
            bufs = arr.buffers()
            cols.append((2, bufs[1], bufs[2] if bufs[2] is not None else b"", bufs[0] if arr.null_count else b"",
                         arr.offset, 8 if pa.types.is_large_string(typ) else 4, True, False, 0,
                         (b" 4", b"5-", b"-1")[: int(rng.integers(0, 4))]))
        elif pa.types.is_integer(typ):
            listed = tuple(int(v) & (2**64 - 1) for v in rng.integers(-2, 8, int(rng.choice([0, 3]))))  # (none: the tight loop)
            cols.append((0, bufs[1], b"", validity, arr.offset, typ.bit_width // 8, pa.types.is_signed_integer(typ),
                         hashed, int(rng.integers(0, 2**63)), listed))
        else:
            listed = tuple(str(v).encode() for v in rng.choice(MISSING, 2, replace=False))
            cols.append((1, bufs[1], bufs[2] if bufs[2] is not None else b"", validity, arr.offset,
                         8 if pa.types.is_large_string(typ) or pa.types.is_large_binary(typ) else 4, True, True,
                         int(rng.integers(0, 2**63)), listed))
    return cols


@pytest.mark.skipif(not _native.is_available(), reason="needs the native core")
@pytest.mark.parametrize("seed", range(10))
def test_native_featurize_ids_equals_its_fallback(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(0, 200))
    cols = _fuzz_columns(rng, n)
    outs = []
    for fn in (_native.featurize_ids, _native._featurize_ids_py):
        c = len(cols)
        out = np.full(c * n, -7, np.int64)
        lengths, offs, counts = np.empty(c * n, np.int64), np.empty((c, n + 1), np.int64), np.empty(c, np.int64)
        total = fn(cols, n, out, lengths, offs, counts)
        outs.append((total, out[:total].copy(), lengths, offs, counts))
    (t1, v1, l1, o1, c1), (t2, v2, l2, o2, c2) = outs
    np.testing.assert_array_equal(c1, c2)
    assert t1 == t2 == int(c1[c1 >= 0].sum())
    np.testing.assert_array_equal(v1, v2)
    done = np.flatnonzero(c1 >= 0)  # a declined column's lengths and offsets are undefined
    np.testing.assert_array_equal(l1.reshape(len(cols), n)[done], l2.reshape(len(cols), n)[done])
    np.testing.assert_array_equal(o1[done], o2[done])


def _fuzz_batch(rng: np.random.Generator, n: int) -> tuple[pa.RecordBatch, list[tuple], list[tuple]]:
    """A record batch of every integer width, (large_)string and binary columns, integer IDs as
    text, nulls, sliced by 3 rows (children with offsets); its columns as featurize_ids takes
    them by buffers and by position."""
    arrays, by_buffers, by_child = {}, [], []
    for k, typ in enumerate(INT_TYPES + STRING_TYPES + [pa.string(), pa.large_string()]):
        text_ids = k >= len(INT_TYPES + STRING_TYPES)
        if text_ids:
            words = ["", "12", "-3", "007", "-0", "9223372036854775807"] + (["x1"] if rng.random() < 0.3 else [])
            arr = pa.array([None if rng.random() < 0.1 else str(rng.choice(words)) for _ in range(n + 3)], typ)
        else:
            arr = _ints(rng, typ, n + 3) if pa.types.is_integer(typ) else _strings(rng, typ, n + 3)
        arrays[f"c{k}"] = arr
    batch = pa.record_batch(arrays).slice(3)
    for k, (name, typ) in enumerate(zip(batch.schema.names, batch.schema.types)):
        arr = batch.column(k)
        bufs = arr.buffers()
        validity = bufs[0] if bufs[0] is not None and arr.null_count else b""
        kind = 0 if pa.types.is_integer(typ) else 2 if k >= len(INT_TYPES + STRING_TYPES) else 1
        width = typ.bit_width // 8 if kind == 0 else 8 if typ in (pa.large_string(), pa.large_binary()) else 4
        signed = pa.types.is_signed_integer(typ) if kind == 0 else True
        hashed = kind == 1 or (kind == 0 and bool(rng.random() < 0.5))
        salt = int(rng.integers(0, 2**63)) if hashed else 0
        listed = (tuple(int(v) & (2**64 - 1) for v in rng.integers(-2, 8, int(rng.choice([0, 3])))) if kind == 0
                  else (b"-3", b"") if kind == 2 else (b"7",))
        data = (bufs[2] if bufs[2] is not None else b"") if kind else b""
        by_buffers.append((kind, bufs[1], data, validity, arr.offset, width, signed, hashed, salt, listed))
        by_child.append((kind, k, width, signed, hashed, salt, listed))
    return batch, by_buffers, by_child


@pytest.mark.parametrize("seed", range(8))
def test_featurize_ids_reads_a_batchs_columns_in_place_as_its_buffers(seed):
    """The columns named by position in a record batch (the Arrow C data interface: its buffers
    read in place) give what the same columns passed as buffers give; natively and in the
    fallback (which takes the batch's buffers itself)."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(0, 150))
    batch, by_buffers, by_child = _fuzz_batch(rng, n)
    outs = []
    calls = [(_native._featurize_ids_py, by_buffers, {})] if not _native.is_available() else [
        (_native.featurize_ids, by_buffers, {}), (_native._featurize_ids_py, by_buffers, {})]
    calls += [(_native.featurize_ids, by_child, {"batch": batch}),
              (_native.featurize_ids, by_child, {"batch": batch, "exported": batch.__arrow_c_array__()})]
    for fn, cols, kw in calls:
        c = len(cols)
        out = np.full(c * n, -7, np.int64)
        lengths, offs, counts = np.empty(c * n, np.int64), np.empty((c, n + 1), np.int64), np.empty(c, np.int64)
        total = fn(cols, n, out, lengths, offs, counts, **kw)
        done = np.flatnonzero(counts >= 0)
        outs.append((total, out[:total].tolist(), counts.tolist(), lengths.reshape(c, n)[done].tolist(), offs[done].tolist()))
    assert all(o == outs[0] for o in outs[1:])


@pytest.mark.parametrize("seed", range(4))
def test_dense_floats_reads_a_batchs_columns_in_place_as_its_buffers(seed):
    """dense_floats by position in a batch: the same rows as by buffers, but an integer column
    with nulls is not done (Arrow's cast decides those)."""
    rng = np.random.default_rng(50 + seed)
    n = int(rng.integers(1, 150))
    cols = {f"i{k}": _ints(rng, t, n + 2) for k, t in enumerate(INT_TYPES)}
    cols["t"] = pa.array([str(rng.choice(["", "0", "-0", "7", "-3", "123456789012345678"])) for _ in range(n + 2)],
                         mask=rng.random(n + 2) < 0.1)
    cols["u"] = pa.array([str(rng.choice(["1", "2.5"])) for _ in range(n + 2)], pa.large_string())
    batch = pa.record_batch(cols).slice(2)
    by_buffers, by_child = [], []
    for k, typ in enumerate(batch.schema.types):
        arr = batch.column(k)
        bufs = arr.buffers()
        kind = 0 if pa.types.is_integer(typ) else 1
        width = typ.bit_width // 8 if kind == 0 else 8 if typ == pa.large_string() else 4
        validity = bufs[0] if bufs[0] is not None and arr.null_count else b""
        by_buffers.append((kind, bufs[1], bufs[2] if kind else b"", validity, arr.offset, width,
                           pa.types.is_signed_integer(typ) if kind == 0 else True, k))
        by_child.append((kind, k, width, pa.types.is_signed_integer(typ) if kind == 0 else True, k))
    rows = len(by_child)
    ref, ref_done = np.full((rows, n), 5.0), np.empty(rows, np.uint8)
    _native.dense_floats(by_buffers, n, ref, ref_done)
    nulls = [pa.types.is_integer(t) and batch.column(k).null_count > 0 for k, t in enumerate(batch.schema.types)]
    for kw in ({"batch": batch}, {"batch": batch, "exported": batch.__arrow_c_array__()}):
        for fn in (_native.dense_floats,):
            out, done = np.full((rows, n), 5.0), np.empty(rows, np.uint8)
            assert fn(by_child, n, out, done, **kw) == int(done.sum())
            assert done.tolist() == [0 if z else int(d) for z, d in zip(nulls, ref_done)]
            for r in np.flatnonzero(done):
                assert out[r].tobytes() == ref[r].tobytes()


@pytest.mark.skipif(not _native.is_available(), reason="needs the native core")
def test_a_sliced_struct_exports_its_offset_to_its_columns():
    """An exported struct array with an offset of its own (the C data interface applies it to
    the children): the columns read from the struct's rows, not from its children's first."""
    rng = np.random.default_rng(7)
    batch, by_buffers, by_child = _fuzz_batch(rng, 40)
    struct = pa.StructArray.from_arrays(batch.columns, names=batch.schema.names).slice(5, 30)
    exported = struct.__arrow_c_array__()
    sliced = batch.slice(5, 30)
    outs = []
    for cols, kw in ((by_child, {"batch": sliced}), (by_child, {"batch": sliced, "exported": exported})):
        c = len(cols)
        out, lengths = np.full(c * 30, -7, np.int64), np.empty(c * 30, np.int64)
        offs, counts = np.empty((c, 31), np.int64), np.empty(c, np.int64)
        total = _native.featurize_ids(cols, 30, out, lengths, offs, counts, **kw)
        outs.append((total, out[:total].tolist(), counts.tolist()))
    assert outs[0] == outs[1]


def test_a_batchs_column_of_another_type_is_refused():
    batch = pa.record_batch({"a": pa.array([1, 2], pa.int32()), "s": pa.array(["x", "y"])})
    out, lengths, offs, counts = np.empty(2, np.int64), np.empty(2, np.int64), np.empty((1, 3), np.int64), np.empty(1, np.int64)
    if _native.is_available():
        for col in [(0, 0, 8, True, False, 0, ()), (0, 0, 4, False, False, 0, ()), (2, 1, 8, True, False, 0, ()),
                    (0, 5, 4, True, False, 0, ())]:
            with pytest.raises(ValueError, match="column"):
                _native.featurize_ids([col], 2, out, lengths, offs, counts, batch)
    with pytest.raises(ValueError, match="record batch of 3 rows"):
        _native.featurize_ids([(0, 0, 4, True, False, 0, ())], 3, np.empty(3, np.int64), np.empty(3, np.int64),
                              np.empty((1, 4), np.int64), np.empty(1, np.int64), batch)


@pytest.mark.skipif(not _native.is_available(), reason="needs the native core")
def test_native_featurize_ids_refuses_offsets_past_the_data():
    offsets = np.array([0, 2, 50], np.int32)
    col = (1, offsets.tobytes(), b"abcd", b"", 0, 4, True, True, 1, ())
    out, lengths, offs, counts = np.empty(2, np.int64), np.empty(2, np.int64), np.empty((1, 3), np.int64), np.empty(1, np.int64)
    with pytest.raises(ValueError, match="out of the data's range"):
        _native.featurize_ids([col], 2, out, lengths, offs, counts)
    with pytest.raises(ValueError, match="kind 0"):
        _native.featurize_ids([(1, offsets.tobytes(), b"abcd", b"", 0, 4, True, False, 1, ())], 2, out, lengths, offs, counts)


def _dense_columns(rng: np.random.Generator, n: int) -> list[tuple]:
    cols = []
    for row in range(6):
        words = ["", "0", "-0", "-000", "12", "-7", "0042", "9223372036854775807", "-9223372036854775808",
                 "123456789012345678"]
        if row % 2:
            words += [str(rng.choice(["1.5", " 3", "9223372036854775808", "-", "5-", "nan"]))]
        typ = pa.large_string() if row == 3 else pa.string()
        arr = pa.array([str(rng.choice(words)) for _ in range(n + 2)], typ, mask=rng.random(n + 2) < 0.1).slice(2)
        b = arr.buffers()
        cols.append((1, b[1], b[2] if b[2] is not None else b"", b[0] if arr.null_count else b"", arr.offset,
                     8 if typ == pa.large_string() else 4, True, 5 - row))
    for row, typ in enumerate(INT_TYPES):
        ints = _ints(rng, typ, n + 1).slice(1)
        b = ints.buffers()
        cols.append((0, b[1], b"", b[0] if ints.null_count else b"", ints.offset, typ.bit_width // 8,
                     pa.types.is_signed_integer(typ), 6 + row))
    return cols


@pytest.mark.skipif(not _native.is_available(), reason="needs the native core")
@pytest.mark.parametrize("seed", range(6))
def test_native_dense_floats_equals_its_fallback(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(0, 200))
    cols = _dense_columns(rng, n)
    outs = []
    for fn in (_native.dense_floats, _native._dense_floats_py):
        out, done = np.full((6 + len(INT_TYPES), n), 3.0), np.empty(len(cols), np.uint8)
        outs.append((fn(cols, n, out, done), out, done))
    (c1, o1, d1), (c2, o2, d2) = outs
    assert c1 == c2 and d1.tolist() == d2.tolist()
    rows = [c[7] for c, d in zip(cols, d1) if d]
    assert o1[rows].tobytes() == o2[rows].tobytes()  # -0.0 and NaN bit for bit


def test_a_batch_of_no_rows():
    schema, batch = _case(7, bad=False)
    fast, reference = _both(schema, batch.slice(0, 0))
    _assert_same(fast(batch.slice(0, 0)).to_batch(), reference(batch.slice(0, 0)).to_batch())
