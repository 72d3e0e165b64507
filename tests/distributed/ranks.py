"""An in-process multi-rank harness: ``run_ranks(fn, world_size)`` runs ``fn(rank, world_size,
*args)`` on ``world_size`` processes started from the calling (pytest) process, with the
environment torchrun would set (RANK, WORLD_SIZE, MASTER_ADDR=127.0.0.1, a free MASTER_PORT),
and returns their results in rank order. Cheaper than torchrun (no launcher and agent
processes); ``fn`` may call ``ember.train.loop.train`` (which starts the process group from
that environment) or ``init()`` for a bare gloo group.

The ranks are forked from a forkserver that imported torch and ember once per pytest session
(every rank is still a fresh process: nothing of an earlier call's ranks carries over), so a
call costs the training, not an interpreter and a torch import per rank (~2-4 s each on 2 cores).
Each rank takes this process's environment as it is at the call. Where a variable that is read
when torch or ember is imported differs from the forkserver's (``ember.pipeline.worker_process``), or with
``EMBER_TEST_SPAWN=1``, the ranks are spawned (a new interpreter each) as before."""

from __future__ import annotations

import contextlib
import datetime
import multiprocessing as mp
import os
import pickle
import queue
import signal
import traceback
from typing import Any, Callable

import numpy as np

import torch
import torch.distributed as dist

from ember.pipeline.worker_process import forkserver_context
from ember.testing.distributed import free_port

__all__ = ["run_ranks", "run_ranks_killed", "init", "train_config", "table_rows", "merge_tables"]

# what the forkserver imports once; a rank forked from it imports only what ``fn`` needs beyond
# (the forkserver is one per process: data workers fork from it too, ``ember.pipeline.worker_process``)
_PRELOAD = ["torch", "torch.distributed", "numpy", "pyarrow", "ember.config", "ember.train.loop", "ember.cli",
            "ember.pipeline.loader", "ember.pipeline.stream", "ember.testing.distributed", "tests.distributed.ranks",
            "tests.distributed._preload"]

if os.environ.get("EMBER_TEST_SPAWN") != "1":
    forkserver_context(_PRELOAD)  # asked at import (collection), before a test starts the server (a data worker)


def _context() -> Any:
    """The forkserver context while the import-time environment is the one it started with
    (``ember.pipeline.worker_process.forkserver_context``: data workers fork from the same
    server), else (or with EMBER_TEST_SPAWN=1) spawn."""
    if os.environ.get("EMBER_TEST_SPAWN") == "1":
        return mp.get_context("spawn")
    ctx, _ = forkserver_context(_PRELOAD)
    return ctx if ctx is not None else mp.get_context("spawn")


def init() -> None:
    """A gloo default group from the environment ``run_ranks`` set."""
    dist.init_process_group("gloo", init_method="env://", timeout=datetime.timedelta(seconds=60))


def train_config(rank: int, world_size: int, path: Any, overrides: tuple[str, ...] | list[str] = ()) -> int:
    """A rank of ``ember train --config path --overwrite overrides...`` as ``run_ranks`` runs it
    (what a torchrun launch of the command line trains, without the launcher): its last step."""
    from ember.config import load
    from ember.train.loop import train

    return train(load(path, list(overrides)), overwrite=True).step


class _StdFds:
    """The caller's stdout and stderr for a rank forked from the forkserver (which holds those of
    the test that started it): sent with the rank, as a spawned rank inherits them (under
    pytest, the current test's capture)."""

    def __reduce__(self) -> tuple:
        from multiprocessing import reduction

        return (_Inherited, (reduction.DupFd(1), reduction.DupFd(2)))  # while the rank is pickled


class _Inherited:
    def __init__(self, out: Any, err: Any) -> None:
        self.fds = (out.detach(), err.detach())

    def install(self) -> None:
        for stream, fd in ((1, self.fds[0]), (2, self.fds[1])):
            os.dup2(fd, stream)
            os.close(fd)


