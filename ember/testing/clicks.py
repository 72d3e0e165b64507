"""A small click table and the run config that trains on it: what the SQL, Iceberg and other
source tests train the same model on, whatever holds the rows."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

__all__ = ["SCHEMA", "clicks", "clicks_run"]

SCHEMA = {"labels": ["label"], "dense": [{"name": "d1"}], "sparse": [{"name": "c1"}, {"name": "c2"}]}


def clicks(seed: int, n: int, first_id: int, id_step: int = 1, scrambled: bool = False) -> pa.Table:
    """``n`` rows with a planted signal (c1 < 20 clicks more) and ids ``first_id, first_id +
    id_step, ...``; ``scrambled``: in a random order (a query's ORDER BY must put them right)."""
    rng = np.random.default_rng(seed)
    c1 = rng.integers(0, 60, n)
    label = (rng.random(n) < np.where(c1 < 20, 0.7, 0.15)).astype(np.int64)
    t = pa.table({"id": first_id + id_step * np.arange(n, dtype=np.int64), "label": label, "d1": rng.integers(0, 9, n),
                  "c1": [f"a{c}" for c in c1], "c2": [f"b{v}" for v in rng.integers(0, 20, n)]})
    return t.take(rng.permutation(n)) if scrambled else t


def clicks_run(tmp_path: Path, name: str, data: dict, **train_kw: Any) -> dict:
    """A raw run config training a small DLRM on ``data`` (a ``data:`` section) deterministically."""
    t = {"out_dir": str(tmp_path), "run_name": name, "progress": False, "deterministic": True, "threads": 1,
         "log_every": 4, **train_kw}
    return {"data": {"batch_size": 64, "shuffle_buffer": 0, "read_rows": 100, **data}, "schema": SCHEMA,
            "embedding": {"dim": 4, "optimizer": {"type": "adagrad", "lr": 0.05}},
            "model": {"type": "dlrm", "bottom_mlp": [8, 4], "top_mlp": [8]}, "train": t}
