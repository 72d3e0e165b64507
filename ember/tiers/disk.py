"""Disk tier: the file *is* an open-addressing hash table of fixed-size record slots.

Layout (chosen by measurement, see docs/capacity.md, "The disk tier"): ``slots.bin`` holds ``n_slots`` slots of
``8 + 4*R`` bytes, ``[id (int64) | record (R float32)]``, memory-mapped. An ID's home slot is a
hash of the ID; collisions probe linearly. RAM holds only a 2-byte *tag* per slot (0 empty,
1 deleted, else 16 hash bits of the ID living there), so finding an ID costs a few vectorised
probes over the tag array in RAM and, for IDs that are present, one random read of their slot
(which also verifies the stored ID). RAM per row ≈ 2 / load bytes (2.4 B at load 0.85) instead
of the 16-32 B a full key index would need: 1.5 GiB of index for 625 M rows.

Disk space is reserved with ``posix_fallocate`` when the file is created or grown, so a full
disk fails there with ``TierIOError`` (the file is reserved under a temporary name, so a failed
reservation leaves nothing behind) and never as a SIGBUS in the middle of a write through
the mapping. The tier is a cache of rows, not a checkpoint: after a crash its files are not
trusted (``meta.json`` says so) and the rows come back from the last checkpoint.
"""

from __future__ import annotations

import json
import mmap
import os
import shutil
from pathlib import Path
from typing import Iterator

import numpy as np
import torch
from torch import Tensor

from ember import _native
from ember.errors import TierIOError
from ember.fileio import atomic_file, write_bytes_atomic
from ember.tiers.base import Tier, TierCounters
from ember.tiers.key_index import KeyIndex
from ember.mix import mix64

__all__ = ["DiskTier", "disk_slot_bytes"]

_EMPTY, _DELETED = 0, 1
_FORMAT = "ember-disk-tier-1"


def disk_slot_bytes(record_dim: int) -> int:
    """Bytes one slot takes on disk: the int64 ID then the float32 record."""
    return 8 + 4 * record_dim


