"""Registry and config errors: each names the key, the problem and what is allowed."""

from __future__ import annotations

import pytest
import torch
from pydantic import ValidationError
from torch import nn

from ember.config_base import ConfigModel
from ember.errors import ConfigError
from ember.models import (
    DCN,
    MODEL_TYPES,
    WDL,
    DCNConfig,
    DLRMConfig,
    MMoE,
    ModelConfig,
    ModelInputs,
    SharedBottom,
    build_model,
    model_config_from_dict,
)

CRITEO = ModelInputs(num_dense=13, sparse_dims=[16] * 26, num_tasks=1)


def test_unknown_type_lists_known_types() -> None:
    with pytest.raises(ConfigError, match="unknown model type 'dlrn'") as err:
        model_config_from_dict({"type": "dlrn"})
    for kind in MODEL_TYPES:
        assert kind in str(err.value)


def test_missing_type_and_non_mapping() -> None:
    with pytest.raises(ConfigError, match="missing key 'type'; known types: dlrm"):
        model_config_from_dict({"top_mlp": [8]})
    with pytest.raises(ConfigError, match="expected a mapping"):
        model_config_from_dict(["dlrm"])  # type: ignore[arg-type]  # wrong on purpose


def test_unknown_key_is_named_with_suggestion() -> None:
    with pytest.raises(ConfigError, match=r"unknown key 'model.top_mpl' \(did you mean 'top_mlp'"):
        model_config_from_dict({"type": "dlrm", "top_mpl": [8]})


def test_bad_values_name_the_nested_key() -> None:
    with pytest.raises(ConfigError, match="model.deep_mlp.dropout"):
        model_config_from_dict({"type": "dcn", "deep_mlp": {"sizes": [8], "dropout": 1.5}})
    with pytest.raises(ConfigError, match="model.num_experts"):
        model_config_from_dict({"type": "mmoe", "num_experts": 0})
    with pytest.raises(ConfigError, match="model.structure"):
        model_config_from_dict({"type": "dcn", "structure": "diagonal"})


def test_configs_are_frozen_and_parse_lists_as_mlp_sizes() -> None:
    config = model_config_from_dict({"type": "dlrm", "bottom_mlp": [64, 16]})
    assert isinstance(config, DLRMConfig) and config.bottom_mlp.sizes == [64, 16]
    with pytest.raises(ValidationError, match="frozen"):
        config.top_mlp = config.bottom_mlp  # type: ignore[misc]  # frozen on purpose


def test_model_config_union_nests_in_a_parent_config() -> None:
    class Run(ConfigModel):
        model: ModelConfig

    run = Run.parse({"model": {"type": "dcn", "low_rank": 8}})
    assert isinstance(run.model, DCNConfig) and run.model.low_rank == 8
    with pytest.raises(ConfigError, match="unknown model type 'nope'; known types: dlrm"):
        Run.parse({"model": {"type": "nope"}})
    with pytest.raises(ConfigError, match="'model.deep_mpl' \\(did you mean 'deep_mlp'"):
        Run.parse({"model": {"type": "deepfm", "deep_mpl": [8]}})
    # the parsed model config round-trips through its dump, as it does in a run's config.yaml
    assert Run.parse(run.model_dump(mode="json")) == run


def test_dlrm_bottom_must_end_in_embedding_dim() -> None:
    expected = r"bottom_mlp must end in the embedding dim 16.*\[64, 32\]"
    with pytest.raises(ConfigError, match=expected):
        build_model({"type": "dlrm", "bottom_mlp": [64, 32]}, CRITEO)


@pytest.mark.parametrize("kind", ["dlrm", "deepfm"])
def test_pairwise_models_need_equal_sparse_dims(kind: str) -> None:
    inputs = ModelInputs(13, [16, 16, 8, 16], 1)
    name = "DLRM" if kind == "dlrm" else "DeepFM"
    with pytest.raises(ConfigError, match=f"{name}: every sparse embedding dim must be 16.*feature 2: 8"):
        build_model({"type": kind}, inputs)


MIXED = ModelInputs(13, [16, 4, 32], 2)  # concat width 13 + 52 = 65, two tasks


def _linears(module: nn.Module) -> list[nn.Linear]:
    return [m for m in module.modules() if isinstance(m, nn.Linear)]


