"""TableConfig: what a table is (dim, initialiser, optimizer, storage)."""

from __future__ import annotations


from pydantic import Field

from ember.config_base import ConfigModel
from ember.embedding.codec import RowDtype, packed_words
from ember.embedding.init import InitializerConfig
from ember.featurize.schema import FeatureConfig, PoolingMode
from ember.optim import RowWiseAdagrad, SparseOptimizerConfig
from ember.tiers.storage import StorageConfig

__all__ = ["TableOptions", "TableConfig", "FeatureConfig", "PoolingMode"]


class TableOptions(ConfigModel):
    """Everything a table is but its name. The run config's ``embedding:`` section is one of
    these: the defaults every table inherits, key by key (see :class:`TableConfig` for what
    each key does)."""

    dim: int = Field(16, gt=0)
    """Embedding width D."""
    initializer: InitializerConfig = InitializerConfig()
    """How a new ID's row starts: a pure function of (table seed, ID)."""
    optimizer: SparseOptimizerConfig = Field(default_factory=lambda: RowWiseAdagrad(lr=0.05))
    """The sparse optimizer (`type`: sgd, adagrad, rowwise_adagrad, adam, ftrl); it updates only the rows a batch
    touched."""
    seed: int | None = Field(None, ge=0, lt=2**63)
    """Seed of the table's initial rows; unset, it is derived from `train.seed` and the table name (tables
    differ; changing `train.seed` changes every table's init)."""
    storage: StorageConfig = StorageConfig()
    """Where the rows live (device cache, host memory, disk); unset: all in host memory."""
    min_count: int = Field(1, ge=1)
    """An ID gets its own row after this many sightings; before, it reads a shared all-zero row and gets no
    update."""
    ttl_steps: int | None = Field(None, gt=0)
    """A row not looked up for more than this many training steps is dropped; its ID comes back freshly
    initialised."""
    dtype: RowDtype = "fp32"
    """How the weights are stored in every tier, checkpoint and export: `fp32`, `bf16` or `fp16` (optimizer state
    stays fp32) (see Capacity planning, "Row storage dtype")."""


class TableConfig(TableOptions):
    """One embedding table. IDs are arbitrary int64; no vocabulary size is needed.

    ``storage`` says where rows live (default: all in host memory). ``seed`` fixes the table's
    row initialisation; unset, it is derived from the run's ``train.seed`` and the table's name
    (``table_seed``), so tables differ from one another and the run seed changes every init. ``min_count``: an ID gets
    its own row only once it has been looked up that many times; until then it reads a shared
    all-zero row and receives no update (DeepRec's counter filter). ``ttl_steps``: a row not
    looked up for more than that many training steps is gone; its ID comes back freshly
    initialised (and, with ``min_count``, must be counted again). ``dtype``: how the weights are
    stored in every tier, checkpoint and export (``fp32``, ``bf16`` or ``fp16``; optimizer state
    and the last-seen step stay fp32); updates are computed in fp32 and rounded back
    stochastically (``ember.embedding.codec``).

    Example:
        >>> t = TableConfig(name="user", dim=16, optimizer={"type": "adam", "lr": 1e-3})
        >>> t.optimizer.state_dim(t.dim), t.record_dim
        (33, 49)
    """

    name: str = Field(min_length=1)
    """The name features refer to (`schema.sparse[].table`)."""

    @property
    def record_dim(self) -> int:
        """Floats per record: weights then optimizer state (what items()/load() exchange)."""
        return self.dim + self.optimizer.state_dim(self.dim)

    @property
    def stored_dim(self) -> int:
        """Floats per record as the tiers store it: record_dim, plus the last-seen step with a TTL."""
        return self.record_dim + (1 if self.ttl_steps is not None else 0)

    @property
    def stored_words(self) -> int:
        """4-byte words per record in the tiers: ``stored_dim`` packed at ``dtype`` (16-bit weights
        two to a word, the rest fp32), what capacity plans and tier files are sized by."""
        return packed_words(self.dtype, self.dim, self.stored_dim)
