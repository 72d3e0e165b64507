"""No ember command destroys or rewrites what it did not write (``ember.outputs``).

Outputs go to new paths; ``--overwrite`` replaces only ember's earlier output of the same kind;
nothing is written into what a command reads; read-only commands never write under the
training run's paths (disk tiers go to a private temporary directory); predict and generate
write the format their output's extension names; a closed stdout ends quietly.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow.csv as pacsv
import pyarrow.orc as orc
import pyarrow.parquet as pq
import pytest
import yaml

from ember.cli import main
from ember.outputs import output_kind

SMALL = {"num_sparse": 4, "num_dense": 2, "vocab_size": 500}


def _config(tmp: Path, name: str, disk: Path | None = None) -> str:
    """A small DLRM run; table C1 lives in a device + host cache over a disk tier at ``disk``."""
    tables = [] if disk is None else [{"name": "C1", "storage": {"device_rows": 40, "device": "cpu", "host_rows": 60,
                                                                "disk_path": str(disk), "disk_rows": 1024}}]
    cfg = tmp / f"{name}.yaml"
    cfg.write_text(yaml.safe_dump({
        "data": {"preset": "synthetic", "synthetic": {**SMALL, "rows": 1000, "eval_rows": 300}, "batch_size": 250},
        "embedding": {"dim": 4}, "tables": tables,
        "model": {"type": "dlrm", "bottom_mlp": [8, 4], "top_mlp": [8]},
        "train": {"out_dir": str(tmp), "run_name": name, "progress": False, "threads": 1, "checkpoint_every": 2,
                  "keep_checkpoints": 5},
    }))
    return str(cfg)


def _tree(root: Path) -> dict[str, tuple[int, int]]:
    """Every file under ``root`` with its size and modification time."""
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(root.rglob("*"))
            if p.is_file()}


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A trained run (4 steps, checkpoints at 2 and 4) whose table C1 has a disk tier, and rows to score."""
    tmp = tmp_path_factory.mktemp("outputs")
    assert main(["train", "--config", _config(tmp, "run", tmp / "disk")]) == 0
    rows = tmp / "rows.parquet"
    assert main(["generate", "--out", str(rows), "--rows", "300", "--split", "eval", "--options", json.dumps(SMALL)]) == 0
    return tmp / "run", rows


@pytest.fixture(scope="module")
def export(run, tmp_path_factory):
    out = tmp_path_factory.mktemp("export") / "e"
    assert main(["export", "--checkpoint", str(run[0]), "--out", str(out)]) == 0
    return out


# ---- export: never into what it reads, never over a run or a folder it did not write -------------

@pytest.mark.parametrize("where", ["", "checkpoints", "exports/mine"])
def test_export_into_the_run_it_reads_is_refused_and_the_run_stays(run, capsys, where):
    run_dir, _ = run
    before = _tree(run_dir)
    out = run_dir / where if where else run_dir
    for extra in ([], ["--overwrite"]):
        assert main(["export", "--checkpoint", str(run_dir), "--out", str(out), *extra]) == 2
        err = capsys.readouterr().err
        assert err.startswith("ember export: error: ") and str(out) in err and "which this command reads" in err
    assert _tree(run_dir) == before
    # also when the checkpoint itself is named
    ckpt = run_dir / "checkpoints" / "step-00000004"
    assert main(["export", "--checkpoint", str(ckpt), "--out", str(run_dir), "--overwrite"]) == 2
    assert _tree(run_dir) == before


