"""Data workers (``pipeline.data_workers: 1``) inside distributed ranks: each rank, a real
process as torchrun starts it, forks its epoch's worker from a forkserver of its own
(``ember.pipeline.worker_process``) and trains the bits it trains without one, two epochs (a
worker per epoch) on 2 ranks."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from ember.testing.distributed import assert_states_close, checkpoint_state, ember_start, finish, free_port

CONFIG = {
    "data": {"preset": "synthetic", "batch_size": 64, "shuffle_buffer": 0,
             "synthetic": {"rows": 1_024, "eval_rows": 128, "vocab_size": 300, "num_sparse": 3, "num_dense": 2}},
    "embedding": {"dim": 4},
    "model": {"type": "dlrm", "bottom_mlp": [8, 4], "top_mlp": [8]},
    "train": {"epochs": 2, "progress": False, "threads": 1, "deterministic": True},
}


@pytest.mark.dist
@pytest.mark.slow
def test_ranks_with_a_data_worker_train_as_without_one(tmp_path: Path) -> None:
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump({**CONFIG, "train": {**CONFIG["train"], "out_dir": str(tmp_path / "runs")}}))
    for workers in (0, 1):
        port = free_port()
        ranks = [ember_start(path, r, 2, port, [f"train.run_name=w{workers}", f"pipeline.data_workers={workers}"])
                 for r in (0, 1)]
        for done in [finish(p, 180) for p in ranks]:
            assert done.returncode == 0, done.stderr[-3000:]
    assert_states_close(checkpoint_state(tmp_path / "runs" / "w0"), checkpoint_state(tmp_path / "runs" / "w1"))
