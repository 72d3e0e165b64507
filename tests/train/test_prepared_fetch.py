"""A device cache's host half prepared one batch ahead (issue: the GPU path, "decisions on the
host, ahead of the device"): the staged trainer at staleness 0 stays bit-identical to the stages
in line, the rows written meanwhile outside the arena are re-read (and must be), and a prepared
lookup that never trains gives back every row and slot."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np

import pytest
import torch

from ember.batch import SparseFeatures
from ember.config import from_dict
from ember.embedding import EmbeddingCollection, FeatureConfig, TableConfig
from ember.models import MODEL_TYPES
from ember.pipeline.staleness import FetchGate, WriteLog
from ember.testing import SPARSE_OPTIMIZERS, apply, assert_identical, run_state
from ember.train.loop import train
from ember.train.stages import TrainStages


def _cfg(tmp_path: Path, name: str, enabled: bool, optimizer: dict, admit_after: int = 1, cached: bool = True, **train_kw):
    cache = {"device_rows": 48, "device": "cpu", "admit_after": admit_after} if cached else {}
    return from_dict({
        "data": {"preset": "synthetic", "batch_size": 128,
                 "synthetic": {"rows": 3_000, "eval_rows": 500, "vocab_size": 400, "num_sparse": 3}},
        "embedding": {"dim": 4, "optimizer": optimizer},
        "tables": [{"name": f"C{j}", "storage": cache} for j in (1, 2, 3)],
        "model": {"type": "dlrm", "bottom_mlp": [8, 4], "top_mlp": [8]},
        "pipeline": {"enabled": enabled, "engine": "threads"},
        "train": {"out_dir": str(tmp_path), "run_name": name, "progress": False, "deterministic": True,
                  "threads": 1, "log_every": 7, "eval_every": 11, "checkpoint_every": 9, **train_kw},
    })


@pytest.fixture
def slow_update(monkeypatch):
    """The sparse update slowed down, so the next batch's prepare runs while it waits; counts
    the prepares that ran ahead of the last write and the rows re-read."""
    seen = {"ahead": 0, "reread": 0}
    update, reread = TrainStages.update, WriteLog.reread

    def slowed(self, step):
        time.sleep(0.01)
        return update(self, step)

    def counted(self, prepared_after, fetched_after, lookups):
        seen["ahead"] += fetched_after > prepared_after
        before = self.reread_rows
        reread(self, prepared_after, fetched_after, lookups)
        seen["reread"] += self.reread_rows - before

    monkeypatch.setattr(TrainStages, "update", slowed)
    monkeypatch.setattr(WriteLog, "reread", counted)
    return seen


@pytest.mark.parametrize("optimizer", SPARSE_OPTIMIZERS, ids=[o["type"] for o in SPARSE_OPTIMIZERS])
def test_prepared_ahead_at_staleness_0_is_bit_identical_to_in_line(tmp_path, slow_update, optimizer):
    """Every table behind a 48-row group cache (admissions, evictions, bypassed rows every
    step); eval and checkpoint barriers on the way."""
    off = train(_cfg(tmp_path, "off", False, optimizer, admit_after=2))
    on = train(_cfg(tmp_path, "on", True, optimizer, admit_after=2))
    assert_identical(run_state(off), run_state(on))
    assert off.metrics == on.metrics
    assert slow_update["ahead"] > 0 and slow_update["reread"] > 0  # prepared ahead, and rows did need a re-read


def test_prepared_ahead_trains_as_rows_in_host_memory(tmp_path, slow_update, caplog):
    """Issue 25 item 4 on the pipelined path: the group cache prepared ahead on threads trains
    the model that rows in host memory train in line, bit for bit (one optimizer arithmetic);
    the run says that it prepares ahead."""
    from ember import once

    opt = {"type": "rowwise_adagrad", "lr": 0.05}
    host = train(_cfg(tmp_path, "host", False, opt, cached=False))
    once.forget("train.prepared_ahead")
    with caplog.at_level("INFO", logger="ember.train"):
        cache = train(_cfg(tmp_path, "cache", True, opt, admit_after=2))
    assert_identical(run_state(host), run_state(cache))
    assert host.metrics == cache.metrics and slow_update["reread"] > 0
    assert any("one batch ahead" in r.getMessage() for r in caplog.records)


def test_without_the_reread_the_prepared_rows_would_be_stale(tmp_path, slow_update, monkeypatch):
    """The check above can fail: prepared ahead without re-reading, training differs."""
    opt = {"type": "adagrad", "lr": 0.05}
    off = train(_cfg(tmp_path, "off", False, opt))
    monkeypatch.setattr(WriteLog, "reread", lambda self, a, b, lookups: None)
    on = train(_cfg(tmp_path, "on", True, opt))
    with pytest.raises(AssertionError):
        assert_identical(run_state(off), run_state(on))


def test_the_gate_lets_a_prepare_run_one_batch_early():
    gate = FetchGate(0)
    assert gate.enter(0) and gate.enter(1, ahead=1)  # batch 1's host half while batch 0 computes
    entered = threading.Event()
    t = threading.Thread(target=lambda: entered.set() if gate.enter(1) else None)
    t.start()
    assert not entered.wait(0.3)  # its fetch waits for batch 0's update
    gate.wrote(0)
    assert entered.wait(5)
    t.join()


def test_a_prepared_lookup_that_never_trains_keeps_every_row_and_slot():
    """Its victims were taken out of the arena at the prepare: they still reach their slower
    tier; the slots it reserved for admissions return to the free ones."""
    ec = EmbeddingCollection([TableConfig(name="t", dim=2, initializer={"type": "normal", "std": 1.0},
                                          storage={"device_rows": 4, "device": "cpu", "admit_after": 1})],
                             [FeatureConfig(name="a", table="t")])
    first = SparseFeatures(["a"], torch.tensor([1, 2, 3, 4]), torch.tensor([4]))
    (lk,) = ec.plan(first, train=True).fetch().groups
    apply(lk, torch.zeros(4, 2))  # the arena is full: 1..4
    (group,) = ec.groups
    cache = group.cache
    rows = {}
    for ids, recs in ec.tables["t"].items():
        for i, r in zip(ids.tolist(), recs):
            rows[i] = r.clone()
    assert set(rows) == {1, 2, 3, 4} and cache._nfree == 0
    hot = SparseFeatures(["a"], torch.tensor([5, 6, 5, 6, 7, 7]), torch.tensor([6]))
    for _ in range(3):  # 5, 6, 7 seen often: they displace residents
        ec.plan(hot, train=True).fetch().discard()
    prepared = ec.plan(hot, train=True).prepare()
    assert prepared.groups[0].ticket is not None and prepared.groups[0].ticket.new.size > 0
    prepared.discard()
    assert int(cache.live.sum()) + cache._nfree == cache.capacity  # no slot lost
    assert int(cache.held.sum()) == 0
    after = {}
    for ids, recs in ec.tables["t"].items():
        for i, r in zip(ids.tolist(), recs):
            after[i] = r
    for i, r in rows.items():
        assert torch.equal(after[i], r), i  # the displaced rows reached host memory unchanged


def test_prepared_ahead_resumes_exactly(tmp_path, slow_update):
    """A run stopped at ``max_steps`` (no batch prepared past it) and resumed equals the run
    straight through, both prepared ahead."""
    opt = {"type": "rowwise_adagrad", "lr": 0.05}
    whole = train(_cfg(tmp_path, "whole", True, opt))
    first = train(_cfg(tmp_path, "part", True, opt, max_steps=13))
    again = train(_cfg(tmp_path, "part", True, opt, resume=str(first.run_dir)))
    assert_identical(run_state(whole), run_state(again))


def test_too_few_spill_rows_stay_exact_and_are_said_once(tmp_path, slow_update, monkeypatch, caplog):
    """A write-back bypassing more rows than the spill rows sends them from a gather, and the
    next batch re-reads them from host memory: the same training, said once."""
    from ember import once
    from ember.tiers.group_cache import GroupCache

    once.forget("group_cache.spill")
    opt = {"type": "adam", "lr": 0.01}
    off = train(_cfg(tmp_path, "off", False, opt, admit_after=2))
    monkeypatch.setattr(GroupCache, "spill_at_most", 3)
    with caplog.at_level("INFO", logger="ember.tiers"):
        on = train(_cfg(tmp_path, "on", True, opt, admit_after=2))
    assert_identical(run_state(off), run_state(on))
    said = [r for r in caplog.records if "bypassed the device cache" in r.getMessage()]
    assert len(said) == 1 and "more than its 3 spill rows" in said[0].getMessage()


def test_a_reread_takes_the_rows_the_last_write_back_bypassed_from_the_spill_rows():
    """Batch b prepared before batch a's write-back; a bypassed IDs 5 and 6 (seen once: not
    admitted) into the spill rows: b's re-read gathers them there, not from host memory."""
    ec = EmbeddingCollection([TableConfig(name="t", dim=2, initializer={"type": "normal", "std": 1.0},
                                          optimizer={"type": "sgd", "lr": 1.0},
                                          storage={"device_rows": 8, "device": "cpu", "admit_after": 2})],
                             [FeatureConfig(name="a", table="t")])
    (group,) = ec.groups
    cache = group.cache
    sf = SparseFeatures(["a"], torch.tensor([5, 6]), torch.tensor([2]))
    (a,) = ec.plan(sf, train=True).fetch().groups
    (b,) = ec.plan(sf, train=True).prepare().groups
    apply(a, torch.ones(2, 2))
    spilled = cache._spill_slots(np.zeros(2, np.int64), np.array([5, 6]))
    assert (spilled > cache.trash).all()
    reads = []
    slow = cache.slow[0]
    monkey = type(slow).get_into

    def counted(self, ids, out):
        reads.append(ids.numel())
        return monkey(self, ids, out)

    type(slow).get_into = counted
    try:
        assert b.reread(lambda: [a.keys(a.written)]) == 2
        b.fetch()
    finally:
        type(slow).get_into = monkey
    assert reads == []  # nothing read from host memory
    assert torch.equal(b.records, a.records)  # the rows a wrote


