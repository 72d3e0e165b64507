"""The scoring server: scores equal the offline Predictor's, a replaced export is swapped in
without a restart (responses name the version that scored them), bad requests get 4xx with a
message and the server keeps serving."""

from __future__ import annotations

import json
import shutil
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

pytest.importorskip("fastapi")
uvicorn = pytest.importorskip("uvicorn")

from ember.cli import main  # noqa: E402
from ember.serving import Predictor  # noqa: E402
from ember.serving.server import ModelSource, make_app  # noqa: E402
from ember.testing.server import LocalServer  # noqa: E402

SMALL = {"num_sparse": 4, "num_dense": 2, "vocab_size": 300}


def _export(tmp: Path, name: str, steps: int) -> Path:
    import yaml

    cfg = tmp / f"{name}.yaml"
    cfg.write_text(yaml.safe_dump({
        "data": {"preset": "synthetic", "synthetic": {**SMALL, "rows": 2000, "eval_rows": 200}, "batch_size": 100},
        "embedding": {"dim": 4}, "model": {"type": "dlrm", "bottom_mlp": [8, 4], "top_mlp": [8]},
        "train": {"out_dir": str(tmp), "run_name": name, "progress": False, "threads": 1, "max_steps": steps}}))
    out = tmp / f"{name}-export"
    assert main(["train", "--config", str(cfg), "--overwrite", "--export", str(out)]) == 0
    return out


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("serve")
    first, second = _export(tmp, "a", 5), _export(tmp, "b", 20)
    live = tmp / "live"
    shutil.copytree(first, live)
    rows_file = tmp / "rows.parquet"
    assert main(["generate", "--out", str(rows_file), "--rows", "50", "--split", "eval",
                 "--options", json.dumps(SMALL)]) == 0
    rows = pq.read_table(rows_file).drop(["label"]).to_pylist()
    source = ModelSource(live, poll_s=0.1)
    source.start()
    with LocalServer(make_app(source, max_body_bytes=200_000)) as server:
        yield {"url": server.url, "live": live, "first": first, "second": second, "rows": rows,
               "rows_file": rows_file, "source": source}
    source.stop()


