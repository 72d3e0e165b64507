"""Reduced precision: bf16/fp16 autocast with fp32 master weights, fp16 loss scaling that skips
an overflowing step whole (dense and rows), its state in checkpoints; torch.compile with an
announced fallback."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch

from ember.config import from_dict
from ember.pipeline.loader import make_batches
from ember.testing import assert_export_scores_as_eval
from ember.train.loop import train, train_step
from ember.train.precision import LossScaler


def _raw(tmp_path: Path, name: str, **train_kw) -> dict:
    return {
        "data": {"preset": "synthetic", "batch_size": 256,
                 "synthetic": {"rows": 8_000, "eval_rows": 4_000, "vocab_size": 1_500, "num_sparse": 4}},
        "embedding": {"dim": 8},
        "model": {"type": "dlrm", "bottom_mlp": [32, 8], "top_mlp": [32]},
        "train": {"out_dir": str(tmp_path), "run_name": name, "progress": False, "threads": 1, "log_every": 10,
                  "device": "cpu", **train_kw},
    }


@pytest.mark.parametrize("precision, dtype", [("bf16", torch.bfloat16), ("fp16", torch.float16)])
def test_reduced_precision_runs_the_model_in_it_and_keeps_fp32_weights(tmp_path, monkeypatch, precision, dtype):
    import ember.train.loop as loop

    seen: set[tuple[bool, torch.dtype]] = set()
    ref = train(from_dict(_raw(tmp_path, "fp32")))
    original = loop.build_components

    def spying(cfg, *rest):  # type: ignore[no-untyped-def]
        parts = original(cfg, *rest)
        first = next(m for m in parts.model.modules() if isinstance(m, torch.nn.Linear))
        first.register_forward_hook(lambda mod, inp, out: seen.add((mod.training, out.dtype)))
        return parts

    monkeypatch.setattr(loop, "build_components", spying)
    low = train(from_dict(_raw(tmp_path, precision, precision=precision)))
    # the training steps' matmuls ran in the reduced type, eval's in fp32 (as an export serves) ...
    assert seen == {(True, dtype), (False, torch.float32)}
    assert all(p.dtype == torch.float32 for p in low.parts.model.parameters())  # ... on fp32 master weights
    assert abs(low.metrics["auc/label"] - ref.metrics["auc/label"]) < 0.01
    assert low.metrics["auc/label"] > 0.6


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_a_reduced_precision_runs_export_scores_what_its_eval_scored(tmp_path, precision):
    """The model trains in bf16 / fp16 but is exported (and served) in fp32: eval and predict
    score in fp32 too, so a run's metrics are its export's."""
    cfg = from_dict(_raw(tmp_path, "low", precision=precision, max_steps=20))
    assert_export_scores_as_eval(train(cfg).parts, cfg, tmp_path / "exported")


def _snapshot(parts) -> dict[str, torch.Tensor]:
    out = {k: v.clone() for k, v in parts.model.state_dict().items()}
    for name, table in parts.embeddings.tables.items():
        ids, rec = zip(*table.items())
        ids, rec = torch.cat(ids), torch.cat(rec)
        out[name] = rec[torch.argsort(ids)].clone()
    return out


def test_fp16_overflow_skips_the_whole_step_and_halves_the_scale(tmp_path):
    cfg = from_dict(_raw(tmp_path, "fp16", precision="fp16", max_steps=3))
    result = train(cfg)
    parts = result.parts
    batch = next(iter(make_batches(cfg.data, cfg.schema, "train")))
    train_step(parts, batch)  # every ID of the batch now has a row, so a snapshot covers them
    before = _snapshot(parts)
    parts.scaler.scale = 1e38  # the scaled loss overflows
    train_step(parts, batch)
    after = _snapshot(parts)
    assert parts.scaler.skipped == 1 and parts.scaler.scale == pytest.approx(0.5e38)
    assert before.keys() == after.keys()
    for k in before:
        assert torch.equal(before[k], after[k]), k  # neither dense weights nor rows moved
    parts.scaler.scale = 2.0**10
    train_step(parts, batch)
    moved = _snapshot(parts)
    assert all(not torch.equal(moved[k], after[k]) for k in parts.embeddings.tables)  # a sane scale: rows move


def test_loss_scale_is_checkpointed_and_resumed(tmp_path):
    first = train(from_dict(_raw(tmp_path, "a", precision="fp16", max_steps=12)))
    from ember.checkpoint.load import load_dense, resolve_checkpoint

    assert load_dense(resolve_checkpoint(first.run_dir))["loss_scaler"]["clean_steps"] == 12
    whole = train(from_dict(_raw(tmp_path, "whole", precision="fp16", max_steps=20)))
    resumed = train(from_dict(_raw(tmp_path, "a", precision="fp16", max_steps=20, resume=str(first.run_dir))))
    assert resumed.parts.scaler.state_dict() == whole.parts.scaler.state_dict() == {"scale": 65536.0, "clean_steps": 20, "skipped": 0}
    for k, v in whole.parts.model.state_dict().items():
        torch.testing.assert_close(resumed.parts.model.state_dict()[k], v, rtol=0, atol=0)


def test_scaler_grows_after_clean_steps():
    s = LossScaler(init_scale=4.0, growth_interval=3)
    for _ in range(3):
        assert s.unscale_([torch.ones(2) * 4.0])
    assert s.scale == 8.0 and s.clean_steps == 0
    assert not s.unscale_([torch.tensor([float("nan")])]) and s.scale == 4.0


def test_a_failed_compile_is_announced_and_the_run_goes_on_uncompiled(tmp_path, monkeypatch, caplog):
    def broken(model, **kw):  # type: ignore[no-untyped-def]
        def run(*a):  # type: ignore[no-untyped-def]
            raise RuntimeError("no C++ compiler found")
        return run

    monkeypatch.setattr(torch, "compile", broken)
    plain = train(from_dict(_raw(tmp_path, "plain", max_steps=6, deterministic=True)))
    with caplog.at_level(logging.WARNING, logger="ember"):
        fell_back = train(from_dict(_raw(tmp_path, "compiled", max_steps=6, deterministic=True, compile=True)))
    assert "train.compile: torch.compile failed (RuntimeError: no C++ compiler found)" in caplog.text
    assert caplog.text.count("train.compile") == 1 and fell_back.parts.compiled is None
    for k, v in plain.parts.model.state_dict().items():
        assert torch.equal(fell_back.parts.model.state_dict()[k], v)


@pytest.mark.parametrize("value, mode", [(True, None), ("default", None), ("reduce-overhead", "reduce-overhead"),
                                         ("max-autotune-no-cudagraphs", "max-autotune-no-cudagraphs")])
def test_compile_passes_its_mode_to_torch(tmp_path, monkeypatch, caplog, value, mode):
    """``train.compile`` names torch.compile's mode; on a CPU the CUDA-graph modes compile as default,
    said once (a stand-in torch.compile records the mode and returns the model: the run trains as eager)."""
    from ember import once

    seen = []
    monkeypatch.setattr(torch, "compile", lambda model, mode=None: seen.append(mode) or model)
    once.forget("builder.compile_graphs")
    with caplog.at_level(logging.INFO, logger="ember"):
        run = train(from_dict(_raw(tmp_path, "c", max_steps=3, compile=value)))
    assert seen == [mode] and run.parts.compiled is not None and not run.parts.compiled_graphs
    said = "train.compile: reduce-overhead replays CUDA graphs on a GPU only; the model on the cpu compiles as default"
    assert caplog.text.count(said) == (value == "reduce-overhead"), caplog.text


def test_compile_refuses_a_mode_torch_does_not_have(tmp_path):
    from ember.errors import ConfigError

    with pytest.raises(ConfigError, match=r"'train.compile': give true, false or one of torch.compile's modes "
                                          r"\(default, reduce-overhead, max-autotune, max-autotune-no-cudagraphs\); got 'fastest'"):
        from_dict(_raw(tmp_path, "c", compile="fastest"))


def test_cuda_graph_modes_mark_each_training_step(tmp_path, monkeypatch):
    """With CUDA graphs (reduce-overhead on a GPU) each training forward starts a new step for
    torch's graph trees (the last step's outputs may be overwritten, never read); evaluation's
    forwards do not. The GPU run itself is tests/train/test_gpu.py's."""
    import ember.train.loop as loop

    marks = []
    monkeypatch.setattr(torch, "compile", lambda model, mode=None: model)
    monkeypatch.setattr(torch.compiler, "cudagraph_mark_step_begin", lambda: marks.append(1))
    original = loop.build_components

    def graphed(cfg, *rest):  # type: ignore[no-untyped-def]
        parts = original(cfg, *rest)
        parts.compiled_graphs = True  # as on a GPU
        return parts

    monkeypatch.setattr(loop, "build_components", graphed)
    run = train(from_dict(_raw(tmp_path, "g", max_steps=5, compile="reduce-overhead")))
    assert run.metrics and len(marks) == 5


