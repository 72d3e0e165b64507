"""Crash safety with a real SIGKILL: a child process trains and is killed between checkpoints,
inside a checkpoint write, and with a table on the disk tier. After each kill the last good
checkpoint is found through LATEST, its checksums verify, and a fresh run resumes from it and
finishes; after a kill during training (in memory and on the disk tier) the resumed run ends
with exactly the model of a run that was never killed (one thread, CPU: bitwise reproducible).

The child is this file run as a script (``python test_crash.py SPEC.json``). It wraps a few
functions to make the kill land where the test wants it, without changing what is computed:

- ``ember.train.checkpointer.save_checkpoint`` touches ``begin-<step>`` / ``saved-<step>`` markers;
- ``hang_at``: the child stops forever at one point and touches ``hanging``, then the parent
  sends SIGKILL: ``training`` (in the loss of the second step after the save of ``hang_step``,
  i.e. between two checkpoints), or inside the save of step ``hang_step``: half-way through a
  table file, half-way through the manifest, after the rename but before ``LATEST``, or (the
  final save re-saving a step) right after the old directory of that step was removed.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from ember.checkpoint.load import resolve_checkpoint, verify_checkpoint
from ember.errors import CheckpointError

HERE = Path(__file__).resolve()


# ---------------------------------------------------------------- the child


def _child(spec_path: str) -> None:
    spec = json.loads(Path(spec_path).read_text())
    markers = Path(spec["markers"])
    torch.set_num_threads(1)

    import ember.checkpoint.atomic as atomic
    import ember.checkpoint.save as save_mod
    import ember.train.placement as placement
    import ember.train.checkpointer as checkpointer
    import ember.train.loop as loop
    from ember.config import from_dict

    def hang() -> None:
        (markers / "hanging").touch()
        time.sleep(600)  # until the parent's SIGKILL

    orig_save = checkpointer.save_checkpoint
    saved: list[int] = []

    def save(root, step, *args, **kwargs):  # type: ignore[no-untyped-def]
        (markers / f"begin-{step:08d}").touch()
        out = orig_save(root, step, *args, **kwargs)
        (markers / f"saved-{step:08d}").touch()
        saved.append(step)
        return out

    checkpointer.save_checkpoint = save

    if spec.get("hang_at") == "training":  # the second training step after the save of hang_step
        orig_loss = placement.multitask_bce
        calls = []

        def loss(*args, **kwargs):  # type: ignore[no-untyped-def]
            if spec["hang_step"] in saved:
                calls.append(1)
                if len(calls) == 2:  # one full step done since that save: mid-way between two saves
                    hang()
            return orig_loss(*args, **kwargs)

        placement.multitask_bce = loss

    hang_at, tag = spec.get("hang_at"), f".tmp-step-{spec.get('hang_step', 0):08d}-"
    if hang_at in ("table_write", "manifest"):
        orig_write = atomic.HashingWriter.write
        target = ".rec" if hang_at == "table_write" else "manifest.json"

        def write(self, data):  # type: ignore[no-untyped-def]
            if tag in str(self.path) and self.path.name.endswith(target):
                orig_write(self, data[: len(data) // 2])
                self._fh.flush()  # a half-written file really is on disk
                hang()
            orig_write(self, data)

        atomic.HashingWriter.write = write
    elif hang_at == "before_latest":
        orig_atomic = save_mod.atomic_write_bytes

        def atomic_write(path, data):  # type: ignore[no-untyped-def]
            if path.name == "LATEST" and data.decode() == f"step-{spec['hang_step']:08d}":
                hang()
            orig_atomic(path, data)

        save_mod.atomic_write_bytes = atomic_write

    elif hang_at == "replace_same_step":  # a resumed run re-saving the step it resumed from
        orig_rename = save_mod.os.rename

        def rename(src, dst, *args, **kwargs):  # type: ignore[no-untyped-def]
            orig_rename(src, dst, *args, **kwargs)
            if Path(src).name == f"step-{spec['hang_step']:08d}":  # the old copy was just moved aside
                hang()

        save_mod.os.rename = rename

    loop.train(from_dict(spec["config"]))
    (markers / "done").touch()


# ---------------------------------------------------------------- parent helpers


def _config(tmp_path: Path, name: str, **train: Any) -> dict[str, Any]:
    return {
        "data": {"preset": "synthetic", "batch_size": 256,
                 "synthetic": {"rows": 8_000, "eval_rows": 1_000, "vocab_size": 2_000, "num_sparse": 4}},
        "embedding": {"dim": 8, "optimizer": {"type": "adam", "lr": 0.01}},
        "model": {"type": "dlrm", "bottom_mlp": [16, 8], "top_mlp": [16]},
        "train": {"dense_optimizer": {"type": "adam", "lr": 0.003}, "out_dir": str(tmp_path), "run_name": name,
                  "progress": False, "threads": 1, "keep_checkpoints": 2, **train},
    }


def _disk_tables(cfg: dict[str, Any], disk: Path) -> dict[str, Any]:
    """Every table: a 64-row host cache in front of a disk tier (most rows live on disk)."""
    storage = {"host_rows": 64, "disk_path": str(disk), "disk_rows": 4096, "policy": "lru", "admit_after": 1}
    return {**cfg, "tables": [{"name": f"C{i}", "dim": 8, "optimizer": {"type": "adam", "lr": 0.01}, "storage": storage}
                              for i in range(1, 5)]}


def _spawn(tmp_path: Path, config: dict[str, Any], **opts: Any) -> tuple[subprocess.Popen, Path]:
    markers = tmp_path / f"markers-{config['train']['run_name']}"
    markers.mkdir()
    spec = tmp_path / f"spec-{config['train']['run_name']}.json"
    spec.write_text(json.dumps({"markers": str(markers), "config": config, **opts}))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    log = open(spec.with_suffix(".log"), "wb")
    proc = subprocess.Popen([sys.executable, str(HERE), str(spec)], stdout=log, stderr=subprocess.STDOUT, env=env)
    log.close()
    return proc, markers


def _wait_for(path: Path, proc: subprocess.Popen, timeout: float = 60.0) -> None:
    end = time.monotonic() + timeout
    while not path.exists():
        if proc.poll() is not None:
            log = Path(proc.args[-1]).with_suffix(".log").read_text()  # type: ignore[index]
            pytest.fail(f"child exited ({proc.returncode}) before {path.name}:\n{log[-3000:]}")
        if time.monotonic() > end:
            proc.kill()
            pytest.fail(f"timed out waiting for {path.name}")
        time.sleep(0.005)


def _sigkill(proc: subprocess.Popen) -> None:
    os.kill(proc.pid, signal.SIGKILL)
    assert proc.wait(timeout=30) == -signal.SIGKILL


def _steps(markers: Path, kind: str) -> list[int]:
    return sorted(int(p.name.split("-")[1]) for p in markers.glob(f"{kind}-*"))


def _state(result) -> tuple[dict[str, torch.Tensor], dict[str, tuple[torch.Tensor, torch.Tensor]]]:
    """Model state_dict and every table's (IDs, records), sorted by ID."""
    tables = {}
    for ec in result.parts.collections():
        for name, t in ec.tables.items():
            ids, rec = (torch.cat(x) for x in zip(*t.items()))
            order = torch.argsort(ids)
            tables[name] = (ids[order], rec[order])
    return result.parts.model.state_dict(), tables


