"""Tower placement of a DMT model (``distributed.placement: towers``; issue 15 item 4): each
tower's tables and tower module live on one node, so only the tower's compressed outputs (and
their gradients) and the IDs routed to it cross nodes.

With M nodes of L ranks (torchrun numbers ranks node after node), tower k lives on node
``tower_node[k]`` (towers spread over the nodes largest first); its tables are sharded row-wise
over that node's L ranks only. Rank r (node a, local rank l) works with one *partner* per node,
the rank of local rank l there (itself on its own node). Per step:

1. fetch (routing): r sends each partner the IDs (lengths, values and per-value weights) of its
   slice's features of that partner's node's towers (``tower_ids``); each rank then holds, for
   the towers of its node, the features of the samples of every rank whose partner it is, plans
   the embedding lookup of those samples (their tables' owners are on its own node: no ID
   crosses nodes from here on) and fetches its rows. The routing is part of the fetch, not of
   the plan: the fetch is what the pipeline's gate orders (``FetchGate``: never past a batch
   after which the trainer evaluates or checkpoints), so under ``pipeline.enabled`` it runs on
   the fetch thread in batch order on the fetch exchange, as every sharded fetch does;
2. forward: the lookup pools as usual; the rank runs its node's tower modules on
   those samples and returns each sender its samples' outputs [B_r, V, D] per tower
   (``tower_out``, an all-to-all with autograd); r runs the head (bottom MLP, global interaction,
   top: ``DMTHead``) under DDP over every rank;
3. backward: the outputs' gradients go back the same way (``tower_grads``) into the tower
   modules and the embeddings; each node sums its towers' parameter gradients over its own
   ranks (a process group per node: ``reduce_tower_grads``); the embedding gradients go to
   their owners as in any sharded lookup.

The forward's and backward's all-to-alls and the head's DDP all-reduce run on a process group
of their own (``TowerPlacement.ex``): they are the training thread's, while the fetch thread
routes later batches on the fetch exchange and the update thread sends gradients on the
updates' (``DistributedRun``): no group is used by two threads.

Every rank holds every tower module (one seed, identical initial weights); only its node's
towers are used and stepped there (the others get no gradient, so optimizers skip them).
``sync_towers`` copies each tower's weights from its node to every rank, and
``sync_optimizer`` its dense optimizer state: the model's and the optimizer's ``state_dict``
call them, so a checkpoint is complete and resumes on any placement or world size.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import torch
import torch.distributed as dist
from torch import Tensor, nn

from ember.batch.sparse import SparseFeatures
from ember.distributed.dense import SumHookState, allreduce_sum_hook, has_state_buffers
from ember.distributed.exchange import Exchange
from ember.distributed.process_group import DistributedRun
from ember.distributed.sharding import ShardingPlan, TableSharding
from ember.embedding.collection import EmbeddingCollection, Lookup
from ember.embedding.config import FeatureConfig, TableConfig
from ember.errors import ConfigError
from ember.models.dmt import DMT, DMTHead

__all__ = ["place_towers", "plan_towers", "TowerPlacement", "TowerLookup"]


def place_towers(towers: Sequence[Sequence[int]], num_nodes: int) -> list[int]:
    """The node of each tower: largest tower (most features) first onto the node with the fewest
    features so far (ties: lowest node, then tower order).

    Example:
        >>> place_towers([[0, 1, 2], [3], [4, 5]], 2)
        [0, 1, 1]
    """
    load = [0] * num_nodes
    out = [0] * len(towers)
    for k in sorted(range(len(towers)), key=lambda k: (-len(towers[k]), k)):
        m = min(range(num_nodes), key=lambda i: (load[i], i))
        out[k], load[m] = m, load[m] + len(towers[k])
    return out


def plan_towers(tables: Sequence[TableConfig], features: Sequence[FeatureConfig], towers: Sequence[Sequence[int]],
                tower_node: Sequence[int], world_size: int, local_world_size: int,
                rows: dict[str, int | None] | None = None) -> ShardingPlan:
    """Each table row-wise over the ranks of its tower's node (``features[i]`` is the model's
    feature i). A table read by features of towers on two nodes is an error: it would have to
    live on both."""
    node_of: dict[str, int] = {}
    for k, idx in enumerate(towers):
        for i in idx:
            table = features[i].table
            if node_of.setdefault(table, tower_node[k]) != tower_node[k]:
                raise ConfigError(f"distributed.placement towers: table '{table}' is read by features of towers on "
                                  f"different nodes; put the features sharing a table in one tower (model.towers)")
    rows = rows or {}
    specs = {}
    for t in tables:
        m = node_of.get(t.name)
        ranks = None if m is None else tuple(range(m * local_world_size, (m + 1) * local_world_size))
        specs[t.name] = TableSharding(t.name, "row_wise", rows=rows.get(t.name), record_bytes=8 + 4 * t.stored_dim,
                                      ranks=ranks)
    return ShardingPlan(world_size, specs)


class _AllToAll(torch.autograd.Function):
    """``Exchange.all_to_all`` of a flat tensor whose backward sends the gradients back the same
    way (counted as ``tower_out`` forward, ``tower_grads`` backward)."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, send: list[int], recv: list[int], ex: Exchange) -> Tensor:  # type: ignore[override]
        ctx.send, ctx.recv, ctx.ex = send, recv, ex
        return ex.all_to_all(x, send, recv, "tower_out")

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None, None, None]:  # type: ignore[override]
        return ctx.ex.all_to_all(grad.contiguous(), ctx.recv, ctx.send, "tower_grads"), None, None, None


