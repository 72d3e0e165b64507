"""Fuzzing the surfaces a user touches that are not data files: config files and overrides,
command lines, output paths and the scoring API.

Every case runs ember's command line in process (``ember.cli.main``) and is classified:

- ``ok``: exit 0;
- ``clear``: exit 2 with ``ember <command>: error: ...`` (or argparse's usage error) on stderr;
- ``traceback``: an exception escaped ``main`` or a traceback was printed: a defect;
- ``other``: any other exit status (a defect unless the case expects it);
- ``lost``: (output-path cases) a file the command did not write changed or vanished: a defect.

The generators are hypothesis strategies (``config_cases``, ``argv_cases``) so that the test
suite shrinks a failure to its smallest form; ``bench/fuzz_reliability.py --surfaces`` draws
many more of them and prints the table.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import traceback
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Sequence

__all__ = ["Outcome", "run_cli", "schema_leaves", "config_cases", "argv_cases", "snapshot", "lost_files",
           "TINY", "write_config", "study"]

TINY: dict[str, Any] = {
    "data": {"preset": "synthetic", "synthetic": {"rows": 256, "eval_rows": 64, "num_sparse": 3, "num_dense": 2,
                                                  "vocab_size": 50}, "batch_size": 64},
    "embedding": {"dim": 4},
    "model": {"type": "dlrm", "bottom_mlp": [8, 4], "top_mlp": [8]},
    "train": {"epochs": 1, "max_steps": 2, "progress": False, "threads": 1, "log_every": 1},
}
"""A run config that trains in about a second: the base every generated config mutates."""


@dataclass
class Outcome:
    """How one command line ended."""

    kind: str  # ok | clear | traceback | other | lost
    argv: list[str]
    code: int | None
    detail: str = ""


def run_cli(argv: Sequence[str]) -> Outcome:
    """Run ``ember <argv>`` in this process with stdout and stderr captured; classify it."""
    from ember.cli import main

    out, err = io.StringIO(), io.StringIO()
    code: int | None
    escaped = ""
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = int(main(list(argv)))
        except SystemExit as e:  # argparse: --help (0) or a usage error (2)
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 2)
            if e.code is not None and not isinstance(e.code, int):
                print(e.code, file=err)
        except BaseException as e:  # noqa: BLE001  (anything else reached the user as a traceback)
            code = None
            escaped = "".join(traceback.format_exception(e))
    text = err.getvalue()
    if escaped or "Traceback (most recent call last)" in text:
        return Outcome("traceback", list(argv), code, (escaped or text)[-2000:])
    if code == 0:
        return Outcome("ok", list(argv), code)
    last = text.strip().splitlines()[-1] if text.strip() else ""
    if code == 2 and "error:" in text:
        return Outcome("clear", list(argv), code, last[:400])
    return Outcome("other", list(argv), code, (last or out.getvalue()[-400:])[:400])


def schema_leaves(model: Any = None, prefix: str = "") -> list[tuple[str, Any]]:
    """Every dotted config key of the run config (``train.epochs``, ``data.synthetic.rows``...)
    with its annotation; a union of sections (model types) contributes the keys of each."""
    from pydantic import BaseModel

    if model is None:
        from ember.config import RunConfig

        model = RunConfig
    out: list[tuple[str, Any]] = []
    for name, field in model.model_fields.items():
        key = f"{prefix}{field.alias or name}"
        sections = [c for c in _flat_args(field.annotation) if isinstance(c, type) and issubclass(c, BaseModel)]
        if sections and key.count(".") < 4:
            for sub in sections:
                out.extend(schema_leaves(sub, key + "."))
            out.append((key, field.annotation))  # the section itself, set to a scalar or a list
        else:
            out.append((key, field.annotation))
    seen: set[str] = set()
    return [(k, a) for k, a in out if not (k in seen or seen.add(k))]  # type: ignore[func-returns-value]


def _flat_args(annotation: Any) -> list[Any]:
    args = typing.get_args(annotation)
    if not args:
        return [annotation]
    out: list[Any] = []
    for a in args:
        out.extend(_flat_args(a))
    return out


def write_config(path: Path, raw: Any) -> Path:
    import yaml

    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def _strategies() -> Any:
    """Values a user might type: numbers of every size, text, YAML that does not parse, lists, maps."""
    from hypothesis import strategies as st

    # no path separators: a generated value used as a path stays inside the case's folder
    text = st.text(st.characters(blacklist_characters="/\\\x00~", blacklist_categories=("Cs",)), max_size=10)
    scalar = st.one_of(st.integers(-(2 ** 40), 2 ** 40), st.integers(-3, 5),
                       st.floats(allow_nan=True, allow_infinity=True), st.booleans(), st.none(), text)
    value = st.one_of(scalar, st.lists(st.integers(-2, 64), max_size=3), st.dictionaries(text, scalar, max_size=2))
    raw_text = st.one_of(text, st.sampled_from(["[1", "{a: 1", "]", ": :", "'x", "!!python/object:os.system x",
                                                 "1e999", "-", "", "null", "~", "*a", "&a b", "\t"]))
    return st, text, value, raw_text


def config_cases() -> Any:
    """A hypothesis strategy of ``(file_bytes | None, overrides)``: the tiny config with keys of
    the schema (or keys that almost are) set to generated values, in the file or as overrides,
    and the file itself sometimes cut, garbled, empty or not UTF-8."""
    import yaml

    st, text, value, raw_text = _strategies()
    keys = [k for k, _ in schema_leaves()]
    key = st.one_of(st.sampled_from(keys), st.sampled_from(keys).map(lambda k: k[:-1] or "x"),
                    st.sampled_from(keys).map(lambda k: k.rsplit(".", 1)[0] + ".nope"), text)

    def apply(raw: dict, k: str, v: Any) -> dict:
        node = raw
        parts = [p for p in k.split(".") if p] or ["x"]
        for p in parts[:-1]:
            if not isinstance(node.get(p), dict):
                node[p] = {}
            node = node[p]
        node[parts[-1]] = v
        return raw

    def build(args: tuple) -> tuple[bytes | None, list[str]]:
        in_file, as_override, garble = args
        import copy

        raw = copy.deepcopy(TINY)
        for k, v in in_file:
            raw = apply(raw, k, v)
        body = yaml.safe_dump(raw, sort_keys=False).encode()
        kind, at, byte = garble
        if kind == "cut":
            body = body[: at % max(len(body), 1)]
        elif kind == "byte":
            i = at % max(len(body), 1)
            body = body[:i] + bytes([byte]) + body[i:]
        elif kind == "bom":
            body = b"\xef\xbb\xbf" + body
        elif kind == "empty":
            body = b""
        elif kind == "list":
            body = b"- 1\n- 2\n"
        elif kind == "binary":
            body = bytes(range(256))
        overrides = [f"{k}={v}" for k, v in as_override]
        return body, overrides

    override = st.tuples(key, st.one_of(raw_text, value.map(lambda v: yaml.safe_dump(v, default_flow_style=True)
                                                             .strip().removesuffix("...").strip())))
    garble = st.tuples(st.sampled_from(["none"] * 6 + ["cut", "byte", "bom", "empty", "list", "binary"]),
                       st.integers(0, 10_000), st.integers(0, 255))
    return st.tuples(st.lists(st.tuples(key, value), max_size=3), st.lists(override, max_size=3), garble).map(build)


def argv_cases(paths: dict[str, str]) -> Any:
    """A hypothesis strategy of command lines: each command's valid form (``paths``: name ->
    path of a config, run, export, data file, folder, missing path), then shuffled, cut short,
    given a stray word or another path, or a flag repeated; plus lines of random words."""
    st, text, value, raw_text = _strategies()
    p = paths
    forms = [
        ["train", "--config", p["config"], "train.max_steps=1", "--overwrite"],
        ["eval", "--checkpoint", p["run"]],
        ["export", "--checkpoint", p["run"], "--out", "out-export"],
        ["predict", "--export", p["export"], "--input", p["data"], "--output", "preds.csv"],
        ["generate", "--rows", "10", "--out", "gen.parquet"],
        ["plan", "--config", p["config"], "--world-size", "2"],
        ["towers", "--checkpoint", p["run"], "--towers", "2", "--rows", "64"],
        ["--version"], ["--help"], ["train", "--help"],
    ]
    words = st.one_of(st.sampled_from(["--config", "--checkpoint", "--out", "--output", "--export", "--input",
                                       "--overwrite", "--rows", "--format", "--world-size", "--bogus", "-h"]),
                      st.sampled_from(sorted(p.values())),
                      st.sampled_from(["train.epochs=2", "train.max_steps=1", "data.batch_size=32", "train.epochs=",
                                       "nope=1", "train.epochs=[", "=1", "1", "-1", "0", "csv", "x.tsv", "x.parquet"]),
                      text)

    def mutate(args: tuple) -> list[str]:
        form, how, at, word, order = args
        argv = list(form)
        i = at % len(argv)
        if how == "shuffle" and len(argv) > 2:
            rest = argv[1:]
            pairs, j = [], 0
            while j < len(rest):  # keep each flag with its value
                take = 2 if rest[j].startswith("--") and j + 1 < len(rest) and not rest[j + 1].startswith("--") else 1
                pairs.append(rest[j:j + take])
                j += take
            pairs = [pairs[k % len(pairs)] for k in order][:len(pairs)] if order else pairs
            argv = [argv[0]] + [w for pr in pairs for w in pr]
        elif how == "drop":
            del argv[i]
        elif how == "add":
            argv.insert(i + 1, word)
        elif how == "replace" and i > 0:
            argv[i] = word
        return argv

    mutated = st.tuples(st.sampled_from(forms), st.sampled_from(["none", "shuffle", "drop", "add", "replace"]),
                        st.integers(0, 20), words, st.permutations(range(4))).map(mutate)
    random_words = st.tuples(st.sampled_from(["train", "eval", "export", "predict", "generate", "plan", "towers"]),
                             st.lists(words, max_size=5)).map(lambda t: [t[0], *t[1]])
    return st.one_of(mutated, mutated, random_words)


def snapshot(root: Path) -> dict[str, str]:
    """Relative path -> sha256 of every file under ``root``."""
    out: dict[str, str] = {}
    for p in sorted(root.rglob("*")):
        if p.is_file():
            out[str(p.relative_to(root))] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def lost_files(before: dict[str, str], after: dict[str, str], replaced: Iterable[str] = ()) -> list[str]:
    """Files of ``before`` that vanished or changed, except under the ``replaced`` prefixes (an
    output the command was allowed to replace)."""
    allowed = [r.rstrip(os.sep) for r in replaced]
    return [k for k, h in before.items()
            if after.get(k) != h and not any(k == a or k.startswith(a + os.sep) for a in allowed)]


def study(count: int, workdir: Path, seed: int = 0) -> dict[str, Any]:
    """Draw ``count`` cases of each surface (configs, command lines, output paths, scoring API
    bodies) and count how each ended; every case has 60 s before it counts as a hang.
    Returns ``{surface: {kind: n}}`` plus ``examples`` (the first few defects of each surface)."""
    import json
    import shutil
    import signal

    from hypothesis import HealthCheck, given, seed as hseed, settings

    from ember.testing.server import LocalServer
    from hypothesis import strategies as st

    tally: dict[str, dict[str, int]] = {}
    examples: dict[str, list[str]] = {}

    class _Hang(Exception):
        pass

    def alarm(signum: int, frame: Any) -> None:
        raise _Hang()

    def count_one(surface: str, fn: Any) -> None:
        old = signal.signal(signal.SIGALRM, alarm)
        signal.alarm(60)
        try:
            kind, detail = fn()
        except _Hang:
            kind, detail = "hang", "over 60 s"
        finally:
            signal.alarm(0)
            signal.signal(signal.SIGALRM, old)
        tally.setdefault(surface, {}).setdefault(kind, 0)
        tally[surface][kind] += 1
        if kind not in ("ok", "clear", "4xx", "200") and len(examples.setdefault(surface, [])) < 5:
            examples[surface].append(f"{kind}: {detail[:200]} ... {detail[-300:]}" if len(detail) > 500 else f"{kind}: {detail}")

    box = workdir / "sandbox"
    box.mkdir(parents=True, exist_ok=True)
    write_config(box / "tiny.yaml", {**TINY, "train": {**TINY["train"], "out_dir": str(box), "run_name": "run"}})
    for argv in (["train", "--config", str(box / "tiny.yaml"), "--overwrite"],
                 ["export", "--checkpoint", str(box / "run"), "--out", str(box / "export")],
                 ["generate", "--rows", "50", "--out", str(box / "data.parquet"),
                  "--options", json.dumps({"num_sparse": 3, "num_dense": 2, "vocab_size": 50})]):
        out = run_cli(argv)
        if out.kind != "ok":
            raise RuntimeError(f"setting up the sandbox failed: {argv}: {out.detail}")
    (box / "mine").mkdir(exist_ok=True)
    (box / "mine" / "notes.txt").write_text("the user's own notes\n")
    run_settings = settings(max_examples=count, deadline=None, database=None,
                            suppress_health_check=list(HealthCheck))

    @hseed(seed)
    @run_settings
    @given(case=config_cases())
    def configs(case: tuple[bytes, list[str]]) -> None:
        body, overrides = case
        path = workdir / "run.yaml"
        path.write_bytes(body)

        def one() -> tuple[str, str]:
            o = run_cli(["plan", "--config", str(path), "--world-size", "2", *overrides])
            return o.kind, f"{overrides} {body[:120]!r}: {o.detail}"
        count_one("configs", one)

    paths = {"config": "tiny.yaml", "run": "run", "export": "export", "data": "data.parquet", "folder": "mine",
             "missing": "nope"}

    @hseed(seed)
    @run_settings
    @given(argv=argv_cases(paths))
    def command_lines(argv: list[str]) -> None:
        work = workdir / "argv"
        shutil.rmtree(work, ignore_errors=True)
        shutil.copytree(box, work)
        cwd = os.getcwd()
        os.chdir(work)
        try:
            before = snapshot(work)

            def one() -> tuple[str, str]:
                o = run_cli(argv)
                lost = lost_files(before, snapshot(work), ["run", "export", "data.parquet"] if "--overwrite" in argv
                                  else [])
                return ("lost" if lost else o.kind), f"ember {' '.join(argv)}: {lost[:3] or o.detail}"
            count_one("command_lines", one)
        finally:
            os.chdir(cwd)

    configs()
    command_lines()

    try:
        server = LocalServer.for_export(box / "export", log_level="critical")
    except ImportError:
        tally["scoring_api"] = {"skipped (no fastapi/uvicorn)": 1}
    else:
        leaf = st.one_of(st.none(), st.booleans(), st.integers(-(2 ** 70), 2 ** 70), st.floats(), st.text(max_size=8))
        anyjson = st.recursive(leaf, lambda kids: st.one_of(st.lists(kids, max_size=3),
                                                            st.dictionaries(st.text(max_size=6), kids, max_size=4)),
                               max_leaves=12)
        row = st.dictionaries(st.sampled_from(["dense_0", "dense_1", "cat_0", "cat_1", "cat_2", "label", "typo"]),
                              anyjson, max_size=6)
        with server:
            @hseed(seed)
            @run_settings
            @given(body=st.one_of(anyjson, st.fixed_dictionaries({"rows": st.lists(row, max_size=3)})))
            def scoring(body: Any) -> None:
                def one() -> tuple[str, str]:
                    status, text = server.post("/score", json.dumps(body, allow_nan=True).encode())
                    kind = "5xx" if status >= 500 else "200" if status == 200 else "4xx"
                    return kind, f"{body!r}: {status} {text[:200]}"
                count_one("scoring_api", one)

            scoring()
    return {"tally": tally, "examples": examples}

