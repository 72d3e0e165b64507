"""Tiered embedding storage benchmarks: throughput vs all-in-memory, cache quality, disk layouts, capacity.

Modes (default: --zipf):
  --zipf      Zipf 1.05 and 1.2 over a table 4x larger than its host budget; paired, interleaved
              steps of the same batches on an all-in-memory table and a tiered one
              (device cache -> host cache -> disk); reports the median time ratio and the
              device-cache hit rate vs the ideal (share of requests to the top-K IDs).
  --layouts   batched random read/write throughput and RAM per row of disk layouts
              (ember's hashed mmap slots vs LMDB), page cache dropped before cold reads.
  --capacity  625 M rows x dim 16 + row-wise Adagrad state on the disk tier, filled in
              resumable passes, then trained on Zipf IDs over the whole range; prints the
              capacity plan first and, at the end, the measured disk blocks and anonymous RSS
              growth against it (`--dtype bf16` stores bf16 rows; `--rows 62500000` is the
              1 B-parameter run).
  --plan-only the capacity plans of the 10 B-parameter run (or --rows) in fp32, bf16 and fp16
              side by side, without allocating anything.

Prints a table and a final JSON line.

Example:
    python bench/bench_tiers.py --zipf --rows 2000000 --steps 60
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from ember.batch import SparseFeatures
from ember.embedding import EmbeddingTable, FeatureConfig, TableConfig, TableGroup
from ember.tiers import DiskTier
from ember.mix import mix64

torch.set_num_threads(1)  # small per-batch ops: threads only add OpenMP stalls on a busy 2-core box


def zipf_sampler(n: int, a: float, seed: int):
    """Draws IDs whose ranks follow a Zipf(a) law truncated to n ranks; ranks -> spread IDs."""
    rng = np.random.default_rng(seed)
    w = np.arange(1, n + 1, dtype=np.float64) ** -a
    cdf = np.cumsum(w)
    cdf /= cdf[-1]

    def draw(k: int) -> np.ndarray:
        ranks = np.searchsorted(cdf, rng.random(k))
        return rank_to_id(ranks)

    return draw, cdf


def rank_to_id(ranks: np.ndarray) -> np.ndarray:
    return (mix64(ranks.astype(np.uint64)) >> np.uint64(1)).view(np.int64)  # hot IDs are not contiguous


def rss_mib() -> dict[str, float]:
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(("VmRSS", "RssAnon", "RssFile", "VmHWM")):
                k, v = line.split(":")
                out[k] = int(v.split()[0]) / 1024
    return out


_GROUPS: dict[int, TableGroup] = {}


def step(table: EmbeddingTable, ids_np: np.ndarray, gen: torch.Generator) -> None:
    """One training step of one table through the engine's phases (a group of one), with a
    random gradient per unique ID in place of a model's."""
    group = _GROUPS.get(id(table))
    if group is None or group.tables[0] is not table:
        group = _GROUPS[id(table)] = TableGroup([table], {table.name: [FeatureConfig(name="f", table=table.name)]})
    ids = torch.from_numpy(ids_np)
    lk = group.plan(SparseFeatures(["f"], ids, torch.ones_like(ids)), train=True).fetch()
    lk.backward(torch.randn(lk.ids.numel(), table.dim, generator=gen) * 0.01)
    lk.update()
    lk.write_back()


