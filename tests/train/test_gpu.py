"""GPU path: model and batches on CUDA, tables in host memory (skipped without CUDA). The runs
compare across devices and row layouts to fp32's tolerance, so they pin ``train.precision: fp32``
(``auto`` would pick bf16 on a bf16 GPU and, on a bf16 CPU, the CPU reference)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ember import once
from ember.config import from_dict
from ember.testing import assert_identical, run_state
from ember.train.loop import train

pytestmark = pytest.mark.gpu


def _cfg(tmp_path, device):
    return from_dict({
        "data": {"preset": "synthetic", "synthetic": {"rows": 20_000, "eval_rows": 4_000, "vocab_size": 5_000, "num_sparse": 4},
                 "batch_size": 512},
        "embedding": {"dim": 8},
        "model": {"type": "dlrm", "bottom_mlp": [16, 8], "top_mlp": [16]},
        "train": {"out_dir": str(tmp_path), "run_name": device, "device": device, "progress": False, "max_steps": 20,
                  "precision": "fp32", "dense_optimizer": {"type": "sgd", "lr": 0.05}},
    })


def test_cuda_training_matches_cpu(tmp_path):
    cpu = train(_cfg(tmp_path, "cpu"))
    gpu = train(_cfg(tmp_path, "cuda"))
    assert next(gpu.parts.model.parameters()).is_cuda
    for (k, a), b in zip(cpu.parts.model.state_dict().items(), gpu.parts.model.state_dict().values()):
        torch.testing.assert_close(a, b.cpu(), rtol=1e-3, atol=1e-4, msg=k)
    assert np.isclose(cpu.metrics["auc/label"], gpu.metrics["auc/label"], atol=1e-3)


def _tiered(tmp_path, name, storage, **train_kw):
    """DLRM on CUDA, rows in ``storage`` (a device cache in front of host memory, or host memory)."""
    c = from_dict({
        "data": {"preset": "synthetic", "synthetic": {"rows": 20_000, "eval_rows": 2_000, "vocab_size": 4_000, "num_sparse": 6},
                 "batch_size": 512},
        "embedding": {"dim": 8, "optimizer": {"type": "rowwise_adagrad", "lr": 0.05}},
        "model": {"type": "dlrm", "bottom_mlp": [16, 8], "top_mlp": [16]},
        "train": {"out_dir": str(tmp_path), "run_name": name, "device": "cuda", "progress": False, "deterministic": True,
                  "precision": "fp32", "dense_optimizer": {"type": "adam", "lr": 0.003}, **train_kw},
    })
    tables = [t.model_copy(update={"storage": type(t.storage).model_validate(storage)}) for t in c.table_configs()]
    return c.model_copy(update={"tables": tables})


def _rows(result):
    out = {}
    for ec in result.parts.collections():
        for name, t in ec.tables.items():
            ids, rec = zip(*t.items())
            ids, rec = torch.cat(ids), torch.cat(rec)
            o = torch.argsort(ids)
            out[name] = (ids[o], rec[o].cpu())
    return out


def _close(a, b) -> None:
    """Two runs' rows (the same IDs) and dense weights equal within float tolerance."""
    ra, rb = _rows(a), _rows(b)
    for name in ra:
        assert torch.equal(ra[name][0], rb[name][0]), name
        torch.testing.assert_close(ra[name][1], rb[name][1], rtol=1e-4, atol=1e-5, msg=name)
    for (k, x), y in zip(a.parts.model.state_dict().items(), b.parts.model.state_dict().values()):
        torch.testing.assert_close(x, y, rtol=1e-4, atol=1e-5, msg=k)


CACHE = {"device_rows": 256, "device": "cuda", "admit_after": 1, "policy": "lfu"}
DEVICE_INDEX = {"index": "device", "device": "cuda"}  # every row in pinned host memory, indexed on the GPU
HOST = {"index": "host"}  # every row in host memory, indexed on the host (storage.index auto's choice would be device)
HOT = {**DEVICE_INDEX, "device_rows": 256}  # the same, and copies of the rows read most in GPU memory


