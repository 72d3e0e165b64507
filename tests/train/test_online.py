"""train.mode: online on a watched directory: the same weights as an offline pass over the same
files in order (threads and in line); files written while it trains are picked up in order and
never read half; SIGKILL and SIGTERM then resume train every row exactly once; the rolling
window reports AUC / logloss of the most recent scored rows."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from ember.checkpoint.load import resolve_checkpoint, verify_checkpoint
from ember.config import from_dict
from ember.errors import ConfigError, DataError, RunInterrupted
from ember.train.loop import train
from ember.train.metrics import evaluate_predictions
from ember.testing import assert_identical, run_state

SCHEMA = {"labels": ["label"], "dense": [{"name": "d1"}], "sparse": [{"name": "c1"}, {"name": "c2"}]}


def _lines(seed: int, rows: int) -> list[str]:
    rng = np.random.default_rng(seed)
    c1 = rng.integers(0, 60, rows)
    label = (rng.random(rows) < np.where(c1 < 20, 0.7, 0.15)).astype(int)  # c1 carries signal
    return ["label,d1,c1,c2"] + [f"{y},{rng.integers(0, 9)},a{c},b{rng.integers(0, 20)}" for y, c in zip(label, c1)]


def _write(folder: Path, k: int, rows: int = 200) -> Path:
    """File k, written under a temporary name and renamed into place (complete when it appears)."""
    tmp, final = folder / f".part-{k:03d}.csv", folder / f"part-{k:03d}.csv"
    tmp.write_text("\n".join(_lines(k, rows)) + "\n")
    os.replace(tmp, final)
    return final


def _raw(tmp_path: Path, name: str, folder: Path, *, online: bool = True, enabled: bool = True,
         watch: dict | None = None, **train_kw: Any) -> dict:
    data: dict[str, Any] = {"format": "csv", "train": str(folder), "batch_size": 64}
    t: dict[str, Any] = {"out_dir": str(tmp_path), "run_name": name, "progress": False, "deterministic": True,
                         "threads": 1, "log_every": 4, **train_kw}
    if online:
        t["mode"] = "online"
        data["watch"] = {"poll_s": 0.05, "idle_timeout_s": 0.5, "settle_s": 0, "order": "name", **(watch or {})}
    else:
        data["shuffle_buffer"] = 0
    return {"data": data, "schema": SCHEMA, "embedding": {"dim": 4, "optimizer": {"type": "adagrad", "lr": 0.05}},
            "model": {"type": "dlrm", "bottom_mlp": [8, 4], "top_mlp": [8]}, "pipeline": {"enabled": enabled}, "train": t}


def _position(run_dir: Path) -> dict:
    return verify_checkpoint(resolve_checkpoint(run_dir))["position"]


@pytest.fixture(scope="module")
def offline_pass(tmp_path_factory) -> tuple[Path, int, dict[str, torch.Tensor]]:
    """Four files whose rows do not fill whole batches, and an offline pass over them in order."""
    tmp = tmp_path_factory.mktemp("offline")
    folder = tmp / "in"
    folder.mkdir()
    for k in range(4):
        _write(folder, k, 150 + 13 * k)  # batches span files
    offline = train(from_dict(_raw(tmp, "off", folder, online=False)))
    return folder, offline.step, run_state(offline)


@pytest.mark.parametrize("enabled, workers", [(True, 0), (False, 0), (True, 1)], ids=["threads", "in_line", "worker"])
def test_online_trains_exactly_as_one_offline_pass_in_file_order(tmp_path, offline_pass, enabled, workers):
    """Threads, in line, or read and featurized in a worker process (pipeline.data_workers)."""
    folder, offline_steps, offline_state = offline_pass
    raw = _raw(tmp_path, "on", folder, enabled=enabled)
    raw["pipeline"]["data_workers"] = workers
    online = train(from_dict(raw))
    assert online.step == offline_steps == -(-sum(150 + 13 * k for k in range(4)) // 64)
    assert_identical(offline_state, run_state(online))
    pos = _position(online.run_dir)
    assert [Path(f).name for f in pos["files_done"]] == ["part-000.csv", "part-001.csv", "part-002.csv"]
    assert (Path(pos["file"]).name, pos["file_rows"], pos["batch"]) == ("part-003.csv", 189, online.step)


def test_files_written_while_training_are_taken_in_order_and_never_half(tmp_path):
    """A writer thread adds files while the trainer waits: renamed into place, or written in
    place in two halves (data.watch.settle_s keeps the half file out); the weights equal an
    offline pass over the finished files."""
    folder = tmp_path / "in"
    folder.mkdir()
    _write(folder, 0)

    def writer() -> None:
        for k in range(1, 5):
            time.sleep(0.2)
            if k % 2:
                _write(folder, k)
            else:  # in place: half the lines, a pause, the rest (a reader taking it now would read half)
                lines = _lines(k, 200)
                path = folder / f"part-{k:03d}.csv"
                path.write_text("\n".join(lines[:100]) + "\n")
                time.sleep(0.1)
                with open(path, "a") as f:
                    f.write("\n".join(lines[100:]) + "\n")

    th = threading.Thread(target=writer)
    th.start()
    try:
        online = train(from_dict(_raw(tmp_path, "live", folder, watch={"settle_s": 0.8, "idle_timeout_s": 2.0, "order": "mtime"})))
    finally:
        th.join()
    offline = train(from_dict(_raw(tmp_path, "off", folder, online=False)))
    assert online.step == offline.step == -(-1000 // 64)
    assert_identical(run_state(offline), run_state(online))
    assert [Path(f).name for f in _position(online.run_dir)["files_done"]] == [f"part-{k:03d}.csv" for k in range(4)]


def _spawn(cfg: dict, path: Path, *overrides: str) -> subprocess.Popen:
    path.write_text(json.dumps(cfg))
    return subprocess.Popen([sys.executable, "-m", "ember", "train", "--config", str(path), *overrides],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_for(proc: subprocess.Popen, ready: Path, timeout: float = 120) -> None:
    deadline = time.time() + timeout
    while not ready.exists():
        assert proc.poll() is None, proc.communicate()
        assert time.time() < deadline, f"{ready} did not appear"
        time.sleep(0.05)


def test_sigkill_and_sigterm_then_resume_train_every_row_exactly_once(tmp_path):
    """Run 1 (a process) trains files 0-2, checkpoints every 2 steps and is SIGKILLed after the
    step-8 checkpoint (steps past it are lost with it); run 2 resumes, trains files 3-4 as they
    come, and gets SIGTERM while it waits for more (it checkpoints where it stands, its partial
    batch untrained); run 3 resumes and ends at the idle timeout. The weights equal one
    uninterrupted run's: no file skipped, no row trained twice."""
    folder = tmp_path / "in"
    folder.mkdir()
    for k in range(3):
        _write(folder, k)
    run_dir = tmp_path / "kill"
    waiting = {"idle_timeout_s": 120}
    proc = _spawn(_raw(tmp_path, "kill", folder, watch=waiting, checkpoint_every=2), tmp_path / "c1.json")
    _wait_for(proc, run_dir / "checkpoints" / "step-00000008" / "manifest.json")
    latest, deadline = run_dir / "checkpoints" / "LATEST", time.time() + 120
    while latest.read_text().strip() != "step-00000008":  # LATEST is replaced just after the rename
        assert time.time() < deadline and proc.poll() is None, "LATEST never named step 8"
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=60)
    pos = _position(run_dir)
    assert pos["batch"] == 8 and (Path(pos["file"]).name, pos["file_rows"]) == ("part-002.csv", 112)  # 8 * 64 - 400

    def feed_then_terminate() -> None:  # run 2 trains in this process; SIGTERM once step 15 is logged
        for k in (3, 4):
            _write(folder, k)
        deadline = time.time() + 300
        while time.time() < deadline:
            lines = (run_dir / "metrics.jsonl").read_text().splitlines()
            if any(json.loads(ln).get("step") == 15 for ln in lines):
                break
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGTERM)

    feeder = threading.Thread(target=feed_then_terminate)
    feeder.start()
    try:
        with pytest.raises(RunInterrupted, match="SIGTERM"):  # 40 rows wait for a 16th batch meanwhile
            train(from_dict(_raw(tmp_path, "kill", folder, watch=waiting, checkpoint_every=2, log_every=1,
                                 resume=str(run_dir))))
    finally:
        feeder.join()
    pos = _position(run_dir)
    assert pos["batch"] == 15 and (Path(pos["file"]).name, pos["file_rows"]) == ("part-004.csv", 160)

    resumed = train(from_dict(_raw(tmp_path, "kill", folder, checkpoint_every=2, resume=str(run_dir))))
    whole = train(from_dict(_raw(tmp_path, "whole", folder)))
    assert resumed.step == whole.step == 16
    assert_identical(run_state(whole), run_state(resumed))
    assert [Path(f).name for f in _position(run_dir)["files_done"]] == [f"part-{k:03d}.csv" for k in range(4)]


