"""Typed errors. Each also inherits the matching builtin so callers can catch either."""

from __future__ import annotations

__all__ = [
    "EmberError",
    "ConfigError",
    "SchemaError",
    "MissingColumnsError",
    "DataError",
    "CapacityError",
    "TierIOError",
    "CheckpointError",
    "WriteError",
    "RunInterrupted",
    "RankLost",
    "Diverged",
]


class EmberError(Exception):
    """Base class of every error ember raises on purpose."""


class ConfigError(EmberError, ValueError):
    """A run config or component config is invalid (unknown key, bad value)."""


class SchemaError(EmberError, ValueError):
    """The feature schema does not match the data (missing column, wrong type)."""


class MissingColumnsError(SchemaError):
    """Columns the reader was asked for are not in the data; ``missing`` names them and
    ``available`` lists what the data has (so a caller that asked for them can say why)."""

    def __init__(self, message: str, missing: list[str], available: list[str]) -> None:
        super().__init__(message)
        self.missing, self.available = missing, available


class DataError(EmberError, ValueError):
    """A data row cannot be parsed; the message names file, row, column and value."""


class CapacityError(EmberError, RuntimeError):
    """A memory or disk budget cannot hold what was asked of it."""


class TierIOError(EmberError, OSError):
    """Reading or writing a storage tier failed (disk full, file damaged)."""


class CheckpointError(EmberError, RuntimeError):
    """A checkpoint is missing, damaged (checksum mismatch) or of another layout."""


class WriteError(EmberError, OSError):
    """An output file (predictions, metrics, plots) cannot be written: disk full, directory not
    writable. The message names the path and, for a full disk, the bytes the write needed."""


class Diverged(EmberError, ArithmeticError):
    """Training's loss, or a model's scores, are no longer finite (NaN or infinite): the weights
    diverged (learning rates too high, values too large in the data). Nothing is saved after it,
    and no metric is computed over such scores."""


class RunInterrupted(EmberError):
    """SIGINT or SIGTERM stopped a training run after it wrote a checkpoint; ``exit_code`` is
    128 + the signal number, as a shell reports a process the signal ended."""

    def __init__(self, signum: int, checkpoint: str) -> None:
        import signal

        self.signum, self.checkpoint = signum, checkpoint
        self.exit_code = 128 + signum
        name = signal.Signals(signum).name
        super().__init__(f"stopped by {name}; the run was saved to {checkpoint} (resume with train.resume={checkpoint})")


class RankLost(EmberError, RuntimeError):
    """Another rank of a distributed run stopped (its process died, hung, or failed with an
    error of its own): the message names it (rank, host, pid) and why. ``exit_code`` is 1."""

    exit_code = 1
