"""What a distributed checkpoint costs each rank: the save in parts (each rank writes its own
part, rank 0 the manifest last: ``save_checkpoint(..., ranks=run)``) against the design it
replaced (every rank's rows gathered on rank 0 in memory, rank 0 writing them alone).

Run under torchrun, once per variant::

    torchrun --standalone --nproc-per-node 2 bench/bench_checkpoint_parts.py --variant parts
    torchrun --standalone --nproc-per-node 2 bench/bench_checkpoint_parts.py --variant gather

Each rank fills one table with ``--rows`` rows (IDs r, r + N, ...), then saves once; rank 0
prints one JSON line: per rank, the resident memory just before the save and the most it grew
during it (MiB, sampled every 5 ms from /proc/self/statm: what the save needs on that rank),
and the save's wall time (s).
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Iterator

import torch

from ember.checkpoint.save import save_checkpoint
from ember.distributed.config import DistributedConfig
from ember.distributed.process_group import start
from ember.embedding import EmbeddingCollection, FeatureConfig, TableConfig


def _rss_mib() -> float:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


class _PeakRss:
    """The most resident memory seen while the ``with`` block runs (a sampling thread)."""

    def __enter__(self) -> "_PeakRss":
        self.peak, self._stop = _rss_mib(), threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(0.005):
            self.peak = max(self.peak, _rss_mib())

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, _rss_mib())


class _Gathered:
    """Every rank's rows of one table in rank 0's memory, read like a table by the writer (the
    replaced design)."""

    def __init__(self, table: Any, shards: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        self.config, self.dim, self.step = table.config, table.dim, table.step
        self.ids = torch.cat([s[0] for s in shards])
        self.records = torch.cat([s[1] for s in shards])

    def __len__(self) -> int:
        return self.ids.numel()

    def flush(self) -> None:
        """The rows are in memory."""

    def admission_state(self) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.empty(0, dtype=torch.int64), torch.empty(0, dtype=torch.int64)

    def items_with_seen(self, chunk_rows: int = 1 << 20) -> Iterator[tuple[torch.Tensor, torch.Tensor, None]]:
        for s in range(0, self.ids.numel(), chunk_rows):
            yield self.ids[s : s + chunk_rows], self.records[s : s + chunk_rows], None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--variant", choices=["parts", "gather"], required=True)
    ap.add_argument("--rows", type=int, default=1_000_000, help="rows per rank")
    ap.add_argument("--dim", type=int, default=16)
    args = ap.parse_args()
    run = start(DistributedConfig(backend="gloo"), torch.device("cpu"))
    assert run is not None, "run under torchrun"
    table_cfg = TableConfig(name="t", dim=args.dim, optimizer={"type": "adagrad", "lr": 0.1})
    ec = EmbeddingCollection([table_cfg], [FeatureConfig(name="f", table="t")])
    table = ec.tables["t"]
    ids = torch.arange(args.rows, dtype=torch.int64) * run.world_size + run.rank
    table.load(ids, torch.randn(args.rows, table_cfg.record_dim))
    del ids
    root = Path(run.broadcast(tempfile.mkdtemp(prefix="ember-bench-ckpt-") if run.lead else None))
    dense = {"model": {"w": torch.zeros(4)}}
    run.barrier()
    before = _rss_mib()
    t0 = time.perf_counter()
    with _PeakRss() as peak:
        if args.variant == "parts":
            save_checkpoint(root, 1, [ec], dense, {"epoch": 0, "batch": 1}, {}, ranks=run)
        else:
            shard = [(i, r) for i, r in table.items()]
            mine = (torch.cat([s[0] for s in shard]), torch.cat([s[1] for s in shard]))
            del shard
            every = run.gather_to_lead(mine)
            del mine
            if every is not None:
                gathered = EmbeddingCollection.__new__(EmbeddingCollection)
                gathered.tables = {"t": _Gathered(table, every)}  # type: ignore[misc]
                del every
                save_checkpoint(root, 1, [gathered], dense, {"epoch": 0, "batch": 1}, {})
            run.barrier()
    seconds = time.perf_counter() - t0
    report = run.gather_to_lead({"rank": run.rank, "rss_before_mib": round(before, 1),
                                 "save_grew_mib": round(peak.peak - before, 1), "save_s": round(seconds, 3)})
    if run.lead:
        size = sum(f.stat().st_size for f in root.rglob("*") if f.is_file())
        from benchkit import json_line  # the machine (CPU model, bf16) in the final line
        print(json_line({"variant": args.variant, "world_size": run.world_size, "rows_per_rank": args.rows,
                          "checkpoint_mib": round(size / 2**20, 1), "ranks": report}))
        shutil.rmtree(root, ignore_errors=True)
    run.close()


if __name__ == "__main__":
    main()