def _post(url: str, body: bytes) -> tuple[int, dict]:
    req = urllib.request.Request(url + "/score", data=body, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_scores_equal_the_offline_predictor_and_a_new_export_is_swapped_in(served):
    url, rows = served["url"], served["rows"]
    status, out = _post(url, json.dumps({"rows": rows}).encode())
    assert status == 200, out
    offline = Predictor.load(served["first"]).predict_files([str(served["rows_file"])])
    np.testing.assert_allclose(np.array(out["scores"]), offline, rtol=1e-6)
    v1 = out["version"]
    # replace the export the way a trainer does (a new directory renamed over the old one)
    tmp = served["live"].with_name("live.new")
    shutil.copytree(served["second"], tmp)
    old = served["live"].with_name("live.old")
    served["live"].rename(old)
    tmp.rename(served["live"])
    deadline = time.time() + 20
    while served["source"].current.version == v1 and time.time() < deadline:
        time.sleep(0.05)
    status, out2 = _post(url, json.dumps({"rows": rows}).encode())
    assert status == 200 and out2["version"] != v1
    np.testing.assert_allclose(np.array(out2["scores"]),
                               Predictor.load(served["second"]).predict_files([str(served["rows_file"])]), rtol=1e-6)
    with urllib.request.urlopen(url + "/health", timeout=10) as r:
        health = json.loads(r.read())
    assert health["status"] == "ok" and health["version"] == out2["version"] and health["served"] >= 100


@pytest.mark.parametrize("body, status, says", [
    (b"{not json", 400, "not JSON"),
    (b'{"rowz": []}', 400, "expected"),
    (b'{"rows": [1, 2]}', 400, "expected"),
    (b'{"rows": [{"I1": "seven", "I2": "1", "C1": "1", "C2": "2", "C3": "3", "C4": "4"}]}', 422, "I1"),
    (b'{"rows": [' + b'{"I1": "1"},' * 20000 + b'{}]}', 413, "over the limit"),
    (b'{"rows": ' + b'[' * 5000 + b']' * 5000 + b'}', 400, "nested too deeply"),
    (b'{"rows": [{"C1": ' + b'[' * 5000 + b']' * 5000 + b'}]}', 400, "nested too deeply"),
    (b'{"rows": [], "rowz": 1}', 400, "unknown key(s) ['rowz']"),
    # values Python's JSON reads but no file holds: a lone surrogate, a number past a float, an
    # integer of more digits than Python turns into text
    (b'{"rows": [{"C1": "\\ud800"}]}', 422, "lone UTF-16 surrogate"),
    (b'{"rows": [{"\\ud800": 1}]}', 422, "unknown column"),
    (b'{"rows": [{"I1": 1' + b'0' * 400 + b'}]}', 422, "beyond the range of a float"),
    (b'{"rows": [{"C1": 1' + b'0' * 5000 + b'}]}', 400, "thousands of digits"),
    (b'{"rows": [{"C1": "1' + b'0' * 5000 + b'"}]}', 422, "C1"),
    (b'{"rows": [{"I1": 1, "I1": 2}]}', 400, "gives the key 'I1' twice"),
], ids=["not-json", "no-rows", "rows-not-objects", "bad-value", "too-large", "deep", "deep-value", "unknown-key",
        "surrogate", "surrogate-key", "float-overflow", "digits", "digit-text", "duplicate-key"])
def test_bad_requests_get_a_4xx_with_a_message_and_the_server_goes_on(served, body, status, says):
    got, out = _post(served["url"], body)
    assert got == status and says in out["error"]
    ok, _ = _post(served["url"], json.dumps({"rows": served["rows"][:3]}).encode())
    assert ok == 200


@pytest.mark.parametrize("manifest, says", [
    (None, "cannot read manifest.json"),  # truncated
    ("[1]", "not an ember export's manifest"),
    ("{}", "not an ember export's manifest"),
    ("no-tables", "does not describe an export this ember reads (KeyError: 'tables')"),
    ("missing-file", "file model.pt is missing"),
], ids=["truncated", "list", "empty", "no-tables", "missing-file"])
def test_a_damaged_export_is_refused_naming_it_and_a_server_following_it_warns_once(served, tmp_path, caplog,
                                                                                      manifest, says):
    """predict, serve and a served export's reload: a damaged manifest (or a missing file) is a
    CheckpointError naming the export, never a traceback; the server keeps its version and says so
    once, however many polls find the same damage."""
    import logging

    from ember.errors import CheckpointError

    bad = tmp_path / "bad"
    shutil.copytree(served["first"], bad)
    text = (bad / "manifest.json").read_text()
    if manifest is None:
        (bad / "manifest.json").write_text(text[:80])
    elif manifest == "no-tables":
        m = json.loads(text)
        del m["tables"]
        (bad / "manifest.json").write_text(json.dumps(m))
    elif manifest == "missing-file":
        (bad / "model.pt").unlink()
    else:
        (bad / "manifest.json").write_text(manifest)
    with pytest.raises(CheckpointError, match=f"export {bad}: .*") as e:
        Predictor.load(bad)
    assert says in str(e.value)
    live = tmp_path / "live"
    shutil.copytree(served["first"], live)
    source = ModelSource(live, poll_s=60)
    version = source.current.version
    shutil.rmtree(live)
    shutil.copytree(bad, live)
    with caplog.at_level(logging.WARNING, logger="ember.serving.server"):
        for _ in range(3):
            assert not source.refresh()
    assert source.current.version == version
    if manifest == "missing-file":  # the same manifest: nothing new to load, the loaded model stays
        assert "could not be loaded" not in caplog.text
    else:
        assert caplog.text.count("could not be loaded") == 1 and says in caplog.text
