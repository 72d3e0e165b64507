"""Tiny runs of every zoo model on a CSV that exercises the whole featurization (dense transforms,
missing values, multi-hot, weights, max_length, integer IDs), exported with ``--format onnx``:
what the portable runtime is checked against the Predictor on."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["ZOO", "SCHEMA", "write_rows", "train_and_export", "probe_records"]

# every model type of the zoo (and a distilled student), sized for a few steps on 2 cores
ZOO: dict[str, dict[str, Any]] = {
    "dlrm": {"type": "dlrm", "bottom_mlp": [8, 4], "top_mlp": [8]},
    "deepfm": {"type": "deepfm", "deep_mlp": [8]},
    "wdl": {"type": "wdl", "deep_mlp": [8]},
    "dcn": {"type": "dcn", "deep_mlp": [8], "num_cross_layers": 2},
    "mmoe": {"type": "mmoe", "num_experts": 2, "expert_mlp": [8], "tower_mlp": [4]},
    "shared_bottom": {"type": "shared_bottom", "bottom_mlp": [8], "tower_mlp": [4]},
    "lr": {"type": "lr"},
    "dmt": {"type": "dmt", "num_towers": 2, "bottom_mlp": [8, 4], "top_mlp": [8]},
    "dlrm_distilled": {"type": "dlrm", "bottom_mlp": [8, 4], "top_mlp": [8], "distill": {"aux_head": True}},
}

SCHEMA: dict[str, Any] = {
    "labels": ["click"],
    "dense": [{"name": "I1", "log1p": True}, {"name": "I2", "clip": [-5.0, 50.0], "standardize": [1.5, 4.0], "fill": 2.0},
              {"name": "I3", "sign_log1p": True}],
    "sparse": [
        {"name": "C1"},  # "" is a category
        {"name": "C2", "missing_values": ["", "-1"], "pooling": "mean"},
        {"name": "tags", "separator": "|", "weight_column": "tag_w", "pooling": "mean", "max_length": 3},
        {"name": "hist", "separator": ";", "pooling": "sqrtn"},
        {"name": "wtags", "column": "tags", "separator": "|", "weight_column": "tag_w", "pooling": "sqrtn", "salt": "tags2"},
        {"name": "uid", "hash_ids": False},
    ],
}


def _row(rng: np.random.Generator, vocab: int) -> dict[str, str]:
    def cat(p_empty: float = 0.1) -> str:
        return "" if rng.random() < p_empty else f"v{int(rng.zipf(1.5)) % vocab}"

    k = int(rng.integers(0, 5))
    tags = [cat(0.1) for _ in range(k)]
    weights = ["" if rng.random() < 0.1 else f"{rng.uniform(-1, 3):.3g}" for _ in range(k)]
    hist = [cat(0.2) for _ in range(int(rng.integers(0, 4)))]
    i2 = "" if rng.random() < 0.2 else f"{rng.normal(3, 20):.4g}"
    return {
        "click": str(int(rng.random() < 0.3)),
        "I1": "" if rng.random() < 0.15 else str(int(rng.integers(-3, 1000))),
        "I2": i2,
        "I3": f"{rng.normal(0, 50):.5g}",
        "C1": cat(),
        "C2": "-1" if rng.random() < 0.1 else cat(),
        "tags": "|".join(tags),
        "tag_w": "|".join(weights),
        "hist": ";".join(hist),
        "uid": "" if rng.random() < 0.1 else str(int(rng.integers(-50, 200))),
        "buy": str(int(rng.random() < 0.1)),
        "teacher_p": f"{rng.random():.3f}",
    }


def write_rows(path: Path, n: int, seed: int, vocab: int = 40) -> list[dict[str, str]]:
    """``n`` rows (text values, as a CSV holds them) written to ``path`` as a CSV with a header."""
    import csv

    rng = np.random.default_rng(seed)
    rows = [_row(rng, vocab) for _ in range(n)]
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    return rows


def train_and_export(tmp: Path, name: str, model: dict[str, Any], steps: int = 6, extra: dict[str, Any] | None = None,
                     fmt: str = "onnx") -> Path:
    """Train ``model`` for ``steps`` steps on generated rows (vocab 40: eval rows hold IDs never
    trained), export it with ``--format fmt``; returns the export directory."""
    import yaml

    from ember.cli import main

    data = tmp / "data"
    if not (data / "train.csv").exists():
        data.mkdir(exist_ok=True)
        write_rows(data / "train.csv", 400, seed=1)
        write_rows(data / "eval.csv", 100, seed=2, vocab=80)
    schema = {**SCHEMA, "teacher": ["teacher_p"]} if model.get("distill") else SCHEMA
    if model["type"] in ("mmoe", "shared_bottom"):  # multi-task models: two labels, two probabilities per row
        schema = {**schema, "labels": ["click", "buy"]}
    cfg = {
        "data": {"format": "csv", "train": str(data / "train.csv"), "eval": str(data / "eval.csv"), "batch_size": 64},
        "schema": schema,
        "embedding": {"dim": 4, "optimizer": {"type": "rowwise_adagrad", "lr": 0.1}},
        "model": model,
        "train": {"out_dir": str(tmp / "runs"), "run_name": name, "progress": False, "threads": 1, "max_steps": steps,
                  "dense_optimizer": {"type": "adam", "lr": 0.01}},
        **(extra or {}),
    }
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    if main(["train", "--config", str(path), "--overwrite"]) != 0:
        raise RuntimeError(f"training {path} failed")
    out = tmp / "exports" / name
    if main(["export", "--checkpoint", str(tmp / "runs" / name), "--out", str(out), "--format", fmt]) != 0:
        raise RuntimeError(f"exporting {name} failed")
    return out


def probe_records() -> list[dict[str, Any]]:
    """Rows as JSON sends them: numbers for text columns, absent keys, None, unseen IDs,
    missing_values entries, multi-hot with empty tokens, integer IDs as numbers and text.

    A weighted feature takes one value per row from JSON: its weight column held text in
    training (a CSV), so a weight is one number (``"0.5|2"`` is not a number), as in the Predictor.
    """
    return [
        {"I1": 3, "I2": 10.5, "I3": -7, "C1": "v1", "C2": "v2", "tags": "v1", "tag_w": 0.5, "hist": "v1;v2;v9",
         "uid": 7},
        {"I1": None, "C1": "", "C2": "-1", "tags": "", "tag_w": None, "uid": "12"},
        {"I2": "7.25", "I3": "1e3", "C1": 4, "C2": 4.0, "tags": "never-seen", "tag_w": "-2", "hist": "v3;;unseen",
         "uid": -3.0},
        {"I1": "-2", "C1": "zz-unseen", "C2": "", "tags": "v4", "tag_w": 0, "hist": "", "uid": None},
        {"I3": 2.5, "C1": 17, "tags": "v2", "tag_w": 3, "hist": "v4;v4;v4;v1", "uid": " 9 "},
        {"tags": "v9"},  # everything else missing; the weight too (it counts as 1)
    ]
