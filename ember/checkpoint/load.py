"""Load and verify checkpoints, into any table layout (tiers are re-filled from the files) and
any number of ranks (each keeps the IDs it owns, from every part, whatever world size saved them)."""

from __future__ import annotations

import json
import logging
import random
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
import torch

from ember.checkpoint.atomic import sha256_file
from ember.checkpoint.safe_torch import read_torch_file
from ember.checkpoint.save import FORMAT_VERSION, Ranks, part_stem
from ember.embedding import EmbeddingCollection
from ember.embedding.codec import RowCodec
from ember.errors import CheckpointError

log = logging.getLogger("ember")

__all__ = [
    "resolve_checkpoint", "read_manifest", "verify_checkpoint", "load_tables", "load_dense", "restore_rng",
    "restore_table_state", "table_parts",
]

_CHUNK_ROWS = 1 << 20


def resolve_checkpoint(path: str | Path) -> Path:
    """A checkpoint directory, or a run / checkpoints directory (then its LATEST)."""
    p = Path(path)
    for cand in [p, p / "checkpoints"]:
        if (cand / "manifest.json").exists():
            return cand
        latest = cand / "LATEST"
        if latest.exists():
            name = latest.read_text(errors="replace").strip()
            target = cand / name
            if name and (target / "manifest.json").exists():
                return target
            named = f"names {name}, which is missing or incomplete" if name else "is empty"
            # killed between moving a same-step checkpoint aside and renaming its replacement in:
            # fall back to the newest complete checkpoint, or to the one moved aside (when it was
            # the only one, it lies under .old-step-*)
            done = sorted(p for p in cand.glob("step-*") if (p / "manifest.json").exists())
            aside = sorted(p for p in cand.glob(".old-step-*") if (p / "manifest.json").exists())
            if done or aside:
                chosen = (done or aside)[-1]
                log.warning("%s %s (a save interrupted?); using %s, the newest complete checkpoint", latest, named, chosen)
                return chosen
            raise CheckpointError(f"{latest} {named}, and no complete checkpoint exists")
    raise CheckpointError(f"no checkpoint at {p}: expected a manifest.json or a LATEST file (a run directory works too)")


def read_manifest(ckpt: Path) -> dict[str, Any]:
    try:
        manifest = json.loads((ckpt / "manifest.json").read_text())
    except (OSError, ValueError) as e:  # (UnicodeDecodeError and JSONDecodeError are ValueErrors)
        raise CheckpointError(f"checkpoint {ckpt}: cannot read manifest.json ({e})") from e
    if not isinstance(manifest, dict):
        raise CheckpointError(f"checkpoint {ckpt}: manifest.json holds a JSON {type(manifest).__name__}, not a "
                              "checkpoint's manifest; it is damaged: use an older checkpoint")
    if manifest.get("format_version") not in range(1, FORMAT_VERSION + 1):
        raise CheckpointError(
            f"checkpoint {ckpt}: format version {manifest.get('format_version')} is not one this ember reads "
            f"(1..{FORMAT_VERSION}); resume it with the ember version that wrote it"
        )
    tables, files = manifest.get("tables"), manifest.get("files")
    if not (isinstance(tables, list) and all(isinstance(t, dict) for t in tables) and isinstance(files, dict)):
        raise CheckpointError(f"checkpoint {ckpt}: manifest.json lacks its \"tables\" list or \"files\" mapping; it "
                              "is damaged: use an older checkpoint")
    return manifest


def verify_checkpoint(ckpt: Path, ranks: Ranks | None = None) -> dict[str, Any]:
    """Check every file's sha256 against the manifest (every part of every table); returns the
    manifest. ``ranks``: the ranks of a distributed run share the hashing (rank r checks every
    r-th file) and every rank raises for a damaged file any of them found."""
    manifest = read_manifest(ckpt)
    for m in manifest["tables"]:
        unlisted = [f"{stem}.{suffix}" for stem, _ in table_parts(manifest, m) for suffix in ("ids", "rec")
                    if f"{stem}.{suffix}" not in manifest["files"]]
        if unlisted:
            raise CheckpointError(f"checkpoint {ckpt}: the manifest lists no hash for {unlisted}; the checkpoint is "
                                  "incomplete, use an older one")
    files = sorted(manifest["files"].items())
    problem = _check_files(ckpt, files if ranks is None else files[ranks.rank :: ranks.world_size])
    if ranks is not None:  # every rank hears of a damaged file, whichever rank hashed it
        found = ranks.gather_to_lead(problem)
        problem = ranks.broadcast(next((p for p in found if p), "") if found is not None else "")
    if problem:
        raise CheckpointError(problem)
    return manifest


