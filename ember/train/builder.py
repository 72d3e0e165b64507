"""Build a run's parts from its config: embedding collections, model, dense optimizer."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch
from torch import Tensor, nn

from ember.batch import Batch
from ember.config import RunConfig
from ember.distributed.process_group import DistributedRun
from ember.distributed.sharding import ShardingPlan
from ember.embedding import EmbeddingCollection, FeatureConfig, SparseOptimizer, TableConfig
from ember.embedding.collection import Lookup
from ember.embedding.init import InitializerConfig
from ember.errors import ConfigError
from ember.models.registry import ModelInputs, build_model
from ember.train.config import DenseOptimizerConfig

__all__ = ["Components", "build_components", "LINEAR_SUFFIX"]

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
    dist: DistributedRun | None = None  # set when torchrun started several processes
    ddp: nn.Module | None = None  # ``model`` under DistributedDataParallel (same parameters)

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
        ``lookups``: one per collection (``collections()`` order), planned and maybe fetched
        ahead (e.g. by the pipeline), else each collection plans and fetches its own."""
        lk = lookups or [None] * len(self.collections())
        emb = self.embeddings(batch.sparse, lk[0])
        pooled = [emb[f.name] for f in self.embeddings.features]
        linear = None
        if self.linear is not None:
            lin = self.linear(batch.sparse, lk[1])
            linear = [lin[f.name] for f in self.linear.features]
        training = self.ddp is not None and self.model.training and torch.is_grad_enabled()
        return (self.ddp if training else self.model)(batch.dense, pooled, linear)  # type: ignore[misc]

    def plan(self, batch: Batch, train: bool) -> list[Lookup]:
        """Phase 1 of every collection for ``batch`` (see ``EmbeddingCollection.plan``)."""
        return [ec.plan(batch.sparse, train) for ec in self.collections()]

    def train(self, mode: bool = True) -> None:
        self.model.train(mode)
        for ec in self.collections():
            ec.train(mode)


def pick_device(name: str) -> torch.device:
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError("train.device is 'cuda' but no CUDA device is visible; use 'auto' or 'cpu'")
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def make_dense_optimizer(params, cfg: DenseOptimizerConfig) -> torch.optim.Optimizer:
    kw: dict = {"lr": cfg.lr, "weight_decay": cfg.weight_decay}
    if cfg.eps is not None and cfg.type != "sgd":
        kw["eps"] = cfg.eps
    cls = {"adagrad": torch.optim.Adagrad, "adam": torch.optim.Adam, "adamw": torch.optim.AdamW, "sgd": torch.optim.SGD}[cfg.type]
    return cls(params, **kw)


def build_components(cfg: RunConfig, dist: DistributedRun | None = None) -> Components:
    """Tables, model and optimizers for ``cfg`` (seeded by ``train.seed``); with ``dist``, this
    rank's shard of the tables (placed by the sharding planner) and the model under DDP."""
    torch.manual_seed(cfg.train.seed)
    device = pick_device(cfg.train.device) if dist is None else dist.model_device
    schema = cfg.schema
    tables = cfg.table_configs()
    features = [FeatureConfig(name=f.name, table=f.table_name, pooling=f.pooling, max_length=f.max_length) for f in schema.sparse]
    pooled = [f for f in features if f.pooling != "sequence"]
    if len(pooled) != len(features):
        names = [f.name for f in features if f.pooling == "sequence"]
        raise ConfigError(
            f"sparse features {names} use pooling 'sequence', which the built-in models do not take; "
            "use sum/mean/sqrtn for them or call EmbeddingCollection from your own model"
        )
    plan = None
    if dist is not None:
        from ember.train.distributed import shard_storage, sharding_plan

        tables = shard_storage(tables, dist.rank)
        plan = sharding_plan(cfg, tables, dist.world_size)
        if dist.lead:
            print(plan.describe(), flush=True)
    _announce_storage(tables)
    ec = _collection(tables, features, cfg.train.seed, dist, plan).to(device)
    dims = {t.name: t.dim for t in tables}
    inputs = ModelInputs(num_dense=len(schema.dense), sparse_dims=[dims[f.table_name] for f in features], num_tasks=len(schema.labels))
    model = build_model(cfg.model, inputs).to(device)
    linear = None
    if getattr(model, "wants_linear", False):
        lin_tables = [
            TableConfig(name=t.name + LINEAR_SUFFIX, dim=1, initializer=InitializerConfig(type="zeros"), optimizer=t.optimizer,
                        seed=t.seed, min_count=t.min_count, ttl_steps=t.ttl_steps)
            for t in tables
        ]
        lin_features = [FeatureConfig(name=f.name, table=f.table_name + LINEAR_SUFFIX, pooling=f.pooling) for f in features]
        if plan is not None:
            plan = plan.with_aliases({lt.name: t.name for lt, t in zip(lin_tables, tables)})
        linear = _collection(lin_tables, lin_features, cfg.train.seed, dist, plan).to(device)
    opt = make_dense_optimizer(model.parameters(), cfg.train.dense_optimizer)
    sparse_opt = SparseOptimizer(ec, *([linear] if linear is not None else []))
    ddp = None
    if dist is not None:
        from ember.distributed.dense import wrap_model

        ddp = wrap_model(model, dist)
    return Components(ec, linear, model, opt, sparse_opt, list(schema.labels), device, dist, ddp)


def _collection(tables: list[TableConfig], features: list[FeatureConfig], seed: int, dist: DistributedRun | None,
                plan: ShardingPlan | None) -> EmbeddingCollection:
    """One process: an EmbeddingCollection; distributed: this rank's shard of it."""
    if dist is None or plan is None:
        return EmbeddingCollection(tables, features, seed=seed)
    from ember.distributed.sharded import ShardContext, ShardedCollection

    return ShardedCollection(tables, features, seed, ShardContext(plan, dist.rank, dist.exchange))


def _announce_storage(tables: list[TableConfig]) -> None:
    """Print the memory and disk each tiered table will use, and fail early if it cannot fit."""
    from ember.tiers.storage import StorageConfig, check_disk_together, plan_storage

    plans = []
    for t in tables:
        if t.storage != StorageConfig():
            plan = plan_storage(t.storage, t.stored_dim, t.name)
            print(plan.describe(), flush=True)
            plan.check()
            plans.append(plan)
    check_disk_together(plans)
