"""Where a GPU training step of ``storage.index: device`` goes (bench_gpu_cache's workload:
DLRM-26, batch 4,096, Zipf 1.05, row-wise Adagrad): paired ms/step of the full step against a
dense-only step of the same model (the embeddings' outputs fixed leaves: the floor), the step's
parts with the device synchronised between them, and torch.profiler's top operations by host
time and by device time over a few steps.

    python bench/gpu/profile_step.py [--steps 30] [--warmup 60] [--profile 6] [--trainer 40] [--compile reduce-overhead] [--dim 128]

With ``--trainer N``, also the pipelined trainer on the same workload (``train(cfg, batches=...)``,
the device index, N timed steps after ``--warmup``; with ``--compile``, under ``train.compile``): samples/s, ms a step, and each pipeline
stage's busy fraction and queue fill over the timed steps (the busiest stage bounds the step).

With ``--compile MODE``, also both steps with the dense model under ``torch.compile(mode=MODE)``
(``train.compile``; ``reduce-overhead`` replays its forward and backward as CUDA graphs), in the
same rounds: ``compiled_vs_eager`` (ember's step) and ``dense_compiled_vs_eager``.

Last line: one JSON object (``device_index_vs_dense``, ``ms_per_step``, ``parts_ms``,
``cuda_ms_per_step``; with ``--trainer``: ``trainer_ms_per_step``, ``trainer_pipeline``; with
``--compile``: ``compile_mode``, ``compiled_vs_eager``, ``dense_compiled_vs_eager``).
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import bench_gpu_cache as bgc  # noqa: E402  (first: ember before torch)
import torch  # noqa: E402
from torch import nn  # noqa: E402

from benchkit import json_line  # noqa: E402


class DenseOnly:
    """The same model and optimizer, embeddings fixed leaves: the step with no embedding path."""

    def __init__(self, dev: torch.device, batch: int) -> None:
        self.model = bgc.make_model(0).to(dev)
        self.opt = torch.optim.Adagrad(self.model.parameters(), lr=0.01)
        g = torch.Generator().manual_seed(0)
        self.emb = [(torch.rand(batch, bgc.D, generator=g) * 0.02).to(dev).requires_grad_() for _ in range(bgc.F)]
        self.dev = dev

    def step(self, dense: torch.Tensor, labels: torch.Tensor) -> None:
        loss = nn.functional.binary_cross_entropy_with_logits(self.model(dense, self.emb), labels)
        self.opt.zero_grad(set_to_none=True)
        for e in self.emb:  # (each step's embedding gradient written afresh, as ember's pooling gets it)
            e.grad = None
        loss.backward()
        self.opt.step()
        bgc._sync(self.dev)


def profile_trainer(dev: torch.device, batches: list, warmup: int, steps: int, compile: str | None = None) -> dict:
    """The pipelined trainer on ``batches`` (the device index; ``compile``: ``train.compile``'s
    mode): ms a step over the timed steps and the pipeline's stage busy fractions and queue fills
    (their medians over the records)."""
    import benchkit
    from bench_pipeline import timed_rate

    tb = bgc.trainer_batches(batches[: warmup + steps])
    raw = benchkit.dlrm_config({"synthetic": {"num_sparse": bgc.F, "vocab_size": bgc.V, "eval_rows": 1024}},
                               batch_size=tb[0].size, bottom_mlp=(512, 256, bgc.D))
    raw["embedding"]["storage"] = {"index": "device", "device": dev.type}
    raw["train"].update(device=dev.type, max_steps=len(tb), epochs=1, log_every=math.gcd(warmup, steps), seed=0,
                        compile=compile or False)
    with tempfile.TemporaryDirectory() as tmp:
        res = benchkit.run_training(raw, Path(tmp), "trainer", batches=tb)
    rate, _ = timed_rate(res.history, warmup)
    recs = [h for h in res.history if h.get("kind") == "train" and h["step"] > warmup]
    keys = sorted({k for h in recs for k in h if k.startswith("pipeline.")})
    pipe = {k[len("pipeline."):]: statistics.median(h.get(k, 0.0) for h in recs) for k in keys}
    ms = tb[0].size / rate * 1e3
    print(f"trainer (device index): {ms:.2f} ms a step; pipeline over the timed steps:",
          {k: round(v, 3) for k, v in sorted(pipe.items(), key=lambda kv: -kv[1])})
    res.parts.embeddings.close()
    return {"trainer_ms_per_step": ms, "trainer_pipeline": pipe}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=60)
    ap.add_argument("--profile", type=int, default=6, help="steps under torch.profiler")
    ap.add_argument("--batch", type=int, default=4096)
    ap.add_argument("--trainer", type=int, default=0, help="also the pipelined trainer, this many timed steps")
    ap.add_argument("--dim", type=int, default=bgc.D, help="rows' dim (MLPerf's DLRM: 128; the rows' share of PCIe "
                                                            "grows with it)")
    ap.add_argument("--compile", default=None, help="also both steps with the dense model under torch.compile in this "
                                                    "mode (train.compile's: default, reduce-overhead, ...)")
    args = ap.parse_args()
    if args.dim != bgc.D:  # (the bottom MLP ends at the rows' dim, for the dot interaction)
        bgc.D = bgc.bench_dlrm.D = args.dim
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    n = max(args.warmup + 2 * args.steps + args.profile, args.warmup + args.trainer)
    batches = bgc.make_batches(n, args.batch, zipf=bgc.ZIPF)
    ember = bgc.EmberVariant("ember-device-index", None, dev, device_index=True)
    dense = DenseOnly(dev, args.batch)
    dev_batches = [(d.to(dev), lab.to(dev)) for _, d, lab in batches]
    steps = {"ember-device-index": lambda i: ember.step(ember.features(batches[i][0]), *dev_batches[i]),
             "dense-only": lambda i: dense.step(*dev_batches[i])}
    if args.compile:  # the same two steps with the dense model compiled (train.compile's mode)
        ember_c = bgc.EmberVariant("ember-device-index-compiled", None, dev, device_index=True)
        dense_c = DenseOnly(dev, args.batch)
        ember_c.model, dense_c.model = (torch.compile(m, mode=args.compile) for m in (ember_c.model, dense_c.model))
        mark = torch.compiler.cudagraph_mark_step_begin  # (a new training step for the graph trees, as run_model does)
        steps["ember-device-index-compiled"] = lambda i: (mark(), ember_c.step(ember_c.features(batches[i][0]), *dev_batches[i]))
        steps["dense-only-compiled"] = lambda i: (mark(), dense_c.step(*dev_batches[i]))
    times: dict[str, list[float]] = {k: [] for k in steps}
    ratios, parts, paired = [], [], {k: [] for k in steps}
    for i in range(args.warmup):
        for run in steps.values():
            run(i)
    for s in range(args.steps):
        i = args.warmup + s
        t = {}
        names = list(steps)
        for name in names[s % len(names):] + names[: s % len(names)]:  # each goes first in turn
            t0 = time.perf_counter()
            steps[name](i)
            t[name] = (time.perf_counter() - t0) * 1e3
            times[name].append(t[name])
        ratios.append(t["dense-only"] / t["ember-device-index"])
        for name in names:  # each against ember's eager step of the same round
            paired[name].append(t["ember-device-index"] / t[name])
    for s in range(args.steps):
        i = args.warmup + args.steps + s
        parts.append(ember.step_phases(ember.features(batches[i][0]), *dev_batches[i]))
    ms = {k: statistics.median(v) for k, v in times.items()}
    parts_ms = {k: statistics.median(p[k] for p in parts) for k in parts[0]}
    print(f"{dev}: ms/step {ms}; dense-only / ember (paired median) {statistics.median(ratios):.3f}")
    compiled = {}
    if args.compile:
        compiled = {"compile_mode": args.compile,
                    "compiled_vs_eager": statistics.median(paired["ember-device-index-compiled"]),
                    "dense_compiled_vs_eager": statistics.median(
                        d / c for d, c in zip(times["dense-only"], times["dense-only-compiled"], strict=True))}
        print(f"train.compile {args.compile}: ember's step {compiled['compiled_vs_eager']:.3f}x the speed of eager's, "
              f"the dense-only step {compiled['dense_compiled_vs_eager']:.3f}x (paired medians)")
    print("parts (device synchronised between them), ms:", {k: round(v, 3) for k, v in parts_ms.items()})
    from torch.profiler import ProfilerActivity, profile
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev.type == "cuda" else [])
    first = args.warmup + 2 * args.steps
    with profile(activities=acts) as prof:
        for i in range(first, first + args.profile):
            ember.step(ember.features(batches[i][0]), *dev_batches[i])
    ka = prof.key_averages()
    print(ka.table(sort_by="self_cpu_time_total", row_limit=30, max_name_column_width=60))
    cuda_ms = None
    if dev.type == "cuda":
        print(ka.table(sort_by="self_cuda_time_total", row_limit=20, max_name_column_width=60))
        cuda_ms = sum(e.self_device_time_total for e in ka) / 1e3 / args.profile
        print(f"device busy {cuda_ms:.3f} ms a step")
    trainer = profile_trainer(dev, batches, args.warmup, args.trainer, args.compile) if args.trainer else {}
    print(json_line({"bench": "profile_step", "device": str(dev), "batch": args.batch, "dim": args.dim,
                     "device_index_vs_dense": statistics.median(ratios), "ms_per_step": ms,
                     "parts_ms": parts_ms, "cuda_ms_per_step": cuda_ms, **compiled, **trainer}))


if __name__ == "__main__":
    main()
