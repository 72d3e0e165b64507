"""Logistic regression on the Criteo sample over seeds: ember vs a plain PyTorch LR.

Both train one epoch on ``criteo/train.tsv`` (7,200 rows) and report eval AUC on ``dev.tsv`` +
``test.tsv`` (800 rows), for seeds 0..N-1 (the seed sets the shuffle and every init). The same
recipe on both sides, so the figures compare the framework, not two recipes:

- inputs: I1..I13 as log1p(max(x, 0)) with empty = 0; C1..C26 one weight per distinct value,
  an empty field is missing (no weight), as the Criteo preset reads it;
- model: logit = sum of the ID weights + w·dense + b, every weight starting at zero;
- training: batch 256, rows shuffled, Adagrad 0.05 on the ID weights, Adam 0.01 on w and b,
  mean binary cross-entropy.

ember runs ``configs/criteo_lr.yaml`` (only paths, seeds, threads and fp32 overridden: the plain
side computes in fp32, so ember does too, whatever ``train.precision: auto`` would pick); the plain
side is ``nn.Embedding`` (one per feature, vocabulary = the training values) + ``nn.Linear``.
``ember_torch_init`` is ember with ``model.dense_init: torch`` (PyTorch's default U(±1/√13) for
w and b, what ember used before ``dense_init`` existed): the seed-to-seed spread it causes is
what the zero init removes.

    PYTHONPATH=. python bench/bench_lr_seeds.py [--seeds 5] [--data DIR] [--threads 1]

The last line is one JSON object: ember_auc_mean, ember_auc_std, torch_auc_mean, torch_auc_std,
ember_torch_init_auc_mean, ember_torch_init_auc_std, the per-seed AUCs, and ``skipped`` (null,
or why nothing ran: the sample is not at ``--data``/criteo).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import ember  # noqa: F401  # first: before torch loads, it shortens libgomp's spin-wait (see ember/__init__.py)

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import torch
from torch import nn

from ember.config import load
from ember.source.config import CRITEO_COLUMNS
from ember.train.loop import train
from ember.train.metrics import auc

REPO = Path(__file__).resolve().parents[1]
FILES = ("train.tsv", "dev.tsv", "test.tsv")
DENSE = [f"I{i}" for i in range(1, 14)]
SPARSE = [f"C{i}" for i in range(1, 27)]
BATCH, ID_LR, DENSE_LR = 256, 0.05, 0.01  # as in configs/criteo_lr.yaml


def default_data_dir() -> Path:
    """$EMBER_DATA_DIR, else ../shared/data beside the checkout."""
    env = os.environ.get("EMBER_DATA_DIR")
    return Path(env) if env else REPO.parent / "shared" / "data"


def ember_auc(criteo: Path, seed: int, threads: int, extra: list[str]) -> float:
    """Eval AUC of one ember run of configs/criteo_lr.yaml."""
    with tempfile.TemporaryDirectory() as out:
        cfg = load(REPO / "configs" / "criteo_lr.yaml", [
            f"data.train={criteo / 'train.tsv'}", f"data.eval=[{criteo / 'dev.tsv'}, {criteo / 'test.tsv'}]",
            f"data.seed={seed}", f"train.seed={seed}", f"train.threads={threads}", f"train.out_dir={out}",
            "train.progress=false", "train.log_every=1000", "train.precision=fp32", *extra,
        ])
        return float(train(cfg).metrics["auc/label"])


def read_split(criteo: Path, names: tuple[str, ...]) -> pa.Table:
    """The files as one table of strings (an empty field is "")."""
    opts = pacsv.ConvertOptions(column_types={c: pa.string() for c in CRITEO_COLUMNS}, strings_can_be_null=False)
    return pa.concat_tables([
        pacsv.read_csv(criteo / n, read_options=pacsv.ReadOptions(column_names=CRITEO_COLUMNS),
                       parse_options=pacsv.ParseOptions(delimiter="\t"), convert_options=opts)
        for n in names
    ])


def plain_tensors(table: pa.Table, vocab: list[dict[str, int]]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dense [N, 13], ids [N, 26] with 0 = empty or unseen, labels [N])."""
    dense = np.stack([
        np.log1p(np.maximum(np.nan_to_num(pc.cast(pc.if_else(pc.equal(table[c], ""), None, table[c]), pa.float64())
                                          .to_numpy(zero_copy_only=False)), 0.0))
        for c in DENSE
    ], axis=1)
    ids = np.stack([[vocab[j].get(v, 0) for v in table[c].to_pylist()] for j, c in enumerate(SPARSE)], axis=1)
    labels = np.asarray(table["label"].to_pylist(), dtype=np.float32)
    return torch.tensor(dense, dtype=torch.float32), torch.tensor(ids), torch.from_numpy(labels)


