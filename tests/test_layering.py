"""Imports point one way, from the ground up (read from the source with ``ast``; nothing is imported).

A module may import from its own layer and from the layers below it, never from one above,
whether the import sits at module level or inside a function. The run config
(``ember.config``) composes the data / schema / embedding / model / train sections, so it sits
above them and just below the trainer that consumes it. Also checked here: ``import ember`` is
cheap (a handful of modules, no torch) and still tunes libgomp before torch loads.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import ember

PACKAGE = Path(ember.__file__).resolve().parent  # the ember under test (this checkout's, with PYTHONPATH)
ROOT = PACKAGE.parent

# Lowest first. A layer is one or more module prefixes; a module belongs to the layer of its
# longest matching prefix. Every module under ember/ must belong to one (a new package has to be
# placed here on purpose).
LAYERS: list[tuple[str, ...]] = [
    ("ember.errors", "ember.config_base", "ember._native", "ember._ember_native", "ember.mix", "ember.fileio",
     "ember.allocator", "ember.outputs", "ember.process_exit", "ember.once",
     "ember.portable"),  # the portable runtime: numpy + onnxruntime, no other part of ember (test_portable_is_alone)
    ("ember.batch",),
    ("ember.source",),
    ("ember.featurize",),
    ("ember.tiers", "ember.optim"),
    ("ember.embedding",),
    ("ember.models",),
    ("ember.pipeline",),
    ("ember.checkpoint",),
    ("ember.distributed",),  # sharded lookups over torch.distributed: below the run config that composes its section
    ("ember.train.config",),  # the run config's `train` section: composed by ember.config
    ("ember.config",),  # the run config: above the sections it composes
    ("ember.train",),  # builder, loop, evaluate: take a RunConfig
    ("ember.serving",),
    ("ember.cli", "ember.__main__"),
    ("ember", "ember.testing"),  # the package facade (lazy re-exports) and test helpers: may import anything
]

# Pairs the order alone allows but that must not exist: serving loads an export without the
# training code or the run config.
FORBIDDEN: dict[str, tuple[str, ...]] = {
    "ember.serving": ("ember.config", "ember.train"),
    "ember.checkpoint": ("ember.config", "ember.train"),
}

MAX_MODULES_ON_IMPORT = 8


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_module(name: str) -> bool:
    """Whether ``name`` (dotted, under ember) is a module or package in the source tree."""
    base = ROOT.joinpath(*name.split("."))
    return base.with_suffix(".py").exists() or (base / "__init__.py").exists() or any(base.parent.glob(base.name + ".*.so"))


def _layer_of(module: str) -> int | None:
    best: tuple[int, int] | None = None  # (prefix length, layer)
    for i, prefixes in enumerate(LAYERS):
        for p in prefixes:
            if (module == p or module.startswith(p + ".")) and (best is None or len(p) > best[0]):
                best = (len(p), i)
    return None if best is None else best[1]


def _layer_name(i: int) -> str:
    return "/".join(p.removeprefix("ember.") for p in LAYERS[i])


def _imports(path: Path) -> list[tuple[int, str]]:
    """(line, imported ember module) for every import in ``path``, at any depth."""
    me = _module_name(path)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    out: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            for a in node.names:
                sub = f"{module}.{a.name}"
                out.append((node.lineno, sub if a.name != "*" and _is_module(sub) else module))
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            fn = node.func
            name = fn.attr if isinstance(fn, ast.Attribute) else fn.id if isinstance(fn, ast.Name) else ""
            if name in ("import_module", "__import__") and isinstance(node.args[0].value, str):
                out.append((node.lineno, node.args[0].value))
    return list(dict.fromkeys((line, m) for line, m in out if m == "ember" or m.startswith("ember.")))


def _sources() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def test_every_module_has_a_layer():
    unplaced = [_module_name(p) for p in _sources() if _layer_of(_module_name(p)) is None]
    assert not unplaced, f"modules in no layer: {unplaced}; add their package to LAYERS in {__file__}"


def test_imports_point_down():
    bad = []
    for path in _sources():
        me = _module_name(path)
        mine = _layer_of(me)
        if mine is None:
            continue  # reported by test_every_module_has_a_layer
        for line, target in _imports(path):
            theirs = _layer_of(target)
            if theirs is not None and theirs > mine:
                bad.append(f"{path.relative_to(ROOT)}:{line}: {me} (layer {_layer_name(mine)}) imports "
                           f"{target} (layer {_layer_name(theirs)}, higher)")
    assert not bad, "imports from a higher layer:\n" + "\n".join(bad)


def test_forbidden_imports():
    bad = []
    for path in _sources():
        me = _module_name(path)
        for owner, banned in FORBIDDEN.items():
            if me != owner and not me.startswith(owner + "."):
                continue
            for line, target in _imports(path):
                if any(target == b or target.startswith(b + ".") for b in banned):
                    bad.append(f"{path.relative_to(ROOT)}:{line}: {me} imports {target} ({owner} must not import {banned})")
    assert not bad, "\n".join(bad)


def test_portable_is_alone():
    """ember.portable runs in a serving image without torch or ember's training code: it imports
    only itself (the no-torch run is tests/portable/test_no_torch.py)."""
    bad = [f"{path.relative_to(ROOT)}:{line}: imports {target}" for path in _sources()
           if _module_name(path).startswith("ember.portable")
           for line, target in _imports(path) if not target.startswith("ember.portable")]
    assert not bad, "\n".join(bad)


def test_layer_order_is_what_the_docs_promise():
    order = [_layer_of(m) for m in ("ember.errors", "ember.batch", "ember.source", "ember.featurize", "ember.tiers",
                                    "ember.embedding", "ember.models", "ember.pipeline", "ember.checkpoint",
                                    "ember.train.config", "ember.config", "ember.train.loop", "ember.serving", "ember.cli")]
    assert order == sorted(order) and len(set(order)) == len(order)
    assert _layer_of("ember.tiers.host") == _layer_of("ember.optim.adam")
    assert _layer_of("ember.mix") == _layer_of("ember._native") == _layer_of("ember.config_base") == 0


def test_the_scanner_sees_function_level_and_relative_imports(tmp_path, monkeypatch):
    fake = tmp_path / "ember"
    (fake / "featurize").mkdir(parents=True)
    (fake / "embedding").mkdir()
    for f in ("__init__.py", "featurize/__init__.py", "embedding/__init__.py", "embedding/config.py", "errors.py"):
        (fake / f).write_text("")
    (fake / "featurize" / "x.py").write_text(
        "import ember.errors\n"
        "def f():\n"
        "    from ember.embedding import config\n"
        "    from ..embedding.config import FeatureConfig\n"
        "    import importlib; importlib.import_module('ember.embedding')\n"
    )
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    assert _imports(fake / "featurize" / "x.py") == [
        (1, "ember.errors"), (3, "ember.embedding.config"), (4, "ember.embedding.config"), (5, "ember.embedding"),
    ]


def _run(code: str, env: dict[str, str] | None = None) -> dict:
    base = {k: v for k, v in os.environ.items() if k not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")}
    base["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
    proc = subprocess.run([sys.executable, "-c", code], env={**base, **(env or {})}, cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


_REPORT = (
    "import json, os, sys; print(json.dumps({'file': ember.__file__, 'torch': 'torch' in sys.modules, "
    "'gomp': os.environ.get('GOMP_SPINCOUNT'), 'mods': sorted(m for m in sys.modules if m.startswith('ember'))}))"
)


def test_import_ember_is_light_and_sets_gomp_spincount():
    r = _run("import ember; " + _REPORT)
    assert Path(r["file"]).resolve() == PACKAGE / "__init__.py"
    assert len(r["mods"]) <= MAX_MODULES_ON_IMPORT, f"`import ember` loaded {len(r['mods'])} ember modules: {r['mods']}"
    assert not r["torch"], "`import ember` loaded torch; keep ember/__init__.py lazy"
    assert r["gomp"] == "10000"


def test_gomp_spincount_is_set_before_torch_loads_through_ember():
    # an audit hook sees the moment torch starts importing; the variable must be in place by then
    code = (
        "import os, sys\n"
        "seen = []\n"
        "def hook(event, args):\n"
        "    if event == 'import' and args[0] == 'torch' and not seen:\n"
        "        seen.append(os.environ.get('GOMP_SPINCOUNT'))\n"
        "sys.addaudithook(hook)\n"
        "from ember.batch import Batch\n"
        "import ember\n"
        "from ember import EmbeddingCollection\n"
        "import json; print(json.dumps({'seen': seen, 'torch': 'torch' in sys.modules}))\n"
    )
    r = _run(code)
    assert r["torch"] and r["seen"] == ["10000"]


def test_gomp_spincount_left_alone_when_torch_came_first_or_the_user_chose():
    assert _run("import torch, ember; " + _REPORT)["gomp"] is None
    assert _run("import ember; " + _REPORT, {"OMP_WAIT_POLICY": "active"})["gomp"] is None
    assert _run("import ember; " + _REPORT, {"GOMP_SPINCOUNT": "5"})["gomp"] == "5"


def test_lazy_exports():
    r = _run(
        "import ember, json, sys\n"
        "names = sorted(set(ember.__all__) - {'SparseOptimizer'})\n"
        "got = {n: getattr(ember, n).__module__ for n in names}\n"
        "print(json.dumps({'got': got, 'dir': sorted(set(ember.__all__) - set(dir(ember))), "
        "'sub': ember.featurize.__name__}))\n"
    )
    assert r["dir"] == []
    assert r["got"]["Batch"].startswith("ember.batch") and r["got"]["EmbeddingCollection"].startswith("ember.embedding")
    assert r["sub"] == "ember.featurize"  # submodules still reachable as attributes, as with the eager import
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        ember.nope  # noqa: B018
