"""DMT: towers from names or a count, each feature in exactly one tower, a tower sees only its
features, TorchScript export, and a training run."""

from __future__ import annotations

import pytest
import torch

from ember.config import from_dict
from ember.errors import ConfigError
from ember.models.dmt import DMT, DMTConfig, tower_indices
from ember.models.registry import ModelInputs, build_model

NAMES = [f"C{i}" for i in range(6)]
INPUTS = ModelInputs(num_dense=3, sparse_dims=[8] * 6, num_tasks=1, feature_names=NAMES)


def test_towers_by_count_and_by_name():
    assert tower_indices(DMTConfig(num_towers=4), NAMES) == [[0], [1, 2], [3], [4, 5]]
    assert tower_indices(DMTConfig(towers=[["C5", "C0"], ["C1", "C2", "C3", "C4"]]), NAMES) == [[5, 0], [1, 2, 3, 4]]
    with pytest.raises(ConfigError, match=r"in several: \['C1'\]; in none: \['C4', 'C5'\]"):
        tower_indices(DMTConfig(towers=[["C0", "C1"], ["C1", "C2", "C3"]]), NAMES)
    with pytest.raises(ConfigError, match="unknown sparse feature"):
        tower_indices(DMTConfig(towers=[["C9"]]), NAMES)
    with pytest.raises(ValueError, match="exactly one of them"):
        DMTConfig(towers=[["C0"]], num_towers=2)


def test_a_tower_sees_only_its_features_and_the_model_scripts():
    model = build_model({"type": "dmt", "towers": [["C0", "C3"], ["C1", "C2", "C4", "C5"]],
                         "bottom_mlp": [16, 8], "top_mlp": [16]}, INPUTS)
    assert isinstance(model, DMT) and model.num_towers == 2
    dense = torch.randn(4, 3)
    sparse = [torch.randn(4, 8, requires_grad=True) for _ in range(6)]
    out = model.towers[0](torch.stack(sparse, 1))
    out.sum().backward()
    reached = [s.grad is not None and bool(s.grad.abs().sum() > 0) for s in sparse]
    assert reached == [True, False, False, True, False, False]
    scripted = torch.jit.script(model.eval())
    torch.testing.assert_close(scripted(dense, [s.detach() for s in sparse]), model(dense, [s.detach() for s in sparse]))


def test_dmt_trains_from_config(tmp_path):
    from ember.train.loop import train

    raw = {"data": {"preset": "synthetic", "batch_size": 256,
                    "synthetic": {"rows": 6000, "eval_rows": 2000, "vocab_size": 500, "num_sparse": 6}},
           "embedding": {"dim": 8},
           "model": {"type": "dmt", "num_towers": 2, "bottom_mlp": [16, 8], "top_mlp": [16]},
           "train": {"out_dir": str(tmp_path), "run_name": "dmt", "progress": False, "threads": 1}}
    res = train(from_dict(raw))
    assert res.metrics["auc/label"] > 0.6
    raw["model"]["towers"] = [["C1", "C2"]]
    raw["model"].pop("num_towers")
    with pytest.raises(ConfigError, match="in none"):
        train(from_dict({**raw, "train": {**raw["train"], "run_name": "bad"}}))
