"""The communication model's byte prediction for a run config (``ember.distributed.traffic``):
the unique IDs each rank's slice of each batch holds, per table, read from the run's own data,
and the model's tables and dense parameters. What the benchmark and the tests compare with the
bytes a distributed run measured (``Exchange.take_stats``)."""

from __future__ import annotations

from itertools import islice

import numpy as np

from ember.config import RunConfig
from ember.distributed.traffic import TableLoad, predict_bytes
from ember.pipeline.loader import make_batches
from ember.train.builder import LINEAR_SUFFIX, build_components

__all__ = ["unique_per_rank", "predicted_bytes"]


def unique_per_rank(cfg: RunConfig, world_size: int, first: int, stop: int) -> dict[str, float]:
    """Mean over ranks and over training steps ``first..stop-1`` (0-based) of the unique IDs of
    each table in one rank's slice of the global batch (rank r takes rows ``rB/N .. (r+1)B/N``)."""
    per_table = {t.name: 0.0 for t in cfg.table_configs()}
    feats = {f.name: f.table_name for f in cfg.schema.sparse}
    batches = make_batches(cfg.data, cfg.schema, "train", threaded=False)
    n = 0
    for batch in islice(batches, first, stop):
        for r in range(world_size):
            part = batch.sparse.slice_rows(batch.size * r // world_size, batch.size * (r + 1) // world_size)
            ids: dict[str, list[np.ndarray]] = {}
            for feat, table in feats.items():
                ids.setdefault(table, []).append(part[feat].values.numpy())
            for table, arrays in ids.items():
                per_table[table] += np.unique(np.concatenate(arrays)).size
        n += 1
    if n != stop - first:
        raise ValueError(f"unique_per_rank: the data has {first + n} batches, fewer than {stop}")
    return {t: v / (n * world_size) for t, v in per_table.items()}


def predicted_bytes(cfg: RunConfig, world_size: int, first: int, stop: int) -> dict[str, float]:
    """``predict_bytes`` for ``cfg`` on ``world_size`` ranks over steps ``first..stop-1``: its
    tables as the trainer groups them, their unique IDs per rank from the data, the dense
    model's parameter count."""
    parts = build_components(cfg)
    unique = unique_per_rank(cfg, world_size, first, stop)
    groups = [[TableLoad(unique[t.name.removesuffix(LINEAR_SUFFIX)], t.dim) for t in g.tables]  # dim-1 twins: same IDs
              for ec in parts.collections() for g in ec.groups]
    params = sum(p.numel() for p in parts.model.parameters())
    for ec in parts.collections():
        ec.close()
    return predict_bytes(groups, world_size, params)
