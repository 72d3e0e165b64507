"""Building blocks of the model zoo: MLP, interactions (dot / FM / cross), MMoE."""

from ember.models.layers.interaction import CrossLayer, CrossNetwork, DotInteraction, FMInteraction
from ember.models.layers.mlp import MLP, MLPConfig, make_activation
from ember.models.layers.moe import MMoELayer

__all__ = [
    "MLP",
    "CrossLayer",
    "CrossNetwork",
    "DotInteraction",
    "FMInteraction",
    "MLPConfig",
    "MMoELayer",
    "make_activation",
]
