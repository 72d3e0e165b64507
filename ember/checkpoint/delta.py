"""Delta exports while training: a numbered series of exports a server can follow.

Layout of ``<run>/exports/`` (``export:`` section, ``ExportConfig``)::

    000001-full/     a full export (``export_model``), plus ``series`` and ``step`` in its manifest
    000002-delta/    manifest.json  dense.pt  model.pt  tables/<name>.ids .weights [.seen] .removed
    000003-delta/
    ...
    000012-full/     again every ``full_every`` deltas; the first export of a run is always full

A delta holds, per table, the rows written since the previous export (updated, or admitted
after ``min_count``) with their IDs sorted, the IDs whose rows were removed since then (TTL
sweeps; an ID written and removed again in between is listed as removed), and the whole dense
model. Its manifest records the table's ``step`` (TTL tables: a row last seen more than
``ttl_steps`` before it reads as absent, so rows that expire without a sweep leave the served
model too), the export it builds on (``base``, the full export) and ``previous`` (number - 1).
Applied in order onto the full export, deltas give exactly the model a full export at the
same step would hold (``ember.serving.overlay``).

Which rows changed comes from each table's ``ChangeLog`` (IDs its write-back stored, its bulk
loads and TTL sweeps noted); at export time those IDs' rows are read through the table's own
read path (``Tier.get_into``: any tier layout, a cache's reads count as accesses), in chunks.

Distributed (``dist``): every rank holds its shard of each table and the same dense model;
rank 0 writes the series. A full export gathers every rank's rows to rank 0, a delta every
rank's changed rows (each rank reads the IDs its own change log noted, through its own
tiers): the export is the one a one-process run writes after the same global batches. The
ranks call the exporter at the same steps (a time-based export is agreed on by the ranks
after each step: ``time_due`` / ``mark``, ``ember.train.agreement``). Rank 0 must hold the
largest table's rows (a full export) or its changed rows (a delta) in memory.

Crash safety: each export is written into a temporary directory (every file fsynced, the
manifest last, with the sha256 of every file), then renamed to its numbered name; a reader
ignores names that are not ``NNNNNN-full`` / ``NNNNNN-delta`` or that hold no manifest.
After each full export, exports older than the ``keep_full``-th newest full one are removed
(renamed aside first, so a half-removed directory never looks like an export).
"""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

import numpy as np
import torch
from torch import nn

from ember.checkpoint.config import ExportConfig
from ember.checkpoint.export import EXPORT_VERSION, RUN_CONFIG_KEYS, encode_weights, export_model, model_files, table_meta
from ember.checkpoint.atomic import HashingWriter
from ember.errors import CheckpointError
from ember.fileio import atomic_dir, fsync_dir
from ember.outputs import SERIES_NAME

__all__ = ["DeltaExporter", "SeriesEntry", "series_entries", "prune_series", "run_exporter", "CHUNK_ROWS"]

CHUNK_ROWS = 1 << 18  # rows read and written at a time by a delta export (bounded memory)


@dataclass(frozen=True)
class SeriesEntry:
    """One complete export of a series: its number, ``full`` or ``delta``, and its directory."""

    number: int
    kind: str
    path: Path


def series_entries(root: str | Path) -> list[SeriesEntry]:
    """The complete exports under ``root`` (numbered names holding a manifest), by number."""
    out = []
    try:
        names = os.listdir(root)
    except FileNotFoundError:
        return []
    for name in names:
        m = SERIES_NAME.match(name)
        if m and os.path.exists(os.path.join(root, name, "manifest.json")):
            out.append(SeriesEntry(int(m.group(1)), m.group(2), Path(root) / name))
    return sorted(out, key=lambda e: e.number)


def prune_series(root: str | Path, keep_full: int) -> list[Path]:
    """Remove the exports older than the ``keep_full``-th newest full export (never that one
    nor anything after it); returns what was removed."""
    entries = series_entries(root)
    fulls = [e.number for e in entries if e.kind == "full"]
    if len(fulls) <= keep_full:
        return []
    cutoff = fulls[-keep_full]
    removed = []
    for e in entries:
        if e.number < cutoff:
            aside = e.path.with_name(f".{e.path.name}.pruned-{os.getpid()}")
            os.rename(e.path, aside)  # no longer an export name: readers skip it at once
            shutil.rmtree(aside, ignore_errors=True)
            removed.append(e.path)
    return removed


