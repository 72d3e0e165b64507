"""Large all-to-alls in pieces (``distributed.exchange_chunk_bytes``): the same rows arrive in
the same order as in one all-to-all, the traffic counters are the same, and a 2-rank run whose
rows and gradients travel in pieces trains exactly the model of one whose exchanges are whole."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from ember.distributed.exchange import Exchange
from ember.testing.distributed import assert_states_close, checkpoint_state
from tests.distributed.ranks import init, run_ranks, train_config

pytestmark = [pytest.mark.dist]


def _exchange_both_ways(rank: int, world: int) -> list[dict]:
    init()
    rng = np.random.default_rng(7)  # the same matrix on every rank: rows from rank r to rank s
    sizes = rng.integers(0, 40, size=(world, world))
    sizes[0, 1] = 0  # an empty transfer between two ranks
    send, recv = sizes[rank].tolist(), sizes[:, rank].tolist()
    peak = max(int(sizes[r, s]) for r in range(world) for s in range(world) if r != s)
    # each row says where it comes from and goes to, and which it is
    rows = torch.tensor([[rank, s, i] for s in range(world) for i in range(send[s])], dtype=torch.float32).view(-1, 3)
    out = []
    for chunk in (0, 12, 100):  # 12 B: one row (3 float32) a piece
        ex = Exchange(rank, world, torch.device("cpu"), chunk_bytes=chunk)
        got = ex.all_to_all(rows, send, recv, "rows", peak=peak)
        ids = ex.all_to_all(rows[:, 2].to(torch.int64), send, recv, "ids", peak=peak)
        out.append({"rows": got, "ids": ids, "pieces": ex.pieces(peak, 12), "traffic": ex.traffic, "peak": peak})
    return out


def test_an_all_to_all_in_pieces_delivers_what_one_does():
    ranks = run_ranks(_exchange_both_ways, 3, timeout=120)
    for per_rank in ranks:
        whole, *pieced = per_rank
        assert whole["pieces"] == 1
        assert [p["pieces"] for p in pieced] == [whole["peak"], -(-whole["peak"] * 12 // 100)]
        for p in pieced:
            assert p["pieces"] > 1
            torch.testing.assert_close(p["rows"], whole["rows"], rtol=0, atol=0)
            torch.testing.assert_close(p["ids"], whole["ids"], rtol=0, atol=0)
            assert p["traffic"] == whole["traffic"]
    # rank 1 got every rank's rows addressed to it, source after source, in order (none from rank 0)
    got = ranks[1][0]["rows"]
    counts = [int((got[:, 0] == s).sum()) for s in range(3)]
    assert counts[0] == 0 and got.tolist() == [[s, 1, i] for s in range(3) for i in range(counts[s])]


CONFIG = {
    "data": {"preset": "synthetic", "batch_size": 64,
             "synthetic": {"num_dense": 3, "num_sparse": 4, "rows": 512, "eval_rows": 64, "vocab_size": 300}},
    "embedding": {"dim": 8, "optimizer": {"type": "adagrad", "lr": 0.1}},
    "model": {"type": "dlrm", "bottom_mlp": [8], "top_mlp": [8]},
    "train": {"epochs": 1, "log_every": 4, "progress": False, "threads": 1, "deterministic": True,
              "dense_optimizer": {"type": "adam", "lr": 0.01}},
    "pipeline": {"enabled": True, "embedding_staleness": 0},
    "distributed": {"sharding": "row_wise"},
}


def test_training_with_exchanges_in_pieces_equals_whole_exchanges(tmp_path: Path):
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump({**CONFIG, "train": {**CONFIG["train"], "out_dir": str(tmp_path / "runs")}}))
    # 128 B: rows of 8 float32 go 4 to a piece (the batch's ~100 IDs per rank pair: many pieces)
    for name, chunk in (("whole", 0), ("pieces", 128)):
        run_ranks(train_config, 2, (path, [f"train.run_name={name}", f"distributed.exchange_chunk_bytes={chunk}"]),
                  timeout=240)
    runs = tmp_path / "runs"
    assert_states_close(checkpoint_state(runs / "whole"), checkpoint_state(runs / "pieces"), rtol=0, atol=0)
    calls = {name: sum(r.get("dist.all_to_all_calls", 0) for r in map(json.loads, (runs / name / "metrics.jsonl").open()))
             for name in ("whole", "pieces")}
    assert calls["pieces"] > 2 * calls["whole"] > 0  # the rows and gradients did go in pieces