def _check_wdl(model: nn.Module) -> None:
    assert [(m.in_features, m.out_features) for m in _linears(model.deep)] == [(65, 24), (24, 2)]
    assert any(isinstance(m, nn.Dropout) and m.p == 0.25 for m in model.deep.modules())


def _check_dcn(model: nn.Module) -> None:
    assert len(model.cross.layers) == 2 and model.parallel
    v, u = model.cross.layers[0].proj  # rank-3 factorisation of the 65x65 cross matrix
    assert v.weight.shape == (3, 65) and u.weight.shape == (65, 3)
    assert model.deep.out_dim == 24 and model.head.in_features == 24 + 65 and model.head.out_features == 2


def _check_mmoe(model: nn.Module) -> None:
    assert len(model.moe.experts) == 5 and model.moe.experts[0].out_dim == 24
    assert len(model.moe.gates) == 2 and all(g.out_features == 5 for g in model.moe.gates)
    assert len(model.moe.towers) == 2
    assert all(isinstance(m, nn.GELU) for m in model.moe.experts[0].layers if not isinstance(m, nn.Linear))


def _check_shared_bottom(model: nn.Module) -> None:
    assert [(m.in_features, m.out_features) for m in _linears(model.bottom)] == [(65, 24)]
    assert len(model.towers) == 2
    assert [(m.in_features, m.out_features) for m in _linears(model.towers[0])] == [(24, 6), (6, 1)]


CONCAT_MODELS = {
    "wdl": ({"type": "wdl", "deep_mlp": {"sizes": [24], "dropout": 0.25}}, WDL, _check_wdl),
    "dcn": ({"type": "dcn", "num_cross_layers": 2, "low_rank": 3, "structure": "parallel", "deep_mlp": [24]},
            DCN, _check_dcn),
    "mmoe": ({"type": "mmoe", "num_experts": 5, "expert_mlp": {"sizes": [24], "activation": "gelu"},
              "tower_mlp": [6]}, MMoE, _check_mmoe),
    "shared_bottom": ({"type": "shared_bottom", "bottom_mlp": [24], "tower_mlp": [6]}, SharedBottom,
                      _check_shared_bottom),
}


@pytest.mark.parametrize("kind", list(CONCAT_MODELS))
def test_concat_models_accept_mixed_sparse_dims(kind: str) -> None:
    raw, cls, check = CONCAT_MODELS[kind]
    torch.manual_seed(0)
    model = build_model(raw, MIXED)
    assert type(model) is cls and model.config == model_config_from_dict(raw)
    check(model)  # the config's sizes and options reached the modules
    g = torch.Generator().manual_seed(0)
    dense = torch.randn(3, 13, generator=g)
    sparse = [torch.randn(3, d, generator=g) for d in MIXED.sparse_dims]
    linear = [torch.randn(3, 1, generator=g) for _ in MIXED.sparse_dims] if model.wants_linear else None
    out = model.eval()(dense, sparse, linear)
    assert out.shape == (3, 2) and torch.isfinite(out).all()
    # every sparse input, whatever its width, feeds the output
    for i in range(MIXED.num_sparse):
        moved = [s + (j == i) for j, s in enumerate(sparse)]
        assert not torch.allclose(model(dense, moved, linear), out), f"sparse feature {i} is ignored"


def test_build_model_rejects_other_objects() -> None:
    with pytest.raises(ConfigError, match="expected one of DLRMConfig"):
        build_model(object(), CRITEO)


def test_model_inputs_validate() -> None:
    with pytest.raises(ConfigError, match="num_tasks must be >= 1"):
        ModelInputs(13, [16], 0)
    with pytest.raises(ConfigError, match="every sparse dim must be > 0"):
        ModelInputs(13, [16, 0], 1)
    with pytest.raises(ConfigError, match="no features"):
        ModelInputs(0, [], 1)
    assert ModelInputs(13, [16] * 26).concat_dim == 13 + 16 * 26


def test_deepfm_needs_a_sparse_feature() -> None:
    with pytest.raises(ConfigError, match="DeepFM: needs at least one sparse feature"):
        build_model({"type": "deepfm"}, ModelInputs(13, [], 1))
