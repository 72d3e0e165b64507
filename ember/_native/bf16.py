"""bf16 rows (``ember.embedding.codec``): fp32 records packed with stochastic rounding, and
widened back."""

from __future__ import annotations

import numpy as np

from ember import _native
from ember.mix import mix64


def bf16_pack_sr(records: np.ndarray, ids: np.ndarray, seeds: np.ndarray, steps: np.ndarray, dim: int,
                 out: np.ndarray) -> None:
    """A bf16 table's records (float32 [N, W], C-contiguous) packed into ``out`` (float32
    [N, (dim+1)//2 + W - dim]): the first ``dim`` columns rounded to bf16 stochastically with
    the noise of (``seeds[i]``, ``steps[i]``, ``ids[i]``, column) (int64 [N] each), two per word;
    the rest copied. One pass in the compiled core; bit-identical to the fallback here and to
    ``ember.embedding.codec``'s torch path (which runs on other devices)."""
    if _native._core is not None:  # (row ranges on several threads when there are many)
        return _native._core.bf16_pack_sr(records, ids, seeds, steps, out, dim, records.shape[1], _native.part_count(ids.size))
    return _bf16_pack_sr_py(records, ids, seeds, steps, dim, out)


def _bf16_pack_sr_py(records: np.ndarray, ids: np.ndarray, seeds: np.ndarray, steps: np.ndarray, dim: int,
                     out: np.ndarray) -> None:
    n, width = records.shape
    half = (dim + 1) // 2
    if not 0 < dim <= width or out.shape != (n, half + width - dim) or not (ids.size == seeds.size == steps.size == n):
        raise ValueError("ember native bf16_pack_sr: records [N, width], ids/seeds/steps int64 [N], "
                         "out [N, (dim+1)//2 + width - dim], 0 < dim <= width")
    golden, m1 = np.uint64(0x9E3779B97F4A7C15), np.uint64(0xBF58476D1CE4E5B9)
    key = mix64(mix64(seeds.view(np.uint64) * np.uint64(2) + np.uint64(0x5352)) ^ (steps.view(np.uint64) * golden))
    key = mix64(key ^ (ids.view(np.uint64) * m1))
    lanes = (dim + 3) // 4
    z = mix64(key[:, None] + np.arange(1, lanes + 1, dtype=np.uint64) * golden)  # [N, lanes]
    shifts = np.arange(4, dtype=np.uint64) * np.uint64(16)
    noise = ((z[:, :, None] >> shifts) & np.uint64(0xFFFF)).reshape(n, lanes * 4)[:, :dim].astype(np.uint32)
    v = _bf16_round_py(np.ascontiguousarray(records[:, :dim]).view(np.uint32), noise)
    if dim % 2:
        out[:, half - 1] = 0.0
    out.view(np.uint16)[:, :dim] = v
    out[:, half:] = records[:, dim:]


def _bf16_round_py(b: np.ndarray, noise: np.ndarray) -> np.ndarray:
    """The bf16 bit patterns (uint16) of float32 bits ``b`` (uint32): the magnitude plus ``noise``
    (uint32, broadcast) truncated to its top 16 bits, the sign kept; NaN stays NaN (quiet, sign
    kept). The numpy form of the C core's ``bf16_round``: noise ``0x7FFF`` + the kept part's
    lowest bit rounds to nearest even, 16 random bits stochastically."""
    sign, mag = b & np.uint32(0x80000000), b & np.uint32(0x7FFFFFFF)
    v = ((sign | ((mag + noise) & np.uint32(0x7FFF0000))) >> np.uint32(16)).astype(np.uint16)
    nan = mag > np.uint32(0x7F800000)
    v[nan] = ((sign[nan] >> np.uint32(16)) | np.uint32(0x7FC0)).astype(np.uint16)
    return v


def _bf16_widen_py(bits: np.ndarray) -> np.ndarray:
    """bf16 bit patterns (uint16) -> their exact float32 values: the numpy form of the C core's
    ``widen_row``."""
    return (bits.astype(np.uint32) << np.uint32(16)).view(np.float32)
