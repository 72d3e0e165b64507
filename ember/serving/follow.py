"""SeriesSource: serve the newest state of a training run's export series (full + deltas).

``ember serve --export RUN/exports`` follows the directory ``ember.checkpoint.delta`` writes:
it loads the newest full export, then applies each later delta in number order. Every
version is built off to the side (files verified against the manifest's sha256 first, tables
as ``OverlayTable``s sharing the full export's rows, the delta's dense model loaded) and then
served by one reference assignment, so a request is scored by the model before or after a
delta, never by half of one; its response names the version (the export's directory name,
e.g. ``000007-delta``). A newer full export replaces everything (the overlay starts again).

Faults: a directory without a manifest is not an export yet (skipped). A damaged or
incomplete delta (a file missing, a checksum that does not match) is logged as an error and
the version before it stays served; the deltas after it build on it, so they are skipped
until the next full export, which is served when it appears. A damaged full export is logged
and skipped. An export the trainer pruned while it was being read is simply looked for again.
A run started again in the same directory (its numbering restarts) is noticed when the served
full export is gone and only lower numbers remain: its newest full export is served.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

from ember.checkpoint.atomic import sha256_file
from ember.checkpoint.delta import SeriesEntry, series_entries
from ember.errors import CheckpointError, EmberError
from ember.serving.overlay import OverlayTable
from ember.serving.predictor import Predictor, read_rows
from ember.serving.source import PolledSource, Served

__all__ = ["SeriesSource"]

log = logging.getLogger(__name__)


class SeriesSource(PolledSource):
    """The served version of an export series, advanced by ``refresh`` (polled by ``start``).

    A ``PolledSource`` like ``ember.serving.server.ModelSource`` (``current``, ``refresh()``,
    ``start()``, ``stop()``, ``root``, ``served``), plus ``info()`` for the
    health endpoint (base, applied, overlay size, last apply time).
    """

    thread_name = "ember-serve-follow"

    def __init__(self, root: str | Path, poll_s: float = 2.0, trust_torchscript: bool = False) -> None:
        super().__init__(root, poll_s, trust_torchscript)
        self.current: Any = None
        self.base: int | None = None  # number of the full export served
        self.applied: int | None = None  # number of the newest export applied (full or delta)
        self.stuck: str | None = None  # the damaged delta the chain stopped at, until the next full
        self.failed: set[str] = set()  # damaged full exports, never retried
        self.last_apply_s: float | None = None
        self.history: list[tuple[str, float]] = []  # (version, seconds to build it) of every version served
        self.refresh()
        if self.current is None:
            raise CheckpointError(f"{self.root}: no complete full export to serve (a NNNNNN-full directory with a "
                                  "manifest.json); train with export.every_steps or export.every_s, or give an "
                                  "export directory made by `ember export`")

    def refresh(self) -> bool:
        """Serve the newest full export and apply the deltas after it, one version at a time;
        True when a new version is served."""
        entries = series_entries(self.root)
        changed = False
        fulls = [e for e in entries if e.kind == "full" and e.path.name not in self.failed]
        # the served full export gone and only older numbers there: the run was started again
        restarted = (self.base is not None and bool(fulls) and fulls[-1].number < self.base
                     and not any(e.number == self.base for e in entries))
        if restarted:
            log.warning("serve: the exports in %s were replaced by a new run (export %d is gone); serving "
                        "its newest full export %s", self.root, self.base, fulls[-1].path.name)
        if fulls and (self.base is None or fulls[-1].number > self.base or restarted):
            changed = self._load_full(fulls[-1])
        if self.base is None or self.stuck is not None:
            return changed
        for e in entries:
            if e.kind != "delta" or e.number <= (self.applied or 0):
                continue
            if e.number != (self.applied or 0) + 1:
                break  # not there yet (or pruned: a newer full export will follow)
            if not self._apply(e):
                break
            changed = True
        return changed

    def _publish(self, predictor: Predictor, entry: SeriesEntry, t0: float) -> None:
        self.current = Served(predictor, entry.path.name)  # one reference assignment
        self.applied = entry.number
        self.last_apply_s = time.perf_counter() - t0
        self.history.append((entry.path.name, self.last_apply_s))
        log.info("serve: now serving version %s (built in %.3f s)", entry.path.name, self.last_apply_s)

    def _load_full(self, entry: SeriesEntry) -> bool:
        t0 = time.perf_counter()
        try:
            p = Predictor.load(entry.path, trust_torchscript=self.trust_torchscript)
            p.tables = {name: OverlayTable(t) for name, t in p.tables.items()}
        except (OSError, ValueError, EmberError) as e:
            if entry.path.exists():
                self.failed.add(entry.path.name)
                log.error("serve: full export %s is damaged (%s); skipping it, still serving version %s",
                          entry.path, e, self.current.version if self.current else None)
            return False
        self.base, self.stuck = entry.number, None
        self._publish(p, entry, t0)
        return True

    def _apply(self, entry: SeriesEntry) -> bool:
        t0 = time.perf_counter()
        try:
            predictor = self._build(entry)
        except (OSError, ValueError, KeyError, EmberError) as e:
            if not entry.path.exists():
                return False  # pruned while read: the newer full export is picked up next time
            self.stuck = entry.path.name
            log.error("serve: delta export %s is damaged or incomplete (%s); still serving version %s; the "
                      "deltas after it build on it, so they are skipped until the next full export",
                      entry.path, e, self.current.version)
            return False
        self._publish(predictor, entry, t0)
        return True

    def _build(self, entry: SeriesEntry) -> Predictor:
        """The next version: the served tables with delta ``entry`` applied, its dense model."""
        root = entry.path
        manifest = json.loads((root / "manifest.json").read_text())
        series = manifest.get("series") or {}
        if series.get("base") != self.base or series.get("previous") != self.applied:
            raise CheckpointError(f"it builds on export {series.get('base')} after {series.get('previous')}, "
                                  f"but the served state is export {self.base} after {self.applied}")
        for rel, digest in manifest["files"].items():
            if sha256_file(root / rel) != digest:
                raise CheckpointError(f"{rel} does not match its sha256 in the manifest")
        served = self.current.predictor.tables
        names = {t["name"] for t in manifest["tables"]}
        if names != set(served):
            raise CheckpointError(f"its tables {sorted(names)} are not the served ones {sorted(served)}")
        tables = {}
        for meta in manifest["tables"]:
            old: OverlayTable = served[meta["name"]]
            ids, weights, seen = read_rows(root, meta["name"], meta["rows"], meta["dim"], meta.get("dtype", "fp32"),
                                           old.ttl is not None)
            removed = read_removed(root, meta)
            tables[meta["name"]] = old.with_delta(ids, weights, seen, removed, meta.get("step"))
        return Predictor(root, manifest, tables=tables, trust_torchscript=self.trust_torchscript)

    def info(self) -> dict[str, Any]:
        """Health details: the full export served, the newest export applied, overlay size."""
        tables = self.current.predictor.tables.values()
        return {"base": self.base, "applied": self.applied, "stuck_at": self.stuck,
                "overlay_rows": sum(t.overlay_rows for t in tables),
                "overlay_bytes": sum(t.overlay_bytes for t in tables), "last_apply_s": self.last_apply_s}


def read_removed(root: Path, meta: dict[str, Any]) -> Any:
    """The IDs a delta removed from table ``meta['name']``."""
    import numpy as np

    n = int(meta.get("removed", 0))
    ids = np.fromfile(root / "tables" / f"{meta['name']}.removed", dtype="<i8") if n else np.empty(0, np.int64)
    if ids.size != n:
        raise CheckpointError(f"tables/{meta['name']}.removed holds {ids.size} IDs, the manifest says {n}")
    return ids
