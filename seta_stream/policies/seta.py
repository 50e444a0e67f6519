"""`seta`: SeTa (Scale Efficient Training), docs/algorithms.md §3.

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

Budget (opt-in ``target_keep = t``, not in the paper). With skewed losses the window's clusters
differ wildly in size, so the kept fraction of plain SeTa swings from epoch to epoch (§3.3,
§11: 1.00, 0.58, 0.19, 0.03, 0.02, ...). With a budget every pruning epoch keeps exactly
B = floor(t N) samples (t <= 1 - r, so B <= |R|):

  * e = 0 or no seen sample in R: the B samples of smallest u (stream 1), a subset of R;
  * otherwise the unseen samples of R count first (if there are more than B of them, a uniform
    B-subset of them, stream 1); the remaining B' = B - |R_u| slots go to a contiguous band of
    the seen samples of R in ascending (loss, uid) order: the clusters and the window s, w are
    computed exactly as without a budget, the band has B' members and is centred on the middle
    rank of the window's clusters, shifted inwards where it would pass either end.

The window's position (which part of the loss distribution is trained, and the easy-to-hard
cycle over the epochs) is unchanged; only its width adapts to the budget, so the kept fraction
is B / N in every pruning epoch. The stage keeps absent samples with probability min(1 - r, t).
Annealing epochs are unchanged (uniform (1 - r) subset).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from .._kernels.kmeans1d import KMeans1D, assign, kmeans1d, kmeans1d_steps
from ..errors import InvalidInputError
from .base import AbsentRule, PolicyInput, PolicyResult, PolicySpec, reason_code, reason_codes
from .random_draws import (
    STREAM_ANNEAL,
    STREAM_RANDOM,
    keep_count,
    prune_epochs,
    smallest_mask,
    uniform_subset,
    uniforms,
)
from .steps import Cut, Decide, PlanContext, Steps, float_order_keys, memo, smallest, total, uniform_keys_of

__all__ = ["SetaParams", "seta", "window_width", "window_start", "rank_range", "SPECS"]


@dataclass(frozen=True)
class SetaParams:
    """SeTa parameters (docs/algorithms.md §3.1); defaults are the reference class defaults."""

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
            raise InvalidInputError(f"seta: r={self.r} is outside the valid range 0 <= r <= 0.9")
        if not (isinstance(self.k, int) and 1 <= self.k <= 256):
            raise InvalidInputError(f"seta: k={self.k!r} is outside the valid range: integer 1 <= k <= 256")
        if not 0 < self.alpha <= 1:
            raise InvalidInputError(f"seta: alpha={self.alpha} is outside the valid range 0 < alpha <= 1")
        if round(self.alpha * self.k) < 1:
            raise InvalidInputError(
                f"seta: alpha={self.alpha} with k={self.k} gives a window of round(alpha*k) = 0 "
                "clusters; expected round(alpha*k) >= 1 (raise alpha or k)"
            )
        if not 0 <= self.delta <= 1:
            raise InvalidInputError(f"seta: delta={self.delta} is outside the valid range 0 <= delta <= 1")
        if self.order not in ("e2h", "h2e"):
            raise InvalidInputError(f"seta: order={self.order!r}, expected 'e2h' or 'h2e'")
        if self.prune_epochs is not None and self.prune_epochs < 0:
            raise InvalidInputError(f"seta: prune_epochs={self.prune_epochs} must be >= 0")
        if self.target_keep is not None and not 0 < self.target_keep <= 1 - self.r + 1e-12:
            raise InvalidInputError(
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
            raise InvalidInputError(f"seta: unknown preset {name!r}; valid: {sorted(presets)}")
        return cls(**{**presets[name], **overrides})


def window_width(k_eff: int, alpha: float) -> int:
    """w(k') = min(k', max(1, round_half_even(alpha k'))) (§3.2)."""
    return min(k_eff, max(1, round(alpha * k_eff)))


def window_start(epoch: int, k_eff: int, w: int) -> int:
    """s = n mod (k' - w + 1) with n = e (§3.2)."""
    return epoch % (k_eff - w + 1)


def _result(
    keep: np.ndarray, reason: np.ndarray, summary: dict[str, Any], cluster: np.ndarray | None, rule: AbsentRule
) -> PolicyResult:
    """The result; ``cluster`` None = no sample clustered (-1 everywhere)."""
    if cluster is None:
        cluster = np.full(len(keep), -1, dtype=np.int16)
    return PolicyResult(keep, keep.astype(np.float32), reason, summary, cluster, absent_rule=rule)


def _seta(inp: PolicyInput, p: SetaParams) -> PolicyResult:
    n, e = inp.n, inp.epoch
    f = 1.0 - p.r
    P = prune_epochs(p.delta, inp.epochs, p.prune_epochs)
    cluster: np.ndarray | None = None  # -1 = not clustered (all of them until step 4)
    loss = np.asarray(inp.last_loss, dtype=np.float32)
    seen = np.isfinite(loss)
    seen &= np.asarray(inp.seen) > 0
    if p.unseen_score is not None:  # reference compatibility (§0.5)
        loss = np.where(seen, loss, np.float32(p.unseen_score))
        seen = np.ones(n, dtype=bool)
    summary: dict[str, Any] = {"P": P}

    if e >= P:  # partial annealing (SeTa eq. 8): a fresh uniform (1 - r) subset, stream 2
        u_anneal = uniforms(inp.uid, inp.seed, e, STREAM_ANNEAL)
        keep = uniform_subset(np.ones(n, dtype=bool), keep_count(f, n), u_anneal, inp.uid)
        reason = np.empty(n, dtype=np.int8)
        reason[:] = reason_code("anneal_dropped")
        reason[keep] = reason_code("anneal")
        summary.update(phase="anneal", n_downsampled=int(keep.sum()), s="all", w=None, k_eff=None)
        return _result(keep, reason, summary, cluster, AbsentRule("bernoulli", f, STREAM_ANNEAL))

    # §3.3 step 1: uniform down-sampling R (stream 1, fresh every epoch)
    m_R = keep_count(f, n)
    u: np.ndarray | None = None
    Ru: np.ndarray | None = None  # step 2: unseen samples of R are kept
    if m_R >= n:  # R is every sample: Ru = ~seen, made below where it is read
        Rs = seen
    else:
        u = uniforms(inp.uid, inp.seed, e, STREAM_RANDOM)
        R = uniform_subset(np.ones(n, dtype=bool), m_R, u, inp.uid)
        Ru = R & ~seen
        Rs = R & seen
        del R
    n_Rs = int(np.count_nonzero(Rs))
    n_Ru = n - n_Rs if Ru is None else int(np.count_nonzero(Ru))
    # every sample seen and in R, with a window: keep and reason are the window's (step 5), and
    # the masks below would all be overwritten (not made: 3 bytes a row less at k-means' peak)
    if e == 0 or n_Rs == 0 or n_Rs < n:
        if Ru is None:
            Ru = ~seen
        reason = np.empty(n, dtype=np.int8)
        reason[:] = reason_code("downsampled_out")
        keep = Ru.copy()
        reason[Ru] = reason_code("unseen")
    summary.update(phase="prune", n_downsampled=n_Ru + n_Rs, n_unseen_in_R=n_Ru)
    budget = keep_count(p.target_keep, n) if p.target_keep is not None else None
    rule = AbsentRule("bernoulli", f if p.target_keep is None else min(f, p.target_keep), STREAM_RANDOM)
    if budget is not None:
        summary["target_keep"] = p.target_keep

    if e == 0 or n_Rs == 0:  # step 3: no window
        if budget is not None:  # the budget's smallest-u samples: a subset of R
            if u is None:
                u = uniforms(inp.uid, inp.seed, e, STREAM_RANDOM)
            keep = uniform_subset(np.ones(n, dtype=bool), budget, u, inp.uid)
            reason[:] = reason_code("downsampled_out")
            reason[keep & seen] = reason_code("no_window")
            reason[keep & ~seen] = reason_code("unseen")
        else:
            keep |= Rs
            reason[Rs] = reason_code("no_window")
        summary.update(k_eff=None, w=None, s="all", cluster_sizes=[], centroids=[], cluster_min=[], cluster_max=[])
        return _result(keep, reason, summary, cluster, rule)

    # step 4: exact 1-D k-means on the seen losses of R, clusters sorted by centroid
    all_seen = n_Rs == n
    idx = None if all_seen else np.flatnonzero(Rs)
    vals = loss if all_seen else loss[idx]
    km = kmeans1d(vals, p.k)
    k_eff = km.k_eff
    c = assign(vals, km.upper)  # ascending centroid order
    sizes, cents, cmin, cmax = km.counts, km.centroids, km.lower, km.upper
    if p.order == "h2e":  # hard to easy: window index 0 = hardest cluster
        c = (k_eff - 1) - c
        sizes, cents, cmin, cmax = sizes[::-1], cents[::-1], cmin[::-1], cmax[::-1]
    w = window_width(k_eff, p.alpha)
    s = window_start(e, k_eff, w)  # SeTa eqs. 6-7 with n = e
    if all_seen:
        cluster = c.astype(np.int16, copy=False)
    else:
        cluster = np.full(n, -1, dtype=np.int16)
        cluster[idx] = c
    if budget is None:  # step 5: the clusters s .. s+w-1
        in_window = c >= s
        in_window &= c < s + w
    else:
        in_window = _budget_band(vals, inp.uid if all_seen else inp.uid[idx], km.counts, s, w, p.order, budget - n_Ru)
    code = reason_codes(in_window, "window", "outside_window")
    if all_seen:
        keep = in_window
        reason = code
    else:
        keep[idx] = in_window
        reason[idx] = code
    if budget is not None and budget < n_Ru:  # more unseen than the budget: draw them uniformly
        if u is None:
            u = uniforms(inp.uid, inp.seed, e, STREAM_RANDOM)
        keep_u = uniform_subset(Ru, budget, u, inp.uid)
        dropped = Ru & ~keep_u
        keep[dropped] = False
        reason[dropped] = reason_code("downsampled_out")
    summary.update(_window_summary(km, p.order, w, s))
    return _result(keep, reason, summary, cluster, rule)


def _window_summary(km: KMeans1D, order: str, w: int, s: int) -> dict[str, Any]:
    """The summary fields of a window epoch (clusters in window order)."""
    sizes, cents, cmin, cmax = _clusters(km, order)
    return dict(
        k_eff=int(km.k_eff),
        w=int(w),
        s=int(s),
        cluster_sizes=[int(x) for x in sizes],
        centroids=[float(x) for x in cents],
        cluster_min=[float(x) for x in cmin],
        cluster_max=[float(x) for x in cmax],
        sse=float(km.sse),
        n_window_clusters=int(sum(sizes[s : s + w])),
    )


def _budget_band(
    vals: np.ndarray, uid: np.ndarray, counts: np.ndarray, s: int, w: int, order: str, m: int
) -> np.ndarray:
    """The budget rule (module docstring): m samples with consecutive ranks in ascending
    (loss, uid) order, centred on the ranks of the window's clusters, clipped to the ends."""
    M = len(vals)
    m = max(0, min(m, M))
    if m == 0:
        return np.zeros(M, dtype=bool)
    if m == M:
        return np.ones(M, dtype=bool)
    lo = _band_start(counts, s, w, order, M, m)
    return rank_range(vals, uid, lo, lo + m)


def rank_range(vals: np.ndarray, uid: np.ndarray, lo: int, hi: int) -> np.ndarray:
    """Bool mask of the samples whose rank in ascending (value, uid) order is in [lo, hi)."""
    upto_hi = smallest_mask(vals, hi, uid)
    if lo <= 0:
        return upto_hi
    upto_hi &= ~smallest_mask(vals, lo, uid)
    return upto_hi


def _losses(inp: PolicyInput, p: SetaParams) -> tuple[np.ndarray, np.ndarray]:
    """(loss as float32, seen) as :func:`seta` takes them."""
    loss = np.asarray(inp.last_loss, dtype=np.float32)
    seen = inp.seen > 0
    seen &= np.isfinite(loss)
    if p.unseen_score is not None:
        loss = np.where(seen, loss, np.float32(p.unseen_score))
        seen = np.ones(inp.n, dtype=bool)
    return loss, seen


def _clusters(km: KMeans1D, order: str) -> tuple[Any, ...]:
    """(sizes, centroids, lower, upper) in window order (``h2e`` reverses them)."""
    sizes, cents, cmin, cmax = km.counts, km.centroids, km.lower, km.upper
    if order == "h2e":
        return sizes[::-1], cents[::-1], cmin[::-1], cmax[::-1]
    return sizes, cents, cmin, cmax


def _seta_steps(ctx: PlanContext, p: SetaParams) -> Steps:
    """:func:`seta` over buckets: the uniform down-sampling and budget draws as exact cuts, the
    1-D k-means of the seen losses of R by :func:`seta_stream._kernels.kmeans1d.kmeans1d_steps`, the
    budget band as two cuts in (loss, uid) order."""
    n, e, seed = ctx.n, ctx.epoch, ctx.seed
    f = 1.0 - p.r
    P = prune_epochs(p.delta, ctx.epochs, p.prune_epochs)

    def u_keys(stream: int) -> Any:
        def key_of(inp: PolicyInput) -> tuple[np.ndarray, np.ndarray, None, None]:
            uid = np.asarray(inp.uid, np.uint64)
            return uniform_keys_of(inp, seed, e, stream), uid, None, None

        return key_of

    if e >= P:  # partial annealing: a fresh uniform (1 - r) subset, stream 2
        m = keep_count(f, n)
        anneal = yield from smallest(u_keys(STREAM_ANNEAL), m, n)

        def anneal_rows(inp: PolicyInput) -> PolicyResult:
            keep = anneal.mask(*u_keys(STREAM_ANNEAL)(inp))
            reason = reason_codes(keep, "anneal", "anneal_dropped")
            return _result(keep, reason, {}, None, AbsentRule())

        summary = {"P": P, "phase": "anneal", "n_downsampled": min(m, n), "s": "all", "w": None, "k_eff": None}
        return Decide(anneal_rows, summary, AbsentRule("bernoulli", f, STREAM_ANNEAL))

    m_R = keep_count(f, n)
    draw = u_keys(STREAM_RANDOM)
    in_R: Cut = Cut(everything=True) if m_R >= n else (yield from smallest(draw, m_R, n))

    def sets(inp: PolicyInput) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(R, unseen of R, seen of R) of a bucket (memoised: every later pass needs them)."""

        def make() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
            R = in_R.mask(*draw(inp))
            _, seen = _losses(inp, p)
            return R, R & ~seen, R & seen

        return memo(inp, "seta/sets", make)

    n_Ru, n_Rs = (yield total(lambda inp: np.array([np.count_nonzero(x) for x in sets(inp)[1:]], np.int64))).tolist()
    summary: dict[str, Any] = {"P": P, "phase": "prune", "n_downsampled": n_Ru + n_Rs, "n_unseen_in_R": n_Ru}
    budget = keep_count(p.target_keep, n) if p.target_keep is not None else None
    rule = AbsentRule("bernoulli", f if p.target_keep is None else min(f, p.target_keep), STREAM_RANDOM)
    if budget is not None:
        summary["target_keep"] = p.target_keep

    if e == 0 or n_Rs == 0:  # no window
        summary.update(k_eff=None, w=None, s="all", cluster_sizes=[], centroids=[], cluster_min=[], cluster_max=[])
        if budget is None:

            def all_of_R(inp: PolicyInput) -> PolicyResult:
                R, Ru, Rs = sets(inp)
                reason = np.full(inp.n, reason_code("downsampled_out"), dtype=np.int8)
                reason[Ru] = reason_code("unseen")
                reason[Rs] = reason_code("no_window")
                return _result(R.copy(), reason, {}, None, rule)

            return Decide(all_of_R, summary, rule)
        drawn = yield from smallest(draw, budget, n)

        def budget_rows(inp: PolicyInput) -> PolicyResult:
            keep = drawn.mask(*draw(inp))
            _, seen = _losses(inp, p)
            reason = np.full(inp.n, reason_code("downsampled_out"), dtype=np.int8)
            reason[keep & seen] = reason_code("no_window")
            reason[keep & ~seen] = reason_code("unseen")
            return _result(keep, reason, {}, None, rule)

        return Decide(budget_rows, summary, rule)

    def seen_losses(inp: PolicyInput) -> np.ndarray:
        loss, _ = _losses(inp, p)
        return loss[sets(inp)[2]]

    km = yield from kmeans1d_steps(seen_losses, n_Rs, p.k)
    k_eff = km.k_eff
    w = window_width(k_eff, p.alpha)
    s = window_start(e, k_eff, w)
    sizes, cents, cmin, cmax = _clusters(km, p.order)
    band: tuple[Cut, Cut] | None = None
    if budget is not None:
        M, m = n_Rs, max(0, min(budget - n_Ru, n_Rs))
        lo = _band_start(km.counts, s, w, p.order, M, m)

        def loss_keys(inp: PolicyInput) -> tuple[np.ndarray, np.ndarray, None, np.ndarray]:
            loss, _ = _losses(inp, p)
            Rs = sets(inp)[2]
            return float_order_keys(np.where(Rs, loss, np.float32(0))), np.asarray(inp.uid, np.uint64), None, Rs

        upto_hi = yield from smallest(loss_keys, lo + m, M)
        upto_lo = yield from smallest(loss_keys, lo, M)
        band = (upto_hi, upto_lo)
    unseen_cut: Cut | None = None
    if budget is not None and budget < n_Ru:

        def unseen_keys(inp: PolicyInput) -> tuple[np.ndarray, np.ndarray, None, np.ndarray]:
            keys, uid, _, _ = draw(inp)
            return keys, uid, None, sets(inp)[1]

        unseen_cut = yield from smallest(unseen_keys, budget, n_Ru)

    def window_rows(inp: PolicyInput) -> PolicyResult:
        R, Ru, Rs = sets(inp)
        loss, _ = _losses(inp, p)
        idx = np.flatnonzero(Rs)
        vals = loss[idx]
        c = assign(vals, km.upper)
        if p.order == "h2e":
            c = (k_eff - 1) - c
        cluster = np.full(inp.n, -1, dtype=np.int16)
        cluster[idx] = c
        if band is None:
            in_window = (c >= s) & (c < s + w)
        else:
            keys, uid, _, _ = loss_keys(inp)
            in_window = (band[0].mask(keys, uid, None, Rs) & ~band[1].mask(keys, uid, None, Rs))[idx]
        keep = Ru.copy()
        reason = np.full(inp.n, reason_code("downsampled_out"), dtype=np.int8)
        reason[Ru] = reason_code("unseen")
        keep[idx] = in_window
        reason[idx] = reason_codes(in_window, "window", "outside_window")
        if unseen_cut is not None:
            dropped = Ru & ~unseen_cut.mask(*unseen_keys(inp))
            keep[dropped] = False
            reason[dropped] = reason_code("downsampled_out")
        return _result(keep, reason, {}, cluster, rule)

    summary.update(_window_summary(km, p.order, w, s))
    return Decide(window_rows, summary, rule)


def _band_start(counts: np.ndarray, s: int, w: int, order: str, M: int, m: int) -> int:
    """First rank of the budget band (:func:`_budget_band`): centred on the window's ranks."""
    k_eff = len(counts)
    first_c = s if order == "e2h" else k_eff - s - w  # window clusters in ascending order
    edges = np.concatenate([[0], np.cumsum(counts)])
    first_rank, last_rank = int(edges[first_c]), int(edges[first_c + w]) - 1
    lo = int(round((first_rank + last_rank) / 2.0 - (m - 1) / 2.0))
    return min(max(lo, 0), M - m)


def _columns(p: SetaParams) -> frozenset[str]:
    """The last loss (clustered), ``seen`` and the uid."""
    return frozenset({"uid", "last_loss", "seen"})


seta = _seta
seta_steps = _seta_steps
columns = _columns


SPECS = (
    PolicySpec(
        "seta",
        SetaParams,
        seta,
        "SeTa: random down-sampling, 1-D k-means on loss, sliding easy-to-hard window, partial annealing",
        columns,
        steps=seta_steps,
        noise=True,
    ),
)
