import re

import pyarrow as pa
import pyarrow.orc as orc
import pyarrow.parquet as pq
import pytest

from ember.errors import ConfigError, DataError, SchemaError
from ember.source.bad_rows import BadRowReport
from ember.source.config import DataConfig
from ember.source.csv import read_csv
from ember.source.file_source import FileSource
from ember.source.files import expand_paths
from ember.source.orc import read_orc
from ember.source.parquet import read_parquet


def _rows(chunks):
    out = {}
    for c in chunks:
        for k, v in c.batch.to_pydict().items():
            out.setdefault(k, []).extend(v)
    return out


def test_csv_with_header_keeps_hex_strings_and_missing(tmp_path):
    p = tmp_path / "a.csv"
    p.write_text("y,n,c\n1,5,00ab\n0,,1e5\n")
    chunks = list(read_csv(str(p), ["y", "c", "n"]))
    assert chunks[0].first_row == 2
    assert _rows(chunks) == {"y": ["1", "0"], "c": ["00ab", "1e5"], "n": ["5", ""]}  # empty field: "" (never null)


def test_tsv_without_header_small_blocks_row_numbers(tmp_path):
    p = tmp_path / "a.tsv"
    p.write_text("".join(f"{i % 2}\tv{i}\n" for i in range(1000)))
    chunks = list(read_csv(str(p), ["y", "c"], delimiter="\t", header=False, column_names=["y", "c"],
                           block_bytes=4096))
    assert len(chunks) > 1
    assert [c.first_row for c in chunks][:2] == [1, 1 + chunks[0].batch.num_rows]
    assert _rows(chunks)["c"] == [f"v{i}" for i in range(1000)]


def test_csv_no_trailing_newline_and_gzip(tmp_path):
    import gzip
    p = tmp_path / "a.csv.gz"
    with gzip.open(p, "wt") as f:
        f.write("y,c\n1,a\n0,b")
    assert _rows(read_csv(str(p), ["c"]))["c"] == ["a", "b"]


def test_csv_wrong_field_count_error_names_file_and_row(tmp_path):
    p = tmp_path / "bad.csv"
    p.write_text("y,c\n1,a\n0,b\n1,c,extra\n0,d\n")
    chunks = read_csv(str(p), ["y", "c"], block_bytes=4096)
    first = next(chunks)  # the good rows before the bad line come first
    assert first.batch.num_rows == 2
    with pytest.raises(DataError) as e:
        next(chunks)
    assert "bad.csv row 4" in str(e.value) and "1,c,extra" in str(e.value) and "on_bad_rows: skip" in str(e.value)


def test_csv_wrong_field_count_skip_counts(tmp_path):
    p = tmp_path / "bad.csv"
    p.write_text("y,c\n1,a\n0\n1,c,extra\n0,d\n")
    report = BadRowReport("skip")
    assert _rows(read_csv(str(p), ["y", "c"], report=report))["c"] == ["a", "d"]
    assert report.counts == {"<row>: wrong number of fields": 2}


def test_csv_missing_column(tmp_path):
    p = tmp_path / "a.csv"
    p.write_text("y,c\n1,a\n")
    with pytest.raises(SchemaError, match=r"\['zz'\] not found"):
        list(read_csv(str(p), ["y", "zz"]))


def test_parquet_and_orc_with_list_columns(tmp_path):
    t = pa.table({
        "y": pa.array([1, 0, 1], pa.int8()),
        "tags": pa.array([["a", "b"], [], None], pa.list_(pa.string())),
        "w": pa.array([[1.0, 2.0], [], None], pa.list_(pa.float32())),
        "n": [1.5, None, 3.0],
    })
    pq.write_table(t, tmp_path / "a.parquet", row_group_size=2)
    orc.write_table(t, str(tmp_path / "a.orc"))
    for chunks in (read_parquet(str(tmp_path / "a.parquet"), ["y", "tags", "w"], read_rows=2),
                   read_orc(str(tmp_path / "a.orc"), ["y", "tags", "w"], read_rows=2)):
        chunks = list(chunks)
        assert [c.first_row for c in chunks] == [1, 3]
        assert _rows(chunks)["tags"] == [["a", "b"], [], None]
    with pytest.raises(SchemaError):
        list(read_parquet(str(tmp_path / "a.parquet"), ["nope"]))


def test_expand_paths_files_globs_dirs(tmp_path):
    for name in ["b.csv", "a.csv", "sub/c.csv", "x.txt.bak"]:
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text("y\n1\n")
    got = expand_paths([str(tmp_path)], "csv")
    assert got == [str(tmp_path / "a.csv"), str(tmp_path / "b.csv"), str(tmp_path / "sub/c.csv")]
    assert expand_paths([str(tmp_path / "*.csv")], "csv") == got[:2]
    with pytest.raises(ConfigError, match="matches no"):
        expand_paths([str(tmp_path / "none*.csv")], "csv")


def test_a_file_named_twice_is_a_config_error_naming_both_spellings(tmp_path, monkeypatch):
    """One rule for data.train, data.eval and predict --input: a file two paths name (spelled
    alike or not, or matched by a directory or glob) is refused, never read twice an epoch
    (``[t.csv, ./t.csv]``) nor silently once (``[t.csv, t.csv]``: fewer rows predicted than given)."""
    (tmp_path / "d").mkdir()
    for name in ("t.csv", "d/u.csv"):
        (tmp_path / name).write_text("y\n1\n")
    monkeypatch.chdir(tmp_path)
    for paths, first, second in [(["t.csv", "t.csv"], "'t.csv'", "'t.csv'"),
                                 (["t.csv", "./t.csv"], "'t.csv'", "'./t.csv'"),
                                 (["t.csv", str(tmp_path / "t.csv")], "'t.csv'", repr(str(tmp_path / "t.csv"))),
                                 (["d", "d/u.csv"], "'d' (as 'd/u.csv')", "'d/u.csv'"),
                                 (["d/u.csv", "d/*.csv"], "'d/u.csv'", "'d/*.csv' (as 'd/u.csv')")]:
        with pytest.raises(ConfigError, match=rf"the data paths: the file .* is named twice, {re.escape(first)} and "
                                              rf"{re.escape(second)}; name each file once"):
            expand_paths(paths, "csv")
    assert expand_paths(["t.csv", "d"], "csv") == ["t.csv", "d/u.csv"]
    with pytest.raises(ConfigError, match=r"^data.eval: the file 't.csv' is named twice, 't.csv' and './t.csv'"):
        FileSource(DataConfig(format="csv", train="t.csv", eval=["t.csv", "./t.csv"])).units("eval")  # (the key named)


def test_data_config_errors_and_preset():
    with pytest.raises(ConfigError) as e:
        DataConfig.parse({"format": "csv", "train": "x", "csv": {"delimeter": ";"}}, where="data")
    assert "data.csv.delimeter" in str(e.value) and "did you mean 'delimiter'" in str(e.value)
    with pytest.raises(ConfigError, match="column_names"):
        DataConfig.parse({"format": "csv", "train": "x", "csv": {"header": False}})
    with pytest.raises(ConfigError, match="needs data.train"):
        DataConfig.parse({"format": "parquet"})
    cfg = DataConfig.parse({"preset": "criteo", "train": "t.tsv", "csv": {"block_bytes": 8192}})
    assert cfg.csv.block_bytes == 8192 and cfg.csv.header is False and cfg.delimiter == "\t"
    assert DataConfig().format == "synthetic" and DataConfig(eval_batch_size=7).split_batch_size("eval") == 7
