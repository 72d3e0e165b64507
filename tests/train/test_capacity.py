"""``ember plan`` with a profile: table rows against a profile of known counts and against what a
real trained run's tables hold, bytes per tier and rank by the storage plan's math, and the CLI."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from ember.cli import main
from ember.config import from_dict
from ember.distributed.sharding import ShardingPlan, TableSharding
from ember.train.capacity import COUNTER_BYTES_PER_ID, estimate_rows, plan_capacity
from ember.train.loop import train
from ember.train.profile import FORMAT, VERSION, profile_data
from ember.tiers.storage import memory_row_bytes, plan_storage

BASE = {"data": {"preset": "synthetic", "synthetic": {"num_sparse": 2, "num_dense": 1, "vocab_size": 100}, "batch_size": 10},
        "embedding": {"dim": 8}, "model": {"type": "dlrm", "bottom_mlp": [8, 8], "top_mlp": [8]},
        "train": {"threads": 1, "progress": False}}


def _profile(rate: float = 0.25) -> dict:
    """A profile with known counts: table C1's sampled IDs seen 1, 2, 3 and 64+ times; C2's all
    exact. ``rate``: C1's sample rate."""
    table = {"features": ["C1"], "distinct": {}, "sample_rate": rate, "frequency_cap": 64,
             "frequencies": {"1": 400, "2": 100, "3": 50, "64": 10}}
    exact = {"features": ["C2"], "distinct": {}, "sample_rate": 1.0, "frequency_cap": 64, "frequencies": {"1": 30, "5": 20}}
    return {"format": FORMAT, "version": VERSION, "data": {"complete": True, "rows_read": 1000, "rows": 1000},
            "sparse": {"C1": {}, "C2": {}}, "tables": {"C1": table, "C2": exact}}


def _cfg(**over) -> object:
    raw = copy.deepcopy(BASE)
    for key, value in over.items():
        section, name = key.split("__")
        raw.setdefault(section, {})[name] = value
    return from_dict(raw)


def test_rows_from_a_profile_of_known_counts():
    e = estimate_rows(_cfg(), _profile())
    assert (e["C1"].rows, e["C1"].distinct) == (560 * 4, 560 * 4)
    assert e["C1"].stderr == pytest.approx(np.sqrt(560 * 0.75) / 0.25)
    assert (e["C2"].rows, e["C2"].stderr) == (50, 0.0)
    two = estimate_rows(_cfg(embedding__min_count=2), _profile())  # seen >= 2 times
    assert (two["C1"].rows, two["C1"].distinct, two["C2"].rows) == (160 * 4, 560 * 4, 20)
    assert estimate_rows(_cfg(embedding__min_count=2, train__epochs=2), _profile())["C1"].rows == 560 * 4  # 1 a pass
    assert estimate_rows(_cfg(embedding__min_count=6, train__epochs=2), _profile())["C1"].rows == 60 * 4  # 3 a pass


def test_ttl_caps_rows_by_the_profiles_window_when_it_matches():
    p = _profile()
    p["tables"]["C1"].update(ttl_window_rows=2 * 50 * 10, ttl_window_distinct=700)
    assert estimate_rows(_cfg(embedding__ttl_steps=50), p)["C1"].rows == 700
    other = estimate_rows(_cfg(embedding__ttl_steps=20), p)["C1"]
    assert other.rows == 2240 and "no window" in other.notes[0]


def test_profile_of_another_schema_is_refused():
    p = _profile()
    del p["sparse"]["C2"]
    with pytest.raises(ValueError, match=r"no sparse feature\(s\) \['C2'\]"):
        estimate_rows(_cfg(), p)


