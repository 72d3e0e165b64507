"""One system, not modes: a table of run configurations that covers every pair of settings
(a mixed-level pairwise covering array) of

    world: 1 process | 2 ranks | 2 nodes        mode: offline | online        staleness: 0 | 2
    rows: fp32 | bf16        placement: row-wise | towers | embedding ranks
    teacher: none | distill  tiers: host | cache + disk

"2 nodes" is 2 ranks whose LOCAL_WORLD_SIZE is 1 (ember's topology: one rank per node, as
torchrun --nnodes 2 --nproc-per-node 1 sets it); the resume of such a cell is two real torchrun
launches (``ember.testing.nodes``: --nnodes 2 on 127.0.0.1), its other runs the in-process
harness (``tests.distributed.ranks``), which keeps the table within its time budget. "Online" is
``train.mode: online`` on a watched directory of 4 Parquet files (200 rows each) that ends at
``data.watch.idle_timeout_s``. "Embedding ranks" is ``distributed.placement: embedding_ranks``
with 1 embedding rank beside 1 dense rank.

One pair has no meaning and is not generated (``EXCLUDED``, which says why): 1 process with
embedding ranks. Every other pair of levels appears in some cell (test_the_table_covers_every_pair).

Each cell trains with a checkpoint every 4 steps and is SIGKILLed, every rank of it, after step 5
(the update of step 5 and, at staleness 2, the fetches of steps 6-7 in flight), resumes to step 8
from the step-4 checkpoint, and is also trained to step 8 without the kill; it is exported, and the export's scores of the eval file
give the AUC that eval gives the checkpoint. A cell whose steps are deterministic (staleness 0)
resumes to the uninterrupted run's exact state, and a multi-rank one equals the one-process run
of the same configuration within float tolerance. Online, "resume" and "equal" mean: the stream
position (files finished, rows of the current file) is in the checkpoint; the killed run's
step-4 checkpoint's position is the uninterrupted run's step-4 position (400 rows: file 0 and all 200 rows of
file 1); the resumed run ends at step 8 with the uninterrupted run's final position (files 0-2
and all of file 3: 800 rows), so it trained every row exactly once (800 rows in 8 batches of
100: a file read twice or skipped would change the step count or the position); deterministic
online cells then hold the uninterrupted run's exact model, rows and optimizer state, and the
stale ones the same position and step. (SIGKILL during a save is covered by
tests/checkpoint/test_crash.py; a rank that dies alone, with the others left to notice, by
tests/distributed/test_faults.py.)
"""

from __future__ import annotations

import itertools
import json
import os
import signal
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from ember.checkpoint.load import resolve_checkpoint, verify_checkpoint
from ember.config import from_dict
from ember.testing.distributed import assert_states_close, checkpoint_state
from ember.testing.nodes import torchrun_nodes
from ember.train.loop import train
from tests.distributed.ranks import run_ranks, run_ranks_killed
from tests.distributed.test_one_system import _with_teacher

pytestmark = [pytest.mark.dist, pytest.mark.slow]

FACTORS = ("world", "mode", "staleness", "rows", "placement", "teacher", "tiers")
LEVELS = {"world": (1, 2, "nodes"), "mode": ("offline", "online"), "staleness": (0, 2), "rows": ("fp32", "bf16"),
          "placement": ("rows", "towers", "embedding_ranks"), "teacher": ("none", "distill"),
          "tiers": ("host", "cached")}
# pairs of levels that no cell may hold, each with why
EXCLUDED = {
    (("world", 1), ("placement", "embedding_ranks")):
        "one process has no rank to dedicate to the tables (a distributed run refuses embedding_ranks >= the world "
        "size, and one process ignores distributed.placement, so the cell would be 1 process x row-wise again)",
}
# a mixed-level pairwise covering array of the seven factors: every pair of levels of every two
# factors, less EXCLUDED, appears in some row (checked by test_the_table_covers_every_pair); 8
# rows, the least possible (world x placement has 8 valid pairs). Multi-rank cells with
# staleness 0, which must equal one process, cover online, towers, embedding ranks, 2 nodes,
# bf16, distill and the cache + disk tiers.
TABLE = [
    (1, "online", 0, "fp32", "rows", "distill", "host"),
    (1, "offline", 2, "bf16", "towers", "none", "cached"),
    (2, "offline", 2, "bf16", "rows", "distill", "cached"),
    (2, "online", 0, "bf16", "towers", "none", "host"),
    (2, "offline", 2, "fp32", "embedding_ranks", "none", "host"),
    ("nodes", "online", 2, "fp32", "rows", "none", "cached"),
    ("nodes", "offline", 0, "fp32", "towers", "distill", "host"),
    ("nodes", "online", 0, "bf16", "embedding_ranks", "distill", "cached"),
]
STREAM_FILES, FILE_ROWS = 4, 200  # the online cells' watched directory: 8 batches of 100


