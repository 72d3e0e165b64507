"""Training and serving agree on what a value is: an export records each input column's type
in training, and the server, ``ember predict`` and the Predictor bring every value to it before
hashing (``ember.featurize.canonical``), so a row scores the same from JSON, CSV, Parquet and
ORC as eval scores it; values that cannot be brought are rejected with row, column and reason."""

from __future__ import annotations

import json
import logging
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import torch
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.orc as orc
import pyarrow.parquet as pq
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytest.importorskip("fastapi")
uvicorn = pytest.importorskip("uvicorn")

from ember.cli import main  # noqa: E402
from ember.errors import DataError  # noqa: E402
from ember.featurize.canonical import canonical_array, canonical_value, canonicalize  # noqa: E402
from ember.serving import Predictor  # noqa: E402
from ember.serving.server import ModelSource, make_app  # noqa: E402
from ember.testing.server import LocalServer  # noqa: E402

VOCAB = 30  # IDs 0..VOCAB-1 are trained; the property draws a few beyond (unseen IDs)


def _train_rows(n: int, seed: int) -> pa.Table:
    rng = np.random.default_rng(seed)
    c1 = rng.integers(0, VOCAB, n)
    c2 = rng.integers(0, VOCAB, n)
    i1 = rng.exponential(3.0, n)
    logit = 0.15 * (c1 % 7) - 0.1 * (c2 % 5) + 0.2 * np.log1p(i1) - 0.5
    y = (rng.random(n) < 1 / (1 + np.exp(-logit))).astype(np.int64)
    # C1 holds integer IDs, C2 text IDs (that look like numbers), as a Parquet file stores them
    return pa.table({"y": y, "I1": i1, "C1": pa.array(c1, pa.int64()), "C2": pa.array([str(v) for v in c2])})


@pytest.fixture(scope="session")
def trained(tmp_path_factory):
    """A tiny DLRM trained on Parquet (integer column C1, text column C2, dense I1): its export,
    its run config and its trained parts (for eval's scores)."""
    import yaml

    tmp = tmp_path_factory.mktemp("canonical")
    train = tmp / "train.parquet"
    pq.write_table(_train_rows(2000, 0), train)
    cfg_path = tmp / "run.yaml"
    cfg_path.write_text(yaml.safe_dump({
        "data": {"format": "parquet", "train": str(train), "eval": str(train), "batch_size": 100},
        "schema": {"labels": ["y"], "dense": [{"name": "I1", "log1p": True}],
                   "sparse": [{"name": "C1"}, {"name": "C2"}], "missing_values": [""]},
        "embedding": {"dim": 4}, "model": {"type": "dlrm", "bottom_mlp": [8, 4], "top_mlp": [8]},
        "train": {"out_dir": str(tmp), "run_name": "run", "progress": False, "threads": 1, "max_steps": 20}}))
    export = tmp / "export"
    assert main(["train", "--config", str(cfg_path), "--overwrite", "--export", str(export)]) == 0
    from ember.cli import _load_checkpoint, _verified
    from ember.config import load

    cfg = load(str(cfg_path))
    parts = _load_checkpoint(cfg, *_verified(str(tmp / "run")))
    predictor = Predictor.load(export)
    with LocalServer(make_app(ModelSource(export))) as server:
        yield {"tmp": tmp, "export": export, "cfg": cfg, "parts": parts, "predictor": predictor,
               "url": f"{server.url}/score"}


def _eval_scores(trained, table: pa.Table, path: Path, as_stored: bool = False) -> np.ndarray:
    """Scores of eval (the trained parts, training's own reader and featurizer) on ``table``;
    ``as_stored``: its IDs hashed as the file stores them (eval brings them to the training
    file's types otherwise)."""
    from ember.pipeline.loader import make_batches
    from ember.train.evaluate import predict_batches

    pq.write_table(table, path)
    cfg = trained["cfg"]
    data = cfg.data.model_copy(update={"eval": str(path), **({"train": str(path)} if as_stored else {})})
    probs, _ = predict_batches(trained["parts"], make_batches(data, cfg.schema, "eval"))
    return probs


