"""``csv.newlines_in_values``: quoted values holding delimiters, quotes and line ends (as
spreadsheets and Python's csv module write them) read exactly, rows numbered by the line they
start on; a stray quote makes its own line a bad row instead of swallowing the file."""

from __future__ import annotations

import csv
import gzip
import io

import pytest

import ember.source.csv as csv_module
from ember.errors import DataError
from ember.featurize.schema import Schema
from ember.pipeline.loader import make_batches
from ember.source.bad_rows import BadRowReport
from ember.source.config import DataConfig
from ember.source.csv import read_csv
from ember.source.quoted import UNCLOSED

NAMES = ["y", "a", "b"]


def _written(records: list[list[str]], eol: str = "\n") -> bytes:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator=eol)
    writer.writerow(NAMES)
    writer.writerows(records)
    return out.getvalue().encode()


def _read(path, **kw) -> tuple[list[tuple], list[int], BadRowReport]:
    report = BadRowReport("skip")
    chunks = list(read_csv(str(path), NAMES, report=report, newlines_in_values=True, **kw))
    rows = [r for c in chunks for r in zip(*(c.batch.column(n).to_pylist() for n in NAMES))]
    lines = [int(x) for c in chunks for x in c.row_numbers]
    return rows, lines, report


RECORDS = [
    ["1", "plain", "x"],
    ["0", "a, b", "line one\nline two"],
    ["1", 'say "hi"', "tab\there"],
    ["0", "crlf\r\ninside", ""],
    ["1", "", "last"],
]


@pytest.mark.parametrize("eol", ["\n", "\r\n"])
@pytest.mark.parametrize("block_bytes", [4096, 8 << 20])
def test_values_holding_delimiters_quotes_and_line_ends_read_exactly(tmp_path, eol, block_bytes):
    records = RECORDS * 300  # many blocks of 4 KiB: values straddle the block cuts
    p = tmp_path / "sheet.csv"
    p.write_bytes(_written(records, eol))
    rows, lines, report = _read(p, block_bytes=block_bytes)
    assert rows == [tuple(r) for r in records] and report.total == 0
    starts, line = [], 2
    for r in records:
        starts.append(line)
        line += 1 + sum(v.count("\n") for v in r)
    assert lines == starts  # each row: the line it starts on


def test_compressed_file_with_multi_line_values(tmp_path):
    p = tmp_path / "sheet.csv.gz"
    p.write_bytes(gzip.compress(_written(RECORDS * 50)))
    assert _read(p, block_bytes=4096)[0] == [tuple(r) for r in RECORDS * 50]


def test_a_bad_row_after_multi_line_rows_names_the_line_it_starts_on(tmp_path):
    text = _written(RECORDS[:2]) + b'1,"two\nlines",3,extra\n0,ok,fine\n'
    p = tmp_path / "bad.csv"
    p.write_bytes(text)  # header 1, rows on lines 2, 3-4; the bad row starts on line 5
    with pytest.raises(DataError, match=r"bad\.csv row 5, column '<row>': expected 3 fields"):
        list(read_csv(str(p), NAMES, newlines_in_values=True))
    rows, lines, report = _read(p)
    assert rows == [tuple(r) for r in RECORDS[:2]] + [("0", "ok", "fine")] and lines == [2, 3, 7]
    assert report.counts == {"<row>: wrong number of fields": 1}


@pytest.mark.parametrize("text, bad_row, kept", [
    (b'y,a,b\n1,"x,2\n0,y,3\n1,z,4\n', 2, ["y", "z"]),  # never closed
    (b'y,a,b\n1,x,2\n0,"y,3\n1,z,4\n1,"w",5\n', 3, ["x", "z", "w"]),  # "closed" by a quote not ending a value
    (b'y,a,b\n1,x,"2', 2, ["x"][:0]),  # open at the end of the file
])
def test_a_stray_quote_makes_its_line_a_bad_row(tmp_path, text, bad_row, kept):
    p = tmp_path / "q.csv"
    p.write_bytes(text)
    with pytest.raises(DataError) as e:
        list(read_csv(str(p), NAMES, newlines_in_values=True))
    assert f"q.csv row {bad_row}, column '<row>'" in str(e.value) and "not closed" in str(e.value)
    rows, _, report = _read(p)
    assert [r[1] for r in rows] == kept and report.counts == {UNCLOSED: 1}


