import numpy as np
import pyarrow as pa
import pytest

from ember.errors import ConfigError
from ember.featurize.presets import preset_data_defaults, preset_schema
from ember.featurize.schema import DenseFeature, Schema
from ember.featurize.transforms import dense_transform, parse_floats, parse_ints


def test_schema_unknown_key_names_it_with_did_you_mean():
    with pytest.raises(ConfigError) as e:
        Schema.parse({"labels": ["y"], "sparse": [{"name": "a", "seperator": "|"}]}, where="schema")
    assert "schema.sparse.0.seperator" in str(e.value) and "did you mean 'separator'" in str(e.value)


def test_schema_validation():
    with pytest.raises(ConfigError, match="repeated"):
        Schema.parse({"labels": ["y"], "dense": [{"name": "a"}], "sparse": [{"name": "a"}]})
    with pytest.raises(ConfigError, match="labels"):
        Schema.parse({"labels": [], "sparse": [{"name": "a"}]})
    with pytest.raises(ConfigError, match="clip"):
        Schema.parse({"labels": ["y"], "dense": [{"name": "d", "clip": [2, 1]}], "sparse": [{"name": "a"}]})
    s = Schema.parse({"labels": "y", "sparse": [{"name": "a", "column": "col_a", "weight_column": "w"}]})
    assert s.labels == ["y"] and s.columns == ["y", "col_a", "w"] and s.sparse[0].salt_value == "a"


def test_dense_transform_matches_numpy():
    x = np.array([np.nan, -5.0, 0.0, 3.0, 1e6])
    got = dense_transform(x, fill=1.0, clip=(None, 1000.0), log1p=True, standardize=(2.0, 0.5))
    filled = np.where(np.isnan(x), 1.0, x)
    want = (np.log1p(np.maximum(np.minimum(filled, 1000.0), 0)) - 2.0) / 0.5
    np.testing.assert_allclose(got, want)
    np.testing.assert_allclose(dense_transform(x, clip=(0, 2)), [0, 0, 0, 2, 2])
    with pytest.raises(ConfigError, match="std"):
        DenseFeature.parse({"name": "d", "standardize": [0, 0]})


def test_parse_floats_and_ints():
    x, missing, bad = parse_floats(pa.array(["1", "-2.5", ".5", "3e2", "", None, "x1", "inf", " 4 "]))
    assert missing.tolist() == [False] * 4 + [True, True] + [False] * 3
    assert bad.tolist() == [False] * 6 + [True, True, False]
    np.testing.assert_allclose(x[[0, 1, 2, 3, 8]], [1, -2.5, 0.5, 300, 4])
    x, missing, bad = parse_floats(pa.array([1.0, None, float("nan"), 2.0]))
    assert missing.tolist() == [False, True, True, False] and not bad.any()
    v, missing, bad = parse_ints(pa.array(["12", "-3", "", "1.5", "99999999999999999999", "9223372036854775807"]))
    assert v[[0, 1, 5]].tolist() == [12, -3, 2**63 - 1]
    assert missing.tolist() == [False, False, True, False, False, False]
    assert bad.tolist() == [False, False, False, True, True, False]


def test_criteo_preset():
    s = preset_schema("criteo")
    assert [d.name for d in s.dense] == [f"I{i}" for i in range(1, 14)]
    assert [f.table_name for f in s.sparse] == [f"C{i}" for i in range(1, 27)]
    assert all(d.log1p and d.clip == (0.0, None) and d.fill == 0 for d in s.dense)
    assert s.missing_values == [""]  # the dataset's empty field means missing
    d = preset_data_defaults("criteo")
    assert d["format"] == "tsv" and d["csv"]["header"] is False and len(d["csv"]["column_names"]) == 40
    with pytest.raises(ConfigError, match="unknown data preset"):
        preset_schema("avazoo")


def test_parse_ints_full_int64_range_and_overflow():
    """Full-range IDs take the one vectorised cast; a token past int64 is bad, not wrapped."""
    import pyarrow as pa

    from ember.featurize.transforms import parse_ints

    values, missing, bad = parse_ints(pa.array(["1", " 9223372036854775807", "-9223372036854775808", "", None]))
    assert values.tolist() == [1, 2**63 - 1, -(2**63), 0, 0]
    assert missing.tolist() == [False, False, False, True, True] and not bad.any()
    values, missing, bad = parse_ints(pa.array(["9223372036854775808", "7", "x"]))
    assert bad.tolist() == [True, False, True] and values[1] == 7