def test_a_signal_with_a_batch_prepared_checkpoints_and_resumes(tmp_path):
    """SIGINT while batches are prepared ahead: the prepared one is given back (its displaced
    rows already on their way to host memory), the checkpoint verifies, and a resume from it
    trains on with each ID in one tier only."""
    import json
    import signal

    from ember.checkpoint.load import resolve_checkpoint, verify_checkpoint
    from tests.signals import train_until_signal

    cfg = {"data": {"preset": "synthetic", "batch_size": 256,
                    "synthetic": {"rows": 5_000_000, "eval_rows": 1000, "vocab_size": 3000, "num_sparse": 3}},
           "embedding": {"dim": 8, "storage": {"device_rows": 300, "device": "cpu", "admit_after": 1}},
           "model": {"type": "dlrm", "bottom_mlp": [16, 8], "top_mlp": [16]},
           "pipeline": {"engine": "threads"},
           "train": {"out_dir": str(tmp_path), "run_name": "sig", "progress": False, "log_every": 5, "threads": 1}}
    code, out, err = train_until_signal(cfg, tmp_path, signal.SIGINT, records=3)
    assert code == 128 + signal.SIGINT, (out, err)
    ckpt = resolve_checkpoint(tmp_path / "sig")
    step = verify_checkpoint(ckpt)["step"]
    cfg["train"].update(resume=str(ckpt), max_steps=step + 10)
    resumed = train(from_dict(json.loads(json.dumps(cfg))))
    assert resumed.step == step + 10
    for name, table in resumed.parts.embeddings.tables.items():
        ids = torch.cat([i for i, _ in table.items()])
        assert ids.unique().numel() == ids.numel(), name  # each ID in one tier only