def test_bytes_per_tier_and_rank_follow_the_storage_plan():
    cfg = _cfg(embedding__storage={"host_rows": 500, "disk_path": "/tmp/ember-plan-test", "disk_rows": 1000},
               distributed__table_wise_max_rows=100)
    plan = plan_capacity(cfg, 2, _profile())
    assert plan.sharding.spec("C1").kind == "row_wise" and plan.sharding.spec("C2").kind == "table_wise"
    c1 = [u for u in plan.uses if u.table == "C1"]
    assert sorted(u.rank for u in c1) == [0, 1] and sum(u.rows for u in c1) == 2240
    words = cfg.table_configs()[0].stored_words
    for u in c1:  # 1120 rows a rank: 500 in the host cache, the rest on disk (the file as sized)
        assert (u.host_rows, u.disk_rows, u.device_rows) == (500, 620, 0)
        sp = plan_storage(cfg.table_configs()[0].storage, words, "C1")
        assert (u.host_bytes, u.disk_bytes) == (sp.host_bytes, sp.disk_bytes)
    (c2,) = [u for u in plan.uses if u.table == "C2"]
    assert (c2.rank, c2.rows, c2.host_rows, c2.disk_rows) == (plan.sharding.spec("C2").rank, 50, 50, 0)
    per_rank = plan.per_rank()
    assert sum(r["disk"] for r in per_rank) == 3 * sp.disk_bytes
    grown = plan_capacity(_cfg(embedding__storage={"disk_path": "/tmp/ember-plan-test", "disk_rows": 100}), 1, _profile())
    (g,) = [u for u in grown.uses if u.table == "C1"]
    assert g.disk_rows == 2240 and g.disk_bytes == plan_storage(
        grown.tables["C1"].storage.model_copy(update={"disk_rows": 2240}), words, "C1").disk_bytes


def test_the_plan_says_when_a_rank_needs_more_ram_than_this_machine_has(monkeypatch):
    """A plan may be for other machines, so it is not refused; but a budget ember train would
    refuse here is said beside the rank's line."""
    import ember.train.capacity as capacity

    plan = plan_capacity(_cfg(embedding__storage={"host_rows": 500}), 2, _profile())
    monkeypatch.setattr(capacity, "mem_available", lambda: 10**12)
    assert "more RAM than this machine has" not in plan.describe()
    monkeypatch.setattr(capacity, "mem_available", lambda: 1000)
    text = plan.describe()
    assert "rank 0: RAM" in text and "more RAM than this machine has available (1000 B): ember train refuses it here" in text


def test_unbounded_host_grows_with_rows_and_min_count_counts_the_rest():
    cfg = _cfg(embedding__min_count=2)
    plan = plan_capacity(cfg, 1, _profile())
    (u,) = [u for u in plan.uses if u.table == "C1"]
    words = cfg.table_configs()[0].stored_words
    assert u.rows == 640 and u.host_bytes == memory_row_bytes(words, 640) + (2240 - 640) * COUNTER_BYTES_PER_ID
    capped = plan_capacity(_cfg(embedding__storage={"host_rows": 100}), 1, _profile())
    assert [u.over_cap for u in capped.uses if u.table == "C1"] == [True]
    text = capped.describe()
    assert "over its host_rows cap" in text and "?" not in text.split("sharding plan")[1]
    assert plan.checkpoint_bytes > 640 * (8 + 4 * words) + 50 * (8 + 4 * words)


# ---- against a real run -------------------------------------------------------------------------

def _ids_file(tmp_path: Path, n: int = 4000) -> Path:
    rng = np.random.default_rng(0)
    path = tmp_path / "train.parquet"
    pq.write_table(pa.table({"label": (rng.random(n) < 0.3).astype(np.int64), "x": rng.random(n),
                             "user": rng.zipf(1.3, n) % 5000, "item": rng.integers(0, 800, n)}), path)
    return path


def _run_cfg(tmp_path: Path, data: Path, name: str, **tables) -> dict:
    return {"data": {"format": "parquet", "train": str(data), "batch_size": 200, "shuffle_buffer": 0},
            "schema": {"labels": ["label"], "dense": [{"name": "x"}], "sparse": [{"name": "user"}, {"name": "item"}]},
            "embedding": {"dim": 4, **tables}, "model": {"type": "lr"},
            "train": {"out_dir": str(tmp_path / "runs"), "run_name": name, "progress": False, "threads": 1,
                      "epochs": 1}}


def test_plan_rows_match_a_trained_dlrms_tables(tmp_path):
    """DLRM reads its D-wide tables: each holds the profile's distinct IDs after one epoch."""
    raw = _run_cfg(tmp_path, _ids_file(tmp_path), "dlrm")
    raw["model"] = {"type": "dlrm", "bottom_mlp": [8, 4], "top_mlp": [8]}
    cfg = from_dict(raw)
    plan = plan_capacity(cfg, 1, profile_data(cfg))
    result = train(cfg)
    assert result.parts is not None and result.parts.linear is None
    actual = {name: len(t) for name, t in result.parts.embeddings.tables.items()}
    assert {u.table: u.rows for u in plan.uses} == actual and all(actual.values())


