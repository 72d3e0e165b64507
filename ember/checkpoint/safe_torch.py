"""Reading torch files without running code.

``torch.load`` unpickles: a plain load of a crafted file calls whatever function its pickle
names (``__reduce__``), and a sha256 in a manifest proves nothing against a crafted directory,
whose manifest is crafted too. Every torch file ember reads (a checkpoint's ``dense.pt``, an
export's ``dense.pt``) therefore goes through torch's weights-only unpickler, which builds
tensors and plain values (str, int, float, bool, None, dicts / lists / tuples of them) and
refuses any other object before calling anything.
"""

from __future__ import annotations

import io
import pickle
import re
from pathlib import Path
from typing import Any, Sequence

import torch

from ember.errors import CheckpointError

__all__ = ["read_torch_file"]


def read_torch_file(path: Path, subject: str, remedy: str, allow: Sequence[Any] = ()) -> Any:
    """``torch.load`` of ``path`` (on the CPU) with ``weights_only=True``: tensors and plain
    values only. ``allow``: more globals to build, as ``torch.serialization.safe_globals``
    takes them (for reading an older format). A file holding another object, or one that is
    not a torch file, raises CheckpointError: ``subject`` (e.g. "checkpoint <dir>"), the file,
    what was refused, and ``remedy``.

    Example:
        >>> import tempfile
        >>> f = Path(tempfile.mkdtemp()) / "x.pt"
        >>> torch.save({"w": torch.ones(2), "step": 3}, f)
        >>> read_torch_file(f, "test", "")["step"]
        3
    """
    try:
        data = path.read_bytes()
    except OSError as e:
        raise CheckpointError(f"{subject}: cannot read {path} ({e}); {remedy}") from e
    try:
        with torch.serialization.safe_globals(list(allow)):
            return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        why = _refused(e)
        if not re.search(r"global|build", why, re.I):  # no object refused: a damaged file
            raise CheckpointError(f"{subject}: {path} is not a readable torch file ({why}); {remedy}") from e
        raise CheckpointError(
            f"{subject}: {path} holds a pickled Python object, not only tensors and plain values ({why}); ember never "
            f"unpickles those, as loading them could run arbitrary code. ember did not write this file (or it was "
            f"changed since): {remedy}") from e
    except (RuntimeError, EOFError, ValueError) as e:
        raise CheckpointError(f"{subject}: {path} is not a readable torch file ({_first_line(e)}); {remedy}") from e


def _refused(e: pickle.UnpicklingError) -> str:
    """What torch's weights-only unpickler refused, e.g. 'Unsupported global: GLOBAL os.system
    was not an allowed global by default'."""
    m = re.search(r"WeightsUnpickler error:(.*?)(?:\. Please use|Check the documentation|$)", str(e), re.S)
    why = " ".join(m.group(1).split()) if m else ""
    return why or _first_line(e)


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__
