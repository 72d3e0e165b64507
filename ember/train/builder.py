"""Build a run's parts from its config: embedding collections, model, dense optimizer."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import torch
from torch import Tensor, nn

from ember.batch import Batch
from ember.config import RunConfig
from ember.distributed.process_group import DistributedRun
from ember.distributed.sharding import ShardingPlan
from ember.embedding import EmbeddingCollection, FeatureConfig, SparseOptimizer, TableConfig
from ember.embedding.collection import Lookup
from ember.embedding.group import GroupLookup
from ember.embedding.init import InitializerConfig
from ember import once
from ember.errors import ConfigError
from ember.models.registry import ModelInputs, build_model
from ember.optim.schedule import scheduled_lr
from ember.train.config import DenseOptimizerConfig, EvalConfig
from ember.train.device import pick_device
from ember.models.distill import DistillConfig, Distilled
from ember.train.placement import EmbeddingOnly, Placement, Towers
from ember.train.precision import LossScaler, Precision, dense_macs, resolve

__all__ = ["Components", "build_components", "tower_plan", "LINEAR_SUFFIX"]

log = logging.getLogger(__name__)

LINEAR_SUFFIX = "__linear"


@dataclass
class Components:
    """The trainable parts of a run; models stay plain nn.Modules that know nothing of tables."""

    embeddings: EmbeddingCollection
    linear: EmbeddingCollection | None  # dim-1 tables for first-order / wide terms
    model: nn.Module
    dense_optimizer: torch.optim.Optimizer
    sparse_optimizer: SparseOptimizer
    task_names: list[str]
    device: torch.device
    precision: Precision = "fp32"  # the model's compute type (train.precision); parameters stay fp32
    scaler: LossScaler | None = None  # fp16: dynamic loss scale over dense and embedding gradients
    compiled: Callable[..., Tensor] | None = field(default=None, repr=False)  # train.compile: torch.compile(model or ddp)
    compiled_graphs: bool = False  # ``compiled`` replays CUDA graphs (train.compile: reduce-overhead on a GPU)
    distill: DistillConfig | None = None  # model.distill: the loss learns from the teacher's scores too
    dense_config: DenseOptimizerConfig | None = None  # its lr schedule is applied per step
    dist: DistributedRun | None = None  # set when torchrun started several processes
    ddp: nn.Module | None = None  # ``model`` under DistributedDataParallel (same parameters)
    eval_config: EvalConfig | None = None  # eval: what ``evaluate`` reports beside AUC and logloss
    placement: Placement = field(default_factory=Placement)  # how a step's IDs, rows and outputs travel

    @property
    def embedding_rank(self) -> bool:
        """Whether this rank holds tables and runs no dense model (``placement: embedding_ranks``)."""
        return not self.placement.runs_model

    @property
    def lead(self) -> bool:
        """Whether this process writes the run's files: the only one, or rank 0."""
        return self.dist is None or self.dist.lead

    def local_batch(self, batch: Batch) -> Batch:
        """This rank's slice of a global batch (the batch itself in one process)."""
        if self.dist is None:
            return batch
        return batch.slice_rows(*self.dist.local_rows(batch.size))

    def sum_over_ranks(self, values: list[float]) -> list[float]:
        """``values`` summed over ranks (unchanged in one process)."""
        return values if self.dist is None else self.dist.all_sum(values)

    def gather_rows(self, array: np.ndarray) -> np.ndarray:
        """Every rank's rows of ``array`` in rank order (unchanged in one process)."""
        return array if self.dist is None else self.dist.gather_rows(array)

    def owned(self) -> Callable[[str, Tensor], Tensor] | None:
        """For loading a checkpoint into a shard: ``owned(table, ids)`` masks the IDs this rank
        owns (None in one process: every row is kept)."""
        if self.dist is None:
            return None
        by_table = {name: ec for ec in self.collections() for name in ec.tables}
        return lambda table, ids: by_table[table].owned(table, ids)  # type: ignore[attr-defined]  # ShardedCollection

    def collections(self) -> list[EmbeddingCollection]:
        return [self.embeddings] + ([self.linear] if self.linear is not None else [])

    def forward(self, batch: Batch, lookups: list[Lookup] | None = None) -> Tensor:
        """Logits [B, T] for a batch whose dense part and labels are already on ``device``;
        ``lookups``: one per collection (``collections()`` order; with tower placement, the
        routed one), planned and maybe fetched ahead (e.g. by the pipeline), else planned and
        fetched here. As the placement runs it (``ember.train.placement``)."""
        return self.placement.forward(self, batch, lookups)

    def run_model(self, *inputs: Any) -> Tensor:
        """The dense model on its inputs: compiled, under DDP in distributed training, or plain."""
        # distributed: training runs DDP (gradients summed over ranks); ``compiled`` is then
        # torch.compile of the DDP module, whose forward is the model's in evaluation too
        if self.compiled is not None:
            try:
                if self.compiled_graphs and self.model.training and torch.is_grad_enabled():
                    # a new training step: the graphs' outputs of the last one may be overwritten (its
                    # logits and gradients are consumed by now; torch cannot always infer the boundary)
                    torch.compiler.cudagraph_mark_step_begin()
                return self.compiled(*inputs)
            except Exception as e:  # announced, never silent: the run goes on uncompiled
                log.warning("train.compile: torch.compile failed (%s: %s); the model runs uncompiled from "
                            "here on", type(e).__name__, str(e).splitlines()[0] if str(e) else "")
                self.compiled = None
        if self.ddp is not None and self.model.training and torch.is_grad_enabled():
            return self.ddp(*inputs)
        return self.model(*inputs)

    def loss(self, batch: Batch, logits: Tensor, task_weights: Tensor | None = None, rows: int | None = None) -> Tensor:
        """The training loss of ``logits`` (from ``forward`` in training mode): BCE on the labels,
        plus the teacher's part under ``model.distill`` (``ember.models.distill``). ``rows``: the
        global batch's rows when ``batch`` is one rank's slice of it (see ``multitask_bce``).
        An embedding rank's loss is 0 (it has no rows)."""
        return self.placement.loss(self, batch, logits, task_weights, rows)

    def set_dense_lr(self, step: int) -> None:
        """Before the dense step of global step ``step`` (0-based): every param group's lr from the
        schedule (no schedule: the optimizer's lr is left alone)."""
        cfg = self.dense_config
        if cfg is None or cfg.schedule is None:
            return
        lr = scheduled_lr(cfg.lr, cfg.schedule, step)
        for group in self.dense_optimizer.param_groups:
            group["lr"] = lr

    def backward(self, loss: Tensor, step: int) -> list[GroupLookup]:
        """Backward (loss-scaled under fp16) and the dense optimizer step of global step ``step``
        (its scheduled lr); returns the lookups whose rows are due for their update
        (``SparseOptimizer.apply``). An fp16 step whose gradients overflowed is skipped whole: no
        dense step and no lookups. An embedding rank has no backward and no dense step: its
        lookups (every rank's IDs it owns) await the dense ranks' gradients in their update."""
        return self.placement.backward(self, loss, step)

    def plan(self, batch: Batch, train: bool) -> list[Lookup]:
        """Phase 1 of every collection for ``batch`` (see ``EmbeddingCollection.plan``); with
        tower placement, the features routed to this rank's towers, planned."""
        return self.placement.plan(self, batch, train)

    def train(self, mode: bool = True) -> None:
        self.model.train(mode)
        for ec in self.collections():
            ec.train(mode)