def test_sign_log1p_keeps_the_sign_and_order_of_negative_values():
    x = np.array([np.nan, -1e6, -3.0, -0.5, 0.0, 0.5, 3.0, 1e6])
    got = dense_transform(x, fill=-2.0, clip=(-1000.0, None), sign_log1p=True, standardize=(1.0, 2.0))
    filled = np.clip(np.where(np.isnan(x), -2.0, x), -1000.0, None)
    np.testing.assert_allclose(got, (np.sign(filled) * np.log1p(np.abs(filled)) - 1.0) / 2.0)
    plain = dense_transform(x[1:], sign_log1p=True)
    assert np.all(np.diff(plain) > 0) and plain[3] == 0.0  # strictly increasing, 0 -> 0
    np.testing.assert_allclose(plain, -plain[::-1])  # odd: -x -> -f(x)
    with pytest.raises(ValueError, match="pick one"):
        dense_transform(x, log1p=True, sign_log1p=True)
    with pytest.raises(ConfigError, match="'d': log1p and sign_log1p exclude each other"):
        DenseFeature.parse({"name": "d", "log1p": True, "sign_log1p": True})


def test_featurizer_applies_sign_log1p_to_a_text_column():
    from ember.featurize.featurizer import Featurizer

    schema = Schema.parse({"labels": ["y"], "dense": [{"name": "delta", "sign_log1p": True}, {"name": "n", "log1p": True}],
                           "sparse": [{"name": "c"}]})
    rb = pa.record_batch({"y": ["0", "1", "0"], "delta": ["-9", "", "9"], "n": ["-9", "0", "9"], "c": ["a", "b", "c"]})
    dense = Featurizer(schema)(rb).dense
    np.testing.assert_allclose(dense[:, 0], [-np.log(10), 0.0, np.log(10)], rtol=1e-6)
    np.testing.assert_allclose(dense[:, 1], [0.0, 0.0, np.log(10)], rtol=1e-6)  # log1p: negatives -> 0


def test_parse_ints_fast_path_matches_the_integer_syntax(monkeypatch):
    """The one-cast path for plain columns gives what the regex path gives on any tokens, and
    plain columns (full-range IDs, empties, nulls) take it."""
    import pyarrow as pa

    import ember.featurize.transforms as T

    rng = np.random.default_rng(7)
    alphabet = list("0123456789") * 3 + list("-+ x./")
    tokens = ["".join(rng.choice(alphabet, size=rng.integers(0, 22))) for _ in range(3000)]
    tokens += ["-0000000000000000001", "00000000000000000001", "0x10", "9223372036854775808", "-", "5-", "1.", ""]
    plain = [str(v) for v in rng.integers(-(2**63), 2**63 - 1, 500, dtype=np.int64)] + ["", "0", "-0", "007"]
    fast_path = T._plain_ints
    for values in [tokens, plain, plain + [None], plain[:3] + ["1 "], *([t] for t in tokens[-600:])]:
        for typ in (pa.string(), pa.large_string()):
            for arr in (pa.array(values, typ), pa.array(["x", *values], typ)[1:]):  # also a slice
                got = T.parse_ints(arr)
                monkeypatch.setattr(T, "_plain_ints", lambda a: None)
                want = T.parse_ints(arr)
                monkeypatch.setattr(T, "_plain_ints", fast_path)
                for g, w in zip(got, want):
                    np.testing.assert_array_equal(g, w)
    assert T._plain_ints(pa.array(plain + [None])) is not None
    assert T._plain_ints(pa.array(tokens)) is None


@pytest.mark.parametrize("key, value", [("fill", float("nan")), ("fill", float("inf")), ("clip", [None, float("inf")]),
                                        ("standardize", [float("nan"), 1.0]), ("standardize", [0.0, float("inf")])])
def test_a_dense_transform_with_a_value_that_is_no_finite_number_is_refused(key, value):
    # a NaN fill or standardize made every score NaN; an unbounded clip side is null
    with pytest.raises(ConfigError, match=r"Input should be a finite number"):
        Schema.parse({"labels": ["y"], "dense": [{"name": "n", key: value}], "sparse": [{"name": "c"}]})