@pytest.mark.slow
@pytest.mark.parametrize("precision, tol", [("fp32", 1e-4), ("bf16", 1e-2)])
def test_compile_trains_like_eager(tmp_path, precision, tol):
    """A real torch.compile of a small LR (inductor: tens of seconds here); in bf16 the compiled
    kernels round at other points than eager's, hence the wider tolerance."""
    kw = dict(max_steps=8, deterministic=True, precision=precision)
    raw = lambda name, **k: {**_raw(tmp_path, name, **kw, **k), "model": {"type": "lr"}}  # noqa: E731
    eager = train(from_dict(raw("eager")))
    compiled = train(from_dict(raw("comp", compile=True)))
    assert compiled.parts.compiled is not None  # it compiled, no fallback
    for k, v in eager.parts.model.state_dict().items():
        torch.testing.assert_close(compiled.parts.model.state_dict()[k], v, rtol=tol, atol=tol / 10)


@pytest.mark.parametrize("flags, expect", [(["avx512_bf16"], "bf16"), (["amx_bf16", "avx512_bf16"], "bf16"), ([], "fp32")])
def test_auto_picks_bf16_only_where_the_cpu_computes_it_and_logs_why_once(monkeypatch, caplog, flags, expect):
    from ember.train import precision

    line = "flags\t\t: fpu sse2 avx2 avx512f " + " ".join(flags) + "\nmodel name\t: Test CPU 9000\n"
    monkeypatch.setattr(precision, "_cpuinfo", lambda: line)
    for cached in (precision.cpu_bf16, precision.cpu_model, precision._resolve_logged):
        cached.cache_clear()
    try:
        with caplog.at_level(logging.INFO, logger="ember.train.precision"):
            assert [precision.resolve("auto", torch.device("cpu")) for _ in range(3)] == [expect] * 3
            assert precision.resolve("fp32", torch.device("cpu")) == "fp32"  # an explicit setting is kept
            assert precision.resolve("bf16", torch.device("cpu")) == "bf16"
        logged = [r.getMessage() for r in caplog.records if "train.precision auto" in r.getMessage()]
        assert len(logged) == 1 and f"auto: {expect} on cpu" in logged[0] and "Test CPU 9000" in logged[0]
        assert ("AVX512_BF16" in logged[0]) if flags else ("neither AMX-BF16 nor AVX512-BF16" in logged[0])
        with precision.autocast(torch.device("cpu"), "auto"):
            out = torch.nn.Linear(4, 4)(torch.randn(2, 4))
        assert out.dtype == precision.DTYPES[expect]
    finally:
        for cached in (precision.cpu_bf16, precision.cpu_model, precision._resolve_logged):
            cached.cache_clear()


