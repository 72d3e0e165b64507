"""Predictor: load an export directory and score batches or raw input files.

Needs only torch, numpy, pyarrow and ember's featurizer and pooling; no optimizer, tier or
trainer code. An ID without a row reads what eval gives it: the same deterministic initial row
the trained model would give it, or, in a table with ``min_count`` > 1, the all-zero row of
IDs admission held back. So scores equal the trained model's eval scores on any input.
"""

from __future__ import annotations

import json
import logging
import os
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Mapping, Sequence

import numpy as np
import torch
from torch import Tensor

from ember.batch import Batch, SparseFeatures
from ember.checkpoint.atomic import sha256_file
from ember.checkpoint.export import EXPORT_VERSION, load_export_model
from ember.embedding.pooling import pool_feature
from ember.embedding.config import FeatureConfig
from ember.embedding.codec import RowDtype, from_bits, round_nearest
from ember.embedding.init import InitializerConfig, init_rows
from ember.errors import CheckpointError, ConfigError, EmberError
from ember.config_base import deep_merge
from ember.source.bad_rows import BadRowReport
from ember import once

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["Predictor"]

log = logging.getLogger(__name__)


class _FrozenTable:
    """Sorted IDs + weights; lookup by binary search; IDs without a row read their initial row,
    or the all-zero row when the table held IDs back (``min_count`` > 1), as eval does. A bf16 /
    fp16 table's weights are widened exactly, and initial rows rounded to nearest at its dtype
    as the table rounds a fresh row, so scores equal eval's."""

    def __init__(self, root: Path, meta: dict[str, Any], min_count: int) -> None:
        self.dim = meta["dim"]
        self.seed = meta["seed"]
        self.init = InitializerConfig.model_validate(meta["initializer"])
        self.min_count = min_count
        self.dtype: RowDtype = meta.get("dtype", "fp32")  # exports before format 3 are fp32
        # TTL (format 4 on): a stored row last seen more than ttl_steps before ``step`` reads as
        # absent, as in the table; a full export holds live rows only, later deltas move ``step``
        self.ttl: int | None = meta.get("ttl_steps")
        self.step: int = meta.get("step", 0)
        self.ids, self.weights, self.seen = read_rows(root, meta["name"], meta["rows"], self.dim, self.dtype,
                                                      self.ttl is not None)

    def fallback(self, ids: Tensor) -> Tensor:
        """Rows [N, dim] of IDs without a row: their initial row, or the zero row below ``min_count``."""
        if self.min_count > 1:  # below min_count an ID never got a row: eval reads the shared zero row for it
            return torch.zeros(ids.numel(), self.dim)
        return round_nearest(init_rows(ids, self.dim, self.init, self.seed), self.dtype)

    def rows(self, ids: Tensor) -> Tensor:
        q = ids.numpy()
        pos, found = search(self.ids, q)
        if self.seen is not None and found.any():
            found[found] = self.step - self.seen[pos[found]] <= self.ttl
        out = torch.empty(q.size, self.dim)
        if found.any():
            out[torch.from_numpy(found)] = self.weights[torch.from_numpy(pos[found])]
        if (~found).any():
            absent = torch.from_numpy(~found)
            out[absent] = self.fallback(ids[absent])
        return out


