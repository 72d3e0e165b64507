"""What a run's tables will hold and what the run needs, before it starts: ``ember plan``.

Each table's expected rows come from a data profile (``ember.train.profile``): the distinct IDs
of its features (the union, for a shared table) that reach the table's ``min_count`` over the
run's ``train.epochs`` passes, capped with ``ttl_steps`` by the most distinct IDs the profile saw
in a window of ``2 * ttl_steps * batch_size`` rows (a row lives ``ttl_steps`` steps after its
last lookup and is reclaimed every ``ttl_steps`` steps). Without a profile, the planner's own
estimate (``ember.train.distributed.table_rows``: synthetic vocabularies, ``host_rows`` caps).

Then the same math as the run: the sharding planner (``ember.distributed.planner``) places the
tables on the ranks with these rows; each rank's share of a table fills its tiers in chain order
(device cache, then host, then disk: each ID lives in exactly one tier), and the bytes are the
storage plan's (``ember.tiers.storage.plan_storage``, at the table's packed record width) for
the tiers as budgeted, a growing host store or a disk file grown to the rows it holds. A
``min_count`` table also counts the IDs still below it (``IdCounter``: at most 48 B each).
Checkpoints: every row (ID + record) plus the dense model and its two Adam moments, times the
checkpoints kept.

Caveats, said in the output: a profile of the first N rows counts those rows' IDs only (more
data holds more IDs); with a shuffle buffer a run counts an ID's sightings once per shuffled batch,
the profile once per occurrence, so ``min_count`` rows are an upper bound when an ID repeats
within a batch (without one, the profile counts per batch, as the run does).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

from ember.config import RunConfig
from ember.distributed.sharding import ShardingPlan
from ember.embedding.config import TableConfig
from ember.errors import ConfigError
from ember.fileio import fmt_bytes
from ember.tiers.storage import mem_available, memory_row_bytes, plan_storage

__all__ = ["TableEstimate", "TierUse", "CapacityPlan", "estimate_rows", "plan_capacity", "COUNTER_BYTES_PER_ID"]

COUNTER_BYTES_PER_ID = 48
"""Most host bytes per ID counted toward ``min_count`` (``ember.tiers.policy.IdCounter``: a 12 B
bucket at a load of 3/8 to 3/4, as low as 1/4 just after a rehash that cleared removed IDs)."""


@dataclass(frozen=True)
class TableEstimate:
    """A table's expected rows over the whole run, and where the number comes from."""

    name: str
    rows: int | None
    stderr: float = 0.0
    distinct: int | None = None  # IDs seen at all (rows plus those below min_count)
    source: str = "unknown"
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class TierUse:
    """Rows and bytes one table takes on one rank: per tier, and its ``min_count`` counter."""

    table: str
    rank: int
    rows: int
    device_rows: int = 0
    host_rows: int = 0
    disk_rows: int = 0
    host_bytes: int = 0
    device_bytes: int = 0
    disk_bytes: int = 0
    over_cap: bool = False  # more rows than a capped host store (no disk tier) holds
    known: bool = True  # False: the table's rows are unknown, only what its storage reserves whatever they are counts


