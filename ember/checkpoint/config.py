"""ExportConfig: the run config's ``export:`` section, exports written while training
(``ember.checkpoint.delta``)."""

from __future__ import annotations

from pydantic import Field

from ember.config_base import ConfigModel

__all__ = ["ExportConfig"]


class ExportConfig(ConfigModel):
    """Exports written during training to ``<run>/exports/``: a full export first, then delta
    exports (only the rows changed since the previous export, the IDs removed, the dense model),
    a full one again every ``full_every`` deltas. Off unless ``every_steps`` or ``every_s`` is set."""

    every_steps: int | None = Field(None, ge=1)
    """Export after every this many steps (on a quiet engine, like a checkpoint)."""
    every_s: float | None = Field(None, gt=0)
    """Seconds: also export after the first step ending this long after the last export
    (decided when that step's batch is fetched, as ``train.checkpoint_every_s``)."""
    full_every: int = Field(10, ge=1)
    """Delta exports between two full ones (the run's first export is full)."""
    keep_full: int = Field(2, ge=1)
    """Full exports kept, with every delta after the oldest kept one; older ones are removed."""
    final: bool = True
    """Also export the state the run ends with (when it is not exported yet)."""

    @property
    def enabled(self) -> bool:
        return self.every_steps is not None or self.every_s is not None
