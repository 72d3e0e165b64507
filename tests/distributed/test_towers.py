"""Tower placement (``distributed.placement: towers``, issue 15 item 4): the placement rules,
and a DMT trained on two "nodes" on 127.0.0.1 (one rank each, spawned from this process with
torchrun's per-node environment) ends with the same
rows and dense weights, losses and eval figures as one process, with no ID, row or embedding
gradient crossing nodes: only the routed IDs and the tower outputs and their gradients."""

from __future__ import annotations

import json

import numpy as np
import pytest
import yaml

from ember.config import from_dict, load
from ember.distributed.towers import place_towers, plan_towers
from ember.embedding.config import FeatureConfig, TableConfig
from ember.errors import ConfigError
from ember.testing.distributed import assert_states_close, checkpoint_state
from ember.train.builder import tower_plan
from ember.train.loop import train

CONFIG = {
    "data": {"preset": "synthetic", "batch_size": 64,
             "synthetic": {"num_dense": 3, "num_sparse": 6, "rows": 256, "eval_rows": 128, "vocab_size": 300}},
    "embedding": {"dim": 4, "optimizer": {"type": "adagrad", "lr": 0.05}},
    "model": {"type": "dmt", "towers": [["C1", "C2", "C3"], ["C4", "C5", "C6"]], "tower_mlp": [16], "tower_vectors": 2,
              "bottom_mlp": [8, 4], "top_mlp": [16]},
    "train": {"max_steps": 4, "log_every": 2, "progress": False, "threads": 1, "eval_max_batches": 1,
              "precision": "fp32", "dense_optimizer": {"type": "adam", "lr": 0.01}},
    "pipeline": {"enabled": False},
    "distributed": {"placement": "towers"},
}


def test_towers_spread_over_nodes_largest_first():
    assert place_towers([[0], [1, 2, 3], [4, 5], [6]], 2) == [1, 0, 1, 0]  # loads 3+1, 2+1
    assert place_towers([[0], [1]], 3) == [0, 1]  # a node may host no tower


def test_plan_puts_a_towers_tables_on_its_nodes_ranks():
    tables = [TableConfig(name=n, dim=4) for n in ("a", "b", "c")]
    feats = [FeatureConfig(name=f"f{i}", table=t) for i, t in enumerate(["a", "b", "b", "c"])]
    plan = plan_towers(tables, feats, [[0, 3], [1, 2]], [1, 0], world_size=4, local_world_size=2)
    ids = np.arange(2000)
    assert set(plan.owners("a", ids)) == set(plan.owners("c", ids)) == {2, 3}  # node 1
    assert set(plan.owners("b", ids)) == {0, 1}
    assert "0-1" in plan.describe()
    with pytest.raises(ConfigError, match="table 'b' is read by features of towers on different nodes"):
        plan_towers(tables, feats, [[0, 1], [2, 3]], [0, 1], world_size=2, local_world_size=1)


def test_tower_placement_needs_a_dmt_and_even_nodes():
    dlrm = {**CONFIG, "model": {"type": "dlrm", "bottom_mlp": [8, 4], "top_mlp": [16]}}
    with pytest.raises(ConfigError, match="distributed.placement towers needs a model of type dmt"):
        from_dict(dlrm)
    cfg = from_dict({**dlrm, "distributed": {**CONFIG["distributed"], "placement": "tables"}})
    with pytest.raises(ConfigError, match="tower placement needs a model of type dmt"):
        tower_plan(cfg, cfg.table_configs(), 2, 1)
    with pytest.raises(ConfigError, match="world size 3 is not a multiple of 2 ranks per node"):
        tower_plan(from_dict(CONFIG), from_dict(CONFIG).table_configs(), 3, 2)


def test_ember_plan_prints_the_tower_placement(tmp_path, capsys):
    from ember.cli import main

    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(CONFIG))
    assert main(["plan", "--config", str(path), "--world-size", "4", "--nodes", "2"]) == 0
    out = capsys.readouterr().out
    assert "tower k on node [0, 1]" in out
    lines = {line.split()[0]: line.split()[2] for line in out.splitlines() if line.strip().startswith("C")}
    assert lines == {"C1": "0-1", "C2": "0-1", "C3": "0-1", "C4": "2-3", "C5": "2-3", "C6": "2-3"}


