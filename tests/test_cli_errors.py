"""Every user mistake ends with ``ember <command>: error: ...`` naming what to fix, exit 2, and
no traceback; an error ember did not expect says it is a bug (traceback, exit 3)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import ember
from ember.cli import main
from ember.config import from_dict

SMALL = {"num_sparse": 4, "num_dense": 2, "vocab_size": 500}


def _config(tmp_path: Path, name: str = "run", **train) -> Path:
    cfg = tmp_path / f"{name}.yaml"
    cfg.write_text(yaml.safe_dump({
        "data": {"preset": "synthetic", "synthetic": {**SMALL, "rows": 1000, "eval_rows": 300}, "batch_size": 250},
        "embedding": {"dim": 4}, "model": {"type": "lr"},
        "train": {"out_dir": str(tmp_path), "run_name": name, "progress": False, "threads": 1, **train},
    }))
    return cfg


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A finished run (1 epoch of 4 steps), its export, and rows to score."""
    tmp = tmp_path_factory.mktemp("cli_errors")
    cfg = _config(tmp, "done")
    assert main(["train", "--config", str(cfg), "--export", str(tmp / "export")]) == 0
    rows = tmp / "rows.parquet"
    assert main(["generate", "--out", str(rows), "--rows", "300", "--split", "eval", "--options", json.dumps(SMALL)]) == 0
    return {"cfg": cfg, "run": tmp / "done", "export": tmp / "export", "rows": rows}


def _error(capsys, argv: list[str], code: int = 2) -> str:
    """Run the CLI in process; the one error line on stderr (asserting the exit status and its form)."""
    assert main(argv) == code
    err = capsys.readouterr().err
    assert "Traceback" not in err
    line = err.strip().splitlines()[-1]
    assert line.startswith(f"ember {argv[0]}: error: "), err
    return line


# ---- config files -------------------------------------------------------------------------------

def test_yaml_that_does_not_parse_names_file_line_and_column(tmp_path, capsys):
    cfg = tmp_path / "bad.yaml"
    cfg.write_text("data: {preset: synthetic}\nmodel: {type: lr\ntrain: {epochs: 1}\n")
    err = _error(capsys, ["train", "--config", str(cfg)])
    assert f"config file {cfg}, line 3, column 6: YAML does not parse" in err
    assert "while parsing a flow mapping" in err


@pytest.mark.parametrize("content, message", [
    (None, "is a directory; give the YAML run config file in it (it holds"),
    (b"\x7fELF\x02\x01\x01\x00\xff\xfe\x00", "is not UTF-8 text (byte 0xff at offset 8)"),
    (b"data: {preset: synthetic}\x00\x00", "is binary (it holds NUL bytes), not YAML text"),
    (b"- data\n- model\n", "holds a list, not a mapping of sections"),
])
def test_a_config_path_that_is_no_yaml_file_says_what_it_is(tmp_path, capsys, content, message):
    path = tmp_path / "cfg"
    if content is None:
        path.mkdir()
        _config(path)
    else:
        path.write_bytes(content)
    err = _error(capsys, ["train", "--config", str(path)])
    assert str(path) in err and message in err


@pytest.mark.parametrize("text, line", [
    ("data: {preset: synthetic}\nmodel: {type: lr}\ntrain: {epochs: 1}\ntrain: {max_steps: 1}\n", "line 4, column 1"),
    ("data: {preset: synthetic, batch_size: 64, batch_size: 32}\nmodel: {type: lr}\n", "line 1, column 43"),
])
def test_a_key_given_twice_in_a_config_file_is_an_error(tmp_path, capsys, text, line):
    """Plain YAML keeps the last of two equal keys: a second ``train:`` section would drop the
    first's settings without a word."""
    cfg = tmp_path / "dup.yaml"
    cfg.write_text(text)
    err = _error(capsys, ["train", "--config", str(cfg)])
    assert f"config file {cfg}, {line}: YAML does not parse: key '" in err and "is given twice" in err


def test_a_missing_config_file_is_named(tmp_path, capsys):
    err = _error(capsys, ["plan", "--config", str(tmp_path / "nope.yaml"), "--world-size", "2"])
    assert f"config file {tmp_path / 'nope.yaml'} does not exist" in err


