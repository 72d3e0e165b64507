"""The dense optimizer: torch's fused kernel for CPU parameters, the same update as torch's
default implementation (up to float rounding), and a resume keeps the run's implementation
whatever the checkpoint was saved with."""

from __future__ import annotations

import copy
import logging

import pytest
import torch
from torch import nn

from ember.train.builder import keep_implementation, make_dense_optimizer
from ember.train.config import DenseOptimizerConfig

TYPES = ["adagrad", "adam", "adamw", "sgd"]


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(13, 64), nn.ReLU(), nn.Linear(64, 1))


def _steps(model: nn.Module, opt: torch.optim.Optimizer, n: int = 5) -> None:
    g = torch.Generator().manual_seed(1)
    for _ in range(n):
        x = torch.randn(32, 13, generator=g)
        opt.zero_grad(set_to_none=True)
        model(x).square().mean().backward()
        opt.step()


@pytest.mark.parametrize("kind", TYPES)
def test_cpu_parameters_get_the_fused_kernel_and_the_default_update(kind):
    cfg = DenseOptimizerConfig(type=kind, lr=0.01, weight_decay=0.001)
    fused_model, plain_model = _model(), _model()
    fused = make_dense_optimizer(fused_model.parameters(), cfg)
    assert all(g["fused"] is True for g in fused.param_groups)
    kw = {"lr": 0.01, "weight_decay": 0.001}
    plain = {"adagrad": torch.optim.Adagrad, "adam": torch.optim.Adam, "adamw": torch.optim.AdamW,
             "sgd": torch.optim.SGD}[kind](plain_model.parameters(), **kw)
    _steps(fused_model, fused)
    _steps(plain_model, plain)
    for a, b in zip(fused_model.parameters(), plain_model.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    moved = any(not torch.equal(a, b) for a, b in zip(fused_model.parameters(), _model().parameters()))
    assert moved, "the optimizer did not step"


def test_non_float_or_non_cpu_parameters_keep_torch_default_and_say_so(caplog):
    meta = nn.Linear(4, 1, device="meta")
    with caplog.at_level(logging.INFO, logger="ember.train.builder"):
        opt = make_dense_optimizer(meta.parameters(), DenseOptimizerConfig(type="adam"))
    assert all(not g["fused"] for g in opt.param_groups)
    assert any("default implementation for parameters on meta" in r.message for r in caplog.records)


def test_resume_keeps_the_runs_implementation_over_the_checkpoints():
    cfg = DenseOptimizerConfig(type="adam", lr=0.01)
    model = _model()
    saved_by_default = torch.optim.Adam(model.parameters(), lr=0.01)  # e.g. a checkpoint from before
    _steps(model, saved_by_default, 2)
    state = copy.deepcopy(saved_by_default.state_dict())
    assert state["param_groups"][0]["fused"] is None
    resumed = make_dense_optimizer(model.parameters(), cfg)
    keep_implementation(resumed, copy.deepcopy(state))  # (loading may keep the tensors it is given)
    assert resumed.param_groups[0]["fused"] is True
    assert torch.equal(resumed.state_dict()["state"][0]["exp_avg"], state["state"][0]["exp_avg"])  # the state itself loaded
    twin = _model()
    twin.load_state_dict(model.state_dict())
    plain = torch.optim.Adam(twin.parameters(), lr=0.01)
    plain.load_state_dict(copy.deepcopy(state))
    _steps(model, resumed, 3)
    _steps(twin, plain, 3)
    for a, b in zip(model.parameters(), twin.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
