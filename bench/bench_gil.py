"""Do the pipeline's stages release the GIL? Threads or processes (issue 11).

The staged trainer runs its stages on threads. That pays off only for work that releases the
GIL (pyarrow, numpy, torch ops, ember's native kernels); a stage that holds it would stall the
compute thread and belongs in a process with shared-memory hand-off instead. This measures,
for each stage's real work on Criteo-shaped data (bench_pipeline.py's files and model), its
parallel efficiency: the time of N items on one thread against 2N items on two threads at once,
``eff = 2 * t(1 thread, N) / t(2 threads, 2N)``. 2.0: the work runs fully in parallel (GIL
released, two free cores); 1.0: it is serialised (GIL held all along). Run it on a quiet
machine: a busy core reads as a held GIL.

Stages: read+featurize from Parquet and from CSV (``FileLoader``: pyarrow reads, then the
featurizer parses, hashes and cuts batches), plan (dedupe), fetch (rows from host tables),
update (row-wise Adagrad + write-back). Compute (torch) is the reference for "releases".

    python bench/bench_gil.py [--rows 200000] [--batches 12] [--data-dir DIR]

The last line is one JSON object: efficiency per stage.
"""

from __future__ import annotations

import argparse
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable

import benchkit  # first: it imports ember before torch
import torch

from ember.config import from_dict
from ember.pipeline.loader import make_batches
from ember.train.builder import build_components
from ember.train.loss import multitask_bce


def run_threads(jobs: list[Callable[[], Any]]) -> float:
    """Seconds to run ``jobs`` each on its own thread, all at once (the first error re-raised)."""
    errors: list[BaseException] = []

    def guarded(job: Callable[[], Any]) -> None:
        try:
            job()
        except BaseException as e:  # surfaced below
            errors.append(e)

    threads = [threading.Thread(target=guarded, args=(job,)) for job in jobs]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return time.perf_counter() - t0


def efficiency(work: Callable[[int], Any], n: int) -> dict[str, float]:
    """``work(i)`` for i in range(n) on one thread, then on each of two threads at once."""
    work(0)  # warm

    def all_items() -> None:
        for i in range(n):
            work(i)

    one = run_threads([all_items])
    two = run_threads([all_items, all_items])
    return {"one_thread_s": one, "two_threads_s": two, "efficiency": 2 * one / two}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--batches", type=int, default=12, help="items per thread")
    ap.add_argument("--batch", type=int, default=4096)
    ap.add_argument("--data-dir", type=Path, default=Path(tempfile.gettempdir()) / "ember-bench-gil")
    args = ap.parse_args()
    torch.set_num_threads(1)  # one core per worker thread: the question is the GIL, not torch's pool
    files = benchkit.ensure_synthetic_files(args.data_dir, args.rows, ("parquet", "csv"), benchkit.criteo_synthetic_options())
    cfgs = {}
    for fmt, path in files.items():
        raw = benchkit.dlrm_config({"format": fmt, "train": str(path), "shuffle_buffer": 0, "drop_last": True,
                                    "synthetic": benchkit.criteo_synthetic_options()}, batch_size=args.batch)
        cfgs[fmt] = from_dict(raw)
    cfg = cfgs["parquet"]
    batches = list(make_batches(cfg.data, cfg.schema, "train"))[: args.batches + 1]
    n = min(args.batches, len(batches) - 1)
    results: dict[str, dict[str, float]] = {}

    def read_featurize(fmt: str) -> Callable[[int], Any]:
        c = cfgs[fmt]

        def work(i: int) -> None:
            loader = iter(make_batches(c.data, c.schema, "train", threaded=False))
            for _ in range(3):  # three batches per item: reading, parsing, hashing, cutting
                next(loader)
        return work

    results["read+featurize parquet"] = efficiency(read_featurize("parquet"), max(n // 3, 2))
    results["read+featurize csv"] = efficiency(read_featurize("csv"), max(n // 3, 2))

    parts = build_components(cfg)
    parts.train(True)
    for b in batches:  # every ID gets its row first: fetch then reads, never inserts
        lk = parts.plan(b, train=False)
        parts.forward(b, lk)
    results["plan"] = efficiency(lambda i: parts.plan(batches[i], train=False), n)
    results["fetch"] = efficiency(lambda i: [lk.fetch() for lk in parts.plan(batches[i], train=False)], n)

    model = parts.model
    inputs = []
    with torch.no_grad():
        for b in batches:
            emb = parts.embeddings(b.sparse)
            inputs.append((b.dense, [emb[f.name] for f in parts.embeddings.features], b.labels))

    def compute(i: int) -> None:
        dense, pooled, labels = inputs[i]
        loss = multitask_bce(model(dense, pooled, None), labels)
        loss.backward()

    results["compute (torch)"] = efficiency(compute, n)

    # update: row-wise Adagrad + write-back of one batch's unique rows. Lookups with gradients
    # are prepared first (forward + backward, not applied); the two threads update two separate
    # sets of tables, as one update stage never runs twice at once on the same tables.
    other = build_components(cfg)
    other.train(True)

    def prepared(p: Any) -> list[list[Any]]:
        out = []
        for b in batches[:n]:
            out.append(p.backward(multitask_bce(p.forward(b), b.labels), 0))
        return out

    def apply(ready: list[Any]) -> None:
        for lk in ready:
            lk.update()
            lk.write_back()

    sets = [prepared(parts), prepared(parts), prepared(other)]
    one = run_threads([lambda: [apply(r) for r in sets[0]]])
    two = run_threads([lambda s=s: [apply(r) for r in s] for s in sets[1:]])
    results["update"] = {"one_thread_s": one, "two_threads_s": two, "efficiency": 2 * one / two}

    print(f"\nparallel efficiency, 2 threads (2.0 = GIL released; 1.0 = serialised), {n} items per thread:")
    benchkit.print_table(["stage", "1 thread s", "2 threads s", "efficiency"],
                         [[k, f"{v['one_thread_s']:.2f}", f"{v['two_threads_s']:.2f}", f"{v['efficiency']:.2f}"]
                          for k, v in results.items()])
    from benchkit import json_line  # the machine (CPU model, bf16) in the final line
    print(json_line({"bench": "gil", "efficiency": {k: v["efficiency"] for k, v in results.items()},
                      "detail": results, "rows": args.rows, "batch": args.batch, "items": n}))


if __name__ == "__main__":
    main()
