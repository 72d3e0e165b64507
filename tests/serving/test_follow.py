"""Follow mode: a server following a run's export series serves, after each delta, exactly the
scores of the offline Predictor on a full export of the same training state; concurrent
requests during swaps never fail nor see a mix; a delta without a manifest is not applied yet;
a damaged delta keeps the previous version served (logged) until the next full export."""

from __future__ import annotations

import json
import logging
import shutil
import socket
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from ember.checkpoint.delta import series_entries
from ember.cli import main
from ember.serving import Predictor
from ember.serving.follow import SeriesSource
from ember.testing.exports import SMALL, full_export_at, train_with_exports


@pytest.fixture(scope="module")
def series(tmp_path_factory):
    """The run's exports (1 full, 2-4 deltas, 5 full, 6 delta), rows to score, and each export's
    offline scores: the Predictor on a full export of the checkpoint at that export's step."""
    tmp = tmp_path_factory.mktemp("follow")
    run = train_with_exports(tmp, "f", 12, {"every_steps": 2, "full_every": 3, "keep_full": 5}, checkpoint_every=2)
    rows_file = tmp / "rows.parquet"
    assert main(["generate", "--out", str(rows_file), "--rows", "64", "--split", "eval", "--seed", "3",
                 "--options", json.dumps(SMALL)]) == 0
    rows = pq.read_table(rows_file).drop(["label"]).to_pylist()
    entries = series_entries(run / "exports")
    offline, fulls = {}, {}
    for e in entries:
        step = json.loads((e.path / "manifest.json").read_text())["step"]
        fulls[e.path.name] = Predictor.load(full_export_at(run, step, tmp / f"full-{step}"))
        offline[e.path.name] = fulls[e.path.name].predict_records(rows)
    return {"entries": entries, "rows": rows, "offline": offline, "fulls": fulls}


def _arrive(entry, live: Path, skip: tuple[str, ...] = ()) -> Path:
    """Copy an export into ``live`` the way a trainer writes it: a temporary name, then a rename."""
    tmp = live / f".{entry.path.name}.tmp"
    shutil.copytree(entry.path, tmp, ignore=shutil.ignore_patterns(*skip))
    return tmp.rename(live / entry.path.name)


def test_scores_after_each_delta_equal_the_offline_predictor_on_a_full_export(series, tmp_path):
    live = tmp_path / "live"
    live.mkdir()
    entries = series["entries"]
    _arrive(entries[0], live)
    source = SeriesSource(live)
    for e in entries:
        if e is not entries[0]:
            _arrive(e, live)
            assert source.refresh()
        cur = source.current
        assert cur.version == e.path.name
        got = cur.predictor.predict_records(series["rows"])
        np.testing.assert_array_equal(got, series["offline"][e.path.name])  # exact: the same rows and dense model
        full = series["fulls"][e.path.name]
        for name, table in cur.predictor.tables.items():  # every ID either side ever held reads the same row
            ids = np.unique(np.concatenate([table.base.ids, table.ids, full.tables[name].ids, np.arange(-5, 5)]))
            t = torch.from_numpy(ids)
            torch.testing.assert_close(table.rows(t), full.tables[name].rows(t), rtol=0, atol=0, msg=f"{e.path.name} {name}")
    assert source.base == 5 and source.applied == 6
    assert source.info()["overlay_rows"] > 0


