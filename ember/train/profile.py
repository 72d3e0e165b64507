"""``ember profile``: what the training data holds, read exactly as training reads it.

The rows come from the run config's ``data.train`` (files through the same readers, or the
synthetic generator), through the same :class:`~ember.featurize.featurizer.Featurizer` and
schema, so hashed IDs, missing values, ``max_length`` and bad rows are what training sees. Bad
rows are always counted per reason (as ``data.on_bad_rows: skip`` would); the profile says when
the config's ``error`` policy would stop training at the first of them. Only the first
``rows`` rows are read when given (file order; training's shuffle does not change counts).

Per label: its rate. Per sparse feature (its IDs as training hashes them): distinct IDs (exact
up to a bound, then an estimate with its standard error: ``ember.train.sketches``), the most
frequent values (their raw text, count and error), the share of rows without a value, values
per row. Per dense feature (raw values, before transforms): min / max / mean, missing and
quantiles. Per table (the union of its features' IDs): distinct IDs and how often each was
seen (sightings: once per batch, as a run counts them, when its batches are the rows in file
order, ``data.shuffle_buffer: 0`` or synthetic data; else once per occurrence, an upper bound),
which ``ember plan`` turns into rows with ``min_count`` and the run's epochs; with
``ttl_steps``, the most distinct IDs in a window of ``2 * ttl_steps * batch_size`` rows (windows aligned
at multiples of that size: the peak of a sliding window may be a little higher).

``write_profile`` writes ``profile.json`` (``FORMAT``, version ``VERSION``), ``profile.txt``
(the table ``describe`` prints) and ``profile.png`` (the distributions) into one directory.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ember.config import RunConfig
from ember.errors import ConfigError, WriteError
from ember.featurize.canonical import hashed_id_types
from ember.featurize.featurizer import Featurizer, _jagged
from ember.featurize.hashing import hash_array
from ember.featurize.schema import SparseFeature
from ember.featurize.transforms import parse_floats, parse_ints
from ember.fileio import write_bytes_atomic
from ember.source.bad_rows import BadRowReport
from ember.source.protocol import source_for
from ember.source.synthetic import split_rows
from ember.train.preflight import check_data
from ember.train.sketches import BottomK, DistinctCounter, HeavyHitters

__all__ = ["FORMAT", "VERSION", "QUANTILES", "profile_data", "describe", "write_profile", "read_profile"]

FORMAT = "ember-profile"
VERSION = 1
QUANTILES = [0.0, 0.01, 0.05, 0.25, 0.5, 0.75, 0.95, 0.99, 1.0]
_ROW = "__ember_profile_row"  # a column added to each block: which rows the featurizer kept
_FREQ_CAP = 64  # sighting counts kept per table, for min_count up to this (times the epochs)


def _blocks(cfg: RunConfig, report: BadRowReport) -> Iterator[tuple[pa.RecordBatch, str, Any]]:
    """The training split's record blocks as training reads them, in the source's order (a
    query in key order; a watched ``data.train``: the units there now): ``(block, unit, first_row)``."""
    data = cfg.data
    if not data.holds("train"):
        raise ConfigError("data.train is not set; ember profile reads the training data: give data.train files")
    check_data(data, cfg.schema.columns, "train")  # paths, columns, rows checked before reading
    source = source_for(data)
    at = source.start("train", None, True, False)
    for unit in source.units("train", at):
        for chunk in source.open(unit, cfg.schema.columns, report, at):
            yield chunk.batch, chunk.file, chunk.row_numbers


class _Sparse:
    """What the profile keeps of one sparse feature."""

    def __init__(self, f: SparseFeature, counter: DistinctCounter, top: int) -> None:
        self.f, self.counter = f, counter
        self.hitters = HeavyHitters(max(64, 8 * top))
        self.names: dict[int, str] = {}  # raw text of held heavy hitters
        self.lengths = np.zeros(1, np.int64)  # rows by number of values
        self.values = 0
        self.block: tuple[np.ndarray, np.ndarray] = (np.zeros(0, np.int64), np.zeros(0, np.int64))

    def add(self, ids: np.ndarray, lengths: np.ndarray, raw: pa.Array) -> None:
        uniq, counts = np.unique(ids, return_counts=True)  # one sort for every summary
        self.block = (uniq, counts)  # the table's counter takes them too (its only feature, occurrences counted)
        self.counter.add(uniq, counts, unique=True)
        self.hitters.add(uniq, counts, unique=True)
        self.values += ids.size
        counts = np.bincount(lengths)
        if counts.size > self.lengths.size:
            self.lengths = np.concatenate([self.lengths, np.zeros(counts.size - self.lengths.size, np.int64)])
        self.lengths[: counts.size] += counts
        unnamed = [i for i in self.hitters.ids.tolist() if i not in self.names]
        if unnamed:
            self._name(np.asarray(unnamed, np.int64), raw)
        held = set(self.hitters.ids.tolist())
        self.names = {i: n for i, n in self.names.items() if i in held}

    def _name(self, ids: np.ndarray, raw: pa.Array) -> None:
        """The raw text of ``ids`` from this block's column (hashed as the featurizer does)."""
        flat, _, _ = _jagged(raw, self.f.separator)
        if isinstance(flat, pa.ChunkedArray):
            flat = flat.combine_chunks()
        distinct = pc.unique(flat.drop_null())
        hashed = hash_array(distinct, self.f.salt_value)[0] if self.f.hash_ids else parse_ints(distinct)[0]
        hit = np.isin(hashed, ids)
        for i, v in zip(hashed[hit].tolist(), distinct.filter(pa.array(hit)).to_pylist()):
            self.names.setdefault(int(i), str(v))

    def summary(self, rows: int, top: int) -> dict[str, Any]:
        lengths = self.lengths
        ranks = np.cumsum(lengths)
        def length_q(q: float) -> int:
            return int(np.searchsorted(ranks, q * max(rows - 1, 0), side="right")) if rows else 0
        c = self.counter
        if c.exact:  # every ID's count is held: the exact top
            held, error = [(int(i), int(n)) for i, n in zip(*c.top(top))], 0
        else:
            held, error = self.hitters.top(top), self.hitters.error
        return {
            "table": self.f.table_name,
            "column": self.f.source_column,
            "multi_hot": self.f.separator is not None or lengths.size > 2,
            "values": int(self.values),
            "missing_rows": int(lengths[0]) if rows else 0,
            "missing_rate": float(lengths[0] / rows) if rows else None,
            "values_per_row": {"mean": self.values / rows if rows else None, "max": int(lengths.nonzero()[0].max())
                               if lengths.any() else 0, "p50": length_q(0.5), "p99": length_q(0.99)},
            "distinct": _distinct(c, 1),
            "top": [{"value": self.names.get(i, str(i)), "id": i, "count": n, "count_error": error}
                    for i, n in held],
        }


