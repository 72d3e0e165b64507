"""The buffer path of ``hash_array`` (native core, or its fallback under EMBER_NATIVE=0) equals
the array-level reference on fuzzed Arrow arrays: nulls, empty and long strings, slices,
large_string / binary, chunked, and every integer width."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from ember import _native
from ember.featurize.hashing import hash_array, hash_array_reference, salt_key

STRING_TYPES = [pa.string(), pa.large_string(), pa.binary(), pa.large_binary()]
INT_TYPES = [pa.int8(), pa.int16(), pa.int32(), pa.int64(), pa.uint8(), pa.uint16(), pa.uint32(), pa.uint64()]


def _strings(rng: np.random.Generator, n: int) -> list[str | None]:
    out: list[str | None] = []
    for _ in range(n):
        r = rng.random()
        if r < 0.15:
            out.append(None)
        elif r < 0.25:
            out.append("")
        else:
            k = int(rng.choice([1, 7, 8, 9, 16, 17, 40])) if rng.random() < 0.7 else int(rng.integers(0, 64))
            out.append("".join(rng.choice(list("abc0123456789é€"), size=k)))
    return out


def _same(values: pa.Array | pa.ChunkedArray, salt: str = "C1") -> None:
    ids, valid = hash_array(values, salt)
    ref_ids, ref_valid = hash_array_reference(values, salt)
    assert ids.dtype == np.int64 and valid.dtype == np.bool_ and ids.shape == valid.shape == (len(values),)
    np.testing.assert_array_equal(valid, ref_valid)
    np.testing.assert_array_equal(ids[valid], ref_ids[valid])


@pytest.mark.parametrize("typ", STRING_TYPES, ids=str)
@pytest.mark.parametrize("seed", range(6))
def test_string_buffers_hash_like_the_reference(typ, seed):
    rng = np.random.default_rng(seed)
    vals = _strings(rng, int(rng.integers(0, 300)))
    arr = pa.array([v if v is None or not pa.types.is_binary(typ) and not pa.types.is_large_binary(typ)
                    else v.encode() for v in vals], typ)
    _same(arr)
    if len(arr) > 2:
        a, b = sorted(int(x) for x in rng.integers(0, len(arr), 2))
        _same(arr.slice(a, b - a))  # an offset into shared buffers, validity bits not byte-aligned
        _same(arr.slice(a))
    _same(pa.chunked_array([arr, arr.slice(len(arr) // 2)], typ))


@pytest.mark.parametrize("typ", INT_TYPES, ids=str)
@pytest.mark.parametrize("seed", range(4))
def test_integer_buffers_hash_like_the_reference(typ, seed):
    rng = np.random.default_rng(seed)
    info = np.iinfo(typ.to_pandas_dtype())
    n = int(rng.integers(0, 300))
    raw = rng.integers(info.min, info.max, size=n, dtype=typ.to_pandas_dtype(), endpoint=True)
    mask = rng.random(n) < 0.2
    arr = pa.array(raw, typ, mask=mask)
    _same(arr)
    if n > 2:
        a = int(rng.integers(1, n))
        _same(arr.slice(a, n - a))
        _same(pa.array(raw, typ).slice(1, n - 1))  # no validity buffer at all


def test_a_string_and_its_dictionary_encoding_and_a_long_value_hash_alike():
    arr = pa.array(["x" * 5000, None, "68fd1e64", "68fd1e64", ""])
    _same(arr)
    ids, valid = hash_array(arr.dictionary_encode(), "C9")
    ref, _ = hash_array(arr, "C9")
    assert (ids[valid] == ref[valid]).all() and valid.tolist() == [True, False, True, True, True]


def test_a_known_id_is_kept():
    # the value documented in hash_strings' docstring: the fast path changes no ID
    assert int(hash_array(pa.array(["68fd1e64"]), "C1")[0][0]) == 8589935920311878028


@pytest.mark.parametrize("kernel", ["strings", "ints"])
def test_the_kernel_and_its_fallback_agree_and_reject_short_buffers(kernel):
    rng = np.random.default_rng(7)
    if kernel == "strings":
        arr = pa.array(_strings(rng, 257))
        bufs = arr.buffers()
        args = (bufs[1], bufs[2], bufs[0], 3, 250, 4)
        fns = (_native.arrow_hash_strings, _native._arrow_hash_strings_py)
        short = (bufs[1], b"", b"", 0, 250, 4)  # offsets point past the (empty) data
    else:
        arr = pa.array(rng.integers(-(2**62), 2**62, 257), pa.int64(), mask=rng.random(257) < 0.3)
        bufs = arr.buffers()
        args = (bufs[1], bufs[0], 3, 250, 8, True)
        fns = (_native.arrow_hash_ints, _native._arrow_hash_ints_py)
        short = (bufs[1], b"\xff", 0, 250, 8, True)  # a bitmap of 8 bits for 250 values
    key = int(salt_key("f"))
    results = []
    for fn in fns:
        out, ok = np.empty(250, np.int64), np.empty(250, np.bool_)
        nulls = fn(*args, key, out, ok)
        assert nulls == int((~ok).sum())
        results.append((out, ok))
        with pytest.raises(ValueError):
            fn(*short, key, np.empty(250, np.int64), np.empty(250, np.bool_))
    np.testing.assert_array_equal(results[0][1], results[1][1])
    np.testing.assert_array_equal(results[0][0], results[1][0])


@pytest.mark.parametrize("typ", STRING_TYPES, ids=str)
@pytest.mark.parametrize("listed", [[""], ["", "a"], ["a", "7"]])
def test_listed_values_found_from_the_offsets_as_by_is_in(typ, listed):
    import pyarrow.compute as pc

    from ember.featurize.transforms import is_listed

    rng = np.random.default_rng(3)
    binary = pa.types.is_binary(typ) or pa.types.is_large_binary(typ)
    vals = [v if v is None or not binary else v.encode() for v in _strings(rng, 200) + ["a", "7"]]
    arr = pa.array(vals, typ)
    for a in (arr, arr.slice(13, 101), arr.slice(0, 0)):
        value_set = pa.array([v.encode() if binary else v for v in listed], typ)
        expect = np.asarray(pc.fill_null(pc.is_in(a, value_set=value_set), False), dtype=bool)
        np.testing.assert_array_equal(is_listed(a, listed), expect)


def _id_tokens(rng: np.random.Generator, n: int) -> list[str | None]:
    pool = ["", "-", "0", "-0", "0007", "5-", "--1", "9223372036854775807", "-9223372036854775808",
            "9223372036854775808", "-9223372036854775809", "9999999999999999999", "12345678901234567890", "1.5", " 3",
            "+4", "x"]
    out: list[str | None] = []
    for _ in range(n):
        r = rng.random()
        if r < 0.1:
            out.append(None)
        elif r < 0.3:
            out.append(str(rng.choice(pool)))
        else:
            out.append(str(int(rng.integers(-(2**63), 2**63 - 1))))
    return out


@pytest.mark.parametrize("typ", [pa.string(), pa.large_string()], ids=str)
@pytest.mark.parametrize("seed", range(8))
def test_integer_ids_parsed_from_the_buffers_as_by_the_general_path(typ, seed, monkeypatch):
    from ember.featurize import transforms

    rng = np.random.default_rng(seed)
    tokens = _id_tokens(rng, int(rng.integers(1, 200)))
    if seed % 2:  # only digits and '-': the buffer path decides alone
        tokens = [t if t is None or set(t) <= set("-0123456789") else "" for t in tokens]
    arr = pa.array(tokens, typ)
    for a in (arr, arr.slice(len(arr) // 3)):
        got = transforms.parse_ints(a)
        with monkeypatch.context() as m:
            m.setattr(transforms, "_buffer_ints", lambda _: None)
            ref = transforms.parse_ints(a)
        for g, r in zip(got, ref):
            np.testing.assert_array_equal(g, r)


def test_the_parse_kernel_and_its_fallback_agree():
    rng = np.random.default_rng(5)
    tokens = [t if t is None or set(t) <= set("-0123456789") else "7" for t in _id_tokens(rng, 300)]
    arr = pa.array(tokens)
    bufs = arr.buffers()
    results = []
    for fn in (_native.arrow_parse_ints, _native._arrow_parse_ints_py):
        out, state = np.empty(290, np.int64), np.empty(290, np.uint8)
        bad = fn(bufs[1], bufs[2], bufs[0], 10, 290, 4, out, state)
        assert bad == int((state == 2).sum()) >= 0
        results.append((out, state))
        foreign = pa.array(["1", " 2"]).buffers()
        assert fn(foreign[1], foreign[2], b"", 0, 2, 4, np.empty(2, np.int64), np.empty(2, np.uint8)) == -1
    np.testing.assert_array_equal(results[0][0], results[1][0])
    np.testing.assert_array_equal(results[0][1], results[1][1])


@pytest.mark.parametrize("typ", [pa.string(), pa.large_string()], ids=str)
@pytest.mark.parametrize("seed", range(8))
def test_integer_counts_parsed_as_floats_from_the_buffers_as_by_the_general_path(typ, seed, monkeypatch):
    from ember.featurize import transforms

    rng = np.random.default_rng(100 + seed)
    tokens = _id_tokens(rng, int(rng.integers(1, 200))) + ["-0", "0", "", "-00"][: seed % 5]
    if seed % 2:  # plain integers and empty fields only: the buffer path decides alone
        tokens = [t if t is None or (set(t) <= set("0123456789") and len(t) < 19) else "" for t in tokens]
    arr = pa.array(tokens, typ)
    for a in (arr, arr.slice(len(arr) // 3)):
        got = transforms.parse_floats(a)
        with monkeypatch.context() as m:
            m.setattr(transforms, "_buffer_int_floats", lambda _: None)
            ref = transforms.parse_floats(a)
        for g, r in zip(got, ref):
            assert g.dtype == r.dtype
            np.testing.assert_array_equal(g, r)
        assert np.array_equal(np.signbit(got[0]), np.signbit(ref[0]))  # -0.0 stays -0.0


def test_the_float_buffer_path_takes_plain_counts_and_leaves_minus_zero_to_arrow():
    from ember.featurize import transforms

    assert transforms._buffer_int_floats(pa.array(["-0", "5", ""])) is None
    values, missing, bad = transforms.parse_floats(pa.array(["-0", "5", ""]))
    assert np.signbit(values[0]) and missing.tolist() == [False, False, True] and not bad.any()
    values, missing, bad = transforms._buffer_int_floats(pa.array(["0", "-5", "", None, "9007199254740993"]))
    assert values[:2].tolist() == [0.0, -5.0] and values[4] == float("9007199254740993")
    assert missing.tolist() == [False, False, True, True, False] and not bad.any()