def _assert_same_model(a, b) -> None:
    (ma, ta), (mb, tb) = _state(a), _state(b)
    for k in ma:
        assert torch.equal(ma[k], mb[k]), k
    assert ta.keys() == tb.keys()
    for name in ta:
        assert torch.equal(ta[name][0], tb[name][0]), name
        assert torch.equal(ta[name][1], tb[name][1]), name


def _close(result) -> None:
    for ec in result.parts.collections():
        for t in ec.tables.values():
            t.close()


@pytest.fixture(autouse=True)
def _restore_torch_globals():
    """train() sets threads and deterministic mode process-wide; give the next test its own."""
    threads, det = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    yield
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(det)


def _train(cfg: dict[str, Any]):
    from ember.config import from_dict
    from ember.train.loop import train

    return train(from_dict(cfg))


# ---------------------------------------------------------------- tests


def _kill_between_checkpoints(tmp_path: Path, cfg: dict[str, Any], after_step: int) -> Path:
    """Run ``cfg`` in a child; SIGKILL it while it trains the steps after the save of ``after_step``."""
    proc, markers = _spawn(tmp_path, cfg, hang_at="training", hang_step=after_step)
    _wait_for(markers / "hanging", proc)
    _sigkill(proc)
    saved, begun = _steps(markers, "saved"), _steps(markers, "begin")
    assert saved == begun and saved[-1] == after_step, (begun, saved)
    assert not (markers / "done").exists()
    run_dir = tmp_path / cfg["train"]["run_name"]
    ckpt = resolve_checkpoint(run_dir)
    assert ckpt == run_dir / "checkpoints" / f"step-{saved[-1]:08d}"
    manifest = verify_checkpoint(ckpt)
    assert manifest["step"] == saved[-1]
    assert not list((run_dir / "checkpoints").glob(".tmp-*"))
    return run_dir


