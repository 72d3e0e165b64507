"""Checkpoints: one directory per save, written under a temp name and renamed when complete.

Layout of ``<run>/checkpoints/step-00000100/``::

    manifest.json                  version, step, data position, config, tables (rows of each
                                   part), sha256 of every file; written last
    dense.pt                       model + dense optimizer state_dicts, RNG states, table step
                                   counters, min_count admission counts: tensors and plain values
                                   only (format 4 on), read back with torch's weights-only
                                   unpickler, so loading a checkpoint never runs code
    tables/<name>.part-<r>.ids     int64 IDs of part r, streamed in chunks (sorted per chunk)
    tables/<name>.part-<r>.rec     records [weights | optimizer state], same order, packed at the
                                   table's dtype (``RowCodec``: fp32 words; bf16/fp16 weights two
                                   to a word)
    tables/<name>.part-<r>.seen    last-seen step per row (float32), tables with a TTL

A part is what one rank held: one process writes one part, a distributed run of N ranks N,
each rank its own in parallel (``ranks``). Rows are keyed by (table, ID), never by rank, so
any number of ranks reads any number of parts (each keeps the IDs it owns). Format 2 and
older have one part named ``tables/<name>.ids`` / ``.rec`` / ``.seen`` (``load.table_parts``).

A full disk raises CheckpointError naming the directory and the bytes needed, and removes the
temporary directory. A crash at any point leaves the previous checkpoint untouched: files go to a
``.tmp-*`` directory, each is fsynced, the manifest goes in last, the directory is renamed, then
``LATEST`` is replaced atomically. A rank that fails to write its part makes every rank raise
CheckpointError naming it; LATEST keeps naming the previous checkpoint.
"""

from __future__ import annotations

import io
import json
import os
import random
import shutil
import time
from collections import OrderedDict
from pathlib import Path
from typing import Any, Callable, Protocol, TypeVar

import numpy as np
import torch

from ember.checkpoint.atomic import HashingWriter, atomic_write_bytes, fsync_dir
from ember.embedding import EmbeddingCollection
from ember.embedding.codec import RowCodec
from ember.errors import CheckpointError
from ember.fileio import is_no_space, no_space_error

__all__ = ["save_checkpoint", "checkpoint_bytes", "FORMAT_VERSION", "rng_state", "mark_best", "best_checkpoint",
           "checkpoint_path", "Ranks", "part_stem", "check_plain"]

# 2: tables record their row dtype; .rec rows are packed at it. 3: tables in parts. 4: dense.pt
# holds tensors and plain values only (the numpy and python RNG states as tensors), so it loads
# with weights_only=True; before, the numpy RNG state was a pickled ndarray
FORMAT_VERSION = 4

_KEPT = "the previous checkpoint is kept"
_T = TypeVar("_T")


class Ranks(Protocol):
    """The ranks saving one checkpoint together, and the two collectives a save needs (small
    objects only: names, hashes, row counts). ``ember.distributed.DistributedRun`` is one."""

    rank: int
    world_size: int

    @property
    def lead(self) -> bool: ...

    def gather_to_lead(self, obj: Any) -> list[Any] | None: ...

    def broadcast(self, obj: Any) -> Any: ...


class _OneProcess:
    """The ``Ranks`` of a single process: rank 0 of 1, collectives are identities."""

    rank, world_size, lead = 0, 1, True

    def gather_to_lead(self, obj: Any) -> list[Any]:
        return [obj]

    def broadcast(self, obj: Any) -> Any:
        return obj


def rng_state() -> dict[str, Any]:
    """Every RNG's state (torch CPU and CUDA, numpy's global one, python's ``random``) as tensors
    and plain numbers: what ``torch.load(weights_only=True)`` reads back (``load.restore_rng``)."""
    kind, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)
    version, words, gauss_next = random.getstate()
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        # uint32 words as int64: exact, and a dtype every torch reads
        "numpy": {"kind": str(kind), "keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos),
                  "has_gauss": int(has_gauss), "cached_gaussian": float(cached)},
        "python": {"version": int(version), "state": torch.tensor(words, dtype=torch.int64),
                   "gauss_next": None if gauss_next is None else float(gauss_next)},
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


# what torch's weights-only unpickler reads (besides tensors): a dense state holding anything
# else could not be loaded back, so a save refuses it (naming the entry) rather than write it
_PLAIN = (str, int, float, bool, type(None), torch.Size, torch.device, torch.dtype)


