"""Base for every config class: frozen, unknown keys rejected, errors say what is allowed."""

from __future__ import annotations

import difflib
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError, field_validator

from ember.errors import ConfigError

__all__ = ["ConfigModel", "deep_merge", "format_validation_error", "removed_key"]


class ConfigModel(BaseModel):
    """Frozen pydantic model; YAML is only its serialisation.

    Every field carries its doc as an attribute docstring (the line under it): pydantic reads it
    into the field's ``description``, and the configuration reference is generated from there.
    No number is NaN or infinite (YAML's ``.nan`` / ``.inf``): a NaN fill or standardize made
    every score NaN, an infinite rate or bound means nothing a run can do; an unbounded side is
    written as null where a key allows it.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True, allow_inf_nan=False)

    @classmethod
    def parse(cls, data: Any, where: str = "") -> Any:
        """Validate ``data``; raise ConfigError naming the key, the problem and what is allowed."""
        try:
            return cls.model_validate(data)
        except ValidationError as e:
            raise ConfigError(format_validation_error(e, cls, where)) from None


def deep_merge(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    """``base`` with ``top`` laid over it: nested dicts merge key by key, anything else in ``top``
    replaces. Neither argument is changed. The one merge of config layers (presets, defaults,
    overrides).

    >>> deep_merge({"csv": {"header": False, "delimiter": ","}, "format": "csv"}, {"csv": {"delimiter": ";"}})
    {'csv': {'header': False, 'delimiter': ';'}, 'format': 'csv'}
    """
    out = dict(base)
    for k, v in top.items():
        out[k] = deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def removed_key(name: str, message: str) -> Any:
    """A validator for a key that was removed (declare it as ``name: None = None``): setting it
    is an error saying ``message`` (what replaced it), instead of a bare "unknown key"."""

    def check(cls: type, v: object) -> None:
        if v is not None:
            raise ValueError(message)
        return None

    return field_validator(name, mode="before")(classmethod(check))


def _fields_at(cls: type[BaseModel], loc: tuple) -> list[str]:
    """Allowed field names of the nested model at ``loc`` (best effort, for 'did you mean')."""
    model: Any = cls
    for part in loc:
        if isinstance(part, int) or model is None:
            continue
        fields = getattr(model, "model_fields", {})
        field = fields.get(part) or next((f for f in fields.values() if f.alias == part), None)
        if field is None:
            return []
        ann = field.annotation
        model = None
        for cand in [ann, *getattr(ann, "__args__", ())]:
            for c in [cand, *getattr(cand, "__args__", ())]:
                if isinstance(c, type) and issubclass(c, BaseModel):
                    model = c
                    break
            if model is not None:
                break
    # a field's name as written in YAML: its alias where it has one (``schema``, not ``schema_``)
    return [f.alias or name for name, f in getattr(model, "model_fields", {}).items()]


def format_validation_error(err: ValidationError, cls: type[BaseModel], where: str = "") -> str:
    lines = []
    for e in err.errors():
        loc = tuple(e["loc"])
        key = ".".join(str(p) for p in loc) or "<root>"
        if where:
            key = f"{where}.{key}" if key != "<root>" else where
        if e["type"] == "extra_forbidden":
            allowed = _fields_at(cls, loc[:-1])
            hint = difflib.get_close_matches(str(loc[-1]), allowed, n=1)
            msg = f"unknown key '{key}'"
            if hint:
                msg += f" (did you mean '{hint[0]}'?)"
            if allowed:
                msg += f"; allowed keys here: {', '.join(allowed)}"
        else:
            cause = (e.get("ctx") or {}).get("error")
            if isinstance(cause, ConfigError):  # a section parsed on its own: its message names its keys
                lines.append(str(cause).removeprefix("invalid config: "))
                continue
            text = e["msg"].removeprefix("Value error, ")
            msg = f"'{key}': {text}" if "got " in text else f"'{key}': {text} (got {e.get('input')!r})"
        lines.append(msg)
    return "invalid config: " + "; ".join(lines)