def _excluded(a: tuple[str, Any], b: tuple[str, Any]) -> bool:
    return (a, b) in EXCLUDED or (b, a) in EXCLUDED


def test_the_table_covers_every_pair():
    assert all(len(row) == len(FACTORS) and all(v in LEVELS[f] for f, v in zip(FACTORS, row)) for row in TABLE)
    assert len(set(TABLE)) == len(TABLE)
    for (a, la), (b, lb) in EXCLUDED:  # an exclusion names real levels, and no cell holds it
        assert la in LEVELS[a] and lb in LEVELS[b]
        i, j = FACTORS.index(a), FACTORS.index(b)
        assert not any(row[i] == la and row[j] == lb for row in TABLE), f"a cell holds excluded {a}={la}, {b}={lb}"
    for (i, a), (j, b) in itertools.combinations(enumerate(FACTORS), 2):
        for la, lb in itertools.product(LEVELS[a], LEVELS[b]):
            if not _excluded((a, la), (b, lb)):
                assert any(row[i] == la and row[j] == lb for row in TABLE), f"no cell with {a}={la}, {b}={lb}"


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("composition")
    _with_teacher(root, "train", STREAM_FILES * FILE_ROWS)
    _with_teacher(root, "eval", 300)
    stream = root / "stream"  # the same rows, as the files an online run finds in its watched directory
    stream.mkdir()
    rows = pq.read_table(root / "train.parquet")
    for k in range(STREAM_FILES):
        pq.write_table(rows.slice(k * FILE_ROWS, FILE_ROWS), stream / f"part-{k:03d}.parquet")
    return root


def _raw(root: Path, cell: dict[str, Any], name: str, **train_kw: Any) -> dict:
    """The cell's run config: a small DLRM (DMT with two towers for tower placement) on the
    synthetic Parquet files with a teacher column (online: the same rows in 4 watched files)."""
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
    data: dict[str, Any] = {"format": "parquet", "train": str(root / "train.parquet"),
                            "eval": str(root / "eval.parquet"), "batch_size": 100, "shuffle_buffer": 0}
    if cell["mode"] == "online":
        train_kw["mode"] = "online"
        data["train"] = str(root / "stream")
        data["watch"] = {"poll_s": 0.05, "idle_timeout_s": 0.5, "settle_s": 0, "order": "name"}
    placement: dict[str, Any] = {"placement": "towers" if cell["placement"] == "towers" else "tables"}
    if cell["placement"] == "embedding_ranks":  # the last rank holds every table, the other runs the model
        placement = {"placement": "embedding_ranks", "embedding_ranks": 1}
    return {
        "data": data, "schema": schema, "embedding": embedding, "model": model,
        "train": {"out_dir": str(root / "runs"), "run_name": name, "progress": False, "precision": "fp32", "threads": 1,
                  "log_every": 2,
                  "dense_optimizer": {"type": "adam", "lr": 0.05}, "deterministic": True, **train_kw},
        "checkpoint": {"every": 4, "keep": 10},
        "pipeline": {"enabled": True, "embedding_staleness": cell["staleness"]},
        "distributed": {"sharding": "row_wise", **placement},
    }


def _train_rank(rank: int, world: int, raw: dict) -> int:
    return train(from_dict(raw)).step


KILL_AT = 5  # the job is SIGKILLed after step 5: the step-4 checkpoint is the last, step 5's update and later fetches in flight


def _train_killed_rank(rank: int, world: int, raw: dict, pids: str) -> None:
    """A rank of a run that is SIGKILLed, every rank of it, once rank 0 has handed back step
    ``KILL_AT`` (its update, and at staleness k the fetches of the next k batches, in flight):
    as when a job's machines are lost. The ranks tell rank 0 their process IDs in ``pids``."""
    from ember.train.progress import Progress

    Path(pids, str(rank)).write_text(str(os.getpid()))
    if rank == 0:
        advance = Progress.advance

        def advance_then_kill(self: Progress, step: int) -> None:
            advance(self, step)
            if step == KILL_AT:
                for f in Path(pids).iterdir():
                    if int(f.read_text()) != os.getpid():
                        os.kill(int(f.read_text()), signal.SIGKILL)
                os.kill(os.getpid(), signal.SIGKILL)

        Progress.advance = advance_then_kill  # type: ignore[method-assign]
    train(from_dict(raw))
    raise AssertionError(f"rank {rank} ended its run instead of being killed at step {KILL_AT}")


