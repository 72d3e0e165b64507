"""Property-based tests (hypothesis) of the data path's promises, over generated inputs:

- CSV: every line is one row. With ``on_bad_rows: skip`` the good lines come out, in order and
  unchanged, and the skipped count is the number of bad lines; with ``error`` the error names
  the file and the first bad line's number. Bad lines: wrong field counts, bytes that are not
  UTF-8, a quote that does not close on its line.
- numbers: any text is a number (then exactly Python's float of it), missing, or bad; never a
  crash, never inf; labels are accepted exactly when in [0, 1].
- Parquet: a file cut short or with bytes overwritten reads whole and unchanged, or raises a
  DataError naming it; never fewer rows without an error.

Each property runs 40 examples by default; the slow variants run 200 (times ``EMBER_FUZZ_SCALE``).
"""

from __future__ import annotations

import io
import math

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ember.errors import DataError, SchemaError
from ember.featurize.featurizer import Featurizer
from ember.featurize.schema import Schema
from ember.featurize.transforms import parse_floats
from ember.source.bad_rows import BadRowReport
from ember.source.csv import read_csv
from ember.source.parquet import read_parquet
from tests.fuzz.conftest import fuzz_derandomize, fuzz_scale

FAST = settings(max_examples=40, deadline=None, database=None, derandomize=fuzz_derandomize(), suppress_health_check=[HealthCheck.too_slow])
SLOW = settings(max_examples=200 * fuzz_scale(), deadline=None, database=None, derandomize=fuzz_derandomize(), suppress_health_check=[HealthCheck.too_slow])

NAMES = ["y", "a", "b"]
# field text: anything but the delimiters, quotes and line ends (a BOM only inside a value)
_FIELD = st.text(st.characters(blacklist_characters=',\t"\r\n\ufeff', blacklist_categories=("Cs",)), max_size=12)
_GOOD = st.lists(_FIELD, min_size=3, max_size=3).map(lambda f: ("good", f))
_BAD = st.one_of(
    st.lists(_FIELD, min_size=1, max_size=6).filter(lambda f: len(f) != 3).map(lambda f: ("fields", f)),
    st.tuples(st.lists(_FIELD, min_size=3, max_size=3), st.sampled_from([b"\xff", b"\xc3(", b"\x80", b"\xe2\x82"]),
              st.integers(0, 2)).map(lambda t: ("utf8", t)),
    st.tuples(st.lists(_FIELD, min_size=3, max_size=3), st.integers(0, 2)).map(lambda t: ("quote", t)),
)
_LINES = st.lists(st.one_of(_GOOD, _GOOD, _GOOD, _BAD), min_size=1, max_size=60)


def _encode(kind: str, item, delim: bytes) -> bytes:
    if kind in ("good", "fields"):
        return delim.join(f.encode() for f in item)
    fields, where = (item[0], item[2]) if kind == "utf8" else item
    cells = [f.encode() for f in fields]
    if kind == "utf8":
        cells[where] += item[1]
    else:
        cells[where] = b'"' + cells[where]  # opens a quoted value; no quote follows on the line
    return delim.join(cells)


def _csv_property(tmp_path_factory, lines, header, crlf, tsv, block):
    delim = b"\t" if tsv else b","
    eol = b"\r\n" if crlf else b"\n"
    body = [_encode(k, item, delim) for k, item in lines]
    text = eol.join(([delim.join(n.encode() for n in NAMES)] if header else []) + body) + eol
    path = tmp_path_factory.mktemp("csv") / "f.csv"
    path.write_bytes(text)
    kw = dict(delimiter=delim.decode(), header=header, column_names=None if header else NAMES, block_bytes=block)
    # a blank line is a row of empty fields (the featurizer then finds its label missing)
    lines = [("good", [""] * len(NAMES)) if b == b"" else (k, item) for (k, item), b in zip(lines, body)]
    good = [item for k, item in lines if k == "good"]
    bad_lines = [i + (2 if header else 1) for i, (k, _) in enumerate(lines) if k != "good"]

    report = BadRowReport("skip")
    rows = [r for c in read_csv(str(path), NAMES, report=report, **kw)
            for r in zip(*(c.batch.column(n).to_pylist() for n in NAMES))]
    assert rows == [tuple(f) for f in good]  # good lines: all, in order, unchanged
    assert report.total == len(bad_lines)  # bad lines: all counted

    if bad_lines:
        with pytest.raises(DataError) as e:
            list(read_csv(str(path), NAMES, **kw))
        assert f"{path} row {bad_lines[0]}," in str(e.value)
    else:
        assert len(list(read_csv(str(path), NAMES, **kw))) >= 1


_CSV_ARGS = dict(lines=_LINES, header=st.booleans(), crlf=st.booleans(), tsv=st.booleans(),
                 block=st.sampled_from([4096, 1 << 20]))


