"""TensorBoard scalars beside ``metrics.jsonl`` (``train.tensorboard: true``; needs the optional
``tensorboard`` package: ``pip install 'ember[tensorboard]'``).

Every record the run logs is also written as scalars, one tag per numeric field, named
``<kind>/<field>`` (``train/loss``, ``train/lr``, ``eval/auc/label``,
``train/pipeline.stage.fetch.busy``, ...), at the record's ``step``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ember.errors import ConfigError

__all__ = ["TensorBoardWriter", "scalars", "require_tensorboard"]


def scalars(record: dict[str, Any]) -> dict[str, float]:
    """The record's numeric fields as ``{"<kind>/<field>": value}`` (strings, None and the
    ``kind`` / ``step`` keys left out; booleans as 0 / 1)."""
    kind = record.get("kind", "record")
    out = {}
    for key, value in record.items():
        if key in ("kind", "step") or value is None or isinstance(value, str):
            continue
        if isinstance(value, (bool, int, float)):
            out[f"{kind}/{key}"] = float(value)
    return out


def require_tensorboard() -> None:
    """ConfigError naming the pip command when the ``tensorboard`` package is missing
    (``torch.utils.tensorboard`` needs it)."""
    try:
        import tensorboard  # noqa: F401
    except ImportError as e:
        raise ConfigError("train.tensorboard is true but the 'tensorboard' package is not installed: "
                          "pip install 'ember[tensorboard]' (or pip install tensorboard), or set "
                          "train.tensorboard: false") from e


class TensorBoardWriter:
    """Writes each record's scalars to an event file under ``log_dir`` (flushed per record, so
    a running TensorBoard sees them at once and a killed run loses nothing)."""

    def __init__(self, log_dir: Path) -> None:
        require_tensorboard()
        from torch.utils.tensorboard import SummaryWriter
        self.log_dir = log_dir
        self._writer = SummaryWriter(log_dir=str(log_dir))

    def write(self, record: dict[str, Any]) -> None:
        """Add the record's scalars at its ``step`` (0 when it has none)."""
        step = int(record.get("step", 0))
        for tag, value in scalars(record).items():
            self._writer.add_scalar(tag, value, step)
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()
