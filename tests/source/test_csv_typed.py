"""Typed CSV reads (``read_csv(types=...)``) against the text path they stand in for: the same
batches on good data, the same errors, counts and batches on bad data, and every fallback
counted."""

from __future__ import annotations

import logging

import numpy as np
import pyarrow as pa
import pytest

from ember.errors import DataError
from ember.featurize.featurizer import Featurizer, read_types
from ember.featurize.schema import Schema
from ember.source import csv as csv_module
from ember.source.bad_rows import BadRowReport
from ember.source.csv import read_csv, typed_read_fallbacks


@pytest.fixture(autouse=True)
def _pyarrow_reads(monkeypatch):
    """These tests are about pyarrow's typed reads: no block is split natively (test_csv_split)."""
    monkeypatch.setattr(csv_module, "_SPLIT", False)


N_DENSE, N_IDS, N_HEX = 6, 5, 5
COLUMNS = ["label", *[f"I{i}" for i in range(N_DENSE)], *[f"C{i}" for i in range(N_IDS + N_HEX)]]


def _schema(**extra) -> Schema:
    return Schema.parse({
        "labels": ["label"],
        "dense": [{"name": f"I{i}", "log1p": i % 2 == 0, "sign_log1p": i % 2 == 1} for i in range(N_DENSE)],
        "sparse": [*({"name": f"C{i}", "hash_ids": False} for i in range(N_IDS)),
                   *({"name": f"C{N_IDS + i}", "missing_values": [""]} for i in range(N_HEX))],
        **extra,
    })


def _criteo_text(rows: int, sep: str, seed: int = 0) -> list[list[str]]:
    """Criteo-shaped fields: 0/1 labels, counts (negative ones, decimals, missing), integer IDs
    over int64's whole range (missing ones), 8-hex-digit IDs (empty ones)."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(rows):
        row = [str(int(rng.integers(0, 2)))]
        for _ in range(N_DENSE):
            r = rng.random()
            row.append("" if r < 0.1 else str(int(rng.integers(-3, 0))) if r < 0.2
                       else f"{rng.random() * 10:.3f}" if r < 0.25 else str(int(rng.integers(0, 10**6))))
        for _ in range(N_IDS):
            row.append("" if rng.random() < 0.05 else str(int(rng.integers(-(2**63), 2**63 - 1, dtype=np.int64))))
        for _ in range(N_HEX):
            row.append("" if rng.random() < 0.05 else f"{int(rng.integers(0, 2**32)):08x}")
        out.append(row)
    return out


def _write(tmp_path, rows: list[list[str]], sep: str = ",", name: str = "d.csv") -> str:
    path = tmp_path / name
    path.write_text(sep.join(COLUMNS) + "\n" + "".join(sep.join(r) + "\n" for r in rows))
    return str(path)


def _featurized(path: str, schema: Schema, typed: bool, policy: str = "error", sep: str = ",", block_bytes: int = 4096):
    """(batches, bad-row counts, chunk column types) of the file read typed or as text."""
    report = BadRowReport(policy)  # type: ignore[arg-type]
    featurize = Featurizer(schema, report)
    batches, types = [], []
    for chunk in read_csv(path, schema.columns, delimiter=sep, block_bytes=block_bytes, report=report,
                          types=read_types(schema) if typed else None):
        types.append({f.name: f.type for f in chunk.batch.schema})
        batches.append(featurize(chunk.batch, chunk.file, chunk.row_numbers).to_batch())
    return batches, report.counts, types


def _flat(batches) -> dict[str, np.ndarray]:
    """The batches' rows end to end, as arrays compared bit for bit."""
    out = {"labels": np.concatenate([b.labels.numpy() for b in batches]).view(np.uint32),
           "dense": np.concatenate([b.dense.numpy() for b in batches]).view(np.uint32)}
    for key in batches[0].sparse.keys:
        out[f"{key}.values"] = np.concatenate([b.sparse[key].values.numpy() for b in batches])
        out[f"{key}.lengths"] = np.concatenate([b.sparse[key].lengths.numpy() for b in batches])
    return out


