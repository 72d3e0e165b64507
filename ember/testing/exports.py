"""A small training run with delta exports and checkpoints at the same steps, and full exports
of those checkpoints: the references delta exports and follow-mode serving are tested against."""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["SMALL", "train_with_exports", "full_export_at"]

SMALL = {"num_sparse": 4, "num_dense": 2, "vocab_size": 300}  # data.synthetic of the run


def train_with_exports(tmp: Path, name: str, steps: int, export: dict[str, Any], checkpoint_every: int | None = None) -> Path:
    """A small DLRM run with delta exports: C1 has a TTL of 3 steps, C2 min_count 2, C3 lives in
    a device cache + host cache + disk chain; returns the run directory."""
    import yaml

    from ember.cli import main

    cfg = tmp / f"{name}.yaml"
    cfg.write_text(yaml.safe_dump({
        "data": {"preset": "synthetic", "synthetic": {**SMALL, "rows": 4000, "eval_rows": 200}, "batch_size": 100},
        "embedding": {"dim": 4},
        "tables": [{"name": "C1", "ttl_steps": 3}, {"name": "C2", "min_count": 2},
                   {"name": "C3", "storage": {"device_rows": 40, "device": "cpu", "host_rows": 60,
                                              "disk_path": str(tmp / f"{name}-disk"), "disk_rows": 1024}}],
        "model": {"type": "dlrm", "bottom_mlp": [8, 4], "top_mlp": [8]},
        "train": {"out_dir": str(tmp), "run_name": name, "progress": False, "threads": 1, "max_steps": steps,
                  "log_every": 5},
        "checkpoint": {"every": checkpoint_every, "keep": 100},
        "export": export}))
    if main(["train", "--config", str(cfg), "--overwrite"]) != 0:
        raise RuntimeError(f"training {cfg} failed")
    return tmp / name


def full_export_at(run: Path, step: int, out: Path) -> Path:
    """A full export (``ember export``) of the run's checkpoint at ``step``."""
    from ember.cli import main

    if main(["export", "--checkpoint", str(run / "checkpoints" / f"step-{step:08d}"), "--out", str(out)]) != 0:
        raise RuntimeError(f"exporting step {step} of {run} failed")
    return out
