"""``train.mode: online`` on a watched directory, the rolling window and delta exports on 2 gloo
ranks (spawned from this process, ``tests.distributed.ranks``) end as one process does on the
same files: the same model and stream position, the same window records, the same export
series (each export's rows and dense model), which ``ember serve`` follows."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import yaml

from ember.checkpoint.delta import series_entries
from ember.checkpoint.load import resolve_checkpoint, verify_checkpoint
from ember.config import from_dict
from ember.serving.follow import SeriesSource
from ember.testing.distributed import assert_states_close, checkpoint_state, finish, rank_pids, torchrun_start
from ember.train.loop import train
from tests.distributed.ranks import merge_tables, run_ranks, table_rows

pytestmark = [pytest.mark.dist, pytest.mark.slow]

SCHEMA = {"labels": ["label"], "dense": [{"name": "d1"}], "sparse": [{"name": "c1"}, {"name": "c2"}]}


def _write(folder: Path, k: int, rows: int) -> None:
    rng = np.random.default_rng(k)
    c1 = rng.integers(0, 60, rows)
    label = (rng.random(rows) < np.where(c1 < 20, 0.7, 0.15)).astype(int)
    lines = ["label,d1,c1,c2"] + [f"{y},{rng.integers(0, 9)},a{c},b{rng.integers(0, 40)}" for y, c in zip(label, c1)]
    tmp = folder / f".part-{k:03d}.csv"
    tmp.write_text("\n".join(lines) + "\n")
    os.replace(tmp, folder / f"part-{k:03d}.csv")


def _raw(root: Path, name: str, **train_kw: Any) -> dict:
    return {
        "data": {"format": "csv", "train": str(root / "in"), "batch_size": 64,
                 "watch": {"poll_s": 0.05, "idle_timeout_s": 0.5, "settle_s": 0, "order": "name"}},
        "schema": SCHEMA,
        "embedding": {"dim": 4, "optimizer": {"type": "adagrad", "lr": 0.05}},
        "tables": [{"name": "c2", "ttl_steps": 4}],
        "model": {"type": "dlrm", "bottom_mlp": [8, 4], "top_mlp": [8]},
        "eval": {"window_rows": 100, "window_every": 3},
        "export": {"every_steps": 3, "full_every": 2, "keep_full": 10},
        "train": {"out_dir": str(root / "runs"), "run_name": name, "progress": False, "precision": "fp32", "threads": 1,
                  "log_every": 4,
                  "mode": "online", "deterministic": True, "dense_optimizer": {"type": "adam", "lr": 0.02}, **train_kw},
        "distributed": {"sharding": "row_wise"},
    }


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("online_ranks")
    (root / "in").mkdir()
    for k in range(4):
        _write(root / "in", k, 150 + 13 * k)  # 678 rows: 10 batches of 64 spanning files, then 38 rows
    return root


def _train(rank: int, world_size: int, raw: dict) -> dict[str, Any]:
    result = train(from_dict(raw))
    assert result.parts is not None
    tables = table_rows(result.parts.embeddings)
    windows = [r for r in result.history if r.get("kind") == "eval" and "window_rows" in r]
    return {"step": result.step, "model": {k: v.clone() for k, v in result.parts.model.state_dict().items()},
            "tables": tables, "windows": windows}


def _tables(ranks: list[dict]) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    return merge_tables([r["tables"] for r in ranks])


def _export(path: Path) -> dict[str, Any]:
    """An export's manifest (less its hashes), its tables' files and its dense model."""
    manifest = json.loads((path / "manifest.json").read_text())
    files = {f: np.fromfile(path / f, dtype="<i8" if f.endswith((".ids", ".removed")) else "<f4")
             for f in manifest["files"] if f.startswith("tables/")}
    dense = torch.load(path / "dense.pt")
    return {"manifest": {k: v for k, v in manifest.items() if k != "files"}, "files": files, "dense": dense}


@pytest.fixture(scope="module")
def runs(root) -> tuple[dict, list[dict]]:
    one = run_ranks(_train, 1, (_raw(root, "one"),), timeout=120)[0]
    two = run_ranks(_train, 2, (_raw(root, "two"),), timeout=180)
    return one, two


def test_online_window_and_exports_on_two_ranks_equal_one_process(root, runs):
    one, two = runs
    assert one["step"] == 11 and all(r["step"] == 11 for r in two)  # the partial last batch trains on both
    for r in two:
        for k, v in one["model"].items():
            torch.testing.assert_close(r["model"][k], v, rtol=1e-4, atol=1e-5, msg=lambda m: f"model {k}: {m}")
    want, got = _tables([one]), _tables(two)
    for name, (ids, rec) in want.items():
        np.testing.assert_array_equal(got[name][0], ids, err_msg=f"table {name}: IDs differ")
        np.testing.assert_allclose(got[name][1], rec, rtol=1e-4, atol=1e-5, err_msg=f"table {name}")
    # the stream position rank 0 wrote is the one-process run's: every row of the 4 files trained
    pos = [verify_checkpoint(resolve_checkpoint(root / "runs" / n))["position"] for n in ("one", "two")]
    assert pos[0] == pos[1] and len(pos[1]["files_done"]) == 3 and pos[1]["file_rows"] == 189
    # the rolling window over both ranks' rows: the same reports as one process
    assert [w["step"] for w in one["windows"]] == [3, 6, 9, 11]
    for r in two:
        assert [w["step"] for w in r["windows"]] == [w["step"] for w in one["windows"]]
        for a, b in zip(r["windows"], one["windows"]):
            assert a["window_rows"] == b["window_rows"] == 100
            assert {k: v for k, v in a.items() if k != "t"} == pytest.approx({k: v for k, v in b.items() if k != "t"},
                                                                            abs=1e-5)
    # the export series: the same exports, each with the same rows and dense model
    series = [series_entries(root / "runs" / n / "exports") for n in ("one", "two")]
    assert [(e.number, e.kind) for e in series[1]] == [(e.number, e.kind) for e in series[0]]
    assert [e.kind for e in series[0]] == ["full", "delta", "delta", "full"]  # steps 3, 6, 9, 11
    for a, b in zip(*series):
        ea, eb = _export(a.path), _export(b.path)
        assert eb["manifest"] == ea["manifest"], a.path.name
        assert sorted(eb["files"]) == sorted(ea["files"])
        for f, arr in ea["files"].items():
            if f.endswith((".ids", ".removed")):
                np.testing.assert_array_equal(eb["files"][f], arr, err_msg=f"{a.path.name} {f}")
            else:
                np.testing.assert_allclose(eb["files"][f], arr, rtol=1e-4, atol=1e-5, err_msg=f"{a.path.name} {f}")
        for k, v in ea["dense"].items():
            torch.testing.assert_close(eb["dense"][k], v, rtol=1e-4, atol=1e-5)
    # ember serve follows the 2-rank series to its last export
    source = SeriesSource(root / "runs" / "two" / "exports")
    assert source.applied == series[1][-1].number


def _timed(rank: int, world_size: int, raw: dict) -> dict[str, Any]:
    import ember.train.clock as clock

    ticks = iter(range(10**6))
    clock.now = lambda: 10.0 * next(ticks) if rank == 1 else 0.0  # only rank 1's clock says a report is due
    out = _train(rank, world_size, raw)
    return {"step": out["step"], "windows": [w["step"] for w in out["windows"]]}


def test_time_based_exports_and_window_reports_fall_on_the_same_steps_on_every_rank(root):
    """export.every_s and eval.window_every_s: the ranks agree after each step (the per-step
    all-reduce), so a report due by one rank's clock is written by every rank after the same
    step, two steps on (its batch not fetched yet)."""
    raw = _raw(root, "timed")
    raw["export"] = {"every_s": 5.0, "full_every": 2, "keep_full": 10}
    raw["eval"] = {"window_rows": 100, "window_every_s": 5.0}
    ranks = run_ranks(_timed, 2, (raw,), timeout=180)
    assert ranks[0] == ranks[1] and ranks[0]["step"] == 11
    steps = [json.loads((e.path / "manifest.json").read_text())["step"]
             for e in series_entries(root / "runs" / "timed" / "exports")]
    assert len(steps) >= 3 and steps[-1] == 11  # every time-based export, then the final one
    assert set(ranks[0]["windows"]) >= set(steps[:-1]) and ranks[0]["windows"][0] >= 2


def test_sigkill_of_rank_0_mid_stream_then_resume_trains_as_one_uninterrupted_process(tmp_path):
    """torchrun, 2 ranks, on a directory whose files arrive while it trains: SIGKILL of rank 0
    (which writes the checkpoints) after its first checkpoint, more files arrive, the run resumes
    on 2 ranks: the final checkpoint (model, tables, optimizer, stream position) is that of one
    process that saw every file from the start."""
    folder = tmp_path / "in"
    folder.mkdir()
    for k in range(3):
        _write(folder, k, 100)
    raw = _raw(tmp_path, "killed", checkpoint_every=4, keep_checkpoints=10)
    del raw["export"], raw["eval"]
    raw["data"].update({"train": str(folder), "batch_size": 32})
    raw["data"]["watch"]["idle_timeout_s"] = 120  # waits for more files until killed
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(raw))
    proc = torchrun_start(path, 2)
    pids = rank_pids(proc, 2)
    runs = tmp_path / "runs"
    latest = runs / "killed" / "checkpoints" / "LATEST"
    deadline = time.monotonic() + 120
    while not latest.exists():
        assert proc.poll() is None and time.monotonic() < deadline, finish(proc, 5).stderr[-4000:]
        time.sleep(0.05)
    os.kill(pids[0], signal.SIGKILL)
    assert finish(proc, 90).returncode != 0
    killed_at = verify_checkpoint(resolve_checkpoint(runs / "killed"))["step"]
    assert 4 <= killed_at < 9  # mid-stream: the first three files hold 9 full batches
    for k in range(3, 6):
        _write(folder, k, 100)
    raw["data"]["watch"]["idle_timeout_s"] = 0.5
    run_ranks(_train, 2, ({**raw, "train": {**raw["train"], "resume": str(runs / "killed")}},), timeout=120)
    train(from_dict({**raw, "train": {**raw["train"], "run_name": "one"}}))  # one process, every file from the start
    a, b = checkpoint_state(runs / "one"), checkpoint_state(runs / "killed")
    assert a["step"] == 19  # 600 rows: 18 batches of 32, then 24 rows
    assert_states_close(a, b)


def test_online_window_and_exports_with_an_embedding_rank_equal_one_process(root, runs):
    """Online training, the rolling window and the export series with 1 embedding rank (every
    table) beside 2 dense ranks: the same model, rows, window reports and exports as one process."""
    one, _ = runs
    raw = _raw(root, "emb")
    raw["distributed"] = {"sharding": "row_wise", "placement": "embedding_ranks", "embedding_ranks": 1}
    three = run_ranks(_train, 3, (raw,), timeout=240)
    assert all(r["step"] == one["step"] for r in three)
    for r in three[:2]:  # the dense ranks (the embedding rank runs no dense model)
        for k, v in one["model"].items():
            torch.testing.assert_close(r["model"][k], v, rtol=1e-4, atol=1e-5, msg=lambda m: f"model {k}: {m}")
    assert all(three[0]["tables"][n][0].size == 0 for n in three[0]["tables"])  # the dense ranks hold no rows
    want, got = _tables([one]), _tables(three)
    for name, (ids, rec) in want.items():
        np.testing.assert_array_equal(got[name][0], ids, err_msg=f"table {name}: IDs differ")
        np.testing.assert_allclose(got[name][1], rec, rtol=1e-4, atol=1e-5, err_msg=f"table {name}")
    assert [w["step"] for w in three[0]["windows"]] == [w["step"] for w in one["windows"]]
    for a, b in zip(three[0]["windows"], one["windows"]):
        assert {k: v for k, v in a.items() if k != "t"} == pytest.approx({k: v for k, v in b.items() if k != "t"},
                                                                        abs=1e-5)
    series = [series_entries(root / "runs" / n / "exports") for n in ("one", "emb")]
    assert [(e.number, e.kind) for e in series[1]] == [(e.number, e.kind) for e in series[0]]
    for a, b in zip(*series):
        ea, eb = _export(a.path), _export(b.path)
        assert eb["manifest"] == ea["manifest"], a.path.name
        for f, arr in ea["files"].items():
            np.testing.assert_allclose(eb["files"][f], arr, rtol=1e-4, atol=1e-5, err_msg=f"{a.path.name} {f}")


def test_online_with_staleness_agrees_k_plus_2_steps_ahead(root):
    """pipeline.embedding_staleness 2 on an online stream with exports and window reports due by
    one rank's clock: the ranks agree on the stream's batches and on the reports k + 2 = 4 steps
    ahead (the fetch may be 3 steps ahead of the last computed step), so both ranks train the
    same 11 steps and report after the same steps."""
    raw = _raw(root, "stale")
    raw["export"] = {"every_s": 5.0, "full_every": 2, "keep_full": 10}
    raw["eval"] = {"window_rows": 100, "window_every_s": 5.0}
    raw["pipeline"] = {"enabled": True, "engine": "threads", "embedding_staleness": 2}
    raw["train"] = {**raw["train"], "deterministic": False}
    ranks = run_ranks(_timed, 2, (raw,), timeout=180)
    assert ranks[0] == ranks[1] and ranks[0]["step"] == 11
    assert ranks[0]["windows"][0] >= 4  # marked 4 steps on from the first agreement
    steps = [json.loads((e.path / "manifest.json").read_text())["step"]
             for e in series_entries(root / "runs" / "stale" / "exports")]
    assert len(steps) >= 2 and steps[-1] == 11
