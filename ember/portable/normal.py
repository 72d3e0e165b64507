"""Normal draws from two uniforms with the same bits on every CPU and device.

A ``normal`` initializer's rows come from Box-Muller, ``sqrt(-2 ln(1 - u1)) cos(2 pi u2)``, of two
counter-based uniforms. Library ``log`` and ``cos`` are not the same function everywhere: numpy's
float32 ones take a different code path on AVX-512, AVX2 and older CPUs (their results differ in
the last bits), and a GPU's differ again. A row must be a pure function of (table seed, ID)
wherever it is made (a rank on another CPU, serving, a GPU making rows in place), so here both
are a fixed sequence of float32 additions, multiplications, one division and one square root,
each rounded as IEEE 754 says on every machine: an exact range reduction, then polynomials.
Accuracy: within 1e-6 of the exact draw for every one of the 2^24 uniforms (tested), far below
what an initial weight needs.

``box_muller`` takes numpy arrays with ``NUMPY_OPS``, or torch tensors with ops of the same
names (``ember.embedding.init``): one definition for the trainer, the device and this runtime.

Example:
    >>> u = np.array([0.5, 0.25], dtype=np.float32)
    >>> [round(float(z), 4) for z in box_muller(u, np.array([0.0, 0.5], dtype=np.float32), NUMPY_OPS)]
    [1.1774, -0.7585]
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np

__all__ = ["NUMPY_OPS", "box_muller"]


def _f32(v: float) -> float:
    """``v`` rounded to float32 (every constant is one: an operation with it is float32 anywhere)."""
    return float(np.float32(v))


_SQRT_HALF = _f32(0.7071067811865476)
_LN2 = _f32(0.6931471805599453)
_TWO_PI = _f32(6.283185307179586)
# ln(m) = 2 atanh(s) = s (2 + 2/3 s^2 + 2/5 s^4 + ...), s = (m - 1) / (m + 1), |s| <= 0.1716
_LOG = [_f32(2.0 / (2 * k + 1)) for k in range(6)]
# cos a and sin a / a as polynomials in a^2 (Taylor), |a| <= pi / 4
_COS = [_f32((-1) ** k / float(np.prod(np.arange(1, 2 * k + 1, dtype=np.float64)))) for k in range(6)]
_SIN = [_f32((-1) ** k / float(np.prod(np.arange(1, 2 * k + 2, dtype=np.float64)))) for k in range(6)]


def _frexp_numpy(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    m, e = np.frexp(x)
    return m, e.astype(np.float32)


def _sqrt_numpy(x: np.ndarray) -> np.ndarray:
    return np.sqrt(x.astype(np.float64)).astype(np.float32)


NUMPY_OPS = SimpleNamespace(frexp=_frexp_numpy, where=np.where, sqrt=_sqrt_numpy, floor=np.floor)
"""``box_muller``'s ops for numpy arrays: ``frexp`` (mantissa in [0.5, 1), exponent as float32),
``where``, ``sqrt`` (float32 -> float64 -> float32: see ``box_muller``), ``floor``."""


def _horner(coef: list[float], x: Any) -> Any:
    p = coef[-1] * x + coef[-2]
    for c in reversed(coef[:-2]):
        p = p * x + c
    return p


def box_muller(u1: Any, u2: Any, ops: Any) -> Any:
    """Standard normal float32 draws of uniforms ``u1``, ``u2`` in [0, 1) (float32 arrays of one
    shape, multiples of 2^-24 as ember's counter-based uniforms are): ``sqrt(-2 ln(1 - u1))
    cos(2 pi u2)``, computed by float32 operations that round alike everywhere (``ops``:
    ``NUMPY_OPS`` or the torch ones). The square root is taken in float64 and rounded to float32:
    that is the correctly rounded float32 root (53 >= 2 x 24 + 2 bits), even from a float64 root
    off by an ulp, whereas torch's float32 root on a CPU is not correctly rounded."""
    # ln x, x = 1 - u1 in [2^-24, 1] (exact): x = m 2^e with m in [sqrt(1/2), sqrt(2)) (exact)
    m, e = ops.frexp(1.0 - u1)
    low = m < _SQRT_HALF
    m = ops.where(low, m + m, m)
    e = ops.where(low, e - 1.0, e)
    s = (m - 1.0) / (m + 1.0)
    ln = e * _LN2 + s * _horner(_LOG, s * s)
    r = ops.sqrt(ln * -2.0)
    # cos(2 pi u2): quarter turns q (exact), the rest f in [-1/8, 1/8] (exact), a = 2 pi f
    q = ops.floor(u2 * 4.0 + 0.5)
    f = u2 - q * 0.25
    a = f * _TWO_PI
    a2 = a * a
    cos, sin = _horner(_COS, a2), a * _horner(_SIN, a2)
    c = ops.where(q == 1.0, -sin, ops.where(q == 2.0, -cos, ops.where(q == 3.0, sin, cos)))  # (q = 4: a full turn)
    return r * c
