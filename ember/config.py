"""The run config: YAML <-> frozen pydantic models, with dotted command-line overrides.

Example YAML (the demo's)::

    data:   {preset: synthetic, synthetic: {rows: 400000, eval_rows: 50000}, batch_size: 2048}
    embedding: {dim: 16, optimizer: {type: rowwise_adagrad, lr: 0.05}}
    model:  {type: dlrm, bottom_mlp: [128, 64, 16], top_mlp: [128, 64]}
    train:  {epochs: 1, dense_optimizer: {type: adam, lr: 0.001}}
"""

from __future__ import annotations

import copy
import difflib
import logging
from pathlib import Path
from typing import Any, Sequence

import yaml
from pydantic import Field, model_validator

from ember.checkpoint.config import CheckpointConfig, ExportConfig
from ember.config_base import ConfigModel, deep_merge
from ember.distributed.config import DistributedConfig
from ember.embedding.config import FeatureConfig, TableConfig, TableOptions
from ember.errors import ConfigError
from ember.featurize.schema import Schema
from ember.models.registry import ModelConfig
from ember.pipeline.config import PipelineConfig
from ember.source.config import DataConfig
from ember.train.config import EvalConfig, TrainConfig
from ember import once

__all__ = ["RunConfig", "EmbeddingDefaults", "MOVED_KEYS", "migrate", "check_sections", "load", "read_yaml", "from_dict",
           "apply_overrides", "to_yaml"]

log = logging.getLogger("ember")

# Keys that moved to the section of their concern: old dotted path -> new one. A config that uses
# an old name still works (``migrate`` moves it and says once what to write instead).
MOVED_KEYS: dict[str, str] = {
    "train.eval_every": "eval.every",
    "train.eval_max_batches": "eval.max_batches",
    "train.checkpoint_every": "checkpoint.every",
    "train.checkpoint_every_s": "checkpoint.every_s",
    "train.keep_checkpoints": "checkpoint.keep",
    "train.embedding_staleness": "pipeline.embedding_staleness",
}


class EmbeddingDefaults(TableOptions):
    """Defaults of every table, any table key but ``name`` (dim, initializer, optimizer, seed,
    storage, min_count, ttl_steps): tables a feature names but ``tables`` does not list use them
    whole; a listed table takes each key it leaves out from here (its own key wins, whole: a
    listed ``storage`` or ``optimizer`` replaces the default one, it is not merged into it)."""


class RunConfig(ConfigModel):
    """Everything a run needs; ``schema`` defaults to the data preset's schema."""

    data: DataConfig
    """Where the rows come from and how they are batched, shuffled and checked."""
    schema_: Schema | None = Field(None, alias="schema")
    """Which columns are labels, dense and sparse features (optional with a `data.preset`). Written `schema:` in
    YAML."""
    embedding: EmbeddingDefaults = EmbeddingDefaults()
    """Defaults of every table: any key of `tables[]` but `name`."""
    tables: list[TableConfig] = []
    """Tables that differ from the `embedding` defaults; a table a feature names but this list leaves out uses
    the defaults whole."""
    model: ModelConfig
    """The model: `type` picks it (dlrm, deepfm, wdl, dcn, mmoe, shared_bottom, lr, dmt); the other keys are its
    own."""
    train: TrainConfig = TrainConfig()
    """How long to train, the dense optimizer, precision, where the run is written."""
    eval: EvalConfig = EvalConfig()
    """Held-out evaluation on `data.eval`: when (`every`), how much (`max_batches`), what it reports (GAUC,
    calibration, NE, slices); and the rolling window of progressive validation over the training stream."""
    checkpoint: CheckpointConfig = CheckpointConfig()
    """When checkpoints are written (`every` steps, `every_s` seconds) and how many are kept (`keep`)."""
    pipeline: PipelineConfig = PipelineConfig()
    """The staged pipeline: which stages run on threads, the queue depth between them, and how far the embedding
    fetch may run ahead of the update (`embedding_staleness`)."""
    distributed: DistributedConfig = DistributedConfig()
    """Sharding and fault detection under torchrun; one process ignores it."""
    export: ExportConfig = ExportConfig()
    """Exports written while training, for `ember serve` to follow (full, then deltas); off unless `every_steps`
    or `every_s` is set."""

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
        if d.format == "sql":
            raise ValueError("train.mode: online streams files (data.train, data.watch); data.format: sql reads a query "
                             "in epochs: use train.mode: offline (a resumed run reads the rows added since, by key)")
        if not d.streams():
            raise ValueError("train.mode: online streams data.train files (csv, tsv, parquet, orc) or an Iceberg table's "
                             "appended data files: set data.format and data.train (a directory or glob, with data.watch "
                             "to follow new files), or data.format: iceberg with data.iceberg.table")
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
        """The schema's sparse features as the embedding side takes them (``SparseFeature.embedding_feature``)."""
        return [f.embedding_feature() for f in self.schema.sparse]


