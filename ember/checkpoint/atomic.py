"""Crash-safe file writing: temp file, fsync, rename; checksums while writing."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import BinaryIO

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
        self._fh.flush()
        os.fsync(self._fh.fileno())
        self._fh.close()
        return self._hash.hexdigest()


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data`` so a crash leaves either the old or the new file."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)


def sha256_file(path: Path, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while True:
            b = fh.read(chunk)
            if not b:
                break
            h.update(b)
    return h.hexdigest()
