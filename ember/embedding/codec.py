"""Row storage dtype: how a table's fp32 records are packed into the tiers' 4-byte words.

The tiers store rows of float32-typed words and never interpret them, so reduced precision is
a matter of packing: a record ``[weights (D) | optimizer state (S) | last-seen step]`` of a
``bf16`` or ``fp16`` table keeps its weights as 16-bit values, two per word (an odd ``D`` pads
the last word with zero bits), and everything after the weights as float32 words unchanged.
Optimizer state stays fp32 for every optimizer: Adagrad's accumulators, Adam's moments and
FTRL's z/n sum many small terms, and 16-bit state would drop them (the issue's "state at a
precision that loses no updates"); row-wise Adagrad's one scalar per row costs one word anyway.
For dim 16 with row-wise Adagrad that is 8 + 1 = 9 words (36 B) instead of 17 (68 B): 53 %.

Rounding. Updates are computed on fp32 records (``decode`` widens exactly); ``encode`` rounds
the weights back *stochastically*: up with probability equal to the distance from the lower
neighbour over the spacing, so E[stored] = value and many small updates that round-to-nearest
would drop each time still move a row on average. The random bits are a pure function of
(table seed, table step, ID, column) through ``mix64`` (16 bits per value, one 64-bit mix per 4
columns), so a run is bit-identical run to run, whatever the thread scheduling or tier layout.
``encode_nearest`` rounds to nearest-even instead; it is used where there is no update to keep
unbiased: fresh rows (rounded once at creation, so the first read equals what is stored and
eval, training and serving agree on an ID without a row) and rows imported from a checkpoint of
another dtype.

bf16 rounding works on the magnitude bits (add 16 random bits, truncate 16), so the sign is
kept and representable values are exact; NaN stays NaN and +-inf stays inf. fp16 has a small
range: finite values beyond +-65504 *saturate* to +-65504 (an embedding weight that large is a
diverged run, which the loss shows; a stored inf would instead poison every later update of the
row); NaN and inf are kept; fp16 subnormals are rounded between their neighbours like any value.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
import torch
from torch import Tensor

from ember import _native
from ember.mix import golden_steps, mix64, mix64_tensor
from ember.tiers import device_budget

__all__ = ["RowDtype", "RowCodec", "packed_words", "round_nearest", "sr_noise", "sr_table_keys", "to_bits", "from_bits"]

RowDtype = Literal["fp32", "bf16", "fp16"]

_GOLDEN = -7046029254386353131  # 0x9E3779B97F4A7C15 as int64
_M1 = -4658895280553007687  # 0xBF58476D1CE4E5B9
_M2 = -7723592293110705685  # 0x94D049BB133111EB
_SR_STREAM = 0x5352  # keeps the rounding noise apart from the initialisers' streams
_FP16_MAX = 65504.0


def packed_words(dtype: RowDtype, dim: int, width: int) -> int:
    """Words (4 bytes) per record of ``width`` fp32 columns whose first ``dim`` are weights.

    Example:
        >>> packed_words("fp32", 16, 17), packed_words("bf16", 16, 17), packed_words("fp16", 3, 4)
        (17, 9, 3)
    """
    if dtype == "fp32":
        return width
    return (dim + 1) // 2 + (width - dim)


def sr_table_keys(seed: "int | np.ndarray", step: "int | np.ndarray") -> np.ndarray:
    """uint64: the (seed, step) part of ``sr_noise``'s key, one per element (a table's seed and
    step), made on the host: a group's few tables cost the device no operations."""
    s = np.atleast_1d(np.asarray(seed)).astype(np.uint64) * np.uint64(2) + np.uint64(_SR_STREAM)
    t = np.atleast_1d(np.asarray(step)).astype(np.uint64) * np.uint64(_GOLDEN & (2**64 - 1))
    return mix64(mix64(s) ^ t)