class DeltaExporter:
    """Writes the export series of a training run (see the module docstring).

    The trainer asks ``due(step)`` when it plans its quiet points (a time-based export is
    decided when the step's batch is fetched, so the pipeline's fetch gate and the loop agree),
    and calls ``after_step(step)`` on a quiet engine (no update in flight) after every step;
    ``finish(step)`` exports the final state. Tables start logging their changes when the
    exporter is built; the first export is full.

    Args:
        config: the ``export:`` section.
        root: the series directory (``<run>/exports``); numbering continues after the exports
            already there (a resumed run), starting with a full export.
        model, collections, features, linear_features, task_names, run_config: as
            ``export_model`` takes them.
        clock: seconds, for ``every_s`` (tests replace it).
        dist: a distributed run's process group (``DistributedRun``; see the module docstring).
    """

    def __init__(self, config: ExportConfig, root: str | Path, model: nn.Module, collections: Sequence[Any],
                 features: Sequence[Any], linear_features: Sequence[Any] | None, task_names: Sequence[str],
                 run_config: Mapping[str, Any], clock: Callable[[], float] = time.monotonic, dist: Any = None) -> None:
        self.config, self.dist = config, dist
        self.writes = dist is None or dist.lead  # rank 0 writes a distributed run's series
        self.root = Path(root)
        self.parts = (model, list(collections), list(features), linear_features, list(task_names))
        self.run_config = {k: run_config[k] for k in RUN_CONFIG_KEYS}
        self.clock = clock
        self.number, self.base, self.since_full = 0, None, 0  # base: the full export the next delta builds on
        self.exported_step: int | None = None
        self.last = clock()
        self._due: set[int] = set()
        self.records: list[dict[str, Any]] = []  # per export: number, kind, step, seconds, bytes, rows, removed
        if not config.enabled:  # off: never due, nothing tracked or written
            return
        if self.writes:
            self.root.mkdir(parents=True, exist_ok=True)
            for leftover in self.root.glob(".*"):  # temporaries of a run killed mid-export
                shutil.rmtree(leftover, ignore_errors=True)
            done = series_entries(self.root)
            self.number = done[-1].number if done else 0
        if dist is not None:
            self.number = dist.broadcast(self.number)
        for t in self.tables():
            t.track_changes()

    def tables(self) -> list[Any]:
        return [t for ec in self.parts[1] for t in ec.tables.values()]

    # ---- when -------------------------------------------------------------------------------
    def due(self, step: int) -> bool:
        """Whether an export follows step ``step`` (idempotent: a time-based export, once
        decided for a step, stays due until written)."""
        c = self.config
        if not c.enabled:
            return False
        if step in self._due or (c.every_steps is not None and step % c.every_steps == 0):
            return True
        if self.dist is None and self.time_due():  # distributed: the ranks agree (``mark``)
            self._due.add(step)
            return True
        return False

    def time_due(self) -> bool:
        """Whether ``every_s`` passed since the last export, with none marked yet."""
        c = self.config
        return c.enabled and c.every_s is not None and not self._due and self.clock() - self.last >= c.every_s

    def mark(self, step: int) -> None:
        """Make an export due after ``step`` (distributed: agreed on by every rank)."""
        if self.config.enabled:
            self._due.add(step)

    def after_step(self, step: int) -> Path | None:
        """Export after ``step`` when it is due (call on a quiet engine); returns the export."""
        if not self.due(step):
            return None
        self._due.discard(step)
        return self.export(step)

    def finish(self, step: int) -> Path | None:
        """Export the state the run ends with, unless that step is exported already."""
        if not self.config.enabled or not self.config.final or self.exported_step == step:
            return None
        return self.export(step)

    # ---- what ---------------------------------------------------------------------------------
    def export(self, step: int) -> Path:
        """Write the next export of the series now: full when none was written by this exporter
        yet or ``full_every`` deltas followed the last full one, else a delta."""
        t0 = time.perf_counter()
        n = self.number + 1
        full = self.base is None or self.since_full >= self.config.full_every
        if full:
            for t in self.tables():
                t.changes.take()  # a full export holds every row: the changes so far are in it
            path = self.root / f"{n:06d}-full"
            model, collections, features, linear, tasks = self.parts
            collections = self._gathered(collections)  # distributed: every rank's rows, on rank 0
            if self.writes:
                export_model(model, collections, features, linear, tasks, self.run_config, path,
                             extra={"step": step, "series": {"kind": "full", "number": n, "base": n}})
            rows, removed = sum(len(t) for ec in collections for t in ec.tables.values()), 0
            self.base, self.since_full = n, 0
        else:
            path = self.root / f"{n:06d}-delta"
            try:
                if self.writes:
                    with atomic_dir(path, CheckpointError, None, "the previous exports are kept") as tmp:
                        rows, removed = self._write_delta(tmp, n, step)
                else:  # another rank: its changed rows go to rank 0
                    rows = removed = 0
                    for ec in self.parts[1]:
                        for name, table in ec.tables.items():
                            for _ in self._changed(ec, name, table):
                                pass
            except BaseException:
                self.base = None  # the change logs were taken: only a full export is complete next time
                raise
            self.since_full += 1
        self.number, self.exported_step, self.last = n, step, self.clock()
        if not self.writes:
            return path
        nbytes = sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
        self.records.append({"number": n, "kind": "full" if full else "delta", "step": step, "rows": rows,
                             "removed": removed, "bytes": nbytes, "seconds": time.perf_counter() - t0})
        if full:
            prune_series(self.root, self.config.keep_full)
        return path

    def _write_delta(self, tmp: Path, n: int, step: int) -> tuple[int, int]:
        """The files of delta ``n`` into ``tmp``, manifest last; returns (rows, removed IDs)."""
        model, collections, features, linear, tasks = self.parts
        (tmp / "tables").mkdir()
        files, model_inputs = model_files(model, tmp, collections, features, tasks, self.run_config)
        entries, total_rows, total_removed = [], 0, 0
        for ec in collections:
            for name, table in ec.tables.items():
                suffixes = ["ids", "weights", "removed"] + (["seen"] if table.ttl else [])
                out = {s: HashingWriter(tmp / "tables" / f"{name}.{s}") for s in suffixes}
                rows = removed = 0
                try:
                    for ids, keep, weights, seen in self._changed(ec, name, table):
                        out["ids"].write(ids[keep].astype("<i8").tobytes())
                        out["weights"].write(encode_weights(weights[keep], table.config.dtype).tobytes())
                        if seen is not None:
                            out["seen"].write(seen[keep].astype("<f4").tobytes())
                        out["removed"].write(ids[~keep].astype("<i8").tobytes())
                        rows += int(keep.sum())
                        removed += int((~keep).sum())
                finally:
                    for s, w in out.items():
                        files[f"tables/{name}.{s}"] = w.close()
                entries.append({**table_meta(name, table), "rows": rows, "removed": removed})
                total_rows += rows
                total_removed += removed
        manifest = {
            "format_version": EXPORT_VERSION,
            "step": step,
            "series": {"kind": "delta", "number": n, "base": self.base, "previous": n - 1},
            "data": self.run_config["data"], "schema": self.run_config["schema"],
            "features": [f.model_dump(mode="json") for f in features],
            "linear_features": [f.model_dump(mode="json") for f in linear] if linear is not None else None,
            "tables": entries, "tasks": list(tasks), "model": self.run_config["model"], "model_inputs": model_inputs,
            "files": files,
        }
        fsync_dir(tmp / "tables")
        mw = HashingWriter(tmp / "manifest.json")  # last: a directory without it is not an export
        try:
            mw.write(json.dumps(manifest, indent=1).encode())
        finally:
            mw.close()
        return total_rows, total_removed


    def _changed(self, ec: Any, name: str, table: Any) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]]:
        """The rows ``table`` changed since the last export, in chunks of ``CHUNK_ROWS`` IDs
        (sorted): (IDs, live mask, weights [n, dim], TTL last-seen steps or None). Distributed:
        every rank's (those it owns), gathered into one chunk on rank 0 (none elsewhere)."""
        ids = table.changes.take()
        if self.dist is None:
            for s in range(0, ids.size, CHUNK_ROWS):
                yield _changed_rows(table, ids[s : s + CHUNK_ROWS])
            return
        ids = ids[_owned(ec, name, ids, self.dist)]
        parts = self.dist.gather_to_lead(_changed_rows(table, ids))
        if parts is not None:
            whole = _cat(parts, table)
            order = np.argsort(whole[0], kind="stable")
            yield tuple(x[order] if x is not None else None for x in whole)  # type: ignore[misc]

    def _gathered(self, collections: list[Any]) -> list[Any]:
        """``collections`` as a full export reads them: distributed, every rank's rows of each
        table on rank 0 (``_Gathered``; empty elsewhere)."""
        if self.dist is None:
            return collections
        out = []
        for ec in collections:
            tables = {}
            for name, table in ec.tables.items():
                ttl = bool(getattr(table.config, "ttl_steps", None))
                chunks = list(table.items_with_seen() if ttl else ((i, r, None) for i, r in table.items()))
                ids = torch.cat([c[0] for c in chunks]).numpy() if chunks else np.empty(0, np.int64)
                w = torch.cat([c[1][:, : table.dim] for c in chunks]).numpy() if chunks else np.empty((0, table.dim), np.float32)
                seen = torch.cat([c[2] for c in chunks]).numpy() if ttl and chunks else np.empty(0, np.float32) if ttl else None
                own = _owned(ec, name, ids, self.dist)
                parts = self.dist.gather_to_lead((ids[own], w[own], seen[own] if seen is not None else None))
                if parts is None:
                    tables[name] = _Gathered(table, np.empty(0, np.int64), np.empty((0, table.dim), np.float32), None)
                    continue
                seen_all = np.concatenate([p[2] for p in parts]) if ttl else None
                tables[name] = _Gathered(table, np.concatenate([p[0] for p in parts]),
                                         np.concatenate([p[1] for p in parts]), seen_all)
            out.append(_GatheredCollection(tables))
        return out


