"""Damaged Parquet / ORC / compressed CSV files give a DataError naming the file and where; checksums are written
by ember's writer and verified by its reader."""

from __future__ import annotations

import gzip

import numpy as np
import pyarrow as pa
import pyarrow.orc as orc
import pyarrow.parquet as pq
import pytest

from ember.errors import DataError
from ember.source.config import SyntheticOptions
from ember.source.csv import read_csv
from ember.source.orc import read_orc
from ember.source.parquet import read_parquet
from ember.source.writer import write_synthetic


def _table(n: int = 20) -> pa.Table:
    return pa.table({"y": pa.array(np.arange(n) % 2), "a": pa.array([f"value-{i:04d}" for i in range(n)])})


def _read_all(chunks) -> int:
    return sum(c.batch.num_rows for c in chunks)


def _error(chunks) -> str:
    """The DataError message that reading ``chunks`` (a reader's lazy iterator) raises."""
    with pytest.raises(DataError) as e:
        _read_all(chunks)
    return str(e.value)


def _flip(path, at: int) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 0x55
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("damage", ["truncated", "garbage", "empty"])
def test_unreadable_parquet_names_the_file(tmp_path, damage):
    p = tmp_path / "part-7.parquet"
    pq.write_table(_table(), p)
    good = p.read_bytes()
    p.write_bytes({"truncated": good[: len(good) // 2], "garbage": b"not a parquet file" * 20, "empty": b""}[damage])
    msg = _error(read_parquet(str(p), ["y", "a"]))
    assert str(p) in msg and "(footer)" in msg and "leave it out of the files read (data.train / data.eval" in msg


def test_flipped_byte_in_a_data_page_is_caught_by_its_checksum(tmp_path):
    p = tmp_path / "sum.parquet"
    pq.write_table(_table(), p, row_group_size=10, write_page_checksum=True, use_dictionary=False,
                   compression="none")
    _flip(p, p.read_bytes().find(b"value-0013") + 7)  # a value in row group 1 (rows 11-20)
    # without verification the damage goes unnoticed: a value silently changed
    assert pq.read_table(p).column("a")[13].as_py() != "value-0013"
    msg = _error(read_parquet(str(p), ["y", "a"]))
    assert str(p) in msg and "row group 1 (rows 11-20, byte offset" in msg and "CRC" in msg


def test_write_synthetic_parquet_has_page_checksums(tmp_path):
    p = tmp_path / "gen.parquet"
    write_synthetic(str(p), "parquet", 300, SyntheticOptions(num_dense=2, num_sparse=2), chunk_rows=100)
    assert _read_all(read_parquet(str(p), ["label", "C1"])) == 300
    meta = pq.ParquetFile(p).metadata
    assert meta.num_row_groups == 3
    col = meta.row_group(1).column(3)  # C1 of the second row group: a dictionary page, then data pages
    start = col.dictionary_page_offset if col.has_dictionary_page else col.data_page_offset
    _flip(p, start + col.total_compressed_size - 3)  # inside the last data page's values
    with pytest.raises(DataError, match=r"gen\.parquet row group 1 \(rows 101-200.*CRC checksum"):
        _read_all(read_parquet(str(p), ["label", "C1"]))


@pytest.mark.parametrize("damage", ["truncated", "garbage"])
def test_unreadable_orc_names_the_file(tmp_path, damage):
    p = tmp_path / "part-3.orc"
    orc.write_table(_table(), str(p))
    good = p.read_bytes()
    p.write_bytes(good[: len(good) // 2] if damage == "truncated" else b"not an orc file" * 20)
    msg = _error(read_orc(str(p), ["y", "a"]))
    assert str(p) in msg and "restore or re-create the file" in msg


def test_orc_damaged_stripe_names_the_stripe(tmp_path):
    p = tmp_path / "s.orc"
    orc.write_table(_table(2000), str(p))
    data = bytearray(p.read_bytes())
    for k in range(100, 400):  # scramble the first stripe's streams, keep the footer
        data[k] ^= 0x5A
    p.write_bytes(bytes(data))
    with pytest.raises(DataError, match=r"s\.orc stripe 0 \(from row 1\)"):
        _read_all(read_orc(str(p), ["y", "a"]))


def test_truncated_gzip_csv_names_the_file(tmp_path):
    p = tmp_path / "t.csv.gz"
    p.write_bytes(gzip.compress(("y,c\n" + "".join(f"{i % 2},v{i}\n" for i in range(5000))).encode())[:-30])
    msg = _error(read_csv(str(p), ["y", "c"], block_bytes=4096))
    assert str(p) in msg and "after byte" in msg


def test_fewer_rows_than_the_footer_lists_is_an_error_not_a_short_read(tmp_path, monkeypatch):
    """Pages or stripes that decode but hold fewer rows than the footer says (a lost page):
    counted against the footer, so rows never go missing without an error."""
    pq.write_table(_table(40), tmp_path / "t.parquet", row_group_size=20)
    real = pq.ParquetFile.iter_batches

    def first_batch_only(self, *args, **kwargs):
        yield next(iter(real(self, *args, **kwargs)))

    monkeypatch.setattr(pq.ParquetFile, "iter_batches", first_batch_only)
    msg = _error(read_parquet(str(tmp_path / "t.parquet"), ["a"], read_rows=5))
    assert "t.parquet row group 0 (rows 1-20)" in msg and "its pages hold 5 rows, the footer lists 20" in msg

    orc.write_table(_table(40), str(tmp_path / "t.orc"))
    monkeypatch.setattr(orc.ORCFile, "read_stripe", lambda self, i, columns=None: _table(40).slice(0, 30))
    msg = _error(read_orc(str(tmp_path / "t.orc"), ["a"]))
    assert "t.orc" in msg and "its stripes hold 30 rows, the footer lists 40" in msg


def test_a_column_name_that_is_not_utf8_names_the_file(tmp_path):
    """A footer whose column name bytes are not UTF-8 (the fuzz study's damaged Parquet, seed 28
    case 35): pyarrow raises UnicodeDecodeError while it builds the column paths, in the preflight's
    header, the row count from the footers and the reader alike; each is the DataError of a damaged file."""
    from ember.source.config import DataConfig
    from ember.source.protocol import source_for
    from ember.train.preflight import check_data

    path = tmp_path / "names.parquet"
    pq.write_table(pa.table({"y": [0, 1], "colé": [1, 2]}), path, store_schema=False)
    body = path.read_bytes()
    assert body.count("colé".encode()) == 2  # the schema and the column chunk's path
    path.write_bytes(body.replace("colé".encode(), b"col\xc3\x28"))  # a lead byte, then no continuation
    data = DataConfig.parse({"format": "parquet", "train": [str(path)], "shuffle_buffer": 0}, where="data")
    for read in (lambda: check_data(data, ["y"], "train"), lambda: _read_all(read_parquet(str(path), ["y"])),
                 lambda: source_for(data).count("train")):
        with pytest.raises(DataError, match="names.parquet.*cannot be read, the file is truncated, damaged"):
            read()
