"""The DLRM dense step with the dot interaction's own backward vs autograd's, paired in one process.

``DotInteraction`` computes x's gradient as one gather of the pairs' gradient into the symmetric
S [B, F, F] and one ``bmm`` (``S @ x``); autograd's backward of its forward (``bmm(x, x^T)`` then
``gather``) zero-fills [B, F, F], scatters the pairs into it, runs two ``bmm`` and adds them. Two
copies of one DLRM, the second with every ``DotInteraction`` running ``autograd_pairs`` (torch's
ops, autograd's backward), train the same batch in turn, alternating which goes first (a dense
step: forward, backward including the embeddings' gradient as any embedding trainer needs it,
dense Adagrad as ember's trainer builds it). Reported per shape: the median ms per step of each
and the paired median of t(autograd) / t(own).

Shapes: ``dlrm26`` is bench_dlrm.py's model (26 features of dim 16, bottom 13-512-256-16, top
512-256, batch 4,096); ``mlperf`` the MLPerf DLRM's (dim 128, bottom 13-512-256-128, top
1024-1024-512-256, batch 8,192 by default: 32,768 needs ~4x the time).

    python bench/bench_interaction.py [--steps 40] [--mlperf-steps 10] [--batch 4096] [--mlperf-batch 8192]
                                      [--device cpu|cuda]

Default run: ~1 minute on 2 vCPUs (AMD EPYC, AVX2). The last line is one JSON object: ``dlrm26_own_vs_autograd``,
``mlperf_own_vs_autograd`` (the paired ratios), the ms per step and the machine.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import ember  # noqa: F401  # before torch (ember/__init__.py)
import torch
from torch import nn

from benchkit import json_line
from ember import allocator
from ember.models.base import ModelInputs
from ember.models.dlrm import DLRM, DLRMConfig
from ember.models.layers.interaction import DotInteraction
from ember.train.builder import make_dense_optimizer
from ember.train.config import DenseOptimizerConfig

SHAPES = {  # bottom MLP, top MLP, embedding dim
    "dlrm26": ([512, 256, 16], [512, 256], 16),
    "mlperf": ([512, 256, 128], [1024, 1024, 512, 256], 128),
}
FEATURES, DENSE = 26, 13


def make(shape: str, autograd: bool, device: torch.device) -> tuple[DLRM, torch.optim.Optimizer]:
    """The shape's DLRM on ``device`` (seed 0: both copies start equal) and its dense optimizer;
    ``autograd``: every dot interaction through ``autograd_pairs``."""
    bottom, top, dim = SHAPES[shape]
    torch.manual_seed(0)
    model = DLRM(DLRMConfig(bottom_mlp=bottom, top_mlp=top),
                 ModelInputs(num_dense=DENSE, sparse_dims=[dim] * FEATURES, num_tasks=1)).to(device)
    if autograd:
        for layer in model.modules():
            if isinstance(layer, DotInteraction):
                layer.forward = layer.autograd_pairs  # type: ignore[method-assign]
    return model, make_dense_optimizer(model.parameters(), DenseOptimizerConfig(type="adagrad", lr=0.01))


def measure(shape: str, batch: int, steps: int, device: torch.device, warmup: int = 2) -> dict:
    """ms per step of the own and the autograd backward, and their paired ratio."""
    dim = SHAPES[shape][2]
    variants = {"own": make(shape, False, device), "autograd": make(shape, True, device)}
    g = torch.Generator().manual_seed(1)
    base = (torch.randn(FEATURES, batch, dim, generator=g) * 0.1).to(device)
    dense = torch.randn(batch, DENSE, generator=g).to(device)
    labels = torch.randint(0, 2, (batch, 1), generator=g).float().to(device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    times: dict[str, list[float]] = {k: [] for k in variants}
    for i in range(warmup + steps):
        for name in (("own", "autograd") if i % 2 else ("autograd", "own")):
            model, opt = variants[name]
            sync()
            start = time.perf_counter()
            emb = list(base.detach().requires_grad_().unbind(0))  # a fresh leaf a step, as pooled rows are
            loss = nn.functional.binary_cross_entropy_with_logits(model(dense, emb), labels)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sync()
            if i >= warmup:
                times[name].append(time.perf_counter() - start)
    ratio = statistics.median(a / o for a, o in zip(times["autograd"], times["own"]))
    ms = {k: statistics.median(v) * 1e3 for k, v in times.items()}
    print(f"{shape:7s} batch {batch:6d}, {steps} steps: own backward {ms['own']:.1f} ms, autograd's "
          f"{ms['autograd']:.1f} ms a step; autograd / own (paired) {ratio:.3f}x", flush=True)
    return {"ratio": ratio, "ms": ms, "batch": batch, "steps": steps}


def main() -> None:
    allocator.reexec_tuned([__file__, *sys.argv[1:]])  # as the ember command line runs (see ember/allocator.py)
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=40, help="timed steps of bench_dlrm's model")
    ap.add_argument("--mlperf-steps", type=int, default=10, help="timed steps of the MLPerf shape (0: skip it)")
    ap.add_argument("--batch", type=int, default=4096)
    ap.add_argument("--mlperf-batch", type=int, default=8192)
    ap.add_argument("--device", default="cpu", help="cpu or cuda (the models and batches on it)")
    args = ap.parse_args()
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("bench_interaction: error: --device cuda, but torch sees no CUDA device", file=sys.stderr)
        sys.exit(2)
    out = {"dlrm26": measure("dlrm26", args.batch, args.steps, device)}
    if args.mlperf_steps > 0:
        out["mlperf"] = measure("mlperf", args.mlperf_batch, args.mlperf_steps, device)
    record = {"bench": "interaction", **{f"{k}_own_vs_autograd": v["ratio"] for k, v in out.items()},
              "ms_per_step": {k: v["ms"] for k, v in out.items()},
              "batch": {k: v["batch"] for k, v in out.items()}, "torch_threads": torch.get_num_threads(),
              "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"}
    print(json_line(record))


if __name__ == "__main__":
    main()
