"""Data workers (``pipeline.data_workers: 1``) inside distributed ranks: each rank, a real
process as torchrun starts it, forks its epoch's worker from a forkserver of its own
(``ember.pipeline.worker_process``): two epochs (a worker per epoch) on 2 ranks end where one
process without a worker does (within float tolerance: the ranks sum in another order)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from ember.config import from_dict
from ember.testing.distributed import assert_states_close, checkpoint_state, ember_start, finish, free_port
from ember.train.loop import train

CONFIG = {
    "data": {"preset": "synthetic", "batch_size": 64, "shuffle_buffer": 0,
             "synthetic": {"rows": 1_024, "eval_rows": 128, "vocab_size": 300, "num_sparse": 3, "num_dense": 2}},
    "embedding": {"dim": 4},
    "model": {"type": "dlrm", "bottom_mlp": [8, 4], "top_mlp": [8]},
    "train": {"epochs": 2, "progress": False, "precision": "fp32", "threads": 1, "deterministic": True},
}


@pytest.mark.dist
@pytest.mark.slow
def test_ranks_with_a_data_worker_train_as_one_process_without_one(tmp_path: Path) -> None:
    raw = {**CONFIG, "train": {**CONFIG["train"], "out_dir": str(tmp_path / "runs")}}
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(raw))
    port = free_port()
    ranks = [ember_start(path, r, 2, port, ["train.run_name=ranks", "pipeline.data_workers=1"]) for r in (0, 1)]
    train(from_dict({**raw, "train": {**raw["train"], "run_name": "one"}}))  # meanwhile, here: no worker
    for done in [finish(p, 180) for p in ranks]:
        assert done.returncode == 0, done.stderr[-3000:]
    assert_states_close(checkpoint_state(tmp_path / "runs" / "one"), checkpoint_state(tmp_path / "runs" / "ranks"))
