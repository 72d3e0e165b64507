"""Registry and config errors: each names the key, the problem and what is allowed."""

from __future__ import annotations

import pytest
from pydantic import BaseModel, ValidationError

from ember.config_base import ConfigModel
from ember.errors import ConfigError
from ember.models import (
    MODEL_TYPES,
    DCNConfig,
    DLRMConfig,
    ModelConfig,
    ModelInputs,
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
    assert isinstance(run, BaseModel)


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


@pytest.mark.parametrize("kind", ["wdl", "dcn", "mmoe", "shared_bottom"])
def test_concat_models_accept_mixed_sparse_dims(kind: str) -> None:
    model = build_model({"type": kind}, ModelInputs(13, [16, 4, 32], 1))
    assert model is not None


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
