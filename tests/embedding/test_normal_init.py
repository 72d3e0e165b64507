"""A normal initializer's rows: the same bits from the native kernel, its numpy reference, the
portable runtime, torch on any device, and numpy on any CPU (``ember.portable.normal``)."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from ember import _native
from ember._native.init import _normal01_py
from ember.embedding.init import TENSOR_OPS, InitializerConfig, init_keys, init_rows, normal_tensor
from ember.portable.normal import NUMPY_OPS, box_muller
from ember.portable.tables import init_rows as portable_rows


def _every_uniform() -> tuple[np.ndarray, np.ndarray]:
    """Every value the counter-based uniforms take (k 2^-24), as u1, and shuffled, as u2."""
    u = np.arange(1 << 24, dtype=np.float32) * np.float32(2.0**-24)
    return u, np.random.default_rng(0).permutation(u)


def test_numpy_and_torch_give_the_same_bits_for_every_uniform_and_the_exact_draw_within_1e_6():
    u1, u2 = _every_uniform()
    z = box_muller(u1, u2, NUMPY_OPS)
    zt = box_muller(torch.from_numpy(u1), torch.from_numpy(u2), TENSOR_OPS).numpy()
    assert np.array_equal(z.view(np.uint32), zt.view(np.uint32))
    exact = np.sqrt(-2 * np.log1p(-u1.astype(np.float64))) * np.cos(2 * np.pi * u2.astype(np.float64))
    assert np.abs(z - exact).max() < 1e-6  # (6.8e-7 at |z| = 4.1; library float32 Box-Muller: 1.8e-6)
    assert abs(float(z.mean())) < 1e-3 and abs(float(z.std()) - 1) < 1e-3
    assert abs(float((np.abs(z) > 3).mean()) - 0.0027) < 2e-4  # (the normal's two-sided tail)


@pytest.mark.parametrize("dim", [1, 16, 33])
def test_the_native_kernel_equals_its_numpy_reference_and_the_tensor_ops(dim):
    rng = np.random.default_rng(dim)
    ids = rng.integers(-(2**63), 2**63 - 1, size=3000, dtype=np.int64, endpoint=True)
    ids[:4] = [0, -1, 2**63 - 1, -(2**63)]
    for seeds in (7, rng.integers(0, 1 << 62, size=ids.size)):
        k1, k2 = init_keys(seeds, 1), init_keys(seeds, 2)
        ref = np.empty((ids.size, dim), np.float32)
        _normal01_py(ids, k1, k2, dim, ref, 0.3)
        got = np.empty_like(ref)
        _native.normal01(ids, k1, k2, dim, got, 0.3)
        assert np.array_equal(got.view(np.uint32), ref.view(np.uint32))
        t = normal_tensor(torch.from_numpy(ids), torch.from_numpy(k1.view(np.int64)), torch.from_numpy(k2.view(np.int64)),
                          dim, 0.3)
        assert np.array_equal(t.numpy().view(np.uint32), ref.view(np.uint32))
        if isinstance(seeds, int):  # the trainer's and the portable runtime's rows are these
            cfg = InitializerConfig(type="normal", std=0.3)
            assert np.array_equal(init_rows(torch.from_numpy(ids), dim, cfg, seeds).numpy().view(np.uint32), ref.view(np.uint32))
            assert np.array_equal(portable_rows(ids, dim, {"type": "normal", "std": 0.3}, seeds).view(np.uint32),
                                  ref.view(np.uint32))


_HASH = ("import hashlib, numpy, torch; from ember.embedding.init import InitializerConfig, init_rows; "
         "from numpy._core._multiarray_umath import __cpu_features__ as f; "
         "r = init_rows(torch.arange(-50000, 50000), 16, InitializerConfig(type='normal'), seed=3).numpy(); "
         "print(hashlib.sha256(r.tobytes()).hexdigest(), int(f.get('X86_V4', f.get('AVX512_SKX', False))), int(f.get('X86_V3', f.get('AVX2', False))))")


def test_the_rows_do_not_depend_on_the_cpu_features_numpy_uses():
    """numpy's float32 log and cos take other code paths on AVX-512, AVX2 and older CPUs (their
    bits differ there): the rows must not. Each run hides CPU features from numpy."""
    runs = {}
    for hide in ("", "X86_V4", "X86_V4 X86_V3"):
        env = {**os.environ, "NPY_DISABLE_CPU_FEATURES": hide, "EMBER_NATIVE": "0"}
        out = subprocess.run([sys.executable, "-c", _HASH], env=env, capture_output=True, text=True, check=True).stdout.split()
        runs[hide] = out
    if len({tuple(v[1:]) for v in runs.values()}) == 1:
        pytest.skip(f"this numpy cannot hide CPU features by group name ({np.__version__}), or the CPU has none of them")
    assert len({v[0] for v in runs.values()}) == 1, runs
    mine = init_rows(torch.arange(-50000, 50000), 16, InitializerConfig(type="normal"), seed=3).numpy()
    assert hashlib.sha256(mine.tobytes()).hexdigest() == runs[""][0]  # (and the native kernel: the same)


@pytest.mark.gpu
def test_the_same_bits_on_a_gpu():
    u1, u2 = _every_uniform()
    z = box_muller(u1, u2, NUMPY_OPS)
    zt = box_muller(torch.from_numpy(u1).cuda(), torch.from_numpy(u2).cuda(), TENSOR_OPS).cpu().numpy()
    assert np.array_equal(z.view(np.uint32), zt.view(np.uint32))
