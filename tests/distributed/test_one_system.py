"""A distributed run takes what one process does: ``model.distill``, ``train.precision: fp16``,
``train.compile`` and ``train.early_stopping.restore_best`` on 2 gloo ranks (spawned from this
process, ``tests.distributed.ranks``) end with the state and eval figures of one process on the
same global batches."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from ember.config import from_dict
from ember.source.config import DataConfig
from ember.source.writer import write_synthetic
from ember.train.loop import RunResult, train
from tests.distributed.ranks import merge_tables, run_ranks, table_rows

pytestmark = [pytest.mark.dist, pytest.mark.slow]

SYN = {"num_dense": 2, "num_sparse": 3, "vocab_size": 60}


def _with_teacher(root: Path, split: str, rows: int) -> str:
    """Synthetic rows plus a ``teacher`` column: a noisy probability that knows the label."""
    path = str(root / f"{split}.parquet")
    write_synthetic(path, "parquet", rows, DataConfig(synthetic={**SYN, "rows": rows, "eval_rows": rows}).synthetic,
                    split=split)
    table = pq.read_table(path)
    y = table.column("label").to_numpy().astype(np.float64)
    logit = np.where(y > 0.5, 1.0, -1.0) + np.random.default_rng(len(split)).normal(0, 1.0, len(y))
    pq.write_table(table.append_column("teacher", pa.array(1 / (1 + np.exp(-logit)), pa.float32())), path)
    return path


def _raw(root: Path, name: str, **train_kw: Any) -> dict:
    schema = {"labels": ["label"], "teacher": ["teacher"], "dense": [{"name": "I1"}, {"name": "I2"}],
              "sparse": [{"name": f"C{i}", "hash_ids": False} for i in (1, 2, 3)]}
    return {
        "data": {"format": "parquet", "train": str(root / "train.parquet"), "eval": str(root / "eval.parquet"),
                 "batch_size": 100, "shuffle_buffer": 0},
        "schema": schema, "embedding": {"dim": 4, "optimizer": {"type": "adagrad", "lr": 0.2}},
        "model": {"type": "dlrm", "bottom_mlp": [8, 4], "top_mlp": [8]},
        "train": {"out_dir": str(root / "runs"), "run_name": name, "progress": False, "threads": 1, "log_every": 2,
                  "precision": "fp32", "dense_optimizer": {"type": "adam", "lr": 0.05}, **train_kw},
        "distributed": {"sharding": "row_wise"},
    }


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("one_system")
    _with_teacher(root, "train", 800)
    _with_teacher(root, "eval", 300)
    return root


def _state(result: RunResult) -> dict[str, Any]:
    """What must not depend on the world size: the dense model, this process's rows (a rank's
    shard), the eval figures, the loss scaler's state and what the compile spy saw."""
    assert result.parts is not None
    tables = table_rows(result.parts.embeddings)
    scaler = result.parts.scaler.state_dict() if result.parts.scaler is not None else None
    return {"model": {k: v.clone() for k, v in result.parts.model.state_dict().items()}, "tables": tables,
            "metrics": dict(result.metrics), "step": result.step, "scaler": scaler, "compiled": list(_COMPILED)}


_COMPILED: list[tuple[str, int]] = []  # the compile spy: (compiled module's type, calls)


def _spy_compile(broken: bool) -> Any:
    """A torch.compile spy that runs the module eagerly (counting calls), or (``broken``) one
    whose first call fails as a compiler would."""
    def compile(module: torch.nn.Module, **_: Any) -> Any:
        entry = [type(module).__name__, 0]
        _COMPILED.append(entry)  # type: ignore[arg-type]

        def run(*inputs: Any) -> Any:
            if broken:
                raise RuntimeError("no C++ compiler found")
            entry[1] += 1
            return module(*inputs)
        return run

    return compile


def _overflowing_scaler(here: bool, at_call: int) -> Any:
    """fp16: a loss scaler whose ``at_call``-th unscale finds an inf in a gradient of this
    process (``here``) only, as an overflow on one rank would."""
    import ember.train.builder as builder

    class Injected(builder.LossScaler):  # type: ignore[misc,valid-type]
        calls = 0

        def unscale_(self, grads):  # type: ignore[no-untyped-def]
            grads = list(grads)
            Injected.calls += 1
            if here and Injected.calls == at_call:
                next(g for g in grads if g is not None).view(-1)[0] = float("inf")
            return super().unscale_(grads)

    return Injected


