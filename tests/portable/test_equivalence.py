"""The portable runtime's pieces equal ember's, value for value, on fuzzed inputs: the ID hash
(strings of any length and script, integers of any range, booleans), the canonical value rules,
the initial rows of unseen IDs, 16-bit rounding and pooling."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ember.embedding.codec import from_bits, round_nearest, to_bits
from ember.embedding.init import InitializerConfig, init_rows
from ember.embedding.pooling import pool_feature
import ember.featurize.canonical as ember_canonical_module
from ember.featurize.hashing import hash_array, hash_array_reference
from ember.portable import hashing as ph
from ember.portable import tables as pt
from ember.portable.values import canonical_value, parse_float, parse_int

texts = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=40)


@settings(max_examples=200, deadline=None)
@given(st.lists(texts, max_size=30), st.text(max_size=8))
def test_string_hash_equals_embers(values, salt):
    want, _ = hash_array(pa.array(values, pa.string()), salt)  # the native kernel where built
    assert ph.hash_strings(values, salt).tolist() == want.tolist()
    assert hash_array_reference(pa.array(values, pa.string()), salt)[0].tolist() == want.tolist()


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(-(2**63), 2**63 - 1), max_size=30), st.text(max_size=8))
def test_integer_hash_equals_embers(values, salt):
    want, _ = hash_array(pa.array(values, pa.int64()), salt)
    assert ph.hash_ints(np.array(values, dtype=np.int64), salt).tolist() == want.tolist()
    assert hash_array_reference(pa.array(values, pa.int64()), salt)[0].tolist() == want.tolist()


def test_long_strings_booleans_and_the_documented_value():
    long = ["x" * 5000, "é" * 4097, "a" * 4096, "b" * 4095, ""]
    assert ph.hash_strings(long, "s").tolist() == hash_array(pa.array(long), "s")[0].tolist()
    assert ph.hash_ints([True, False], "f").tolist() == hash_array(pa.array([True, False]), "f")[0].tolist()
    assert int(ph.hash_strings(["68fd1e64"], "C1")[0]) == 8589935920311878028
    assert ph.hash_strings([b"\xff\x00raw"], "s").tolist() == hash_array(pa.array([b"\xff\x00raw"]), "s")[0].tolist()


def test_serving_and_the_portable_runtime_share_one_canonical_value():
    # one definition (ember.portable.values), so the two can never disagree; canonical_array, the
    # Arrow path of files, is tested against it in tests/serving/test_canonical_values.py
    assert ember_canonical_module.canonical_value is canonical_value


def _parsed(fn, v):
    """("ok", None, fn(v)) or ("error", why)."""
    try:
        return ("ok", None, fn(v))
    except ValueError as e:
        return ("error", str(e))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(st.none(), st.sampled_from(["", " ", "1.5", "-2", " 3 ", "nan", "inf", "abc", "1e400", ".5",
                                                    "5.", "+7", "1_000", "٣"]), texts), max_size=12))
def test_number_and_integer_syntax_equal_the_featurizers(values):
    from ember.featurize.transforms import parse_floats, parse_ints

    x, missing, bad = parse_floats(pa.array(values, pa.string()))
    for v, xi, m, b in zip(values, x, missing, bad):
        got = _parsed(parse_float, v)
        assert got[0] == ("error" if b else "ok"), v
        assert (got[2] is None) == bool(m) if not b else True, v
        if not b and not m:
            assert got[2] == xi, v
    ids, missing, bad = parse_ints(pa.array(values, pa.string()))
    for v, i, m, b in zip(values, ids, missing, bad):
        got = _parsed(parse_int, v)
        assert got[0] == ("error" if b else "ok"), v
        if not b:
            assert got[2] == (None if m else int(i)), v


@pytest.mark.parametrize("init", [{"type": "uniform"}, {"type": "uniform", "scale": 0.3}, {"type": "normal"},
                                  {"type": "normal", "std": 0.05}, {"type": "zeros"}])
@pytest.mark.parametrize("dim", [1, 4, 7])
def test_initial_rows_equal_embers(init, dim):
    ids = np.concatenate([np.random.default_rng(dim).integers(-(2**63), 2**63 - 1, 500), [0, -1, 2**63 - 1]])
    seed = 123456789012345
    want = init_rows(torch.from_numpy(ids), dim, InitializerConfig.model_validate(init), seed).numpy()
    np.testing.assert_array_equal(pt.init_rows(ids, dim, init, seed), want)


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_16_bit_rounding_and_widening_equal_embers(dtype):
    rng = np.random.default_rng(0)
    w = np.concatenate([rng.normal(0, 1, 2000), rng.normal(0, 1e5, 100), [0.0, -0.0, 65504, 70000, -1e-8, np.inf, np.nan]])
    w = w.astype(np.float32)
    want = round_nearest(torch.from_numpy(w), dtype).numpy()
    np.testing.assert_array_equal(pt.round_nearest(w, dtype), want)
    bits = to_bits(torch.from_numpy(w), dtype)
    np.testing.assert_array_equal(pt.widen(bits.numpy(), dtype), from_bits(bits, dtype).numpy())


@pytest.mark.parametrize("pooling", ["sum", "mean", "sqrtn"])
@pytest.mark.parametrize("weighted", [False, True])
def test_pooling_equals_embers(pooling, weighted):
    rng = np.random.default_rng(1)
    rows = rng.normal(size=(9, 5)).astype(np.float32)
    counts = np.array([0, 1, 3, 5, 0, 2, 8])
    offsets = np.concatenate([[0], np.cumsum(counts)])
    inverse = rng.integers(0, 9, offsets[-1])
    weights = rng.normal(size=offsets[-1]).astype(np.float32) if weighted else None
    if weighted:
        weights[offsets[5]:offsets[6]] = 0.0  # a bag whose weights are all zero pools to zero
    want = pool_feature(torch.from_numpy(rows), torch.from_numpy(inverse), torch.from_numpy(offsets),
                        None if weights is None else torch.from_numpy(weights), pooling).numpy()
    np.testing.assert_allclose(pt.pool(rows, inverse, offsets, weights, pooling), want, rtol=1e-6, atol=1e-7)
