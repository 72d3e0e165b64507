"""The sharding planner, the ``distributed:`` section, torchrun's environment, batch slices."""

from __future__ import annotations

import pytest
import torch
import yaml

from ember.batch import Batch, SparseFeatures
from ember.config import apply_overrides, from_dict
from ember.distributed.config import DistributedConfig
from ember.distributed.planner import plan_sharding
from ember.distributed.process_group import Topology, pick_backend
from ember.embedding.config import TableConfig
from ember.errors import ConfigError
from ember.train.distributed import check_distributed, start_run, table_rows
from tests.conftest import REPO


def _tables(*names: str) -> list[TableConfig]:
    return [TableConfig(name=n, dim=8) for n in names]


def test_auto_splits_by_size_and_balances_table_wise_tables():
    rows = {"huge": 10_000_000, "a": 90_000, "b": 60_000, "c": 50_000, "unknown": None}
    plan = plan_sharding(_tables(*rows), 2, DistributedConfig(table_wise_max_rows=100_000), rows)
    kinds = {n: plan.spec(n).kind for n in rows}
    assert kinds == {"huge": "row_wise", "a": "table_wise", "b": "table_wise", "c": "table_wise", "unknown": "row_wise"}
    # largest first onto the least-loaded rank: a -> 0, b -> 1, c -> 1 (b + c = 110k vs 90k)
    assert [plan.spec(n).rank for n in "abc"] == [0, 1, 1]
    per_rank = plan.bytes_per_rank()
    record = 8 + 4 * (8 + 1)  # key + weights + row-wise Adagrad state
    assert per_rank[0] == pytest.approx((5_000_000 + 90_000) * record)
    assert per_rank[1] == pytest.approx((5_000_000 + 110_000) * record)
    text = plan.describe()
    assert "huge" in text and "table_wise" in text and "unknown" in text and "?" in text


def test_forced_kinds_and_per_table_overrides():
    rows = {"a": 10, "b": 10**9}
    assert plan_sharding(_tables("a", "b"), 3, DistributedConfig(sharding="row_wise"), rows).spec("a").kind == "row_wise"
    cfg = DistributedConfig(sharding="table_wise", tables={"a": "row_wise"})
    plan = plan_sharding(_tables("a", "b"), 3, cfg, rows)
    assert plan.spec("a").kind == "row_wise" and plan.spec("b").kind == "table_wise"
    with pytest.raises(ConfigError, match=r"distributed.tables names \['nope'\]"):
        plan_sharding(_tables("a"), 2, DistributedConfig(tables={"nope": "row_wise"}), rows)


def _demo(*overrides: str):
    raw = yaml.safe_load((REPO / "configs" / "demo.yaml").read_text())
    return from_dict(apply_overrides(raw, list(overrides)))


def test_distributed_section_validates():
    cfg = _demo("distributed.backend=gloo", "distributed.tables={C1: table_wise}")
    assert cfg.distributed.backend == "gloo" and cfg.distributed.tables == {"C1": "table_wise"}
    with pytest.raises(ConfigError, match="did you mean 'backend'"):
        _demo("distributed.backed=gloo")
    with pytest.raises(ConfigError, match="distributed.sharding"):
        _demo("distributed.sharding=column_wise")


def test_unsupported_settings_are_errors_saying_what_to_do():
    """check_distributed is the one place a distributed run refuses settings."""
    with pytest.raises(ConfigError, match="divisible by the world size 3.*data.batch_size=2046"):
        check_distributed(_demo("data.batch_size=2048"), 3)
    # what distributed training now takes as one process does
    check_distributed(_demo("data.batch_size=2048", "pipeline.embedding_staleness=2", "train.precision=fp16",
                            "train.compile=true", "train.early_stopping={metric: auc, restore_best: true}"), 2)
    check_distributed(_demo("eval.window_rows=100", "eval.window_every_s=5", "export.every_steps=5", "export.every_s=9"), 2)
    check_distributed(_demo("distributed.placement=towers", "model={type: dmt, num_towers: 2}"), 2)  # with the pipeline
    # staleness with what the ranks agree on ahead (k + 2 steps: ember.train.shards.ahead_of)
    check_distributed(_demo("pipeline.embedding_staleness=1", "export.every_s=30", "eval.window_rows=100",
                            "eval.window_every_s=5", "checkpoint.every_s=60"), 2)