@dataclass
class TowerLookup:
    """One step's features for the towers. Planned: this rank's slice (``local``, its ``rows``);
    fetched (``fetch``: the routing collective, then the lookup): the lookup of the samples this
    rank runs its towers for (``sparse``: every sender's samples, sender after sender) and how
    many samples each rank sent here (``got_rows``)."""

    placement: "TowerPlacement"
    embeddings: EmbeddingCollection
    local: SparseFeatures
    rows: int
    training: bool
    lookup: Lookup | None = None
    sparse: SparseFeatures | None = None
    got_rows: list[int] | None = None

    @property
    def fetched(self) -> bool:
        return self.lookup is not None and self.lookup.fetched

    @property
    def train(self) -> bool:
        return self.training

    def fetch(self) -> "TowerLookup":
        """Route the slice's features to the towers' ranks and fetch the rows of what came here
        (collective: every rank fetches every batch, in batch order)."""
        if self.lookup is None:
            self.sparse, self.got_rows = self.placement.route(self.local, self.training)
            self.lookup = self.embeddings.plan(self.sparse, self.training)
        self.lookup.fetch()
        return self

    def to_device(self, device: torch.device) -> None:
        """After ``fetch``: the routed features and fetched rows to ``device`` (the pipeline's copy)."""
        assert self.lookup is not None and self.sparse is not None, "fetch before to_device"
        self.lookup.to_device(device)
        self.sparse = self.sparse.to(device, non_blocking=True)