# ---- overrides ----------------------------------------------------------------------------------

@pytest.mark.parametrize("override, message", [
    ("train.epochs=[1", "override 'train.epochs=[1': the value '[1' does not parse as YAML"),
    ("=3", "override '=3' names no key"),
    ("train..x=1", "key path 'train..x' has an empty part"),
    ("train.=1", "key path 'train.' has an empty part"),
    ("train.epochs.x=1", "'train.epochs' is 1, not a section"),
    ("epochs", "must look like key.path=value"),
    ("train.epoch=2", "unknown key 'train.epoch' (did you mean 'epochs'?)"),
    ("schem={}", "unknown key 'schem' (did you mean 'schema'?)"),  # its YAML name, not the field's (schema_)
    ("data=3", "'data': Input should be a valid dictionary"),
    ("train.task_weights=[1, 2]", "train.task_weights gives 2 weight(s) [1.0, 2.0] for 1 task(s) (schema.labels: label)"),
    ("train.seed=99999999999999999999999", "'train.seed': Input should be less than 9223372036854775808"),
    ("data.seed=-5", "'data.seed': Input should be greater than or equal to 0 (got -5)"),
    ("embedding.seed=99999999999999999999999", "'embedding.seed': Input should be less than 9223372036854775808"),
    ("train.run_name=../../escaped", "'train.run_name': must be a directory name, not a path"),
    ("train.run_name=''", "'train.run_name': must be a directory name"),
    ("model={type: dlrm, bottom_mlp: [0], top_mlp: [4]}", "invalid config: 'model.bottom_mlp': every MLP size must be > 0, "
                                                          "got [0]"),
    ("model={type: dlrn}", "invalid config: 'model.type': unknown model type 'dlrn'; known types: dlrm,"),
    ("train.dense_optimizer.lr=.inf", "'train.dense_optimizer.lr': Input should be a finite number (got inf)"),
])
def test_overrides_that_do_not_parse_or_name_no_key(tmp_path, capsys, override, message):
    err = _error(capsys, ["train", "--config", str(_config(tmp_path, epochs=1)), override])
    assert message in err
    assert err.count("got ") <= 1 and "Value error" not in err  # said once, in our words
    assert not (tmp_path / "run").exists()  # nothing ran


# ---- entries naming a table or feature ----------------------------------------------------------

def _raw(**extra) -> dict:
    return {"data": {"preset": "synthetic", "synthetic": SMALL}, "model": {"type": "lr"}, **extra}


@pytest.mark.parametrize("size", ["0", "100000000"])
def test_plan_world_size_out_of_range_is_named(tmp_path, capsys, size):
    """(10^8 ranks ran out of memory printing a line each)"""
    err = _error(capsys, ["plan", "--config", str(_config(tmp_path)), "--world-size", size])
    assert f"--world-size must be in 1..65536, got {size}" in err


def test_a_tables_entry_naming_no_table_is_an_error(tmp_path, capsys):
    cfg = str(_config(tmp_path))
    err = _error(capsys, ["train", "--config", cfg, "tables=[{name: c3, min_count: 5}]"])
    assert "tables[0] names table 'c3', which no sparse feature reads (did you mean 'C3'?)" in err
    assert "the tables are C1, C2, C3, C4" in err
    err = _error(capsys, ["plan", "--config", cfg, "--world-size", "2", "tables=[{name: C1}, {name: user, dim: 8}]"])
    assert "tables[1] names table 'user'" in err and "did you mean" not in err
    # a listed table the schema reads takes its keys (min_count reaches the table)
    tables = {t.name: t for t in from_dict(_raw(tables=[{"name": "C3", "min_count": 5}])).table_configs()}
    assert tables["C3"].min_count == 5 and tables["C1"].min_count == 1
    with pytest.raises(ember.errors.ConfigError, match="tables lists C2 more than once"):
        from_dict(_raw(tables=[{"name": "C2"}, {"name": "C2", "dim": 8}]))


