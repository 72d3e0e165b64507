"""Helpers of the distributed tests: launch ``ember train`` under torchrun on this machine (or
as ranks without torchrun), find its ranks' processes, and read a checkpoint's state keyed by (table, ID) to compare runs of different world sizes."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch

__all__ = ["launch_env", "torchrun_train", "torchrun_start", "ember_start", "finish", "free_port", "rank_pids", "checkpoint_state",
           "assert_states_close"]


def launch_env() -> dict[str, str]:
    """This checkout first on PYTHONPATH, one thread per process."""
    root = str(Path(__file__).resolve().parents[2])
    return {**os.environ, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
            "OMP_NUM_THREADS": "1"}


def torchrun_start(config: Path, nproc: int, overrides: Sequence[str] = (), launch: Sequence[str] = ("--standalone",),
                   prefix: Sequence[str] = (), entry: Sequence[str] = ("-m", "ember")) -> subprocess.Popen:
    """Start ``torchrun <launch> --nproc-per-node nproc -m ember train --config config ...``
    (``launch``: ``--standalone``, which picks a free port, or e.g. ``--nnodes 2 --node-rank 1
    --master-addr ...``) in a session of its own, stdout and stderr piped; ``prefix``: a command
    that runs it (e.g. ``unshare``); ``entry``: what torchrun runs instead of ``-m ember``."""
    cmd = [*prefix, sys.executable, "-m", "torch.distributed.run", *launch, f"--nproc-per-node={nproc}",
           *entry, "train", "--config", str(config), "--overwrite", *overrides]
    return subprocess.Popen(cmd, env=launch_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def finish(proc: subprocess.Popen, timeout: float) -> subprocess.CompletedProcess:
    """Wait for ``proc`` (from ``torchrun_start`` or ``ember_start``); on a timeout stop it
    (SIGTERM: torchrun terminates its ranks, then kills them; then SIGKILL to its session, or
    their open pipes would keep this call waiting) and raise AssertionError with its output."""
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.terminate()
        try:
            out, err = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
        raise AssertionError(f"{proc.args[:6]} did not finish in {timeout} s (killed):\n{out[-3000:]}\n{err[-6000:]}") from None
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def torchrun_train(config: Path, nproc: int, overrides: Sequence[str] = (), timeout: float = 240,
                   entry: Sequence[str] = ("-m", "ember")) -> subprocess.CompletedProcess:
    """``torchrun --standalone --nproc-per-node nproc -m ember train --config config ...`` with
    this checkout first on PYTHONPATH (a free port is picked by ``--standalone``); returns the
    finished process (stdout and stderr captured). ``entry``: what torchrun runs instead of
    ``-m ember`` (e.g. a test's script that wraps ember's command line)."""
    return finish(torchrun_start(config, nproc, overrides, entry=entry), timeout)


def ember_start(config: Path, rank: int, world_size: int, port: int, overrides: Sequence[str] = (),
                prefix: Sequence[str] = ()) -> subprocess.Popen:
    """``python -m ember train`` as rank ``rank`` of ``world_size`` without torchrun (the
    environment a launcher sets: RANK, WORLD_SIZE, MASTER_ADDR=127.0.0.1, MASTER_PORT=port;
    rank 0 hosts the rendezvous store)."""
    env = {**launch_env(), "RANK": str(rank), "WORLD_SIZE": str(world_size), "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    cmd = [*prefix, sys.executable, "-m", "ember", "train", "--config", str(config), "--overwrite", *overrides]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on (now)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def rank_pids(launcher: subprocess.Popen, nproc: int, timeout: float = 60) -> dict[int, int]:
    """``{rank: pid}`` of the ``nproc`` ranks a torchrun launcher started (its children, by the
    RANK in their environment), once they all run."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found: dict[int, int] = {}
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit():
                continue
            try:
                ppid = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
                if ppid != launcher.pid:
                    continue
                env = dict(v.split("=", 1) for v in (proc / "environ").read_text().split("\0") if "=" in v)
            except (OSError, IndexError, ValueError):
                continue
            if "RANK" in env:
                found[int(env["RANK"])] = int(proc.name)
        if len(found) == nproc:
            return found
        if launcher.poll() is not None:
            break
        time.sleep(0.05)
    raise AssertionError(f"the {nproc} ranks of torchrun (pid {launcher.pid}) did not all start")


def checkpoint_state(ckpt: Path) -> dict[str, Any]:
    """A checkpoint's tables ({name: (ids sorted, records in that order)}), step counters,
    dense model and dense optimizer state: what must not depend on the world size."""
    from ember.checkpoint.load import load_dense, read_manifest, resolve_checkpoint, table_parts

    ckpt = resolve_checkpoint(ckpt)
    manifest = read_manifest(ckpt)
    tables = {}
    for m in manifest["tables"]:
        name, parts = m["name"], table_parts(manifest, m)  # any number of parts: one per rank that saved
        ids = np.concatenate([np.fromfile(ckpt / f"{stem}.ids", dtype="<i8") for stem, _ in parts])
        rec = np.concatenate([np.fromfile(ckpt / f"{stem}.rec", dtype="<f4") for stem, _ in parts])
        rec = rec.reshape(-1, m.get("record_words", m["record_dim"]))
        assert np.unique(ids).size == ids.size, f"table {name}: an ID is in two parts"
        order = np.argsort(ids)
        tables[name] = (ids[order], rec[order])
    dense = load_dense(ckpt)
    return {"step": manifest["step"], "position": manifest["position"], "tables": tables,
            "table_steps": dense["table_steps"], "model": dense["model"], "optimizer": dense["optimizer"]}


def assert_states_close(a: dict[str, Any], b: dict[str, Any], rtol: float = 1e-4, atol: float = 1e-5) -> None:
    """Same IDs per table, records and dense state equal within float tolerance (summation
    order differs between world sizes)."""
    assert a["step"] == b["step"] and a["position"] == b["position"], (a["step"], b["step"], a["position"], b["position"])
    assert a["table_steps"] == b["table_steps"]
    assert sorted(a["tables"]) == sorted(b["tables"])
    for name, (ids, rec) in a["tables"].items():
        ids_b, rec_b = b["tables"][name]
        np.testing.assert_array_equal(ids, ids_b, err_msg=f"table {name}: IDs differ")
        np.testing.assert_allclose(rec, rec_b, rtol=rtol, atol=atol, err_msg=f"table {name}: records differ")
    for key, value in a["model"].items():
        torch.testing.assert_close(value, b["model"][key], rtol=rtol, atol=atol, msg=lambda m: f"model {key}: {m}")
    sa, sb = a["optimizer"]["state"], b["optimizer"]["state"]
    assert sorted(sa) == sorted(sb)
    for p in sa:
        for key, value in sa[p].items():
            if isinstance(value, torch.Tensor):
                torch.testing.assert_close(value, sb[p][key], rtol=rtol, atol=atol, msg=lambda m: f"optimizer {p}.{key}: {m}")
