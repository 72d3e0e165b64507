"""CSV edge cases: text that is not UTF-8, lines longer than pyarrow's parse block, and a header
line in some files but not others (``csv.header: auto``)."""

from __future__ import annotations

import pytest

from ember.errors import ConfigError, DataError
from ember.source.bad_rows import BadRowReport
from ember.source.config import DataConfig
from ember.source.csv import read_csv
from tests.conftest import shared_data_dir


def _rows(chunks) -> dict[str, list]:
    out: dict[str, list] = {}
    for c in chunks:
        for k, v in c.batch.to_pydict().items():
            out.setdefault(k, []).extend(v)
    return out


_LATIN1 = b"y,c,n\n1,a,1\n0,caf\xe9,2\n1,b,3\n0,c,\xff\xfe\n1,d,5"


def test_non_utf8_error_names_file_row_column_and_offset(tmp_path):
    p = tmp_path / "latin1.csv"
    p.write_bytes(_LATIN1)
    chunks = read_csv(str(p), ["y", "c"])
    assert next(chunks).batch.column("c").to_pylist() == ["a"]  # the good rows before come first
    with pytest.raises(DataError) as e:
        next(chunks)
    msg = str(e.value)
    offset = _LATIN1.index(b"\xe9")
    assert "latin1.csv row 3, column 'c'" in msg and f"byte offset {offset}" in msg
    assert "caf\\xe9" in msg and "on_bad_rows: skip" in msg and "UTF-8" in msg


def test_non_utf8_skip_counts_rows_and_keeps_row_numbers(tmp_path):
    p = tmp_path / "latin1.csv"
    p.write_bytes(_LATIN1)
    report = BadRowReport("skip")
    chunks = list(read_csv(str(p), ["y", "c"], report=report))
    assert _rows(chunks)["c"] == ["a", "b", "d"]
    assert [(c.first_row, c.batch.num_rows) for c in chunks] == [(2, 1), (4, 1), (6, 1)]
    assert report.counts == {"<row>: not valid UTF-8 text": 2}


def test_non_utf8_line_with_wrong_field_count_is_one_bad_row(tmp_path):
    p = tmp_path / "x.tsv"
    p.write_bytes(b"1\ta\n0\t\xc3\tz\n1\tb\n")  # invalid byte and an extra field
    report = BadRowReport("skip")
    got = _rows(read_csv(str(p), ["y", "c"], delimiter="\t", header=False, column_names=["y", "c"],
                         report=report))
    assert got["c"] == ["a", "b"] and report.counts == {"<row>: not valid UTF-8 text": 1}
    with pytest.raises(DataError, match=r"x\.tsv row 2, column '<row>'.*not valid UTF-8"):
        list(read_csv(str(p), ["y", "c"], delimiter="\t", header=False, column_names=["y", "c"]))


def test_earlier_wrong_field_count_is_reported_before_later_non_utf8(tmp_path):
    p = tmp_path / "x.csv"
    p.write_bytes(b"y,c\n1,a,extra\n0,\xff\n")
    with pytest.raises(DataError, match=r"x\.csv row 2, column '<row>': expected 2 fields"):
        list(read_csv(str(p), ["y", "c"]))


def test_non_utf8_header_is_a_data_error(tmp_path):
    p = tmp_path / "h.csv"
    p.write_bytes(b"y,caf\xe9\n1,a\n")
    with pytest.raises(DataError, match=r"h\.csv row 1 \(the header\): not valid UTF-8"):
        list(read_csv(str(p), ["y"]))


@pytest.mark.parametrize("block_bytes", [4096, 8 << 20])
def test_a_3_mib_line_is_read(tmp_path, block_bytes):
    long = "x" * (3 << 20)
    p = tmp_path / "long.csv"
    p.write_text("y,c\n1,a\n0," + long + "\n1,b\n")
    chunks = list(read_csv(str(p), ["y", "c"], block_bytes=block_bytes))
    assert _rows(chunks)["c"] == ["a", long, "b"]
    assert chunks[0].first_row == 2
    # row numbers stay exact after the long line
    p.write_text("y,c\n1,a\n0," + long + "\n1,b,extra\n")
    with pytest.raises(DataError, match=r"long\.csv row 4"):
        list(read_csv(str(p), ["y", "c"], block_bytes=block_bytes))


