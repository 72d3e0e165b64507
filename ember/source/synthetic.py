"""Criteo-shaped synthetic data with a planted signal; any row is computed from its number.

Every random draw is a counter-based hash: ``mix64`` of (row number, draw number, split key),
so row ``r`` of a split depends only on ``(options, split, r)``. Batch ``k`` is rows
``[k*B, (k+1)*B)``: resuming at batch ``k`` costs nothing, and the data do not depend on how
many rows are generated at a time. Nothing of vocabulary size is ever allocated.

- Dense ``I1..In``: latent ``z ~ N(0, 1)``, shown as the count ``floor(exp(1.5 + z))``.
- Sparse ``C1..Cm``: a Zipf rank ``r`` in ``[0, V)`` drawn by inverse CDF of the continuous power
  law ``p(x) ~ x^-zipf`` on ``[1, V + 1)``, scrambled to an int64 ID by the bijection
  ``mix64(r ^ key_f)`` (so IDs look arbitrary, and distinct ranks stay distinct). Features in
  ``multi_hot`` carry ``1..L`` such IDs per row (a list column).
- Label ``~ Bernoulli(sigmoid(score))`` with ``score = b + a * sum_f e_f(id) + dense part``:
  ``e_f(id) ~ N(0, 1)`` is a hidden effect computed by hashing the ID (no table) for the first
  ``signal_features`` sparse features (mean over a multi-hot bag); the dense part is
  ``0.5 z1 - 0.4 z2 + 0.3 z3``. Scales give a positive rate near 0.22 and a Bayes AUC
  (AUC of the true score) near 0.8. Train and eval draw from different streams but share the
  hidden effects, so what is learned on train carries over.

Example:
    >>> from ember.source.config import SyntheticOptions
    >>> opts = SyntheticOptions(num_dense=2, num_sparse=3, vocab_size=10**9)
    >>> rb = synthetic_records(opts, "train", 10, 14)
    >>> rb.num_rows, rb.schema.names
    (4, ['label', 'I1', 'I2', 'C1', 'C2', 'C3'])
    >>> synthetic_records(opts, "train", 12, 14).column("C2").equals(rb.column("C2").slice(2))
    True
"""

from __future__ import annotations

from typing import Any, Callable, Iterator, Literal, Sequence

import hashlib

import numpy as np
import pyarrow as pa

from ember.source.config import SyntheticOptions
from ember.mix import mix64

__all__ = ["synthetic_records", "synthetic_score", "synthetic_columns", "split_rows", "SyntheticSource"]

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_TWO53 = 1.0 / float(1 << 53)
_SPARSE_SCALE = 1.25  # std of the summed per-ID effects
_DENSE_W = (0.5, -0.4, 0.3)
_BIAS = -1.45


def synthetic_columns(options: SyntheticOptions) -> tuple[list[str], list[str]]:
    """Dense and sparse column names: ``I1..In`` and ``C1..Cm`` (the label is ``label``)."""
    return [f"I{i + 1}" for i in range(options.num_dense)], [f"C{i + 1}" for i in range(options.num_sparse)]


def split_rows(options: SyntheticOptions, split: Literal["train", "eval"]) -> int:
    return options.rows if split == "train" else options.eval_rows


def _key(options: SyntheticOptions, *parts: object) -> np.uint64:
    text = "/".join(["ember-synthetic", str(options.seed), *map(str, parts)])
    return np.uint64(int.from_bytes(hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest(), "little"))


def _offset(draw: int | np.ndarray) -> np.ndarray | np.uint64:
    """``(draw + 1) * golden`` modulo 2**64, without numpy's scalar-overflow warning."""
    if isinstance(draw, np.ndarray):
        return (draw.astype(np.uint64) + np.uint64(1)) * _GOLDEN
    return np.uint64(((draw + 1) * 0x9E3779B97F4A7C15) % (1 << 64))


def _uniform(base: np.ndarray, draw: int | np.ndarray) -> np.ndarray:
    """A uniform [0, 1) per row for draw number ``draw`` (independent across draws)."""
    bits = mix64(base + _offset(draw))
    return (bits >> np.uint64(11)).astype(np.float64) * _TWO53


def _normal_from_bits(h: np.ndarray) -> np.ndarray:
    u1 = ((mix64(h) >> np.uint64(11)).astype(np.float64) + 0.5) * _TWO53
    u2 = (mix64(h + _GOLDEN) >> np.uint64(11)).astype(np.float64) * _TWO53
    return np.sqrt(-2.0 * np.log(u1)) * np.cos(2.0 * np.pi * u2)


def _zipf_ranks(u: np.ndarray, vocab: int, s: float) -> np.ndarray:
    top = float(vocab) + 1.0
    if abs(s - 1.0) < 1e-9:
        x = np.exp(u * np.log(top))
    else:
        x = (1.0 - u * (1.0 - top ** (1.0 - s))) ** (1.0 / (1.0 - s))
    return np.clip(np.floor(x) - 1.0, 0, vocab - 1).astype(np.uint64)


