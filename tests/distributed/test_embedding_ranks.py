"""Dedicated embedding ranks (``distributed.placement: embedding_ranks``): 3 gloo ranks, the
last one holding every table and running no dense model, 2 dense ranks: the run equals one
process on the same global batches (rows, dense model, optimizer state, losses, eval figures),
from scratch and resumed from a one-process checkpoint; the embedding rank's checkpoint part
holds every row, the dense ranks' none. Also: staleness k = 2 (no gradient lost), fp16 /
distill / compile, and SIGTERM to one of 2 embedding ranks beside 2 dense ranks (4 ranks)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from ember.config import from_dict
from ember.distributed.embedding_ranks import embedding_rank_ids, on_ranks
from ember.distributed.planner import plan_sharding
from ember.distributed.config import DistributedConfig
from ember.embedding.config import TableConfig
from ember.errors import ConfigError
from ember.testing.distributed import assert_states_close, checkpoint_state
from ember.train.distributed import check_distributed, sharding_plan
from ember.train.loop import train
from tests.distributed.ranks import run_ranks

CONFIG = {
    # 94 rows: 3 batches of 30, then 4 rows (2 a dense rank)
    "data": {"preset": "synthetic", "batch_size": 30,
             "synthetic": {"num_dense": 3, "num_sparse": 4, "rows": 94, "eval_rows": 60, "vocab_size": 40,
                           "signal_features": 3, "multi_hot": {"C2": 3}}},
    "embedding": {"dim": 4},
    "tables": [
        {"name": "C1", "optimizer": {"type": "sgd", "lr": 0.1}},
        {"name": "C2", "optimizer": {"type": "adagrad", "lr": 0.1}},
        {"name": "C3", "optimizer": {"type": "rowwise_adagrad", "lr": 0.1}, "min_count": 2},
        {"name": "C4", "optimizer": {"type": "adam", "lr": 0.01}, "ttl_steps": 3},
    ],
    "model": {"type": "deepfm", "deep_mlp": [8]},  # a second, dim-1 collection too
    "train": {"epochs": 2, "log_every": 2, "progress": False, "precision": "fp32", "threads": 1, "checkpoint_every": 2,
              "keep_checkpoints": 10, "dense_optimizer": {"type": "adam", "lr": 0.01}},
    "pipeline": {"enabled": False},
    "distributed": {"placement": "embedding_ranks", "embedding_ranks": 1, "sharding": "row_wise",
                    "tables": {"C1": "table_wise"}},
}


def _raw(root: Path, name: str, **train: Any) -> dict:
    return {**CONFIG, "train": {**CONFIG["train"], "out_dir": str(root), "run_name": name, **train}}


def _rank(rank: int, world_size: int, raw: dict) -> dict[str, Any]:
    """Train; this rank's row count per table and whether it ran the dense model."""
    result = train(from_dict(raw))
    assert result.parts is not None
    rows = {name: sum(int(i.numel()) for i, _ in t.items()) for name, t in result.parts.embeddings.tables.items()}
    return {"rows": rows, "embedding_rank": result.parts.embedding_rank, "ddp": result.parts.ddp is not None,
            "metrics": dict(result.metrics), "step": result.step}


def test_embedding_ranks_are_the_last_and_hold_every_table():
    assert embedding_rank_ids(5, 2) == (3, 4)
    with pytest.raises(ConfigError, match="fewer than the world size 2"):
        embedding_rank_ids(2, 2)
    tables = [TableConfig(name=n, dim=4) for n in ("big", "s1", "s2")]
    plan = on_ranks(plan_sharding(tables, 2, DistributedConfig(), {"big": 10**7, "s1": 10, "s2": 20}), (2, 3), 4)
    ids = np.arange(4000)
    assert set(plan.owners("big", ids)) == {2, 3}
    assert {plan.spec("s1").rank, plan.spec("s2").rank} == {2, 3}
    assert plan.bytes_per_rank()[:2] == [0.0, 0.0]
    cfg = from_dict({**CONFIG, "distributed": {**CONFIG["distributed"], "embedding_ranks": 2}})
    plan = sharding_plan(cfg, cfg.table_configs(), 4)
    assert plan.spec("C1").rank in (2, 3) and plan.spec("C2").ranks == (2, 3)


