"""The MLPerf DLRM shape on ember, per physical core, beside Intel's MLPerf Training v0.7 CPU result.

Workload (MLPerf Training DLRM, Criteo 1TB): 13 dense features, 26 single-hot sparse features with
one table each, dim 128, bottom MLP 13-512-256-128 (ReLU throughout, as the reference), dot
interaction, top MLP 1024-1024-512-256-1; plain SGD on the embeddings and on the MLPs (as the
reference and Intel's submission; lr 0.05 here, since the labels are random). IDs follow Zipf(1.1)
over each table's MLPerf size (the Criteo 1TB tables with the reference's 40 M cap), capped at
``--max-rows``; the hot ranks are scattered over the vocabulary. Batch 32,768, MLPerf's and Intel's:
it fits a 24 GiB machine with the default cap (peak RSS 13.9 GB for ember and plain over the default
14 steps, 2026-11-29: plain's 6.7 GB of fixed tables, ember's rows within ``--ram-gib``, the
activations), so no smaller batch is needed.

ember's tables are sized by a RAM budget (``--ram-gib``, for ember's rows): the smallest tables,
whole, while they fit; every larger one gets a host cache (LFU, an equal share of the rest of the
budget) in front of a disk tier under ``--disk`` sized for its full (capped) vocabulary, as
bench_dlrm.py ``--disk`` and bench_tiers.py configure tiers. Rows are created when an ID is first
seen (no preload), as in a first epoch.

Variants, one process, the same pre-generated batches, step i of each back to back in a rotating
order (../shared/BENCHMARKING.md):
  ember       fp32 rows, dense model in fp32;
  ember-bf16  bf16 rows (stochastic rounding) and the dense model under bf16 autocast, as
              ``train.precision: bf16`` runs it (``ember.train.precision.autocast``);
  plain       the strongest plain-PyTorch baseline here (``--baseline``): ``fused``, FBGEMM's
              table-batched approach written out (one ``[sum V, 128]`` weight, the batch's IDs
              deduplicated by one sort, SGD applied in place on the unique rows), or ``bags``
              (one ``nn.EmbeddingBag(sparse=True)`` per table + ``torch.optim.SGD``, slower:
              ember / bags 1.23x where ember / fused was 1.06x at batch 8,192); the same model
              class, so the same MLPs and dot interaction;
  plain-bf16  plain with the dense model under bf16 autocast; it trains plain's fp32 tables (one
              copy in RAM; a step does the same work whichever variant last wrote the rows).
Figures: medians over steps with min-max, and the paired ratios ``ember_vs_plain`` (fp32) and
``ember_bf16_vs_plain_bf16``: the median over steps of t(plain, i) / t(ember, i).

Per core: samples/s divided by this machine's physical cores (``lscpu``: sockets x cores per
socket; a VM's vCPUs may still be SMT siblings on the host, which the guest cannot see).
Intel's MLPerf Training v0.7 result: 1 node, 4-socket Cooper Lake (Xeon Platinum 8380H, 4 x 28 =
112 cores), bf16 + IPEX, 68.97 ms per step at batch 32,768 = 475,000 samples/s, ~4,241 per core.
``per_core_vs_intel`` compares ember's bf16 figure with it (the issue's target: >= 2 on a CPU with
AMX); on a CPU without native bf16 (neither AMX-BF16 nor AVX512-BF16) the bf16 figure is measured
but marked as no target (``bf16_is_target``), since bf16 matmuls are emulated there; by default
(``--bf16 auto``) the two bf16 variants run only where the CPU computes bf16 natively: emulated on
an AVX2-only CPU a bf16 step took 178 s against ember's 8.6 s in fp32, so a default run there would
take over an hour (``--bf16 always`` measures them anyway; their JSON figures are null when skipped).

    python bench/bench_mlperf.py [--batch 32768] [--steps 12] [--warmup 2] [--max-rows 2000000]
                                 [--ram-gib 2] [--disk DIR] [--baseline fused|bags] [--bf16 auto|always|never]

The default run takes about 5 minutes on 2 shared vCPUs without native bf16 (AMD EPYC, AVX2 only:
274 s measured, ember and plain in fp32; 415 s with the bf16 variants on an AMD box with AVX-512);
the last line printed is one JSON
object with the headline figures (samples_per_s_fp32, samples_per_s_bf16, per_core_fp32,
per_core_bf16, per_core_vs_intel, ember_vs_plain, batch, physical_cores, machine, ...).
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from math import gcd
from pathlib import Path
from typing import Any, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's ember, not an installed one
sys.path.insert(1, str(Path(__file__).resolve().parent))  # benchkit, also when run as a module

import ember  # noqa: E402,F401  # first: before torch loads, it shortens libgomp's spin-wait (see ember/__init__.py)

import numpy as np  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402

from ember import allocator  # noqa: E402
from ember.batch import SparseFeatures  # noqa: E402
from ember.embedding import EmbeddingCollection, FeatureConfig, SparseOptimizer, TableConfig  # noqa: E402
from ember.models.base import ModelInputs  # noqa: E402
from ember.models.dlrm import DLRM, DLRMConfig  # noqa: E402
from ember.optim import SGD  # noqa: E402
from ember.train.precision import autocast, cpu_bf16  # noqa: E402

from benchkit import timed_ember_step  # noqa: E402

# MLPerf DLRM's Criteo 1TB table sizes (the reference's day_fea_count with --max-ind-range 40,000,000)
MLPERF_ROWS = [39884406, 39043, 17289, 7420, 20263, 3, 7120, 1543, 63, 38532951, 2953546, 403346, 10, 2208, 11938,
               155, 4, 976, 14, 39979771, 25641295, 39664984, 585935, 12972, 108, 36]
DIM, DENSE = 128, 13
BOTTOM, TOP = [512, 256, 128], [1024, 1024, 512, 256]  # the top MLP's 1-wide logit layer is DLRM's own
INTEL = {"samples_per_s": 475_000, "cores": 112, "per_core": 475_000 / 112, "precision": "bf16",
         "system": "MLPerf Training v0.7, Intel, 1 node 4-socket Cooper Lake (Xeon Platinum 8380H, 4x28 cores), "
                   "PyTorch + IPEX, batch 32,768, 68.97 ms/step"}
LR_SPARSE, LR_DENSE, ZIPF_S = 0.05, 0.05, 1.1
FEATURES = [f"C{i + 1}" for i in range(len(MLPERF_ROWS))]


def cpu_topology() -> dict[str, int]:
    """Sockets, cores per socket, threads per core and physical cores of the online CPUs, from
    ``lscpu`` (``os.cpu_count()`` and one thread per core where lscpu is missing)."""
    info: dict[str, str] = {}
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
        info = {k.strip(): v.strip() for k, _, v in (line.partition(":") for line in out.splitlines())}
    except (OSError, subprocess.CalledProcessError):
        pass
    cpus = os.cpu_count() or 1
    tpc = int(info.get("Thread(s) per core", 1))
    sockets, cps = int(info.get("Socket(s)", 1)), int(info.get("Core(s) per socket", cpus // tpc))
    return {"vcpus": cpus, "threads_per_core": tpc, "sockets": sockets, "cores_per_socket": cps,
            "physical_cores": max(min(sockets * cps, cpus // tpc), 1)}


def rss_mib() -> dict[str, float]:
    """This process's resident memory now (anonymous, file-backed: the disk tiers' mappings) and
    its peak, MiB (``/proc/self/status``; empty elsewhere)."""
    out: dict[str, float] = {}
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith(("VmHWM", "RssAnon", "RssFile")):
                    key, value = line.split(":")
                    out[key] = int(value.split()[0]) / 1024
    except OSError:
        pass
    return out


def zipf_ranks(rng: np.random.Generator, n: int, cdf: np.ndarray) -> np.ndarray:
    """``n`` ranks 0..V-1 with P(r) ~ (r+1)^-s, by inverse CDF of the exact finite law."""
    return np.minimum(np.searchsorted(cdf, rng.random(n)), cdf.size - 1)


def scatter(ranks: np.ndarray, vocab: int) -> np.ndarray:
    """Rank -> row in [0, vocab): ``(r * a + c) mod vocab`` with ``a`` coprime to ``vocab``, a
    permutation that spreads the hot ranks without materialising one (tables of 40 M rows)."""
    a = 2_654_435_761 % vocab or 1
    while gcd(a, vocab) != 1:
        a += 1
    return (ranks.astype(np.int64) * a + 12_345) % vocab


def make_batches(n: int, batch: int, vocab: Sequence[int], seed: int = 0) -> list[tuple[torch.Tensor, ...]]:
    """``n`` batches of ``(ids [F, B] int64 rows within each table, dense [B, 13], labels [B, 1])``."""
    rng = np.random.default_rng(seed)
    cdfs: dict[int, np.ndarray] = {}
    for v in sorted(set(vocab)):
        w = 1.0 / np.arange(1, v + 1, dtype=np.float64) ** ZIPF_S
        cdfs[v] = np.cumsum(w) / w.sum()
    out = []
    for _ in range(n):
        ids = np.stack([scatter(zipf_ranks(rng, batch, cdfs[v]), v) for v in vocab])
        dense = torch.from_numpy(rng.random((batch, DENSE), dtype=np.float32))
        labels = torch.from_numpy((rng.random((batch, 1)) < 0.25).astype(np.float32))
        out.append((torch.from_numpy(ids), dense, labels))
    return out


def make_model() -> DLRM:
    """The MLPerf DLRM (the same initial weights in every variant)."""
    torch.manual_seed(0)
    cfg = DLRMConfig(bottom_mlp=BOTTOM, top_mlp=TOP, bottom_final_activation="relu")
    return DLRM(cfg, ModelInputs(num_dense=DENSE, sparse_dims=[DIM] * len(FEATURES), num_tasks=1))


def storage_plan(vocab: Sequence[int], ram_bytes: float, record_bytes: int, disk: str | None) -> list[dict[str, Any] | None]:
    """Per table: None (all rows in host memory) or a ``storage`` section (host LFU cache + disk tier).

    Tables are taken smallest first and kept whole while their full vocabularies fit ``ram_bytes``;
    the rest share what is left equally as host caches in front of disk tiers under ``disk``.
    """
    order = sorted(range(len(vocab)), key=lambda i: vocab[i])
    used, k = 0.0, 0
    while k < len(order) and used + vocab[order[k]] * record_bytes <= ram_bytes:
        used += vocab[order[k]] * record_bytes
        k += 1
    tiered = order[k:]
    plan: list[dict[str, Any] | None] = [None] * len(vocab)
    if tiered and disk is None:
        raise SystemExit(f"{len(tiered)} tables do not fit --ram-gib; give --disk DIR for their disk tier")
    for i in tiered:
        host_rows = max(int((ram_bytes - used) / len(tiered) / record_bytes), 1024)
        plan[i] = {"host_rows": min(host_rows, vocab[i]), "policy": "lfu", "admit_after": 2,
                   "disk_path": str(disk), "disk_rows": vocab[i]}
    return plan


class Ember:
    """ember's step: plan + fetch (dedupe, index probes, row reads), pool + model forward/backward +
    dense SGD step, then the sparse SGD step (update + write back)."""

    def __init__(self, vocab: Sequence[int], ram_bytes: float, disk: Path | None, bf16: bool) -> None:
        self.name = "ember-bf16" if bf16 else "ember"
        self.precision = "bf16" if bf16 else "fp32"
        record = DIM * (2 if bf16 else 4)  # SGD keeps no state: a record is the row
        self.storage = storage_plan(vocab, ram_bytes, record, None if disk is None else str(disk / self.name))
        opt = SGD(lr=LR_SPARSE)
        tables = [TableConfig(name=n, dim=DIM, optimizer=opt, **({"dtype": "bf16"} if bf16 else {}),
                              **({"storage": s} if s else {}))
                  for n, s in zip(FEATURES, self.storage)]
        self.ec = EmbeddingCollection(tables, [FeatureConfig(name=n) for n in FEATURES])
        self.sparse_opt = SparseOptimizer(self.ec)
        self.model = make_model()
        self.opt = torch.optim.SGD(self.model.parameters(), lr=LR_DENSE)
        self.split: dict[str, list[float]] = {"plan+fetch": [], "fwd/bwd+dense": [], "sparse step": []}
        self.lengths: torch.Tensor | None = None

    def step(self, ids: torch.Tensor, dense: torch.Tensor, labels: torch.Tensor) -> float:
        if self.lengths is None or self.lengths.numel() != ids.numel():
            self.lengths = torch.ones(ids.numel(), dtype=torch.int64)
        return timed_ember_step(self, SparseFeatures(FEATURES, ids.reshape(-1), self.lengths), dense, labels)

    def reset_tier_stats(self) -> None:
        """Zero every table's tier counters (after the warm-up steps)."""
        for t in self.ec.tables.values():
            t.reset_step_stats()

    def tier_stats(self) -> dict[str, float | None]:
        """Rows held, and over the tiered tables since ``reset_tier_stats``: the share of lookups
        found in the host cache, and of those it missed, the share found on disk (the rest are
        IDs seen for the first time, whose rows are created)."""
        tiered = [self.ec.tables[n] for n, s in zip(FEATURES, self.storage) if s]
        out: dict[str, float | None] = {"rows": sum(len(t) for t in self.ec.tables.values()), "tiered_tables": len(tiered)}
        if not tiered:
            return out
        st = [t.tier.stats() for t in tiered]
        total = {k: sum(x.get(f"tier.{k}", 0.0) for x in st) for k in ("host.requests", "host.hits", "disk.requests", "disk.hits")}
        nan = None  # JSON has no NaN: no lookups, no rate
        return {**out, "tiered_rows": sum(len(t) for t in tiered),
                "host_cache_rows": sum(s["host_rows"] for s in self.storage if s),
                "host_hit_rate": total["host.hits"] / total["host.requests"] if total["host.requests"] else nan,
                "disk_hit_rate": total["disk.hits"] / total["disk.requests"] if total["disk.requests"] else nan}


