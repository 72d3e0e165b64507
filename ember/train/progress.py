"""The training progress bar: steps done of a total, ETA, loss, samples/s, the busiest stage.

The total comes from the data's source (``Source.count``): the synthetic split's rows, Parquet /
ORC row counts from the files' metadata (footers only), a query's count, an Iceberg table's
manifests, or, for CSV, an estimate refined as the file is read: total
bytes x rows read / bytes read, marked ``~`` until the epoch's files are read through (then
the count is exact, also for the epochs after it). The bar
moves every step, so short runs show it too; loss and the rest are refreshed at each log record.
"""

from __future__ import annotations

import math
from typing import Any

from ember.config import RunConfig
from ember.pipeline.loader import Loader, ReadCounter
from ember.source.config import DataConfig
from ember.source.protocol import source_for

__all__ = ["Progress", "hit_rate", "EpochRows", "epoch_rows", "estimate_rows", "planned_steps"]


class EpochRows:
    """Rows of one training epoch: ``rows`` exact, or estimated from ``total_bytes`` of CSV files."""

    def __init__(self, rows: int | None = None, total_bytes: int | None = None) -> None:
        self.rows, self.total_bytes = rows, total_bytes

    @property
    def exact(self) -> bool:
        return self.rows is not None


def epoch_rows(data: DataConfig) -> EpochRows:
    """The train split's rows per epoch as its source counts them without reading rows
    (``Source.count``): exact for synthetic data, Parquet and ORC footers, a query's COUNT, an
    Iceberg table's manifests; for CSV / TSV the files' total size, to estimate from."""
    count = source_for(data).count("train")
    return EpochRows(rows=count.rows, total_bytes=count.bytes)


def estimate_rows(total_bytes: int, bytes_read: int, rows_read: int) -> int | None:
    """Rows in ``total_bytes`` of CSV at the density read so far (None before any row is read).

    Example:
        >>> estimate_rows(1000, 250, 40), estimate_rows(1000, 0, 0), estimate_rows(1000, 1000, 161)
        (160, None, 161)
    """
    if bytes_read <= 0 or rows_read <= 0:
        return None
    if bytes_read >= total_bytes:
        return rows_read
    return round(rows_read * total_bytes / bytes_read)


def planned_steps(rows_per_epoch: int, batch_size: int, drop_last: bool, epochs: int, max_steps: int | None) -> int:
    """Steps of a run: batches per epoch times epochs, capped at ``max_steps``.

    Example:
        >>> planned_steps(1000, 256, False, 2, None), planned_steps(1000, 256, True, 2, None), planned_steps(1000, 256, False, 2, 5)
        (8, 6, 5)
    """
    per_epoch = rows_per_epoch // batch_size if drop_last else math.ceil(rows_per_epoch / batch_size)
    total = per_epoch * epochs
    return total if max_steps is None else min(total, max_steps)


def hit_rate(rec: dict[str, Any], tier: str) -> float | None:
    """A tier's hit rate over every table of a log record: hits over requests summed (a busy
    table weighs as much as its lookups; one the window never asked has no rate to average in),
    None when no table asked ``tier`` anything.

    Example:
        >>> rec = {"a/tier.disk.hits": 3.0, "a/tier.disk.requests": 4.0, "b/tier.disk.hits": 0.0,
        ...        "b/tier.disk.requests": 0.0, "b/tier.disk.hit_rate": float("nan")}
        >>> hit_rate(rec, "disk"), hit_rate(rec, "host")
        (0.75, None)
    """
    hits = requests = 0.0
    for k, v in rec.items():
        if k.endswith(f"tier.{tier}.requests") and v:
            requests += v
            hits += rec.get(k[: -len("requests")] + "hits", 0.0)
    return hits / requests if requests else None


class Progress:
    """tqdm bar over the run's steps (quiet when disabled). ``watch`` a CSV epoch's loader to
    refine the estimated total as it reads."""

    _EXACT = "{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}<{remaining}, {rate_fmt}{postfix}]"
    _ESTIMATE = "{l_bar}{bar}| {n_fmt}/~{total_fmt} [{elapsed}<~{remaining}, {rate_fmt}{postfix}]"

    def __init__(self, cfg: RunConfig, step: int = 0, rows: EpochRows | None = None, enabled: bool = True) -> None:
        """``rows``: the epoch's rows when known otherwise (batches held in memory); default:
        from ``cfg.data``. ``enabled``: False keeps it quiet whatever ``train.progress`` says
        (ranks other than 0)."""
        t, d = cfg.train, cfg.data
        self.bar: Any = None
        self.last = step
        show = t.progress and enabled
        self.rows = rows or (epoch_rows(d) if show else EpochRows())
        self._plan = (d.split_batch_size("train"), d.drop_last, t.epochs, t.max_steps)
        self._loader: Loader | None = None
        if show:
            from tqdm import tqdm

            total = self._total(self.rows.rows) if self.rows.exact else t.max_steps
            self.bar = tqdm(total=total, initial=step, unit="step", dynamic_ncols=True,
                            bar_format=self._EXACT if self.rows.exact or total is None else self._ESTIMATE)

    def _total(self, rows: int) -> int:
        return planned_steps(rows, *self._plan)

    def watch(self, loader: Loader) -> None:
        """The loader of the epoch now training (its read counter refines a CSV estimate)."""
        self._loader = loader

    def advance(self, step: int) -> None:
        """After each step (cheap: tqdm redraws at most every 0.1 s)."""
        if self.bar is not None:
            if not self.rows.exact and self._loader is not None and self.rows.total_bytes is not None \
                    and hasattr(self._loader, "read"):
                read: ReadCounter = self._loader.read
                est = estimate_rows(self.rows.total_bytes, read.bytes, read.rows)
                if est is not None:
                    done = read.finished
                    self.bar.total = self._total(est)
                    self.bar.bar_format = self._EXACT if done else self._ESTIMATE
                    if done:  # read through once: later epochs have as many rows
                        self.rows = EpochRows(rows=est)
            self.bar.update(step - self.last)
        self.last = step

    def update(self, step: int, rec: dict[str, Any]) -> None:
        """At a log record: move to ``step`` and show loss, samples/s, the busiest stage and hit rates."""
        self.advance(step)
        if self.bar is not None:
            post = {"loss": f"{rec['loss']:.4f}", "sps": f"{rec['samples_per_s']:.0f}"}
            busy = {k.split(".")[2]: v for k, v in rec.items() if k.startswith("pipeline.stage.")}
            if busy:  # the busiest stage is the bottleneck
                name = max(busy, key=busy.__getitem__)
                post["busiest"] = f"{name} {busy[name]:.0%}"
            for tier in ("device", "host", "disk"):
                rate = hit_rate(rec, tier)
                if rate is not None:
                    post[f"{tier}_hit"] = f"{rate:.2f}"
            self.bar.set_postfix(post)

    def note(self, text: str) -> None:
        if self.bar is not None and text:
            self.bar.write(text)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
