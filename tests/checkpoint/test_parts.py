"""Checkpoints in parts, one per rank: ranks played by threads of this process (the two
collectives of a save over a barrier), so the protocol is checked in milliseconds; the real
torch.distributed runs are in tests/distributed/test_equivalence.py.

Each rank writes its own part, rank 0 the manifest last; any number of ranks loads any number
of parts (keyed by table and ID); a rank that fails makes every rank raise naming it, with the
previous checkpoint kept; a directory without a manifest is never picked; format 2 (one part,
``tables/<name>.ids``) still loads."""

from __future__ import annotations

import errno
import json
import shutil
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import ember.checkpoint.atomic as atomic
from ember.checkpoint.load import (
    load_dense, load_tables, read_manifest, resolve_checkpoint, restore_table_state, verify_checkpoint,
)
from ember.checkpoint.save import FORMAT_VERSION, save_checkpoint
from ember.embedding import EmbeddingCollection, FeatureConfig, TableConfig
from ember.errors import CheckpointError

ROWS = 60


class _Group:
    """What N thread-ranks share: a barrier and one slot per rank."""

    def __init__(self, n: int) -> None:
        self.n, self.barrier, self.slots = n, threading.Barrier(n, timeout=30), [None] * n


class _ThreadRank:
    """A ``Ranks`` of one thread: gather and broadcast through the group's slots."""

    def __init__(self, group: _Group, rank: int) -> None:
        self.group, self.rank, self.world_size = group, rank, group.n

    @property
    def lead(self) -> bool:
        return self.rank == 0

    def gather_to_lead(self, obj: Any) -> list[Any] | None:
        self.group.slots[self.rank] = obj
        self.group.barrier.wait()
        out = list(self.group.slots) if self.lead else None
        self.group.barrier.wait()
        return out

    def broadcast(self, obj: Any) -> Any:
        if self.lead:
            self.group.slots[0] = obj
        self.group.barrier.wait()
        out = self.group.slots[0]
        self.group.barrier.wait()
        return out


def _tables() -> list[TableConfig]:
    return [TableConfig(name="a", dim=4, optimizer={"type": "adagrad", "lr": 0.1}),
            TableConfig(name="b", dim=2, optimizer={"type": "adam", "lr": 0.01}, ttl_steps=1000, min_count=2)]


def _collection() -> EmbeddingCollection:
    return EmbeddingCollection(_tables(), [FeatureConfig(name="fa", table="a"), FeatureConfig(name="fb", table="b")])


def _full() -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Every table's rows (IDs 0..ROWS-1 but 7, records seeded) and admission counts of 7."""
    g = torch.Generator().manual_seed(0)
    ids = torch.tensor([i for i in range(ROWS) if i != 7])
    return {t.name: (ids, torch.randn(ids.numel(), t.record_dim, generator=g)) for t in _tables()}


def _shard(world: int, rank: int, step: int = 5) -> EmbeddingCollection:
    """Rank ``rank`` of ``world``: the rows with ID % world == rank; the pending ID 7 on its owner."""
    ec = _collection()
    for name, (ids, rec) in _full().items():
        mine = ids % world == rank
        table = ec.tables[name]
        table.step = step
        table.load(ids[mine], rec[mine], torch.full((int(mine.sum()),), float(step)) if table.config.ttl_steps else None)
        if name == "b" and 7 % world == rank:
            table.load_admission_state(torch.tensor([7]), torch.tensor([1]))
    return ec