def _distinct(c: DistinctCounter, min_count: int) -> dict[str, Any]:
    """A distinct count as the profile states it: the value, exact or not, and its error."""
    err = c.stderr(min_count)
    return {"value": round(c.distinct(min_count)), "exact": c.exact, "stderr": err,
            "relative_error_95": 1.96 * err / max(c.distinct(min_count), 1.0),
            "method": "exact" if c.exact else f"distinct sampling, 1 in {2 ** c.level} IDs kept ({c.ids.size} held)"}


def profile_data(cfg: RunConfig, rows: int | None = None, exact_bound: int = 1 << 16, top: int = 10,
                 config_path: str | None = None) -> dict[str, Any]:
    """The profile (a JSON-ready dict, see the module docstring) of ``cfg``'s training data, or
    of its first ``rows`` rows.

    Args:
        cfg: the run config: data, schema, tables (min_count, ttl_steps), batch size.
        rows: read at most this many rows (None: all).
        exact_bound: distinct IDs held exactly per feature before sampling starts.
        top: most frequent values listed per sparse feature.
        config_path: recorded in the profile, for the reader.

    Raises:
        ConfigError: ``rows`` < 1, or no training data.
    """
    if rows is not None and rows < 1:
        raise ConfigError(f"--rows must be >= 1, got {rows}")
    schema = cfg.schema
    tables = {t.name: t for t in cfg.table_configs()}
    report = BadRowReport("skip")
    featurize = Featurizer(schema, report, keys=[_ROW], id_types=hashed_id_types(schema, cfg.data))  # as training reads
    by_table: dict[str, list[int]] = {}
    for j, f in enumerate(schema.sparse):
        by_table.setdefault(f.table_name, []).append(j)
    table_counters = {name: DistinctCounter(exact_bound) for name in by_table}
    sparse = [_Sparse(f, DistinctCounter(exact_bound), top) for f in schema.sparse]  # occurrences; tables: sightings
    window_rows = {name: 2 * tables[name].ttl_steps * cfg.data.batch_size for name in by_table
                   if tables[name].ttl_steps is not None}
    windows = {name: (DistinctCounter(exact_bound), [0.0]) for name in window_rows}  # this window's IDs, the most
    dense = [(f, BottomK(seed=j), {"present": 0, "missing": 0, "sum": 0.0, "min": math.inf, "max": -math.inf})
             for j, f in enumerate(schema.dense)]
    # without a shuffle buffer (or with synthetic rows) a run's batches are the rows in file order
    in_order = cfg.data.format == "synthetic" or cfg.data.shuffle_buffer == 0
    batch_size = cfg.data.batch_size
    label_sums = np.zeros(len(schema.labels))
    read = kept_rows = 0
    complete = True
    first_bad: str | None = None
    for block, file, first_row in _blocks(cfg, report):
        if rows is not None and read + block.num_rows > rows:
            block = block.slice(0, rows - read)
            first_row = first_row if np.ndim(first_row) == 0 else first_row[: block.num_rows]
            complete = False
        read += block.num_rows
        n = block.num_rows
        bad_before = report.total
        out = featurize(block.append_column(_ROW, pa.array(np.arange(n, dtype=np.int64))), file, first_row)
        if first_bad is None and report.total > bad_before:
            first_bad = file
        kept = np.asarray(out.key_columns[_ROW], dtype=np.int64)  # type: ignore[index]
        kept_rows += kept.size
        label_sums += out.labels.sum(axis=0)
        taken = featurize.bring_ids(block).take(pa.array(kept))  # (top values named from IDs as hashed)
        for j, s in enumerate(sparse):
            ids, offsets = out.values[j], out.offsets[j]
            s.add(ids, np.diff(offsets), taken.column(s.f.source_column))
        for name, js in by_table.items():
            ids = np.concatenate([out.values[j] for j in js]) if len(js) > 1 else out.values[js[0]]
            if in_order:  # training's batches are these rows in order: count an ID once per batch, as the run does
                rows_of = np.concatenate([np.repeat(np.arange(kept.size), np.diff(out.offsets[j])) for j in js])
                table_counters[name].add(_once_per_batch(ids, (kept_rows - kept.size + rows_of) // batch_size))
            elif len(js) == 1:
                table_counters[name].add(*sparse[js[0]].block, unique=True)
            else:
                table_counters[name].add(ids)
            if name in windows:  # distinct IDs per aligned window of rows, the largest kept
                size = window_rows[name]
                rows_of = np.concatenate([np.repeat(np.arange(kept.size), np.diff(out.offsets[j])) for j in js])
                window_of = (kept_rows - kept.size + rows_of) // size
                for w in range((kept_rows - kept.size) // size, (kept_rows - 1) // size + 1 if kept_rows else 0):
                    counter, peak = windows[name]
                    counter.add(ids[window_of == w])
                    if (w + 1) * size <= kept_rows:  # this window is complete
                        peak[0] = max(peak[0], counter.distinct())
                        windows[name] = (DistinctCounter(exact_bound), peak)
        for f, sample, st in dense:
            x, missing, _ = parse_floats(taken.column(f.source_column))
            present = x[~missing & np.isfinite(x)]
            st["present"] += present.size
            st["missing"] += int(missing.sum())
            if present.size:
                st["sum"] += float(present.sum())
                st["min"] = min(st["min"], float(present.min()))
                st["max"] = max(st["max"], float(present.max()))
                sample.add(present)
        if rows is not None and read >= rows:
            complete = read == rows and _at_end(cfg, rows)
            break
    for name, (counter, peak) in windows.items():
        peak[0] = max(peak[0], counter.distinct())
    if cfg.data.format != "synthetic" and read == 0:
        raise ConfigError("data.train holds no rows; ember profile needs rows to count")
    return {
        "format": FORMAT, "version": VERSION, "config": config_path,
        "data": {"format": cfg.data.format, "train": list(cfg.data.paths("train")) if cfg.data.format != "synthetic" else None,
                 "rows_read": read, "rows": kept_rows, "complete": complete, "rows_limit": rows,
                 "on_bad_rows": cfg.data.on_bad_rows, "batch_size": cfg.data.batch_size, "epochs": cfg.train.epochs},
        "bad_rows": {"total": report.total, "by_reason": dict(sorted(report.counts.items(), key=lambda kv: -kv[1])),
                     "training_stops": cfg.data.on_bad_rows == "error" and report.total > 0,
                     "first_file": first_bad},
        "labels": {name: {"rate": float(label_sums[j] / kept_rows) if kept_rows else None,
                          "positives": float(label_sums[j]), "rows": kept_rows} for j, name in enumerate(schema.labels)},
        "sparse": {s.f.name: s.summary(kept_rows, top) for s in sparse},
        "dense": {f.name: _dense_summary(f.source_column, sample, st, kept_rows) for f, sample, st in dense},
        "tables": {name: {"features": [schema.sparse[j].name for j in js], "distinct": _distinct(table_counters[name], 1),
                          "sample_rate": table_counters[name].rate,
                          "frequencies": {str(k): v for k, v in table_counters[name].frequencies(_FREQ_CAP).items()},
                          "frequency_cap": _FREQ_CAP,
                          **({"ttl_window_rows": window_rows[name], "ttl_window_distinct": round(windows[name][1][0])}
                             if name in windows else {})}
                   for name, js in by_table.items()},
    }


def _once_per_batch(ids: np.ndarray, batch: np.ndarray) -> np.ndarray:
    """``ids`` with repeats within one batch (same ``batch`` number) removed.

    Example:
        >>> _once_per_batch(np.array([5, 5, 6, 5]), np.array([0, 0, 0, 1])).tolist()
        [5, 6, 5]
    """
    order = np.lexsort((ids, batch))
    ids, batch = ids[order], batch[order]
    first = np.ones(ids.size, dtype=bool)
    first[1:] = (ids[1:] != ids[:-1]) | (batch[1:] != batch[:-1])
    return ids[first]


def _at_end(cfg: RunConfig, rows: int) -> bool:
    """Whether the training data holds exactly ``rows`` rows, as far as cheaply known."""
    if cfg.data.format == "synthetic":
        return split_rows(cfg.data.synthetic, "train") == rows
    return False


def _dense_summary(column: str, sample: BottomK, st: dict[str, Any], rows: int) -> dict[str, Any]:
    present = st["present"]
    return {"column": column, "present": present, "missing": st["missing"],
            "missing_rate": st["missing"] / rows if rows else None,
            "min": st["min"] if present else None, "max": st["max"] if present else None,
            "mean": st["sum"] / present if present else None,
            "quantiles": {str(q): (None if math.isnan(v) else float(v)) for q, v in zip(QUANTILES, sample.quantiles(QUANTILES))},
            "quantiles_exact": sample.exact}


def _count(value: float | int | None) -> str:
    if value is None:
        return "-"
    v = float(value)
    for unit, size in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(v) >= size:
            return f"{v / size:.2f}{unit}"
    return f"{v:.0f}" if v == int(v) else f"{v:.4g}"


def describe(profile: dict[str, Any]) -> str:
    """The profile as a readable table (what ``ember profile`` prints)."""
    d = profile["data"]
    lines = [f"profile of {d['rows_read']:,} rows read ({d['rows']:,} kept)"
             + ("" if d["complete"] else f", the first {d['rows_limit']:,} rows of data.train") + ":"]
    for name, lab in profile["labels"].items():
        rate = "-" if lab["rate"] is None else f"{lab['rate']:.4f}"
        lines.append(f"  label {name}: rate {rate} ({lab['positives']:,.0f} of {lab['rows']:,})")
    bad = profile["bad_rows"]
    lines.append(f"  bad rows: {bad['total']:,}" + "".join(f"\n    {k}: {v:,}" for k, v in bad["by_reason"].items()))
    if bad["training_stops"]:
        lines.append(f"  (data.on_bad_rows is error: training stops at the first bad row, in {bad['first_file']}; "
                     "set data.on_bad_rows: skip to skip them)")
    lines.append("")
    lines.append(f"  {'sparse feature':<20} {'distinct':>10} {'± (95%)':>8} {'missing':>8} {'values/row':>10} "
                 f"{'max':>5}  top values (count)")
    for name, s in profile["sparse"].items():
        dc = s["distinct"]
        err = "exact" if dc["exact"] else f"{100 * dc['relative_error_95']:.1f}%"
        vpr = s["values_per_row"]
        top = ", ".join(f"{_short(t['value'])} ({t['count']:,})" for t in s["top"][:3])
        missing = "-" if s["missing_rate"] is None else f"{100 * s['missing_rate']:.1f}%"
        mean = "-" if vpr["mean"] is None else f"{vpr['mean']:.2f}"
        lines.append(f"  {name:<20} {_count(dc['value']):>10} {err:>8} {missing:>8} {mean:>10} {vpr['max']:>5}  {top}")
    if profile["dense"]:
        lines.append("")
        lines.append(f"  {'dense feature':<20} {'min':>10} {'p50':>10} {'p99':>10} {'max':>10} {'mean':>10} {'missing':>8}")
        for name, x in profile["dense"].items():
            q = x["quantiles"]
            missing = "-" if x["missing_rate"] is None else f"{100 * x['missing_rate']:.1f}%"
            lines.append(f"  {name:<20} {_count(x['min']):>10} {_count(q['0.5']):>10} {_count(q['0.99']):>10} "
                         f"{_count(x['max']):>10} {_count(x['mean']):>10} {missing:>8}")
    shared = {n: t for n, t in profile["tables"].items() if len(t["features"]) > 1}
    for name, t in shared.items():
        lines.append(f"  table {name} (shared by {', '.join(t['features'])}): {_count(t['distinct']['value'])} distinct IDs")
    return "\n".join(lines)


def _short(text: str, width: int = 14) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def _plot(profile: dict[str, Any], path: Path) -> None:
    """A PNG of the distributions: distinct IDs and missing share per sparse feature, values per
    row, and each dense feature's quantiles."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sparse, dense = profile["sparse"], profile["dense"]
    names = list(sparse)
    fig, axes = plt.subplots(3, 1, figsize=(max(8.0, 0.45 * max(len(names), len(dense)) + 3), 11))
    x = np.arange(len(names))
    distinct = [s["distinct"]["value"] for s in sparse.values()]
    err = [1.96 * s["distinct"]["stderr"] for s in sparse.values()]
    axes[0].bar(x, distinct, yerr=err, color="tab:blue")
    axes[0].set_yscale("log")
    axes[0].set_ylabel("distinct IDs (95% error bar)")
    ax2 = axes[0].twinx()
    ax2.plot(x, [100 * (s["missing_rate"] or 0) for s in sparse.values()], "o", color="tab:red")
    ax2.set_ylabel("rows without a value (%)", color="tab:red")
    axes[0].set_xticks(x, names, rotation=60, fontsize=8)
    axes[0].set_title("sparse features")
    vpr = [s["values_per_row"] for s in sparse.values()]
    axes[1].bar(x - 0.2, [v["mean"] or 0 for v in vpr], width=0.4, label="mean")
    axes[1].bar(x + 0.2, [v["p99"] for v in vpr], width=0.4, label="p99")
    axes[1].set_xticks(x, names, rotation=60, fontsize=8)
    axes[1].set_ylabel("values per row")
    axes[1].legend(fontsize=8)
    if dense:
        qs = [[x["quantiles"][str(q)] for q in QUANTILES] for x in dense.values()]
        data = [[v for v in q if v is not None] for q in qs]
        boxes = [{"whislo": d[1], "q1": d[3], "med": d[4], "q3": d[5], "whishi": d[7], "fliers": [d[0], d[-1]],
                  "label": name} for name, d in zip(dense, data) if len(d) == len(QUANTILES)]
        if boxes:
            axes[2].bxp(boxes, showfliers=True)
        axes[2].set_yscale("symlog")
        axes[2].set_title("dense features (raw): box p25-p75, whiskers p1-p99, dots min/max")
        axes[2].tick_params(axis="x", rotation=60, labelsize=8)
    else:
        axes[2].set_axis_off()
    labels = ", ".join(f"{k} {v['rate']:.4f}" for k, v in profile["labels"].items() if v["rate"] is not None)
    fig.suptitle(f"{profile['data']['rows']:,} rows; label rate: {labels}")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def write_profile(profile: dict[str, Any], out: str | Path) -> list[Path]:
    """Write ``profile.json``, ``profile.txt`` and ``profile.png`` into ``out`` (created, marked as
    ember's profile output); returns their paths. Each file is replaced atomically."""
    from ember.outputs import mark

    d = Path(out)
    d.mkdir(parents=True, exist_ok=True)
    mark(d, "profile")
    paths = [d / "profile.json", d / "profile.txt", d / "profile.png"]
    write_bytes_atomic(paths[0], (json.dumps(profile, indent=1, allow_nan=False) + "\n").encode(), WriteError)
    write_bytes_atomic(paths[1], (describe(profile) + "\n").encode(), WriteError)
    tmp = d / ".profile.tmp.png"
    _plot(profile, tmp)
    tmp.replace(paths[2])
    return paths


def read_profile(path: str | Path) -> dict[str, Any]:
    """A profile written by ``write_profile`` (the JSON file, or its directory).

    Raises:
        ConfigError: the path is missing or not an ember profile of a version this ember reads.
    """
    p = Path(path)
    p = p / "profile.json" if p.is_dir() else p
    try:
        profile = json.loads(p.read_text())
    except FileNotFoundError:
        raise ConfigError(f"--profile {path} does not exist; write one with ember profile --config X.yaml --out DIR "
                          "and give DIR/profile.json") from None
    except (OSError, ValueError) as e:
        raise ConfigError(f"--profile {path} is not readable JSON ({e}); give the profile.json ember profile wrote") from None
    if not isinstance(profile, dict) or profile.get("format") != FORMAT:
        raise ConfigError(f"--profile {path} is not an ember profile (no \"format\": \"{FORMAT}\"); give the "
                          "profile.json ember profile wrote")
    if profile.get("version") != VERSION:
        raise ConfigError(f"--profile {path} is version {profile.get('version')}; this ember reads version {VERSION}: "
                          "profile the data again with this ember")
    return profile
