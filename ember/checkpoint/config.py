"""The run config's ``checkpoint:`` section (when checkpoints are written, how many are kept) and
its ``export:`` section (exports written while training, ``ember.checkpoint.delta``)."""

from __future__ import annotations

from pydantic import Field

from ember.config_base import ConfigModel

__all__ = ["CheckpointConfig", "ExportConfig"]


class CheckpointConfig(ConfigModel):
    """When a training run writes a checkpoint to ``<run>/checkpoints/`` and how many it keeps.
    The state the run ends with is always saved; a checkpoint is written to a temporary directory,
    fsynced and renamed, so a crash never damages the last good one."""

    every: int | None = Field(None, ge=1)
    """Steps between checkpoints; unset: only the final state (and SIGINT / SIGTERM) is saved."""
    every_s: float | None = Field(None, gt=0)
    """Seconds: also checkpoint after the first step ending at least this long after the last save (for long and
    online runs; distributed, the ranks decide it together each step)."""
    keep: int = Field(2, ge=1)
    """Checkpoints kept (the newest; early stopping's best, named by `checkpoints/BEST`, is kept on top of them)."""


class ExportConfig(ConfigModel):
    """Exports written during training to ``<run>/exports/``: a full export first, then delta
    exports (only the rows changed since the previous export, the IDs removed, the dense model),
    a full one again every ``full_every`` deltas. Off unless ``every_steps`` or ``every_s`` is set."""

    every_steps: int | None = Field(None, ge=1)
    """Export after every this many steps (on a quiet engine, like a checkpoint)."""
    every_s: float | None = Field(None, gt=0)
    """Seconds: also export after the first step ending this long after the last export
    (decided when that step's batch is fetched, as ``checkpoint.every_s``)."""
    full_every: int = Field(10, ge=1)
    """Delta exports between two full ones (the run's first export is full)."""
    keep_full: int = Field(2, ge=1)
    """Full exports kept, with every delta after the oldest kept one; older ones are removed."""
    final: bool = True
    """Also export the state the run ends with (when it is not exported yet)."""

    @property
    def enabled(self) -> bool:
        return self.every_steps is not None or self.every_s is not None
