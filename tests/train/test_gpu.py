"""GPU path: model and batches on CUDA, tables in host memory (skipped without CUDA)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ember.config import from_dict
from ember.train.loop import train

pytestmark = pytest.mark.gpu


def _cfg(tmp_path, device):
    return from_dict({
        "data": {"preset": "synthetic", "synthetic": {"rows": 20_000, "eval_rows": 4_000, "vocab_size": 5_000, "num_sparse": 4},
                 "batch_size": 512},
        "embedding": {"dim": 8},
        "model": {"type": "dlrm", "bottom_mlp": [16, 8], "top_mlp": [16]},
        "train": {"out_dir": str(tmp_path), "run_name": device, "device": device, "progress": False, "max_steps": 20,
                  "dense_optimizer": {"type": "sgd", "lr": 0.05}},
    })


def test_cuda_training_matches_cpu(tmp_path):
    cpu = train(_cfg(tmp_path, "cpu"))
    gpu = train(_cfg(tmp_path, "cuda"))
    assert next(gpu.parts.model.parameters()).is_cuda
    for (k, a), b in zip(cpu.parts.model.state_dict().items(), gpu.parts.model.state_dict().values()):
        torch.testing.assert_close(a, b.cpu(), rtol=1e-3, atol=1e-4, msg=k)
    assert np.isclose(cpu.metrics["auc/label"], gpu.metrics["auc/label"], atol=1e-3)