def test_export_over_an_export_needs_overwrite(run, export, tmp_path, capsys):
    out = tmp_path / "e"
    shutil.copytree(export, out)
    manifest = (out / "manifest.json").stat().st_mtime_ns
    assert main(["export", "--checkpoint", str(run[0]), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert str(out) in err and "pass --overwrite" in err and "choose another path" in err
    assert (out / "manifest.json").stat().st_mtime_ns == manifest  # untouched
    assert main(["export", "--checkpoint", str(run[0]), "--out", str(out), "--overwrite"]) == 0
    assert (out / "manifest.json").stat().st_mtime_ns != manifest and output_kind(out) == "export"
    # an empty directory counts as new
    (tmp_path / "empty").mkdir()
    assert main(["export", "--checkpoint", str(run[0]), "--out", str(tmp_path / "empty")]) == 0


def test_overwrite_never_replaces_a_run_or_a_folder_ember_did_not_write(run, tmp_path, capsys):
    other = tmp_path / "other"
    assert main(["train", "--config", _config(tmp_path, "other"), "train.max_steps=2"]) == 0
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "todo.txt").write_text("mine")
    data = tmp_path / "data.csv"
    data.write_text("a,b\n1,2\n")
    for out, says in [(other, "holds a training run"), (notes, "ember did not write"), (data, "ember did not write")]:
        before = _tree(tmp_path)
        assert main(["export", "--checkpoint", str(run[0]), "--out", str(out), "--overwrite"]) == 2
        err = capsys.readouterr().err
        assert str(out) in err and says in err and "even with --overwrite" in err
        assert _tree(tmp_path) == before
    # a run never replaces a folder it did not write either (its name is the run name)
    assert main(["train", "--config", _config(tmp_path, "notes"), "--overwrite"]) == 2
    assert "ember did not write" in capsys.readouterr().err
    assert sorted(p.name for p in notes.iterdir()) == ["todo.txt"]
    # train --export onto a run is refused before any training: no run directory appears
    assert main(["train", "--config", _config(tmp_path, "fresh"), "--export", str(other), "--overwrite"]) == 2
    assert "holds a training run" in capsys.readouterr().err
    assert not (tmp_path / "fresh").exists() and output_kind(other) == "run"


def test_overwrite_never_deletes_files_a_user_put_into_an_export_or_a_run(run, export, tmp_path, capsys):
    """An export or a run directory ember wrote, into which the user put files of their own: those
    would go with it, so --overwrite refuses, naming them; once they are moved out it replaces."""
    out = tmp_path / "e"
    shutil.copytree(export, out)
    (out / "NOTES.md").write_text("deployment notes")
    (out / "mine").mkdir()
    (out / "mine" / "a.txt").write_text("x")
    before = _tree(out)
    assert main(["export", "--checkpoint", str(run[0]), "--out", str(out), "--overwrite"]) == 2
    err = capsys.readouterr().err
    assert f"--out {out} holds an export" in err and "files ember did not write (NOTES.md, mine/)" in err
    assert _tree(out) == before
    shutil.rmtree(out / "mine")
    (out / "NOTES.md").unlink()
    (out / ".model.pt.tmp-123").write_text("")  # a crashed write's leftover is ember's
    assert main(["export", "--checkpoint", str(run[0]), "--out", str(out), "--overwrite"]) == 0
    # a run directory: the same rule, before any training
    cfg = _config(tmp_path, "mine")
    assert main(["train", "--config", cfg, "train.max_steps=2"]) == 0
    (tmp_path / "mine" / "NOTES.md").write_text("notes")
    before = _tree(tmp_path / "mine")
    assert main(["train", "--config", cfg, "train.max_steps=2", "--overwrite"]) == 2
    err = capsys.readouterr().err
    assert "holds a training run (ember train) and also files ember did not write (NOTES.md)" in err
    assert _tree(tmp_path / "mine") == before
    (tmp_path / "mine" / "NOTES.md").unlink()
    assert main(["train", "--config", cfg, "train.max_steps=2", "--overwrite"]) == 0


def test_overwrite_finds_a_users_files_at_any_depth(run, export, tmp_path, capsys):
    """Files, folders and links a user put below the top of a run or an export (a checkpoint's
    folder, checkpoints/, tensorboard/, exports/, an export's tables/) are named and kept; what
    ember wrote there (every manifest's files, LATEST, a crashed save's leftovers, an export
    series) is replaced."""
    from ember.checkpoint.save import mark_best
    from ember.outputs import _foreign_entries

    out = tmp_path / "e"
    shutil.copytree(export, out)
    (out / "tables" / "README.txt").write_text("mine")
    (out / "tables" / "mine").mkdir()
    (out / "link").symlink_to(tmp_path)
    assert _foreign_entries(out, "export") == ["link", "tables/README.txt", "tables/mine/"]
    before = _tree(out)
    assert main(["export", "--checkpoint", str(run[0]), "--out", str(out), "--overwrite"]) == 2
    assert "also files ember did not write (link, tables/README.txt, tables/mine/)" in capsys.readouterr().err
    assert _tree(out) == before and (out / "link").is_symlink()
    cfg = _config(tmp_path, "deep")
    series = ["export.every_steps=1", "export.full_every=1", "train.max_steps=3"]
    assert main(["train", "--config", cfg, *series]) == 0
    run = tmp_path / "deep"
    assert _foreign_entries(run, "run") == []
    ckpt = sorted((run / "checkpoints").glob("step-*"))[-1]
    shutil.copytree(export, run / "export")  # train --export into its run: ember's
    (run / "checkpoints" / ".tmp-step-00000009-123").mkdir()  # a crashed save's leftovers: ember's
    (run / "exports" / ".000009-full.tmp-123").mkdir()
    shutil.copytree(ckpt, run / "checkpoints" / "step-100000000")  # past 10^8 steps: nine digits
    mark_best(ckpt)  # early stopping's best checkpoint, named in checkpoints/BEST
    (run / f".ranks-see-{'0' * 32}").write_bytes(b"")  # a distributed start's check, left by a crash
    assert _foreign_entries(run, "run") == []
    (ckpt / "notes.txt").write_text("mine")
    (ckpt / "tables" / "extra.bin").write_bytes(b"x")
    (run / "checkpoints" / "notes").mkdir()
    (run / "checkpoints" / "notes" / "todo.txt").write_text("mine")
    (run / "checkpoints" / "alias").symlink_to(ckpt)
    (run / "exports" / "README.md").write_text("mine")
    (sorted((run / "exports").glob("0*"))[0] / "notes.txt").write_text("mine")
    (run / "export" / "tables" / "notes.txt").write_text("mine")
    found = _foreign_entries(run, "run")
    first = sorted((run / "exports").glob("0*"))[0].name
    assert found == sorted(["checkpoints/alias", "checkpoints/notes/", f"checkpoints/{ckpt.name}/notes.txt",
                            f"checkpoints/{ckpt.name}/tables/extra.bin", "export/tables/notes.txt", "exports/README.md",
                            f"exports/{first}/notes.txt"]), found
    before = _tree(run)
    assert main(["train", "--config", cfg, *series, "--overwrite"]) == 2
    assert "also files ember did not write (checkpoints/alias, checkpoints/notes/" in capsys.readouterr().err
    assert _tree(run) == before
    for f in found:
        target = run / f.rstrip("/")
        shutil.rmtree(target) if target.is_dir() and not target.is_symlink() else target.unlink()
    assert main(["train", "--config", cfg, *series, "--overwrite"]) == 0


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs /proc, a folder that takes no new files even for root")
def test_an_output_folder_that_takes_no_files_is_refused_before_the_work(run, export, tmp_path, capsys):
    """Read-only, no permission, a kernel's file system: every command says so, exit 2, before
    it trains, exports or generates (an OSError after the work, exit 1, before)."""
    for args in (["generate", "--out", "/proc/g.csv", "--rows", "10"],
                 ["export", "--checkpoint", str(run[0]), "--out", "/proc/ember-export"],
                 ["towers", "--checkpoint", str(run[0]), "--towers", "2", "--out", "/proc/t.yaml"],
                 ["predict", "--export", str(export), "--input", str(run[1]), "--output", "/proc/p.csv"],
                 ["train", "--config", _config(tmp_path, "ro"), "train.out_dir=/proc"]):
        assert main(args) == 2, args
        err = capsys.readouterr().err
        assert "cannot be written: /proc takes no new files" in err, (args, err)


def test_generated_text_data_is_recognised_by_its_mark_not_its_header(tmp_path, capsys):
    """A Criteo-shaped CSV of the user's own (the generator's header over real rows) is never
    replaced; generated CSV/ORC data is, until it changes."""
    opts = ["--rows", "20", "--options", json.dumps(SMALL)]
    mine = tmp_path / "criteo.csv"
    mine.write_text("label,I1,I2,C1,C2,C3,C4\n1,5,5,abc,abc,abc,abc\n")
    assert main(["generate", "--out", str(mine), *opts, "--overwrite"]) == 2
    assert "is a file ember did not write" in capsys.readouterr().err and "abc" in mine.read_text()
    for name in ("g.csv", "g.tsv.gz", "g.orc"):
        out = tmp_path / name
        assert main(["generate", "--out", str(out), *opts]) == 0
        assert output_kind(out) == "generate"
        assert main(["generate", "--out", str(out), *opts, "--seed", "3", "--overwrite"]) == 0
    with open(tmp_path / "g.csv", "a") as fh:
        fh.write("1,2,3,a,b,c,d\n")  # changed since: the user's now
    assert output_kind(tmp_path / "g.csv") is None
    assert main(["generate", "--out", str(tmp_path / "g.csv"), *opts, "--overwrite"]) == 2


def test_a_resume_never_continues_into_another_run_without_overwrite(tmp_path, capsys):
    """train.resume=runs/a with train.run_name=b: b holds another run, which it overwrote (its
    LATEST went back, its metrics mixed); now refused, replaced only with --overwrite; a new
    name continues a's run in a new directory; a itself is never touched."""
    cfg = _config(tmp_path, "a")
    assert main(["train", "--config", cfg, "train.max_steps=2"]) == 0
    assert main(["train", "--config", cfg, "train.run_name=b", "train.max_steps=4"]) == 0
    a, b = _tree(tmp_path / "a"), _tree(tmp_path / "b")
    capsys.readouterr()
    resume = ["train", "--config", cfg, f"train.resume={tmp_path / 'a'}", "train.max_steps=3"]
    assert main([*resume, "train.run_name=b"]) == 2
    assert "would continue in run directory" in capsys.readouterr().err
    assert _tree(tmp_path / "b") == b and _tree(tmp_path / "a") == a
    assert main([*resume, "train.run_name=c"]) == 0  # a new directory: a's run continued there
    assert json.loads((tmp_path / "c" / "summary.json").read_text())["step"] == 3
    assert main([*resume, "train.run_name=b", "--overwrite"]) == 0
    assert json.loads((tmp_path / "b" / "summary.json").read_text())["step"] == 3
    assert sorted(p.name for p in (tmp_path / "b" / "checkpoints").glob("step-*")) == ["step-00000003"]
    assert _tree(tmp_path / "a") == a
    assert main([*resume, "train.max_steps=9"]) == 0  # in its own directory, as ever (to the epoch's end, step 4)
    assert json.loads((tmp_path / "a" / "summary.json").read_text())["step"] == 4


def test_train_exports_into_its_own_run_but_never_over_it(tmp_path, capsys):
    args = ["train", "--config", _config(tmp_path, "demo"), f"train.out_dir={tmp_path / 'runs'}", "train.max_steps=2",
            "--export"]
    assert main([*args, str(tmp_path / "runs")]) == 2
    assert "contains" in capsys.readouterr().err and not (tmp_path / "runs").exists()
    assert main([*args, str(tmp_path / "runs" / "demo")]) == 2
    assert not (tmp_path / "runs").exists()
    for inside in ("checkpoints/step-00000002", "tensorboard/e", "summary.json", "exports/000001-full",
                   "exports/1000000-delta"):
        assert main([*args, str(tmp_path / "runs" / "demo" / inside)]) == 2  # where the run writes: before training
        assert "lies where the run writes its own" in capsys.readouterr().err and not (tmp_path / "runs").exists()
    export = tmp_path / "runs" / "demo" / "export"  # the README's layout
    assert main([*args, str(export)]) == 0
    assert output_kind(export) == "export" and output_kind(tmp_path / "runs" / "demo") == "run"
    assert main([*args, str(export), "--overwrite"]) == 0
    assert output_kind(export) == "export"


def test_the_library_export_refuses_a_folder_it_did_not_write(tmp_path):
    from ember.checkpoint.export import export_model
    from ember.errors import CheckpointError

    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "todo.txt").write_text("mine")
    with pytest.raises(CheckpointError, match="not an earlier export"):
        export_model(None, [], [], None, ["y"], {"data": {}, "schema": {}, "model": {}}, tmp_path / "notes")  # type: ignore[arg-type]
    assert (tmp_path / "notes" / "todo.txt").read_text() == "mine"


