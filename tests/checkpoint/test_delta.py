"""Delta exports: each delta holds exactly what changed between two full exports of the same
training states (rows written or admitted, IDs removed by TTL), for tables in every tier
layout; numbering, full_every, retention, time-based exports."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from ember.checkpoint.config import ExportConfig
from ember.checkpoint.delta import DeltaExporter, prune_series, series_entries
from ember.serving.predictor import read_rows
from ember.testing.exports import full_export_at, train_with_exports


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("delta")
    return train_with_exports(tmp, "r", 12, {"every_steps": 2, "full_every": 3, "keep_full": 5}, checkpoint_every=2)


def _table(root: Path, meta: dict) -> dict:
    ids, w, seen = read_rows(root, meta["name"], meta["rows"], meta["dim"], meta["dtype"], "ttl_steps" in meta)
    return {"ids": ids, "w": w.numpy(), "seen": seen}


def test_series_numbering_full_every_and_manifests(run):
    got = [(e.number, e.kind, json.loads((e.path / "manifest.json").read_text())["step"])
           for e in series_entries(run / "exports")]
    # every 2 steps, a full export first and after every 3 deltas; the final step (12) exported once
    assert got == [(1, "full", 2), (2, "delta", 4), (3, "delta", 6), (4, "delta", 8), (5, "full", 10), (6, "delta", 12)]
    m = json.loads((run / "exports" / "000003-delta" / "manifest.json").read_text())
    assert m["series"] == {"kind": "delta", "number": 3, "base": 1, "previous": 2}
    assert set(m["files"]) >= {"model.pt", "tables/C1.ids", "tables/C1.weights", "tables/C1.seen", "tables/C1.removed"}


@pytest.mark.parametrize("delta", [3, 6])
def test_a_delta_holds_exactly_the_diff_of_two_full_exports(run, tmp_path, delta):
    """Rows that differ or are new between full exports at the previous and this export's step
    are all in the delta with the later values; IDs that left are removed (TTL), or expired by
    the table's step; nothing else."""
    entries = {e.number: e for e in series_entries(run / "exports")}
    d = entries[delta].path
    dm = json.loads((d / "manifest.json").read_text())
    step, prev_step = dm["step"], json.loads((entries[delta - 1].path / "manifest.json").read_text())["step"]
    before = full_export_at(run, prev_step, tmp_path / "before")
    after = full_export_at(run, step, tmp_path / "after")
    bm = {t["name"]: t for t in json.loads((before / "manifest.json").read_text())["tables"]}
    am = {t["name"]: t for t in json.loads((after / "manifest.json").read_text())["tables"]}
    removed_any = 0
    for meta in dm["tables"]:
        name = meta["name"]
        b, a, x = _table(before, bm[name]), _table(after, am[name]), _table(d, meta)
        removed = np.fromfile(d / "tables" / f"{name}.removed", dtype="<i8")
        # the delta's rows are the after-state's rows, bit for bit
        pos = np.searchsorted(a["ids"], x["ids"])
        assert np.isin(x["ids"], a["ids"]).all(), name
        np.testing.assert_array_equal(x["w"], a["w"][pos])
        if x["seen"] is not None:
            np.testing.assert_array_equal(x["seen"], a["seen"][pos])
        # every row new or changed since the previous export is in the delta
        in_b = np.isin(a["ids"], b["ids"])
        changed = ~in_b
        bpos = np.searchsorted(b["ids"], a["ids"][in_b])
        changed[in_b] = (a["w"][in_b] != b["w"][bpos]).any(1)
        assert np.isin(a["ids"][changed], x["ids"]).all(), name
        assert changed.any(), f"{name}: training changed no row between steps {prev_step} and {step}?"
        # IDs that left: listed as removed, or expired by the delta's table step (TTL)
        gone = ~np.isin(b["ids"], a["ids"])
        listed = np.isin(b["ids"], removed)
        if "ttl_steps" in meta:
            expired = meta["step"] - b["seen"] > meta["ttl_steps"]
            assert (listed | expired)[gone].all(), name
        else:
            assert listed[gone].all() and not gone.sum() or not gone.any(), name
        assert not np.isin(removed, a["ids"]).any(), name  # a removed ID has no row after
        removed_any += removed.size
    if delta == 3:  # TTL sweeps at steps 5 (log) and 6 (every ttl_steps) remove rows
        assert removed_any > 0


def test_retention_keeps_the_newest_full_exports_and_their_deltas(tmp_path):
    run = train_with_exports(tmp_path, "k", 10, {"every_steps": 2, "full_every": 2, "keep_full": 1})
    # exports 1 full, 2-3 deltas, 4 full, 5 delta (step 10); keep_full 1 prunes 1-3 after export 4
    assert [(e.number, e.kind) for e in series_entries(run / "exports")] == [(4, "full"), (5, "delta")]
    assert sorted(p.name for p in (run / "exports").iterdir()) == ["000004-full", "000005-delta"]  # nothing left aside


