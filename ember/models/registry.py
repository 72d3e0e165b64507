"""Model registry: config union, ``model_config_from_dict`` and ``build_model``.

Adding a model = its module (a ``XConfig`` with ``type: Literal["x"]`` and an ``nn.Module``
taking ``(config, inputs)``) plus one entry in ``_MODELS`` and one in ``ModelConfig``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Annotated, Any

from pydantic import BeforeValidator, Field
from torch import nn

from ember.config_base import ConfigModel
from ember.errors import ConfigError
from ember.models.base import ModelInputs
from ember.models.dcn import DCN, DCNConfig
from ember.models.deepfm import DeepFM, DeepFMConfig
from ember.models.distill import Distilled
from ember.models.dmt import DMT, DMTConfig
from ember.models.dlrm import DLRM, DLRMConfig
from ember.models.lr import LR, LRConfig
from ember.models.mmoe import MMoE, MMoEConfig, SharedBottom, SharedBottomConfig
from ember.models.wdl import WDL, WDLConfig

__all__ = ["MODEL_TYPES", "ModelConfig", "ModelInputs", "build_model", "model_config_from_dict"]



def _parse_mapping(data: Any) -> Any:
    # Inside a parent config, route mappings through model_config_from_dict so errors keep
    # the known-types list and the "did you mean" that pydantic's union error paths lose.
    if not isinstance(data, Mapping):
        return data
    return model_config_from_dict(data)  # its ConfigError: format_validation_error gives its message as it is


ModelConfig = Annotated[
    DLRMConfig | DeepFMConfig | WDLConfig | DCNConfig | MMoEConfig | SharedBottomConfig | LRConfig | DMTConfig,
    Field(discriminator="type"),
    BeforeValidator(_parse_mapping),
]
"""Any model config; the class is picked by its ``type`` key."""

_MODELS: dict[str, tuple[type[ConfigModel], Callable[[Any, ModelInputs], nn.Module]]] = {
    "dlrm": (DLRMConfig, DLRM),
    "deepfm": (DeepFMConfig, DeepFM),
    "wdl": (WDLConfig, WDL),
    "dcn": (DCNConfig, DCN),
    "mmoe": (MMoEConfig, MMoE),
    "shared_bottom": (SharedBottomConfig, SharedBottom),
    "lr": (LRConfig, LR),
    "dmt": (DMTConfig, DMT),
}
MODEL_TYPES: tuple[str, ...] = tuple(_MODELS)


def model_config_from_dict(data: Mapping[str, Any], where: str = "model") -> Any:
    """Parse a ``{"type": ..., ...}`` mapping (e.g. from YAML) into its model config.

    Raises:
        ConfigError: missing or unknown ``type`` (lists the known types), unknown keys
            (with a "did you mean"), wrong values.

    Example:
        >>> model_config_from_dict({"type": "dlrm", "top_mlp": [64, 32]}).top_mlp.sizes
        [64, 32]
        >>> model_config_from_dict({"type": "dlrn"})  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        ember.errors.ConfigError: 'model.type': unknown model type 'dlrn'; known types: dlrm, ...
    """
    known = ", ".join(MODEL_TYPES)
    if not isinstance(data, Mapping):
        raise ConfigError(f"'{where}': expected a mapping with a 'type' key, got {data!r}")
    if "type" not in data:
        raise ConfigError(f"'{where}': missing key 'type'; known types: {known}")
    kind = data["type"]
    if kind not in _MODELS:
        raise ConfigError(f"'{where}.type': unknown model type {kind!r}; known types: {known}")
    return _MODELS[kind][0].parse(dict(data), where=where)


def build_model(config: Any, inputs: ModelInputs) -> nn.Module:
    """Build the model for ``config`` (a model config or a mapping) and the input layout.

    Raises:
        ConfigError: an invalid config, or one that does not fit ``inputs`` (e.g. DLRM's
            bottom MLP not ending in the embedding dim).

    Example:
        >>> import torch
        >>> inputs = ModelInputs(num_dense=13, sparse_dims=[16] * 26, num_tasks=1)
        >>> model = build_model({"type": "dcn", "deep_mlp": [32]}, inputs)
        >>> model(torch.randn(2, 13), [torch.randn(2, 16)] * 26).shape
        torch.Size([2, 1])
    """
    if isinstance(config, Mapping):
        config = model_config_from_dict(config)
    kind = getattr(config, "type", None)
    if kind not in _MODELS or not isinstance(config, _MODELS[kind][0]):
        raise ConfigError(
            f"build_model: expected one of {', '.join(c.__name__ for c, _ in _MODELS.values())}"
            f" or a mapping, got {type(config).__name__}"
        )
    if config.distill is None:
        return _MODELS[kind][1](config, inputs)
    d = config.distill  # the body grows a second head per task for the teacher (see ember.models.distill)
    heads = inputs.num_tasks * (2 if d.aux_head else 1)
    body = _MODELS[kind][1](config, ModelInputs(inputs.num_dense, inputs.sparse_dims, heads, inputs.feature_names))
    return Distilled(body, d, inputs.num_tasks, inputs.num_dense)
