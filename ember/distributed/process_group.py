"""Process-group setup from torchrun's environment, teardown, and the few collectives the
trainer needs beyond the embedding exchange (barrier, sums, gathers).

``Topology.from_env`` reads ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``,
``MASTER_ADDR`` and ``MASTER_PORT`` at call time (never at import). A process without them, or
with ``WORLD_SIZE=1``, is not distributed: nothing is initialised and the run is unchanged.
"""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import numpy as np
import torch
import torch.distributed as dist

from ember.distributed.config import DistributedConfig
from ember.distributed.exchange import Exchange
from ember.distributed.watchdog import Watchdog, connect
from ember.errors import ConfigError, EmberError, RankLost, RunInterrupted

__all__ = ["Topology", "DistributedRun", "start", "pick_backend"]

_ENV = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


@dataclass(frozen=True)
class Topology:
    """Where this process sits: global rank and size, rank and size on its node."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> "Topology | None":
        """The topology torchrun (``--nproc-per-node``, ``--nnodes``) put in the environment, or
        None for a single process (no ``WORLD_SIZE``, or ``WORLD_SIZE=1``)."""
        env = os.environ if env is None else env
        if int(env.get("WORLD_SIZE", "1")) <= 1:
            return None
        missing = [k for k in _ENV if k not in env]
        if missing:
            raise ConfigError(f"WORLD_SIZE={env['WORLD_SIZE']} but {missing} are not set; launch with torchrun "
                              "(torchrun --nproc-per-node N -m ember train --config X.yaml), which sets them all")
        world = int(env["WORLD_SIZE"])
        rank = int(env["RANK"])
        if not 0 <= rank < world:
            raise ConfigError(f"RANK={rank} is outside 0..{world - 1} (WORLD_SIZE={world})")
        return cls(rank, world, int(env.get("LOCAL_RANK", rank)), int(env.get("LOCAL_WORLD_SIZE", world)))


def pick_backend(cfg: DistributedConfig, device: torch.device) -> str:
    """``distributed.backend``, with ``auto`` resolved: NCCL for a CUDA model, else gloo."""
    backend = cfg.backend if cfg.backend != "auto" else ("nccl" if device.type == "cuda" else "gloo")
    if backend == "nccl":
        if not dist.is_nccl_available():
            raise ConfigError("distributed.backend is nccl but this torch build has no NCCL; use "
                              "distributed.backend=gloo (or auto) or install a CUDA build of torch")
        if device.type != "cuda":
            raise ConfigError("distributed.backend nccl needs the model on CUDA (train.device cuda or auto with a "
                              "GPU); on CPU use distributed.backend=gloo or auto")
    elif not dist.is_gloo_available():
        raise ConfigError("distributed.backend gloo is not available in this torch build; use distributed.backend=nccl "
                          "on GPUs")
    return backend


class DistributedRun:
    """A started process group: this rank's place, the embedding exchange, and helpers.

    Embedding all-to-alls run on groups of their own, so the dense model's all-reduces (DDP,
    on the default group) never interleave with them: ``exchange`` carries the fetches (IDs to
    their owners, rows back; and evaluation's), ``updates`` the gradients to the owners. With
    ``pipeline.embedding_staleness`` k > 0 the fetch of batch t + k and the update of batch t run
    on different pipeline threads at once; each group still sees its collectives in batch
    order on every rank (both exchanges share the traffic counters). ``watchdog`` (None
    when not started) names a rank that stops (``ember.distributed.watchdog``).

    ``embedding_ranks`` (``distributed.placement: embedding_ranks``): the ranks that hold the
    tables and run no dense model; the others (``dense_ranks``) split each global batch among
    themselves and sum their dense gradients over ``dense_group`` (None: every rank is dense,
    the default group). See ``ember.distributed.embedding_ranks``.
    """

    def __init__(self, topology: Topology, backend: str, model_device: torch.device,
                 watchdog: Watchdog | None = None, embedding_ranks: tuple[int, ...] = (), chunk_bytes: int = 0) -> None:
        self.topology, self.backend, self.model_device, self.watchdog = topology, backend, model_device, watchdog
        self.device = model_device if backend == "nccl" else torch.device("cpu")  # where collectives run
        self.rank, self.world_size = topology.rank, topology.world_size
        # torchrun numbers ranks node after node (RANK = GROUP_RANK * LOCAL_WORLD_SIZE + LOCAL_RANK)
        nodes = [r // topology.local_world_size for r in range(self.world_size)]
        self.exchange = Exchange(self.rank, self.world_size, self.device, dist.new_group(backend=backend), nodes,
                                 chunk_bytes)
        self.updates = self.exchange.on_group(dist.new_group(backend=backend))
        self.embedding_ranks = tuple(embedding_ranks)
        self.dense_ranks = tuple(r for r in range(self.world_size) if r not in self.embedding_ranks)
        # every rank creates the group, members or not
        self.dense_group = dist.new_group(list(self.dense_ranks), backend=backend) if self.embedding_ranks else None

    @property
    def embedding_only(self) -> bool:
        """Whether this rank is an embedding rank (holds tables, runs no dense model)."""
        return self.rank in self.embedding_ranks

    @property
    def data_slice(self) -> tuple[int, int] | None:
        """(slice index, slices) of this rank's part of each global batch: (rank, world size),
        or among the dense ranks only; None for an embedding rank (its slice has no rows)."""
        if self.embedding_only:
            return None
        return self.dense_ranks.index(self.rank), len(self.dense_ranks)

    @property
    def lead(self) -> bool:
        """Rank 0: the one rank that creates and writes the run directory."""
        return self.rank == 0

    def local_rows(self, rows: int) -> tuple[int, int]:
        """[start, stop) of this rank's slice of a global batch of ``rows`` rows: slice r of N
        nearly equal slices, in order (a partial last batch leaves the last ranks one row fewer);
        N and r count the dense ranks only (``data_slice``), an embedding rank's slice is empty."""
        part = self.data_slice
        if part is None:
            return rows, rows
        r, n = part
        return rows * r // n, rows * (r + 1) // n

    def barrier(self) -> None:
        dist.barrier(device_ids=[self.device.index] if self.backend == "nccl" and self.device.index is not None else None)

    def agree(self, values: list[int]) -> list[int]:
        """Elementwise maximum of ``values`` over ranks: one tiny all-reduce through which the
        ranks agree each step on a stop request (its signal number, 0: none) and the like."""
        return self.agree_later(values)()

    def agree_later(self, values: list[int]) -> Callable[[], list[int]]:
        """``agree`` started now, its answer read later: the returned function waits for it
        (the all-reduce runs meanwhile, e.g. across the next step's compute)."""
        t = torch.tensor(values, dtype=torch.int64, device=self.device)
        work = dist.all_reduce(t, op=dist.ReduceOp.MAX, async_op=True)

        def answer() -> list[int]:
            work.wait()
            return [int(v) for v in t.cpu().tolist()]

        return answer

    def all_gather(self, obj: Any) -> list[Any]:
        """Every rank's ``obj`` in rank order, on every rank."""
        parts: list[Any] = [None] * self.world_size
        dist.all_gather_object(parts, obj)
        return parts

    def all_sum(self, values: list[float]) -> list[float]:
        """Elementwise sum of ``values`` over ranks (float64)."""
        t = torch.tensor(values, dtype=torch.float64, device=self.device)
        dist.all_reduce(t)
        return t.cpu().tolist()

    def gather_rows(self, array: np.ndarray) -> np.ndarray:
        """Every rank's ``array`` [n_r, ...] concatenated in rank order, on every rank."""
        parts: list[Any] = [None] * self.world_size
        dist.all_gather_object(parts, array)
        return np.concatenate(parts)

    def gather_to_lead(self, obj: Any) -> list[Any] | None:
        """Every rank's ``obj`` in rank order on rank 0 (None elsewhere)."""
        out: list[Any] | None = [None] * self.world_size if self.lead else None
        dist.gather_object(obj, out, dst=0)
        return out

    def broadcast(self, obj: Any, src: int = 0) -> Any:
        """Rank ``src``'s ``obj`` on every rank."""
        box = [obj]
        dist.broadcast_object_list(box, src=src)
        return box[0]

    def failure(self, error: BaseException) -> BaseException:
        """What this rank raises when ``error`` ends its run. A collective that raised (gloo:
        "connection reset by peer", a timeout: a RuntimeError or OSError) usually means another
        rank stopped: wait for the watchdog's verdict and return ``RankLost`` naming that rank.
        An error of this rank's own (a ConfigError, a CheckpointError, a bug...) is told to the
        others, who name this rank with it, and returned as it is."""
        w = self.watchdog
        if w is None or isinstance(error, (RunInterrupted, RankLost)):
            return error
        if isinstance(error, EmberError) or not isinstance(error, (RuntimeError, OSError)):
            w.failed(error)  # a bug or a stop of this rank's own: no collective to blame, no wait
            return error
        verdict = w.explain()
        if verdict is None or verdict.startswith(w.describe(self.rank) + " "):
            w.failed(error)
            return error
        return RankLost(verdict)

    def close(self) -> None:
        """Stop the watchdog (saying this rank finished) and tear the process group down
        (every rank, at the end of the run)."""
        if self.watchdog is not None:
            self.watchdog.close()
        if dist.is_initialized():
            dist.destroy_process_group()


GLOO_CHUNK_BYTES = 256 << 10
"""``distributed.exchange_chunk_bytes`` under gloo by default (bench/bench_hybrid.py: a step of 4 MB
per rank over a 100 Mbit/s link is ~12 % faster with it at staleness 0 and 2)."""


def start(cfg: DistributedConfig, device: torch.device, topology: Topology | None = None) -> DistributedRun | None:
    """Initialise the default process group from the environment (torchrun's), or return None
    for a single process. ``device``: the model's device type; on CUDA each rank takes the
    GPU of its ``LOCAL_RANK``. ``placement: embedding_ranks``: the last
    ``cfg.embedding_ranks`` ranks are embedding ranks."""
    topology = topology or Topology.from_env()
    if topology is None:
        return None
    if device.type == "cuda":
        if topology.local_rank >= torch.cuda.device_count():
            raise ConfigError(f"LOCAL_RANK {topology.local_rank} has no GPU ({torch.cuda.device_count()} visible); start "
                              "at most one process per GPU (torchrun --nproc-per-node) or use train.device=cpu")
        device = torch.device("cuda", topology.local_rank)
        torch.cuda.set_device(device)
    backend = pick_backend(cfg, device)
    if dist.is_initialized():
        raise ConfigError("a torch.distributed process group is already initialised in this process; ember starts its own")
    addr, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    where = f"{addr}:{port}"
    try:
        dist.init_process_group(backend, init_method="env://", rank=topology.rank, world_size=topology.world_size,
                                timeout=datetime.timedelta(seconds=cfg.timeout_s))
    except Exception as e:  # torch's own message is a store or socket timeout from deep inside
        if dist.is_initialized():
            raise
        raise _rendezvous_error(where, topology, cfg.timeout_s, e) from None
    run_id = f"ember/{os.environ.get('TORCHELASTIC_RUN_ID', 'run')}/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}/"
    watchdog = Watchdog(connect(addr, port, run_id, cfg.heartbeat_timeout_s), topology.rank, topology.world_size,
                        cfg.heartbeat_timeout_s, where)
    watchdog.start()
    emb: tuple[int, ...] = ()
    if cfg.placement == "embedding_ranks":
        from ember.distributed.embedding_ranks import embedding_rank_ids

        emb = embedding_rank_ids(topology.world_size, cfg.embedding_ranks)
    chunk = cfg.exchange_chunk_bytes
    if chunk is None:
        chunk = GLOO_CHUNK_BYTES if backend == "gloo" else 0
    return DistributedRun(topology, backend, device, watchdog, emb, chunk)


def _rendezvous_error(where: str, topology: Topology, timeout_s: float, error: Exception) -> ConfigError:
    """The ConfigError for a rendezvous that did not complete within ``timeout_s``."""
    first = (str(error).strip().splitlines() or [""])[0][:300]
    if topology.rank == 0:
        what = (f"rank 0 listened at {where} for {timeout_s:g} s (distributed.timeout_s) but not all "
                f"{topology.world_size} ranks joined")
        check = ("that every node was started with the same --nnodes/--nproc-per-node and this address, and the "
                 "other nodes' logs (a rank that failed before joining says why there)")
    else:
        what = f"rank {topology.rank} of {topology.world_size} could not reach the rendezvous at {where} within {timeout_s:g} s"
        check = ("that node 0 (rank 0) is running, that MASTER_ADDR/MASTER_PORT (torchrun --master-addr/--master-port "
                 "or --rdzv-endpoint) name its address and port, and that no firewall blocks that port")
    return ConfigError(f"distributed rendezvous failed: {what}; check {check} ({type(error).__name__}: {first})")
