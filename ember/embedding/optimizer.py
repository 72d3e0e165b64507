"""SparseOptimizer: the embedding tables' optimizer, used like a ``torch.optim`` optimizer."""

from __future__ import annotations

from ember.embedding.collection import EmbeddingCollection
from ember.embedding.group import GroupLookup

__all__ = ["SparseOptimizer"]


class SparseOptimizer:
    """Applies each table's own update rule (its config's ``optimizer``) to the rows a backward
    pass reached, then writes them back to their tiers.

    ``step()`` after ``loss.backward()``; ``zero_grad()`` drops gradients not yet applied. A
    ``step()`` with no gradient since the last one is an error, and so is the next training
    forward when a computed gradient was never stepped: embeddings never freeze silently.

    Example:
        >>> import torch
        >>> from ember.embedding import FeatureConfig, TableConfig
        >>> from ember.batch import SparseFeatures
        >>> ec = EmbeddingCollection([TableConfig(name="t", dim=2, optimizer={"type": "sgd", "lr": 1.0})],
        ...                          [FeatureConfig(name="a", table="t")])
        >>> opt = SparseOptimizer(ec)
        >>> sf = SparseFeatures(["a"], torch.tensor([7]), torch.tensor([1]))
        >>> before = ec(sf)["a"].detach()
        >>> ec(sf)["a"].sum().backward()
        >>> opt.step()
        >>> (ec(sf)["a"].detach() - before).tolist()   # each weight moved by -lr * 1
        [[-1.0, -1.0]]
    """

    def __init__(self, *collections: EmbeddingCollection) -> None:
        if not collections:
            raise ValueError("SparseOptimizer needs at least one EmbeddingCollection")
        wrong = [type(c).__name__ for c in collections if not isinstance(c, EmbeddingCollection)]
        if wrong:
            raise TypeError(f"SparseOptimizer steps EmbeddingCollections, got {wrong}; a dense module's parameters "
                            "take a torch.optim optimizer")
        self.collections = list(collections)
        self.steps = 0  # step() calls so far: the global step lr schedules read (set it when resuming)

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Forget embedding gradients computed but not applied."""
        for ec in self.collections:
            ec.zero_grad()

    def step(self) -> None:
        """Update and write back the rows of every lookup whose backward ran since the last step
        (lr schedules read ``steps``, then it counts this step)."""
        self.apply(self.take(), self.steps)
        self.steps += 1

    def take(self) -> list[GroupLookup]:
        """The lookups whose backward ran since the last call, for ``apply`` later (a pipeline
        applies them on another thread while the next batch's forward runs)."""
        ready, waiting = [], 0
        for ec in self.collections:
            r, w = ec.take_gradients()
            ready += r
            waiting += w
        if not ready:
            why = (
                f"{waiting} training lookup(s) got no gradient: call loss.backward() before step(), "
                "and check that the embeddings reach the loss"
                if waiting else "there was no training forward since the last step()"
            )
            raise RuntimeError(f"SparseOptimizer.step(): no embedding gradients to apply; {why}")
        return ready

    @staticmethod
    def apply(ready: list[GroupLookup], step: int | None = None) -> None:
        """Update and write back ``ready`` (from ``take``), in order; ``step``: the global step
        (0-based) lr schedules read (required when a table has a schedule)."""
        for lk in ready:
            lk.apply(step)
