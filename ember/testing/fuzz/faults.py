"""Checkpoint faults: ``ENOSPC`` at the k-th write, fsync or rename, or SIGKILL there in a
forked child; then whether the last good checkpoint (or the new one) loads and verifies."""

from __future__ import annotations

import errno
import io
import os
import shutil
import signal
from pathlib import Path
from typing import Any, Callable

import numpy as np

from ember.errors import CheckpointError
from ember.testing.fuzz.case import Case, Outcome


class _Faults:
    """Counts the checkpoint writer's I/O operations (writes, fsyncs, renames) and fails the
    ``at``-th one: ``ENOSPC`` (``mode="enospc"``) or SIGKILL of this process (``"kill"``)."""

    def __init__(self, at: int | None, mode: str) -> None:
        self.at, self.mode, self.count = at, mode, 0

    def tick(self, what: str) -> None:
        self.count += 1
        if self.at is not None and self.count == self.at:
            if self.mode == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            raise OSError(errno.ENOSPC, f"No space left on device (injected at {what} #{self.count})")

    def install(self) -> Callable[[], None]:
        """Patch the I/O the checkpoint and ``ember.fileio`` writers call; returns the undo."""
        import ember.checkpoint.atomic as atomic
        import ember.fileio as fileio

        faults = self
        real_open, real_fsync, real_rename, real_replace = open, os.fsync, os.rename, os.replace
        real_write = atomic.HashingWriter.write

        class _File(io.FileIO):
            def write(self, data: Any) -> int:  # type: ignore[override]
                faults.tick("write")
                return super().write(data)

        def hashing_write(self: Any, data: Any) -> None:
            faults.tick("write")
            real_write(self, data)

        def fault_open(file: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
            if "w" in mode and "b" in mode:
                return _File(file, "w")
            return real_open(file, mode, *args, **kwargs)

        def fsync(fd: int) -> None:
            faults.tick("fsync")
            real_fsync(fd)

        def rename(a: Any, b: Any) -> None:
            faults.tick("rename")
            real_rename(a, b)

        def replace(a: Any, b: Any) -> None:
            faults.tick("rename")
            real_replace(a, b)

        atomic.HashingWriter.write = hashing_write  # type: ignore[method-assign]
        fileio.open = fault_open  # type: ignore[attr-defined]  # module global shadows the builtin
        os.fsync, os.rename, os.replace = fsync, rename, replace

        def undo() -> None:
            atomic.HashingWriter.write = real_write  # type: ignore[method-assign]
            del fileio.open  # type: ignore[attr-defined]
            os.fsync, os.rename, os.replace = real_fsync, real_rename, real_replace

        return undo


def _checkpoint_parts(seed: int, fill: bool = True) -> tuple[Any, dict[str, Any]]:
    """A collection of two small tables (one with a TTL) with random rows, and a dense state."""
    import torch

    from ember.embedding import EmbeddingCollection, FeatureConfig, TableConfig

    g = torch.Generator().manual_seed(seed)
    ec = EmbeddingCollection([TableConfig(name="t", dim=4), TableConfig(name="u", dim=2, ttl_steps=5)],
                             [FeatureConfig(name="f", table="t"), FeatureConfig(name="g", table="u")])
    for t in ec.tables.values() if fill else []:
        n = int(torch.randint(1, 300, (1,), generator=g))
        t.load(torch.randperm(10_000, generator=g)[:n], torch.randn(n, t.config.record_dim, generator=g))
    return ec, {"model": {"w": torch.randn(16, generator=g)}}


def _table_state(ec: Any) -> dict[str, tuple]:
    """Every table's (sorted IDs, their records) as lists: equal iff the tables hold the same rows."""
    import torch

    out = {}
    for name, t in ec.tables.items():
        chunks = list(t.items_with_seen())
        ids = torch.cat([c[0] for c in chunks]) if chunks else torch.zeros(0, dtype=torch.int64)
        recs = torch.cat([c[1] for c in chunks]) if chunks else torch.zeros(0, t.config.record_dim)
        order = ids.argsort()
        out[name] = (ids[order].tolist(), recs[order].tolist())
    return out


def _run_fault(case: Case, workdir: Path) -> Outcome:
    """Save checkpoint 1 (good), change the tables, save checkpoint 2 under a fault; then the
    newest complete checkpoint must load and equal one of the two saved states."""
    from ember.checkpoint.load import load_tables, resolve_checkpoint, verify_checkpoint
    from ember.checkpoint.save import save_checkpoint

    shutil.rmtree(workdir, ignore_errors=True)
    root = workdir / "checkpoints"
    draw = case.fault["draw"]
    rng = np.random.default_rng(draw)
    ec1, dense1 = _checkpoint_parts(draw)
    first = save_checkpoint(root, 1, [ec1], dense1, {"epoch": 0, "batch": 1}, {}, keep=int(rng.integers(1, 3)))
    ec2, dense2 = _checkpoint_parts(draw + 1)
    same_step = bool(rng.random() < 0.2)  # a re-save of the same step (the final save does that)
    step2 = 1 if same_step else 2
    states = {1: _table_state(ec1), 2: _table_state(ec2)}

    counter = _Faults(None, "count")  # how many operations a clean save of step 2 makes
    probe = workdir / "probe"
    shutil.copytree(root, probe)
    undo = counter.install()
    try:
        save_checkpoint(probe, step2, [ec2], dense2, {"epoch": 0, "batch": 2}, {}, keep=2)
    finally:
        undo()
    at = int(rng.integers(1, counter.count + 1))
    mode = "kill" if case.kind == "checkpoint.kill" else "enospc"
    case.fault.update(at=at, ops=counter.count, same_step=same_step)
    detail = f"fault {mode} at op {at}/{counter.count}{' (same step)' if same_step else ''}"

    if mode == "kill":
        pid = os.fork()
        if pid == 0:  # the child: save under the fault, which kills it
            code = 0
            try:
                _Faults(at, "kill").install()
                save_checkpoint(root, step2, [ec2], dense2, {"epoch": 0, "batch": 2}, {}, keep=2)
            except BaseException:
                code = 3
            os._exit(code)
        _, status = os.waitpid(pid, 0)
        if not (os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL):
            return Outcome(case.kind, "crash", f"{detail}: the child was not killed (status {status})")
        result = "recovered"
    else:
        undo = _Faults(at, "enospc").install()
        try:
            save_checkpoint(root, step2, [ec2], dense2, {"epoch": 0, "batch": 2}, {}, keep=2)
            result = "clean_read"  # the fault hit nothing that matters (cannot happen: every op is checked)
        except CheckpointError as e:
            result = "clear_error" if "no space left" in str(e) and str(root) in str(e) else "unclear_error"
            detail += f": {str(e)[:160]}"
        except Exception as e:
            return Outcome(case.kind, "crash", f"{detail}: {type(e).__name__}: {e}")
        finally:
            undo()
    try:  # no data lost: the newest complete checkpoint loads, verifies and holds a saved state
        ckpt = resolve_checkpoint(root)
        manifest = verify_checkpoint(ckpt)
        fresh, _ = _checkpoint_parts(draw, fill=False)
        load_tables(ckpt, [fresh], manifest)
        state = _table_state(fresh)
        if state not in (states[1], states[2]):
            return Outcome(case.kind, "data_lost", f"{detail}: {ckpt.name} holds neither saved state")
        if ckpt != first and state != states[2] and not same_step:
            return Outcome(case.kind, "data_lost", f"{detail}: {ckpt.name} does not hold what was saved in it")
    except Exception as e:
        return Outcome(case.kind, "data_lost", f"{detail}: {type(e).__name__}: {e}")
    return Outcome(case.kind, result, detail)
