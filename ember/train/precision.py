"""Reduced-precision dense compute: autocast for the model, fp32 master weights, and dynamic
loss scaling for fp16 that covers the embedding gradients too.

``train.precision``: ``auto`` (the default): bf16 where a CPU computes bf16 natively and the
dense model is large enough to gain, fp32 elsewhere (``_auto``'s rules, each measured with
bench/bench_autocast_size.py: emulated bf16 matmuls are slower than fp32; for a smaller model
the casts cost more than the matmuls save; on a GPU, DLRM-sized dense models are bound by kernel
launches, and autocast adds cast kernels); ``fp32``; ``bf16`` (bfloat16 autocast: fp32's range,
so no loss scaling); ``fp16`` (float16 autocast with a dynamic loss scale). ``resolve`` makes
auto's choice and logs it, with its reason, once per device and model size. Why bf16 may be the default:
bench/bench_precision_quality.py, 10 seeds, the real samples cross-validated over 10 folds,
found eval AUC within 0.001 of fp32 beyond two standard errors on the Criteo and Avazu samples
and the synthetic set (bench/RESULTS.md, 2026-11-27, twelfth session).

Parameters, optimizer state, embedding rows and the loss stay fp32; only the model's matmuls
and convolutions run in the reduced type (torch.autocast's op lists), and only while training:
eval and predict score in fp32 (``placement.compute_precision``), the way an exported model
serves, so the metrics a run reports are those of the model it exports. The pooled embeddings
enter the model in fp32.

Loss scaling (fp16): the loss is multiplied by ``scale`` before backward so small gradients do
not flush to zero; the dense and the embedding gradients are divided by it again before any
optimizer sees them. A step whose gradients hold an inf or NaN is skipped whole (no dense step,
no row update) and the scale halves; after ``growth_interval`` clean steps it doubles. Unlike
``torch.amp.GradScaler``, which only knows the dense optimizer's parameters, this scaler checks
and unscales the embedding gradients as well, so one overflow never updates half a model.

Distributed, each rank sees only its own gradients before the exchange (the embedding
gradients of its slice): the ranks agree on the overflow (``agree``: a MAX all-reduce of the
flag) before the scaler decides, so every rank skips the same steps and keeps the same scale.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from pathlib import Path
from typing import Any, Callable, Iterable, Literal

import torch
from torch import Tensor

__all__ = ["Precision", "PrecisionSetting", "LossScaler", "autocast", "resolve", "cpu_bf16", "cpu_model", "DTYPES",
           "BF16_MIN_MACS", "AMX_MIN_MACS", "AMX_MIN_MACS_PER_SAMPLE", "dense_macs"]

log = logging.getLogger(__name__)

Precision = Literal["fp32", "bf16", "fp16"]
PrecisionSetting = Literal["auto", "fp32", "bf16", "fp16"]  # train.precision: a Precision, or auto
DTYPES: dict[str, torch.dtype] = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
BF16_CPU_FLAGS = ("amx_bf16", "avx512_bf16")  # /proc/cpuinfo flags of native bf16 matmuls on x86
# auto keeps fp32 for a dense model whose linear layers do fewer multiply-adds than this per batch:
# there autocast's casts cost more than its faster matmuls save (python bench/bench_autocast_size.py,
# AMD EPYC, AVX512-BF16: 0.82-0.97x of fp32 up to 21.9 M, 1.01-2.02x from 25.6 M up; bench/RESULTS.md).
BF16_MIN_MACS = 25_000_000
# With AMX-BF16 (Intel Xeon, 16 and 2 threads) width decides, not only size: models of 6-130 k
# multiply-adds a sample ran at 0.76-0.97x of fp32 at every batch measured (up to 117 M a batch),
# 180 k at 0.85x (batch 512) and 1.07x (4,096); from 461 k a sample bf16 gained 1.01-1.80x from a
# batch of 128 (59 M) up, 0.94-0.99x at 64 (bench/RESULTS.md, GPU session 5: its host).
AMX_MIN_MACS = 50_000_000
AMX_MIN_MACS_PER_SAMPLE = 400_000


def _cpuinfo() -> str:
    try:
        return Path("/proc/cpuinfo").read_text()
    except OSError:  # not Linux: no flags to read
        return ""


@functools.cache
def cpu_bf16() -> list[str]:
    """The native-bf16 features of this CPU (``amx_bf16``, ``avx512_bf16``; empty when it has
    none, or where ``/proc/cpuinfo`` cannot be read)."""
    flags: set[str] = set()
    for line in _cpuinfo().splitlines():
        if line.startswith("flags"):
            flags.update(line.partition(":")[2].split())
            break
    return [f for f in BF16_CPU_FLAGS if f in flags]


@functools.cache
def cpu_model() -> str:
    """This CPU's model name (``/proc/cpuinfo``; ``platform.processor()`` elsewhere)."""
    for line in _cpuinfo().splitlines():
        if line.startswith("model name"):
            return line.partition(":")[2].strip()
    import platform

    return platform.processor() or platform.machine() or "unknown"


def dense_macs(model: torch.nn.Module) -> int:
    """Multiply-adds per sample of ``model``'s linear layers: the work bf16 autocast speeds up."""
    return sum(m.in_features * m.out_features for m in model.modules() if isinstance(m, torch.nn.Linear))