def _save(root: Path, step: int, world: int, roots: dict[int, Path] | None = None) -> list[Any]:
    """Every thread-rank saves its shard (under ``root``, or ``roots[rank]``); each one's
    returned path or raised error."""
    group, out = _Group(world), [None] * world
    dense = {"model": {"w": torch.arange(3.0)}}

    def run(r: int) -> None:
        try:
            out[r] = save_checkpoint((roots or {}).get(r, root), step, [_shard(world, r, step)], dense,
                                     {"epoch": 0, "batch": step}, {"k": 1}, ranks=_ThreadRank(group, r))
        except BaseException as e:
            out[r] = e

    threads = [threading.Thread(target=run, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads), "a rank hung"
    return out


def _rows(ec: EmbeddingCollection) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    out = {}
    for name, table in ec.tables.items():
        chunks = list(table.items())
        ids = torch.cat([c[0] for c in chunks]) if chunks else torch.empty(0, dtype=torch.int64)
        rec = torch.cat([c[1] for c in chunks]) if chunks else torch.empty(0, table.config.record_dim)
        order = torch.argsort(ids)
        out[name] = (ids[order].numpy(), rec[order].numpy())
    return out


@pytest.mark.parametrize("saved_by,loaded_by", [(3, 1), (3, 2), (1, 3), (2, 2)])
def test_parts_of_n_ranks_load_on_m_ranks(tmp_path, saved_by, loaded_by):
    root = tmp_path / "checkpoints"
    paths = _save(root, 5, saved_by)
    assert all(p == root / "step-00000005" for p in paths), paths
    ckpt = resolve_checkpoint(root)
    manifest = verify_checkpoint(ckpt)
    assert manifest["format_version"] == FORMAT_VERSION and manifest["parts"] == saved_by
    for m in manifest["tables"]:
        assert len(m["part_rows"]) == saved_by and sum(m["part_rows"]) == m["rows"] == ROWS - 1
    suffixes = {"a": ["ids", "rec"], "b": ["ids", "rec", "seen"]}
    assert sorted(manifest["files"]) == sorted(
        ["dense.pt"] + [f"tables/{t}.part-{r}.{s}" for t in "ab" for r in range(saved_by) for s in suffixes[t]])
    dense = load_dense(ckpt)
    assert dense["table_steps"] == {"a": 5, "b": 5}
    full = _full()
    for r in range(loaded_by):  # rank r of loaded_by keeps the IDs it owns, from every part
        ec = _collection()
        keep = (lambda table, ids, r=r: ids % loaded_by == r) if loaded_by > 1 else None
        load_tables(ckpt, [ec], manifest, keep)
        restore_table_state([ec], dense, keep)
        got = _rows(ec)
        for name, (ids, rec) in full.items():
            mine = (ids % loaded_by == r).numpy()
            np.testing.assert_array_equal(got[name][0], ids.numpy()[mine])
            np.testing.assert_array_equal(got[name][1], rec.numpy()[mine])
        pending = ec.tables["b"].admission_state()
        assert pending[0].tolist() == ([7] if 7 % loaded_by == r else [])
        assert ec.tables["b"].step == 5
    assert not list(root.glob(".tmp-*"))


@pytest.mark.parametrize("cause", ["disk_full", "exception"])
def test_a_rank_failing_to_write_its_part_stops_every_rank_and_keeps_the_previous_checkpoint(tmp_path, monkeypatch, cause):
    root = tmp_path / "checkpoints"
    first = _save(root, 5, 3)[0]
    orig = atomic.HashingWriter.write

    def write(self, data):  # type: ignore[no-untyped-def]
        if ".part-1." in self.path.name and ".tmp-step-00000006" in str(self.path):
            orig(self, bytes(data)[: len(data) // 2])
            if cause == "disk_full":
                raise OSError(errno.ENOSPC, "No space left on device")
            raise RuntimeError("bad sector")
        orig(self, data)

    monkeypatch.setattr(atomic.HashingWriter, "write", write)
    errors = _save(root, 6, 3)
    assert all(isinstance(e, CheckpointError) for e in errors), errors
    for e in errors:  # every rank names the failed rank and why
        assert "rank 1 failed" in str(e) and str(root / "step-00000006") in str(e)
        assert ("no space left" in str(e)) if cause == "disk_full" else ("RuntimeError: bad sector" in str(e))
    assert sorted(p.name for p in root.iterdir()) == ["LATEST", "step-00000005"]  # no temporary directory left
    assert resolve_checkpoint(root) == first and verify_checkpoint(first)["step"] == 5
    ec = _collection()
    load_tables(first, [ec], read_manifest(first))
    np.testing.assert_array_equal(_rows(ec)["a"][1], _full()["a"][1].numpy())


def test_a_rank_that_does_not_see_the_checkpoint_directory_is_named(tmp_path):
    """As a node whose train.out_dir is not the shared one: rank 1 writes under another root."""
    root = tmp_path / "checkpoints"
    errors = _save(root, 5, 2, roots={1: tmp_path / "elsewhere" / "checkpoints"})
    assert all(isinstance(e, CheckpointError) and "rank 1 failed" in str(e) and "every rank must see" in str(e)
               for e in errors), errors
    assert not root.exists() or sorted(p.name for p in root.iterdir()) == []


def test_rank_0_failing_at_the_manifest_stops_every_rank(tmp_path, monkeypatch):
    root = tmp_path / "checkpoints"
    first = _save(root, 5, 2)[0]
    orig = atomic.HashingWriter.write

    def write(self, data):  # type: ignore[no-untyped-def]
        if self.path.name == "manifest.json":
            raise OSError(errno.ENOSPC, "No space left on device")
        orig(self, data)

    monkeypatch.setattr(atomic.HashingWriter, "write", write)
    errors = _save(root, 6, 2)
    assert all(isinstance(e, CheckpointError) and "rank 0 failed" in str(e) for e in errors), errors
    assert sorted(p.name for p in root.iterdir()) == ["LATEST", "step-00000005"]
    assert resolve_checkpoint(root) == first


def test_a_directory_without_its_manifest_is_never_picked(tmp_path):
    """Every part written but no manifest (rank 0 died before it): neither LATEST naming such a
    directory, nor a newer one beside it, nor a leftover temporary one is ever loaded."""
    root = tmp_path / "checkpoints"
    first = _save(root, 5, 2)[0]
    for name in ["step-00000006", ".tmp-step-00000007-4242"]:
        shutil.copytree(first, root / name)
        (root / name / "manifest.json").unlink()
    assert resolve_checkpoint(root) == first and resolve_checkpoint(tmp_path) == first
    (root / "LATEST").write_text("step-00000006")
    assert resolve_checkpoint(root) == first
    with pytest.raises(CheckpointError, match="no checkpoint"):
        resolve_checkpoint(root / "step-00000006")


def test_verification_covers_every_part(tmp_path):
    root = tmp_path / "checkpoints"
    ckpt = _save(root, 5, 3)[0]
    rec = ckpt / "tables" / "a.part-2.rec"
    data = bytearray(rec.read_bytes())
    data[0] ^= 1
    rec.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=r"tables/a\.part-2\.rec is damaged"):
        verify_checkpoint(ckpt)
    manifest = json.loads((ckpt / "manifest.json").read_text())
    del manifest["files"]["tables/b.part-1.ids"]
    (ckpt / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(CheckpointError, match=r"lists no hash for \['tables/b\.part-1\.ids'\]"):
        verify_checkpoint(ckpt)


def test_ranks_share_the_verification_and_all_hear_of_a_damaged_part(tmp_path):
    ckpt = _save(tmp_path / "checkpoints", 5, 3)[0]
    group, out = _Group(2), [None, None]

    def run(r: int) -> None:
        try:
            out[r] = verify_checkpoint(ckpt, _ThreadRank(group, r))
        except CheckpointError as e:
            out[r] = e

    def verify_in_two_ranks() -> list[Any]:
        threads = [threading.Thread(target=run, args=(r,)) for r in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        return out

    assert all(m["step"] == 5 for m in verify_in_two_ranks())
    files = sorted(json.loads((ckpt / "manifest.json").read_text())["files"])
    for victim in (files[0], files[1]):  # hashed by rank 0, then by rank 1
        data = bytearray((ckpt / victim).read_bytes())
        data[-1] ^= 1
        (ckpt / victim).write_bytes(bytes(data))
        assert all(isinstance(e, CheckpointError) and f"{victim} is damaged" in str(e) for e in verify_in_two_ranks())
        data[-1] ^= 1
        (ckpt / victim).write_bytes(bytes(data))


def test_format_2_one_part_still_loads(tmp_path):
    """A checkpoint as format 2 wrote it (``tables/<name>.ids`` ..., no parts) loads as before."""
    root = tmp_path / "checkpoints"
    ckpt = _save(root, 5, 1)[0]
    manifest = json.loads((ckpt / "manifest.json").read_text())
    files = {}
    for rel, digest in manifest["files"].items():
        old = rel.replace(".part-0", "")
        if old != rel:
            (ckpt / rel).rename(ckpt / old)
        files[old] = digest
    for m in manifest["tables"]:
        del m["part_rows"]
    del manifest["parts"]
    (ckpt / "manifest.json").write_text(json.dumps({**manifest, "format_version": 2, "files": files}))
    ec = _collection()
    load_tables(ckpt, [ec], verify_checkpoint(ckpt))
    got, full = _rows(ec), _full()
    for name, (ids, rec) in full.items():
        np.testing.assert_array_equal(got[name][0], ids.numpy())
        np.testing.assert_array_equal(got[name][1], rec.numpy())
