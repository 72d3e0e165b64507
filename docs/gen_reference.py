"""Generate the configuration and CLI references from the code: the pydantic schema of
``ember.config.RunConfig`` (each field's attribute docstring) and ``ember.cli.build_parser()``.

The docs build runs this through ``docs/hooks.py``; ``python docs/gen_reference.py`` prints both.
``undocumented_fields()`` and ``options_without_help()`` are what ``tests/test_docs.py`` checks.
"""

from __future__ import annotations

import argparse
import inspect
import re
import types
import typing
from pathlib import Path
from typing import Any, Callable, Iterator

import sys

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

# This checkout's ember, not an installed one: the references describe the code beside them.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ember.cli import build_parser  # noqa: E402
from ember.config import MOVED_KEYS, RunConfig  # noqa: E402

__all__ = ["config_reference", "cli_reference", "undocumented_fields", "options_without_help", "write_references",
           "REFERENCES"]

DOCS = Path(__file__).resolve().parent


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    """The config models an annotation holds (``X | None``, ``list[X]``, a union of model types)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    out: list[type[BaseModel]] = []
    for arg in typing.get_args(annotation):
        out += [m for m in _models_in(arg) if m not in out]
    return out


def _type_name(annotation: Any) -> str:
    if annotation is type(None):
        return "null"
    origin = typing.get_origin(annotation)
    if origin is typing.Literal:
        return " \\| ".join(f"`{a}`" if not isinstance(a, bool) else f"`{str(a).lower()}`" for a in typing.get_args(annotation))
    if origin in (typing.Union, types.UnionType):
        return " \\| ".join(dict.fromkeys(_type_name(a) for a in typing.get_args(annotation)))
    if origin is typing.Annotated:
        return _type_name(typing.get_args(annotation)[0])
    if origin in (list, tuple):
        args = [a for a in typing.get_args(annotation) if a is not Ellipsis]
        return f"list[{', '.join(_type_name(a) for a in args)}]"
    if origin is dict:
        k, v = typing.get_args(annotation)
        return f"map[{_type_name(k)}, {_type_name(v)}]"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "section"
    return getattr(annotation, "__name__", str(annotation)).replace("NoneType", "null")


def _default(field: Any) -> str:
    if field.is_required():
        return "required"
    value = field.default_factory() if field.default is PydanticUndefined else field.default
    if isinstance(value, BaseModel):
        return "(section)"
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, (list, dict)) and not value:
        return f"`{value}`"
    return f"`{value}`"


def _markdown(text: str) -> str:
    """A docstring's reStructuredText bits as Markdown, on one line, safe in a table cell."""
    text = re.sub(r":(?:mod|class|func|meth|attr):`~?([^`]+)`", r"`\1`", " ".join(text.split()))
    return text.replace("``", "`").replace("|", "\\|")


def _key(name: str, field: Any) -> str:
    return field.alias or name


def _removed(field: Any) -> bool:
    """A removed key (declared ``name: None = None`` so that setting it says what replaced it)."""
    return field.annotation is type(None)


def _walk(model: type[BaseModel], path: str, seen: set | None = None) -> Iterator[tuple[str, type[BaseModel]]]:
    """(path, model) of every section under ``model``, depth first, each model class once (where
    it first appears: ``tables[].optimizer`` has the keys shown under ``embedding.optimizer``); a
    union of models (model types, optimizers) yields one section per member, ``(type: ...)``."""
    seen = set() if seen is None else seen
    if model in seen:
        return
    seen.add(model)
    yield path, model
    for name, field in model.model_fields.items():
        if _removed(field):
            continue
        key = _key(name, field)
        sub = _models_in(field.annotation)
        many = typing.get_origin(field.annotation) is list or any(
            typing.get_origin(a) is list for a in typing.get_args(field.annotation))
        for m in sub:
            tag = ""
            if len(sub) > 1 and "type" in m.model_fields:
                tag = f" (type: {m.model_fields['type'].default})"
            yield from _walk(m, f"{path}.{key}{'[]' if many else ''}{tag}".lstrip("."), seen)


def _paths(model: type[BaseModel], path: str, acc: dict, stack: tuple = ()) -> dict[type, list[str]]:
    """Every path at which each model class appears (``(type: ...)`` tags dropped), in order."""
    if model in stack:
        return acc
    plain = re.sub(r" \(type: [^)]*\)", "", path)
    if plain not in acc.setdefault(model, []):
        acc[model].append(plain)
    for name, field in model.model_fields.items():
        if _removed(field):
            continue
        many = typing.get_origin(field.annotation) is list or any(
            typing.get_origin(a) is list for a in typing.get_args(field.annotation))
        for m in _models_in(field.annotation):
            _paths(m, f"{path}.{_key(name, field)}{'[]' if many else ''}".lstrip("."), acc, (*stack, model))
    return acc


