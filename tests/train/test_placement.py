"""The placement runs a step's plan, forward, loss and backward (``ember.train.placement``):
local in one process; an embedding rank's (``EmbeddingOnly``) fetches but runs no model and has
a zero loss. Tower placement, and embedding ranks taking their lookups for the dense ranks'
gradients with no dense step: tests/distributed/test_towers.py and test_embedding_ranks.py."""

from __future__ import annotations

import torch

from ember.config import from_dict
from ember.pipeline.loader import make_batches
from ember.train.builder import build_components
from ember.train.placement import EmbeddingOnly, Placement


def _parts():
    cfg = from_dict({
        "data": {"preset": "synthetic", "synthetic": {"rows": 256, "eval_rows": 64, "vocab_size": 500, "num_sparse": 3},
                 "batch_size": 64},
        "embedding": {"dim": 4, "optimizer": {"type": "adagrad", "lr": 0.1}},
        "model": {"type": "dlrm", "bottom_mlp": [8, 4], "top_mlp": [8]},
        "train": {"device": "cpu", "progress": False},
    })
    parts = build_components(cfg)
    parts.train(True)
    return parts, next(iter(make_batches(cfg.data, cfg.schema, "train")))


def _dense(parts) -> list[torch.Tensor]:
    return [p.detach().clone() for p in parts.model.parameters()]


def test_one_process_runs_the_local_placement_and_steps_the_dense_model():
    parts, batch = _parts()
    assert type(parts.placement) is Placement and not parts.embedding_rank
    before = _dense(parts)
    logits = parts.forward(batch, parts.plan(batch, train=True))
    assert logits.shape == (batch.size, 1) and logits.dtype == torch.float32
    ready = parts.backward(parts.loss(batch, logits), step=0)
    assert ready and all(lk.grad is not None for lk in ready)
    assert any(not torch.equal(a, b) for a, b in zip(before, _dense(parts)))


def test_an_embedding_rank_fetches_but_runs_no_model():
    parts, batch = _parts()
    parts.placement = EmbeddingOnly()
    assert parts.embedding_rank
    before = _dense(parts)
    lookups = parts.plan(batch, train=True)
    logits = parts.forward(batch, lookups)
    assert torch.equal(logits, torch.zeros(batch.size, 1))
    assert all(lk.records is not None for lk in lookups[0].groups)  # fetched: the rows wait for their update
    assert parts.loss(batch, logits).item() == 0.0
    assert all(torch.equal(a, b) for a, b in zip(before, _dense(parts)))  # no model ran, nothing stepped