# ---- formats from the extension -------------------------------------------------------------------

def test_generate_writes_the_format_its_extension_names(tmp_path, capsys):
    opts = ["--rows", "50", "--options", json.dumps(SMALL)]
    for name in ["a.csv", "a.tsv", "a.csv.gz", "a.tsv.bz2", "a.parquet", "a.orc"]:
        assert main(["generate", "--out", str(tmp_path / name), *opts]) == 0
    ref = pq.read_table(tmp_path / "a.parquet")
    assert ref.num_rows == 50 and output_kind(tmp_path / "a.parquet") == "generate"
    assert orc.read_table(tmp_path / "a.orc").equals(ref.replace_schema_metadata(None))
    for name, delim in [("a.csv", ","), ("a.tsv", "\t"), ("a.csv.gz", ","), ("a.tsv.bz2", "\t")]:
        t = pacsv.read_csv(tmp_path / name, parse_options=pacsv.ParseOptions(delimiter=delim))
        assert t.column_names == ref.column_names and t.num_rows == 50, name
        assert t["label"].to_pylist() == ref["label"].to_pylist()
    # a mismatch or an unknown extension is refused; --format names the format of another extension
    assert main(["generate", "--out", str(tmp_path / "b.tsv"), "--format", "parquet", *opts]) == 2
    assert "extension says tsv but --format says parquet" in capsys.readouterr().err
    assert main(["generate", "--out", str(tmp_path / "b.dat"), *opts]) == 2
    assert "cannot tell the format" in capsys.readouterr().err
    assert main(["generate", "--out", str(tmp_path / "b.parquet.gz"), *opts]) == 2
    assert not list(tmp_path.glob("b.*"))
    assert main(["generate", "--out", str(tmp_path / "b.dat"), "--format", "csv", *opts]) == 0
    assert pacsv.read_csv(tmp_path / "b.dat").num_rows == 50


