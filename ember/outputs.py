"""What ember writes, and what it may replace: one rule for every command's output.

An output (a run directory, an export directory, a predictions file, generated data) goes to a
new path. An existing path is refused unless the user passes ``--overwrite``, and even then it
is replaced only when ember recognises it as its own earlier output of the same kind: a run by
a run, an export by an export, predictions by predictions, generated data by generated data.
A run directory is never replaced by an export, and a folder or file ember did not write is
never replaced at all, nor an output directory into which the user put files of their own, at
any depth (``check_own``: they would be deleted with it). An output may not lie inside (or contain) what the command reads.

How an output is recognised (``output_kind``):

- a directory with a ``.ember-output.json`` marker ``{"kind": ...}`` (ember writes one into every
  run directory); a run from before the marker: its ``checkpoints/`` or ``summary.json``;
- an export: its ``manifest.json`` (format version, file hashes, ``model.pt``);
- predictions: CSV/TSV whose header names only ``p_<task>`` columns over lines of
  probabilities, or kept input columns then ``p_<task>`` columns over lines ending in as many
  probabilities (``predict --keep``); Parquet with the ``ember.output: predictions`` schema
  metadata ember writes;
- generated data: Parquet with ``ember.output: generate`` metadata; CSV, TSV and ORC files by
  the hidden ``.NAME.ember-output.json`` ember writes beside them (``mark_file``: the file's size
  and the digest of its start, so a file changed since is no longer ember's; a header alone
  would claim a user's Criteo file with a header line);
- a data profile: a directory with the marker, ``kind: profile`` (``ember profile --out``);
- a towers snippet: a YAML file holding exactly the ``model: {type: dmt, towers: ...}`` lines
  ``ember towers`` writes (a config the user edited is no longer replaced).

An empty directory counts as new. Output file formats follow the extension (``output_format``).

Example:
    >>> import tempfile
    >>> d = Path(tempfile.mkdtemp())
    >>> claim_output(d / "new", "export", "--out", overwrite=False)
    False
    >>> (d / "notes").mkdir(); _ = (d / "notes" / "todo.txt").write_text("mine")
    >>> claim_output(d / "notes", "export", "--out", overwrite=True)
    Traceback (most recent call last):
    ...
    ember.errors.ConfigError: --out ... holds files ember did not write ...
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from pathlib import Path
from typing import Literal, Sequence

from ember.errors import ConfigError, WriteError
from ember.fileio import write_bytes_atomic

__all__ = ["Kind", "MARKER", "mark", "mark_file", "sidecar", "output_kind", "manifest_kind", "claim_output", "check_apart", "check_own",
           "check_writable", "check_in_run", "output_format", "OUTPUT_KEY", "SERIES_NAME"]

Kind = Literal["run", "export", "predictions", "generate", "towers", "profile"]
MARKER = ".ember-output.json"
OUTPUT_KEY = b"ember.output"  # Parquet schema metadata key: which command wrote the file

_DESCRIBED = {"run": "a training run (ember train)", "export": "an export (ember export / train --export)",
              "predictions": "predictions (ember predict)", "generate": "generated data (ember generate)",
              "towers": "a towers snippet (ember towers)", "profile": "a data profile (ember profile)"}
# what ``ember towers --out`` writes, whole: the model section of a DMT config
_TOWERS = re.compile(r"model:\n  type: dmt\n  towers:\n(    - \[[^\n\]]*\]\n)+")
_COMPRESSED = {".gz": "gzip", ".bz2": "bz2", ".zst": "zstd", ".lz4": "lz4"}
_TEXT = ("csv", "tsv")


def mark(directory: str | os.PathLike, kind: Kind) -> None:
    """Record in ``directory`` that ember wrote it, as an output of ``kind``."""
    write_bytes_atomic(Path(directory) / MARKER, json.dumps({"kind": kind}).encode(), WriteError)


def sidecar(path: str | os.PathLike) -> Path:
    """Where ember records that it wrote the file ``path``: a hidden file beside it."""
    p = Path(path)
    return p.with_name(f".{p.name}{MARKER}")


def _fingerprint(path: Path) -> dict[str, object]:
    """A file's size and the digest of its first 64 KiB: changed, it is no longer what ember wrote."""
    import hashlib

    with open(path, "rb") as fh:
        head = fh.read(1 << 16)
    return {"bytes": path.stat().st_size, "head_sha256": hashlib.sha256(head).hexdigest()}