# ---- zipf: throughput vs all-in-memory, cache quality --------------------------------------------
def bench_zipf(args) -> dict:
    rows, dim = args.rows, 16
    results = {}
    for a in (1.05, 1.2):
        draw, cdf = zipf_sampler(rows, a, seed=1)
        batches = [draw(args.batch) for _ in range(args.warmup + args.steps)]
        tmp = Path(tempfile.mkdtemp(prefix="ember-bench-", dir=args.dir))
        opt = {"type": "rowwise_adagrad", "lr": 0.05}
        mem = EmbeddingTable(TableConfig(name="t", dim=dim, optimizer=opt))
        host_rows = rows // 4
        dev_rows = rows // 64
        layouts = {  # name: (storage, first cache tier, its rows)
            "host4+disk/lfu": (dict(host_rows=host_rows, policy="lfu", admit_after=2), "host", host_rows),
            "dev64+host4+disk/lfu": (dict(device_rows=dev_rows, device="cpu", host_rows=host_rows,
                                          policy="lfu", admit_after=2), "device", dev_rows),
            "dev64+host4+disk/lru": (dict(device_rows=dev_rows, device="cpu", host_rows=host_rows,
                                          policy="lru", admit_after=1), "device", dev_rows),
        }
        tiered = {
            k: EmbeddingTable(
                TableConfig(name="t", dim=dim, optimizer=opt,
                            storage=dict(disk_path=str(tmp / k), disk_rows=rows, **v[0]))
            )
            for k, v in layouts.items()
        }
        all_ids = torch.from_numpy(rank_to_id(np.arange(rows)))
        for t in [mem, *tiered.values()]:  # every row materialised: table = 4x the host budget
            for s in range(0, rows, 1 << 20):
                chunk = all_ids[s : s + (1 << 20)]
                t.load(chunk, t.new_records(chunk))
        # warm start: ID frequencies counted over a data sample (the warm-up batches) fill the caches
        sample_ids, sample_counts = np.unique(np.concatenate(batches[: args.warmup]), return_counts=True)
        for t in tiered.values():
            t.warm_start(torch.from_numpy(sample_ids), torch.from_numpy(sample_counts))
        variants = {"memory": mem, **tiered}
        times: dict[str, list[float]] = {k: [] for k in variants}
        # kernel time and page faults of each variant's steps (this thread): where a CPU's
        # syscall and fault costs show up (madvise per row cost 6 of 12 ms a step on one VM)
        kern = {k: np.zeros(3) for k in variants}  # system s, minor faults, major faults
        gens = {k: torch.Generator().manual_seed(0) for k in variants}
        names = list(variants)
        for i, b in enumerate(batches):
            if i == args.warmup:
                for t in tiered.values():
                    t.reset_step_stats()
            order = names[i % len(names):] + names[: i % len(names)]  # rotate who goes first
            for k in order:
                r0 = resource.getrusage(resource.RUSAGE_THREAD)
                t0 = time.perf_counter()
                step(variants[k], b, gens[k])
                if i >= args.warmup:
                    times[k].append(time.perf_counter() - t0)
                    r1 = resource.getrusage(resource.RUSAGE_THREAD)
                    kern[k] += (r1.ru_stime - r0.ru_stime, r1.ru_minflt - r0.ru_minflt, r1.ru_majflt - r0.ru_majflt)
        # ideal hit rate of a K-row cache on this request stream (unique IDs per batch)
        req = np.concatenate([np.unique(b) for b in batches[args.warmup:]])
        _, counts = np.unique(req, return_counts=True)
        counts = np.sort(counts)[::-1]
        tm = np.array(times["memory"])
        for k, t in tiered.items():
            _, first, k_rows = layouts[k]
            ideal = counts[:k_rows].sum() / counts.sum()
            ratio = np.median(tm / np.array(times[k]))
            st = t.stats()
            hit = st[f"tier.{first}.hit_rate"]
            results[f"zipf{a}/{k}"] = {
                "throughput_vs_memory": round(float(ratio), 3),
                "ms_step_memory": round(float(np.median(tm)) * 1e3, 1),
                "ms_step_tiered": round(float(np.median(times[k])) * 1e3, 1),
                "first_cache": first, "cache_rows": k_rows,
                "hit_rate": round(hit, 4),
                "ideal_hit_rate": round(float(ideal), 4),
                "hit_vs_ideal": round(hit / ideal, 3),
                "disk_share_of_requests": round(st["tier.disk.requests"] / len(req) * args.steps / args.steps, 4),
                "rows": rows, "host_rows": host_rows,
                "unique_ids_per_step": int(len(req) / args.steps),
                "sys_ms_per_step": round(kern[k][0] / args.steps * 1e3, 2),
                "memory_sys_ms_per_step": round(kern["memory"][0] / args.steps * 1e3, 2),
                "minor_faults_per_step": round(kern[k][1] / args.steps, 1),
                "major_faults_per_step": round(kern[k][2] / args.steps, 2),
            }
            t.close()
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"{'variant':<31}{'tiered/mem':>11}{'ms mem':>9}{'ms tier':>9}{'cache':>8}{'hit':>8}{'ideal':>8}{'hit/ideal':>10}"
          f"{'sys ms':>8}{'faults':>8}")
    for k, r in results.items():
        print(f"{k:<31}{r['throughput_vs_memory']:>11}{r['ms_step_memory']:>9}{r['ms_step_tiered']:>9}"
              f"{r['first_cache']:>8}{r['hit_rate']:>8}{r['ideal_hit_rate']:>8}{r['hit_vs_ideal']:>10}"
              f"{r['sys_ms_per_step']:>8}{r['minor_faults_per_step']:>8}")
    return results