def test_online_without_any_file_stops_at_the_idle_timeout_naming_it(tmp_path):
    folder = tmp_path / "empty"
    folder.mkdir()
    t0 = time.perf_counter()
    with pytest.raises(DataError, match=r"no rows arrived in data.train .* within data.watch.idle_timeout_s \(0.5 s\)"):
        train(from_dict(_raw(tmp_path, "none", folder)))
    assert time.perf_counter() - t0 < 30
    assert not (tmp_path / "none").exists()  # a run that failed before its first checkpoint leaves nothing


def _spy_window(monkeypatch) -> list[tuple[np.ndarray, np.ndarray, dict]]:
    """What the training stream adds to the rolling window, batch after batch: (probs, labels,
    key columns), copies."""
    import ember.train.stages as stages_mod

    seen: list[tuple[np.ndarray, np.ndarray, dict]] = []
    original = stages_mod.RollingWindow.add

    def spy(self, probs, labels, step=0, keys=None):  # type: ignore[no-untyped-def]
        seen.append((np.asarray(probs).copy(), np.asarray(labels).copy(), {k: v.copy() for k, v in (keys or {}).items()}))
        return original(self, probs, labels, step, keys)

    monkeypatch.setattr(stages_mod.RollingWindow, "add", spy)
    return seen


