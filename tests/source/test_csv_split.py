"""The native CSV splitter (``_native.csv_split`` / ``csv_gather``, taken by ``read_csv`` for
plain blocks: no quote, no CR, every line its fields) gives exactly pyarrow's text read: the same
record batches, the same featurized batches, the same bad-row errors and counts (blocks it
cannot split go to pyarrow, logged once). On the native core and on its numpy fallback."""

from __future__ import annotations

import logging

import numpy as np
import pyarrow as pa
import pytest

from ember import _native
from ember.errors import DataError
from ember.featurize.featurizer import Featurizer, read_types
from ember.featurize.schema import Schema
from ember.source import csv as csv_module
from ember.source.bad_rows import BadRowReport
from ember import once
from ember.source.csv import read_csv

NAMES = ["y", "n", "a", "b", "c", "d"]
FIELDS = ["", "0", "1", "-3", "12", "4.5", "x", "héllo", "a b", " 7", "9223372036854775807", "-0", "007", "nan",
          "\t", "€€€€€€€€€", "0123456789abcdefghij"]


def _text(rng: np.random.Generator, rows: int, sep: str, extra: str | None) -> str:
    lines = []
    for _ in range(rows):
        fields = [str(rng.choice([f for f in FIELDS if f != sep])) for _ in NAMES]
        fields[0] = str(int(rng.integers(0, 2)))
        line = sep.join(fields)
        if extra == "width" and rng.random() < 0.05:
            line += sep + "z"  # a line of the wrong width
        if extra == "quote" and rng.random() < 0.05:
            line = line.replace("x", '"x"', 1) if "x" in line else '"q"' + line[3:]
        if extra == "cr" and rng.random() < 0.2:
            line += "\r"  # a CRLF line end: split natively
        if extra == "lone_cr" and rng.random() < 0.02:
            line = line[:1] + "\r" + line[1:]  # a CR inside a line (pyarrow: a line end): left to pyarrow
        if extra == "empty" and rng.random() < 0.03:
            line = ""
        lines.append(line)
    return sep.join(NAMES) + "\n" + "\n".join(lines) + "\n"


def _chunks(path: str, columns: list[str], sep: str, split: bool, monkeypatch, policy: str = "skip",
            types: dict | None = None) -> tuple[list, dict]:
    monkeypatch.setattr(csv_module, "_SPLIT", split)
    report = BadRowReport(policy)  # type: ignore[arg-type]
    out = [(c.first_row, c.batch) for c in read_csv(path, columns, delimiter=sep, block_bytes=2048, report=report,
                                                     types=types)]
    return out, report.counts


@pytest.mark.parametrize("extra", [None, "width", "quote", "cr", "lone_cr", "empty"])
@pytest.mark.parametrize("sep", [",", "\t", "|"])
@pytest.mark.parametrize("seed", range(3))
def test_split_blocks_equal_pyarrows_text_read(tmp_path, monkeypatch, seed, sep, extra):
    rng = np.random.default_rng(seed)
    path = tmp_path / "d.csv"
    path.write_bytes(_text(rng, int(rng.integers(1, 400)), sep, extra).encode("utf-8"))
    columns = [str(c) for c in rng.permutation(NAMES)[: int(rng.integers(1, len(NAMES) + 1))]]
    fast, fast_counts = _chunks(str(path), columns, sep, True, monkeypatch)
    ref, ref_counts = _chunks(str(path), columns, sep, False, monkeypatch)
    assert fast_counts == ref_counts
    assert [r for r, _ in fast] == [r for r, _ in ref]
    for (_, a), (_, b) in zip(fast, ref):
        assert a.schema.equals(b.schema) and a.equals(b)


