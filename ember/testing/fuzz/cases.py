"""The seeded case generators: damaged CSV, Parquet and ORC files, and checkpoint faults, each
kind drawn from its own ``default_rng([seed, index])`` so any case is rebuilt alone."""

from __future__ import annotations

import gzip
import io
from typing import Any, Callable, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.orc as orc
import pyarrow.parquet as pq

from ember.testing.fuzz.case import COLUMNS, Case


_TOKENS = ["a", "b7", "68fd1e64", "é", "中文", "x y", "-1", "0", "", "null", "NaN", "ab\"c", "tab-ish"]
_NUMBERS = ["3", "-2.5", ".5", "1e3", " 7 ", "", "0", "12345678901234", "+4", "2.", "-0", "1E-3", "nan"]
_BAD_NUMBERS = ["abc", "1.2.3", "1e", "--1", "inf", "-inf", "1e999", "0x1F", "1_000", "\u0661\u0662", "+-1",
                "\u221e", "NaN1", "1 2", "."]
_BAD_LABELS = ["2", "-1", "1.5", "nan", "inf", "", "yes", " ", "-0.1", "1e9", "true"]
_GOOD_LABELS = ["0", "1", "1.0", "0.0", " 1 ", "0.5"]
_BAD_UTF8 = [b"\xff", b"\xc3\x28", b"\x80abc", b"\xe2\x82", b"\xed\xa0\x80", b"ok\xfe"]


def _pick(rng: np.random.Generator, seq: list) -> Any:
    return seq[int(rng.integers(len(seq)))]


def _good_fields(rng: np.random.Generator) -> dict[str, str]:
    c2 = "|".join(_pick(rng, _TOKENS[:6]) for _ in range(int(rng.integers(0, 4))))
    return {"y": _pick(rng, _GOOD_LABELS), "I1": _pick(rng, _NUMBERS), "I2": str(int(rng.integers(-50, 50))),
            "C1": _pick(rng, _TOKENS), "C2": c2}


def _csv_case(kind: str, rng: np.random.Generator) -> Case:
    fmt = "tsv" if rng.random() < 0.4 else "csv"
    delim = "\t" if fmt == "tsv" else ","
    header = bool(rng.random() < 0.7)
    order = list(COLUMNS) + (["extra"] if rng.random() < 0.3 else [])
    if header:
        rng.shuffle(order)
    n = int(rng.integers(1, 160))
    lines: list[bytes] = []
    bad_idx: list[int] = []  # indices into lines
    planted = {"wrong_fields": 0, "bad_number": 0, "bad_label": 0, "bad_utf8": 0, "stray_quote": 0, "blank_line": 0}
    n_bad = int(rng.integers(1, min(6, n) + 1)) if kind in planted else 0
    bad_at = set(rng.choice(n, size=n_bad, replace=False).tolist()) if n_bad else set()
    huge_at = int(rng.integers(n)) if kind == "huge_line" else -1
    for i in range(n):
        f = _good_fields(rng)
        f["extra"] = "zz"
        raw: bytes | None = None
        if i == huge_at:
            f["C1"] = "h" * int(rng.integers(1 << 20, 3 << 20))  # 1-3 MiB in one field: a valid row
        if i in bad_at:
            if kind == "wrong_fields":
                cells = [f[c] for c in order]
                if rng.random() < 0.5 and len(cells) > 1:
                    cells = cells[: int(rng.integers(1, len(cells)))]
                else:
                    cells += ["x"] * int(rng.integers(1, 3))
                raw = delim.join(cells).encode()
            elif kind == "bad_number":
                f[_pick(rng, ["I1", "I2"])] = _pick(rng, _BAD_NUMBERS)
            elif kind == "bad_label":
                f["y"] = _pick(rng, _BAD_LABELS)
            elif kind == "stray_quote":
                f["C1"] = '"' + f["C1"].replace('"', "")  # opens a quoted value that never closes on its line
            elif kind == "bad_utf8":
                cells = [f[c].encode() if c != "C1" else f[c].encode() + _pick(rng, _BAD_UTF8) for c in order]
                raw = delim.encode().join(cells)
            elif kind == "blank_line":
                lines.append(b"")  # a blank line before this row: a row with no label
                bad_idx.append(len(lines) - 1)
        if raw is None:
            raw = delim.join(f[c] for c in order).encode()
        if i in bad_at and kind != "blank_line":
            bad_idx.append(len(lines))
        lines.append(raw)
    eol = b"\r\n" if rng.random() < 0.3 else b"\n"
    head = [delim.join(order).encode()] if header else []
    body = eol.join(head + lines)
    if rng.random() < 0.8 or (lines and lines[-1] == b""):
        body += eol
    offset = 2 if header else 1
    case = Case(kind=f"csv.{kind}", format=fmt, rows=len(lines), bad=len(bad_idx),
                bad_rows=[offset + i for i in bad_idx])
    case.data = {"csv": {"header": header, **({} if header else {"column_names": order})},
                 "read_rows": 64}
    case.data["csv"]["block_bytes"] = _pick(rng, [4096, 65536, 8 << 20])
    name = f"data.{fmt}"
    if kind == "gzip_truncated" or rng.random() < 0.1:
        packed = gzip.compress(body)
        name += ".gz"
        if kind == "gzip_truncated":
            case.original = packed
            case.checksummed = True
            cut = int(rng.integers(10, max(len(packed) - 1, 11)))
            packed = packed[:cut]
            case.rows = 0  # unknown: the reference read of the original says
        body = packed
    case.files = [(name, body)]
    case.policy = "skip" if (case.bad and rng.random() < 0.5) else "error"
    return case


