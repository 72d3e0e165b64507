"""Several torchrun "nodes" on this machine: one ``torchrun --nnodes N --node-rank i
--master-addr 127.0.0.1 --master-port P`` launch per node, as on N machines (issue 10 item 9;
the tower-placement tests and benchmark of issue 15 use it)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Sequence

from ember.testing.distributed import free_port, launch_env

__all__ = ["free_port", "torchrun_nodes"]


def torchrun_nodes(config: Path, nnodes: int, nproc_per_node: int, overrides: Sequence[str] = (),
                   timeout: float = 300) -> list[subprocess.CompletedProcess]:
    """``ember train --config config`` on ``nnodes`` torchrun launches of ``nproc_per_node``
    processes each, meeting at 127.0.0.1 (static rendezvous), this checkout first on
    PYTHONPATH; returns every launch's finished process (node 0 first). A launch still running
    after ``timeout`` seconds is killed with its ranks, and AssertionError raised."""
    env = launch_env()
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="ember-nodes-") as logs:
        procs = []
        for node in range(nnodes):
            cmd = [sys.executable, "-m", "torch.distributed.run", f"--nnodes={nnodes}", f"--node-rank={node}",
                   "--master-addr=127.0.0.1", f"--master-port={port}", f"--nproc-per-node={nproc_per_node}",
                   "-m", "ember", "train", "--config", str(config), "--overwrite", *overrides]
            # output to files, not pipes: a launch blocked on a full pipe would stall the others
            o, e = open(Path(logs) / f"{node}.out", "w"), open(Path(logs) / f"{node}.err", "w")
            procs.append((cmd, subprocess.Popen(cmd, env=env, stdout=o, stderr=e, start_new_session=True), o, e))
        deadline = time.monotonic() + timeout
        try:
            for _, p, _, _ in procs:
                p.wait(timeout=max(deadline - time.monotonic(), 1))
        except subprocess.TimeoutExpired:
            for _, p, _, _ in procs:  # every rank prints its threads' stacks (SIGUSR1), then all end
                for rank in _children(p.pid):
                    _signal(rank, signal.SIGUSR1)
            time.sleep(3)
            for _, p, _, _ in procs:
                if p.poll() is None:
                    os.killpg(p.pid, signal.SIGKILL)
                    p.wait()
            for _, _, o, e in procs:
                o.close()
                e.close()
            tails = "\n".join(f"--- node {i} stderr (last 6000 characters) ---\n"
                              + (Path(logs) / f"{i}.err").read_text(errors="replace")[-6000:] for i in range(nnodes))
            raise AssertionError(f"torchrun nodes did not finish in {timeout} s (killed); "
                                 f"each rank's stacks at the end are in its node's stderr:\n{tails}") from None
        finally:
            for _, _, o, e in procs:
                o.close()
                e.close()
        return [subprocess.CompletedProcess(cmd, p.returncode, (Path(logs) / f"{i}.out").read_text(),
                                            (Path(logs) / f"{i}.err").read_text())
                for i, (cmd, p, _, _) in enumerate(procs)]


def _children(pid: int) -> list[int]:
    """The processes ``pid`` started (torchrun's ranks), as far as /proc tells."""
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except (OSError, ValueError):
        return []


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except OSError:
        pass  # already gone
