"""Serving ``model.onnx`` from NVIDIA Triton's onnxruntime backend (or any server speaking the
KServe v2 protocol): the model repository entry and the request body.

The server runs the dense graph; featurization and table lookups stay with the caller
(:meth:`ember.portable.PortableModel.inputs`), since a table of a billion int64 IDs is no
graph operation. Layout written by :func:`write_triton_model`::

    <repository>/<name>/config.pbtxt
    <repository>/<name>/1/model.onnx

Example:
    >>> body = v2_request({"dense": np.zeros((2, 3), np.float32)})
    >>> body["inputs"][0]["shape"], body["inputs"][0]["datatype"], body["outputs"]
    ([2, 3], 'FP32', [{'name': 'probabilities'}])
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any, Mapping

import numpy as np

__all__ = ["triton_config", "write_triton_model", "v2_request"]


def triton_config(model: Any, name: str, max_batch_size: int = 4096) -> str:
    """``config.pbtxt`` for a :class:`~ember.portable.PortableModel`'s graph: the onnxruntime
    backend, dynamic batching, every graph input (``dense``, ``pooled_<i>``, ``linear_<i>``;
    one no output reads is left out of the graph) and both outputs, FP32, batch first."""
    def tensor(name_: str, dims: list[int]) -> str:
        return f'  {{ name: "{name_}", data_type: TYPE_FP32, dims: [ {", ".join(str(d) for d in dims)} ] }}'

    inputs = [tensor(i.name, [int(d) for d in i.shape[1:]]) for i in model.session.get_inputs()]
    outputs = [tensor(o.name, [len(model.tasks)]) for o in model.session.get_outputs()]
    return "\n".join([
        f'name: "{name}"', 'platform: "onnxruntime_onnx"', f"max_batch_size: {int(max_batch_size)}",
        "input [", ",\n".join(inputs), "]", "output [", ",\n".join(outputs), "]", "dynamic_batching { }", ""])


def write_triton_model(model: Any, repository: str | Path, name: str, max_batch_size: int = 4096) -> Path:
    """Write ``<repository>/<name>/`` (``config.pbtxt`` and ``1/model.onnx``) for Triton; returns
    that directory. An existing ``<name>`` entry is refused: remove it first."""
    where = Path(repository) / name
    if where.exists():
        raise FileExistsError(f"{where} exists; remove it (or choose another name) to write the model there")
    (where / "1").mkdir(parents=True)
    shutil.copyfile(model.root / model.manifest["onnx"]["file"], where / "1" / "model.onnx")
    (where / "config.pbtxt").write_text(triton_config(model, name, max_batch_size))
    return where


def v2_request(feeds: Mapping[str, np.ndarray], outputs: tuple[str, ...] = ("probabilities",)) -> dict[str, Any]:
    """The KServe v2 JSON body (``POST /v2/models/<name>/infer``) for model inputs ``feeds``
    (:meth:`~ember.portable.PortableModel.inputs`)."""
    return {"inputs": [{"name": k, "shape": list(v.shape), "datatype": "FP32",
                        "data": np.asarray(v, np.float32).reshape(-1).tolist()} for k, v in feeds.items()],
            "outputs": [{"name": o} for o in outputs]}
