"""Distributed training equals one process: 2 and 3 ranks (gloo, CPU, launched by torchrun)
end with the same rows, optimizer state, dense weights and eval figures as one process on the
same global batches, for every sparse optimizer (one table each), with table- and row-wise
tables, ``min_count`` and a TTL; a checkpoint of 2 ranks resumes on 3."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from ember.config import load
from ember.testing.distributed import assert_states_close, checkpoint_state, torchrun_train
from ember.train.loop import train

pytestmark = [pytest.mark.dist, pytest.mark.slow]

CONFIG = {
    # 194 rows: 8 batches of 24, then 2 rows, which leave one of 3 ranks a slice of no rows
    "data": {"preset": "synthetic", "batch_size": 24,
             "synthetic": {"num_dense": 3, "num_sparse": 5, "rows": 194, "eval_rows": 90, "vocab_size": 40,
                           "signal_features": 3, "multi_hot": {"C2": 3}}},
    "embedding": {"dim": 4},
    "tables": [
        {"name": "C1", "optimizer": {"type": "sgd", "lr": 0.1}},
        {"name": "C2", "optimizer": {"type": "adagrad", "lr": 0.1}},
        {"name": "C3", "optimizer": {"type": "rowwise_adagrad", "lr": 0.1}, "min_count": 2},
        {"name": "C4", "optimizer": {"type": "adam", "lr": 0.01}, "ttl_steps": 3},
        {"name": "C5", "optimizer": {"type": "ftrl", "alpha": 0.1, "l1": 0.01, "l2": 0.01}},
    ],
    "model": {"type": "deepfm", "deep_mlp": [8]},  # deepfm: a second, dim-1 collection too
    "train": {"epochs": 1, "log_every": 4, "progress": False, "threads": 1, "dense_optimizer": {"type": "adam", "lr": 0.01}},
    "pipeline": {"enabled": False},
    "distributed": {"sharding": "row_wise", "tables": {"C1": "table_wise", "C3": "table_wise"}},
}


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """The config, and its one-process reference runs: 4 steps, and the whole epoch (9 steps)."""
    root = tmp_path_factory.mktemp("dist")
    cfg = {**CONFIG, "train": {**CONFIG["train"], "out_dir": str(root / "runs")}}
    path = root / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg))
    short = train(load(path, ["train.run_name=one4", "train.max_steps=4"]))
    full = train(load(path, ["train.run_name=one"]))
    return path, root / "runs", short, full


def _launch(path: Path, nproc: int, *overrides: str) -> None:
    done = torchrun_train(path, nproc, overrides, timeout=300)
    assert done.returncode == 0, f"torchrun exited {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-6000:]}"


def _check_run(runs: Path, name: str, reference: str, ref_metrics: dict[str, float]) -> None:
    """The run's checkpoint, eval figures and logged losses equal the one-process run's."""
    assert_states_close(checkpoint_state(runs / reference), checkpoint_state(runs / name))
    summary = json.loads((runs / name / "summary.json").read_text())
    assert summary["auc/label"] == pytest.approx(ref_metrics["auc/label"], abs=1e-6)
    assert summary["logloss/label"] == pytest.approx(ref_metrics["logloss/label"], abs=1e-6)
    mine = [json.loads(line) for line in (runs / name / "metrics.jsonl").read_text().splitlines()]
    ref = [json.loads(line) for line in (runs / reference / "metrics.jsonl").read_text().splitlines()]
    trains, ref_trains = [r for r in mine if r["kind"] == "train"], [r for r in ref if r["kind"] == "train"]
    assert [r["step"] for r in trains] == [r["step"] for r in ref_trains][-len(trains):]
    assert [r["loss"] for r in trains] == pytest.approx([r["loss"] for r in ref_trains][-len(trains):], abs=1e-6)
    assert all(r["dist.bytes_sent"] > 0 and r["dist.bytes_received"] > 0 for r in trains)


def test_two_ranks_then_three_match_one_process(setup):
    """4 steps on 2 ranks equal 4 steps of one process; that checkpoint resumed on 3 ranks to
    the end of the epoch (whose last batch leaves rank 0 no row) equals the whole epoch in one
    process."""
    path, runs, short, full = setup
    _launch(path, 2, "train.run_name=resumed", "train.max_steps=4")
    _check_run(runs, "resumed", "one4", short.metrics)
    _launch(path, 3, "train.run_name=resumed", f"train.resume={runs / 'resumed'}")
    _check_run(runs, "resumed", "one", full.metrics)