@FAST
@given(**_CSV_ARGS)
def test_csv_every_line_is_one_row_counted_or_named(tmp_path_factory, lines, header, crlf, tsv, block):
    _csv_property(tmp_path_factory, lines, header, crlf, tsv, block)


@pytest.mark.slow
@SLOW
@given(**_CSV_ARGS)
def test_csv_every_line_is_one_row_counted_or_named_many(tmp_path_factory, lines, header, crlf, tsv, block):
    _csv_property(tmp_path_factory, lines, header, crlf, tsv, block)


# ---- numbers and labels ------------------------------------------------------------------------


def _numbers_property(texts: list[str]) -> None:
    values, missing, bad = parse_floats(pa.array(texts))
    for s, v, m, b in zip(texts, values, missing, bad):
        assert int(m) + int(b) <= 1
        if not m and not b:  # accepted: exactly the number the text says, finite
            assert math.isfinite(v) and v == float(s.strip())
        else:
            assert math.isnan(v)
        if m:
            assert s.strip() == "" or s.strip().lower() == "nan"


_NUMBER_TEXT = st.one_of(st.text(max_size=10), st.floats(allow_nan=True, allow_infinity=True).map(repr),
                         st.integers(-10**25, 10**25).map(str), st.sampled_from(["1e999", " 7 ", ".5", "1_0", "0x1"]))


@FAST
@given(st.lists(_NUMBER_TEXT, min_size=1, max_size=30))
def test_any_text_is_a_number_missing_or_bad(texts):
    _numbers_property(texts)


@pytest.mark.slow
@SLOW
@given(st.lists(_NUMBER_TEXT, min_size=1, max_size=30))
def test_any_text_is_a_number_missing_or_bad_many(texts):
    _numbers_property(texts)


@FAST
@given(st.lists(st.floats(allow_nan=True, allow_infinity=True), min_size=1, max_size=40))
def test_a_label_is_accepted_exactly_when_it_lies_in_0_1(labels):
    schema = Schema(labels=["y"], sparse=[{"name": "c"}])
    batch = pa.record_batch({"y": pa.array(labels, pa.float64()), "c": ["x"] * len(labels)})
    report = BadRowReport("skip")
    rows = Featurizer(schema, report)(batch, "f.parquet")
    ok = [x for x in labels if 0.0 <= x <= 1.0]  # False for NaN
    assert rows.labels[:, 0].tolist() == pytest.approx(ok) and report.total == len(labels) - len(ok)
    if len(ok) < len(labels):
        first = next(i for i, x in enumerate(labels) if not 0.0 <= x <= 1.0)
        with pytest.raises(DataError, match=f"f.parquet row {first + 1}, column 'y'"):
            Featurizer(schema)(batch, "f.parquet")


# ---- damaged Parquet ---------------------------------------------------------------------------


def _parquet(checksum: bool) -> bytes:
    rng = np.random.default_rng(0)
    n = 300
    t = pa.table({"y": rng.integers(0, 2, n), "a": rng.normal(size=n), "b": [f"v{i % 17}" for i in range(n)]})
    buf = io.BytesIO()
    pq.write_table(t, buf, row_group_size=64, write_page_checksum=checksum)
    return buf.getvalue()


_CHECKED = _parquet(True)
_REFERENCE = pq.read_table(io.BytesIO(_CHECKED))


def _damage_property(tmp_path_factory, cut, spans):
    body = bytearray(_CHECKED)
    for at, junk in spans:
        at %= len(body)
        body[at : at + len(junk)] = junk
    body = bytes(body[: cut % (len(body) + 1)])
    path = tmp_path_factory.mktemp("pq") / "f.parquet"
    path.write_bytes(body)
    try:
        chunks = list(read_parquet(str(path), ["y", "a", "b"], read_rows=50))
    except (DataError, SchemaError) as e:
        assert str(path) in str(e)
        return
    got = pa.Table.from_batches([c.batch for c in chunks]) if chunks else None
    assert got is not None and got.num_rows == _REFERENCE.num_rows  # never fewer rows without an error
    if got.equals(_REFERENCE):
        return
    # values changed unnoticed: only possible outside the checksummed pages (e.g. statistics
    # or a column name in the footer), never inside the data
    assert got.column_names != _REFERENCE.column_names or got.schema != _REFERENCE.schema


_DAMAGE_ARGS = dict(cut=st.integers(0, len(_CHECKED) + 100),
                    spans=st.lists(st.tuples(st.integers(0, 10**6), st.binary(min_size=1, max_size=8)), max_size=3))


@FAST
@given(**_DAMAGE_ARGS)
def test_damaged_parquet_reads_whole_or_names_the_file(tmp_path_factory, cut, spans):
    _damage_property(tmp_path_factory, cut, spans)


@pytest.mark.slow
@SLOW
@given(**_DAMAGE_ARGS)
def test_damaged_parquet_reads_whole_or_names_the_file_many(tmp_path_factory, cut, spans):
    _damage_property(tmp_path_factory, cut, spans)
