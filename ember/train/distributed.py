"""The trainer's side of distributed training: start the process group for a run config,
plan the sharding of its tables, give each rank its own disk-tier directory.

``ember.distributed`` sits below the run config; what needs the whole ``RunConfig`` (data
sizes for the planner's estimates, the checks against other sections) lives here.
"""

from __future__ import annotations

import hashlib
import json
import socket
import uuid
from pathlib import Path
from typing import Any, Callable

from ember.config import RunConfig
from ember.distributed.embedding_ranks import embedding_rank_ids, on_ranks
from ember.distributed.planner import plan_sharding
from ember.distributed.process_group import DistributedRun, Topology, start
from ember.distributed.sharding import ShardingPlan
from ember.embedding.config import TableConfig
from ember.errors import ConfigError, DataError, EmberError
from ember.train.device import pick_device
from ember.source.files import expand_sized
from ember.source.protocol import source_for
from ember.source.storage import is_remote
from ember.train.shards import check_file_shards

__all__ = ["start_run", "check_distributed", "check_same_config", "check_same_files", "config_differences", "flat_config", "flatten",
           "sharding_plan", "table_rows", "shard_storage", "lead_prepares_run", "check_shared_dir"]


def start_run(cfg: RunConfig, topology: Topology | None = None) -> DistributedRun | None:
    """The process group of a torchrun launch (None for one process: nothing is initialised),
    after checking that every rank runs the same config, one distributed training supports."""
    topology = topology or Topology.from_env()
    if topology is None:
        return None
    check_distributed(cfg, topology.world_size)
    dist = start(cfg.distributed, pick_device(cfg.train.device), topology)
    try:
        check_same_config(cfg, dist)
        check_same_files(cfg, dist)
    except BaseException:
        dist.close()
        raise
    return dist


def check_distributed(cfg: RunConfig, world_size: int) -> None:
    """Every refusal of a distributed run, in one place: raise ConfigError (on every rank alike,
    before the process group starts) for settings distributed training does not take.

    Refused: ``data.shard: files`` with ``train.mode: online`` (``check_file_shards``: every rank reads
    the whole stream, whose position is one list of files); an ``embedding_ranks`` count that
    leaves no dense rank. Every other setting trains as in one process (online
    streams, rolling windows and exports included)."""
    d = cfg.distributed
    slices, who = world_size, f"the world size {world_size}"
    if d.placement == "embedding_ranks":  # the last E ranks hold the tables, the others split each batch
        embedding_rank_ids(world_size, d.embedding_ranks)
        slices, who = world_size - d.embedding_ranks, f"the {world_size - d.embedding_ranks} dense ranks"
    elif d.embedding_ranks:
        raise ConfigError(f"distributed.embedding_ranks={d.embedding_ranks} is set but distributed.placement is "
                          f"{d.placement}; set distributed.placement=embedding_ranks, or leave embedding_ranks out")
    if cfg.data.batch_size % slices:
        raise ConfigError(
            f"data.batch_size {cfg.data.batch_size} is the global batch and must be divisible by {who} "
            f"(each trains batch_size / {slices} rows); use e.g. "
            f"data.batch_size={cfg.data.batch_size - cfg.data.batch_size % slices or slices}")
    check_file_shards(cfg, slices)  # (the dense ranks share the files; embedding ranks read none)


LOCAL_KEYS = ("train.threads", "train.progress")
"""Config keys a rank may set for itself: they change nothing that other ranks see."""


def flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """A nested config dict as ``{"dotted.key": value}``; a list of sections is entered too,
    by name where its items have one (``tables[C1].dim``), else by index."""
    out: dict[str, Any] = {}
    for k, v in tree.items():
        key = f"{prefix}.{k}" if prefix else str(k)
        if isinstance(v, dict) and v:
            out.update(flatten(v, key))
        elif isinstance(v, list) and v and all(isinstance(x, dict) for x in v):
            for i, x in enumerate(v):
                out.update(flatten(x, f"{key}[{x.get('name', i)}]"))
        else:
            out[key] = v
    return out


