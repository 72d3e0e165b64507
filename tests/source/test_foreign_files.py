"""Files as other tools write them: a UTF-8 byte order mark, CRLF line ends, compressed files,
duplicate header names, very long fields, text labels, and directories holding more than data
(README.md, _SUCCESS, .crc files, a .txt)."""

from __future__ import annotations

import bz2
import gzip
import logging
from pathlib import Path

import pyarrow as pa
import pytest

from ember.errors import ConfigError, DataError, SchemaError
from ember.featurize.schema import Schema
from ember.pipeline.loader import make_batches
from ember.source.bad_rows import BadRowReport
from ember.source.config import DataConfig
from ember.source.csv import read_csv
from ember.source.files import expand_paths
from ember.source.orc import read_orc
from ember.source.parquet import read_parquet
from ember.train.preflight import check_data
from tests.source.test_csv_hardening import _rows  # a file's chunks as columns of Python values

SCHEMA = Schema.parse({"labels": ["label"], "dense": [{"name": "n"}], "sparse": [{"name": "id"}]})
TEXT = "label,n,id\n1,0.5,a\n0,2,b\n1,,c\n"


def _loaded(data: DataConfig) -> tuple[list[float], list[float]]:
    batches = list(make_batches(data, SCHEMA, "train"))
    return ([x for b in batches for x in b.labels[:, 0].tolist()], [x for b in batches for x in b.dense[:, 0].tolist()])


def _data(path: Path | str, **kw) -> DataConfig:
    return DataConfig(format=kw.pop("format", "csv"), train=str(path), batch_size=8, shuffle_buffer=0, **kw)


# ---- byte order mark, line ends ---------------------------------------------------------------


def test_a_utf8_bom_is_not_part_of_the_first_column_name(tmp_path):
    p = tmp_path / "excel.csv"
    p.write_bytes(b"\xef\xbb\xbf" + TEXT.encode())
    assert check_data(_data(p), SCHEMA.columns, "train") == [str(p)]  # preflight reads the header too
    assert _loaded(_data(p)) == ([1.0, 0.0, 1.0], [0.5, 2.0, 0.0])
    # without a header the BOM is no part of the first value either; auto still sees the header
    names = ["label", "n", "id"]
    for header, first_row in [(False, 1), ("auto", 2)]:
        body = TEXT if header == "auto" else TEXT.split("\n", 1)[1]
        p.write_bytes(b"\xef\xbb\xbf" + body.encode())
        chunks = list(read_csv(str(p), ["label", "id"], header=header, column_names=names))
        assert _rows(chunks) == {"label": ["1", "0", "1"], "id": ["a", "b", "c"]} and chunks[0].first_row == first_row


def test_a_bom_keeps_byte_offsets_of_the_file(tmp_path):
    p = tmp_path / "bom.csv"
    raw = b"\xef\xbb\xbf" + b"y,c\n1,a\n0,caf\xe9\n"
    p.write_bytes(raw)
    at = raw.index(b"\xe9")
    with pytest.raises(DataError, match=f"byte offset {at}"):
        list(read_csv(str(p), ["y", "c"]))


def test_crlf_line_ends_leave_no_carriage_return_in_the_last_column(tmp_path):
    p = tmp_path / "dos.csv"
    p.write_bytes(b"label,n,id\r\n1,0.5,a\r\n0,2,b\r\n1,,c\r\n")
    chunks = list(read_csv(str(p), ["label", "n", "id"]))
    assert _rows(chunks) == {"label": ["1", "0", "1"], "n": ["0.5", "2", ""], "id": ["a", "b", "c"]}
    assert _loaded(_data(p)) == ([1.0, 0.0, 1.0], [0.5, 2.0, 0.0])
    # the label as the last column: "1\r" would not be a number
    q = tmp_path / "label_last.csv"
    q.write_bytes(b"id,n,label\r\na,1,1\r\nb,2,0\r\n")
    assert _loaded(_data(q))[0] == [1.0, 0.0]
    with pytest.raises(DataError, match=r"dos2\.csv row 3, column '<row>'"):  # line numbers stay exact
        (tmp_path / "dos2.csv").write_bytes(b"label,n,id\r\n1,0.5,a\r\n0,2\r\n")
        list(read_csv(str(tmp_path / "dos2.csv"), ["label"]))


# ---- compressed files -------------------------------------------------------------------------


