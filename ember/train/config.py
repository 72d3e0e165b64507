"""The run config's ``train:`` section (how long, how to optimise the dense part, where the run is
written) and its ``eval:`` section (when and how much to evaluate, and what to report)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from ember.config_base import ConfigModel, removed_key
from ember.optim.schedule import ScheduleConfig

CompileMode = Literal["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"]
COMPILE_MODES: tuple[str, ...] = CompileMode.__args__  # torch.compile's modes, as train.compile names them

__all__ = ["TrainConfig", "DenseOptimizerConfig", "EarlyStoppingConfig", "EvalConfig"]


class DenseOptimizerConfig(ConfigModel):
    """The torch optimizer of the dense (MLP) parameters: on CPU parameters its fused kernel
    (torch's ``fused=True``, 2.7-5.7x faster than the default loop on a DLRM's MLPs), elsewhere
    torch's default for the device."""

    type: Literal["adagrad", "adam", "adamw", "sgd"] = "adagrad"
    """`adagrad`, `adam`, `adamw` or `sgd` (torch.optim)."""
    lr: float = Field(0.01, gt=0)
    """Learning rate."""
    weight_decay: float = Field(0.0, ge=0)
    """Weight decay (L2 for adagrad, adam, sgd; decoupled for adamw)."""
    eps: float | None = Field(None, gt=0)
    """The optimizer's eps; unset: torch's default."""
    schedule: ScheduleConfig | None = None
    """Learning-rate warmup and decay over the global step."""


class EarlyStoppingConfig(ConfigModel):
    """Stop when an eval metric has not improved for ``patience`` evaluations (``eval.every``
    steps, or each epoch's end); see ``ember.train.early_stop``."""

    metric: str = "auc"
    """``auc`` or ``logloss`` (the mean over tasks), or one task's: ``auc/<label>``, ``logloss/<label>``."""
    mode: Literal["max", "min"] | None = None
    """`max` or `min`: which direction is better; unset: max for auc, min for logloss."""
    patience: int = Field(3, ge=1)
    """Evaluations without improvement before stopping."""
    min_delta: float = Field(0.0, ge=0)
    """An improvement smaller than this does not count."""
    save_best: bool = True
    """Checkpoint each improving evaluation and keep it (`checkpoints/BEST`); false: only record the best step."""
    restore_best: bool = False
    """At the end, the run's model (result, --export, summary metrics) is the best one."""

    @model_validator(mode="after")
    def _check(self) -> "EarlyStoppingConfig":
        kind = self.metric.split("/", 1)[0]
        if kind not in ("auc", "logloss") or self.metric.endswith("/"):
            raise ValueError(f"metric must be auc or logloss, optionally for one task (auc/<label>), got {self.metric!r}")
        if self.restore_best and not self.save_best:
            raise ValueError("restore_best needs save_best: true (the best weights are restored from their checkpoint)")
        return self

    @property
    def direction(self) -> str:
        """``max`` or ``min``: ``mode``, or the metric's natural direction."""
        return self.mode or ("max" if self.metric.startswith("auc") else "min")