def test_plan_command_prints_the_embedding_ranks(tmp_path, capsys):
    from ember.cli import main

    path = tmp_path / "cfg.json"
    path.write_text(json.dumps(CONFIG | {"distributed": {**CONFIG["distributed"], "embedding_ranks": 2}}))
    assert main(["plan", "--config", str(path), "--world-size", "4"]) == 0
    out = capsys.readouterr().out
    lines = {line.split()[0]: line.split() for line in out.splitlines() if line.strip().startswith("C")}
    assert lines["C1"][1] == "table_wise" and lines["C1"][2] in ("2", "3") and lines["C2"][1:3] == ["row_wise", "2-3"]
    assert "embedding ranks (tables only, no dense model): 2-3; dense ranks" in out
    assert main(["plan", "--config", str(path), "--world-size", "2"]) == 2
    assert "fewer than the world size 2" in capsys.readouterr().err


def test_check_distributed_names_what_embedding_ranks_refuse():
    check_distributed(from_dict(CONFIG), 3)  # 30 rows over 2 dense ranks
    with pytest.raises(ConfigError, match="divisible by the 4 dense ranks.*data.batch_size=28"):
        check_distributed(from_dict(CONFIG), 5)
    with pytest.raises(ConfigError, match="fewer than the world size 3"):
        check_distributed(from_dict({**CONFIG, "distributed": {**CONFIG["distributed"], "embedding_ranks": 3}}), 3)
    with pytest.raises(ConfigError, match="set distributed.placement=embedding_ranks"):
        check_distributed(from_dict({**CONFIG, "distributed": {"embedding_ranks": 1}}), 3)


@pytest.fixture(scope="module")
def one(tmp_path_factory) -> tuple[Path, Any]:
    """The one-process reference: both epochs (8 steps), a checkpoint every 2 steps, all kept."""
    root = tmp_path_factory.mktemp("emb")
    return root, train(from_dict(_raw(root, "one")))


def _ckpt(run: Path, step: int) -> Path:
    return run / "checkpoints" / f"step-{step:08d}"


def _same_losses(run: Path, ref: Path) -> None:
    mine = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    want = {r["step"]: r for r in map(json.loads, (ref / "metrics.jsonl").read_text().splitlines()) if r["kind"] == "train"}
    trains = [r for r in mine if r["kind"] == "train"]
    assert trains and [r["loss"] for r in trains] == pytest.approx([want[r["step"]]["loss"] for r in trains], abs=1e-6)


@pytest.fixture(scope="module")
def emb(one) -> list[dict[str, Any]]:
    """1 embedding rank + 2 dense ranks, from scratch, as the reference run (run "emb")."""
    root, _ = one
    return run_ranks(_rank, 3, (_raw(root, "emb"),), timeout=180)


@pytest.mark.dist
@pytest.mark.slow
def test_one_embedding_rank_and_two_dense_ranks_train_as_one_process(one, emb):
    """From scratch: every checkpoint and the end equal one process's (float tolerance: the
    dense ranks sum their slices' gradients); the embedding rank holds every row and runs no
    dense model, the dense ranks hold no row and run DDP."""
    root, ref = one
    ranks = emb
    assert [r["embedding_rank"] for r in ranks] == [False, False, True]
    assert [r["ddp"] for r in ranks] == [True, True, False]
    assert all(r["step"] == ref.step == 8 for r in ranks)
    assert all(sum(r["rows"].values()) == 0 for r in ranks[:2]) and sum(ranks[2]["rows"].values()) > 0
    for r in ranks:
        assert r["metrics"]["auc/label"] == pytest.approx(ref.metrics["auc/label"], abs=1e-6)
        assert r["metrics"]["logloss/label"] == pytest.approx(ref.metrics["logloss/label"], abs=1e-6)
    for step in (2, 4, 6, 8):
        assert_states_close(checkpoint_state(_ckpt(root / "one", step)), checkpoint_state(_ckpt(root / "emb", step)))
    _same_losses(root / "emb", root / "one")
    # the train records' table figures are the embedding rank's (here: every row, as one process's)
    records = [[json.loads(line) for line in (root / run / "metrics.jsonl").read_text().splitlines()] for run in ("one", "emb")]
    rows = [{r["step"]: (r["C1/rows"], r["C3/pending_ids"]) for r in recs if r["kind"] == "train"} for recs in records]
    assert rows[1] == rows[0] and all(n > 0 for n, _ in rows[1].values())


