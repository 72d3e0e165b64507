"""DLRM-26 with a device cache: what one step costs the device (ops launched per table group, and
device->host syncs), and with CUDA the speed against rows in host memory and rows all on the GPU.

Workload as bench_dlrm.py but Zipf(1.05): 26 single-hot features over 200 k IDs each, dim 16,
row-wise Adagrad 0.05, batch 4096 (CPU: --cpu-batch 1024). ember variants (one table group of 26):
  ember-cache-1/4   each table: a device cache of 1/4 of its IDs (LFU, admit after 1) in front of
  ember-cache-1/16  host memory (1/16 of its IDs): hits gathered, pooled and updated on the device
  ember-all-device  a device cache of every ID (every row in device memory)
  ember-host        every row in host memory (rows cross to the device and gradients back)
  ember-device-index  storage.index: device: every row in pinned host memory, indexed on the
                    device (one MappedRows per group): the host dedupes and uploads the IDs, the
                    device looks up, gathers over PCIe, makes fresh rows, updates, scatters back
  ember-mapped      the same mechanism written out by hand in this file (MappedRows alone, the
                    reference the trainer's path is held to)
  plain-gpu         nn.EmbeddingBag(sparse=True) per table on the GPU + torch.optim.Adagrad (CUDA only)

Budgets (CPU and CUDA; on a CPU the "device" is an arena in host memory, marked for
ember.tiers.device_budget): after warm-up, K steps of the embedding path of each cache variant
run under ``DeviceBudget``, one table group at a time (plan, fetch, pool + backward with fixed
cotangents, update, write back): device ops per step per group (max over groups and steps),
syncs per step (max over steps), and the split by phase.

With CUDA also, interleaved in one process on the same batches: ms/step of a full training step
(paired, rotating order) and IDs/s of the embedding path alone (each on batches of its own, the
even and the odd ones: each timed on IDs the variant has not seen yet), the cache's hit rate,
and its host<->device bytes per step against (misses + evictions) x record bytes. Targets on
one H100: the 1/4 cache >= 2x the speed of ember-host and >= 0.9x of ember-all-device
(``cache_vs_host``, ``cache_vs_all_device``).

Timing starts once the 1/4 cache is full and evicting (``--warmup`` 80: it fills at step ~66;
figures before 2026-11-26's third session timed its filling, with free slots and no victims).

    python bench/bench_gpu_cache.py [--steps 40] [--warmup 80] [--budget-steps 3] [--cpu-batch 1024]
        [--phases N [--profile-top K]] [--trainer N [--trainer-warmup 80]]

The last line is one JSON object: device_ops_per_step_per_group, syncs_per_step (the caches'),
device_index_ops_per_step, device_index_syncs_per_step (storage.index: device), hot_ops_per_step,
hot_syncs_per_step (its hot rows in device memory), budget, mapped_ops_per_step, mapped_syncs_per_step, and with CUDA cache_vs_host, cache_vs_all_device,
mapped_vs_host, mapped_vs_all_device, mapped_vs_plain_gpu, device_index_vs_host,
device_index_vs_all_device, device_index_vs_plain_gpu, device_index_graphs_vs_eager, ms_per_step, embedding_ids_per_s,
cache_hit_rate, transfer.
"""

from __future__ import annotations

import argparse
import math
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import ember  # noqa: F401  # first: before torch loads (GOMP_SPINCOUNT)

import numpy as np
import torch
from torch import nn

import bench_dlrm
from bench_dlrm import D, F, V, make_batches, make_model
from ember import allocator
from ember.batch import Batch, SparseFeatures
from ember.embedding import EmbeddingCollection, FeatureConfig, SparseOptimizer, TableConfig, mapped_fetch
from ember import _native
from ember.embedding.init import uniform01_tensor
from ember.tiers.device_budget import DeviceBudget, to_device
from ember.tiers.mapped_rows import MappedRows

ZIPF = 1.05
PHASES = ("plan", "fetch", "pool+backward", "update", "write_back")
CACHES = {"ember-cache-1/4": 4, "ember-cache-1/16": 16, "ember-all-device": 1}  # name -> 1/fraction of IDs cached


def _sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


