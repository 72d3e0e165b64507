"""Checkpoints: one directory per save, written under a temp name and renamed when complete.

Layout of ``<run>/checkpoints/step-00000100/``::

    manifest.json      version, step, data position, config, tables, sha256 of every file
    dense.pt           model + dense optimizer state_dicts, RNG states, table step counters
    tables/<name>.ids  int64 IDs, streamed in chunks (sorted by ID per chunk)
    tables/<name>.rec  records [weights | optimizer state], same order, packed at the table's
                       dtype (``RowCodec``: fp32 words; bf16/fp16 weights two to a word)
    tables/<name>.seen last-seen step per row (float32), tables with a TTL

A full disk raises CheckpointError naming the directory and the bytes needed, and removes the
temporary directory. A crash at any point leaves the previous checkpoint untouched: files go to a ``.tmp-*``
directory, each is fsynced, the directory is renamed, then ``LATEST`` is replaced atomically.
"""

from __future__ import annotations

import io
import json
import os
import random
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ember.checkpoint.atomic import HashingWriter, atomic_write_bytes, fsync_dir
from ember.embedding import EmbeddingCollection
from ember.embedding.codec import RowCodec
from ember.errors import CheckpointError
from ember.fileio import is_no_space, no_space_error

__all__ = ["save_checkpoint", "checkpoint_bytes", "FORMAT_VERSION", "rng_state", "mark_best", "best_checkpoint", "checkpoint_path"]

FORMAT_VERSION = 2  # 2: tables record their row dtype; .rec rows are packed at it


def rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def save_checkpoint(
    root: Path,
    step: int,
    collections: list[EmbeddingCollection],
    dense_state: dict[str, Any],
    position: dict[str, int],
    config: dict[str, Any],
    keep: int = 2,
) -> Path:
    """Write a complete checkpoint under ``root`` and point ``root/LATEST`` at it; returns its path."""
    root.mkdir(parents=True, exist_ok=True)
    final = checkpoint_path(root, step)
    tmp = root / f".tmp-step-{step:08d}-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    try:
        _write(tmp, step, collections, dense_state, position, config)
    except BaseException as e:  # a failed save leaves no half-written directory behind
        shutil.rmtree(tmp, ignore_errors=True)
        if is_no_space(e):
            raise no_space_error(CheckpointError, final, checkpoint_bytes(collections, dense_state),
                                 e, "the previous checkpoint is kept (lower train.keep_checkpoints or move "
                                 "train.out_dir to a larger volume)") from e  # type: ignore[arg-type]
        raise
    old = None
    try:
        if final.exists():  # a second save of the same step: move the old one aside, never delete first
            old = root / f".old-{final.name}-{os.getpid()}"
            os.rename(final, old)
        os.rename(tmp, final)
        fsync_dir(root)
        atomic_write_bytes(root / "LATEST", final.name.encode())
    except BaseException as e:  # e.g. a full disk at the rename or LATEST: back to the previous checkpoint
        _undo_publish(tmp, final, old)
        if isinstance(e, CheckpointError) or not is_no_space(e):
            raise
        raise no_space_error(CheckpointError, final, None, e, "the previous checkpoint is kept") from e  # type: ignore[arg-type]
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    _prune(root, keep)
    return final


def _undo_publish(tmp: Path, final: Path, old: Path | None) -> None:
    """Undo a save whose directory was (maybe) renamed in but not named by LATEST: the new
    directory goes, a same-step predecessor moved aside comes back. LATEST still names the
    previous checkpoint, which is thus untouched."""
    shutil.rmtree(tmp, ignore_errors=True)
    if old is None:
        shutil.rmtree(final, ignore_errors=True)
    elif old.exists():
        shutil.rmtree(final, ignore_errors=True)
        os.rename(old, final)


def checkpoint_bytes(collections: list[EmbeddingCollection], dense_state: dict[str, Any]) -> int:
    """About how many bytes a checkpoint of these tables and dense state takes on disk."""
    total = _tensor_bytes(dense_state)
    for ec in collections:
        for table in ec.tables.values():
            per_row = 8 + 4 * table.config.stored_words  # ID + packed record (+ last-seen step)
            total += len(table) * per_row
    return total


