"""Feature interactions: DLRM dot products, FM second order, DCNv2 cross layers."""

from __future__ import annotations

import torch
from torch import Tensor, nn

__all__ = ["CrossLayer", "CrossNetwork", "DotInteraction", "FMInteraction"]


class DotInteraction(nn.Module):
    """Pairwise dot products between F feature vectors (DLRM), upper triangle only.

    Args:
        num_features: F, the number of vectors per sample.
        self_interaction: also keep each vector's dot with itself (off in DLRM).

    Shapes:
        [B, F, D] -> [B, P] with P = F(F-1)/2 (or F(F+1)/2 with self-interaction),
        pairs (i, j), i < j, in row-major order.

    Example:
        >>> x = torch.randn(2, 4, 8)
        >>> DotInteraction(4)(x).shape
        torch.Size([2, 6])
    """

    def __init__(self, num_features: int, self_interaction: bool = False) -> None:
        super().__init__()
        offset = 0 if self_interaction else 1
        rows, cols = torch.triu_indices(num_features, num_features, offset=offset)
        self.register_buffer("rows", rows, persistent=False)
        self.register_buffer("cols", cols, persistent=False)
        # pair (i, j) at i*F + j of the flattened gram matrix
        self.register_buffer("flat", rows * num_features + cols, persistent=False)
        self.num_pairs: int = int(rows.numel())
        # backward: entry (i, j) and (j, i) of the gram matrix's gradient both read pair (i, j)'s
        # (the gram is symmetric); a diagonal one without self-interaction reads pair 0's, then is zeroed
        mirror = torch.zeros(num_features * num_features, dtype=torch.int64)
        pairs = torch.arange(self.num_pairs)
        mirror[self.flat] = pairs
        mirror[cols * num_features + rows] = pairs
        self.register_buffer("mirror", mirror, persistent=False)
        self.self_interaction = self_interaction

    def forward(self, x: Tensor) -> Tensor:
        if not torch.jit.is_scripting() and not torch.jit.is_tracing() and x.requires_grad and torch.is_grad_enabled():
            return _dot_pairs(x, self.flat, self.mirror, self.self_interaction)
        return self.autograd_pairs(x)

    def autograd_pairs(self, x: Tensor) -> Tensor:
        """The pairs from torch ops alone, whose backward autograd derives: the path of scripted
        export, tracing and no-grad calls, and the reference of the layer's own backward."""
        return _gram_pairs(x, self.flat)


def _gram_pairs(x: Tensor, flat: Tensor) -> Tensor:
    """The pairs at ``flat`` of the gram matrix ``x @ x^T`` [B, F, F], flattened."""
    gram = torch.bmm(x, x.transpose(1, 2)).flatten(1)
    # gather, not gram[:, rows, cols]: the advanced-index backward (index_put with
    # accumulate) costs ~3x the whole interaction on CPU
    return torch.gather(gram, 1, flat.expand(gram.shape[0], -1))


@torch.jit.unused
def _dot_pairs(x: Tensor, flat: Tensor, mirror: Tensor, self_interaction: bool) -> Tensor:
    """``DotInteraction``'s forward when a gradient is wanted: the same pairs, under autocast
    in its dtype (as autocast runs ``bmm``), with ``_DotPairs``' backward."""
    device = x.device.type
    if torch.is_autocast_enabled(device) and x.is_floating_point():
        x = x.to(torch.get_autocast_dtype(device))  # the cast autocast makes for bmm, kept in the graph
    with torch.autocast(device, enabled=False):
        return _DotPairs.apply(x, flat, mirror, self_interaction)


