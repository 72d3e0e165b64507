"""Export for serving: a self-contained directory that ``ember.serving.Predictor`` loads.

Layout::

    manifest.json          schema, features, tables (dim, initialiser, rows), tasks, sha256 of files
    model.pt               the dense model as TorchScript: (dense, pooled, linear) -> logits
    tables/<name>.ids      int64 IDs, sorted (looked up with a binary search)
    tables/<name>.weights  float32 [rows, dim] weights only (optimizer state is dropped)
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import torch

from ember.checkpoint.atomic import HashingWriter, fsync_dir
from ember.config import RunConfig
from ember.train.builder import Components

__all__ = ["export_model", "EXPORT_VERSION"]

EXPORT_VERSION = 1


def export_model(parts: Components, cfg: RunConfig, out_dir: str | Path) -> Path:
    """Write the trained model to ``out_dir`` (replaced atomically if it exists)."""
    out = Path(out_dir)
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    if tmp.exists():
        shutil.rmtree(tmp)
    (tmp / "tables").mkdir(parents=True)
    files: dict[str, str] = {}
    parts.model.eval()
    scripted = torch.jit.script(parts.model.cpu())
    scripted.save(str(tmp / "model.pt"))
    parts.model.to(parts.device)
    from ember.checkpoint.atomic import sha256_file

    files["model.pt"] = sha256_file(tmp / "model.pt")
    tables = []
    for ec in parts.collections():
        for name, table in ec.tables.items():
            chunks = list(table.items())
            ids = torch.cat([c[0] for c in chunks]).numpy() if chunks else np.empty(0, np.int64)
            w = torch.cat([c[1][:, : table.dim] for c in chunks]).numpy() if chunks else np.empty((0, table.dim), np.float32)
            order = np.argsort(ids, kind="stable")
            for suffix, arr in [("ids", ids[order].astype("<i8")), ("weights", np.ascontiguousarray(w[order], dtype="<f4"))]:
                wr = HashingWriter(tmp / "tables" / f"{name}.{suffix}")
                wr.write(arr.tobytes())
                files[f"tables/{name}.{suffix}"] = wr.close()
            tables.append({
                "name": name, "dim": table.dim, "rows": int(ids.size), "seed": table.seed,
                "initializer": table.config.initializer.model_dump(mode="json"),
            })
    manifest = {
        "format_version": EXPORT_VERSION,
        "data": cfg.data.model_dump(mode="json"),
        "schema": cfg.schema.model_dump(mode="json"),
        "features": [f.model_dump(mode="json") for f in parts.embeddings.features],
        "linear_features": [f.model_dump(mode="json") for f in parts.linear.features] if parts.linear else None,
        "tables": tables,
        "tasks": parts.task_names,
        "model": cfg.model.model_dump(mode="json"),
        "files": files,
    }
    (tmp / "manifest.json").write_text(json.dumps(manifest, indent=1))
    fsync_dir(tmp / "tables")
    fsync_dir(tmp)
    if out.exists():
        shutil.rmtree(out)
    os.rename(tmp, out)
    fsync_dir(out.parent)
    return out
