"""Score raw rows with an ONNX export (``ember export --format onnx``): numpy + onnxruntime only.

The export directory holds ``manifest.json`` (schema, input types, features, tables, tasks),
``tables/<name>.ids|weights[|seen]`` and ``model.onnx``: the dense model as an ONNX graph taking
``dense`` float32 [B, Dd], ``pooled_<i>`` float32 [B, D_i] per feature and, for models with a
linear part (DeepFM, Wide&Deep, LR), ``linear_<i>`` float32 [B, 1], and giving ``logits`` and
``probabilities`` [B, T]. :class:`PortableModel` does the rest as ember's ``Predictor`` does:

1. each value to its column's type in training (``ember.portable.values``);
2. dense transforms (fill, clip, log1p / sign_log1p, standardize);
3. sparse features: split multi-hot values, drop missing ones, hash to int64 IDs
   (``ember.portable.hashing``), keep the first ``max_length``, read weights;
4. table lookups (unseen IDs get their initial row or the zero row, ``ember.portable.tables``)
   and pooling (sum / mean / sqrtn, weighted or not);
5. the ONNX graph.

Nothing here imports torch or ember's training code, so it runs in a small serving image
(``pip install numpy onnxruntime``, plus this package, whose modules import nothing else of ember).

Example (after ``ember export --checkpoint runs/x --out exports/x --format onnx``)::

    from ember.portable import PortableModel
    model = PortableModel.load("exports/x")
    model.predict_records([{"I1": 3, "C1": "a|b"}])   # float32 [1, T] probabilities
    model.predict_csv("new_rows.csv")                 # [N, T], the file's rows in order
"""

from __future__ import annotations

import bz2
import csv
import gzip
import hashlib
import io
import json
import lzma
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

import numpy as np

from ember.portable.hashing import hash_ints, hash_strings
from ember.portable.tables import Table, pool
from ember.portable.values import BadInput, canonical_value, listed_ints, parse_float, parse_int, shown

__all__ = ["PortableModel", "BadInput"]

_CHUNK_ROWS = 8192  # rows featurized and scored at a time from a file: bounded memory


class _Feature:
    """A sparse feature of the schema (the data side) with the embedding side that pools it."""

    def __init__(self, raw: Mapping[str, Any], schema_missing: Sequence[str]) -> None:
        self.name: str = raw["name"]
        self.table: str = raw.get("table") or self.name
        self.pooling: str = raw.get("pooling", "sum")
        self.max_length: int | None = raw.get("max_length")
        self.column: str = raw.get("column") or self.name
        self.separator: str | None = raw.get("separator")
        self.weight_column: str | None = raw.get("weight_column")
        self.salt: str = self.name if raw.get("salt") is None else raw["salt"]
        self.hash_ids: bool = raw.get("hash_ids", True)
        own = raw.get("missing_values")
        self.missing: list[str] = list(schema_missing if own is None else own)
        self.missing_set = frozenset(self.missing)
        self.missing_ints = listed_ints(self.missing)


class _Dense:
    def __init__(self, raw: Mapping[str, Any]) -> None:
        self.name: str = raw["name"]
        self.column: str = raw.get("column") or self.name
        self.fill: float = float(raw.get("fill", 0.0))
        self.log1p: bool = bool(raw.get("log1p", False))
        self.sign_log1p: bool = bool(raw.get("sign_log1p", False))
        self.clip = raw.get("clip")
        self.standardize = raw.get("standardize")

    def transform(self, x: np.ndarray) -> np.ndarray:
        """Fill NaN -> clip -> log1p(max(x, 0)) or sign(x)·log1p(|x|) -> (x - mean) / std, float64."""
        x = np.where(np.isnan(x), self.fill, x)
        if self.clip is not None:
            lo, hi = self.clip
            x = np.clip(x, -np.inf if lo is None else lo, np.inf if hi is None else hi)
        if self.log1p:
            x = np.log1p(np.maximum(x, 0.0))
        if self.sign_log1p:
            x = np.sign(x) * np.log1p(np.abs(x))
        if self.standardize is not None:
            x = (x - self.standardize[0]) / self.standardize[1]
        return x


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


