"""Learning-rate schedules: hand-computed values, config errors, and that the sparse update
rules and the dense optimizer actually use the scheduled rate."""

from __future__ import annotations

import math

import pytest
import torch

from ember.batch import SparseFeatures
from ember.embedding import EmbeddingCollection, FeatureConfig, SparseOptimizer, TableConfig
from ember.errors import ConfigError
from ember.optim import SGD, Adagrad, Adam, RowWiseAdagrad
from ember.optim.schedule import ScheduleConfig, scheduled_lr


def _s(**kw) -> ScheduleConfig:
    return ScheduleConfig.parse(kw)


def test_warmup_then_linear_decay_by_hand():
    s = _s(warmup_steps=4, decay="linear", decay_steps=10, final_ratio=0.1)
    # warmup (s+1)/4; then 1 - 0.9 * p/10
    expected = [0.25, 0.5, 0.75, 1.0, 1.0, 0.91, 0.82, 0.73]
    assert [s.factor(i) for i in range(8)] == pytest.approx(expected)
    assert s.factor(14) == pytest.approx(0.1) and s.factor(1000) == pytest.approx(0.1)
    assert scheduled_lr(0.2, s, 5) == pytest.approx(0.2 * 0.91)
    assert scheduled_lr(0.2, None, 5) == 0.2


def test_cosine_by_hand():
    s = _s(decay="cosine", decay_steps=8)
    assert s.factor(0) == 1.0
    assert s.factor(2) == pytest.approx(0.5 * (1 + math.cos(math.pi / 4)))  # 0.853553...
    assert s.factor(4) == pytest.approx(0.5)
    assert s.factor(8) == pytest.approx(0.0, abs=1e-12) and s.factor(50) == pytest.approx(0.0, abs=1e-12)
    w = _s(warmup_steps=2, decay="cosine", decay_steps=4, final_ratio=0.2)
    assert [w.factor(i) for i in (0, 1, 2, 4, 6)] == pytest.approx([0.5, 1.0, 1.0, 0.6, 0.2])


def test_step_and_exponential_by_hand():
    st = _s(decay="step", decay_steps=3, gamma=0.5)
    assert [st.factor(i) for i in range(7)] == [1, 1, 1, 0.5, 0.5, 0.5, 0.25]
    st10 = _s(decay="step", decay_steps=2)  # gamma defaults to 0.1
    assert st10.factor(2) == pytest.approx(0.1)
    ex = _s(warmup_steps=1, decay="exponential", decay_steps=10, gamma=0.5)
    assert ex.factor(0) == 1.0 and ex.factor(1) == 1.0
    assert ex.factor(6) == pytest.approx(0.5 ** 0.5) and ex.factor(21) == pytest.approx(0.25)
    assert _s(warmup_steps=3).factor(1) == pytest.approx(2 / 3) and _s(warmup_steps=3).factor(99) == 1.0


@pytest.mark.parametrize("cfg, message", [
    ({"decay": "cosine"}, "needs decay_steps"),
    ({"decay": "constant", "decay_steps": 5}, "'decay_steps' has no effect with decay 'constant'"),
    ({"decay": "linear", "decay_steps": 5, "gamma": 0.5}, "'gamma' has no effect with decay 'linear'"),
    ({"decay": "step", "decay_steps": 5, "final_ratio": 0.5}, "'final_ratio' has no effect"),
    ({"decay": "poly"}, "decay"),
    ({"warmup": 5}, "unknown key"),
])
def test_bad_schedules_are_config_errors(cfg, message):
    with pytest.raises(ConfigError, match=message):
        ScheduleConfig.parse(cfg)


def test_ftrl_refuses_a_schedule_and_configs_reach_the_run():
    from ember.config import from_dict

    base = {"data": {"preset": "synthetic"}, "model": {"type": "lr"}}
    with pytest.raises(ConfigError, match="ftrl takes no lr schedule"):
        from_dict({**base, "embedding": {"optimizer": {"type": "ftrl", "schedule": {"warmup_steps": 3}}}})
    cfg = from_dict({**base, "embedding": {"optimizer": {"type": "sgd", "lr": 0.1, "schedule": {"warmup_steps": 3}}},
                     "train": {"dense_optimizer": {"type": "sgd", "lr": 0.1, "schedule": {"decay": "cosine", "decay_steps": 9}}}})
    assert cfg.table_configs()[0].optimizer.schedule.warmup_steps == 3
    assert cfg.train.dense_optimizer.schedule.decay_steps == 9


def test_sgd_row_moves_by_scheduled_lr_times_grad():
    sched = {"warmup_steps": 3, "decay": "step", "decay_steps": 2, "gamma": 0.5}
    ec = EmbeddingCollection([TableConfig(name="t", dim=2, optimizer={"type": "sgd", "lr": 0.8, "schedule": sched})],
                             [FeatureConfig(name="a", table="t")])
    opt = SparseOptimizer(ec)
    sf = SparseFeatures(["a"], torch.tensor([7]), torch.tensor([1]))
    moves = []
    for _ in range(7):
        before = ec(sf)["a"].detach().clone()
        ec(sf)["a"].sum().backward()  # gradient 1 on each weight
        opt.step()
        after = ec(sf)["a"].detach()
        moves.append(float((before - after)[0, 0]))
    # lr(s) = 0.8 * [1/3, 2/3, 1 (warmup), then gamma ** floor((s - 3) / 2): 1, 1, 0.5, 0.5]
    assert moves == pytest.approx([0.8 / 3, 1.6 / 3, 0.8, 0.8, 0.8, 0.4, 0.4], rel=1e-5)
    assert opt.steps == 7


@pytest.mark.parametrize("rule", [SGD(lr=0.3), Adagrad(lr=0.3), RowWiseAdagrad(lr=0.3), Adam(lr=0.3)])
def test_each_rule_uses_the_lr_passed_in(rule):
    """update(lr=x) equals the same rule configured with lr=x (the native row-wise Adagrad too)."""
    torch.manual_seed(0)
    rows, grads = torch.randn(5, 4), torch.randn(5, 4)
    state = rule.init_state(rows)
    a = rule.update(rows.clone(), state.clone(), grads, 0, lr=0.05)
    b = rule.model_copy(update={"lr": 0.05}).update(rows.clone(), state.clone(), grads, 0)
    assert torch.allclose(a[0], b[0]) and torch.allclose(a[1], b[1])
    assert not torch.allclose(a[0], rule.update(rows.clone(), state.clone(), grads, 0)[0])


def test_scheduled_table_without_a_step_is_an_error():
    ec = EmbeddingCollection([TableConfig(name="t", dim=2, optimizer={"type": "sgd", "schedule": {"warmup_steps": 2}})],
                             [FeatureConfig(name="a", table="t")])
    opt = SparseOptimizer(ec)
    sf = SparseFeatures(["a"], torch.tensor([7]), torch.tensor([1]))
    ec(sf)["a"].sum().backward()
    with pytest.raises(RuntimeError, match="pass the global step"):
        SparseOptimizer.apply(opt.take())
