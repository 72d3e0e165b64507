"""DLRM-26 step throughput, side by side in one process: ember vs plain PyTorch vs dense-only.

Workload: 26 single-hot sparse features, one table each, 200,000 distinct IDs per table
drawn from Zipf(1.1); 13 dense features; DLRM bottom 13-512-256-16, dim 16, dot interaction, top
512-256-1; batch 4096; row-wise Adagrad (lr 0.05) on embeddings, Adagrad (lr 0.01) on the MLPs.
Variants: (a) ember (dynamic tables, KeyIndex, sparse row-wise Adagrad), (b) plain PyTorch
(nn.EmbeddingBag(sparse=True) + torch.optim.Adagrad), (e) fused: plain PyTorch done as FBGEMM
does it, one table-batched weight for all 26 tables, deduplicated by one sort, exact row-wise
Adagrad written out on the unique rows (the strongest fixed-vocabulary baseline we can build
here; ember must also hash arbitrary IDs into a growing table), (f) ember-bf16: (a) with rows
stored in bf16 (stochastic rounding) and, where the CPU has AVX512-BF16 or AMX (``--bf16-dense
auto``; ``cpu_bf16`` in the JSON says), the dense model under bf16 autocast, (c) dense-only (embedding outputs given
as a fixed tensor: the ceiling of this model on this machine), (d) ember with a different
initializer scale per table (three distinct ones): ``mixed_init_cost`` is the paired ratio of
its plan+fetch time to (a)'s, i.e. what per-table init settings cost the one grouped path,
(g) dense-only under ember-bf16's autocast (``ember_bf16_vs_dense_bf16``: the same comparison as
``ember_vs_dense`` when both dense steps are bf16; fp32 where the CPU has no bf16), (i) ember's
default on this CPU: fp32 rows, the dense model in what ``train.precision: auto`` picks (bf16
under ``--bf16-dense auto`` on a bf16 CPU), against (g) (``ember_default_vs_dense_bf16``).
(h) dense-only, fp32 and under (g)'s autocast, with the embeddings as a leaf that requires a
gradient: the step also computes the loss's gradient with respect to every embedding, which the
dense model owes any system that trains embeddings (``ember_vs_dense_grad``,
``ember_bf16_vs_dense_bf16_grad``; ``dense_grad_vs_dense`` is what that gradient costs). The
plain dense-only figures stay the headline ratios' reference; these say how much of their gap
is the dense model's own backward to its inputs rather than ember's sparse path.
All variants share one process and so one runtime setting (GOMP_SPINCOUNT, printed).
Method (../shared/BENCHMARKING.md): batches generated before timing; step i of every variant
runs back to back with a rotating order; we report the median over steps of the paired ratios
t(ref, i) / t(variant, i), and absolute medians with min-max.

    python bench/bench_dlrm.py [--steps 40] [--warmup 5] [--batch 4096] [--disk DIR]

Options (defaults keep the workload above, so earlier figures stay comparable): ``--reference``
(ReLU after the bottom MLP), ``--signal`` (labels from hidden per-ID effects of 8 features plus a
dense one), ``--multi-hot 3`` (3 IDs per feature, bags summed), ``--kaggle-sizes [--cap N]``
(Criteo-Kaggle's 26 table sizes, each capped at N).

The last line is one JSON object: ember_vs_dense, ember_vs_plain, mixed_init_cost, ember_vs_fused,
bf16_vs_fused, ember_bf16_vs_dense_bf16, ember_default_vs_dense_bf16, ...; ``ember_vs_fused_ceiling``
(fused's step time over dense-only's) is the most ``ember_vs_fused`` can be on this machine, the
value it would take if ember's sparse path cost nothing.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
import resource
import statistics
import time

import sys

import ember  # noqa: F401  # first: before torch loads, it shortens libgomp's spin-wait (see ember/__init__.py)

import os

import numpy as np
import torch
from torch import nn

from ember import allocator
from ember.batch import SparseFeatures
from ember.embedding import EmbeddingCollection, FeatureConfig, SparseOptimizer, TableConfig
from ember.models.dlrm import DLRM, DLRMConfig
from ember.models.base import ModelInputs
from ember.mix import mix64
from ember.optim import RowWiseAdagrad
from ember.train.builder import make_dense_optimizer
from ember.train.config import DenseOptimizerConfig
from ember.train.precision import autocast

from benchkit import timed_ember_step  # (after ember: benchkit imports it first too)

F, V, D, DENSE = 26, 200_000, 16, 13
# Criteo-Kaggle's per-feature cardinalities (--kaggle-sizes, capped by --cap)
KAGGLE = [1460, 583, 10131227, 2202608, 305, 24, 12517, 633, 3, 93145, 5683, 8351593, 3194, 27, 14992, 5461306,
          10, 5652, 2173, 4, 7046547, 18, 15, 286181, 105, 142572]


@dataclass
class Workload:
    """The default run (kept so earlier figures stay comparable) or the options' variations."""

    vocab: list[int] = field(default_factory=lambda: [V] * F)  # IDs per table
    hot: int = 1  # IDs per feature per sample (multi-hot bags summed)
    reference: bool = False  # the reference DLRM: ReLU after the bottom MLP
    signal: bool = False  # labels from hidden per-ID effects (else 25 % positives at random)


