"""The CLI end to end: generate -> train (--export) -> eval -> export -> predict."""

from __future__ import annotations

import json

import numpy as np
import yaml

from ember.cli import main


def test_cli_workflow(tmp_path, capsys):
    data = tmp_path / "eval.parquet"
    assert main(["generate", "--out", str(data), "--format", "parquet", "--rows", "2000", "--split", "eval",
                 "--options", json.dumps({"num_sparse": 4, "vocab_size": 3000})]) == 0
    cfg = tmp_path / "run.yaml"
    cfg.write_text(yaml.safe_dump({
        "data": {"preset": "synthetic", "synthetic": {"rows": 8000, "eval_rows": 2000, "num_sparse": 4, "vocab_size": 3000},
                 "batch_size": 512},
        "embedding": {"dim": 4},
        "model": {"type": "wdl", "deep_mlp": [16]},
        "train": {"out_dir": str(tmp_path), "run_name": "cli", "progress": False},
    }))
    assert main(["train", "--config", str(cfg), "--export", str(tmp_path / "exp1"), "train.max_steps=10"]) == 0
    assert "eval auc/label" in capsys.readouterr().out
    assert main(["eval", "--checkpoint", str(tmp_path / "cli")]) == 0
    captured = capsys.readouterr()
    metrics = json.loads(captured.out)
    assert 0.5 < metrics["auc/label"] <= 1.0
    # it names the checkpoint it scored (the run's LATEST), in the JSON and on stderr
    latest = tmp_path / "cli" / "checkpoints" / "step-00000010"
    assert metrics["checkpoint"] == str(latest) and metrics["step"] == 10
    assert f"scoring checkpoint {latest} (step 10)" in captured.err
    assert main(["export", "--checkpoint", str(tmp_path / "cli"), "--out", str(tmp_path / "exp2")]) == 0
    assert f"exported checkpoint {latest} (step 10)" in capsys.readouterr().out
    out = tmp_path / "p.csv"
    assert main(["predict", "--export", str(tmp_path / "exp2"), "--input", str(data), "--output", str(out)]) == 0
    probs = np.loadtxt(out, delimiter=",", skiprows=1)
    assert probs.shape == (2000,) and ((probs > 0) & (probs < 1)).all()
    # the export written by `train --export` and the one by `export` score the file identically
    from ember.serving import Predictor

    p = Predictor.load(tmp_path / "exp1")
    np.testing.assert_allclose(p.predict_files([str(data)])[:, 0], probs, atol=2e-6)
    # raw rows to score need no label column
    import pyarrow.parquet as pq

    pq.write_table(pq.read_table(data).drop(["label"]), tmp_path / "unlabeled.parquet")
    np.testing.assert_allclose(p.predict_files([str(tmp_path / "unlabeled.parquet")])[:, 0], probs, atol=2e-6)


def test_cli_bad_config_is_a_clean_error(tmp_path, capsys):
    cfg = tmp_path / "bad.yaml"
    cfg.write_text("data: {preset: synthetic}\nmodel: {type: dlrm}\ntrain: {epoch: 2}\n")
    assert main(["train", "--config", str(cfg)]) == 2
    assert "did you mean 'epochs'" in capsys.readouterr().err


# ---- argument checks, run names, predict inputs --------------------------------------------------

import errno  # noqa: E402

import pyarrow as pa  # noqa: E402
import pyarrow.csv as pacsv  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402
import pytest  # noqa: E402

SMALL = {"num_sparse": 4, "num_dense": 2, "vocab_size": 500}


def _run_yaml(tmp_path, name="again"):
    cfg = tmp_path / f"{name}.yaml"
    cfg.write_text(yaml.safe_dump({
        "data": {"preset": "synthetic", "synthetic": {**SMALL, "rows": 1000, "eval_rows": 300}, "batch_size": 250},
        "embedding": {"dim": 4}, "model": {"type": "lr"},
        "train": {"out_dir": str(tmp_path), "run_name": name, "progress": False, "threads": 1},
    }))
    return str(cfg)