class DiskTier(TierCounters, Tier):
    """Records on local disk (SSD), for tables far larger than RAM.

    Args:
        path: directory of this tier's files (created; one directory per table).
        record_dim: floats per record.
        rows: rows to size the file for up front (it grows by doubling beyond that, which
            rewrites the file: size it right to avoid that).
        max_load: fraction of slots that may be used before the file grows (0.5-0.95; higher
            saves disk and probes longer in RAM). Default 0.85, or on ``reopen`` the value the
            files were created with (it is saved in ``meta.json``).
        reopen: open the files a previous ``close()`` left (else start empty, replacing them).

    The tag probes are ``ember._native.tag_find`` / ``tag_claim``: compiled when the native core
    is built (and ``EMBER_NATIVE=0`` is not set), else numpy. Both find the same rows; where the
    IDs of one insert land may differ.

    Example:
        >>> import tempfile
        >>> d = DiskTier(tempfile.mkdtemp(), record_dim=2, rows=100)
        >>> d.put(torch.tensor([5, -1]), torch.tensor([[1.0, 2.0], [3.0, 4.0]]))
        >>> rows = torch.zeros(2, 2)
        >>> found = d.get_into(torch.tensor([-1, 8]), rows)
        >>> found.tolist(), rows[0].tolist()
        ([True, False], [3.0, 4.0])
    """

    name = "disk"
    capacity: int | None = None
    device = torch.device("cpu")

    def __init__(
        self,
        path: str | os.PathLike,
        record_dim: int,
        rows: int = 1 << 16,
        max_load: float | None = None,
        reopen: bool = False,
    ) -> None:
        if max_load is not None and not 0.5 <= max_load <= 0.95:
            raise ValueError(f"DiskTier: max_load must be in [0.5, 0.95], got {max_load}")
        self.path = Path(path)
        self.record_dim = record_dim
        self.width = record_dim + 2  # float32 columns per slot (the ID takes two)
        self.max_load = 0.85 if max_load is None else max_load
        made = not self.path.exists()
        self.path.mkdir(parents=True, exist_ok=True)
        self._memo: tuple[Tensor, np.ndarray] | None = None
        # (IDs -> position, their slots or -1) of the last get_into, kept exact through every change
        # of the ID -> slot mapping since (inserts, removals; cleared by evict and rebuilds): the
        # CachedTier's follow-up calls on parts of that batch (promotions removed, the rest
        # written back) then skip their probes, each a random read per row
        self._known: tuple[KeyIndex, np.ndarray] | None = None
        self._mm: np.memmap | None = None
        self.reset_step_stats()
        meta = self.path / "meta.json"
        try:
            if reopen and meta.exists():
                self._open_existing(meta, max_load)
            else:
                n = max(64, int(np.ceil(max(rows, 1) / self.max_load)))
                self._create(self.path / "slots.bin", n)
            self._write_meta(clean=False)
        except BaseException:
            if made:  # a tier that never started leaves no directory behind
                shutil.rmtree(self.path, ignore_errors=True)
            raise

    # ---- files ----------------------------------------------------------------------------
    def _create(self, file: Path, n_slots: int) -> None:
        """Reserve ``file`` for ``n_slots`` slots: under a temporary name, renamed once the space is
        reserved, so a full disk leaves neither a short file nor a temporary one behind."""
        nbytes = n_slots * self.width * 4
        tmp = file.with_name(f".{file.name}.tmp-{os.getpid()}")
        try:
            fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                os.posix_fallocate(fd, 0, nbytes)
            finally:
                os.close(fd)
            os.replace(tmp, file)
        except OSError as e:
            try:
                tmp.unlink()
            except OSError:
                pass
            free = shutil.disk_usage(file.parent).free
            raise TierIOError(
                f"DiskTier at {self.path}: cannot reserve {nbytes / 2**30:.2f} GiB ({nbytes} bytes) for "
                f"{n_slots} slots ({e.strerror}); {free / 2**30:.2f} GiB free there. Point "
                "storage.disk_path at a larger volume, free space, or lower storage.disk_rows"
            ) from e
        self._attach(file, n_slots, np.zeros(n_slots, dtype=np.uint16), live=0, used=0)

    def _attach(self, file: Path, n_slots: int, tags: np.ndarray, live: int, used: int) -> None:
        self._mm = np.memmap(file, dtype=np.float32, mode="r+", shape=(n_slots, self.width))
        try:  # random access: readahead would read pages we never use
            self._mm._mmap.madvise(mmap.MADV_RANDOM)  # type: ignore[attr-defined]  # numpy private
        except (AttributeError, OSError, ValueError):
            pass
        self.n_slots = n_slots
        self._tags = tags
        self._live = live
        self._used = used  # live + deleted slots

    def _open_existing(self, meta_file: Path, max_load: float | None) -> None:
        meta = json.loads(meta_file.read_text())
        if meta.get("format") != _FORMAT or meta.get("record_dim") != self.record_dim:
            raise TierIOError(
                f"DiskTier at {self.path}: files are {meta.get('format')} with record_dim "
                f"{meta.get('record_dim')}, expected {_FORMAT} with {self.record_dim}; use another disk_path"
            )
        if not meta.get("clean"):
            raise TierIOError(
                f"DiskTier at {self.path}: the previous run did not close this tier cleanly "
                "(crash?), so its rows are not trusted; restore the table from the last "
                "checkpoint into a fresh tier (delete the directory or open without reopen)"
            )
        if max_load is None:  # keep the load the file was sized for, or it grows needlessly
            self.max_load = float(meta.get("max_load", self.max_load))
        tags = np.load(self.path / "tags.npy", allow_pickle=False)  # raw int64 tags: never unpickle
        self._attach(self.path / "slots.bin", int(meta["n_slots"]), tags, int(meta["live"]), int(meta["used"]))

    def _write_meta(self, clean: bool) -> None:
        meta = {
            "format": _FORMAT,
            "record_dim": self.record_dim,
            "n_slots": self.n_slots,
            "max_load": self.max_load,
            "live": self._live,
            "used": self._used,
            "clean": clean,
        }
        write_bytes_atomic(self.path / "meta.json", json.dumps(meta).encode(), TierIOError,
                           "the disk tier's files are not trusted after this; restore from the last checkpoint")

    def flush(self) -> None:
        """Write dirty pages of the mapping to disk (msync)."""
        if self._mm is not None:
            self._mm.flush()

    def close(self) -> None:
        """Flush, save the tag array and mark the files clean so ``reopen=True`` can use them."""
        if self._mm is None:
            return
        self.flush()
        with atomic_file(self.path / "tags.npy", TierIOError, self._tags.nbytes + 128) as tmp:
            with open(tmp, "wb") as f:
                np.save(f, self._tags)
        self._write_meta(clean=True)
        self._mm = None
        self._memo = None
        self._known = None

    # ---- size ---------------------------------------------------------------------------------
    def __len__(self) -> int:
        return self._live

    @property
    def nbytes(self) -> int:
        """Bytes of disk the slot file takes."""
        return self.n_slots * self.width * 4

    @property
    def ram_bytes(self) -> int:
        """Bytes of RAM the in-memory index (the tag array) takes."""
        return self._tags.nbytes

    # ---- hashing and probing ----------------------------------------------------------------
    def _hash(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        h = mix64(ids.view(np.uint64))
        home = (((h >> np.uint64(32)) * np.uint64(self.n_slots)) >> np.uint64(32)).astype(np.int64)
        tag = ((h & np.uint64(0xFFFF)) % np.uint64(65534) + np.uint64(2)).astype(np.uint16)
        return home, tag

    def _read(self, slots: np.ndarray) -> np.ndarray:
        """Slots' contents [K, width], read in file order (sorted) for locality."""
        assert self._mm is not None, "DiskTier is closed"
        order = np.argsort(slots, kind="stable")
        got = np.empty((slots.size, self.width), dtype=np.float32)
        ordered = np.ascontiguousarray(slots[order], dtype=np.int64)
        _native.willneed_cold(self._mm, ordered)  # every page not in memory read at once, not one fault at a time
        _native.gather_rows(self._mm, ordered, got)
        out = np.empty_like(got)
        out[order] = got
        self.reads += slots.size
        return out

    def _probe(self, ids: np.ndarray, want_rows: bool, into: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray | None]:
        """Slot of each ID (-1 absent) and, if ``want_rows``, each found ID's record [N, R]
        (zeros for the others; or straight into ``into`` [N, R] float32, the others untouched):
        ``_native.disk_find``, one pass in C (numpy rounds without it)."""
        assert self._mm is not None, "DiskTier is closed"
        n = ids.size
        slot_of = np.empty(n, dtype=np.int64)
        rows = (np.zeros((n, self.record_dim), dtype=np.float32) if into is None else into) if want_rows else None
        if n == 0:
            slot_of[:] = -1
            return slot_of, rows
        read = _native.disk_find(self._tags, self._mm, ids, slot_of, rows)  # (ranges of the IDs on several threads)
        if want_rows:
            self.reads += read
        return slot_of, rows

    def _slots_of(self, ids: Tensor) -> np.ndarray:
        memo = self._memo
        if memo is not None and memo[0] is ids:
            return memo[1]
        ids_np = ids.numpy()
        slots = self._recall(ids_np)
        if slots is None:
            slots, _ = self._probe(ids_np, want_rows=False)
        self._memo = (ids, slots)
        return slots

    def _recall(self, ids: np.ndarray) -> np.ndarray | None:
        """Slots of ``ids`` from the last get_into's (kept current), or None unless all are there."""
        k = self._known
        if k is None or ids.size == 0:
            return None
        pos = k[0].lookup(ids)
        if (pos < 0).any():
            return None
        return k[1].take(pos)

    def _note(self, ids: np.ndarray, slots: np.ndarray | int) -> None:
        """The ID -> slot mapping of ``ids`` changed: update the remembered slots of those known."""
        k = self._known
        if k is None or ids.size == 0:
            return
        pos = k[0].lookup(ids)
        hit = pos >= 0
        k[1][pos[hit]] = slots if np.isscalar(slots) else np.asarray(slots)[hit]

    # ---- protocol ---------------------------------------------------------------------------
    def contains(self, ids: Tensor) -> Tensor:
        return torch.from_numpy(self._slots_of(ids) >= 0)

    def get_into(self, ids: Tensor, out: Tensor) -> Tensor:
        """Write the records of found ``ids`` into ``out`` [N, R]; returns the found mask [N]."""
        ids_np = ids.numpy()
        direct = (out.device.type == "cpu" and out.dtype == torch.float32 and out.is_contiguous()
                  and tuple(out.shape) == (ids_np.size, self.record_dim))
        slots, rows = self._probe(ids_np, want_rows=True, into=out.numpy() if direct else None)
        assert rows is not None
        self._memo = (ids, slots)
        known = KeyIndex(ids_np.size)  # a duplicate ID is placed twice; lookups find its first
        known.insert(ids_np, np.arange(ids_np.size, dtype=np.int32))
        self._known = (known, slots.copy())
        found = slots >= 0
        self.requests += ids.numel()
        hit = np.flatnonzero(found)
        self.hits += hit.size
        if hit.size:
            self.count_transfer(hit.size, out.device)
            if not direct:  # the probe copied the rows into a CPU float32 ``out`` already
                out.index_copy_(0, torch.from_numpy(hit).to(out.device), torch.from_numpy(rows[hit]).to(out.device, out.dtype))
        return torch.from_numpy(found)

    def put(self, ids: Tensor, records: Tensor, counts: np.ndarray | None = None) -> None:
        """Overwrite present IDs in place; insert absent ones (growing the file if needed).
        ``counts`` is ignored: the last tier has no eviction policy."""
        ids_np = ids.numpy()
        slots = self._slots_of(ids)
        missing = slots < 0
        if missing.any():
            n_new = int(missing.sum())
            # Grow when the live rows need it. Deleted slots (rows promoted to a faster tier)
            # are reused by inserts, so only purge them when they crowd out the empty slots
            # that end every probe.
            limit = self.max_load + (1 - self.max_load) / 2
            if self._live + n_new > self.max_load * self.n_slots or self._used + n_new > limit * self.n_slots:
                self._rebuild(self._live + n_new)
                slots = self._probe(ids_np, want_rows=False)[0]  # every slot moved
            slots = slots.copy()
            slots[missing] = self._insert_slots(ids_np[missing])
            self._note(ids_np[missing], slots[missing])
            self._memo = (ids, slots)
            self.inserts += n_new
        self.count_transfer(ids.numel(), records.device)
        self._write(slots, ids_np, records.detach().to("cpu", torch.float32).numpy())

    def _write(self, slots: np.ndarray, ids: np.ndarray, recs: np.ndarray) -> None:
        """Rows of unique ``ids`` (the Tier protocol's: so unique slots) into their slots, in ID
        ranges on several threads when there are many (no two ranges write one slot)."""
        assert self._mm is not None, "DiskTier is closed"
        _native.disk_write(self._mm, slots, ids, np.ascontiguousarray(recs, dtype=np.float32), unique=True)
        self.writes += slots.size

    def _insert_slots(self, ids: np.ndarray) -> np.ndarray:
        """Claim a free slot for each of the absent, unique ``ids`` (tags only; no disk I/O)."""
        home, tag = self._hash(ids)
        target = np.empty(ids.size, dtype=np.int64)
        self._used += _native.tag_claim(self._tags, home, tag, target)
        self._live += ids.size
        return target

    def remove(self, ids: Tensor) -> Tensor:
        """Delete ``ids`` (marks their slots deleted in RAM; no disk I/O)."""
        slots = self._slots_of(ids)
        self._memo = None
        found = slots >= 0
        self._note(ids.numpy()[found], -1)
        self._tags[slots[found]] = _DELETED
        self._live -= int(found.sum())
        return torch.from_numpy(found)

    def evict(self, n: int) -> tuple[Tensor, Tensor]:
        """Remove up to ``n`` rows in slot order (the last tier has no access policy)."""
        slots = np.flatnonzero(self._tags > _DELETED)[:n]
        data = self._read(slots)
        ids = np.ascontiguousarray(data[:, :2]).view(np.int64)[:, 0].copy()
        self._tags[slots] = _DELETED
        self._live -= slots.size
        self._memo = None
        self._known = None
        self.evictions += slots.size
        return torch.from_numpy(ids), torch.from_numpy(np.ascontiguousarray(data[:, 2:]))

    def items(self, chunk_rows: int = 1 << 20) -> Iterator[tuple[Tensor, Tensor]]:
        """Every (ids, records), reading the file sequentially in slot order."""
        assert self._mm is not None, "DiskTier is closed"
        step = max(chunk_rows, 1)
        for a in range(0, self.n_slots, step):
            live = np.flatnonzero(self._tags[a : a + step] > _DELETED)
            if live.size == 0:
                continue
            data = np.asarray(self._mm[a : a + step])[live]
            ids = np.ascontiguousarray(data[:, :2]).view(np.int64)[:, 0].copy()
            yield torch.from_numpy(ids), torch.from_numpy(np.ascontiguousarray(data[:, 2:]))

    def _rebuild(self, need: int) -> None:
        """Rewrite the live rows into a new file sized for ``need`` rows (drops deleted slots)."""
        n = self.n_slots
        while need > self.max_load * n:  # grow by doubling; else purge deleted slots at the same size
            n *= 2
        old_mm, old_tags, old_n = self._mm, self._tags, self.n_slots
        assert old_mm is not None
        tmp = self.path / "slots.bin.grow"
        self._create(tmp, n)
        for a in range(0, old_n, 1 << 20):
            live = np.flatnonzero(old_tags[a : a + (1 << 20)] > _DELETED)
            if live.size:
                data = np.asarray(old_mm[a : a + (1 << 20)])[live]
                ids = np.ascontiguousarray(data[:, :2]).view(np.int64)[:, 0]
                self._write(self._insert_slots(ids), ids, data[:, 2:])
        self._mm.flush()  # type: ignore[union-attr]
        live, used, tags = self._live, self._used, self._tags
        del old_mm
        self._mm = None
        os.replace(tmp, self.path / "slots.bin")
        self._attach(self.path / "slots.bin", n, tags, live, used)
        self._memo = None
        self._known = None
        self._write_meta(clean=False)

    # ---- observability -------------------------------------------------------------------------
    def reset_step_stats(self) -> None:
        super().reset_step_stats()
        self.reads = 0
        self.writes = 0

    def extra_stats(self) -> dict[str, float]:
        return {"ram_bytes": self.ram_bytes, "slot_reads": self.reads, "slot_writes": self.writes}