def _compress(data: bytes, suffix: str) -> bytes:
    if suffix == ".gz":
        return gzip.compress(data)
    if suffix == ".bz2":
        return bz2.compress(data)
    codec = {".zst": "zstd", ".lz4": "lz4"}[suffix]
    sink = pa.BufferOutputStream()
    with pa.CompressedOutputStream(sink, codec) as f:
        f.write(data)
    return sink.getvalue().to_pybytes()


@pytest.mark.parametrize("suffix", [".gz", ".bz2", ".zst", ".lz4"])
@pytest.mark.parametrize("fmt", ["csv", "tsv"])
def test_compressed_files_by_extension_in_files_globs_and_directories(tmp_path, suffix, fmt):
    text = TEXT if fmt == "csv" else TEXT.replace(",", "\t")
    d = tmp_path / "data"
    d.mkdir()
    path = d / f"part-0.{fmt}{suffix}"
    path.write_bytes(_compress(text.encode(), suffix))
    for pattern in [path, d, d / f"*.{fmt}{suffix}"]:
        assert expand_paths([str(pattern)], fmt) == [str(path)]
        assert _loaded(_data(pattern, format=fmt)) == ([1.0, 0.0, 1.0], [0.5, 2.0, 0.0])


def test_a_compressed_file_streams_in_blocks(tmp_path):
    """Decompressed ``block_bytes`` at a time, never whole: a file whose text is many blocks
    long comes out in chunks of at most one block of lines."""
    p = tmp_path / "big.csv.zst"
    p.write_bytes(_compress(b"y,c\n" + b"1,a\n" * 50_000, ".zst"))
    sizes = [c.batch.num_rows for c in read_csv(str(p), ["y"], block_bytes=1 << 14)]
    assert sum(sizes) == 50_000 and max(sizes) <= (1 << 14) // 4 and len(sizes) >= 12


# ---- header names, long fields ----------------------------------------------------------------


def test_a_column_named_twice_in_the_header_is_an_error_naming_file_and_column(tmp_path):
    p = tmp_path / "dup.csv"
    p.write_text("label,id,n,id\n1,a,1,b\n")
    with pytest.raises(DataError) as e:
        list(read_csv(str(p), ["label", "id"]))
    assert "dup.csv: the header (row 1) names column 'id' 2 times (fields 2, 4)" in str(e.value)
    with pytest.raises(DataError, match="dup.csv: the header"):
        _loaded(_data(p))
    # a repeated name nothing reads is harmless; csv.column_names can rename the copies
    assert _rows(read_csv(str(p), ["label", "n"])) == {"label": ["1"], "n": ["1"]}
    got = read_csv(str(p), ["id", "id2"], column_names=["label", "id", "n", "id2"])
    assert _rows(got) == {"id": ["a"], "id2": ["b"]}
    with pytest.raises(DataError, match="csv.column_names names column 'id' 2 times"):
        list(read_csv(str(p), ["id"], column_names=["label", "id", "n", "id"]))


@pytest.mark.parametrize("fmt", ["parquet", "orc"])
def test_a_column_named_twice_in_a_columnar_file_is_an_error_naming_file_and_column(tmp_path, fmt):
    """Parquet and ORC files can hold two columns of one name (pyarrow writes them): refused
    when one is read, before any row is featurized; harmless when nothing reads it."""
    import pyarrow.orc as orc
    import pyarrow.parquet as pq

    t = pa.Table.from_arrays([pa.array([1, 0]), pa.array(["a", "b"]), pa.array([1, 2]), pa.array(["c", "d"])],
                             names=["label", "id", "n", "id"])
    p = tmp_path / f"dup.{fmt}"
    pq.write_table(t, p) if fmt == "parquet" else orc.write_table(t, str(p))
    reader = read_parquet if fmt == "parquet" else read_orc
    with pytest.raises(DataError, match=f"dup.{fmt}: its schema names column 'id' 2 times \\(fields 2, 4\\)"):
        list(reader(str(p), ["label", "id"]))
    with pytest.raises(DataError, match=f"dup.{fmt}: its schema names column 'id' 2 times"):
        _loaded(_data(p, format=fmt))
    assert [c.batch.to_pydict() for c in reader(str(p), ["label", "n"])] == [{"label": [1, 0], "n": [1, 2]}]


