"""Loading never runs code: a checkpoint's ``dense.pt`` is read with torch's weights-only
unpickler, so one carrying a pickle payload (an object whose ``__reduce__`` calls a function)
is refused with a CheckpointError naming the file, and the function never runs, even when the
manifest's sha256 matches the crafted file. The RNG states travel as tensors (format 4); a
format 3 checkpoint (numpy's RNG state as a pickled ndarray) still loads, through the same
unpickler, and restores the same random streams."""

from __future__ import annotations

import io
import json
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from ember.checkpoint.atomic import sha256_file
from ember.checkpoint.load import load_dense, restore_rng, verify_checkpoint
from ember.checkpoint.save import FORMAT_VERSION, rng_state, save_checkpoint
from ember.embedding import EmbeddingCollection, FeatureConfig, TableConfig
from ember.errors import CheckpointError

RAN: list[str] = []  # what the payload did, when it ran (it must not)


def _payload_ran(marker: str) -> int:
    """The function a crafted pickle calls: appends to RAN and writes ``marker``."""
    RAN.append(marker)
    Path(marker).write_text("the pickle payload ran")
    return 0


class Payload:
    """Unpickling this calls ``_payload_ran(marker)``: what a crafted checkpoint would carry."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self) -> tuple[Any, ...]:
        return (_payload_ran, (self.marker,))


def _collection() -> EmbeddingCollection:
    ec = EmbeddingCollection([TableConfig(name="t", dim=4)], [FeatureConfig(name="f", table="t")])
    ec.tables["t"].load(torch.arange(10), torch.randn(10, ec.tables["t"].config.record_dim))
    return ec


def _checkpoint(tmp_path: Path) -> Path:
    dense = {"model": {"w": torch.arange(3.0)}, "optimizer": {"state": {}, "param_groups": [{"lr": 0.1, "betas": (0.9, 0.99)}]},
             "early_stopping": {"best": 0.5, "best_step": 3, "bad_evals": 0}}
    return save_checkpoint(tmp_path / "checkpoints", 3, [_collection()], dense, {"epoch": 0, "batch": 3}, {})


def _replace(ckpt: Path, rel: str, obj: Any, **manifest_updates: Any) -> None:
    """Put ``torch.save(obj)`` at ``rel`` and rehash it in the manifest (a crafted checkpoint
    has a matching manifest: the hash proves nothing against it)."""
    torch.save(obj, ckpt / rel)
    manifest = json.loads((ckpt / "manifest.json").read_text())
    manifest["files"][rel] = sha256_file(ckpt / rel)
    manifest.update(manifest_updates)
    (ckpt / "manifest.json").write_text(json.dumps(manifest))


def test_the_payload_runs_under_plain_pickle(tmp_path):
    """The control: what the tests below refuse would run its function under a plain load."""
    marker = tmp_path / "ran"
    buf = io.BytesIO()
    torch.save({"x": Payload(marker)}, buf)
    torch.load(io.BytesIO(buf.getvalue()), weights_only=False)
    assert marker.exists()


@pytest.mark.parametrize("version", [FORMAT_VERSION, 3])  # a format 3 checkpoint is read as safely
def test_a_dense_pt_carrying_a_pickle_payload_is_refused_and_runs_nothing(tmp_path, version):
    ckpt, marker = _checkpoint(tmp_path), tmp_path / "ran"
    _replace(ckpt, "dense.pt", {"model": {"w": torch.arange(3.0)}, "rng": {"x": Payload(marker)}}, format_version=version)
    verify_checkpoint(ckpt)  # every hash matches
    RAN.clear()
    with pytest.raises(CheckpointError, match=r"dense\.pt holds a pickled Python object.*_payload_ran.*could run "
                                              r"arbitrary code"):
        load_dense(ckpt)
    assert not marker.exists() and not RAN


def test_a_dense_pt_that_is_not_a_torch_file_is_a_checkpoint_error(tmp_path):
    ckpt = _checkpoint(tmp_path)
    (ckpt / "dense.pt").write_bytes(b"not a torch file")
    with pytest.raises(CheckpointError, match=r"dense\.pt is not a readable torch file"):
        load_dense(ckpt)


def _draws() -> tuple[float, ...]:
    return (torch.rand(1).item(), float(np.random.rand()), float(np.random.randn()), random.random(), random.gauss(0, 1))


def test_rng_states_round_trip_through_a_checkpoint(tmp_path):
    np.random.randn()  # numpy now holds a cached gaussian: part of its state
    random.gauss(0, 1)
    ckpt = _checkpoint(tmp_path)
    expected = _draws()
    dense = load_dense(ckpt)
    assert isinstance(dense["rng"]["numpy"]["keys"], torch.Tensor) and isinstance(dense["rng"]["python"]["state"], torch.Tensor)
    _draws()  # the streams move on
    restore_rng(dense["rng"])
    assert _draws() == expected
    assert dense["early_stopping"] == {"best": 0.5, "best_step": 3, "bad_evals": 0}
    assert dense["optimizer"]["param_groups"][0]["betas"] == (0.9, 0.99)


def test_a_format_3_checkpoint_with_a_pickled_numpy_rng_still_loads_and_restores(tmp_path):
    """Format 3 pickled numpy's state as a uint32 ndarray: read through the weights-only
    unpickler with numpy's array reconstruction allowed, and converted to the current form."""
    np.random.randn()
    ckpt = _checkpoint(tmp_path)
    old = {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}
    expected = _draws()
    _replace(ckpt, "dense.pt", {"model": {"w": torch.arange(3.0)}, "rng": old, "table_steps": {"t": 0}, "admission": {}},
             format_version=3)
    verify_checkpoint(ckpt)
    dense = load_dense(ckpt)
    restore_rng(dense["rng"])
    assert _draws() == expected
    # an ndarray is welcome in a format 3 file only: a format 4 one holding it is refused
    _replace(ckpt, "dense.pt", {"rng": old}, format_version=FORMAT_VERSION)
    with pytest.raises(CheckpointError, match=r"pickled Python object.*numpy"):
        load_dense(ckpt)