def check_plain(obj: Any, where: str = "dense_state") -> None:
    """Raise CheckpointError naming the first entry of ``obj`` that is not a tensor, a plain
    value (str, int, float, bool, None) or a dict / list / tuple of them: such an entry would
    be a pickled Python object, which ``load_dense`` refuses (loading it could run code)."""
    if isinstance(obj, torch.Tensor) or type(obj) in _PLAIN:
        return
    if type(obj) in (dict, OrderedDict):  # a state_dict is an OrderedDict
        for k, v in obj.items():
            if type(k) not in _PLAIN:
                raise CheckpointError(f"{where}: key {k!r} is a {type(k).__module__}.{type(k).__qualname__}; a "
                                      "checkpoint's dense state takes str / int keys only")
            check_plain(v, f"{where}[{k!r}]")
        return
    if type(obj) in (list, tuple):
        for i, v in enumerate(obj):
            check_plain(v, f"{where}[{i}]")
        return
    raise CheckpointError(f"{where} is a {type(obj).__module__}.{type(obj).__qualname__}; a checkpoint's dense "
                          "state holds tensors, str, int, float, bool, None and dicts / lists / tuples of them "
                          "only (convert it, e.g. float(x) for a numpy number), so that loading never unpickles "
                          "Python objects")


def part_stem(name: str, part: int) -> str:
    """Path of part ``part`` of table ``name`` in a checkpoint, less its suffix (.ids, .rec, .seen)."""
    return f"tables/{name}.part-{part}"


def save_checkpoint(
    root: Path,
    step: int,
    collections: list[EmbeddingCollection],
    dense_state: dict[str, Any],
    position: dict[str, int],
    config: dict[str, Any],
    keep: int = 2,
    ranks: Ranks | None = None,
) -> Path:
    """Write a complete checkpoint under ``root`` and point ``root/LATEST`` at it; returns its path.

    ``ranks``: a distributed run, whose every rank calls this with its own shard of the tables
    (None: one process, one part). Rank 0 makes the temporary directory; each rank writes its
    part of every table there (chunk by chunk, fsynced, hashed); rank 0 gathers the parts' file
    hashes, row counts and admission counts (never rows), writes ``dense.pt`` (its
    ``dense_state``) and the manifest last, renames the directory in and replaces ``LATEST``.
    Any rank failing (a full disk, an exception) makes every rank raise a CheckpointError naming
    it (one process: the error itself), with the temporary directory removed and ``LATEST`` on
    the previous checkpoint.
    """
    ranks = ranks or _OneProcess()
    final = checkpoint_path(root, step)

    def needed() -> int:  # asked only when the disk is full: this rank's rows and the dense state
        return checkpoint_bytes(collections, dense_state)

    # 1. rank 0 makes the temporary directory; every rank learns its name
    made, err = _attempt(lambda: _make_tmp(root, step), final, needed) if ranks.lead else (None, None)
    name, why = ranks.broadcast((made.name if made else None, _describe(err)))
    if why:
        _raise(ranks, final, [(0, why)], err)
    tmp = root / name
    # 2. every rank writes its part of every table
    part, err = _attempt(lambda: _write_part(tmp, ranks.rank, collections), final, needed)
    reports = ranks.gather_to_lead((part, _describe(err)))
    # 3. rank 0 writes dense.pt and the manifest, publishes, and tells every rank how it went
    failures: list[tuple[int, str]] = []
    if reports is not None:
        failures = [(r, why) for r, (_, why) in enumerate(reports) if why]
        if not failures:
            _, err = _attempt(lambda: _finish(tmp, step, collections, dense_state, position, config,
                                              [p for p, _ in reports]), final, needed)
            if err is None:
                _, err = _attempt(lambda: _publish(root, tmp, final), final, None)
            failures = [(0, why)] if (why := _describe(err)) else []
        if failures:
            shutil.rmtree(tmp, ignore_errors=True)
    failures = ranks.broadcast(failures)
    if failures:
        _raise(ranks, final, failures, err)
    if ranks.lead:
        _prune(root, keep)
    return final


def _attempt(fn: Callable[[], _T], final: Path, needed: Callable[[], int] | None) -> tuple[_T | None, BaseException | None]:
    """``fn()`` and None, or None and what it raised (a full disk: the CheckpointError naming
    ``final`` and the bytes ``needed``), so that every rank hears of a failure before raising."""
    try:
        return fn(), None
    except BaseException as e:
        if isinstance(e, OSError) and is_no_space(e):
            hint = f"{_KEPT} (lower checkpoint.keep or move train.out_dir to a larger volume)"
            err = no_space_error(CheckpointError, final, needed, e, hint)
            err.__cause__ = e
            return None, err
        return None, e


def _describe(err: BaseException | None) -> str:
    """What every rank is told of a failure ("" for none: never empty for an error)."""
    if err is None:
        return ""
    return str(err) if isinstance(err, CheckpointError) and str(err) else f"{type(err).__name__}: {err}".rstrip(": ")


def _raise(ranks: Ranks, final: Path, failures: list[tuple[int, str]], own: BaseException | None) -> None:
    """Raise on every rank once all know the save failed: one process raises its own error;
    ranks raise a CheckpointError naming the failed ranks and why (an interrupt stays one)."""
    if own is not None and (ranks.world_size == 1 or not isinstance(own, Exception)):
        raise own
    which = "; ".join(f"rank {r} failed: {why}" for r, why in failures)
    raise CheckpointError(f"checkpoint {final} was not written: {which}. Every rank stopped; LATEST still names "
                          "the previous checkpoint") from own


