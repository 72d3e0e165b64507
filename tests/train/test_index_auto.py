"""storage.index auto, the default: a run indexes a table on the device when its model trains on a
GPU and the table keeps every row in host memory (no device cache, host budget or disk tier);
the host index elsewhere. The choice is made from the config alone (so it is checked here without
a GPU); the GPU run itself is tests/train/test_gpu.py's."""

from __future__ import annotations

import logging

import pytest
import torch

from ember import once
from ember.config import from_dict
from ember.embedding import EmbeddingCollection, FeatureConfig, TableConfig
from ember.tiers.storage import StorageConfig
from ember.train.builder import resolve_index
from ember.train.loop import train

CUDA, CPU = torch.device("cuda"), torch.device("cpu")


@pytest.mark.parametrize("storage,device,index,why", [
    ({}, CUDA, "device", "the model trains on a GPU and every row of the table stays in host memory"),
    ({}, CPU, "host", "the model trains on the cpu"),
    ({"device_rows": 100}, CUDA, "device", "the model trains on a GPU and every row of the table stays in host memory, "
                                           "the rows read most also in GPU memory (device_rows)"),
    ({"device_bytes": "1MiB", "policy": "lru"}, CUDA, "host", "the table has device_bytes with policy: lru"),
    ({"device_rows": 100, "admit_after": 2}, CUDA, "host", "the table has device_rows with admit_after"),
    ({"host_bytes": "1MiB", "disk_path": "/tmp/x"}, CUDA, "host", "the table has host_bytes, disk_path"),
    ({"device": "cpu"}, CUDA, "host", "storage.device: cpu"),
    ({"index": "host"}, CUDA, "host", "storage.index: host"),
    ({"index": "device", "device": "cpu"}, CPU, "device", "storage.index: device"),
])
def test_auto_chooses_from_the_model_device_and_the_tiers(storage, device, index, why):
    assert StorageConfig.model_validate(storage).index_for(device) == (index, why)


def test_auto_takes_budgets_that_index_device_refuses():
    assert StorageConfig(device_rows=10, disk_path="/tmp/x").index == "auto"
    with pytest.raises(ValueError, match="does not combine with host_rows"):
        StorageConfig(index="device", host_rows=10)
    assert StorageConfig(index="device", device_rows=10).device_rows == 10  # (its hot rows)
    with pytest.raises(ValueError, match="policy: lru applies to the host index's cache only"):
        StorageConfig(index="device", device_rows=10, policy="lru")
    with pytest.raises(ValueError, match="admit_after applies to the host index's cache only"):
        StorageConfig(index="device", device_bytes="1MiB", admit_after=3)


def test_a_run_resolves_auto_and_says_so_for_a_gpu_model(caplog):
    once.forget("builder.index_auto")
    tables = [TableConfig(name=f"t{i}", dim=4) for i in range(3)] + [
        TableConfig(name="hot", dim=4, storage={"device_rows": 8}),
        TableConfig(name="cached", dim=4, storage={"device_rows": 8, "policy": "lru"}),
        TableConfig(name="mine", dim=4, storage={"index": "host"})]
    with caplog.at_level(logging.INFO, logger="ember.train.builder"):
        out = resolve_index(tables, CUDA)
        again = resolve_index(tables, CUDA)  # (said once)
    assert [t.storage.index for t in out] == ["device", "device", "device", "device", "host", "host"]
    assert [t.storage.index for t in again] == [t.storage.index for t in out]
    assert [t.storage.model_dump(exclude={"index"}) for t in out] == [t.storage.model_dump(exclude={"index"}) for t in tables]
    lines = [(r.levelname, r.getMessage()) for r in caplog.records]
    assert lines[0] == ("INFO", "storage.index auto: device for 3 tables (t0, t1, t2) (the model trains on a GPU and every "
                        "row of the table stays in host memory); set storage.index: host to keep the index on the host")
    assert lines[1] == ("INFO", "storage.index auto: device for table 'hot' (the model trains on a GPU and every row of the "
                        "table stays in host memory, the rows read most also in GPU memory (device_rows)); set "
                        "storage.index: host to keep the index on the host")
    # the host index's device cache (its own policy) is slower on a GPU: kept as configured, and said
    assert lines[2][0] == "WARNING" and lines[2][1].startswith(
        "storage.index auto: host for table 'cached' (the table has device_rows with policy: lru): on a GPU the host "
        "index's device cache trains slower than no cache"), lines
    assert "Without policy: lru and admit_after these tables would take the device index" in lines[2][1]
    assert len(lines) == 3, lines


def test_only_the_host_index_cache_alone_is_warned_about(caplog):
    """A cache in front of a host budget or a disk tier, or in host memory (``device: cpu``), has no
    faster layout to point to: the plain line."""
    once.forget("builder.index_auto")
    tables = [TableConfig(name="lru", dim=4, storage={"device_bytes": "1MiB", "policy": "lru"}),
              TableConfig(name="tiered", dim=4, storage={"device_rows": 8, "host_rows": 100}),
              TableConfig(name="cpu_cache", dim=4, storage={"device_rows": 8, "device": "cpu"})]
    with caplog.at_level(logging.INFO, logger="ember.train.builder"):
        out = resolve_index(tables, CUDA)
    assert [t.storage.index for t in out] == ["host"] * 3
    lines = {r.getMessage().split(" (")[0].split("for ")[1]: r.levelname for r in caplog.records}
    assert lines == {"table 'lru'": "WARNING", "table 'tiered'": "INFO", "table 'cpu_cache'": "INFO"}, caplog.text


def test_a_cpu_run_keeps_the_host_index_and_says_nothing(tmp_path, caplog):
    once.forget("builder.index_auto")
    cfg = from_dict({
        "data": {"preset": "synthetic", "synthetic": {"rows": 2_000, "eval_rows": 500, "vocab_size": 500, "num_sparse": 3},
                 "batch_size": 256},
        "embedding": {"dim": 4},
        "model": {"type": "dlrm", "bottom_mlp": [8, 4], "top_mlp": [8]},
        "train": {"out_dir": str(tmp_path), "device": "cpu", "progress": False, "max_steps": 3},
    })
    assert all(t.storage.index == "auto" for t in cfg.table_configs())
    with caplog.at_level(logging.INFO, logger="ember.train.builder"):
        result = train(cfg)
    tiers = [t for ec in result.parts.collections() for t in ec.tables.values()]
    assert tiers and all(type(t.tier).__name__ == "HostTier" and t.config.storage.index == "host" for t in tiers)
    assert "storage.index auto" not in caplog.text


def test_a_collection_groups_auto_with_host_tables():
    """Outside a run ``auto`` is the host index: such tables share a group with ``index: host`` ones."""
    ec = EmbeddingCollection([TableConfig(name="a", dim=4), TableConfig(name="b", dim=4, storage={"index": "host"})],
                             [FeatureConfig(name="a"), FeatureConfig(name="b")])
    assert len(ec.groups) == 1
