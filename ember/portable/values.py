"""Input values as ember's training read them, in plain Python (no pyarrow, no torch): the
canonical value rules (``canonical_value``: the one definition, which ``ember.featurize.canonical``
serves ember's own server and ``ember predict`` with) and the number / integer syntax of
``ember.featurize.transforms`` (``parse_float``, ``parse_int``: per value, where the featurizer
parses Arrow arrays; tested equal).

A value sent at scoring time is first brought to its column's type in training (the export's
``input_types``): ``"int"`` (4, 4.0, "4", " 4 " are the ID 4; text is read as training reads a
file's text, decimal digits: "4.0", "+4", "1e3" and "NaN" are no integer IDs there, so not
here either), ``"string"`` (a number becomes
the text a CSV file holds for it: 4 and 4.0 are "4", 4.5 is "4.5"), ``"bool"``, ``"float"``,
``"list<...>"`` or ``"unknown"`` (text). None is a missing value.

Example:
    >>> [canonical_value(v, "int") for v in (4, 4.0, "4", " 4 ", None)]
    [4, 4, 4, 4, None]
    >>> [canonical_value(v, "string") for v in (4, 4.0, "4.0", 4.5)]
    ['4', '4', '4.0', '4.5']
    >>> parse_float(" 2.5 "), parse_float(""), parse_int(" 7 ")
    (2.5, None, 7)
"""

from __future__ import annotations

import math
import re
from typing import Any, Sequence

__all__ = ["canonical_value", "parse_float", "parse_int", "listed_ints", "BadInput", "shown"]

_EXACT = 2**53  # floats are exact integers up to here
_NUMBER_TEXT = re.compile(r"^[-+]?((\d+\.?\d*|\.\d+)([eE][-+]?\d+)?|(?i:nan|inf|infinity))$", re.ASCII)
_NUMBER = _NUMBER_TEXT  # the featurizer's number syntax (Arrow's regex: ASCII digits)
_INTEGER = re.compile(r"^-?\d{1,19}$", re.ASCII)


class BadInput(ValueError):
    """A value the export cannot score: names the row (0-based index in the request, or the
    file's 1-based line), the column and the reason."""


def shown(v: Any, limit: int = 80) -> str:
    """``repr(v)`` for an error message, cut to about ``limit`` characters: a request may send a
    megabyte of text, or an integer of thousands of digits (whose repr Python refuses).

    Example:
        >>> shown("ab"), shown(10**5000), shown("x" * 200, 10)
        ("'ab'", 'an integer of 5001 digits', "'xxxxxxx...")
    """
    try:
        r = repr(v)
    except ValueError:  # (more digits than sys.get_int_max_str_digits)
        return f"an integer of {_digits(v)} digits"
    return r if len(r) <= limit else r[: limit - 2] + "..."


def _digits(v: int) -> int:
    """The decimal digits of ``abs(v)``, without converting it to text."""
    n, d = abs(v), int(abs(v).bit_length() * 0.30102999566398120)
    return d + 1 if n >= 10**d else max(d, 1)


def _text(v: str) -> str:
    """``v``, when it is Unicode text (what a file can hold): JSON's "\\ud800" escape gives a lone
    surrogate, which is not; ValueError then."""
    if not v.isascii():
        try:
            v.encode("utf-8")
        except UnicodeEncodeError:
            raise ValueError("text holding a lone UTF-16 surrogate (e.g. from a \\ud800 escape), which is not "
                             "Unicode text") from None
    return v


def _as_float(v: int | float) -> float:
    """``float(v)``; ValueError for an integer past the float range (Python's OverflowError)."""
    try:
        return float(v)
    except OverflowError:
        raise ValueError(f"{shown(v)} is beyond the range of a float") from None


def _kind(v: Any) -> str:
    return "a boolean" if isinstance(v, bool) or type(v).__name__ == "bool_" else "a list" if isinstance(v, (list, tuple)) \
        else "an object" if isinstance(v, dict) else type(v).__name__