class PortableModel:
    """An ONNX export loaded for scoring (see the module docstring).

    Args:
        root: the export directory.
        manifest: its ``manifest.json``, parsed.
        providers: onnxruntime execution providers (default: the CPU one).
    """

    def __init__(self, root: str | Path, manifest: Mapping[str, Any], providers: Sequence[str] | None = None) -> None:
        self.root = Path(root)
        self.manifest = manifest
        onnx_meta = manifest.get("onnx")
        if not onnx_meta:
            raise ValueError(f"export {self.root} has no ONNX graph (model.onnx); export the checkpoint with "
                             "`ember export --checkpoint RUN --out DIR --format onnx`")
        if (manifest.get("series") or {}).get("kind") == "delta":
            raise ValueError(f"export {self.root} is a delta export (only the rows changed since the previous one); "
                             "load a full export")
        if manifest.get("input_types") is None:
            raise ValueError(f"export {self.root} records no input column types; export the checkpoint again")
        try:
            import onnxruntime as ort
        except ImportError as e:
            raise ImportError("the portable runtime needs onnxruntime: pip install onnxruntime "
                              "(or pip install 'ember[portable]')") from e
        schema = manifest["schema"]
        schema_missing = schema["missing_values"] if "missing_values" in schema else [""]  # before the key: "" missing
        self.dense = [_Dense(d) for d in schema.get("dense") or []]
        self.sparse = {s["name"]: _Feature(s, schema_missing) for s in schema["sparse"]}
        self.labels: list[str] = list(schema["labels"]) if isinstance(schema["labels"], list) else [schema["labels"]]
        self.teacher: list[str] = list(schema.get("teacher") or [])
        self.types: dict[str, str] = {c: v["type"] for c, v in manifest["input_types"]["columns"].items()}
        self.features = [(f["name"], f.get("table") or f["name"], f.get("pooling", "sum")) for f in manifest["features"]]
        lin = manifest.get("linear_features")
        self.linear = [(f["name"], f.get("table") or f["name"], f.get("pooling", "sum")) for f in lin] if lin else []
        bad = [n for n, _, p in [*self.features, *self.linear] if p not in ("sum", "mean", "sqrtn")]
        if bad:
            raise ValueError(f"export {self.root}: features {bad} use a pooling this runtime does not do "
                             "(sum, mean, sqrtn only)")
        self.tables = {t["name"]: Table(self.root, t) for t in manifest["tables"]}
        self.tasks: list[str] = list(manifest["tasks"])
        self.input_names: list[str] = list(onnx_meta["inputs"])
        self.session = ort.InferenceSession(str(self.root / onnx_meta["file"]),
                                            providers=list(providers or ["CPUExecutionProvider"]))
        self._graph_inputs = {i.name for i in self.session.get_inputs()}  # an input no output reads is pruned
        self.columns = self._columns()

    @classmethod
    def load(cls, path: str | Path, verify: bool = True, providers: Sequence[str] | None = None) -> "PortableModel":
        """Open the export at ``path``; ``verify`` checks every file's sha256 against the manifest."""
        root = Path(path)
        mf = root / "manifest.json"
        if not mf.exists():
            raise ValueError(f"{root} is not an ember export (no manifest.json); create one with "
                             "`ember export --format onnx`")
        manifest = json.loads(mf.read_text())
        if verify:
            for rel, digest in manifest["files"].items():
                if _sha256(root / rel) != digest:
                    raise ValueError(f"export {root}: {rel} is damaged (sha256 mismatch); export again")
        return cls(root, manifest, providers)

    def _columns(self) -> list[str]:
        """Every column the schema reads to score (labels and teacher columns are not read)."""
        cols = [*(d.column for d in self.dense), *(f.column for f in self.sparse.values()),
                *(f.weight_column for f in self.sparse.values() if f.weight_column)]
        return list(dict.fromkeys(cols))

    # ---- scoring -------------------------------------------------------------------------

    def predict_records(self, rows: Sequence[Mapping[str, Any]]) -> np.ndarray:
        """Probabilities float32 [N, T] of rows given as mappings column -> value (parsed JSON):
        each value brought to its column's training type first (4, 4.0 and "4" are one integer
        ID); None or an absent key is a missing value; a key the export does not read, or a value
        that cannot be, raises :class:`BadInput` naming ``rows[i]`` and the column."""
        return self.run(self.inputs(rows))

    def predict_csv(self, path: str | Path, delimiter: str | None = None) -> np.ndarray:
        """Probabilities float32 [N, T] of a CSV / TSV file's rows, in order (``.gz`` / ``.bz2`` /
        ``.xz`` read compressed). Values are read as the training data's CSV reader reads them
        (every field is text; an empty field is ``""``); the delimiter is ``delimiter``, else
        the training data's, else tab for ``.tsv`` and comma otherwise; a header line names the
        columns unless the training data's CSV had none (its ``column_names`` then)."""
        parts = [self.run(self._feeds(cols, n, str(path), first)) for cols, n, first in self._csv_chunks(Path(path), delimiter)]
        return np.concatenate(parts) if parts else np.zeros((0, len(self.tasks)), np.float32)

    def run(self, feeds: Mapping[str, np.ndarray]) -> np.ndarray:
        """The ONNX graph on model inputs (:meth:`inputs`): probabilities float32 [B, T]."""
        b = next(iter(feeds.values())).shape[0] if feeds else 0
        if b == 0:
            return np.zeros((0, len(self.tasks)), np.float32)
        used = {k: v for k, v in feeds.items() if k in self._graph_inputs}
        return self.session.run(["probabilities"], used)[0]

    def inputs(self, rows: Sequence[Mapping[str, Any]]) -> dict[str, np.ndarray]:
        """The ONNX graph's inputs for ``rows`` (name -> float32 array): what to send to an
        inference server that serves ``model.onnx`` alone (e.g. Triton's onnxruntime backend,
        ``ember.portable.triton``). Only the graph's inputs: one no output reads (LR's pooled
        embeddings) is not in the graph."""
        feeds = self._feeds(self._record_columns(rows), len(rows), "<request>", None)
        return {k: v for k, v in feeds.items() if k in self._graph_inputs}

    # ---- columns from records / files ----------------------------------------------------

    def _record_columns(self, rows: Sequence[Mapping[str, Any]]) -> dict[str, list[Any]]:
        known = [*self.columns, *self.labels, *self.teacher]
        known_set = set(known)
        seps = {f.column: f.separator for f in self.sparse.values()}
        missing = {f.column: f.missing for f in self.sparse.values()}
        out: dict[str, list[Any]] = {c: [] for c in self.columns}
        for i, row in enumerate(rows):
            for k in row:
                if k not in known_set:
                    raise BadInput(f"rows[{i}], column {shown(k)}: unknown column; the export reads {known}")
            for c in self.columns:
                v = row.get(c)
                try:
                    out[c].append(canonical_value(v, self.types.get(c, "unknown"), missing.get(c, ()), seps.get(c)))
                except ValueError as e:
                    raise BadInput(f"rows[{i}], column '{c}': {e} (got {shown(v)})") from None
        return out

    def _csv_layout(self, path: Path, delimiter: str | None) -> tuple[str, bool | str, list[str] | None]:
        """(delimiter, header, column_names) of a CSV file, as the Predictor reads it: the training
        data's CSV options for a file of the training format, else a header line and the
        format's delimiter (comma, or tab for ``.tsv``)."""
        data = self.manifest.get("data") or {}
        fmt = data.get("format")
        suffixes = [s.lower() for s in path.suffixes if s.lower() not in (".gz", ".bz2", ".xz")]
        ext = suffixes[-1].lstrip(".") if suffixes else ""
        file_fmt = ext if ext in ("csv", "tsv") else fmt if fmt in ("csv", "tsv") else "csv"
        opts = dict(data.get("csv") or {})
        if file_fmt != fmt and data.get("preset") != "criteo":
            opts.update({"delimiter": None, "header": True})
        delim = delimiter or opts.get("delimiter") or ("\t" if file_fmt == "tsv" else ",")
        return delim, opts.get("header", True), opts.get("column_names")

    def _csv_chunks(self, path: Path, delimiter: str | None) -> Iterator[tuple[dict[str, list[Any]], int, int]]:
        """(columns, rows, first line) chunks of a CSV file's rows (values as text)."""
        delim, header, names = self._csv_layout(path, delimiter)
        opener = {".gz": gzip.open, ".bz2": bz2.open, ".xz": lzma.open}.get(path.suffix.lower())
        raw = opener(path, "rb") if opener else open(path, "rb")
        with io.TextIOWrapper(raw, encoding="utf-8-sig", newline="") as text:
            reader = csv.reader(text, delimiter=delim)
            first = next(reader, None)
            if first is None:
                return
            if header is True or names is None:
                names = list(names) if names else first  # column_names replace a header's names
                pending: list[list[str]] = []
                line = 2
            elif header == "auto" and first == names:
                pending, line = [], 2
            else:
                pending, line = [first], 1
                if set(self.labels) <= set(names) and len(first) == len(names) - len(self.labels):
                    names = [c for c in names if c not in self.labels]  # a headerless file without its labels
            index = {n: j for j, n in enumerate(names)}
            absent = [c for c in self.columns if c not in index]
            if absent:
                raise BadInput(f"{path}: column(s) {absent} not found; the file has {names}")
            take = [(c, index[c]) for c in self.columns]
            rows: list[list[str]] = pending
            for rec in reader:
                rows.append(rec)
                if len(rows) == _CHUNK_ROWS:
                    yield self._csv_columns(rows, take, len(names), path, line), len(rows), line
                    line += len(rows)
                    rows = []
            if rows:
                yield self._csv_columns(rows, take, len(names), path, line), len(rows), line

    def _csv_columns(self, rows: list[list[str]], take: list[tuple[str, int]], width: int, path: Path, line: int
                     ) -> dict[str, list[Any]]:
        """A chunk's columns: text, as the training data's CSV reader gives it, except in columns
        whose training type is not text (a model trained on Parquet or synthetic data: integer
        IDs; list columns), whose values are brought to that type as the Predictor does."""
        for k, r in enumerate(rows):
            if len(r) != width:
                raise BadInput(f"{path} line {line + k}: {len(r)} fields, the header has {width}")
        seps = {f.column: f.separator for f in self.sparse.values()}
        missing = {f.column: f.missing for f in self.sparse.values()}
        out: dict[str, list[Any]] = {}
        for c, j in take:
            values: list[Any] = [r[j] for r in rows]
            type_ = self.types.get(c, "unknown")
            if type_ not in ("string", "unknown", "float"):
                done: dict[str, Any] = {}  # each distinct text once
                for k, v in enumerate(values):
                    if v not in done:
                        try:
                            done[v] = canonical_value(v, type_, missing.get(c, ()), seps.get(c))
                        except ValueError as e:
                            raise BadInput(f"{path} line {line + k}, column '{c}': {e} (got {shown(v)})") from None
                    values[k] = done[v]
            out[c] = values
        return out

    # ---- featurize -----------------------------------------------------------------------

    def _feeds(self, cols: Mapping[str, list[Any]], n: int, where: str, first_line: int | None) -> dict[str, np.ndarray]:
        """Model inputs of ``n`` rows whose values are ``cols`` (canonical values, or a file's text)."""
        def place(i: int) -> str:
            return f"rows[{i}]" if first_line is None else f"{where} line {first_line + i}"

        dense = np.empty((n, len(self.dense)), dtype=np.float32)
        for j, d in enumerate(self.dense):
            x = np.empty(n, dtype=np.float64)
            for i, v in enumerate(cols[d.column]):
                try:
                    p = parse_float(v)
                except ValueError as e:
                    raise BadInput(f"{place(i)}, column '{d.column}': {e}") from None
                x[i] = np.nan if p is None else p
            dense[:, j] = d.transform(x)
        bags = {name: self._bags(f, cols, n, place) for name, f in self.sparse.items()}
        feeds = {"dense": dense}
        for prefix, feats in (("pooled", self.features), ("linear", self.linear)):
            for i, (name, table, pooling) in enumerate(feats):
                ids, offsets, weights = bags[name]
                uniq, inverse = np.unique(ids, return_inverse=True)
                feeds[f"{prefix}_{i}"] = pool(self.tables[table].rows(uniq), inverse.reshape(-1), offsets, weights, pooling)
        return feeds

    def _elements(self, v: Any, type: str, separator: str | None) -> list[Any]:
        """A row's values of a (multi-hot) column, as the featurizer splits them."""
        if type.startswith("list<"):
            return [] if v is None else list(v)
        if separator is not None and isinstance(v, str):
            return v.split(separator)
        if v is None and separator is not None and type in ("string", "unknown"):
            return []  # a missing joined list: no values
        return [v]

    @staticmethod
    def _classify(f: _Feature, e: Any, strs: dict[str, int], ints: dict[int, int]) -> int:
        """One element of feature ``f`` as a code: -1 no value (missing, listed, an empty token),
        else 2·k for the distinct string ``k`` to hash, or 2·k + 1 for the integer ``k``; raises
        ValueError for a value that is no ID."""
        if f.hash_ids:
            if isinstance(e, str):
                if (f.separator is not None and e == "") or e in f.missing_set:
                    return -1
                return 2 * strs.setdefault(e, len(strs))
            if isinstance(e, bool):
                e = int(e)
            elif not isinstance(e, int):
                raise ValueError(f"{shown(e)} cannot be hashed to an ID (strings and integers can)")
            elif e in f.missing_ints:
                return -1
            return 2 * ints.setdefault(e, len(ints)) + 1
        if (isinstance(e, str) and e in f.missing_set) or (isinstance(e, int) and e in f.missing_ints):
            return -1
        try:
            p = parse_int(e)
        except ValueError:
            raise ValueError(f"not an integer ID (got {shown(e)})") from None
        return -1 if p is None else 2 * ints.setdefault(p, len(ints)) + 1

    def _bags(self, f: _Feature, cols: Mapping[str, list[Any]], n: int, place: Any
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """(ids int64, offsets int64 [n + 1], weights float32 or None) of feature ``f``; each
        distinct value is judged and hashed once."""
        type_ = self.types.get(f.column, "unknown")
        strs: dict[str, int] = {}
        ints: dict[int, int] = {}
        seen: dict[tuple[type, Any], int] = {}  # element (with its type: True is not 1) -> code
        codes: list[int] = []
        row_of: list[int] = []
        weights: list[float] | None = [] if f.weight_column else None
        wtype = self.types.get(f.weight_column, "float") if f.weight_column else "float"
        simple = f.separator is None and not type_.startswith("list<")  # one element per row: the value
        for i, v in enumerate(cols[f.column]):
            elems = [v] if simple else self._elements(v, type_, f.separator)
            ws: list[float] = []
            if f.weight_column is not None:
                wv = self._elements(cols[f.weight_column][i], wtype, f.separator)
                if len(wv) != len(elems):
                    raise BadInput(f"{place(i)}, column '{f.weight_column}': weights do not match the values of "
                                   f"'{f.column}' ({len(wv)} weights, {len(elems)} values)")
                for w in wv:
                    try:
                        p = parse_float(w)
                    except ValueError:
                        raise BadInput(f"{place(i)}, column '{f.weight_column}': weight is not a number (got {shown(w)})") from None
                    ws.append(1.0 if p is None else p)  # a missing weight counts as 1
            for k, e in enumerate(elems):
                if e is None:
                    continue
                key = (e.__class__, e)
                code = seen.get(key)
                if code is None:
                    try:
                        code = seen[key] = self._classify(f, e, strs, ints)
                    except ValueError as err:
                        raise BadInput(f"{place(i)}, column '{f.column}': {err}") from None
                if code < 0:
                    continue
                codes.append(code)
                row_of.append(i)
                if weights is not None:
                    weights.append(ws[k])
        hashed_s = hash_strings(list(strs), f.salt) if strs else np.zeros(0, np.int64)
        int_arr = np.fromiter(ints, dtype=np.int64, count=len(ints))
        hashed_i = hash_ints(int_arr, f.salt) if f.hash_ids else int_arr
        code = np.array(codes, dtype=np.int64)
        is_int = (code & 1).astype(bool)
        ids = np.empty(code.size, dtype=np.int64)
        ids[~is_int] = hashed_s[code[~is_int] >> 1]
        ids[is_int] = hashed_i[code[is_int] >> 1]
        rows = np.array(row_of, dtype=np.int64)
        w = np.array(weights, dtype=np.float32) if weights is not None else None
        counts = np.bincount(rows, minlength=n).astype(np.int64)
        if f.max_length is not None and counts.size and counts.max() > f.max_length:
            starts = np.cumsum(counts) - counts
            keep = (np.arange(rows.size) - np.repeat(starts, counts)) < f.max_length
            ids, w = ids[keep], (w[keep] if w is not None else None)
            counts = np.minimum(counts, f.max_length)
        offsets = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(counts, out=offsets[1:])
        return ids, offsets, w