def test_generate_replaces_only_generated_data(tmp_path, capsys):
    opts = ["--rows", "20", "--options", json.dumps(SMALL)]
    for name in ["g.csv", "g.parquet"]:
        out = tmp_path / name
        assert main(["generate", "--out", str(out), *opts]) == 0
        assert main(["generate", "--out", str(out), *opts, "--seed", "1"]) == 2
        assert "pass --overwrite" in capsys.readouterr().err
        assert main(["generate", "--out", str(out), *opts, "--seed", "1", "--overwrite"]) == 0
    mine = tmp_path / "mine.csv"
    mine.write_text("label,x\n1,2\n")
    assert main(["generate", "--out", str(mine), *opts, "--overwrite"]) == 2
    assert "ember did not write" in capsys.readouterr().err and mine.read_text() == "label,x\n1,2\n"


def test_predict_writes_the_format_its_extension_names(export, run, tmp_path, capsys):
    _, rows = run
    for name in ["p.csv", "p.tsv", "p.csv.gz", "p.parquet"]:
        assert main(["predict", "--export", str(export), "--input", str(rows), "--output", str(tmp_path / name)]) == 0
        assert output_kind(tmp_path / name) == "predictions", name
    ref = np.loadtxt(tmp_path / "p.csv", delimiter=",", skiprows=1)
    assert ref.shape == (300,)
    assert pq.read_table(tmp_path / "p.parquet").column_names == ["p_label"]
    np.testing.assert_allclose(pq.read_table(tmp_path / "p.parquet")["p_label"].to_numpy(), ref, atol=1e-6)
    for name, delim in [("p.tsv", "\t"), ("p.csv.gz", ",")]:
        t = pacsv.read_csv(tmp_path / name, parse_options=pacsv.ParseOptions(delimiter=delim))
        assert t.column_names == ["p_label"] and t["p_label"].to_pylist() == ref.tolist(), name
    assert main(["predict", "--export", str(export), "--input", str(rows), "--output", str(tmp_path / "p.json")]) == 2
    assert "cannot tell the format" in capsys.readouterr().err and not (tmp_path / "p.json").exists()