def _main(fn: Callable[..., Any], rank: int, world_size: int, port: int, args: tuple, out: Any,
          local_world_size: int | None = None, env: dict[str, str] | None = None, std: Any = None) -> None:
    local = local_world_size or world_size  # ranks per "node" (torchrun numbers ranks node after node)
    if std is not None:
        std.install()
    if env is not None:  # forked from the forkserver: the caller's environment, as a spawned rank has it
        os.environ.clear()
        os.environ.update(env)
    np.random.seed()  # a forked rank would otherwise share the forkserver's global numpy state
    os.environ.update({"RANK": str(rank), "WORLD_SIZE": str(world_size), "LOCAL_RANK": str(rank % local),
                       "LOCAL_WORLD_SIZE": str(local), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
                       "OMP_NUM_THREADS": "1"})
    torch.set_num_threads(1)
    try:
        # plain pickle: the queue's own pickler would pass tensors as file descriptors of this
        # process, gone once it exits
        out.put((rank, True, pickle.dumps(fn(rank, world_size, *args))))
    except BaseException:  # the parent raises it, naming the rank
        out.put((rank, False, traceback.format_exc()))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def run_ranks(fn: Callable[..., Any], world_size: int = 2, args: tuple = (), timeout: float = 120,
              local_world_size: int | None = None) -> list[Any]:
    """``[fn(r, world_size, *args) for r in ranks]``, each on its own spawned process (``fn``
    and ``args`` must pickle: a module-level function); AssertionError with the traceback of
    every rank that raised, or when a rank does not finish within ``timeout`` seconds.
    ``local_world_size``: ranks per "node" as torchrun would say (default: all on one node)."""
    procs, out = _start(fn, world_size, args, local_world_size)
    results: dict[int, Any] = {}
    failed: list[str] = []
    try:
        for _ in procs:
            rank, ok, value = out.get(timeout=timeout)
            if ok:
                results[rank] = pickle.loads(value)
            else:
                failed.append(f"rank {rank}:\n{value}")
    except queue.Empty:
        failed.append(f"ranks {sorted(set(range(world_size)) - set(results))} did not finish within {timeout} s")
    finally:
        _reap(procs)
    if failed:
        raise AssertionError("\n".join(failed))
    return [results[r] for r in range(world_size)]


def run_ranks_killed(fn: Callable[..., Any], world_size: int = 2, args: tuple = (), timeout: float = 120,
                     local_world_size: int | None = None) -> None:
    """Run ``fn`` on ``world_size`` ranks as ``run_ranks`` does, where ``fn`` has every rank
    killed by SIGKILL (e.g. one rank kills them all at some step): AssertionError naming each
    rank that ended otherwise (returned, raised (with its traceback), another signal, or still
    running after ``timeout`` seconds)."""
    procs, out = _start(fn, world_size, args, local_world_size)
    try:
        for p in procs:
            p.join(timeout)
            timeout = 1.0  # the first rank's wait was the budget; the others end with it
        codes = [p.exitcode for p in procs]
    finally:
        _reap(procs)
    told = {}
    with contextlib.suppress(queue.Empty):
        while True:
            rank, ok, value = out.get(timeout=0.1)
            told[rank] = "returned" if ok else f"raised:\n{value}"
    wrong = [f"rank {r}: exit code {c}" + (f", {told[r]}" if r in told else "") for r, c in enumerate(codes)
             if c != -signal.SIGKILL]
    if wrong:
        raise AssertionError("ranks not killed by SIGKILL:\n" + "\n".join(wrong))


def _start(fn: Callable[..., Any], world_size: int, args: tuple, local_world_size: int | None) -> tuple[list[Any], Any]:
    ctx = _context()
    out = ctx.Queue()
    port = free_port()
    forked = ctx.get_start_method() == "forkserver"
    env, std = (dict(os.environ), _StdFds()) if forked else (None, None)
    procs = [ctx.Process(target=_main, args=(fn, r, world_size, port, args, out, local_world_size, env, std), daemon=True)
             for r in range(world_size)]
    for p in procs:
        p.start()
    return procs, out


def _reap(procs: list[Any]) -> None:
    for p in procs:
        p.join(5)
        if p.is_alive():
            p.kill()
            p.join()


def table_rows(collection: Any) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Each table's (IDs, records) of this process (a rank's shard), in the tier's order."""
    out = {}
    for name, table in collection.tables.items():
        chunks = list(table.items())
        ids = torch.cat([i for i, _ in chunks]).numpy() if chunks else np.empty(0, np.int64)
        rec = torch.cat([r for _, r in chunks]).numpy() if chunks else np.empty((0, 0), np.float32)
        out[name] = (ids, rec)
    return out


def merge_tables(tables: list[dict[str, tuple[np.ndarray, np.ndarray]]]) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Every rank's ``table_rows`` together, sorted by ID; an ID held by two ranks fails."""
    out = {}
    for name in tables[0]:
        ids = np.concatenate([t[name][0] for t in tables])
        held = [t[name][1] for t in tables if t[name][0].size]
        rec = np.concatenate(held) if held else np.empty((0, 0), np.float32)
        assert np.unique(ids).size == ids.size, f"table {name}: an ID on two ranks"
        order = np.argsort(ids)
        out[name] = (ids[order], rec[order])
    return out