@pytest.fixture(scope="module")
def export_dir(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("cli")
    assert main(["train", "--config", _run_yaml(tmp, "exp"), "--export", str(tmp / "export")]) == 0
    data = tmp / "rows.parquet"
    assert main(["generate", "--out", str(data), "--rows", "300", "--split", "eval", "--options", json.dumps(SMALL)]) == 0
    return tmp / "export", data


def test_reusing_a_run_name_needs_overwrite(tmp_path, capsys):
    cfg = _run_yaml(tmp_path)
    assert main(["train", "--config", cfg]) == 0
    first = (tmp_path / "again" / "summary.json").read_text()
    assert main(["train", "--config", cfg]) == 2
    err = capsys.readouterr().err
    assert "already holds a run" in err and "--overwrite" in err
    assert (tmp_path / "again" / "summary.json").read_text() == first  # untouched
    assert main(["train", "--config", cfg, "--overwrite"]) == 0
    assert main(["train", "--config", cfg, f"train.resume={tmp_path / 'again'}", "train.epochs=2"]) == 0


@pytest.mark.parametrize("args, named", [
    (["--rows", "0"], "--rows"),
    (["--options", "{vocab_size: 3"], "--options is not valid JSON"),
    (["--options", "[1, 2]"], "--options must be a JSON object"),
    (["--options", '{"vocab_sise": 10}'], "unknown key '--options.vocab_sise'"),
    (["--options", '{"vocab_size": 0}'], "vocab_size must be >= 1"),
    (["--options", '{"num_sparse": -1}'], "'--options.num_sparse'"),
    (["--options", '{"seed": 3}'], "--seed"),
    (["--seed", "99999999999999999999999"], "--seed 99999999999999999999999: give a whole number in [0, 2**63)"),
])
def test_generate_rejects_bad_arguments_naming_them(tmp_path, capsys, args, named):
    assert main(["generate", "--out", str(tmp_path / "x.parquet"), *args]) == 2
    assert named in capsys.readouterr().err
    assert not (tmp_path / "x.parquet").exists()


def test_predict_refuses_unknown_extensions_unless_format_is_given(export_dir, tmp_path, capsys):
    export, data = export_dir
    odd = tmp_path / "rows.dat"
    odd.write_bytes(data.read_bytes())
    assert main(["predict", "--export", str(export), "--input", str(odd)]) == 2
    assert "cannot tell the format" in capsys.readouterr().err  # never synthetic rows scored instead
    assert main(["predict", "--export", str(export), "--input", str(data), "--output", str(tmp_path / "a.csv")]) == 0
    assert main(["predict", "--export", str(export), "--input", str(odd), "--format", "parquet",
                 "--output", str(tmp_path / "b.csv")]) == 0
    assert (tmp_path / "a.csv").read_text() == (tmp_path / "b.csv").read_text()


def test_predict_headerless_rows_without_labels_via_overrides(export_dir, tmp_path, capsys):
    export, data = export_dir
    table = pq.read_table(data)
    names = table.column_names
    assert main(["predict", "--export", str(export), "--input", str(data), "--output", str(tmp_path / "a.csv")]) == 0
    rows = tmp_path / "rows.txt"  # no header, no label column, an extension that needs --format
    pacsv.write_csv(table.drop(["label"]).cast(pa.schema([(n, pa.string()) for n in names if n != "label"])), rows,
                    pacsv.WriteOptions(include_header=False))
    args = ["predict", "--export", str(export), "--input", str(rows), "--format", "csv", "--output", str(tmp_path / "b.csv"),
            "data.csv.header=false", f"data.csv.column_names=[{', '.join(names)}]", "data.batch_size=7"]
    assert main(args) == 0, capsys.readouterr().err
    a = np.loadtxt(tmp_path / "a.csv", delimiter=",", skiprows=1)
    np.testing.assert_allclose(np.loadtxt(tmp_path / "b.csv", delimiter=",", skiprows=1), a, atol=2e-6)
    assert main(["predict", "--export", str(export), "--input", str(data), "train.epochs=2"]) == 2
    assert "not data.* keys" in capsys.readouterr().err


def test_predict_output_on_a_full_disk_leaves_no_file(export_dir, tmp_path, capsys, monkeypatch):
    import ember.fileio as fileio

    export, data = export_dir

    def no_space(path):  # type: ignore[no-untyped-def]
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(fileio, "fsync_dir", no_space)
    out = tmp_path / "p.csv"
    assert main(["predict", "--export", str(export), "--input", str(data), "--output", str(out)]) == 2
    err = capsys.readouterr().err
    assert str(out) in err and "no space left" in err and "bytes)" in err
    assert list(tmp_path.iterdir()) == []


def test_a_checkpoint_from_before_missing_values_reads_empty_categories_as_missing(tmp_path):
    import argparse

    from ember.checkpoint.load import resolve_checkpoint
    from ember.cli import _restore

    cfg = tmp_path / "run.yaml"
    cfg.write_text(yaml.safe_dump({
        "data": {"preset": "synthetic", "synthetic": {"rows": 256, "eval_rows": 64, "num_sparse": 2, "vocab_size": 50},
                 "batch_size": 64},
        "model": {"type": "lr"},
        "train": {"out_dir": str(tmp_path), "run_name": "old", "progress": False, "max_steps": 2},
    }))
    assert main(["train", "--config", str(cfg)]) == 0
    args = argparse.Namespace(checkpoint=str(tmp_path / "old"), config=None, overrides=[])
    assert _restore(args)[0].schema.missing_values == []  # recorded now: as trained
    manifest_path = resolve_checkpoint(tmp_path / "old") / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    del manifest["config"]["schema"]["missing_values"]  # as a checkpoint written before the key
    manifest_path.write_text(json.dumps(manifest))
    assert _restore(args)[0].schema.missing_values == [""]