def test_a_save_refuses_a_dense_state_that_is_not_plain_naming_the_entry(tmp_path):
    root = tmp_path / "checkpoints"
    first = save_checkpoint(root, 1, [_collection()], {"model": {"w": torch.zeros(2)}}, {"epoch": 0, "batch": 1}, {})
    with pytest.raises(CheckpointError, match=r"dense_state\['early_stopping'\]\['best'\] is a numpy.float64"):
        save_checkpoint(root, 2, [_collection()], {"early_stopping": {"best": np.float64(0.5)}}, {"epoch": 0, "batch": 2}, {})
    assert (root / "LATEST").read_text() == first.name and not list(root.glob(".tmp-*"))


def test_rng_state_is_tensors_and_plain_values():
    state = rng_state()
    buf = io.BytesIO()
    torch.save(state, buf)
    back = torch.load(io.BytesIO(buf.getvalue()), weights_only=True)  # raises on anything else
    assert torch.equal(back["numpy"]["keys"], state["numpy"]["keys"]) and back["numpy"]["keys"].dtype == torch.int64


# ---- exports, delta exports and the CLI ----------------------------------------------------------

import logging  # noqa: E402
import shutil  # noqa: E402


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A small DLRM run: checkpoints, and an export series (1 full at step 2, 2 delta at step 4)."""
    from ember.testing.exports import train_with_exports

    return train_with_exports(tmp_path_factory.mktemp("safe"), "s", 4, {"every_steps": 2, "full_every": 3})


def _tampered_copy(src: Path, dst: Path, rel: str, marker: Path, **manifest_updates: Any) -> Path:
    """A copy of the checkpoint / export ``src`` whose file ``rel`` carries the payload (rehashed)."""
    shutil.copytree(src, dst)
    _replace(dst, rel, {"x": Payload(marker)}, **manifest_updates)
    return dst


def test_an_export_whose_dense_pt_carries_a_payload_is_refused_and_runs_nothing(run, tmp_path):
    from ember.serving import Predictor

    marker = tmp_path / "ran"
    out = _tampered_copy(run / "exports" / "000001-full", tmp_path / "exp", "dense.pt", marker)
    RAN.clear()
    with pytest.raises(CheckpointError, match=r"export .*dense\.pt holds a pickled Python object.*_payload_ran"):
        Predictor.load(out)
    assert not marker.exists() and not RAN


def test_an_export_is_served_without_loading_its_torchscript(run, tmp_path, monkeypatch):
    """model.pt (TorchScript, a program) is never loaded: a payload there changes nothing, and
    an export before format 5, which has nothing else, is refused unless trusted explicitly."""
    from ember.serving import Predictor

    marker = tmp_path / "ran"
    out = _tampered_copy(run / "exports" / "000001-full", tmp_path / "exp", "model.pt", marker)
    monkeypatch.setattr(torch.jit, "load", lambda *a, **k: pytest.fail("torch.jit.load was called"))
    reference = Predictor.load(run / "exports" / "000001-full")
    batch_rows = [{"I1": "1", "I2": "2", "C1": "3", "C2": "4", "C3": "5", "C4": "6"}]
    np.testing.assert_array_equal(Predictor.load(out).predict_records(batch_rows), reference.predict_records(batch_rows))
    manifest = json.loads((out / "manifest.json").read_text())
    (out / "manifest.json").write_text(json.dumps({**manifest, "format_version": 4}))
    with pytest.raises(CheckpointError, match=r"before format 5 .*model\.pt\) gives its dense model, and "
                                              r"TorchScript is a program.*--trust-torchscript"):
        Predictor.load(out)
    monkeypatch.undo()
    with pytest.raises(CheckpointError, match=r"model\.pt is not a TorchScript model"):
        Predictor.load(out, trust_torchscript=True)  # trusted: TorchScript, which never unpickles Python objects
    assert not marker.exists() and not RAN


def test_a_delta_whose_dense_pt_carries_a_payload_is_not_applied_and_runs_nothing(run, tmp_path, caplog):
    from ember.serving.follow import SeriesSource

    marker, live = tmp_path / "ran", tmp_path / "exports"
    shutil.copytree(run / "exports", live)
    _replace(live / "000002-delta", "dense.pt", {"x": Payload(marker)})
    RAN.clear()
    with caplog.at_level(logging.ERROR, logger="ember.serving.follow"):
        source = SeriesSource(live)
    assert source.current.version == "000001-full" and source.stuck == "000002-delta"
    assert "dense.pt holds a pickled Python object" in caplog.text
    assert not marker.exists() and not RAN


@pytest.mark.parametrize("command", ["eval", "export"])
def test_the_cli_refuses_a_checkpoint_carrying_a_payload(run, tmp_path, capsys, command):
    from ember.checkpoint.load import resolve_checkpoint
    from ember.cli import main

    marker = tmp_path / "ran"
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    ckpt = resolve_checkpoint(copy)
    _replace(ckpt, "dense.pt", {"model": {}, "rng": {"x": Payload(marker)}})
    # the run's recorded paths point at the original run: only the checkpoint is read here
    args = ["--checkpoint", str(copy)] + (["--out", str(tmp_path / "exp")] if command == "export" else [])
    RAN.clear()
    assert main([command, *args]) == 2
    err = capsys.readouterr().err
    assert f"ember {command}: error: checkpoint {ckpt}: {ckpt / 'dense.pt'} holds a pickled Python object" in err
    assert not marker.exists() and not RAN and not (tmp_path / "exp").exists()


def test_the_cli_refuses_an_export_carrying_a_payload(run, tmp_path, capsys):
    from ember.cli import main

    marker = tmp_path / "ran"
    out = _tampered_copy(run / "exports" / "000001-full", tmp_path / "exp", "dense.pt", marker)
    rows = tmp_path / "rows.csv"
    rows.write_text("I1,I2,C1,C2,C3,C4\n1,2,3,4,5,6\n")
    RAN.clear()
    assert main(["predict", "--export", str(out), "--input", str(rows), "--output", str(tmp_path / "p.csv")]) == 2
    assert "ember predict: error: export" in capsys.readouterr().err
    assert not marker.exists() and not RAN


def test_every_load_in_ember_is_one_that_runs_no_code():
    """A guard on the source (read with ``ast``): ember loads torch files only through
    ``safe_torch.read_torch_file`` (weights_only=True), TorchScript only behind the explicit
    trust of ``load_export_model``, numpy files never with allow_pickle, and unpickles nothing."""
    import ast

    import ember

    allowed = {("torch.load", "ember/checkpoint/safe_torch.py"), ("torch.jit.load", "ember/checkpoint/export.py")}
    root = Path(ember.__file__).resolve().parent
    found = []
    for path in sorted(root.rglob("*.py")):
        rel = str(path.relative_to(root.parent))
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call):
                continue
            name = ast.unparse(node.func)
            risky = (name in ("torch.load", "torch.jit.load") or name.startswith(("pickle.", "cloudpickle.", "dill."))
                     or (name in ("np.load", "numpy.load") and any(k.arg == "allow_pickle" and not (
                         isinstance(k.value, ast.Constant) and k.value.value is False) for k in node.keywords)))
            if name == "torch.load":
                assert any(k.arg == "weights_only" and isinstance(k.value, ast.Constant) and k.value.value is True
                           for k in node.keywords), f"{rel}:{node.lineno}: torch.load without weights_only=True"
            if risky and (name, rel) not in allowed:
                found.append(f"{rel}:{node.lineno}: {name}")
    assert not found, found


@pytest.mark.gpu
def test_cuda_rng_states_round_trip_through_a_checkpoint(tmp_path):
    torch.cuda.manual_seed_all(5)
    torch.rand(3, device="cuda")
    ckpt = _checkpoint(tmp_path)
    expected = torch.rand(4, device="cuda").cpu()
    dense = load_dense(ckpt)
    assert len(dense["rng"]["cuda"]) == torch.cuda.device_count()
    restore_rng(dense["rng"])
    torch.testing.assert_close(torch.rand(4, device="cuda").cpu(), expected, rtol=0, atol=0)