@pytest.mark.parametrize("block_bytes", [1 << 12, 8 << 20])
def test_a_1_mb_id_is_read(tmp_path, block_bytes):
    long_id = "k" * (1 << 20)
    p = tmp_path / "long.csv"
    p.write_text(f"label,n,id\n1,1,a\n0,2,{long_id}\n1,3,c\n")
    chunks = list(read_csv(str(p), ["id"], block_bytes=block_bytes))
    assert _rows(chunks)["id"] == ["a", long_id, "c"]
    batches = list(make_batches(_data(p, csv={"block_bytes": block_bytes}), SCHEMA, "train"))
    assert sum(b.size for b in batches) == 3


# ---- text labels ------------------------------------------------------------------------------


@pytest.mark.parametrize("policy", ["error", "skip"])
def test_text_labels_are_an_error_naming_file_column_and_values(tmp_path, policy):
    p = tmp_path / "words.csv"
    p.write_text("label,n,id\nyes,1,a\nno,2,b\nyes,3,c\nclick,4,d\n")
    with pytest.raises(SchemaError) as e:
        _loaded(_data(p, on_bad_rows=policy))
    msg = str(e.value)
    assert "words.csv: label column 'label' holds text, not numbers: 'yes', 'no', 'click'" in msg
    assert "row 2" in msg and "0/1" in msg


def test_a_stray_word_among_numeric_labels_is_one_bad_row(tmp_path):
    p = tmp_path / "stray.csv"
    p.write_text("label,n,id\n1,1,a\n0,2,b\noops,3,c\n1,4,d\n")
    data = _data(p, on_bad_rows="skip")
    loader = make_batches(data, SCHEMA, "train")
    assert sum(b.size for b in loader) == 3 and loader.bad_rows.counts == {"label: label is not a number": 1}
    with pytest.raises(DataError, match=r"stray\.csv row 4, column 'label': label is not a number, got 'oops'"):
        _loaded(_data(p))


# ---- directories holding more than data -------------------------------------------------------


def test_a_directory_skips_files_that_are_not_data_and_names_them_once(tmp_path, caplog):
    d = tmp_path / "out"
    (d / "sub").mkdir(parents=True)
    (d / "part-0.csv").write_text(TEXT)
    (d / "sub" / "part-1.csv.gz").write_bytes(gzip.compress(TEXT.encode()))
    for name in ["README.md", "_SUCCESS", ".part-0.csv.crc", "notes.txt", "sub/_metadata"]:
        (d / name).write_text("not data\n")
    with caplog.at_level(logging.INFO, logger="ember"):
        first = expand_paths([str(d)], "csv")
        again = expand_paths([str(d)], "csv")
    assert first == again == [str(d / "part-0.csv"), str(d / "sub" / "part-1.csv.gz")]
    lines = [r.getMessage() for r in caplog.records if "skipped" in r.getMessage()]
    assert len(lines) == 1  # once, however often the paths are expanded
    for name in [".part-0.csv.crc", "README.md", "_SUCCESS", "notes.txt", "sub/_metadata"]:
        assert name in lines[0]
    assert _loaded(_data(d))[0] == [1.0, 0.0, 1.0] * 2


def test_a_txt_file_is_read_only_when_named(tmp_path):
    d = tmp_path / "criteo"
    d.mkdir()
    (d / "train.txt").write_text(TEXT.replace(",", "\t"))
    (d / "_SUCCESS").write_text("")
    with pytest.raises(ConfigError) as e:
        expand_paths([str(d)], "tsv")
    assert "matches no tsv file (it holds 2 other file(s): _SUCCESS, train.txt" in str(e.value)
    assert str(d / "*.txt") in str(e.value)
    assert expand_paths([str(d / "*.txt")], "tsv") == expand_paths([str(d / "train.txt")], "tsv") == [str(d / "train.txt")]
    assert expand_paths([str(d / "*")], "tsv") == [str(d / "train.txt")]  # a glob leaves marker files out
    assert expand_paths([str(d / "_*")], "tsv") == [str(d / "_SUCCESS")]  # ... unless it spells them
    assert _loaded(_data(d / "*.txt", format="tsv"))[0] == [1.0, 0.0, 1.0]


def test_skip_reports_per_distinct_row_in_a_crlf_file(tmp_path):
    """The bad-row policy is unchanged by line ends: one bad line is one counted row."""
    p = tmp_path / "dos.csv"
    p.write_bytes(b"label,n,id\r\n1,1,a\r\n0,2\r\n1,3,c\r\n")
    report = BadRowReport("skip")
    assert _rows(read_csv(str(p), ["id"], report=report))["id"] == ["a", "c"]
    assert report.counts == {"<row>: wrong number of fields": 1}
