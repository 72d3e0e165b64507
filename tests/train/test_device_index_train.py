"""storage.index: device end to end (on a CPU the same code a GPU runs: the index as tensor
operations, the rows in host memory): training, resume and the pipeline give the model that rows
in the host index give, bit for bit; evaluation and export read through the same rows."""

from __future__ import annotations

import pytest

from ember.config import from_dict
from ember.testing import assert_identical, run_state
from ember.tiers.mapped_rows import MappedTier
from ember.train.loop import train

DEVICE_INDEX = {"index": "device", "device": "cpu"}
pytestmark = pytest.mark.usefixtures("padding")  # (tests/conftest.py: every test unpadded, then padded)


def _cfg(tmp_path, name, storage, dtype="fp32", ttl=None, min_count=1, **train_kw):
    c = from_dict({
        "data": {"preset": "synthetic", "synthetic": {"rows": 12_000, "eval_rows": 3_000, "vocab_size": 3_000, "num_sparse": 5},
                 "batch_size": 256},
        "embedding": {"dim": 8, "optimizer": {"type": "rowwise_adagrad", "lr": 0.05}, "dtype": dtype},
        "model": {"type": "dlrm", "bottom_mlp": [16, 8], "top_mlp": [16]},
        "train": {"out_dir": str(tmp_path), "run_name": name, "progress": False, "deterministic": True,
                  "precision": "fp32", "dense_optimizer": {"type": "adam", "lr": 0.003}, **train_kw},
    })
    tables = [t.model_copy(update={"storage": type(t.storage).model_validate(storage), "ttl_steps": ttl,
                                   "min_count": min_count if j % 2 == 0 else 1})  # (and tables without, in one group)
              for j, t in enumerate(c.table_configs())]
    return c.model_copy(update={"tables": tables})


def _same(a, b) -> None:
    assert_identical(run_state(a), run_state(b))


@pytest.mark.parametrize("dtype,ttl,min_count", [("fp32", None, 1), ("bf16", None, 1), ("fp32", 3, 1), ("fp32", None, 3),
                                                 ("bf16", 3, 2)])
def test_trains_the_model_the_host_index_trains(tmp_path, dtype, ttl, min_count):
    host = train(_cfg(tmp_path, "host", {}, dtype, ttl, min_count, max_steps=25))
    dev = train(_cfg(tmp_path, "dev", DEVICE_INDEX, dtype, ttl, min_count, max_steps=25))
    assert all(isinstance(t.tier, MappedTier) for ec in dev.parts.collections() for t in ec.tables.values())
    _same(host, dev)
    assert dev.metrics["auc/label"] == host.metrics["auc/label"]
    if min_count > 1:  # (held-back IDs: counted, read as zero rows, stored nowhere; the same counts as the host's)
        for ec_h, ec_d in zip(host.parts.collections(), dev.parts.collections()):
            for name, t in ec_h.tables.items():
                ids, counts = t.admission_state()
                got = ec_d.tables[name].admission_state()
                assert ids.tolist() == got[0].tolist() and counts.tolist() == got[1].tolist(), name
                assert (len(ids) > 0) == (t.min_count > 1), name


@pytest.mark.parametrize("ttl,min_count", [(None, 1), (4, 1), (4, 2)])
def test_resume_is_bit_identical_to_an_uninterrupted_run(tmp_path, ttl, min_count):
    full = train(_cfg(tmp_path, "full", DEVICE_INDEX, ttl=ttl, min_count=min_count, max_steps=24))
    first = train(_cfg(tmp_path, "part", DEVICE_INDEX, ttl=ttl, min_count=min_count, max_steps=11))
    resumed = train(_cfg(tmp_path, "part", DEVICE_INDEX, ttl=ttl, min_count=min_count, max_steps=24,
                         resume=str(first.run_dir)))
    _same(full, resumed)


@pytest.mark.parametrize("before,after", [(DEVICE_INDEX, {"index": "host"}), ({"index": "host"}, DEVICE_INDEX)],
                         ids=["device-then-host", "host-then-device"])
