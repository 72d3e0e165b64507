"""Export for serving: a self-contained directory that ``ember.serving.Predictor`` loads.

Layout::

    manifest.json          schema, features, tables (dim, initialiser, seed, rows, min_count), tasks,
                           sha256 of files
    model.pt               the dense model as TorchScript: (dense, pooled, linear) -> logits
    tables/<name>.ids      int64 IDs, sorted (looked up with a binary search)
    tables/<name>.weights  [rows, dim] weights only (optimizer state is dropped), at the table's
                           dtype: float32, or the 16-bit patterns of bf16 / fp16 (format 3 on)

An ID without a row is served as eval scores it: a table's ``min_count`` (format version 2 on)
says whether that is the ID's initial row (``min_count`` 1) or the all-zero row of IDs held
back by admission (``min_count`` > 1).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterable, Mapping, Protocol, Sequence

import numpy as np
import torch
from torch import nn

from ember.checkpoint.atomic import HashingWriter, sha256_file
from ember.embedding.codec import to_bits
from ember.errors import CheckpointError
from ember.fileio import atomic_dir, fsync_dir

__all__ = ["export_model", "EXPORT_VERSION"]

EXPORT_VERSION = 3  # 2: tables record min_count; 3: tables record their dtype (16-bit weights)

# keys of the run config's JSON form that the export records (Predictor reads data and schema)
RUN_CONFIG_KEYS = ("data", "schema", "model")


class _Dumpable(Protocol):
    def model_dump(self, *, mode: str = ...) -> dict[str, Any]: ...


class _Table(Protocol):
    dim: int
    seed: int  # the effective seed of the table's initial rows
    config: Any  # .initializer (a pydantic model), .min_count, .dtype (fp32 when absent)

    def items(self) -> Iterable[tuple[torch.Tensor, torch.Tensor]]: ...


class _Collection(Protocol):
    tables: Mapping[str, _Table]


def export_model(
    model: nn.Module,
    collections: Sequence[_Collection],
    features: Sequence[_Dumpable],
    linear_features: Sequence[_Dumpable] | None,
    task_names: Sequence[str],
    run_config: Mapping[str, Any],
    out_dir: str | Path,
) -> Path:
    """Write a trained model to ``out_dir`` (replaced atomically if it exists) for serving. A
    failed write (a full disk: CheckpointError naming ``out_dir`` and the bytes needed) leaves
    the old export, if any, and no temporary directory.

    Takes plain parts, so checkpoint needs neither the trainer nor the run config classes:

    - ``model``: the dense model, ``(dense, pooled, linear) -> logits``; it is scripted on the
      CPU and put back on its device and in its train/eval mode afterwards;
    - ``collections``: every embedding collection whose tables the model reads (anything with
      ``.tables: {name: table}``; a table has ``items()``, ``dim``, ``config.initializer``,
      ``config.min_count`` and its effective ``seed``);
    - ``features`` / ``linear_features``: the embedding FeatureConfigs feeding ``pooled`` /
      ``linear`` (None without a linear part);
    - ``task_names``: the label of each logit column;
    - ``run_config``: the run config as JSON, e.g. ``cfg.model_dump(mode="json", by_alias=True)``;
      its ``data``, ``schema`` and ``model`` sections are recorded.
    """
    missing = [k for k in RUN_CONFIG_KEYS if run_config.get(k) is None]
    if missing:
        raise ValueError(f"export_model: run_config lacks {missing}; pass the resolved run config as JSON, "
                         "e.g. cfg.model_dump(mode='json', by_alias=True)")
    out = Path(out_dir)

    def needed() -> int:  # asked only when the disk is full
        return sum(p.numel() * p.element_size() for p in model.parameters()) + sum(
            ids.numel() * (8 + _weight_bytes(t) * t.dim) for ec in collections for t in ec.tables.values()
            for ids, _ in t.items())

    with atomic_dir(out, CheckpointError, needed, "the previous export, if any, is kept") as tmp:
        _write(tmp, model, collections, features, linear_features, task_names, run_config)
    return out


def _write(tmp: Path, model: nn.Module, collections: Sequence[_Collection], features: Sequence[_Dumpable],
           linear_features: Sequence[_Dumpable] | None, task_names: Sequence[str],
           run_config: Mapping[str, Any]) -> None:
    """Every file of the export into the directory ``tmp``, fsynced."""
    (tmp / "tables").mkdir()
    files: dict[str, str] = {}
    files["model.pt"] = _script(model, tmp / "model.pt")
    tables = []
    for ec in collections:
        for name, table in ec.tables.items():
            chunks = list(table.items())
            ids = torch.cat([c[0] for c in chunks]).numpy() if chunks else np.empty(0, np.int64)
            w = torch.cat([c[1][:, : table.dim] for c in chunks]).numpy() if chunks else np.empty((0, table.dim), np.float32)
            order = np.argsort(ids, kind="stable")
            dtype = getattr(table.config, "dtype", "fp32")
            if dtype == "fp32":
                weights = np.ascontiguousarray(w[order], dtype="<f4")
            else:  # the stored values exactly, two bytes each
                weights = to_bits(torch.from_numpy(np.ascontiguousarray(w[order])), dtype).numpy().astype("<i2")
            for suffix, arr in [("ids", ids[order].astype("<i8")), ("weights", weights)]:
                wr = HashingWriter(tmp / "tables" / f"{name}.{suffix}")
                try:
                    wr.write(arr.tobytes())
                finally:
                    files[f"tables/{name}.{suffix}"] = wr.close()
            tables.append({
                "name": name, "dim": table.dim, "rows": int(ids.size), "seed": int(table.seed),
                "initializer": table.config.initializer.model_dump(mode="json"),
                "min_count": int(table.config.min_count), "dtype": dtype,
            })
    manifest = {
        "format_version": EXPORT_VERSION,
        "data": run_config["data"],
        "schema": run_config["schema"],
        "features": [f.model_dump(mode="json") for f in features],
        "linear_features": [f.model_dump(mode="json") for f in linear_features] if linear_features is not None else None,
        "tables": tables,
        "tasks": list(task_names),
        "model": run_config["model"],
        "files": files,
    }
    mw = HashingWriter(tmp / "manifest.json")
    try:
        mw.write(json.dumps(manifest, indent=1).encode())
    finally:
        mw.close()
    fsync_dir(tmp / "tables")


def _weight_bytes(table: _Table) -> int:
    """Bytes per exported weight: 4 for fp32 tables, 2 for bf16 / fp16 ones."""
    return 4 if getattr(table.config, "dtype", "fp32") == "fp32" else 2


def _script(model: nn.Module, path: Path) -> str:
    """Save ``model`` as TorchScript on the CPU at ``path``; return its sha256."""
    devices = {t.device for t in (*model.parameters(), *model.buffers())}
    if len(devices) > 1:
        raise ValueError(f"export_model: the model spans devices {sorted(map(str, devices))}; move it to one device first")
    device = devices.pop() if devices else torch.device("cpu")
    was_training = model.training
    model.eval()
    try:
        torch.jit.script(model.cpu()).save(str(path))
    finally:
        model.to(device)
        model.train(was_training)
    return sha256_file(path)