class Plain:
    """Plain PyTorch, fixed vocabularies, SGD. ``fused``: one table-batched weight, IDs deduplicated
    by one sort, rows gathered once and updated in place (no sparse COO gradient); ``bags``: one
    ``nn.EmbeddingBag(sparse=True)`` per table and ``torch.optim.SGD``."""

    def __init__(self, vocab: Sequence[int], kind: str, bf16: bool, share: "Plain | None" = None) -> None:
        self.name = "plain-bf16" if bf16 else "plain"
        self.kind, self.precision = kind, "bf16" if bf16 else "fp32"
        torch.manual_seed(1)
        bound = DIM ** -0.5
        if share is not None:  # the other plain variant's tables: half the RAM, the same work per step
            self.__dict__.update({k: v for k, v in vars(share).items() if k in ("weight", "offsets", "bags")})
        elif kind == "fused":
            self.weight = torch.empty(sum(vocab), DIM).uniform_(-bound, bound)
            self.offsets = torch.tensor([0, *np.cumsum(vocab)[:-1]], dtype=torch.int64).unsqueeze(1)
        else:
            self.bags = nn.ModuleList([nn.EmbeddingBag(v, DIM, mode="sum", sparse=True) for v in vocab])
            for bag in self.bags:
                nn.init.uniform_(bag.weight, -bound, bound)
        if kind == "bags":
            self.sparse_opt = torch.optim.SGD(list(self.bags.parameters()), lr=LR_SPARSE)
        self.model = make_model()
        self.opt = torch.optim.SGD(self.model.parameters(), lr=LR_DENSE)

    def step(self, ids: torch.Tensor, dense: torch.Tensor, labels: torch.Tensor) -> float:
        if self.kind == "fused":
            uniq, inv = torch.unique((ids + self.offsets).reshape(-1), return_inverse=True)
            rows = self.weight.index_select(0, uniq).requires_grad_()
            emb = list(nn.functional.embedding(inv.view(ids.shape), rows).unbind(0))  # F x [B, D]
        else:
            emb = [bag(ids[f].view(-1, 1)) for f, bag in enumerate(self.bags)]
            self.sparse_opt.zero_grad(set_to_none=True)
        with autocast(torch.device("cpu"), self.precision):
            logits = self.model(dense, emb)
        loss = nn.functional.binary_cross_entropy_with_logits(logits.float(), labels)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()
        if self.kind == "fused":
            with torch.no_grad():
                self.weight.index_add_(0, uniq, rows.grad, alpha=-LR_SPARSE)
        else:
            self.sparse_opt.step()
        return float(loss.detach())