def _two_admitting():
    """A table behind an 8-row group cache (SGD, lr 1, zero rows); lookup ``a`` of IDs 5 and 6
    fetched, ``b`` of the same IDs prepared before ``a``'s write-back: both admit them."""
    ec = EmbeddingCollection([TableConfig(name="t", dim=2, initializer={"type": "zeros"}, optimizer={"type": "sgd", "lr": 1.0},
                                          storage={"device_rows": 8, "device": "cpu", "admit_after": 1})],
                             [FeatureConfig(name="a", table="t")])
    (group,) = ec.groups
    sf = SparseFeatures(["a"], torch.tensor([5, 6]), torch.tensor([2]))
    (a,) = ec.plan(sf, train=True).fetch().groups
    (b,) = ec.plan(sf, train=True).prepare().groups
    return ec, group, group.cache, sf, a, b


def test_two_lookups_admitting_the_same_ids_keep_every_slot():
    """b prepared before a's write-back, both admitting IDs 5 and 6: a inserts them, b finds
    them in the arena at its own write-back (its reserved slots go back to the free ones), and
    every slot is held by no one afterwards, live or free."""
    ec, group, cache, sf, a, b = _two_admitting()
    assert a.ticket.new.size == 2 and b.ticket.new.size == 2  # both reserved slots for 5 and 6
    apply(a, torch.ones(2, 2))
    assert b.reread(lambda: [a.keys(a.written)]) == 2
    b.fetch()
    assert torch.equal(b.records[:, :2], -torch.ones(2, 2))  # a's update, read from the arena
    apply(b, torch.ones(2, 2))
    assert int(cache.held.sum()) == 0 and int(cache.live.sum()) == 2 and cache._nfree == cache.capacity - 2
    rows = {i: r for ids, recs in ec.tables["t"].items() for i, r in zip(ids.tolist(), recs)}
    assert set(rows) == {5, 6} and all(torch.equal(r[:2], -2 * torch.ones(2)) for r in rows.values())


