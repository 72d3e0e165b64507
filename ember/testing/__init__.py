"""Test helpers: the per-table reference implementation (the oracle of the grouped engine) and
small conveniences over the tier protocol."""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["apply", "lookup", "read", "rows", "run_state", "assert_identical", "assert_export_scores_as_eval",
           "group_step", "SPARSE_OPTIMIZERS"]

# one config of every sparse optimizer type (tests/optim checks that none is missing)
SPARSE_OPTIMIZERS: list[dict] = [
    {"type": "sgd", "lr": 0.05},
    {"type": "adagrad", "lr": 0.05},
    {"type": "rowwise_adagrad", "lr": 0.05},
    {"type": "adam", "lr": 0.01},
    {"type": "ftrl", "alpha": 0.05, "l1": 0.001, "l2": 0.001},
]


def read(tier, ids: Tensor) -> tuple[Tensor, Tensor]:
    """(records [N, R] on the tier's device, found mask [N]) through ``Tier.get_into``; rows of
    absent IDs are zero."""
    out = torch.zeros(ids.numel(), tier.record_dim, device=tier.device)
    return out, tier.get_into(ids, out)


def rows(table, ids: Tensor) -> Tensor:
    """Records [N, record_dim] of ``ids`` in an EmbeddingTable (decoded to fp32): stored rows, fresh
    rows for absent IDs."""
    out, found = read(table.tier, ids)
    out = table.codec.decode(out.cpu())[:, : table.config.record_dim].clone()
    miss = ~found
    if bool(miss.any()):
        out[miss] = table.new_records(ids[miss])
    return out


def lookup(table, ids: Tensor, train: bool = True):
    """One table's lookup of unique ``ids`` through the engine's phases (plan, fetch), as a group
    of one; ``.records`` [U, stored_dim] follow the order of ``ids``. Pass it to ``apply``."""
    from ember.batch.sparse import SparseFeatures
    from ember.embedding.config import FeatureConfig
    from ember.embedding.group import TableGroup

    group = TableGroup([table], {table.name: [FeatureConfig(name=table.name, table=table.name)]})
    return group.plan(SparseFeatures([table.name], ids, torch.ones_like(ids)), train).fetch()


def apply(lk, grads: Tensor) -> None:
    """The update and write-back phases of ``lookup``'s result with ``grads`` [U, D] as its gradient."""
    lk.backward(grads)
    lk.update()
    lk.write_back()


def group_step(group, sf, cot: Tensor, step: int, device: torch.device | str = "cpu") -> None:
    """One training step of a table group's embedding path on the features ``sf``: plan, fetch,
    pool on ``device``, backward with the gradient ``cot`` [B, D] for every feature, update
    (``step``), write-back: what issue 25's budget tests count."""
    lk = group.plan(sf, True)
    lk.fetch()
    pooled = lk.pool(torch.device(device))
    torch.autograd.backward([pooled[n] for n in sf.keys], [cot] * len(sf.keys))
    lk.update(step)
    lk.write_back()


def run_state(result) -> dict[str, Tensor]:
    """A finished run's dense weights and every table's rows sorted by ID (``train``'s result):
    what two runs that must be bit-identical are compared on."""
    out = {f"dense/{k}": v for k, v in result.parts.model.state_dict().items()}
    for ec in result.parts.collections():
        for name, table in ec.tables.items():
            chunks = list(table.items())
            if not chunks:  # a table no step reached (e.g. a model that embeds through another collection)
                out[f"{name}/ids"], out[f"{name}/rows"] = torch.empty(0, dtype=torch.int64), torch.empty(0)
                continue
            ids, rec = zip(*chunks)
            ids, rec = torch.cat(ids), torch.cat(rec)
            order = torch.argsort(ids)
            out[f"{name}/ids"], out[f"{name}/rows"] = ids[order], rec[order]
    return out


def assert_identical(a: dict[str, Tensor], b: dict[str, Tensor]) -> None:
    """Two ``run_state``s are equal bit for bit."""
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


def assert_export_scores_as_eval(parts, cfg, out, batches: int = 4):
    """Export a trained run (its ``parts`` and config ``cfg``) to ``out`` and check that the
    export's ``Predictor`` scores the first ``batches`` eval batches as the run's own eval does
    (``predict_batches``), to float tolerance. Returns the export's directory."""
    import numpy as np

    from ember.checkpoint.export import export_model
    from ember.pipeline.loader import make_batches
    from ember.serving import Predictor
    from ember.train.evaluate import predict_batches

    lin = parts.linear.features if parts.linear is not None else None
    out = export_model(parts.model, parts.collections(), parts.embeddings.features, lin, parts.task_names,
                       cfg.model_dump(mode="json", by_alias=True), out)
    probs_run, _ = predict_batches(parts, make_batches(cfg.data, cfg.schema, "eval"), max_batches=batches)
    eval_batches = make_batches(cfg.data, cfg.schema, "eval")
    probs_export = Predictor.load(out).predict_batches(b for _, b in zip(range(batches), eval_batches))
    np.testing.assert_allclose(probs_export, probs_run, rtol=1e-5, atol=1e-6)
    return out
