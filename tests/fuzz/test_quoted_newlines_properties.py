"""Property of ``csv.newlines_in_values`` over generated files: records as CSV writers
write them (values holding delimiters, quotes, CR and LF), between lines with a wrong number of
unquoted fields. With ``on_bad_rows: skip`` the records come out in order and unchanged, each
numbered by the line it starts on, and the skipped count is the number of bad lines; with
``error`` the error names the first bad line."""

from __future__ import annotations

import io

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ember.errors import DataError
from ember.source.bad_rows import BadRowReport
from ember.source.csv import read_csv
from tests.fuzz.conftest import fuzz_derandomize, fuzz_scale

FAST = settings(max_examples=40, deadline=None, database=None, derandomize=fuzz_derandomize(), suppress_health_check=[HealthCheck.too_slow])
SLOW = settings(max_examples=200 * fuzz_scale(), deadline=None, database=None, derandomize=fuzz_derandomize(),
                suppress_health_check=[HealthCheck.too_slow])

NAMES = ["y", "a", "b"]
_VALUE = st.text(st.sampled_from(list('ab ,;"\r\n\té')), max_size=8)
_PLAIN = st.text(st.sampled_from(list("ab é;")), max_size=6)  # unquoted: no delimiter, quote or line end
_GOOD = st.lists(_VALUE, min_size=3, max_size=3).map(lambda f: ("good", f))
_BAD = st.lists(_PLAIN, min_size=1, max_size=6).filter(lambda f: len(f) != 3 and f != [""]).map(lambda f: ("bad", f))
_ITEMS = st.lists(st.one_of(_GOOD, _GOOD, _BAD), min_size=1, max_size=40)


def _quoted(value: str, delim: str) -> str:
    """``value`` as CSV writers write it (RFC 4180): quoted, quotes doubled, when it holds the
    delimiter, a quote, CR or LF (Python's csv module leaves a CR unquoted under an LF eol)."""
    if any(ch in value for ch in (delim, '"', "\r", "\n")):
        return '"' + value.replace('"', '""') + '"'
    return value


def _property(tmp_path_factory, items, crlf, tsv, block):
    delim, eol = ("\t" if tsv else ","), ("\r\n" if crlf else "\n")
    out = io.StringIO()
    out.write(delim.join(NAMES) + eol)
    good, starts, bad_lines, line = [], [], [], 2
    for kind, fields in items:
        if kind == "good":
            out.write(delim.join(_quoted(v, delim) for v in fields) + eol)
            good.append(tuple(fields))
            starts.append(line)
        else:
            out.write(delim.join(fields) + eol)
            bad_lines.append(line)
        line += 1 + sum(v.count("\n") for v in fields)  # a line ends at each LF
    path = tmp_path_factory.mktemp("csvq") / "f.csv"
    path.write_bytes(out.getvalue().encode())
    kw = dict(delimiter=delim, block_bytes=block, newlines_in_values=True)

    report = BadRowReport("skip")
    chunks = list(read_csv(str(path), NAMES, report=report, **kw))
    rows = [r for c in chunks for r in zip(*(c.batch.column(n).to_pylist() for n in NAMES))]
    assert rows == good
    assert [int(x) for c in chunks for x in c.row_numbers] == starts
    assert report.total == len(bad_lines)
    if bad_lines:
        with pytest.raises(DataError) as e:
            list(read_csv(str(path), NAMES, **kw))
        assert f"{path} row {bad_lines[0]}," in str(e.value)


_ARGS = dict(items=_ITEMS, crlf=st.booleans(), tsv=st.booleans(), block=st.sampled_from([4096, 1 << 20]))


@FAST
@given(**_ARGS)
def test_quoted_values_holding_line_ends_read_exactly_and_bad_lines_are_named(tmp_path_factory, items, crlf, tsv, block):
    _property(tmp_path_factory, items, crlf, tsv, block)


@pytest.mark.slow
@SLOW
@given(**_ARGS)
def test_quoted_values_holding_line_ends_many(tmp_path_factory, items, crlf, tsv, block):
    _property(tmp_path_factory, items, crlf, tsv, block)