@pytest.mark.dist
@pytest.mark.slow
def test_embedding_ranks_are_bit_identical_to_the_same_slices_on_placement_tables(one, emb):
    """The placement moves the rows, not the numbers: 2 ranks of placement: tables (the same 2
    slices of each batch, the rows on those ranks) end with bit-identical rows and model."""
    root, _ = one
    raw = _raw(root, "tables")
    raw["distributed"] = {k: v for k, v in raw["distributed"].items() if k not in ("placement", "embedding_ranks")}
    run_ranks(_rank, 2, (raw,), timeout=180)
    a, b = checkpoint_state(root / "emb"), checkpoint_state(root / "tables")
    for name, (ids, rec) in a["tables"].items():
        assert np.array_equal(ids, b["tables"][name][0]) and np.array_equal(rec, b["tables"][name][1]), name
    assert all(torch.equal(v, b["model"][k]) for k, v in a["model"].items())


@pytest.mark.dist
@pytest.mark.slow
def test_embedding_ranks_resume_a_one_process_checkpoint_and_one_process_resumes_theirs(one):
    """One process's step-2 checkpoint resumed on 1 embedding + 2 dense ranks to step 5 (with
    the pipeline's threads), then one process resumes that to the end: equal to one process
    throughout."""
    root, ref = one
    raw = _raw(root, "resumed", resume=str(_ckpt(root / "one", 2)), max_steps=5) | {"pipeline": {"enabled": True}}
    run_ranks(_rank, 3, (raw,), timeout=180)
    assert_states_close(checkpoint_state(_ckpt(root / "one", 4)), checkpoint_state(_ckpt(root / "resumed", 4)))
    back = train(from_dict(_raw(root, "back", resume=str(root / "resumed"))))
    assert back.step == ref.step == 8
    assert_states_close(checkpoint_state(_ckpt(root / "one", 8)), checkpoint_state(_ckpt(root / "back", 8)))
    assert back.metrics["auc/label"] == pytest.approx(ref.metrics["auc/label"], abs=1e-6)
    _same_losses(root / "resumed", root / "one")


@pytest.mark.dist
@pytest.mark.slow
def test_embedding_ranks_run_k_batches_ahead_and_lose_no_gradient(tmp_path):
    """``pipeline.embedding_staleness`` 2: the embedding rank answers fetches up to 2 batches ahead
    of the updates (some reads are stale and re-read before the update) and no gradient is
    lost: each row (SGD from zero) is -lr x the sum of every gradient the dense ranks sent."""
    from tests.distributed.test_staleness import LR, _raw as stale_raw, _stale_rank

    raw = stale_raw(tmp_path, "k2", 2)
    raw["data"]["synthetic"] = {**raw["data"]["synthetic"], "rows": 960, "eval_rows": 240}
    raw["train"]["epochs"] = 1
    raw["distributed"] = {**raw["distributed"], "placement": "embedding_ranks", "embedding_ranks": 1}
    ranks = run_ranks(_stale_rank, 3, (raw,), timeout=180)
    assert [r["step"] for r in ranks] == [8] * 3
    assert ranks[0]["metrics"] == ranks[1]["metrics"] == ranks[2]["metrics"]
    assert not ranks[0]["rows"] and not ranks[1]["rows"] and not ranks[2]["sent"]  # the tables live on rank 2 alone
    assert ranks[2]["refreshed"] > 0  # reads were stale: updates landed on re-read rows
    total: dict[tuple[str, int], np.ndarray] = {}
    for r in ranks[:2]:
        for key, g in r["sent"].items():
            total[key] = total.get(key, 0.0) + g
    owned = ranks[2]["rows"]
    assert set(owned) == set(total)
    keys = sorted(total)
    np.testing.assert_allclose(np.stack([owned[k] for k in keys]), -LR * np.stack([total[k] for k in keys]),
                               rtol=1e-4, atol=1e-8)


