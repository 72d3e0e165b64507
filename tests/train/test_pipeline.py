"""The staged trainer: bit-identical to the stages in line at staleness 0; no update lost at
staleness k > 0; a failure in any stage stops the run fast, naming the stage, with no thread
left behind; SIGINT / SIGTERM checkpoint and exit non-zero; stage and queue figures logged."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from ember.batch import SparseFeatures
from ember.checkpoint.load import resolve_checkpoint, verify_checkpoint
from ember.config import from_dict
from ember.embedding import EmbeddingCollection, FeatureConfig, SparseOptimizer, TableConfig
from ember.errors import DataError
from ember.pipeline.scheduler import Scheduler, Stage
from ember.pipeline.staleness import FetchGate, WriteLog
from ember.train.loop import train
from ember.testing import SPARSE_OPTIMIZERS, assert_identical, run_state
from tests.signals import train_until_signal

OPTIMIZERS = SPARSE_OPTIMIZERS


def _cfg(tmp_path: Path, name: str, *, enabled: bool = True, k: int = 0, optimizer: dict | None = None,
         data: dict | None = None, engine: str = "threads", **train_kw: Any):
    raw = {
        "data": data or {"preset": "synthetic", "batch_size": 256,
                         "synthetic": {"rows": 6_000, "eval_rows": 1_000, "vocab_size": 1_500, "num_sparse": 4}},
        "embedding": {"dim": 8, "optimizer": optimizer or {"type": "adam", "lr": 0.01}},
        "model": {"type": "dlrm", "bottom_mlp": [16, 8], "top_mlp": [16]},
        "pipeline": {"enabled": enabled, "engine": engine},
        "train": {"out_dir": str(tmp_path), "run_name": name, "progress": False, "deterministic": True,
                  "threads": 1, "log_every": 5, "embedding_staleness": k, **train_kw},
    }
    return from_dict(raw)


@pytest.mark.parametrize("optimizer", OPTIMIZERS, ids=[o["type"] for o in OPTIMIZERS])
def test_staleness_0_on_threads_is_bit_identical_to_in_line(tmp_path, optimizer):
    """Every stage on threads, and reading on threads with the embedding stages in line
    (``pipeline.engine: inline``, what ``auto`` picks on a CPU), train exactly as all in line."""
    kw = dict(optimizer=optimizer, eval_every=7, checkpoint_every=9)
    off = train(_cfg(tmp_path, "off", enabled=False, **kw))
    for engine in ("threads", "inline"):
        on = train(_cfg(tmp_path, engine, enabled=True, engine=engine, **kw))
        assert_identical(run_state(off), run_state(on))
        assert off.metrics == on.metrics


def test_batches_in_memory_train_exactly_as_the_same_batches_read_from_the_source(tmp_path):
    """``train(cfg, batches=...)`` (the benchmarks' in-memory variant) runs the same pipeline:
    identical state, eval and step count; a resume mid-epoch continues in the list."""
    from ember.pipeline.loader import make_batches

    cfg = _cfg(tmp_path, "read", epochs=2)
    held = list(make_batches(cfg.data, cfg.schema, "train"))
    read = train(cfg)
    held_run = train(_cfg(tmp_path, "held", epochs=2), batches=held)
    assert held_run.step == read.step == 2 * len(held)
    assert_identical(run_state(read), run_state(held_run))
    assert read.metrics == held_run.metrics
    part = train(_cfg(tmp_path, "part", epochs=2, max_steps=len(held) + 5), batches=held)
    resumed = train(_cfg(tmp_path, "part", epochs=2, resume=str(part.run_dir)), batches=held)
    assert_identical(run_state(read), run_state(resumed))


def test_staleness_0_bit_identical_with_tiers_admission_and_ttl(tmp_path):
    """Rows on disk, in a bounded cache over host memory, under min_count and TTL."""
    runs = []
    for enabled in (False, True):
        raw = _cfg(tmp_path, f"tiers-{enabled}", enabled=enabled).model_dump(mode="json", by_alias=True)
        raw["tables"] = [
            {"name": "C1", "storage": {"disk_path": str(tmp_path / f"disk-{enabled}"), "disk_rows": 4096, "host_rows": 300}},
            {"name": "C2", "storage": {"device_rows": 200, "device": "cpu"}},
            {"name": "C3", "min_count": 2, "ttl_steps": 6},
        ]
        runs.append(train(from_dict(raw)))
    assert_identical(run_state(runs[0]), run_state(runs[1]))


# ---- no update lost under staleness ----------------------------------------------------------


def _stale_run(k: int, refresh: bool, steps: int = 12, storage: dict | None = None,
               prepare: int = 0, min_count: int = 1) -> tuple[torch.Tensor, int, WriteLog]:
    """SGD (lr 1) on loss = sum of pooled rows: every occurrence of an ID adds -1 to each of its
    weights whatever the row's value, so the final rows are exact whatever the staleness, as
    long as no update is lost. The fetch runs ``k`` batches ahead (the update is slowed);
    ``prepare``: a device cache's host half is prepared that many batches earlier still, as
    ``TrainStages.fetch`` does."""
    extra = {} if storage is None else {"storage": storage}
    ec = EmbeddingCollection([TableConfig(name="t", dim=2, initializer={"type": "zeros"}, min_count=min_count,
                                          optimizer={"type": "sgd", "lr": 1.0}, **extra)],
                             [FeatureConfig(name="a", table="t")])
    opt = SparseOptimizer(ec)
    gate, log = FetchGate(k), WriteLog(k if refresh else 0, prepare)
    lock = threading.Lock()
    stale = []
    batches = [SparseFeatures(["a"], torch.tensor([1, 2, 3, 1 + i % 3]), torch.tensor([4])) for i in range(steps)]

    def plan(item):
        i, sf = item
        return [i, sf, ec.plan(sf, train=True), 0, None]

    def fetch(step):
        if prepare:
            assert gate.enter(step[0], prepare)
            with lock:
                prepared_after = gate.written
                step[2].prepare()
        assert gate.enter(step[0])
        with lock:
            step[3] = gate.written
            if prepare:
                log.reread(prepared_after, step[3], step[2].groups)
            step[2].fetch()
        stale.append(step[0] - step[3])
        return step

    def update(step):
        time.sleep(0.01)  # a slow update: the fetch gets ahead of it
        with lock:
            log.refresh(step[0], step[3], step[4])
            opt.apply(step[4])
            log.record(step[0], step[4])
        gate.wrote(step[0])
        return step

    ahead = [Stage("read", lambda _: enumerate(batches), expand=True), Stage("plan", plan), Stage("fetch", fetch, depth=4)]
    with Scheduler(ahead, [Stage("update", update, depth=4)]) as s:
        for step in s:
            ec(step[1], step[2])["a"].sum().backward()
            step[4] = opt.take()
            s.hand_back(step)
        s.drain()
    rows = torch.cat([rec for _, rec in sorted(ec.tables["t"].items(), key=lambda x: 0)])
    ids = torch.cat([i for i, _ in ec.tables["t"].items()])
    return rows[torch.argsort(ids)][:, :2], max(stale), log


@pytest.mark.parametrize("k", [1, 2, 4])
def test_staleness_k_never_loses_an_update(k):
    rows, most_stale, log = _stale_run(k, refresh=True)
    # ID 1 occurs in every batch and once more in every third; 2 and 3 likewise
    counts = torch.tensor([12 + 4, 12 + 4, 12 + 4], dtype=torch.float32)
    assert torch.equal(rows, -counts[:, None].expand(3, 2))
    assert 0 < most_stale <= k  # reads did run ahead, and never more than k batches
    assert log.refreshed_rows > 0


@pytest.mark.parametrize("k", [1, 2])
def test_staleness_k_never_loses_an_update_through_a_group_cache(k):
    # a device cache of 2 rows for 3 hot IDs: rows are admitted, displaced and sent back to the
    # host between a batch's fetch and its update, while later batches fetch ahead
    rows, most_stale, _ = _stale_run(k, refresh=True, storage={"device_rows": 2, "device": "cpu", "admit_after": 1})
    counts = torch.tensor([12 + 4, 12 + 4, 12 + 4], dtype=torch.float32)
    assert torch.equal(rows, -counts[:, None].expand(3, 2))
    assert 0 < most_stale <= k


@pytest.mark.parametrize("k", [0, 1, 2])
def test_no_update_is_lost_with_the_cache_prepared_ahead(k):
    # as above, each batch's host half prepared one batch before its fetch: the rows written in
    # between are re-read into the plan (one write-back: the cache tells which; more: the log)
    rows, most_stale, log = _stale_run(k, refresh=True, storage={"device_rows": 2, "device": "cpu", "admit_after": 1},
                                       prepare=1)
    counts = torch.tensor([12 + 4, 12 + 4, 12 + 4], dtype=torch.float32)
    assert torch.equal(rows, -counts[:, None].expand(3, 2))
    assert most_stale <= k and log.reread_rows > 0


@pytest.mark.parametrize("k", [1, 2])
def test_staleness_k_never_loses_an_update_with_the_device_index(k):
    # storage.index: device: a lookup's refresh re-gathers the rows written since its fetch from
    # the device-indexed rows (every indexed pair holds its record from its first fetch on)
    rows, most_stale, _ = _stale_run(k, refresh=True, storage={"index": "device", "device": "cpu"})
    counts = torch.tensor([12 + 4, 12 + 4, 12 + 4], dtype=torch.float32)
    assert torch.equal(rows, -counts[:, None].expand(3, 2))
    assert 0 < most_stale <= k


@pytest.mark.parametrize("k", [1, 2])
def test_staleness_k_never_loses_an_update_through_the_device_index_hot_rows(k, monkeypatch):
    # storage.index: device with 2 hot rows for 3 IDs read alike: the hot set is chosen again
    # (rows written home, others loaded) between lookups' fetches and their updates
    from ember.tiers.hot_rows import HotRows

    chosen = []
    real = HotRows.rebalance
    monkeypatch.setattr(HotRows, "rebalance", lambda self, *a: (chosen.append(1), real(self, *a)))
    rows, most_stale, _ = _stale_run(k, refresh=True, storage={"index": "device", "device": "cpu", "device_rows": 2})
    counts = torch.tensor([12 + 4, 12 + 4, 12 + 4], dtype=torch.float32)
    assert torch.equal(rows, -counts[:, None].expand(3, 2))
    assert 0 < most_stale <= k and len(chosen) >= 2


@pytest.mark.parametrize("k", [1, 2])
def test_min_count_under_staleness_k_updates_the_device_index_as_the_host_index(k):
    # min_count 3: each ID is held back (a zero row, no update) in batches 0 and 1, admitted in
    # batch 2 (every batch has each ID once, plus one more of them in turn); from then on every
    # occurrence counts: 10 + 3 / 3 / 4 of them
    want = -torch.tensor([13, 13, 14], dtype=torch.float32)[:, None].expand(3, 2)
    host, _, _ = _stale_run(k, refresh=True, min_count=3)
    dev, most_stale, _ = _stale_run(k, refresh=True, storage={"index": "device", "device": "cpu"}, min_count=3)
    assert torch.equal(host, want) and torch.equal(dev, want)
    assert 0 < most_stale <= k


def test_without_refresh_stale_updates_would_be_lost():
    """The check above can fail: the same run without re-reading loses updates."""
    rows, most_stale, _ = _stale_run(2, refresh=False)
    assert most_stale > 0
    assert (rows > -16).any()


def test_staleness_k_trains_end_to_end_and_stays_close(tmp_path):
    exact = train(_cfg(tmp_path, "k0", k=0))
    stale = train(_cfg(tmp_path, "k2", k=2))
    assert stale.step == exact.step
    assert abs(stale.metrics["auc/label"] - exact.metrics["auc/label"]) < 0.02


# ---- failures in each stage ------------------------------------------------------------------


def _ember_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("ember-stage-") and t.is_alive()]


def _csv(tmp_path: Path, bad_row: int | None = None) -> dict:
    lines = ["label,d1,c1,c2"] + [f"{i % 2},{i % 7},a{i % 13},b{i % 5}" for i in range(3000)]
    if bad_row is not None:
        lines[bad_row] = "1,notanumber,a,b"
    p = tmp_path / "train.csv"
    p.write_text("\n".join(lines) + "\n")
    return {"format": "csv", "train": str(p), "eval": str(p), "batch_size": 100}


SCHEMA = {"labels": ["label"], "dense": [{"name": "d1"}], "sparse": [{"name": "c1"}, {"name": "c2"}]}


def _fail(monkeypatch, stage: str) -> None:
    import ember.embedding.optimizer as optimizer
    import ember.tiers.host as host
    import ember.train.builder as builder
    import ember.train.stages as stages

    def boom(*a: Any, **k: Any) -> Any:
        raise OSError(28, f"No space left on device (injected into {stage})")

    calls = {"n": 0}

    def later(orig):
        def f(*a: Any, **k: Any) -> Any:
            calls["n"] += 1
            if calls["n"] == 3:
                boom()
            return orig(*a, **k)
        return f

    if stage == "plan":
        monkeypatch.setattr(builder.Components, "plan", later(builder.Components.plan))
    elif stage == "fetch":
        monkeypatch.setattr(host.HostTier, "get_into", later(host.HostTier.get_into))
        monkeypatch.setattr(host.HostTier, "read_native", staticmethod(later(host.HostTier.read_native)))
    elif stage == "compute":
        monkeypatch.setattr(builder.Components, "loss", later(builder.Components.loss))
    elif stage == "update":
        monkeypatch.setattr(optimizer.SparseOptimizer, "apply", staticmethod(later(optimizer.SparseOptimizer.apply)))
    elif stage == "metrics":
        monkeypatch.setattr(stages.TrainStages, "metrics", later(stages.TrainStages.metrics))


@pytest.mark.parametrize("engine", ["threads", "auto"])
@pytest.mark.parametrize("stage", ["read", "featurize", "plan", "fetch", "compute", "update", "metrics"])
def test_a_failure_in_any_stage_stops_the_run_naming_it(tmp_path, monkeypatch, stage, engine):
    data = _csv(tmp_path, bad_row=1500 if stage == "featurize" else None)
    if stage == "read":  # a damaged file among good ones: the reader fails mid-run
        good = tmp_path / "a.parquet"
        pq.write_table(pa.table({"label": [0, 1] * 1000, "d1": [1.0] * 2000, "c1": ["x"] * 2000, "c2": ["y"] * 2000}), good)
        # damaged pages behind an intact footer: preflight (footer only) passes, the read fails mid-run
        bad = tmp_path / "b.parquet"
        pq.write_table(pa.table({"label": [0, 1] * 1000, "d1": [1.0] * 2000, "c1": ["x"] * 2000, "c2": ["y"] * 2000}), bad,
                       write_page_checksum=True, use_dictionary=False, compression="none")
        raw = bytearray(bad.read_bytes())
        raw[100:400] = os.urandom(300)
        bad.write_bytes(bytes(raw))
        data = {"format": "parquet", "train": [str(good), str(tmp_path / "b.parquet")], "eval": str(good), "batch_size": 100}
    _fail(monkeypatch, stage)
    cfg = from_dict({"data": data, "schema": SCHEMA, "embedding": {"dim": 4}, "model": {"type": "dlrm", "bottom_mlp": [8, 4], "top_mlp": [8]},
                     "pipeline": {"engine": engine}, "train": {"out_dir": str(tmp_path), "run_name": "r", "progress": False}})
    t0 = time.perf_counter()
    with pytest.raises(Exception) as e:
        train(cfg)
    assert time.perf_counter() - t0 < 30
    assert f"(in ember pipeline stage '{stage}')" in getattr(e.value, "__notes__", []), (stage, repr(e.value))
    if stage == "featurize":
        assert isinstance(e.value, DataError) and "row 1501" in str(e.value)
    elif stage != "read":
        assert "injected" in str(e.value)
    assert _ember_threads() == []


# ---- signals -----------------------------------------------------------------------------------


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_checkpoints_then_exits_non_zero(tmp_path, sig):
    cfg = {"data": {"preset": "synthetic", "batch_size": 256, "synthetic": {"rows": 5_000_000, "eval_rows": 1000, "vocab_size": 2000, "num_sparse": 4}},
           "embedding": {"dim": 8}, "model": {"type": "dlrm", "bottom_mlp": [16, 8], "top_mlp": [16]},
           "train": {"out_dir": str(tmp_path), "run_name": "sig", "progress": False, "log_every": 5, "threads": 1}}
    code, out, err = train_until_signal(cfg, tmp_path, sig)
    assert code == 128 + sig, (out, err)
    assert signal.Signals(sig).name in err and "train.resume=" in err
    ckpt = resolve_checkpoint(tmp_path / "sig")
    manifest = verify_checkpoint(ckpt)
    assert manifest["step"] > 0 and manifest["position"]["batch"] == manifest["step"]


# ---- visibility ----------------------------------------------------------------------------------


@pytest.mark.parametrize("engine", ["threads", "inline"])
def test_stage_busy_and_queue_fill_are_logged(tmp_path, engine):
    result = train(_cfg(tmp_path, "vis", engine=engine))
    rec = [r for r in result.history if r["kind"] == "train"][-1]
    for name in ("read", "featurize", "plan", "fetch", "compute", "update", "metrics"):
        assert 0 <= rec[f"pipeline.stage.{name}.busy"] <= 1.5, name
    queues = ("read", "featurize", "plan", "fetch") if engine == "threads" else ("read", "featurize")
    assert {k for k in rec if k.startswith("pipeline.queue.")} >= {f"pipeline.queue.{q}.fill" for q in queues}
    if engine == "inline":  # the embedding stages have no queue: they run on the training thread
        assert not any(k.startswith(("pipeline.queue.plan", "pipeline.queue.fetch", "pipeline.queue.update")) for k in rec)
    assert rec["pipeline.stage.compute.busy"] > 0


def test_engine_auto_runs_the_embedding_stages_in_line_on_a_cpu_and_says_so(tmp_path, caplog):
    from ember.pipeline.config import PipelineConfig, engine_on_threads

    auto = PipelineConfig()
    assert engine_on_threads(auto, cuda=False, staleness=0, distributed=False)[0] is False
    assert engine_on_threads(auto, cuda=True, staleness=0, distributed=False)[0] is True
    assert engine_on_threads(auto, cuda=False, staleness=2, distributed=False)[0] is True
    assert engine_on_threads(auto, cuda=False, staleness=0, distributed=True)[0] is True
    assert engine_on_threads(PipelineConfig(engine="threads"), cuda=False, staleness=0, distributed=False)[0] is True
    assert engine_on_threads(PipelineConfig(engine="inline"), cuda=True, staleness=2, distributed=True)[0] is False
    assert engine_on_threads(PipelineConfig(enabled=False, engine="threads"), cuda=True, staleness=0, distributed=False)[0] is False
    with caplog.at_level("INFO", logger="ember.train"):
        result = train(_cfg(tmp_path, "auto", engine="auto", max_steps=5, device="cpu"))  # a GPU would choose threads
    assert "pipeline.engine: auto runs the embedding stages in line" in caplog.text
    rec = [r for r in result.history if r["kind"] == "train"][-1]
    assert "pipeline.queue.featurize.fill" in rec and "pipeline.queue.fetch.fill" not in rec


def test_data_worker_process_trains_bit_identically_and_reports_bad_rows_and_errors(tmp_path):
    """pipeline.data_workers: 1 reads and featurizes in a worker process: the same batches (state
    bit-identical to the threads), its bad-row counts arrive, its errors are raised unchanged."""
    import pyarrow as pa
    import pyarrow.csv as pacsv

    from ember.errors import DataError

    rng = __import__("numpy").random.default_rng(0)
    n = 1200
    table = pa.table({"label": [str(int(x)) for x in rng.random(n) < 0.3], "I1": [str(x) for x in rng.integers(0, 9, n)],
                      **{f"C{i}": [str(x) for x in rng.integers(0, 300, n)] for i in (1, 2, 3)}})
    good = tmp_path / "train.csv"
    pacsv.write_csv(table, good)
    lines = good.read_text().splitlines()
    lines[10] = lines[10] + ",extra"  # one row with a field too many
    bad = tmp_path / "bad.csv"
    bad.write_text("\n".join(lines) + "\n")

    def cfg(name: str, workers: int, path: Path, policy: str = "skip"):
        data = {"format": "csv", "train": str(path), "eval": str(good), "batch_size": 100, "shuffle_buffer": 300,
                "on_bad_rows": policy}
        raw = {"data": data, "schema": {"labels": ["label"], "dense": [{"name": "I1"}], "sparse": [{"name": f"C{i}"} for i in (1, 2, 3)]},
               "embedding": {"dim": 4}, "model": {"type": "dlrm", "bottom_mlp": [8, 4], "top_mlp": [8]},
               "pipeline": {"data_workers": workers},
               "train": {"out_dir": str(tmp_path), "run_name": name, "progress": False, "deterministic": True, "threads": 1,
                         "epochs": 2}}
        return from_dict(raw)

    threads = train(cfg("threads", 0, bad))
    worker = train(cfg("worker", 1, bad))
    assert_identical(run_state(threads), run_state(worker))
    assert worker.bad_rows == threads.bad_rows == {"<row>: wrong number of fields": 1}  # once, not once per epoch
    with pytest.raises(DataError, match=r"bad\.csv row 11"):
        train(cfg("fails", 1, bad, policy="error"))


@pytest.mark.parametrize("enabled", [True, False])
def test_checkpoint_every_s_saves_by_time_and_resumes_exactly(tmp_path, monkeypatch, enabled):
    """checkpoint.every_s: a checkpoint after the first step past the interval (a fake
    clock advancing 1 s per call), each one resumable to the uninterrupted run's state."""
    import ember.train.checkpointer as checkpointer
    from ember.train import clock as run_clock

    saved: list[int] = []
    original = checkpointer.save_checkpoint

    def counting(root, step, *a, **k):  # type: ignore[no-untyped-def]
        saved.append(step)
        return original(root, step, *a, **k)

    monkeypatch.setattr(checkpointer, "save_checkpoint", counting)
    clock = iter(range(0, 10**6, 1))
    monkeypatch.setattr(run_clock, "monotonic", lambda: float(next(clock)))
    whole = train(_cfg(tmp_path, f"t{enabled}", enabled=enabled, checkpoint_every_s=5.0, keep_checkpoints=50))
    assert len(saved) >= 3 and saved[-1] == whole.step  # several by time, then the final state
    # (a save by time may fall on the last step: the final one then records the epoch's end there)
    assert saved[:-1] == sorted(set(saved[:-1])) and all(0 < s <= whole.step for s in saved[:-1])
    first = saved[0]
    monkeypatch.setattr(checkpointer, "save_checkpoint", original)
    from ember.checkpoint.load import resolve_checkpoint

    ckpt = resolve_checkpoint(whole.run_dir / "checkpoints" / f"step-{first:08d}")
    resumed = train(_cfg(tmp_path, f"r{enabled}", enabled=enabled, resume=str(ckpt)))
    assert_identical(run_state(whole), run_state(resumed))


def test_refresh_through_a_group_cache_keeps_the_fetched_row_of_an_id_gone_since():
    """A refresh through the group cache re-reads the rows written since the fetch; an ID that
    left the chain meanwhile keeps the row its fetch read (the refresh's rare path)."""
    ec = EmbeddingCollection([TableConfig(name="t", dim=2, initializer={"type": "zeros"}, optimizer={"type": "sgd", "lr": 1.0},
                                          storage={"device_rows": 2, "device": "cpu", "admit_after": 1})],
                             [FeatureConfig(name="a", table="t")])
    opt = SparseOptimizer(ec)
    sf = SparseFeatures(["a"], torch.tensor([1, 2, 3]), torch.tensor([3]))
    stale = ec.plan(sf, train=True).fetch()  # fetched first: every row zero
    fresh = ec.plan(sf, train=True).fetch()
    ec(sf, fresh)["a"].sum().backward()
    written = opt.take()
    opt.apply(written)  # each row -1 now: arena (two slots) and host memory
    group = written[0].group
    assert group.cache is not None
    keys = [written[0].keys(written[0].written)]
    ec.tables["t"].tier.remove(torch.tensor([2]))  # ID 2 leaves the chain
    (lk,) = stale.groups
    assert lk.refresh(keys) == 2  # IDs 1 and 3 re-read; 2 kept as fetched
    rows = lk.records[:, :2]
    pos = {int(i): k for k, i in enumerate(lk.ids.tolist())}
    assert torch.equal(rows[pos[1]], torch.tensor([-1.0, -1.0])) and torch.equal(rows[pos[3]], torch.tensor([-1.0, -1.0]))
    assert torch.equal(rows[pos[2]], torch.zeros(2))