def test_a_checkpoint_resumes_in_the_other_layout(tmp_path, before, after):
    """A GPU run's checkpoint (storage.index auto: device) resumed where auto picks host (a CPU
    machine), and back: the same run as an uninterrupted one, bit for bit (TTL and min_count too)."""
    full = train(_cfg(tmp_path, "full", after, ttl=4, min_count=2, max_steps=24))
    first = train(_cfg(tmp_path, "part", before, ttl=4, min_count=2, max_steps=11))
    resumed = train(_cfg(tmp_path, "part", after, ttl=4, min_count=2, max_steps=24, resume=str(first.run_dir)))
    assert all(isinstance(t.tier, MappedTier) == (after == DEVICE_INDEX) for ec in resumed.parts.collections()
               for t in ec.tables.values())
    _same(full, resumed)


HOT = {**DEVICE_INDEX, "device_rows": 40}  # 40 of each table's ~3,000 IDs read most, in device memory


def _hot(result):
    """The run's hot rows (each group's ``HotRows``), after checking they were used."""
    hot = [g.mapped.hot for ec in result.parts.collections() for g in ec.groups]
    assert hot and all(h is not None and h.rebalances >= 3 and bool((h.held >= 0).any()) for h in hot)
    return hot


@pytest.mark.parametrize("dtype,ttl,min_count", [("fp32", None, 1), ("bf16", 3, 2)])
def test_hot_rows_train_the_model_the_host_index_trains(tmp_path, dtype, ttl, min_count):
    """A device budget under the device index (copies of the rows read most in device memory,
    chosen again as the run goes): the model and rows the host index trains, bit for bit."""
    host = train(_cfg(tmp_path, "host", {}, dtype, ttl, min_count, max_steps=25, log_every=5))
    hot = train(_cfg(tmp_path, "hot", HOT, dtype, ttl, min_count, max_steps=25, log_every=5))
    assert [h.capacity for h in _hot(hot)] == [5 * 40]
    _same(host, hot)
    assert hot.metrics["auc/label"] == host.metrics["auc/label"]
    # each table's device hit rate in the run's records: the share of the group's reads served from the hot rows
    rates = [v for h in hot.history for k, v in h.items() if k.endswith("/tier.device.hit_rate") and v == v]
    assert rates and all(0 < v < 1 for v in rates), rates


def test_hot_rows_resume_bit_identical_to_an_uninterrupted_run(tmp_path):
    """The hot set is not saved: a resumed run chooses it again, and trains the same model."""
    full = train(_cfg(tmp_path, "full", HOT, ttl=4, min_count=2, max_steps=24))
    first = train(_cfg(tmp_path, "part", HOT, ttl=4, min_count=2, max_steps=11))
    resumed = train(_cfg(tmp_path, "part", HOT, ttl=4, min_count=2, max_steps=24, resume=str(first.run_dir)))
    _hot(full)
    _same(full, resumed)


def test_the_pipeline_on_threads_trains_as_in_line(tmp_path):
    """Fetches on the pipeline's thread (staleness 0: after the update before): the run the
    stages in line give, and the host index's."""
    c = _cfg(tmp_path, "threads", DEVICE_INDEX, max_steps=20)
    threads = train(c)
    inline = train(c.model_copy(update={"train": c.train.model_copy(update={"run_name": "inline"}),
                                        "pipeline": c.pipeline.model_copy(update={"enabled": False})}))
    _same(threads, inline)
    _same(threads, train(_cfg(tmp_path, "host", {}, max_steps=20)))


@pytest.mark.parametrize("storage", [DEVICE_INDEX, HOT], ids=["rows", "hot-rows"])
def test_export_scores_as_the_run_evaluates(tmp_path, storage):
    from ember.testing import assert_export_scores_as_eval

    cfg = _cfg(tmp_path, "export", storage, max_steps=15)
    assert_export_scores_as_eval(train(cfg).parts, cfg, tmp_path / "exported")


@pytest.mark.parametrize("embedding,tables,says", [
    ({}, [{"name": "C1", "storage": {**DEVICE_INDEX, "disk_path": "/tmp/x"}}], ["disk_path", "index: host"]),
], ids=["with-a-disk-tier"])
def test_a_table_the_device_index_cannot_hold_is_a_config_error(tmp_path, embedding, tables, says):
    from ember.errors import ConfigError

    raw = _cfg(tmp_path, "bad", {}).model_dump(mode="json", by_alias=True)
    raw["embedding"], raw["tables"] = {**raw["embedding"], **embedding}, tables
    with pytest.raises(ConfigError) as e:
        from_dict(raw)
    assert all(s in str(e.value) for s in says), str(e.value)
