"""An empty category string is a category (its own ID) unless the schema lists it in
``missing_values``; null is always missing. Checked on record batches and through CSV and
Parquet files."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ember.errors import ConfigError, DataError
from ember.featurize.featurizer import Featurizer
from ember.featurize.hashing import hash_array
from ember.featurize.schema import Schema
from ember.source.csv import read_csv
from ember.source.parquet import read_parquet


def _schema(**extra) -> Schema:
    sparse = extra.pop("sparse", [{"name": "c"}])
    return Schema.parse({"labels": ["y"], "sparse": sparse, **extra})


def _ids(schema: Schema, batch: pa.RecordBatch) -> list[list[int]]:
    b = Featurizer(schema)(batch).to_batch()
    out, start = [], 0
    for n in b.sparse.lengths.tolist():
        out.append(b.sparse.values[start:start + n].tolist())
        start += n
    return out


def _hash(value: str, salt: str = "c") -> int:
    return int(hash_array(pa.array([value]), salt)[0][0])


BATCH = pa.record_batch({"y": ["1", "0", "0", "1"], "c": ["a", "", None, "-1"]})


def test_empty_string_is_a_category_and_null_is_missing_by_default():
    assert _ids(_schema(), BATCH) == [[_hash("a")], [_hash("")], [], [_hash("-1")]]
    assert _hash("") != _hash("a")


def test_schema_wide_and_per_feature_missing_values():
    assert _ids(_schema(missing_values=[""]), BATCH) == [[_hash("a")], [], [], [_hash("-1")]]
    assert _ids(_schema(missing_values=["", "-1"]), BATCH) == [[_hash("a")], [], [], []]
    # a feature's own list replaces the schema's (here: nothing is missing but null)
    own = _schema(missing_values=[""], sparse=[{"name": "c", "missing_values": []}])
    assert _ids(own, BATCH) == [[_hash("a")], [_hash("")], [], [_hash("-1")]]
    with pytest.raises(ConfigError, match="missing_values"):
        _schema(missing_values="")


def test_multi_hot_empty_tokens_stay_no_value_and_listed_tokens_are_dropped():
    rb = pa.record_batch({"y": ["0"] * 3, "c": ["a||b|", "", "a|NA"]})
    a, b = _hash("a"), _hash("b")
    assert _ids(_schema(sparse=[{"name": "c", "separator": "|"}]), rb) == [[a, b], [], [a, _hash("NA")]]
    assert _ids(_schema(sparse=[{"name": "c", "separator": "|", "missing_values": ["NA"]}]), rb) == [[a, b], [], [a]]


def test_integer_ids_take_listed_values_as_missing_not_as_bad():
    strings = pa.record_batch({"y": ["0"] * 4, "c": ["5", "", "-1", "NA"]})
    ints = pa.record_batch({"y": ["0"] * 3, "c": pa.array([5, -1, None], pa.int64())})
    plain = _schema(sparse=[{"name": "c", "hash_ids": False}])
    with pytest.raises(DataError, match="not an integer ID"):
        _ids(plain, strings)  # "NA" is not an ID and not listed
    listed = _schema(sparse=[{"name": "c", "hash_ids": False, "missing_values": ["-1", "NA"]}])
    assert _ids(listed, strings) == [[5], [], [], []]  # "" cannot be an integer: no ID
    assert _ids(plain, ints) == [[5], [-1], []]
    assert _ids(listed, ints) == [[5], [], []]
    assert _ids(_schema(sparse=[{"name": "c", "missing_values": ["-1"]}]), ints) == [[int(hash_array(pa.array([5]), "c")[0][0])], [], []]


@pytest.mark.parametrize("missing_values, want_empty", [([], True), ([""], False)])
def test_csv_and_parquet_files_agree(tmp_path: Path, missing_values: list[str], want_empty: bool):
    csv = tmp_path / "t.csv"
    csv.write_text('y,c,n\n1,a,1\n0,,\n0,"",2\n')  # an empty field and a quoted empty string
    parquet = tmp_path / "t.parquet"
    pq.write_table(pa.table({"y": ["1", "0", "0", "1"], "c": ["a", "", "", None], "n": ["1", None, "2", "3"]}), parquet)
    schema = _schema(dense=[{"name": "n", "fill": -1.0}], missing_values=missing_values)
    empty = [_hash("")] if want_empty else []
    csv_rows = Featurizer(schema)(next(read_csv(str(csv), schema.columns)).batch)
    pq_rows = Featurizer(schema)(next(read_parquet(str(parquet), schema.columns)).batch)
    assert _ids(schema, next(read_csv(str(csv), schema.columns)).batch) == [[_hash("a")], empty, empty]
    assert _ids(schema, next(read_parquet(str(parquet), schema.columns)).batch) == [[_hash("a")], empty, empty, []]
    # an empty numeric field is still a missing number (filled), in both formats
    np.testing.assert_array_equal(csv_rows.dense[:, 0], [1.0, -1.0, 2.0])
    np.testing.assert_array_equal(pq_rows.dense[:, 0], [1.0, -1.0, 2.0, 3.0])


@pytest.mark.parametrize("one_pass", [True, False])
def test_an_integer_id_past_int64_is_named_as_such_not_as_text(one_pass, monkeypatch):
    from ember.source.bad_rows import BadRowReport

    monkeypatch.setattr(Featurizer, "one_pass", one_pass)
    wide = "an integer ID outside the int64 range (hash_ids: true takes IDs of any length)"
    for sparse in ({"name": "c", "hash_ids": False}, {"name": "c", "hash_ids": False, "separator": "|"}):
        with pytest.raises(DataError, match=r"row 2, column 'c': an integer ID outside the int64 range .*"
                                            r"got '-?9{20}'"):
            _ids(_schema(sparse=[sparse]), pa.record_batch({"y": ["0"] * 2, "c": ["5", "99999999999999999999"]}))
        report = BadRowReport("skip")
        batch = pa.record_batch({"y": ["0"] * 4, "c": ["5", " 99999999999999999999 ", "x7", "-9223372036854775809"]})
        Featurizer(_schema(sparse=[sparse]), report)(batch)
        assert report.counts == {f"c: {wide}": 2, "c: not an integer ID": 1}