class _Gathered:
    """A table's rows gathered from every rank, read as ``export_model`` reads a table (its
    other attributes are the local table's: every rank has the same config, seed and step)."""

    def __init__(self, table: Any, ids: np.ndarray, weights: np.ndarray, seen: np.ndarray | None) -> None:
        self._table, self._ids, self._weights, self._seen = table, ids, weights, seen

    def __getattr__(self, name: str) -> Any:
        return getattr(self._table, name)

    def __len__(self) -> int:
        return int(self._ids.size)

    def items(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        yield torch.from_numpy(self._ids), torch.from_numpy(self._weights)

    def items_with_seen(self) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]]:
        seen = torch.from_numpy(self._seen) if self._seen is not None else None
        yield torch.from_numpy(self._ids), torch.from_numpy(self._weights), seen


@dataclass
class _GatheredCollection:
    tables: dict[str, Any]


def _owned(ec: Any, name: str, ids: np.ndarray, dist: Any) -> np.ndarray:
    """Mask of the ``ids`` of table ``name`` whose rows this rank contributes: those it owns
    (a sharded collection), or all of them on rank 0 alone (a table every rank holds whole)."""
    owned = getattr(ec, "owned", None)
    if owned is None:
        return np.full(ids.size, bool(dist.lead))
    return owned(name, torch.from_numpy(ids)).numpy().astype(bool)


