"""Helpers shared by the bench scripts that train through ember's config-driven entry points.

- ``dlrm_config``: the raw run config (a dict, as YAML would give) of a Criteo-shaped DLRM;
- ``ensure_synthetic_files``: Criteo-shaped synthetic data written once with ``ember generate``
  and reused while its parameters stay the same;
- ``run_training``: ``ember.train.loop.train`` on a raw config in a scratch run directory;
- ``yaml_config``: a config file of ``configs/`` as a raw dict, to modify before validating;
- ``shared_data_dir``, ``criteo_sample_config``, ``avazu_sample_config``: the real data samples
  and configs/criteo.yaml's model on each;
- ``spread``, ``print_table``: summaries and output;
- ``machine``, ``json_line``: the CPU model and its bf16 support, which every benchmark's final
  JSON line records (figures from different CPUs are never one comparison).

The scripts import this module as a sibling (``python bench/bench_x.py`` puts ``bench/`` first on
``sys.path``), after ``import ember`` so that ember's OpenMP setting precedes torch.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any, Sequence

import yaml

import ember  # noqa: F401  # before torch: ember shortens libgomp's spin-wait (ember/__init__.py)
from ember.batch import Batch
from ember.config import from_dict
from ember.train.loop import RunResult, train
from ember.train.precision import autocast, cpu_bf16, cpu_model

__all__ = [
    "REPO", "dlrm_config", "ensure_synthetic_files", "run_training", "shared_data_dir", "spread",
    "print_table", "criteo_synthetic_options", "yaml_config", "machine", "json_line", "criteo_sample_config",
    "avazu_sample_config", "AVAZU_COLUMNS", "AVAZU_FEATURES",
]

REPO = Path(__file__).resolve().parents[1]
AVAZU_COLUMNS = [
    "id", "click", "hour", "C1", "banner_pos", "site_id", "site_domain", "site_category", "app_id", "app_domain",
    "app_category", "device_id", "device_ip", "device_model", "device_type", "device_conn_type",
    "C14", "C15", "C16", "C17", "C18", "C19", "C20", "C21",
]
AVAZU_FEATURES = [c for c in AVAZU_COLUMNS if c not in ("id", "click", "hour")]  # id: unique; hour: constant here


def timed_ember_step(runner: Any, sf: Any, dense: Any, labels: Any) -> float:
    """ember's training step as the benches time it, each part's seconds appended to
    ``runner.split`` (``plan+fetch``, ``fwd/bwd+dense``, ``sparse step``): plan + fetch of the
    batch's rows, pooling + the model's forward (under ``runner.precision``'s autocast) +
    backward + the dense optimizer's step, then the sparse step (update + write back). ``runner``
    holds ``ec`` (the EmbeddingCollection), ``sparse_opt``, ``model`` (taking the features in
    ``sf.keys`` order), ``opt``, ``precision`` and ``split``; returns the loss."""
    import time

    import torch
    from torch import nn

    t0 = time.perf_counter()
    lookup = runner.ec.plan(sf).fetch()
    t1 = time.perf_counter()
    emb = runner.ec(sf, lookup)
    with autocast(torch.device("cpu"), runner.precision):
        logits = runner.model(dense, [emb[k] for k in sf.keys])
    loss = nn.functional.binary_cross_entropy_with_logits(logits.float(), labels)
    runner.opt.zero_grad(set_to_none=True)
    loss.backward()
    runner.opt.step()
    t2 = time.perf_counter()
    runner.sparse_opt.step()
    t3 = time.perf_counter()
    for k, v in zip(runner.split, (t1 - t0, t2 - t1, t3 - t2)):
        runner.split[k].append(v)
    return float(loss.detach())


def machine() -> dict[str, Any]:
    """Where a figure was measured: the CPU model, its logical CPUs, its native-bf16 features
    (``amx_bf16`` / ``avx512_bf16``; bf16 matmuls are emulated and slow without them) and
    torch's SIMD level, and the allocator's tunables (``GLIBC_TUNABLES``; None: glibc defaults,
    under which random-access kernels run several times slower on 4 KB pages: ember.allocator).

    Example:
        >>> sorted(machine())
        ['bf16', 'cpu', 'cpu_capability', 'cpus', 'glibc_tunables']
    """
    import torch

    return {"cpu": cpu_model(), "cpus": os.cpu_count(), "bf16": cpu_bf16(),
            "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "glibc_tunables": os.environ.get("GLIBC_TUNABLES")}


def json_line(record: dict[str, Any], **dumps: Any) -> str:
    """A benchmark's final JSON line: ``record`` with ``machine()`` under the key ``machine``."""
    return json.dumps({**record, "machine": machine()}, **dumps)


def shared_data_dir() -> Path:
    """The real data samples: ``$EMBER_DATA_DIR``, else ``../shared/data`` beside the checkout
    (the rule of ``tests/conftest.py``)."""
    env = os.environ.get("EMBER_DATA_DIR")
    return Path(env) if env else REPO.parent / "shared" / "data"


def criteo_synthetic_options(big_vocab: int | None = None, seed: int = 0) -> dict[str, Any]:
    """``SyntheticOptions`` keys of Criteo-shaped data: 13 dense, 26 single-hot sparse features
    of 100,000 IDs each, except C1 with ``big_vocab`` IDs when given (a user-ID-like table)."""
    vocab: int | list[int] = 100_000 if big_vocab is None else [big_vocab] + [100_000] * 25
    return {"num_dense": 13, "num_sparse": 26, "vocab_size": vocab, "seed": seed}


def dlrm_config(
    data: dict[str, Any],
    batch_size: int = 4096,
    bottom_mlp: Sequence[int] = (512, 256, 16),
    top_mlp: Sequence[int] = (512, 256),
    dense_optimizer: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Raw run config of a DLRM over the synthetic schema (bench_dlrm.py's workload by default:
    dim 16, bottom 13-512-256-16, top 512-256-1, row-wise Adagrad 0.05 on the embeddings,
    Adagrad 0.01 on the MLPs).

    Args:
        data: the ``data`` section without ``preset`` and ``batch_size`` (e.g. format, paths,
            ``synthetic`` options, which also shape the schema).
        batch_size: training batch size.
        bottom_mlp, top_mlp: MLP sizes (``bottom_mlp`` ends in the embedding dim).
        dense_optimizer: the ``train.dense_optimizer`` section (default Adagrad, lr 0.01).

    Returns:
        A dict for ``ember.config.from_dict`` (add ``train``/``pipeline``/``tables`` keys as needed).

    Example:
        >>> cfg = from_dict(dlrm_config({"synthetic": criteo_synthetic_options()}))
        >>> len(cfg.schema.dense), len(cfg.schema.sparse), cfg.data.batch_size
        (13, 26, 4096)
    """
    dim = bottom_mlp[-1]
    return {
        "data": {"preset": "synthetic", **data, "batch_size": batch_size},
        "embedding": {"dim": dim, "optimizer": {"type": "rowwise_adagrad", "lr": 0.05}},
        "model": {"type": "dlrm", "bottom_mlp": list(bottom_mlp), "top_mlp": list(top_mlp)},
        "train": {"dense_optimizer": dense_optimizer or {"type": "adagrad", "lr": 0.01}},
    }


def ensure_synthetic_files(data_dir: Path, rows: int, formats: Sequence[str], options: dict[str, Any]) -> dict[str, Path]:
    """``data_dir/train.<format>`` for each format, written by ``python -m ember generate``.

    Files are reused when ``data_dir/data.json`` records the same rows and options (and the
    files are there); otherwise they are written anew. Returns format -> path.
    """
    data_dir.mkdir(parents=True, exist_ok=True)
    stamp_file = data_dir / "data.json"
    stamp = {"rows": rows, "options": options}
    paths = {fmt: data_dir / f"train.{fmt}" for fmt in formats}
    old = json.loads(stamp_file.read_text()) if stamp_file.exists() else None
    todo = [f for f, p in paths.items() if old != stamp or not p.exists()]
    if old != stamp:
        stamp_file.unlink(missing_ok=True)  # written back only once every file matches it
    for fmt in todo:
        paths[fmt].unlink(missing_ok=True)  # this cache's own stale file: generate writes only new paths
        opts = {k: v for k, v in options.items() if k != "seed"}
        cmd = [sys.executable, "-m", "ember", "generate", "--out", str(paths[fmt]), "--format", fmt,
               "--rows", str(rows), "--seed", str(options.get("seed", 0)), "--options", json.dumps(opts)]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, cwd=REPO)
    if todo or old != stamp:
        stamp_file.write_text(json.dumps(stamp))
    return paths


def yaml_config(name: str) -> dict[str, Any]:
    """``configs/<name>`` of this checkout as a raw dict (not yet validated)."""
    with open(REPO / "configs" / name) as fh:
        return yaml.safe_load(fh)


def run_training(raw: dict[str, Any], out_dir: Path, name: str, keep: bool = False,
                 batches: Sequence[Batch] | None = None) -> RunResult:
    """``train(from_dict(raw), batches=batches)`` with no progress bar, in ``out_dir/name``; the
    run directory (checkpoint, metrics) is deleted afterwards unless ``keep``."""
    raw = {**raw, "train": {**raw.get("train", {}), "progress": False, "out_dir": str(out_dir), "run_name": name}}
    result = train(from_dict(raw), batches=batches)
    if not keep:
        shutil.rmtree(result.run_dir, ignore_errors=True)
    return result


def criteo_sample_config(root: Path) -> dict[str, Any]:
    """configs/criteo.yaml on the shared Criteo sample under ``root`` (train.tsv; eval on dev.tsv
    + test.tsv)."""
    base = yaml_config("criteo.yaml")
    data = {**base["data"], "train": str(root / "train.tsv"), "eval": [str(root / "dev.tsv"), str(root / "test.tsv")]}
    return {**base, "data": data}


def avazu_sample_config(root: Path) -> dict[str, Any]:
    """configs/criteo.yaml's model and training on the shared Avazu sample under ``root``: every
    categorical column hashed into its own table (``min_count`` 2), label ``click``; the header
    line of train.csv is read as a bad row and skipped, since dev/test have none."""
    base = yaml_config("criteo.yaml")
    data = {
        "format": "csv", "train": str(root / "train.csv"), "eval": [str(root / "dev.csv"), str(root / "test.csv")],
        "csv": {"header": False, "column_names": AVAZU_COLUMNS}, "on_bad_rows": "skip",
        **{k: base["data"][k] for k in ("batch_size", "eval_batch_size", "shuffle_buffer")},
    }
    return {
        **base, "data": data,
        "schema": {"labels": ["click"], "sparse": [{"name": f} for f in AVAZU_FEATURES]},
        "tables": [{"name": f, "min_count": 2} for f in AVAZU_FEATURES],
    }


def spread(values: Sequence[float]) -> dict[str, float]:
    """Median, min and max of a non-empty sequence.

    Example:
        >>> spread([3.0, 1.0, 2.0])
        {'median': 2.0, 'min': 1.0, 'max': 3.0}
    """
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def print_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
    """A plain fixed-width table: first column left-aligned, the others right-aligned."""
    cells = [[str(h) for h in headers]] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    for r in cells:
        print("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))))
