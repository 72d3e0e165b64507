"""Model zoo: plain ``nn.Module`` s mapping pooled embeddings to logits.

Every model has ``forward(dense [B, Dd], sparse: F_s × [B, D_i], linear=None) -> [B, T]``;
``linear`` (F_s × [B, 1] first-order terms) is only read by models with ``wants_linear``.
Models own no optimizer, device, loss or embedding table.
"""

from ember.models.base import ModelInputs
from ember.models.dcn import DCN, DCNConfig
from ember.models.deepfm import DeepFM, DeepFMConfig
from ember.models.dlrm import DLRM, DLRMConfig
from ember.models.layers.mlp import MLPConfig
from ember.models.mmoe import MMoE, MMoEConfig, SharedBottom, SharedBottomConfig
from ember.models.registry import MODEL_TYPES, ModelConfig, build_model, model_config_from_dict
from ember.models.wdl import WDL, WDLConfig

__all__ = [
    "DCN",
    "DLRM",
    "MODEL_TYPES",
    "WDL",
    "DCNConfig",
    "DLRMConfig",
    "DeepFM",
    "DeepFMConfig",
    "MLPConfig",
    "MMoE",
    "MMoEConfig",
    "ModelConfig",
    "ModelInputs",
    "SharedBottom",
    "SharedBottomConfig",
    "WDLConfig",
    "build_model",
    "model_config_from_dict",
]