# ---- layouts: disk tier vs LMDB ---------------------------------------------------------------------
def _drop_cache(path: Path) -> None:
    for f in path.rglob("*"):
        if f.is_file():
            fd = os.open(f, os.O_RDONLY)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            os.close(fd)


def bench_layouts(args) -> dict:
    n, r, k = args.rows, 17, 65536
    rng = np.random.default_rng(0)
    ids = rank_to_id(np.arange(n))
    recs = rng.standard_normal((n, r)).astype(np.float32)
    probe = [ids[rng.integers(0, n, k)] for _ in range(5)]
    probe = [np.unique(p) for p in probe]
    out = {}
    tmp = Path(tempfile.mkdtemp(prefix="ember-layout-", dir=args.dir))

    d = DiskTier(tmp / "slots", r, rows=n, max_load=0.85)
    t0 = time.perf_counter()
    for s in range(0, n, 1 << 20):
        d.put(torch.from_numpy(ids[s : s + (1 << 20)]), torch.from_numpy(recs[s : s + (1 << 20)]))
    d.flush()
    fill = n / (time.perf_counter() - t0)
    res = {"fill_rows_s": fill, "ram_bytes_per_row": d.ram_bytes / n, "disk_bytes_per_row": d.nbytes / n}
    for label, cold in (("warm", False), ("cold", True)):
        rd, wr = [], []
        for p in probe:
            if cold:
                d.flush()
                _drop_cache(tmp / "slots")
            t0 = time.perf_counter()
            got = torch.empty(p.size, d.record_dim)
            found = d.get_into(torch.from_numpy(p), got)
            rd.append(p.size / (time.perf_counter() - t0))
            assert bool(found.all())
            t0 = time.perf_counter()
            d.put(torch.from_numpy(p), got)
            wr.append(p.size / (time.perf_counter() - t0))
        res[f"{label}_read_rows_s"] = float(np.median(rd))
        res[f"{label}_write_rows_s"] = float(np.median(wr))
    d.close()
    out["ember_mmap_slots"] = res

    try:
        import lmdb
    except ImportError:
        out["lmdb"] = {"skipped": "pip install lmdb"}
    else:
        env = lmdb.open(str(tmp / "lmdb"), map_size=max(1 << 30, n * 400), writemap=True, sync=False, metasync=False)
        keys = [int(x).to_bytes(8, "big", signed=True) for x in ids]  # setup only
        vals = [recs[i].tobytes() for i in range(n)]
        t0 = time.perf_counter()
        with env.begin(write=True) as txn:
            txn.cursor().putmulti(list(zip(keys, vals)))
        env.sync()
        fill = n / (time.perf_counter() - t0)
        size = sum(f.stat().st_blocks * 512 for f in (tmp / "lmdb").iterdir())  # allocated, not apparent
        res = {"fill_rows_s": fill, "ram_bytes_per_row": 0.0, "disk_bytes_per_row": size / n}
        for label, cold in (("warm", False), ("cold", True)):
            rd, wr = [], []
            for p in probe:
                if cold:
                    env.sync()
                    _drop_cache(tmp / "lmdb")
                pk = [int(x).to_bytes(8, "big", signed=True) for x in p]
                t0 = time.perf_counter()
                with env.begin() as txn:
                    got = txn.cursor().getmulti(pk)
                    arr = np.frombuffer(b"".join(v for _, v in got), dtype=np.float32).reshape(-1, r)
                rd.append(p.size / (time.perf_counter() - t0))
                assert arr.shape[0] == p.size
                t0 = time.perf_counter()
                with env.begin(write=True) as txn:
                    txn.cursor().putmulti([(kk, arr[i].tobytes()) for i, kk in enumerate(pk)])
                wr.append(p.size / (time.perf_counter() - t0))
            res[f"{label}_read_rows_s"] = float(np.median(rd))
            res[f"{label}_write_rows_s"] = float(np.median(wr))
        env.close()
        out["lmdb"] = res
    shutil.rmtree(tmp, ignore_errors=True)
    print(f"{'layout':<18}{'fill r/s':>12}{'warm rd':>12}{'warm wr':>12}{'cold rd':>12}{'cold wr':>12}{'RAM B/row':>10}{'disk B/row':>11}")
    for name, v in out.items():
        if "skipped" in v:
            print(f"{name:<18} skipped: {v['skipped']}")
            continue
        print(f"{name:<18}{v['fill_rows_s']:>12.3g}{v['warm_read_rows_s']:>12.3g}{v['warm_write_rows_s']:>12.3g}"
              f"{v['cold_read_rows_s']:>12.3g}{v['cold_write_rows_s']:>12.3g}{v['ram_bytes_per_row']:>10.2f}{v['disk_bytes_per_row']:>11.1f}")
    return {"layouts": out, "rows": n, "record_floats": r, "batch": k}