def test_a_settled_lookup_dropped_without_write_back_gives_every_slot_back():
    """b reserved slots for 5 and 6, then its re-read settled it onto a's (held): dropped
    unwritten, the next fetch gives back what it holds and frees what it reserved."""
    import gc

    ec, group, cache, sf, a, b = _two_admitting()
    (c,) = ec.plan(SparseFeatures(["a"], torch.tensor([7]), torch.tensor([1])), train=True).prepare().groups
    apply(a, torch.ones(2, 2))
    b.reread(lambda: [a.keys(a.written)])
    assert int(cache.held.sum()) == 2 + 2 + 1  # b: a's two slots, and its two reserved (free now) until its release; c: one
    del b, c
    gc.collect()
    group.plan(sf, False).fetch()  # adopts the orphans
    assert int(cache.held.sum()) == 0 and not cache.orphans
    assert int(cache.live.sum()) == 2 and cache._nfree == cache.capacity - 2


@pytest.mark.parametrize("model", [m for m in MODEL_TYPES if m != "dlrm"])
def test_every_model_prepared_ahead_is_bit_identical_to_in_line(tmp_path, slow_update, model):
    """The other models of the zoo (their own collections: a linear part, towers, tasks) with
    every table behind a group cache, prepared ahead on threads vs in line."""
    runs = []
    for enabled in (False, True):
        cfg = _cfg(tmp_path, f"{model}-{enabled}", enabled, {"type": "adagrad", "lr": 0.05}, admit_after=2)
        raw = cfg.model_dump(mode="json", by_alias=True)
        raw["model"] = {"type": model, **({"bottom_mlp": [8, 4]} if model == "dmt" else {})}
        runs.append(train(from_dict(raw)))
    assert_identical(run_state(runs[0]), run_state(runs[1]))
    assert runs[0].metrics == runs[1].metrics and slow_update["ahead"] > 0


