"""bf16 row storage end to end: learns like fp32, resumes exactly, converts checkpoints between
dtypes, exports with scores equal to eval's, and works as a command-line override."""

from __future__ import annotations

import json

import torch
import yaml

from ember.checkpoint.load import load_tables, read_manifest
from ember.checkpoint.save import save_checkpoint
from ember.cli import main
from ember.config import from_dict
from ember.embedding import EmbeddingCollection, FeatureConfig, TableConfig
from ember.embedding.codec import round_nearest
from ember.testing import assert_export_scores_as_eval
from ember.train.loop import train
from tests.train.test_train_e2e import _assert_same_model


def _cfg(tmp_path, name, dtype="bf16", rows=20_000, eval_rows=4_000, **train_kw):
    return from_dict({
        "data": {"preset": "synthetic", "synthetic": {"rows": rows, "eval_rows": eval_rows, "vocab_size": 5_000, "num_sparse": 6},
                 "batch_size": 512},
        "embedding": {"dim": 8, "optimizer": {"type": "rowwise_adagrad", "lr": 0.05}, "dtype": dtype},
        "model": {"type": "dlrm", "bottom_mlp": [16, 8], "top_mlp": [16]},
        "train": {"dense_optimizer": {"type": "adam", "lr": 0.003}, "out_dir": str(tmp_path), "run_name": name,
                  "progress": False, "log_every": 10, "threads": 1, **train_kw},
    })


def _is_bf16(result) -> bool:
    for ec in result.parts.collections():
        for t in ec.tables.values():
            for _, rec in t.items():
                w = rec[:, : t.dim]
                if not torch.equal(w, w.to(torch.bfloat16).float()):
                    return False
    return True


def test_bf16_learns_like_fp32(tmp_path):
    fp32 = train(_cfg(tmp_path, "fp32", dtype="fp32", epochs=2))
    bf16 = train(_cfg(tmp_path, "bf16", epochs=2))
    assert fp32.metrics["auc/label"] > 0.65, fp32.metrics
    assert abs(bf16.metrics["auc/label"] - fp32.metrics["auc/label"]) < 0.01, (bf16.metrics, fp32.metrics)
    assert _is_bf16(bf16)


def test_bf16_resume_equals_uninterrupted(tmp_path):
    full = train(_cfg(tmp_path, "full", rows=8_000, eval_rows=500, max_steps=12, deterministic=True))
    first = train(_cfg(tmp_path, "part", rows=8_000, eval_rows=500, max_steps=5, deterministic=True))
    manifest = read_manifest(first.run_dir / "checkpoints" / "step-00000005")
    assert {t["dtype"] for t in manifest["tables"]} == {"bf16"}
    resumed = train(_cfg(tmp_path, "part", rows=8_000, eval_rows=500, max_steps=12, deterministic=True, resume=str(first.run_dir)))
    assert resumed.step == full.step == 12
    _assert_same_model(full, resumed)


def _collection(dtype: str, ttl: int | None = None) -> EmbeddingCollection:
    tables = [TableConfig(name="t", dim=5, dtype=dtype, ttl_steps=ttl, optimizer={"type": "adam", "lr": 0.01})]
    return EmbeddingCollection(tables, [FeatureConfig(name="t")], seed=1)


def _fill(ec: EmbeddingCollection) -> None:
    t = ec.tables["t"]
    ids = torch.arange(300) * 977 - 40
    rec = torch.randn(300, t.config.record_dim)
    rec[:, t.dim :] = rec[:, t.dim :].abs()  # Adam's state (moments, step) as plain values
    t.load(ids, rec)
    t.step = 7


def _items(ec: EmbeddingCollection) -> tuple[torch.Tensor, torch.Tensor]:
    ids, rec = zip(*ec.tables["t"].items())
    ids, rec = torch.cat(ids), torch.cat(rec)
    order = torch.argsort(ids)
    return ids[order], rec[order]


