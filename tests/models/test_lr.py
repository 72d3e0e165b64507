"""The logistic-regression baseline: its exact formula, TorchScript parity, the registry entry,
and that the trainer feeds it the dim-1 linear tables and it learns."""

from __future__ import annotations

import pytest
import torch

from ember.config import from_dict
from ember.models import ModelInputs, build_model, model_config_from_dict
from ember.models.lr import LR, LRConfig
from ember.train.loop import train


def _batch(inputs: ModelInputs, b: int = 5, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    dense = torch.randn(b, inputs.num_dense, generator=g)
    sparse = [torch.randn(b, d, generator=g) for d in inputs.sparse_dims]
    linear = [torch.randn(b, 1, generator=g) for _ in inputs.sparse_dims]
    return dense, sparse, linear


@pytest.mark.parametrize("inputs", [ModelInputs(13, [8] * 26, 1), ModelInputs(3, [4, 2], 3), ModelInputs(0, [4] * 3, 1),
                                    ModelInputs(5, [], 2)])
def test_logit_is_sum_of_linear_terms_plus_dense_linear(inputs: ModelInputs) -> None:
    torch.manual_seed(0)
    model = build_model({"type": "lr"}, inputs)
    assert isinstance(model, LR) and model.wants_linear
    dense, sparse, linear = _batch(inputs)
    with torch.no_grad():
        model.dense_linear.bias.copy_(torch.arange(inputs.num_tasks, dtype=torch.float32))
    ids = torch.cat(linear, 1).sum(1, keepdim=True) if linear else torch.zeros(5, 1)
    expected = ids + dense @ model.dense_linear.weight.T + model.dense_linear.bias
    out = model(dense, sparse, linear)
    assert out.shape == (5, inputs.num_tasks)
    torch.testing.assert_close(out, expected)
    # the D-wide embeddings do not matter
    torch.testing.assert_close(model(dense, [s * 7 for s in sparse], linear), out)


def test_rejects_missing_linear_and_is_registered() -> None:
    inputs = ModelInputs(13, [8] * 4, 1)
    model = build_model(model_config_from_dict({"type": "lr"}), inputs)
    dense, sparse, linear = _batch(inputs)
    with pytest.raises(ValueError, match="wants_linear"):
        model(dense, sparse)
    with pytest.raises(ValueError, match="expected 4 tensors"):
        model(dense, sparse, linear[:3])
    assert model_config_from_dict({"type": "lr"}) == LRConfig()
    with pytest.raises(Exception, match="unknown key"):
        model_config_from_dict({"type": "lr", "deep_mlp": [8]})


@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")
def test_torchscript_matches_eager() -> None:
    torch.manual_seed(0)
    inputs = ModelInputs(13, [8] * 6, 2)
    model = build_model({"type": "lr"}, inputs).eval()
    batch = _batch(inputs)
    scripted = torch.jit.script(model)
    torch.testing.assert_close(scripted(*batch), model(*batch))
    with pytest.raises(Exception, match="wants_linear"):
        scripted(batch[0], batch[1])


def test_trains_through_the_linear_tables_and_learns(tmp_path) -> None:
    threads = torch.get_num_threads()
    try:
        result = train(from_dict({
            "data": {"preset": "synthetic", "batch_size": 256,
                     "synthetic": {"rows": 10_000, "eval_rows": 2_000, "vocab_size": 1_000, "num_sparse": 8}},
            "embedding": {"dim": 1, "optimizer": {"type": "adagrad", "lr": 0.1}},
            "model": {"type": "lr"},
            "train": {"dense_optimizer": {"type": "adam", "lr": 0.01}, "out_dir": str(tmp_path), "run_name": "lr",
                      "progress": False, "threads": 1, "epochs": 2},
        }))
    finally:
        torch.set_num_threads(threads)
    assert result.parts is not None and result.parts.linear is not None
    linear_rows = sum(len(t) for t in result.parts.linear.tables.values())
    assert linear_rows > 1000  # one learned weight per ID seen
    assert result.metrics["auc/label"] > 0.65, result.metrics
