"""``pipeline.embedding_staleness`` k > 0 on 2 gloo ranks (Persia's hybrid training): the fetch
of batch t + k overlaps the update of batch t on other threads and process groups, reads may
be stale (by at most k updates), and no gradient is lost: each owner's final rows are exactly
what applying every gradient every rank sent, to the current row, gives."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from ember.config import from_dict
from ember.pipeline.staleness import FetchGate
from ember.train.loop import train
from tests.distributed.ranks import run_ranks


LR = 0.1


def _raw(root: Path, name: str, k: int) -> dict:
    return {
        "data": {"preset": "synthetic", "batch_size": 120,
                 "synthetic": {"num_dense": 3, "num_sparse": 4, "rows": 2400, "eval_rows": 1200, "vocab_size": 150,
                               "signal_features": 4, "multi_hot": {"C2": 3}}},
        # SGD from zero rows: a row ends as -lr x the sum of the gradients applied to it
        "embedding": {"dim": 4, "initializer": {"type": "zeros"}, "optimizer": {"type": "sgd", "lr": LR}},
        "model": {"type": "dlrm", "bottom_mlp": [8, 4], "top_mlp": [8]},
        "train": {"out_dir": str(root), "run_name": name, "progress": False, "threads": 1, "log_every": 5,
                  "epochs": 2, "embedding_staleness": k, "dense_optimizer": {"type": "adam", "lr": 0.01}},
        "pipeline": {"enabled": True, "engine": "threads"},
        "distributed": {"sharding": "row_wise", "tables": {"C1": "table_wise"}},
    }


def _stale_rank(rank: int, world_size: int, raw: dict) -> dict[str, Any]:
    """Train, recording every gradient this rank sends to the owners and the rows refreshed
    (stale reads caught before an update); returns them with this rank's shard of the rows."""
    from ember.distributed.sharded import ShardedGroupLookup

    sent: dict[tuple[str, int], np.ndarray] = {}
    refreshed = [0]
    exchange, refresh = ShardedGroupLookup._owner_gradient, ShardedGroupLookup.refresh

    def recording_exchange(self):  # type: ignore[no-untyped-def]  # the gradients' send, of update or apply
        if self.grad is not None:
            names = np.repeat([t.name for t in self.group.tables], self.sizes)
            for name, i, g in zip(names, self.ids.tolist(), self.grad.detach().double().numpy()):
                sent[(name, i)] = sent.get((name, i), 0.0) + g
        return exchange(self)

    def counting_refresh(self, writes):  # type: ignore[no-untyped-def]
        n = refresh(self, writes)
        refreshed[0] += n
        return n

    ShardedGroupLookup._owner_gradient, ShardedGroupLookup.refresh = recording_exchange, counting_refresh
    result = train(from_dict(raw))
    assert result.parts is not None
    rows = {}
    for name, table in result.parts.embeddings.tables.items():
        for ids, rec in table.items():
            for i, r in zip(ids.tolist(), rec[:, :4].double().numpy()):
                rows[(name, i)] = r
    return {"sent": sent, "rows": rows, "refreshed": refreshed[0], "metrics": result.metrics, "step": result.step}


@pytest.mark.dist
@pytest.mark.slow
def test_stale_reads_lose_no_gradient_and_learn_as_k_0(tmp_path):
    ranks = run_ranks(_stale_rank, 2, (_raw(tmp_path, "k2", 2),), timeout=300)
    assert ranks[0]["step"] == ranks[1]["step"] == 40
    assert ranks[0]["metrics"] == ranks[1]["metrics"]
    assert sum(r["refreshed"] for r in ranks) > 0  # reads were stale: updates landed on re-read rows
    total: dict[tuple[str, int], np.ndarray] = {}
    for r in ranks:
        for key, g in r["sent"].items():
            total[key] = total.get(key, 0.0) + g
    owned = {**ranks[0]["rows"], **ranks[1]["rows"]}
    assert not set(ranks[0]["rows"]) & set(ranks[1]["rows"])  # each row on one owner
    assert set(owned) == set(total)
    keys = sorted(total)
    np.testing.assert_allclose(np.stack([owned[k] for k in keys]), -LR * np.stack([total[k] for k in keys]),
                               rtol=1e-4, atol=1e-8)
    exact = train(from_dict(_raw(tmp_path, "k0", 0)))  # one process, synchronous
    assert exact.metrics["auc/label"] > 0.58  # it learned
    print("auc k=2 on 2 ranks", ranks[0]["metrics"]["auc/label"], "k=0 one process", exact.metrics["auc/label"],
          "refreshed", [r["refreshed"] for r in ranks])
    assert abs(ranks[0]["metrics"]["auc/label"] - exact.metrics["auc/label"]) < 0.02


def _fetch_through(gate: FetchGate, last: int) -> None:
    for b in range(last + 1):
        assert gate.enter(b)
        gate.fetched(b)


