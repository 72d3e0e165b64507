"""The configuration guide's full config example (docs/configuration.md) must stay a valid config;
config errors name the key."""

from __future__ import annotations

import re

import pytest
import yaml

from ember.config import apply_overrides, from_dict, load
from ember.errors import ConfigError
from tests.conftest import REPO


def _readme_config() -> dict:
    text = (REPO / "docs" / "configuration.md").read_text()
    block = re.search(r"```yaml\n(.*?)```", text, re.S)
    assert block, "docs/configuration.md has no yaml block"
    return yaml.safe_load(block.group(1))


def test_readme_example_validates():
    cfg = from_dict(_readme_config())
    assert cfg.data.format == "tsv" and cfg.model.type == "dlrm"
    tables = {t.name: t for t in cfg.table_configs()}
    assert tables["C1"].optimizer.type == "ftrl"
    assert {f.name for f in cfg.schema.sparse} == {"C1", "tags"}


def test_shipped_configs_validate():
    for path in sorted((REPO / "configs").glob("*.yaml")):
        load(path)


@pytest.mark.parametrize(
    "override, message",
    [
        ("train.epoch=2", "did you mean 'epochs'"),
        ("model.type=dlrn", "unknown model type 'dlrn'"),
        ("embedding.optimizer.type=adamw", "optimizer"),
        ("data.on_bad_rows=ignore", "on_bad_rows"),
        ("train.dense_optimizer.lr=-1", "dense_optimizer.lr"),
    ],
)
def test_bad_config_names_the_key(override, message):
    raw = apply_overrides(yaml.safe_load((REPO / "configs" / "demo.yaml").read_text()), [override])
    with pytest.raises(ConfigError, match=re.escape(message)):
        from_dict(raw)


def test_override_syntax_error():
    with pytest.raises(ConfigError, match="key.path=value"):
        apply_overrides({}, ["train.epochs"])


def test_listed_tables_inherit_embedding_defaults():
    raw = yaml.safe_load((REPO / "configs" / "demo.yaml").read_text())
    raw["embedding"] = {"dim": 16, "optimizer": {"type": "adam", "lr": 0.002}}
    raw["tables"] = [{"name": "C1", "optimizer": {"type": "sgd", "lr": 0.1}}, {"name": "C2"}]
    tables = {t.name: t for t in from_dict(raw).table_configs()}
    assert tables["C1"].optimizer.type == "sgd" and tables["C1"].dim == 16
    assert tables["C2"].optimizer.type == "adam" and tables["C2"].optimizer.lr == 0.002
    assert tables["C3"].optimizer.type == "adam"


def test_readme_schedule_and_early_stopping_examples_validate():
    """The YAML fragments shown for lr schedules and early stopping are valid on top of a config."""
    text = (REPO / "docs" / "configuration.md").read_text()
    blocks = [b for b in re.findall(r"```yaml\n(.*?)```", text, re.S) if "schedule:" in b or "early_stopping:" in b]
    assert len(blocks) == 2
    for block in blocks:
        raw = yaml.safe_load((REPO / "configs" / "demo.yaml").read_text())
        for section, values in yaml.safe_load(block).items():
            raw[section] = {**(raw.get(section) or {}), **values}
        cfg = from_dict(raw)
        assert cfg.train.early_stopping is not None or cfg.train.dense_optimizer.schedule is not None