class EmberVariant:
    """ember on ``dev``: a device cache of ``cache_rows`` per table (None: rows in host memory)."""

    def __init__(self, name: str, cache_rows: int | None, dev: torch.device, device_index: bool = False) -> None:
        """``device_index``: storage.index: device, and with ``cache_rows`` its hot rows in device
        memory (that many per table); else ``cache_rows`` rows of a device cache per table (the
        host index's group cache), or None: rows in host memory."""
        self.name, self.dev = name, dev
        hot = {} if cache_rows is None else {"device_rows": cache_rows}
        storage = ({"storage": {"index": "device", "device": dev.type, **hot}} if device_index else {} if cache_rows is None
                   else {"storage": {"device_rows": cache_rows, "device": dev.type, "admit_after": 1}})
        self.keys = [f"C{i + 1}" for i in range(F)]
        tables = [TableConfig(name=n, dim=D, optimizer={"type": "rowwise_adagrad", "lr": 0.05}, **storage) for n in self.keys]
        self.ec = EmbeddingCollection(tables, [FeatureConfig(name=n) for n in self.keys]).to(dev)
        self.model = make_model(0).to(dev)
        self.opt = torch.optim.Adagrad(self.model.parameters(), lr=0.01)
        self.sparse_opt = SparseOptimizer(self.ec)
        self.step_no = 0
        self.moved: list[float] = []  # per accounted step: host<->device bytes
        self.expected: list[float] = []  # (misses + evictions) x record bytes
        self.hits: list[float] = []  # device-tier hits and requests
        self.requests: list[float] = []
        self._lengths: torch.Tensor | None = None

    def features(self, ids: torch.Tensor) -> SparseFeatures:
        """The batch's IDs [F, B] (host memory) as single-hot sparse features."""
        if self._lengths is None or self._lengths.numel() != ids.numel():
            self._lengths = torch.ones(ids.numel(), dtype=torch.int64)
        return SparseFeatures(self.keys, ids.reshape(-1), self._lengths)

    def step(self, sf: SparseFeatures, dense: torch.Tensor, labels: torch.Tensor) -> None:
        """One full training step (embeddings, model, both optimizers)."""
        emb = self.ec(sf)
        loss = nn.functional.binary_cross_entropy_with_logits(self.model(dense, [emb[k] for k in self.keys]), labels)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()
        self.sparse_opt.step()
        self.step_no += 1
        _sync(self.dev)

    def step_phases(self, sf: SparseFeatures, dense: torch.Tensor, labels: torch.Tensor) -> dict[str, float]:
        """One full training step (as ``step``), the device synchronised between its parts: ms of
        each (where a full step's time goes beyond its embedding path)."""
        ms, t = {}, time.perf_counter()

        def mark(name: str) -> None:
            nonlocal t
            _sync(self.dev)
            now = time.perf_counter()
            ms[name] = (now - t) * 1e3
            t = now

        emb = self.ec(sf)
        mark("embedding forward")
        loss = nn.functional.binary_cross_entropy_with_logits(self.model(dense, [emb[k] for k in self.keys]), labels)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        mark("dense forward+backward")
        self.opt.step()
        mark("dense optimizer")
        self.sparse_opt.step()
        mark("sparse step")
        self.step_no += 1
        return ms

    def embedding_path(self, sf: SparseFeatures, cot: dict[str, torch.Tensor],
                       budget: "StepBudget | None" = None) -> None:
        """The embedding path of one step, group by group: plan, fetch, pool, backward with the
        fixed cotangents ``cot``, update, write back; under ``budget`` when given."""
        for g in self.ec.groups:
            b = budget.start(g, cot) if budget is not None else None
            lk = g.plan(sf, True)
            if b is not None:
                b.phase("plan")
            lk.fetch()
            self._train(g, lk, cot, b, "fetch")
        self.step_no += 1
        _sync(self.dev)

    def embedding_path_ahead(self, sf_next: SparseFeatures, cot: dict[str, torch.Tensor],
                             budget: "StepBudget | None" = None) -> None:
        """The embedding path of one step as the pipelined trainer orders it with a group cache
        (``TrainStages.fetch``), group by group: the rows the last write-back stored outside the
        arena re-read into this batch's prepared plan and the plan loaded, pool, backward, the
        next batch (``sf_next``) planned and prepared, update, write back. The first call
        prepares its batch first."""
        if not hasattr(self, "_ahead"):
            self._ahead = {id(g): (g.plan(sf_next, True).prepare(), []) for g in self.ec.groups}
            return
        for g in self.ec.groups:
            b = budget.start(g, cot) if budget is not None else None
            lk, last = self._ahead[id(g)]
            lk.reread(lambda: last)
            lk.fetch()
            nxt = self._train(g, lk, cot, b, "re-read+load", lambda: g.plan(sf_next, True).prepare())
            self._ahead[id(g)] = (nxt, [lk.keys(lk.written)])
        self.step_no += 1
        _sync(self.dev)

    def _train(self, g: Any, lk: Any, cot: dict[str, torch.Tensor], b: "StepBudget | None", fetched: str,
               between: Any = None) -> Any:
        """A fetched lookup's phases (``fetched``: the name of the phase that fetched it): pool,
        backward with ``cot``, ``between()`` (its result returned), update, write back."""
        if b is not None:
            b.fetched(lk)
            b.phase(fetched)
        out = lk.pool(self.dev)
        names = [f.name for f in g.features]
        torch.autograd.backward([out[n] for n in names], [cot[n] for n in names])
        if b is not None:
            b.phase("pool+backward")
        made = None
        if between is not None:
            made = between()
            if b is not None:
                b.phase("prepare next")
        lk.update(self.step_no)
        if b is not None:
            b.phase("update")
        lk.write_back()
        if b is not None:
            b.phase("write_back")
            b.stop()
        return made

    def account(self) -> None:
        """This step's host<->device bytes and (misses + evictions) x record bytes; resets the tables' step stats."""
        moved = expected = hits = requests = 0.0
        for t in self.ec.tables.values():
            s = t.stats()
            moved += s.get("transfer_bytes", 0.0)
            req = s.get("tier.device.requests", 0.0)
            if req:
                miss = req - s.get("tier.device.hits", 0.0)
                evicted = s.get("tier.device.demotions", 0.0) + s.get("tier.device.bypasses", 0.0)
                expected += (miss + evicted) * 4 * t.config.stored_words
                hits += s.get("tier.device.hits", 0.0)
                requests += req
            t.reset_step_stats()
        self.moved.append(moved)
        self.expected.append(expected)
        self.hits.append(hits)
        self.requests.append(requests)


class StepBudget:
    """Per-group, per-phase device ops and syncs of one step's embedding path (``DeviceBudget``)."""

    def __init__(self, dev: torch.device) -> None:
        self.dev = dev
        self.groups: list[dict[str, tuple[int, int]]] = []  # per group: phase -> (ops, syncs)
        self.top: dict[str, int] = {}
        self.sync_names: dict[str, int] = {}
        self._mode: DeviceBudget | None = None

    def start(self, group: Any, cot: dict[str, torch.Tensor]) -> "StepBudget":
        """Enter a DeviceBudget for one group's phases, its arenas and the cotangents marked."""
        self._mode = DeviceBudget(self.dev).__enter__()
        self._mode.mark(*_arenas(group, self.dev), *cot.values())  # what lives on a CPU "device"
        self._last = (0, 0)
        self.groups.append({})
        return self

    def fetched(self, lk: Any) -> None:
        """fetch leaves the rows ``records`` on the group's (fast tier's) device."""
        if lk.records is not None and lk.records.device.type == self.dev.type:
            self._mode.mark(lk.records)

    def phase(self, name: str) -> None:
        m = self._mode
        self.groups[-1][name] = (m.ops - self._last[0], m.syncs - self._last[1])
        self._last = (m.ops, m.syncs)

    def stop(self) -> None:
        m, self._mode = self._mode, None
        m.__exit__(None, None, None)
        for k, c in m.op_names.items():
            self.top[k] = self.top.get(k, 0) + c
        for k, c in m.sync_names.items():
            self.sync_names[k] = self.sync_names.get(k, 0) + c


