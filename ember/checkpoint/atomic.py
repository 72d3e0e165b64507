"""Crash-safe file writing: temp file, fsync, rename; checksums while writing. The general
helpers (temporary name, rename, full disk -> an error naming the path) are in ``ember.fileio``."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import BinaryIO

from ember.errors import CheckpointError
from ember.fileio import fsync_dir, write_bytes_atomic

__all__ = ["HashingWriter", "fsync_dir", "atomic_write_bytes", "sha256_file"]


class HashingWriter:
    """Writes to ``path`` and keeps a running sha256 and byte count; fsyncs on close."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fh: BinaryIO = open(path, "wb")
        self._hash = hashlib.sha256()
        self.nbytes = 0

    def write(self, data: bytes | memoryview) -> None:
        self._fh.write(data)
        self._hash.update(data)
        self.nbytes += len(data)

    def close(self) -> str:
        try:
            self._fh.flush()
            os.fsync(self._fh.fileno())
        finally:  # a failed flush (disk full) still closes the file, so its directory can go
            try:
                self._fh.close()
            except OSError:
                pass
        return self._hash.hexdigest()


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data`` so a crash leaves either the old or the new file (a full
    disk: CheckpointError naming the path, the old file kept)."""
    write_bytes_atomic(path, data, CheckpointError)


def sha256_file(path: Path, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while True:
            b = fh.read(chunk)
            if not b:
                break
            h.update(b)
    return h.hexdigest()