def _closest(name: str, choices: Sequence[str]) -> str | None:
    """The choice ``name`` most likely misspells (case ignored: ``c9`` finds ``C9``), or None."""
    lower = {c.lower(): c for c in choices}
    hint = difflib.get_close_matches(name.lower(), list(lower), n=1)
    return lower[hint[0]] if hint else None


def apply_overrides(raw: dict, overrides: Sequence[str]) -> dict:
    """Apply ``a.b.c=value`` overrides (value parsed as YAML) to a nested dict copy.

    ConfigError, naming the override, for one without ``=``, with no key or an empty part of
    its key path (``=3``, ``train..x=1``), a value that is not YAML (``train.epochs=[1``), or
    a path through a key that is not a section.

    Examples:
        >>> apply_overrides({"train": {"epochs": 1}}, ["train.epochs=2", "data.eval=[a.csv, b.csv]"])
        {'train': {'epochs': 2}, 'data': {'eval': ['a.csv', 'b.csv']}}
    """
    out = copy.deepcopy(raw)
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r} must look like key.path=value, e.g. train.epochs=2")
        key, value = item.split("=", 1)
        key = key.strip()
        if not key:
            raise ConfigError(f"override {item!r} names no key: write key.path=value, e.g. train.epochs={value or 2}")
        parts = key.split(".")
        if any(not p.strip() for p in parts):
            raise ConfigError(f"override {item!r}: key path '{key}' has an empty part (two dots, or a dot at an end); "
                              "write the sections joined by single dots, e.g. train.dense_optimizer.lr=0.01")
        node = out
        for i, p in enumerate(parts[:-1]):
            if node.get(p) is None:
                node[p] = {}
            elif not isinstance(node[p], dict):
                where = ".".join(parts[: i + 1])
                raise ConfigError(f"override {item!r}: '{where}' is {node[p]!r}, not a section with keys; set it "
                                  f"whole instead, e.g. {where}=<value>")
            node = node[p]
        node[parts[-1]] = _override_value(item, value)
    return out


class _UniqueKeyLoader(yaml.SafeLoader):
    """YAML's safe loader that refuses a key given twice in one mapping (plain YAML keeps the last
    silently: a second ``train:`` section would drop the first's settings without a word)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:  # type: ignore[override]
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)  # type: ignore[no-untyped-call]
            if isinstance(key, (str, int, float, bool)) and key in seen:
                raise yaml.constructor.ConstructorError(
                    "while reading a mapping", node.start_mark,
                    f"key '{key}' is given twice (first on line {seen[key] + 1}); a later one would replace the "
                    "earlier silently: give each key once", key_node.start_mark)
            seen[key] = key_node.start_mark.line
        return super().construct_mapping(node, deep=deep)


def _override_value(item: str, value: str) -> Any:
    """An override's value, parsed as YAML (``2`` is an int, ``[1, 2]`` a list, ``{a: 1}`` a mapping)."""
    try:
        return yaml.safe_load(value)
    except yaml.YAMLError as e:
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        mark = getattr(e, "problem_mark", None)
        at = f" at character {mark.column + 1}" if mark is not None and mark.line == 0 else ""
        raise ConfigError(f"override {item!r}: the value {value!r} does not parse as YAML ({problem}{at}); write a "
                          "list as [1, 2], a mapping as {a: 1}, and quote a string holding such characters") from None


