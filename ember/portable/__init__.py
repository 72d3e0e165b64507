"""Portable serving: score raw rows with an ONNX export using numpy and onnxruntime only.

``ember export --format onnx`` writes the dense model as ``model.onnx`` beside the export's
table files; :class:`PortableModel` featurizes raw rows exactly as ember's ``Predictor`` does
(canonical values, dense transforms, hashing, multi-hot and weighted pooling, unseen IDs) and
runs the graph. No module here imports torch or any other part of ember, so the package (or
its seven files) runs in a serving image with only ``numpy`` and ``onnxruntime``.
"""

from ember.portable.hashing import hash_ints, hash_strings
from ember.portable.runtime import BadInput, PortableModel
from ember.portable.triton import triton_config, v2_request, write_triton_model

__all__ = ["PortableModel", "BadInput", "hash_ints", "hash_strings", "triton_config", "write_triton_model", "v2_request"]
