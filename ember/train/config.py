"""TrainConfig: how long, how to optimise the dense part, where to write, when to evaluate."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from ember.config_base import ConfigModel, removed_key
from ember.optim.schedule import ScheduleConfig

__all__ = ["TrainConfig", "DenseOptimizerConfig"]


class DenseOptimizerConfig(ConfigModel):
    """The torch optimizer of the dense (MLP) parameters."""

    type: Literal["adagrad", "adam", "adamw", "sgd"] = "adagrad"
    lr: float = Field(0.01, gt=0)
    weight_decay: float = Field(0.0, ge=0)
    eps: float | None = Field(None, gt=0)
    schedule: ScheduleConfig | None = None  # lr warmup / decay over the global step (ember.optim.schedule)


class TrainConfig(ConfigModel):
    """The training run. Steps count optimizer steps (one per batch)."""

    epochs: int = Field(1, ge=1)
    max_steps: int | None = Field(None, ge=1)
    dense_optimizer: DenseOptimizerConfig = DenseOptimizerConfig()
    task_weights: list[float] | None = None
    log_every: int = Field(50, ge=1)
    eval_every: int | None = Field(None, ge=1)  # steps; None: after each epoch
    eval_max_batches: int | None = Field(None, ge=1)
    checkpoint_every: int | None = Field(None, ge=1)  # steps; the final state is always saved
    keep_checkpoints: int = Field(2, ge=1)
    device: Literal["auto", "cpu", "cuda"] = "auto"
    threads: int | None = Field(None, ge=1)
    seed: int = 0
    deterministic: bool = False
    out_dir: str = "runs"
    run_name: str | None = None
    resume: str | None = None  # checkpoint to continue exactly (model, optimizers, data position)
    init_from: str | None = None  # checkpoint whose weights start a finetune (fresh data position)
    progress: bool = True
    embedding_staleness: int = Field(0, ge=0)
    """Steps the embedding fetch may run ahead of the sparse update: 0 = exact synchronous
    training; k > 0 lets batch t+k read rows before batch t's update is written (no update is
    lost: an update lands on the current row; a read is at most k updates behind)."""
    # removed: the staged pipeline schedules the lookup phases ahead (``pipeline:`` section)
    prefetch: None = None

    _no_prefetch = removed_key("prefetch", "train.prefetch was removed: the staged pipeline fetches rows ahead; use "
                               "pipeline.enabled and train.embedding_staleness (how many steps the fetch may run ahead)")