def _check_files(ckpt: Path, files: list[tuple[str, str]]) -> str:
    """Why the first of ``files`` (path, sha256) that is missing or damaged is, or ""."""
    for rel, digest in files:
        f = ckpt / rel
        if not f.exists():
            return f"checkpoint {ckpt}: file {rel} is missing"
        if sha256_file(f) != digest:
            return f"checkpoint {ckpt}: {rel} is damaged (sha256 mismatch); use an older checkpoint"
    return ""


Keep = Callable[[str, torch.Tensor], torch.Tensor]  # (table, ids) -> mask of the IDs to load


def load_tables(ckpt: Path, collections: list[EmbeddingCollection], manifest: dict[str, Any], keep: Keep | None = None,
                exact: bool = True) -> None:
    """Stream every table's rows from the checkpoint into the collections' tables (any tier
    layout). ``keep``: load only the IDs it marks (a rank of a distributed run: those it owns,
    whatever world size saved the checkpoint).

    Rows are converted to each table's dtype: a checkpoint of a wider dtype is rounded to nearest
    (fp32 -> bf16), a narrower one widens exactly (bf16 -> fp32); version 1 checkpoints are fp32.
    ``exact`` False (a finetune, ``train.init_from``): a table whose sparse optimizer is of another
    type than the checkpoint's takes the weights alone, its optimizer's state made fresh from
    them as a new row's is (said once per table); its dim must still match.
    """
    meta = {t["name"]: t for t in manifest["tables"]}
    for ec in collections:
        for name, table in ec.tables.items():
            if name not in meta:
                saved = (manifest.get("config") or {}).get("model") or {}
                hint = ""
                if isinstance(saved, dict) and saved.get("type"):
                    hint = (f"; it was saved by a '{saved['type']}' model: give the config it was trained with, or "
                            "one whose model and schema make the same tables")
                raise CheckpointError(f"checkpoint {ckpt} has no table '{name}'; it has {sorted(meta)}{hint}")
            m = meta[name]
            opt, saved_opt = table.config.optimizer, m["optimizer"]["type"]
            weights_only = not exact and m["dim"] == table.dim and saved_opt != opt.type
            if m["record_dim"] != table.config.record_dim and not weights_only:
                raise CheckpointError(
                    f"checkpoint {ckpt}: table '{name}' records are {m['record_dim']} floats wide "
                    f"(dim {m['dim']}, optimizer {saved_opt}), the config asks for {table.config.record_dim} "
                    f"(dim {table.dim}, optimizer {opt.type}); "
                    + ("keep its dim (a finetune, train.init_from, may change the sparse optimizer)" if not exact
                       else "keep dim and optimizer type when resuming (train.init_from finetunes from the weights "
                       "with another sparse optimizer)"))
            if weights_only:
                log.info("train.init_from: table '%s' was trained with %s; its weights start this finetune, with %s's "
                         "state fresh", name, saved_opt, opt.type)
            codec = RowCodec(m.get("dtype", "fp32"), m["dim"], m["record_dim"])  # how the file packs rows
            for stem, rows in table_parts(manifest, m):
                # last-seen steps (TTL tables); older checkpoints lack them: rows count as seen now
                with_seen = bool(table.config.ttl_steps) and f"{stem}.seen" in manifest["files"]
                for ids, rec, seen in _read_part(ckpt / stem, rows, codec.words, with_seen):
                    if keep is not None:
                        mask = keep(name, ids)
                        ids, rec, seen = ids[mask], rec[mask], None if seen is None else seen[mask]
                    records = codec.decode(rec)
                    if weights_only:  # the new optimizer's state, made from the weights as a fresh row's
                        w = records[:, : table.dim].contiguous()
                        records = torch.cat([w, opt.init_state(w)], dim=1)
                    table.load(ids, records, seen)


def table_parts(manifest: dict[str, Any], meta: dict[str, Any]) -> list[tuple[str, int]]:
    """(file stem in the checkpoint, rows) of each part of one table (``meta``, an entry of the
    manifest's ``tables``): one per rank that saved it, from format 3; one before."""
    name = meta["name"]
    if manifest["format_version"] < 3:
        return [(f"tables/{name}", int(meta["rows"]))]
    return [(part_stem(name, r), int(n)) for r, n in enumerate(meta["part_rows"])]