@pytest.mark.parametrize("seed", range(3))
def test_split_blocks_featurize_as_pyarrows_typed_and_text_reads(tmp_path, monkeypatch, seed):
    rng = np.random.default_rng(seed)
    lines = ["y,n,c,h"]
    for _ in range(500):
        ident = "" if rng.random() < 0.05 else str(int(rng.integers(-(2**63), 2**63 - 1, dtype=np.int64)))
        count = "" if rng.random() < 0.1 else str(int(rng.integers(-3, 10**6)))
        lines.append(f"{int(rng.integers(0, 2))},{count},{ident},{int(rng.integers(0, 2**32)):08x}")
    path = tmp_path / "d.csv"
    path.write_text("\n".join(lines) + "\n")
    schema = Schema.parse({"labels": ["y"], "dense": [{"name": "n", "log1p": True}],
                           "sparse": [{"name": "c", "hash_ids": False}, {"name": "h"}]})
    got = []
    for split, types in ((True, read_types(schema)), (False, read_types(schema)), (False, None)):
        chunks, _ = _chunks(str(path), schema.columns, ",", split, monkeypatch, "error", types)
        featurize = Featurizer(schema)
        got.append([featurize(b).to_batch() for _, b in chunks])
    assert len(got[0]) > 3  # several blocks
    for other in got[1:]:
        for a, b in zip(got[0], other):
            assert a.dense.numpy().tobytes() == b.dense.numpy().tobytes()
            assert a.labels.numpy().tobytes() == b.labels.numpy().tobytes()
            np.testing.assert_array_equal(a.sparse.values.numpy(), b.sparse.values.numpy())
            np.testing.assert_array_equal(a.sparse.lengths.numpy(), b.sparse.lengths.numpy())


def test_a_bad_line_raises_as_pyarrows_read_does(tmp_path, monkeypatch):
    path = tmp_path / "d.csv"
    path.write_text("y,a\n1,x\n0,y,z\n1,w\n")
    errors = []
    for split in (True, False):
        monkeypatch.setattr(csv_module, "_SPLIT", split)
        with pytest.raises(DataError) as e:
            list(read_csv(str(path), ["y", "a"]))
        errors.append(str(e.value))
    assert errors[0] == errors[1] and "row 3" in errors[0]


def test_a_block_left_to_pyarrow_is_logged_once(tmp_path, caplog):
    once.forget("csv.not_split")
    path = tmp_path / "d.csv"
    path.write_text('y,a\n1,"x"\n0,y\n' * 50)
    with caplog.at_level(logging.INFO, logger="ember"):
        list(read_csv(str(path), ["y", "a"], block_bytes=64))
    said = [r.getMessage() for r in caplog.records if "not split" in r.getMessage()]
    assert len(said) == 1 and "quote" in said[0]


@pytest.mark.skipif(not _native.is_available(), reason="needs the native core")
@pytest.mark.parametrize("seed", range(8))
def test_native_split_and_gather_equal_their_fallbacks(seed):
    rng = np.random.default_rng(seed)
    _split_and_gather_equal_fallbacks(rng, int(rng.integers(1, 6)), int(rng.integers(0, 60)))


@pytest.mark.skipif(not _native.is_available(), reason="needs the native core")
@pytest.mark.parametrize("ncols,n", [(7, 1), (7, 17), (7, 200), (70, 1), (70, 40), (130, 9)])
def test_native_split_takes_dense_separators_exactly(ncols, n):
    """The splitter flattens each 64 bytes' separators eight positions at a time: lines of mostly
    empty fields (up to 64 separators in one 64-byte chunk), wide and narrow, give the
    fallback's outputs too, and so does a line with a field too many or too few."""
    for seed in range(4):
        _split_and_gather_equal_fallbacks(np.random.default_rng(seed), ncols, n, words=["", "", "", "", "a", "12"])


@pytest.mark.skipif(not _native.is_available(), reason="needs the native core")
@pytest.mark.parametrize("seed", range(12))
def test_native_split_of_crlf_lines_equals_its_fallback(seed):
    """CRLF line ends on some lines (the CR no part of the last field, read or not), and now and
    then a CR elsewhere in a line (no split: -1), natively and by the fallback alike."""
    rng = np.random.default_rng(100 + seed)
    _split_and_gather_equal_fallbacks(rng, int(rng.integers(1, 6)), int(rng.integers(0, 60)), crlf=True)