def _csv_unreadable_case(kind: str, rng: np.random.Generator) -> Case:
    """Files no policy can read: empty, header only, blank lines only, a missing column, a
    header that is not UTF-8."""
    header = {"empty": b"", "header_only": b"y,I1,I2,C1,C2\n", "blank_only": b"\n\n\r\n",
              "missing_column": b"y,I1,C1,C2\n1,2,a,b\n", "utf8_header": b"y,I1,I2,C1\xff,C2\n1,2,3,a,b\n"}[kind]
    return Case(kind=f"csv.{kind}", format="csv", files=[("data.csv", header)], must_fail=True,
                policy=_pick(rng, ["error", "skip"]), data={"csv": {"header": True}},
                column="I2" if kind == "missing_column" else None)


def _columnar_table(rng: np.random.Generator, n: int) -> dict[str, pa.Array]:
    label_type = _pick(rng, ["int", "float", "string", "bool"])
    y = rng.integers(0, 2, n)
    labels = {"int": pa.array(y, pa.int64()), "float": pa.array(y.astype(float)),
              "string": pa.array([str(v) for v in y]), "bool": pa.array(y.astype(bool))}[label_type]
    i1 = rng.normal(size=n) * 10
    i1_null = rng.random(n) < 0.1
    c1 = [_pick(rng, _TOKENS) for _ in range(n)]
    cols = {
        "y": labels,
        "I1": pa.array(np.where(i1_null, np.nan, i1), mask=i1_null),
        "I2": pa.array(rng.integers(-100, 100, n), pa.int32()),
        "C1": pa.array(c1).dictionary_encode() if rng.random() < 0.3 else
        (pa.array(rng.integers(0, 1000, n), pa.int64()) if rng.random() < 0.3 else pa.array(c1)),
        "C2": pa.array([[_pick(rng, _TOKENS[:6]) for _ in range(int(rng.integers(0, 4)))] for _ in range(n)],
                       pa.list_(pa.string())),  # typed: all-empty lists would be list<null>, which ORC cannot hold
    }
    return cols


def _write_columnar(fmt: str, cols: dict[str, pa.Array], rng: np.random.Generator, checksum: bool = True) -> bytes:
    if fmt == "orc":  # ORC has no dictionary type: the writer takes the plain values
        cols = {k: v.dictionary_decode() if pa.types.is_dictionary(v.type) else v for k, v in cols.items()}
    table = pa.table(cols)
    buf = io.BytesIO()
    if fmt == "parquet":
        pq.write_table(table, buf, row_group_size=int(rng.integers(8, 200)), write_page_checksum=checksum,
                       compression=_pick(rng, ["snappy", "zstd", "none", "gzip"]))
    else:
        orc.write_table(table, buf, stripe_size=int(rng.integers(1 << 10, 1 << 16)),
                        compression=_pick(rng, ["uncompressed", "zlib", "zstd", "snappy"]))
    return buf.getvalue()