def test_rolling_window_reports_the_last_rows_scored_before_their_update(tmp_path, monkeypatch):
    """eval.window_rows: each report's AUC / logloss equal the reference metrics on the last
    window_rows (score, label) pairs of the training forward; the first batch's scores are the
    initial model's (scored before its update)."""
    seen = _spy_window(monkeypatch)
    folder = tmp_path / "in"
    folder.mkdir()
    for k in range(3):
        _write(folder, k)
    # (a window scores the training forward, in train.precision; fp32 here, so that the initial
    # model's scores compare exactly with predict's below)
    raw = _raw(tmp_path, "win", folder, precision="fp32")
    raw["eval"] = {"window_rows": 150, "window_every": 3}
    raw["embedding"]["optimizer"]["lr"] = 0.5
    raw["train"]["dense_optimizer"] = {"type": "adam", "lr": 0.01}
    result = train(from_dict(raw))
    reports = [r for r in result.history if r["kind"] == "eval" and "window_rows" in r]
    assert [r["step"] for r in reports] == [3, 6, 9, 10]  # every 3 steps, and at the end
    probs = np.concatenate([p for p, _, _ in seen])
    labels = np.concatenate([y for _, y, _ in seen])
    assert len(probs) == 600
    for r in reports:
        n = min(r["step"] * 64, 600)
        want = evaluate_predictions(labels[max(0, n - 150):n], probs[max(0, n - 150):n], ["label"])
        assert r["window_rows"] == 150
        assert r["auc/label"] == pytest.approx(want["auc/label"], abs=1e-12)
        assert r["logloss/label"] == pytest.approx(want["logloss/label"], abs=1e-9)
    assert reports[-1]["auc/label"] > 0.6  # c1 carries signal: the stream is learned
    # the first batch was scored by the initial model (before any update)
    from ember.pipeline.stream import StreamLoader
    from ember.train.evaluate import predict_batches
    from ember.train.loop import prepare_run

    cfg = from_dict(_raw(tmp_path, "init", folder, precision="fp32"))
    parts, _ = prepare_run(cfg)
    first = next(iter(StreamLoader(cfg.data, cfg.schema)))
    p0, _ = predict_batches(parts, [first])
    np.testing.assert_allclose(p0, seen[0][0], rtol=1e-6, atol=1e-7)


def test_docs_online_example_validates():
    import re

    import yaml

    from tests.conftest import REPO

    text = (REPO / "docs" / "online-serving.md").read_text()
    block = [b for b in re.findall(r"```yaml\n(.*?)```", text, re.S) if "mode: online" in b]
    assert len(block) == 1
    raw = yaml.safe_load(block[0])
    cfg = from_dict({**raw, "schema": SCHEMA, "model": {"type": "lr"}})
    assert cfg.train.mode == "online" and cfg.data.watch is not None and cfg.data.shuffle_buffer == 0
    assert cfg.eval.window_rows == 1_000_000


def test_time_based_window_reports_and_checkpoints_online(tmp_path, offline_pass, monkeypatch):
    """eval.window_every_s and checkpoint.every_s (a fake clock advancing 1 s per call):
    both fire by time alone, and the run still equals the offline pass."""
    from ember.train import clock as run_clock

    clock = iter(range(0, 10**6))
    monkeypatch.setattr(run_clock, "monotonic", lambda: float(next(clock)))
    folder, offline_steps, offline_state = offline_pass
    raw = _raw(tmp_path, "timed", folder, checkpoint_every_s=4.0, keep_checkpoints=50)
    raw["eval"] = {"window_rows": 100, "window_every_s": 3.0}
    result = train(from_dict(raw))
    steps = [r["step"] for r in result.history if r["kind"] == "eval"]
    assert 2 <= len(steps) < offline_steps and steps == sorted(set(steps)) and steps[-1] == offline_steps
    saved = sorted(p.name for p in (result.run_dir / "checkpoints").glob("step-*"))
    assert len(saved) >= 3  # by time, then the final state
    assert_identical(offline_state, run_state(result))


