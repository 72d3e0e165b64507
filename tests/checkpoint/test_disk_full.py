"""A full disk while saving a checkpoint or an export: a CheckpointError naming the path and the
bytes needed, the previous checkpoint / export intact, and no temporary directory left behind."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest
import torch
from torch import nn

import ember.checkpoint.atomic as atomic
from ember.checkpoint.export import export_model
from ember.checkpoint.load import resolve_checkpoint, verify_checkpoint
from ember.checkpoint.save import save_checkpoint
from ember.embedding import EmbeddingCollection, FeatureConfig, TableConfig
from ember.errors import CheckpointError


def _collection(rows: int) -> EmbeddingCollection:
    ec = EmbeddingCollection([TableConfig(name="t", dim=4)], [FeatureConfig(name="f", table="t")])
    table = ec.tables["t"]
    table.load(torch.arange(rows), torch.randn(rows, table.config.record_dim))
    return ec


def _fail_after(monkeypatch: pytest.MonkeyPatch, writes: int) -> None:
    """HashingWriter.write writes half of the ``writes``-th chunk, then the disk is full."""
    orig, calls = atomic.HashingWriter.write, []

    def write(self, data):  # type: ignore[no-untyped-def]
        calls.append(1)
        if len(calls) >= writes:
            orig(self, bytes(data)[: len(data) // 2])
            raise OSError(errno.ENOSPC, "No space left on device")
        orig(self, data)

    monkeypatch.setattr(atomic.HashingWriter, "write", write)


def _leftovers(root: Path) -> list[str]:
    return sorted(p.name for p in root.rglob("*") if p.name.startswith("."))


@pytest.mark.parametrize("writes", [1, 2, 3])  # ids, records, dense.pt
def test_checkpoint_full_disk_keeps_the_previous_checkpoint(tmp_path, monkeypatch, writes):
    ec, root = _collection(100), tmp_path / "checkpoints"
    dense = {"model": {"w": torch.zeros(10)}}
    first = save_checkpoint(root, 1, [ec], dense, {"epoch": 0, "batch": 1}, {})
    _fail_after(monkeypatch, writes)
    with pytest.raises(CheckpointError) as err:
        save_checkpoint(root, 2, [ec], dense, {"epoch": 0, "batch": 2}, {})
    msg = str(err.value)
    assert str(root / "step-00000002") in msg and "no space left" in msg
    # 100 rows x (8 B id + 4 x record floats) + the dense tensor
    assert f"({100 * (8 + 4 * ec.tables['t'].config.record_dim) + 40} bytes)" in msg
    assert resolve_checkpoint(root) == first and verify_checkpoint(first)["step"] == 1
    assert sorted(p.name for p in root.iterdir()) == ["LATEST", "step-00000001"]
    assert _leftovers(root) == []


class _Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.tensor(0.5))

    def forward(self, dense: torch.Tensor, pooled: list[torch.Tensor], linear: list[torch.Tensor] | None = None) -> torch.Tensor:
        return self.scale * torch.stack([p.sum(1) for p in pooled], 1).sum(1, keepdim=True)


@pytest.mark.parametrize("writes", [1, 2])  # ids, weights
def test_export_full_disk_keeps_the_previous_export(tmp_path, monkeypatch, writes):
    ec = _collection(50)
    run_config = {"data": {"preset": "synthetic"}, "schema": {"labels": ["y"], "sparse": [{"name": "f"}]},
                  "model": {"type": "custom"}}
    args = (_Model(), [ec], ec.features, None, ["y"], run_config)
    out = export_model(*args, tmp_path / "export")
    before = {p.name: p.read_bytes() for p in (out / "tables").iterdir()}
    _fail_after(monkeypatch, writes)
    with pytest.raises(CheckpointError) as err:
        export_model(*args, tmp_path / "export")
    assert str(tmp_path / "export") in str(err.value) and f"({4 + 50 * (8 + 16)} bytes)" in str(err.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["export"]
    assert {p.name: p.read_bytes() for p in (out / "tables").iterdir()} == before


# ---- faults after the files are written (found by tests/fuzz) ----------------------------------

import os  # noqa: E402
import shutil  # noqa: E402

import ember.checkpoint.save as save_mod  # noqa: E402
from ember.checkpoint.load import load_tables  # noqa: E402


def _ids(ckpt: Path) -> list[int]:
    ec = EmbeddingCollection([TableConfig(name="t", dim=4)], [FeatureConfig(name="f", table="t")])
    load_tables(ckpt, [ec], verify_checkpoint(ckpt))
    return sorted(i for ids, _ in ec.tables["t"].items() for i in ids.tolist())


@pytest.mark.parametrize("same_step", [False, True])
@pytest.mark.parametrize("fail_at", ["rename", "fsync", "latest"])
def test_full_disk_while_publishing_a_checkpoint_keeps_the_previous_one(tmp_path, monkeypatch, fail_at, same_step):
    root, dense = tmp_path / "checkpoints", {"model": {"w": torch.zeros(3)}}
    first = save_checkpoint(root, 1, [_collection(10)], dense, {"epoch": 0, "batch": 1}, {})
    full = OSError(errno.ENOSPC, "No space left on device")
    if fail_at == "rename":  # renaming the finished directory in
        real = os.rename
        monkeypatch.setattr(save_mod.os, "rename", lambda a, b: (_ for _ in ()).throw(full)
                            if ".tmp-step" in str(a) else real(a, b))
    elif fail_at == "fsync":  # the directory fsync after the rename
        monkeypatch.setattr(save_mod, "fsync_dir", lambda p: (_ for _ in ()).throw(full) if Path(p) == root else None)
    else:  # replacing LATEST
        monkeypatch.setattr(save_mod, "atomic_write_bytes", lambda p, d: (_ for _ in ()).throw(
            CheckpointError(f"{p}: no space left on device")))
    with pytest.raises(CheckpointError, match="no space left"):
        save_checkpoint(root, 1 if same_step else 2, [_collection(20)], dense, {"epoch": 0, "batch": 2}, {})
    assert resolve_checkpoint(root) == first and _ids(first) == list(range(10))
    assert sorted(p.name for p in root.iterdir()) == ["LATEST", "step-00000001"]


def test_a_kill_between_moving_a_checkpoint_aside_and_renaming_its_replacement_in_loses_nothing(tmp_path, caplog):
    """The state a SIGKILL leaves between the two renames of a same-step re-save, when that step
    was the only checkpoint: LATEST names a missing directory, the good one lies aside (and
    the fallback is said)."""
    root, dense = tmp_path / "checkpoints", {"model": {"w": torch.zeros(3)}}
    first = save_checkpoint(root, 1, [_collection(10)], dense, {"epoch": 0, "batch": 1}, {})
    aside = root / ".old-step-00000001-4242"
    shutil.move(first, aside)
    (root / ".tmp-step-00000001-4242").mkdir()  # the replacement, never renamed in
    with caplog.at_level("WARNING", logger="ember"):
        found = resolve_checkpoint(root)
    assert found == aside and _ids(found) == list(range(10))
    (said,) = [r.getMessage() for r in caplog.records]
    assert "names step-00000001, which is missing or incomplete" in said and str(aside) in said