def _title(path: str, model: type[BaseModel], where: list[str]) -> str:
    """A section's heading: its path, or for a section used in several places its own name."""
    if not path:
        return "Top level"
    if len(where) == 1:
        return f"`{where[0]}`" + (f" ({m.group(1)})" if (m := re.search(r"\((type: [^)]*)\)$", path)) else "")
    lasts = {w.rsplit(".", 1)[-1] for w in where}
    name = f"`{lasts.pop()}`" if len(lasts) == 1 else model.__name__.removesuffix("Config")
    tag = re.search(r"\((type: [^)]*)\)$", path)
    return name + (f" ({tag.group(1)})" if tag else "")


def config_reference() -> str:
    """Markdown: one table per config section, every key with its type, default and doc."""
    lines = [
        "# Configuration reference",
        "",
        "Generated from the code (`ember.config.RunConfig` and the sections it composes) by",
        "`docs/gen_reference.py` each time the docs are built (never edit it by hand): what you read here is the schema",
        "ember validates against. Every key can be set in the YAML file or on the command line as",
        "`key.path=value`. Unknown keys and bad values are errors that name the key.",
        "A section used in several places (an optimizer, a `schedule`, `storage`, an MLP) is shown",
        "once, with the places it is used at.",
        "",
    ]
    where = _paths(RunConfig, "", {})
    for path, model in _walk(RunConfig, ""):
        lines += [f"## {_title(path, model, where[model])}", ""]
        if len(where[model]) > 1:
            lines += ["Used at " + ", ".join(f"`{w}`" for w in where[model]) + ".", ""]
        doc = re.split(r"\n\s*Examples?:", inspect.cleandoc(model.__doc__ or ""))[0].strip()
        if doc and path:
            lines += [_markdown(doc), ""]
        lines += ["| key | type | default | meaning |", "|---|---|---|---|"]
        for name, field in model.model_fields.items():
            if _removed(field):
                continue
            desc = _markdown(field.description or "")
            lines.append(f"| `{_key(name, field)}` | {_type_name(field.annotation)} | {_default(field)} | {desc} |")
        lines.append("")
    lines += ["## Keys that moved", "",
              "Keys now live in the section of their concern. A config (or a checkpoint's recorded config) that uses an",
              "old name still works: the run logs once what to write instead. Setting both names to different values",
              "is an error.", "", "| old name | write instead |", "|---|---|"]
    lines += [f"| `{old}` | `{new}` |" for old, new in MOVED_KEYS.items()]
    lines.append("")
    return "\n".join(lines)


def undocumented_fields() -> list[str]:
    """Every config key (removed ones included) whose field carries no doc."""
    out = []
    for path, model in _walk(RunConfig, ""):
        for name, field in model.model_fields.items():
            if not (field.description or "").strip():
                out.append(f"{path}.{_key(name, field)}".lstrip("."))
    return sorted(set(out))


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def options_without_help() -> list[str]:
    """``command --flag`` (or a positional) of every CLI option that has no help text."""
    out = []
    for name, sub in _subparsers(build_parser()).items():
        for action in sub._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            if not (action.help or "").strip():
                out.append(f"{name} {'/'.join(action.option_strings) or action.dest}")
    return out


def cli_reference() -> str:
    """Markdown: ``ember --help`` and every command's ``--help``, as a 100-column terminal prints them."""
    import os

    columns = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "100"  # argparse wraps at the terminal's width: fix it
    try:
        return _cli_reference()
    finally:
        if columns is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = columns


def _cli_reference() -> str:
    parser = build_parser()
    lines = [
        "# CLI reference",
        "",
        "Generated from `ember.cli.build_parser()` by `docs/gen_reference.py` each time the docs",
        "are built (never edit it by hand): this is what `ember --help` and `ember COMMAND --help` print. `ember` is also",
        "`python -m ember`.",
        "",
        "```text",
        parser.format_help().rstrip(),
        "```",
        "",
    ]
    for name, sub in _subparsers(parser).items():
        lines += [f"## `ember {name}`", "", "```text", sub.format_help().rstrip(), "```", ""]
    return "\n".join(lines)


# Generated page (under docs/) -> the function that writes it.
REFERENCES: dict[str, Callable[[], str]] = {"reference/config.md": config_reference, "reference/cli.md": cli_reference}


def write_references() -> None:
    """Write the generated pages under docs/ (only those whose text changed)."""
    for rel, make in REFERENCES.items():
        path = DOCS / rel
        text = make()
        if not path.exists() or path.read_text() != text:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)


if __name__ == "__main__":
    write_references()
    print("wrote " + ", ".join(f"docs/{rel}" for rel in REFERENCES))
