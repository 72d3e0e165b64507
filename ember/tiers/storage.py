"""StorageConfig (where one table's rows live), the memory/disk plan, and ``build_tier``.

A table's chain is ``[device cache] -> [host cache or host store] -> [disk]``: each tier that is
configured takes part; the last one holds every row. The default (nothing configured) is one
unbounded host tier, i.e. "all in host memory".
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Mapping, Sequence

import torch
from pydantic import Field, field_validator, model_validator

from ember.config_base import ConfigModel
from ember.errors import CapacityError
from ember.fileio import fmt_bytes as _fmt
from ember.fileio import free_bytes, nearest_existing
from ember.tiers.base import Tier
from ember.tiers.cached import CachedTier
from ember.tiers.device import DeviceTier, default_cache_device
from ember.tiers.disk import DiskTier, disk_slot_bytes
from ember.tiers.host import META_BYTES_PER_ROW, HostTier
from ember.tiers.policy import Policy

__all__ = ["StorageConfig", "StoragePlan", "build_tier", "plan_storage", "parse_bytes", "check_disk_together"]

_UNITS = {"": 1, "b": 1, "k": 1e3, "kb": 1e3, "kib": 2**10, "m": 1e6, "mb": 1e6, "mib": 2**20,
          "g": 1e9, "gb": 1e9, "gib": 2**30, "t": 1e12, "tb": 1e12, "tib": 2**40}


def parse_bytes(value: int | str) -> int:
    """``4096``, ``"512MiB"``, ``"1.5 GB"`` -> bytes.

    Examples:
        >>> parse_bytes("2KiB"), parse_bytes("1.5 GB"), parse_bytes(10)
        (2048, 1500000000, 10)
    """
    if isinstance(value, int):
        return value
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", str(value))
    if not m or m.group(2).lower() not in _UNITS:
        raise ValueError(f"not a byte size: {value!r} (use e.g. 4096, '512MiB', '2GB', '1TiB')")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


class StorageConfig(ConfigModel):
    """Where one table's records live: tiers, their budgets, and the cache policy.

    Budgets are rows (``*_rows``) or bytes (``*_bytes``, e.g. ``"2GiB"``), not both. A tier is
    present when it has a budget (device, host) or a path (disk). Without a disk tier the host
    tier holds every row (unbounded unless given a budget, which then caps the table); with a
    disk tier the host tier, if budgeted, caches the disk.

    Examples:
        >>> s = StorageConfig(device_rows=1000, host_bytes="64MiB", disk_path="/tmp/ember-disk")
        >>> [t for t, _, _ in plan_storage(s, record_dim=17).tiers]
        ['device', 'host', 'disk']
    """

    device_rows: int | None = Field(None, gt=0)
    """Device cache size in rows (on the GPU when present, else a host-memory cache). Under `index: device`: copies
    of the rows read most, kept in device memory (a table group's budgets summed, chosen by access counts)."""
    device_bytes: int | str | None = None
    """Device cache size in bytes, e.g. `256MiB`; give rows or bytes, not both."""
    device: Literal["auto", "cuda", "cpu"] = "auto"
    """Where the device cache lives: `auto`, `cuda` or `cpu`."""
    host_rows: int | None = Field(None, gt=0)
    """Host-memory rows: with a disk tier a cache in front of it, without one a hard cap; unset: unbounded."""
    host_bytes: int | str | None = None
    """Host-memory budget in bytes, e.g. `8GiB`; give rows or bytes, not both."""
    disk_path: str | None = None
    """Enables the disk tier; its files go to `<disk_path>/<table name>/`."""
    disk_rows: int = Field(1 << 20, gt=0)
    """Rows the disk file is sized for; beyond, it grows by rewriting."""
    disk_max_load: float = Field(0.85, ge=0.5, le=0.95)
    """Slot occupancy before the disk file grows (0.5 to 0.95)."""
    policy: Policy = "lfu"
    """What a cache evicts: `lru` (oldest access) or `lfu` (fewest accesses)."""
    admit_after: int = Field(2, ge=1)
    """Misses before an ID is promoted into a faster tier."""
    index: Literal["auto", "host", "device"] = "auto"
    """Where the ID -> row index lives: `auto` (a run picks `device` when its model trains on a GPU and the table has
    no host budget or disk tier, nor a device cache with `policy: lru` or `admit_after`; else `host`; it logs the
    choice), `host`, or `device` (for a model on a GPU: every row in pinned host memory, found, read and written by
    the GPU itself, with no host work per ID; a device budget keeps copies of the rows read most in GPU memory; not
    with a host budget or a disk tier). An `EmbeddingCollection` built outside a run takes `auto` as `host`."""

    @field_validator("device_bytes", "host_bytes")
    @classmethod
    def _bytes(cls, v: int | str | None) -> int | str | None:
        if v is not None and parse_bytes(v) <= 0:
            raise ValueError("must be > 0 bytes")
        return v

    @model_validator(mode="after")
    def _one_budget(self) -> "StorageConfig":
        for t in ("device", "host"):
            if getattr(self, f"{t}_rows") is not None and getattr(self, f"{t}_bytes") is not None:
                raise ValueError(f"give {t}_rows or {t}_bytes, not both")
        if self.index == "device":
            other = [b for b in self.budgets() if b not in HOT_BUDGETS]
            if other:
                raise ValueError(f"index: device keeps every row in (pinned) host memory, indexed on the device; it does not "
                                 f"combine with {', '.join(other)} (remove them, or use index: host)")
            unused = self._hot_unused()
            if unused and any(getattr(self, b) is not None for b in HOT_BUDGETS):
                raise ValueError(f"index: device keeps the rows read most in device memory (device_rows / device_bytes), "
                                 f"chosen by access counts; {unused} applies to the host index's cache only (remove it, "
                                 f"or use index: host)")
        return self

    def _hot_unused(self) -> str:
        """The cache options set that the device index's hot rows do not take ('' for none)."""
        if self.policy != "lfu":
            return f"policy: {self.policy}"
        return "admit_after" if "admit_after" in self.model_fields_set else ""

    def device_budget_only(self) -> bool:
        """Whether the table's only budget is a device one (``device_rows`` / ``device_bytes``): the
        device index's hot rows, or the host index's device cache in front of host memory."""
        budgets = self.budgets()
        return bool(budgets) and all(b in HOT_BUDGETS for b in budgets)

    @property
    def tiered(self) -> bool:
        return self.device_rows is not None or self.device_bytes is not None or self.disk_path is not None

    def budgets(self) -> list[str]:
        """The options set that give the table a device cache, a host budget or a disk tier (what
        ``index: device`` refuses and ``auto`` keeps on the host index)."""
        return [k for k in ("device_rows", "device_bytes", "host_rows", "host_bytes", "disk_path") if getattr(self, k) is not None]

    def index_for(self, model_device: torch.device) -> tuple[Literal["host", "device"], str]:
        """The index a run whose model trains on ``model_device`` uses, and why (``auto``'s choice).

        Examples:
            >>> StorageConfig().index_for(torch.device("cuda"))[0], StorageConfig().index_for(torch.device("cpu"))[0]
            ('device', 'host')
            >>> StorageConfig(host_rows=10).index_for(torch.device("cuda"))
            ('host', 'the table has host_rows')
        """
        if self.index != "auto":
            return self.index, f"storage.index: {self.index}"
        if model_device.type != "cuda":
            return "host", f"the model trains on the {model_device.type}"
        if self.device == "cpu":
            return "host", "storage.device: cpu"
        budgets = self.budgets()
        if budgets and not self.device_budget_only():
            return "host", f"the table has {', '.join(budgets)}"
        unused = self._hot_unused()
        if budgets and unused:
            return "host", f"the table has {', '.join(budgets)} with {unused}"
        if budgets:
            return "device", (f"the model trains on a GPU and every row of the table stays in host memory, the rows read "
                              f"most also in GPU memory ({budgets[0]})")
        return "device", "the model trains on a GPU and every row of the table stays in host memory"


HOT_BUDGETS = ("device_rows", "device_bytes")  # the budgets index: device takes, as its hot rows in device memory


def hot_rows(storage: StorageConfig, record_dim: int, name: str = "table") -> int:
    """The rows of an ``index: device`` table's device budget (0 without one): its share of its
    group's hot rows in device memory (``ember.tiers.hot_rows``)."""
    return _rows_for(storage.device_bytes, storage.device_rows, record_dim, "device_bytes", name) or 0


def memory_row_bytes(record_dim: int, rows: int) -> int:
    """Bytes a memory tier of ``rows`` records takes: arena + policy metadata + key index."""
    buckets = 1 << max(4, math.ceil(math.log2(max(rows, 16) / 0.75)))  # as KeyIndex sizes itself
    return rows * (4 * record_dim + META_BYTES_PER_ROW) + 12 * buckets


def _rows_for(budget: int | str | None, rows: int | None, record_dim: int, key: str, name: str) -> int | None:
    if rows is not None:
        return rows
    if budget is None:
        return None
    b = parse_bytes(budget)
    lo, hi = 0, b // (4 * record_dim) + 1
    while lo < hi:  # most rows whose full footprint fits the budget
        mid = (lo + hi + 1) // 2
        if memory_row_bytes(record_dim, mid) <= b:
            lo = mid
        else:
            hi = mid - 1
    if lo == 0:
        raise CapacityError(f"table '{name}': storage.{key} = {b} bytes cannot hold one row of {record_dim} floats "
                            f"and its index; raise it, or set storage.{key.replace('_bytes', '_rows')} instead")
    return lo


@dataclass
class StoragePlan:
    """What a table's tiers will take, computed before anything is allocated."""

    name: str
    tiers: list[tuple[str, int | None, str]] = field(default_factory=list)  # (tier, rows, place)
    host_bytes: int = 0
    device_bytes: int = 0
    disk_bytes: int = 0
    disk_path: str | None = None
    host_unbounded: bool = False
    record_dim: int = 0

    def describe(self) -> str:
        """One line per tier, e.g. for the trainer to print before it starts."""
        lines = [f"table '{self.name}' (record {self.record_dim} words = {4 * self.record_dim} B):"]
        for tier, rows, place in self.tiers:
            lines.append(f"  {tier:<6} {'unbounded' if rows is None else f'{rows:,} rows':>18}  {place}")
        grow = ""
        if self.host_unbounded:
            per = memory_row_bytes(self.record_dim, 1 << 20) / (1 << 20)
            grow = f" + ~{per:.0f} B per row as the table grows"
        lines.append(
            f"  total: host {_fmt(self.host_bytes)}{grow}, device {_fmt(self.device_bytes)}, "
            f"disk {_fmt(self.disk_bytes)}"
        )
        return "\n".join(lines)

    def reclaimable(self) -> int:
        """Bytes of this table's old disk-tier file, which a fresh tier replaces."""
        existing = Path(self.disk_path) / self.name / "slots.bin" if self.disk_path is not None else None
        return existing.stat().st_size if existing is not None and existing.exists() else 0

    def check(self) -> None:
        """Raise CapacityError (naming every budget that does not fit) before anything is allocated."""
        problems = []
        avail = mem_available()
        if avail is not None and self.host_bytes > avail:
            problems.append(
                f"its tiers need {_fmt(self.host_bytes)} of host memory but only {_fmt(avail)} is "
                "available; lower storage.host_rows/host_bytes (or disk_rows: its index takes 2 B per slot)"
            )
        if self.device_bytes and torch.cuda.is_available():
            free, _ = torch.cuda.mem_get_info()
            if self.device_bytes > free:
                problems.append(
                    f"its device cache needs {_fmt(self.device_bytes)} of GPU memory but "
                    f"{_fmt(free)} is free; lower storage.device_rows/device_bytes"
                )
        if self.disk_path is not None:
            free = free_bytes(self.disk_path) + self.reclaimable()
            if self.disk_bytes > free:
                problems.append(
                    f"its disk tier needs {_fmt(self.disk_bytes)} at {self.disk_path} but "
                    f"{_fmt(free)} is free there; free space, point storage.disk_path at a larger "
                    "volume or lower storage.disk_rows"
                )
        if problems:
            raise CapacityError(f"table '{self.name}': " + "; and ".join(problems))


def check_disk_together(plans: Sequence[StoragePlan]) -> None:
    """Raise CapacityError when the disk tiers of several tables fit one by one but not together
    on their volume, before any file exists (else the first tables' files would fill the disk
    and a later table's own check would fail with their files left behind)."""
    by_volume: dict[int, list[StoragePlan]] = {}
    for plan in plans:
        if plan.disk_path is not None:
            by_volume.setdefault(nearest_existing(plan.disk_path).stat().st_dev, []).append(plan)
    for group in by_volume.values():
        need = sum(p.disk_bytes for p in group)
        free = free_bytes(group[0].disk_path) + sum(p.reclaimable() for p in group)  # type: ignore[arg-type]
        if len(group) > 1 and need > free:
            each = ", ".join(f"'{p.name}' {_fmt(p.disk_bytes)} at {p.disk_path}" for p in group)
            raise CapacityError(
                f"the disk tiers of tables {each} need {_fmt(need)} together on one volume but {_fmt(free)} is "
                "free there; free space, point some storage.disk_path at another volume or lower storage.disk_rows")


def _sketch_bytes(cache_rows: int) -> int:
    """The admission sketch of a cache: 4 rows of uint16 counters, width 8x the cache rows
    (power of 2), as ``CountMinSketch`` sizes itself."""
    return 4 * 2 * (1 << max(4, math.ceil(math.log2(max(8 * cache_rows, 16)))))


def mem_available() -> int | None:
    """This machine's available memory in bytes (``MemAvailable``), or None where unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _device(storage: StorageConfig) -> torch.device:
    if storage.device == "auto":
        return default_cache_device()
    if storage.device == "cuda" and not torch.cuda.is_available():
        raise CapacityError("storage.device is 'cuda' but no GPU is visible; use device: auto or cpu")
    return torch.device(storage.device)


def plan_storage(storage: StorageConfig, record_dim: int, name: str = "table") -> StoragePlan:
    """The memory and disk ``build_tier`` will use for this table, without allocating anything.

    Examples:
        >>> print(plan_storage(StorageConfig(host_rows=1000), record_dim=17, name="t").describe())
        table 't' (record 17 words = 68 B):
          host           1,000 rows  host store (caps the table), 110.91 KiB
          total: host 110.91 KiB, device 0 B, disk 0 B
    """
    if isinstance(storage, Mapping):
        storage = StorageConfig.parse(storage, where="storage")
    if not isinstance(storage, StorageConfig):
        raise TypeError(f"plan_storage: storage must be a StorageConfig (or its keys as a dict), got {type(storage).__name__}")
    if isinstance(record_dim, bool) or not isinstance(record_dim, int) or record_dim < 1:
        raise ValueError(f"plan_storage: record_dim must be a whole number of floats >= 1, got {record_dim!r}")
    plan = StoragePlan(name=name, record_dim=record_dim, disk_path=storage.disk_path)
    if storage.index == "device":
        dev = _device(storage)
        hot = hot_rows(storage, record_dim, name)
        if hot:  # copies of the rows read most, in device memory (and a map and counts per host row there)
            arena = (hot + 1) * 4 * record_dim
            if dev.type == "cuda":
                plan.device_bytes += arena
            else:
                plan.host_bytes += arena
            plan.tiers.append(("device", hot, f"{dev.type} copies of the rows read most, {_fmt(arena)}"))
        plan.tiers.append(("host", None, f"host store{' (pinned)' if dev.type == 'cuda' else ''}, indexed on the {dev.type}"))
        plan.host_unbounded = True
        return plan
    dev_rows = _rows_for(storage.device_bytes, storage.device_rows, record_dim, "device_bytes", name)
    host_rows = _rows_for(storage.host_bytes, storage.host_rows, record_dim, "host_bytes", name)
    if dev_rows is not None:
        dev = _device(storage)
        b = memory_row_bytes(record_dim, dev_rows)
        arena = dev_rows * 4 * record_dim
        if dev.type == "cuda":  # the records on the GPU; the index and the policy's counters on the host
            plan.device_bytes += arena
            plan.host_bytes += b - arena
            size = f"{_fmt(arena)} on the GPU + {_fmt(b - arena)} of host index"
        else:
            plan.host_bytes += b
            size = _fmt(b)
        plan.tiers.append(("device", dev_rows, f"{dev.type} cache, {storage.policy}, {size}"))
        plan.host_bytes += _sketch_bytes(dev_rows)
    if host_rows is not None:
        b = memory_row_bytes(record_dim, host_rows)
        plan.host_bytes += b
        role = f"cache, {storage.policy}" if storage.disk_path else "store (caps the table)"
        plan.tiers.append(("host", host_rows, f"host {role}, {_fmt(b)}"))
        if storage.disk_path:
            plan.host_bytes += _sketch_bytes(host_rows)
    elif storage.disk_path is None:
        plan.tiers.append(("host", None, "host store"))
        plan.host_unbounded = True
    if storage.disk_path is not None:
        n_slots = max(64, -(-storage.disk_rows * 100 // int(storage.disk_max_load * 100)))
        plan.disk_bytes = n_slots * disk_slot_bytes(record_dim)
        plan.host_bytes += 2 * n_slots  # the tag array
        where = os.path.join(storage.disk_path, name)
        plan.tiers.append(("disk", storage.disk_rows, f"{where}, {_fmt(plan.disk_bytes)} file, {_fmt(2 * n_slots)} RAM index"))
    return plan


def build_tier(storage: StorageConfig, record_dim: int, name: str = "table") -> Tier:
    """Check the plan (CapacityError up front), then build the table's chain of tiers.

    Examples:
        >>> t = build_tier(StorageConfig(device_rows=4, device="cpu"), record_dim=3)
        >>> type(t).__name__, t.fast.capacity
        ('CachedTier', 4)
    """
    plan = plan_storage(storage, record_dim, name)
    plan.check()
    if storage.index == "device":
        from ember.tiers.mapped_rows import MappedRows, MappedTier  # (a leaf: tiers import storage)

        tier = MappedTier(MappedRows(record_dim, _device(storage), capacity=1024))
        tier.hot_rows = hot_rows(storage, record_dim, name)  # (made by the table group: ``MappedRows.keep_hot``)
        return tier
    rows = {tier: n for tier, n, _ in plan.tiers}  # the plan's rows per tier (a byte budget's, found once)
    dev_rows, host_rows = rows.get("device"), rows.get("host")
    last: Tier
    if storage.disk_path is not None:
        last = DiskTier(
            Path(storage.disk_path) / name, record_dim, rows=storage.disk_rows, max_load=storage.disk_max_load
        )
        if host_rows is not None:
            last = CachedTier(_named(HostTier(record_dim, capacity=host_rows, policy=storage.policy), name), last,
                              storage.admit_after)
    else:
        last = _named(HostTier(record_dim, capacity=host_rows, policy=storage.policy), name)
    if dev_rows is not None:
        dev = _named(DeviceTier(record_dim, capacity=dev_rows, policy=storage.policy, device=_device(storage)), name)
        last = CachedTier(dev, last, storage.admit_after)
    return last


def _named(tier: HostTier, table: str) -> HostTier:
    """``tier``, naming ``table`` in its errors."""
    tier.table = table
    return tier
