"""Each sparse optimizer against a dense reference on the same rows."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ember.batch import SparseFeatures
from ember.embedding import EmbeddingCollection, EmbeddingTable, FeatureConfig, SparseOptimizer, TableConfig
from ember.optim import FTRL, SGD, Adagrad, Adam, RowWiseAdagrad
from ember.testing import rows

D = 4
N_ROWS = 6


def _collection(opt, dim: int = D, **kw) -> tuple[EmbeddingCollection, SparseOptimizer]:
    ec = EmbeddingCollection([TableConfig(name="t", dim=dim, optimizer=opt, seed=0, **kw)], [FeatureConfig(name="f", table="t")])
    return ec, SparseOptimizer(ec)


def _embed(ec, ids):
    """One bag per ID: the embedding of every occurrence, [N, D]."""
    return ec(SparseFeatures(["f"], ids, torch.ones_like(ids)))["f"]


def _run_sparse(opt, batches, grads_fn):
    """Train a table through the engine on ID batches; the loss per occurrence comes from grads_fn."""
    ec, sparse_opt = _collection(opt, initializer={"type": "normal"})
    for ids in batches:
        grads_fn(_embed(ec, ids), ids).backward()
        sparse_opt.step()
    table = ec.tables["t"]
    return table, rows(table, torch.arange(N_ROWS))[:, :D]


def _loss(emb: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    target = torch.sin(ids.float().unsqueeze(1) + torch.arange(D).float())
    return ((emb - target) ** 2 * (1 + ids.float().unsqueeze(1))).sum()


def _dense_reference(torch_opt_cls, kwargs, batches, init):
    weight = torch.nn.Parameter(init.clone())
    opt = torch_opt_cls([weight], **kwargs)
    for ids in batches:
        opt.zero_grad()
        _loss(weight[ids], ids).backward()
        opt.step()
    return weight.detach()


# every batch touches every row (with duplicates), so lazy == dense semantics
FULL_BATCHES = [torch.tensor([0, 1, 2, 3, 4, 5, 2, 2, 5]), torch.tensor([5, 4, 3, 2, 1, 0, 0]), torch.tensor([3, 0, 1, 2, 4, 5, 1])] * 3


def _init():
    t = EmbeddingTable(TableConfig(name="t", dim=D, initializer={"type": "normal"}, seed=0))
    return t.new_records(torch.arange(N_ROWS))[:, :D]


@pytest.mark.parametrize(
    "ours, ref_cls, ref_kwargs",
    [
        (SGD(lr=0.05), torch.optim.SGD, {"lr": 0.05}),
        (Adagrad(lr=0.1, eps=1e-10), torch.optim.Adagrad, {"lr": 0.1, "eps": 1e-10}),
        (Adagrad(lr=0.1, initial_accumulator_value=0.5), torch.optim.Adagrad, {"lr": 0.1, "initial_accumulator_value": 0.5}),
        (Adam(lr=0.01, beta1=0.8, beta2=0.99, eps=1e-7), torch.optim.Adam, {"lr": 0.01, "betas": (0.8, 0.99), "eps": 1e-7}),
    ],
)
def test_matches_torch_optim(ours, ref_cls, ref_kwargs):
    _, got = _run_sparse(ours, FULL_BATCHES, _loss)
    want = _dense_reference(ref_cls, ref_kwargs, FULL_BATCHES, _init())
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_rowwise_adagrad_matches_dense_formula():
    lr, eps = 0.1, 1e-8
    _, got = _run_sparse(RowWiseAdagrad(lr=lr, eps=eps), FULL_BATCHES, _loss)
    w = _init().clone()
    g2 = torch.zeros(N_ROWS, 1)
    for ids in FULL_BATCHES:
        wp = w.clone().requires_grad_()
        _loss(wp[ids], ids).backward()
        g = wp.grad
        g2 += (g * g).mean(dim=1, keepdim=True)
        w = w - lr * g / (g2.sqrt() + eps)
    torch.testing.assert_close(got, w, rtol=1e-5, atol=1e-6)


def _ftrl_reference(alpha, beta, l1, l2, init, batches):
    """McMahan et al. 2013, Algorithm 1, per coordinate, in numpy."""
    w = init.numpy().astype(np.float64).copy()
    z = -w * (beta / alpha + l2)
    n = np.zeros_like(w)
    for ids in batches:
        wt = torch.tensor(w, dtype=torch.float32, requires_grad=True)
        _loss(wt[ids], ids).backward()
        g = wt.grad.numpy().astype(np.float64)
        touched = np.unique(ids.numpy())
        for i in touched:
            sigma = (np.sqrt(n[i] + g[i] ** 2) - np.sqrt(n[i])) / alpha
            z[i] += g[i] - sigma * w[i]
            n[i] += g[i] ** 2
            w[i] = np.where(
                np.abs(z[i]) <= l1, 0.0, -(z[i] - np.sign(z[i]) * l1) / ((beta + np.sqrt(n[i])) / alpha + l2)
            )
    return torch.tensor(w, dtype=torch.float32)


@pytest.mark.parametrize("l1, l2", [(0.0, 0.0), (0.5, 0.1), (3.0, 1.0)])
def test_ftrl_matches_reference(l1, l2):
    alpha, beta = 0.1, 1.0
    _, got = _run_sparse(FTRL(alpha=alpha, beta=beta, l1=l1, l2=l2), FULL_BATCHES, _loss)
    want = _ftrl_reference(alpha, beta, l1, l2, _init(), FULL_BATCHES)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    if l1 >= 3.0:
        assert (got == 0).any(), "a strong L1 must zero some coordinates"


def test_adam_is_lazy_per_row():
    """Rows not in a batch keep weights, moments and step count; bias correction is per row."""
    ec, sparse_opt = _collection(Adam(lr=0.01))
    table = ec.tables["t"]
    ids_a, ids_b = torch.tensor([0, 1]), torch.tensor([1])
    for ids in [ids_a, ids_b, ids_b]:
        _embed(ec, ids).sum().backward()  # gradient 1 for every coordinate
        sparse_opt.step()
    rec = rows(table, torch.tensor([0, 1]))
    steps = rec[:, D + 2 * D]
    assert steps.tolist() == [1.0, 3.0]
    # row 0 saw exactly one Adam step with g=1: w0 - lr * 1 / (1 + eps') ~ w0 - lr
    w0 = table.new_records(torch.tensor([0]))[0, :D]
    torch.testing.assert_close(rec[0, :D], w0 - 0.01, rtol=0, atol=1e-6)


def test_duplicate_ids_are_summed_then_applied_once():
    """Adagrad with one ID twice in a batch equals one step with the summed gradient."""
    ec, sparse_opt = _collection(Adagrad(lr=1.0), dim=2)
    ids, uniq = torch.tensor([7, 7]), torch.tensor([7])
    lk = ec.plan(SparseFeatures(["f"], ids, torch.ones_like(ids))).fetch()
    before = rows(ec.tables["t"], uniq)[:, :2]
    emb = ec(lk.groups[0].sparse, lk)["f"]
    (emb * torch.tensor([[1.0, 2.0], [3.0, 4.0]])).sum().backward()
    torch.testing.assert_close(lk.groups[0].grad, torch.tensor([[4.0, 6.0]]))
    sparse_opt.step()
    after = rows(ec.tables["t"], uniq)
    # one Adagrad step from G=0 moves each coordinate by exactly lr * sign(g)
    torch.testing.assert_close(after[:, :2], before - 1.0, rtol=0, atol=1e-6)
    torch.testing.assert_close(after[:, 2:], torch.tensor([[16.0, 36.0]]))


def test_unknown_optimizer_is_a_clear_error():
    from ember.errors import ConfigError

    with pytest.raises(ConfigError, match="optimizer"):
        TableConfig.parse({"name": "t", "dim": 4, "optimizer": {"type": "adamw"}}, where="tables[0]")
    with pytest.raises(ConfigError, match="momentum"):
        TableConfig.parse({"name": "t", "dim": 4, "optimizer": {"type": "sgd", "momentum": 0.9}})


def test_a_forgotten_step_or_backward_is_a_clear_error():
    ec, sparse_opt = _collection(SGD(lr=0.1))
    ids = torch.tensor([1, 2])
    with pytest.raises(RuntimeError, match="no training forward"):
        sparse_opt.step()
    _embed(ec, ids).sum()
    with pytest.raises(RuntimeError, match=r"loss.backward\(\) before step"):
        sparse_opt.step()  # forward without backward
    _embed(ec, ids).sum().backward()
    with pytest.raises(RuntimeError, match="never applied"):
        _embed(ec, ids)  # gradients computed but never stepped: embeddings would stay frozen
    sparse_opt.zero_grad()  # dropping them explicitly is fine
    out = _embed(ec, ids)
    sparse_opt.zero_grad()  # as a loop may do between forward and backward: drops nothing pending
    out.sum().backward()
    sparse_opt.step()
    with torch.no_grad():
        _embed(ec, ids)  # evaluation forwards need no step
    assert ec.tables["t"].step == 1


def test_the_shared_test_configs_cover_every_sparse_optimizer():
    """ember.testing.SPARSE_OPTIMIZERS is what 'every sparse optimizer' means in the tests."""
    import typing

    from ember.optim import SparseOptimizerConfig
    from ember.testing import SPARSE_OPTIMIZERS

    union = typing.get_args(typing.get_args(SparseOptimizerConfig)[0])
    assert {c.model_fields["type"].default for c in union} == {o["type"] for o in SPARSE_OPTIMIZERS}