@pytest.mark.parametrize("storage", [CACHE, HOST, DEVICE_INDEX, HOT], ids=["group-cache", "host-rows", "device-index", "hot-rows"])
def test_cuda_resume_is_bit_identical_to_an_uninterrupted_run(tmp_path, storage):
    """Issue 25 item 4: on a GPU, a resumed run (rows in a device cache that evicts, or in host
    memory) ends with the same dense weights and rows, bit for bit, as an uninterrupted one."""
    full = train(_tiered(tmp_path, "full", storage, max_steps=30))
    first = train(_tiered(tmp_path, "part", storage, max_steps=13))
    resumed = train(_tiered(tmp_path, "part", storage, max_steps=30, resume=str(first.run_dir)))
    assert_identical(run_state(full), run_state(resumed))


def test_cuda_group_cache_trains_like_host_rows(tmp_path):
    """The group cache on a GPU (evicting: 256 rows of 4,000 per table) trains the model that rows
    in host memory train, within float tolerance (one optimizer arithmetic for every tier)."""
    cached = train(_tiered(tmp_path, "cached", CACHE, max_steps=30))
    host = train(_tiered(tmp_path, "host", HOST, max_steps=30))
    assert any(type(t.tier).__name__ == "GroupCacheView" for ec in cached.parts.collections() for t in ec.tables.values())
    _close(cached, host)


def test_cuda_index_auto_indexes_untiered_tables_on_the_gpu(tmp_path, caplog):
    """storage.index auto (the default) with the model on a GPU: tables without a device cache,
    host budget or disk tier get the device index (logged with its reason), a table with a device
    cache keeps the host index; the run trains the model ``index: device`` trains, bit for bit."""
    c = _tiered(tmp_path, "auto", {}, max_steps=20)
    c = c.model_copy(update={"tables": [c.tables[0].model_copy(update={"storage": type(c.tables[0].storage).model_validate(CACHE)}),
                                        *c.tables[1:]]})
    once.forget("builder.index_auto")  # (said once a process: another test may have said it)
    with caplog.at_level("INFO", logger="ember.train.builder"):
        auto = train(c)
    tiers = {name: type(t.tier).__name__ for ec in auto.parts.collections() for name, t in ec.tables.items()}
    first = c.tables[0].name
    assert tiers[first] == "GroupCacheView" and all(v == "MappedTier" for k, v in tiers.items() if k != first), tiers
    assert "storage.index auto: device for 5 tables" in caplog.text and f"storage.index auto: host for table '{first}'" in caplog.text
    c2 = c.model_copy(update={"train": c.train.model_copy(update={"run_name": "explicit"}), "tables": [
        c.tables[0], *[t.model_copy(update={"storage": type(t.storage).model_validate(DEVICE_INDEX)}) for t in c.tables[1:]]]})
    assert_identical(run_state(auto), run_state(train(c2)))


def test_cuda_group_cache_prepared_ahead_matches_in_line(tmp_path):
    """The pipelined trainer on a GPU prepares the group cache's host half one batch ahead
    (``TrainStages.fetch``); the stages in line do not: the same run, bit for bit."""
    ahead = train(_tiered(tmp_path, "ahead", CACHE, max_steps=30))
    c = _tiered(tmp_path, "inline", CACHE, max_steps=30)
    inline = train(c.model_copy(update={"pipeline": c.pipeline.model_copy(update={"enabled": False})}))
    assert_identical(run_state(ahead), run_state(inline))


@pytest.mark.parametrize("dtype,ttl,min_count,init", [("fp32", None, 1, "uniform"), ("bf16", None, 1, "uniform"),
                                                      ("fp32", 3, 1, "uniform"), ("fp32", 3, 2, "normal")])
