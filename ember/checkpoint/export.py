"""Export for serving: a self-contained directory that ``ember.serving.Predictor`` loads.

Layout::

    manifest.json          schema, input_types (each input column's type in training), features, tables (dim, initialiser, seed, rows, min_count), tasks,
                           sha256 of files
    dense.pt               the dense model's state_dict (format 5 on): tensors only, read with
                           torch's weights-only unpickler; ``Predictor`` builds the model with
                           ember's own code from the manifest's ``model`` and ``model_inputs``
    model.onnx             (``ember export --format onnx``) the dense model as an ONNX graph, for
                           ``ember.portable`` and standard inference servers (``ember.checkpoint.onnx``);
                           the manifest's ``onnx`` entry names its inputs and outputs
    model.pt               the dense model as TorchScript: (dense, pooled, linear) -> logits, for
                           other runtimes. TorchScript is a program (a crafted one runs what it
                           likes): ember loads it only for what nothing else describes (an export
                           before format 5, a model of no built-in type) and only when trusted
                           explicitly (``trust_torchscript``, ``--trust-torchscript``; ``load_export_model``)
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

import io
import json
from pathlib import Path
from typing import Any, Iterable, Mapping, Protocol, Sequence

import numpy as np
import torch
from torch import nn

from ember.checkpoint.atomic import HashingWriter, sha256_file
from ember.checkpoint.safe_torch import read_torch_file
from ember.embedding.codec import to_bits
from ember.errors import CheckpointError, ConfigError
from ember.fileio import atomic_dir, fsync_dir
from ember.outputs import output_kind

__all__ = ["export_model", "EXPORT_VERSION", "encode_weights", "write_array", "table_meta", "script_model",
           "model_files", "load_export_model"]

# 2: tables record min_count; 3: tables record their dtype (16-bit weights); 4: TTL tables record
# their step, ttl_steps and each row's last-seen step; exports may carry a ``series`` entry (delta
# exports); 5: the dense model's weights in dense.pt and its input layout in ``model_inputs``, so
# serving builds the model itself and never loads TorchScript
EXPORT_VERSION = 5
# =1: serve an export whose model only its TorchScript gives (before format 5, or a custom model)

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
    *,
    onnx: bool = False,
) -> Path:
    """Write a trained model to ``out_dir`` (an earlier export there is replaced atomically; any
    other non-empty path is refused, CheckpointError: ember never deletes what it did not write) for serving. A
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
      exports of a delta series, ``ember.checkpoint.delta``);
    - ``onnx``: also write the dense model as ``model.onnx`` (``ember.checkpoint.onnx``); a model
      ONNX cannot express is refused (ConfigError) before anything is written.
    """
    missing = [k for k in RUN_CONFIG_KEYS if run_config.get(k) is None]
    if missing:
        raise ValueError(f"export_model: run_config lacks {missing}; pass the resolved run config as JSON, "
                         "e.g. cfg.model_dump(mode='json', by_alias=True)")
    if onnx:
        from ember.checkpoint.onnx import onnx_refusal, require_onnx

        require_onnx()
        why = onnx_refusal(features, linear_features)
        if why:
            raise ConfigError(f"--format onnx: the {run_config['model'].get('type')!r} model cannot be served from an "
                              f"ONNX graph: {why}; export with --format ember (the default) and serve with ember serve")
    out = Path(out_dir)
    if output_kind(out) != "export" and out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise CheckpointError(f"export_model: {out} exists and is not an earlier export ({_what(out)}); an export "
                              "replaces only an export: choose another directory")

    def needed() -> int:  # asked only when the disk is full
        return sum(p.numel() * p.element_size() for p in model.parameters()) + sum(
            ids.numel() * (8 + _weight_bytes(t) * t.dim) for ec in collections for t in ec.tables.values()
            for ids, _ in t.items())

    with atomic_dir(out, CheckpointError, needed, "the previous export, if any, is kept") as tmp:
        _write(tmp, model, collections, features, linear_features, task_names, run_config, extra or {}, onnx)
    return out


def _what(path: Path) -> str:
    kind = output_kind(path)
    return f"it holds {kind} output" if kind else "a file" if not path.is_dir() else "it holds other files"


def _write(tmp: Path, model: nn.Module, collections: Sequence[_Collection], features: Sequence[_Dumpable],
           linear_features: Sequence[_Dumpable] | None, task_names: Sequence[str],
           run_config: Mapping[str, Any], extra: Mapping[str, Any], onnx: bool = False) -> None:
    """Every file of the export into the directory ``tmp``, fsynced."""
    (tmp / "tables").mkdir()
    files, model_inputs = model_files(model, tmp, collections, features, task_names, run_config)
    if onnx:
        from ember.checkpoint.onnx import ONNX_FILE, onnx_graph

        graph, onnx_entry = onnx_graph(model, model_inputs, len(linear_features) if linear_features is not None else None,
                                       str(run_config["model"].get("type")))
        files[ONNX_FILE] = write_array(tmp / ONNX_FILE, [graph])
        extra = {**extra, "onnx": onnx_entry}
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
        "model_inputs": model_inputs,
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


def model_files(model: nn.Module, tmp: Path, collections: Sequence[_Collection], features: Sequence[Any],
                task_names: Sequence[str], run_config: Mapping[str, Any]) -> tuple[dict[str, str], dict[str, Any]]:
    """Write the dense model into the export directory ``tmp``: ``model.pt`` (TorchScript) and
    ``dense.pt`` (its state_dict, tensors only); returns their sha256 by name and the model's
    input layout (``ModelInputs`` as the trainer built it: the manifest's ``model_inputs``)."""
    files = {"model.pt": script_model(model, tmp / "model.pt")}
    state = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    buf = io.BytesIO()
    torch.save(state, buf)
    files["dense.pt"] = write_array(tmp / "dense.pt", [buf.getvalue()])
    dims = {name: t.dim for ec in collections for name, t in ec.tables.items()}
    inputs = {"num_dense": len(run_config["schema"].get("dense") or []),
              "sparse_dims": [int(dims[f.table_name]) for f in features], "num_tasks": len(task_names),
              "feature_names": [f.name for f in features]}
    return files, inputs


def load_export_model(root: Path, manifest: Mapping[str, Any], trust_torchscript: bool = False) -> nn.Module:
    """The dense model of the export (or delta export) at ``root``, in eval mode, loading no
    code from it: built by ember's model code from the manifest's ``model`` config and
    ``model_inputs``, its weights read from ``dense.pt`` by torch's weights-only unpickler (a
    pickled object in it: CheckpointError naming the file).

    Only TorchScript (``model.pt``) can give the model of an export before format 5, or of a
    model that is not one of ember's built-in types (``export_model`` of your own module), and
    TorchScript is a program: those are refused (CheckpointError saying why) unless
    ``trust_torchscript`` (``ember serve`` / ``ember predict --trust-torchscript``) says the
    export comes from a source you trust.
    """
    from ember.models.base import ModelInputs
    from ember.models.registry import MODEL_TYPES, build_model

    version = manifest.get("format_version")
    kind = (manifest.get("model") or {}).get("type")
    why = (f"was written before format 5 (it is format {version})" if not isinstance(version, int) or version < 5
           else f"holds a model of type {kind!r}, not one of ember's ({', '.join(MODEL_TYPES)})" if kind not in MODEL_TYPES
           else "")
    if why:
        if not trust_torchscript:
            raise CheckpointError(
                f"export {root} {why}: only its TorchScript ({root / 'model.pt'}) gives its dense model, and TorchScript "
                "is a program: loading it could run arbitrary code, so ember does not. Export the checkpoint again "
                "with this ember and a built-in model type, or, if you trust where the export came from, give "
                "--trust-torchscript (ember serve / ember predict; Predictor.load(..., trust_torchscript=True))")
        try:
            return torch.jit.load(str(root / "model.pt"), map_location="cpu").eval()
        except RuntimeError as e:
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise CheckpointError(f"export {root}: {root / 'model.pt'} is not a TorchScript model ({first}); "
                                  "export the checkpoint again") from e
    state = read_torch_file(root / "dense.pt", f"export {root}", "export the checkpoint again")
    try:
        with torch.random.fork_rng(devices=[]):  # building initialises weights: the caller's RNG stays where it was
            model = build_model(manifest["model"], ModelInputs(**manifest["model_inputs"]))
    except (KeyError, TypeError, ValueError) as e:  # ConfigError is a ValueError
        raise CheckpointError(f"export {root}: its manifest's model / model_inputs do not describe a model ember "
                              f"builds ({type(e).__name__}: {e}); export the checkpoint again") from e
    try:
        model.load_state_dict(state)
    except (RuntimeError, TypeError) as e:
        why = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise CheckpointError(f"export {root}: dense.pt does not fit the model its manifest describes ({why}); "
                              "export the checkpoint again") from e
    return model.eval()


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
