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

from ember.testing.fuzz.case import COLUMNS, OUTCOMES, RIGHT, SCHEMA, Case, Outcome
from ember.testing.fuzz.cases import DATA_KINDS, FAULT_KINDS, KINDS, cases, make_case
from ember.testing.fuzz.judge import _judge_error, run_case
from ember.testing.fuzz.study import study, table

__all__ = ["Case", "Outcome", "KINDS", "DATA_KINDS", "FAULT_KINDS", "OUTCOMES", "RIGHT", "SCHEMA", "COLUMNS", "make_case",
           "run_case", "cases", "study", "table"]
