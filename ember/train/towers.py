"""Propose DMT towers from a trained model: group features whose embeddings interact strongly.

Interaction strength of features i and j: over sample rows, the mean of ``|<e_i, e_j>|`` (their
pooled embeddings' dot product, what DLRM's interaction feeds the top MLP) divided by the two
features' root-mean-square norms, so large-norm features do not win by scale alone (1 = always
parallel, 0 = always orthogonal). Features are then grouped by balanced average-linkage
agglomeration: start from single features, repeatedly merge the two groups with the highest mean
strength between them (on a tie, the smaller union) whose union stays within ``ceil(F / K)``
features, until K groups remain
(the cap is relaxed by one feature at a time if no merge fits). The score of a proposal is the
share of the total pairwise strength that stays inside towers (higher: less crosses towers).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable

import numpy as np
import torch

from ember.batch import Batch
from ember.errors import DataError
from ember.train.builder import Components

__all__ = ["TowerProposal", "interaction_strength", "balanced_groups", "propose_towers"]


@dataclass
class TowerProposal:
    towers: list[list[str]]
    inside_share: float  # share of the pairwise interaction strength inside towers
    rows: int  # sample rows the strengths were measured on

    def snippet(self) -> str:
        """A YAML config snippet for the ``model`` section."""
        lines = ["model:", "  type: dmt", "  towers:"]
        lines += [f"    - [{', '.join(t)}]" for t in self.towers]
        return "\n".join(lines) + "\n"


@torch.no_grad()
def interaction_strength(parts: Components, batches: Iterable[Batch], max_rows: int) -> tuple[np.ndarray, int]:
    """[F, F] normalised mean |dot| between the pooled embeddings of every pair of sparse
    features (see the module docstring), over up to ``max_rows`` rows; and the rows used."""
    parts.train(False)
    feats = parts.embeddings.features
    dots: torch.Tensor | None = None
    sq: torch.Tensor | None = None
    rows = 0
    for b in batches:
        emb = parts.embeddings(b.sparse)
        x = torch.stack([emb[f.name] for f in feats], dim=1).float()  # [B, F, D]
        take = min(x.shape[0], max_rows - rows)
        x = x[:take]
        gram = torch.bmm(x, x.transpose(1, 2)).abs().sum(0)  # [F, F]
        norms = x.square().sum(-1).sum(0)  # [F]
        dots = gram if dots is None else dots + gram
        sq = norms if sq is None else sq + norms
        rows += take
        if rows >= max_rows:
            break
    if dots is None or sq is None or rows == 0:
        raise DataError("propose_towers: the data gave no rows to measure the features' interactions on (e.g. "
                        "header-only eval files); give it data with rows")
    rms = (sq / rows).sqrt().clamp_min(1e-12)
    strength = (dots / rows) / (rms[:, None] * rms[None, :])
    return strength.cpu().numpy().astype(np.float64), rows


def balanced_groups(strength: np.ndarray, k: int) -> list[list[int]]:
    """K groups of feature indices (each sorted; groups by their first index) from a symmetric
    strength matrix, by balanced average-linkage agglomeration (module docstring).

    Example:
        >>> s = np.full((4, 4), 0.1); s[0, 2] = s[2, 0] = s[1, 3] = s[3, 1] = 0.9
        >>> balanced_groups(s, 2)
        [[0, 2], [1, 3]]
    """
    n = strength.shape[0]
    if not 1 <= k <= n:
        raise ValueError(f"towers: K must be between 1 and the number of sparse features ({n}), got {k}")
    groups = [[i] for i in range(n)]
    cap = math.ceil(n / k)
    while len(groups) > k:
        best: tuple[float, int] = (-math.inf, 0)
        pair = None
        for a in range(len(groups)):
            for b in range(a + 1, len(groups)):
                size = len(groups[a]) + len(groups[b])
                if size > cap:
                    continue
                key = (float(strength[np.ix_(groups[a], groups[b])].mean()), -size)  # ties: the smaller union
                if key > best:
                    best, pair = key, (a, b)
        if pair is None:  # no merge fits under the cap: allow one more feature per group
            cap += 1
            continue
        a, b = pair
        groups[a] = sorted(groups[a] + groups[b])
        del groups[b]
    return sorted(groups, key=lambda g: g[0])


def inside_share(strength: np.ndarray, groups: list[list[int]]) -> float:
    """Share of the off-diagonal strength between features of the same group."""
    off = strength - np.diag(np.diag(strength))
    inside = sum(float(off[np.ix_(g, g)].sum()) for g in groups)
    total = float(off.sum())
    return inside / total if total > 0 else 1.0


def propose_towers(parts: Components, batches: Iterable[Batch], k: int, max_rows: int = 20_000) -> TowerProposal:
    """K towers for ``parts``' sparse features from their measured interaction strength."""
    strength, rows = interaction_strength(parts, batches, max_rows)
    groups = balanced_groups(strength, k)
    names = [f.name for f in parts.embeddings.features]
    return TowerProposal([[names[i] for i in g] for g in groups], inside_share(strength, groups), rows)
