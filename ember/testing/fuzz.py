"""Reliability fuzzing: bad inputs and faults, each with the outcome ember owes it.

Every case is built from a seeded generator (``make_case(kind, rng)``), so a failure is replayed
from ``(seed, index)``. A data case writes its file(s), then runs what ``ember train`` runs on
data before the first step and while training: the preflight (``check_data``) and the threaded
loader (read -> featurize), counting every row that comes out. A fault case saves a checkpoint
while the file system fails (``ENOSPC`` at the k-th write, fsync or rename) or the process is
killed (SIGKILL at the k-th of those operations, in a forked child).

Outcomes (``Outcome.kind``); the first four and ``recovered`` are right, the rest are defects:

- ``clear_error``: an ember error (DataError, SchemaError, ConfigError, CheckpointError, ...)
  whose message names the file, and for a planted bad row that row's number;
- ``counted_skip``: with ``on_bad_rows: skip``, the skipped count equals the bad rows planted
  and every other row came out;
- ``clean_read``: a valid input (e.g. a 2 MiB line) read whole, or damage that did not touch
  the data (the rows equal the undamaged file's);
- ``recovered``: after a kill during a checkpoint write, the last good checkpoint (or the new
  one, when the kill came after it was complete) loads and verifies;
- ``silent_drop``: rows missing with no error and no count;
- ``crash``: any other exception, a traceback, or a process that died;
- ``data_lost``: after a fault, no good checkpoint loads;
- ``unclear_error``: an ember error that names no file or the wrong row, or an error on a valid input;
- ``accepted_bad``: a planted bad row came out as data;
- ``undetected_change``: damaged bytes read as other values without an error (a file without
  checksums: ORC, or Parquet written without page checksums).
"""

from __future__ import annotations

import errno
import gzip
import io
import os
import shutil
import signal
import traceback
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.orc as orc
import pyarrow.parquet as pq

from ember.errors import CheckpointError, EmberError
from ember.featurize.schema import Schema
from ember.pipeline.loader import make_batches
from ember.source.config import DataConfig
from ember.train.preflight import check_data

__all__ = ["Case", "Outcome", "KINDS", "DATA_KINDS", "FAULT_KINDS", "OUTCOMES", "RIGHT", "make_case", "run_case",
           "cases", "study", "table"]

SCHEMA = Schema.parse({
    "labels": ["y"],
    "dense": [{"name": "I1", "log1p": True}, {"name": "I2"}],
    "sparse": [{"name": "C1"}, {"name": "C2", "separator": "|"}],
})
COLUMNS = ["y", "I1", "I2", "C1", "C2"]

OUTCOMES = ["clear_error", "counted_skip", "clean_read", "recovered", "silent_drop", "crash", "data_lost",
            "unclear_error", "accepted_bad", "undetected_change"]
RIGHT = {"clear_error", "counted_skip", "clean_read", "recovered"}


@dataclass
class Case:
    """One input and what ember owes it.

    ``rows``: data rows in the files (good and bad); ``bad``: rows planted bad (what a skip
    must count); ``bad_rows``: their 1-based row numbers (a CSV header counted), one of which
    an error must name; ``must_fail``: no outcome but a clear error is right (a missing
    column, an empty file, a wrong column type); ``original``: for damaged files, the bytes
    before the damage (their read is the reference); ``column``: a column the error must name.
    """

    kind: str
    seed: tuple[int, ...] = ()
    format: str = "csv"
    files: list[tuple[str, bytes]] = field(default_factory=list)
    policy: str = "error"
    data: dict[str, Any] = field(default_factory=dict)
    rows: int = 0
    bad: int = 0
    bad_rows: list[int] = field(default_factory=list)
    must_fail: bool = False
    original: bytes | None = None
    column: str | None = None
    checksummed: bool = True  # damage cases: whether the format can notice changed values
    fault: dict[str, Any] = field(default_factory=dict)


@dataclass
class Outcome:
    kind: str  # the case kind
    outcome: str  # one of OUTCOMES
    detail: str = ""


# ---------------------------------------------------------------- good rows

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


# ---------------------------------------------------------------- CSV cases


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


# ---------------------------------------------------------------- Parquet / ORC cases


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


# ---------------------------------------------------------------- kinds

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


# ---------------------------------------------------------------- running a data case


