"""Checkpoints of a training run: the one place that writes them, decides when one is due, and
restores one into a run's parts.

``Checkpointer.save(state)`` writes the parts at a ``RunState`` (``ember.train.run_state``):
tables, dense model and optimizer, loss scale, early-stopping state, and the position (with
the data position of the loader it follows). The same state is written once: a second save
of it returns the first one's path. A save is due after every ``checkpoint.every``-th
step and after a step marked by ``checkpoint.every_s`` (``mark``: decided when that
step's batch is fetched, so the fetch gate holds after it).

``restore(parts, ckpt, exact)`` is how every caller loads a checkpoint: resume and
``train.restore_best`` (``exact``: optimizers and random state too), ``train.init_from`` and
``ember eval`` / ``export`` (the weights and the tables' counters).
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, Protocol

import torch

from ember.checkpoint.load import load_dense, load_tables, restore_rng, restore_table_state, verify_checkpoint
from ember.checkpoint.save import save_checkpoint
from ember.config import RunConfig
from ember.errors import CheckpointError
from ember.train import clock
from ember.train.builder import Components, keep_implementation
from ember.train.distributed import config_differences, flatten
from ember.train.run_state import DataPosition, RunState

if TYPE_CHECKING:  # early stopping restores through this module
    from ember.train.early_stop import EarlyStopping

__all__ = ["Checkpointer", "Restored", "restore"]


class _Follows(Protocol):
    def data_position(self, batch: int) -> DataPosition: ...


class Checkpointer:
    """Saves the run's checkpoints under ``run_dir/checkpoints`` (see the module docstring).

    ``early``: its state travels in every checkpoint. ``follow(loader)``: the training loader
    whose data position the next saves record (before any: the state's own ``data``).
    """

    def __init__(self, cfg: RunConfig, parts: Components, run_dir: Path, early: EarlyStopping | None = None) -> None:
        self.cfg, self.parts, self.root, self.early = cfg, parts, run_dir / "checkpoints", early
        self.every, self.every_s = cfg.checkpoint.every, cfg.checkpoint.every_s
        self.marked: set[int] = set()  # steps after which checkpoint.every_s asked for a checkpoint
        self.last_save = clock.now()  # when the last checkpoint was written
        self._saved: dict[tuple[int, int, int], Path] = {}
        self._loader: _Follows | None = None

    def follow(self, loader: _Follows) -> None:
        self._loader = loader

    def save(self, state: RunState) -> Path:
        """Write the parts at ``state`` (once: the same state again returns its path)."""
        key = (state.step, state.epoch, state.batch)
        if key in self._saved:  # this exact state is on disk already
            return self._saved[key]
        p = self.parts
        dense: dict[str, Any] = {"model": p.model.state_dict(), "optimizer": p.dense_optimizer.state_dict()}
        if p.scaler is not None:
            dense["loss_scaler"] = p.scaler.state_dict()
        if self.early is not None:
            dense["early_stopping"] = self.early.state_dict()
        data = self._loader.data_position(state.batch) if self._loader is not None else state.data
        at = RunState(state.step, state.epoch, state.batch, data)
        # distributed: every rank writes its own part of every table, rank 0 the manifest last
        path = save_checkpoint(self.root, at.step, p.collections(), dense, at.position(),
                               self.cfg.model_dump(mode="json", by_alias=True), self.cfg.checkpoint.keep, p.dist)
        self._saved[key] = path
        self.last_save = clock.now()
        return path

    def due(self, step: int) -> bool:
        """Whether a checkpoint is due after ``step`` (every ``checkpoint.every`` steps, or marked)."""
        return bool(self.every and step % self.every == 0) or step in self.marked

    def time_due(self) -> bool:
        """Whether ``checkpoint.every_s`` passed since the last save, with no save marked yet."""
        return self.every_s is not None and not self.marked and clock.now() - self.last_save >= self.every_s

    def mark(self, step: int) -> None:
        """Make a checkpoint due after ``step``."""
        self.marked.add(step)

    def after_step(self, state: RunState) -> None:
        """At a quiet engine after ``state.step``: save when one is due."""
        if self.due(state.step):
            self.save(state)
            self.marked.discard(state.step)


@dataclass
class Restored:
    """What ``restore`` read besides the parts: the manifest, the dense state (``dense.pt``) and
    the run state the checkpoint recorded."""

    manifest: dict[str, Any]
    dense: dict[str, Any]
    state: RunState


def restore(parts: Components, ckpt: Path, exact: bool, cfg: RunConfig | None = None,
            manifest: dict[str, Any] | None = None) -> Restored:
    """Make ``parts`` hold checkpoint ``ckpt``: every table emptied, then its rows (distributed:
    the rows this rank owns, of every part whatever world size saved it), the tables' counters
    (TTL steps, min_count admission counts) and the dense model; ``exact`` (resume, restore_best):
    the dense optimizer, the loss scale and the random state too.

    ``manifest``: already verified (else it is verified here, the ranks sharing the hashing).
    A state that does not fit (another model shape or dense optimizer) raises CheckpointError
    naming the keys of ``cfg`` that differ from the checkpoint's run."""
    manifest = manifest if manifest is not None else verify_checkpoint(ckpt, parts.dist)
    if cfg is not None:
        check_input_order(ckpt, manifest, cfg)
    owned = parts.owned()
    for ec in parts.collections():  # rows created after the checkpoint are gone
        for table in ec.tables.values():
            ids = [i for i, _ in table.items()]
            if ids:
                table.tier.remove(torch.cat(ids))
    load_tables(ckpt, parts.collections(), manifest, owned, exact)
    dense = load_dense(ckpt)
    with _fits(ckpt, manifest, cfg, "model"):
        parts.model.load_state_dict(dense["model"])
    restore_table_state(parts.collections(), dense, owned)
    if exact:
        with _fits(ckpt, manifest, cfg, "train.dense_optimizer"):
            keep_implementation(parts.dense_optimizer, dense["optimizer"])
        if parts.scaler is not None and "loss_scaler" in dense:
            parts.scaler.load_state_dict(dense["loss_scaler"])
        restore_rng(dense["rng"])
    return Restored(manifest, dense, RunState.from_dict(manifest))


# the schema's lists whose order is the model's input layout (what the weights were trained on)
_ORDERED = (("sparse", "the sparse features"), ("dense", "the dense features"), ("labels", "the labels"),
            ("teacher", "the teacher columns"))


def check_input_order(ckpt: Path, manifest: dict[str, Any], cfg: RunConfig) -> None:
    """CheckpointError when this config lists the checkpoint's features (or labels) in another
    order: the model takes its inputs by position, so its weights would meet swapped inputs
    and score silently wrong (same shapes: nothing else notices). A list whose names differ is
    another model (a shape check, or a table without rows, says so), not a reorder."""
    saved = (manifest.get("config") or {}).get("schema") or {}
    mine = cfg.schema.model_dump(mode="json")
    for key, what in _ORDERED:
        names = [[e["name"] if isinstance(e, dict) else e for e in s.get(key) or []] for s in (saved, mine)]
        if names[0] != names[1] and sorted(names[0]) == sorted(names[1]):
            raise CheckpointError(
                f"checkpoint {ckpt} was trained with {what} in the order {names[0]}, but schema.{key} lists them as "
                f"{names[1]}: the model takes its inputs by position, so its weights would meet swapped inputs; list "
                f"schema.{key} in the checkpoint's order")


@contextmanager
def _fits(ckpt: Path, manifest: dict[str, Any], cfg: RunConfig | None, section: str) -> Iterator[None]:
    """Turn torch's error for a state that does not fit (another model shape, another dense
    optimizer) into a CheckpointError naming the config keys that differ from the checkpoint's
    run (every rank of a distributed run raises the same)."""
    try:
        yield
    except (RuntimeError, ValueError, KeyError) as e:
        mine = {} if cfg is None else flatten(cfg.model_dump(mode="json", by_alias=True))
        mine = {k: v for k, v in mine.items() if k.startswith(section + ".")}
        saved = {k: v for k, v in flatten(manifest.get("config", {})).items() if k.startswith(section + ".")}
        diffs = config_differences([saved, mine], names=["checkpoint", "this config"]) if cfg is not None else []
        raise CheckpointError(
            f"checkpoint {ckpt} does not fit this config's {section} ({type(e).__name__}: {' '.join(str(e).split())[:240]}); "
            + (f"it was written with {'; '.join(diffs)}; " if diffs else "")
            + f"resume or init_from it with the {section} it was trained with") from None