@dataclass
class CapacityPlan:
    """Rows per table, their sharding, their tiers per rank, and the run's RAM / GPU / disk."""

    world_size: int
    estimates: dict[str, TableEstimate]
    sharding: ShardingPlan
    uses: list[TierUse]
    checkpoint_bytes: int
    checkpoints_kept: int
    source: str
    tables: dict[str, TableConfig]
    notes: list[str] = field(default_factory=list)

    def per_rank(self) -> list[dict[str, int]]:
        """``{"host", "device", "disk"}`` bytes of every table on each rank."""
        out = [{"host": 0, "device": 0, "disk": 0} for _ in range(self.world_size)]
        for u in self.uses:
            out[u.rank]["host"] += u.host_bytes
            out[u.rank]["device"] += u.device_bytes
            out[u.rank]["disk"] += u.disk_bytes
        return out

    def describe(self) -> str:
        """The plan as ``ember plan`` prints it."""
        lines = [f"table rows ({self.source}):",
                 f"  {'table':<24} {'est. rows':>12} {'± (95%)':>9} {'distinct IDs':>13} {'min_count':>9} {'ttl_steps':>9}"]
        for e in self.estimates.values():
            rows = "?" if e.rows is None else f"{e.rows:,}"
            err = "" if e.rows is None else ("exact" if e.stderr == 0 else f"{1.96 * e.stderr:,.0f}")
            distinct = "" if e.distinct is None else f"{e.distinct:,}"
            t = self.tables[e.name]
            lines.append(f"  {e.name:<24} {rows:>12} {err:>9} {distinct:>13} {t.min_count:>9} {t.ttl_steps or '-':>9}")
            lines.extend(f"    {n}" for n in e.notes)
        lines.append(self.sharding.describe())
        lines.append("rows and bytes per rank and tier:")
        lines.append(f"  {'rank':<5} {'table':<24} {'device rows':>12} {'host rows':>12} {'disk rows':>12} "
                     f"{'RAM':>11} {'GPU':>11} {'disk':>11}")
        order = {name: i for i, name in enumerate(self.tables)}
        for u in sorted(self.uses, key=lambda u: (u.rank, order.get(u.table.split('__')[0], 0), u.table)):
            n = (f"{u.device_rows:>12,} {u.host_rows:>12,} {u.disk_rows:>12,}" if u.known
                 else f"{'?':>12} {'?':>12} {'?':>12}")
            lines.append(f"  {u.rank:<5} {u.table:<24} {n} "
                         f"{fmt_bytes(u.host_bytes):>11} {fmt_bytes(u.device_bytes):>11} {fmt_bytes(u.disk_bytes):>11}"
                         + ("  over its host_rows cap" if u.over_cap else ""))
        lines.append("a run needs, per rank (tables, tiers and min_count counters):")
        avail = mem_available()
        for r, need in enumerate(self.per_rank()):
            lines.append(f"  rank {r}: RAM {fmt_bytes(need['host'])}, GPU {fmt_bytes(need['device'])}, "
                         f"disk {fmt_bytes(need['disk'])} (tier files)"
                         + (f"  more RAM than this machine has available ({fmt_bytes(avail)}): ember train refuses "
                            "it here" if avail is not None and need["host"] > avail else ""))
        lines.append(f"  checkpoints: {fmt_bytes(self.checkpoint_bytes)} each, up to "
                     f"{fmt_bytes(self.checkpoint_bytes * self.checkpoints_kept)} at train.out_dir "
                     f"({self.checkpoints_kept} at once: checkpoint.keep + 1 being written)")
        lines.extend(f"  note: {n}" for n in self.notes)
        return "\n".join(lines)


def estimate_rows(cfg: RunConfig, profile: dict[str, Any] | None) -> dict[str, TableEstimate]:
    """Each table's expected rows for ``cfg`` from ``profile`` (see the module docstring), or
    the planner's own estimate without one.

    Raises:
        ConfigError: the profile lacks a sparse feature of ``cfg`` (profiled with another schema).
    """
    from ember.train.distributed import table_rows

    tables = cfg.table_configs()
    if profile is None:
        known = table_rows(cfg)
        return {t.name: TableEstimate(t.name, known[t.name], source="config" if known[t.name] is not None else "unknown")
                for t in tables}
    missing = sorted({f.name for f in cfg.schema.sparse} - set(profile["sparse"]))
    if missing:
        raise ConfigError(f"the profile has no sparse feature(s) {missing} of this config (profiled with another "
                          "schema); profile the data again with this config: ember profile --config X.yaml")
    epochs = cfg.train.epochs if cfg.train.mode == "offline" else 1
    out = {}
    for t in tables:
        feats = sorted(f.name for f in cfg.schema.sparse if f.table_name == t.name)
        entry = profile["tables"].get(t.name)
        if entry is None or sorted(entry["features"]) != feats:
            raise ConfigError(f"table '{t.name}': the profile's tables group the features otherwise (this config: "
                              f"{feats}); profile the data again with this config")
        out[t.name] = _from_profile(t, entry, epochs, cfg.data.batch_size)
    return out


