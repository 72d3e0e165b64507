"""A deterministic run trains the same bits whether reading and featurizing run in a worker
process (``pipeline.data_workers: 1``) or on threads, and whether the embedding stages run on
threads or in line (``pipeline.engine``): for every model of the zoo, dropout included.

The data path never draws from torch's global generator (the one dropout draws from): the
worker DataLoader seeds its workers from a generator of its own (``worker_loader``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from ember.config import from_dict
from ember.featurize.presets import preset_schema
from ember.models import MODEL_TYPES
from ember.pipeline.loader import make_batches
from ember.source.config import DataConfig
from ember.testing import assert_identical
from ember.train.loop import train


def _mlp(*sizes: int) -> dict[str, Any]:
    return {"sizes": list(sizes), "dropout": 0.3}


# every model type, with dropout in each MLP it has (lr has none)
MODELS: dict[str, dict[str, Any]] = {
    "dlrm": {"type": "dlrm", "bottom_mlp": _mlp(8, 4), "top_mlp": _mlp(8)},
    "deepfm": {"type": "deepfm", "deep_mlp": _mlp(8)},
    "wdl": {"type": "wdl", "deep_mlp": _mlp(8)},
    "dcn": {"type": "dcn", "num_cross_layers": 1, "deep_mlp": _mlp(8)},
    "mmoe": {"type": "mmoe", "num_experts": 2, "expert_mlp": _mlp(8), "tower_mlp": _mlp(4)},
    "shared_bottom": {"type": "shared_bottom", "bottom_mlp": _mlp(8), "tower_mlp": _mlp(4)},
    "lr": {"type": "lr"},
    "dmt": {"type": "dmt", "tower_mlp": _mlp(8), "bottom_mlp": _mlp(8, 4), "top_mlp": _mlp(8)},
}


def test_every_model_type_is_covered() -> None:
    assert set(MODELS) == set(MODEL_TYPES)


def _run(tmp_path: Path, model: dict[str, Any], workers: int, engine: str) -> dict[str, torch.Tensor]:
    raw = {
        "data": {"preset": "synthetic", "batch_size": 32,
                 "synthetic": {"rows": 192, "eval_rows": 32, "vocab_size": 40, "num_sparse": 4, "num_dense": 2}},
        "embedding": {"dim": 4},
        "model": model,
        "pipeline": {"data_workers": workers, "engine": engine},
        "train": {"out_dir": str(tmp_path), "run_name": f"{model['type']}-{workers}-{engine}", "progress": False,
                  "deterministic": True, "threads": 1, "max_steps": 5},
    }
    return _state(train(from_dict(raw)))


def _state(result: Any) -> dict[str, torch.Tensor]:
    """``run_state``: dense weights and every table's rows by ID (a table no row reached, e.g.
    the unused embedding tables of lr, counts as empty)."""
    out = {f"dense/{k}": v for k, v in result.parts.model.state_dict().items()}
    for ec in result.parts.collections():
        for name, table in ec.tables.items():
            pairs = list(table.items())
            ids = torch.cat([i for i, _ in pairs]) if pairs else torch.zeros(0, dtype=torch.int64)
            rows = torch.cat([r for _, r in pairs]) if pairs else torch.zeros(0)
            order = torch.argsort(ids)
            out[f"{name}/ids"], out[f"{name}/rows"] = ids[order], rows[order]
    assert sum(v.numel() for k, v in out.items() if k.endswith("/rows")), "no embedding row was trained"
    return out


def test_a_data_worker_leaves_the_global_torch_generator_alone() -> None:
    """The root cause: DataLoader drew its workers' base seed from torch's global generator."""
    data = DataConfig(batch_size=32, synthetic={"rows": 64, "num_dense": 2, "num_sparse": 2, "vocab_size": 20})
    torch.manual_seed(0)
    before = torch.get_rng_state()
    in_worker = list(make_batches(data, preset_schema("synthetic", data), "train", workers=1))
    assert torch.equal(before, torch.get_rng_state())
    in_line = list(make_batches(data, preset_schema("synthetic", data), "train"))
    assert [b.sparse.values.tolist() for b in in_worker] == [b.sparse.values.tolist() for b in in_line]


def test_a_streams_data_worker_leaves_the_global_torch_generator_alone(tmp_path: Path) -> None:
    """The same for a watched stream's worker (``StreamLoader``, train.mode: online)."""
    from ember.featurize.schema import Schema
    from ember.pipeline.stream import StreamLoader

    (tmp_path / "part-0.csv").write_text("y,d,c\n" + "".join(f"{i % 2},{i},id{i}\n" for i in range(20)))
    data = DataConfig(format="csv", train=str(tmp_path), batch_size=8, shuffle_buffer=0)
    torch.manual_seed(0)
    before = torch.get_rng_state()
    schema = Schema(labels=["y"], dense=[{"name": "d"}], sparse=[{"name": "c"}])
    assert sum(b.size for b in StreamLoader(data, schema, stop=lambda: True, workers=1)) == 16  # a stop keeps the partial batch
    assert torch.equal(before, torch.get_rng_state())


def test_dropout_run_is_the_same_with_a_data_worker_and_either_engine(tmp_path: Path) -> None:
    base = _run(tmp_path, MODELS["dlrm"], 0, "inline")
    assert_identical(base, _run(tmp_path, MODELS["dlrm"], 1, "inline"))
    assert_identical(base, _run(tmp_path, MODELS["dlrm"], 0, "threads"))


@pytest.mark.slow
@pytest.mark.parametrize("kind", [k for k in MODELS if k != "dlrm"])
def test_every_model_is_the_same_with_a_data_worker_and_either_engine(tmp_path: Path, kind: str) -> None:
    # a data worker with the threads engine, and the threads engine alone; a worker with the
    # inline engine is the dlrm test's above: the worker process reads and featurizes, the same
    # for every model (and each worker run pays a spawned interpreter's torch import)
    base = _run(tmp_path, MODELS[kind], 0, "inline")
    for workers, engine in [(0, "threads"), (1, "threads")]:
        assert_identical(base, _run(tmp_path, MODELS[kind], workers, engine))
