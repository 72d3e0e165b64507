"""The docs' own-loop Python example (docs/api.md) runs as written and trains the embeddings."""

from __future__ import annotations

import re
from pathlib import Path

import torch

from ember.batch import Batch, SparseFeatures

README = Path(__file__).resolve().parents[1] / "docs" / "api.md"


def _own_loop_example() -> str:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    (code,) = [b for b in blocks if "SparseOptimizer(ec)" in b]
    return code


def _batches(n: int) -> list[Batch]:
    g = torch.Generator().manual_seed(0)
    out = []
    for _ in range(n):
        lengths = torch.cat([torch.ones(8, dtype=torch.int64), torch.ones(8, dtype=torch.int64),
                             torch.randint(0, 4, (8,), generator=g)])
        values = torch.randint(0, 50, (int(lengths.sum()),), generator=g)
        sparse = SparseFeatures(["user_id", "item_id", "history"], values, lengths)
        out.append(Batch(torch.zeros(8, 0), sparse, torch.randint(0, 2, (8, 1), generator=g).float()))
    return out


def test_the_readme_loop_runs_and_updates_every_table():
    scope: dict = {"batches": _batches(3)}
    exec(compile(_own_loop_example(), str(README), "exec"), scope)
    ec = scope["ec"]
    assert {name: t.step for name, t in ec.tables.items()} == {"user": 3, "item": 3}
    assert all(len(t) > 0 for t in ec.tables.values())
