"""The device-resident index (``ember.tiers.device_index.DeviceIndex``) against the host index a
GPU step waits for today (``KeyIndex``, probed by the native core), on the same batches.

Workload: ``--rows`` (table, ID) pairs of 26 tables already indexed; then batches of ``--batch-ids``
unique pairs, Zipf(1.05) over the indexed pairs with a ``--new`` share never seen (a DLRM-26 step at
batch 4,096 has ~50 k unique pairs). Per batch, in rotating order:

  device find_or_insert   a training step's look-up: rows of the pairs, the new ones inserted
  device find             an eval step's look-up
  host probe              KeyIndex.lookup of the mixed keys (ID ^ per-table constant) on the
                          host, the new ones inserted, and (CUDA) the rows' copy to the device

Each is timed as the host sees it (``busy``: until the call returns; what the device index costs
the step's thread is its launches) and until the device is done (``done``: synchronised). With
``DeviceBudget``: operations launched and syncs per call.

    python bench/bench_device_index.py [--rows 1000000] [--batch-ids 50000] [--new 0.05] [--steps 30]
        [--device cuda|cpu]

The last line is one JSON object: find_or_insert_ms, find_ms, host_index_ms (median ``done`` ms),
*_busy_ms, device_ops_find_or_insert, device_ops_find, syncs_per_call, device, machine.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

import ember  # noqa: F401  # before torch
import torch

from benchkit import json_line, machine
from ember.tiers.device_budget import DeviceBudget, to_device
from ember.tiers.device_index import DeviceIndex
from ember.tiers.group_cache import table_mix
from ember.tiers.key_index import KeyIndex

TABLES = 26


def batches(rows: int, n: int, new: float, steps: int, seed: int = 0) -> tuple[tuple[np.ndarray, np.ndarray], list]:
    """The indexed pairs (keys, tags), and ``steps`` batches of ``n`` unique pairs each."""
    rng = np.random.default_rng(seed)
    keys = rng.integers(0, 2**62, size=rows, dtype=np.int64)
    tags = rng.integers(0, TABLES, size=rows).astype(np.int32)
    weights = 1.0 / np.arange(1, rows + 1) ** 1.05
    cdf = np.cumsum(weights) / weights.sum()
    out = []
    for _ in range(steps):
        m = int(n * (1 - new))
        pick = np.unique(np.searchsorted(cdf, rng.random(3 * m)))[:m]  # distinct hot pairs
        fresh = rng.integers(2**62, 2**63 - 1, size=n - pick.size, dtype=np.int64)
        k = np.concatenate([keys[pick], fresh])
        t = np.concatenate([tags[pick], rng.integers(0, TABLES, size=fresh.size).astype(np.int32)])
        order = rng.permutation(k.size)
        out.append((k[order], t[order]))
    return (keys, tags), out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--batch-ids", type=int, default=50_000)
    ap.add_argument("--new", type=float, default=0.05)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    a = ap.parse_args()
    dev = torch.device(a.device)
    cuda = dev.type == "cuda"
    (keys, tags), work = batches(a.rows, a.batch_ids, a.new, a.steps + a.warmup + 1)
    # grown to hold the whole run's inserts up front: growth (a sync, once per doubling) is not timed
    index = DeviceIndex(a.rows + (a.steps + a.warmup + 1) * a.batch_ids, dev)
    index.find_or_insert(torch.from_numpy(keys).to(dev), torch.from_numpy(tags).to(dev))
    host = KeyIndex(a.rows)
    mix = table_mix(TABLES)
    host.insert(keys ^ mix[tags], np.arange(a.rows, dtype=np.int32))

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize(dev)

    def device_insert(k: np.ndarray, t: np.ndarray) -> None:
        index.find_or_insert(torch.from_numpy(k).to(dev, non_blocking=True), torch.from_numpy(t).to(dev, non_blocking=True))

    def device_find(k: np.ndarray, t: np.ndarray) -> None:
        index.find(torch.from_numpy(k).to(dev, non_blocking=True), torch.from_numpy(t).to(dev, non_blocking=True))

    pinned = torch.empty(a.batch_ids, dtype=torch.int64, pin_memory=cuda)

    def host_probe(k: np.ndarray, t: np.ndarray) -> None:
        mixed = k ^ mix[t]
        slots = host.lookup(mixed)
        absent = np.flatnonzero(slots < 0)
        fresh = np.arange(len(host), len(host) + absent.size, dtype=np.int32)
        host.insert(mixed[absent], fresh)
        slots[absent] = fresh
        pinned[: slots.size].numpy()[:] = slots
        pinned[: slots.size].to(dev, non_blocking=True)

    variants = {"find_or_insert": device_insert, "find": device_find, "host_index": host_probe}
    busy: dict[str, list[float]] = {v: [] for v in variants}
    done: dict[str, list[float]] = {v: [] for v in variants}
    names = list(variants)
    for i, (k, t) in enumerate(work[1:]):
        for j in range(len(names)):
            name = names[(i + j) % len(names)]
            sync()
            t0 = time.perf_counter()
            variants[name](k, t)
            t1 = time.perf_counter()
            sync()
            t2 = time.perf_counter()
            if i >= a.warmup:
                busy[name].append((t1 - t0) * 1e3)
                done[name].append((t2 - t0) * 1e3)
    k, t = work[0]
    with DeviceBudget(dev) as budget:
        if not cuda:
            budget.mark(index.keys, index.tags, index.rows, index.fill, index.counts)
        kd, td = to_device(torch.from_numpy(k), dev), to_device(torch.from_numpy(t), dev)
        budget.reset()
        index.find_or_insert(kd, td)
        ops_insert, syncs_insert = budget.ops, budget.syncs
        budget.reset()
        index.find(kd, td)
        ops_find, syncs_find = budget.ops, budget.syncs
    index.check()  # no insert lost a way
    med = {v: statistics.median(x) for v, x in done.items()}
    med_busy = {v: statistics.median(x) for v, x in busy.items()}
    print(f"device {dev}, {a.rows:,} pairs indexed, batches of {a.batch_ids:,} unique pairs ({a.new:.0%} new), "
          f"{a.steps} steps; index {index.nbytes / 2**20:.0f} MiB on the device")
    print(f"{'variant':<16}{'done ms':>10}{'busy ms':>10}")
    for v in names:
        print(f"{v:<16}{med[v]:>10.3f}{med_busy[v]:>10.3f}")
    print(f"device ops per call: find_or_insert {ops_insert}, find {ops_find}; syncs {syncs_insert + syncs_find}")
    print(json_line({
        "bench": "device_index", "device": str(dev), "rows": a.rows, "batch_ids": a.batch_ids, "new": a.new, "steps": a.steps,
        "find_or_insert_ms": med["find_or_insert"], "find_ms": med["find"], "host_index_ms": med["host_index"],
        "find_or_insert_busy_ms": med_busy["find_or_insert"], "find_busy_ms": med_busy["find"],
        "host_index_busy_ms": med_busy["host_index"], "device_ops_find_or_insert": ops_insert, "device_ops_find": ops_find,
        "syncs_per_call": max(syncs_insert, syncs_find), "index_mib": index.nbytes / 2**20,
        "gpu": torch.cuda.get_device_name(dev) if cuda else None, "machine": machine(),
    }))


if __name__ == "__main__":
    main()
