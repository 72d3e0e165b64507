"""Training from object storage (``s3://``) against moto's S3 server on 127.0.0.1 over real
HTTP: the same model as from the same files on local disk (CSV from a prefix, Parquet from a
glob), resume mid-epoch equal to an uninterrupted run, online training on a prefix while
objects are uploaded (each trained once), SIGKILL of ``ember train`` then resume, the command's
errors for a missing bucket / object and a denied request (exit 2, no traceback), and
``ember predict --input s3://...``."""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest

from ember.checkpoint.load import resolve_checkpoint, verify_checkpoint
from ember.cli import main
from ember.config import from_dict
from ember.testing import assert_identical, run_state
from ember.testing.s3 import S3Server, server_or_skip
from ember.train.loop import train
from tests.train.test_online import _lines, _raw

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def s3():
    yield from server_or_skip("data")


@pytest.fixture(scope="module")
def files(s3, tmp_path_factory) -> Path:
    """Four CSV files and the same rows as four Parquet files (2 row groups each), local and
    under s3://data/csv/ and s3://data/pq/ (with a marker and a note the listing skips)."""
    root = tmp_path_factory.mktemp("files")
    for k in range(4):
        (root / "csv").mkdir(exist_ok=True)
        path = root / "csv" / f"part-{k:03d}.csv"
        path.write_text("\n".join(_lines(k, 150 + 13 * k)) + "\n")
        (root / "pq").mkdir(exist_ok=True)
        pq.write_table(pacsv.read_csv(path), root / "pq" / f"part-{k:03d}.parquet", row_group_size=100)
    (root / "csv" / "_SUCCESS").write_text("")
    (root / "pq" / "notes.txt").write_text("x")
    s3.upload(root / "csv", "data/csv")
    s3.upload(root / "pq", "data/pq")
    return root


def _cfg(tmp_path: Path, name: str, train_paths: Any, s3: S3Server | None, fmt: str = "csv", **train_kw: Any) -> dict:
    raw = _raw(tmp_path, name, Path("."), online=False, **train_kw)
    raw["data"].update(format=fmt, train=train_paths, shuffle_buffer=100, seed=3)
    if s3 is not None:
        raw["data"]["storage_options"] = s3.options()
    return raw


@pytest.mark.parametrize("fmt, local, remote", [("csv", "csv", "s3://data/csv/"),
                                                ("parquet", "pq/*.parquet", "s3://data/pq/*.parquet")],
                         ids=["csv_prefix", "parquet_glob"])
