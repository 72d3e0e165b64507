"""Every table key but ``name`` can be set once under ``embedding:``: listed tables and the
tables only a feature names inherit it, and a listed table's own key wins (whole)."""

from __future__ import annotations

from typing import Any

import pytest

from ember.config import EmbeddingDefaults, from_dict
from ember.embedding import TableConfig
from ember.train.builder import build_components

# one non-default value per table key; a new TableConfig field must be added here
DEFAULTS: dict[str, Any] = {
    "dim": 3,
    "initializer": {"type": "normal", "std": 0.1},
    "optimizer": {"type": "sgd", "lr": 0.3},
    "seed": 42,
    "storage": {"host_rows": 1000},
    "min_count": 3,
    "ttl_steps": 50,
    "dtype": "bf16",
}
OWN: dict[str, Any] = {
    "dim": 5,
    "initializer": {"type": "zeros"},
    "optimizer": {"type": "adam", "lr": 0.002},
    "seed": 7,
    "storage": {"policy": "lru", "host_rows": 10},
    "min_count": 2,
    "ttl_steps": 9,
    "dtype": "fp16",
}


def _raw(embedding: dict[str, Any], tables: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "data": {"preset": "synthetic", "synthetic": {"num_dense": 1, "num_sparse": 3, "rows": 64, "eval_rows": 8}},
        "embedding": embedding,
        "tables": tables,
        "model": {"type": "lr"},
        "train": {"threads": 1, "progress": False},
    }


def test_every_table_key_but_name_is_an_embedding_default():
    assert set(EmbeddingDefaults.model_fields) == set(TableConfig.model_fields) - {"name"} == set(DEFAULTS) == set(OWN)


@pytest.mark.parametrize("key", sorted(DEFAULTS))
def test_listed_and_unlisted_tables_inherit_the_default(key: str):
    cfg = from_dict(_raw({key: DEFAULTS[key]}, [{"name": "C1"}]))
    tables = {t.name: t for t in cfg.table_configs()}
    assert set(tables) == {"C1", "C2", "C3"}
    want = TableConfig.model_validate({"name": "x", key: DEFAULTS[key]})
    for name in ("C1", "C2"):  # C1 listed without the key, C2 not listed at all
        assert getattr(tables[name], key) == getattr(want, key), (name, key)
        assert getattr(tables[name], key) != getattr(TableConfig(name="x"), key)


@pytest.mark.parametrize("key", sorted(OWN))
def test_a_listed_tables_own_key_wins_whole(key: str):
    cfg = from_dict(_raw(dict(DEFAULTS), [{"name": "C1", key: OWN[key]}]))
    tables = {t.name: t for t in cfg.table_configs()}
    own = TableConfig.model_validate({"name": "x", key: OWN[key]})
    assert getattr(tables["C1"], key) == getattr(own, key)  # not merged with the default (storage)
    assert getattr(tables["C2"], key) == getattr(TableConfig.model_validate({"name": "x", **DEFAULTS}), key)


def test_the_trainer_builds_tables_with_the_inherited_keys():
    cfg = from_dict(_raw({"dim": 2, "min_count": 2, "ttl_steps": 5, "seed": 11}, [{"name": "C1", "min_count": 4}]))
    parts = build_components(cfg)
    built = {name: t.config for name, t in parts.embeddings.tables.items()}
    assert {n: (c.dim, c.min_count, c.ttl_steps, c.seed) for n, c in built.items()} == {
        "C1": (2, 4, 5, 11), "C2": (2, 2, 5, 11), "C3": (2, 2, 5, 11)}