def test_tower_and_sharding_entries_naming_no_feature_or_table_are_errors():
    with pytest.raises(ember.errors.ConfigError, match=r"model.towers\[1\] names feature 'c4', .* \(did you mean 'C4'\?\)"):
        from_dict(_raw(model={"type": "dmt", "towers": [["C1", "C2"], ["C3", "c4"]]}))
    with pytest.raises(ember.errors.ConfigError, match="distributed.tables names table 'C9'"):
        from_dict(_raw(distributed={"tables": {"C9": "row_wise"}}))
    # a first-order (dim-1) twin of a table may be named too
    assert from_dict(_raw(distributed={"tables": {"C1__linear": "table_wise"}})).distributed.tables


# ---- paths given to eval / export / towers / predict / serve ------------------------------------

@pytest.mark.parametrize("argv, message", [
    (["eval", "--checkpoint", "{tmp}/nope"], "--checkpoint {tmp}/nope does not exist; give a run directory"),
    (["export", "--checkpoint", "{tmp}/nope", "--out", "{tmp}/out"], "--checkpoint {tmp}/nope does not exist"),
    (["towers", "--checkpoint", "{tmp}/nope", "--towers", "2"], "--checkpoint {tmp}/nope does not exist"),
    (["predict", "--export", "{tmp}/nope", "--input", "{rows}"], "--export {tmp}/nope does not exist; give an export directory"),
    (["predict", "--export", "{export}", "--input", "{tmp}/nope.csv"], "--input {tmp}/nope.csv does not exist"),
    (["serve", "--export", "{tmp}/nope"], "--export {tmp}/nope does not exist"),
])
def test_missing_input_paths_are_named(trained, tmp_path, capsys, argv, message):
    fill = {"tmp": tmp_path, "rows": trained["rows"], "export": trained["export"]}
    err = _error(capsys, [a.format(**fill) for a in argv])
    assert message.format(**fill) in err


def test_a_diverged_run_stops_at_its_first_non_finite_loss_and_saves_nothing_after(tmp_path, capsys):
    cfg = _config(tmp_path, "nan", epochs=1, checkpoint_every=1)
    err = _error(capsys, ["train", "--config", str(cfg), "model={type: dlrm, bottom_mlp: [8, 4], top_mlp: [8]}",
                          "train.dense_optimizer={type: sgd, lr: 1.0e+30}"])
    assert "training diverged at step " in err and "the batch's loss is nan" in err
    step = int(err.split("training diverged at step ")[1].split(":")[0])
    saved = sorted((tmp_path / "nan" / "checkpoints").glob("step-*"))
    assert all(int(p.name.split("-")[1]) < step for p in saved)  # (no weights of the diverged step are kept)
    assert not (tmp_path / "nan" / "summary.json").exists()  # and no metric of NaN scores


def test_predict_on_an_empty_csv_or_into_a_folder_that_takes_no_files_says_so(trained, tmp_path, capsys):
    empty = tmp_path / "empty.csv"
    empty.write_text("")
    err = _error(capsys, ["predict", "--export", str(trained["export"]), "--input", str(empty)])
    assert f"{empty}: the file is empty (csv.header is true: a header line is expected)" in err
    if Path("/proc/self").is_dir():  # Linux: /proc exists and takes no new files, not even as root
        err = _error(capsys, ["predict", "--export", str(trained["export"]), "--input", str(trained["rows"]),
                              "--output", "/proc/ember-test.csv"])
        assert "--output /proc/ember-test.csv cannot be written: /proc takes no new files" in err  # before the scoring


def test_an_export_where_a_checkpoint_belongs_and_the_reverse(trained, capsys):
    export, run = trained["export"], trained["run"]
    err = _error(capsys, ["eval", "--checkpoint", str(export)])
    assert f"--checkpoint {export} is an export (written by ember export or train --export), not a checkpoint" in err
    assert f"ember predict --export {export}" in err
    err = _error(capsys, ["predict", "--export", str(run), "--input", str(trained["rows"])])
    assert f"--export {run} is a training run directory, not an export; export it first (ember export --checkpoint {run}" in err
    step = next((run / "checkpoints").glob("step-*"))
    err = _error(capsys, ["serve", "--export", str(step)])
    assert f"--export {step} is a training checkpoint, not an export" in err


