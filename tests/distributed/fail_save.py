"""``ember`` under torchrun with one rank's disk filling up during one save, for the tests:
``python fail_save.py RANK STEP train --config ...``: rank RANK runs out of space half-way
through the first records file of its part of the checkpoint of step STEP; nothing else changes."""

from __future__ import annotations

import errno
import os
import sys

import ember.checkpoint.atomic as atomic
from ember.cli import main


def fill_disk(rank: int, step: int) -> None:
    """On rank ``rank`` only: HashingWriter.write of a ``.rec`` file of the save of ``step``
    writes half its bytes, then raises ENOSPC."""
    if int(os.environ["RANK"]) != rank:
        return
    orig = atomic.HashingWriter.write

    def write(self, data):  # type: ignore[no-untyped-def]
        if f".tmp-step-{step:08d}-" in str(self.path) and self.path.name.endswith(".rec"):
            orig(self, bytes(data)[: len(data) // 2])
            raise OSError(errno.ENOSPC, "No space left on device")
        orig(self, data)

    atomic.HashingWriter.write = write  # type: ignore[method-assign]


if __name__ == "__main__":
    fill_disk(int(sys.argv[1]), int(sys.argv[2]))
    sys.exit(main(sys.argv[3:]))