def sr_noise(ids: Tensor, seed: int | Tensor, step: int | Tensor, cols: int, device: torch.device,
             table_key: Tensor | None = None) -> Tensor:
    """Uniform 16-bit integers int64 [N, cols] in [0, 65536): one per (seed, step, ID, column).

    ``seed`` / ``step``: one per call, or int64 [N] per row (the tables of a group at once).
    ``table_key``: int64 [N], ``sr_table_keys`` of each row's (seed, step) when the caller has
    them (then ``seed`` and ``step`` are not read).
    """
    n = ids.numel()
    ids = ids.to(device=device, dtype=torch.int64)
    if table_key is None:
        seed_t = torch.as_tensor(seed, dtype=torch.int64, device=device)
        step_t = torch.as_tensor(step, dtype=torch.int64, device=device)
        table_key = mix64_tensor(mix64_tensor(seed_t * 2 + _SR_STREAM) ^ (step_t * _GOLDEN))
    key = mix64_tensor(table_key ^ (ids * _M1)).reshape(-1, 1)
    lanes = (cols + 3) // 4
    z = mix64_tensor(key + golden_steps(lanes, ids.device))  # [N, lanes]
    parts = torch.stack([(z >> (16 * k)) & 0xFFFF for k in range(4)], dim=2)  # [N, lanes, 4]
    return parts.reshape(n, lanes * 4)[:, :cols]


def _bf16_bits(x: Tensor, noise: Tensor | None) -> Tensor:
    """bf16 bit patterns (int64 [N, D], low 16 bits) of fp32 ``x``: stochastic with ``noise``, else
    round-to-nearest-even."""
    bits = x.contiguous().view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    sign = bits & 0x80000000
    mag = bits & 0x7FFFFFFF
    if noise is None:
        mag = mag + 0x7FFF + ((mag >> 16) & 1)
    else:
        mag = mag + noise
    out = (sign | (mag & 0x7FFF0000)) >> 16
    nan = (bits & 0x7FFFFFFF) > 0x7F800000
    return torch.where(nan, (sign >> 16) | 0x7FC0, out)  # (unconditional: no read-back of device data)


def _fp16_bits(x: Tensor, noise: Tensor | None) -> Tensor:
    """fp16 bit patterns (int64 [N, D], low 16 bits) of fp32 ``x``: stochastic with ``noise``
    (between the two neighbouring fp16 values, up with probability distance / spacing), else
    round-to-nearest-even; finite values beyond +-65504 saturate."""
    finite = torch.isfinite(x)
    xs = torch.where(finite, x.clamp(-_FP16_MAX, _FP16_MAX), x)
    if noise is None:
        return xs.to(torch.float16).view(torch.int16).to(torch.int64) & 0xFFFF
    a = xs.abs()
    near = a.to(torch.float16)
    lo_bits = near.view(torch.int16).to(torch.int64)
    lo_bits = lo_bits - (near.float() > a).to(torch.int64)  # the fp16 value at or below |x|
    lo = lo_bits.to(torch.int16).view(torch.float16).to(torch.float64)
    hi = (lo_bits + 1).clamp(max=0x7BFF).to(torch.int16).view(torch.float16).to(torch.float64)
    gap = hi - lo
    frac = torch.where(gap > 0, (a.to(torch.float64) - lo) / torch.where(gap > 0, gap, 1.0), 0.0)
    up = (noise.to(torch.float64) < frac * 65536.0) & finite
    mag = lo_bits + up.to(torch.int64)
    mag = torch.where(finite, mag, a.to(torch.float16).view(torch.int16).to(torch.int64))  # inf / NaN kept
    sign = (x.contiguous().view(torch.int32) < 0).to(torch.int64) << 15
    return sign | mag