# ---- capacity: 10 B parameters on the disk tier -----------------------------------------------------
def capacity_plan(rows: int, host_rows: int, dtype: str, root: str = "."):
    """The tier plan of the capacity run: a disk tier sized for ``rows`` at load 0.9 behind an
    LFU host cache of ``host_rows``, dim 16 + row-wise Adagrad, rows stored at ``dtype``."""
    from ember.tiers import StorageConfig, plan_storage

    cfg = TableConfig(name="big", dim=16, optimizer={"type": "rowwise_adagrad", "lr": 0.05}, dtype=dtype)
    storage = StorageConfig(host_rows=host_rows, policy="lfu", disk_path=str(root), disk_rows=rows, disk_max_load=0.9)
    return cfg, plan_storage(storage, cfg.stored_words, "big")


def bench_plan(args) -> dict:
    """Planned bytes of the capacity run per row dtype, and each one's ratio to fp32."""
    out = {}
    for dtype in ("fp32", "bf16", "fp16"):
        _, plan = capacity_plan(args.rows, args.host_rows, dtype)
        print(plan.describe().replace("table 'big'", f"{dtype}: table 'big'"), flush=True)
        out[dtype] = {"disk_bytes": plan.disk_bytes, "host_bytes": plan.host_bytes,
                      "total_bytes": plan.disk_bytes + plan.host_bytes}
    for dtype in ("bf16", "fp16"):
        for k in ("disk", "host", "total"):
            out[dtype][f"{k}_vs_fp32"] = round(out[dtype][f"{k}_bytes"] / out["fp32"][f"{k}_bytes"], 4)
    print(f"bf16 / fp32 planned bytes: disk {out['bf16']['disk_vs_fp32']}, RAM {out['bf16']['host_vs_fp32']}, "
          f"total {out['bf16']['total_vs_fp32']}")
    return {"rows": args.rows, "embedding_params": args.rows * 16, "host_rows": args.host_rows, **out}


def _trim() -> None:
    """Hand the C heap's free pages back to the kernel, so RSS shows live memory only."""
    import ctypes

    ctypes.CDLL("libc.so.6").malloc_trim(0)


def _settled_anon_mib(cfg: TableConfig, root: Path) -> float:
    """Anonymous RSS after the same code paths ran once on a small throwaway table (torch's
    and numpy's one-time allocations are made), heap trimmed: the baseline the plan adds to."""
    from ember.tiers import CachedTier, HostTier

    d = DiskTier(root / "warmup", cfg.stored_words, rows=50_000, max_load=0.9)
    small = EmbeddingTable(cfg, tier=CachedTier(HostTier(cfg.stored_words, capacity=5_000, policy="lfu"), d, admit_after=2))
    gen = torch.Generator().manual_seed(0)
    for _ in range(3):
        step(small, rank_to_id(np.arange(40_000)), gen)
    small.flush()
    del small, d
    _GROUPS.clear()
    shutil.rmtree(root / "warmup", ignore_errors=True)
    _trim()
    return rss_mib()["RssAnon"]