def make_dense_optimizer(params, cfg: DenseOptimizerConfig) -> torch.optim.Optimizer:
    """The torch optimizer ``cfg`` names over ``params``. When every parameter is a float tensor
    on the CPU, its fused kernel (``fused=True``: one pass over each parameter instead of torch's
    default loop of one op per parameter and term; on bench_dlrm's model 2.7x faster for Adagrad,
    5.7x for Adam, the same update up to float rounding); elsewhere torch's default for the
    device, said once."""
    params = list(params)
    kw: dict = {"lr": cfg.lr, "weight_decay": cfg.weight_decay}
    if cfg.eps is not None and cfg.type != "sgd":
        kw["eps"] = cfg.eps
    cls = {"adagrad": torch.optim.Adagrad, "adam": torch.optim.Adam, "adamw": torch.optim.AdamW, "sgd": torch.optim.SGD}[cfg.type]
    devices = sorted({p.device.type for p in params})
    if devices == ["cpu"] and all(torch.is_floating_point(p) for p in params):
        return cls(params, **kw, fused=True)
    if params and once.first("builder.dense_fused", (cfg.type, tuple(devices))):
        log.info("dense optimizer %s: torch's default implementation for parameters on %s (the fused kernel "
                 "serves CPU float parameters)", cfg.type, ", ".join(devices))
    return cls(params, **kw)


