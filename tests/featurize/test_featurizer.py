import numpy as np
import pyarrow as pa
import pytest

from ember.errors import DataError, SchemaError
from ember.featurize.featurizer import Featurizer
from ember.featurize.hashing import hash_array
from ember.featurize.schema import Schema
from ember.source.bad_rows import BadRowReport


def _schema(**sparse_extra):
    return Schema.parse({
        "labels": ["y"],
        "dense": [{"name": "d", "log1p": True}],
        "sparse": [{"name": "tags", "separator": "|", "weight_column": "w", "max_length": 2, **sparse_extra},
                   {"name": "u"}],
    })


def test_multi_hot_weights_truncation_and_layout():
    rb = pa.record_batch({
        "y": ["1", "0", "0"], "d": ["3", "", "1"],
        "tags": ["a|b|c", None, "b||a"], "w": ["1|2|3", None, "0.5||4"], "u": ["x", "x", None],
    })
    b = Featurizer(_schema())(rb).to_batch()
    b.sparse.validate()
    assert b.sparse.keys == ("tags", "u")
    assert b.sparse.lengths.tolist() == [2, 0, 2, 1, 1, 0]
    a, bb, c = hash_array(pa.array(["a", "b", "c"]), "tags")[0]
    x = hash_array(pa.array(["x"]), "u")[0][0]
    assert b.sparse.values.tolist() == [a, bb, bb, a, x, x]
    assert b.sparse.weights.tolist() == [1, 2, 0.5, 4, 1, 1]
    np.testing.assert_allclose(b.dense[:, 0].numpy(), np.log1p([3, 0, 1]), rtol=1e-6)
    assert b.labels.shape == (3, 1) and b.dense.dtype == b.labels.dtype


def test_list_columns_and_int_ids():
    schema = Schema.parse({"labels": ["y"], "sparse": [
        {"name": "l"}, {"name": "i", "hash_ids": False}, {"name": "s", "hash_ids": False}]})
    rb = pa.record_batch({
        "y": pa.array([1, 0], pa.int8()),
        "l": pa.array([[1, 2, 3], None], pa.list_(pa.int64())),
        "i": pa.array([7, None], pa.int64()),
        "s": pa.array(["-4", "5"]),
    })
    b = Featurizer(schema)(rb).to_batch()
    assert b.sparse.lengths.tolist() == [3, 0, 1, 0, 1, 1]
    assert b.sparse.values.tolist()[3:] == [7, -4, 5]
    assert b.dense.shape == (2, 0)


def test_error_names_file_row_column_value_and_fix():
    rb = pa.record_batch({"y": ["1", "0", "1"], "d": ["1", "2", "oops"], "tags": ["a"] * 3,
                          "w": ["1"] * 3, "u": ["x"] * 3})
    with pytest.raises(DataError) as e:
        Featurizer(_schema())(rb, "f.csv", first_row=10)
    msg = str(e.value)
    assert "f.csv row 12" in msg and "'d'" in msg and "'oops'" in msg and "on_bad_rows: skip" in msg


def test_earliest_bad_row_is_reported():
    rb = pa.record_batch({"y": ["1", None, "1"], "d": ["1", "2", "x"], "tags": ["a"] * 3,
                          "w": ["1"] * 3, "u": ["x"] * 3})
    with pytest.raises(DataError, match=r"row 3, column 'y': label is missing"):
        Featurizer(_schema())(rb, "f.csv", first_row=2)


def test_skip_counts_per_reason():
    rb = pa.record_batch({
        "y": ["1", None, "2", "x", "0", "1"], "d": ["1", "1", "1", "1", "bad", "1"],
        "tags": ["a|b"] * 6, "w": ["1|2", "1|2", "1|2", "1|2", "1|2", "1"], "u": ["x"] * 6,
    })
    report = BadRowReport("skip")
    rows = Featurizer(_schema(), report)(rb)
    assert len(rows) == 1
    assert report.counts == {"y: label is missing": 1, "y: label is not in [0, 1]": 1,
                             "y: label is not a number": 1, "d: not a number": 1,
                             "w: weights do not match the values of 'tags'": 1}
    assert report.rows_read == 6 and "skipped 5 bad rows" in str(report)