@pytest.mark.slow
def test_sigkill_during_training_resumes_to_the_uninterrupted_model(tmp_path):
    cfg = _config(tmp_path, "killed", max_steps=24, checkpoint_every=4)
    run_dir = _kill_between_checkpoints(tmp_path, cfg, after_step=8)
    resumed = _train({**cfg, "train": {**cfg["train"], "resume": str(run_dir)}})
    assert resumed.step == 24
    verify_checkpoint(resolve_checkpoint(run_dir))
    full = _train(_config(tmp_path, "full", max_steps=24, checkpoint_every=4))
    _assert_same_model(full, resumed)


@pytest.mark.slow
@pytest.mark.parametrize("hang_at", ["table_write", "manifest", "before_latest"])
def test_sigkill_inside_a_checkpoint_write_keeps_the_previous_one(tmp_path, hang_at):
    cfg = _config(tmp_path, "killed", max_steps=16, checkpoint_every=4)
    proc, markers = _spawn(tmp_path, cfg, hang_at=hang_at, hang_step=8)
    _wait_for(markers / "hanging", proc)
    _sigkill(proc)
    assert _steps(markers, "saved") == [4] and _steps(markers, "begin") == [4, 8]

    root = tmp_path / "killed" / "checkpoints"
    tmp_dirs = list(root.glob(".tmp-step-00000008-*"))
    if hang_at == "before_latest":  # renamed into place, but never committed through LATEST
        assert not tmp_dirs and (root / "step-00000008").is_dir()
    else:  # a half-written directory is left behind and must never be taken as a checkpoint
        assert len(tmp_dirs) == 1 and not (root / "step-00000008").exists()
        with pytest.raises(CheckpointError):
            verify_checkpoint(tmp_dirs[0])
    assert (root / "LATEST").read_text() == "step-00000004"
    for where in (tmp_path / "killed", root):
        assert resolve_checkpoint(where) == root / "step-00000004"
    assert verify_checkpoint(root / "step-00000004")["step"] == 4

    resumed = _train({**cfg, "train": {**cfg["train"], "resume": str(tmp_path / "killed")}})
    assert resumed.step == 16
    assert not list(root.glob(".tmp-*")), "a crashed save's temp directory is cleaned up by the next save"
    final = resolve_checkpoint(root)
    assert final.name == "step-00000016"
    assert verify_checkpoint(final)["step"] == 16


@pytest.mark.slow
def test_sigkill_while_a_save_replaces_the_same_step(tmp_path):
    """A run resumed from its step-4 checkpoint with max_steps=8 saves step 8 again (a finished
    run is not resumed: that is refused). Killed after the old copy was moved aside and before the
    new one is renamed in, the run directory still resolves to a checkpoint that verifies."""
    first = _train(_config(tmp_path, "killed", max_steps=8, checkpoint_every=4))
    cfg = _config(tmp_path, "killed", max_steps=8, checkpoint_every=4,
                  resume=str(first.run_dir / "checkpoints" / "step-00000004"))
    proc, markers = _spawn(tmp_path, cfg, hang_at="replace_same_step", hang_step=8)
    _wait_for(markers / "hanging", proc)
    _sigkill(proc)
    assert not (first.run_dir / "checkpoints" / "step-00000008").exists()  # really inside the window
    assert verify_checkpoint(resolve_checkpoint(first.run_dir))["step"] == 4


@pytest.mark.slow
def test_sigkill_with_a_disk_tier_resumes_from_the_last_checkpoint(tmp_path):
    disk = tmp_path / "disk"
    cfg = _disk_tables(_config(tmp_path, "killed", max_steps=24, checkpoint_every=4, log_every=4), disk)
    run_dir = _kill_between_checkpoints(tmp_path, cfg, after_step=8)
    assert any((disk / "C1").iterdir()), "the killed run had rows on the disk tier"
    resumed = _train({**cfg, "train": {**cfg["train"], "resume": str(run_dir)}})
    assert resumed.step == 24
    last = [r for r in resumed.history if r["kind"] == "train"][-1]
    assert all(last[f"C{i}/tier.disk.rows"] > 64 for i in range(1, 5)), last
    verify_checkpoint(resolve_checkpoint(run_dir))
    full = _train(_config(tmp_path, "full", max_steps=24, checkpoint_every=4))  # all in host memory
    _assert_same_model(full, resumed)
    _close(resumed)


if __name__ == "__main__":
    _child(sys.argv[1])