def keep_implementation(optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
    """``optimizer.load_state_dict(state)``, keeping the optimizer's own choice of implementation
    (``fused`` / ``foreach``, made for this run's devices) over the one saved with ``state``: a
    checkpoint written by a run on another device, or before the fused kernel was used, resumes
    at this run's speed."""
    chosen = [{k: g.get(k) for k in ("fused", "foreach")} for g in optimizer.param_groups]
    optimizer.load_state_dict(state)
    for group, impl in zip(optimizer.param_groups, chosen):
        group.update(impl)


def build_components(cfg: RunConfig, dist: DistributedRun | None = None, announce: bool = True) -> Components:
    """Tables, model and optimizers for ``cfg`` (seeded by ``train.seed``); with ``dist``, this
    rank's shard of the tables (placed by the sharding planner) and the model under DDP.
    ``announce``: print each tiered table's storage plan (training does; commands that only read
    a checkpoint do not: the plan would bury their output)."""
    torch.manual_seed(cfg.train.seed)
    device = pick_device(cfg.train.device) if dist is None else dist.model_device
    schema = cfg.schema
    tables = cfg.table_configs()
    features = cfg.features()  # (pooled: ember.config.check_sections)
    plan = None
    tower_node: list[int] = []
    if dist is not None:
        from ember.train.distributed import shard_storage, sharding_plan

        tables = shard_storage(tables, dist.rank)
        if cfg.distributed.placement == "towers":
            plan, tower_node = tower_plan(cfg, tables, dist.world_size, dist.topology.local_world_size)
        else:
            plan = sharding_plan(cfg, tables, dist.world_size)
        if dist.lead:
            print(plan.describe(), flush=True)
            if dist.embedding_ranks:
                from ember.distributed.embedding_ranks import describe_ranks

                print(describe_ranks(dist.world_size, len(dist.embedding_ranks)), flush=True)
    _announce_storage(tables, announce)
    tables = resolve_index(tables, device)
    ec = _collection(tables, features, cfg.train.seed, dist, plan).to(device)
    dims = {t.name: t.dim for t in tables}
    inputs = ModelInputs(num_dense=len(schema.dense), sparse_dims=[dims[f.table_name] for f in features],
                         num_tasks=len(schema.labels), feature_names=[f.name for f in features])
    model = build_model(cfg.model, inputs).to(device)
    linear = None
    if getattr(model, "wants_linear", False):
        # dim-1 tables stay fp32 whatever ``dtype`` says: one 16-bit weight pads to a whole word,
        # so a bf16 record would be no smaller
        lin_tables = [
            TableConfig(name=t.name + LINEAR_SUFFIX, dim=1, initializer=InitializerConfig(type="zeros"), optimizer=t.optimizer,
                        seed=t.seed, min_count=t.min_count, ttl_steps=t.ttl_steps)
            for t in tables
        ]
        lin_tables = resolve_index(lin_tables, device)
        # (the first-order twin reads every ID of a row: max_length applies to the embedding, as it always has)
        lin_features = [f.model_copy(update={"table": f.table_name + LINEAR_SUFFIX, "max_length": None}) for f in features]
        if plan is not None:
            plan = plan.with_aliases({lt.name: t.name for lt, t in zip(lin_tables, tables)})
        linear = _collection(lin_tables, lin_features, cfg.train.seed, dist, plan).to(device)
    opt = make_dense_optimizer(model.parameters(), cfg.train.dense_optimizer)
    sparse_opt = SparseOptimizer(ec, *([linear] if linear is not None else []))
    t = cfg.train
    scaler = None
    if t.precision == "fp16":  # distributed: every rank skips the steps any rank overflowed in
        scaler = LossScaler(agree=None if dist is None else lambda bad: bool(dist.agree([int(bad)])[0]))
    distill = cfg.model.distill  # (with schema.teacher: ember.config.check_sections)
    ddp, placement = None, Placement()
    embedding_rank = dist is not None and dist.embedding_only  # runs no dense model: no DDP, no compile
    if dist is not None:
        from ember.distributed.dense import wrap_model

        if cfg.distributed.placement == "towers":
            from ember.distributed.towers import TowerPlacement

            body = model.body if isinstance(model, Distilled) else model  # the DMT whose towers are placed
            placement = Towers(TowerPlacement(body, features, tower_node, dist, opt))  # type: ignore[arg-type]
        elif embedding_rank:
            placement = EmbeddingOnly()
        else:
            ddp = wrap_model(model, dist)
    # auto weighs the dense model's matmuls on a dense rank's slice of the batch (the same on every rank)
    ranks = dist.data_slice[1] if dist is not None and dist.data_slice is not None else 1
    per_sample = dense_macs(model)
    precision = resolve(t.precision, device, per_sample * -(-cfg.data.batch_size // ranks), per_sample)
    compiled, graphs = None, False
    if t.compile and not embedding_rank:
        mode = None if t.compile is True or t.compile == "default" else t.compile
        graphs = mode in _GRAPH_MODES and device.type == "cuda"
        if mode in _GRAPH_MODES and not graphs and once.first("builder.compile_graphs", mode):
            log.info("train.compile: %s replays CUDA graphs on a GPU only; the model on the %s compiles as default",
                     mode, device.type)
        compiled = _compile(ddp if ddp is not None else model, mode)  # distributed: compile(DDP(model))
    return Components(ec, linear, model, opt, sparse_opt, list(schema.labels), device, precision=precision,
                      scaler=scaler, compiled=compiled, compiled_graphs=graphs, distill=distill,
                      dense_config=t.dense_optimizer, dist=dist, ddp=ddp, eval_config=cfg.eval, placement=placement)


def tower_plan(cfg: RunConfig, tables: list[TableConfig], world_size: int, local_world_size: int,
               rows: dict[str, int | None] | None = None) -> tuple[ShardingPlan, list[int]]:
    """``distributed.placement: towers``: each DMT tower's tables on one node's ranks (nodes of
    ``local_world_size`` ranks), and the node of each tower (``ember.distributed.towers``).
    ``rows``: estimated rows per table (default ``table_rows(cfg)``)."""
    from ember.distributed.towers import place_towers, plan_towers
    from ember.models.dmt import DMTConfig, tower_indices
    from ember.train.distributed import table_rows

    if not isinstance(cfg.model, DMTConfig):  # (from_dict refuses it for placement towers: check_sections)
        raise ConfigError(f"tower placement needs a model of type dmt (towers of features); this run's model is "
                          f"{cfg.model.type}: use distributed.placement=tables")
    if local_world_size < 1 or world_size % local_world_size:
        raise ConfigError(f"distributed.placement towers needs the same number of ranks on every node; world size "
                          f"{world_size} is not a multiple of {local_world_size} ranks per node")
    features = cfg.features()
    towers = tower_indices(cfg.model, [f.name for f in features])
    tower_node = place_towers(towers, world_size // local_world_size)
    rows = table_rows(cfg) if rows is None else rows
    return plan_towers(tables, features, towers, tower_node, world_size, local_world_size, rows), tower_node


def resolve_index(tables: list[TableConfig], device: torch.device) -> list[TableConfig]:
    """``tables`` with ``storage.index: auto`` made ``host`` or ``device`` for a model on
    ``device`` (``StorageConfig.index_for``). With the model on a GPU each choice is logged once
    with its reason: ``device`` is the faster layout there (bench/RESULTS.md: 1.6x host rows a
    step, 1.8-2x in the pipelined trainer on an H200; a device budget becomes its hot rows in GPU
    memory), ``host`` is kept for tiered tables. A table whose device budget comes with the host
    cache's own options (``policy: lru``, ``admit_after``) keeps the host index's device cache and
    is warned about: it trains slower there, and is never switched silently."""
    out, chosen = [], {}
    for t in tables:
        if t.storage.index == "auto":
            index, why = t.storage.index_for(device)
            cache_only = index == "host" and t.storage.device != "cpu" and t.storage.device_budget_only()
            chosen.setdefault((index, why, cache_only), []).append(t.name)
            t = t.model_copy(update={"storage": t.storage.model_copy(update={"index": index})})
        out.append(t)
    if device.type == "cuda":
        for (index, why, cache_only), names in chosen.items():
            if not once.first("builder.index_auto", (index, why, tuple(names))):
                continue
            if cache_only:  # the host index's device cache (its policy options), every other row in host memory
                log.warning("storage.index auto: %s for %s (%s): on a GPU the host index's device cache trains slower "
                            "than no cache (DLRM-26 on an H200, bench/RESULTS.md: a cache of 1/4 of the rows at 0.65x "
                            "the speed of rows in host memory and 0.41x of the device index). Without policy: lru and "
                            "admit_after these tables would take the device index, which keeps their device budget "
                            "as copies of the rows read most in GPU memory; set storage.index: host to keep the cache "
                            "and this message away", index, _names(names), why)
                continue
            hint = "; set storage.index: host to keep the index on the host" if index == "device" else ""
            log.info("storage.index auto: %s for %s (%s)%s", index, _names(names), why, hint)
    return out


def _names(names: list[str]) -> str:
    return f"table '{names[0]}'" if len(names) == 1 else f"{len(names)} tables ({', '.join(names[:4])}{', ...' if len(names) > 4 else ''})"


_GRAPH_MODES = ("reduce-overhead", "max-autotune")  # torch.compile's modes that replay CUDA graphs


def _compile(model: nn.Module, mode: str | None = None) -> Callable[..., Tensor] | None:
    """``torch.compile(model, mode=mode)``; compilation itself happens at the first call
    (``Components.run_model`` announces a failure there). None, announced, where torch.compile is
    unavailable."""
    try:
        return torch.compile(model, mode=mode)
    except Exception as e:
        log.warning("train.compile: torch.compile is unavailable here (%s); the model runs uncompiled", e)
        return None


def _collection(tables: list[TableConfig], features: list[FeatureConfig], seed: int, dist: DistributedRun | None,
                plan: ShardingPlan | None) -> EmbeddingCollection:
    """One process: an EmbeddingCollection; distributed: this rank's shard of it."""
    if dist is None or plan is None:
        return EmbeddingCollection(tables, features, seed=seed)
    from ember.distributed.sharded import ShardContext, ShardedCollection

    return ShardedCollection(tables, features, seed, ShardContext(plan, dist.rank, dist.exchange, dist.updates))


def _announce_storage(tables: list[TableConfig], announce: bool = True) -> None:
    """Print (``announce``) the memory and disk each tiered table will use, and fail early if it cannot fit."""
    from ember.tiers.storage import StorageConfig, check_disk_together, plan_storage

    plans = []
    for t in tables:
        if t.storage != StorageConfig():
            plan = plan_storage(t.storage, t.stored_words, t.name)  # packed at the table's dtype
            if announce:
                print(plan.describe(), flush=True)
            plan.check()
            plans.append(plan)
    check_disk_together(plans)
