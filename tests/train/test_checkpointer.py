"""Checkpointer: saves once per state, knows when a save is due, and the one restore path."""

from __future__ import annotations

import json

import pytest
import torch

import ember.train.checkpointer as checkpointer_module
from ember.config import from_dict
from ember.errors import CheckpointError
from ember.pipeline.loader import make_batches
from ember.pipeline.stream import StreamPosition
from ember.testing import assert_identical, run_state
from ember.train import clock
from ember.train.builder import build_components
from ember.train.checkpointer import Checkpointer, restore
from ember.train.loop import train_step
from ember.train.run_state import RunState, ShardPositions


def _cfg(tmp_path, **train):
    return from_dict({
        "data": {"preset": "synthetic", "synthetic": {"rows": 1_024, "eval_rows": 256, "vocab_size": 2_000, "num_sparse": 3},
                 "batch_size": 128},
        "embedding": {"dim": 4, "optimizer": {"type": "adam", "lr": 0.01}},
        "model": {"type": "dlrm", "bottom_mlp": [8, 4], "top_mlp": [8]},
        "train": {"dense_optimizer": {"type": "adam", "lr": 0.01}, "out_dir": str(tmp_path), "run_name": "r",
                  "progress": False, "keep_checkpoints": 10, "device": "cpu", **train},
    })


def _trained(cfg, steps: int):
    parts = build_components(cfg)
    parts.train(True)
    batches = list(make_batches(cfg.data, cfg.schema, "train"))
    for b in batches[:steps]:
        train_step(parts, b)
    return parts, batches


def _state(parts):
    return run_state(type("R", (), {"parts": parts})())


def test_a_state_is_saved_once_and_its_position_is_the_manifest_s(tmp_path, monkeypatch):
    cfg = _cfg(tmp_path)
    parts, _ = _trained(cfg, 2)
    calls = []
    original = checkpointer_module.save_checkpoint
    monkeypatch.setattr(checkpointer_module, "save_checkpoint", lambda *a, **k: calls.append(a[1]) or original(*a, **k))
    ck = Checkpointer(cfg, parts, tmp_path / "run")
    state = RunState(2, 0, 2)
    first = ck.save(state)
    assert ck.save(RunState(2, 0, 2)) == first and calls == [2]  # the same state: no second write
    manifest = json.loads((first / "manifest.json").read_text())
    assert manifest["step"] == 2 and manifest["position"] == {"epoch": 0, "batch": 2}
    assert RunState.from_dict(manifest) == state

    class Follows:  # a loader whose data position the checkpoints record
        def data_position(self, batch):
            return StreamPosition(("a.csv",), "b.csv", batch)

    ck.follow(Follows())
    path = ck.save(RunState(3, 0, 3))
    assert json.loads((path / "manifest.json").read_text())["position"] == {
        "epoch": 0, "batch": 3, "files_done": ["a.csv"], "file": "b.csv", "file_rows": 3}


def test_when_a_save_is_due(tmp_path, monkeypatch):
    now = iter(range(100))
    monkeypatch.setattr(clock, "monotonic", lambda: float(next(now)))
    cfg = _cfg(tmp_path, checkpoint_every=3, checkpoint_every_s=5.0)
    parts, _ = _trained(cfg, 0)
    ck = Checkpointer(cfg, parts, tmp_path / "run")  # the clock reads 0
    assert ck.due(3) and ck.due(6) and not ck.due(4)
    assert not ck.time_due()  # 1 s
    for _ in range(3):
        next(now)
    assert ck.time_due()  # 5 s since the start
    ck.mark(4)
    assert ck.due(4) and not ck.time_due()  # one marked at a time
    ck.after_step(RunState(4, 0, 4))
    assert not ck.due(4) and (tmp_path / "run" / "checkpoints" / "step-00000004").exists()
    assert not ck.time_due()  # counted from that save


def test_restore_makes_the_parts_the_checkpoint_s(tmp_path):
    cfg = _cfg(tmp_path)
    parts, batches = _trained(cfg, 3)
    saved = _state(parts)
    opt = {k: v.clone() for k, v in parts.dense_optimizer.state_dict()["state"][0].items()}
    path = Checkpointer(cfg, parts, tmp_path / "run").save(RunState(3, 0, 3, ShardPositions((2, 1))))
    for b in batches[3:6]:  # trains on: new IDs, other weights
        train_step(parts, b)
    rows_after = sum(len(t) for t in parts.embeddings.tables.values())

    restored = restore(parts, path, exact=True, cfg=cfg)  # restore_best: into parts that trained on
    assert_identical(_state(parts), saved)
    assert sum(len(t) for t in parts.embeddings.tables.values()) < rows_after  # IDs created after it are gone
    assert torch.equal(parts.dense_optimizer.state_dict()["state"][0]["exp_avg"], opt["exp_avg"])
    assert restored.state == RunState(3, 0, 3, ShardPositions((2, 1)))

    fresh = build_components(cfg)
    restore(fresh, path, exact=False, cfg=cfg)  # init_from, eval, export: the weights and the tables' counters
    assert_identical(_state(fresh), saved)
    assert fresh.dense_optimizer.state_dict()["state"] == {}  # not the optimizer
    assert {n: t.step for n, t in fresh.embeddings.tables.items()} == {n: t.step for n, t in parts.embeddings.tables.items()}