def search(sorted_ids: np.ndarray, q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(position, found) of each of ``q`` in ``sorted_ids`` (positions clipped into range)."""
    if not sorted_ids.size:
        return np.zeros(q.size, np.int64), np.zeros(q.size, bool)
    pos = np.minimum(np.searchsorted(sorted_ids, q), sorted_ids.size - 1)
    return pos, sorted_ids[pos] == q


def _not_finite(probs: np.ndarray, batch: Batch, root: Path) -> None:
    """Raise for scores that are NaN: a DataError when the row's dense input is infinite (the
    caller's to fix), else Diverged (the export's weights are not finite)."""
    from ember.errors import DataError, Diverged

    row = int(np.flatnonzero(~np.isfinite(probs).all(axis=1))[0])
    dense = batch.dense[row].numpy()
    if not np.isfinite(dense).all():
        raise DataError(f"row {row} (0-based, of this batch): a dense value is infinite after its transforms "
                        f"({int((~np.isfinite(dense)).sum())} of {dense.size}), which scores NaN; give finite numbers")
    raise Diverged(f"export {root}: row {row} (0-based, of this batch) scores NaN with finite inputs: the export's "
                   "weights are not finite (a diverged run); export a checkpoint from before it")


def read_rows(root: Path, name: str, n: int, dim: int, dtype: RowDtype, ttl: bool
              ) -> tuple[np.ndarray, Tensor, np.ndarray | None]:
    """A table's (ids, weights [n, dim] float32, last-seen steps or None) from an export or a
    delta export directory ``root``: 16-bit weights widened exactly."""
    tables = root / "tables"
    ids = np.fromfile(tables / f"{name}.ids", dtype="<i8") if n else np.empty(0, np.int64)
    wfile = tables / f"{name}.weights"
    if dtype == "fp32":
        w = np.fromfile(wfile, dtype="<f4") if n else np.empty(0, np.float32)
        weights = torch.from_numpy(w.reshape(n, dim))
    else:
        bits = np.fromfile(wfile, dtype="<i2") if n else np.empty(0, np.int16)
        weights = from_bits(torch.from_numpy(bits.astype(np.int16).reshape(n, dim)), dtype)
    seen = None
    if ttl:
        seen = np.fromfile(tables / f"{name}.seen", dtype="<f4") if n else np.empty(0, np.float32)
    for what, arr in (("ids", ids), ("weights", weights), ("seen", seen)):
        if arr is not None and arr.shape[0] != n:
            raise CheckpointError(f"export {root}: tables/{name}.{what} holds {arr.shape[0]} rows, the manifest says {n}")
    return ids, weights, seen


class Predictor:
    """Scores rows with an exported model.

    Example (after ``ember export``)::

        p = Predictor.load("runs/demo/export")
        probs = p.predict_files(["new_rows.parquet"])   # [N, T] click probabilities
    """

    def __init__(self, root: Path, manifest: dict[str, Any], tables: dict[str, Any] | None = None,
                 trust_torchscript: bool = False) -> None:
        """``tables``: the tables to score with (anything with ``rows(ids) -> [N, dim]``, e.g. a
        served export with delta exports applied: ``ember.serving.overlay``) instead of the
        export's own; the dense model is ``root``'s. ``trust_torchscript``: an export whose model
        only its TorchScript gives (an old format, a model of your own) is loaded from it
        (``load_export_model``); off, it is refused."""
        self.root = root
        self.manifest = manifest
        version = manifest.get("format_version")
        if not isinstance(version, int) or not 1 <= version <= EXPORT_VERSION:
            raise CheckpointError(f"export {root}: format_version {version!r} is not one this ember reads "
                                  f"(1..{EXPORT_VERSION}); export it again with this version of ember")
        self.model = load_export_model(root, manifest, trust_torchscript)  # ember's model code: no code from the export
        if tables is None and manifest.get("series", {}).get("kind") == "delta":
            raise CheckpointError(f"export {root} is a delta export (only the rows changed since the previous "
                                  f"export): load a full export, or serve the series with "
                                  f"`ember serve --export {root.parent}`")
        # version 1 did not record min_count and served every table as min_count 1
        self.tables = tables if tables is not None else {
            t["name"]: _FrozenTable(root, t, t["min_count"] if version >= 2 else 1) for t in manifest["tables"]}
        self.features = [FeatureConfig.model_validate(f) for f in manifest["features"]]
        lin = manifest.get("linear_features")
        self.linear_features = [FeatureConfig.model_validate(f) for f in lin] if lin else None
        self.tasks: list[str] = manifest["tasks"]
        self.input_types: dict[str, str] = self._input_types()
        self.bad_rows: BadRowReport | None = None  # rows the last predict_files skipped (data.on_bad_rows=skip)

    @classmethod
    def load(cls, path: str | Path, verify: bool = True, trust_torchscript: bool = False) -> "Predictor":
        root = Path(path)
        mf = root / "manifest.json"
        if not mf.exists():
            raise CheckpointError(f"{root} is not an ember export (no manifest.json); create one with `ember export`")
        try:
            manifest = json.loads(mf.read_text())
        except (OSError, ValueError) as e:  # (UnicodeDecodeError and JSONDecodeError are ValueErrors)
            raise CheckpointError(f"export {root}: cannot read manifest.json ({e}); it is truncated or damaged: "
                                  "export again") from None
        files = manifest.get("files") if isinstance(manifest, dict) else None
        if not isinstance(files, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in files.items()):
            raise CheckpointError(f"export {root}: manifest.json is not an ember export's manifest (no \"files\" "
                                  "mapping of file to sha256); it is damaged: export again")
        if verify:
            for rel, digest in files.items():
                if not (root / rel).is_file():
                    raise CheckpointError(f"export {root}: file {rel} is missing; export again")
                if sha256_file(root / rel) != digest:
                    raise CheckpointError(f"export {root}: {rel} is damaged (sha256 mismatch); export again")
        try:
            return cls(root, manifest, trust_torchscript=trust_torchscript)
        except EmberError:
            raise
        except (KeyError, TypeError, AttributeError, IndexError, ValueError) as e:  # its files check out: the manifest
            raise CheckpointError(f"export {root}: manifest.json does not describe an export this ember reads "
                                  f"({type(e).__name__}: {e}); it is damaged, or from another version: export "
                                  "again") from None

    def _pooled(self, sparse: SparseFeatures, features: list[FeatureConfig]) -> list[Tensor]:
        out = []
        for f in features:
            jf = sparse[f.name]
            uniq, inv = torch.unique(jf.values, return_inverse=True)
            w = self.tables[f.table_name].rows(uniq)
            out.append(pool_feature(w, inv, jf.offsets, jf.weights, f.pooling, f.max_length))
        return out

    @torch.no_grad()
    def predict_batch(self, batch: Batch) -> np.ndarray:
        """Probabilities [B, T] for a featurized batch."""
        pooled = self._pooled(batch.sparse, self.features)
        linear = self._pooled(batch.sparse, self.linear_features) if self.linear_features else None
        probs = torch.sigmoid(self.model(batch.dense, pooled, linear)).numpy()
        if not np.isfinite(probs).all():
            _not_finite(probs, batch, self.root)
        return probs

    def predict_batches(self, batches: Iterable[Batch]) -> np.ndarray:
        parts = [self.predict_batch(b) for b in batches]
        return np.concatenate(parts) if parts else np.zeros((0, len(self.tasks)))

    @cached_property
    def score_schema(self) -> Any:
        """The export's schema for scoring (labels not read; they may be absent), built once."""
        from ember.featurize.schema import Schema, as_recorded

        return Schema.parse({**as_recorded(self.manifest["schema"]), "score_only": True}, where=f"export {self.root} schema")

    def _input_types(self) -> dict[str, str]:
        """Each input column's type in training (``ember.featurize.canonical``): as the export
        recorded it, or, for an export made before types were recorded, inferred from its
        schema and data format (logged once per export)."""
        from ember.featurize.canonical import training_types

        recorded = self.manifest.get("input_types")
        if recorded is not None:
            return {c: v["type"] for c, v in recorded["columns"].items()}
        columns, how = training_types(self.score_schema, self.manifest["data"], read_files=False)
        if once.first("predictor.no_input_types", str(self.root)):
            unknown = sorted(c for c, v in columns.items() if v["type"] == "unknown")
            log.warning("export %s records no input column types (made before ember recorded them): inferred from "
                        "its schema and %s%s; export the checkpoint again to record them", self.root, how,
                        f"; columns {unknown} are read as before (file values as stored, JSON values as text)"
                        if unknown else "")
        return {c: v["type"] for c, v in columns.items()}

    def predict_records(self, rows: list[dict[str, Any]]) -> np.ndarray:
        """Probabilities [N, T] for raw rows given as mappings of column -> value (e.g. parsed
        JSON), featurized by the export's schema exactly as files are. Each value is brought to
        its column's type in training first (``ember.featurize.canonical``: 4, 4.0 and "4" are
        one integer ID); None or an absent key is a missing value. A value that cannot be, or a
        key the schema does not read, raises ``BadValue`` (a DataError) naming the row's index
        in ``rows`` (0-based), the column and the reason."""
        from ember.featurize.canonical import canonicalize
        from ember.featurize.featurizer import Featurizer

        schema = self.score_schema
        if isinstance(rows, Mapping) or not isinstance(rows, Sequence) or isinstance(rows, (str, bytes)):
            raise TypeError(f"predict_records takes a list of rows (each a mapping of column -> value), got "
                            f"{type(rows).__name__}" + ("; wrap one row in a list: [row]" if isinstance(rows, Mapping) else ""))
        wrong = next((i for i, r in enumerate(rows) if not isinstance(r, Mapping)), None)
        if wrong is not None:
            raise TypeError(f"predict_records: rows[{wrong}] is a {type(rows[wrong]).__name__}, not a mapping of "
                            "column -> value")
        if not rows:
            return np.zeros((0, len(self.tasks)))
        batch = Featurizer(schema)(canonicalize(rows, schema, self.input_types), "<request>", 1).to_batch()
        return self.predict_batch(batch)

    def predict_files(self, paths: list[str], format: str | None = None, *, keep: Sequence[str] | str = (),
                      out: str | os.PathLike | None = None, **data_overrides: Any) -> np.ndarray:
        """Probabilities [N, T] for raw rows in ``paths`` (order kept); with ``out``, also
        written to that file (``ember.serving.predictions``: its format from the extension,
        .csv (.gz, .bz2, .zst, .lz4), .tsv or .parquet; earlier predictions there are replaced,
        any other file is refused), the input's columns ``keep`` (e.g. ``["id"]``) first, as
        read, beside the ``p_<task>`` columns. ``keep`` without ``out``: use :meth:`predict_table`.

        The format comes from the extensions (csv, tsv, parquet, orc, optionally compressed:
        ``.csv.gz``) or from ``format``; other extensions are refused (ConfigError), so rows are
        never read in a format they are not in, nor generated (an export trained on synthetic
        data). ``data_overrides`` are keys of the export's data config, merged into it (nested
        dicts key by key). Each value is brought to its column's type in training first, as
        ``predict_records`` does (``ember.featurize.canonical``), so a CSV's "4" and a Parquet
        file's 4 are one integer ID. Label columns may be absent, also from headerless files read by
        ``csv.column_names`` (e.g. ``preset: criteo``): they are dropped from the names when the
        first line has that many fields fewer. A bad row raises DataError (file, row, column)
        whatever the training run's ``on_bad_rows``, since one output row per input row is the
        contract; with ``on_bad_rows="skip"`` passed here, the skipped rows are counted in
        ``self.bad_rows``.
        """
        keep = _columns(keep)
        if keep and out is None:
            raise ConfigError(f"predict_files: keep={list(keep)} names columns written beside the probabilities to "
                              "out=; give out= (a .csv/.tsv/.parquet path), or call predict_table for them in memory")
        if out is None:
            return self._scored(paths, format, (), data_overrides)[0]
        from ember.outputs import claim_output, output_format
        from ember.serving.predictions import predictions_table, write_predictions

        fmt, compression = output_format(out, None, ("csv", "tsv", "parquet"), "out")
        claim_output(out, "predictions", "out", True, [self.root, *paths])  # an earlier predictions file, nothing else
        probs, kept = self._scored(paths, format, keep, data_overrides)
        write_predictions(out, predictions_table(probs, self.tasks, kept), fmt, compression)
        return probs

    def predict_table(self, paths: list[str], keep: Sequence[str] | str = (), format: str | None = None,
                      **data_overrides: Any) -> "pa.Table":
        """``predict_files`` as a pyarrow Table: the input's columns ``keep`` as read (e.g. an
        ID to join the scores back on), then ``p_<task>`` per task, one row per input row. A
        ``keep`` column the input lacks is a ConfigError naming it (with a did-you-mean)."""
        from ember.serving.predictions import predictions_table

        probs, kept = self._scored(paths, format, _columns(keep), data_overrides)
        return predictions_table(probs, self.tasks, kept)

    def _scored(self, paths: list[str], format: str | None, keep: Sequence[str], data_overrides: dict[str, Any]
                ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """Probabilities [N, T] of the rows in ``paths`` and their columns ``keep``, column -> [N]."""
        from ember.errors import MissingColumnsError
        from ember.featurize.canonical import canonicalize
        from ember.featurize.featurizer import Featurizer
        from ember.pipeline.loader import missing_keys_error
        from ember.source.bad_rows import BadRowReport
        from ember.source.config import DataConfig
        from ember.source.files import expand_paths
        from ember.source.protocol import Unit, source_for

        paths = _paths(paths)
        if not paths:
            raise ConfigError("predict: no input files given")
        if format is not None and format not in _FORMATS:
            raise ConfigError(f"predict: format {format!r} is not one of {'|'.join(_FORMATS)}")
        # on_bad_rows: error unless the caller asks for skip: a skipped row would shift every later
        # probability against its input row (the training run's own policy does not carry over)
        data = {**self.manifest["data"], "eval": list(paths), "shuffle_buffer": 0, "on_bad_rows": "error"}
        data.pop("train", None)
        data.pop("sql", None)  # the inputs are files, whatever the model was trained from
        data.pop("iceberg", None)
        data.pop("watch", None)  # an online run's watched training stream, not these inputs (which it would refuse)
        fmt = format or _format_of(paths)
        if fmt not in _FORMATS:
            exts = sorted({"".join(Path(p).suffixes[-2:]) or "(none)" for p in paths})
            raise ConfigError(f"predict: cannot tell the format of {list(paths)[:3]} (extensions {exts}); name the "
                              f"files .csv/.tsv/.parquet/.orc (optionally .gz/.bz2/.zst/.lz4) or give the format "
                              f"(--format {'|'.join(_FORMATS)})")
        if fmt != data.get("format"):  # e.g. a model trained on synthetic data
            data["format"] = fmt
            if fmt in ("csv", "tsv") and data.get("preset") != "criteo":
                data["csv"] = {**data.get("csv", {}), "delimiter": None, "header": True}
        data = deep_merge(data, data_overrides)
        cfg = DataConfig.parse(data, where="data")
        schema = self.score_schema
        cfg = _without_absent_labels(cfg, schema.labels, paths[0])
        report = BadRowReport(cfg.on_bad_rows)
        self.bad_rows = report
        keep = list(keep)
        featurize, size = Featurizer(schema, report, keep), cfg.split_batch_size("eval")
        parts, kept = [], []
        for path in expand_paths(cfg.paths("eval"), cfg.format, cfg.storage_options, "the input paths"):  # file order, then row order
            try:
                chunks = list(source_for(cfg).open(Unit(path), schema.columns + [k for k in keep if k not in schema.columns],
                                                   report))
            except MissingColumnsError as e:
                raise missing_keys_error(e, keep, "--keep") from None
            for chunk in chunks:
                # each value to its column's type in training, as predict_records does (one rule);
                # the kept columns ride along as read
                canonical = canonicalize(chunk.batch, schema, self.input_types, chunk.file, chunk.first_row,
                                         skip=report if report.skip else None, passthrough=keep)
                rows = featurize(canonical, chunk.file, chunk.first_row)
                for i in range(0, len(rows), size):
                    batch = rows.slice(i, i + size).to_batch()
                    parts.append(self.predict_batch(batch))
                    kept.append(batch.keys or {})
        columns = {k: np.concatenate([part[k] for part in kept]) if kept else np.zeros(0, object) for k in keep}
        return (np.concatenate(parts) if parts else np.zeros((0, len(self.tasks)))), columns


def _paths(paths: Any) -> list[str]:
    """Input paths as strings: a list of str / PathLike, or one path (not split into characters)."""
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    given = list(paths) if isinstance(paths, Iterable) else None
    if given is None or not all(isinstance(p, (str, os.PathLike)) for p in given):
        raise TypeError(f"predict: paths must be a path or a list of paths (str or pathlib.Path), got {paths!r:.80}")
    return [os.fspath(p) for p in given]


def _columns(keep: Sequence[str] | str) -> list[str]:
    """Column names from a list, or from one string of them separated by commas (``"id,country"``)."""
    if not isinstance(keep, (str, Sequence)) or not all(isinstance(n, str) for n in keep):
        raise TypeError(f"predict: keep must be column names (a list of str, or one str 'a,b'), got {keep!r:.80}")
    names = keep.split(",") if isinstance(keep, str) else list(keep)
    return [n.strip() for n in names if n.strip()]


_FORMATS = ("csv", "tsv", "parquet", "orc")
_COMPRESSED = (".gz", ".bz2", ".zst", ".lz4")  # as the training readers take them (ember.source)


def _format_of(paths: list[str]) -> str | None:
    """File format from the extensions of ``paths``, a compression suffix skipped (None when
    unknown or mixed)."""
    exts = set()
    for p in paths:
        suffixes = [x.lower() for x in Path(p).suffixes]
        if suffixes and suffixes[-1] in _COMPRESSED:
            suffixes.pop()
        exts.add(suffixes[-1].lstrip(".") if suffixes else "")
    if len(exts) == 1 and (ext := exts.pop()) in _FORMATS:
        return ext
    return None


def _without_absent_labels(cfg: Any, labels: list[str], first_file: str) -> Any:
    """``cfg`` (a DataConfig) without the label columns in ``csv.column_names`` when the files
    carry no header and ``first_file``'s first line has exactly that many fields fewer."""
    names = cfg.csv.column_names
    if cfg.format not in ("csv", "tsv") or cfg.csv.header is True or not names or not set(labels) <= set(names):
        return cfg
    from ember.source.csv import read_head

    line = read_head(first_file, 1 << 16, cfg.storage_options).split(b"\n", 1)[0].rstrip(b"\r")
    fields = line.decode("utf-8", "replace").split(cfg.delimiter)
    if fields == names or len(fields) != len(names) - len(labels):  # a header line, or labels present
        return cfg
    csv = cfg.csv.model_copy(update={"column_names": [n for n in names if n not in labels]})
    return cfg.model_copy(update={"csv": csv})