def test_header_auto_detects_the_header_line_per_file(tmp_path):
    with_header, without = tmp_path / "train.csv", tmp_path / "eval.csv"
    with_header.write_text("y,c\n1,a\n0,b\n")
    without.write_text("1,c\n0,d\n")
    kw = {"header": "auto", "column_names": ["y", "c"]}
    a = list(read_csv(str(with_header), ["y", "c"], **kw))
    b = list(read_csv(str(without), ["y", "c"], **kw))
    assert _rows(a) == {"y": ["1", "0"], "c": ["a", "b"]} and a[0].first_row == 2
    assert _rows(b) == {"y": ["1", "0"], "c": ["c", "d"]} and b[0].first_row == 1
    # a header naming other columns is not taken for the configured one: it is a bad data row
    other = tmp_path / "other.csv"
    other.write_text("label,cat\n1,a\n")
    report = BadRowReport("skip")
    assert _rows(read_csv(str(other), ["y", "c"], report=report, **kw)) == {"y": ["label", "1"], "c": ["cat", "a"]}


def test_header_auto_in_config_needs_column_names():
    with pytest.raises(ConfigError, match="csv.header is auto: set csv.column_names"):
        DataConfig.parse({"format": "csv", "train": "x", "csv": {"header": "auto"}})
    cfg = DataConfig.parse({"format": "csv", "train": "x", "csv": {"header": "auto", "column_names": ["y"]}})
    assert cfg.csv.header == "auto"
    with pytest.raises(ConfigError, match="header"):
        DataConfig.parse({"format": "csv", "train": "x", "csv": {"header": "maybe", "column_names": ["y"]}})
    with pytest.raises(ValueError, match="needs column_names"):
        next(read_csv("unused.csv", ["y"], header="auto"))


def test_header_auto_on_real_criteo_rows(tmp_path):
    dev = shared_data_dir() / "criteo" / "dev.tsv"
    if not dev.exists():
        pytest.skip(f"{dev} not found (shared data absent)")
    cfg = DataConfig.parse({"preset": "criteo", "train": str(dev), "csv": {"header": "auto"}})
    with_header = tmp_path / "train.tsv"
    with_header.write_bytes("\t".join(cfg.csv.column_names).encode() + b"\n" + dev.read_bytes())
    kw = {"delimiter": "\t", "header": cfg.csv.header, "column_names": cfg.csv.column_names}
    plain = _rows(read_csv(str(dev), ["label", "C1"], **kw))
    assert len(plain["label"]) == 409  # the README's row count: no line taken for a header
    assert _rows(read_csv(str(with_header), ["label", "C1"], **kw)) == plain


# ---- quotes that run past their line (found by tests/fuzz) -------------------------------------


@pytest.mark.parametrize("text, bad_row, kept", [
    ('y,a,b\n1,"x,2\n0,y,3\n1,z,4\n', 2, ["y", "z"]),  # the quote would swallow every later line
    ('y,a,b\n1,x,2\n0,"y,3\n1,z,4\n1,"w",5\n', 3, ["x", "z", "w"]),  # ... up to the next quote
    ('y,a,b\n1,x,"2\n', 2, []),  # the last line: it would take its own newline as the value's
    ('y,a,b\n1,x,"2', 2, []),  # ... or, without a final newline, pass at the end of the data
    ('y,a,b\n1,"x\r2,y\n0,z",3\n1,w,4\n', 2, ['z"', "w"]),  # a lone CR making up for a merged line
])
def test_a_quote_that_does_not_close_on_its_line_is_one_bad_row(tmp_path, text, bad_row, kept):
    p = tmp_path / "q.csv"
    p.write_bytes(text.encode())
    with pytest.raises(DataError) as e:
        list(read_csv(str(p), ["y", "a", "b"]))
    assert f"q.csv row {bad_row}," in str(e.value) and "quoted value must end on its own line" in str(e.value)
    report = BadRowReport("skip")
    chunks = list(read_csv(str(p), ["y", "a", "b"], report=report))
    assert [v for c in chunks for v in c.batch.column("a").to_pylist()] == kept  # no line merged away
    assert report.total == 1


def test_quotes_that_close_on_their_line_are_values(tmp_path):
    p = tmp_path / "ok.csv"
    p.write_text('y,a,b\n1,"x,y",2\n0,a"b,3\n1,"say ""hi""",4\n')
    chunks = list(read_csv(str(p), ["a"]))
    assert chunks[0].batch.column("a").to_pylist() == ["x,y", 'a"b', 'say "hi"']
