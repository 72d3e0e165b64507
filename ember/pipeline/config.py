"""The ``pipeline:`` config section: whether the stages run on threads, and how far ahead.

Every queue depth trades memory for smoothing: a deeper queue absorbs a slower item (a large
file block, a cold disk read) without stalling the stage after it, and holds that many more
items in memory. Depth 1 already overlaps two neighbours; beyond 2-4 there is rarely more to
gain, since the slowest stage sets the pace. How far the embedding fetch may run ahead of the
sparse update is not a queue depth but ``train.embedding_staleness`` (0: never).
"""

from __future__ import annotations

from pydantic import Field

from ember.config_base import ConfigModel

__all__ = ["PipelineConfig", "QueueDepths"]


class QueueDepths(ConfigModel):
    """Items each queue holds between two stages (the stage named writes into it)."""

    read: int = Field(4, ge=1)
    """Record blocks read from files (or synthetic row ranges) awaiting parsing: up to this
    many ``data.read_rows`` rows (Parquet/ORC) or ``data.csv.block_bytes`` bytes (CSV) each."""
    featurize: int = Field(2, ge=1)
    """Finished batches (featurized, hashed, shuffled, cut to ``batch_size``) awaiting planning."""
    plan: int = Field(2, ge=1)
    """Planned batches (IDs deduplicated per table) awaiting their rows: small (IDs only)."""
    fetch: int = Field(1, ge=1)
    """Batches whose rows were fetched from the tiers awaiting the dense step (or, on a GPU, the
    copy): each holds [unique IDs, record width] floats, the largest per-batch buffer."""
    device: int = Field(1, ge=1)
    """GPU only: batches copied to the device (own CUDA stream, pinned host memory) awaiting
    the dense step; each holds its batch and rows in device memory."""
    update: int = Field(1, ge=1)
    """Batches whose backward ran awaiting the sparse update and write-back."""


class PipelineConfig(ConfigModel):
    """The staged trainer: read -> featurize (parse, hash) -> plan -> fetch -> host-to-device ->
    forward/backward -> sparse update + write back -> metrics.

    ``enabled: true`` runs each stage on its own thread with bounded queues between them (the
    work of every stage releases the GIL: pyarrow, numpy, ember's C kernels and torch ops);
    ``false`` runs the very same stage functions one after another on the calling thread, the
    reference the threaded run is tested against.
    """

    enabled: bool = True
    depth: QueueDepths = QueueDepths()
    data_workers: int = Field(0, ge=0, le=1)
    """1: read and featurize the training data in a worker process (``torch.utils.data``'s
    DataLoader), batches handed over in shared memory, so the parsing and hashing, which hold
    the GIL much of the time, never compete with the trainer's threads for it; it costs the
    worker's start (an interpreter importing torch, a few seconds) per epoch. 0: on threads of
    this process."""
    stop_timeout_s: float = Field(10.0, gt=0)
    """How long a stopping pipeline waits for each stage thread to finish its current item."""