def test_predict_creates_missing_folders_and_replaces_only_predictions(export, run, tmp_path, capsys):
    _, rows = run
    out = tmp_path / "a" / "b" / "p.csv"
    args = ["predict", "--export", str(export), "--input", str(rows), "--output"]
    assert main([*args, str(out)]) == 0
    assert np.loadtxt(out, delimiter=",", skiprows=1).shape == (300,)
    assert main([*args, str(out)]) == 2
    assert "pass --overwrite" in capsys.readouterr().err
    assert main([*args, str(out), "--overwrite"]) == 0
    # never over its input (generated data), nor over a file ember did not write
    copy = tmp_path / "rows.parquet"
    shutil.copy(rows, copy)
    before = copy.read_bytes()
    assert main(["predict", "--export", str(export), "--input", str(copy), "--output", str(copy), "--overwrite"]) == 2
    assert "which this command reads" in capsys.readouterr().err and copy.read_bytes() == before
    mine = tmp_path / "mine.csv"
    mine.write_text("x\n1\n")
    assert main([*args, str(mine), "--overwrite"]) == 2
    assert "ember did not write" in capsys.readouterr().err and mine.read_text() == "x\n1\n"


def test_a_closed_stdout_ends_quietly(export, tmp_path):
    rows = tmp_path / "many.parquet"
    assert main(["generate", "--out", str(rows), "--rows", "20000", "--split", "eval", "--options", json.dumps(SMALL)]) == 0
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    proc = subprocess.Popen([sys.executable, "-m", "ember", "predict", "--export", str(export), "--input", str(rows)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    assert proc.stdout is not None and proc.stdout.readline() == b"p_label\n"
    proc.stdout.close()  # as `| head -1` does: 20000 rows (~180 KB) do not fit the pipe
    _, err = proc.communicate(timeout=120)
    assert b"Traceback" not in err and b"BrokenPipe" not in err, err.decode()
    assert proc.returncode == 141


# ---- read-only commands write nothing under the training run's paths -----------------------------

def test_eval_and_export_of_a_disk_tier_checkpoint_leave_the_run_untouched(run, tmp_path, capsys):
    run_dir, _ = run
    disk = run_dir.parent / "disk"
    assert any(disk.rglob("*")), "the run has a disk tier"
    before, run_before = _tree(disk), _tree(run_dir)
    assert main(["eval", "--checkpoint", str(run_dir)]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["step"] == 4  # stdout is the JSON alone: no storage plan in it
    assert "table 'C1'" not in out + err
    assert sum("private temporary directory" in line for line in err.splitlines()) == 1
    assert main(["export", "--checkpoint", str(run_dir), "--out", str(tmp_path / "e")]) == 0
    out, err = capsys.readouterr()
    assert "table 'C1'" not in out + err and len(out.splitlines()) == 1
    assert _tree(disk) == before and _tree(run_dir) == run_before
    scratch = Path(err.split("private temporary directory ")[1].split(" ")[0])
    assert scratch.name == "0" and not scratch.parent.exists()  # removed when the command ended


def test_a_checkpoint_pruned_while_read_falls_back_to_the_newest(run, tmp_path, capsys, monkeypatch):
    import ember.checkpoint.load as load
    import ember.train.checkpointer as checkpointer  # the one restore path reads the dense state through it

    run_dir = tmp_path / "run"
    shutil.copytree(run[0], run_dir)
    ckpts = run_dir / "checkpoints"
    (ckpts / "LATEST").write_text("step-00000002")  # what the reader saw before the run saved step 4 and pruned 2
    original = load.load_dense
    pruned: list[Path] = []

    def pruning(ckpt):  # the training run prunes the checkpoint between its tables and its dense state
        if ckpt.name == "step-00000002":
            shutil.rmtree(ckpt)
            (ckpts / "LATEST").write_text("step-00000004")
            pruned.append(ckpt)
        return original(ckpt)

    monkeypatch.setattr(checkpointer, "load_dense", pruning)
    assert main(["export", "--checkpoint", str(run_dir), "--out", str(tmp_path / "e")]) == 0
    out, err = capsys.readouterr()
    assert pruned and "step-00000002 was removed while being read" in err and "reading the newest" in err
    assert "(step 4)" in out
    # a checkpoint named itself is not swapped for another: a clear error
    shutil.copytree(run[0] / "checkpoints" / "step-00000002", ckpts / "step-00000002")
    assert main(["export", "--checkpoint", str(ckpts / "step-00000002"), "--out", str(tmp_path / "f")]) == 2
    err = capsys.readouterr().err
    assert "was removed while being read" in err and "Traceback" not in err and not (tmp_path / "f").exists()


def test_towers_replaces_only_its_own_snippet(run, tmp_path, capsys):
    run_dir, _ = run
    args = ["towers", "--checkpoint", str(run_dir), "--towers", "2", "--rows", "100", "--out"]
    out = tmp_path / "new" / "towers.yaml"
    assert main([*args, str(out)]) == 0
    assert output_kind(out) == "towers" and yaml.safe_load(out.read_text())["model"]["type"] == "dmt"
    assert main([*args, str(out)]) == 2
    assert "pass --overwrite" in capsys.readouterr().err
    assert main([*args, str(out), "--overwrite"]) == 0
    edited = out.read_text() + "  bottom_mlp: [8, 4]\n"  # the user made it a config of their own
    out.write_text(edited)
    assert main([*args, str(out), "--overwrite"]) == 2
    assert "ember did not write" in capsys.readouterr().err and out.read_text() == edited


def test_one_rule_tells_checkpoints_exports_and_runs_apart_for_every_command(tmp_path):
    """``manifest_kind`` decides for the output rules (--overwrite), the commands' input checks
    and the preflight of train.resume / init_from: a full and a delta export are exports, a
    checkpoint is a checkpoint, a manifest of anything else is neither."""
    from ember.cli import _holds
    from ember.errors import ConfigError
    from ember.outputs import _dir_kind, manifest_kind
    from ember.testing.exports import train_with_exports
    from ember.train.preflight import _checkpoint_manifest

    run = train_with_exports(tmp_path, "r", 6, {"every_steps": 2, "full_every": 3}, checkpoint_every=2)
    full = sorted((run / "exports").glob("*-full"))[0]
    delta = sorted((run / "exports").glob("*-delta"))[0]
    ckpt = sorted((run / "checkpoints").glob("step-*"))[0]
    junk = tmp_path / "junk"
    junk.mkdir()
    (junk / "manifest.json").write_text('{"files": {"model.pt": "x"}, "format_version": 5}')
    assert [manifest_kind(p) for p in (full, delta, ckpt, junk, run)] == ["export", "export", "checkpoint", None, None]
    assert [_holds(p) for p in (full, delta, ckpt, run)] == ["export", "export", "checkpoint", "run"]
    assert [_dir_kind(p) for p in (full, delta, junk)] == ["export", "export", None]
    for export in (full, delta):
        with pytest.raises(ConfigError, match="is an export"):
            _checkpoint_manifest("train.resume", str(export))
    assert _checkpoint_manifest("train.resume", str(ckpt))["step"] == int(ckpt.name.split("-")[1])


def test_an_output_another_command_is_creating_right_now_is_named_as_such(tmp_path):
    """Two runs of one run_name started together: the second finds the first's marker mid-write
    (its temporary name) and says so, instead of "files ember did not write"."""
    from ember.errors import ConfigError
    from ember.outputs import MARKER, claim_output

    run = tmp_path / "runs" / "x"
    run.mkdir(parents=True)
    (run / f".{MARKER}.tmp-4242").write_text("{")
    with pytest.raises(ConfigError, match=r"being created by another ember command right now \(process 4242"):
        claim_output(run, "run", "train.run_name", overwrite=True)
    (run / f".{MARKER}.tmp-4242").unlink()
    (run / "notes.txt").write_text("mine")
    with pytest.raises(ConfigError, match="holds files ember did not write"):
        claim_output(run, "run", "train.run_name", overwrite=True)


def test_an_output_under_a_file_is_named_before_any_work(tmp_path, capsys):
    """``--out data.csv/x.csv``: the folder to create is a file (was FileExistsError, exit 1)."""
    data = tmp_path / "data.csv"
    data.write_text("a,b\n1,2\n")
    assert main(["generate", "--out", str(data / "sub" / "x.csv"), "--rows", "10"]) == 2
    err = capsys.readouterr().err
    assert f"--out {data / 'sub' / 'x.csv'}: {data} is a file, not a folder" in err
    assert data.read_text() == "a,b\n1,2\n"