def round_nearest(weights: Tensor, dtype: RowDtype) -> Tensor:
    """fp32 ``weights`` rounded to the nearest ``dtype`` value (ties to even), still fp32: what a
    fresh row of a ``dtype`` table holds (the predictor rounds initial rows the same way).

    Example:
        >>> round_nearest(torch.tensor([1.0 + 2**-9, 1.0 + 3 * 2**-9]), "bf16").tolist()
        [1.0, 1.0078125]
    """
    if dtype == "fp32":
        return weights
    if dtype == "bf16":
        return _bf16_nearest(weights)
    return _widen(_fp16_bits(weights, None).to(torch.int16), dtype)


def _bf16_nearest(x: Tensor) -> Tensor:
    """``x`` rounded to the nearest bf16 (ties to even), as fp32. torch's conversion is one
    vectorised pass (fresh rows of every new ID go through it) and gives ``_bf16_bits``' bits,
    the reference, for every value but NaN (kept with its sign there) and subnormals (a CPU's
    AVX512-BF16 conversion flushes them to zero): a tensor where a non-zero value became zero,
    or whose sum is not finite (NaN, inf, or so large it overflows), takes the reference."""
    fast = x.to(torch.bfloat16).float()
    if torch.count_nonzero(fast) != torch.count_nonzero(x) or not bool(torch.isfinite(fast.sum())):
        return _widen(_bf16_bits(x, None).to(torch.int16), "bf16")
    return fast


def to_bits(weights: Tensor, dtype: RowDtype) -> Tensor:
    """fp32 ``weights`` -> int16 bit patterns of ``dtype`` ("bf16" / "fp16"), rounded to nearest
    (exact for values of that dtype): how exports store 16-bit weights."""
    if dtype == "fp32":
        raise ValueError("to_bits: fp32 weights are stored as they are; only bf16 / fp16 have 16-bit patterns")
    bits = _bf16_bits(weights, None) if dtype == "bf16" else _fp16_bits(weights, None)
    return bits.to(torch.int16)


def from_bits(bits16: Tensor, dtype: RowDtype) -> Tensor:
    """int16 bit patterns of ``dtype`` -> their exact fp32 values (inverse of ``to_bits``)."""
    return _widen(bits16, dtype)


def _widen(bits16: Tensor, dtype: RowDtype, out: Tensor | None = None) -> Tensor:
    """int16 bit patterns [N, D] -> their exact fp32 values (into ``out`` [N, D] when given: one
    pass, no temporary)."""
    values = bits16.view(torch.bfloat16 if dtype == "bf16" else torch.float16)
    return values.float() if out is None else out.copy_(values)