def test_auto_keeps_fp32_for_a_dense_model_too_small_for_bf16_to_pay(monkeypatch, caplog):
    """On a bf16 CPU auto weighs the dense model's multiply-adds per batch: under BF16_MIN_MACS
    its casts cost more than the faster matmuls save, so fp32, and the log says why."""
    from ember.train import precision

    monkeypatch.setattr(precision, "_cpuinfo", lambda: "flags\t\t: avx512f avx512_bf16\nmodel name\t: Test CPU 9000\n")
    for cached in (precision.cpu_bf16, precision.cpu_model, precision._resolve_logged):
        cached.cache_clear()
    cpu = torch.device("cpu")
    try:
        with caplog.at_level(logging.INFO, logger="ember.train.precision"):
            assert precision.resolve("auto", cpu, precision.BF16_MIN_MACS - 1) == "fp32"
            assert precision.resolve("auto", cpu, precision.BF16_MIN_MACS) == "bf16"
            assert precision.resolve("auto", cpu) == "bf16"  # size unknown: the device decides
            assert precision.resolve("bf16", cpu, 10) == "bf16"  # an explicit setting is kept
        small = [r.getMessage() for r in caplog.records if "auto: fp32" in r.getMessage()]
        assert len(small) == 1 and "AVX512_BF16" in small[0] and "multiply-adds a batch" in small[0]
    finally:
        for cached in (precision.cpu_bf16, precision.cpu_model, precision._resolve_logged):
            cached.cache_clear()