def test_topology_from_env():
    assert Topology.from_env({}) is None  # no torchrun: one process, nothing initialised
    assert Topology.from_env({"WORLD_SIZE": "1", "RANK": "0"}) is None
    env = {"WORLD_SIZE": "4", "RANK": "3", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "1"}
    assert Topology.from_env(env) == Topology(3, 4, 1, 2)
    with pytest.raises(ConfigError, match=r"\['MASTER_ADDR', 'MASTER_PORT'\] are not set; launch with torchrun"):
        Topology.from_env({"WORLD_SIZE": "2", "RANK": "0"})
    with pytest.raises(ConfigError, match="outside 0..1"):
        Topology.from_env({**env, "WORLD_SIZE": "2", "RANK": "2"})


def test_start_run_checks_the_config_before_any_process_group():
    topo = Topology(0, 3, 0, 3)
    with pytest.raises(ConfigError, match="divisible"):
        start_run(_demo("pipeline.enabled=false"), topo)  # demo: batch 2048, not divisible by 3
    assert start_run(_demo()) is None  # this test process has no torchrun environment


def test_backend_choice():
    assert pick_backend(DistributedConfig(), torch.device("cpu")) == "gloo"
    with pytest.raises(ConfigError, match="needs the model on CUDA|has no NCCL"):
        pick_backend(DistributedConfig(backend="nccl"), torch.device("cpu"))


def test_row_estimates_for_the_planner():
    cfg = _demo("data.synthetic.vocab_size=1000", "schema.sparse=[{name: C1}, {name: C2, table: C1}, {name: C3}]",
                "data.synthetic.num_sparse=3", "data.synthetic.signal_features=1", "schema.dense=[]",
                "schema.labels=[label]", "data.synthetic.num_dense=0")
    assert table_rows(cfg) == {"C1": 2000, "C3": 1000}


def test_batch_slices_cover_the_batch_in_order():
    sf = SparseFeatures(["a", "b"], torch.tensor([1, 2, 3, 7, 8, 9]), torch.tensor([2, 1, 0, 1, 0, 2]),
                        torch.tensor([0.5, 1.0, 1.5, 2.0, 2.5, 3.0]))
    batch = Batch(torch.arange(6.0).view(3, 2), sf, torch.tensor([[0.0], [1.0], [0.0]]))
    parts = [batch.slice_rows(a, b) for a, b in [(0, 1), (1, 1), (1, 3)]]
    assert [p.size for p in parts] == [1, 0, 2]
    assert parts[2].sparse["a"].values.tolist() == [3] and parts[2].sparse["b"].values.tolist() == [8, 9]
    assert parts[2].sparse.weights.tolist() == [1.5, 2.5, 3.0] and parts[0].sparse["a"].values.tolist() == [1, 2]
    assert torch.equal(torch.cat([p.dense for p in parts]), batch.dense)
    with pytest.raises(ValueError, match="not within the batch of 3"):
        sf.slice_rows(2, 4)


def test_plan_command_prints_the_plan(capsys):
    from ember.cli import main

    assert main(["plan", "--config", str(REPO / "configs" / "demo.yaml"), "--world-size", "2",
                 "distributed.tables={C1: table_wise}", "distributed.sharding=row_wise"]) == 0
    out = capsys.readouterr().out
    lines = {line.split()[0]: line.split() for line in out.splitlines()[2:] if line.strip().startswith("C")}
    assert lines["C1"][1:3] == ["table_wise", "0"] and lines["C2"][1:3] == ["row_wise", "all"]
    assert "sharding plan over 2 ranks" in out and len(lines) == 26
    assert main(["plan", "--config", str(REPO / "configs" / "demo.yaml"), "--world-size", "0"]) == 2