def test_missing_column_is_a_schema_error():
    with pytest.raises(SchemaError, match="'u'"):
        Featurizer(_schema())(pa.record_batch({"y": ["1"], "d": ["1"], "tags": ["a"], "w": ["1"]}))


# ---- column types (found by tests/fuzz) ---------------------------------------------------------


@pytest.mark.parametrize("column, values, role", [
    ("y", [[1], [0]], "label"),
    ("d", [{"a": 1}, {"a": 2}], "dense feature 'd'"),
])
def test_a_column_of_the_wrong_type_is_a_schema_error_naming_file_and_column(column, values, role):
    cols = {"y": [1, 0], "d": [1.0, 2.0], "c": ["a", "b"], column: values}
    schema = Schema(labels=["y"], dense=[{"name": "d"}], sparse=[{"name": "c"}])
    with pytest.raises(SchemaError) as e:
        Featurizer(schema)(pa.record_batch(cols), "f.parquet")
    assert f"f.parquet: {role} (column '{column}')" in str(e.value) and "one number" in str(e.value)


def test_decimal_dense_and_missing_values_on_binary_and_bool_columns():
    import decimal

    schema = Schema(labels=["y"], dense=[{"name": "d"}], sparse=[{"name": "b"}, {"name": "t"}], missing_values=[""])
    rb = pa.record_batch({"y": [1, 0], "d": pa.array([decimal.Decimal("1.5"), None], pa.decimal128(5, 2)),
                          "b": pa.array([b"", b"x"]), "t": pa.array([True, False])})
    batch = Featurizer(schema)(rb).to_batch()
    assert batch.dense[:, 0].tolist() == [1.5, 0.0]
    assert batch.sparse["b"].lengths.tolist() == [0, 1]  # b"" is listed as missing, like ""
    assert batch.sparse["t"].lengths.tolist() == [1, 1]


def test_a_column_read_twice_is_refused_naming_file_and_column():
    """Which copy of a repeated column holds the values would be a guess: refused, with both named."""
    cols = [pa.array(["1", "0"]), pa.array(["3", "4"]), pa.array(["5", "6"]), pa.array(["a", "b"]),
            pa.array(["1", "1"]), pa.array(["x", "y"])]
    rb = pa.RecordBatch.from_arrays(cols, names=["y", "d", "d", "tags", "w", "u"])
    with pytest.raises(SchemaError, match=r"f\.parquet: column 'd' appears 2 times \(columns 2, 3\)"):
        Featurizer(_schema())(rb, "f.parquet")
    # a repeated column nothing reads is harmless
    rb = pa.RecordBatch.from_arrays([*cols[:2], *cols[3:], pa.array([1, 2]), pa.array([3, 4])],
                                    names=["y", "d", "tags", "w", "u", "z", "z"])
    assert Featurizer(_schema())(rb).to_batch().labels[:, 0].tolist() == [1.0, 0.0]


def test_a_table_is_featurized_as_its_record_batch():
    rb = pa.record_batch({"y": ["1", "0", "0"], "d": ["3", "", "1"], "tags": ["a|b|c", None, "b||a"],
                          "w": ["1|2|3", None, "0.5||4"], "u": ["x", "x", None]})
    want = Featurizer(_schema())(rb).to_batch()
    table = pa.Table.from_batches([rb.slice(0, 1), rb.slice(1)])  # two chunks
    got = Featurizer(_schema())(table).to_batch()
    assert got.sparse.values.tolist() == want.sparse.values.tolist()
    assert got.sparse.lengths.tolist() == want.sparse.lengths.tolist()
    assert got.labels.tolist() == want.labels.tolist() and got.dense.tolist() == want.dense.tolist()
    assert Featurizer(_schema())(table.slice(0, 0)).to_batch().labels.shape == (0, 1)
