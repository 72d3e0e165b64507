"""An in-process multi-rank harness: ``run_ranks(fn, world_size)`` runs ``fn(rank, world_size,
*args)`` on ``world_size`` spawned processes from the calling (pytest) process, with the
environment torchrun would set (RANK, WORLD_SIZE, MASTER_ADDR=127.0.0.1, a free MASTER_PORT),
and returns their results in rank order. Cheaper than torchrun (no launcher and agent
processes); ``fn`` may call ``ember.train.loop.train`` (which starts the process group from
that environment) or ``init()`` for a bare gloo group."""

from __future__ import annotations

import datetime
import multiprocessing as mp
import os
import pickle
import queue
import traceback
from typing import Any, Callable

import numpy as np

import torch
import torch.distributed as dist

from ember.testing.distributed import free_port

__all__ = ["run_ranks", "init", "table_rows", "merge_tables"]


def init() -> None:
    """A gloo default group from the environment ``run_ranks`` set."""
    dist.init_process_group("gloo", init_method="env://", timeout=datetime.timedelta(seconds=60))


def _main(fn: Callable[..., Any], rank: int, world_size: int, port: int, args: tuple, out: Any,
          local_world_size: int | None = None) -> None:
    local = local_world_size or world_size  # ranks per "node" (torchrun numbers ranks node after node)
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
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_main, args=(fn, r, world_size, port, args, out, local_world_size), daemon=True)
             for r in range(world_size)]
    for p in procs:
        p.start()
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
        for p in procs:
            p.join(5)
            if p.is_alive():
                p.kill()
                p.join()
    if failed:
        raise AssertionError("\n".join(failed))
    return [results[r] for r in range(world_size)]


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