def test_a_lockstep_stop_ends_every_rank_s_fetches_at_the_same_batch():
    """Distributed, a stop agreed after batch c's compute ends the stream before c + 2 + k on
    every rank, wherever its fetch thread is (one rank may have fetched c + 1 + k, another only
    c + 1); at a barrier the trainer stands on, every rank stops at once."""
    for fetched_up_to in (1, 3):  # two ranks' fetch threads at different batches
        gate = FetchGate(2)
        gate.lockstep = True
        gate.wrote(0)  # batch 0 computed and written: batch 3 may be fetched
        _fetch_through(gate, fetched_up_to)
        gate.computed(0)
        gate.stop()
        gate.wrote(1)
        assert [b for b in range(fetched_up_to + 1, 8) if gate.enter(b)] == list(range(fetched_up_to + 1, 4))
    barrier = FetchGate(2, barrier=lambda b: b == 1)
    barrier.lockstep = True
    _fetch_through(barrier, 1)
    barrier.computed(1)
    barrier.stop()
    assert not barrier.enter(2)
    alone = FetchGate(2)  # one process: a stop ends the fetches at once
    _fetch_through(alone, 1)
    alone.stop()
    assert not alone.enter(2)


def _files_raw(root: Path, name: str, k: int) -> dict:
    """CSV files of uneven sizes sharded by file (rank r its files: they run out at different
    steps), with checkpoints, exports and window reports due by the clock: what the ranks agree
    on ahead, k + 2 steps with staleness k."""
    rng = np.random.default_rng(11)
    data = root / "data"
    if not data.exists():
        data.mkdir()
        for f, rows in enumerate([300, 170, 260, 90]):
            lines = ["label,I1,I2,C1,C2,C3"]
            for _ in range(rows):
                c1, c2, c3 = rng.integers(0, 60, 3)
                lines.append(f"{int(rng.random() < 0.2 + 0.5 * (c1 % 2))},{rng.normal():.3f},{rng.random():.3f},"
                             f"a{c1},b{c2},c{c3}")
            (data / f"part-{f}.csv").write_text("\n".join(lines) + "\n")
        (data / "eval.csv").write_text((data / "part-0.csv").read_text())
    return {
        "data": {"format": "csv", "train": str(data / "part-*.csv"), "eval": str(data / "eval.csv"), "batch_size": 40,
                 "shuffle_buffer": 0, "shard": "files"},
        "schema": {"labels": ["label"], "dense": [{"name": "I1"}, {"name": "I2"}],
                   "sparse": [{"name": "C1"}, {"name": "C2"}, {"name": "C3"}]},
        "embedding": {"dim": 4, "initializer": {"type": "zeros"}, "optimizer": {"type": "sgd", "lr": LR}},
        "model": {"type": "dlrm", "bottom_mlp": [8, 4], "top_mlp": [8]},
        "train": {"out_dir": str(root), "run_name": name, "progress": False, "threads": 1, "log_every": 3,
                  "epochs": 2, "dense_optimizer": {"type": "adam", "lr": 0.01}},
        "checkpoint": {"every_s": 0.2, "keep": 50},
        "export": {"every_s": 0.3, "full_every": 2},
        "eval": {"window_rows": 200, "window_every_s": 0.25},
        "pipeline": {"enabled": True, "engine": "threads", "embedding_staleness": k},
        "distributed": {"sharding": "row_wise"},
    }


@pytest.mark.dist
@pytest.mark.slow
def test_staleness_with_file_shards_and_reports_due_by_the_clock(tmp_path):
    """Staleness 2 with what the ranks agree on ahead (each rank's rows under data.shard: files,
    checkpoints / exports / window reports due by the clock): the ranks agree k + 2 steps ahead,
    so every rank stops, checkpoints and exports after the same steps; every row of every file
    trains once per epoch; no gradient is lost; and a time-marked checkpoint resumes."""
    import json

    ranks = run_ranks(_stale_rank, 2, (_files_raw(tmp_path, "files", 2),), timeout=300)
    # each rank batches of 20 rows (40 / 2): rank 0's files 0 and 2 (560 rows) 28 of them, rank 1's
    # files 1 and 3 (260 rows) 13: an epoch is 28 steps, the last 15 with rows on rank 0 only
    assert ranks[0]["step"] == ranks[1]["step"] == 56
    assert ranks[0]["metrics"] == ranks[1]["metrics"]
    total: dict[tuple[str, int], np.ndarray] = {}
    for r in ranks:
        for key, g in r["sent"].items():
            total[key] = total.get(key, 0.0) + g
    owned = {**ranks[0]["rows"], **ranks[1]["rows"]}
    assert set(owned) == set(total)
    keys = sorted(total)
    np.testing.assert_allclose(np.stack([owned[k] for k in keys]), -LR * np.stack([total[k] for k in keys]),
                               rtol=1e-4, atol=1e-8)
    run = tmp_path / "files"
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    trains = [r for r in records if r["kind"] == "train"]
    assert sum(r.get("rows", 0) for r in trains) in (0, 2 * 820)  # (when train records count rows: every row, twice)
    steps = sorted(int(p.name.split("-")[1]) for p in (run / "checkpoints").glob("step-*"))
    assert steps[-1] == 56 and len(steps) >= 2  # at least one checkpoint by the clock besides the final one
    assert any(r.get("window_rows") for r in records if r["kind"] == "eval")
    assert sorted((run / "exports").glob("*-full"))
    mid = next(s for s in steps if s < 56)
    resumed = run_ranks(_stale_rank, 2, ({**_files_raw(tmp_path, "again", 2),
                                           "train": {**_files_raw(tmp_path, "again", 2)["train"],
                                                     "resume": str(run / "checkpoints" / f"step-{mid:08d}")}},),
                        timeout=300)
    assert resumed[0]["step"] == resumed[1]["step"] == 56
