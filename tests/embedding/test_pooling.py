"""Weighted pooling: the rule for weights that sum to zero, are negative or tiny, checked with
its gradients against a per-bag reference in plain torch."""

from __future__ import annotations

import pytest
import torch

from ember.embedding.pooling import WEIGHT_EPS, pool_feature

D = 3


def _reference(w: torch.Tensor, idx: torch.Tensor, offsets: torch.Tensor, weights: torch.Tensor, pooling: str):
    """One bag at a time: sum w*e, divided by max(sum |w|, eps) or max(sqrt(sum w^2), eps)."""
    out = []
    for b in range(offsets.numel() - 1):
        s, e = int(offsets[b]), int(offsets[b + 1])
        rows, wb = w[idx[s:e]], weights[s:e]
        acc = (wb.unsqueeze(1) * rows).sum(0) if e > s else w.new_zeros(D)
        if pooling == "mean":
            acc = acc / torch.clamp(wb.abs().sum(), min=WEIGHT_EPS)
        elif pooling == "sqrtn":
            acc = acc / torch.clamp((wb * wb).sum(), min=WEIGHT_EPS**2).sqrt()
        out.append(acc)
    return torch.stack(out)


# bags: ordinary, weights summing to zero, negative sum, all zero, tiny, empty, one huge + one tiny
_WEIGHTS = [[0.5, 2.0, 1.0], [1.0, -1.0], [-2.0, -0.5], [0.0, 0.0, 0.0], [1e-9, 3e-9], [], [1e6, 1e-6]]


def _inputs(dtype=torch.float64):
    g = torch.Generator().manual_seed(0)
    lengths = torch.tensor([len(b) for b in _WEIGHTS])
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)])
    idx = torch.randint(0, 6, (int(lengths.sum()),), generator=g)
    w = torch.randn(6, D, generator=g, dtype=dtype).requires_grad_()
    weights = torch.tensor([x for b in _WEIGHTS for x in b], dtype=dtype).requires_grad_()
    return w, idx, offsets, weights


@pytest.mark.parametrize("pooling", ["sum", "mean", "sqrtn"])
def test_weighted_pooling_and_gradients_match_reference(pooling):
    w, idx, offsets, weights = _inputs()
    got = pool_feature(w, idx, offsets, weights, pooling)
    w2, weights2 = w.detach().clone().requires_grad_(), weights.detach().clone().requires_grad_()
    want = _reference(w2, idx, offsets, weights2, pooling)
    torch.testing.assert_close(got, want)
    upstream = torch.randn(got.shape, generator=torch.Generator().manual_seed(1), dtype=got.dtype)
    (got * upstream).sum().backward()
    (want * upstream).sum().backward()
    assert torch.isfinite(w.grad).all() and torch.isfinite(weights.grad).all()
    torch.testing.assert_close(w.grad, w2.grad)
    torch.testing.assert_close(weights.grad, weights2.grad)


def test_weighted_mean_rule_on_edge_bags():
    w, idx, offsets, weights = _inputs(torch.float32)
    out = pool_feature(w, idx, offsets, weights, "mean").detach()
    rows = w.detach()[idx]
    bag = [rows[int(offsets[b]) : int(offsets[b + 1])] for b in range(len(_WEIGHTS))]
    # weights summing to zero: (e1 - e2) / 2, not zero
    torch.testing.assert_close(out[1], (bag[1][0] - bag[1][1]) / 2)
    # all weights negative: the mean with its sign flipped, not zero
    torch.testing.assert_close(out[2], -(2.0 * bag[2][0] + 0.5 * bag[2][1]) / 2.5)
    assert torch.equal(out[3], torch.zeros(D)) and torch.equal(out[5], torch.zeros(D))  # all-zero / empty bag
    # tiny weights do not blow up: the norm is floored, so the bag shrinks toward zero
    torch.testing.assert_close(out[4], (1e-9 * bag[4][0] + 3e-9 * bag[4][1]) / WEIGHT_EPS)
    # never larger than the bag's largest row, whatever the weights
    for b, rows_b in enumerate(bag):
        if len(rows_b):
            assert (out[b].abs() <= rows_b.abs().max(0).values + 1e-6).all(), b


def test_unweighted_sqrtn_of_an_empty_bag_is_zero():
    w = torch.randn(4, D)
    out = pool_feature(w, torch.tensor([0, 1, 3, 2]), torch.tensor([0, 3, 3, 4]), None, "sqrtn")
    torch.testing.assert_close(out[0], (w[0] + w[1] + w[3]) / 3**0.5)
    assert torch.equal(out[1], torch.zeros(D))
    torch.testing.assert_close(out[2], w[2])
