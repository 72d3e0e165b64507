"""The dense model of an export as a standard ONNX graph (``ember export --format onnx``).

``model.onnx`` takes the model's inputs after embedding lookup and pooling, one named tensor
each, the batch dimension dynamic:

- ``dense`` float32 [B, Dd] (transformed dense features; Dd may be 0),
- ``pooled_<i>`` float32 [B, D_i], one per feature of the manifest's ``features``,
- ``linear_<i>`` float32 [B, 1], one per ``linear_features`` (DeepFM, Wide&Deep, LR only),

and gives ``logits`` and ``probabilities`` (their sigmoid), float32 [B, T]. The tables stay in
ember's table files beside it: a lookup into a table of a billion int64 IDs is no graph
operation, and ``ember.portable`` (numpy + onnxruntime) does it, with the featurization.

Exported with torch's TorchScript-based exporter (``dynamo=False``: it needs the ``onnx``
package but not ``onnxscript``, and no network), opset 17. torch has deprecated TorchScript; when
that exporter goes, ``dynamo=True`` (with ``onnxscript``) is the replacement to try. Every built-in model type can be expressed (they are fixed compositions of
linear layers, activations, concatenations, products and sums); what cannot, the export refuses
(ConfigError, exit 2): features pooled as ``sequence`` (a padded [B, L, D] input, which no
built-in model takes), a model the exporter cannot trace, or a graph whose outputs differ from
the model's on probe batches (checked with onnxruntime when installed).
"""

from __future__ import annotations

import io
import warnings
from typing import Any, Mapping, Sequence

import torch
from torch import Tensor, nn

from ember.errors import ConfigError

__all__ = ["ONNX_OPSET", "ONNX_FILE", "require_onnx", "onnx_refusal", "onnx_graph"]

ONNX_OPSET = 17
ONNX_FILE = "model.onnx"
_PROBE_ROWS = 7
_PROBE_TOLERANCE = 1e-4  # max |logit difference| on the probe batch (float32 graphs agree to ~1e-6)


def require_onnx() -> None:
    """ConfigError (exit 2) unless the ``onnx`` package, which torch's exporter writes with, is
    installed; says how to install it."""
    try:
        import onnx  # noqa: F401
    except ImportError:
        raise ConfigError("--format onnx needs the onnx package (and onnxruntime to check the graph and to serve it): "
                          "pip install 'ember[portable]' (or pip install onnx onnxruntime), or export with "
                          "--format ember") from None


def onnx_refusal(features: Sequence[Any], linear_features: Sequence[Any] | None) -> str | None:
    """Why the model fed by ``features`` (FeatureConfigs) cannot be served from an ONNX graph,
    or None when it can."""
    seq = [f.name for f in [*features, *(linear_features or [])] if f.pooling not in ("sum", "mean", "sqrtn")]
    if seq:
        return (f"features {seq} are pooled as 'sequence' (a padded [B, L, D] input); the portable runtime pools "
                "sum / mean / sqrtn only")
    return None


class _Flat(nn.Module):
    """``model(dense, pooled, linear)`` with one tensor per input: what an ONNX graph takes."""

    def __init__(self, model: nn.Module, num_pooled: int, linear: bool) -> None:
        super().__init__()
        self.model, self.num_pooled, self.linear = model, num_pooled, linear

    def forward(self, dense: Tensor, *xs: Tensor) -> tuple[Tensor, Tensor]:
        pooled = list(xs[: self.num_pooled])
        linear = list(xs[self.num_pooled:]) if self.linear else None
        logits = self.model(dense, pooled, linear)
        return logits, torch.sigmoid(logits)


def onnx_graph(model: nn.Module, model_inputs: Mapping[str, Any], num_linear: int | None,
               model_type: str) -> tuple[bytes, dict[str, Any]]:
    """``model`` (a built model, ``(dense, pooled, linear) -> logits``) as an ONNX graph (bytes)
    and the manifest's ``onnx`` entry (file, opset, input and output names). The model is
    exported on the CPU in eval mode and put back as it was. Raises ConfigError when the
    exporter fails or the graph disagrees with the model (see the module docstring)."""
    require_onnx()
    dims = list(model_inputs["sparse_dims"])
    num_dense = int(model_inputs["num_dense"])
    names = ["dense", *(f"pooled_{i}" for i in range(len(dims))), *(f"linear_{i}" for i in range(num_linear or 0))]
    flat = _Flat(model, len(dims), num_linear is not None).eval()  # the exporter puts back the wrapper's mode

    def probe(b: int, seed: int) -> tuple[Tensor, ...]:
        g = torch.Generator().manual_seed(seed)
        return (torch.randn(b, num_dense, generator=g), *(torch.randn(b, d, generator=g) for d in dims),
                *(torch.randn(b, 1, generator=g) for _ in range(num_linear or 0)))

    devices = {t.device for t in (*model.parameters(), *model.buffers())}
    device = devices.pop() if len(devices) == 1 else torch.device("cpu")
    was_training = model.training
    model.eval()
    buf = io.BytesIO()
    try:
        model.cpu()
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the exporter's notes on tracing (constant shapes folded, etc.)
            torch.onnx.export(flat, probe(3, 0), buf, dynamo=False, input_names=names,
                              output_names=["logits", "probabilities"], opset_version=ONNX_OPSET,
                              dynamic_axes={n: {0: "batch"} for n in [*names, "logits", "probabilities"]})
            # two probes, the second the first negated and scaled: a branch on the data that tracing
            # froze takes the other way on one of them
            checks = [probe(_PROBE_ROWS, 1)]
            checks.append(tuple(-4 * t for t in checks[0]))
            wants = [flat(*c)[0].numpy() for c in checks]
    except Exception as e:  # the exporter raises many types (torch.onnx errors, RuntimeError, TypeError, ...)
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ConfigError(f"--format onnx: the {model_type!r} model cannot be exported as ONNX ({type(e).__name__}: "
                          f"{first}); export with --format ember (the default) and serve with ember serve") from e
    finally:
        model.to(device)
        model.train(was_training)
    graph = buf.getvalue()
    for check, want in zip(checks, wants):
        _check(graph, names, check, want, model_type)
    return graph, {"file": ONNX_FILE, "opset": ONNX_OPSET, "inputs": names, "outputs": ["logits", "probabilities"]}


def _check(graph: bytes, names: list[str], inputs: tuple[Tensor, ...], want: Any, model_type: str) -> None:
    """The graph's logits on a probe batch against the model's (skipped without onnxruntime)."""
    try:
        import onnxruntime as ort
    except ImportError:
        return
    session = ort.InferenceSession(graph, providers=["CPUExecutionProvider"])
    declared = {i.name for i in session.get_inputs()}  # an input no output reads is pruned from the graph
    got = session.run(["logits"], {n: t.numpy() for n, t in zip(names, inputs) if n in declared})[0]
    diff = float(abs(got - want).max()) if want.size else 0.0
    if got.shape != want.shape or not diff <= _PROBE_TOLERANCE:
        raise ConfigError(f"--format onnx: the ONNX graph of the {model_type!r} model does not compute what the model "
                          f"does (max |logit difference| {diff:.3g} on a probe batch, shapes {got.shape} vs "
                          f"{want.shape}); export with --format ember (the default) and serve with ember serve")