def test_training_from_s3_equals_training_from_local_files(s3, files, tmp_path, fmt, local, remote):
    """Same files, same sorted order, same shuffle: bitwise the same weights and eval metrics."""
    here = train(from_dict(_cfg(tmp_path, "local", str(files / local), None, fmt)))
    there = train(from_dict(_cfg(tmp_path, "s3", remote, s3, fmt)))
    assert here.step == there.step == -(-sum(150 + 13 * k for k in range(4)) // 64)
    assert_identical(run_state(here), run_state(there))


def test_resume_mid_epoch_from_s3_equals_an_uninterrupted_run(s3, files, tmp_path):
    """The checkpoint's data position (epoch, batch) over the sorted object list resumes mid-epoch."""
    whole = train(from_dict(_cfg(tmp_path, "whole", "s3://data/csv/", s3, epochs=2)))
    part = train(from_dict(_cfg(tmp_path, "part", "s3://data/csv/", s3, epochs=2, max_steps=7)))
    assert part.step == 7 < whole.step // 2  # stopped inside the first epoch
    resumed = train(from_dict(_cfg(tmp_path, "part", "s3://data/csv/", s3, epochs=2, resume=str(part.run_dir))))
    assert resumed.step == whole.step
    assert_identical(run_state(whole), run_state(resumed))


def _online(tmp_path: Path, name: str, prefix: str, s3: S3Server | None, **kw: Any) -> dict:
    raw = _raw(tmp_path, name, Path("."), **kw)
    raw["data"]["train"] = prefix
    raw["data"]["watch"]["poll_s"] = 0.1
    if s3 is not None:
        raw["data"]["storage_options"] = s3.options()
    return raw


def test_online_training_on_a_prefix_takes_each_object_once_as_it_arrives(s3, tmp_path):
    """Objects uploaded while the trainer watches the prefix: the weights equal an offline pass
    over the same local files in order, and the stream position lists the objects' URIs."""
    local = tmp_path / "in"
    local.mkdir()
    for k in range(4):
        (local / f"part-{k:03d}.csv").write_text("\n".join(_lines(10 + k, 150 + 13 * k)) + "\n")
    s3.upload(local / "part-000.csv", "data/live/part-000.csv")

    def uploader() -> None:
        for k in range(1, 4):
            time.sleep(0.3)
            s3.upload(local / f"part-{k:03d}.csv", f"data/live/part-{k:03d}.csv")

    th = threading.Thread(target=uploader)
    th.start()
    try:
        online = train(from_dict(_online(tmp_path, "live", "s3://data/live/", s3,
                                         watch={"idle_timeout_s": 2.0})))
    finally:
        th.join()
    raw = _raw(tmp_path, "off", local, online=False)
    offline = train(from_dict(raw))
    assert online.step == offline.step == -(-sum(150 + 13 * k for k in range(4)) // 64)
    assert_identical(run_state(offline), run_state(online))
    pos = verify_checkpoint(resolve_checkpoint(online.run_dir))["position"]
    assert pos["files_done"] == [f"s3://data/live/part-{k:03d}.csv" for k in range(3)]
    assert pos["file"] == "s3://data/live/part-003.csv"


def test_sigkill_of_ember_train_on_s3_then_resume_trains_every_row_once(s3, tmp_path, monkeypatch):
    """``ember train`` (a process; credentials and endpoint from the environment) watches a
    prefix, checkpoints every 2 steps and is SIGKILLed after step 6's checkpoint; more objects
    arrive; a resumed run ends at the idle timeout with the weights of one uninterrupted run."""
    env = s3.env()
    for k, v in env.items():
        if k.startswith("AWS_"):
            monkeypatch.setenv(k, v)
    for k in range(3):
        s3.put(f"data/kill/part-{k:03d}.csv", ("\n".join(_lines(20 + k, 200)) + "\n").encode())
    run_dir = tmp_path / "kill"
    cfg = _online(tmp_path, "kill", "s3://data/kill/", None, watch={"idle_timeout_s": 120}, checkpoint_every=2)
    (tmp_path / "c.json").write_text(json.dumps(cfg))
    env["PYTHONPATH"] = str(ROOT)
    proc = subprocess.Popen([sys.executable, "-m", "ember", "train", "--config", str(tmp_path / "c.json")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    latest, deadline = run_dir / "checkpoints" / "LATEST", time.time() + 120
    while not (latest.exists() and int(latest.read_text().strip().removeprefix("step-")) >= 6):
        assert proc.poll() is None, proc.communicate()
        assert time.time() < deadline, "no step-6 checkpoint"
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)  # after step 6's checkpoint, or step 8's on a slow poll
    proc.communicate(timeout=60)
    pos = verify_checkpoint(resolve_checkpoint(run_dir))["position"]
    rows = pos["batch"] * 64  # 200 rows a file
    assert pos["batch"] in (6, 8) and (pos["file"], pos["file_rows"]) == (f"s3://data/kill/part-{rows // 200:03d}.csv",
                                                                          rows % 200)
    for k in (3, 4):
        s3.put(f"data/kill/part-{k:03d}.csv", ("\n".join(_lines(20 + k, 200)) + "\n").encode())
    resumed = train(from_dict({**cfg, "train": {**cfg["train"], "resume": str(run_dir)},
                               "data": {**cfg["data"], "watch": {**cfg["data"]["watch"], "idle_timeout_s": 0.5}}}))
    whole = train(from_dict(_online(tmp_path, "whole", "s3://data/kill/", None)))
    assert resumed.step == whole.step == -(-1000 // 64)
    assert_identical(run_state(whole), run_state(resumed))


def _run(args: list[str], capsys) -> tuple[int, str]:
    code = main(args)
    return code, capsys.readouterr().err


def test_ember_train_names_a_missing_bucket_object_or_denied_request(s3, files, tmp_path, capsys):
    """Each its own message, ``ember train: error: ...``, exit 2, no traceback."""
    cases = [
        ("s3://nobucket/csv/", s3.options(), "bucket 'nobucket' does not exist"),
        ("s3://data/csv/part-999.csv", s3.options(), "'s3://data/csv/part-999.csv': no such object"),
        ("s3://data/csv/part-000.csv", s3.options("nobody"), "access denied while reading its information"),
    ]
    for k, (path, options, message) in enumerate(cases):
        raw = _cfg(tmp_path, f"err{k}", path, None)
        raw["data"]["storage_options"] = options
        (tmp_path / f"e{k}.json").write_text(json.dumps(raw))
        with s3.authenticated() if options["access_key"] == s3.keys["nobody"][0] else contextlib.nullcontext():
            code, err = _run(["train", "--config", str(tmp_path / f"e{k}.json")], capsys)
        assert code == 2 and "ember train: error: " in err and message in err, err
        assert "Traceback" not in err


def test_ember_predict_reads_its_input_from_s3(s3, files, tmp_path, capsys):
    """Scores of s3:// input equal the scores of the same local file."""
    raw = _cfg(tmp_path, "pred", str(files / "csv"), None, max_steps=4)
    (tmp_path / "p.json").write_text(json.dumps(raw))
    assert main(["train", "--config", str(tmp_path / "p.json"), "--export", str(tmp_path / "export")]) == 0
    local = tmp_path / "local.csv"
    assert main(["predict", "--export", str(tmp_path / "export"), "--input", str(files / "csv" / "part-001.csv"),
                 "--output", str(local)]) == 0
    remote = tmp_path / "remote.csv"
    options = json.dumps(s3.options())
    assert main(["predict", "--export", str(tmp_path / "export"), "--input", "s3://data/csv/part-001.csv",
                 "--output", str(remote), f"data.storage_options={options}"]) == 0
    capsys.readouterr()
    assert remote.read_text() == local.read_text() and len(remote.read_text().splitlines()) == 1 + 163


def test_ember_profile_reads_s3_as_it_reads_local_files(s3, files, tmp_path, capsys):
    """The profile of s3://data/csv/ is the profile of the same local directory (paths aside)."""
    out = {}
    for name, path, options in (("local", str(files / "csv"), None), ("s3", "s3://data/csv/", s3.options())):
        raw = _cfg(tmp_path, name, path, None)
        if options:
            raw["data"]["storage_options"] = options
        (tmp_path / f"{name}.json").write_text(json.dumps(raw))
        assert main(["profile", "--config", str(tmp_path / f"{name}.json"), "--out", str(tmp_path / name)]) == 0
        out[name] = sorted(p.name for p in (tmp_path / name).iterdir())
        out[name + "_printed"] = capsys.readouterr().out.split("wrote")[0]
    assert out["local"] == out["s3"]
    assert out["s3_printed"] == out["local_printed"].replace(str(files / "csv") + "/", "s3://data/csv/")
