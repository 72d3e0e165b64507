import numpy as np
import pyarrow as pa
import pytest

from ember.featurize.hashing import hash_array, hash_ints, hash_strings, salt_key


def test_golden_values_are_stable():
    # Hard-coded from a first run: any change here changes every ID of every trained model.
    assert int(salt_key("C1")) == int(salt_key("C1"))
    assert hash_strings(pa.array(["68fd1e64", "", "abcdefghij"]), "C1").tolist() == GOLDEN_STR
    assert hash_ints(np.array([0, 1, -1, 2**62]), "C1").tolist() == GOLDEN_INT


GOLDEN_STR = [8589935920311878028, 5032920486001096797, 7536448250114568712]
GOLDEN_INT = [-4890320533847702159, -269884104763455945, 833178246733922129, 8178658492216679543]


def test_salt_changes_ids_and_equal_salts_share():
    a = pa.array(["x", "y", "z"])
    assert not np.intersect1d(hash_array(a, "f1")[0], hash_array(a, "f2")[0]).size
    assert (hash_array(a, "shared")[0] == hash_array(a, "shared")[0]).all()


def test_equal_values_equal_ids_within_batch_and_across_batches():
    ids, valid = hash_array(pa.array(["a", "b", "a", None, "b"]), "s")
    assert ids[0] == ids[2] and ids[1] == ids[4] and ids[0] != ids[1]
    assert valid.tolist() == [True, True, True, False, True]
    assert hash_array(pa.array(["b"]), "s")[0][0] == ids[1]


def test_dictionary_path_equals_direct_hash_and_slices():
    values = [f"v{i % 37}-{'x' * (i % 21)}" for i in range(500)]
    arr = pa.array(values)
    direct = hash_strings(arr, "k")
    via_dict, _ = hash_array(arr, "k")
    assert (direct == via_dict).all()
    assert (hash_strings(arr.slice(100, 50), "k") == direct[100:150]).all()
    assert (hash_array(arr.cast(pa.large_string()), "k")[0] == direct).all()
    # A string's hash depends on every byte, including across the 8-byte word boundaries.
    h = hash_strings(pa.array(["abcdefgh", "abcdefgi", "abcdefghX", "abcdefgh\x00"]), "k")
    assert len(set(h.tolist())) == 4


def test_strings_with_nulls_hash_like_without():
    arr = pa.array(["aa", None, "bbbbbbbbbbb"])
    h = hash_strings(arr, "k")
    assert h[0] == hash_strings(pa.array(["aa"]), "k")[0]
    assert h[2] == hash_strings(pa.array(["bbbbbbbbbbb"]), "k")[0]


def test_int_hash_is_bijective_and_all_int_types_agree():
    x = np.arange(-50_000, 50_000)
    ids = hash_ints(x, "f")
    assert np.unique(ids).size == x.size
    a32 = hash_array(pa.array(np.arange(10, dtype=np.int32)), "f")[0]
    a64 = hash_array(pa.array(np.arange(10, dtype=np.int64)), "f")[0]
    assert (a32 == a64).all()


def test_int_and_string_kinds_differ():
    assert hash_array(pa.array([7]), "f")[0][0] != hash_array(pa.array(["7"]), "f")[0][0]


def test_few_collisions_on_many_distinct_strings():
    arr = pa.array([f"{i:08x}" for i in range(200_000)])
    assert np.unique(hash_array(arr, "C3")[0]).size == 200_000


def test_same_ids_in_another_process_with_another_hash_seed():
    import os
    import subprocess
    import sys

    code = "import pyarrow as pa; from ember.featurize.hashing import hash_array; print(hash_array(pa.array(['a', 'b']), 'C1')[0].tolist())"
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert out.strip() == str(hash_array(pa.array(["a", "b"]), "C1")[0].tolist())


def _values(n: int = 300) -> list:
    # nulls, empty strings and values across the 8-byte word boundaries
    return [None if i % 7 == 3 else ("" if i % 11 == 5 else f"v{i % 41}" + "x" * (i % 19)) for i in range(n)]


