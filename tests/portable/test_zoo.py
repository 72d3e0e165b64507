"""Every model of the zoo, trained a few steps and exported with ``--format onnx``, scores the same
raw rows with the portable runtime (numpy + onnxruntime) as with ember's Predictor, to 1e-6:
CSV files and JSON-like rows, with unseen IDs, missing values, multi-hot and weighted features,
integer IDs, and tables in bf16 / fp16, with min_count, a TTL and a normal initializer."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("onnx", reason="onnx is not installed: pip install 'ember[portable]' (make test installs it)")
pytest.importorskip("onnxruntime", reason="onnxruntime is not installed: pip install 'ember[portable]' (make test installs it)")

from ember.errors import DataError  # noqa: E402
from ember.portable import BadInput, PortableModel  # noqa: E402
from ember.serving import Predictor  # noqa: E402
from ember.testing.portable import ZOO, probe_records, train_and_export  # noqa: E402

TOL = 1e-6


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("zoo")


def _same_scores(export: Path, csv: Path) -> float:
    """Max |difference| of the two runtimes' probabilities on ``csv`` and on the probe records."""
    predictor, portable = Predictor.load(export), PortableModel.load(export)
    want, got = predictor.predict_files([str(csv)]), portable.predict_csv(csv)
    assert got.shape == want.shape == (100, len(predictor.tasks))
    diff = float(np.abs(got - want).max())
    rows = probe_records()
    want_r, got_r = predictor.predict_records(rows), portable.predict_records(rows)
    assert got_r.shape == want_r.shape == (len(rows), len(predictor.tasks))
    diff = max(diff, float(np.abs(got_r - want_r).max()))
    assert diff <= TOL, diff
    assert np.ptp(got) > 0, "every row scored the same: the comparison would prove little"
    return diff


@pytest.mark.parametrize("name", list(ZOO))
def test_portable_scores_equal_the_predictors(work, name):
    export = train_and_export(work, name, ZOO[name])
    manifest = json.loads((export / "manifest.json").read_text())
    assert manifest["onnx"]["file"] == "model.onnx" and "model.onnx" in manifest["files"]
    assert (export / "dense.pt").exists() and (export / "tables").is_dir()  # ember's own export, and the graph beside it
    _same_scores(export, work / "data" / "eval.csv")


def test_16_bit_ttl_min_count_and_normal_tables(work):
    tables = [{"name": "C1", "dtype": "bf16"}, {"name": "C2", "min_count": 2}, {"name": "hist", "dtype": "fp16"},
              {"name": "tags", "ttl_steps": 2, "initializer": {"type": "normal", "std": 0.2}}]
    export = train_and_export(work, "tables", ZOO["dlrm"], steps=8, extra={"tables": tables})
    meta = {t["name"]: t for t in json.loads((export / "manifest.json").read_text())["tables"]}
    assert meta["C1"]["dtype"] == "bf16" and meta["tags"]["ttl_steps"] == 2 and meta["C2"]["min_count"] == 2
    _same_scores(export, work / "data" / "eval.csv")
    # compressed, and a TSV: read as the Predictor reads them
    gz = work / "eval.csv.gz"
    gz.write_bytes(gzip.compress((work / "data" / "eval.csv").read_bytes()))
    tsv = work / "eval.tsv"
    tsv.write_text((work / "data" / "eval.csv").read_text().replace(",", "\t"))
    predictor, portable = Predictor.load(export), PortableModel.load(export)
    for path in (gz, tsv):
        np.testing.assert_allclose(portable.predict_csv(path), predictor.predict_files([str(path)]), rtol=0, atol=TOL)