def test_checkpoints_convert_between_dtypes(tmp_path):
    """fp32 checkpoint -> bf16 table: weights rounded to nearest, state exact; bf16 checkpoint ->
    fp32 table: exact. bf16 checkpoints are packed (smaller .rec) and record their dtype."""
    src = _collection("fp32")
    _fill(src)
    c32 = save_checkpoint(tmp_path / "a", 1, [src], {}, {}, {})
    bf = _collection("bf16")
    load_tables(c32, [bf], read_manifest(c32))
    ids, want = _items(src)
    got_ids, got = _items(bf)
    assert torch.equal(got_ids, ids)
    assert torch.equal(got[:, :5], round_nearest(want[:, :5], "bf16")) and torch.equal(got[:, 5:], want[:, 5:])

    c16 = save_checkpoint(tmp_path / "b", 1, [bf], {}, {}, {})
    m = read_manifest(c16)["tables"][0]
    assert (m["dtype"], m["record_words"], m["record_dim"]) == ("bf16", 3 + 11, 16)  # Adam: 11 state floats
    size = lambda c: (c / "tables" / "t.part-0.rec").stat().st_size  # noqa: E731
    assert size(c16) == 300 * 4 * 14 and size(c32) == 300 * 4 * 16
    back = _collection("fp32")
    load_tables(c16, [back], read_manifest(c16))
    assert torch.equal(_items(back)[1], got)  # bf16 -> fp32 widens exactly
    again = _collection("bf16")
    load_tables(c16, [again], read_manifest(c16))
    assert torch.equal(_items(again)[1], got)  # bf16 -> bf16 is exact
    fp16 = _collection("fp16")
    load_tables(c16, [fp16], read_manifest(c16))
    assert torch.equal(_items(fp16)[1][:, :5], round_nearest(got[:, :5], "fp16"))


def test_ttl_table_checkpoint_keeps_last_seen_at_bf16(tmp_path):
    src = _collection("bf16", ttl=50)
    _fill(src)
    c = save_checkpoint(tmp_path / "c", 1, [src], {}, {}, {})
    dst = _collection("bf16", ttl=50)
    load_tables(c, [dst], read_manifest(c))
    seen = lambda ec: torch.cat([s for _, _, s in ec.tables["t"].items_with_seen()])  # noqa: E731
    assert torch.equal(seen(dst), seen(src)) and torch.equal(_items(dst)[1], _items(src)[1])


def test_fp32_run_resumes_into_bf16_and_back(tmp_path):
    first = train(_cfg(tmp_path, "mix", dtype="fp32", rows=8_000, eval_rows=500, max_steps=5))
    as_bf16 = train(_cfg(tmp_path, "mix", dtype="bf16", rows=8_000, eval_rows=500, max_steps=9, resume=str(first.run_dir)))
    assert as_bf16.step == 9 and _is_bf16(as_bf16)
    as_fp32 = train(_cfg(tmp_path, "mix", dtype="fp32", rows=8_000, eval_rows=500, max_steps=12, resume=str(first.run_dir)))
    assert as_fp32.step == 12 and 0.5 < as_fp32.metrics["auc/label"] <= 1


def test_bf16_export_scores_equal_eval(tmp_path):
    cfg = _cfg(tmp_path, "export", rows=8_000, max_steps=10)
    # eval data has IDs training never saw: they read their (rounded) initial rows in both
    out = assert_export_scores_as_eval(train(cfg).parts, cfg, tmp_path / "exported")  # beside the run "export"
    manifest = json.loads((out / "manifest.json").read_text())
    t = manifest["tables"][0]
    assert t["dtype"] == "bf16"
    assert (out / "tables" / f"{t['name']}.weights").stat().st_size == t["rows"] * t["dim"] * 2


def test_cli_override_embedding_dtype(tmp_path, capsys):
    cfg = tmp_path / "run.yaml"
    cfg.write_text(yaml.safe_dump({
        "data": {"preset": "synthetic", "synthetic": {"rows": 2000, "eval_rows": 500, "num_sparse": 3, "vocab_size": 500},
                 "batch_size": 250},
        "embedding": {"dim": 4}, "model": {"type": "lr"},
        "train": {"out_dir": str(tmp_path), "run_name": "cli", "progress": False, "threads": 1},
    }))
    assert main(["train", "--config", str(cfg), "embedding.dtype=bf16", "train.max_steps=4"]) == 0
    resolved = yaml.safe_load((tmp_path / "cli" / "config.yaml").read_text())
    assert resolved["embedding"]["dtype"] == "bf16"
    manifest = read_manifest(tmp_path / "cli" / "checkpoints" / "step-00000004")
    dtypes = {t["name"]: t["dtype"] for t in manifest["tables"]}
    # the model's embedding tables are bf16; its dim-1 linear tables stay fp32 (no smaller packed)
    assert {d for n, d in dtypes.items() if not n.endswith("__linear")} == {"bf16"}, dtypes
    assert {d for n, d in dtypes.items() if n.endswith("__linear")} == {"fp32"}, dtypes
