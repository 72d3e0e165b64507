"""Fuzzing the surfaces that are not data files (ember.testing.surfaces): config files and
overrides generated from the config schema, command lines in any order, output paths that
already hold something, and the scoring API (schemathesis over the server's own OpenAPI
document, and arbitrary JSON bodies). The promise: zero tracebacks, zero 5xx answers, zero
files lost; every mistake ends in ``ember <command>: error: ...`` with exit 2.

The examples are derandomized (the same every run, so the suite is reproducible;
``EMBER_FUZZ_RANDOM=1`` draws new ones), and ``bench/fuzz_reliability.py --surfaces N --seed S``
explores more."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ember.testing.surfaces import (
    TINY, config_cases, lost_files, run_cli, schema_leaves, snapshot, write_config,
)
from tests.fuzz.conftest import fuzz_derandomize, fuzz_scale

FAST = settings(max_examples=60 * fuzz_scale(), deadline=None, database=None, derandomize=fuzz_derandomize(),
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


def test_the_schema_walk_finds_the_keys_users_set():
    keys = {k for k, _ in schema_leaves()}
    assert {"train.epochs", "data.batch_size", "data.synthetic.rows", "model.bottom_mlp", "embedding.dim",
            "pipeline.data_workers", "distributed.placement"} <= keys
    assert len(keys) > 150


@FAST
@given(case=config_cases())
def test_a_generated_config_is_planned_or_refused_clearly(case, tmp_path_factory):
    body, overrides = case
    tmp = tmp_path_factory.mktemp("cfg")
    path = tmp / "run.yaml"
    path.write_bytes(body)
    out = run_cli(["plan", "--config", str(path), "--world-size", "2", *overrides])
    assert out.kind in ("ok", "clear"), f"{out.kind} for {overrides} on\n{body[:400]!r}\n{out.detail}"


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory):
    """A folder with a config, a trained run, its export, a data file, predictions, a folder and
    a file that ember did not write."""
    root = tmp_path_factory.mktemp("sandbox")
    write_config(root / "tiny.yaml", {**TINY, "train": {**TINY["train"], "out_dir": str(root), "run_name": "run"}})
    for argv in (["train", "--config", str(root / "tiny.yaml")],
                 ["export", "--checkpoint", str(root / "run"), "--out", str(root / "export")],
                 ["generate", "--rows", "50", "--out", str(root / "data.parquet"),
                  "--options", json.dumps({"num_sparse": 3, "num_dense": 2, "vocab_size": 50})],
                 ["predict", "--export", str(root / "export"), "--input", str(root / "data.parquet"),
                  "--output", str(root / "preds.csv")]):
        out = run_cli(argv)
        assert out.kind == "ok", f"{argv}: {out.detail}"
    (root / "mine").mkdir()
    (root / "mine" / "notes.txt").write_text("the user's own notes\n")
    (root / "mine.txt").write_text("the user's own file\n")
    return root


# what each command writes, and which existing target it may replace with --overwrite
_KIND_OF = {"run": "train", "export": "export", "preds.csv": "predict", "data.parquet": "generate"}
_TARGETS = ["new", "run", "export", "preds.csv", "data.parquet", "mine", "mine.txt", "run/checkpoints"]


def _command(cmd: str, root: Path, target: Path) -> list[str]:
    if cmd == "train":
        return ["train", "--config", str(root / "tiny.yaml"), f"train.out_dir={target.parent}",
                f"train.run_name={target.name}"]
    if cmd == "export":
        return ["export", "--checkpoint", str(root / "run"), "--out", str(target)]
    if cmd == "predict":
        return ["predict", "--export", str(root / "export"), "--input", str(root / "data.parquet"),
                "--output", str(target)]
    return ["generate", "--rows", "20", "--out", str(target),
            "--options", json.dumps({"num_sparse": 3, "num_dense": 2, "vocab_size": 50})]


@pytest.mark.slow
@pytest.mark.parametrize("overwrite", [False, True])
@pytest.mark.parametrize("target", _TARGETS)
@pytest.mark.parametrize("cmd", ["export", "predict", "generate", "train"])
def test_no_command_destroys_what_it_did_not_write(sandbox, tmp_path, cmd, target, overwrite):
    root = tmp_path / "box"
    shutil.copytree(sandbox, root)
    path = root / ("out-" + cmd + {"export": "", "train": "", "predict": ".csv", "generate": ".parquet"}[cmd]
                   if target == "new" else target)
    before = snapshot(root)
    argv = _command(cmd, root, path) + (["--overwrite"] if overwrite else [])
    out = run_cli(argv)
    replaceable = overwrite and _KIND_OF.get(target) == cmd
    lost = lost_files(before, snapshot(root), [target] if replaceable else [])
    assert not lost, f"{argv} ({out.kind}: {out.detail}) changed or removed {lost[:5]}"
    assert out.kind in ("ok", "clear"), f"{argv}: {out.kind} {out.detail}"
    if target == "new" or replaceable:
        assert out.kind == "ok", f"{argv}: {out.detail}"
    else:  # an existing path that is not this command's earlier output: refused
        assert out.kind == "clear", f"{argv} was not refused: it wrote over {target}"


@FAST
@given(data=st.data())
def test_any_command_line_ends_ok_or_with_a_clear_error(sandbox, data):
    from ember.testing.surfaces import argv_cases

    paths = {"config": str(sandbox / "tiny.yaml"), "run": str(sandbox / "run"), "export": str(sandbox / "export"),
             "data": str(sandbox / "data.parquet"), "folder": str(sandbox / "mine"), "missing": str(sandbox / "nope")}
    argv = data.draw(argv_cases(paths))
    if any(a in ("train", "generate", "export", "predict", "towers") for a in argv[:1]):
        argv = argv  # these may write: they run in a copy of the sandbox
    work = sandbox.parent / f"argv-{os.getpid()}"
    shutil.rmtree(work, ignore_errors=True)
    shutil.copytree(sandbox, work)
    argv = [a.replace(str(sandbox), str(work)) for a in argv]
    cwd = os.getcwd()
    os.chdir(work)
    try:
        before = snapshot(work)
        out = run_cli(argv)
        lost = lost_files(before, snapshot(work), ["run", "export", "preds.csv", "data.parquet"]
                          if "--overwrite" in argv else [])
    finally:
        os.chdir(cwd)
    assert out.kind in ("ok", "clear"), f"ember {' '.join(argv)}: {out.kind} (exit {out.code}) {out.detail}"
    assert not lost, f"ember {' '.join(argv)} changed or removed {lost[:5]}"


# ---- the scoring API -------------------------------------------------------------------------

@pytest.fixture(scope="module")
def server(sandbox):
    pytest.importorskip("fastapi")
    pytest.importorskip("uvicorn")
    from ember.testing.server import LocalServer

    with LocalServer.for_export(sandbox / "export") as srv:
        yield srv


_JSON = st.recursive(st.one_of(st.none(), st.booleans(), st.integers(-(2 ** 70), 2 ** 70), st.floats(),
                               st.text(max_size=8)),
                     lambda kids: st.one_of(st.lists(kids, max_size=3), st.dictionaries(st.text(max_size=6), kids,
                                                                                        max_size=4)), max_leaves=12)
_ROW = st.dictionaries(st.sampled_from(["dense_0", "dense_1", "cat_0", "cat_1", "cat_2", "label", "typo", ""]),
                       _JSON, max_size=6)


@FAST
@given(body=st.one_of(_JSON, st.fixed_dictionaries({"rows": st.lists(_ROW, max_size=3)})))
def test_any_json_body_gets_an_answer_below_500(server, body):
    status, text = server.post("/score", json.dumps(body, allow_nan=True).encode())
    assert status in (200, 400, 413, 422), f"{body!r}: {status} {text[:300]}"
    if status != 200:
        assert json.loads(text).get("error"), f"{body!r}: no message in {text[:300]}"


def test_schemathesis_finds_no_5xx_in_the_openapi_document(server):
    schemathesis = pytest.importorskip("schemathesis")

    schema = schemathesis.openapi.from_url(server.url + "/openapi.json")
    failures = []
    operations = [op.ok() for op in schema.get_all_operations()]
    assert {o.path for o in operations} >= {"/score", "/health"}
    for operation in operations:
        @settings(max_examples=25 * fuzz_scale(), deadline=None, database=None,
                  suppress_health_check=list(HealthCheck))
        @given(case=operation.as_strategy())
        def check(case):
            response = case.call()
            if response.status_code >= 500:
                failures.append((operation.path, case.body, response.status_code))

        check()
    assert not failures, failures[:3]