def test_prepared_ahead_with_admission_and_ttl_tables_is_bit_identical(tmp_path, slow_update):
    """Every table behind the group cache, one of them counting sightings before it stores a
    row (min_count: some rows of a batch are not written back) and one expiring rows (TTL
    sweeps through the cache's views), prepared ahead on threads vs in line."""
    runs = []
    for enabled in (False, True):
        cfg = _cfg(tmp_path, f"special-{enabled}", enabled, {"type": "adam", "lr": 0.01}, admit_after=2)
        raw = cfg.model_dump(mode="json", by_alias=True)
        cache = {"device_rows": 48, "device": "cpu", "admit_after": 2}
        raw["tables"] = [{"name": "C1", "storage": cache, "min_count": 2}, {"name": "C2", "storage": cache, "ttl_steps": 6},
                         {"name": "C3", "storage": cache}]
        runs.append(train(from_dict(raw)))
    assert_identical(run_state(runs[0]), run_state(runs[1]))
    assert runs[0].metrics == runs[1].metrics and slow_update["reread"] > 0


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_random_steps_prepared_ahead_match_the_steps_in_line(seed):
    """200 random batches over 60 IDs of two tables (one with min_count) behind a 6-row group
    cache: each batch prepared before the write-back of the one before it, re-read, loaded,
    trained (SGD on the pooled rows' squares: the update depends on the row), written back;
    the same batches in line on a twin collection. Every 20 steps: the same rows, bit for bit,
    each ID in one tier only; at the end no slot held and none lost."""
    rng = np.random.default_rng(seed)

    def collection():
        tables = [TableConfig(name=n, dim=2, initializer={"type": "normal", "std": 1.0}, optimizer={"type": "sgd", "lr": 0.1},
                              storage={"device_rows": 3, "device": "cpu", "admit_after": 1 + seed % 2}, **kw)
                  for n, kw in (("t", {}), ("u", {"min_count": 2}))]
        return EmbeddingCollection(tables, [FeatureConfig(name="a", table="t"), FeatureConfig(name="b", table="u")])

    def step(lk):
        (g,) = lk.groups
        pooled = g.pool(torch.device("cpu"))
        (sum((v ** 2).sum() for v in pooled.values())).backward()
        g.update(0)
        g.write_back()

    def state(ec):
        out = {}
        for name, t in ec.tables.items():
            for ids, rec in t.items():
                for i, r in zip(ids.tolist(), rec):
                    assert (name, i) not in out, (name, i)  # one tier only
                    out[(name, i)] = r.clone()
        return out

    batches = [SparseFeatures(["a", "b"], torch.from_numpy(rng.integers(0, 30, 8) * 7 + 1), torch.ones(8, dtype=torch.int64))
               for _ in range(200)]
    line, ahead = collection(), collection()
    nxt = ahead.plan(batches[0], train=True).prepare()
    last: list = []
    for i, sf in enumerate(batches):
        step(line.plan(sf, train=True).fetch())
        lk = nxt
        (g,) = lk.groups
        g.reread(lambda: last)
        lk.fetch()
        pooled = g.pool(torch.device("cpu"))
        (sum((v ** 2).sum() for v in pooled.values())).backward()
        if i + 1 < len(batches):
            nxt = ahead.plan(batches[i + 1], train=True).prepare()  # before this batch's write-back
        g.update(0)
        g.write_back()
        last = [g.keys(g.written)]
        if i % 20 == 19 or i + 1 == len(batches):
            a, b = state(line), state(ahead)
            assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), i
    cache = ahead.groups[0].cache
    assert int(cache.held.sum()) == 0 and int(cache.live.sum()) + cache._nfree == cache.capacity
