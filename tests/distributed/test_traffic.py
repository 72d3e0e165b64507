"""The communication model (``ember.distributed.traffic``, docs/distributed.md "Communication model")
predicts the bytes a 2-rank run measures (``Exchange.take_stats`` in ``metrics.jsonl``): split
counts and the dense all-reduce exactly, IDs, rows and gradients within 10 % (the model takes
the expected share (N-1)/N of IDs owned elsewhere; the hash's actual share on this data
differs by a few per cent). The ranks are spawned from this process (``tests.distributed.ranks``):
what is measured is the exchange, not the launch (torchrun's is tested in test_faults.py and
test_equivalence.py)."""

from __future__ import annotations

import json

import pytest
import yaml

from ember.config import from_dict
from ember.distributed.traffic import TableLoad, predict_bytes
from ember.train.traffic import predicted_bytes
from tests.distributed.ranks import run_ranks, train_config

CONFIG = {
    "data": {"preset": "synthetic", "batch_size": 512,
             "synthetic": {"num_dense": 3, "num_sparse": 6, "rows": 2048, "eval_rows": 256, "vocab_size": 2000}},
    "embedding": {"dim": 8, "optimizer": {"type": "adagrad", "lr": 0.05}},
    "tables": [{"name": "C6", "dim": 4}],  # a second group (another dim): counts per group
    "model": {"type": "wdl", "deep_mlp": [16]},  # wide & deep: a dim-1 collection too
    "train": {"max_steps": 4, "log_every": 2, "progress": False, "threads": 1, "eval_max_batches": 1},
    "pipeline": {"enabled": False},
    "distributed": {"sharding": "row_wise"},
}


def test_predict_bytes_by_hand():
    """Two groups on 4 ranks: every term of the module docstring's formulas."""
    b = predict_bytes([[TableLoad(40, 8), TableLoad(20, 8)], [TableLoad(10, 1)]], 4, dense_params=100)
    assert b["counts"] == (8 * (2 + 1) + 4 * 8) * 3 + (8 * (1 + 1) + 4 * 1) * 3  # split sizes, the peak, a block of reached flags
    assert b["ids"] == pytest.approx(8 * 70 * 0.75)
    assert b["rows"] == b["grads"] == pytest.approx(4 * (60 * 8 + 10) * 0.75)
    assert b["dense"] == pytest.approx(2 * 0.75 * 400)
    assert b["total"] == pytest.approx(sum(b[k] for k in ("counts", "ids", "rows", "grads", "dense")))


@pytest.mark.dist
@pytest.mark.slow
def test_two_rank_bytes_match_the_model(tmp_path):
    cfg = {**CONFIG, "train": {**CONFIG["train"], "out_dir": str(tmp_path / "runs"), "run_name": "two"}}
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg))
    assert run_ranks(train_config, 2, (path,), timeout=300) == [4, 4]
    recs = [json.loads(line) for line in (tmp_path / "runs" / "two" / "metrics.jsonl").read_text().splitlines()]
    last = [r for r in recs if r["kind"] == "train"][-1]  # steps 3 and 4
    assert last["step"] == 4
    want = predicted_bytes(from_dict(cfg), 2, 2, 4)
    got = {k: last[f"dist.{k}.sent_per_step"] for k in ("counts", "ids", "rows", "grads", "dense")}
    assert got["counts"] == want["counts"]
    assert got["dense"] == pytest.approx(want["dense"], rel=1e-6)
    for k in ("ids", "rows", "grads"):
        assert got[k] == pytest.approx(want[k], rel=0.10), k
    assert got["rows"] == got["grads"]  # gradients travel back along the rows' routes
    assert last["dist.received_per_step"] == pytest.approx(last["dist.sent_per_step"])  # mean over ranks
    assert last["dist.cross_node.sent_per_step"] == 0  # one node