class RowCodec:
    """Packs fp32 records [N, width] (first ``dim`` columns weights) into [N, words] float32-typed
    words for the tiers, and back. ``fp32`` is the identity (no copy).

    Args:
        dtype: ``fp32`` / ``bf16`` / ``fp16``: how weights are stored.
        dim: weights per record.
        width: fp32 columns per record (weights, optimizer state, last-seen step).

    Example:
        >>> c = RowCodec("bf16", dim=3, width=4)
        >>> rec = torch.tensor([[1.0, -2.5, 0.1, 7.25]])
        >>> c.words, c.decode(c.encode_nearest(rec)).tolist()
        (3, [[1.0, -2.5, 0.10009765625, 7.25]])
    """

    def __init__(self, dtype: RowDtype, dim: int, width: int) -> None:
        if dtype not in ("fp32", "bf16", "fp16"):
            raise ValueError(f"row dtype must be fp32, bf16 or fp16, got {dtype!r}")
        if not 0 < dim <= width:
            raise ValueError(f"RowCodec: need 0 < dim <= width, got dim {dim}, width {width}")
        self.dtype: RowDtype = dtype
        self.dim = dim
        self.width = width
        self.half = (dim + 1) // 2  # words of weights
        self.words = packed_words(dtype, dim, width)

    @property
    def identity(self) -> bool:
        return self.dtype == "fp32"

    @property
    def record_bytes(self) -> int:
        return 4 * self.words

    def decode(self, packed: Tensor) -> Tensor:
        """[N, words] -> fp32 [N, width] (exact: 16-bit weights widen without rounding)."""
        if self.identity:
            return packed
        self._check(packed, self.words, "packed")
        out = packed.new_empty(packed.shape[0], self.width, dtype=torch.float32)
        w16 = packed.contiguous().view(torch.int16)[:, : self.dim]
        _widen(w16, self.dtype, out=out[:, : self.dim])
        out[:, self.dim :] = packed[:, self.half :]
        return out

    def encode(self, records: Tensor, ids: Tensor, seed: int | Tensor, step: int | Tensor,
               table_key: Tensor | None = None) -> Tensor:
        """fp32 [N, width] -> [N, words], weights rounded stochastically with the noise of
        (``seed``, ``step``, ``ids``, column) (``sr_noise``; ``table_key``: its (seed, step)
        part per row, made by the caller): unbiased and reproducible."""
        if self.identity:
            return records
        self._check(records, self.width, "records")
        if self.dtype == "bf16" and records.device.type == "cpu" and table_key is None and device_budget.active() is None:
            # one compiled pass (numpy without the core); under a DeviceBudget, the path a GPU takes
            return self._pack_bf16_cpu(records, ids, seed, step)
        w = records[:, : self.dim]
        noise = sr_noise(ids, seed, step, self.dim, records.device, table_key)
        bits = _bf16_bits(w, noise) if self.dtype == "bf16" else _fp16_bits(w, noise)
        return self._pack(records, bits)

    def _pack_bf16_cpu(self, records: Tensor, ids: Tensor, seed: int | Tensor, step: int | Tensor) -> Tensor:
        n = records.shape[0]
        out = torch.empty(n, self.words)
        per_row = [np.ascontiguousarray(np.broadcast_to(np.asarray(torch.as_tensor(v).cpu(), dtype=np.int64).reshape(-1), (n,)))
                   for v in (seed, step)]  # one seed and step per row (an int, or one per row)
        _native.bf16_pack_sr(records.contiguous().numpy(), np.ascontiguousarray(ids.cpu().numpy(), dtype=np.int64),
                             per_row[0], per_row[1], self.dim, out.numpy())
        return out

    def encode_nearest(self, records: Tensor) -> Tensor:
        """fp32 [N, width] -> [N, words], weights rounded to nearest-even (no noise)."""
        if self.identity:
            return records
        self._check(records, self.width, "records")
        w = records[:, : self.dim]
        bits = _bf16_bits(w, None) if self.dtype == "bf16" else _fp16_bits(w, None)
        return self._pack(records, bits)

    def round_exact(self, weights: Tensor) -> Tensor:
        """fp32 ``weights`` rounded to nearest at the codec's dtype by the reference bit patterns
        (``round_nearest``'s values, as tensor operations with no read-back: a device's fresh rows)."""
        if self.identity:
            return weights
        bits = _bf16_bits(weights, None) if self.dtype == "bf16" else _fp16_bits(weights, None)
        return _widen(bits.to(torch.int16), self.dtype)

    def round_weights(self, records: Tensor) -> Tensor:
        """``records`` with its weights rounded to nearest (in place; returned): a fresh row as stored."""
        if not self.identity and records.numel():
            records[:, : self.dim] = round_nearest(records[:, : self.dim], self.dtype)
        return records

    def _pack(self, records: Tensor, bits: Tensor) -> Tensor:
        n = records.shape[0]
        out = records.new_empty(n, self.words, dtype=torch.float32)
        if self.dim % 2:
            out[:, self.half - 1] = 0.0  # the pad half-word: zero bits
        out.view(torch.int16)[:, : self.dim] = bits.to(torch.int16)
        out[:, self.half :] = records[:, self.dim :]
        return out

    def _check(self, t: Tensor, width: int, what: str) -> None:
        if t.dim() != 2 or t.shape[1] != width or t.dtype != torch.float32:
            raise ValueError(f"RowCodec({self.dtype}, dim {self.dim}): {what} must be float32 [N, {width}], "
                             f"got {t.dtype} {list(t.shape)}")