def flat_config(cfg: RunConfig) -> dict[str, Any]:
    """The resolved config, flattened, without ``LOCAL_KEYS``."""
    flat = flatten(cfg.model_dump(mode="json", by_alias=True))
    return {k: v for k, v in flat.items() if k not in LOCAL_KEYS}


def config_differences(configs: list[dict[str, Any]], limit: int = 8, names: list[str] | None = None) -> list[str]:
    """``key: rank 0: a, rank 1: b`` for each key whose value differs between the flattened
    configs (``names``: what to call each, default ``rank r``; at most ``limit`` keys, then how
    many more)."""
    names = names or [f"rank {r}" for r in range(len(configs))]
    keys = sorted(set().union(*configs))
    missing = object()
    lines = []
    for key in keys:
        values = [c.get(key, missing) for c in configs]
        if any(v != values[0] for v in values[1:]):
            shown = ", ".join(f"{names[r]}: {'(unset)' if v is missing else _short(json.dumps(v))}" for r, v in enumerate(values))
            lines.append(f"{key}: {shown}")
    if len(lines) > limit:
        lines = lines[:limit] + [f"... and {len(lines) - limit} more keys"]
    return lines


def _short(text: str, width: int = 60) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


def check_same_config(cfg: RunConfig, dist: DistributedRun) -> None:
    """Raise ConfigError on every rank when the ranks' resolved configs differ (another file or
    other overrides on one node): a hash of each is compared, and when they differ the message
    says which keys differ on which ranks."""
    flat = flat_config(cfg)
    digest = hashlib.sha256(json.dumps(flat, sort_keys=True).encode()).hexdigest()
    if len(set(dist.all_gather(digest))) == 1:
        return
    diffs = config_differences(dist.all_gather(flat))
    raise ConfigError("the ranks' configs differ; every rank must run the same config (the same file and overrides "
                      "on every node; only " + ", ".join(LOCAL_KEYS) + " may differ):\n  " + "\n  ".join(diffs))


def check_same_files(cfg: RunConfig, dist: DistributedRun) -> None:
    """Raise ConfigError on every rank when the ranks' training files differ (a node with its
    own copy of the data, out of date): under ``data.shard: rows`` they would form other global
    batches, under ``files`` train some files twice and others never. Each rank's files, their
    sizes and, for local files, a digest of their first and last 4 KiB (a copy of the same size
    with other rows; objects in a store are one copy for every rank) are compared (a hash, then,
    when they differ, the lists, to name a file); a rank that
    cannot list them (a path missing on its node) sends its error instead, so every rank stops
    naming it rather than one waiting in the comparison for a rank that has already failed.
    Offline runs only (an online run's stream lists files as they arrive)."""
    if cfg.data.format == "synthetic" or cfg.train.mode == "online" or not cfg.data.paths("train"):
        return
    listing: list[tuple[str, int, str | None]] = []
    error: Exception | None = None
    try:
        d = cfg.data
        sized_of = getattr(source_for(d), "sized", None)  # (a file source: the run's one listing, sizes as listed)
        sized = sized_of("train") if sized_of is not None else expand_sized(d.paths("train"), d.format,
                                                                             d.storage_options, "data.train")
        listing = [(f, size, _edges(f, size)) for f, size in sized]
    except Exception as e:  # every rank must hear of it, or the others would wait for this one
        error = e
    said = None if error is None else str(error) if isinstance(error, EmberError) else f"{type(error).__name__}: {error}"
    seen = dist.all_gather((hashlib.sha256(json.dumps(listing).encode()).hexdigest(), said))
    failed = [(r, why) for r, (_, why) in enumerate(seen) if why is not None]
    if failed:
        if error is not None and not isinstance(error, EmberError):
            raise error  # not the data's fault here: this rank's traceback says where
        raise ConfigError("not every rank can list data.train: " + "; ".join(f"rank {r}: {why}" for r, why in failed)
                          + _SAME_FILES)
    if all(digest == seen[0][0] for digest, _ in seen):
        return
    listings = dist.all_gather(listing)
    raise ConfigError("the ranks see different data.train files: " + "; ".join(_file_differences(listings))
                      + _SAME_FILES)


