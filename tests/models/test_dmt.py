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


def test_balanced_groups_recover_planted_blocks_and_stay_balanced():
    import numpy as np

    from ember.train.towers import balanced_groups, inside_share

    rng = np.random.default_rng(0)
    order = rng.permutation(9)
    blocks = [order[:3], order[3:6], order[6:]]
    s = rng.uniform(0.0, 0.2, (9, 9))
    for b in blocks:
        s[np.ix_(b, b)] += 0.8
    s = (s + s.T) / 2
    groups = balanced_groups(s, 3)
    assert sorted(map(sorted, groups)) == sorted(sorted(b.tolist()) for b in blocks)
    assert inside_share(s, groups) > 0.7
    uniform = balanced_groups(np.ones((7, 7)), 3)
    assert sorted(len(g) for g in uniform) == [2, 2, 3] and sorted(sum(uniform, [])) == list(range(7))
    with pytest.raises(ValueError, match="between 1 and the number"):
        balanced_groups(s, 10)


def test_towers_command_proposes_a_config_that_trains(tmp_path, capsys):
    import yaml

    from ember.cli import main
    from ember.train.loop import train

    raw = {"data": {"preset": "synthetic", "batch_size": 256,
                    "synthetic": {"rows": 3000, "eval_rows": 1000, "vocab_size": 300, "num_sparse": 6}},
           "embedding": {"dim": 8}, "model": {"type": "dlrm", "bottom_mlp": [16, 8], "top_mlp": [16]},
           "train": {"out_dir": str(tmp_path), "run_name": "base", "progress": False, "threads": 1}}
    train(from_dict(raw))
    out = tmp_path / "towers.yaml"
    assert main(["towers", "--checkpoint", str(tmp_path / "base"), "--towers", "3", "--rows", "500",
                 "--out", str(out)]) == 0
    printed = capsys.readouterr()
    assert "3 towers for 6 features" in printed.err and "500 eval rows" in printed.err
    snippet = yaml.safe_load(out.read_text())
    assert yaml.safe_load(printed.out) == snippet
    towers = snippet["model"]["towers"]
    assert sorted(sum(towers, [])) == sorted(f"C{i + 1}" for i in range(6)) and len(towers) == 3
    raw["model"] = {**snippet["model"], "bottom_mlp": [16, 8], "top_mlp": [16]}
    raw["train"]["run_name"] = "dmt"
    assert train(from_dict(raw)).metrics["auc/label"] > 0.5
    assert main(["towers", "--checkpoint", str(tmp_path / "base"), "--towers", "9"]) == 2
    assert "at most 6" in capsys.readouterr().err
    # eval files with no row: nothing to measure (was an internal error, exit 3)
    header = ["label", *(f"I{i + 1}" for i in range(13)), *(f"C{i + 1}" for i in range(6))]
    (tmp_path / "empty.csv").write_text(",".join(header) + "\n")
    assert main(["towers", "--checkpoint", str(tmp_path / "base"), "--towers", "2", "data.format=csv",
                 f"data.eval={tmp_path / 'empty.csv'}"]) == 2
    assert "gave no rows to measure the features' interactions on" in capsys.readouterr().err
    # a config whose model makes other tables than the checkpoint's: named as such
    other = tmp_path / "deepfm.yaml"
    other.write_text(yaml.safe_dump({**raw, "model": {"type": "deepfm"}}))
    assert main(["towers", "--checkpoint", str(tmp_path / "base"), "--towers", "2", "--config", str(other)]) == 2
    assert "has no table 'C1__linear'; it has ['C1'," in (err := capsys.readouterr().err)
    assert "it was saved by a 'dlrm' model: give the config it was trained with" in err
    # an lr model's dim-D tables are never trained: no proposal from their noise
    raw["model"], raw["train"]["run_name"] = {"type": "lr"}, "lr"
    train(from_dict(raw))
    assert main(["towers", "--checkpoint", str(tmp_path / "lr"), "--towers", "2"]) == 2
    assert "is of an lr model, whose features have no trained embeddings" in capsys.readouterr().err
