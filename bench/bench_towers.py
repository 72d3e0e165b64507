"""Bytes crossing nodes per step (issue 15 item 4): a Criteo-shaped DMT on two torchrun "nodes"
on 127.0.0.1 (``--nnodes 2``, ``--nproc-per-node 2``: 4 ranks), with (i) plain row-wise sharding
over all ranks (``distributed.placement: tables``, ``sharding: row_wise``; the towers run
data-parallel on every rank) and (ii) tower placement (``distributed.placement: towers``: each
tower's tables and module on one node). Both train the same steps; the figures are the last log
interval's ``dist.*`` per-step bytes (mean over ranks). That mode (ii) trains the same model as
one process is tested in ``tests/distributed/test_towers.py``.

Workload: 13 dense and 26 sparse features (100,000 IDs each, Zipf 1.1), dim 16, 4 towers of
6-7 features in schema order, ``tower_mlp`` [64], 2 vectors per tower, bottom 13-64-16, top
128-64, global batch ``--batch``.

    python bench/bench_towers.py [--batch 1024] [--steps 4] [--nproc-per-node 2]

Imported by ``bench_distributed.py`` (``measure_towers``); alone, its last line is the same JSON
fields: ``tower_cross_node_bytes``, ``rowwise_cross_node_bytes`` and the per-kind figures.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from typing import Any

import yaml

import ember  # noqa: F401  # before torch (see benchkit)
from benchkit import criteo_synthetic_options, print_table

from ember.testing.nodes import torchrun_nodes

KINDS = ("counts", "ids", "rows", "grads", "tower_ids", "tower_out", "tower_grads", "dense")


def dmt_config(out: Path, batch: int, steps: int) -> dict[str, Any]:
    synth = {**criteo_synthetic_options(), "rows": batch * steps, "eval_rows": batch}
    return {
        "data": {"preset": "synthetic", "batch_size": batch, "synthetic": synth},
        "embedding": {"dim": 16, "optimizer": {"type": "rowwise_adagrad", "lr": 0.05}},
        "model": {"type": "dmt", "num_towers": 4, "tower_mlp": [64], "tower_vectors": 2, "bottom_mlp": [64, 16],
                  "top_mlp": [128, 64]},
        "train": {"max_steps": steps, "log_every": steps // 2, "progress": False, "threads": 1,
                  "out_dir": str(out), "dense_optimizer": {"type": "adagrad", "lr": 0.01}},
        "eval": {"max_batches": 1},
        "pipeline": {"enabled": False},
        "distributed": {"sharding": "row_wise"},
    }


def run_mode(out: Path, raw: dict[str, Any], placement: str, nproc: int) -> dict[str, float]:
    """Train on two nodes of ``nproc`` ranks; the last train record's per-step bytes."""
    name = f"nodes-{placement}"
    raw = {**raw, "distributed": {**raw["distributed"], "placement": placement}}
    path = out / f"{name}.yaml"
    path.write_text(yaml.safe_dump(raw))
    done = torchrun_nodes(path, 2, nproc, [f"train.run_name={name}"], timeout=900)
    if any(d.returncode for d in done):
        raise SystemExit("two-node run failed:\n" + "\n".join(d.stderr[-3000:] for d in done))
    recs = [json.loads(line) for line in (out / name / "metrics.jsonl").read_text().splitlines()]
    last = [r for r in recs if r["kind"] == "train"][-1]
    fig = {k: float(last.get(f"dist.{k}.sent_per_step", 0.0)) for k in KINDS}
    fig["cross_node"] = float(last["dist.cross_node.sent_per_step"])
    fig["all_to_all_total"] = float(last["dist.sent_per_step"]) - fig["dense"]
    fig["loss"] = float(last["loss"])
    return fig


def measure_towers(out: Path, batch: int = 1024, steps: int = 4, nproc: int = 2) -> dict[str, Any]:
    """Both modes; prints a table and returns the JSON fields."""
    raw = dmt_config(out, batch, steps)
    rowwise = run_mode(out, raw, "tables", nproc)
    towers = run_mode(out, raw, "towers", nproc)
    print(f"DMT on 2 nodes x {nproc} ranks, global batch {batch}: bytes sent per step and rank (mean over ranks)")
    rows = [[k, f"{rowwise[k]:,.0f}", f"{towers[k]:,.0f}"] for k in (*KINDS, "all_to_all_total", "cross_node")]
    print_table(["kind", "(i) row-wise", "(ii) towers"], rows)
    print(f"cross-node bytes, towers / row-wise: {towers['cross_node'] / rowwise['cross_node']:.3f}")
    return {"tower_cross_node_bytes": towers["cross_node"], "rowwise_cross_node_bytes": rowwise["cross_node"],
            "towers": {"nodes": 2, "ranks_per_node": nproc, "batch_size": batch, "rowwise": rowwise, "towers": towers}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--nproc-per-node", type=int, default=2)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench_towers-") as out:
        from benchkit import json_line  # the machine (CPU model, bf16) in the final line
        print(json_line(measure_towers(Path(out), args.batch, args.steps, args.nproc_per_node)))


if __name__ == "__main__":
    main()