def canonical_value(v: Any, type: str, missing: Sequence[str] = (), separator: str | None = None) -> Any:
    """``v`` (a JSON / Python scalar) as a column of ``type`` holds it; None when missing.
    Raises ValueError with the reason otherwise (``ember.featurize.canonical.canonical_value``)."""
    if v is None:
        return None
    if type.startswith("list<"):
        if isinstance(v, str) and separator is not None:
            v = v.split(separator)
        if not isinstance(v, (list, tuple)):
            raise ValueError(f"{_kind(v)} where a list belongs (the column was a list column in training)")
        return [canonical_value(e, type[5:-1], missing) for e in v]
    if hasattr(v, "item") and not isinstance(v, (list, tuple, dict, str)):  # a numpy scalar
        v = v.item()
    what = {"int": "an integer ID", "string": "a string ID", "bool": "a boolean", "float": "a number",
            "unknown": "a value"}[type]
    if isinstance(v, bool) != (type == "bool") or isinstance(v, (list, tuple, dict)) or not isinstance(v, (bool, int, float, str)):
        raise ValueError(f"{_kind(v)} where {what} belongs")
    if isinstance(v, str) and _text(v) in missing:
        return None
    if type == "bool" or type == "unknown":
        return v if type == "bool" else str(v)
    if type == "string":
        return v if isinstance(v, str) else _decimal(v)
    if isinstance(v, str) and type == "int":  # text: as a file's text is read in training (parse_int)
        return parse_int(v)
    if isinstance(v, str):
        s = v.strip()
        if not s:
            return None
        if _NUMBER_TEXT.fullmatch(s):
            v = float(s)
        else:
            raise ValueError(f"{shown(v)} is not {what}")
    if type == "float":
        x = _as_float(v)
        if math.isinf(x):
            raise ValueError(f"{shown(v)} is not a finite number")
        return x
    if isinstance(v, float):
        if math.isnan(v):
            return None
        if not math.isfinite(v) or v != int(v):
            raise ValueError(f"{v!r} is not an integer, and this column holds integer IDs")
        if abs(v) > _EXACT:
            raise ValueError(f"{v!r} is beyond 2**53, where a float is not exactly one integer; send the ID as an "
                             "integer or a string")
        v = int(v)
    if not -(2**63) <= v < 2**63:
        raise ValueError(f"{shown(v)} is outside the int64 range of integer IDs")
    return v


def _decimal(v: int | float) -> str:
    if isinstance(v, int):
        try:
            return str(v)
        except ValueError:  # (more digits than Python turns into text: no file could hold it either)
            raise ValueError(f"{shown(v)} is too long to be a string ID") from None
    if not math.isfinite(v):
        raise ValueError(f"{v!r} is not a finite number, and cannot be a string ID")
    return str(int(v)) if v == int(v) and abs(v) <= _EXACT else repr(v)


def parse_float(v: Any) -> float | None:
    """A dense value, weight or number as the featurizer reads it: None when missing (None, an
    empty or blank string, NaN); ValueError when not a finite decimal number."""
    if v is None:
        return None
    if isinstance(v, str):
        s = v.strip()
        if not s:
            return None
        if not _NUMBER.match(s):
            raise ValueError(f"{shown(v)} is not a number")
        x = float(s)
    elif isinstance(v, (bool, int, float)):
        x = _as_float(v)
    else:
        raise ValueError(f"{_kind(v)} where a number belongs")
    if math.isnan(x):
        return None
    if math.isinf(x):
        raise ValueError(f"{shown(v)} is not a finite number")
    return x


def parse_int(v: Any) -> int | None:
    """An integer ID of a ``hash_ids: false`` feature: None when missing (None, empty or blank);
    ValueError when not a decimal int64."""
    if v is None:
        return None
    if isinstance(v, bool):
        raise ValueError("a boolean where an integer ID belongs")
    if isinstance(v, int):
        return v
    if not isinstance(v, str):
        raise ValueError(f"{_kind(v)} where an integer ID belongs")
    s = v.strip()
    if not s:
        return None
    if not _INTEGER.match(s) or not -(2**63) <= int(s) < 2**63:
        raise ValueError(f"{shown(v)} is not an integer ID")
    return int(s)


def listed_ints(missing: Sequence[str]) -> set[int]:
    """The entries of ``missing_values`` that also match integer IDs (``"-1"`` matches -1)."""
    return {int(m) for m in missing if _INTEGER.match(m.strip()) and -(2**63) <= int(m) < 2**63}