def _from_profile(t: TableConfig, entry: dict[str, Any], epochs: int, batch_size: int) -> TableEstimate:
    rate = float(entry["sample_rate"])
    freq = {int(k): int(v) for k, v in entry["frequencies"].items()}
    cap = int(entry["frequency_cap"])
    need = math.ceil(t.min_count / epochs)  # sightings per pass an ID needs to be admitted
    notes = []
    if need > cap:
        notes.append(f"min_count {t.min_count} over {epochs} epoch(s) needs {need} sightings per pass; the profile "
                     f"counts up to {cap}: rows counted from {cap}")
        need = cap
    held = sum(n for c, n in freq.items() if c >= need)
    seen = sum(freq.values())
    rows, distinct = round(held / rate), round(seen / rate)
    stderr = math.sqrt(held * (1 - rate)) / rate
    if t.ttl_steps is not None:
        window = 2 * t.ttl_steps * batch_size
        if entry.get("ttl_window_rows") == window:
            live = int(entry["ttl_window_distinct"])
            if live < rows:
                rows, stderr = live, 0.0
                notes.append(f"ttl_steps {t.ttl_steps}: at most the {live:,} distinct IDs of {window:,} rows live at once")
        else:
            notes.append(f"ttl_steps {t.ttl_steps}: the profile has no window of {window:,} rows (2 x ttl_steps x "
                         "batch_size); rows counted without expiry: profile again with this config")
    return TableEstimate(t.name, rows, stderr, distinct, "profile", tuple(notes))


def _rank_rows(sharding: ShardingPlan, table: str, rows: int) -> dict[int, int]:
    """Rows of ``table`` on each rank that holds some: all on one rank (table-wise), or an even
    share of the ranks it is hashed over (row-wise)."""
    spec = sharding.spec(table)
    if spec.kind == "table_wise":
        return {spec.rank: rows}  # type: ignore[dict-item]
    ranks = list(spec.ranks) if spec.ranks is not None else list(range(sharding.world_size))
    base, extra = divmod(rows, len(ranks))
    return {r: base + (1 if i < extra else 0) for i, r in enumerate(ranks)}


def tier_use(t: TableConfig, rank: int, rows: int, distinct: int | None = None) -> TierUse:
    """How ``rows`` rows of ``t`` on one rank fill its tiers, and the bytes they take (the
    storage plan's math); ``distinct``: IDs this rank sees in all (the rest wait in the
    ``min_count`` counter)."""
    words = t.stored_words
    plan = plan_storage(t.storage, words, t.name)
    caps = {tier: n for tier, n, _ in plan.tiers}
    device = min(rows, caps.get("device") or 0)
    rest = rows - device
    host_cap = caps.get("host")
    over = False
    disk = 0
    if "disk" in caps:
        host = min(rest, host_cap or 0)
        disk = rest - host
        if disk > t.storage.disk_rows:  # the file grows to hold them
            plan = plan_storage(t.storage.model_copy(update={"disk_rows": disk}), words, t.name)
    else:
        host = rest
        over = host_cap is not None and host > host_cap
    host_bytes = plan.host_bytes + (memory_row_bytes(words, host) if plan.host_unbounded else 0)
    if t.min_count > 1 and distinct is not None:
        host_bytes += max(distinct - rows, 0) * COUNTER_BYTES_PER_ID
    return TierUse(t.name, rank, rows, device, host, disk, host_bytes, plan.device_bytes, plan.disk_bytes, over)