class TrainConfig(ConfigModel):
    """The training run. Steps count optimizer steps (one per batch)."""

    mode: Literal["offline", "online"] = "offline"
    """``offline``: ``epochs`` passes over ``data.train``. ``online``: one pass over it as a stream,
    in file order, no epochs (a watched ``data.train``, ``data.watch``, never ends by itself):
    until ``max_steps``, the end of the files (``data.watch.idle_timeout_s``) or a signal; the
    checkpoint records the files finished and the rows trained of the current one."""
    epochs: int = Field(1, ge=1)
    """Passes over the training data (offline mode)."""
    max_steps: int | None = Field(None, ge=1)
    """Stop after this many steps (one step per batch)."""
    dense_optimizer: DenseOptimizerConfig = DenseOptimizerConfig()
    """The torch optimizer of the model's dense parameters: `type` (`adagrad`, `adam`, `adamw`, `sgd`), `lr`,
    `weight_decay` (0), `eps` (torch's default), `schedule` (none; see Learning-rate schedules)."""
    task_weights: list[float] | None = None
    """One loss weight per label; unset: all 1."""
    log_every: int = Field(50, ge=1)
    """Steps between training log records in `metrics.jsonl`."""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """Where the model and batches run: `auto` (CUDA when present), `cuda` or `cpu`; tables stay where their
    `storage` puts them."""
    threads: int | None = Field(None, ge=1)
    """`torch.set_num_threads`; the native kernels use as many. Unset: torch's default."""
    seed: int = Field(0, ge=0, lt=2**63)
    """Seed of the model's initialisation, and of every table without its own `seed`."""
    deterministic: bool = False
    """Use torch's deterministic algorithms: a resumed run is then bit-identical to an uninterrupted one."""
    out_dir: str = "runs"
    """Parent directory of runs."""
    run_name: str | None = None
    """The run directory is `out_dir/run_name` (a name, not a path: no `/`, not `.` or `..`); unset:
    `run-<date>-<time>`."""
    resume: str | None = None
    """A run or checkpoint directory to continue exactly (model, optimizers, data position, RNG)."""
    init_from: str | None = None
    """A run or checkpoint directory whose weights start a finetune (fresh data position, fresh
    dense optimizer). A table keeps its checkpointed sparse optimizer state when its optimizer type
    is the same, else it takes the weights alone and its new optimizer's state starts fresh (said
    per table); a table's dim must match the checkpoint's."""

    @field_validator("run_name")
    @classmethod
    def _run_name(cls, v: str | None) -> str | None:
        if v is not None and (v in ("", ".", "..") or "/" in v or "\\" in v or "\x00" in v):
            raise ValueError("must be a directory name, not a path (no '/', not empty, '.' or '..'): the run "
                             "directory is train.out_dir/train.run_name; set train.out_dir for another place")
        return v
    progress: bool = True
    """Progress bar on stderr: steps done of the total with an ETA, loss, samples/s, the busiest stage, hit
    rates."""
    precision: Literal["auto", "fp32", "bf16", "fp16"] = "auto"
    """The dense model's compute type: `bf16` or `fp16` run its matmuls under `torch.autocast` on fp32 master
    weights; `fp16` adds a dynamic loss scale that also covers the embedding gradients (a step that overflows
    is skipped whole: no dense step, no row update; the scale is checkpointed). Rows, optimizer state and the
    loss stay fp32. Scoring (eval, predict) runs in fp32, as an exported model serves. `auto` (the default): bf16
    on a CPU that computes it natively when the dense model is large enough to gain (AVX512-BF16: its linear
    layers do at least 25 M multiply-adds a batch; AMX-BF16: 50 M a batch and 400 k a sample, since narrow
    layers lose there), else fp32, and fp32 on a GPU (DLRM-sized dense models measured 0.76-0.83x in bf16 on an
    H200: launch-bound); the choice and its reason are logged. Without native bf16, bf16/fp16 are slower."""
    compile: bool | CompileMode = False
    """`torch.compile` the dense model (the first steps pay for compilation); if compiling fails, a warning names
    the error and the run goes on uncompiled. `true` is torch's `default` mode; a mode name is passed to
    `torch.compile(mode=...)`: `reduce-overhead` (and `max-autotune`) also replay the model's forward and backward
    as CUDA graphs on a GPU, for a dense step bound by launching its kernels (on a CPU they compile as `default`,
    said once)."""

    @field_validator("compile", mode="before")
    @classmethod
    def _compile_mode(cls, v: object) -> object:
        if isinstance(v, bool) or v in COMPILE_MODES:
            return v
        raise ValueError(f"give true, false or one of torch.compile's modes ({', '.join(COMPILE_MODES)}); got {v!r}")
    early_stopping: EarlyStoppingConfig | None = None
    """Stop when an eval metric stops improving."""
    tensorboard: bool = False
    """Also write every `metrics.jsonl` record as TensorBoard scalars to `<run>/tensorboard` (needs `pip install
    'ember[tensorboard]'`; without it the run stops up front naming that command)."""
    # removed: the staged pipeline schedules the lookup phases ahead (``pipeline:`` section)
    prefetch: None = None
    """Removed: the staged pipeline fetches rows ahead (`pipeline.enabled`, `pipeline.embedding_staleness`);
    setting it is an error that says so."""

    _no_prefetch = removed_key("prefetch", "train.prefetch was removed: the staged pipeline fetches rows ahead; use "
                               "pipeline.enabled and pipeline.embedding_staleness (how many steps the fetch may run ahead)")