def _read_part(stem: Path, rows: int, words: int, with_seen: bool) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]]:
    """(ids, packed records, last-seen or None) of one part, ``_CHUNK_ROWS`` rows at a time."""
    if not rows:
        return
    ids_mm = np.memmap(f"{stem}.ids", dtype="<i8", mode="r")
    rec_mm = np.memmap(f"{stem}.rec", dtype="<f4", mode="r").reshape(-1, words)
    seen_mm = np.memmap(f"{stem}.seen", dtype="<f4", mode="r") if with_seen else None
    for s in range(0, rows, _CHUNK_ROWS):
        yield (torch.from_numpy(np.array(ids_mm[s : s + _CHUNK_ROWS])), torch.from_numpy(np.array(rec_mm[s : s + _CHUNK_ROWS])),
               None if seen_mm is None else torch.from_numpy(np.array(seen_mm[s : s + _CHUNK_ROWS])))


def load_dense(ckpt: Path) -> dict[str, Any]:
    """The dense state beside the tables (model, dense optimizer, loss scaler, early stopping,
    RNG states, table counters), read with torch's weights-only unpickler: tensors and plain
    values only, so a crafted ``dense.pt`` cannot run code (its sha256 in the manifest proves
    nothing against a crafted checkpoint: the manifest can be crafted too). Anything else in
    it raises CheckpointError naming the file.

    Checkpoints before format 4 pickled numpy's RNG state as an ndarray: for them, and only
    them, numpy's array reconstruction is allowed too (it builds arrays, runs nothing else), and
    the RNG state is returned in the current form (``restore_rng``).
    """
    path = ckpt / "dense.pt"
    legacy = read_manifest(ckpt)["format_version"] < 4
    dense = read_torch_file(path, f"checkpoint {ckpt}", "use a checkpoint from a run you trust, or an older one",
                            _legacy_numpy() if legacy else ())
    if not isinstance(dense, dict) or not isinstance(dense.get("rng"), dict):
        raise CheckpointError(f"checkpoint {ckpt}: {path} is not an ember dense state (no RNG states in it); "
                              "use a checkpoint ember wrote")
    if isinstance(dense["rng"].get("numpy"), tuple):  # format 3 and older
        dense["rng"] = _current_rng(dense["rng"])
    return dense


def _legacy_numpy() -> list[Any]:
    """The globals a format <= 3 ``dense.pt`` names for numpy's RNG keys (a uint32 ndarray, the
    only numpy object an older ember saved): numpy's array reconstruction, under its numpy 2 and
    numpy 1 module names, and the uint32 dtype."""
    try:
        from numpy._core.multiarray import _reconstruct  # numpy 2
    except ImportError:  # numpy 1
        from numpy.core.multiarray import _reconstruct  # type: ignore[no-redef]
    return [(_reconstruct, "numpy._core.multiarray._reconstruct"), (_reconstruct, "numpy.core.multiarray._reconstruct"),
            np.ndarray, np.dtype, type(np.dtype(np.uint32))]


def _current_rng(old: dict[str, Any]) -> dict[str, Any]:
    """A format <= 3 RNG state (numpy's and python's as their get_state tuples) in the form
    ``save.rng_state`` writes."""
    kind, keys, pos, has_gauss, cached = old["numpy"]
    version, words, gauss_next = old["python"]
    out = {k: v for k, v in old.items() if k not in ("numpy", "python")}
    out["numpy"] = {"kind": str(kind), "keys": torch.from_numpy(np.asarray(keys, dtype=np.int64)), "pos": int(pos),
                    "has_gauss": int(has_gauss), "cached_gaussian": float(cached)}
    out["python"] = {"version": int(version), "state": torch.tensor(words, dtype=torch.int64), "gauss_next": gauss_next}
    return out


def restore_rng(state: dict[str, Any]) -> None:
    """Set every RNG to ``state`` (``save.rng_state``, as ``load_dense`` returns it)."""
    torch.set_rng_state(state["torch"])
    n, p = state["numpy"], state["python"]
    np.random.set_state((n["kind"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["cached_gaussian"]))
    random.setstate((p["version"], tuple(p["state"].tolist()), p["gauss_next"]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def restore_table_state(collections: list[EmbeddingCollection], dense: dict[str, Any], keep: Keep | None = None) -> None:
    """Table step counters and min_count admission counts, as saved beside the dense state
    (``keep``: only the counts of the IDs it marks, as ``load_tables``)."""
    admission = dense.get("admission", {})
    for ec in collections:
        for name, table in ec.tables.items():
            table.step = dense["table_steps"][name]
            if name in admission:
                ids, counts = admission[name]
                if keep is not None:
                    mask = keep(name, ids)
                    ids, counts = ids[mask], counts[mask]
                table.load_admission_state(ids, counts)