class PlainLR(nn.Module):
    """logit = sum_j weight_j[id_j] + w·dense + b; index 0 (empty or unseen) has no weight."""

    def __init__(self, vocab_sizes: list[int]) -> None:
        super().__init__()
        self.ids = nn.ModuleList(nn.Embedding(v + 1, 1, padding_idx=0) for v in vocab_sizes)
        self.dense = nn.Linear(len(DENSE), 1)
        for table in self.ids:
            nn.init.zeros_(table.weight)
        nn.init.zeros_(self.dense.weight)
        nn.init.zeros_(self.dense.bias)

    def forward(self, dense: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        first = torch.cat([t(ids[:, j]) for j, t in enumerate(self.ids)], dim=1).sum(dim=1)
        return first + self.dense(dense).squeeze(1)


def torch_auc(criteo: Path, seed: int) -> float:
    """Eval AUC of the plain PyTorch LR, one epoch, rows shuffled by ``seed``."""
    train_table = read_split(criteo, ("train.tsv",))
    vocab = []
    for c in SPARSE:
        values = sorted(set(train_table[c].to_pylist()) - {""})  # empty: missing, as ember's preset
        vocab.append({v: i + 1 for i, v in enumerate(values)})
    dense, ids, labels = plain_tensors(train_table, vocab)
    torch.manual_seed(seed)
    model = PlainLR([len(v) for v in vocab])
    id_opt = torch.optim.Adagrad(model.ids.parameters(), lr=ID_LR)
    dense_opt = torch.optim.Adam(model.dense.parameters(), lr=DENSE_LR)
    order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(seed))
    for start in range(0, len(order), BATCH):
        rows = order[start:start + BATCH]
        loss = nn.functional.binary_cross_entropy_with_logits(model(dense[rows], ids[rows]), labels[rows])
        id_opt.zero_grad()
        dense_opt.zero_grad()
        loss.backward()
        id_opt.step()
        dense_opt.step()
    eval_dense, eval_ids, eval_labels = plain_tensors(read_split(criteo, ("dev.tsv", "test.tsv")), vocab)
    with torch.no_grad():
        return auc(eval_labels.numpy(), model(eval_dense, eval_ids).numpy())


def summary(name: str, aucs: list[float] | None) -> dict[str, Any]:
    """``<name>_auc_mean``, ``<name>_auc_std`` (population std over seeds) and the per-seed AUCs."""
    if not aucs:
        return {f"{name}_auc_mean": None, f"{name}_auc_std": None, f"{name}_aucs": None}
    return {f"{name}_auc_mean": statistics.fmean(aucs), f"{name}_auc_std": statistics.pstdev(aucs),
            f"{name}_aucs": [round(a, 4) for a in aucs]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=5, help="seeds 0..N-1")
    ap.add_argument("--data", type=Path, default=default_data_dir(), help="folder holding criteo/")
    ap.add_argument("--threads", type=int, default=1, help="torch threads of both sides")
    args = ap.parse_args()
    criteo = args.data / "criteo"
    missing = [f for f in FILES if not (criteo / f).exists()]
    if missing:
        reason = f"the Criteo sample is not at {criteo} (missing {missing}; set --data or EMBER_DATA_DIR)"
        print(f"skipped: {reason}")
        from benchkit import json_line  # the machine (CPU model, bf16) in the final line
        print(json_line({**summary("ember", None), **summary("torch", None), **summary("ember_torch_init", None),
                          "skipped": reason}))
        return
    torch.set_num_threads(args.threads)
    results: dict[str, list[float]] = {"ember": [], "torch": [], "ember_torch_init": []}
    t0 = time.perf_counter()
    for seed in range(args.seeds):
        results["ember"].append(ember_auc(criteo, seed, args.threads, []))
        results["torch"].append(torch_auc(criteo, seed))
        results["ember_torch_init"].append(ember_auc(criteo, seed, args.threads, ["model.dense_init=torch"]))
        print(f"seed {seed}: " + "  ".join(f"{k} {v[-1]:.4f}" for k, v in results.items()), flush=True)
    out: dict[str, Any] = {}
    for name, aucs in results.items():
        out.update(summary(name, aucs))
        print(f"{name:<17} AUC mean {out[f'{name}_auc_mean']:.4f}  std {out[f'{name}_auc_std']:.4f}")
    print(f"{args.seeds} seeds in {time.perf_counter() - t0:.0f} s")
    from benchkit import json_line  # the machine (CPU model, bf16) in the final line
    print(json_line({**out, "seeds": args.seeds, "skipped": None}))


if __name__ == "__main__":
    main()