def test_concurrent_requests_during_swaps_never_fail_and_never_see_a_mix(series, tmp_path):
    uvicorn = pytest.importorskip("uvicorn")
    pytest.importorskip("fastapi")
    from ember.serving.server import make_app

    live = tmp_path / "live"
    live.mkdir()
    entries = series["entries"]
    _arrive(entries[0], live)
    source = SeriesSource(live, poll_s=0.02)
    source.start()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(make_app(source), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.time() + 30
    while not server.started and time.time() < deadline:
        time.sleep(0.02)
    url = f"http://127.0.0.1:{port}"
    body = json.dumps({"rows": series["rows"]}).encode()
    results: list[tuple[str, list]] = []
    failures: list[str] = []
    stop = threading.Event()

    def hammer() -> None:
        while not stop.is_set():
            try:
                req = urllib.request.Request(url + "/score", data=body, headers={"Content-Type": "application/json"})
                with urllib.request.urlopen(req, timeout=30) as r:
                    out = json.loads(r.read())
                results.append((out["version"], out["scores"]))
            except Exception as e:  # any failed request fails the test
                failures.append(repr(e))

    clients = [threading.Thread(target=hammer) for _ in range(2)]
    for c in clients:
        c.start()
    try:
        for e in entries[1:]:
            _arrive(e, live)
            deadline = time.time() + 20
            while source.current.version != e.path.name and time.time() < deadline:
                time.sleep(0.01)
            n = len(results)
            while len(results) < n + 2 and time.time() < deadline:  # a few requests on each version
                time.sleep(0.01)
    finally:
        stop.set()
        for c in clients:
            c.join()
        server.should_exit = True
        thread.join(timeout=10)
        source.stop()
    assert not failures, failures[:3]
    seen = {v for v, _ in results}
    assert seen == {e.path.name for e in entries}, seen
    for version, scores in results:  # every response equals its own version's offline scores
        np.testing.assert_array_equal(np.array(scores), series["offline"][version].astype(np.float64), err_msg=version)


def test_a_delta_without_its_manifest_is_not_applied(series, tmp_path):
    live = tmp_path / "live"
    live.mkdir()
    full, delta = series["entries"][:2]
    _arrive(full, live)
    source = SeriesSource(live)
    half = _arrive(delta, live, skip=("manifest.json",))  # being written: every file but the manifest
    assert not source.refresh() and source.current.version == full.path.name
    shutil.copy(delta.path / "manifest.json", half / "manifest.json")
    assert source.refresh() and source.current.version == delta.path.name


@pytest.mark.parametrize("damage", ["corrupt", "missing"])
def test_a_damaged_delta_keeps_the_previous_version_until_the_next_full_export(series, tmp_path, caplog, damage):
    live = tmp_path / "live"
    live.mkdir()
    entries = {e.number: e for e in series["entries"]}
    _arrive(entries[1], live)
    source = SeriesSource(live)
    _arrive(entries[2], live)
    bad = _arrive(entries[3], live)
    weights = bad / "tables" / "C3.weights"
    if damage == "corrupt":
        data = bytearray(weights.read_bytes())
        data[0] ^= 0xFF
        weights.write_bytes(bytes(data))
    else:
        weights.unlink()
    with caplog.at_level(logging.ERROR, logger="ember.serving.follow"):
        source.refresh()
    assert source.current.version == "000002-delta"
    assert "000003-delta is damaged or incomplete" in caplog.text and "still serving version 000002-delta" in caplog.text
    np.testing.assert_array_equal(source.current.predictor.predict_records(series["rows"]),
                                  series["offline"]["000002-delta"])
    _arrive(entries[4], live)  # builds on the damaged one: skipped
    assert not source.refresh() and source.current.version == "000002-delta"
    _arrive(entries[5], live)  # the next full export is served, and deltas after it again
    _arrive(entries[6], live)
    assert source.refresh() and source.current.version == "000006-delta"
    np.testing.assert_array_equal(source.current.predictor.predict_records(series["rows"]),
                                  series["offline"]["000006-delta"])


def test_a_delta_export_alone_is_refused_by_the_predictor(series):
    delta = series["entries"][1].path
    with pytest.raises(Exception, match="delta export"):
        Predictor.load(delta)


def test_serve_picks_follow_mode_for_a_series_and_refuses_one_without_a_full_export(series, tmp_path):
    from ember.errors import CheckpointError
    from ember.serving.server import ModelSource, open_source

    live = tmp_path / "live"
    live.mkdir()
    with pytest.raises(CheckpointError, match="no complete full export"):
        open_source(live)
    _arrive(series["entries"][0], live)
    assert isinstance(open_source(live), SeriesSource)
    assert isinstance(open_source(series["entries"][0].path), ModelSource)  # one export: the plain server


def test_a_run_started_again_in_the_same_directory_is_followed(series, tmp_path):
    live = tmp_path / "live"
    live.mkdir()
    entries = {e.number: e for e in series["entries"]}
    _arrive(entries[5], live)
    _arrive(entries[6], live)
    source = SeriesSource(live)
    assert source.current.version == "000006-delta"
    shutil.rmtree(live)  # `ember train --overwrite`: the run directory is replaced, numbering starts again
    live.mkdir()
    _arrive(entries[1], live)
    _arrive(entries[2], live)
    assert source.refresh() and source.current.version == "000002-delta"
    np.testing.assert_array_equal(source.current.predictor.predict_records(series["rows"]),
                                  series["offline"]["000002-delta"])
