"""The hot rows' masked kernels (``ember.tiers.hot_kernels``, Triton) against the tensor
operations they replace on a GPU: the same words read and written, and nothing touched where a
record does not live (a hot record's host row, a cold record's arena slot). On a CPU they run in
Triton's interpreter (``TRITON_INTERPRET=1``, set before Triton is imported: in a subprocess),
and through Triton's compiler to an sm_90 cubin (no GPU needed); without Triton the checks are
skipped here and ``.ci/run`` runs them with Triton installed beside the suite. The GPU runs them
for real (tests/train/test_gpu.py)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest

from tests.conftest import REPO

CHECK = r'''
import torch
from ember.tiers import hot_kernels as hk
from ember.tiers.hot_rows import HotRows

assert hk.triton is not None
torch.manual_seed(0)
for width in (3, 17, 33, 129):
    n_rec, cap = 60, 9
    host = torch.randn(n_rec + 1, width)  # records 0..59, the scratch row 60
    hot = HotRows(cap, width, n_rec + 1, "cpu")
    hot.arena.normal_()
    chosen = torch.randperm(n_rec)[:cap]
    hot.slot[chosen] = torch.arange(cap, dtype=torch.int32)
    rows = torch.cat([torch.randperm(n_rec)[:25], torch.tensor([n_rec, n_rec])])  # (and padding: the scratch row)
    want = torch.where((hot.slot[rows] >= 0).unsqueeze(1), hot.arena[hot.slot[rows].clamp(min=0).long()], host[rows])
    got = hk.gather(host, hot.arena, rows, hot.slot)
    assert torch.equal(got.view(torch.int32), want.view(torch.int32)), width
    rec = torch.randn(rows.numel(), width)
    rec[-1] = rec[-2]  # (the padding's rows write the same scratch row)
    h_ref, a_ref = host.clone(), hot.arena.clone()
    s = hot.slot[rows].long()
    is_hot = s >= 0
    h_ref[rows[~is_hot]] = rec[~is_hot]
    a_ref[s[is_hot]] = rec[is_hot]
    h, a = host.clone(), hot.arena.clone()
    hk.scatter(h, a, rows, hot.slot, rec)
    assert torch.equal(h, h_ref) and torch.equal(a, a_ref), width
    assert torch.equal(h[chosen], host[chosen])  # (a hot record's host row is not written)
print("ok")
'''


@pytest.mark.skipif(importlib.util.find_spec("triton") is None,
                    reason="Triton is not installed (PyTorch's CUDA builds bring it; .ci/run installs it for this check)")
def test_the_masked_kernels_read_and_write_as_the_tensor_operations():
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": os.pathsep.join(
        p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)}
    out = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True, timeout=600, env=env, cwd=REPO)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-3000:]


@pytest.mark.skipif(importlib.util.find_spec("triton") is None,
                    reason="Triton is not installed (PyTorch's CUDA builds bring it; .ci/run installs it for this check)")
@pytest.mark.parametrize("width", [17, 129])
def test_the_kernels_compile_for_a_gpu(width):
    """Both kernels through Triton's whole compiler for an H100/H200 (sm_90: PTX and cubin), no GPU
    needed: what the interpreter does not check (types, the code generator)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from ember.tiers import hot_kernels

    br, bw = hot_kernels._blocks(width)
    for kernel, last in ((hot_kernels._gather_kernel, "out"), (hot_kernels._scatter_kernel, "src")):
        sig = {"host": "*i32", "arena": "*i32", "rows": "*i64", "slot": "*i32", last: "*i32", "n": "i32", "width": "i32",
               "BLOCK_R": "constexpr", "BLOCK_W": "constexpr"}
        compiled = triton.compile(ASTSource(fn=kernel, signature=sig, constexprs={"BLOCK_R": br, "BLOCK_W": bw}),
                                  target=GPUTarget("cuda", 90, 32))
        assert compiled.asm["cubin"] and ".entry" in compiled.asm["ptx"]