def test_cuda_device_index_trains_like_host_rows(tmp_path, dtype, ttl, min_count, init):
    """storage.index: device on a GPU (rows gathered and scattered by the GPU in pinned host
    memory, fresh rows made there; bf16: packed there, rounded stochastically on the GPU; a TTL:
    expired rows read as new on the GPU, swept, their rows reused; min_count counted on the GPU;
    normal rows drawn there) trains the model host rows train, within float tolerance (bf16: a
    stochastic rounding may go the other way where the fp32 update differs in its last bit)."""
    def cfg(name, storage):
        c = _tiered(tmp_path, name, storage, max_steps=30)
        return c.model_copy(update={"tables": [t.model_copy(update={
            "dtype": dtype, "ttl_steps": ttl, "min_count": min_count, "initializer": type(t.initializer)(type=init)})
            for t in c.tables]})

    mapped = train(cfg(f"mapped-{dtype}-{ttl}-{min_count}", DEVICE_INDEX))
    host = train(cfg(f"host-{dtype}-{ttl}-{min_count}", HOST))
    tol = {"rtol": 1e-4, "atol": 1e-5} if dtype == "fp32" else {"rtol": 2e-2, "atol": 1e-3}
    assert all(type(t.tier).__name__ == "MappedTier" and t.tier.device.type == "cuda"
               for ec in mapped.parts.collections() for t in ec.tables.values())
    ra, rb = _rows(mapped), _rows(host)
    for name in ra:
        assert torch.equal(ra[name][0], rb[name][0]), name
        torch.testing.assert_close(ra[name][1], rb[name][1], **tol, msg=name)
    for (k, a), b in zip(mapped.parts.model.state_dict().items(), host.parts.model.state_dict().values()):
        torch.testing.assert_close(a, b, **tol, msg=k)


@pytest.mark.parametrize("storage", [DEVICE_INDEX, HOT], ids=["rows", "hot-rows"])
def test_cuda_device_index_fetch_replays_a_graph_with_the_same_results(tmp_path, monkeypatch, storage):
    """storage.index: device's training fetch is captured as a CUDA graph per padded size and
    replayed (``ember.embedding.mapped_fetch``): the run equals the same fetch operation by
    operation (EMBER_CUDA_GRAPHS=0), bit for bit, and the graphs were used (with hot rows too:
    chosen again between replays, outside the graphs)."""
    graphs = train(_tiered(tmp_path, "graphs", storage, max_steps=30))
    fetches = [g.mapped_fetch for ec in graphs.parts.collections() for g in ec.groups]
    assert fetches and all(f.graphs_on and any(gr.graph is not None for gr in f._graphs.values()) for f in fetches)
    monkeypatch.setenv("EMBER_CUDA_GRAPHS", "0")
    eager = train(_tiered(tmp_path, "eager", storage, max_steps=30))
    assert not any(g.mapped_fetch.graphs_on for ec in eager.parts.collections() for g in ec.groups)
    assert_identical(run_state(graphs), run_state(eager))


def test_cuda_hot_rows_train_like_host_rows(tmp_path):
    """A device budget under the device index: copies of the rows read most in GPU memory (256
    per table, chosen again as the run goes), the model and rows that host rows train."""
    hot = train(_tiered(tmp_path, "hot", HOT, max_steps=30))
    host = train(_tiered(tmp_path, "host", HOST, max_steps=30))
    kept = [g.mapped.hot for ec in hot.parts.collections() for g in ec.groups]
    assert kept and all(h is not None and h.arena.is_cuda and h.rebalances >= 3 and bool((h.held >= 0).any()) for h in kept)
    _close(hot, host)


