"""The ``pipeline:`` config section: whether the stages run on threads, and how far ahead.

Every queue depth trades memory for smoothing: a deeper queue absorbs a slower item (a large
file block, a cold disk read) without stalling the stage after it, and holds that many more
items in memory. Depth 1 already overlaps two neighbours; beyond 2-4 there is rarely more to
gain, since the slowest stage sets the pace. How far the embedding fetch may run ahead of the
sparse update is not a queue depth but ``embedding_staleness`` (0: never).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from ember.config_base import ConfigModel

__all__ = ["PipelineConfig", "QueueDepths", "engine_on_threads"]


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
    """Batches with fetched rows waiting for the dense step: each holds [unique IDs × record width] floats, the
    largest buffer; how far fetches run ahead of updates is `pipeline.embedding_staleness`."""
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
    """Stages on threads with bounded queues; false: the same stages in line (the reference, see "The pipeline")."""
    depth: QueueDepths = QueueDepths()
    """Queue depth after each stage: more absorbs bursts, costs RAM."""
    data_workers: int = Field(0, ge=0, le=1)
    """1: read and featurize the training data in a worker process (``torch.utils.data``'s
    DataLoader), batches handed over in shared memory, so the parsing and hashing, which hold
    the GIL much of the time, never compete with the trainer's threads for it. Each epoch's worker
    forks from a server process that imported torch once (the first epoch pays its start, a few
    seconds; the others a fraction of a second; ``ember.pipeline.worker_process``). 0: on threads
    of this process."""
    engine: Literal["auto", "threads", "inline"] = "auto"
    """Where the embedding stages (plan, fetch, the GPU copy, the sparse update, metrics) run
    when ``enabled``; reading and featurizing are on threads either way. ``threads``: each on
    its own thread, overlapping the dense step. That pays when the dense step leaves the CPU
    free (it runs on a GPU) or a fetch waits on a disk (``embedding_staleness`` > 0 lets
    it run ahead). ``inline``: on the training thread, between dense steps. A dense step on the
    CPU already uses every core it is given (``train.threads``), so a stage thread can only take
    cores from it (and the GIL): on 2 cores the threaded stages ran at 0.91x of inline ones
    (bench/RESULTS.md). ``auto``: ``threads`` on a GPU, with staleness > 0 or under distributed
    training (the ID exchange waits on the network); ``inline`` otherwise. The choice is logged."""
    stop_timeout_s: float = Field(10.0, gt=0)
    """How long a stopping pipeline waits for each stage thread to finish its current item."""
    embedding_staleness: int = Field(0, ge=0)
    """Steps the embedding fetch may run ahead of the sparse update: 0 = exact synchronous
    training; k > 0 lets batch t+k read rows before batch t's update is written (no update is
    lost: an update lands on the current row; a read is at most k updates behind). Hybrid
    training as in Persia: with distributed training the ID and row exchanges of later batches
    overlap the dense step."""


def engine_on_threads(pipe: PipelineConfig, cuda: bool, staleness: int, distributed: bool) -> tuple[bool, str]:
    """Whether the embedding stages run on threads (``pipeline.engine``), and why, in words."""
    if not pipe.enabled:
        return False, "pipeline.enabled is false: every stage runs in line"
    if pipe.engine != "auto":
        return pipe.engine == "threads", f"pipeline.engine: {pipe.engine}"
    why = ("the dense step runs on a GPU" if cuda else f"pipeline.embedding_staleness is {staleness}" if staleness
           else "distributed training exchanges IDs over the network" if distributed else None)
    if why is not None:
        return True, f"pipeline.engine: auto chose threads ({why})"
    return False, ("pipeline.engine: auto runs the embedding stages in line (reading and featurizing stay on "
                   "threads): the dense step runs on the CPU, whose cores it uses; set pipeline.engine: threads "
                   "to overlap them with it")