def _auto(device: torch.device, macs: int | None = None, per_sample: int | None = None) -> tuple[Precision, str]:
    """auto's choice on ``device`` for a dense model of ``macs`` multiply-adds per batch and
    ``per_sample`` per sample (None: unknown, the device alone decides), and the reason for it."""
    native, why = _native_bf16(device)
    if not native:
        return "fp32", why
    if device.type == "cuda":
        return "fp32", (f"{why}, but for DLRM-sized dense models bf16 autocast measured 0.76-0.83x of fp32's "
                        "speed on an H200 (0.8 M to 8.8 G multiply-adds a batch: the step is bound by kernel "
                        "launches, and autocast adds cast kernels)")
    amx = "amx_bf16" in cpu_bf16()
    if amx and per_sample is not None and per_sample < AMX_MIN_MACS_PER_SAMPLE:
        return "fp32", (f"{why}, but the dense model's linear layers do {per_sample / 1e3:.0f} k multiply-adds a "
                        f"sample, fewer than the {AMX_MIN_MACS_PER_SAMPLE / 1e3:.0f} k from which AMX's bf16 "
                        "matmuls outweigh autocast's casts")
    least = AMX_MIN_MACS if amx else BF16_MIN_MACS
    if macs is not None and macs < least:
        return "fp32", (f"{why}, but the dense model's linear layers do {macs / 1e6:.1f} M multiply-adds a "
                        f"batch, fewer than the {least / 1e6:.0f} M from which bf16's faster matmuls "
                        "outweigh its casts")
    return "bf16", why


def _native_bf16(device: torch.device) -> tuple[bool, str]:
    """Whether ``device`` computes bf16 natively, and why (not)."""
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        if torch.cuda.is_bf16_supported():
            return True, f"the GPU ({name}) computes bf16 natively"
        return False, f"the GPU ({name}) has no native bf16"
    if device.type == "cpu":
        native = cpu_bf16()
        if native:
            return True, f"the CPU ({cpu_model()}) has {' and '.join(f.upper() for f in native)}"
        return False, (f"the CPU ({cpu_model()}) has neither AMX-BF16 nor AVX512-BF16, so bf16 matmuls "
                       "would be emulated and slower than fp32")
    return False, f"native bf16 is not detected on {device.type} devices"


@functools.cache
def _resolve_logged(device: torch.device, macs: int | None, per_sample: int | None) -> Precision:
    choice, reason = _auto(device, macs, per_sample)
    log.info("train.precision auto: %s on %s, because %s (set train.precision to fp32 or bf16 to choose)",
             choice, device, reason)
    return choice


def resolve(setting: PrecisionSetting, device: torch.device, macs: int | None = None,
            per_sample: int | None = None) -> Precision:
    """The compute type that ``train.precision: setting`` means on ``device``: the setting
    itself, or auto's choice for a dense model of ``macs`` multiply-adds per batch and
    ``per_sample`` per sample (``dense_macs``; logged once per device and size, with its reason).

    Example:
        >>> resolve("fp16", torch.device("cpu"))
        'fp16'
    """
    if setting != "auto":
        return setting
    return _resolve_logged(torch.device(device), macs, per_sample)


def autocast(device: torch.device, precision: PrecisionSetting) -> contextlib.AbstractContextManager[Any]:
    """The autocast context of ``precision`` on ``device`` (a no-op for fp32; ``auto`` resolves
    as ``resolve`` says)."""
    precision = resolve(precision, device)
    if precision == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=DTYPES[precision])


class LossScaler:
    """Dynamic loss scale for fp16 training (see the module docstring).

    Args:
        agree: distributed: ``agree(overflowed here)`` returns whether any rank overflowed (a
            collective every rank calls at the same step); None: one process.

    Example:
        >>> s = LossScaler(init_scale=8.0, growth_interval=2)
        >>> g = torch.tensor([8.0, 16.0])
        >>> s.unscale_([g]), g.tolist(), s.scale
        (True, [1.0, 2.0], 8.0)
        >>> s.unscale_([torch.tensor([float("inf")])]), s.scale, s.skipped
        (False, 4.0, 1)
    """

    def __init__(self, init_scale: float = 2.0**16, growth_factor: float = 2.0, backoff_factor: float = 0.5,
                 growth_interval: int = 2000, agree: Callable[[bool], bool] | None = None) -> None:
        self.scale = float(init_scale)
        self.growth_factor, self.backoff_factor, self.growth_interval = growth_factor, backoff_factor, growth_interval
        self.clean_steps = 0  # consecutive steps without overflow
        self.skipped = 0  # steps skipped for an overflow, in total
        self.agree = agree

    def scaled(self, loss: Tensor) -> Tensor:
        """``loss * scale``, to call backward on."""
        return loss * self.scale

    def unscale_(self, grads: Iterable[Tensor | None]) -> bool:
        """Divide ``grads`` by the scale in place and update the scale; False when any of them
        holds an inf or NaN (the step must then be skipped); distributed, False on every rank
        when any rank's do."""
        inv = 1.0 / self.scale
        flags = []
        for g in grads:
            if g is not None:
                g.mul_(inv)
                flags.append(torch.isfinite(g).all())
        finite = bool(torch.stack(flags).all()) if flags else True
        if self.agree is not None:
            finite = not self.agree(not finite)
        if finite:
            self.clean_steps += 1
            if self.clean_steps >= self.growth_interval:
                self.scale *= self.growth_factor
                self.clean_steps = 0
        else:
            self.scale *= self.backoff_factor
            self.clean_steps = 0
            self.skipped += 1
            log.info("fp16 loss scale: gradients overflowed, step skipped, scale now %g", self.scale)
        return finite

    def state_dict(self) -> dict[str, float | int]:
        return {"scale": self.scale, "clean_steps": self.clean_steps, "skipped": self.skipped}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.scale = float(state["scale"])
        self.clean_steps, self.skipped = int(state["clean_steps"]), int(state["skipped"])