def _tensor_bytes(obj: Any) -> int:
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(_tensor_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(_tensor_bytes(v) for v in obj)
    return 0


def _write(tmp: Path, step: int, collections: list[EmbeddingCollection], dense_state: dict[str, Any],
           position: dict[str, int], config: dict[str, Any]) -> None:
    """Every file of the checkpoint into the directory ``tmp``, fsynced."""
    (tmp / "tables").mkdir(parents=True)
    files: dict[str, str] = {}
    tables_meta = []
    steps, admission = {}, {}
    for ec in collections:
        for name, table in ec.tables.items():
            table.flush()
            admission[name] = table.admission_state()  # min_count sightings of IDs without a row
            ids_w = HashingWriter(tmp / "tables" / f"{name}.ids")
            rec_w = HashingWriter(tmp / "tables" / f"{name}.rec")
            # with a TTL, each row's last-seen step too, so rows expire on the same steps after a resume
            seen_w = HashingWriter(tmp / "tables" / f"{name}.seen") if table.config.ttl_steps else None
            rows = 0
            # rows are saved packed at the table's dtype: its values are representable, so
            # rounding to nearest repacks them exactly
            codec = RowCodec(table.config.dtype, table.dim, table.config.record_dim)
            for ids, records, seen in table.items_with_seen():
                ids_w.write(ids.numpy().astype("<i8", copy=False).tobytes())
                rec_w.write(codec.encode_nearest(records.contiguous()).numpy().astype("<f4", copy=False).tobytes())
                if seen_w is not None and seen is not None:
                    seen_w.write(seen.numpy().astype("<f4", copy=False).tobytes())
                rows += ids.numel()
            files[f"tables/{name}.ids"] = ids_w.close()
            files[f"tables/{name}.rec"] = rec_w.close()
            if seen_w is not None:
                files[f"tables/{name}.seen"] = seen_w.close()
            steps[name] = table.step
            tables_meta.append({"name": name, "rows": rows, "dim": table.dim, "record_dim": table.config.record_dim,
                                "dtype": table.config.dtype, "record_words": codec.words,
                                "optimizer": table.config.optimizer.model_dump(mode="json")})
    buf = io.BytesIO()
    torch.save({**dense_state, "rng": rng_state(), "table_steps": steps, "admission": admission}, buf)
    dense_w = HashingWriter(tmp / "dense.pt")
    dense_w.write(buf.getvalue())
    files["dense.pt"] = dense_w.close()
    manifest = {
        "format_version": FORMAT_VERSION,
        "step": step,
        "position": position,
        "time": time.time(),
        "tables": tables_meta,
        "files": files,
        "config": config,
    }
    mw = HashingWriter(tmp / "manifest.json")
    mw.write(json.dumps(manifest, indent=1).encode())
    mw.close()
    fsync_dir(tmp / "tables")
    fsync_dir(tmp)


def checkpoint_path(root: Path, step: int) -> Path:
    """Where ``save_checkpoint`` puts the checkpoint of ``step`` under ``root``."""
    return root / f"step-{step:08d}"


def mark_best(checkpoint: Path) -> None:
    """Name ``checkpoint`` in its directory's ``BEST`` file (atomically): pruning keeps it beside
    the ``keep`` newest (early stopping's best checkpoint)."""
    atomic_write_bytes(checkpoint.parent / "BEST", checkpoint.name.encode())


def best_checkpoint(root: Path) -> Path | None:
    """The checkpoint ``root/BEST`` names, if any."""
    best = root / "BEST"
    return root / best.read_text().strip() if best.exists() else None


def _prune(root: Path, keep: int) -> None:
    best = best_checkpoint(root)
    done = sorted(p for p in root.glob("step-*") if p.is_dir() and p != best)
    for old in done[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    for stale in [*root.glob(".tmp-step-*"), *root.glob(".old-step-*")]:  # left by a crashed save
        if not stale.name.endswith(f"-{os.getpid()}"):
            shutil.rmtree(stale, ignore_errors=True)
