"""Helpers of the distributed tests: launch ``ember train`` under torchrun on this machine,
and read a checkpoint's state keyed by (table, ID) to compare runs of different world sizes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch

__all__ = ["torchrun_train", "checkpoint_state", "assert_states_close"]


def torchrun_train(config: Path, nproc: int, overrides: Sequence[str] = (), timeout: float = 240,
                   entry: Sequence[str] = ("-m", "ember")) -> subprocess.CompletedProcess:
    """``torchrun --standalone --nproc-per-node nproc -m ember train --config config ...`` with
    this checkout first on PYTHONPATH (a free port is picked by ``--standalone``); returns the
    finished process (stdout and stderr captured). ``entry``: what torchrun runs instead of
    ``-m ember`` (e.g. a test's script that wraps ember's command line)."""
    root = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
           "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
           *entry, "train", "--config", str(config), "--overwrite", *overrides]
    # on a timeout torchrun must stop its ranks (SIGTERM: it terminates them, then kills them; they
    # run in sessions of their own), or their open pipes would keep this call waiting
    with subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          start_new_session=True) as proc:
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.terminate()
            try:
                out, err = proc.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                out, err = proc.communicate()
            raise AssertionError(f"torchrun did not finish in {timeout} s (killed):\n{out[-3000:]}\n{err[-6000:]}") from None
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


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