class TowerPlacement:
    """A DMT's towers on their nodes (module docstring) for one rank of ``run``.

    Args:
        model: the DMT (every rank builds it from the same seed).
        features: the model's sparse features in its order (the collection's).
        tower_node: each tower's node (``place_towers``).
        run: the started process group.
        optimizer: the dense optimizer; its ``state_dict`` first copies each tower's state
            from the tower's node (``sync_optimizer``), so a checkpoint holds all of it.
    """

    def __init__(self, model: DMT, features: Sequence[FeatureConfig], tower_node: Sequence[int], run: DistributedRun,
                 optimizer: torch.optim.Optimizer | None = None) -> None:
        topo = run.topology
        self.L = topo.local_world_size
        if run.world_size % self.L:
            raise ConfigError(f"distributed.placement towers needs the same ranks on every node; world size "
                              f"{run.world_size} is not a multiple of LOCAL_WORLD_SIZE {self.L}")
        self.M = run.world_size // self.L
        # the training thread's all-to-alls and DDP all-reduce: a group of their own (module docstring)
        self.model, self.run, self.ex = model, run, run.exchange.on_group(dist.new_group(backend=run.backend))
        self.names = [f.name for f in features]
        self.node, self.local = run.rank // self.L, run.rank % self.L
        self.tower_node = list(tower_node)
        self.vectors, self.dim = model.config.tower_vectors, 0
        self.index = [t.index.tolist() for t in model.towers]  # type: ignore[operator]
        self.node_towers = [[k for k, m in enumerate(self.tower_node) if m == node] for node in range(self.M)]
        self.node_feats = [sorted(i for k in ks for i in self.index[k]) for ks in self.node_towers]
        self.mine = self.node_towers[self.node]
        # every rank creates every node's group, in the same order
        self.node_groups = [dist.new_group(list(range(m * self.L, (m + 1) * self.L)), backend=run.backend)
                            for m in range(self.M)]
        head = DMTHead(model)
        ids = [run.model_device.index] if run.model_device.type == "cuda" else None
        self.head = head
        self.ddp_head = nn.parallel.DistributedDataParallel(head, device_ids=ids, broadcast_buffers=has_state_buffers(head))
        self.ddp_head.register_comm_hook(SumHookState(None, run.exchange, run.world_size), allreduce_sum_hook)
        model.register_state_dict_pre_hook(lambda *_: self.sync_towers())
        if optimizer is not None:
            optimizer.register_state_dict_pre_hook(self.sync_optimizer)

    def partner(self, node: int) -> int:
        """This rank's partner on ``node``: the rank of the same local rank there."""
        return node * self.L + self.local

    def plan(self, embeddings: EmbeddingCollection, sparse: SparseFeatures, train: bool) -> TowerLookup:
        """This slice's lookup for the towers: no collective yet (``TowerLookup.fetch`` routes)."""
        return TowerLookup(self, embeddings, sparse, sparse.batch_size, train)

    def route(self, sparse: SparseFeatures, train: bool) -> tuple[SparseFeatures, list[int]]:
        """Send each partner this slice's features of its node's towers (IDs, and weights when the
        batch has them); returns what the partners sent here (every feature of the model, those
        of other nodes' towers empty) and how many samples each rank sent. Collective on the
        fetch exchange: every rank calls it once per batch, in batch order."""
        ex = self.run.exchange
        weighted = sparse.weights is not None
        n, B = self.run.world_size, sparse.batch_size
        counts = torch.zeros(n, 2, dtype=torch.int64)
        lens, vals, wts = [], [], []
        for m in range(self.M):
            if not self.node_feats[m]:
                continue
            jag = [sparse[self.names[i]] for i in self.node_feats[m]]
            lens += [j.lengths.to(torch.int32) for j in jag]  # a bag's length fits 32 bits: half the bytes
            vals += [j.values for j in jag]
            if weighted:
                wts += [j.weights for j in jag]
            counts[self.partner(m)] = torch.tensor([len(jag) * B, sum(j.values.numel() for j in jag)])
        kind = "tower_ids" if train else "eval"
        got = ex.counts(counts, kind)
        empty = torch.empty(0, dtype=torch.int64)
        lengths = ex.all_to_all(torch.cat(lens) if lens else empty.int(), counts[:, 0].tolist(), got[:, 0].tolist(),
                                kind).long()
        values = ex.all_to_all(torch.cat(vals) if vals else empty, counts[:, 1].tolist(), got[:, 1].tolist(), kind)
        weights = None
        if weighted:  # (every rank's batch has weights or none: one schema)
            weights = ex.all_to_all(torch.cat(wts) if wts else torch.empty(0, dtype=sparse.weights.dtype),
                                    counts[:, 1].tolist(), got[:, 1].tolist(), kind)
        feats = self.node_feats[self.node]
        f = len(feats)
        got_rows = [int(c) // f if f else 0 for c in got[:, 0].tolist()]
        total = sum(got_rows)
        per_len: list[list[Tensor]] = [[] for _ in feats]
        per_val: list[list[Tensor]] = [[] for _ in feats]
        per_wt: list[list[Tensor]] = [[] for _ in feats]
        sizes = got[:, 1].tolist()
        src_wts = weights.split(sizes) if weights is not None else [None] * n
        for src_len, src_val, src_wt, b in zip(lengths.split(got[:, 0].tolist()), values.split(sizes), src_wts, got_rows):
            if not b:
                continue
            block = src_len.view(f, b)
            bags = block.sum(1).tolist()
            for j, part in enumerate(src_val.split(bags)):
                per_len[j].append(block[j])
                per_val[j].append(part)
            if src_wt is not None:
                for j, part in enumerate(src_wt.split(bags)):
                    per_wt[j].append(part)
        mine = {i: j for j, i in enumerate(feats)}
        all_len, all_val, all_wt = [], [], []
        for i in range(len(self.names)):
            if i in mine and total:
                all_len.append(torch.cat(per_len[mine[i]]))
                all_val.append(torch.cat(per_val[mine[i]]))
                if weights is not None:
                    all_wt.append(torch.cat(per_wt[mine[i]]))
            else:
                all_len.append(torch.zeros(total, dtype=torch.int64))
        routed_weights = None
        if weights is not None:
            routed_weights = torch.cat(all_wt) if all_wt else torch.empty(0, dtype=weights.dtype)
        routed = SparseFeatures(self.names, torch.cat(all_val) if all_val else empty, torch.cat(all_len), routed_weights)
        return routed, got_rows

    def forward(self, embeddings: EmbeddingCollection, dense: Tensor, lookup: TowerLookup, train: bool) -> Tensor:
        """Logits [B_r, T] of this rank's slice: pool the routed samples (routed and fetched
        here when no pipeline did it ahead), run this node's towers on them, send each sender its
        outputs, run the head (under DDP when ``train``)."""
        if not lookup.fetched:
            lookup.fetch()
        assert lookup.sparse is not None and lookup.got_rows is not None
        pooled = embeddings(lookup.sparse, lookup.lookup)
        x = torch.stack([pooled[name] for name in self.names], dim=1)  # type: ignore[misc]  # [B', F, D]
        d, v = x.shape[2], self.vectors
        local = [self.model.towers[k](x) for k in self.mine]
        flat = torch.cat(local, dim=1).reshape(-1) if local else x.new_zeros(0, requires_grad=train)
        width = len(self.mine) * v * d
        send = [b * width for b in lookup.got_rows]
        recv = [0] * self.run.world_size
        for m in range(self.M):
            recv[self.partner(m)] = lookup.rows * len(self.node_towers[m]) * v * d
        got = _AllToAll.apply(flat, send, recv, self.ex) if train else self.ex.all_to_all(flat, send, recv, "eval")
        outs: list[Tensor | None] = [None] * len(self.tower_node)
        for m, part in zip(range(self.M), got.split([recv[self.partner(m)] for m in range(self.M)])):
            if self.node_towers[m]:
                block = part.view(lookup.rows, len(self.node_towers[m]) * v, d)
                for j, k in enumerate(self.node_towers[m]):
                    outs[k] = block[:, j * v : (j + 1) * v]
        head = self.ddp_head if train else self.head
        return head(dense, outs)

    def reduce_tower_grads(self) -> None:
        """Sum this node's towers' parameter gradients over the node's ranks (after backward;
        a rank whose towers got no gradient adds zeros)."""
        if not self.mine:
            return
        params = [p for k in self.mine for p in self.model.towers[k].parameters()]
        if self.L > 1:
            flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in params])
            flat = flat.to(self.run.device)
            dist.all_reduce(flat, group=self.node_groups[self.node])
            wire = int(round(2 * (self.L - 1) / self.L * flat.numel() * flat.element_size()))
            self.ex.note("dense", wire, wire)
            flat = flat.to(params[0].device)
            for p, g in zip(params, flat.split([p.numel() for p in params])):
                p.grad = g.view_as(p).clone()
        else:
            for p in params:
                if p.grad is None:
                    p.grad = torch.zeros_like(p)

    def sum_grads(self, params: Sequence[nn.Parameter]) -> None:
        """Sum ``params``' gradients over every rank (collective, after backward): for a module
        outside both the towers and the DDP head, e.g. distillation's adapter, whose loss each
        rank computes on its own slice (a parameter without a gradient adds zeros)."""
        params = list(params)
        if not params:
            return
        flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in params])
        flat = flat.to(self.run.device)
        dist.all_reduce(flat)
        n = self.run.world_size
        wire = int(round(2 * (n - 1) / n * flat.numel() * flat.element_size()))
        self.ex.note("dense", wire, wire)
        flat = flat.to(params[0].device)
        for p, g in zip(params, flat.split([p.numel() for p in params])):
            p.grad = g.view_as(p).clone()

    def sync_optimizer(self, optimizer: torch.optim.Optimizer) -> None:
        """Every tower's dense optimizer state (e.g. Adam's moments) from its node's first rank
        to every rank (collective; the others never step that tower, so theirs is stale)."""
        for k, m in enumerate(self.tower_node):
            params = list(self.model.towers[k].parameters())
            mine = [{key: (v.cpu() if torch.is_tensor(v) else v) for key, v in optimizer.state.get(p, {}).items()}
                    for p in params] if self.run.rank == m * self.L else None
            box = [mine]
            dist.broadcast_object_list(box, src=m * self.L)
            for p, state in zip(params, box[0]):
                if state:
                    optimizer.state[p] = {key: (v.to(p.device) if torch.is_tensor(v) and v.dim() else v)
                                          for key, v in state.items()}

    def sync_towers(self) -> None:
        """Every tower's parameters from its node's first rank to every rank (collective)."""
        for k, m in enumerate(self.tower_node):
            for t in list(self.model.towers[k].parameters()) + list(self.model.towers[k].buffers()):
                if not t.is_floating_point():
                    continue
                buf = t.data.to(self.run.device)
                dist.broadcast(buf, src=m * self.L)
                t.data.copy_(buf)