@pytest.mark.skipif(not _native.is_available(), reason="needs the native core")
def test_native_split_refuses_more_fields_than_bytes_without_allocating_for_them():
    """A line count or width that asks for more separators than the block has bytes is no split
    (-1, the pyarrow path then judges the block), not an allocation of their positions."""
    data = b"a,b\nc,d\n"
    slots = np.full(1000, -1, np.int64)
    slots[0] = 0
    assert _native.csv_split(data, ord(","), 1000, slots, 2, np.empty(2, np.int32), np.empty((1, 3), np.int32)) == -1
    none = np.full(1, -1, np.int64)
    assert _native.csv_split(data, ord(","), 1, none, 10**12, np.empty(0, np.int32), np.empty((0, 1), np.int32)) == -1
    assert _native.csv_split(data, ord(","), 2, np.arange(2, dtype=np.int64), 2, np.empty(4, np.int32),
                             np.empty((2, 3), np.int32)) == 2


def _split_and_gather_equal_fallbacks(rng: np.random.Generator, ncols: int, n: int,
                                      words: list[str] | None = None, crlf: bool = False) -> None:
    words = words or ["", "a", "bcdefghijk", "12", "é"]
    rows = [",".join(str(rng.choice(words)) for _ in range(ncols)) for _ in range(n)]
    if crlf:  # CRLF line ends on some lines; now and then a CR elsewhere (no split)
        rows = [r + "\r" if rng.random() < 0.5 else r for r in rows]
        if n and rng.random() < 0.3:
            i = int(rng.integers(0, n))
            at = int(rng.integers(0, len(rows[i]) + 1))
            rows[i] = rows[i][:at] + "\r" + rows[i][at:]
    if n and rng.random() < 0.3:
        rows[int(rng.integers(0, n))] += ",extra"
    elif n and ncols > 1 and rng.random() < 0.2:
        i = int(rng.integers(0, n))
        rows[i] = rows[i][: rows[i].rindex(",")]  # a field too few
    data = ("\n".join(rows) + "\n").encode() if n else b""
    slots = np.array(rng.permutation(ncols), np.int64)
    slots[rng.random(ncols) < 0.3] = -1
    k = int(slots.max()) + 1 if (slots >= 0).any() else 0
    results = []
    for split, gather in ((_native.csv_split, _native.csv_gather), (_native._csv_split_py, _native._csv_gather_py)):
        starts, offsets = np.full(k * n, 7, np.int32), np.full((k, n + 1), 7, np.int32)
        got = split(data, ord(","), ncols, slots, n, starts, offsets, crlf)
        outs = []
        if got >= 0:
            outs = [np.zeros(int(offsets[s, n]), np.uint8) for s in range(k)]
            gather(data, starts, offsets, n, outs)
        results.append((got, starts, offsets, [o.tobytes() for o in outs]))
    (g1, s1, o1, d1), (g2, s2, o2, d2) = results
    assert g1 == g2
    if g1 >= 0:
        np.testing.assert_array_equal(s1, s2)
        np.testing.assert_array_equal(o1, o2)
        assert d1 == d2
        for s in range(k):  # each slot's data is its column's fields, as Python splits them ("" for none)
            arr = pa.Array.from_buffers(pa.string(), n, [None, pa.py_buffer(o1[s]), pa.py_buffer(d1[s])])
            col = list(slots).index(s) if s in slots else None
            want = [r[:-1] if crlf and r.endswith("\r") else r for r in rows]  # (the CR of a CRLF end is no field's)
            assert arr.to_pylist() == [r.split(",")[col] if col is not None else "" for r in want]


