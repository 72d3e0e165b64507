"""Predictor: load an export directory and score batches or raw input files.

Needs only torch, numpy, pyarrow and ember's featurizer and pooling; no optimizer, tier or
trainer code. Unseen IDs get the same deterministic initial row the trained model saw for
them, so scores equal the trained model's on any input.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterable

import numpy as np
import torch
from torch import Tensor

from ember.batch import Batch, SparseFeatures
from ember.checkpoint.atomic import sha256_file
from ember.embedding.pooling import pool_feature
from ember.embedding.config import FeatureConfig
from ember.embedding.init import InitializerConfig, init_rows
from ember.errors import CheckpointError

__all__ = ["Predictor"]


class _FrozenTable:
    """Sorted IDs + weights; lookup by binary search, init rows for unseen IDs."""

    def __init__(self, root: Path, meta: dict[str, Any]) -> None:
        self.dim = meta["dim"]
        self.seed = meta["seed"]
        self.init = InitializerConfig.model_validate(meta["initializer"])
        n = meta["rows"]
        self.ids = np.fromfile(root / "tables" / f"{meta['name']}.ids", dtype="<i8") if n else np.empty(0, np.int64)
        w = np.fromfile(root / "tables" / f"{meta['name']}.weights", dtype="<f4") if n else np.empty(0, np.float32)
        self.weights = torch.from_numpy(w.reshape(n, self.dim))

    def rows(self, ids: Tensor) -> Tensor:
        q = ids.numpy()
        pos = np.searchsorted(self.ids, q)
        pos_c = np.minimum(pos, max(self.ids.size - 1, 0))
        found = (self.ids.size > 0) & (self.ids[pos_c] == q) if self.ids.size else np.zeros(q.size, bool)
        out = torch.empty(q.size, self.dim)
        if found.any():
            out[torch.from_numpy(found)] = self.weights[torch.from_numpy(pos_c[found])]
        if (~found).any():
            out[torch.from_numpy(~found)] = init_rows(ids[torch.from_numpy(~found)], self.dim, self.init, self.seed)
        return out


class Predictor:
    """Scores rows with an exported model.

    Example (after ``ember export``)::

        p = Predictor.load("runs/demo/export")
        probs = p.predict_files(["new_rows.parquet"])   # [N, T] click probabilities
    """

    def __init__(self, root: Path, manifest: dict[str, Any]) -> None:
        self.root = root
        self.manifest = manifest
        self.model = torch.jit.load(str(root / "model.pt"), map_location="cpu")
        self.model.eval()
        self.tables = {t["name"]: _FrozenTable(root, t) for t in manifest["tables"]}
        self.features = [FeatureConfig.model_validate(f) for f in manifest["features"]]
        lin = manifest.get("linear_features")
        self.linear_features = [FeatureConfig.model_validate(f) for f in lin] if lin else None
        self.tasks: list[str] = manifest["tasks"]

    @classmethod
    def load(cls, path: str | Path, verify: bool = True) -> "Predictor":
        root = Path(path)
        mf = root / "manifest.json"
        if not mf.exists():
            raise CheckpointError(f"{root} is not an ember export (no manifest.json); create one with `ember export`")
        manifest = json.loads(mf.read_text())
        if verify:
            for rel, digest in manifest["files"].items():
                if sha256_file(root / rel) != digest:
                    raise CheckpointError(f"export {root}: {rel} is damaged (sha256 mismatch); export again")
        return cls(root, manifest)

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
        return torch.sigmoid(self.model(batch.dense, pooled, linear)).numpy()

    def predict_batches(self, batches: Iterable[Batch]) -> np.ndarray:
        parts = [self.predict_batch(b) for b in batches]
        return np.concatenate(parts) if parts else np.zeros((0, len(self.tasks)))

    def predict_files(self, paths: list[str], **data_overrides: Any) -> np.ndarray:
        """Probabilities [N, T] for raw rows in files of the export's data format (order kept)."""
        from ember.featurize.schema import Schema, as_recorded
        from ember.pipeline.loader import make_batches
        from ember.source.config import DataConfig

        data = {**self.manifest["data"], "eval": list(paths), "shuffle_buffer": 0}
        data.pop("train", None)
        fmt = _format_of(paths)
        if fmt is not None and fmt != data.get("format"):  # e.g. a model trained on synthetic data
            data["format"] = fmt
            if fmt in ("csv", "tsv") and data.get("preset") != "criteo":
                data["csv"] = {**data.get("csv", {}), "delimiter": None, "header": True}
        data.update(data_overrides)
        cfg = DataConfig.model_validate(data)
        schema = Schema.model_validate({**as_recorded(self.manifest["schema"]), "score_only": True})  # labels may be absent
        return self.predict_batches(make_batches(cfg, schema, "eval"))


def _format_of(paths: list[str]) -> str | None:
    """File format from the extensions of ``paths`` (None when unknown or mixed)."""
    exts = {Path(p).suffix.lower().lstrip(".") for p in paths}
    if len(exts) == 1 and (ext := exts.pop()) in ("csv", "tsv", "parquet", "orc"):
        return ext
    return None