def test_auto_on_amx_weighs_the_model_width_too(monkeypatch, caplog):
    """With AMX-BF16, narrow dense models lose in bf16 at every batch measured: auto needs
    AMX_MIN_MACS a batch and AMX_MIN_MACS_PER_SAMPLE a sample there, and says which it lacked.
    The same sizes on an AVX512-BF16 CPU without AMX take bf16 (the 25 M rule alone)."""
    from ember.train import precision

    cpu, wide = torch.device("cpu"), precision.AMX_MIN_MACS_PER_SAMPLE
    caches = (precision.cpu_bf16, precision.cpu_model, precision._resolve_logged)
    try:
        monkeypatch.setattr(precision, "_cpuinfo", lambda: "flags\t\t: avx512f amx_bf16 avx512_bf16\nmodel name\t: X\n")
        for cached in caches:
            cached.cache_clear()
        with caplog.at_level(logging.INFO, logger="ember.train.precision"):
            # configs/demo.yaml's DLRM (57 k a sample) at batch 2048: 117 M a batch, too narrow
            assert precision.resolve("auto", cpu, 57_000 * 2048, 57_000) == "fp32"
            assert precision.resolve("auto", cpu, wide * 128, wide) == "bf16"  # wide enough, 51 M a batch
            assert precision.resolve("auto", cpu, precision.AMX_MIN_MACS - 1, wide * 2) == "fp32"  # too few a batch
            assert precision.resolve("auto", cpu, wide * 4096, wide - 1) == "fp32"
            assert precision.resolve("bf16", cpu, 57_000 * 2048, 57_000) == "bf16"  # an explicit setting is kept
        said = [r.getMessage() for r in caplog.records if "auto: fp32" in r.getMessage()]
        assert len(said) == 3 and sum("k multiply-adds a sample" in m for m in said) == 2
        assert sum("M multiply-adds a batch" in m for m in said) == 1
        monkeypatch.setattr(precision, "_cpuinfo", lambda: "flags\t\t: avx512f avx512_bf16\nmodel name\t: Y\n")
        for cached in caches:
            cached.cache_clear()
        assert precision.resolve("auto", cpu, 57_000 * 2048, 57_000) == "bf16"
        assert precision.resolve("auto", cpu, precision.BF16_MIN_MACS, 6_240) == "bf16"
    finally:
        for cached in caches:
            cached.cache_clear()


def test_auto_keeps_fp32_on_a_gpu_and_says_why(monkeypatch, caplog):
    """On an H200 every DLRM-sized dense model measured ran slower in bf16 (launch-bound): auto
    keeps fp32 on a GPU, whatever its size, and an explicit bf16 is kept."""
    from ember.train import precision

    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a, **k: "Test GPU")
    precision._resolve_logged.cache_clear()
    gpu = torch.device("cuda")
    try:
        with caplog.at_level(logging.INFO, logger="ember.train.precision"):
            assert precision.resolve("auto", gpu, 10**10, 10**7) == "fp32"
            assert precision.resolve("auto", gpu) == "fp32"
            assert precision.resolve("bf16", gpu, 10**10, 10**7) == "bf16"
        said = [r.getMessage() for r in caplog.records if "auto: fp32 on cuda" in r.getMessage()]
        assert len(said) == 2 and all("Test GPU" in m and "H200" in m for m in said)
    finally:
        precision._resolve_logged.cache_clear()


def test_dense_macs_counts_the_linear_layers_per_sample():
    from ember.train.precision import dense_macs

    model = torch.nn.Sequential(torch.nn.Linear(13, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    assert dense_macs(model) == 13 * 64 + 64


def test_auto_is_a_setting_the_run_resolves(tmp_path, monkeypatch):
    from ember.train import precision

    seen: list[int | None] = []

    def pick(choice):  # auto's choice, noting the size the run asked about
        return lambda device, macs=None, per_sample=None: (seen.append((macs, per_sample)), (choice, "test"))[1]

    monkeypatch.setattr(precision, "_auto", pick("fp32"))
    precision._resolve_logged.cache_clear()
    try:
        cfg = from_dict(_raw(tmp_path, "auto", precision="auto", max_steps=2))
        assert cfg.train.precision == "auto"
        parts = train(cfg).parts
        assert parts.precision == "fp32"
        per_sample = precision.dense_macs(parts.model)
        assert seen == [(per_sample * 256, per_sample)]  # the model's multiply-adds per batch of 256 and per sample
        default = from_dict(_raw(tmp_path, "default", max_steps=2))
        assert default.train.precision == "auto"  # the default: what auto picks
        monkeypatch.setattr(precision, "_auto", pick("bf16"))
        precision._resolve_logged.cache_clear()
        assert train(default).parts.precision == "bf16"
    finally:
        precision._resolve_logged.cache_clear()
