"""Serving: score raw rows with an exported model, without the training code."""

from ember.serving.predictor import Predictor

__all__ = ["Predictor"]