def _changed_rows(table: Any, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]:
    """(IDs, live mask, weights [n, dim], TTL last-seen steps or None) of ``ids`` now."""
    live, rec = _read_live(table, torch.from_numpy(ids))
    return ids, live.numpy(), rec[:, : table.dim].numpy(), rec[:, -1].numpy() if table.ttl else None


def _cat(parts: Sequence[tuple[Any, ...]], table: Any) -> tuple[Any, ...]:
    """Chunks of ``_changed_rows`` as one (a TTL table's last-seen steps too)."""
    return (np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]),
            np.concatenate([p[2] for p in parts]).reshape(-1, table.dim),
            np.concatenate([p[3] for p in parts]) if table.ttl else None)


def _read_live(table: Any, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(live mask [N], decoded records [N, stored_dim] on the CPU) of ``ids`` read through the
    table's tiers; an absent ID, or a TTL row older than ``ttl_steps``, is not live."""
    packed = torch.empty(ids.numel(), table.codec.words, device=table.tier.device)
    found = table.tier.get_into(ids, packed)
    rec = table.codec.decode(packed).cpu()
    live = found.clone()
    if table.ttl is not None and bool(live.any()):
        live &= table.step - rec[:, -1] <= table.ttl
    return live, rec


def run_exporter(config: ExportConfig, root: Path, parts: Any, run_config: Mapping[str, Any],
                 clock: Callable[[], float] = time.monotonic) -> DeltaExporter:
    """The exporter of a training run's parts (``ember.train.builder.Components``); with
    ``export`` off it is never due and tracks nothing. Distributed (``parts.dist``): rank 0
    writes every rank's rows (see the module docstring). ``clock``: seconds, for ``every_s``."""
    return DeltaExporter(config, root, parts.model, parts.collections(), parts.embeddings.features,
                         parts.linear.features if parts.linear is not None else None, parts.task_names, run_config,
                         clock=clock, dist=parts.dist)