W = Workload()


def zipf_ids(rng: np.random.Generator, n: int, cdf: np.ndarray) -> np.ndarray:
    """Ranks 0..vocab-1 with P(r) ~ (r+1)^-s, by inverse CDF (``zipf_cdf``) of the exact finite law."""
    return np.minimum(np.searchsorted(cdf, rng.random(n)), cdf.size - 1)


def zipf_cdf(vocab: int, s: float = 1.1) -> np.ndarray:
    w = 1.0 / np.arange(1, vocab + 1) ** s
    return np.cumsum(w) / w.sum()


def make_batches(n_batches: int, batch: int, seed: int = 0, zipf: float = 1.1):
    """Batches of ``(ids [F, B*hot], dense [B, 13], labels [B, 1])``; feature f's IDs are the B
    samples' bags one after another, Zipf(``zipf``) over each table's vocabulary."""
    rng = np.random.default_rng(seed)
    perm = [rng.permutation(v) for v in W.vocab]  # hot IDs scattered over the vocabulary
    cdfs = {v: zipf_cdf(v, zipf) for v in set(W.vocab)}
    out = []
    for _ in range(n_batches):
        ids = np.stack([perm[f][zipf_ids(rng, batch * W.hot, cdfs[v])] for f, v in enumerate(W.vocab)])
        dense = torch.from_numpy(rng.random((batch, DENSE), dtype=np.float32))
        if W.signal:  # Bernoulli(sigmoid(score)): hidden N(0, 1) effects of the IDs of 8 features
            eff = mix64((ids[:8].astype(np.int64) * 7919 + np.arange(8)[:, None]).view(np.uint64))
            z = (eff >> np.uint64(11)).astype(np.float64) / 2.0**53  # uniform [0, 1)
            effects = np.sqrt(2) * torch.erfinv(torch.from_numpy(2 * np.clip(z, 1e-9, 1 - 1e-9) - 1)).numpy()
            score = 0.8 * effects.reshape(8, batch, W.hot).mean(-1).sum(0) / np.sqrt(8)
            score = score + 1.5 * (dense[:, 0].numpy() - 0.5) - 1.3
            labels = torch.from_numpy((rng.random(batch) < 1 / (1 + np.exp(-score))).astype(np.float32)[:, None])
        else:
            labels = torch.from_numpy((rng.random((batch, 1)) < 0.25).astype(np.float32))
        out.append((torch.from_numpy(ids), dense, labels))
    return out


def dense_optimizer(model: nn.Module) -> torch.optim.Optimizer:
    """Every variant's dense optimizer, Adagrad lr 0.01, as ember's trainer builds it
    (``make_dense_optimizer``: torch's fused kernel on CPU): one dense step for all."""
    return make_dense_optimizer(model.parameters(), DenseOptimizerConfig(type="adagrad", lr=0.01))


def make_model(seed: int) -> DLRM:
    torch.manual_seed(seed)
    cfg = DLRMConfig(bottom_mlp=[512, 256, D], top_mlp=[512, 256],
                     bottom_final_activation="relu" if W.reference else "identity")
    return DLRM(cfg, ModelInputs(num_dense=DENSE, sparse_dims=[D] * F, num_tasks=1))