def test_a_lone_cr_inside_a_quoted_value_is_part_of_it(tmp_path):
    p = tmp_path / "cr.csv"
    p.write_bytes(b'y,a,b\n1,"x\r2,y\n0,z",3\n1,w,4\n')  # without the option: a bad line
    rows, lines, report = _read(p)
    assert rows == [("1", "x\r2,y\n0,z", "3"), ("1", "w", "4")] and lines == [2, 4] and report.total == 0


def test_an_open_value_is_carried_only_so_far(tmp_path, monkeypatch):
    """A quote left open is carried from block to block up to a limit (RAM stays bounded
    whatever the file); past it, the quote is stray and its line a bad row."""
    monkeypatch.setattr(csv_module, "_CARRY_LIMIT", 8192)
    body = b"".join(b"1,v%d,%d\n" % (i, i) for i in range(3000))  # ~30 KiB with no quote
    p = tmp_path / "open.csv"
    p.write_bytes(b'y,a,b\n0,"opened,1\n' + body)
    rows, lines, report = _read(p, block_bytes=4096)
    assert len(rows) == 3000 and lines[0] == 3 and report.counts == {UNCLOSED: 1}


def test_non_utf8_inside_a_multi_line_row_is_one_bad_row(tmp_path):
    p = tmp_path / "latin1.csv"
    p.write_bytes(b'y,a,b\n1,"caf\xe9\nau lait",2\n0,ok,3\n')
    rows, lines, report = _read(p)
    assert rows == [("0", "ok", "3")] and lines == [4] and report.counts == {"<row>: not valid UTF-8 text": 1}
    with pytest.raises(DataError, match=r"latin1\.csv row 2, column 'a': not valid UTF-8"):
        list(read_csv(str(p), NAMES, newlines_in_values=True))


def test_the_featurizer_names_the_line_a_row_starts_on(tmp_path):
    p = tmp_path / "train.csv"
    p.write_bytes(b'y,a,b\n1,"multi\nline",1\n0,"more\nlines\nhere",2\n1,x,oops\n')
    schema = Schema.parse({"labels": ["y"], "dense": [{"name": "b"}], "sparse": [{"name": "a"}]})
    data = DataConfig.parse({"format": "csv", "train": str(p), "batch_size": 4, "shuffle_buffer": 0,
                             "csv": {"newlines_in_values": True}})
    with pytest.raises(DataError, match=r"train\.csv row 7, column 'b': not a number, got 'oops'"):
        list(make_batches(data, schema, "train"))
    (batch,) = list(make_batches(data.model_copy(update={"on_bad_rows": "skip"}), schema, "train"))
    assert batch.dense[:, 0].tolist() == [1.0, 2.0]


def test_without_the_option_such_values_are_bad_lines_and_a_log_line_says_why(tmp_path, caplog):
    p = tmp_path / "sheet.csv"
    p.write_bytes(_written(RECORDS))
    report = BadRowReport("skip")
    with caplog.at_level("WARNING", logger="ember"):
        chunks = list(read_csv(str(p), NAMES, report=report))
    assert sum(c.batch.num_rows for c in chunks) == 3 and report.total == 4  # each line of the 2 two-line rows
    hints = [r.getMessage() for r in caplog.records if "newlines_in_values" in r.getMessage()]
    assert len(hints) == 1 and "sheet.csv row 3: a quoted value spans lines" in hints[0]
    with pytest.raises(DataError, match="set csv.newlines_in_values: true if values hold line ends"):
        list(read_csv(str(p), NAMES))