def main(argv: Sequence[str] | None = None) -> None:
    """Run the variants interleaved and print a table, then the JSON line."""
    allocator.reexec_tuned([__file__, *sys.argv[1:]])  # as the ember command line runs (see ember/allocator.py)
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", type=int, default=32768, help="MLPerf's and Intel's batch")
    ap.add_argument("--steps", type=int, default=12, help="timed steps per variant")
    ap.add_argument("--warmup", type=int, default=2, help="untimed steps per variant first")
    ap.add_argument("--max-rows", type=int, default=2_000_000, help="cap on every table's vocabulary (RAM)")
    ap.add_argument("--ram-gib", type=float, default=2.0, help="RAM budget for each ember variant's rows")
    ap.add_argument("--disk", default=None, help="disk tiers' directory (default: a temporary one, removed)")
    ap.add_argument("--baseline", choices=["fused", "bags"], default="fused", help="plain PyTorch variant")
    ap.add_argument("--no-plain-bf16", action="store_true", help="skip the plain-bf16 variant (shorter runs)")
    ap.add_argument("--bf16", choices=["auto", "always", "never"], default="auto",
                    help="the bf16 variants (ember-bf16, plain-bf16): auto runs them where the CPU computes bf16 "
                         "natively (AMX-BF16 or AVX512-BF16), always also where bf16 matmuls are emulated (on an "
                         "AVX2-only CPU ~20x slower than fp32: a default run would take over an hour)")
    args = ap.parse_args(argv)
    t_start = time.perf_counter()
    vocab = [min(v, args.max_rows) for v in MLPERF_ROWS]
    topo = cpu_topology()
    native = cpu_bf16()
    bf16 = args.bf16 == "always" or args.bf16 == "auto" and bool(native)
    disk = Path(tempfile.mkdtemp(prefix="ember-mlperf-", dir=args.disk))
    n = args.warmup + args.steps
    t0 = time.perf_counter()
    batches = make_batches(n, args.batch, vocab)
    print(f"MLPerf DLRM: 26 tables x dim {DIM} ({sum(vocab):,} rows after --max-rows {args.max_rows:,}; "
          f"uncapped {sum(MLPERF_ROWS):,}), bottom 13-{'-'.join(map(str, BOTTOM))}, top {'-'.join(map(str, TOP))}-1, "
          f"batch {args.batch:,}; {n} batches generated in {time.perf_counter() - t0:.1f}s")
    print(f"CPU: {topo['vcpus']} vCPUs, {topo['threads_per_core']} thread(s) per core -> {topo['physical_cores']} "
          f"physical core(s); native bf16: {', '.join(native) or 'none (bf16 figures are no target here)'}; "
          f"torch threads {torch.get_num_threads()}")
    if not bf16:
        print("bf16 variants skipped (--bf16 " + args.bf16 + ("" if args.bf16 == "never" else
              ": bf16 matmuls would be emulated on this CPU; --bf16 always runs them anyway") + ")")
    ram = args.ram_gib * 2**30
    t0 = time.perf_counter()
    variants: list[Any] = [Ember(vocab, ram, disk, bf16=False)] + ([Ember(vocab, ram, disk, bf16=True)] if bf16 else [])
    t1 = time.perf_counter()
    plain = Plain(vocab, args.baseline, bf16=False)
    variants.append(plain)
    if bf16 and not args.no_plain_bf16:
        variants.append(Plain(vocab, args.baseline, bf16=True, share=plain))
    print(f"built ember's tables (disk tiers reserved) in {t1 - t0:.0f}s, plain's in {time.perf_counter() - t1:.0f}s")
    embers = [v for v in variants if isinstance(v, Ember)]
    for v in embers:
        tiered = [f"{n}({s['host_rows']:,} cached of {s['disk_rows']:,})" for n, s in zip(FEATURES, v.storage) if s]
        print(f"{v.name}: {len(tiered)} tables on host cache + disk: {', '.join(tiered) or 'none'}")
    print(f"setup {time.perf_counter() - t_start:.0f}s; running {n} steps x {len(variants)} variants")
    times: dict[str, list[float]] = {v.name: [] for v in variants}
    losses: dict[str, float] = {}
    for i, (ids, dense, labels) in enumerate(batches):
        k = i % len(variants)
        took: dict[str, float] = {}
        for v in variants[k:] + variants[:k]:
            s = time.perf_counter()
            losses[v.name] = v.step(ids, dense, labels)
            took[v.name] = time.perf_counter() - s
            if i >= args.warmup:
                times[v.name].append(took[v.name])
            elif i == args.warmup - 1 and isinstance(v, Ember):
                v.reset_tier_stats()  # hit rates over the timed steps
        mem = rss_mib()
        print(f"  step {i + 1}/{n}{' (warmup)' if i < args.warmup else ''}: "
              + ", ".join(f"{v.name} {took[v.name] * 1e3:.0f} ms" for v in variants)
              + f"; {time.perf_counter() - t_start:.0f}s elapsed; RSS anon {mem.get('RssAnon', 0):.0f} MiB, "
              f"file {mem.get('RssFile', 0):.0f} MiB", flush=True)
    ember32, ember16 = embers[0], embers[1] if bf16 else None
    for v in embers:
        for key in v.split:
            v.split[key] = v.split[key][args.warmup:]
    sps = {k: [args.batch / x for x in t] for k, t in times.items()}
    med = {k: statistics.median(v) for k, v in sps.items()}

    def paired(ref: str, var: str) -> float:
        return statistics.median(r / x for r, x in zip(times[ref], times[var]))

    cores = topo["physical_cores"]
    r_plain = paired("plain", "ember")
    r_plain16 = paired("plain-bf16", "ember-bf16") if "plain-bf16" in times else None
    print(f"\n{'variant':<12}{'samples/s median':>18}{'min':>10}{'max':>10}{'per core':>10}{'ms/step':>10}")
    for k, v in sps.items():
        print(f"{k:<12}{med[k]:>18.0f}{min(v):>10.0f}{max(v):>10.0f}{med[k] / cores:>10.0f}{args.batch / med[k] * 1e3:>10.0f}")
    per_core = {"fp32": med["ember"] / cores, "bf16": med["ember-bf16"] / cores if bf16 else None}
    split = {k: statistics.median(v) * 1e3 for k, v in ember32.split.items()}
    split16 = {k: statistics.median(v) * 1e3 for k, v in ember16.split.items()} if ember16 is not None else {}
    print(f"\npaired ratios (median over {args.steps} steps): ember / plain ({args.baseline}) {r_plain:.3f}x"
          + (f", ember-bf16 / plain-bf16 {r_plain16:.3f}x" if r_plain16 is not None else ""))
    vs_intel = None if per_core["bf16"] is None else per_core["bf16"] / INTEL["per_core"]
    print(f"per core vs Intel MLPerf v0.7 ({INTEL['per_core']:.0f} samples/s/core, bf16): "
          + ("" if vs_intel is None else f"bf16 {vs_intel:.3f}x, ") + f"fp32 {per_core['fp32'] / INTEL['per_core']:.3f}x"
          + ("" if native else "  (no native bf16 on this CPU: not a target)"))
    print("ember time split (ms, median): fp32 " + ", ".join(f"{k} {v:.0f}" for k, v in split.items())
          + ("; bf16 " + ", ".join(f"{k} {v:.0f}" for k, v in split16.items()) if split16 else ""))
    tiers = {v.name: v.tier_stats() for v in embers}
    print(f"ember tiers: {tiers}")
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    rss_end = rss_mib()
    wall = time.perf_counter() - t_start
    print(f"peak RSS {rss_mb:.0f} MB; wall {wall:.0f}s")
    # no ec.close(): it writes every cached row back to disk and msyncs (minutes on this VM), which
    # a throwaway benchmark table does not need; the unlinked files' dirty pages are dropped at exit
    shutil.rmtree(disk, ignore_errors=True)
    from benchkit import json_line  # the machine (CPU model, bf16) in the final line

    print(json_line({
        "bench": "mlperf_dlrm", "batch": args.batch, "steps": args.steps, "warmup": args.warmup,
        "samples_per_s_fp32": med["ember"], "samples_per_s_bf16": med.get("ember-bf16"), "bf16": args.bf16,
        "per_core_fp32": per_core["fp32"], "per_core_bf16": per_core["bf16"],
        "per_core_vs_intel": vs_intel,
        "per_core_vs_intel_fp32": per_core["fp32"] / INTEL["per_core"],
        "bf16_native": bool(native), "bf16_is_target": bool(native),
        "per_core_vs_intel_target": ">= 2 with bf16 on a CPU with AMX (issue 29)",
        "ember_vs_plain": r_plain, "ember_bf16_vs_plain_bf16": r_plain16, "baseline": args.baseline,
        "samples_per_s": {k: {"median": med[k], "min": min(v), "max": max(v)} for k, v in sps.items()},
        "physical_cores": cores, "cpu_topology": topo, "intel_mlperf_v07": INTEL,
        "ember_split_ms": {"fp32": split, "bf16": split16}, "tiers": tiers,
        "workload": {"max_rows": args.max_rows, "table_rows": sum(vocab), "ram_gib": args.ram_gib, "zipf_s": ZIPF_S,
                     "optimizer": f"sgd (sparse lr {LR_SPARSE}, dense lr {LR_DENSE})"},
        "final_loss": losses, "torch_threads": torch.get_num_threads(), "peak_rss_mb": rss_mb, "rss_end_mib": rss_end, "wall_s": wall,
    }))


if __name__ == "__main__":
    main()