def test_bad_rows_are_refused_as_the_predictor_refuses_them(work):
    export = train_and_export(work, "refuse", ZOO["wdl"], steps=2)
    predictor, portable = Predictor.load(export), PortableModel.load(export)
    for rows, says in [([{"C9": "x"}], "unknown column"), ([{"I1": "abc"}], "column 'I1'"),
                       ([{"I1": float("inf")}], "column 'I1'"), ([{"uid": 4.5}], "column 'uid'"),
                       ([{"tags": "a|b", "tag_w": 1.0}], "weights do not match"), ([{"C1": ["a"]}], "column 'C1'"),
                       ([{"C1": "\ud800"}], "lone UTF-16 surrogate"), ([{"\ud800": 1}], "unknown column"),
                       ([{"I1": 10**400}], "beyond the range of a float"), ([{"uid": "1" + "0" * 5000}], "column 'uid'")]:
        with pytest.raises(DataError):
            predictor.predict_records(rows)
        with pytest.raises(BadInput, match=says):
            portable.predict_records(rows)
    bad = work / "bad.csv"
    bad.write_text("I1,I2,I3,C1,C2,tags,tag_w,hist,uid\n1,2,3,a,b,x|y,1|2|3,h,5\n")
    with pytest.raises(DataError):
        predictor.predict_files([str(bad)])
    with pytest.raises(BadInput, match="line 2, column 'tag_w'"):
        portable.predict_csv(bad)
    bad.write_text("I1,C1\n1,a\n")
    with pytest.raises(BadInput, match=r"column\(s\) \['I2'"):
        portable.predict_csv(bad)
    # a damaged file is found before scoring
    copy = work / "damaged"
    shutil.copytree(export, copy)
    (copy / "model.onnx").write_bytes((copy / "model.onnx").read_bytes()[:-1] + b"\0")
    with pytest.raises(ValueError, match="model.onnx is damaged"):
        PortableModel.load(copy)


def test_a_model_trained_on_typed_columns(work):
    """Synthetic training data has integer ID columns (as Parquet would): CSV text and JSON
    numbers or strings are brought to integers before hashing, by both runtimes."""
    from ember.cli import main

    run = work / "typed"
    assert main(["train", "--config", str(Path(__file__).resolve().parents[2] / "configs" / "demo.yaml"),
                 "data.synthetic.rows=3000", "data.synthetic.eval_rows=100", "data.batch_size=256", "train.max_steps=3",
                 "train.progress=false", f"train.out_dir={run}", "--overwrite"]) == 0
    export = work / "exports" / "typed"
    assert main(["export", "--checkpoint", str(run / "demo"), "--out", str(export), "--format", "onnx"]) == 0
    assert main(["generate", "--out", str(work / "typed.csv"), "--rows", "100", "--split", "eval"]) == 0
    predictor, portable = Predictor.load(export), PortableModel.load(export)
    csv = work / "typed.csv"
    np.testing.assert_allclose(portable.predict_csv(csv), predictor.predict_files([str(csv)]), rtol=0, atol=TOL)
    rows = [{"C1": 5, "C2": "5", "C3": 5.0, "C4": " 12 ", "I1": "3", "I2": 1.5}, {"C1": None, "C5": -7}, {}]
    np.testing.assert_allclose(portable.predict_records(rows), predictor.predict_records(rows), rtol=0, atol=TOL)
    same = portable.predict_records([{"C1": 5}, {"C1": "5"}, {"C1": 5.0}, {"C1": " 5 "}])
    assert (same == same[0]).all()  # one integer ID, however it was written
    with pytest.raises(BadInput, match="column 'C1'"):
        portable.predict_records([{"C1": 4.5}])


def test_triton_entry_lists_the_graph_inputs(work, tmp_path):
    """LR reads no pooled embeddings: its graph has no such inputs, nor has its Triton config,
    nor the inputs sent; the v2 request body runs the graph to the same scores."""
    from ember.portable import v2_request, write_triton_model

    export = work / "exports" / "lr"
    if not export.exists():
        train_and_export(work, "lr", ZOO["lr"], steps=2)
    model = PortableModel.load(export)
    entry = write_triton_model(model, tmp_path / "repo", "ctr")
    config = (entry / "config.pbtxt").read_text()
    assert 'platform: "onnxruntime_onnx"' in config and "pooled_0" not in config and 'name: "linear_0"' in config
    assert (entry / "1" / "model.onnx").read_bytes() == (export / "model.onnx").read_bytes()
    rows = probe_records()
    feeds = model.inputs(rows)
    assert not [k for k in feeds if k.startswith("pooled")] and f'"{next(iter(feeds))}"' in config
    body = v2_request(feeds)
    again = {i["name"]: np.asarray(i["data"], np.float32).reshape(i["shape"]) for i in body["inputs"]}
    np.testing.assert_array_equal(model.run(again), model.predict_records(rows))
    with pytest.raises(FileExistsError):
        write_triton_model(model, tmp_path / "repo", "ctr")
