"""Distributed training equals one process: 2 and 3 ranks (gloo, CPU; spawned from this process
by ``tests.distributed.ranks``, or launched by torchrun where the command line is tested) end with the same rows, optimizer state, dense weights and eval figures as one process on the
same global batches, for every sparse optimizer (one table each), with table- and row-wise
tables, ``min_count`` and a TTL.

Checkpoints are keyed by table and ID: one run of the epoch hops between world sizes at its
checkpoints (1 -> 3 -> 2 -> 3, and 2 -> 1 with a larger ``train.max_steps``) and ends equal to
the uninterrupted one-process run; a rank running out of disk during a save stops every rank
naming it, with LATEST on the previous checkpoint, which resumes; ``ember export`` of a 2-rank
checkpoint equals that of one process, and so does ``ember train --export`` under torchrun."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from ember.checkpoint.load import resolve_checkpoint, verify_checkpoint
from ember.cli import main as ember_main
from ember.config import load
from ember.testing.distributed import assert_states_close, checkpoint_state, torchrun_train
from ember.train.loop import train
from tests.distributed.ranks import run_ranks, train_config

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
    # log_every 2: every run below resumes at an even step, so its logged losses cover the same steps
    "train": {"epochs": 1, "log_every": 2, "progress": False, "threads": 1, "precision": "fp32",
              "dense_optimizer": {"type": "adam", "lr": 0.01}},
    "pipeline": {"enabled": False},
    "distributed": {"sharding": "row_wise", "tables": {"C1": "table_wise", "C3": "table_wise"}},
}


FAIL_SAVE = Path(__file__).with_name("fail_save.py")


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """The config, and its one-process reference run over the whole epoch (9 steps), with a
    checkpoint every 2 steps (all kept): the states the distributed runs must reach."""
    root = tmp_path_factory.mktemp("dist")
    cfg = {**CONFIG, "train": {**CONFIG["train"], "out_dir": str(root / "runs")}}
    path = root / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg))
    full = train(load(path, ["train.run_name=one", "checkpoint.every=2", "checkpoint.keep=10"]))
    return path, root / "runs", full


def _launch(path: Path, nproc: int, *overrides: str) -> None:
    done = torchrun_train(path, nproc, overrides, timeout=300)
    assert done.returncode == 0, f"torchrun exited {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-6000:]}"


def _reference(runs: Path, step: int) -> Path:
    """The one-process run's checkpoint of ``step``."""
    return runs / "one" / "checkpoints" / f"step-{step:08d}"


def _check_run(run: Path, reference: Path, ref_run: Path, ref_metrics: dict[str, float] | None = None) -> None:
    """The run's latest checkpoint equals ``reference``, its logged losses those of the
    reference run at the same steps, and (``ref_metrics``) its eval figures."""
    assert_states_close(checkpoint_state(reference), checkpoint_state(run))
    if ref_metrics is not None:
        summary = json.loads((run / "summary.json").read_text())
        assert summary["auc/label"] == pytest.approx(ref_metrics["auc/label"], abs=1e-6)
        assert summary["logloss/label"] == pytest.approx(ref_metrics["logloss/label"], abs=1e-6)
    mine = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    ref = {r["step"]: r for r in map(json.loads, (ref_run / "metrics.jsonl").read_text().splitlines()) if r["kind"] == "train"}
    trains = [r for r in mine if r["kind"] == "train"]  # none when the run only trained the unlogged step 9
    assert [r["loss"] for r in trains] == pytest.approx([ref[r["step"]]["loss"] for r in trains], abs=1e-6)


def _export(ckpt: Path, out: Path) -> Path:
    assert ember_main(["export", "--checkpoint", str(ckpt), "--out", str(out)]) == 0
    return out


def _assert_same_export(a: Path, b: Path) -> None:
    """Same manifest but for the files' hashes, byte-identical ID files, weights and the dense
    model equal within float tolerance (only the dense sums' order differs between world sizes)."""
    ma, mb = (json.loads((d / "manifest.json").read_text()) for d in (a, b))
    assert {**ma, "files": None} == {**mb, "files": None}
    assert sorted(ma["files"]) == sorted(mb["files"])
    for t in ma["tables"]:
        assert (a / "tables" / f"{t['name']}.ids").read_bytes() == (b / "tables" / f"{t['name']}.ids").read_bytes()
        wa, wb = (np.fromfile(d / "tables" / f"{t['name']}.weights", dtype="<f4") for d in (a, b))
        np.testing.assert_allclose(wa, wb, rtol=1e-4, atol=1e-5, err_msg=t["name"])
    sa, sb = (torch.jit.load(str(d / "model.pt")).state_dict() for d in (a, b))
    assert sorted(sa) == sorted(sb)
    for k in sa:
        torch.testing.assert_close(sa[k], sb[k], rtol=1e-4, atol=1e-5)


