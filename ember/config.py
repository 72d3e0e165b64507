"""The run config: YAML <-> frozen pydantic models, with dotted command-line overrides.

Example YAML (the demo's)::

    data:   {preset: synthetic, synthetic: {rows: 400000, eval_rows: 50000}, batch_size: 2048}
    embedding: {dim: 16, optimizer: {type: rowwise_adagrad, lr: 0.05}}
    model:  {type: dlrm, bottom_mlp: [128, 64, 16], top_mlp: [128, 64]}
    train:  {epochs: 1, dense_optimizer: {type: adam, lr: 0.001}}
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, Sequence

import yaml
from pydantic import Field, model_validator

from ember.checkpoint.config import ExportConfig
from ember.config_base import ConfigModel
from ember.distributed.config import DistributedConfig
from ember.embedding.config import FeatureConfig, TableConfig, TableOptions
from ember.errors import ConfigError
from ember.featurize.schema import Schema, SparseFeature
from ember.models.registry import ModelConfig
from ember.pipeline.config import PipelineConfig
from ember.source.config import DataConfig
from ember.train.config import EvalConfig, TrainConfig

__all__ = ["RunConfig", "EmbeddingDefaults", "feature_config", "load", "from_dict", "apply_overrides", "to_yaml"]


class EmbeddingDefaults(TableOptions):
    """Defaults of every table, any table key but ``name`` (dim, initializer, optimizer, seed,
    storage, min_count, ttl_steps): tables a feature names but ``tables`` does not list use them
    whole; a listed table takes each key it leaves out from here (its own key wins, whole: a
    listed ``storage`` or ``optimizer`` replaces the default one, it is not merged into it)."""


class RunConfig(ConfigModel):
    """Everything a run needs; ``schema`` defaults to the data preset's schema."""

    data: DataConfig
    schema_: Schema | None = Field(None, alias="schema")
    embedding: EmbeddingDefaults = EmbeddingDefaults()
    tables: list[TableConfig] = []
    model: ModelConfig
    train: TrainConfig = TrainConfig()
    pipeline: PipelineConfig = PipelineConfig()
    distributed: DistributedConfig = DistributedConfig()
    export: ExportConfig = ExportConfig()  # exports while training: full, then deltas (ember.checkpoint.delta)
    eval: EvalConfig = EvalConfig()

    model_config = {**ConfigModel.model_config, "populate_by_name": True, "protected_namespaces": ()}

    @model_validator(mode="before")
    @classmethod
    def _online_defaults(cls, raw: Any) -> Any:
        """``train.mode: online`` trains in arrival order: ``data.shuffle_buffer`` defaults to 0."""
        if isinstance(raw, dict) and isinstance(raw.get("train"), dict) and raw["train"].get("mode") == "online" \
                and isinstance(raw.get("data"), dict) and "shuffle_buffer" not in raw["data"]:
            raw = {**raw, "data": {**raw["data"], "shuffle_buffer": 0}}
        return raw

    @model_validator(mode="after")
    def _check_online(self) -> "RunConfig":
        t, d = self.train, self.data
        if d.watch is not None and t.mode != "online":
            raise ValueError("data.watch streams new files without end, which epochs cannot pass over: set "
                             "train.mode: online (or remove data.watch to train offline on the files there now)")
        if t.mode != "online":
            return self
        if d.format == "synthetic" or d.train is None:
            raise ValueError("train.mode: online streams data.train files (csv, tsv, parquet, orc): set data.format "
                             "and data.train (a directory or glob, with data.watch to follow new files)")
        if t.epochs != 1:  # (1, the default, is what a recorded config holds)
            raise ValueError(f"train.epochs ({t.epochs}) does not apply to train.mode: online (one pass over the stream, no "
                             "epochs): remove it; bound the run with train.max_steps or data.watch.idle_timeout_s")
        if d.shuffle_buffer:
            raise ValueError(f"data.shuffle_buffer is {d.shuffle_buffer} but train.mode: online trains rows in "
                             "arrival order (the checkpoint records a position in the stream): set it to 0")
        return self

    @property
    def schema(self) -> Schema:  # type: ignore[override]
        if self.schema_ is None:
            raise ConfigError("config has no schema: set 'schema' or a 'data.preset'")
        return self.schema_

    def table_configs(self) -> list[TableConfig]:
        """Listed tables plus a default-configured table for every other table a feature names."""
        listed = {t.name: t for t in self.tables}
        out = list(self.tables)
        for f in self.schema.sparse:
            name = f.table_name
            if name not in listed:
                listed[name] = TableConfig(name=name, **dict(self.embedding))
                out.append(listed[name])
        return out

    def features(self) -> list[FeatureConfig]:
        """The schema's sparse features as embedding FeatureConfigs (name, table, pooling, ...)."""
        return [feature_config(f) for f in self.schema.sparse]


