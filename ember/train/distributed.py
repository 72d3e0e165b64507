"""The trainer's side of distributed training: start the process group for a run config,
plan the sharding of its tables, give each rank its own disk-tier directory.

``ember.distributed`` sits below the run config; what needs the whole ``RunConfig`` (data
sizes for the planner's estimates, the checks against other sections) lives here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from ember.config import RunConfig
from ember.distributed.config import check_compatible
from ember.distributed.planner import plan_sharding
from ember.distributed.process_group import DistributedRun, Topology, start
from ember.distributed.sharding import ShardingPlan
from ember.embedding.config import TableConfig
from ember.errors import ConfigError
from ember.train.builder import pick_device

__all__ = ["start_run", "sharding_plan", "table_rows", "shard_storage", "lead_prepares_run"]


def start_run(cfg: RunConfig, topology: Topology | None = None) -> DistributedRun | None:
    """The process group of a torchrun launch (None for one process: nothing is initialised),
    after checking that the config is one distributed training supports."""
    topology = topology or Topology.from_env()
    if topology is None:
        return None
    check_compatible(topology.world_size, cfg.data.batch_size, cfg.train.embedding_staleness)
    if cfg.distributed.placement == "towers" and cfg.pipeline.enabled:
        raise ConfigError("distributed.placement=towers routes each batch's IDs to the towers' nodes while planning, which "
                          "the pipeline runs on a thread of its own ahead of the updates; the runs would order their "
                          "all-to-alls differently across ranks. Set pipeline.enabled=false with tower placement")
    return start(cfg.distributed, pick_device(cfg.train.device), topology)


def table_rows(cfg: RunConfig) -> dict[str, int | None]:
    """Estimated rows per table: with synthetic data, the sum of its features' vocabularies;
    else a host-only table's ``host_rows`` cap; else unknown (None)."""
    out: dict[str, int | None] = {}
    synth = cfg.data.synthetic if cfg.data.format == "synthetic" else None
    columns = [f"C{i + 1}" for i in range(synth.num_sparse)] if synth is not None else []
    for t in cfg.table_configs():
        feats = [f for f in cfg.schema.sparse if f.table_name == t.name]
        if synth is not None and feats and all((f.column or f.name) in columns for f in feats):
            out[t.name] = sum(synth.vocab(columns.index(f.column or f.name)) for f in feats)
        elif t.storage.disk_path is None and t.storage.host_rows is not None:
            out[t.name] = t.storage.host_rows
        else:
            out[t.name] = None
    return out


def sharding_plan(cfg: RunConfig, tables: list[TableConfig], world_size: int) -> ShardingPlan:
    """The planner's placement of ``tables`` for ``cfg`` over ``world_size`` ranks."""
    return plan_sharding(tables, world_size, cfg.distributed, table_rows(cfg))


def shard_storage(tables: list[TableConfig], rank: int) -> list[TableConfig]:
    """Tables whose disk tier goes to ``<disk_path>/rank-<r>``: ranks on one machine never
    share a file. Row and byte budgets (``host_rows``, ``device_bytes``, ...) are per rank."""
    out = []
    for t in tables:
        if t.storage.disk_path is not None:
            storage = t.storage.model_copy(update={"disk_path": f"{t.storage.disk_path}/rank-{rank}"})
            t = t.model_copy(update={"storage": storage})
        out.append(t)
    return out


def lead_prepares_run(run_dir: Path, dist: DistributedRun | None, prepare: Callable[[Path], bool]) -> tuple[Path, bool]:
    """``prepare(run_dir)`` (check, clear an earlier run; returns whether the run starts fresh)
    on rank 0 alone, every rank getting its outcome: rank 0's run directory (a timestamped name
    is rank 0's clock), and its error when it refused. Only rank 0 is ever "fresh" (it alone
    removes a failed run's directory)."""
    if dist is None:
        return run_dir, prepare(run_dir)
    run_dir = Path(dist.broadcast(str(run_dir)))
    outcome: tuple[bool, str] = (False, "")
    error: Exception | None = None
    if dist.lead:
        try:
            outcome = (prepare(run_dir), "")
        except Exception as e:  # every rank must hear of it, or the others would wait for rank 0
            error, outcome = e, (False, f"{type(e).__name__}: {e}")
    outcome = dist.broadcast(outcome)
    if error is not None:
        raise error
    if outcome[1]:
        raise ConfigError(f"rank 0 refused the run directory {run_dir}: {outcome[1]}")
    return run_dir, outcome[0] and dist.lead