# ---- serve --------------------------------------------------------------------------------------

def test_serve_on_a_busy_port_says_so_before_announcing(trained, capsys):
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        assert main(["serve", "--export", str(trained["export"]), "--port", str(port)]) == 2
    err = capsys.readouterr().err
    assert f"ember serve: error: port {port} on 127.0.0.1 is in use; pick another with --port" in err
    assert "serving" not in err


@pytest.mark.parametrize("flag, value", [("--poll-s", "nan"), ("--poll-s", "inf"), ("--poll-s", "0.0"),
                                         ("--max-body-bytes", "0")])
def test_serve_flags_out_of_range_are_named(trained, capsys, flag, value):
    err = _error(capsys, ["serve", "--export", str(trained["export"]), flag, value])
    assert f"ember serve: error: {flag} {value}: give the" in err


def test_serve_announces_once_the_port_is_bound(trained):
    from ember.serving.server import serve

    class Announced(Exception):
        pass

    seen = []

    def ready(host: str, port: int) -> None:
        with socket.create_connection((host, port), timeout=5):  # bound (and listening) already
            seen.append(port)
        raise Announced

    with pytest.raises(Announced):
        serve(trained["export"], "127.0.0.1", 0, on_ready=ready)
    assert seen and seen[0] > 0  # port 0: the port picked is the one announced
    with socket.socket() as again:  # closed again on the way out
        again.bind(("127.0.0.1", seen[0]))


# ---- resuming a finished run --------------------------------------------------------------------

def test_resuming_a_finished_run_names_the_key_to_raise(trained, capsys):
    cfg, run = str(trained["cfg"]), trained["run"]
    latest = (run / "checkpoints" / "LATEST").read_text()
    err = _error(capsys, ["train", "--config", cfg, f"train.resume={run}"])
    assert f"train.resume {run}: the run is finished: it reached step 4 after 1 full epoch(s) and train.epochs is 1" in err
    assert "raise train.epochs above 1 to train further (e.g. train.epochs=2)" in err
    err = _error(capsys, ["train", "--config", cfg, f"train.resume={run}", "train.epochs=3", "train.max_steps=4"])
    assert "it reached step 4 and train.max_steps is 4; raise train.max_steps above 4" in err
    assert (run / "checkpoints" / "LATEST").read_text() == latest
    # its position counts batches of 250 rows: another batch size would resume at the wrong row
    err = _error(capsys, ["train", "--config", cfg, f"train.resume={run}", "train.epochs=3", "data.batch_size=100"])
    assert (f"train.resume {run}: its data position counts batches of 250 rows (batch 0 of epoch 1), but "
            "data.batch_size is now 100: it would resume at the wrong row; resume with data.batch_size=250") in err
    assert (run / "checkpoints" / "LATEST").read_text() == latest


# ---- flags, version, help -----------------------------------------------------------------------

def test_flags_and_overrides_in_any_order(tmp_path, capsys):
    cfg = str(_config(tmp_path))
    assert main(["train", "train.max_steps=2", "--config", cfg, "train.run_name=mixed", "--overwrite",
                 "train.log_every=1"]) == 0
    assert "steps: 2" in capsys.readouterr().out and (tmp_path / "mixed" / "summary.json").exists()
    err = _error(capsys, ["train", "--config", cfg, "--bogus", "train.max_steps=2"])
    assert err == "ember train: error: unrecognized arguments: --bogus"
    err = _error(capsys, ["generate", "--out", str(tmp_path / "x.parquet"), "data.batch_size=3"])
    assert err == "ember generate: error: unrecognized arguments: data.batch_size=3"  # generate takes no overrides