class _DotPairs(torch.autograd.Function):
    """Pairwise dots [B, F, D] -> [B, P] whose backward is one gather and one ``bmm``.

    The gram matrix is symmetric, so the gradient of x is ``S @ x`` with S [B, F, F] holding
    pair (i, j)'s gradient at (i, j) and (j, i) (twice on the diagonal with self-interaction, zero
    without): one gather of the pairs' gradient builds S. Autograd's backward of ``bmm(x, x^T)`` then
    ``gather`` zero-fills the [B, F, F] gradient, scatters into it and runs two ``bmm`` and an
    add: ~2x this one's time inside a DLRM step on CPU (12-14 vs 5.5 ms at D 16, batch 4,096),
    the whole step 1.02-1.04x faster at D 16 and 1.07-1.09x at D 128 (``bench/bench_interaction.py``).
    The sums differ from autograd's only by rounding."""

    @staticmethod
    def forward(ctx, x: Tensor, flat: Tensor, mirror: Tensor, self_interaction: bool) -> Tensor:  # type: ignore[override]
        ctx.save_for_backward(x, mirror)
        ctx.self_interaction = self_interaction
        return _gram_pairs(x, flat)

    @staticmethod
    def backward(ctx, grad: Tensor):  # type: ignore[override]  # torch ops: differentiable again (create_graph)
        x, mirror = ctx.saved_tensors
        b, f, _ = x.shape
        if grad.shape[1] == 0:  # one vector: no pairs
            return torch.zeros_like(x), None, None, None
        # the pairs' gradient is often a column slice of the top MLP input's: read in place
        sym = torch.gather(grad, 1, mirror.expand(b, -1)).view(b, f, f)
        diagonal = sym.diagonal(dim1=1, dim2=2)
        if ctx.self_interaction:
            diagonal.mul_(2)  # d(x_i . x_i) / dx_i = 2 x_i
        else:
            diagonal.zero_()
        return torch.bmm(sym, x), None, None, None


class FMInteraction(nn.Module):
    """Factorization-machine second-order term: sum over pairs i < j of <v_i, v_j>.

    Uses the O(F·D) identity 0.5 * sum_d((sum_i v_id)^2 - sum_i v_id^2).

    Shapes:
        [B, F, D] -> [B, 1]

    Example:
        >>> x = torch.ones(1, 3, 2)
        >>> FMInteraction()(x)  # 3 pairs, each <1,1> = 2
        tensor([[6.]])
    """

    def forward(self, x: Tensor) -> Tensor:
        square_of_sum = x.sum(dim=1).pow(2)
        sum_of_square = x.pow(2).sum(dim=1)
        return 0.5 * (square_of_sum - sum_of_square).sum(dim=1, keepdim=True)


class CrossLayer(nn.Module):
    """One DCNv2 cross layer: ``x0 * (W x + b) + x``; with ``rank`` r, ``W = U V`` (low rank).

    Args:
        dim: D, the width of x0 and x.
        rank: None for a full D×D matrix, else the inner rank r < D of the factorisation.

    Shapes:
        x0, x: [B, D] -> [B, D]

    Example:
        >>> layer = CrossLayer(8, rank=2)
        >>> x0 = torch.randn(3, 8)
        >>> layer(x0, x0).shape
        torch.Size([3, 8])
    """

    def __init__(self, dim: int, rank: int | None = None) -> None:
        super().__init__()
        if rank is not None and rank <= 0:
            raise ValueError(f"CrossLayer: rank must be > 0 or None, got {rank}")
        out = nn.Linear(dim if rank is None else rank, dim)
        # Zero bias: the layer starts as x0 * (W x) + x and the residual carries the signal.
        nn.init.zeros_(out.bias)
        self.proj: nn.Module = (
            out if rank is None else nn.Sequential(nn.Linear(dim, rank, bias=False), out)
        )

    def forward(self, x0: Tensor, x: Tensor) -> Tensor:
        return x0 * self.proj(x) + x


class CrossNetwork(nn.Module):
    """``num_layers`` stacked :class:`CrossLayer` s, all crossing with the input x0.

    Shapes:
        [B, D] -> [B, D]

    Example:
        >>> net = CrossNetwork(8, num_layers=3)
        >>> net(torch.randn(2, 8)).shape
        torch.Size([2, 8])
    """

    def __init__(self, dim: int, num_layers: int, rank: int | None = None) -> None:
        super().__init__()
        self.layers = nn.ModuleList([CrossLayer(dim, rank) for _ in range(num_layers)])

    def forward(self, x0: Tensor) -> Tensor:
        x = x0
        for layer in self.layers:
            x = layer(x0, x)
        return x
