"""TrainConfig: how long, how to optimise the dense part, where to write, when to evaluate."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from ember.config_base import ConfigModel

__all__ = ["TrainConfig", "DenseOptimizerConfig"]


class DenseOptimizerConfig(ConfigModel):
    """The torch optimizer of the dense (MLP) parameters."""

    type: Literal["adagrad", "adam", "adamw", "sgd"] = "adagrad"
    lr: float = Field(0.01, gt=0)
    weight_decay: float = Field(0.0, ge=0)
    eps: float | None = Field(None, gt=0)


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
    # removed: the staged pipeline will schedule the lookup phases ahead (see the README)
    prefetch: None = None

    @field_validator("prefetch", mode="before")
    @classmethod
    def _no_prefetch(cls, v: object) -> None:
        if v is not None:
            raise ValueError(
                "train.prefetch was removed: embedding lookups now run in explicit phases that the "
                "staged pipeline schedules; delete the key (data.prefetch still reads batches ahead)"
            )
        return None