def _assert_same(a, b) -> None:
    fa, fb = _flat(a), _flat(b)
    assert fa.keys() == fb.keys()
    for k in fa:
        np.testing.assert_array_equal(fa[k], fb[k], err_msg=k)


@pytest.mark.parametrize("sep", [",", "\t"])
def test_typed_reads_give_the_text_paths_batches(tmp_path, sep):
    path = _write(tmp_path, _criteo_text(700, sep), sep, "d.tsv" if sep == "\t" else "d.csv")
    schema = _schema()
    before = typed_read_fallbacks()
    text, text_bad, text_types = _featurized(path, schema, typed=False, sep=sep)
    typed, typed_bad, typed_types = _featurized(path, schema, typed=True, sep=sep)
    assert len(typed) > 3  # several blocks
    _assert_same(text, typed)
    assert text_bad == typed_bad == {}
    assert typed_read_fallbacks() == before  # every block was typed
    assert all(t["C0"] == pa.int64() and t["I0"] == pa.string() and t["C7"] == pa.string() for t in typed_types)
    assert all(set(t.values()) == {pa.string()} for t in text_types)


# (value, column): each in row 31 of 80, a block of its own under block_bytes 1 MiB
BAD_VALUES = [
    ("abc", "C1"), ("1.5", "C1"), ("+5", "C1"), (" 7 ", "C1"), ("0x1f", "C1"), ("0" * 20 + "7", "C1"),
    ("-9223372036854775809", "C1"), ("-0", "I1"), ("-0", "C1"), ("nan", "I2"), ("NA", "I2"), ("inf", "I2"), ("-inf", "I2"),
    (" 2 ", "I2"), ("1e999", "I3"), ("x", "label"), ("2", "label"), ("", "label"), ("nan(1)", "I2"),
]


@pytest.mark.parametrize("policy", ["error", "skip"])
@pytest.mark.parametrize("value,column", BAD_VALUES)
def test_a_bad_value_mid_block_is_found_as_the_text_path_finds_it(tmp_path, policy, value, column):
    rows = _criteo_text(80, ",", seed=3)
    rows[30][COLUMNS.index(column)] = value
    if value == "nan(1)":  # with a blank-padded number beside it, the text path calls nan(1) no number
        rows[50][COLUMNS.index(column)] = " 4"
    path = _write(tmp_path, rows)
    schema = _schema()
    outcome = []
    for typed in (False, True):
        try:
            outcome.append(_featurized(path, schema, typed, policy, block_bytes=1 << 20)[:2])
        except DataError as e:
            outcome.append(str(e))
    if isinstance(outcome[0], str):
        assert outcome[1] == outcome[0]
    else:
        assert not isinstance(outcome[1], str), outcome[1]
        _assert_same(outcome[0][0], outcome[1][0])
        assert outcome[0][1] == outcome[1][1]


@pytest.mark.parametrize("policy", ["error", "skip"])
@pytest.mark.parametrize("line", ["1,2,3", "1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18", '1,"2\n'])
def test_a_wrong_width_line_mid_block_is_found_as_the_text_path_finds_it(tmp_path, policy, line):
    rows = _criteo_text(60, ",", seed=4)
    path = tmp_path / "d.csv"
    text = [",".join(r) + "\n" for r in rows]
    text.insert(25, line if line.endswith("\n") else line + "\n")
    path.write_text(",".join(COLUMNS) + "\n" + "".join(text))
    outcome = []
    for typed in (False, True):
        try:
            outcome.append(_featurized(str(path), _schema(), typed, policy, block_bytes=1 << 20)[:2])
        except DataError as e:
            outcome.append(str(e))
    if isinstance(outcome[0], str):
        assert outcome[1] == outcome[0] and "row 27" in outcome[0]
    else:
        _assert_same(outcome[0][0], outcome[1][0])
        assert outcome[0][1] == outcome[1][1] and sum(outcome[0][1].values()) >= 1