def _stopped_rank(rank: int, world_size: int, raw: dict) -> tuple[str, int] | None:
    """Train; SIGTERM reaches the embedding rank alone, in its 9th sharded update. Returns the
    checkpoint the stop saved and the exit code (None: the run was not stopped)."""
    import os
    import signal

    from ember.distributed.sharded import ShardedGroupLookup
    from ember.errors import RunInterrupted

    if rank == world_size - 1:
        exchange, calls = ShardedGroupLookup._owner_gradient, [0]

        def signalling_exchange(self):  # type: ignore[no-untyped-def]  # the gradients' exchange of an update
            calls[0] += 1
            if calls[0] == 9:
                os.kill(os.getpid(), signal.SIGTERM)
            return exchange(self)

        ShardedGroupLookup._owner_gradient = signalling_exchange
    try:
        train(from_dict(raw))
    except RunInterrupted as e:
        return e.checkpoint, e.exit_code
    return None


@pytest.mark.dist
@pytest.mark.slow
def test_sigterm_to_an_embedding_rank_stops_every_rank_at_one_step_with_one_checkpoint(one):
    """2 embedding ranks beside 2 dense ranks; the stop agreement takes the last embedding
    rank's signal: every rank stops at one step with one checkpoint (both embedding ranks'
    rows in it, none of the dense ranks'), which equals one process trained to that step."""
    root, _ = one
    raw = _raw(root, "stopped", checkpoint_every=None)
    raw["distributed"] = {**raw["distributed"], "embedding_ranks": 2}
    ranks = run_ranks(_stopped_rank, 4, (raw,), timeout=180)
    assert all(r is not None and r == ranks[0] for r in ranks), ranks
    ckpt, code = ranks[0]
    assert code == 143
    manifest = json.loads((Path(ckpt) / "manifest.json").read_text())
    parts = {m["name"]: m["part_rows"] for m in manifest["tables"]}  # rows each rank saved
    assert all(p[0] == p[1] == 0 and len(p) == 4 for p in parts.values()), parts
    assert sorted(n > 0 for n in parts["C1"][2:]) == [False, True]  # table-wise: one embedding rank
    assert all(p[2] > 0 and p[3] > 0 for name, p in parts.items() if name in ("C2", "C4")), parts  # row-wise: both
    state = checkpoint_state(Path(ckpt))
    assert 2 <= state["step"] < 8
    train(from_dict(_raw(root, "one_stop", checkpoint_every=None, max_steps=state["step"])))
    assert_states_close(checkpoint_state(root / "one_stop"), state)


def _fp16_rank(rank: int, world_size: int, raw: dict, spy: str) -> dict[str, Any]:
    """``test_one_system``'s training with an overflow at the 3rd unscale of the last dense rank
    (one process: its own 3rd), plus whether this rank ran the dense model."""
    from tests.distributed import test_one_system as one_system

    dense = world_size - raw["distributed"].get("embedding_ranks", 0)
    for obj, name, value in one_system._patches(rank == dense - 1, raw, spy):  # compile spy, overflow at the 3rd
        setattr(obj, name, value)
    return one_system._run(raw)


@pytest.mark.dist
@pytest.mark.slow
def test_fp16_distill_and_compile_on_embedding_ranks_train_as_one_process(tmp_path):
    """fp16 (an overflow on a dense rank skips the step on every rank, the embedding rank
    included), model.distill and a compiled DDP module on the dense ranks (none on the
    embedding rank, which runs no dense model): the dense ranks end with one process's model
    and eval figures, the embedding rank with its rows."""
    from tests.distributed.test_one_system import _raw as one_raw, _with_teacher

    _with_teacher(tmp_path, "train", 800)
    _with_teacher(tmp_path, "eval", 300)
    kw = {"precision": "fp16", "max_steps": 6, "compile": True}
    model = {**one_raw(tmp_path, "x")["model"], "distill": {}}
    raw_one = one_raw(tmp_path, "one", **kw) | {"model": model}
    raw_emb = one_raw(tmp_path, "emb", **kw) | {"model": model, "distributed": {
        "sharding": "row_wise", "placement": "embedding_ranks", "embedding_ranks": 1}}
    one = run_ranks(_fp16_rank, 1, (raw_one, "working"))[0]
    ranks = run_ranks(_fp16_rank, 3, (raw_emb, "working"), timeout=180)
    assert one["scaler"] == {"scale": 2.0**15, "clean_steps": 3, "skipped": 1}
    assert [[c[0] for c in r["compiled"]] for r in ranks] == [["DistributedDataParallel"]] * 2 + [[]]
    assert all(r["compiled"][0][1] == one["compiled"][0][1] for r in ranks[:2])
    for r in ranks:
        assert r["step"] == one["step"] and r["scaler"] == one["scaler"]
        assert r["metrics"] == pytest.approx(one["metrics"], abs=1e-3)
    for r in ranks[:2]:
        for k, v in one["model"].items():
            torch.testing.assert_close(r["model"][k], v, rtol=1e-4, atol=1e-3, msg=lambda m: f"model {k}: {m}")
    for name, (ids, rec) in one["tables"].items():
        assert ranks[0]["tables"][name][0].size == ranks[1]["tables"][name][0].size == 0
        got_ids, got_rec = ranks[2]["tables"][name]
        order, want = np.argsort(got_ids), np.argsort(ids)
        np.testing.assert_array_equal(got_ids[order], ids[want], err_msg=f"table {name}: IDs differ")
        np.testing.assert_allclose(got_rec[order], rec[want], rtol=1e-4, atol=1e-3, err_msg=f"table {name}")