def test_a_checkpoint_that_does_not_fit_names_the_differing_keys(tmp_path):
    cfg = _cfg(tmp_path)
    parts, _ = _trained(cfg, 1)
    path = Checkpointer(cfg, parts, tmp_path / "run").save(RunState(1, 0, 1))
    wider = from_dict({**cfg.model_dump(mode="json", by_alias=True), "model": {"type": "dlrm", "bottom_mlp": [16, 4], "top_mlp": [8]}})
    with pytest.raises(CheckpointError, match=r"does not fit this config's model.*model\.bottom_mlp"):
        restore(build_components(wider), path, exact=False, cfg=wider)


def test_a_config_listing_the_checkpoints_inputs_in_another_order_is_refused(tmp_path):
    """Same shapes, inputs swapped: the weights would meet the wrong features and score silently
    wrong (eval, export, resume and init_from all restore through here)."""
    cfg = _cfg(tmp_path)
    parts, _ = _trained(cfg, 1)
    path = Checkpointer(cfg, parts, tmp_path / "run").save(RunState(1, 0, 1))
    raw = cfg.model_dump(mode="json", by_alias=True)
    sparse, dense = raw["schema"]["sparse"], raw["schema"]["dense"]
    for key, swapped in (("sparse", [sparse[1], sparse[0], *sparse[2:]]), ("dense", [dense[1], dense[0], *dense[2:]])):
        other = from_dict({**raw, "schema": {**raw["schema"], key: swapped}})
        first, second = swapped[0]["name"], swapped[1]["name"]
        with pytest.raises(CheckpointError, match=rf"in the order \['{second}', '{first}'.*schema\.{key} lists them as \['{first}', '{second}'"):
            restore(build_components(other), path, exact=False, cfg=other)
    restore(build_components(cfg), path, exact=False, cfg=cfg)  # the checkpoint's own order loads


def _rows(parts) -> dict[str, dict[int, torch.Tensor]]:
    """{table: {ID: fp32 record}} of every table."""
    out = {}
    for name, t in parts.embeddings.tables.items():
        rows = {}
        for ids, rec in t.items():
            rows.update(zip(ids.tolist(), t.codec.decode(rec) if hasattr(t, "codec") else rec))
        out[name] = rows
    return out


@pytest.mark.parametrize("new", [{"type": "sgd", "lr": 0.1}, {"type": "rowwise_adagrad", "lr": 0.05},
                                 {"type": "adagrad", "lr": 0.05, "initial_accumulator_value": 0.1},
                                 {"type": "ftrl", "alpha": 0.05}])
def test_a_finetune_may_change_the_sparse_optimizer(tmp_path, new):
    """train.init_from with another sparse optimizer type: every row's weights are the
    checkpoint's, bit for bit, and its state is what the new optimizer gives a fresh row of
    those weights (``init_state``); the finetune then trains. A resume, and a finetune that
    changes a table's dim, are refused with the reason."""
    cfg = _cfg(tmp_path)  # trained with adam (state 2 * dim + 1 floats a row)
    parts, batches = _trained(cfg, 3)
    path = Checkpointer(cfg, parts, tmp_path / "run").save(RunState(3, 0, 3))
    saved = _rows(parts)
    raw = cfg.model_dump(mode="json", by_alias=True)
    other = from_dict({**raw, "embedding": {**raw["embedding"], "optimizer": new}})
    fresh = build_components(other)
    restore(fresh, path, exact=False, cfg=other)
    loaded = _rows(fresh)
    dim = cfg.embedding.dim
    assert {n: set(r) for n, r in loaded.items()} == {n: set(r) for n, r in saved.items()}
    for name, rows in loaded.items():
        opt = fresh.embeddings.tables[name].config.optimizer
        assert opt.type == new["type"]
        for i, rec in rows.items():
            w = saved[name][i][:dim]
            assert torch.equal(rec[:dim], w), (name, i)
            assert torch.equal(rec[dim:], opt.init_state(w.unsqueeze(0))[0]), (name, i)
    fresh.train(True)
    train_step(fresh, batches[3])  # the new optimizer's rule runs on the loaded rows
    with pytest.raises(CheckpointError, match=r"keep dim and optimizer type when resuming"):
        restore(build_components(other), path, exact=True, cfg=other)
    wider = from_dict({**raw, "embedding": {**raw["embedding"], "dim": 8, "optimizer": new},
                       "model": {"type": "dlrm", "bottom_mlp": [8, 8], "top_mlp": [8]}})
    with pytest.raises(CheckpointError, match=r"keep its dim \(a finetune"):
        restore(build_components(wider), path, exact=False, cfg=wider)
