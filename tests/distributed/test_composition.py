"""One system, not modes: a table of run configurations that covers every pair of settings
(a pairwise covering array) of

    world: 1 process | 2 ranks          staleness: 0 | 2          rows: fp32 | bf16
    placement: row-wise | towers        teacher: none | distill   tiers: host | cache + disk

Each cell trains to step 4 (checkpoint), resumes to step 8 from that checkpoint, and is also
trained to step 8 without the stop; it is exported, and the export's scores of the eval file
give the AUC that eval gives the checkpoint. A cell whose steps are deterministic (staleness 0)
resumes to the uninterrupted run's exact state, and a 2-rank one equals the one-process run of
the same configuration within float tolerance. (SIGKILL during a save and during training is
covered by tests/checkpoint/test_crash.py and tests/distributed/test_faults.py; here the stop is
a clean one, so the table stays fast.)
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ember.config import from_dict
from ember.testing.distributed import assert_states_close, checkpoint_state
from ember.train.loop import train
from tests.distributed.ranks import run_ranks
from tests.distributed.test_one_system import _with_teacher

pytestmark = [pytest.mark.dist, pytest.mark.slow]

FACTORS = ("world", "staleness", "rows", "placement", "teacher", "tiers")
LEVELS = {"world": (1, 2), "staleness": (0, 2), "rows": ("fp32", "bf16"), "placement": ("rows", "towers"),
          "teacher": ("none", "distill"), "tiers": ("host", "cached")}
# a pairwise covering array of the six two-level factors: every pair of levels of every two
# factors appears in some row (checked by test_the_table_covers_every_pair)
TABLE = [
    (1, 0, "fp32", "rows", "none", "host"),
    (1, 0, "fp32", "rows", "distill", "cached"),
    (1, 2, "bf16", "towers", "none", "host"),
    (2, 0, "bf16", "towers", "none", "cached"),
    (2, 2, "fp32", "towers", "distill", "host"),
    (2, 2, "bf16", "rows", "distill", "cached"),
]


def test_the_table_covers_every_pair():
    for (i, a), (j, b) in itertools.combinations(enumerate(FACTORS), 2):
        for la, lb in itertools.product(LEVELS[a], LEVELS[b]):
            assert any(row[i] == la and row[j] == lb for row in TABLE), f"no cell with {a}={la}, {b}={lb}"


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("composition")
    _with_teacher(root, "train", 800)
    _with_teacher(root, "eval", 300)
    return root


def _raw(root: Path, cell: dict[str, Any], name: str, **train_kw: Any) -> dict:
    """The cell's run config: a small DLRM (DMT with two towers for tower placement) on the
    synthetic Parquet files with a teacher column."""
    schema = {"labels": ["label"], "teacher": ["teacher"], "dense": [{"name": "I1"}, {"name": "I2"}],
              "sparse": [{"name": f"C{i}", "hash_ids": False} for i in (1, 2, 3)]}
    model: dict[str, Any] = {"type": "dlrm", "bottom_mlp": [8, 4], "top_mlp": [8]}
    if cell["placement"] == "towers":
        model = {"type": "dmt", "towers": [["C1", "C2"], ["C3"]], "tower_mlp": [8], "tower_vectors": 1,
                 "bottom_mlp": [8, 4], "top_mlp": [8]}
    if cell["teacher"] == "distill":
        model["distill"] = {}
    embedding: dict[str, Any] = {"dim": 4, "optimizer": {"type": "adagrad", "lr": 0.2}, "dtype": cell["rows"]}
    if cell["tiers"] == "cached":
        embedding["storage"] = {"device_rows": 8, "device": "cpu", "host_rows": 16,
                                "disk_path": str(root / "disk" / name), "disk_rows": 256}
    return {
        "data": {"format": "parquet", "train": str(root / "train.parquet"), "eval": str(root / "eval.parquet"),
                 "batch_size": 100, "shuffle_buffer": 0},
        "schema": schema, "embedding": embedding, "model": model,
        "train": {"out_dir": str(root / "runs"), "run_name": name, "progress": False, "threads": 1, "log_every": 2,
                  "dense_optimizer": {"type": "adam", "lr": 0.05}, "deterministic": True, **train_kw},
        "checkpoint": {"every": 4, "keep": 10},
        "pipeline": {"enabled": True, "embedding_staleness": cell["staleness"]},
        "distributed": {"sharding": "row_wise", "placement": "towers" if cell["placement"] == "towers" else "tables"},
    }


def _train_rank(rank: int, world: int, raw: dict) -> int:
    return train(from_dict(raw)).step


def _train(raw: dict, world: int) -> None:
    if world == 1:
        train(from_dict(raw))
    else:
        assert run_ranks(_train_rank, world, (raw,), timeout=240) == [raw["train"]["max_steps"]] * world


def _export_matches_eval(root: Path, run: Path, name: str) -> None:
    """The export of the run's last checkpoint scores the eval file with the AUC that eval
    gives that checkpoint."""
    from ember.cli import main
    from ember.serving import Predictor
    from ember.train.metrics import auc

    out = root / "exports" / name
    assert main(["export", "--checkpoint", str(run), "--out", str(out)]) == 0
    import pyarrow.parquet as pq

    labels = pq.read_table(root / "eval.parquet", columns=["label"]).column("label").to_numpy()
    scores = Predictor.load(out).predict_files([str(root / "eval.parquet")])[:, 0]
    evaluated = json.loads((run / "summary.json").read_text())["auc/label"]
    assert auc(labels, scores) == pytest.approx(evaluated, abs=1e-6), f"{name}: export and eval disagree"


@pytest.mark.parametrize("row", TABLE, ids=["-".join(map(str, r)) for r in TABLE])
def test_every_cell_trains_resumes_exports_and_matches(root, row):
    cell = dict(zip(FACTORS, row))
    name = "-".join(map(str, row))
    world = cell["world"]
    runs = root / "runs"
    _train(_raw(root, cell, f"{name}-full", max_steps=8), world)
    _train(_raw(root, cell, f"{name}-cut", max_steps=4), world)
    _train(_raw(root, cell, f"{name}-cut", max_steps=8, resume=str(runs / f"{name}-cut")), world)
    full, resumed = checkpoint_state(runs / f"{name}-full"), checkpoint_state(runs / f"{name}-cut")
    assert full["step"] == resumed["step"] == 8
    if cell["staleness"] == 0:  # deterministic steps: the resumed run is the uninterrupted one
        assert_states_close(full, resumed, rtol=0, atol=0)
    else:  # stale reads race with the updates: the same run within the noise of k stale steps
        assert set(full["tables"]) == set(resumed["tables"])
    _export_matches_eval(root, runs / f"{name}-cut", name)
    if world > 1 and cell["staleness"] == 0:  # one process on the same global batches: the same model
        one = dict(cell, world=1)
        _train(_raw(root, one, f"{name}-one", max_steps=8), 1)
        assert_states_close(checkpoint_state(runs / f"{name}-one"), full, rtol=1e-3, atol=1e-4)