def _plain(values: list, type_=pa.string()) -> tuple[np.ndarray, np.ndarray]:
    """The reference: hash_strings of each value on its own, in a fresh unsliced array."""
    ids = np.array([hash_strings(pa.array([v or ""], type_), "k")[0] for v in values], dtype=np.int64)
    return ids, np.array([v is not None for v in values], dtype=bool)


@pytest.mark.parametrize("type_", [pa.string(), pa.large_string(), pa.binary()])
@pytest.mark.parametrize("start,length", [(3, None), (1, 5), (50, 120), (299, 1), (10, 0)])
def test_sliced_arrays_with_nulls_hash_like_unsliced(type_, start, length):
    values = _values()
    arr = pa.array([v if v is None or type_ != pa.binary() else v.encode() for v in values], type_)
    part = arr.slice(start, length)
    assert part.offset == start and (part.null_count > 0 or length in (0, 1))
    want_ids, want_valid = _plain(values[start : start + len(part)])
    ids, valid = hash_array(part, "k")
    assert valid.tolist() == want_valid.tolist()
    assert ids[valid].tolist() == want_ids[want_valid].tolist()
    # hash_strings hashes a null as "" (so it works on a dictionary with a null as well)
    assert hash_strings(part, "k").tolist() == want_ids.tolist()


def test_chunked_arrays_hash_like_the_plain_array():
    values = _values()
    arr = pa.array(values)
    chunked = pa.chunked_array([arr.slice(0, 3), arr.slice(3, 0), arr.slice(3, 100), arr.slice(103)])
    want_ids, want_valid = hash_array(arr, "k")
    ids, valid = hash_array(chunked, "k")
    assert valid.tolist() == want_valid.tolist() and ids[valid].tolist() == want_ids[want_valid].tolist()
    assert hash_strings(chunked, "k").tolist() == hash_strings(arr, "k").tolist()
    # chunks dictionary-encoded separately (different dictionaries), integers with nulls
    dicts = pa.chunked_array([arr.slice(0, 150).dictionary_encode(), arr.slice(150).dictionary_encode()])
    ids, valid = hash_array(dicts, "k")
    assert valid.tolist() == want_valid.tolist() and ids[valid].tolist() == want_ids[want_valid].tolist()
    ints = pa.array([None if i % 5 == 0 else i for i in range(40)])
    ids, valid = hash_array(pa.chunked_array([ints.slice(0, 13), ints.slice(13)]), "k")
    assert valid.tolist() == [i % 5 != 0 for i in range(40)]
    assert ids[valid].tolist() == hash_ints(np.array([i for i in range(40) if i % 5]), "k").tolist()
    assert [a.size for a in hash_array(pa.chunked_array([], pa.string()), "k")] == [0, 0]


def test_long_strings_hash_one_by_one_to_the_same_ids_quickly():
    """A 2 MiB token (found by tests/fuzz: one such CSV value took 20 s, one numpy step per
    8 bytes) hashes like the side-by-side path, in well under a second per MiB."""
    import time

    from ember.featurize import hashing

    rng = np.random.default_rng(0)
    arr = pa.array(["".join(chr(int(c)) for c in rng.integers(32, 1000, int(n))) for n in rng.integers(0, 9000, 40)]
                   + ["x" * 4097, "y" * 4096, ""])
    off = np.frombuffer(arr.buffers()[1], np.int32).astype(np.int64)
    data = np.frombuffer(arr.buffers()[2], np.uint8)
    side_by_side = hashing.hash_utf8_buffers(off, data, hashing.salt_key("f"), long_bytes=1 << 40)
    for long_bytes in (0, 7, 8, 4096):
        assert (hashing.hash_utf8_buffers(off, data, hashing.salt_key("f"), long_bytes) == side_by_side).all()
    t = time.perf_counter()
    hashing.hash_strings(pa.array(["h" * (2 << 20)]), "f")
    assert time.perf_counter() - t < 5.0  # was ~20 s
