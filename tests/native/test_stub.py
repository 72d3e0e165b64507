"""ember/_ember_native.pyi matches the extension: its C source always, the built module when there is one."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from ember import _native

PACKAGE = Path(_native.__file__).parent.parent  # ember/ (the wrappers: ember/_native/, one module per kernel family)
C_SOURCE = PACKAGE / "_csrc" / "ember_native.c"
STUB = PACKAGE / "_ember_native.pyi"
WRAPPER = {"rowwise_adagrad": "rowwise_adagrad_"}  # wrappers whose name differs from the kernel's (in place: _)


def _method_table() -> dict[str, tuple[str, str]]:
    """name -> (C function, docstring) of every entry of the extension's PyMethodDef table."""
    src = C_SOURCE.read_text()
    table = src[src.index("static PyMethodDef methods[]") :]
    table = table[: table.index("\n};")]
    entries = re.findall(r'\{"(\w+)",\s*(\w+),\s*METH_VARARGS,\s*"([^"]*)"\}', table)
    assert len(entries) == table.count("METH_"), "an entry of the method table is not METH_VARARGS with a docstring"
    return {name: (fn, doc) for name, fn, doc in entries}


def _doc_params(name: str, doc: str) -> tuple[list[str], int]:
    """Argument names and how many are required, from a docstring "name(a, b, c=1) -> result"."""
    m = re.fullmatch(r"(\w+)\(([^)]*)\) -> .+", doc)
    assert m and m.group(1) == name, f"docstring of {name} is not 'name(args) -> result': {doc!r}"
    params = [p.strip() for p in m.group(2).split(",")]
    return [p.split("=")[0] for p in params], sum("=" not in p for p in params)


def _parse_arity(c_function: str) -> tuple[int, int]:
    """(required, total) arguments of the PyArg_ParseTuple format in the C function."""
    src = C_SOURCE.read_text()
    body = src[src.index(f"static PyObject *{c_function}(PyObject *self, PyObject *args)") :]
    fmt = re.search(r'PyArg_ParseTuple\(args, "([^"]*)"', body).group(1)  # type: ignore[union-attr]
    required = total = 0
    optional = False
    for ch in re.split(r"[:;]", fmt)[0]:
        if ch == "|":
            optional = True
        elif ch.isalpha():  # one argument per letter; * # ! & modify the one before
            total += 1
            required += not optional
    return required, total


def _stub() -> dict[str, ast.FunctionDef]:
    tree = ast.parse(STUB.read_text())
    return {node.name: node for node in tree.body if isinstance(node, ast.FunctionDef)}


def test_stub_names_every_function_of_the_method_table():
    assert set(_stub()) == set(_method_table())


@pytest.mark.parametrize("name", sorted(_method_table()))
def test_stub_signature_matches_the_c_docstring_and_argument_parsing(name):
    c_function, doc = _method_table()[name]
    names, required = _doc_params(name, doc)
    assert _parse_arity(c_function) == (required, len(names)), f"docstring of {name} disagrees with its PyArg_ParseTuple"
    fn = _stub()[name].args
    assert not fn.args and not fn.kwonlyargs and fn.vararg is None and fn.kwarg is None, f"{name}: arguments are positional-only"
    assert [a.arg for a in fn.posonlyargs] == names
    assert len(fn.posonlyargs) - len(fn.defaults) == required


@pytest.mark.parametrize("name", sorted(_method_table()))
def test_every_kernel_has_one_wrapper_and_a_fallback_next_to_it(name):
    wrapper = WRAPPER.get(name, name)
    assert wrapper in _native.__all__ and callable(getattr(_native, wrapper))
    assert callable(getattr(_native, f"_{name}_py"))
    module = getattr(_native, wrapper).__module__  # its family's module; the fallback beside it
    assert module.startswith("ember._native.") and getattr(_native, f"_{name}_py").__module__ == module
    src = (PACKAGE / "_native" / f"{module.rsplit('.', 1)[1]}.py").read_text()
    at, fallback = src.index(f"\ndef {wrapper}("), src.index(f"\ndef _{name}_py(")
    between = src[at + 1 : fallback]
    assert at < fallback and between.count("\ndef ") == 0, f"_{name}_py must follow {wrapper} directly"


@pytest.mark.skipif(not _native.is_available(), reason="ember native core not available (not built, or EMBER_NATIVE=0)")
def test_stub_matches_the_built_module():
    core = _native.require()
    callables = {n for n in dir(core) if not n.startswith("__") and callable(getattr(core, n))}
    assert callables == set(_stub())
    for name, (_, doc) in _method_table().items():
        assert getattr(core, name).__doc__ == doc, f"{name}: the built module is older than its source (rebuild)"