class Ember:
    """ember's step: plan + fetch (dedupe, index probes, row reads), pool + model forward/backward +
    dense step, then the sparse optimizer's step (update + write back)."""

    def __init__(self, mixed_init: bool = False, disk: str | None = None, bf16: bool = False,
                 bf16_dense: bool = False, name: str | None = None, min_count: int = 1) -> None:
        self.name = name or ("ember-mixed-init" if mixed_init else "ember-bf16" if bf16 else "ember")
        self.precision = "bf16" if bf16_dense else "fp32"  # the dense model's autocast (rows: dtype bf16 when ``bf16``)
        names = [f"C{i + 1}" for i in range(F)]
        self.keys = names
        opt = RowWiseAdagrad(lr=0.05)

        def extra(i: int, n: str) -> dict:
            out: dict = {}
            if mixed_init:  # three initializer scales over the tables: three init calls per fetch
                out["initializer"] = {"type": "uniform", "scale": (0.5, 1.0, 2.0)[i % 3] * D**-0.5}
            if bf16:  # rows stored in bf16, written back with stochastic rounding
                out["dtype"] = "bf16"
            if min_count > 1:  # IDs seen fewer times read a shared zero row (bench_own_work.py --min-count)
                out["min_count"] = min_count
            if disk is not None:  # a host cache of vocab/16 rows per table in front of a disk tier
                path = f"{disk}/{self.name}/{n}"
                out["storage"] = {"host_rows": max(W.vocab[i] // 16, 1), "policy": "lfu", "admit_after": 2,
                                  "disk_path": path, "disk_rows": W.vocab[i]}
            return out

        tables = [TableConfig(name=n, dim=D, optimizer=opt, **extra(i, n)) for i, n in enumerate(names)]
        self.ec = EmbeddingCollection(tables, [FeatureConfig(name=n) for n in names])
        assert len(self.ec.groups) == 1, "the 26 tables must form one group"
        self.sparse_opt = SparseOptimizer(self.ec)
        self.model = make_model(0)
        self.opt = dense_optimizer(self.model)
        self.split = {"plan+fetch": [], "fwd/bwd+dense": [], "sparse step": []}
        self.lengths = None

    def features(self, ids) -> SparseFeatures:
        b = ids.shape[1] // W.hot
        if self.lengths is None or self.lengths.numel() != F * b:
            self.lengths = torch.full((F * b,), W.hot, dtype=torch.int64)
        return SparseFeatures(self.keys, ids.reshape(-1), self.lengths)

    def step(self, ids, dense, labels) -> float:
        return timed_ember_step(self, self.features(ids), dense, labels)

    def index_bytes_per_row(self) -> float:
        rows = sum(len(t) for t in self.ec.tables.values())
        if not all(hasattr(t.tier, "index_bytes") for t in self.ec.tables.values()):
            return float("nan")  # tiered tables: see bench_tiers.py for their RAM per row
        return sum(t.tier.index_bytes for t in self.ec.tables.values()) / max(rows, 1)


class Plain:
    name = "plain"

    def __init__(self) -> None:
        torch.manual_seed(1)
        self.bags = nn.ModuleList([nn.EmbeddingBag(v, D, mode="sum", sparse=True) for v in W.vocab])
        for bag in self.bags:
            nn.init.uniform_(bag.weight, -D**-0.5, D**-0.5)
        self.model = make_model(0)
        self.sparse_opt = torch.optim.Adagrad(list(self.bags.parameters()), lr=0.05)
        self.opt = dense_optimizer(self.model)

    def step(self, ids, dense, labels) -> float:
        emb = [bag(ids[f].view(-1, W.hot)) for f, bag in enumerate(self.bags)]
        logits = self.model(dense, emb)
        loss = nn.functional.binary_cross_entropy_with_logits(logits, labels)
        self.opt.zero_grad(set_to_none=True)
        self.sparse_opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()
        self.sparse_opt.step()
        return float(loss.detach())


class Fused:
    """The strongest plain-PyTorch baseline here (FBGEMM's table-batched approach, written out):
    one fused ``[F*V, D]`` weight with a row offset per table, the batch's IDs deduplicated by one
    sort (``torch.unique``), their rows gathered once, and an exact row-wise Adagrad applied to the
    unique rows in place (``G += mean(g^2)``, ``w -= lr*g/(sqrt(G)+eps)``), no sparse COO tensors."""

    name = "fused"

    def __init__(self, lr: float = 0.05, eps: float = 1e-10) -> None:
        torch.manual_seed(3)
        rows = sum(W.vocab)
        self.weight = torch.empty(rows, D).uniform_(-D**-0.5, D**-0.5)
        self.state = torch.zeros(rows)
        self.offsets = torch.tensor([0, *np.cumsum(W.vocab)[:-1]], dtype=torch.int64).unsqueeze(1)
        self.lr, self.eps = lr, eps
        self.model = make_model(0)
        self.opt = dense_optimizer(self.model)

    def step(self, ids, dense, labels) -> float:
        uniq, inv = torch.unique((ids + self.offsets).reshape(-1), return_inverse=True)
        rows = self.weight.index_select(0, uniq).requires_grad_()
        emb = nn.functional.embedding(inv.view(F, -1, W.hot), rows).sum(2)  # [F, B, D]: bags summed
        logits = self.model(dense, list(emb.unbind(0)))
        loss = nn.functional.binary_cross_entropy_with_logits(logits, labels)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()
        with torch.no_grad():
            g = rows.grad
            acc = self.state.index_select(0, uniq).add_(g.square().mean(dim=1))
            self.state.index_copy_(0, uniq, acc)
            self.weight.index_copy_(0, uniq, rows.detach().addcdiv_(g, acc.sqrt().add_(self.eps).unsqueeze(1), value=-self.lr))
        return float(loss.detach())


class DenseOnly:
    """The dense model's step alone on fixed embeddings (``precision`` bf16: under the autocast
    ember-bf16's dense model runs in, the baseline of ``ember_bf16_vs_dense_bf16``).

    ``input_grads``: the embeddings are one leaf [F, B, D] that requires a gradient (unbound
    per feature, as ember's pooling hands them over), so the step also computes what the dense
    model owes any embedding trainer: the gradient of the loss with respect to each embedding
    (the interaction's and the concatenation's backward to their inputs). Without it the step
    is the model's ceiling with frozen embeddings; with it, the ceiling of any system that
    trains them (``*_grad`` ratios)."""

    def __init__(self, batch: int, precision: str = "fp32", name: str = "dense-only", input_grads: bool = False) -> None:
        self.name, self.precision, self.input_grads = name, precision, input_grads
        torch.manual_seed(2)
        self.base = torch.randn(F, batch, D) * 0.1
        self.emb = list(self.base.unbind(0))
        self.model = make_model(0)
        self.opt = dense_optimizer(self.model)

    def step(self, ids, dense, labels) -> float:
        emb = self.emb
        if self.input_grads:  # a fresh leaf per step, as each batch's pooled rows are
            emb = list(self.base.detach().requires_grad_().unbind(0))
        with autocast(torch.device("cpu"), self.precision):
            logits = self.model(dense, emb)
        loss = nn.functional.binary_cross_entropy_with_logits(logits.float(), labels)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()
        return float(loss.detach())


def cpu_bf16() -> str:
    """What the CPU offers for bf16 math (from /proc/cpuinfo): AMX, AVX512-BF16, or neither."""
    try:
        flags = open("/proc/cpuinfo").read()
    except OSError:
        return "unknown"
    return "amx_bf16" if "amx_bf16" in flags else "avx512_bf16" if "avx512_bf16" in flags else "none"


def main() -> None:
    allocator.reexec_tuned([__file__, *sys.argv[1:]])  # as the ember command line runs (see ember/allocator.py)
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--batch", type=int, default=4096)
    ap.add_argument("--bf16-dense", choices=["auto", "on", "off"], default="auto",
                    help="ember-bf16's dense model under bf16 autocast (auto: where the CPU has AVX512-BF16 or AMX; "
                         "elsewhere bf16 matmuls are emulated, ~10x slower)")
    ap.add_argument("--disk", default=None, help="ember's tables: host cache of vocab/16 rows + disk tier under this dir")
    ap.add_argument("--reference", action="store_true", help="the reference DLRM (ReLU after the bottom MLP)")
    ap.add_argument("--signal", action="store_true", help="labels with real signal (hidden per-ID effects)")
    ap.add_argument("--multi-hot", type=int, default=1, help="IDs per feature per sample (bags summed)")
    ap.add_argument("--kaggle-sizes", action="store_true", help="Criteo-Kaggle's table sizes, capped by --cap")
    ap.add_argument("--cap", type=int, default=1_000_000, help="largest table with --kaggle-sizes")
    args = ap.parse_args()
    global W
    W = Workload([min(v, args.cap) for v in KAGGLE] if args.kaggle_sizes else [V] * F, args.multi_hot,
                 args.reference, args.signal)
    print(f"workload: {F} tables ({sum(W.vocab):,} IDs in all), {W.hot} ID(s) per feature, "
          f"{'reference (ReLU bottom)' if W.reference else 'identity bottom'}, labels {'with' if W.signal else 'without'} signal")
    n = args.steps + args.warmup
    t0 = time.perf_counter()
    batches = make_batches(n, args.batch)
    spin = os.environ.get("GOMP_SPINCOUNT", "libgomp default")
    print(f"generated {n} batches in {time.perf_counter() - t0:.1f}s; torch threads={torch.get_num_threads()}; GOMP_SPINCOUNT={spin}")
    bf16_dense = {"on": True, "off": False, "auto": cpu_bf16() != "none"}[args.bf16_dense]
    print(f"ember-bf16: bf16 rows, dense model in {'bf16 (autocast)' if bf16_dense else 'fp32'} "
          f"(--bf16-dense {args.bf16_dense}; this CPU's bf16 support: {cpu_bf16()})")
    variants = [Ember(disk=args.disk), Plain(), DenseOnly(args.batch), Ember(mixed_init=True, disk=args.disk), Fused(),
                Ember(disk=args.disk, bf16=True, bf16_dense=bf16_dense),
                DenseOnly(args.batch, "bf16" if bf16_dense else "fp32", "dense-only-bf16" if bf16_dense else "dense-only-2"),
                DenseOnly(args.batch, input_grads=True, name="dense+grad"),
                DenseOnly(args.batch, "bf16" if bf16_dense else "fp32", "dense-bf16+grad" if bf16_dense else "dense-2+grad",
                          input_grads=True),
                # (i): fp32 rows, dense as train.precision: auto (fp32 without bf16)
                Ember(disk=args.disk, bf16_dense=bf16_dense, name="ember-default")]
    times = {v.name: [] for v in variants}
    faults = {v.name: [] for v in variants}  # minor page faults per step (see ember/allocator.py)
    # the two ember variants run back to back (their plan+fetch times are compared, ~6 ms each:
    # adjacent runs see the same machine state), alternating which goes first; the slots of
    # (ember pair, plain, dense-only) rotate
    slots = [[variants[0], variants[3]], [variants[1]], [variants[2], variants[7]], [variants[4]],
             [variants[5], variants[6], variants[8], variants[9]]]
    for i, (ids, dense, labels) in enumerate(batches):
        k = i % len(slots)
        order = [v for slot in slots[k:] + slots[:k] for v in (slot if i % 2 else slot[::-1])]
        for v in order:
            f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            s = time.perf_counter()
            v.step(ids, dense, labels)
            e = time.perf_counter() - s
            if i >= args.warmup:
                times[v.name].append(e)
                faults[v.name].append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)
    ours, mixed = variants[0], variants[3]
    for v in (ours, mixed):
        for k in v.split:
            v.split[k] = v.split[k][args.warmup :]
    med = {k: statistics.median(v) for k, v in times.items()}
    ratio = lambda ref, var: statistics.median(r / x for r, x in zip(times[ref], times[var]))  # noqa: E731
    r_plain = ratio("plain", "ember")
    r_dense = ratio("dense-only", "ember")
    r_plain_dense = ratio("dense-only", "plain")
    r_fused = ratio("fused", "ember")
    r_fused_dense = ratio("dense-only", "fused")
    r_fused_ceiling = ratio("fused", "dense-only")  # ember_vs_fused if ember's step cost what dense-only's does
    r_bf16_fused = ratio("fused", "ember-bf16")
    r_bf16_dense = ratio(variants[6].name, "ember-bf16")
    r_dense_grad = ratio("dense+grad", "ember")
    r_bf16_dense_grad = ratio(variants[8].name, "ember-bf16")
    r_default_dense = ratio(variants[6].name, "ember-default")
    r_grad_cost = ratio("dense-only", "dense+grad")
    mixed_cost = statistics.median(m / u for m, u in zip(mixed.split["plan+fetch"], ours.split["plan+fetch"]))
    pf = {k: statistics.median(v) for k, v in faults.items()}
    tunables = os.environ.get("GLIBC_TUNABLES", "none (glibc defaults)")
    print(f"\nallocator tunables: {tunables}")
    print(f"{'variant':<17}{'samples/s median':>18}{'min':>10}{'max':>10}{'ms/step':>10}{'faults/step':>13}")
    for k, v in times.items():
        sps = [args.batch / x for x in v]
        print(f"{k:<17}{args.batch / med[k]:>18.0f}{min(sps):>10.0f}{max(sps):>10.0f}{med[k] * 1e3:>10.1f}{pf[k]:>13.0f}")
    print(f"\npaired ratios (median over {args.steps} steps):")
    print(f"  ember / plain PyTorch speed : {r_plain:.3f}x  (target >= 1.2)")
    print(f"  ember / dense-only speed    : {r_dense:.3f}x  (target >= 0.95, issue 29)")
    print(f"  ember / fused baseline speed: {r_fused:.3f}x  (target >= 1.15, issue 29; at most {r_fused_ceiling:.3f}x here: "
          f"fused / dense-only's inverse, ember with a sparse path that cost nothing)")
    print(f"  ember bf16 / fused speed    : {r_bf16_fused:.3f}x  (target >= 1.3; bf16 rows, dense {'bf16' if bf16_dense else 'fp32'})")
    print(f"  ember bf16 / dense-only bf16: {r_bf16_dense:.3f}x  (target >= 0.9; both dense steps {'bf16' if bf16_dense else 'fp32'})")
    print(f"  ember default / dense-only {'bf16' if bf16_dense else 'fp32'}: {r_default_dense:.3f}x  (fp32 rows, dense as "
          f"train.precision: auto)")
    print(f"  ember / dense-only speed, both computing the embeddings' gradient: {r_dense_grad:.3f}x "
          f"(bf16: {r_bf16_dense_grad:.3f}x); dense+grad / dense-only: {r_grad_cost:.3f}x")
    print(f"  plain / dense-only speed    : {r_plain_dense:.3f}x")
    print(f"  fused / dense-only speed    : {r_fused_dense:.3f}x")
    print(f"  plan+fetch, mixed / uniform init scales: {mixed_cost:.3f}x  (target <= 1.03)")
    split = {k: statistics.median(v) * 1e3 for k, v in ours.split.items()}
    print("ember time split (ms, median): " + ", ".join(f"{k} {v:.1f}" for k, v in split.items()))
    rows = sum(len(t) for t in ours.ec.tables.values())
    per_row = ours.index_bytes_per_row()
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"ember rows: {rows}, index bytes/row: {per_row:.1f} (target <= 32), record bytes/row: {(D + 1) * 4}")
    print(f"peak RSS (whole process, all variants): {rss_mb:.0f} MB")
    from benchkit import json_line  # the machine (CPU model, bf16) in the final line
    print(json_line({
        "bench": "dlrm26", "batch": args.batch, "steps": args.steps,
        "samples_per_s": {k: args.batch / v for k, v in med.items()},
        "ember_vs_dense": r_dense, "ember_vs_plain": r_plain, "mixed_init_cost": mixed_cost, "plain_vs_dense": r_plain_dense,
        "ember_vs_fused": r_fused, "fused_vs_dense": r_fused_dense, "ember_vs_fused_ceiling": r_fused_ceiling,
        "bf16_vs_fused": r_bf16_fused,
        "ember_bf16_vs_dense_bf16": r_bf16_dense, "ember_default_vs_dense_bf16": r_default_dense,
        "ember_vs_dense_grad": r_dense_grad, "ember_bf16_vs_dense_bf16_grad": r_bf16_dense_grad,
        "dense_grad_vs_dense": r_grad_cost,
        "cpu_bf16": cpu_bf16(), "bf16_dense": bf16_dense,
        "ember_split_ms": split, "index_bytes_per_row": per_row, "rows": rows, "peak_rss_mb": rss_mb,
        "torch_threads": torch.get_num_threads(), "gomp_spincount": spin,
        "page_faults_per_step": pf, "glibc_tunables": os.environ.get("GLIBC_TUNABLES"),
        "workload": {"table_rows": sum(W.vocab), "multi_hot": W.hot, "reference": W.reference, "signal": W.signal},
    }))


if __name__ == "__main__":
    main()