def from_dict(raw: dict[str, Any]) -> RunConfig:
    """Validate a raw dict (after overrides), filling the data preset's defaults and schema.

    Examples:
        >>> cfg = from_dict({"data": {"preset": "synthetic"}, "model": {"type": "lr"}})
        >>> cfg.model.type, len(cfg.schema.sparse), cfg.schema.labels
        ('lr', 26, ['label'])
    """
    from ember.featurize.presets import preset_data_defaults, preset_schema

    if not isinstance(raw, dict):
        raise ConfigError(f"a run config must be a mapping, got {type(raw).__name__}")
    raw = migrate(raw)
    data = raw.get("data") or {}
    preset = data.get("preset") if isinstance(data, dict) else None  # (not a mapping: validation says so)
    if preset is not None:
        merged = deep_merge(preset_data_defaults(preset), data)
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
    check_sections(cfg)
    return cfg


def migrate(raw: dict[str, Any]) -> dict[str, Any]:
    """A copy of a raw config with every key of ``MOVED_KEYS`` under its new name; each old name
    found is logged once per process, saying what to write instead. Both names set to different
    values is a ConfigError naming both (which one was meant cannot be told).

    >>> migrate({"train": {"eval_every": 5, "epochs": 2}})
    {'train': {'epochs': 2}, 'eval': {'every': 5}}
    """
    out = copy.deepcopy(raw)
    for old, new in MOVED_KEYS.items():
        (osec, okey), (nsec, nkey) = old.split("."), new.split(".")
        section = out.get(osec)
        if not isinstance(section, dict) or okey not in section:
            continue
        value = section.pop(okey)
        target = out.get(nsec)
        if target is None:
            target = out[nsec] = {}
        elif not isinstance(target, dict):
            continue  # (validation names the section that is not a mapping)
        if nkey in target and target[nkey] != value:
            raise ConfigError(f"{old} ({value!r}) and {new} ({target[nkey]!r}) are both set: {old} is the old name of "
                              f"{new}; keep only {new}")
        target[nkey] = value
        if once.first("config.old_name", old):
            log.warning("config: %s is now %s; write that instead (the old name still works)", old, new)
    return out


