"""Which rank owns each (table, ID): a stable hash (row-wise) or one rank for a whole table
(table-wise).

The owner is a pure function of the table name, the ID and the world size, so every rank (and
every run: no Python ``hash()``, no process seed) computes the same placement without talking.
Row-wise: ``splitmix64(id XOR salt(table)) mod world_size``, where ``salt`` is the first 8
bytes of the BLAKE2b digest of the table name; splitmix64's finalizer spreads consecutive or
clustered IDs evenly. Later kinds (column-wise: a table's columns split over ranks) add a
``TableSharding`` kind and an owner rule; the exchange only needs ``owners``.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Mapping

import numpy as np

from ember.distributed.config import ShardingKind

__all__ = ["TableSharding", "ShardingPlan", "table_salt", "splitmix64", "hash_owners"]

_U64 = np.uint64


def table_salt(name: str) -> np.uint64:
    """A table's 64-bit salt: the first 8 bytes (little-endian) of BLAKE2b(name)."""
    return _U64(int.from_bytes(hashlib.blake2b(name.encode(), digest_size=8).digest(), "little"))


def splitmix64(x: np.ndarray) -> np.ndarray:
    """The splitmix64 finalizer over uint64 values (wrapping arithmetic), vectorised.

    Example:
        >>> int(splitmix64(np.array([0], dtype=np.uint64))[0])
        16294208416658607535
    """
    with np.errstate(over="ignore"):
        z = x.astype(_U64) + _U64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> _U64(30))) * _U64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> _U64(27))) * _U64(0x94D049BB133111EB)
        return z ^ (z >> _U64(31))


def hash_owners(ids: np.ndarray, salt: np.uint64, world_size: int) -> np.ndarray:
    """Row-wise owner rank [N] int64 of int64 ``ids`` in a table salted ``salt``."""
    keys = np.ascontiguousarray(ids, dtype=np.int64).view(_U64) ^ salt
    return (splitmix64(keys) % _U64(world_size)).astype(np.int64)


@dataclass(frozen=True)
class TableSharding:
    """One table's placement: ``row_wise`` (IDs hashed over every rank, or over ``ranks`` only:
    e.g. one node's, for tower placement) or ``table_wise`` (all rows on ``rank``). ``rows``
    and ``record_bytes`` are the planner's estimates."""

    name: str
    kind: ShardingKind
    rank: int | None = None
    rows: int | None = None
    record_bytes: int = 0
    ranks: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if (self.kind == "table_wise") != (self.rank is not None):
            raise ValueError(f"table '{self.name}': a table_wise table needs a rank, a row_wise one none")
        if self.ranks is not None and (self.kind != "row_wise" or not self.ranks):
            raise ValueError(f"table '{self.name}': only a row_wise table takes ranks, and at least one")


@dataclass
class ShardingPlan:
    """The placement of every table over ``world_size`` ranks; ``owners`` routes IDs.

    Example:
        >>> plan = ShardingPlan(2, {"t": TableSharding("t", "row_wise"), "s": TableSharding("s", "table_wise", 1)})
        >>> plan.owners("s", np.array([5, 6])).tolist()
        [1, 1]
        >>> bool(((plan.owners("t", np.arange(1000)) == 0).mean() - 0.5) < 0.05)
        True
    """

    world_size: int
    tables: dict[str, TableSharding]
    _salts: dict[str, np.uint64] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if self.world_size < 1:
            raise ValueError(f"ShardingPlan: world_size must be >= 1, got {self.world_size}")
        for t in self.tables.values():
            bad = [r for r in ([t.rank] if t.rank is not None else list(t.ranks or ())) if not 0 <= r < self.world_size]
            if bad:
                raise ValueError(f"table '{t.name}': rank {bad[0]} outside 0..{self.world_size - 1}")

    def spec(self, table: str) -> TableSharding:
        if table not in self.tables:
            raise KeyError(f"the sharding plan has no table '{table}'; it has {sorted(self.tables)}")
        return self.tables[table]

    def owners(self, table: str, ids: np.ndarray) -> np.ndarray:
        """Owner rank [N] int64 of each ID of ``table``."""
        spec = self.spec(table)
        if spec.kind == "table_wise":
            return np.full(len(ids), spec.rank, dtype=np.int64)
        if table not in self._salts:
            self._salts[table] = table_salt(table)
        if spec.ranks is not None:
            return np.asarray(spec.ranks, dtype=np.int64)[hash_owners(ids, self._salts[table], len(spec.ranks))]
        return hash_owners(ids, self._salts[table], self.world_size)

    def owned(self, table: str, ids: np.ndarray, rank: int) -> np.ndarray:
        """Mask [N]: which ``ids`` of ``table`` ``rank`` owns (e.g. rows to keep from a checkpoint)."""
        return self.owners(table, ids) == rank

    def with_aliases(self, aliases: Mapping[str, str]) -> "ShardingPlan":
        """The plan plus tables placed like another (``{new name: planned name}``), e.g. a model's
        first-order (dim-1) tables beside the tables they shadow; their IDs hash by their own name."""
        extra = {new: TableSharding(new, self.spec(old).kind, self.spec(old).rank, ranks=self.spec(old).ranks)
                 for new, old in aliases.items()}
        return ShardingPlan(self.world_size, {**self.tables, **extra})

    def bytes_per_rank(self) -> list[float]:
        """Estimated table bytes on each rank (tables of unknown size count 0)."""
        out = [0.0] * self.world_size
        for t in self.tables.values():
            size = float((t.rows or 0) * t.record_bytes)
            if t.kind == "table_wise":
                out[t.rank] += size  # type: ignore[index]  # table_wise always has a rank
            else:
                over = t.ranks if t.ranks is not None else range(self.world_size)
                for r in over:
                    out[r] += size / len(over)
        return out

    def describe(self) -> str:
        """A table of the plan: one line per table, then the estimated bytes per rank."""
        lines = [f"sharding plan over {self.world_size} ranks:", f"  {'table':<24} {'kind':<11} {'rank':<5} {'est. rows':>12} {'est. bytes':>12}"]
        for t in self.tables.values():
            rows = "?" if t.rows is None else f"{t.rows:,}"
            size = "?" if t.rows is None else _human(t.rows * t.record_bytes)
            where = str(t.rank) if t.rank is not None else ("all" if t.ranks is None else _span(t.ranks))
            lines.append(f"  {t.name:<24} {t.kind:<11} {where:<5} {rows:>12} {size:>12}")
        per_rank = ", ".join(f"{r}: {_human(b)}" for r, b in enumerate(self.bytes_per_rank()))
        lines.append(f"  estimated table bytes per rank (known sizes only): {per_rank}")
        return "\n".join(lines)


def _span(ranks: tuple[int, ...]) -> str:
    """``0-3`` for consecutive ranks, else ``0,2``."""
    if list(ranks) == list(range(ranks[0], ranks[0] + len(ranks))) and len(ranks) > 1:
        return f"{ranks[0]}-{ranks[-1]}"
    return ",".join(map(str, ranks))


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"