def feature_config(feature: SparseFeature) -> FeatureConfig:
    """The embedding FeatureConfig of a schema feature: every key the two share, table resolved.

    The schema (featurize) sits below embedding and so cannot build FeatureConfigs itself.
    """
    shared = {k: getattr(feature, k) for k in FeatureConfig.model_fields if k in SparseFeature.model_fields}
    return FeatureConfig(**{**shared, "table": feature.table_name})


def apply_overrides(raw: dict, overrides: Sequence[str]) -> dict:
    """Apply ``a.b.c=value`` overrides (value parsed as YAML) to a nested dict copy."""
    out = copy.deepcopy(raw)
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r} must look like key.path=value, e.g. train.epochs=2")
        key, value = item.split("=", 1)
        node = out
        parts = key.strip().split(".")
        for p in parts[:-1]:
            if not isinstance(node.get(p), dict):
                node[p] = {} if node.get(p) is None else node[p]
                if not isinstance(node[p], dict):
                    raise ConfigError(f"override {item!r}: '{p}' is not a section")
            node = node[p]
        node[parts[-1]] = yaml.safe_load(value)
    return out


def from_dict(raw: dict[str, Any]) -> RunConfig:
    """Validate a raw dict (after overrides), filling the data preset's defaults and schema."""
    from ember.featurize.presets import preset_data_defaults, preset_schema

    if not isinstance(raw, dict):
        raise ConfigError(f"a run config must be a mapping, got {type(raw).__name__}")
    raw = copy.deepcopy(raw)
    data = raw.get("data") or {}
    preset = data.get("preset")
    if preset is not None:
        merged = _deep_merge(preset_data_defaults(preset), data)
        raw["data"] = merged
    defaults = raw.get("embedding") or {}
    if isinstance(raw.get("tables"), list) and isinstance(defaults, dict):
        # a listed table takes every key it leaves out from the `embedding` defaults
        inherit = {k: v for k, v in defaults.items() if k in TableOptions.model_fields}
        raw["tables"] = [{**inherit, **t} if isinstance(t, dict) else t for t in raw["tables"]]
    cfg = RunConfig.parse(raw)
    if cfg.schema_ is None and cfg.data.preset is not None:
        schema = preset_schema(cfg.data.preset, cfg.data)
        cfg = cfg.model_copy(update={"schema_": schema})
    cfg.schema  # raises when neither is given
    return cfg


def load(path: str | Path, overrides: Sequence[str] = ()) -> RunConfig:
    """Read a YAML run config, apply overrides, validate."""
    p = Path(path)
    if not p.exists():
        raise ConfigError(f"config file {p} does not exist")
    with open(p) as fh:
        raw = yaml.safe_load(fh) or {}
    return from_dict(apply_overrides(raw, overrides))


def to_yaml(cfg: RunConfig) -> str:
    """The fully resolved config, as YAML (written into every run directory)."""
    return yaml.safe_dump(cfg.model_dump(mode="json", by_alias=True), sort_keys=False)


def _deep_merge(base: dict, top: dict) -> dict:
    out = dict(base)
    for k, v in top.items():
        out[k] = _deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out