def test_checkpoints_move_between_world_sizes(setup, tmp_path):
    """One epoch, its checkpoints resumed on other world sizes: 1 process -> 3 ranks (steps 5-6)
    -> 2 ranks (7-8) -> 3 ranks (9, the partial last batch leaves rank 0 no row) equals the
    one-process run at each checkpoint and at the end; the 2-rank checkpoint resumed by one
    process with a larger train.max_steps continues to the same end. ``ember export`` of the
    2-rank checkpoint equals the one-process one's, and so does ``ember train --export`` of the
    3-rank run."""
    path, runs, full = setup
    # the first two hops run as ranks spawned from this process (the maths, not the launch);
    # the last is `ember train --export` under torchrun.
    # this hop trains with the pipeline's stage threads: the same states as in line
    run_ranks(train_config, 3, (path, ["train.run_name=to3", f"train.resume={_reference(runs, 4)}", "train.max_steps=6",
                                       "pipeline.enabled=true"]), timeout=300)
    _check_run(runs / "to3", _reference(runs, 6), runs / "one")
    run_ranks(train_config, 2, (path, ["train.run_name=to2", f"train.resume={runs / 'to3'}", "train.max_steps=8"]),
              timeout=300)
    _check_run(runs / "to2", _reference(runs, 8), runs / "one")
    assert verify_checkpoint(resolve_checkpoint(runs / "to2"))["parts"] == 2
    _launch(path, 3, "train.run_name=back3", f"train.resume={runs / 'to2'}", "--export", str(tmp_path / "exp3"))
    _check_run(runs / "back3", _reference(runs, 9), runs / "one", full.metrics)
    one = train(load(path, ["train.run_name=to1", f"train.resume={runs / 'to2'}", "train.max_steps=20"]))
    assert one.step == 9
    _check_run(runs / "to1", _reference(runs, 9), runs / "one", full.metrics)
    _assert_same_export(_export(_reference(runs, 8), tmp_path / "e1"), _export(runs / "to2", tmp_path / "e2"))
    _assert_same_export(_export(runs / "one", tmp_path / "e9"), tmp_path / "exp3")


def test_bf16_ranks_train_as_one_process_within_bf16_rounding(setup):
    """``train.precision: bf16`` (what ``auto`` picks on a bf16 CPU or GPU) on 2 ranks ends near
    one process: each rank's bf16 matmuls round its own partial gradient sums before the
    all-reduce, so the two agree to bf16's precision, not fp32's (the runs above pin fp32)."""
    path, runs, _ = setup
    one = train(load(path, ["train.run_name=bf16one", "train.precision=bf16", "train.max_steps=6"]))
    run_ranks(train_config, 2, (path, ["train.run_name=bf16two", "train.precision=bf16", "train.max_steps=6"]),
              timeout=300)
    assert one.step == 6 and one.parts.precision == "bf16"
    assert_states_close(checkpoint_state(runs / "bf16one"), checkpoint_state(runs / "bf16two"), rtol=2e-2, atol=2e-3)


def test_a_rank_out_of_disk_stops_every_rank_and_the_previous_checkpoint_resumes(setup):
    """2 ranks from scratch, checkpoint every 2 steps; rank 1's disk fills up in the save of step
    4: both ranks exit with an error naming rank 1, no temporary directory is left, LATEST names
    step 2, which equals one process's step 2 (and the losses logged up to step 4 its losses)
    and resumes to one process's step 4."""
    path, runs, _ = setup
    done = torchrun_train(path, 2, ["train.run_name=full_disk", "checkpoint.every=2", "train.max_steps=4"],
                          timeout=120, entry=[str(FAIL_SAVE), "1", "4"])
    assert done.returncode != 0, done.stdout[-3000:]
    # both ranks' messages (they share torchrun's stderr, and may land on one line)
    named = done.stderr.split("ember train: error: checkpoint")[1:]
    assert len(named) == 2 and all("rank 1 failed" in m and "no space left" in m for m in named), done.stderr[-6000:]
    ckpts = runs / "full_disk" / "checkpoints"
    assert (ckpts / "LATEST").read_text() == "step-00000002"
    assert sorted(p.name for p in ckpts.iterdir()) == ["LATEST", "step-00000002"]
    _check_run(runs / "full_disk", _reference(runs, 2), runs / "one")
    train(load(path, ["train.run_name=after_full_disk", f"train.resume={runs / 'full_disk'}", "train.max_steps=4"]))
    _check_run(runs / "after_full_disk", _reference(runs, 4), runs / "one")