@pytest.mark.parametrize("min_count, epochs, exact", [(1, 1, True), (2, 2, True), (3, 1, True), (3, 1, False), (2, 2, False)])
def test_plan_rows_match_a_trained_runs_tables(tmp_path, min_count, epochs, exact):
    """The plan from a profile of the training data against the rows the run's tables hold after
    training on it: equal when the run reads the rows in order (the profile counts sightings per
    batch, as the run does); an upper bound, close, with a shuffle buffer."""
    raw = _run_cfg(tmp_path, _ids_file(tmp_path), f"m{min_count}e{epochs}")
    raw["embedding"]["min_count"] = min_count
    raw["train"]["epochs"] = epochs
    if not exact:  # shuffled batches: the profile counts per occurrence, an upper bound
        raw["data"]["shuffle_buffer"] = 1000
    cfg = from_dict(raw)
    plan = plan_capacity(cfg, 1, profile_data(cfg))
    result = train(cfg)
    assert result.parts is not None
    actual = {name: len(t) for ec in result.parts.collections() for name, t in ec.tables.items()}
    planned = {u.table: u.rows for u in plan.uses}
    assert actual["user"] == actual["item"] == 0  # lr reads only its first-order tables: the plan leaves the others out
    actual = {name: rows for name, rows in actual.items() if name.endswith("__linear")}
    assert set(planned) == set(actual) and all(actual.values())
    for name, rows in actual.items():
        if exact:
            assert planned[name] == rows, name
        else:
            assert rows <= planned[name] <= rows * 1.05 + 5, (name, rows, planned[name])


def test_row_wise_shares_match_where_the_run_hashes_ids(tmp_path):
    """The plan's even row-wise share per rank against where the sharding hash sends the IDs the
    profile counted (2 ranks)."""
    data = _ids_file(tmp_path, 20_000)
    cfg = from_dict({**_run_cfg(tmp_path, data, "s"), "distributed": {"sharding": "row_wise"}})
    plan = plan_capacity(cfg, 2, profile_data(cfg))
    ids = np.unique(pq.read_table(data)["user"].to_numpy())  # hash_ids: the run's IDs are hashes of these
    from ember.featurize.hashing import hash_array

    hashed = hash_array(pa.array(ids), cfg.schema.sparse[0].salt_value)[0]
    owners = ShardingPlan(2, {"user": TableSharding("user", "row_wise")}).owners("user", hashed)
    for u in (u for u in plan.uses if u.table == "user"):
        assert abs(u.rows - int((owners == u.rank).sum())) <= 4 * np.sqrt(len(ids)) / 2


# ---- the command --------------------------------------------------------------------------------

def test_cli_plan_prints_rows_and_bytes_instead_of_question_marks(tmp_path, capsys):
    cfg = tmp_path / "run.yaml"
    cfg.write_text(yaml.safe_dump(_run_cfg(tmp_path, _ids_file(tmp_path), "cli")))
    assert main(["plan", "--config", str(cfg), "--world-size", "2"]) == 0
    before = capsys.readouterr().out
    assert "?" in before and "give --profile or --rows N" in before
    assert main(["plan", "--config", str(cfg), "--world-size", "2", "--rows", "1000"]) == 0
    out = capsys.readouterr().out
    assert "?" not in out and "from the first 1,000 rows" in out
    assert "rank 0: RAM" in out and "rank 1: RAM" in out and "checkpoints:" in out
    assert "estimated table bytes per rank (known sizes only): 0: 0 B" not in out
    assert main(["profile", "--config", str(cfg), "--out", str(tmp_path / "prof")]) == 0
    capsys.readouterr()
    assert main(["plan", "--config", str(cfg), "--world-size", "1", "--profile", str(tmp_path / "prof")]) == 0
    assert "from the profile" in capsys.readouterr().out


