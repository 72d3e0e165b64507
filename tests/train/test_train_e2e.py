"""End to end on synthetic data: learns, resumes exactly, exports with equal scores, finetunes."""

from __future__ import annotations

import pytest
import torch

from ember.config import from_dict
from ember.models.registry import model_config_from_dict
from ember.testing import assert_export_scores_as_eval
from ember.train.loop import train


def _cfg(tmp_path, name, **train):
    return from_dict({
        "data": {"preset": "synthetic", "synthetic": {"rows": 40_000, "eval_rows": 8_000, "vocab_size": 20_000, "num_sparse": 8},
                 "batch_size": 512},
        "embedding": {"dim": 8, "optimizer": {"type": "rowwise_adagrad", "lr": 0.05}},
        "model": {"type": "dlrm", "bottom_mlp": [32, 8], "top_mlp": [32]},
        "train": {"dense_optimizer": {"type": "adam", "lr": 0.003}, "out_dir": str(tmp_path), "run_name": name,
                  "progress": False, "log_every": 10, **train},
    })


def test_dlrm_learns_planted_signal(tmp_path):
    result = train(_cfg(tmp_path, "learn", epochs=2))
    assert result.metrics["auc/label"] > 0.7, result.metrics
    assert (result.run_dir / "metrics.png").exists()
    assert (result.run_dir / "config.yaml").exists()
    losses = [r["loss"] for r in result.history if r["kind"] == "train"]
    assert losses[-1] < losses[0]


def _state(result):
    parts = result.parts
    tables = {}
    for ec in parts.collections():
        for name, t in ec.tables.items():
            ids, rec = zip(*t.items())
            tables[name] = (torch.cat(ids), torch.cat(rec))
    return parts.model.state_dict(), tables


def _assert_same_model(a, b, by_id: bool = False) -> None:
    """Two runs end with equal dense weights and equal tables (rows in the same order, or matched
    by ID when ``by_id``: a different tier layout yields rows in another order)."""
    m_a, t_a = _state(a)
    m_b, t_b = _state(b)
    for k in m_a:
        assert torch.equal(m_a[k], m_b[k]), k
    assert t_a.keys() == t_b.keys()
    for name, (ids_a, rec_a) in t_a.items():
        ids_b, rec_b = t_b[name]
        if by_id:
            o_a, o_b = torch.argsort(ids_a), torch.argsort(ids_b)
            ids_a, rec_a, ids_b, rec_b = ids_a[o_a], rec_a[o_a], ids_b[o_b], rec_b[o_b]
        assert torch.equal(ids_a, ids_b), name
        assert torch.equal(rec_a, rec_b), name


@pytest.mark.parametrize("model", [{"type": "dlrm", "bottom_mlp": [32, 8], "top_mlp": [32]}, {"type": "deepfm", "deep_mlp": [32]}])
def test_resume_equals_uninterrupted(tmp_path, model):
    def cfg(name, **kw):
        c = _cfg(tmp_path, name, deterministic=True, **kw)
        return c.model_copy(update={"model": model_config_from_dict(model)})

    full = train(cfg("full", max_steps=30))
    first = train(cfg("part", max_steps=14))
    resumed = train(cfg("part", max_steps=30, resume=str(first.run_dir)))
    assert resumed.step == full.step == 30
    _assert_same_model(full, resumed)


def test_export_predictor_scores_equal_trained_model(tmp_path):
    cfg = _cfg(tmp_path, "export", max_steps=20)
    assert_export_scores_as_eval(train(cfg).parts, cfg, tmp_path / "exported")  # beside the run "export", not over it


def test_finetune_starts_from_checkpoint_weights(tmp_path):
    base = train(_cfg(tmp_path, "base", max_steps=15))
    tuned = train(_cfg(tmp_path, "tuned", max_steps=1, init_from=str(base.run_dir), dense_optimizer={"type": "sgd", "lr": 1e-9}))
    a, _ = _state(base)
    b, _ = _state(tuned)
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=0, atol=1e-6)


@pytest.mark.slow
def test_resume_across_tier_layouts_with_admission(tmp_path):
    """Trained with a tiny device cache + small host budget + disk tier (and min_count), resumed
    all in host memory: the final model equals an uninterrupted all-in-memory run."""
    tiered = {"device_rows": 32, "host_rows": 128, "disk_path": str(tmp_path / "disk"), "disk_rows": 40_000,
              "policy": "lfu", "admit_after": 2}

    def cfg(name, storage, **kw):
        c = _cfg(tmp_path, name, deterministic=True, **kw)
        tables = [t.model_copy(update={"storage": type(t.storage).model_validate(storage), "min_count": 2})
                  for t in c.table_configs()]
        return c.model_copy(update={"tables": tables})

    full = train(cfg("full", {}, max_steps=24))
    first = train(cfg("part", tiered, max_steps=11))
    last_train = [r for r in first.history if r["kind"] == "train"][-1]
    assert any(v > 0 for k, v in last_train.items() if k.endswith("tier.disk.rows")), last_train
    for ec in first.parts.collections():
        for t in ec.tables.values():
            t.close()
    resumed = train(cfg("part", {}, max_steps=24, resume=str(first.run_dir)))
    _assert_same_model(full, resumed, by_id=True)


def test_removed_train_prefetch_is_a_clear_error():
    from ember.config import from_dict
    from ember.errors import ConfigError

    with pytest.raises(ConfigError, match="train.prefetch was removed"):
        from_dict({"data": {"preset": "synthetic"}, "model": {"type": "dlrm"}, "train": {"prefetch": True}})


@pytest.mark.slow
def test_resume_with_ttl_equals_uninterrupted(tmp_path):
    """Rows expire on the same steps after a resume: each row's last-seen step is checkpointed."""

    def cfg(name, **kw):
        c = _cfg(tmp_path, name, deterministic=True, **kw)
        tables = [t.model_copy(update={"ttl_steps": 4}) for t in c.table_configs()]
        return c.model_copy(update={"tables": tables})

    full = train(cfg("full", max_steps=24))
    first = train(cfg("part", max_steps=10))
    resumed = train(cfg("part", max_steps=24, resume=str(first.run_dir)))
    assert any(r.get(k, 0) > 0 for r in full.history for k in r if k.endswith("expired_rows"))  # TTL did act
    _assert_same_model(full, resumed, by_id=True)