def test_prune_never_removes_the_newest_full_or_what_follows(tmp_path):
    for n, kind in [(1, "full"), (2, "delta"), (3, "full"), (4, "delta"), (5, "delta"), (6, "full"), (7, "delta")]:
        (tmp_path / f"{n:06d}-{kind}").mkdir()
        (tmp_path / f"{n:06d}-{kind}" / "manifest.json").write_text("{}")
    (tmp_path / "000008-delta").mkdir()  # being written: no manifest, not an export, not touched
    assert [p.name for p in prune_series(tmp_path, 2)] == ["000001-full", "000002-delta"]
    assert [e.number for e in series_entries(tmp_path)] == [3, 4, 5, 6, 7]
    prune_series(tmp_path, 1)
    assert [e.number for e in series_entries(tmp_path)] == [6, 7] and (tmp_path / "000008-delta").exists()


def test_every_s_is_decided_once_and_stays_due_until_written(tmp_path):
    now = [0.0]
    ex = DeltaExporter(ExportConfig(every_s=10), tmp_path, None, [], [], None, [], {
        "data": {}, "schema": {}, "model": {}}, clock=lambda: now[0])
    assert not ex.due(1)
    now[0] = 11.0
    assert ex.due(5) and not ex.due(6) and ex.due(5)  # decided for step 5 (at its fetch); 6 waits


def test_off_by_default_and_tracks_nothing(tmp_path):
    ex = DeltaExporter(ExportConfig(), tmp_path / "x", None, [], [], None, [], {"data": {}, "schema": {}, "model": {}})
    assert not ex.due(1000) and ex.finish(5) is None and not (tmp_path / "x").exists()


def test_time_based_exports_in_a_pipelined_run(tmp_path):
    """every_s decided at fetch time: with a tiny interval nearly every step exports, the
    pipelined loop neither hangs nor exports a step twice."""
    run = train_with_exports(tmp_path, "t", 6, {"every_s": 1e-6, "full_every": 2, "keep_full": 10})
    steps = [json.loads((e.path / "manifest.json").read_text())["step"] for e in series_entries(run / "exports")]
    assert len(steps) >= 3 and steps == sorted(set(steps)) and steps[-1] == 6


class _Sum(torch.nn.Module):
    def forward(self, dense: torch.Tensor, pooled: list[torch.Tensor], linear: list[torch.Tensor] | None = None) -> torch.Tensor:
        return torch.stack([p.sum(1) for p in pooled], 1).sum(1, keepdim=True)


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_full_plus_delta_served_equals_a_full_export_of_the_same_state(tmp_path, dtype):
    """Through the lookup phases (fetch, update, write back) without a trainer: the delta holds
    exactly the written rows, and the served full + delta reads every row as a full export of
    the final state does (bf16: the exact 16-bit weights)."""
    from ember.checkpoint.export import export_model
    from ember.embedding import EmbeddingCollection, FeatureConfig, TableConfig
    from ember.embedding.group import GroupLookup
    from ember.featurize.schema import Schema
    from ember.serving import Predictor
    from ember.serving.follow import SeriesSource
    from ember.source.config import DataConfig

    features = [FeatureConfig(name="t", table="t")]
    ec = EmbeddingCollection([TableConfig(name="t", dim=4, dtype=dtype)], features, seed=0)
    run_config = {"data": DataConfig(preset="synthetic").model_dump(mode="json"),
                  "schema": Schema(labels=["y"], sparse=[{"name": "t"}]).model_dump(mode="json"), "model": {"type": "x"}}
    exporter = DeltaExporter(ExportConfig(every_steps=1), tmp_path / "ex", _Sum(), [ec], features, None, ["y"], run_config)

    def touch(ids: range, step: int) -> None:
        lk = GroupLookup.of_ids(ec.groups[0], [torch.tensor(list(ids))], train=True).fetch()
        lk.backward(torch.randn(len(ids), 4))
        lk.update(step)
        lk.write_back()

    touch(range(0, 50), 0)
    exporter.export(1)
    touch(range(40, 80), 1)
    delta = exporter.export(2)
    assert delta.name == "000002-delta"
    assert np.fromfile(delta / "tables" / "t.ids", dtype="<i8").tolist() == list(range(40, 80))
    # _Sum is no built-in model: served through its TorchScript, trusted explicitly
    full = Predictor.load(export_model(_Sum(), [ec], features, None, ["y"], run_config, tmp_path / "full"),
                          trust_torchscript=True)
    served = SeriesSource(tmp_path / "ex", trust_torchscript=True).current.predictor.tables["t"]
    ids = torch.arange(-5, 100)
    torch.testing.assert_close(served.rows(ids), full.tables["t"].rows(ids), rtol=0, atol=0)
