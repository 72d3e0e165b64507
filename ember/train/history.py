"""Metrics history of a run: JSON lines on disk and a PNG plot of loss and AUC.

Neither file is ever left partial: a record is appended whole or the file is cut back to its
previous length (rewriting the whole history under a temporary name at every log would cost
O(records) per log), and the plot is rendered in memory, then written under a temporary name
and renamed. A full disk raises WriteError naming the file and the bytes needed.
"""

from __future__ import annotations

import io
import json
import os
from pathlib import Path
from typing import Any

from ember.errors import WriteError
from ember.fileio import is_no_space, no_space_error, write_bytes_atomic
from ember.train.tensorboard import TensorBoardWriter
from ember.train.metrics import json_safe

__all__ = ["History"]


class History:
    """Appends one JSON object per record to ``metrics.jsonl`` and redraws ``metrics.png``;
    with ``tensorboard``, each record's numbers also go to TensorBoard (``run_dir/tensorboard``)."""

    def __init__(self, run_dir: Path, resume: bool = False, tensorboard: bool = False, write: bool = True) -> None:
        self.tensorboard = TensorBoardWriter(run_dir / "tensorboard") if tensorboard and write else None
        self.path = run_dir / "metrics.jsonl"
        self.plot_path = run_dir / "metrics.png"
        self.write = write  # False: records are kept in memory only (ranks other than 0)
        self.records: list[dict[str, Any]] = []
        if resume and self.path.exists():
            self.records = [json.loads(line) for line in self.path.read_text().splitlines() if line.strip()]
        elif self.path.exists() and write:
            self.path.unlink()

    def log(self, record: dict[str, Any]) -> None:
        if not self.write:
            self.records.append(record)
            return
        line = (json.dumps(json_safe(record)) + "\n").encode()  # an undefined AUC as null, not NaN
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            size = os.fstat(fd).st_size
            try:
                done = 0
                while done < len(line):
                    done += os.write(fd, line[done:])
            except OSError as e:  # no half line: cut the file back to the last whole record
                os.ftruncate(fd, size)
                if is_no_space(e):
                    raise no_space_error(WriteError, self.path, len(line), e, "the metrics so far are kept") from e
                raise
        finally:
            os.close(fd)
        self.records.append(record)
        if self.tensorboard is not None:
            self.tensorboard.write(record)

    def close(self) -> None:
        """Close the TensorBoard writer (records already logged are on disk either way)."""
        if self.tensorboard is not None:
            self.tensorboard.close()

    def plot(self) -> Path:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        train = [r for r in self.records if r.get("kind") == "train"]
        evals = [r for r in self.records if r.get("kind") == "eval" and "window_rows" not in r]  # held-out only
        fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
        if train:
            ax1.plot([r["step"] for r in train], [r["loss"] for r in train], label="train loss")
        for key in sorted({k for r in evals for k in r if k.startswith("logloss/")}):
            ax1.plot([r["step"] for r in evals], [r[key] for r in evals], "o-", label=f"eval {key}")
        ax1.set_xlabel("step")
        ax1.set_ylabel("log loss")
        if ax1.get_legend_handles_labels()[0]:  # (no line yet: matplotlib warns of an empty legend)
            ax1.legend()
        for key in sorted({k for r in evals for k in r if k.startswith("auc/")}):
            ax2.plot([r["step"] for r in evals], [r[key] for r in evals], "o-", label=f"eval {key}")
        ax2.set_xlabel("step")
        ax2.set_ylabel("AUC")
        if ax2.get_legend_handles_labels()[0]:
            ax2.legend()
        fig.tight_layout()
        png = io.BytesIO()
        fig.savefig(png, format="png", dpi=80)
        plt.close(fig)
        write_bytes_atomic(self.plot_path, png.getvalue(), WriteError)
        return self.plot_path