def _train_killed(raw: dict, world: int | str) -> None:
    """Train ``raw`` (1 process, 2 ranks or 2 nodes, each rank its own process) until every
    rank is SIGKILLed after step ``KILL_AT``; the run's last checkpoint is then step 4's."""
    pids = Path(raw["train"]["out_dir"]).parent / "pids" / raw["train"]["run_name"]
    pids.mkdir(parents=True)
    run_ranks_killed(_train_killed_rank, 1 if world == 1 else 2, (raw, str(pids)), timeout=240,
                     local_world_size=1 if world == "nodes" else None)
    run = Path(raw["train"]["out_dir"]) / raw["train"]["run_name"]
    assert resolve_checkpoint(run).name == "step-00000004", resolve_checkpoint(run)


def _train(raw: dict, world: int | str, launch: bool = False) -> None:
    """Train ``raw`` on 1 process, 2 ranks or 2 nodes (``launch``: 2 torchrun launches, one a
    node, else the harness with one rank a node); every rank ends at the same step."""
    if world == 1:
        train(from_dict(raw))
    elif launch:
        config = Path(raw["train"]["out_dir"]).parent / f"{raw['train']['run_name']}.json"
        config.write_text(json.dumps(raw))
        nodes = torchrun_nodes(config, 2, 1, timeout=240)
        assert all(n.returncode == 0 for n in nodes), "\n".join(n.stderr[-4000:] for n in nodes)
    else:
        steps = run_ranks(_train_rank, 2, (raw,), timeout=240, local_world_size=1 if world == "nodes" else None)
        assert len(set(steps)) == 1, steps


def _position(ckpt: Path) -> dict:
    return verify_checkpoint(resolve_checkpoint(ckpt))["position"]


def _stream_at(position: dict) -> int:
    """The rows of the stream an online position says were trained: the files finished, in name
    order from the first, then the rows of the current one."""
    done = [Path(f).name for f in position["files_done"]]
    assert done == [f"part-{k:03d}.parquet" for k in range(len(done))], done
    assert Path(position["file"]).name == f"part-{len(done):03d}.parquet", position
    return len(done) * FILE_ROWS + position["file_rows"]


def _export_matches_eval(root: Path, run: Path, name: str) -> None:
    """The export of the run's last checkpoint scores the eval file with the AUC that eval
    gives that checkpoint."""
    from ember.cli import main
    from ember.serving import Predictor
    from ember.train.metrics import auc

    out = root / "exports" / name
    assert main(["export", "--checkpoint", str(run), "--out", str(out)]) == 0
    labels = pq.read_table(root / "eval.parquet", columns=["label"]).column("label").to_numpy()
    scores = Predictor.load(out).predict_files([str(root / "eval.parquet")])[:, 0]
    evaluated = json.loads((run / "summary.json").read_text())["auc/label"]
    assert auc(labels, scores) == pytest.approx(evaluated, abs=1e-6), f"{name}: export and eval disagree"


@pytest.mark.parametrize("row", TABLE, ids=["-".join(map(str, r)) for r in TABLE])
def test_every_cell_trains_resumes_exports_and_matches(root, row):
    cell = dict(zip(FACTORS, row))
    name = "-".join(map(str, row))
    world, online = cell["world"], cell["mode"] == "online"
    runs = root / "runs"
    # offline: 8 steps of the 8-batch file; online: to the end of the stream (the idle timeout)
    to_end = {} if online else {"max_steps": 8}
    _train(_raw(root, cell, f"{name}-full", **to_end), world)
    _train_killed(_raw(root, cell, f"{name}-cut", **to_end), world)
    _train(_raw(root, cell, f"{name}-cut", resume=str(runs / f"{name}-cut"), **to_end), world, launch=world == "nodes")
    full, resumed = checkpoint_state(runs / f"{name}-full"), checkpoint_state(runs / f"{name}-cut")
    assert full["step"] == resumed["step"] == 8
    if online:  # the stream position: stopped where the uninterrupted run was, then every file exactly once
        assert _position(runs / f"{name}-cut" / "checkpoints" / "step-00000004") == \
            _position(runs / f"{name}-full" / "checkpoints" / "step-00000004")
        assert _stream_at(_position(runs / f"{name}-full" / "checkpoints" / "step-00000004")) == 4 * 100
        assert resumed["position"] == full["position"] and _stream_at(full["position"]) == STREAM_FILES * FILE_ROWS
    if cell["staleness"] == 0:  # deterministic steps: the resumed run is the uninterrupted one
        assert_states_close(full, resumed, rtol=0, atol=0)
    else:  # stale reads race with the updates: the same run within the noise of k stale steps
        assert set(full["tables"]) == set(resumed["tables"])
    _export_matches_eval(root, runs / f"{name}-cut", name)
    if world != 1 and cell["staleness"] == 0:  # one process on the same global batches: the same model
        one = dict(cell, world=1)
        _train(_raw(root, one, f"{name}-one", **to_end), 1)
        assert_states_close(checkpoint_state(runs / f"{name}-one"), full, rtol=1e-3, atol=1e-4)
