"""``dense_init`` of the first-order weights over the dense features (LR, DeepFM, WDL): zeros by
default, a normal or PyTorch's own init on request, and bad combinations named."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from ember.errors import ConfigError
from ember.models import ModelInputs, build_model, model_config_from_dict
from ember.models.base import NORMAL_STD, DenseInit, dense_linear

FIRST_ORDER = {"lr": {"type": "lr"}, "deepfm": {"type": "deepfm", "deep_mlp": [8]}, "wdl": {"type": "wdl", "deep_mlp": [8]}}


@pytest.mark.parametrize("name", list(FIRST_ORDER))
@pytest.mark.parametrize("num_dense", [13, 0])
def test_first_order_weights_start_at_zero_by_default(name: str, num_dense: int) -> None:
    torch.manual_seed(1)
    model = build_model(FIRST_ORDER[name], ModelInputs(num_dense, [4] * 3, 1))
    assert model.config.dense_init == DenseInit(type="zeros")
    assert torch.count_nonzero(model.dense_linear.weight) == 0
    assert torch.count_nonzero(model.dense_linear.bias) == 0


def test_lr_starts_at_the_sum_of_its_id_terms_whatever_the_dense_scale() -> None:
    model = build_model({"type": "lr"}, ModelInputs(13, [4] * 3, 1))
    dense = torch.full((6, 13), 7.0)  # log1p counts are this large on Criteo
    linear = [torch.randn(6, 1) for _ in range(3)]
    torch.testing.assert_close(model(dense, [torch.zeros(6, 4)] * 3, linear), sum(linear))


def test_normal_draws_weights_with_the_given_std_and_a_zero_bias() -> None:
    torch.manual_seed(0)
    layer = dense_linear(20_000, 1, DenseInit(type="normal", std=0.05))
    assert layer.weight.std().item() == pytest.approx(0.05, rel=0.03)
    assert abs(layer.weight.mean().item()) < 0.002
    assert layer.bias.item() == 0.0
    torch.manual_seed(0)
    assert dense_linear(20_000, 1, DenseInit.parse("normal")).weight.std().item() == pytest.approx(NORMAL_STD, rel=0.03)


def test_torch_is_pytorchs_own_linear_init() -> None:
    torch.manual_seed(5)
    ours = dense_linear(13, 2, DenseInit(type="torch"))
    torch.manual_seed(5)
    plain = nn.Linear(13, 2)
    torch.testing.assert_close(ours.weight, plain.weight)
    torch.testing.assert_close(ours.bias, plain.bias)


def test_a_string_is_short_for_the_type_and_std_needs_normal() -> None:
    cfg = model_config_from_dict({"type": "wdl", "dense_init": "torch"})
    assert cfg.dense_init == DenseInit(type="torch")
    for init in ("zeros", "normal", {"type": "normal", "std": 0.2}):  # a resolved config dumped and read back
        cfg = model_config_from_dict({"type": "lr", "dense_init": init})
        assert model_config_from_dict(cfg.model_dump(mode="json")) == cfg
    with pytest.raises(ConfigError, match=r"model\.dense_init.*std.*type 'normal'"):
        model_config_from_dict({"type": "lr", "dense_init": {"type": "zeros", "std": 0.1}})
    with pytest.raises(ConfigError, match=r"model\.dense_init\.type"):
        model_config_from_dict({"type": "deepfm", "dense_init": "xavier"})