def _fill_pass(disk: DiskTier, table: EmbeddingTable, rows: int, parts: int, p: int, chunk: int = 1 << 22) -> None:
    """Insert the IDs of the p-th of ``parts`` regions of the disk file."""
    # Collect this region's IDs, then insert them in home-slot order: the writes then sweep
    # the region once, front to back. Inserting them in ID order instead dirties each page of
    # the region dozens of times, and once the file outgrows the page cache every one of
    # those is written back (7-12 min per pass instead of ~2).
    mine, homes = [], []
    for s in range(0, rows, chunk):
        ids = rank_to_id(np.arange(s, min(rows, s + chunk)))
        home, _ = disk._hash(ids)
        sel = (home * parts // disk.n_slots) == p
        mine.append(ids[sel])
        homes.append(home[sel])
    ids_p = np.concatenate(mine)
    ids_p = ids_p[np.argsort(np.concatenate(homes), kind="stable")]
    del mine, homes
    for s in range(0, ids_p.size, chunk):
        sub = torch.from_numpy(ids_p[s : s + chunk])
        table.load(sub, table.new_records(sub))
    del ids_p


def bench_capacity(args) -> dict:
    rows, dim = args.rows, 16
    root = Path(args.dir or ".") / "ember-capacity"
    root.mkdir(parents=True, exist_ok=True)
    state_file = root / "progress.json"
    progress = json.loads(state_file.read_text()) if state_file.exists() else {"pass": 0, "dtype": args.dtype}
    if progress.get("dtype", "fp32") != args.dtype:
        raise SystemExit(f"{root} holds a {progress.get('dtype', 'fp32')} fill; rerun with --dtype "
                         f"{progress.get('dtype', 'fp32')} or delete it")
    cfg, plan = capacity_plan(rows, args.host_rows, args.dtype, str(root))
    print(plan.describe(), flush=True)
    anon0 = _settled_anon_mib(cfg, root)  # the process before the big tiers: what the plan's RAM adds to
    disk_dir = root / "big"
    reopen = progress["pass"] > 0
    if not reopen:
        plan.check()
    disk = DiskTier(disk_dir, cfg.stored_words, rows=rows, max_load=0.9, reopen=reopen)
    table = EmbeddingTable(cfg, tier=disk)
    parts = args.passes
    t_fill = time.perf_counter()
    for p in range(progress["pass"], parts):  # pass p fills the p-th region of the file: writes stay local
        t0 = time.perf_counter()
        _fill_pass(disk, table, rows, parts, p)  # a function: its chunk arrays die with it
        disk.close()  # tags + clean meta: the fill resumes from the next pass after a kill
        progress["pass"] = p + 1
        state_file.write_text(json.dumps(progress))
        disk = DiskTier(disk_dir, cfg.stored_words, reopen=True)
        table = EmbeddingTable(cfg, tier=disk)
        print(f"fill pass {p + 1}/{parts}: {len(disk):,} rows, {time.perf_counter() - t0:.0f} s, RSS {rss_mib()}", flush=True)
    fill_s = time.perf_counter() - t_fill
    assert len(disk) == rows, (len(disk), rows)
    # training on Zipf IDs over the whole range (the disk tier holds everything; the host cache in front)
    from ember.tiers import CachedTier, HostTier

    tier = CachedTier(HostTier(cfg.stored_words, capacity=args.host_rows, policy="lfu"), disk, admit_after=2)
    assert tier.nbytes - disk.nbytes + disk.ram_bytes <= plan.host_bytes
    table = EmbeddingTable(cfg, tier=tier)
    rng = np.random.default_rng(7)
    a = 1.05
    # Zipf over 625 M ranks without a 5 GB CDF: inverse-CDF of the continuous power law
    def draw(k: int) -> np.ndarray:
        u = rng.random(k)
        x = ((rows ** (1 - a) - 1) * u + 1) ** (1 / (1 - a))
        return rank_to_id(np.minimum(x.astype(np.int64) - 1, rows - 1))

    gen = torch.Generator().manual_seed(0)
    times = []
    t_train = time.perf_counter()
    for i in range(args.steps):
        b = draw(args.batch)
        t0 = time.perf_counter()
        step(table, b, gen)
        times.append(time.perf_counter() - t0)
        if (i + 1) % max(1, args.steps // 10) == 0:
            st = table.stats()
            print(f"step {i + 1}: {np.median(times[-50:]) * 1e3:.0f} ms/step, host hit {st['tier.host.hit_rate']:.3f}, RSS {rss_mib()}", flush=True)
            table.reset_step_stats()
    train_s = time.perf_counter() - t_train
    table.flush()
    _trim()
    anon_growth = (rss_mib()["RssAnon"] - anon0) * 2**20
    allocated = (disk.path / "slots.bin").stat().st_blocks * 512
    du = shutil.disk_usage(root)
    res = {
        "dtype": args.dtype, "host_rows": args.host_rows, "host_cache_rows_filled": len(tier.fast),
        "plan_disk_bytes": plan.disk_bytes, "measured_disk_bytes": allocated,
        "disk_vs_plan": round(allocated / plan.disk_bytes, 4),
        "plan_ram_bytes": plan.host_bytes, "measured_anon_rss_growth_bytes": int(anon_growth),
        "ram_vs_plan": round(anon_growth / plan.host_bytes, 4),
        "rows": rows, "dim": dim, "embedding_params": rows * dim, "record_floats": cfg.stored_words,
        "fill_seconds_this_run": round(fill_s, 1), "train_steps": args.steps, "batch_ids": args.batch,
        "train_seconds": round(train_s, 1), "ms_per_step_median": round(float(np.median(times)) * 1e3, 1),
        "ids_per_s": round(args.batch * args.steps / train_s),
        "disk_file_gib": round(disk.nbytes / 2**30, 2), "disk_allocated_gib": round((disk.path / "slots.bin").stat().st_blocks * 512 / 2**30, 2),
        "disk_free_gib_after": round(du.free / 2**30, 1),
        "ram_index_gib": round(disk.ram_bytes / 2**30, 2), "rss_mib": rss_mib(),
        "max_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }
    from benchkit import json_line  # the machine (CPU model, bf16) in the final line
    print(json_line(res, indent=1))
    if not args.keep:
        shutil.rmtree(root, ignore_errors=True)
    else:
        tier.close()  # writes the host cache's rows back: the kept files hold every row
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--zipf", action="store_true")
    ap.add_argument("--layouts", action="store_true")
    ap.add_argument("--capacity", action="store_true")
    ap.add_argument("--plan-only", action="store_true", help="capacity plans per dtype, nothing allocated")
    ap.add_argument("--dtype", default="fp32", choices=["fp32", "bf16", "fp16"], help="capacity: row dtype")
    ap.add_argument("--rows", type=int, default=None)
    ap.add_argument("--batch", type=int, default=None, help="IDs drawn per step (before dedupe)")
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--warmup", type=int, default=40)
    ap.add_argument("--passes", type=int, default=8, help="capacity fill passes (file regions)")
    ap.add_argument("--host-rows", type=int, default=20_000_000, help="capacity: host cache rows")
    ap.add_argument("--dir", default=None, help="where files go (default: temp dir / .)")
    ap.add_argument("--keep", action="store_true", help="capacity: keep the files")
    args = ap.parse_args()
    if not (args.layouts or args.capacity or args.plan_only):
        args.zipf = True
    out: dict = {"torch_threads": torch.get_num_threads()}
    if args.zipf:
        a2 = argparse.Namespace(**{**vars(args), "rows": args.rows or 2_000_000, "batch": args.batch or 65536,
                                   "steps": args.steps or 60})
        out["zipf"] = bench_zipf(a2)
    if args.layouts:
        a2 = argparse.Namespace(**{**vars(args), "rows": args.rows or 4_000_000})
        out["layouts"] = bench_layouts(a2)
    if args.plan_only:
        out["plan"] = bench_plan(argparse.Namespace(**{**vars(args), "rows": args.rows or 625_000_000}))
    if args.capacity:
        a2 = argparse.Namespace(**{**vars(args), "rows": args.rows or 625_000_000, "batch": args.batch or 65536,
                                   "steps": args.steps or 2000})
        out["capacity"] = bench_capacity(a2)
    from benchkit import json_line  # the machine (CPU model, bf16) in the final line
    print(json_line(out))


if __name__ == "__main__":
    sys.exit(main())
