"""The sharding planner: row-wise or table-wise per table, from a small cost model.

Cost model (estimates, per table ``t``): ``bytes_t = rows_t * (8 + 4 * stored_dim_t)`` (an
int64 key plus the float32 record ``[weights | optimizer state | last-seen]``). Row-wise puts
``bytes_t / N`` and ``1/N`` of the table's lookups on every rank; table-wise puts all of both on
one rank, and keeps the table's rows together (one tier chain, one cache, no per-rank
fragments of a small table). Both send every ID that another rank owns through the same
all-to-all, so communication does not decide between them; memory balance does.

The rule (``distributed.sharding: auto``): a table whose estimated rows are known and at most
``distributed.table_wise_max_rows`` is table-wise, placed largest first on the rank with the
fewest estimated bytes so far (ties: lowest rank), counting every row-wise table's even share;
every other table (large, or of unknown size) is row-wise. ``row_wise`` / ``table_wise`` force
one kind for all tables; ``distributed.tables`` forces a kind per table and wins over both.
"""

from __future__ import annotations

from typing import Mapping, Sequence

from ember.distributed.config import DistributedConfig
from ember.distributed.sharding import ShardingPlan, TableSharding
from ember.embedding.config import TableConfig
from ember.errors import ConfigError

__all__ = ["plan_sharding"]


def plan_sharding(tables: Sequence[TableConfig], world_size: int, cfg: DistributedConfig,
                  rows: Mapping[str, int | None]) -> ShardingPlan:
    """The placement of ``tables`` over ``world_size`` ranks (see the module docstring).

    Args:
        tables: every table of the run.
        world_size: ranks.
        cfg: the ``distributed`` section (policy, per-table kinds, threshold).
        rows: estimated rows per table name (None or absent: unknown).

    Example:
        >>> ts = [TableConfig(name="big", dim=8), TableConfig(name="small", dim=8)]
        >>> plan = plan_sharding(ts, 2, DistributedConfig(), {"big": 10_000_000, "small": 100})
        >>> plan.spec("big").kind, plan.spec("small").kind, plan.spec("small").rank
        ('row_wise', 'table_wise', 0)
    """
    names = {t.name for t in tables}
    unknown = sorted(set(cfg.tables) - names)
    if unknown:
        raise ConfigError(f"distributed.tables names {unknown}, which are not tables of this run; tables are {sorted(names)}")
    kinds: dict[str, str] = {}
    for t in tables:
        n = rows.get(t.name)
        if t.name in cfg.tables:
            kinds[t.name] = cfg.tables[t.name]
        elif cfg.sharding != "auto":
            kinds[t.name] = cfg.sharding
        else:
            kinds[t.name] = "table_wise" if n is not None and n <= cfg.table_wise_max_rows else "row_wise"
    record = {t.name: 8 + 4 * t.stored_dim for t in tables}
    load = [0.0] * world_size
    for t in tables:
        if kinds[t.name] == "row_wise":
            share = (rows.get(t.name) or 0) * record[t.name] / world_size
            load = [x + share for x in load]
    placed: dict[str, int] = {}
    whole = sorted((t for t in tables if kinds[t.name] == "table_wise"),
                   key=lambda t: (-(rows.get(t.name) or 0) * record[t.name], t.name))
    for t in whole:  # largest first onto the least-loaded rank (LPT)
        r = min(range(world_size), key=lambda i: (load[i], i))
        placed[t.name] = r
        load[r] += (rows.get(t.name) or 0) * record[t.name]
    specs = {t.name: TableSharding(t.name, kinds[t.name], placed.get(t.name), rows.get(t.name), record[t.name])  # type: ignore[arg-type]
             for t in tables}
    return ShardingPlan(world_size, specs)