def test_cuda_hot_rows_kernels_move_what_the_tensor_operations_move():
    """The hot rows' masked Triton kernels on the GPU against the tensor operations (EMBER_TRITON=0's
    path): the same words gathered and scattered, a hot record's host row and a cold record's
    arena slot untouched, with rows in pinned host memory read through the device view."""
    from ember.tiers import hot_kernels
    from ember.tiers.hot_rows import HotRows
    from ember.tiers.mapped import device_view

    assert hot_kernels.usable(torch.device("cuda")), "Triton kernels not usable on this GPU"
    dev = torch.device("cuda")
    g = torch.Generator().manual_seed(0)
    for width in (17, 129):
        n_rec, cap = 5000, 700
        pinned = torch.randn(n_rec + 1, width, generator=g).pin_memory()
        host = device_view(pinned, dev)
        hot = HotRows(cap, width, n_rec + 1, dev)
        hot.arena.normal_()
        chosen = torch.randperm(n_rec, generator=g)[:cap].to(dev)
        hot.slot[chosen] = torch.arange(cap, dtype=torch.int32, device=dev)
        rows = torch.cat([torch.randperm(n_rec, generator=g)[:3000], torch.tensor([n_rec] * 5)]).to(dev)
        s = hot.slot[rows].long()
        is_hot = s >= 0
        want = torch.where(is_hot.unsqueeze(1), hot.arena[s.clamp(min=0)], host[rows])
        assert torch.equal(hot_kernels.gather(host, hot.arena, rows, hot.slot).view(torch.int32), want.view(torch.int32))
        rec = torch.randn(rows.numel(), width, device=dev)
        rec[-5:] = rec[-1]
        before_host, before_arena = host.clone(), hot.arena.clone()
        hot_kernels.scatter(host, hot.arena, rows, hot.slot, rec)
        torch.cuda.synchronize()
        h_ref, a_ref = before_host.clone(), before_arena.clone()
        h_ref[rows[~is_hot]] = rec[~is_hot]
        a_ref[s[is_hot]] = rec[is_hot]
        assert torch.equal(host, h_ref) and torch.equal(hot.arena, a_ref), width


def test_cuda_compile_reduce_overhead_trains_like_eager(tmp_path):
    """train.compile: reduce-overhead on a GPU replays the dense model's forward and backward as
    CUDA graphs (torch's graph trees, a step marked at each training forward): the run, with the
    pipelined trainer and evaluation, trains the model eager trains within float tolerance
    (inductor's fused kernels round at other points)."""
    eager = train(_tiered(tmp_path, "eager", DEVICE_INDEX, max_steps=30))
    graphed = train(_tiered(tmp_path, "graphed", DEVICE_INDEX, max_steps=30, compile="reduce-overhead"))
    assert graphed.parts.compiled is not None and graphed.parts.compiled_graphs  # no fallback
    for (k, a), b in zip(eager.parts.model.state_dict().items(), graphed.parts.model.state_dict().values()):
        torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-4, msg=k)
    assert abs(eager.metrics["auc/label"] - graphed.metrics["auc/label"]) < 2e-3


def test_cuda_device_index_step_launches_within_the_budget():
    """Issue 25's budget on a GPU for storage.index: device: a steady step of a 26-table group
    (plan, fetch, pool, backward, update, write-back) launches at most 25 operations (a graph's
    replay counts as one) and never waits for the device."""
    from ember.embedding import EmbeddingCollection, FeatureConfig, TableConfig
    from ember.batch import SparseFeatures
    from ember.tiers.device_budget import DeviceBudget

    dev = torch.device("cuda")
    names = [f"C{i}" for i in range(26)]
    ec = EmbeddingCollection([TableConfig(name=n, dim=16, optimizer={"type": "rowwise_adagrad", "lr": 0.05},
                                          storage=DEVICE_INDEX) for n in names], [FeatureConfig(name=n) for n in names])
    (group,) = ec.groups
    rng = np.random.default_rng(0)
    cot = torch.randn(512, 16, device=dev)
    for step in range(8):
        sf = SparseFeatures(names, torch.from_numpy(rng.zipf(1.2, 26 * 512) % 100_000), torch.ones(26 * 512, dtype=torch.int64))
        with DeviceBudget(dev) as b:
            lk = group.plan(sf, True)
            lk.fetch()
            pooled = lk.pool(dev)
            torch.autograd.backward([pooled[n] for n in names], [cot] * 26)
            lk.update(step)
            lk.write_back()
        if step >= 4:  # (past the first captures)
            assert b.syncs == 0, b.report()
            assert b.ops <= 25, b.report()
