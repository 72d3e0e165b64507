"""Export for serving: a self-contained directory that ``ember.serving.Predictor`` loads.

Layout::

    manifest.json          schema, input_types (each input column's type in training), features, tables (dim, initialiser, seed, rows, min_count), tasks,
                           sha256 of files
    model.pt               the dense model as TorchScript: (dense, pooled, linear) -> logits
    tables/<name>.ids      int64 IDs, sorted (looked up with a binary search)
    tables/<name>.weights  [rows, dim] weights only (optimizer state is dropped), at the table's
                           dtype: float32, or the 16-bit patterns of bf16 / fp16 (format 3 on)
    tables/<name>.seen     (tables with ``ttl_steps``, format 4 on) float32 last-seen step of each
                           row; the manifest records the table's ``step`` and ``ttl_steps``, so a
                           server applying later delta exports knows when a row expires

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

__all__ = ["export_model", "EXPORT_VERSION", "encode_weights", "write_array", "table_meta", "script_model"]

# 2: tables record min_count; 3: tables record their dtype (16-bit weights); 4: TTL tables record
# their step, ttl_steps and each row's last-seen step; exports may carry a ``series`` entry (delta exports)
EXPORT_VERSION = 4

# keys of the run config's JSON form that the export records (Predictor reads data and schema)
RUN_CONFIG_KEYS = ("data", "schema", "model")


class _Dumpable(Protocol):
    def model_dump(self, *, mode: str = ...) -> dict[str, Any]: ...


class _Table(Protocol):
    dim: int
    seed: int  # the effective seed of the table's initial rows
    config: Any  # .initializer (a pydantic model), .min_count, .dtype (fp32 when absent)

    def items(self) -> Iterable[tuple[torch.Tensor, torch.Tensor]]: ...

    def items_with_seen(self) -> Iterable[tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]]: ...


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
    extra: Mapping[str, Any] | None = None,
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
      its ``data``, ``schema`` and ``model`` sections are recorded;
    - ``extra``: more top-level manifest entries (e.g. ``step``, or ``series`` for the full
      exports of a delta series, ``ember.checkpoint.delta``).
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
        _write(tmp, model, collections, features, linear_features, task_names, run_config, extra or {})
    return out


def _write(tmp: Path, model: nn.Module, collections: Sequence[_Collection], features: Sequence[_Dumpable],
           linear_features: Sequence[_Dumpable] | None, task_names: Sequence[str],
           run_config: Mapping[str, Any], extra: Mapping[str, Any]) -> None:
    """Every file of the export into the directory ``tmp``, fsynced."""
    (tmp / "tables").mkdir()
    files: dict[str, str] = {}
    files["model.pt"] = script_model(model, tmp / "model.pt")
    tables = []
    for ec in collections:
        for name, table in ec.tables.items():
            ttl = getattr(table.config, "ttl_steps", None)
            chunks = list(table.items_with_seen() if ttl else ((i, r, None) for i, r in table.items()))
            ids = torch.cat([c[0] for c in chunks]).numpy() if chunks else np.empty(0, np.int64)
            w = torch.cat([c[1][:, : table.dim] for c in chunks]).numpy() if chunks else np.empty((0, table.dim), np.float32)
            order = np.argsort(ids, kind="stable")
            arrays = [("ids", ids[order].astype("<i8")), ("weights", encode_weights(w[order], _dtype(table)))]
            if ttl:
                seen = torch.cat([c[2] for c in chunks]).numpy() if chunks else np.empty(0, np.float32)  # type: ignore[misc]
                arrays.append(("seen", seen[order].astype("<f4")))
            for suffix, arr in arrays:
                files[f"tables/{name}.{suffix}"] = write_array(tmp / "tables" / f"{name}.{suffix}", [arr])
            tables.append({**table_meta(name, table), "rows": int(ids.size)})
    manifest = {
        "format_version": EXPORT_VERSION,
        **extra,
        "data": run_config["data"],
        "schema": run_config["schema"],
        "input_types": input_types(run_config),
        "features": [f.model_dump(mode="json") for f in features],
        "linear_features": [f.model_dump(mode="json") for f in linear_features] if linear_features is not None else None,
        "tables": tables,
        "tasks": list(task_names),
        "model": run_config["model"],
        "files": files,
    }
    write_array(tmp / "manifest.json", [json.dumps(manifest, indent=1).encode()])
    fsync_dir(tmp / "tables")


def input_types(run_config: Mapping[str, Any]) -> dict[str, Any]:
    """Each input column's role and type as training read it (``{"columns": {column: {"role",
    "type"}}, "found": how}``), so serving brings every value to that type before hashing it
    (``ember.featurize.canonical``: the integer 4 and the text "4" are two IDs)."""
    from ember.featurize.canonical import training_types
    from ember.featurize.schema import Schema, as_recorded

    columns, how = training_types(Schema.model_validate(as_recorded(run_config["schema"])), run_config["data"])
    return {"columns": columns, "found": how}


def _dtype(table: _Table) -> str:
    return getattr(table.config, "dtype", "fp32")


def table_meta(name: str, table: _Table) -> dict[str, Any]:
    """A table's manifest entry but its row count: what serving needs to read its rows and
    give IDs without a row what eval gives them (initial row or zero row; TTL: ``step`` and
    ``ttl_steps`` say which stored rows have expired)."""
    meta = {"name": name, "dim": table.dim, "seed": int(table.seed),
            "initializer": table.config.initializer.model_dump(mode="json"),
            "min_count": int(table.config.min_count), "dtype": _dtype(table)}
    ttl = getattr(table.config, "ttl_steps", None)
    if ttl:
        meta.update({"ttl_steps": int(ttl), "step": int(getattr(table, "step"))})
    return meta


def encode_weights(w: np.ndarray, dtype: str) -> np.ndarray:
    """Weights [N, dim] (float32) as an export stores them: little-endian float32, or the exact
    16-bit patterns of a bf16 / fp16 table."""
    if dtype == "fp32":
        return np.ascontiguousarray(w, dtype="<f4")
    return to_bits(torch.from_numpy(np.ascontiguousarray(w, dtype=np.float32)), dtype).numpy().astype("<i2")


def write_array(path: Path, parts: Iterable[np.ndarray | bytes]) -> str:
    """Write ``parts`` (arrays or bytes, in order) to ``path``, fsynced; returns the sha256."""
    wr = HashingWriter(path)
    try:
        for p in parts:
            wr.write(p if isinstance(p, bytes) else p.tobytes())
    finally:
        digest = wr.close()
    return digest


def _weight_bytes(table: _Table) -> int:
    """Bytes per exported weight: 4 for fp32 tables, 2 for bf16 / fp16 ones."""
    return 4 if getattr(table.config, "dtype", "fp32") == "fp32" else 2


def script_model(model: nn.Module, path: Path) -> str:
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
