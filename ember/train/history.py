"""Metrics history of a run: JSON lines on disk and a PNG plot of loss and AUC."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

__all__ = ["History"]


class History:
    """Appends one JSON object per record to ``metrics.jsonl`` and redraws ``metrics.png``."""

    def __init__(self, run_dir: Path, resume: bool = False) -> None:
        self.path = run_dir / "metrics.jsonl"
        self.plot_path = run_dir / "metrics.png"
        self.records: list[dict[str, Any]] = []
        if resume and self.path.exists():
            self.records = [json.loads(line) for line in self.path.read_text().splitlines() if line.strip()]
        elif self.path.exists():
            self.path.unlink()

    def log(self, record: dict[str, Any]) -> None:
        self.records.append(record)
        with open(self.path, "a") as fh:
            fh.write(json.dumps(record) + "\n")

    def plot(self) -> Path:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        train = [r for r in self.records if r.get("kind") == "train"]
        evals = [r for r in self.records if r.get("kind") == "eval"]
        fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
        if train:
            ax1.plot([r["step"] for r in train], [r["loss"] for r in train], label="train loss")
        for key in sorted({k for r in evals for k in r if k.startswith("logloss/")}):
            ax1.plot([r["step"] for r in evals], [r[key] for r in evals], "o-", label=f"eval {key}")
        ax1.set_xlabel("step")
        ax1.set_ylabel("log loss")
        ax1.legend()
        for key in sorted({k for r in evals for k in r if k.startswith("auc/")}):
            ax2.plot([r["step"] for r in evals], [r[key] for r in evals], "o-", label=f"eval {key}")
        ax2.set_xlabel("step")
        ax2.set_ylabel("AUC")
        if evals:
            ax2.legend()
        fig.tight_layout()
        fig.savefig(self.plot_path, dpi=80)
        plt.close(fig)
        return self.plot_path
