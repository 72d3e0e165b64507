"""Schema: which columns are labels, dense features (with transforms) and sparse features.

Example:
    >>> s = Schema.parse({"labels": ["click"], "dense": [{"name": "age", "log1p": True}],
    ...                   "sparse": [{"name": "user"}, {"name": "tags", "separator": "|"}]})
    >>> s.sparse[1].source_column, s.sparse[1].salt_value, s.feature_names
    ('tags', 'tags', ['user', 'tags'])
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from ember.config_base import ConfigModel

__all__ = ["DenseFeature", "FeatureConfig", "SparseFeature", "Schema", "PoolingMode", "as_recorded"]

# How a sparse feature's bag of rows becomes one vector: the one definition, here because
# featurize sits below embedding (which implements the modes and imports this name).
PoolingMode = Literal["sum", "mean", "sqrtn", "sequence"]


class FeatureConfig(ConfigModel):
    """How one sparse feature is embedded: which table, and how its IDs are pooled per sample. The
    one definition: the schema's ``SparseFeature`` extends it with where its values come from, and
    ``ember.embedding`` (which implements the pooling) takes it as is. It lives here, below
    embedding, so that the data side can extend it.

    ``sum`` / ``mean`` / ``sqrtn`` pool the bag of IDs (weighted when the batch carries per-ID
    weights: sum w*e, sum w*e / sum |w|, sum w*e / sqrt(sum w^2), each norm floored at
    ``ember.embedding.pooling.WEIGHT_EPS``, so an all-zero-weight bag pools to zero); ``sequence`` keeps every
    position: a [B, L, D] tensor padded with zeros plus a [B, L] mask (L = ``max_length``).

    Examples:
        >>> FeatureConfig(name="history", table="item", pooling="mean").table_name
        'item'
    """

    name: str = Field(min_length=1)
    """Feature name (its key in `SparseFeatures`)."""
    table: str | None = None
    """The table it looks up; unset: `name`. Several features may share one table."""
    pooling: PoolingMode = "sum"
    """`sum`, `mean`, `sqrtn` (weighted when the feature has weights: `Σw·e`, `Σw·e / max(Σ|w|, 1e-6)`, `Σw·e /
    max(√Σw², 1e-6)`; a bag whose weights are all zero pools to zero, and a weighted mean never exceeds the
    bag's largest row, whatever the weights' signs), or `sequence`: a padded `[B, L, D]` tensor plus mask, for
    your own models (the built-in ones take pooled features)."""
    max_length: int | None = Field(None, gt=0)
    """Keep the first `max_length` values of a row (`L` for `sequence`)."""

    @property
    def table_name(self) -> str:
        return self.table or self.name


class DenseFeature(ConfigModel):
    """A float column. Transforms run in this order (each optional):

    1. ``fill``: a missing value (null or empty field) becomes ``fill``;
    2. ``clip = (lo, hi)``: clamp to ``[lo, hi]`` (either side may be None: unbounded);
    3. ``log1p``: ``log(1 + max(x, 0))`` (negative values become 0 first: counts like Criteo's
       I2 = -2 would otherwise give NaN); or ``sign_log1p``: ``sign(x) * log(1 + |x|)``, the
       same compression for columns whose negative values mean something (they keep their
       sign and order); not both;
    4. ``standardize = (mean, std)``: ``(x - mean) / std``.
    """

    name: str = Field(min_length=1)
    """Feature name."""
    column: str | None = None
    """Source column; unset: `name`."""
    fill: float = 0.0
    """Value of a missing field (null or empty)."""
    log1p: bool = False
    """Apply `log(1 + max(x, 0))` (after `fill` and `clip`)."""
    sign_log1p: bool = False
    """`sign(x) · log(1 + |x|)`: log1p's compression for columns with meaningful negative values (they keep sign
    and order); not with `log1p`."""
    clip: tuple[float | None, float | None] | None = None
    """`[lo, hi]` to clamp to; either side may be null (unbounded)."""
    standardize: tuple[float, float] | None = None
    """`[mean, std]`: the value becomes `(x - mean) / std`, last of the transforms."""

    @model_validator(mode="after")
    def _check(self) -> "DenseFeature":
        if self.log1p and self.sign_log1p:
            raise ValueError(f"dense feature '{self.name}': log1p and sign_log1p exclude each other; keep one")
        if self.clip is not None and None not in self.clip and self.clip[0] > self.clip[1]:  # type: ignore[operator]  # None excluded
            raise ValueError(f"dense feature '{self.name}': clip low {self.clip[0]} > high {self.clip[1]}")
        if self.standardize is not None and not self.standardize[1] > 0:
            raise ValueError(f"dense feature '{self.name}': standardize std must be > 0, got {self.standardize[1]}")
        return self

    @property
    def source_column(self) -> str:
        return self.column or self.name


class SparseFeature(FeatureConfig):
    """A categorical column hashed to int64 IDs (see :mod:`ember.featurize.hashing`).

    - ``table``: the embedding table it looks up (defaults to ``name``; features may share one).
    - ``pooling``: how a row's IDs become one vector: ``sum`` / ``mean`` / ``sqrtn``, or
      ``sequence`` (every position kept, up to ``max_length``).
    - ``max_length``: keep the first ``max_length`` values of each row.
    - ``column``: source column (defaults to ``name``).
    - ``separator``: multi-hot values joined in one string column (e.g. ``"a|b|c"``). List
      columns (Parquet/ORC) are read as multi-hot without it. Empty tokens (``"a||b"``, a
      trailing ``|``, an empty cell) are no value: they are how an empty bag is written.
    - ``missing_values``: values that mean "no value" (no ID, an empty bag when all are), e.g.
      ``[""]`` or ``["", "-1"]``; default the schema's ``missing_values`` (itself ``[]``). Null
      is always missing. Anything else is a category, the empty string ``""`` included, which
      is what an empty CSV field reads as: "not given" often predicts clicks, so it gets its
      own ID unless listed. With ``hash_ids: false`` an empty or blank field is no ID (it is
      not an integer), and integer entries (``"-1"``) match integer columns too.
    - ``weight_column``: per-value weights, same shape (same separator or list lengths); a null
      weight (a list's None) counts as 1.
    - ``salt``: hash salt, defaults to the feature name, so equal values in two features get
      different IDs unless both features set the same salt.
    - ``hash_ids``: ``False`` takes integer values as IDs unchanged (the column already holds
      IDs; string columns are parsed as decimal int64).

    The embedding keys (``name``, ``table``, ``pooling``, ``max_length``) are ``FeatureConfig``'s,
    which this extends; ``embedding_feature`` is the feature as the embedding side sees it.
    """

    # the data side
    column: str | None = None
    """Source column; unset: `name`."""
    separator: str | None = None
    """Multi-hot values joined in one string column (`"a|b|c"`; empty tokens are no value); list columns
    (Parquet, ORC) are multi-hot without it."""
    weight_column: str | None = None
    """Column of per-value weights, the same shape as the values; a null weight counts as 1."""
    salt: str | None = None
    """Hash salt; unset: `name`, so equal values in two features get different IDs unless both set the same salt."""
    hash_ids: bool = True
    """`false`: integer values are the IDs, unchanged (string columns are parsed as decimal int64)."""
    missing_values: list[str] | None = None
    """Values that mean "no value" (no ID; a bag of only these is empty), e.g. `["", "-1"]`. Anything else is a
    category, `""` included (an empty field often predicts the label; list it to make it missing). Null is
    always missing; empty tokens of a `separator` column are no value; with `hash_ids: false` an empty field
    is no ID and integer entries match integer columns."""

    def embedding_feature(self) -> FeatureConfig:
        """This feature as the embedding side takes it: the ``FeatureConfig`` keys, table resolved."""
        return FeatureConfig(name=self.name, table=self.table_name, pooling=self.pooling, max_length=self.max_length)

    @model_validator(mode="after")
    def _check_sep(self) -> "SparseFeature":
        if self.separator == "":
            raise ValueError(f"sparse feature '{self.name}': separator must not be empty (use null for none)")
        return self

    @property
    def table_name(self) -> str:
        return self.table or self.name

    @property
    def source_column(self) -> str:
        return self.column or self.name

    @property
    def salt_value(self) -> str:
        return self.name if self.salt is None else self.salt


class Schema(ConfigModel):
    """Labels (>= 1), dense features and sparse features (>= 1), in model input order.

    ``missing_values``: the categorical values every sparse feature takes as missing unless it
    sets its own (default none: ``""`` is a category, null is missing).
    """

    labels: list[str] = Field(min_length=1)
    """Label column(s): one logit each, several labels make a multi-task model."""
    dense: list[DenseFeature] = Field(default_factory=list)
    """Dense (float) features, in model input order."""
    sparse: list[SparseFeature] = Field(min_length=1)
    """Sparse (categorical) features, at least one, in model input order."""
    missing_values: list[str] = Field(default_factory=list)
    """Categorical values every sparse feature takes as missing unless it sets its own, e.g. `[""]`; by default
    the empty string (an empty CSV field) is a category and only null is missing. The `criteo` preset sets
    `[""]`: that dataset defines an empty field as missing."""
    teacher: list[str] = Field(default_factory=list)
    """Columns of a teacher model's probabilities, one per label in ``labels`` order, for
    ``model.distill`` (empty: no teacher). Not read when scoring."""
    # scoring: label columns are not read (they may be absent) and labels come out as 0
    score_only: bool = False
    """Set by the scorer, not in configs: label and teacher columns are not read (they may be absent)."""

    @model_validator(mode="before")
    @classmethod
    def _labels_str(cls, data: Any) -> Any:
        if isinstance(data, dict) and isinstance(data.get("labels"), str):
            data = {**data, "labels": [data["labels"]]}
        return data

    @model_validator(mode="after")
    def _unique(self) -> "Schema":
        if self.teacher and len(self.teacher) != len(self.labels):
            raise ValueError(f"teacher: give one teacher score column per label ({len(self.labels)}: {self.labels}), "
                             f"got {len(self.teacher)}: {self.teacher}")
        names = [*self.labels, *self.teacher, *(d.name for d in self.dense), *(s.name for s in self.sparse)]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"names must be unique across labels, teacher, dense and sparse; repeated: {dup}")
        return self

    @property
    def feature_names(self) -> list[str]:
        """Sparse feature names in schema order (the keys of ``Batch.sparse``)."""
        return [s.name for s in self.sparse]

    @property
    def dense_names(self) -> list[str]:
        return [d.name for d in self.dense]

    @property
    def columns(self) -> list[str]:
        """Every source column the schema reads, each once, in a stable order."""
        cols: list[str] = []
        for c in [
            *([] if self.score_only else [*self.labels, *self.teacher]),
            *(d.source_column for d in self.dense),
            *(s.source_column for s in self.sparse),
            *(s.weight_column for s in self.sparse if s.weight_column),
        ]:
            if c not in cols:
                cols.append(c)
        return cols

    def missing_values_of(self, feature: SparseFeature) -> list[str]:
        """The values ``feature`` takes as missing: its own list, else the schema's."""
        return self.missing_values if feature.missing_values is None else feature.missing_values

    @property
    def categorical_columns(self) -> list[str]:
        """Columns to read as strings (so hex values like '68fd1e64' are never mangled)."""
        return list(dict.fromkeys(s.source_column for s in self.sparse))


def as_recorded(raw: dict[str, Any]) -> dict[str, Any]:
    """A schema as an export or checkpoint recorded it (every key written), read as it was
    trained: one recorded before ``missing_values`` existed took ``""`` as missing.

    Example:
        >>> as_recorded({"labels": ["y"], "sparse": [{"name": "c"}]})["missing_values"]
        ['']
    """
    return raw if "missing_values" in raw else {**raw, "missing_values": [""]}