def test_the_window_reports_gauc_calibration_ne_and_slices_over_the_training_rows(tmp_path, monkeypatch):
    """With eval.group_by / eval.slices the training stream carries those columns and each window
    report holds every ranking metric of the last window_rows rows: GAUC against scikit-learn's
    roc_auc_score per group, calibration and NE by their formulas, slices as eval reports them."""
    from sklearn.metrics import roc_auc_score

    from ember.train.ranking_metrics import ranking_report

    seen = _spy_window(monkeypatch)
    folder = tmp_path / "in"
    folder.mkdir()
    for k in range(3):
        _write(folder, k)
    raw = _raw(tmp_path, "gwin", folder)
    raw["eval"] = {"window_rows": 256, "window_every": 4, "group_by": "c2", "slices": ["c1"], "slice_top": 2}
    result = train(from_dict(raw))
    reports = [r for r in result.history if r["kind"] == "eval" and "window_rows" in r]
    assert [r["step"] for r in reports] == [4, 8, 10]
    probs = np.concatenate([p for p, _, _ in seen])[:, 0]
    labels = np.concatenate([y for _, y, _ in seen])[:, 0]
    groups = np.concatenate([k["c2"] for _, _, k in seen])
    slices = np.concatenate([k["c1"] for _, _, k in seen])
    for r in reports:
        n = min(r["step"] * 64, len(probs))
        p, y, g, c = probs[n - 256:n], labels[n - 256:n], groups[n - 256:n], slices[n - 256:n]
        aucs, weights = [], []
        for value in np.unique(g):
            m = g == value
            if 0 < y[m].sum() < m.sum():
                aucs.append(roc_auc_score(y[m], p[m]))
                weights.append(m.sum())
        assert r["gauc/label"] == pytest.approx(np.average(aucs, weights=weights), abs=1e-9)
        assert r["calibration/label"] == pytest.approx(p.astype(np.float64).mean() / y.mean(), rel=1e-6)
        base = y.mean()
        entropy = -(base * np.log(base) + (1 - base) * np.log(1 - base))
        assert r["ne/label"] == pytest.approx(r["logloss/label"] / entropy, rel=1e-6)  # (logloss is float32 sums)
        want = ranking_report(y[:, None], p[:, None], ["label"], {"c2": g, "c1": c}, "c2", slices=["c1"], slice_top=2)
        for key, value in want.items():
            assert r[key] == pytest.approx(value, abs=1e-9, nan_ok=True), key
        assert sum(v for k, v in r.items() if k.startswith("rows/c1=")) == 256
    summary = json.loads((tmp_path / "gwin" / "summary.json").read_text())
    assert summary["window"]["gauc/label"] == pytest.approx(reports[-1]["gauc/label"])


def test_a_window_grouping_by_a_column_the_data_lacks_names_it(tmp_path):
    folder = tmp_path / "in"
    folder.mkdir()
    _write(folder, 0)
    raw = _raw(tmp_path, "nokey", folder)
    raw["eval"] = {"window_rows": 64, "group_by": "user_id"}
    with pytest.raises(ConfigError, match=r"eval.group_by / eval.slices \(with eval.window_rows.*\['user_id'\]"):
        train(from_dict(raw))


def test_an_online_runs_export_scores_files_as_its_eval_does(tmp_path):
    """``Predictor.predict_files`` (``ember predict``) on the export of an online run: the run's
    ``data.watch`` describes its training stream, not the files to score (it was carried into
    the scoring config, which then refused it: "data.watch watches the data.train directories");
    the scores give the AUC the run's eval gave."""
    from ember.cli import main
    from ember.serving import Predictor
    from ember.train.metrics import auc

    folder = tmp_path / "in"
    folder.mkdir()
    for k in range(2):
        _write(folder, k)
    held_out = tmp_path / "eval.csv"
    held_out.write_text("\n".join(_lines(9, 300)) + "\n")
    raw = _raw(tmp_path, "online", folder)
    raw["data"]["eval"] = str(held_out)
    result = train(from_dict(raw))
    assert main(["export", "--checkpoint", str(result.run_dir), "--out", str(tmp_path / "export")]) == 0
    scores = Predictor.load(tmp_path / "export").predict_files([str(held_out)])[:, 0]
    labels = np.array([int(line.split(",")[0]) for line in _lines(9, 300)[1:]])
    assert auc(labels, scores) == pytest.approx(result.metrics["auc/label"], abs=1e-6)