def mark_file(path: str | os.PathLike, kind: Kind) -> None:
    """Record beside the file ``path`` that ember wrote it as an output of ``kind`` (generated
    CSV / TSV / ORC data, which cannot carry a mark inside: a header alone would claim a user's
    Criteo file with a header line)."""
    p = Path(path)
    write_bytes_atomic(sidecar(p), json.dumps({"kind": kind, **_fingerprint(p)}).encode(), WriteError)


def _marked_kind(f: Path) -> Kind | None:
    """The kind the sidecar of file ``f`` records, when it still describes ``f``."""
    try:
        mark = json.loads(sidecar(f).read_text())
        if mark.get("kind") in _DESCRIBED and {k: mark.get(k) for k in ("bytes", "head_sha256")} == _fingerprint(f):
            return mark["kind"]  # type: ignore[no-any-return]
    except (OSError, ValueError, AttributeError):
        pass
    return None


def output_kind(path: str | os.PathLike) -> Kind | None:
    """Which of ember's outputs ``path`` is, or None (absent, or not one ember recognises)."""
    p = Path(path)
    if p.is_dir():
        return _dir_kind(p)
    if p.is_file():
        return _file_kind(p)
    return None


def manifest_kind(d: str | os.PathLike) -> Literal["checkpoint", "export"] | None:
    """What the ``manifest.json`` in directory ``d`` says it is: a ``checkpoint`` (it records the
    run ``config`` and its ``step``), an ``export`` (full or delta: the ``features`` a server
    needs and a ``format_version``, no run config), or None (no manifest, or neither). The one
    rule every command uses to tell them apart."""
    try:
        manifest = json.loads((Path(d) / "manifest.json").read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(manifest, dict):
        return None
    if "config" in manifest and "step" in manifest:
        return "checkpoint"
    if "features" in manifest and "format_version" in manifest:
        return "export"
    return None


def _dir_kind(d: Path) -> Kind | None:
    try:
        recorded = json.loads((d / MARKER).read_text()).get("kind")
        if recorded in _DESCRIBED:
            return recorded  # type: ignore[no-any-return]
    except (OSError, ValueError, AttributeError):
        pass
    if (d / "checkpoints").is_dir() or (d / "summary.json").is_file():
        return "run"  # a run from before the marker
    return "export" if manifest_kind(d) == "export" else None


def _file_kind(f: Path) -> Kind | None:
    marked = _marked_kind(f)
    if marked is not None:
        return marked
    if f.suffix.lower() in (".yaml", ".yml"):
        try:
            return "towers" if f.stat().st_size < 1 << 20 and _TOWERS.fullmatch(f.read_text()) else None
        except (OSError, UnicodeDecodeError):
            return None
    try:
        fmt, _ = output_format(f, None, ("csv", "tsv", "parquet", "orc"), "path")
    except ConfigError:
        return None
    try:
        if fmt == "parquet":
            import pyarrow.parquet as pq

            written = (pq.read_schema(f).metadata or {}).get(OUTPUT_KEY, b"").decode()
            return written if written in ("predictions", "generate") else None  # type: ignore[return-value]
        if fmt == "orc":
            return None
        import pyarrow as pa

        with pa.input_stream(str(f), compression="detect") as s:
            head = s.read(1 << 16)
    except Exception:  # unreadable or not what its extension says: not ember's
        return None
    sep = "\t" if fmt == "tsv" else ","
    lines = head.decode("utf-8", "replace").split("\n")
    names = lines[0].rstrip("\r").split(sep)
    names = [n[1:-1] if len(n) >= 2 and n[0] == n[-1] == '"' else n for n in names]  # pyarrow quotes its header
    if names and all(re.fullmatch(r"p_\w+", n) for n in names) and all(_probabilities(ln, sep, len(names))
                                                                        for ln in lines[1:-1]):
        return "predictions"
    if _kept_predictions(head.decode("utf-8", "replace"), sep):
        return "predictions"
    return None


def _kept_predictions(head: str, sep: str) -> bool:
    """Whether ``head`` (the start of a text file) is predictions with kept input columns
    (``predict --keep``): a header of column names ending in ``p_<task>`` columns, each later
    complete line of as many fields, those last ones numbers in [0, 1]."""
    import csv
    import io

    rows = list(csv.reader(io.StringIO(head.rsplit("\n", 1)[0] if "\n" in head else head), delimiter=sep))
    if len(rows) < 2 or not rows[0]:
        return False
    names = rows[0]
    n = next((i for i, name in enumerate(reversed(names)) if not re.fullmatch(r"p_\w+", name)), len(names))
    if n == 0 or n == len(names):  # no p_ column, or only p_ columns (the plain predictions checked above)
        return False
    return all(len(r) == len(names) and _probabilities(sep.join(r[-n:]), sep, n) for r in rows[1:])


def _probabilities(line: str, sep: str, n: int) -> bool:
    """Whether a line holds ``n`` numbers in [0, 1], as a line of predictions does."""
    try:
        values = [float(v) for v in line.rstrip("\r").split(sep)]
    except ValueError:
        return False
    return len(values) == n and all(0.0 <= v <= 1.0 for v in values)


def _empty_dir(p: Path) -> bool:
    return p.is_dir() and not p.is_symlink() and next(p.iterdir(), None) is None


def claim_output(path: str | os.PathLike, kind: Kind, flag: str, overwrite: bool,
                 reading: Sequence[str | os.PathLike] = ()) -> bool:
    """Check that an output of ``kind`` may be written to ``path`` (given as ``flag``, e.g.
    ``--out``); returns whether it replaces an earlier output (an empty directory is new).

    Raises ConfigError when ``path`` exists and ``overwrite`` is false, when it is not an
    earlier output of ``kind`` (never replaced, whatever ``overwrite`` says), or when it lies
    inside or contains a path in ``reading`` (what the command reads)."""
    p = Path(path)
    for source in reading:
        check_apart(p, source, flag)
    base = p.parent  # the folders to create: below the nearest one that exists, which must be a folder
    while not base.exists() and base != base.parent:
        base = base.parent
    if not base.is_dir():
        raise ConfigError(f"{flag} {p}: {base} is a file, not a folder, so nothing can be written under it; "
                          "choose another path")
    check_writable(base, f"{flag} {p}", "choose a path in a folder you can write to")
    if not (p.exists() or p.is_symlink()) or _empty_dir(p):
        return False
    found = output_kind(p)
    what = _DESCRIBED[kind].split(" (")[0]
    writing = sorted(p.glob(f".{MARKER}.tmp-*")) if found is None and p.is_dir() else []
    if writing:  # (ember.fileio.atomic_file's temporary name: the marker of another process, mid-write)
        pid = writing[0].name.rsplit("-", 1)[-1]
        raise ConfigError(f"{flag} {p} is being created by another ember command right now (process {pid} is writing "
                          f"its marker): two commands writing one output at once would mix their files; wait for it "
                          f"to finish, or choose another path (for train: another train.run_name)")
    if found != kind:
        holds = f"holds {_DESCRIBED[found]}, not {what}" if found is not None else \
            f"holds files ember did not write (not {what})" if p.is_dir() else f"is a file ember did not write (not {what})"
        raise ConfigError(f"{flag} {p} already exists and {holds}; ember replaces only its own earlier output of the "
                          f"same kind, even with --overwrite: choose another path")
    if not overwrite:
        raise ConfigError(f"{flag} {p} already exists ({_DESCRIBED[found]}); pass --overwrite to replace it, or "
                          "choose another path")
    if kind == "export" and p.is_dir():  # replaced whole (a profile replaces its own files in place)
        check_own(p, kind, f"{flag} {p}")
    return True


def check_writable(folder: Path, what: str, fix: str) -> None:
    """ConfigError (naming ``what`` and the ``fix``) when no file can be created in the existing
    ``folder``: read-only, no permission, a kernel's virtual file system. Tried with a file of
    its own (made and removed at once), as permission bits cannot say it (root may write where
    the file system refuses), so a command fails before its work, not after it."""
    try:
        fd, probe = tempfile.mkstemp(prefix=".ember-write-check-", dir=folder)
    except OSError as e:
        raise ConfigError(f"{what} cannot be written: {folder} takes no new files ({e.strerror or e}); {fix}") from None
    os.close(fd)
    os.unlink(probe)


def check_own(d: Path, kind: Kind, where: str) -> None:
    """ConfigError when output directory ``d`` (of ``kind``, named ``where`` in the message), about
    to be replaced, also holds entries ember did not write there (a user's notes in an export):
    replacing it would delete them."""
    foreign = _foreign_entries(d, kind)
    if foreign:
        shown = ", ".join(foreign[:5]) + (f" and {len(foreign) - 5} more" if len(foreign) > 5 else "")
        raise ConfigError(f"{where} holds {_DESCRIBED[kind]} and also files ember did not write ({shown}); "
                          "--overwrite would delete them with it: move them out of it, or choose another path")


# what ember writes at the top of a run directory: files, and folders whose entries ``_foreign_run`` checks
_RUN_FILES = {MARKER, "config.yaml", "metrics.jsonl", "metrics.png", "summary.json"}
_TEMP = re.compile(r"\..+\.tmp(-\d+|\.\w+)")  # an atomic write's temporary, left by a crash (ember.fileio)
_STEP = re.compile(r"step-\d{8,}")  # a checkpoint (ember.checkpoint.save: step-{step:08d})
_CKPT_LEFTOVER = re.compile(r"\.(tmp|old)-step-\d{8,}-\d+")  # a crashed save's directory (ember.checkpoint.save)
SERIES_NAME = re.compile(r"^(\d{6,})-(full|delta)$")
"""An export series' numbered name under a run's ``exports/`` (``ember.checkpoint.delta``)."""
_EVENTS = re.compile(r"events\.out\.tfevents\..+")  # TensorBoard's event files (train.tensorboard)
_RANKS = re.compile(r"\.ranks-see-[0-9a-f]{32}")  # a distributed run's shared-folder check (ember.train.distributed)


def _foreign_entries(d: Path, kind: Kind) -> list[str]:
    """The entries of output directory ``d`` (of ``kind``), at any depth, that ember did not write
    there, as paths relative to ``d``, sorted (a directory with a trailing /: it holds nothing of
    ember's): what replacing ``d`` must not delete. A symbolic link is never ember's (it may
    point at anything). What ember wrote is what the layout names: an export's and a
    checkpoint's manifest list their files; a run holds its own files, checkpoints, event files
    and exports; an ember output inside a run (``train --export`` into its run directory) is
    checked as its own kind."""
    out: list[str] = []
    (_foreign_run if kind == "run" else _foreign_listed)(d, "", out)
    return sorted(out)


def _entry(e: Path, prefix: str) -> str:
    return f"{prefix}{e.name}" + ("/" if e.is_dir() and not e.is_symlink() else "")


def _foreign_listed(d: Path, prefix: str, out: list[str]) -> None:
    """An export's or a checkpoint's directory: its manifest, marker and the files the manifest
    lists (and a crashed write's temporaries) are ember's, everything else is not."""
    try:
        listed = json.loads((d / "manifest.json").read_text()).get("files", {})
        own = {MARKER, "manifest.json"} | {str(f) for f in listed}
    except (OSError, ValueError, AttributeError):
        own = {MARKER, "manifest.json"}
    folders = {"tables"} | {"/".join(parts[:i]) for parts in (f.split("/") for f in own) for i in range(1, len(parts))}

    def walk(at: Path, rel: str) -> None:
        for e in sorted(at.iterdir()):
            name = f"{rel}{e.name}"
            if e.is_symlink() or not (name in own or name in folders or _TEMP.fullmatch(e.name)):
                out.append(_entry(e, prefix + rel))
            elif e.is_dir() and name in folders:
                walk(e, name + "/")
    walk(d, "")


def _foreign_run(d: Path, prefix: str, out: list[str]) -> None:
    """A run directory: its files, ``checkpoints/`` (checkpoints, ``LATEST``, ``BEST``, a crashed
    save's leftovers), ``tensorboard/`` (event files), ``exports/`` (the exports it wrote; an export
    series' temporaries), and ember outputs put into it (``train --export``)."""
    for e in sorted(d.iterdir()):
        rel = f"{prefix}{e.name}/"
        if e.is_symlink():
            out.append(_entry(e, prefix))
        elif e.is_file() and (e.name in _RUN_FILES or _TEMP.fullmatch(e.name) or _RANKS.fullmatch(e.name)):
            continue
        elif e.is_dir() and e.name == "checkpoints":
            for c in sorted(e.iterdir()):
                if c.is_symlink() or not (c.name in ("LATEST", "BEST") and c.is_file() or _TEMP.fullmatch(c.name)
                                          or c.is_dir() and (_STEP.fullmatch(c.name) or _CKPT_LEFTOVER.fullmatch(c.name))):
                    out.append(_entry(c, rel))
                elif _STEP.fullmatch(c.name) and (c / "manifest.json").is_file():  # (one without: half removed by a prune)
                    _foreign_listed(c, f"{rel}{c.name}/", out)
        elif e.is_dir() and e.name == "tensorboard":
            out.extend(_entry(c, rel) for c in sorted(e.iterdir()) if c.is_symlink() or not (c.is_file() and _EVENTS.fullmatch(c.name)))
        elif e.is_dir() and e.name == "exports":
            for c in sorted(e.iterdir()):
                if c.is_symlink() or not (c.name.startswith(".") or c.is_dir() and output_kind(c) == "export"):
                    out.append(_entry(c, rel))
                elif not c.name.startswith("."):  # (dot names: an export series' temporaries, ember.checkpoint.delta)
                    _foreign_listed(c, f"{rel}{c.name}/", out)
        else:
            kind = output_kind(e) if e.is_dir() else None
            if kind == "export":
                _foreign_listed(e, rel, out)
            elif kind == "run":
                _foreign_run(e, rel, out)
            elif kind is None:  # (another ember output, e.g. a profile, is replaced whole)
                out.append(_entry(e, prefix))


def check_in_run(path: str | os.PathLike, run_dir: str | os.PathLike, flag: str) -> None:
    """ConfigError when the output ``path``, inside ``run_dir``, is where the run writes its own
    files (``checkpoints/``, ``tensorboard/``, its files, an export series' numbered names): it
    would collide with them once the run has written them (``train --export runs/x/export`` is
    fine)."""
    out, run = Path(path).resolve(), Path(run_dir).resolve()
    if not out.is_relative_to(run) or out == run:
        return
    parts = out.relative_to(run).parts
    if parts[0] in ("checkpoints", "tensorboard") or (len(parts) == 1 and parts[0] in _RUN_FILES) \
            or (parts[0] == "exports" and len(parts) > 1 and SERIES_NAME.match(parts[1])):
        where = "/".join(parts[:2] if parts[0] == "exports" else parts[:1])
        raise ConfigError(f"{flag} {path} lies where the run writes its own {where}; choose another path (e.g. "
                          f"{Path(run_dir) / 'export'})")


def check_apart(path: str | os.PathLike, source: str | os.PathLike, flag: str, inside_ok: bool = False) -> None:
    """ConfigError when the output ``path`` is, lies inside (unless ``inside_ok``) or contains
    ``source``, which the command reads (an export into the run it exports would replace the
    run). ``inside_ok``: ``train --export runs/x/export`` puts the export in the run it writes."""
    out, src = Path(path).resolve(), Path(source).resolve()
    if out == src or (out.is_relative_to(src) and not inside_ok) or src.is_relative_to(out):
        where = "is" if out == src else "lies inside" if out.is_relative_to(src) else "contains"
        raise ConfigError(f"{flag} {path} {where} {source}, which this command {'writes' if inside_ok else 'reads'}; "
                          "writing there would replace it: choose a path outside it")


def output_format(path: str | os.PathLike, given: str | None, allowed: Sequence[str], flag: str,
                  format_flag: str | None = None) -> tuple[str, str | None]:
    """The format (one of ``allowed``) and compression (gzip, bz2, zstd, lz4 or None) an output
    file is written in: what its extension names (``.csv``, ``.tsv``, ``.parquet``, ``.orc``,
    a text format + ``.gz``/``.bz2``/``.zst``/``.lz4``). ``given`` (an explicit ``--format``)
    must agree with a known extension and names the format of any other extension; the error
    for an unknown one names ``format_flag`` (the option that gives it), if the command has one.

    Example:
        >>> output_format("p.csv.gz", None, ("csv", "parquet"), "--output")
        ('csv', 'gzip')
    """
    name = Path(path).name.lower()
    compression = None
    stem, ext = os.path.splitext(name)
    if ext in _COMPRESSED:
        compression = _COMPRESSED[ext]
        stem, ext = os.path.splitext(stem)
    named = {".csv": "csv", ".tsv": "tsv", ".parquet": "parquet", ".pq": "parquet", ".orc": "orc"}.get(ext)
    fmt = named or given
    choices = ", ".join(f".{a}" for a in allowed)
    if fmt is None:
        raise ConfigError(f"{flag} {path}: cannot tell the format from the extension '{ext or name}'; end the name "
                          f"with one of {choices} (CSV/TSV may add .gz, .bz2, .zst or .lz4)"
                          + (f" or pass {format_flag}" if format_flag else ""))
    if given is not None and named is not None and given != named:
        raise ConfigError(f"{flag} {path}: the extension says {named} but --format says {given}; make them agree "
                          "(or leave --format out: the extension decides)")
    if fmt not in allowed:
        raise ConfigError(f"{flag} {path}: {fmt} is not an output format here; use one of {choices}")
    if compression is not None and fmt not in _TEXT:
        raise ConfigError(f"{flag} {path}: {fmt} files are compressed inside; drop the '{os.path.splitext(name)[1]}' "
                          "extension")
    return fmt, compression