@pytest.mark.dist
@pytest.mark.slow
def test_two_nodes_with_tower_placement_match_one_process(tmp_path):
    """One process trains 2 steps; two nodes with tower placement resume its checkpoint to step
    4 and end where one process does after 4 steps (their checkpoint holds every tower's
    weights and dense optimizer state, copied from the towers' nodes). The nodes are ranks of
    the in-process harness (LOCAL_WORLD_SIZE 1, as torchrun sets it for one rank per node);
    the launch of two torchrun nodes is tested in test_faults.py."""
    from tests.distributed.ranks import run_ranks, train_config

    cfg = {**CONFIG, "train": {**CONFIG["train"], "out_dir": str(tmp_path / "runs")}}
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg))
    runs = tmp_path / "runs"
    one = train(load(path, ["train.run_name=one"]))
    train(load(path, ["train.run_name=towers", "train.max_steps=2"]))
    run_ranks(train_config, 2, (path, ["train.run_name=towers", f"train.resume={runs / 'towers'}"]), timeout=300,
              local_world_size=1)
    assert_states_close(checkpoint_state(runs / "one"), checkpoint_state(runs / "towers"))
    summary = json.loads((runs / "towers" / "summary.json").read_text())
    assert summary["auc/label"] == pytest.approx(one.metrics["auc/label"], abs=1e-6)
    mine = [json.loads(line) for line in (runs / "towers" / "metrics.jsonl").read_text().splitlines()]
    ref = [json.loads(line) for line in (runs / "one" / "metrics.jsonl").read_text().splitlines()]
    trains = [r for r in mine if r["kind"] == "train"]
    assert [r["step"] for r in trains] == [2, 4]  # the resumed run's history continues the first's
    assert [r["loss"] for r in trains] == pytest.approx([r["loss"] for r in ref if r["kind"] == "train"], abs=1e-6)
    last = trains[-1]
    # one rank per node: every table lives on its tower's node's only rank, so no ID, row or
    # embedding gradient goes to another rank; each rank gets its 32 rows' outputs of the other
    # node's tower (2 vectors x dim 4, float32) and sends their gradients back
    assert last["dist.ids.sent_per_step"] == last["dist.rows.sent_per_step"] == last["dist.grads.sent_per_step"] == 0
    assert last["dist.tower_out.received_per_step"] == last["dist.tower_grads.sent_per_step"] == 32 * 2 * 4 * 4
    assert last["dist.cross_node.sent_per_step"] == last["dist.sent_per_step"] - last["dist.dense.sent_per_step"]


def _weighted_data(root) -> dict:
    """CSV train/eval files with a weighted multi-hot feature (``c1``, weights in ``w1``) beside
    single-hot ones, and the config of a two-tower DMT over them."""
    rng = np.random.default_rng(7)

    def rows(n: int) -> str:
        out = ["y,d1,d2,c1,w1,c2,c3,c4"]
        for _ in range(n):
            k = int(rng.integers(0, 4))  # 0-3 values in the bag (an empty bag too)
            bag = rng.integers(0, 40, k)
            w = rng.uniform(0.1, 2.0, k).round(3)
            c2, c3, c4 = rng.integers(0, 30, 3)
            y = int(rng.random() < 0.3 + 0.4 * (c2 % 2))
            out.append(f"{y},{rng.normal():.4f},{rng.random():.4f},{'|'.join(map(str, bag))},"
                       f"{'|'.join(map(str, w))},b{c2},c{c3},d{c4}")
        return "\n".join(out) + "\n"

    (root / "train.csv").write_text(rows(256))
    (root / "eval.csv").write_text(rows(64))
    return {
        "data": {"format": "csv", "train": str(root / "train.csv"), "eval": str(root / "eval.csv"), "batch_size": 32,
                 "shuffle_buffer": 0},
        "schema": {"labels": ["y"], "dense": [{"name": "d1"}, {"name": "d2"}],
                   "sparse": [{"name": "c1", "separator": "|", "weight_column": "w1", "pooling": "mean"},
                              {"name": "c2"}, {"name": "c3"}, {"name": "c4"}]},
        "embedding": {"dim": 4, "optimizer": {"type": "adagrad", "lr": 0.05}},
        "model": {"type": "dmt", "towers": [["c1", "c2"], ["c3", "c4"]], "tower_mlp": [8], "tower_vectors": 2,
                  "bottom_mlp": [8, 4], "top_mlp": [8]},
        "train": {"epochs": 2, "log_every": 4, "progress": False, "threads": 1, "deterministic": True,
                  "precision": "fp32", "out_dir": str(root / "runs"), "dense_optimizer": {"type": "adam", "lr": 0.01}},
        "eval": {"every": 4},
        "checkpoint": {"every": 4, "keep": 10},
    }