def _fingerprint(batches: Any) -> tuple:
    """Rows and order-sensitive sums of every tensor: two reads agree iff (almost surely) equal."""
    rows, lab, den, ids, lens = 0, 0.0, 0.0, 0, 0
    for k, b in enumerate(batches):
        w = float(k + 1)
        rows += b.size
        lab += w * float(b.labels.double().sum())
        den += w * float(b.dense.double().nan_to_num(123.0).sum())
        ids = (ids + int(b.sparse.values.sum()) * (k + 1)) % (1 << 61)
        lens += int(b.sparse.lengths.sum())
    return rows, round(lab, 6), round(den, 3), ids, lens


def _read(case: Case, paths: list[str]) -> tuple[tuple, int]:
    """Preflight + threaded loader over ``paths``: (fingerprint, rows counted as skipped)."""
    data = DataConfig.parse({"format": case.format, "train": paths, "batch_size": 50, "shuffle_buffer": 0,
                             "on_bad_rows": case.policy, **case.data}, where="data")
    check_data(data, SCHEMA.columns, "train")
    loader = make_batches(data, SCHEMA, "train", threaded=True)
    return _fingerprint(loader), loader.bad_rows.total


def _names_file(msg: str, paths: list[str]) -> bool:
    return any(p in msg for p in paths)


def run_case(case: Case, workdir: Path) -> Outcome:
    """Run one case in ``workdir`` (emptied first) and classify what happened."""
    if case.kind in FAULT_KINDS:
        return _run_fault(case, workdir)
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    paths = []
    for name, body in case.files:
        (workdir / name).write_bytes(body)
        paths.append(str(workdir / name))
    expected = None
    if case.original is not None:  # the undamaged file's read is the reference
        ref = workdir / "reference"
        ref.mkdir()
        (ref / case.files[0][0]).write_bytes(case.original)
        try:
            expected = _read(case, [str(ref / case.files[0][0])])
        except Exception as e:  # the generator made an unreadable original: a bug of this module
            return Outcome(case.kind, "crash", f"reference read failed: {type(e).__name__}: {e}")
    try:
        got = _read(case, paths)
    except EmberError as e:
        return _judge_error(case, str(e), paths)
    except Exception as e:
        tb = traceback.format_exception(type(e), e, e.__traceback__)[-3:]
        return Outcome(case.kind, "crash", f"{type(e).__name__}: {e} | {''.join(tb).strip()[-400:]}")
    return _judge_read(case, got, expected)


def _judge_error(case: Case, msg: str, paths: list[str]) -> Outcome:
    if not _names_file(msg, paths):
        return Outcome(case.kind, "unclear_error", f"names no file: {msg[:300]}")
    if case.must_fail:
        if case.column and f"'{case.column}'" not in msg and case.column not in msg:
            return Outcome(case.kind, "unclear_error", f"names not column {case.column}: {msg[:300]}")
        return Outcome(case.kind, "clear_error", msg[:200])
    if case.original is not None:
        return Outcome(case.kind, "clear_error", msg[:200])  # damage: naming the file is what we can ask
    if case.bad and case.policy == "error":
        if not any(f" row {r}," in msg or f" row {r} " in msg for r in case.bad_rows):
            return Outcome(case.kind, "unclear_error", f"names none of rows {case.bad_rows}: {msg[:300]}")
        return Outcome(case.kind, "clear_error", msg[:200])
    return Outcome(case.kind, "unclear_error", f"error on an input that reads ({case.policy}): {msg[:300]}")


def _judge_read(case: Case, got: tuple[tuple, int], expected: tuple[tuple, int] | None) -> Outcome:
    (rows, *_), skipped = got
    if case.must_fail:
        return Outcome(case.kind, "silent_drop" if rows < max(case.rows, 1) else "accepted_bad",
                       f"read {rows} rows, skipped {skipped}, from an input that cannot be read")
    if expected is not None:  # damaged: all rows, equal to the original's, or an error
        if rows + skipped < expected[0][0]:
            return Outcome(case.kind, "silent_drop", f"{rows} rows + {skipped} skipped of {expected[0][0]}")
        if got[0] != expected[0] or skipped:
            return Outcome(case.kind, "undetected_change" if not case.checksummed or case.format == "orc"
                           else "accepted_bad", f"read {got} vs {expected}")
        return Outcome(case.kind, "clean_read")
    want = case.rows - (case.bad if case.policy == "skip" else 0)
    if rows + skipped < case.rows or rows < want:
        return Outcome(case.kind, "silent_drop", f"{rows} rows + {skipped} skipped of {case.rows} (bad {case.bad})")
    if case.bad and case.policy == "error":
        return Outcome(case.kind, "accepted_bad", f"no error for bad rows {case.bad_rows}; read {rows}")
    if skipped != case.bad or rows != want:
        return Outcome(case.kind, "accepted_bad" if rows > want else "silent_drop",
                       f"{rows} rows, {skipped} skipped; planted {case.bad} bad of {case.rows}")
    return Outcome(case.kind, "counted_skip" if case.bad else "clean_read")