def test_version(capsys, monkeypatch):
    import importlib.metadata

    assert main(["--version"]) == 0
    assert capsys.readouterr().out == f"ember {importlib.metadata.version('ember')}\n"

    def not_installed(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", not_installed)  # a source checkout: the package's own
    monkeypatch.setattr(ember, "__version__", "9.9.9")
    assert main(["--version"]) == 0
    assert capsys.readouterr().out == "ember 9.9.9\n"


@pytest.mark.parametrize("command", [[], ["train"], ["eval"], ["export"], ["towers"], ["serve"], ["predict"], ["plan"], ["profile"],
                                     ["generate"]])
def test_help_is_plain_text(command, capsys):
    assert main([*command, "--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: ember") and "``" not in out and ":class:" not in out


# ---- errors ember did not expect ----------------------------------------------------------------

def test_an_internal_error_says_it_is_a_bug(monkeypatch, tmp_path, capsys):
    def boom(args):
        raise TypeError("unsupported operand")

    monkeypatch.setattr("ember.cli.cmd_generate", boom)
    assert main(["generate", "--out", str(tmp_path / "x.parquet")]) == 3
    err = capsys.readouterr().err
    assert "Traceback" in err and "in boom" in err
    assert err.strip().splitlines()[-1] == ("ember generate: internal error (a bug in ember, please report it with the "
                                            "traceback above): TypeError: unsupported operand")


@pytest.mark.parametrize("raised, code, line", [
    (OSError(28, "No space left on device"), 1, "ember generate: error: OSError: [Errno 28] No space left on device"),
    (KeyboardInterrupt(), 130, "ember generate: interrupted"),
])
def test_a_system_failure_or_interrupt_has_no_traceback(monkeypatch, tmp_path, capsys, raised, code, line):
    def fail(args):
        raise raised

    monkeypatch.setattr("ember.cli.cmd_generate", fail)
    assert main(["generate", "--out", str(tmp_path / "x.parquet")]) == code
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.strip() == line


# ---- the real process ---------------------------------------------------------------------------

ROOT = Path(ember.__file__).resolve().parents[1]


def _ember(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
    return subprocess.run([sys.executable, "-m", "ember", *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)


def test_no_traceback_reaches_the_user_of_the_command(trained, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("data: [1\n")
    r = _ember("train", "--config", str(bad), "train.epochs=2")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.startswith(f"ember train: error: config file {bad}, line 2, column 1: YAML does not parse"), r.stderr
    r = _ember("eval", "--checkpoint", str(trained["export"]))
    assert r.returncode == 2 and "Traceback" not in r.stderr and "is an export" in r.stderr, r.stderr


def test_an_export_given_to_resume_or_finetune_from_is_named(trained, tmp_path, capsys):
    for key in ("train.resume", "train.init_from"):
        err = _error(capsys, ["train", "--config", str(_config(tmp_path)), f"{key}={trained['export']}"])
        assert f"{key} {trained['export']} is an export (written by ember export or train --export), not a checkpoint" in err


def test_a_resume_past_the_end_of_shorter_data_says_where_it_resumed(tmp_path, capsys):
    """The checkpoint stopped at batch 6 of 8; the data given on resume holds 2 batches: the run
    trains nothing, and the error says why (it blamed the files for holding no rows)."""
    rows = "".join(f"{i % 2},{i},c{i % 5}\n" for i in range(64))
    (tmp_path / "long.csv").write_text("y,x,c\n" + rows)
    (tmp_path / "short.csv").write_text("y,x,c\n" + rows[: rows.index("\n", 0) + 1] * 16)
    cfg = tmp_path / "run.yaml"
    cfg.write_text(yaml.safe_dump({
        "data": {"format": "csv", "train": str(tmp_path / "long.csv"), "batch_size": 8},
        "schema": {"labels": ["y"], "dense": [{"name": "x"}], "sparse": [{"name": "c"}]},
        "embedding": {"dim": 4}, "model": {"type": "dlrm", "bottom_mlp": [4], "top_mlp": [4]},
        "train": {"out_dir": str(tmp_path), "run_name": "r", "progress": False, "threads": 1, "max_steps": 6}}))
    assert main(["train", "--config", str(cfg)]) == 0
    capsys.readouterr()
    assert main(["train", "--config", str(cfg), f"train.resume={tmp_path / 'r'}", "train.max_steps=100",
                 f"data.train={tmp_path / 'short.csv'}"]) == 2
    err = capsys.readouterr().err
    assert f"data.train is {tmp_path / 'short.csv'}, the run read {tmp_path / 'long.csv'} before" in err  # said first
    assert "the run resumed at batch 6 of epoch 0" in err and "data.train gave no batch past it" in err
