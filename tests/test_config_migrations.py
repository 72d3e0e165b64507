"""Keys moved to the section of their concern (``ember.config.MOVED_KEYS``): the new names drive
the run, the old names still work (moved, with one log line saying what to write instead), and
both names set to different values is an error naming both."""

from __future__ import annotations

import logging

import pytest
import yaml

from ember.cli import main
from ember.config import MOVED_KEYS, from_dict, load, migrate, to_yaml
from ember import once
from ember.errors import ConfigError

BASE = {"data": {"preset": "synthetic"}, "model": {"type": "lr"}}
VALUES = {"train.eval_every": 7, "train.eval_max_batches": 3, "train.checkpoint_every": 11,
          "train.checkpoint_every_s": 2.5, "train.keep_checkpoints": 4, "train.embedding_staleness": 2}


def _get(cfg, dotted: str):
    section, key = dotted.split(".")
    return getattr(getattr(cfg, section), key)


def _with(path: str, value) -> dict:
    section, key = path.split(".")
    return {**BASE, section: {key: value}}


def test_every_moved_key_has_a_value_here_and_the_new_name_drives_the_config():
    assert set(VALUES) == set(MOVED_KEYS)
    for old, new in MOVED_KEYS.items():
        assert _get(from_dict(_with(new, VALUES[old])), new) == VALUES[old]


def test_an_old_name_is_moved_and_logged_once_with_what_to_write(caplog, monkeypatch):
    once.forget("config.old_name")
    for old, new in MOVED_KEYS.items():
        with caplog.at_level(logging.WARNING, logger="ember"):
            caplog.clear()
            cfg = from_dict(_with(old, VALUES[old]))
            assert _get(cfg, new) == VALUES[old]
            assert [r.getMessage() for r in caplog.records] == [
                f"config: {old} is now {new}; write that instead (the old name still works)"]
            caplog.clear()
            from_dict(_with(old, VALUES[old]))  # said once per process
            assert caplog.records == []
        assert old.split(".")[1] not in to_yaml(cfg).split(f"{new.split('.')[0]}:")[0].split("train:")[-1]


def test_both_names_equal_is_fine_different_is_an_error_naming_both():
    raw = {**BASE, "train": {"eval_every": 5}, "eval": {"every": 5}}
    assert from_dict(raw).eval.every == 5
    raw["eval"]["every"] = 6
    with pytest.raises(ConfigError, match=r"train.eval_every \(5\) and eval.every \(6\) are both set.*keep only eval.every"):
        from_dict(raw)


def test_migrate_leaves_its_argument_alone_and_keeps_the_other_keys():
    raw = {"train": {"checkpoint_every": 3, "epochs": 2}, "checkpoint": {"keep": 5}}
    out = migrate(raw)
    assert raw == {"train": {"checkpoint_every": 3, "epochs": 2}, "checkpoint": {"keep": 5}}
    assert out == {"train": {"epochs": 2}, "checkpoint": {"keep": 5, "every": 3}}


def test_old_names_work_in_files_and_overrides_and_a_recorded_old_config_loads(tmp_path):
    path = tmp_path / "old.yaml"
    path.write_text(yaml.safe_dump({**BASE, "train": {"keep_checkpoints": 3, "embedding_staleness": 1}}))
    cfg = load(path, ["train.eval_every=9", "checkpoint.every=4"])
    assert (cfg.checkpoint.keep, cfg.pipeline.embedding_staleness, cfg.eval.every, cfg.checkpoint.every) == (3, 1, 9, 4)
    # a run directory's config.yaml from before the move (what a resumed old checkpoint records)
    recorded = yaml.safe_load(to_yaml(cfg))
    recorded["train"].update(eval_every=recorded["eval"].pop("every"), keep_checkpoints=recorded["checkpoint"].pop("keep"))
    assert from_dict(recorded) == cfg


def test_the_command_line_names_both_keys_and_exits_2(tmp_path, capsys):
    path = tmp_path / "both.yaml"
    path.write_text(yaml.safe_dump({**BASE, "train": {"checkpoint_every": 2, "out_dir": str(tmp_path)},
                                    "checkpoint": {"every": 3}}))
    assert main(["train", "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert "train.checkpoint_every (2) and checkpoint.every (3) are both set" in err and "Traceback" not in err


def test_rules_across_sections_are_checked_when_the_config_is_read():
    seq = {**BASE, "schema": {"labels": ["y"], "sparse": [{"name": "a", "pooling": "sequence"}]}}
    with pytest.raises(ConfigError, match=r"sparse features \['a'\] use pooling 'sequence'"):
        from_dict(seq)
    with pytest.raises(ConfigError, match="model.distill needs the teacher's scores"):
        from_dict({**BASE, "model": {"type": "lr", "distill": {}}})
    with pytest.raises(ConfigError, match="distributed.placement towers needs a model of type dmt"):
        from_dict({**BASE, "distributed": {"placement": "towers"}})