# ---------------------------------------------------------------- checkpoint faults


class _Faults:
    """Counts the checkpoint writer's I/O operations (writes, fsyncs, renames) and fails the
    ``at``-th one: ``ENOSPC`` (``mode="enospc"``) or SIGKILL of this process (``"kill"``)."""

    def __init__(self, at: int | None, mode: str) -> None:
        self.at, self.mode, self.count = at, mode, 0

    def tick(self, what: str) -> None:
        self.count += 1
        if self.at is not None and self.count == self.at:
            if self.mode == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            raise OSError(errno.ENOSPC, f"No space left on device (injected at {what} #{self.count})")

    def install(self) -> Callable[[], None]:
        """Patch the I/O the checkpoint and ``ember.fileio`` writers call; returns the undo."""
        import ember.checkpoint.atomic as atomic
        import ember.fileio as fileio

        faults = self
        real_open, real_fsync, real_rename, real_replace = open, os.fsync, os.rename, os.replace
        real_write = atomic.HashingWriter.write

        class _File(io.FileIO):
            def write(self, data: Any) -> int:  # type: ignore[override]
                faults.tick("write")
                return super().write(data)

        def hashing_write(self: Any, data: Any) -> None:
            faults.tick("write")
            real_write(self, data)

        def fault_open(file: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
            if "w" in mode and "b" in mode:
                return _File(file, "w")
            return real_open(file, mode, *args, **kwargs)

        def fsync(fd: int) -> None:
            faults.tick("fsync")
            real_fsync(fd)

        def rename(a: Any, b: Any) -> None:
            faults.tick("rename")
            real_rename(a, b)

        def replace(a: Any, b: Any) -> None:
            faults.tick("rename")
            real_replace(a, b)

        atomic.HashingWriter.write = hashing_write  # type: ignore[method-assign]
        fileio.open = fault_open  # type: ignore[attr-defined]  # module global shadows the builtin
        os.fsync, os.rename, os.replace = fsync, rename, replace

        def undo() -> None:
            atomic.HashingWriter.write = real_write  # type: ignore[method-assign]
            del fileio.open  # type: ignore[attr-defined]
            os.fsync, os.rename, os.replace = real_fsync, real_rename, real_replace

        return undo


def _checkpoint_parts(seed: int, fill: bool = True) -> tuple[Any, dict[str, Any]]:
    """A collection of two small tables (one with a TTL) with random rows, and a dense state."""
    import torch

    from ember.embedding import EmbeddingCollection, FeatureConfig, TableConfig

    g = torch.Generator().manual_seed(seed)
    ec = EmbeddingCollection([TableConfig(name="t", dim=4), TableConfig(name="u", dim=2, ttl_steps=5)],
                             [FeatureConfig(name="f", table="t"), FeatureConfig(name="g", table="u")])
    for t in ec.tables.values() if fill else []:
        n = int(torch.randint(1, 300, (1,), generator=g))
        t.load(torch.randperm(10_000, generator=g)[:n], torch.randn(n, t.config.record_dim, generator=g))
    return ec, {"model": {"w": torch.randn(16, generator=g)}}


def _table_state(ec: Any) -> dict[str, tuple]:
    """Every table's (sorted IDs, their records) as lists: equal iff the tables hold the same rows."""
    import torch

    out = {}
    for name, t in ec.tables.items():
        chunks = list(t.items_with_seen())
        ids = torch.cat([c[0] for c in chunks]) if chunks else torch.zeros(0, dtype=torch.int64)
        recs = torch.cat([c[1] for c in chunks]) if chunks else torch.zeros(0, t.config.record_dim)
        order = ids.argsort()
        out[name] = (ids[order].tolist(), recs[order].tolist())
    return out


def _run_fault(case: Case, workdir: Path) -> Outcome:
    """Save checkpoint 1 (good), change the tables, save checkpoint 2 under a fault; then the
    newest complete checkpoint must load and equal one of the two saved states."""
    from ember.checkpoint.load import load_tables, resolve_checkpoint, verify_checkpoint
    from ember.checkpoint.save import save_checkpoint

    shutil.rmtree(workdir, ignore_errors=True)
    root = workdir / "checkpoints"
    draw = case.fault["draw"]
    rng = np.random.default_rng(draw)
    ec1, dense1 = _checkpoint_parts(draw)
    first = save_checkpoint(root, 1, [ec1], dense1, {"epoch": 0, "batch": 1}, {}, keep=int(rng.integers(1, 3)))
    ec2, dense2 = _checkpoint_parts(draw + 1)
    same_step = bool(rng.random() < 0.2)  # a re-save of the same step (the final save does that)
    step2 = 1 if same_step else 2
    states = {1: _table_state(ec1), 2: _table_state(ec2)}

    counter = _Faults(None, "count")  # how many operations a clean save of step 2 makes
    probe = workdir / "probe"
    shutil.copytree(root, probe)
    undo = counter.install()
    try:
        save_checkpoint(probe, step2, [ec2], dense2, {"epoch": 0, "batch": 2}, {}, keep=2)
    finally:
        undo()
    at = int(rng.integers(1, counter.count + 1))
    mode = "kill" if case.kind == "checkpoint.kill" else "enospc"
    case.fault.update(at=at, ops=counter.count, same_step=same_step)
    detail = f"fault {mode} at op {at}/{counter.count}{' (same step)' if same_step else ''}"

    if mode == "kill":
        pid = os.fork()
        if pid == 0:  # the child: save under the fault, which kills it
            code = 0
            try:
                _Faults(at, "kill").install()
                save_checkpoint(root, step2, [ec2], dense2, {"epoch": 0, "batch": 2}, {}, keep=2)
            except BaseException:
                code = 3
            os._exit(code)
        _, status = os.waitpid(pid, 0)
        if not (os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL):
            return Outcome(case.kind, "crash", f"{detail}: the child was not killed (status {status})")
        result = "recovered"
    else:
        undo = _Faults(at, "enospc").install()
        try:
            save_checkpoint(root, step2, [ec2], dense2, {"epoch": 0, "batch": 2}, {}, keep=2)
            result = "clean_read"  # the fault hit nothing that matters (cannot happen: every op is checked)
        except CheckpointError as e:
            result = "clear_error" if "no space left" in str(e) and str(root) in str(e) else "unclear_error"
            detail += f": {str(e)[:160]}"
        except Exception as e:
            return Outcome(case.kind, "crash", f"{detail}: {type(e).__name__}: {e}")
        finally:
            undo()
    try:  # no data lost: the newest complete checkpoint loads, verifies and holds a saved state
        ckpt = resolve_checkpoint(root)
        manifest = verify_checkpoint(ckpt)
        fresh, _ = _checkpoint_parts(draw, fill=False)
        load_tables(ckpt, [fresh], manifest)
        state = _table_state(fresh)
        if state not in (states[1], states[2]):
            return Outcome(case.kind, "data_lost", f"{detail}: {ckpt.name} holds neither saved state")
        if ckpt != first and state != states[2] and not same_step:
            return Outcome(case.kind, "data_lost", f"{detail}: {ckpt.name} does not hold what was saved in it")
    except Exception as e:
        return Outcome(case.kind, "data_lost", f"{detail}: {type(e).__name__}: {e}")
    return Outcome(case.kind, result, detail)


# ---------------------------------------------------------------- the study


def study(seed: int, count: int, workdir: Path, kinds: list[str] | None = None,
          on_outcome: Callable[[Case, Outcome], None] | None = None) -> list[Outcome]:
    """Run ``count`` cases in ``workdir``; ``on_outcome`` sees each as it is classified."""
    out = []
    for case in cases(seed, count, kinds):
        o = run_case(case, workdir / "case")
        out.append(o)
        if on_outcome is not None:
            on_outcome(case, o)
    shutil.rmtree(workdir / "case", ignore_errors=True)
    return out


def table(outcomes: list[Outcome]) -> tuple[str, dict[str, int]]:
    """The reliability table (markdown, one row per kind family and a total) and its totals."""
    fam: dict[str, Counter] = {}
    for o in outcomes:
        fam.setdefault(o.kind, Counter())[o.outcome] += 1
    cols = ["inputs", *OUTCOMES]
    lines = ["| input kind | " + " | ".join(c.replace("_", " ") for c in cols) + " |",
             "|---" * (len(cols) + 1) + "|"]
    total: Counter = Counter()
    for kind in sorted(fam):
        c = fam[kind]
        n = sum(c.values())
        total.update(c)
        lines.append(f"| {kind} | {n} | " + " | ".join(str(c.get(k, 0)) for k in OUTCOMES) + " |")
    n = sum(total.values())
    lines.append(f"| **total** | **{n}** | " + " | ".join(f"**{total.get(k, 0)}**" for k in OUTCOMES) + " |")
    totals = {"inputs": n, **{k: int(total.get(k, 0)) for k in OUTCOMES}}
    return "\n".join(lines), totals
