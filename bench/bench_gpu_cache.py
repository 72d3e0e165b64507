"""DLRM-26 on a GPU: ember with a device-resident cache vs ember with rows in host memory vs plain
PyTorch with every table in GPU memory, side by side in one process (paired, interleaved steps).

Workload as bench_dlrm.py (26 single-hot Zipf(1.1) features over 200 k IDs, dim 16, batch 4096,
row-wise Adagrad 0.05), model on the GPU. Variants:
  ember-cache  each table: a GPU cache of --cache-frac of its IDs (LFU, admit after 1) in front
               of host memory: hits are gathered, pooled and updated on the GPU
  ember-host   each table all in host memory (rows cross to the GPU and gradients back)
  plain-gpu    nn.EmbeddingBag(sparse=True) per table on the GPU + torch.optim.Adagrad
Also reports the cache's host<->device row traffic against (misses + evictions) x record bytes.
Needs CUDA.

    python bench/bench_gpu_cache.py [--steps 60] [--warmup 20] [--cache-frac 0.25]
"""

from __future__ import annotations

import argparse
import statistics
import time

import ember  # noqa: F401  # first: before torch loads (GOMP_SPINCOUNT)

import torch
from torch import nn

from bench_dlrm import D, F, V, make_batches, make_model
from ember.batch import SparseFeatures
from ember.embedding import EmbeddingCollection, FeatureConfig, SparseOptimizer, TableConfig


class EmberGPU:
    def __init__(self, name: str, cache_rows: int | None) -> None:
        self.name = name
        storage = {} if cache_rows is None else {"storage": {"device_rows": cache_rows, "device": "cuda", "admit_after": 1}}
        names = [f"C{i + 1}" for i in range(F)]
        tables = [TableConfig(name=n, dim=D, optimizer={"type": "rowwise_adagrad", "lr": 0.05}, **storage) for n in names]
        self.ec = EmbeddingCollection(tables, [FeatureConfig(name=n) for n in names]).to("cuda")
        self.keys = names
        self.model = make_model(0).cuda()
        self.opt = torch.optim.Adagrad(self.model.parameters(), lr=0.01)
        self.sparse_opt = SparseOptimizer(self.ec)
        self.moved, self.expected, self.hits, self.requests = [], [], 0.0, 0.0

    def step(self, ids, dense, labels) -> None:
        sf = SparseFeatures(self.keys, ids.reshape(-1), torch.ones(ids.numel(), dtype=torch.int64))
        emb = self.ec(sf)
        loss = nn.functional.binary_cross_entropy_with_logits(self.model(dense, [emb[k] for k in self.keys]), labels)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()
        self.sparse_opt.step()
        torch.cuda.synchronize()

    def account(self) -> None:
        moved = expected = 0.0
        for t in self.ec.tables.values():
            s = t.stats()
            moved += s["transfer_bytes"]
            if "tier.device.requests" in s:
                miss = s["tier.device.requests"] - s["tier.device.hits"]
                expected += (miss + s["tier.device.demotions"] + s["tier.device.bypasses"]) * 4 * t.config.stored_words
                self.hits += s["tier.device.hits"]
                self.requests += s["tier.device.requests"]
            t.reset_step_stats()
        self.moved.append(moved)
        self.expected.append(expected)


class PlainGPU:
    name = "plain-gpu"

    def __init__(self) -> None:
        torch.manual_seed(1)
        self.bags = nn.ModuleList([nn.EmbeddingBag(V, D, mode="sum", sparse=True) for _ in range(F)]).cuda()
        self.model = make_model(0).cuda()
        self.sparse_opt = torch.optim.Adagrad(list(self.bags.parameters()), lr=0.05)
        self.opt = torch.optim.Adagrad(self.model.parameters(), lr=0.01)

    def step(self, ids, dense, labels) -> None:
        emb = [bag(ids[f].unsqueeze(1)) for f, bag in enumerate(self.bags)]
        loss = nn.functional.binary_cross_entropy_with_logits(self.model(dense, emb), labels)
        self.opt.zero_grad(set_to_none=True)
        self.sparse_opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()
        self.sparse_opt.step()
        torch.cuda.synchronize()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--batch", type=int, default=4096)
    ap.add_argument("--cache-frac", type=float, default=0.25)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench_gpu_cache.py needs CUDA")
    n = args.steps + args.warmup
    batches = [(i.cuda(), d.cuda(), l.cuda()) for i, d, l in make_batches(n, args.batch)]
    cache = EmberGPU("ember-cache", int(V * args.cache_frac))
    variants = [cache, EmberGPU("ember-host", None), PlainGPU()]
    times = {v.name: [] for v in variants}
    for i, (ids, dense, labels) in enumerate(batches):
        k = i % len(variants)
        for v in variants[k:] + variants[:k]:
            s = time.perf_counter()
            v.step(ids.cpu() if isinstance(v, EmberGPU) else ids, dense, labels)
            e = time.perf_counter() - s
            if isinstance(v, EmberGPU):
                v.account()
            if i >= args.warmup:
                times[v.name].append(e)
    ratio = lambda ref, var: statistics.median(r / x for r, x in zip(times[ref], times[var]))  # noqa: E731
    w = args.warmup
    moved, expected = sum(cache.moved[w:]), sum(cache.expected[w:])
    print(f"{torch.cuda.get_device_name()}; {F} tables x {V} IDs, cache {int(V * args.cache_frac)} rows/table")
    for k, v in times.items():
        print(f"{k:<12} {statistics.median(v) * 1e3:8.2f} ms/step  ({args.batch / statistics.median(v):,.0f} samples/s)")
    out = {
        "bench": "gpu_cache", "device": torch.cuda.get_device_name(), "batch": args.batch, "steps": args.steps,
        "ms_per_step": {k: statistics.median(v) * 1e3 for k, v in times.items()},
        "cache_vs_host": ratio("ember-host", "ember-cache"), "cache_vs_plain_gpu": ratio("plain-gpu", "ember-cache"),
        "cache_hit_rate": cache.hits / max(cache.requests, 1),
        "transfer_mb_per_step": moved / args.steps / 2**20,
        "transfer_vs_misses_evictions": moved / expected if expected else float("nan"),
    }
    print(f"ember-cache vs ember-host speed: {out['cache_vs_host']:.3f}x; vs plain-gpu: {out['cache_vs_plain_gpu']:.3f}x")
    print(f"cache hit rate {out['cache_hit_rate']:.3f}; host<->device {out['transfer_mb_per_step']:.2f} MiB/step = "
          f"{out['transfer_vs_misses_evictions']:.3f} x (misses + evictions) x record bytes")
    from benchkit import json_line  # the machine (CPU model, bf16) in the final line
    print(json_line(out))


if __name__ == "__main__":
    main()