class EvalConfig(ConfigModel):
    """``eval:``: when the held-out evaluation on ``data.eval`` runs (``every``, ``max_batches``),
    what it reports beside AUC and logloss
    (``ember.train.ranking_metrics``: calibration, ECE and NE always; GAUC with ``group_by``;
    every metric per slice with ``slices``), and the rolling window of progressive validation
    (``ember.train.window``): each training batch is scored by the forward that trains on it,
    before its update, so its scores are out-of-sample; the last ``window_rows`` (score, label)
    pairs give every metric above every ``window_every`` steps (or ``window_every_s`` seconds),
    with no extra forward."""

    every: int | None = Field(None, ge=1)
    """Steps between evaluations on `data.eval`; unset: after each epoch (offline) or at the end (online)."""
    max_batches: int | None = Field(None, ge=1)
    """Cap on evaluation batches; unset: the whole eval set."""
    group_by: str | None = None
    """A column of the eval data (a feature or not, e.g. ``user_id``): also report GAUC, the AUC
    of each group's rows averaged (``gauc/<task>``); groups with one class are skipped and counted
    (``gauc_groups_skipped/<task>``)."""
    gauc_weight: Literal["rows", "clicks"] = "rows"
    """GAUC's weight of a group: its rows (impressions), or its positive labels (clicks)."""
    calibration_bins: int = Field(10, ge=1)
    """Equal-mass bins (of the rows sorted by prediction) of the expected calibration error (``ece/<task>``)."""
    slices: list[str] = []
    """Columns of the eval data (e.g. ``country``): every metric also per value of each, as
    ``auc/<task>/country=US``, with ``rows/country=US``."""
    slice_top: int = Field(10, ge=1)
    """Values per slice column reported on their own (the most frequent by rows); the rest together as ``other``."""

    window_rows: int | None = Field(None, ge=1)
    """Keep the last this many (score, label) pairs of the training forward (each batch scored before its own
    update: out-of-sample) and report over them what eval reports (AUC, logloss, calibration, ECE, NE; GAUC with
    `group_by` and per slice with `slices`, whose columns the training rows then carry too) as `eval` records with a
    `window_rows` field
    (offline too, but from a second epoch on its rows were trained on before: no longer out-of-sample); the
    scores are the training forward's, in `train.precision` (eval's are fp32); 8 bytes per row and label; a
    report sorts the window (~1.4 s per million rows on a loaded 2-core box, training paused)."""
    window_every: int | None = Field(None, ge=1)
    """Steps between window reports; default ``train.log_every`` (unless ``window_every_s`` is set)."""
    window_every_s: float | None = Field(None, gt=0)
    """Seconds: also report after the first step ending this long after the last report."""

    @property
    def key_columns(self) -> list[str]:
        """The raw columns the eval batches must carry: ``group_by`` and ``slices``."""
        return list(dict.fromkeys([*([self.group_by] if self.group_by else []), *self.slices]))

    @model_validator(mode="after")
    def _check(self) -> "EvalConfig":
        if len(set(self.slices)) != len(self.slices):
            raise ValueError(f"slices lists a column twice: {self.slices}")
        if self.window_rows is None and (self.window_every is not None or self.window_every_s is not None):
            raise ValueError("window_every / window_every_s set the rolling window's interval: set window_rows too")
        return self