@pytest.mark.parametrize("extra, says", [
    (["--rows", "5", "--profile", "p.json"], "not both"),
    (["--profile", "missing.json"], "--profile missing.json does not exist"),
    (["--rows", "0"], "--rows must be >= 1"),
    (["--profile", "{not}"], "not an ember profile"),
])
def test_cli_plan_mistakes(tmp_path, capsys, monkeypatch, extra, says):
    monkeypatch.chdir(tmp_path)
    cfg = tmp_path / "run.yaml"
    cfg.write_text(yaml.safe_dump(_run_cfg(tmp_path, _ids_file(tmp_path), "err")))
    if "{not}" in extra:
        (tmp_path / "x.json").write_text(json.dumps({"rows": 3}))
        extra = ["--profile", "x.json"]
    assert main(["plan", "--config", str(cfg), "--world-size", "1", *extra]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.strip().splitlines()[-1].startswith("ember plan: error: ") and says in err


def test_ttl_rows_against_a_trained_run(tmp_path):
    """IDs that drift (each in 50 consecutive rows): with ttl_steps 2 at 100 rows a batch a row
    lives at most about 2 x 2 x 100 rows, so the plan caps the table at the most distinct IDs of
    such a window, and the trained table holds no more."""
    n = 4000
    rng = np.random.default_rng(4)
    path = tmp_path / "drift.parquet"
    pq.write_table(pa.table({"label": (rng.random(n) < 0.3).astype(np.int64), "x": rng.random(n),
                             "user": np.arange(n) // 50, "item": rng.integers(0, 30, n)}), path)
    raw = _run_cfg(tmp_path, path, "ttl")
    raw["data"]["batch_size"] = 100
    raw["embedding"]["ttl_steps"] = 2
    cfg = from_dict(raw)
    profile = profile_data(cfg)
    assert profile["tables"]["user"]["ttl_window_rows"] == 400
    assert profile["tables"]["user"]["ttl_window_distinct"] == 8  # rows 0-399, 400-799, ...: 8 IDs each
    plan = plan_capacity(cfg, 1, profile)
    planned = {u.table: u.rows for u in plan.uses}
    assert planned["user__linear"] == 8 and planned["item__linear"] == 30  # 80 users seen in all, 30 items
    result = train(cfg)
    actual = {name: len(t) for name, t in result.parts.linear.tables.items()}
    assert 0 < actual["user__linear"] <= planned["user__linear"] and actual["item__linear"] == 30


def test_tables_of_unknown_size_count_what_their_storage_reserves(tmp_path):
    """Without a profile a file source's tables have unknown rows, yet every rank holding a share
    of one reserves its disk file (sized by disk_rows) and its bounded cache whatever the rows:
    the plan counts those bytes, marks the rows '?', and says so (it said disk 0 B)."""
    csv = tmp_path / "t.csv"
    csv.write_text("label,d1,C1,C2\n1,0.5,a,b\n")
    storage = {"host_rows": 500, "disk_path": str(tmp_path / "disk"), "disk_rows": 1000}
    cfg = from_dict({**BASE, "data": {"format": "csv", "train": str(csv), "batch_size": 10},
                     "schema": {"labels": ["label"], "dense": [{"name": "d1"}], "sparse": [{"name": "C1"}, {"name": "C2"}]},
                     "embedding": {"dim": 8, "storage": storage}})
    plan = plan_capacity(cfg, 2)
    assert all(plan.estimates[t].rows is None for t in ("C1", "C2"))
    sp = plan_storage(cfg.table_configs()[0].storage, cfg.table_configs()[0].stored_words, "C1")
    assert sp.disk_bytes > 0
    for r, need in enumerate(plan.per_rank()):  # both tables row-wise over both ranks: a file each
        assert need["disk"] == 2 * sp.disk_bytes and need["host"] >= 2 * sp.host_bytes, (r, need)
    assert {(u.table, u.rank) for u in plan.uses} == {(t, r) for t in ("C1", "C2") for r in (0, 1)}
    assert not any(u.known for u in plan.uses) and all(u.rows == 0 for u in plan.uses)
    text = plan.describe()
    assert "count only what their storage reserves" in text
    row = next(line for line in text.splitlines() if line.split()[:2] == ["0", "C1"])
    assert row.split()[2:5] == ["?", "?", "?"]