def test_a_fallback_is_counted_and_logged_once(tmp_path, caplog):
    rows = _criteo_text(300, ",", seed=5)
    for i in (10, 200):
        rows[i][COLUMNS.index("C2")] = "oops"
    path = _write(tmp_path, rows)
    reason = "a value does not convert to its column's type"
    before = typed_read_fallbacks().get(reason, 0)
    with caplog.at_level(logging.INFO, logger="ember"), \
            pytest.MonkeyPatch.context() as mp:
        mp.setattr(csv_module, "_fallbacks", csv_module.Counter())  # "once per process": a fresh process
        _featurized(path, _schema(), typed=True, policy="skip", block_bytes=8192)
        counted = typed_read_fallbacks().get(reason, 0)
    assert counted == 2  # the two blocks holding a bad value, each read as text
    assert [r.getMessage() for r in caplog.records].count(
        next(r.getMessage() for r in caplog.records if reason in r.getMessage())) == 1
    assert typed_read_fallbacks().get(reason, 0) == before


def test_hazardous_text_reads_only_those_columns_as_text(tmp_path):
    """An 'x' anywhere in a block (a hex value in a hashed column) makes that block's integer
    columns text, and the batches are the text path's."""
    rows = _criteo_text(100, ",", seed=6)
    rows[40][COLUMNS.index("C8")] = "0x12"
    path = _write(tmp_path, rows)
    text = _featurized(path, _schema(), typed=False, block_bytes=1 << 20)
    typed = _featurized(path, _schema(), typed=True, block_bytes=1 << 20)
    _assert_same(text[0], typed[0])
    assert typed[2][0]["C0"] == pa.string()


def test_read_types():
    s = _schema()
    types = read_types(s)
    assert "label" not in types and "I0" not in types  # numbers: text (faster; a bad label is named by its text)
    assert types["C0"] == pa.int64()
    assert "C7" not in types  # hashed: its text is what is hashed
    assert "C0" not in read_types(s, text=["C0"])  # a key column is carried as read
    listed = Schema.parse({"labels": ["y"], "sparse": [{"name": "c", "hash_ids": False, "missing_values": ["-1"]},
                                                        {"name": "d", "hash_ids": False, "missing_values": ["NA", ""]},
                                                        {"name": "e", "hash_ids": False, "separator": "|"}]})
    assert read_types(listed) == {"d": pa.int64()}  # "-01" is no "-1": c stays text
    two_roles = Schema.parse({"labels": ["y"], "dense": [{"name": "n"}], "sparse": [{"name": "n2", "column": "n"}]})
    assert read_types(two_roles) == {}
    scoring = Schema.parse({"labels": ["y"], "sparse": [{"name": "c", "hash_ids": False}], "score_only": True})
    assert read_types(scoring) == {"c": pa.int64()}


@pytest.mark.parametrize("policy", ["error", "skip"])
@pytest.mark.parametrize("value", ["inf", "-inf", "1e999", "nan(1)", "nan", "-0", " 2 ", "", "abc"])
def test_a_float64_column_read_typed_gives_the_text_paths_result(tmp_path, policy, value):
    """read_csv takes any types: a dense column read as float64 (no read_types default) still
    gives what its text gives, bad values included."""
    rows = _criteo_text(50, ",", seed=8)
    rows[20][COLUMNS.index("I2")] = value
    rows[30][COLUMNS.index("I2")] = " 4"  # the text path's regex path, where nan(1) is no number
    path = _write(tmp_path, rows)
    schema = _schema()
    outcome = []
    for types in (None, {**read_types(schema), "I2": pa.float64()}):
        report = BadRowReport(policy)  # type: ignore[arg-type]
        featurize = Featurizer(schema, report)
        try:
            batches = [featurize(c.batch, c.file, c.row_numbers).to_batch()
                       for c in read_csv(path, schema.columns, report=report, types=types)]
            outcome.append((batches, report.counts))
        except DataError as e:
            outcome.append(str(e))
    if isinstance(outcome[0], str):
        assert outcome[1] == outcome[0]
    else:
        _assert_same(outcome[0][0], outcome[1][0])
        assert outcome[0][1] == outcome[1][1]