def _generations(v: Any) -> list[tuple[int, int, int]]:
    """Each storage.index: device group's (rows, index) generations, which change with a growth,
    and its hot rows' rebalances (the hot set chosen again: every 64 steps once warm)."""
    return [(g.mapped.generation, g.mapped.index.generation, g.mapped.hot.rebalances if g.mapped.hot is not None else 0)
            for g in v.ec.groups if g.mapped is not None]


def _arenas(group: Any, dev: torch.device) -> list[torch.Tensor]:
    """The device arenas of a group's tiers (a cached chain's fast tier, recursively)."""
    out, todo = [], list(group.tiers)
    while todo:
        t = todo.pop()
        arena = getattr(t, "_arena", None)
        if isinstance(arena, torch.Tensor) and getattr(t, "name", "") == "device" and arena.device.type == dev.type:
            out.append(arena)
        todo.extend(x for x in (getattr(t, "fast", None), getattr(t, "slow", None)) if x is not None)
    return out


def cotangents(keys: list[str], batch: int, dev: torch.device) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    return {k: (torch.randn(batch, D, generator=g) * 1e-3).to(dev) for k in keys}


def measure_budgets(dev: torch.device, batches: list, vocab: int, warmup: int, steps: int,
                    caches: dict[str, int] = CACHES, log: bool = True, device_index: bool = True) -> dict[str, Any]:
    """For each cache variant: ``warmup`` full steps, then ``steps`` embedding-path steps under
    ``DeviceBudget``, in line and as the pipelined trainer orders them (next batch prepared
    ahead: the variant's name + " ahead"); then (``device_index``) the rows in host memory
    indexed on the device (storage.index: device), in line, its CUDA graphs each one launch (on
    a CPU: the padded functions a GPU captures, each counted as its replay). Returns {variant: {ops_per_step_per_group,
    syncs_per_step (both the max over steps and groups), phases (mean per step and group),
    top_ops, sync_names}}."""
    if len(batches) < warmup + steps + 1:
        raise ValueError(f"measure_budgets: {len(batches)} batches for {warmup} warm-up + {steps} measured steps + 1")
    out: dict[str, Any] = {}
    runs = [(n, f, a) for n, f in caches.items() for a in (False, True)]
    if device_index:  # (storage.index: device: its device memory marked by ember; its hot rows: 1/4 of each table)
        runs += [("ember-device-index", 0, False), ("ember-device-index-hot-1/4", -4, False)]
    try:
        for name, frac, ahead in runs:
            name = name + " ahead" if ahead else name
            v = (EmberVariant(name, None, dev, device_index=True) if not frac
                 else EmberVariant(name, max(vocab // -frac, 1), dev, device_index=True) if frac < 0
                 else EmberVariant(name, max(vocab // frac, 1), dev))
            # storage.index: device on a CPU: its fetch and write-back padded and each counted as the one
            # launch a GPU's CUDA graph replay is (on CUDA the replays themselves are counted)
            as_graphs = frac <= 0 and dev.type == "cpu"
            mapped_fetch.PAD_ON_CPU = mapped_fetch.COUNT_AS_GRAPHS = as_graphs
            for ids, dense, labels in batches[:warmup]:
                v.step(v.features(ids), dense.to(dev), labels.to(dev))
            cot = cotangents(v.keys, batches[0][0].shape[1], dev)
            per_step_ops, per_step_syncs = [], []
            phases: dict[str, list[int]] = {}
            top: dict[str, int] = {}
            sync_names: dict[str, int] = {}
            if ahead:
                v.embedding_path_ahead(v.features(batches[warmup][0]), cot)  # (prepares the first)
            grew = 0  # (storage.index: device: steps that grew the rows or the index, a wait each, or chose the hot
            # rows again, left out of the max)
            grown: list[tuple[int, int]] = []
            step_phases: list[tuple[Any, bool]] = []  # each step's per-group phases, and whether it is left out
            for i, (ids, _, _) in enumerate(batches[warmup : warmup + steps]):
                sb = StepBudget(dev)
                before = _generations(v)
                if ahead:
                    v.embedding_path_ahead(v.features(batches[warmup + i + 1][0]), cot, sb)
                else:
                    v.embedding_path(v.features(ids), cot, sb)
                ops, syncs = max(sum(o for o, _ in g.values()) for g in sb.groups), sum(s for g in sb.groups for _, s in g.values())
                left_out = _generations(v) != before
                if left_out:
                    grew += 1
                    grown.append((ops, syncs))
                else:
                    per_step_ops.append(ops)
                    per_step_syncs.append(syncs)
                step_phases.append((sb.groups, left_out))
                for k, c in sb.top.items():
                    top[k] = top.get(k, 0) + c
                for k, c in sb.sync_names.items():
                    sync_names[k] = sync_names.get(k, 0) + c
            all_grew = not per_step_ops
            if all_grew:  # (every measured step grew: their figures, said)
                per_step_ops, per_step_syncs = [o for o, _ in grown], [s for _, s in grown]
            kept = [gs for gs, out in step_phases if not out] or [gs for gs, _ in step_phases]  # (the steps in the figures)
            for gs in kept:
                for g in gs:
                    for p, (o, s) in g.items():
                        acc = phases.setdefault(p, [0, 0])
                        acc[0] += o
                        acc[1] += s
            n = len(kept) * len(v.ec.groups)
            res = {
                "groups": len(v.ec.groups), "ops_per_step_per_group": max(per_step_ops), "syncs_per_step": max(per_step_syncs),
                "growth_steps": grew, "growth_in_figures": all_grew,
                "phases": {p: {"ops": o / n, "syncs": s / n} for p, (o, s) in phases.items()},
                "top_ops": dict(sorted(top.items(), key=lambda kv: -kv[1])[:8]), "sync_names": sync_names,
            }
            out[name] = res
            mapped_fetch.PAD_ON_CPU = mapped_fetch.COUNT_AS_GRAPHS = False
            v.ec.close()
            if log:
                split = ", ".join(f"{p} {d['ops']:.0f}/{d['syncs']:.0f}" for p, d in res["phases"].items())
                print(f"{name:<17} {res['ops_per_step_per_group']:>6} device ops/step/group, {res['syncs_per_step']:>5} syncs/step "
                      f"({res['groups']} group(s)); per phase ops/syncs: {split}"
                      + ("; every measured step grew the rows: their figures" if all_grew
                         else f"; {grew} step(s) that grew the rows left out" if grew else ""))
                print(f"{'':<17} top ops: {', '.join(f'{k} x{c}' for k, c in list(res['top_ops'].items())[:6]) or '-'}; "
                      f"syncs: {', '.join(f'{k} x{c}' for k, c in sync_names.items()) or '-'}")
    finally:  # (an exception in a variant leaves no flag set for the rest of the process)
        mapped_fetch.PAD_ON_CPU = mapped_fetch.COUNT_AS_GRAPHS = False
    return out


class PhaseTimer:
    """Wall time of each phase of one step's embedding path, the device synchronised at each phase
    end (``EmberVariant.embedding_path``'s ``budget`` hook): where a step's time goes."""

    def __init__(self, dev: torch.device) -> None:
        self.dev = dev
        self.ms: dict[str, float] = {p: 0.0 for p in PHASES}

    def start(self, group: Any, cot: dict[str, torch.Tensor]) -> "PhaseTimer":
        _sync(self.dev)
        self._t = time.perf_counter()
        return self

    def fetched(self, lk: Any) -> None:
        pass

    def phase(self, name: str) -> None:
        _sync(self.dev)
        t = time.perf_counter()
        self.ms[name] += (t - self._t) * 1e3
        self._t = t

    def stop(self) -> None:
        pass


def profile_phases(dev: torch.device, batches: list, vocab: int, warmup: int, steps: int,
                   caches: dict[str, int | None], top: int = 0) -> dict[str, dict[str, float]]:
    """Median ms per phase of the embedding path for each variant (None: rows in host memory);
    with ``top`` > 0 also cProfile's ``top`` functions by own time for the first variant."""
    import cProfile
    import pstats

    out: dict[str, dict[str, float]] = {}
    for i, (name, frac) in enumerate(caches.items()):
        v = EmberVariant(name, None if frac is None else max(vocab // frac, 1), dev)
        for ids, dense, labels in batches[:warmup]:
            v.step(v.features(ids), dense.to(dev), labels.to(dev))
        cot = cotangents(v.keys, batches[0][0].shape[1], dev)
        per: dict[str, list[float]] = {p: [] for p in PHASES}
        prof = cProfile.Profile() if top and i == 0 else None
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        for ids, _, _ in batches[warmup : warmup + steps]:
            pt = PhaseTimer(dev)
            sf = v.features(ids)
            if prof is not None:
                prof.enable()
            v.embedding_path(sf, cot, pt)
            if prof is not None:
                prof.disable()
            for p, ms in pt.ms.items():
                per[p].append(ms)
        faults = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults) / max(steps, 1)
        out[name] = {p: statistics.median(x) for p, x in per.items()}
        out[f"{name} page faults per step"] = faults  # fresh memory the host touched (glibc, pinned buffers)
        print(f"{name:<17} ms per phase (median of {steps}): " + ", ".join(f"{p} {m:.2f}" for p, m in out[name].items())
              + f"; sum {sum(out[name].values()):.2f}; {faults:.0f} page faults a step")
        if prof is not None:
            print(f"cProfile of {name}'s embedding path over {steps} steps, top {top} by own time:")
            pstats.Stats(prof).sort_stats("tottime").print_stats(top)
        # full steps on the next batches (first seen), split where the device is synchronised
        full: dict[str, list[float]] = {}
        prof = cProfile.Profile() if top and i == 0 else None
        for ids, dense, labels in batches[warmup + steps : warmup + 2 * steps]:
            sf = v.features(ids)
            if prof is not None:
                prof.enable()
            for p, ms in v.step_phases(sf, dense.to(dev), labels.to(dev)).items():
                full.setdefault(p, []).append(ms)
            if prof is not None:
                prof.disable()
        out[f"{name} full step"] = {p: statistics.median(x) for p, x in full.items()}
        print(f"{name:<17} full step, ms per part (median of {steps}): "
              + ", ".join(f"{p} {m:.2f}" for p, m in out[f"{name} full step"].items())
              + f"; sum {sum(out[f'{name} full step'].values()):.2f}")
        if prof is not None:
            print(f"cProfile of {name}'s full steps over {steps} steps, top {top} by own time:")
            pstats.Stats(prof).sort_stats("tottime").print_stats(top)
        v.ec.close()
    return out


def budget_summary(budgets: dict[str, Any]) -> dict[str, Any]:
    """The JSON headline of the budgets: the worst cache variant's figures (the issue's budget is
    the cache's), storage.index: device's beside them, and each variant's."""
    caches = [b for n, b in budgets.items() if not n.startswith("ember-device-index")]
    out = {
        "device_ops_per_step_per_group": max(b["ops_per_step_per_group"] for b in caches),
        "syncs_per_step": max(b["syncs_per_step"] for b in caches),
        "budget": budgets,
    }
    if "ember-device-index" in budgets:
        out["device_index_ops_per_step"] = budgets["ember-device-index"]["ops_per_step_per_group"]
        out["device_index_syncs_per_step"] = budgets["ember-device-index"]["syncs_per_step"]
    if "ember-device-index-hot-1/4" in budgets:  # (its max over steps: a step that chooses the hot rows again included)
        out["hot_ops_per_step"] = budgets["ember-device-index-hot-1/4"]["ops_per_step_per_group"]
        out["hot_syncs_per_step"] = budgets["ember-device-index-hot-1/4"]["syncs_per_step"]
    return out


class PlainGPU:
    """nn.EmbeddingBag(sparse=True) per table on the GPU + torch.optim.Adagrad."""

    name = "plain-gpu"

    def __init__(self, dev: torch.device, vocab: int = V) -> None:
        torch.manual_seed(1)
        self.dev = dev
        self.bags = nn.ModuleList([nn.EmbeddingBag(vocab, D, mode="sum", sparse=True) for _ in range(F)]).to(dev)
        self.model = make_model(0).to(dev)
        self.sparse_opt = torch.optim.Adagrad(list(self.bags.parameters()), lr=0.05)
        self.opt = torch.optim.Adagrad(self.model.parameters(), lr=0.01)
        self.keys = [f"C{i + 1}" for i in range(F)]

    def step(self, ids: torch.Tensor, dense: torch.Tensor, labels: torch.Tensor) -> None:
        emb = [bag(ids[f].unsqueeze(1)) for f, bag in enumerate(self.bags)]
        loss = nn.functional.binary_cross_entropy_with_logits(self.model(dense, emb), labels)
        self.opt.zero_grad(set_to_none=True)
        self.sparse_opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()
        self.sparse_opt.step()
        _sync(self.dev)

    def embedding_path(self, ids: torch.Tensor, cot: dict[str, torch.Tensor]) -> None:
        emb = [bag(ids[f].unsqueeze(1)) for f, bag in enumerate(self.bags)]
        self.sparse_opt.zero_grad(set_to_none=True)
        torch.autograd.backward(emb, [cot[k] for k in self.keys])
        self.sparse_opt.step()
        _sync(self.dev)


class MappedVariant:
    """ember's tables (the same configs, seeds, fresh rows and row-wise Adagrad as ``ember-host``)
    on ``MappedRows``: records in pinned host memory, the index on the device. The host dedupes
    the batch's IDs (ember's plan, as in every ember variant) and uploads them; the device does
    the rest: look-up and inserts in its index, one gather of the records over PCIe, fresh rows
    made in place (``uniform01_tensor``), pooling, backward, the optimizer as tensor ops, one
    scatter of the records back. The mechanism of issue 25's next group storage, measured here
    before the trainer uses it."""

    name = "ember-mapped"

    def __init__(self, dev: torch.device) -> None:
        base = EmberVariant(self.name, None, dev)  # (configs, seeds and dense model as ember-host's)
        self.dev, self.keys, self.model, self.opt = dev, base.keys, base.model, base.opt
        assert len(base.ec.groups) == 1
        g = base.ec.groups[0]
        assert [t.name for t in g.tables] == self.keys and len(g.combos) == 1 and g.fills[0] is not None
        self.rule, self.width = g.tables[0].optimizer, g.width
        self.rows = MappedRows(g.width, dev, capacity=1 << 16)  # (grows as IDs arrive)
        self.init_keys = torch.from_numpy(g.init_keys.view(np.int64)).to(dev)
        self.mul = torch.from_numpy((2 * g.scale).astype(np.float32)).to(dev)
        self.add = torch.from_numpy((-g.scale).astype(np.float32)).to(dev)
        self.fill = torch.from_numpy(g.fills[0]).to(dev)
        base.ec.close()
        self.step_no = 0
        self._bufs: list[Any] = [None, None]  # two pinned upload buffers, used in turn (with their copy's event)

    def plan(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Host: each table's unique IDs, their tables and every value's index among them, in one
        pinned buffer, copied to the device (non-blocking)."""
        f, b = ids.shape
        uniq, inverse, sizes = _native.unique_segments(ids.reshape(-1).numpy(), np.arange(f + 1, dtype=np.int64) * b)
        u = uniq.size
        buf, event = self._bufs[self.step_no % 2] or (None, None)
        if event is not None:
            event.synchronize()  # (two steps old: its copy has long landed)
        if buf is None or buf.numel() < 2 * u + inverse.size:
            buf = torch.empty(2 * (2 * u + inverse.size), dtype=torch.int64, pin_memory=self.dev.type == "cuda")
        h = buf.numpy()
        h[:u], h[u : 2 * u], h[2 * u : 2 * u + inverse.size] = uniq, np.repeat(np.arange(f), sizes), inverse
        d = buf[: 2 * u + inverse.size].to(self.dev, non_blocking=True)
        if self.dev.type == "cuda":
            event = torch.cuda.Event()
            event.record()
        self._bufs[self.step_no % 2] = (buf, event)
        return d[:u], d[u : 2 * u].to(torch.int32), d[2 * u :]

    def embedding(self, ids: torch.Tensor) -> tuple[list[torch.Tensor], tuple]:
        keys, tags, inverse = self.plan(ids)
        rows, new, rec = self.rows.lookup(keys, tags)
        dim = self.width - self.fill.numel()
        fresh = uniform01_tensor(keys, self.init_keys[tags], dim, self.mul[tags], self.add[tags])
        fresh = torch.cat((fresh, self.fill.expand(keys.numel(), -1)), 1)
        rec = torch.where(new.unsqueeze(1), fresh, rec)
        leaf = rec[:, :dim].detach().requires_grad_()
        emb = leaf.index_select(0, inverse).view(ids.shape[0], ids.shape[1], dim).unbind(0)
        return list(emb), (rows, rec, leaf, dim)

    def sparse_step(self, ctx: tuple) -> None:
        rows, rec, leaf, dim = ctx
        self.rule.update(rec[:, :dim], rec[:, dim:], leaf.grad, self.step_no)
        self.rows.store(rows, rec)
        self.step_no += 1

    def step(self, ids: torch.Tensor, dense: torch.Tensor, labels: torch.Tensor) -> None:
        emb, ctx = self.embedding(ids)
        loss = nn.functional.binary_cross_entropy_with_logits(self.model(dense, emb), labels)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()
        self.sparse_step(ctx)
        _sync(self.dev)

    def embedding_path(self, ids: torch.Tensor, cot: dict[str, torch.Tensor]) -> None:
        emb, ctx = self.embedding(ids)
        torch.autograd.backward(emb, [cot[k] for k in self.keys])
        self.sparse_step(ctx)
        _sync(self.dev)


def measure_mapped_budget(dev: torch.device, batches: list, warmup: int, steps: int) -> dict[str, Any]:
    """``MappedVariant``'s embedding path under ``DeviceBudget`` after ``warmup`` full steps: ops
    and syncs per step (max over ``steps``; the host's dedupe and upload not counted as device work)."""
    v = MappedVariant(dev)
    for ids, dense, labels in batches[:warmup]:
        v.step(ids, dense.to(dev), labels.to(dev))
    cot = cotangents(v.keys, batches[0][0].shape[1], dev)
    ops, syncs, top = [], [], {}
    for ids, _, _ in batches[warmup : warmup + steps]:
        m = v.rows
        with DeviceBudget(dev) as b:
            b.mark(m.rows, m.index.keys, m.index.tags, m.index.rows, m.index.fill, m.index.counts, v.init_keys, v.mul,
                   v.add, v.fill, *cot.values())
            real = v.plan
            v.plan = lambda x: tuple(to_device(t, dev) for t in real(x))  # type: ignore[method-assign]
            v.embedding_path(ids, cot)
            v.plan = real  # type: ignore[method-assign]
        ops.append(b.ops)
        syncs.append(b.syncs)
        for k, c in b.op_names.items():
            top[k] = top.get(k, 0) + c
    res = {"ops_per_step": max(ops), "syncs_per_step": max(syncs),
           "top_ops": dict(sorted(top.items(), key=lambda kv: -kv[1])[:10])}
    print(f"{v.name:<17} {res['ops_per_step']:>6} device ops/step (one group), {res['syncs_per_step']:>5} syncs/step; "
          f"top ops: {', '.join(f'{k} x{c}' for k, c in res['top_ops'].items())}")
    return res


def compare_on_gpu(dev: torch.device, batches: list, vocab: int, warmup: int) -> dict[str, Any]:
    """Full steps and embedding-path steps of every variant, interleaved (rotating order) on the
    same batches: ms/step, embedding IDs/s, the 1/4 cache's hit rate and transfer."""
    # full steps on the even batches, the embedding path alone on the odd ones: each timed on
    # batches the variant has not seen (a second pass over one batch would find its misses cached)
    # (warm-up counts batches through the cache: ``warmup // 2`` pairs)
    emb_batches = batches[1::2]
    host_batches = batches[0::2]
    dev_batches = [(i.to(dev), d.to(dev), lab.to(dev)) for i, d, lab in host_batches]
    eager = EmberVariant("ember-device-index-eager", None, dev, device_index=True)  # its CUDA graphs off
    for g in eager.ec.groups:
        g.mapped_fetch.graphs_on = False
    ember_vs = [EmberVariant(n, max(vocab // f, 1), dev) for n, f in CACHES.items()] + [
        EmberVariant("ember-host", None, dev), EmberVariant("ember-device-index", None, dev, device_index=True), eager,
        # the device index's hot rows (storage.index: device + device_rows): 1/4 of each table, and every row
        EmberVariant("ember-device-index-hot-1/4", max(vocab // 4, 1), dev, device_index=True),
        EmberVariant("ember-device-index-hot-all", vocab, dev, device_index=True)]
    variants: list[Any] = [*ember_vs, MappedVariant(dev), PlainGPU(dev, vocab)]
    cot = cotangents(ember_vs[0].keys, batches[0][0].shape[1], dev)
    times: dict[str, list[float]] = {v.name: [] for v in variants}
    emb_times: dict[str, list[float]] = {v.name: [] for v in variants}
    for i, ((ids_h, _, _), (ids_d, dense, labels), (ids_e, _, _)) in enumerate(zip(host_batches, dev_batches, emb_batches)):
        k = i % len(variants)
        ids_e_d = ids_e.to(dev)
        for v in variants[k:] + variants[:k]:
            ember_v = isinstance(v, EmberVariant)
            sf = v.features(ids_h) if ember_v else None  # ember plans on the host (IDs from the data loader)
            s = time.perf_counter()
            on_host = ember_v or isinstance(v, MappedVariant)  # (ember's IDs come from the host's data loader)
            v.step(sf if ember_v else ids_h, dense, labels) if on_host else v.step(ids_d, dense, labels)
            e = time.perf_counter() - s
            if ember_v:
                v.account()
            s = time.perf_counter()
            v.embedding_path(v.features(ids_e) if ember_v else ids_e if on_host else ids_e_d, cot)
            e2 = time.perf_counter() - s
            if ember_v:
                v.account()
            if i >= warmup // 2:
                times[v.name].append(e)
                emb_times[v.name].append(e2)
    ratio = lambda ref, var: statistics.median(r / x for r, x in zip(times[ref], times[var]))  # noqa: E731
    n_ids = batches[0][0].numel()
    out: dict[str, Any] = {
        "ms_per_step": {k: statistics.median(t) * 1e3 for k, t in times.items()},
        "embedding_ids_per_s": {k: n_ids / statistics.median(t) for k, t in emb_times.items()},
        "cache_vs_host": ratio("ember-host", "ember-cache-1/4"),
        "cache_vs_all_device": ratio("ember-all-device", "ember-cache-1/4"),
        "cache_vs_plain_gpu": ratio("plain-gpu", "ember-cache-1/4"),
        "mapped_vs_host": ratio("ember-host", "ember-mapped"),
        "mapped_vs_all_device": ratio("ember-all-device", "ember-mapped"),
        "mapped_vs_plain_gpu": ratio("plain-gpu", "ember-mapped"),
        "device_index_vs_host": ratio("ember-host", "ember-device-index"),
        "device_index_vs_all_device": ratio("ember-all-device", "ember-device-index"),
        "device_index_vs_plain_gpu": ratio("plain-gpu", "ember-device-index"),
        "device_index_graphs_vs_eager": ratio("ember-device-index-eager", "ember-device-index"),
        "hot_vs_host": ratio("ember-host", "ember-device-index-hot-1/4"),
        "hot_vs_all_device": ratio("ember-device-index-hot-all", "ember-device-index-hot-1/4"),
        "hot_vs_device_index": ratio("ember-device-index", "ember-device-index-hot-1/4"),
        "hot_vs_plain_gpu": ratio("plain-gpu", "ember-device-index-hot-1/4"),
        "cache_hit_rate": {}, "transfer_mb_per_step": {}, "transfer_vs_misses_evictions": {},
    }
    w = 2 * (warmup // 2)  # two accounted steps per pair (full step, embedding path)
    for v in ember_vs:
        moved, expected, requests = sum(v.moved[w:]), sum(v.expected[w:]), sum(v.requests[w:])
        out["cache_hit_rate"][v.name] = sum(v.hits[w:]) / requests if requests else None  # after warm-up
        out["transfer_mb_per_step"][v.name] = moved / max(len(v.moved) - w, 1) / 2**20
        out["transfer_vs_misses_evictions"][v.name] = moved / expected if expected else None
    for k in times:
        print(f"{k:<17} {out['ms_per_step'][k]:8.2f} ms/step  embedding path {out['embedding_ids_per_s'][k] / 1e6:8.2f} M IDs/s")
    print(f"ember-cache-1/4 speed vs ember-host: {out['cache_vs_host']:.3f}x (target >= 2); vs ember-all-device: "
          f"{out['cache_vs_all_device']:.3f}x (target >= 0.9); vs plain-gpu: {out['cache_vs_plain_gpu']:.3f}x")
    print(f"ember-mapped (records in pinned host memory, the index on the device) vs ember-host: "
          f"{out['mapped_vs_host']:.3f}x; vs ember-all-device: {out['mapped_vs_all_device']:.3f}x; "
          f"vs plain-gpu: {out['mapped_vs_plain_gpu']:.3f}x")
    print(f"ember-device-index (storage.index: device, through the trainer's own path) vs ember-host: "
          f"{out['device_index_vs_host']:.3f}x; vs ember-all-device: {out['device_index_vs_all_device']:.3f}x; "
          f"vs plain-gpu: {out['device_index_vs_plain_gpu']:.3f}x; its CUDA graphs vs the same operation by operation: "
          f"{out['device_index_graphs_vs_eager']:.3f}x")
    print(f"ember-device-index-hot-1/4 (storage.index: device, 1/4 of each table's rows read most in GPU memory) vs "
          f"ember-host: {out['hot_vs_host']:.3f}x; vs every row hot: {out['hot_vs_all_device']:.3f}x; vs no hot rows: "
          f"{out['hot_vs_device_index']:.3f}x; vs plain-gpu: {out['hot_vs_plain_gpu']:.3f}x")
    for v in ember_vs:
        hr, tr = out["cache_hit_rate"][v.name], out["transfer_vs_misses_evictions"][v.name]
        print(f"{v.name:<17} hit rate {'-' if hr is None else f'{hr:.3f}'}; host<->device "
              f"{out['transfer_mb_per_step'][v.name]:.2f} MiB/step"
              + ("" if tr is None else f" = {tr:.3f} x (misses + evictions) x record bytes"))
    return out


def trainer_batches(batches: list) -> list[Batch]:
    """The bench's batches as the trainer's ``Batch`` (host memory, single-hot features C1..C26)."""
    keys = [f"C{i + 1}" for i in range(F)]
    out = []
    for ids, dense, labels in batches:
        n = ids.numel()
        out.append(Batch(dense, SparseFeatures(keys, torch.as_tensor(ids).reshape(-1), torch.ones(n, dtype=torch.int64)), labels))
    return out


def compare_trainer(dev: torch.device, batches: list, vocab: int, warmup: int, rounds: int,
                    staleness: tuple[int, ...] = (0, 1)) -> dict[str, Any]:
    """ember's pipelined trainer (``train(cfg, batches=...)``: plan and fetch of later batches on
    the pipeline's threads) on the same batches, rows in a 1/4 group cache or in host memory,
    at each embedding staleness: samples/s after ``warmup`` steps, variants alternating over
    ``rounds``; the paired ratio cache / host per staleness. At staleness 0 also the 1/4 cache
    with its host half not prepared ahead (``TrainStages.fetch``; "-inline-plan"): the paired
    ratio ``trainer_prepared_ahead_gain`` says what preparing a batch ahead is worth."""
    import benchkit
    from bench_pipeline import timed_rate
    import ember.train.loop as loop

    tb = trainer_batches(batches)
    steps = len(tb) - warmup
    log_every = math.gcd(warmup, steps)
    cache = {"device_rows": max(vocab // 4, 1), "device": dev.type, "admit_after": 1}
    storages = {"cache-1/4": cache, "host": {"index": "host"}, "device-index": {"index": "device", "device": dev.type}}
    names = [(f"trainer-{n}-k{k}", st, k) for k in staleness for n, st in storages.items()]
    if 0 in staleness:
        names.append(("trainer-cache-1/4-k0-inline-plan", cache, 0))
    rates: dict[str, list[float]] = {n: [] for n, _, _ in names}
    ahead = loop._prepared_ahead
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(rounds):
            order = names if r % 2 == 0 else names[::-1]
            for name, storage, k in order:
                raw = benchkit.dlrm_config({"synthetic": {"num_sparse": F, "vocab_size": vocab, "eval_rows": 1024}},
                                           batch_size=tb[0].size)
                raw["embedding"]["storage"] = storage
                raw["train"].update(device=dev.type, max_steps=len(tb), epochs=1, log_every=log_every, seed=0)
                raw["pipeline"] = {"embedding_staleness": k}
                loop._prepared_ahead = (lambda parts: 0) if name.endswith("-inline-plan") else ahead
                try:
                    res = benchkit.run_training(raw, Path(tmp), name.replace("/", "-"), batches=tb)
                finally:
                    loop._prepared_ahead = ahead
                rates[name].append(timed_rate(res.history, warmup)[0])
                res.parts.embeddings.close()
    med = {n: statistics.median(x) for n, x in rates.items()}
    out: dict[str, Any] = {"trainer_samples_per_s": med, "trainer_steps": steps}
    for k in staleness:
        c, h = rates[f"trainer-cache-1/4-k{k}"], rates[f"trainer-host-k{k}"]
        out[f"trainer_cache_vs_host_k{k}"] = statistics.median(a / b for a, b in zip(c, h))
        d = rates[f"trainer-device-index-k{k}"]
        out[f"trainer_device_index_vs_host_k{k}"] = statistics.median(a / b for a, b in zip(d, h))
    if 0 in staleness:
        c, i = rates["trainer-cache-1/4-k0"], rates["trainer-cache-1/4-k0-inline-plan"]
        out["trainer_prepared_ahead_gain"] = statistics.median(a / b for a, b in zip(c, i))
    for n, v in med.items():
        print(f"{n:<34} {v:10.0f} samples/s (median of {rounds}, {steps} timed steps after {warmup})")
    print("trainer, 1/4 cache vs host rows: " + ", ".join(f"staleness {k}: {out[f'trainer_cache_vs_host_k{k}']:.3f}x"
                                                         for k in staleness)
          + (f"; prepared ahead vs not (staleness 0): {out['trainer_prepared_ahead_gain']:.3f}x" if 0 in staleness else ""))
    print("trainer, storage.index: device vs host rows: " + ", ".join(
        f"staleness {k}: {out[f'trainer_device_index_vs_host_k{k}']:.3f}x" for k in staleness))
    return out


def main() -> None:
    allocator.reexec_tuned([__file__, *sys.argv[1:]])  # as the ember command line runs (see ember/allocator.py)
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=40, help="timed steps (CUDA)")
    ap.add_argument("--warmup", type=int, default=80, help="steps before timing and before the budgets (CUDA; the "
                    "1/4 cache is full and evicting from step ~66 on)")
    ap.add_argument("--budget-steps", type=int, default=3, help="steps measured under DeviceBudget per variant")
    ap.add_argument("--batch", type=int, default=4096)
    ap.add_argument("--cpu-batch", type=int, default=1024, help="batch on a CPU (budgets only)")
    ap.add_argument("--cpu-warmup", type=int, default=3, help="warm-up steps on a CPU")
    ap.add_argument("--vocab", type=int, default=V, help="IDs per table")
    ap.add_argument("--trainer", type=int, default=0, help="also run the pipelined trainer this many timed steps "
                    "(1/4 cache vs host rows, staleness 0 and 1)")
    ap.add_argument("--trainer-warmup", type=int, default=80, help="trainer steps before timing (the cache fills)")
    ap.add_argument("--trainer-rounds", type=int, default=2)
    ap.add_argument("--phases", type=int, default=0, help="also time each phase of the embedding path over this many steps")
    ap.add_argument("--profile-top", type=int, default=0, help="with --phases: cProfile's top functions of the 1/4 cache")
    args = ap.parse_args()
    cuda = torch.cuda.is_available()
    dev = torch.device("cuda" if cuda else "cpu")
    bench_dlrm.W = bench_dlrm.Workload([args.vocab] * F)
    batch = args.batch if cuda else args.cpu_batch
    warmup = args.warmup if cuda else args.cpu_warmup
    n = max(2 * args.steps if cuda else 0, args.budget_steps + 1, 2 * args.phases) + warmup  # (CUDA: steps in pairs)
    batches = make_batches(n, batch, zipf=ZIPF)
    where = torch.cuda.get_device_name() if cuda else "CPU (device arena in host memory)"
    print(f"{where}; {F} tables x {args.vocab} IDs, Zipf {ZIPF}, batch {batch}; budgets over {args.budget_steps} steps "
          f"after {warmup} warm-up steps")
    out: dict[str, Any] = {"bench": "gpu_cache", "device": where, "batch": batch, "vocab": args.vocab, "zipf": ZIPF}
    if args.phases:
        out["phase_ms"] = profile_phases(dev, batches, args.vocab, warmup, args.phases,
                                         {"ember-cache-1/4": 4, "ember-all-device": 1, "ember-host": None}, args.profile_top)
    if not cuda:  # the torch paths a GPU runs: the C core serves CPU tensors only, through .numpy()
        from ember import _native
        _native._core = None
        print("budgets with the native core off (the torch paths a GPU step takes)")
    out.update(budget_summary(measure_budgets(dev, batches, args.vocab, warmup, args.budget_steps)))
    mb = measure_mapped_budget(dev, batches, warmup, args.budget_steps)
    out["mapped_ops_per_step"], out["mapped_syncs_per_step"] = mb["ops_per_step"], mb["syncs_per_step"]
    out["mapped_budget"] = mb
    if cuda:
        out["steps"] = args.steps
        out.update(compare_on_gpu(dev, batches, args.vocab, warmup))
    else:
        print("no CUDA: the timing comparison (ms/step, IDs/s, hit rate, transfer vs ember-host, all-device and "
              "plain PyTorch) runs only on a GPU; budgets above are the CPU check")
    if args.trainer:
        tb = make_batches(args.trainer_warmup + args.trainer, batch, seed=1, zipf=ZIPF)
        out.update(compare_trainer(dev, tb, args.vocab, args.trainer_warmup, args.trainer_rounds))
    from benchkit import json_line  # the machine (CPU model, bf16) in the final line
    print(json_line(out))


if __name__ == "__main__":
    main()