def _post(trained, rows: list[dict] | None = None, body: bytes | None = None) -> tuple[int, dict]:
    """POST ``{"rows": rows}`` (or ``body``) to the scoring server: (status, JSON body)."""
    data = body if body is not None else json.dumps({"rows": rows}).encode()
    req = urllib.request.Request(trained["url"], data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def _cli_predict(trained, path: Path, capsys) -> tuple[int, np.ndarray | None, str]:
    out = path.with_suffix(".scores.csv")
    capsys.readouterr()
    rc = main(["predict", "--export", str(trained["export"]), "--input", str(path), "--output", str(out), "--overwrite"])
    err = capsys.readouterr().err
    return rc, (np.loadtxt(out, delimiter=",", skiprows=1, ndmin=2) if rc == 0 else None), err


def test_the_export_records_each_input_column_type_as_training_read_it(trained):
    recorded = json.loads((trained["export"] / "manifest.json").read_text())["input_types"]
    assert recorded["columns"] == {"C1": {"role": "sparse", "type": "int"}, "C2": {"role": "sparse", "type": "string"},
                                   "I1": {"role": "dense", "type": "float"}, "y": {"role": "label", "type": "float"}}
    assert "train.parquet" in recorded["found"]


# --- the property: one row, every way in, one score -------------------------------------------------

_ID = st.integers(0, VOCAB + 5)
_C1 = st.one_of(st.none(), _ID, _ID.map(float), _ID.map(str), _ID.map(lambda k: f" {k} "))  # integer IDs
_C2 = st.one_of(st.none(), _ID, _ID.map(float), _ID.map(str))  # text IDs: a number is its CSV text
_I1 = st.one_of(st.none(), st.integers(0, 1000), st.floats(0, 1e4, allow_nan=False).map(lambda x: round(x, 3)),
                st.floats(0, 1e4).map(lambda x: repr(round(x, 3))))
_ROW = st.fixed_dictionaries({"C1": _C1, "C2": _C2, "I1": _I1})


def _column(values: list) -> pa.Array:
    """A file column holding ``values`` as given: int64, float64 or text (typed nulls), mixed
    kinds as text (a file column has one type)."""
    kinds = {type(v) for v in values if v is not None}
    t = {frozenset({int}): pa.int64(), frozenset({float}): pa.float64(), frozenset({int, float}): pa.float64()}.get(
        frozenset(kinds), pa.string())
    def text(v):  # a number as a file's text holds it (an integral float as its digits, as pyarrow writes it)
        return str(int(v)) if isinstance(v, float) and v.is_integer() else str(v)

    return pa.array([None if v is None else (text(v) if t == pa.string() else v) for v in values], t)


def _canonical_reference(rows: list[dict]) -> pa.Table:
    """The rows as training's Parquet file holds them (an oracle written out by hand): C1 int64,
    C2 text (a number as its integer digits: only integral values are drawn), I1 float."""
    def c1(v):
        return None if v is None else int(float(v)) if isinstance(v, str) else int(v)

    def c2(v):
        return None if v is None else v if isinstance(v, str) else str(int(v))

    return pa.table({"y": pa.array([0] * len(rows), pa.int64()),
                     "I1": pa.array([None if r["I1"] is None else float(r["I1"]) for r in rows], pa.float64()),
                     "C1": pa.array([c1(r["C1"]) for r in rows], pa.int64()),
                     "C2": pa.array([c2(r["C2"]) for r in rows], pa.string())})


@settings(max_examples=25, deadline=None, database=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=st.lists(_ROW, min_size=1, max_size=4), drop=st.sampled_from([None, "C1", "C2", "I1"]))
def test_a_row_scores_the_same_from_json_csv_parquet_orc_and_eval(trained, tmp_path, capsys, rows, drop):
    reference = _eval_scores(trained, _canonical_reference(rows), tmp_path / "reference.parquet")
    # JSON: the values as drawn; an absent key is a missing value, like a null
    given_rows = [{k: v for k, v in r.items() if not (k == drop and v is None)} for r in rows]
    status, out = _post(trained, given_rows)
    assert status == 200, out
    np.testing.assert_allclose(np.array(out["scores"]), reference, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(trained["predictor"].predict_records(given_rows), reference, rtol=1e-5, atol=1e-6)
    # files: each column stored with the values' own type; the CSV is what pyarrow writes of it
    table = pa.table({c: _column([r[c] for r in rows]) for c in ("C1", "C2", "I1")})
    paths = {"parquet": tmp_path / "rows.parquet", "orc": tmp_path / "rows.orc", "csv": tmp_path / "rows.csv"}
    pq.write_table(table, paths["parquet"])
    orc.write_table(table, paths["orc"])
    pacsv.write_csv(table, paths["csv"])
    for fmt, path in paths.items():
        np.testing.assert_allclose(trained["predictor"].predict_files([str(path)]), reference, rtol=1e-5, atol=1e-6,
                                   err_msg=fmt)
        rc, scores, err = _cli_predict(trained, path, capsys)
        assert rc == 0, err
        np.testing.assert_allclose(scores, reference, atol=2e-6, err_msg=fmt)  # printed with 6 decimals


def test_four_and_four_point_oh_are_one_id_and_a_seen_id_differs_from_an_unseen_one(trained):
    scores = [_post(trained, [{"C1": v, "C2": "3", "I1": 1}])[1]["scores"][0][0] for v in (4, 4.0, "4", " 4 ", 77)]
    assert scores[0] == scores[1] == scores[2] == scores[3] != scores[4]
    text = [_post(trained, [{"C1": 4, "C2": v, "I1": 1}])[1]["scores"][0][0] for v in (3, 3.0, "3", "3.0")]
    assert text[0] == text[1] == text[2] != text[3]  # "3.0" is another text ID than "3", as in a CSV file


def test_eval_brings_a_file_with_other_id_types_to_training_s_as_predict_does(trained, tmp_path):
    # C1 was int64 and C2 text in the training file; here they are stored the other way round
    swapped = pa.table({"y": pa.array([0, 1]), "I1": pa.array([1.0, 2.0]), "C1": pa.array(["4", "77"]),
                        "C2": pa.array([3, 7], pa.int64())})
    rows = [{"C1": 4, "C2": "3", "I1": 1.0}, {"C1": 77, "C2": "7", "I1": 2.0}]
    np.testing.assert_allclose(_eval_scores(trained, swapped, tmp_path / "swapped.parquet"),
                               trained["predictor"].predict_records(rows), rtol=1e-6)


# --- rejections --------------------------------------------------------------------------------------

GOOD = {"C1": 4, "C2": "7", "I1": 2.5}


@pytest.mark.parametrize("column, value, says", [
    ("C1", 4.5, "4.5 is not an integer"),
    ("C1", "4.5", "not an integer"),
    ("C1", "abc", "'abc' is not an integer ID"),
    ("C1", True, "a boolean where an integer ID belongs"),
    ("C1", 2**63, "outside the int64 range"),
    ("C1", 1e17, "beyond 2**53"),
    ("C2", [1, 2], "a list where a string ID belongs"),
    ("C2", False, "a boolean"),
    ("I1", {"a": 1}, "an object where a number belongs"),
    ("I1", "seven", "'seven' is not a number"),
    # what JSON holds and no file can: a lone surrogate, a number past the float range, thousands of digits
    ("C2", "\ud800", "lone UTF-16 surrogate"),
    ("I1", 10**400, "beyond the range of a float"),
    ("C1", "1" + "0" * 5000, "is not an integer ID"),
])
def test_a_value_that_cannot_be_brought_to_its_type_is_a_422_naming_row_and_column(trained, column, value, says):
    status, out = _post(trained, [GOOD, {**GOOD, column: value}])
    assert status == 422, out
    assert out["row"] == 1 and out["column"] == column and says in out["reason"]
    assert f"rows[1], column '{column}'" in out["error"]
    assert _post(trained, [GOOD])[0] == 200  # and the server goes on


def test_an_unknown_column_is_a_422_with_a_did_you_mean(trained):
    status, out = _post(trained, [GOOD, GOOD, {**GOOD, "C11": 3}])
    assert status == 422 and out["row"] == 2 and out["column"] == "C11"
    assert "did you mean 'C1'?" in out["reason"]
    # the label is a column the export knows (not read when scoring): allowed
    assert _post(trained, [{**GOOD, "y": 1}])[0] == 200


def test_an_absent_column_is_a_missing_value_like_a_null(trained):
    for col in ("C1", "C2", "I1"):
        absent = _post(trained, [{k: v for k, v in GOOD.items() if k != col}])
        null = _post(trained, [{**GOOD, col: None}])
        assert absent[0] == null[0] == 200 and absent[1]["scores"] == null[1]["scores"]


def test_no_bad_request_is_a_5xx(trained):
    for value in (-0.0, "", " ", [], {}, [[1]], 10**40, -(2**63), "\u0663", "1e3", "0x10", "inf"):
        status, out = _post(trained, [{**GOOD, "C1": value}])
        assert status in (200, 422), (value, status, out)
    for body in (b'{"rows": [{"C1": NaN}]}', b'{"rows": [{"C2": Infinity}]}', b'{"rows": [{"I1": -Infinity}]}'):
        status, out = _post(trained, body=body)
        assert status in (200, 422), (body, status, out)


@pytest.mark.parametrize("fmt", ["csv", "parquet"])
def test_ember_predict_exits_2_naming_file_row_and_column(trained, tmp_path, capsys, fmt):
    table = pa.table({"C1": pa.array([1.0, 2.0, 4.5]), "C2": pa.array(["a", "b", "c"]), "I1": pa.array([1.0, 2.0, 3.0])})
    path = tmp_path / f"bad.{fmt}"
    pq.write_table(table, path) if fmt == "parquet" else pacsv.write_csv(table, path)
    rc, _, err = _cli_predict(trained, path, capsys)
    row = 4 if fmt == "csv" else 3  # a CSV's rows count its header line
    assert rc == 2
    last = err.strip().splitlines()[-1]  # (after any log line said once per process, e.g. the CSV reader's)
    assert last.startswith("ember predict: error: ") and f"{path} row {row}, column 'C1'" in last and "4.5" in last
    # skip: the bad row is counted and left out
    out = tmp_path / "skip.csv"
    assert main(["predict", "--export", str(trained["export"]), "--input", str(path), "--output", str(out),
                 "data.on_bad_rows=skip"]) == 0
    assert np.loadtxt(out, delimiter=",", skiprows=1, ndmin=2).shape == (2, 1)
    assert "C1: not a value of its training type (int) x1" in capsys.readouterr().err


@pytest.mark.parametrize("text", ["4.0", "+4", "1e3", "NaN"])
def test_text_an_integer_id_column_refuses_in_training_is_refused_by_predict_and_the_server(tmp_path, capsys, text):
    """A CSV-trained ``hash_ids: false`` column: eval reads its text with the featurizer's integer
    syntax, so predict and the server do too (they scored "4.0" as 4 and "NaN" as missing)."""
    rows = "".join(f"{i % 2},{i},{i % 7}\n" for i in range(64))
    (tmp_path / "train.csv").write_text("y,I1,C1\n" + rows)
    (tmp_path / "bad.csv").write_text(f"y,I1,C1\n1,1,5\n0,2,{text}\n")
    cfg = tmp_path / "run.yaml"
    cfg.write_text(yaml.safe_dump({
        "data": {"format": "csv", "train": str(tmp_path / "train.csv"), "eval": str(tmp_path / "train.csv"), "batch_size": 32},
        "schema": {"labels": ["y"], "dense": [{"name": "I1"}], "sparse": [{"name": "C1", "hash_ids": False}]},
        "embedding": {"dim": 4}, "model": {"type": "dlrm", "bottom_mlp": [4], "top_mlp": [4]},
        "train": {"out_dir": str(tmp_path), "run_name": "run", "progress": False, "threads": 1, "max_steps": 2}}))
    assert main(["train", "--config", str(cfg), "--export", str(tmp_path / "export")]) == 0
    capsys.readouterr()
    assert main(["eval", "--checkpoint", str(tmp_path / "run"), f"data.eval={tmp_path / 'bad.csv'}"]) == 2
    assert "row 3, column 'C1'" in capsys.readouterr().err
    assert main(["predict", "--export", str(tmp_path / "export"), "--input", str(tmp_path / "bad.csv")]) == 2
    assert "row 3, column 'C1'" in capsys.readouterr().err
    with pytest.raises(DataError, match=r"rows\[0\], column 'C1'"):
        Predictor.load(tmp_path / "export").predict_records([{"I1": 2, "C1": text}])


def test_an_export_without_the_type_record_infers_it_and_says_so_once(trained, tmp_path, caplog):
    import shutil

    old = tmp_path / "old-export"
    shutil.copytree(trained["export"], old)
    manifest = json.loads((old / "manifest.json").read_text())
    del manifest["input_types"]
    (old / "manifest.json").write_text(json.dumps(manifest))
    with caplog.at_level(logging.WARNING, logger="ember.serving.predictor"):
        p = Predictor.load(old)
        Predictor.load(old)
    told = [r for r in caplog.records if "records no input column types" in r.getMessage()]
    assert len(told) == 1 and "['C1', 'C2']" in told[0].getMessage()  # Parquet: ID types not known without files
    assert p.input_types == {"C1": "unknown", "C2": "unknown", "I1": "float", "y": "float"}
    # read as before: JSON values as text (here C1's 4 is the text "4", not the integer ID it was in training)
    as_text = pa.table({"y": pa.array([0]), "I1": pa.array([1.0]), "C1": pa.array(["4"]), "C2": pa.array(["7"])})
    np.testing.assert_allclose(p.predict_records([{"C1": 4, "C2": 7, "I1": 1}]),
                               _eval_scores(trained, as_text, tmp_path / "as-text.parquet", as_stored=True), rtol=1e-5)


# --- the rule itself ---------------------------------------------------------------------------------

@given(st.one_of(st.integers(-(2**63), 2**63 - 1), st.text(max_size=6), st.floats(allow_nan=False),
                 st.none()))
def test_the_vectorised_form_agrees_with_the_rule_on_every_value(v):
    for t in ("int", "string"):  # "float" columns pass to the featurizer's own number parser
        try:
            want, bad = canonical_value(v, t), False
        except ValueError:
            want, bad = None, True
        arr = pa.array([v], pa.string() if isinstance(v, str) else None)
        got, mask, _ = canonical_array(arr, t)
        assert bool(mask[0]) == bad, (v, t)
        if not bad:
            assert got[0].as_py() == want, (v, t)


def test_a_multi_hot_list_column_takes_lists_from_parquet_and_joined_text_from_csv_and_json(tmp_path):
    """Synthetic data trains C2 from a list column (hash_ids: false, separator "|" for CSV): the
    export records list<int>, and a Parquet list, a CSV's "a|b" and a JSON list or joined text
    score alike."""
    import yaml

    opts = {"num_sparse": 3, "num_dense": 1, "vocab_size": 50, "multi_hot": {"C2": 3}}
    cfg = tmp_path / "mh.yaml"
    cfg.write_text(yaml.safe_dump({
        "data": {"preset": "synthetic", "synthetic": {**opts, "rows": 600, "eval_rows": 50}, "batch_size": 100},
        "embedding": {"dim": 4}, "model": {"type": "dlrm", "bottom_mlp": [4], "top_mlp": [4]},
        "train": {"out_dir": str(tmp_path), "run_name": "mh", "progress": False, "threads": 1, "max_steps": 4}}))
    export = tmp_path / "export"
    assert main(["train", "--config", str(cfg), "--overwrite", "--export", str(export)]) == 0
    types = json.loads((export / "manifest.json").read_text())["input_types"]["columns"]
    assert types["C2"]["type"] == "list<int>" and types["C1"]["type"] == "int" and types["I1"]["type"] == "float"
    paths = {}
    for fmt in ("parquet", "csv"):
        paths[fmt] = tmp_path / f"rows.{fmt}"
        assert main(["generate", "--out", str(paths[fmt]), "--format", fmt, "--rows", "20", "--split", "eval",
                     "--options", json.dumps(opts)]) == 0
    p = Predictor.load(export)
    from_parquet = p.predict_files([str(paths["parquet"])])
    np.testing.assert_allclose(p.predict_files([str(paths["csv"])]), from_parquet, rtol=1e-6)
    rows = pq.read_table(paths["parquet"]).drop(["label"]).to_pylist()
    np.testing.assert_allclose(p.predict_records(rows), from_parquet, rtol=1e-6)
    joined = [{**r, "C2": "|".join(map(str, r["C2"])), "C1": str(r["C1"])} for r in rows]
    np.testing.assert_allclose(p.predict_records(joined), from_parquet, rtol=1e-6)
    with pytest.raises(DataError, match=r"rows\[0\], column 'C2': 1.5 is not an integer"):
        p.predict_records([{**rows[0], "C2": [1, 1.5]}])


def test_a_score_that_is_not_finite_is_an_error_naming_its_cause(trained):
    from ember.errors import DataError, Diverged

    from ember.featurize.featurizer import Featurizer

    p = Predictor.load(trained["export"])  # every reader refuses inf; a float32 overflow of a transform remains
    batch = Featurizer(p.score_schema)(canonicalize([GOOD, GOOD], p.score_schema, p.input_types)).to_batch()
    batch.dense[1, 0] = float("inf")
    with pytest.raises(DataError, match=r"row 1 \(0-based, of this batch\): a dense value is infinite"):
        p.predict_batch(batch)
    p = Predictor.load(trained["export"])
    with torch.no_grad():
        next(p.model.parameters()).fill_(float("nan"))  # the weights of a diverged run
    with pytest.raises(Diverged, match="scores NaN with finite inputs: the export's weights are not finite"):
        p.predict_records([GOOD])


def test_eval_computes_no_metric_over_scores_that_are_not_finite(trained, tmp_path):
    from ember.errors import Diverged
    from ember.pipeline.loader import make_batches
    from ember.train.evaluate import evaluate

    parts, cfg = trained["parts"], trained["cfg"]
    pq.write_table(_train_rows(50, 3), tmp_path / "e.parquet")
    param = next(parts.model.parameters())
    kept = param.detach().clone()
    try:
        with torch.no_grad():
            param.fill_(float("nan"))
        with pytest.raises(Diverged, match=r"eval: 50 of 50 rows score NaN or infinite"):
            evaluate(parts, make_batches(cfg.data.model_copy(update={"eval": str(tmp_path / "e.parquet")}), cfg.schema, "eval"))
    finally:
        with torch.no_grad():
            param.copy_(kept)