@pytest.mark.skipif(not _native.is_available(), reason="needs the native core")
@pytest.mark.parametrize("size", [0, 1, 31, 32, 33, 255 * 32 - 1, 255 * 32, 255 * 32 + 1, 3 * 255 * 32 + 77])
def test_native_csv_bytes_equals_its_fallback(size):
    """One pass's newline count and flags (a quote, a CR, a byte >= 0x80) == the numpy searches,
    at sizes around its 32-byte steps and its 255-step counting runs; every byte placed alone
    at the start, in the middle and in the tail."""
    rng = np.random.default_rng(size)
    base = rng.choice(np.frombuffer(b"abc,0123456789\n", np.uint8), size).astype(np.uint8)
    blocks = [base.tobytes(), b"\n" * size]  # (all newlines: each 8-bit lane counts 255 a run)
    for byte in (ord('"'), ord("\r"), 0x80, 0xFF, ord("\n")):
        for at in {0, size // 2, size - 1} if size else ():
            b = base.copy()
            b[at] = byte
            blocks.append(b.tobytes())
    for b in blocks:
        got = _native.csv_bytes(b)
        assert got == _native._csv_bytes_py(b)
        assert got[0] == b.count(b"\n")
        assert got[1] == ((_native.CSV_QUOTE if b'"' in b else 0) | (_native.CSV_CR if b"\r" in b else 0)
                          | (_native.CSV_NOT_ASCII if not b.isascii() else 0))
    assert _native.csv_bytes(bytearray(b"x\n\xc3\xa9\n")) == (2, _native.CSV_NOT_ASCII)  # (a bytearray: read_csv's blocks)


def test_line_blocks_reuse_a_buffer_only_when_no_view_of_it_is_held(tmp_path):
    """``_line_blocks(reuse=True)`` reads the next block into the one before, the same blocks as
    new buffers give; a block something still views (a numpy array over it) is never written
    again: the next block gets a new buffer."""
    rng = np.random.default_rng(3)
    lines = [",".join(str(v) for v in rng.integers(0, 10**rng.integers(1, 12), 5)) for _ in range(3000)]
    path = tmp_path / "f.csv"
    path.write_text("\n".join(lines))  # (no newline at the end: one is added)
    fresh = [bytes(b) for b in csv_module._line_blocks(str(path), 4096)]
    assert b"".join(fresh) == ("\n".join(lines) + "\n").encode()
    reused, ids = [], []
    for b in csv_module._line_blocks(str(path), 4096, reuse=True):
        reused.append(bytes(b))
        ids.append(id(b))
    assert reused == fresh and len(set(ids[:-1])) == 1  # one buffer throughout (the last line: its own)
    held, kept = [], []
    for b in csv_module._line_blocks(str(path), 4096, reuse=True):
        held.append(np.frombuffer(b, np.uint8))  # a view: the buffer must not be reused
        kept.append(bytes(b))
    assert [a.tobytes() for a in held] == kept == fresh
    buf = bytearray(b"abc")
    view = memoryview(buf)
    assert not csv_module._reuse(buf, 3) and buf == b"abc"
    view.release()
    assert csv_module._reuse(buf, 3) and len(buf) == 3 and csv_module._reuse(buf, 5) and len(buf) == 5


def test_split_reads_id_columns_as_int64_unless_a_field_is_no_id(tmp_path, monkeypatch):
    """With int64 asked for two ID columns, the splitter reads them as IDs from the block (an
    empty field null), in every block but the one where a field of ``b`` is no ID: there ``b``
    stays text, as pyarrow's text read gives it; ``a`` is its IDs everywhere."""
    rng = np.random.default_rng(5)
    rows = []
    for i in range(600):
        a = "" if rng.random() < 0.1 else str(int(rng.integers(-(2**63), 2**63 - 1, dtype=np.int64)))
        b = "12x" if i == 300 else str(int(rng.integers(0, 10**6)))
        rows.append((str(i % 2), a, b))
    path = tmp_path / "d.csv"
    path.write_text("y,a,b\n" + "".join(",".join(r) + "\n" for r in rows))
    chunks, _ = _chunks(str(path), ["y", "a", "b"], ",", True, monkeypatch, "error", {"a": pa.int64(), "b": pa.int64()})
    text, _ = _chunks(str(path), ["y", "a", "b"], ",", False, monkeypatch, "error")
    assert len(chunks) > 3 and [r for r, _ in chunks] == [r for r, _ in text]
    kinds = []
    for (first, got), (_, want) in zip(chunks, text):
        assert got.column("y").equals(want.column("y"))
        a = got.column("a")
        assert a.type == pa.int64()
        expect = [None if s == "" else int(s) for s in want.column("a").to_pylist()]
        assert a.to_pylist() == expect and a.null_count == expect.count(None)
        b = got.column("b")
        kinds.append(str(b.type))
        if b.type == pa.string():
            assert b.equals(want.column("b")) and "12x" in b.to_pylist()
        else:
            assert b.to_pylist() == [int(s) for s in want.column("b").to_pylist()] and b.null_count == 0
    assert kinds.count("string") == 1 and kinds.count("int64") == len(kinds) - 1


@pytest.mark.skipif(not _native.is_available(), reason="needs the native core")
@pytest.mark.parametrize("seed", range(6))
def test_native_csv_ints_equal_their_fallback(seed):
    """Split fields read as IDs, natively and by the fallback (gather, then arrow_parse_ints' numpy
    reference): the same values, validity and null counts, and the same slots declined."""
    rng = np.random.default_rng(seed)
    words = ["", "0", "-0", "7", "-12", "007", "9223372036854775807", "-9223372036854775808", "123456789012345678",
             "1234567890123456", "-9999999999999999", "0000000000000000001", "-1000000000000000000", "999999999999999999"]
    words += ["".join(rng.choice(list("0123456789"), size=int(k))) for k in rng.integers(16, 20, 6)]  # (16-19 digits:
    words += ["-" + "".join(rng.choice(list("0123456789"), size=int(k))) for k in rng.integers(16, 20, 3)]  # one SSE step)
    bad = ["9223372036854775808", "-", "+1", " 4", "1-2", "x", "99999999999999999999", "1.5", "-9223372036854775809",
           "1234567890123x45", "12345678901234567-", "123456789012345/7", "12345678901234:67", "--1234567890123456"]
    ncols, n = 6, int(rng.integers(0, 70))
    cols = [[str(rng.choice(words)) for _ in range(n)] for _ in range(ncols)]
    for c in range(ncols):
        if n and rng.random() < 0.4:  # a field that is no ID: the slot is declined
            cols[c][int(rng.integers(0, n))] = str(rng.choice(bad))
    data = "".join(",".join(cols[c][i] for c in range(ncols)) + "\n" for i in range(n)).encode()
    starts, offsets = np.empty(ncols * n, np.int32), np.empty((ncols, n + 1), np.int32)
    assert _native.csv_split(data, ord(","), ncols, np.arange(ncols, dtype=np.int64), n, starts, offsets) == n
    got = _native.csv_ints(data, starts[2 * n :], offsets[2:], n)  # slots 2.. (a slice, as read_csv passes)
    m = ncols - 2
    out, valid, nulls = np.empty((m, n), np.int64), np.empty((m, (n + 7) // 8), np.uint8), np.empty(m, np.int64)
    _native._csv_ints_py(data, starts[2 * n :], offsets[2:], n, out, valid, nulls)
    np.testing.assert_array_equal(got[2], nulls)
    for s in np.flatnonzero(nulls >= 0):
        np.testing.assert_array_equal(got[0][s], out[s])
        np.testing.assert_array_equal(got[1][s], valid[s])
        texts = cols[2 + s]
        assert nulls[s] == texts.count("") and list(out[s]) == [0 if t == "" else int(t) for t in texts]
    def is_id(t: str) -> bool:  # featurize_ids' reading of ID text, spelt out
        digits = t[1:] if t.startswith("-") else t
        return t == "" or (0 < len(digits) <= 19 and digits.isascii() and digits.isdigit() and -(2**63) <= int(t) < 2**63)

    for s in range(m):
        assert (nulls[s] < 0) == (not all(is_id(t) for t in cols[2 + s]))