def _patches(here: bool, raw: dict, spy: str | None) -> list[tuple[Any, str, Any]]:
    """(object, attribute, value) to set: the compile spy; under fp16 an overflow at the third
    step on the last rank (``here``; one process: in its third step)."""
    import ember.train.builder as builder

    out: list[tuple[Any, str, Any]] = []
    if spy is not None:
        out.append((torch, "compile", _spy_compile(spy == "broken")))
    if raw["train"].get("precision") == "fp16":
        out.append((builder, "LossScaler", _overflowing_scaler(here, at_call=3)))
    return out


def _run(raw: dict) -> dict[str, Any]:
    _COMPILED.clear()
    return _state(train(from_dict(raw)))


def _train(rank: int, world_size: int, raw: dict, spy: str | None = None) -> dict[str, Any]:
    for obj, name, value in _patches(rank == world_size - 1, raw, spy):
        setattr(obj, name, value)
    return _run(raw)


def _one_and_two(monkeypatch: pytest.MonkeyPatch, raw_one: dict, raw_two: dict,
                 spy: str | None = None) -> tuple[dict, list[dict]]:
    """One process (this one), then 2 spawned ranks."""
    with monkeypatch.context() as m:
        for obj, name, value in _patches(True, raw_one, spy):
            m.setattr(obj, name, value)
        one = _run(raw_one)
    return one, run_ranks(_train, 2, (raw_two, spy), timeout=240)


def _assert_same(one: dict, ranks: list[dict], atol: float = 1e-5) -> None:
    for r in ranks:
        assert r["step"] == one["step"]
        assert r["metrics"] == pytest.approx(one["metrics"], abs=max(atol, 1e-6))
        assert r["scaler"] == one["scaler"]
        for k, v in one["model"].items():
            torch.testing.assert_close(r["model"][k], v, rtol=1e-4, atol=atol, msg=lambda m: f"model {k}: {m}")
    got = merge_tables([r["tables"] for r in ranks])
    for name, (ids, rec) in merge_tables([one["tables"]]).items():
        np.testing.assert_array_equal(got[name][0], ids, err_msg=f"table {name}: IDs differ")
        np.testing.assert_allclose(got[name][1], rec, rtol=1e-4, atol=atol, err_msg=f"table {name}")


def test_distill_restore_best_and_compile_train_as_one_process(root, monkeypatch):
    """model.distill (the teacher's scores reach every rank's slice), early stopping that
    restores the best checkpoint (each rank restores its shard and the dense state), and
    torch.compile (a spy: a real compile takes minutes on 2 cores) of the DDP module, through
    which every training step and evaluation runs."""
    es = {"metric": "logloss", "patience": 2, "restore_best": True}
    kw = {"epochs": 3, "eval_every": 2, "early_stopping": es, "compile": True}
    model = {**_raw(root, "x")["model"], "distill": {}}
    one, ranks = _one_and_two(monkeypatch, _raw(root, "one", **kw) | {"model": model},
                              _raw(root, "two", **kw) | {"model": model}, "working")
    summary = json.loads((root / "runs" / "two" / "summary.json").read_text())
    assert summary["early_stopping"]["restored_best"] and summary["early_stopping"]["best_step"] < summary["step"]
    assert [c[0] for c in one["compiled"]] == ["Distilled"]
    assert all([c[0] for c in r["compiled"]] == ["DistributedDataParallel"] for r in ranks)
    assert all(r["compiled"][0][1] == one["compiled"][0][1] > summary["step"] for r in ranks)
    _assert_same({**one, "compiled": None}, [{**r, "compiled": None} for r in ranks])


def test_fp16_and_a_failed_compile_train_as_one_process(root, monkeypatch):
    """fp16 loss scaling with an overflow at step 3 on the last rank only (one process: in its
    step 3): every rank skips that step and halves its scale, as one process does; and a
    compile that fails at its first call: every rank goes on uncompiled."""
    one, ranks = _one_and_two(monkeypatch, _raw(root, "fp16one", precision="fp16", max_steps=6, compile=True),
                              _raw(root, "fp16two", precision="fp16", max_steps=6, compile=True), "broken")
    assert one["scaler"] == {"scale": 2.0**15, "clean_steps": 3, "skipped": 1}
    _assert_same({**one, "compiled": None}, [{**r, "compiled": None} for r in ranks], atol=1e-3)