def _file_shards_raw(root: Path, name: str, placement: dict) -> dict:
    """Five CSV files of uneven sizes under data.shard: files (the dense ranks share them)."""
    data = root / "files"
    if not data.exists():
        data.mkdir()
        rng = np.random.default_rng(5)
        for f, rows in enumerate([90, 50, 70, 30, 40]):
            lines = ["label,I1,C1,C2"] + [f"{int(rng.random() < 0.4)},{rng.normal():.3f},a{rng.integers(0, 30)},"
                                          f"b{rng.integers(0, 20)}" for _ in range(rows)]
            (data / f"part-{f}.csv").write_text("\n".join(lines) + "\n")
    return {
        "data": {"format": "csv", "train": str(data / "part-*.csv"), "eval": str(data / "part-0.csv"), "batch_size": 20,
                 "shuffle_buffer": 0, "shard": "files"},
        "schema": {"labels": ["label"], "dense": [{"name": "I1"}], "sparse": [{"name": "C1"}, {"name": "C2"}]},
        "embedding": {"dim": 4, "optimizer": {"type": "adagrad", "lr": 0.05}},
        "model": {"type": "dlrm", "bottom_mlp": [8, 4], "top_mlp": [8]},
        "train": {"epochs": 2, "log_every": 2, "progress": False, "precision": "fp32", "threads": 1,
                  "deterministic": True,
                  "out_dir": str(root), "run_name": name, "dense_optimizer": {"type": "adam", "lr": 0.01}},
        "checkpoint": {"every": 4, "keep": 20},
        "distributed": {"sharding": "row_wise", **placement},
    }


def test_file_shards_with_an_embedding_rank_equal_the_dense_ranks_alone(tmp_path):
    """data.shard: files with 1 embedding rank + 2 dense ranks: the dense ranks share the files
    (the embedding rank reads none and answers their lookups), bit-identical to the same 2 ranks
    sharding the files with placement tables; and it resumes from a mid-run checkpoint."""
    emb = run_ranks(_rank, 3, (_file_shards_raw(tmp_path, "emb", {"placement": "embedding_ranks",
                                                                    "embedding_ranks": 1}),), timeout=180)
    ref = run_ranks(_rank, 2, (_file_shards_raw(tmp_path, "ref", {}),), timeout=180)
    assert [r["embedding_rank"] for r in emb] == [False, False, True]
    assert emb[0]["step"] == ref[0]["step"] > 4 and emb[0]["metrics"] == ref[0]["metrics"]
    a, b = checkpoint_state(tmp_path / "emb"), checkpoint_state(tmp_path / "ref")
    assert a["tables"].keys() == b["tables"].keys()
    for name, (ids, rec) in a["tables"].items():
        np.testing.assert_array_equal(ids, b["tables"][name][0])
        np.testing.assert_array_equal(rec, b["tables"][name][1])
    for key, value in a["model"].items():
        assert torch.equal(value, b["model"][key]), key
    resumed = _file_shards_raw(tmp_path, "again", {"placement": "embedding_ranks", "embedding_ranks": 1})
    resumed["train"]["resume"] = str(_ckpt(tmp_path / "emb", 4))
    again = run_ranks(_rank, 3, (resumed,), timeout=180)
    assert again[0]["step"] == emb[0]["step"] and again[0]["metrics"] == emb[0]["metrics"]
