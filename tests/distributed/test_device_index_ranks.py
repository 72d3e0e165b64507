"""storage.index: device across ranks (gloo, CPU: the same code a GPU runs): 2 ranks, row- and
table-wise tables, end with the rows, optimizer state and dense weights of one process, and one
process with the device index ends with the host index's, bit for bit."""

from __future__ import annotations

import pytest
import yaml

from ember.checkpoint.load import resolve_checkpoint
from ember.config import load
from ember.testing.distributed import assert_states_close, checkpoint_state
from ember.train.loop import train
from tests.distributed.ranks import run_ranks, train_config

pytestmark = [pytest.mark.dist, pytest.mark.slow]

INDEX = {"index": "device", "device": "cpu"}
CONFIG = {
    "data": {"preset": "synthetic", "batch_size": 24,
             "synthetic": {"num_dense": 3, "num_sparse": 4, "rows": 194, "eval_rows": 90, "vocab_size": 40,
                           "signal_features": 3, "multi_hot": {"C2": 3}}},
    "embedding": {"dim": 4, "storage": INDEX},
    "tables": [
        {"name": "C1", "optimizer": {"type": "sgd", "lr": 0.1}},
        {"name": "C2", "optimizer": {"type": "adagrad", "lr": 0.1}},
        {"name": "C3", "optimizer": {"type": "rowwise_adagrad", "lr": 0.1}},
        {"name": "C4", "optimizer": {"type": "ftrl", "alpha": 0.1, "l1": 0.01, "l2": 0.01}},
    ],
    "model": {"type": "dlrm", "bottom_mlp": [8, 4], "top_mlp": [8]},
    "train": {"epochs": 1, "progress": False, "threads": 1, "precision": "fp32", "deterministic": True,
              "dense_optimizer": {"type": "adam", "lr": 0.01}},
    "pipeline": {"enabled": False},
    "distributed": {"sharding": "row_wise", "tables": {"C1": "table_wise"}},
}


@pytest.mark.parametrize("storage", [INDEX, {**INDEX, "device_rows": 8}], ids=["rows", "hot-rows"])
def test_two_ranks_train_as_one_process_and_as_the_host_index(tmp_path, storage):
    """(hot-rows: each rank's shard keeps 8 rows a table of its group read most in device memory)"""
    cfg = {**CONFIG, "embedding": {"dim": 4, "storage": storage}, "train": {**CONFIG["train"], "out_dir": str(tmp_path / "runs")}}
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg))
    one = train(load(path, ["train.run_name=one"]))
    host = {**cfg, "embedding": {"dim": 4}}
    host_path = tmp_path / "host.yaml"
    host_path.write_text(yaml.safe_dump(host))
    train(load(host_path, ["train.run_name=host"]))
    assert type(next(iter(one.parts.embeddings.tables.values())).tier).__name__ == "MappedTier"
    if "device_rows" in storage:
        assert all(g.mapped.hot is not None and g.mapped.hot.rebalances > 0 for g in one.parts.embeddings.groups)
    ckpt = lambda name: resolve_checkpoint(tmp_path / "runs" / name)  # noqa: E731
    assert_states_close(checkpoint_state(ckpt("one")), checkpoint_state(ckpt("host")), rtol=0, atol=0)
    run_ranks(train_config, 2, (path, ("train.run_name=two",)), timeout=240)
    assert_states_close(checkpoint_state(ckpt("one")), checkpoint_state(ckpt("two")))
