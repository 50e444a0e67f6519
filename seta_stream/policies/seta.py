"""`seta`: SeTa (Scale Efficient Training), algorithms.md §3.

Pruning epochs e < P = floor(delta E):
  1. R = uniform (1 - r) subset of all N samples (stream 1, fresh every epoch);
  2. unseen samples of R are kept (§0.5);
  3. e = 0 or no seen sample in R: keep all of R ("no_window");
  4. else cluster the seen samples' last losses with exact 1-D k-means into k' = min(k, U)
     clusters ordered by centroid (easy to hard; `h2e` reverses) and keep the clusters
     s..s+w-1 of the sliding window, w = min(k', max(1, round(alpha k'))), s = e mod (k'-w+1)
     (SeTa eqs. 6-7 with n = e).
Annealing epochs e >= P ("partial annealing", SeTa eq. 8): a uniform (1 - r) subset (stream 2).
Weights are always 1.

Budget (opt-in `target_keep`, not in the paper): with skewed losses the window's clusters
differ wildly in size, so the kept fraction of plain SeTa swings from epoch to epoch. With
`target_keep = t` every pruning epoch keeps floor(t N) samples (t <= 1 - r): the unseen samples
of R count first; the rest is a contiguous band of the seen samples of R in loss order (ties by
uid) of exactly the remaining size, centred on the centre of the window's clusters. The window
cycle (which part of the loss distribution is trained) is unchanged; only its width adapts. At
e = 0 (nothing seen) it keeps the floor(t N) samples of smallest u (a subset of R).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from ..kmeans1d import assign, kmeans1d
from .base import AbsentRule, PolicyInput, PolicyResult, reason_code
from .random_draws import (
    STREAM_ANNEAL,
    STREAM_RANDOM,
    keep_count,
    prune_epochs,
    uniform_subset,
    uniforms,
)

__all__ = ["SetaParams", "seta", "window_width", "window_start"]


@dataclass(frozen=True)
class SetaParams:
    """SeTa parameters (algorithms.md §3.1); defaults are the reference class defaults."""

    r: float = 0.0
    k: int = 10
    alpha: float = 0.5
    delta: float = 0.875
    order: Literal["e2h", "h2e"] = "e2h"
    unseen_score: float | None = None
    prune_epochs: int | None = None
    target_keep: float | None = None

    def __post_init__(self) -> None:
        if not 0 <= self.r <= 0.9:
            raise ValueError(f"seta: r={self.r} is outside the valid range 0 <= r <= 0.9")
        if not (isinstance(self.k, int) and 1 <= self.k <= 256):
            raise ValueError(f"seta: k={self.k!r} is outside the valid range: integer 1 <= k <= 256")
        if not 0 < self.alpha <= 1:
            raise ValueError(f"seta: alpha={self.alpha} is outside the valid range 0 < alpha <= 1")
        if round(self.alpha * self.k) < 1:
            raise ValueError(
                f"seta: alpha={self.alpha} with k={self.k} gives a window of round(alpha*k) = 0 "
                "clusters; expected round(alpha*k) >= 1 (raise alpha or k)"
            )
        if not 0 <= self.delta <= 1:
            raise ValueError(f"seta: delta={self.delta} is outside the valid range 0 <= delta <= 1")
        if self.order not in ("e2h", "h2e"):
            raise ValueError(f"seta: order={self.order!r}, expected 'e2h' or 'h2e'")
        if self.prune_epochs is not None and self.prune_epochs < 0:
            raise ValueError(f"seta: prune_epochs={self.prune_epochs} must be >= 0")
        if self.target_keep is not None and not 0 < self.target_keep <= 1 - self.r + 1e-12:
            raise ValueError(
                f"seta: target_keep={self.target_keep} is outside the valid range "
                f"0 < target_keep <= 1 - r = {1 - self.r:g}"
            )

    @classmethod
    def preset(cls, name: str, **overrides: Any) -> SetaParams:
        """Reference recipes: "cifar" (r=0.1, k=5, alpha=0.9) and "imagenet" (r=0, k=5, alpha=0.6)."""
        presets = {
            "cifar": dict(r=0.1, k=5, alpha=0.9, delta=0.875),
            "imagenet": dict(r=0.0, k=5, alpha=0.6, delta=0.875),
        }
        if name not in presets:
            raise ValueError(f"seta: unknown preset {name!r}; valid: {sorted(presets)}")
        return cls(**{**presets[name], **overrides})


def window_width(k_eff: int, alpha: float) -> int:
    """w(k') = min(k', max(1, round_half_even(alpha k'))) (§3.2)."""
    return min(k_eff, max(1, round(alpha * k_eff)))


def window_start(epoch: int, k_eff: int, w: int) -> int:
    """s = n mod (k' - w + 1) with n = e (§3.2)."""
    return epoch % (k_eff - w + 1)


def seta(inp: PolicyInput, p: SetaParams) -> PolicyResult:
    n, e = inp.n, inp.epoch
    f = 1.0 - p.r
    P = prune_epochs(p.delta, inp.epochs, p.prune_epochs)
    keep = np.zeros(n, dtype=bool)
    reason = np.zeros(n, dtype=np.int8)
    cluster = np.full(n, -1, dtype=np.int16)
    loss = inp.last_loss.astype(np.float32, copy=False)
    seen = (inp.seen > 0) & np.isfinite(loss)
    if p.unseen_score is not None:  # reference compatibility (§0.5)
        loss = np.where(seen, loss, np.float32(p.unseen_score)).astype(np.float32)
        seen = np.ones(n, dtype=bool)
    summary: dict[str, Any] = {}

    if e >= P:  # partial annealing (SeTa eq. 8)
        u = uniforms(inp.uid, inp.seed, e, STREAM_ANNEAL)
        keep = uniform_subset(np.ones(n, dtype=bool), keep_count(f, n), u, inp.uid)
        reason[:] = np.where(keep, reason_code("anneal"), reason_code("anneal_dropped"))
        summary.update(phase="anneal", n_downsampled=int(keep.sum()), s="all", w=None, k_eff=None)
        return PolicyResult(
            keep,
            keep.astype(np.float32),
            reason,
            summary,
            cluster,
            absent_rule=AbsentRule("bernoulli", f, STREAM_ANNEAL),
        )

    u = uniforms(inp.uid, inp.seed, e, STREAM_RANDOM)
    everyone = np.ones(n, dtype=bool)
    R = uniform_subset(everyone, keep_count(f, n), u, inp.uid)
    reason[~R] = reason_code("downsampled_out")
    Ru, Rs = R & ~seen, R & seen
    keep[Ru] = True
    reason[Ru] = reason_code("unseen")
    summary.update(phase="prune", n_downsampled=int(R.sum()), n_unseen_in_R=int(Ru.sum()))
    budget = keep_count(p.target_keep, n) if p.target_keep is not None else None
    absent_f = f if budget is None else min(f, float(p.target_keep))

    if e == 0 or not Rs.any():
        if budget is not None:  # the budget's smallest-u samples: a subset of R (same order)
            keep = uniform_subset(everyone, budget, u, inp.uid)
            reason[R & ~keep] = reason_code("downsampled_out")
            reason[keep] = np.where(seen[keep], reason_code("no_window"), reason_code("unseen"))
        else:
            keep[Rs] = True
            reason[Rs] = reason_code("no_window")
        summary.update(k_eff=None, w=None, s="all", cluster_sizes=[], centroids=[], cluster_min=[], cluster_max=[])
        return PolicyResult(
            keep,
            keep.astype(np.float32),
            reason,
            summary,
            cluster,
            absent_rule=AbsentRule("bernoulli", absent_f, STREAM_RANDOM),
        )

    idx = np.flatnonzero(Rs)
    vals = loss[idx]
    km = kmeans1d(vals, p.k)
    k_eff = km.k_eff
    c = assign(vals, km.upper)
    sizes, cents, cmin, cmax = km.counts, km.centroids, km.lower, km.upper
    if p.order == "h2e":
        c = k_eff - 1 - c
        sizes, cents, cmin, cmax = sizes[::-1], cents[::-1], cmin[::-1], cmax[::-1]
    w = window_width(k_eff, p.alpha)
    s = window_start(e, k_eff, w)
    cluster[idx] = c.astype(np.int16)
    in_window = (c >= s) & (c < s + w)
    if budget is None:
        keep[idx] = in_window
        reason[idx] = np.where(in_window, reason_code("window"), reason_code("outside_window"))
    else:
        band = _budget_band(vals, inp.uid[idx], c, s, w, max(0, budget - int(Ru.sum())), p.order)
        keep[idx] = band
        reason[idx] = np.where(band, reason_code("window"), reason_code("outside_window"))
        if budget < int(Ru.sum()):  # more unseen than the budget: draw them uniformly
            keep_u = uniform_subset(Ru, budget, u, inp.uid)
            keep[Ru & ~keep_u] = False
            reason[Ru & ~keep_u] = reason_code("downsampled_out")
        summary["target_keep"] = p.target_keep
    summary.update(
        k_eff=int(k_eff),
        w=int(w),
        s=int(s),
        cluster_sizes=[int(x) for x in sizes],
        centroids=[float(x) for x in cents],
        cluster_min=[float(x) for x in cmin],
        cluster_max=[float(x) for x in cmax],
        sse=float(km.sse),
    )
    return PolicyResult(
        keep,
        keep.astype(np.float32),
        reason,
        summary,
        cluster,
        absent_rule=AbsentRule("bernoulli", absent_f, STREAM_RANDOM),
    )


def _budget_band(vals: np.ndarray, uid: np.ndarray, c: np.ndarray, s: int, w: int, m: int, order: str) -> np.ndarray:
    """Contiguous band of m samples in loss order centred on the window's clusters."""
    M = len(vals)
    m = min(m, M)
    out = np.zeros(M, dtype=bool)
    if m == 0:
        return out
    rank_order = np.lexsort((uid, vals))  # ascending loss, ties by uid
    if order == "h2e":
        rank_order = rank_order[::-1]
    pos = np.empty(M, dtype=np.int64)
    pos[rank_order] = np.arange(M)
    in_window = (c >= s) & (c < s + w)
    centre = (pos[in_window].min() + pos[in_window].max()) / 2.0 if in_window.any() else M / 2.0
    lo = int(round(centre - m / 2.0))
    lo = min(max(lo, 0), M - m)
    out[rank_order[lo : lo + m]] = True
    return out