def _train_ranked(rank: int, world_size: int, raw: dict) -> dict:
    from ember.train.loop import train as train_run

    result = train_run(from_dict(raw))
    return {"metrics": result.metrics, "step": result.step}


def test_towers_with_the_pipeline_and_weighted_features_match_one_process(tmp_path):
    """Two "nodes" of one rank each (the in-process harness, LOCAL_WORLD_SIZE 1) with tower
    placement, the pipeline's stages on threads (the routing in the fetch stage, gated like every
    fetch), a weighted multi-hot feature routed with its weights, and evaluations during the run:
    the same checkpoints and eval figures as one process without the pipeline."""
    from tests.distributed.ranks import run_ranks

    raw = _weighted_data(tmp_path)
    one = train(from_dict({**raw, "train": {**raw["train"], "run_name": "one"}, "pipeline": {"enabled": False}}))
    placed = {**raw, "train": {**raw["train"], "run_name": "placed"}, "pipeline": {"enabled": True, "engine": "threads"},
              "distributed": {"placement": "towers"}}
    ranks = run_ranks(_train_ranked, 2, (placed,), timeout=240, local_world_size=1)
    runs = tmp_path / "runs"
    for step in (4, 8, 12, 16):
        assert_states_close(checkpoint_state(runs / "one" / "checkpoints" / f"step-{step:08d}"),
                            checkpoint_state(runs / "placed" / "checkpoints" / f"step-{step:08d}"))
    assert ranks[0]["step"] == one.step == 16
    for r in ranks:
        assert r["metrics"]["auc/y"] == pytest.approx(one.metrics["auc/y"], abs=1e-6)
    evals = [json.loads(line) for line in (runs / "placed" / "metrics.jsonl").read_text().splitlines()]
    ref = [json.loads(line) for line in (runs / "one" / "metrics.jsonl").read_text().splitlines()]
    got = [(r["step"], r["auc/y"]) for r in evals if r["kind"] == "eval"]
    want = [(r["step"], r["auc/y"]) for r in ref if r["kind"] == "eval"]
    assert [s for s, _ in got] == [s for s, _ in want] == [4, 8, 12, 16]
    assert [a for _, a in got] == pytest.approx([a for _, a in want], abs=1e-6)


def test_towers_with_a_distillation_adapter_match_one_process(tmp_path):
    """model.distill with its adapter (beside both the towers and the DDP head: its gradients
    are summed over every rank after backward) on two "nodes" equals one process."""
    from tests.distributed.ranks import run_ranks

    raw = _weighted_data(tmp_path)
    rng = np.random.default_rng(3)
    for name in ("train.csv", "eval.csv"):  # a teacher column: a noisy, biased score
        lines = (tmp_path / name).read_text().splitlines()
        out = [lines[0] + ",teacher"] + [f"{line},{min(max(0.2 + 0.5 * rng.random(), 0.01), 0.99):.3f}"
                                         for line in lines[1:]]
        (tmp_path / name).write_text("\n".join(out) + "\n")
    raw["schema"] = {**raw["schema"], "teacher": ["teacher"]}
    raw["model"] = {**raw["model"], "distill": {"adapter": True}}
    raw["train"] = {**raw["train"], "epochs": 1}
    one = train(from_dict({**raw, "train": {**raw["train"], "run_name": "one"}, "pipeline": {"enabled": False}}))
    placed = {**raw, "train": {**raw["train"], "run_name": "placed"}, "distributed": {"placement": "towers"}}
    run_ranks(_train_ranked, 2, (placed,), timeout=240, local_world_size=1)
    runs = tmp_path / "runs"
    a, b = checkpoint_state(runs / "one"), checkpoint_state(runs / "placed")
    assert any("adapter" in key for key in a["model"])
    assert_states_close(a, b)