def _columnar_case(fmt: str, kind: str, rng: np.random.Generator) -> Case:
    n = int(rng.integers(1, 400))
    cols = _columnar_table(rng, n)
    case = Case(kind=f"{fmt}.{kind}", format=fmt, rows=n, data={"read_rows": int(rng.integers(7, 100))})
    if kind in ("bad_label", "bad_number"):
        k = int(rng.integers(1, min(5, n) + 1))
        at = sorted(rng.choice(n, size=k, replace=False).tolist())
        if kind == "bad_label" and rng.random() < 0.3:  # strings where numbers belong
            vals_s = [str(v) for v in rng.integers(0, 2, n)]
            for i in at:
                vals_s[i] = _pick(rng, _BAD_LABELS)
            cols["y"] = pa.array(vals_s)
        elif kind == "bad_label":
            vals = [float(v) for v in rng.integers(0, 2, n)]
            for i in at:
                vals[i] = float(_pick(rng, [2.0, -1.0, 1.5, np.inf, -np.inf, np.nan, 7.0]))
            mask = None
            if rng.random() < 0.3:  # nulls: a missing label
                mask = np.zeros(n, bool)
                mask[at[0]] = True
            cols["y"] = pa.array(vals, pa.float64(), mask=mask)
        else:
            vals = [f"{v:.3f}" for v in rng.normal(size=n)]
            for i in at:
                vals[i] = _pick(rng, _BAD_NUMBERS)
            cols["I1"] = pa.array(vals)
        case.bad, case.bad_rows = k, [i + 1 for i in at]
        case.policy = _pick(rng, ["error", "skip"])
    elif kind == "wrong_type":
        col = _pick(rng, ["y", "I1", "I2", "C1", "C2"])
        wrong = {
            "list": pa.array([[1, 2]] * n),
            "struct": pa.array([{"a": 1}] * n),
            "map": pa.array([[("k", 1)]] * n, pa.map_(pa.string(), pa.int64())),
            "nested_list": pa.array([[[1]]] * n),
            "timestamp": pa.array(np.arange(n).astype("datetime64[s]")),
        }
        name = _pick(rng, sorted(wrong))
        if fmt == "orc" and name == "map":
            name = "struct"
        if col in ("C1", "C2") and name == "list":  # a list of IDs is multi-hot: right for a sparse feature
            name = "nested_list"
        cols[col] = wrong[name]
        case.must_fail, case.column = True, col
        case.policy = _pick(rng, ["error", "skip"])
    elif kind == "missing_column":
        col = _pick(rng, COLUMNS)
        del cols[col]
        case.must_fail, case.column = True, col
    elif kind == "empty":
        cols = {k: v.slice(0, 0) for k, v in cols.items()}
        case.rows, case.must_fail = 0, True
    body = _write_columnar(fmt, cols, rng)
    if kind == "damaged":
        checksum = fmt == "parquet" and rng.random() < 0.8
        body = _write_columnar(fmt, cols, rng, checksum)
        case.original, case.checksummed = body, checksum
        body = _damage(body, rng)
    case.files = [(f"data.{fmt}", body)]
    return case


def _damage(body: bytes, rng: np.random.Generator) -> bytes:
    """A damaged copy: flipped bytes, a truncation, a span of garbage, nothing, or noise."""
    how = _pick(rng, ["flip", "flip", "flip", "truncate", "garbage", "zero", "noise", "append"])
    b = bytearray(body)
    if how == "flip":
        for i in rng.integers(0, len(b), int(rng.integers(1, 9))):
            b[int(i)] ^= int(rng.integers(1, 256))
    elif how == "truncate":
        b = b[: int(rng.integers(0, len(b)))]
    elif how == "garbage":
        start = int(rng.integers(0, len(b)))
        span = rng.integers(0, 256, int(rng.integers(1, 64)), dtype=np.uint8).tobytes()
        b[start : start + len(span)] = span
    elif how == "zero":
        b = bytearray()
    elif how == "noise":
        b = bytearray(rng.integers(0, 256, len(b), dtype=np.uint8).tobytes())
    else:
        b += rng.integers(0, 256, int(rng.integers(1, 100)), dtype=np.uint8).tobytes()
    return bytes(b)


DATA_KINDS: dict[str, Callable[[np.random.Generator], Case]] = {}
for _k in ["wrong_fields", "bad_number", "bad_label", "bad_utf8", "stray_quote", "blank_line", "huge_line",
           "gzip_truncated"]:
    DATA_KINDS[f"csv.{_k}"] = (lambda k: lambda rng: _csv_case(k, rng))(_k)
for _k in ["empty", "header_only", "blank_only", "missing_column", "utf8_header"]:
    DATA_KINDS[f"csv.{_k}"] = (lambda k: lambda rng: _csv_unreadable_case(k, rng))(_k)
for _f in ["parquet", "orc"]:
    for _k in ["damaged", "damaged", "damaged", "bad_label", "bad_number", "wrong_type", "missing_column", "empty"]:
        DATA_KINDS.setdefault(f"{_f}.{_k}", (lambda f, k: lambda rng: _columnar_case(f, k, rng))(_f, _k))
# damage is drawn three times as often as the other columnar kinds: its space is the largest
_WEIGHTS = {k: (3 if k.endswith(".damaged") else 1) for k in DATA_KINDS}

FAULT_KINDS = ["checkpoint.enospc", "checkpoint.kill"]
KINDS = [*DATA_KINDS, *FAULT_KINDS]


def make_case(kind: str, rng: np.random.Generator) -> Case:
    """A case of ``kind`` (one of ``KINDS``) drawn from ``rng``."""
    if kind in FAULT_KINDS:
        return Case(kind=kind, format="checkpoint", fault={"draw": int(rng.integers(1 << 30))})
    return DATA_KINDS[kind](rng)


def cases(seed: int, count: int, kinds: list[str] | None = None) -> Iterator[Case]:
    """``count`` cases: kinds in a seeded weighted draw (fault cases about one in eleven), each from its
    own generator ``default_rng([seed, index])`` so any case can be rebuilt alone."""
    kinds = kinds or KINDS
    weights = np.array([_WEIGHTS.get(k, 0) or sum(_WEIGHTS.values()) / 10 / len(FAULT_KINDS) for k in kinds], float)
    pick = np.random.default_rng(seed).choice(len(kinds), size=count, p=weights / weights.sum())
    for i, k in enumerate(pick):
        rng = np.random.default_rng([seed, i])
        case = make_case(kinds[int(k)], rng)
        case.seed = (seed, i)
        yield case