def plan_capacity(cfg: RunConfig, world_size: int, profile: dict[str, Any] | None = None,
                  source: str = "the config alone", local_world_size: int | None = None) -> CapacityPlan:
    """The capacity plan of ``cfg`` over ``world_size`` ranks (see the module docstring), with
    table rows from ``profile`` when given.

    Example:
        >>> from ember.config import from_dict
        >>> cfg = from_dict({"data": {"preset": "synthetic", "synthetic": {"num_sparse": 2, "vocab_size": 1000}},
        ...                  "model": {"type": "dlrm", "bottom_mlp": [8, 16], "top_mlp": [8]}})
        >>> plan = plan_capacity(cfg, 2)
        >>> sorted({u.table for u in plan.uses}), sum(u.rows for u in plan.uses if u.table == "C1")
        (['C1', 'C2'], 1000)
    """
    from ember.models.base import ModelInputs
    from ember.models.registry import build_model
    from ember.train.builder import LINEAR_SUFFIX, tower_plan
    from ember.train.distributed import sharding_plan

    estimates = estimate_rows(cfg, profile)
    tables = cfg.table_configs()
    rows = {name: e.rows for name, e in estimates.items()}
    if cfg.distributed.placement == "towers":
        sharding, _ = tower_plan(cfg, tables, world_size, local_world_size or world_size, rows)
    else:
        sharding = sharding_plan(cfg, tables, world_size, rows)
    dims = {t.name: t.dim for t in tables}
    features = cfg.schema.sparse
    model = build_model(cfg.model, ModelInputs(num_dense=len(cfg.schema.dense),
                                               sparse_dims=[dims[f.table_name] for f in features],
                                               num_tasks=len(cfg.schema.labels), feature_names=[f.name for f in features]))
    linear = bool(getattr(model, "wants_linear", False))
    dense_bytes = 3 * sum(p.numel() * p.element_size() for p in model.parameters())  # weights + Adam's 2 moments
    uses: list[TierUse] = []
    checkpoint = dense_bytes
    for t in tables:
        e = estimates[t.name]
        # a table of unknown size still takes what its storage reserves whatever its rows (bounded
        # caches, a disk file sized by disk_rows, its index) on every rank holding a share of it
        share = _rank_rows(sharding, t.name, e.rows or 0)
        seen = _rank_rows(sharding, t.name, e.distinct) if e.distinct is not None else {}
        pairs = [t] if getattr(model, "reads_embeddings", True) else []  # lr: only its first-order tables fill
        if linear:  # the dim-1 first-order table beside it, placed alike, as many rows
            pairs.append(TableConfig(name=t.name + LINEAR_SUFFIX, dim=1, optimizer=t.optimizer, min_count=t.min_count,
                                     ttl_steps=t.ttl_steps))
        for table in pairs:
            checkpoint += (e.rows or 0) * (8 + 4 * table.stored_words)  # ID + packed record, as checkpoints store rows
            for rank, n in share.items():
                use = tier_use(table, rank, n, seen.get(rank))
                uses.append(use if e.rows is not None else replace(use, known=False))
    notes = []
    unknown = [n for n, e in estimates.items() if e.rows is None]
    if unknown:
        notes.append(f"tables of unknown size ({', '.join(unknown)}) count only what their storage reserves whatever "
                     "their rows (a bounded cache, a disk file sized by disk_rows): give --profile or --rows N")
    if profile is not None and not profile["data"]["complete"]:
        notes.append(f"the profile read the first {profile['data']['rows_read']:,} rows only; the whole data holds "
                     "more IDs: profile more rows (or all) for the full-size plan")
    if profile is not None and any(t.min_count > 1 for t in tables) and cfg.data.format != "synthetic" \
            and cfg.data.shuffle_buffer > 0:
        notes.append("est. rows with min_count > 1 are an upper bound: the run counts an ID's sightings once per "
                     "(shuffled) batch, the profile once per occurrence")
    if linear:
        notes.append(f"model {cfg.model.type} adds a dim-1 first-order table per table ({LINEAR_SUFFIX}), counted above"
                     + ("" if getattr(model, "reads_embeddings", True) else "; its D-wide tables are never read and "
                        "stay empty"))
    es = cfg.train.early_stopping
    kept = cfg.checkpoint.keep + 1 + (1 if es is not None and es.save_best else 0)
    return CapacityPlan(world_size, estimates, sharding, uses, checkpoint, kept, source, {t.name: t for t in tables}, notes)
