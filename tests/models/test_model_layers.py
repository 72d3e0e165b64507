"""Layers against slow references: dot / FM / cross interactions, MLP options, MMoE mixing."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from ember.errors import ConfigError
from ember.models.layers import (
    MLP,
    CrossLayer,
    CrossNetwork,
    DotInteraction,
    FMInteraction,
    MLPConfig,
    MMoELayer,
)


@pytest.mark.parametrize("self_interaction", [False, True])
def test_dot_interaction_matches_pair_loop(self_interaction: bool) -> None:
    torch.manual_seed(0)
    x = torch.randn(5, 6, 4)
    out = DotInteraction(6, self_interaction=self_interaction)(x)
    expected = []
    for i in range(6):
        for j in range(i if self_interaction else i + 1, 6):
            expected.append((x[:, i] * x[:, j]).sum(-1))
    assert out.shape == (5, 21 if self_interaction else 15)
    torch.testing.assert_close(out, torch.stack(expected, dim=1))


@pytest.mark.parametrize("self_interaction", [False, True])
def test_dot_interaction_gradient_is_the_pair_loops(self_interaction: bool) -> None:
    """The interaction's own backward (one gather + one bmm over the symmetric gram's gradient)
    against autograd through the pair loop, in float64; and it is the one that runs."""
    torch.manual_seed(0)
    layer = DotInteraction(6, self_interaction=self_interaction)
    x = torch.randn(5, 6, 4, dtype=torch.float64, requires_grad=True)
    ref = x.detach().clone().requires_grad_()
    out = layer(x)
    assert type(out.grad_fn).__name__ == "_DotPairsBackward"
    pairs = [(ref[:, i] * ref[:, j]).sum(-1) for i in range(6) for j in range(i if self_interaction else i + 1, 6)]
    g = torch.randn(5, layer.num_pairs, dtype=torch.float64)
    out.backward(g)
    torch.stack(pairs, dim=1).backward(g)
    torch.testing.assert_close(x.grad, ref.grad, rtol=1e-12, atol=1e-12)
    assert torch.autograd.gradcheck(layer, (x.detach().clone().requires_grad_(),))
    assert torch.autograd.gradgradcheck(layer, (x.detach().clone().requires_grad_(),))  # create_graph works too


@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated")
def test_dot_interaction_under_autocast_and_script() -> None:
    """Under bf16 autocast the pairs are bf16 (as autocast's bmm gives) and x's gradient comes
    back in x's float32; the scripted layer (export) and no-grad calls take the plain path."""
    torch.manual_seed(0)
    layer = DotInteraction(5)
    x = torch.randn(8, 5, 16, requires_grad=True)
    ref = x.detach().clone().requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = layer(x)
        want = layer.autograd_pairs(ref)  # autocast's own bmm, autograd's backward
    assert out.dtype == want.dtype == torch.bfloat16
    torch.testing.assert_close(out, want)
    g = torch.randn(8, layer.num_pairs).to(torch.bfloat16)
    out.backward(g)
    want.backward(g)
    assert x.grad.dtype == torch.float32
    torch.testing.assert_close(x.grad, ref.grad, rtol=2e-2, atol=2e-2)
    scripted = torch.jit.script(layer)
    with torch.no_grad():
        torch.testing.assert_close(scripted(x), layer(x))


def test_fm_matches_pairwise_sum() -> None:
    torch.manual_seed(0)
    x = torch.randn(7, 5, 3)
    naive = torch.zeros(7)
    for i in range(5):
        for j in range(i + 1, 5):
            naive += (x[:, i] * x[:, j]).sum(-1)
    out = FMInteraction()(x)
    assert out.shape == (7, 1)
    torch.testing.assert_close(out[:, 0], naive, rtol=1e-5, atol=1e-5)


def test_cross_layer_full_rank_formula() -> None:
    torch.manual_seed(0)
    layer = CrossLayer(6)
    with torch.no_grad():
        layer.proj.bias.normal_()  # zero-initialised; make b matter in the check
    x0, x = torch.randn(4, 6), torch.randn(4, 6)
    w, b = layer.proj.weight, layer.proj.bias
    torch.testing.assert_close(layer(x0, x), x0 * (x @ w.T + b) + x)


def test_cross_layer_low_rank_formula() -> None:
    torch.manual_seed(0)
    layer = CrossLayer(6, rank=2)
    v, u = layer.proj[0].weight, layer.proj[1].weight  # [r, D], [D, r]
    with torch.no_grad():
        layer.proj[1].bias.normal_()
    b = layer.proj[1].bias
    x0, x = torch.randn(4, 6), torch.randn(4, 6)
    assert v.shape == (2, 6) and u.shape == (6, 2)
    torch.testing.assert_close(layer(x0, x), x0 * (x @ v.T @ u.T + b) + x)


def test_cross_layer_rejects_bad_rank() -> None:
    with pytest.raises(ValueError, match="rank must be > 0"):
        CrossLayer(6, rank=0)


def test_cross_network_crosses_with_x0_every_layer() -> None:
    torch.manual_seed(0)
    net = CrossNetwork(5, num_layers=3)
    x0 = torch.randn(3, 5)
    x = x0
    for layer in net.layers:
        x = x0 * layer.proj(x) + x
    torch.testing.assert_close(net(x0), x)


def test_mlp_layers_and_final_activation() -> None:
    mlp = MLP(3, MLPConfig(sizes=[8, 4], dropout=0.1, batchnorm=True), final_activation="identity")
    kinds = [type(m) for m in mlp.layers]
    assert kinds == [
        nn.Linear, nn.BatchNorm1d, nn.ReLU, nn.Dropout,
        nn.Linear, nn.BatchNorm1d, nn.Identity, nn.Dropout,
    ]
    assert mlp.out_dim == 4
    plain = MLP(3, [8, 4])
    assert [type(m) for m in plain.layers] == [nn.Linear, nn.ReLU, nn.Linear, nn.ReLU]
    assert (plain(torch.randn(10, 3)) >= 0).all()


def test_mlp_config_errors_name_the_problem() -> None:
    with pytest.raises(ConfigError, match="sizes"):
        MLPConfig.parse({"sizes": []})
    with pytest.raises(ConfigError, match="must be > 0"):
        MLPConfig.parse([16, 0])
    with pytest.raises(ConfigError, match="activation"):
        MLPConfig.parse({"sizes": [4], "activation": "relu6"})
    with pytest.raises(ConfigError, match="did you mean 'dropout'"):
        MLPConfig.parse({"sizes": [4], "dropuot": 0.1})
    with pytest.raises(ValueError, match="unknown activation"):
        MLP(3, [4], final_activation="swish")


def test_mmoe_layer_matches_manual_mixture() -> None:
    torch.manual_seed(0)
    layer = MMoELayer(5, num_tasks=2, num_experts=3, expert=[4], tower=[2])
    x = torch.randn(6, 5)
    experts = torch.stack([e(x) for e in layer.experts], dim=1)
    for t in range(2):
        w = torch.softmax(layer.gates[t](x), dim=-1)
        mixed = (w.unsqueeze(-1) * experts).sum(1)
        torch.testing.assert_close(layer(x)[:, t], layer.towers[t](mixed)[:, 0])
