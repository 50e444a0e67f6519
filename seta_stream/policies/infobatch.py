"""`infobatch`: InfoBatch (docs/algorithms.md §4).

Pruning epochs e < P = floor(delta E): among the seen samples S, those with a score strictly
below the mean score are "well learned" (L); a uniform (1 - r) share of L is kept (stream 3)
with weight 1/(1 - r) (``rescale="reference"``) or |L|/m (``"exact"``, unbiased for the drawn
count); everything else (S \\ L and unseen samples) is kept with weight 1. Annealing epochs keep
everything with weight 1: weights are recomputed by every plan, so no rescaled weight can leak
into annealing, whatever delta*E is (the released reference leaks them, §10 item 9).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from ..errors import InvalidInputError
from .base import PolicyInput, PolicyResult, PolicySpec, reason_code
from .random_draws import STREAM_INFOBATCH, keep_count, prune_epochs, uniform_subset, uniforms


@dataclass(frozen=True)
class InfoBatchParams:
    """r: probability of pruning a well-learned sample; delta: share of pruning epochs."""

    r: float = 0.5
    delta: float = 0.875
    score: Literal["last", "ema"] = "last"
    rescale: Literal["reference", "exact"] = "reference"
    unseen_score: float | None = None
    prune_epochs: int | None = None

    def __post_init__(self) -> None:
        if not 0 <= self.r <= 0.9:
            raise InvalidInputError(f"infobatch: r={self.r} is outside the valid range 0 <= r <= 0.9")
        if not 0 <= self.delta <= 1:
            raise InvalidInputError(f"infobatch: delta={self.delta} is outside the valid range 0 <= delta <= 1")
        if self.score not in ("last", "ema"):
            raise InvalidInputError(f"infobatch: score={self.score!r}, expected 'last' or 'ema'")
        if self.rescale not in ("reference", "exact"):
            raise InvalidInputError(f"infobatch: rescale={self.rescale!r}, expected 'reference' or 'exact'")
        if self.prune_epochs is not None and self.prune_epochs < 0:
            raise InvalidInputError(f"infobatch: prune_epochs={self.prune_epochs} must be >= 0")


def infobatch(inp: PolicyInput, p: InfoBatchParams) -> PolicyResult:
    n = inp.n
    P = prune_epochs(p.delta, inp.epochs, p.prune_epochs)
    score = (inp.last_loss if p.score == "last" else inp.ema).astype(np.float64)
    seen = (inp.seen > 0) & np.isfinite(score)
    if p.unseen_score is not None:  # reference compatibility (§0.5)
        score = np.where(seen, score, float(p.unseen_score))
        seen = np.ones(n, dtype=bool)
    keep = np.ones(n, dtype=bool)
    weight = np.ones(n, dtype=np.float32)
    reason = np.where(seen, reason_code("above_mean"), reason_code("unseen")).astype(np.int8)
    if inp.epoch >= P:
        reason[:] = reason_code("anneal")
        return PolicyResult(keep, weight, reason, {"phase": "anneal"})
    if not seen.any():
        reason[:] = reason_code("unseen")
        return PolicyResult(
            keep, weight, reason, {"phase": "prune", "mu": None, "n_seen": 0, "n_below_mean": 0, "m": 0, "weight": 1.0}
        )
    mu = float(np.mean(score[seen], dtype=np.float64))
    below = seen & (score < mu)  # strict: samples equal to the mean are not candidates
    n_below = int(below.sum())
    m = keep_count(1.0 - p.r, n_below)
    drawn = uniform_subset(below, m, uniforms(inp.uid, inp.seed, inp.epoch, STREAM_INFOBATCH), inp.uid)
    if p.rescale == "exact" and m > 0:
        w = np.float32(n_below / m)
    else:
        w = np.float32(1.0 / (1.0 - p.r))
    keep[below & ~drawn] = False
    weight[drawn] = w
    reason[below & ~drawn] = reason_code("below_mean_pruned")
    reason[drawn] = reason_code("below_mean_drawn")
    summary = {
        "phase": "prune",
        "mu": mu,
        "n_seen": int(seen.sum()),
        "n_below_mean": n_below,
        "m": m,
        "weight": float(w),
        "rescaled": int(drawn.sum()),
    }
    return PolicyResult(keep, weight, reason, summary)


def columns(p: InfoBatchParams) -> frozenset[str]:
    """The score column (``last_loss`` or ``ema``), ``seen`` and the uid."""
    return frozenset({"uid", "seen", "last_loss" if p.score == "last" else "ema"})


SPECS = (
    PolicySpec(
        "infobatch",
        InfoBatchParams,
        infobatch,
        "InfoBatch: prune a (r) share of below-mean-loss samples, rescale the kept ones by 1/(1-r)",
        columns,
    ),
)