def _make_tmp(root: Path, step: int) -> Path:
    """An empty temporary checkpoint directory with its ``tables`` folder (rank 0)."""
    root.mkdir(parents=True, exist_ok=True)
    tmp = root / f".tmp-step-{step:08d}-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    (tmp / "tables").mkdir(parents=True)
    return tmp


def _write_part(tmp: Path, part: int, collections: list[EmbeddingCollection]) -> dict[str, Any]:
    """This rank's part of every table into ``tmp/tables``, chunk by chunk, each file fsynced;
    returns its files' sha256, rows and admission counts per table (what rank 0 gathers)."""
    if not (tmp / "tables").is_dir():
        raise CheckpointError(f"{tmp} (made by rank 0) is not there for this rank: every rank must see "
                              "train.out_dir, on one machine or a file system all nodes share")
    files: dict[str, str] = {}
    tables: dict[str, dict[str, Any]] = {}
    for ec in collections:
        for name, table in ec.tables.items():
            table.flush()
            stem = part_stem(name, part)
            writers = {"ids": HashingWriter(tmp / f"{stem}.ids"), "rec": HashingWriter(tmp / f"{stem}.rec")}
            if table.config.ttl_steps:  # each row's last-seen step, so rows expire on the same steps after a resume
                writers["seen"] = HashingWriter(tmp / f"{stem}.seen")
            rows = 0
            # rows are saved packed at the table's dtype: its values are representable, so
            # rounding to nearest repacks them exactly
            codec = RowCodec(table.config.dtype, table.dim, table.config.record_dim)
            try:
                for ids, records, seen in table.items_with_seen():
                    writers["ids"].write(_raw(ids, "<i8"))
                    writers["rec"].write(_raw(codec.encode_nearest(records.contiguous()), "<f4"))
                    if "seen" in writers and seen is not None:
                        writers["seen"].write(_raw(seen, "<f4"))
                    rows += ids.numel()
                    del ids, records, seen  # before the next chunk is read: one chunk held at a time
            finally:
                for suffix, w in writers.items():
                    files[f"{stem}.{suffix}"] = w.close()
            # min_count sightings of IDs without a row: small, saved in dense.pt by rank 0
            tables[name] = {"rows": rows, "admission": table.admission_state()}
    fsync_dir(tmp / "tables")  # this rank's entries
    return {"files": files, "tables": tables}


def _raw(t: torch.Tensor, dtype: str) -> memoryview:
    """The bytes of ``t`` as ``dtype``, without the copy ``tobytes`` would make (a save holds
    one chunk of rows at a time)."""
    return memoryview(np.ascontiguousarray(t.cpu().numpy().astype(dtype, copy=False))).cast("B")


def _finish(tmp: Path, step: int, collections: list[EmbeddingCollection], dense_state: dict[str, Any],
            position: dict[str, int], config: dict[str, Any], parts: list[dict[str, Any]]) -> None:
    """Rank 0, once every part is written: ``dense.pt``, then the manifest naming every part's
    files and hashes, all fsynced."""
    files: dict[str, str] = {k: v for p in parts for k, v in p["files"].items()}
    tables_meta = []
    steps, admission = {}, {}
    for ec in collections:
        for name, table in ec.tables.items():
            counts = [p["tables"][name]["admission"] for p in parts]
            admission[name] = (torch.cat([c[0] for c in counts]), torch.cat([c[1] for c in counts]))
            steps[name] = table.step
            rows = [int(p["tables"][name]["rows"]) for p in parts]
            codec = RowCodec(table.config.dtype, table.dim, table.config.record_dim)
            tables_meta.append({"name": name, "rows": sum(rows), "part_rows": rows, "dim": table.dim,
                                "record_dim": table.config.record_dim, "dtype": table.config.dtype,
                                "record_words": codec.words, "optimizer": table.config.optimizer.model_dump(mode="json")})
    dense = {**dense_state, "rng": rng_state(), "table_steps": steps, "admission": admission}
    check_plain(dense)
    buf = io.BytesIO()
    torch.save(dense, buf)
    dense_w = HashingWriter(tmp / "dense.pt")
    try:
        dense_w.write(buf.getvalue())
    finally:
        files["dense.pt"] = dense_w.close()
    manifest = {
        "format_version": FORMAT_VERSION,
        "step": step,
        "position": position,
        "time": time.time(),
        "parts": len(parts),
        "tables": tables_meta,
        "files": files,
        "config": config,
    }
    mw = HashingWriter(tmp / "manifest.json")
    try:
        mw.write(json.dumps(manifest, indent=1).encode())
    finally:
        mw.close()
    fsync_dir(tmp / "tables")
    fsync_dir(tmp)


def _publish(root: Path, tmp: Path, final: Path) -> None:
    """Rename the finished ``tmp`` to ``final`` and point ``LATEST`` at it; on any failure,
    back to the previous checkpoint (a full disk: CheckpointError)."""
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
        raise no_space_error(CheckpointError, final, None, e, _KEPT) from e  # type: ignore[arg-type]
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


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