def check_sections(cfg: RunConfig) -> None:
    """The rules that tie two sections of a run config together, in one place (a rule within one
    section is that section's validator; what needs the launch, such as the world size, is
    ``ember.train.distributed.check_distributed``'s):

    - every ``tables:`` entry (and ``distributed.tables`` key) names a table some sparse feature
      reads (a feature's ``table``, else its name), every ``model.towers`` entry a sparse feature,
      and ``train.task_weights`` gives one weight per label: an entry naming none would configure
      nothing, and its settings would silently never apply (or, extra weights, scale the loss);
    - the built-in models take pooled features only (``schema.sparse[].pooling``);
    - ``model.distill`` needs the teacher's scores (``schema.teacher``);
    - ``distributed.placement: towers`` needs a model of towers (``model.type: dmt``).
    (``train.mode: online`` against ``data`` is ``RunConfig``'s own validator: it needs no schema.)"""
    sequence = [f.name for f in cfg.schema.sparse if f.pooling == "sequence"]
    if sequence:
        raise ConfigError(f"sparse features {sequence} use pooling 'sequence', which the built-in models do not take; "
                          "use sum/mean/sqrtn for them or call EmbeddingCollection from your own model")
    if cfg.model.distill is not None and not cfg.schema.teacher:
        raise ConfigError("model.distill needs the teacher's scores: set schema.teacher to their columns "
                          "(one per label, probabilities in [0, 1])")
    if cfg.distributed.placement == "towers" and cfg.model.type != "dmt":
        raise ConfigError(f"distributed.placement towers needs a model of type dmt (towers of features); this run's "
                          f"model is {cfg.model.type}: use distributed.placement=tables")
    read = list(dict.fromkeys(f.table_name for f in cfg.schema.sparse))
    for i, t in enumerate(cfg.tables):
        if t.name not in read:
            hint = _closest(t.name, read)
            mean = f" (did you mean '{hint}'?)" if hint else ""
            raise ConfigError(f"tables[{i}] names table '{t.name}', which no sparse feature reads{mean}; the tables are "
                              f"{', '.join(read)} (a feature reads the table its 'table' key names, else its own name)")
    names = [t.name for t in cfg.tables]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ConfigError(f"tables lists {', '.join(twice)} more than once; give each table one entry")
    for name in cfg.distributed.tables:  # (a model's dim-1 first-order twin of table T is T__linear)
        if name not in read and name.removesuffix("__linear") not in read:
            hint = _closest(name, read)
            raise ConfigError(f"distributed.tables names table '{name}', which no sparse feature reads"
                              + (f" (did you mean '{hint}'?)" if hint else "") + f"; the tables are {', '.join(read)}")
    features = cfg.schema.feature_names
    for k, tower in enumerate(getattr(cfg.model, "towers", None) or []):
        for name in tower:
            if name not in features:
                hint = _closest(name, features)
                raise ConfigError(f"model.towers[{k}] names feature '{name}', which the schema does not have"
                                  + (f" (did you mean '{hint}'?)" if hint else "")
                                  + f"; the sparse features are {', '.join(features)}")
    weights, labels = cfg.train.task_weights, cfg.schema.labels
    if weights is not None and len(weights) != len(labels):
        raise ConfigError(f"train.task_weights gives {len(weights)} weight(s) {weights} for {len(labels)} task(s) "
                          f"(schema.labels: {', '.join(labels)}); give one weight per label, in that order")


def load(path: str | Path, overrides: Sequence[str] = ()) -> RunConfig:
    """Read a YAML run config, apply overrides, validate."""
    return from_dict(apply_overrides(read_yaml(path), overrides))


def read_yaml(path: str | Path) -> dict[str, Any]:
    """The mapping a YAML run config file holds; ConfigError naming the file (and, for YAML that
    does not parse, the line and column) when it is missing, a directory, not UTF-8 text, not
    YAML or not a mapping."""
    p = Path(path)
    if not p.exists():
        raise ConfigError(f"config file {p} does not exist; give the path of a YAML run config (e.g. configs/demo.yaml)")
    if p.is_dir():
        found = sorted(p.glob("*.yaml"))[:3]
        hint = f" (it holds {', '.join(str(f) for f in found)})" if found else ""
        raise ConfigError(f"config path {p} is a directory; give the YAML run config file in it{hint}")
    try:
        data = p.read_bytes()
    except OSError as e:
        raise ConfigError(f"config file {p} cannot be read ({e.strerror or e}); check its permissions") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(f"config file {p} is not UTF-8 text (byte 0x{data[e.start]:02x} at offset {e.start}); "
                          "give a YAML run config, saved as UTF-8") from None
    if "\x00" in text:
        raise ConfigError(f"config file {p} is binary (it holds NUL bytes), not YAML text; give a YAML run config")
    try:
        raw = yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 (a SafeLoader)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark
        where = f"{p}, line {mark.line + 1}, column {mark.column + 1}" if mark is not None else str(p)
        context = f" ({e.context})" if e.context else ""
        raise ConfigError(f"config file {where}: YAML does not parse: {e.problem}{context}") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"config file {p}: YAML does not parse: {str(e).splitlines()[0]}") from None
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ConfigError(f"config file {p} holds a {type(raw).__name__}, not a mapping of sections "
                          "(data:, model:, train:, ...)")
    return raw


def to_yaml(cfg: RunConfig) -> str:
    """The fully resolved config, as YAML (written into every run directory)."""
    return yaml.safe_dump(cfg.model_dump(mode="json", by_alias=True), sort_keys=False)