_SAME_FILES = ("; every rank must see the same files at the same paths (a file system every node mounts, or identical "
               "copies)")


_EDGE = 4096  # bytes digested at each end of a local training file


def _edges(path: str, size: int) -> str | None:
    """A digest of a local file's first and last ``_EDGE`` bytes (None for an object in a store)."""
    if is_remote(path):
        return None
    h = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            h.update(f.read(_EDGE))
            if size > _EDGE:
                f.seek(max(size - _EDGE, _EDGE))
                h.update(f.read(_EDGE))
    except OSError as e:
        raise DataError(f"data.train: cannot read {path!r} ({e.strerror or e}); check its permissions") from e
    return h.hexdigest()


def _file_differences(listings: list[list[Any]], limit: int = 4) -> list[str]:
    """What each rank's ``(file, size, digest)`` list has other than rank 0's: a file of another
    size or other contents, one only one of them lists, or the same files in another order (at
    most ``limit``)."""
    base = {f: (size, digest) for f, size, digest in listings[0]}
    out = []
    for r, listing in enumerate(listings[1:], 1):
        mine = {f: (size, digest) for f, size, digest in listing}
        said = len(out)
        out += [f"{f!r} has {size} bytes on rank {r} and {base[f][0]} on rank 0" for f, (size, _) in mine.items()
                if f in base and base[f][0] != size]
        out += [f"{f!r} has other contents on rank {r} than on rank 0 (the same size, other bytes at its start or end)"
                for f, (size, digest) in mine.items() if f in base and base[f][0] == size and base[f][1] != digest]
        out += [f"rank {r} lists {f!r}, which rank 0 does not" for f in mine if f not in base]
        out += [f"rank {r} lacks {f!r}, which rank 0 lists" for f in base if f not in mine]
        if len(out) == said:
            out.append(f"rank {r} lists the same files in another order than rank 0")
    return out[:limit] + ([f"... and {len(out) - limit} more"] if len(out) > limit else [])


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


def sharding_plan(cfg: RunConfig, tables: list[TableConfig], world_size: int,
                  rows: dict[str, int | None] | None = None) -> ShardingPlan:
    """The planner's placement of ``tables`` for ``cfg`` over ``world_size`` ranks; with
    ``distributed.placement: embedding_ranks``, over the embedding ranks only (the planner's
    policy among them, ``ember.distributed.embedding_ranks``). ``rows``: estimated rows per
    table (``ember plan`` from a data profile); default ``table_rows(cfg)``."""
    d = cfg.distributed
    rows = table_rows(cfg) if rows is None else rows
    if d.placement == "embedding_ranks":
        ranks = embedding_rank_ids(world_size, d.embedding_ranks)
        return on_ranks(plan_sharding(tables, len(ranks), d, rows), ranks, world_size)
    return plan_sharding(tables, world_size, d, rows)


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
    check_shared_dir(run_dir, dist)
    return run_dir, outcome[0] and dist.lead


def check_shared_dir(run_dir: Path, dist: DistributedRun) -> None:
    """Raise ConfigError on every rank unless every rank sees the file rank 0 writes in
    ``run_dir`` (``train.out_dir`` must be one file system every node mounts at the same path:
    rank 0 writes the run there and every rank reads its checkpoints on resume)."""
    mark = run_dir / f".ranks-see-{uuid.uuid4().hex}"
    if dist.lead:
        run_dir.mkdir(parents=True, exist_ok=True)
        mark.write_bytes(b"")
    mark = Path(dist.broadcast(str(mark)))
    seen = dist.all_gather((mark.exists(), socket.gethostname()))
    if dist.lead:
        mark.unlink(missing_ok=True)
    blind = [f"rank {r} ({host})" for r, (ok, host) in enumerate(seen) if not ok]
    if blind:
        raise ConfigError(f"train.out_dir is not shared: {', '.join(blind)} cannot see {run_dir}, which rank 0 "
                          f"({seen[0][1]}) created; put train.out_dir on a file system every node mounts at the same "
                          "path (NFS, a cluster file system), not on a node's local disk")