def _generate(options: SyntheticOptions, split: str, start: int, stop: int) -> tuple[dict, np.ndarray]:
    rows = np.arange(start, stop, dtype=np.uint64)
    n = rows.size
    base = mix64(rows ^ _key(options, "rows", split))
    draw = 0
    cols: dict[str, pa.Array] = {}
    score = np.full(n, _BIAS)
    dense_names, sparse_names = synthetic_columns(options)
    for j, name in enumerate(dense_names):
        z = _normal_from_bits(mix64(base + _offset(draw)))
        draw += 1
        cols[name] = pa.array(np.floor(np.exp(1.5 + z)).astype(np.int64))
        if j < len(_DENSE_W):
            score += _DENSE_W[j] * z
    n_signal = min(options.signal_features, options.num_sparse)
    alpha = _SPARSE_SCALE / np.sqrt(max(n_signal, 1))
    for f, name in enumerate(sparse_names):
        vocab, max_len = options.vocab(f), options.multi_hot.get(name, 0)
        id_key, eff_key = _key(options, "id", name), _key(options, "effect", name)
        if not max_len:
            ranks = _zipf_ranks(_uniform(base, draw), vocab, options.zipf)
            draw += 1
            ids = mix64(ranks ^ id_key)
            cols[name] = pa.array(ids.view(np.int64))
            if f < n_signal:
                score += alpha * _normal_from_bits(ids ^ eff_key)
            continue
        lengths = 1 + np.minimum((_uniform(base, draw) * max_len).astype(np.int64), max_len - 1)
        draw += 1
        row = np.repeat(np.arange(n), lengths)
        pos = np.arange(int(lengths.sum())) - np.repeat(np.cumsum(lengths) - lengths, lengths)
        ranks = _zipf_ranks(_uniform(base[row], draw + pos), vocab, options.zipf)
        draw += max_len
        ids = mix64(ranks ^ id_key)
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
        cols[name] = pa.ListArray.from_arrays(pa.array(offsets), pa.array(ids.view(np.int64)))
        if f < n_signal:
            eff = np.bincount(row, weights=_normal_from_bits(ids ^ eff_key), minlength=n) / lengths
            score += alpha * eff * np.sqrt(np.minimum(lengths, 4))  # keep the bag's effect spread
    label = (_uniform(base, 10_000) < 1.0 / (1.0 + np.exp(-score))).astype(np.int8)
    return {"label": pa.array(label), **cols}, score


def synthetic_records(
    options: SyntheticOptions, split: Literal["train", "eval"], start: int, stop: int
) -> pa.RecordBatch:
    """Rows ``[start, stop)`` of ``split`` as a record batch: label, I1..In, C1..Cm."""
    cols, _ = _generate(options, split, start, stop)
    return pa.record_batch(cols)


def synthetic_score(options: SyntheticOptions, split: Literal["train", "eval"], start: int, stop: int) -> np.ndarray:
    """The true logit of rows ``[start, stop)`` (for tests: its AUC is the best achievable)."""
    return _generate(options, split, start, stop)[1]


class SyntheticSource:
    """The generator as a source (``data.format: synthetic``): one unit per split, its rows in
    blocks of ``data.read_rows``. (The training loader jumps straight to a batch's rows instead,
    and slices them per rank: ``ember.pipeline.loader``.)"""

    def __init__(self, data: Any) -> None:
        self.data, self.options = data, data.synthetic

    def units(self, split: Literal["train", "eval"], at: Any = None) -> list[Any]:
        from ember.source.protocol import Unit

        return [Unit(f"<synthetic {split}>", rows=split_rows(self.options, split))]

    def open(self, unit: Any, columns: Sequence[str], report: Any = None, at: Any = None,
             consumed: list[int] | None = None, types: Any = None) -> Iterator[Any]:  # types: a hint for text (CSV)
        from ember.source.base import RecordChunk

        split: Literal["train", "eval"] = "train" if unit.name == "<synthetic train>" else "eval"
        n, step = split_rows(self.options, split), self.data.read_rows
        for start in range(0, n, step):
            yield RecordChunk(synthetic_records(self.options, split, start, min(n, start + step)), unit.name, start + 1)

    def check(self, split: Literal["train", "eval"], columns: Sequence[str]) -> list[Any]:
        return []  # the generator has every column the presets name, and rows (no units to name)

    def count(self, split: Literal["train", "eval"], estimate: bool = False) -> Any:
        from ember.source.protocol import RowCount

        return RowCount(rows=split_rows(self.options, split))

    def start(self, split: Literal["train", "eval"], at: Any, ordered: bool, resumed: bool) -> Any:
        return None

    def key(self, split: Literal["train", "eval"], ordered: bool) -> str | None:
        return None

    def after(self, at: Any, value: Any) -> Any:
        return None

    def follow(self, resume: str | None, taken: set[str], stop: Callable[[], bool]) -> Iterator[Any]:
        from ember.errors import ConfigError

        raise ConfigError("train.mode: online streams data.train files or an Iceberg table; synthetic data has no "
                          "stream: use train.mode: offline")
