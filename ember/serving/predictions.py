"""The predictions file ``ember predict`` and ``Predictor.predict_files(out=...)`` write.

One row per input row: the input's key columns asked for (``--keep id,...``) as they were read,
then ``p_<task>`` per task. CSV / TSV (optionally compressed) hold a header line and the
probabilities with six decimals (a value with the delimiter, a quote or a line break is
quoted); Parquet holds the values with the ``ember.output: predictions`` schema metadata, so
``ember.outputs`` recognises the file as predictions it may replace.

Example:
    >>> t = predictions_table(np.array([[0.25], [0.5]]), ["click"], {"id": np.array(["a,1", "b"], dtype=object)})
    >>> print(csv_bytes(t, ",").decode(), end="")
    id,p_click
    "a,1",0.250000
    b,0.500000
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np
import pyarrow as pa

__all__ = ["predictions_table", "csv_bytes", "write_predictions"]


def predictions_table(probs: np.ndarray, tasks: Sequence[str], kept: Mapping[str, np.ndarray] | None = None) -> pa.Table:
    """The kept columns (in order) then ``p_<task>`` columns of ``probs`` [N, T]. Raises
    ConfigError when a kept column is named like a ``p_<task>`` column (two columns, one name)."""
    from ember.errors import ConfigError

    kept = dict(kept or {})
    names = [f"p_{t}" for t in tasks]
    clash = [k for k in kept if k in names]
    if clash:
        raise ConfigError(f"--keep {clash}: the output already has a column of that name (the probabilities "
                          f"{names}); keep other columns, or rename them in the input")
    cols = {k: pa.array(v, from_pandas=True) if np.asarray(v).dtype != object else pa.array(list(v))
            for k, v in kept.items()}
    cols.update({n: pa.array(np.asarray(probs[:, i], dtype=np.float64)) for i, n in enumerate(names)})
    return pa.table(cols) if cols else pa.table({})


def csv_bytes(table: pa.Table, sep: str, header: bool = True) -> bytes:
    """``table`` as delimited text: a header, the ``p_*`` columns with six decimals, other
    values as arrow prints them, quoted only where needed (the delimiter, a quote or a line
    break in them); a null is an empty field. ``header``: start with the line of column names."""
    import csv

    import pyarrow.compute as pc

    cols: list[list[str]] = []
    for name, col in zip(table.column_names, table.columns):
        if name.startswith("p_") and pa.types.is_floating(col.type):
            cols.append(np.char.mod("%.6f", col.to_numpy()).tolist())
        else:
            text = col if pa.types.is_string(col.type) else pc.cast(col, pa.string())
            cols.append(["" if v is None else v for v in text.to_pylist()])
    out = io.StringIO()
    writer = csv.writer(out, delimiter=sep, lineterminator="\n")
    if header:
        writer.writerow(table.column_names)
    writer.writerows(zip(*cols))
    return out.getvalue().encode()


def write_predictions(path: str | Path, table: pa.Table, fmt: str, compression: str | None) -> None:
    """``table`` (:func:`predictions_table`) to ``path`` as ``fmt`` (csv / tsv, ``compression``
    optional; parquet marked as ember's predictions), written whole or not at all; missing
    parent folders are created."""
    from ember.errors import WriteError
    from ember.fileio import atomic_file
    from ember.outputs import OUTPUT_KEY

    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        # about 9 bytes per probability ("0.123456,"): the estimate a full disk's message names
        with atomic_file(path, WriteError, table.num_columns * 8 + table.num_rows * table.num_columns * 9) as tmp:
            if fmt == "parquet":
                import pyarrow.parquet as pq

                pq.write_table(table.replace_schema_metadata({OUTPUT_KEY: b"predictions"}), tmp)
                return
            data = csv_bytes(table, "\t" if fmt == "tsv" else ",")
            with (pa.CompressedOutputStream(str(tmp), compression) if compression else pa.OSFile(str(tmp), "wb")) as out:
                out.write(data)
    except WriteError:
        raise
    except OSError as e:  # a folder that takes no new files (read-only, /proc), no permission, ...
        raise WriteError(f"{path}: the predictions cannot be written there ({e.strerror or e}); give an output "
                         "path in a folder you can write to") from e
