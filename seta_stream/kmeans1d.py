"""Exact, deterministic 1-D k-means (algorithms.md §3.5).

In one dimension every optimal partition is a set of contiguous runs of the sorted values, so
the optimum is found by dynamic programming over the sorted points (Wang & Song 2011). Points
are the distinct values with their multiplicities when there are at most ``B_MAX`` of them
(the result is then the exact global optimum); otherwise at most ``B_MAX`` bins of the sorted
values, followed by Lloyd iterations on the full sorted values (which never increase the SSE).

The DP layer D[j][i] = min_a D[j-1][a-1] + SSE(a..i) is solved by divide and conquer over i
(the optimal a is monotone in i), vectorised one recursion level at a time: each level is a
few NumPy passes over O(B) candidates, so k layers cost O(k B log B) without Python loops per
point. No RNG anywhere: the same values give the same clusters on any machine.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["KMeans1D", "kmeans1d", "assign", "B_MAX"]

B_MAX = 65_536


@dataclass(frozen=True)
class KMeans1D:
    """Clusters sorted by centroid, as boundaries.

    ``upper[j]`` is the largest value in cluster j; a value belongs to the first cluster whose
    upper value is >= it (:func:`assign`). ``k_eff`` = number of clusters (min(k, distinct)).
    """

    upper: np.ndarray  # float64[k_eff]
    lower: np.ndarray  # float64[k_eff], smallest value of each cluster
    counts: np.ndarray  # int64[k_eff]
    centroids: np.ndarray  # float64[k_eff]
    sse: float
    k_eff: int
    binned: bool


def assign(values: np.ndarray, upper: np.ndarray) -> np.ndarray:
    """Cluster index of each value: the first cluster whose upper value is >= the value."""
    idx = np.searchsorted(np.asarray(upper, dtype=np.float64), np.asarray(values, dtype=np.float64), side="left")
    return np.minimum(idx, len(upper) - 1)


def _segment_argmin(vals: np.ndarray, seg_starts: np.ndarray) -> np.ndarray:
    """Index (into vals) of the leftmost minimum of each segment."""
    mins = np.minimum.reduceat(vals, seg_starts)
    lengths = np.diff(np.append(seg_starts, len(vals)))
    is_min = vals == np.repeat(mins, lengths)
    pos = np.where(is_min, np.arange(len(vals)), len(vals))
    return np.minimum.reduceat(pos, seg_starts)


def _dp(c: np.ndarray, s: np.ndarray, q: np.ndarray, k: int) -> tuple[np.ndarray, float]:
    """Optimal split of weighted points into k contiguous runs. Returns run ends (inclusive)."""
    B = len(c)
    P0 = np.concatenate([[0.0], np.cumsum(c)])
    P1 = np.concatenate([[0.0], np.cumsum(s)])
    P2 = np.concatenate([[0.0], np.cumsum(q)])

    def cost(a: np.ndarray, b: np.ndarray) -> np.ndarray:  # points a..b inclusive
        cnt = P0[b + 1] - P0[a]
        sm = P1[b + 1] - P1[a]
        return np.maximum(P2[b + 1] - P2[a] - sm * sm / cnt, 0.0)

    idx = np.arange(B)
    D_prev = cost(np.zeros(B, dtype=np.int64), idx)
    opts = []
    for j in range(1, k):  # layer j = j+1 clusters; valid i >= j
        D_cur = np.full(B, np.inf)
        opt = np.zeros(B, dtype=np.int64)
        # intervals of i with candidate ranges of a
        ilo = np.array([j], dtype=np.int64)
        ihi = np.array([B - 1], dtype=np.int64)
        alo = np.array([j], dtype=np.int64)
        ahi = np.array([B - 1], dtype=np.int64)
        while len(ilo):
            mid = (ilo + ihi) // 2
            lo = alo
            hi = np.minimum(ahi, mid)
            lengths = hi - lo + 1
            seg_starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
            total = int(lengths.sum())
            cand = np.arange(total) - np.repeat(seg_starts, lengths) + np.repeat(lo, lengths)
            imid = np.repeat(mid, lengths)
            vals = D_prev[cand - 1] + cost(cand, imid)
            best = _segment_argmin(vals, seg_starts)
            best_a = cand[best]
            D_cur[mid] = vals[best]
            opt[mid] = best_a
            # children: [ilo, mid-1] with a in [alo, best_a]; [mid+1, ihi] with [best_a, ahi]
            left = mid - 1 >= ilo
            right = mid + 1 <= ihi
            ilo, ihi, alo, ahi = (
                np.concatenate([ilo[left], mid[right] + 1]),
                np.concatenate([mid[left] - 1, ihi[right]]),
                np.concatenate([alo[left], best_a[right]]),
                np.concatenate([best_a[left], ahi[right]]),
            )
        opts.append(opt)
        D_prev = D_cur
    ends = np.empty(k, dtype=np.int64)
    i = B - 1
    for j in range(k - 1, 0, -1):
        ends[j] = i
        i = int(opts[j - 1][i]) - 1
    ends[0] = i
    return ends, float(D_prev[B - 1])


def kmeans1d(values: np.ndarray, k: int, *, b_max: int = B_MAX, max_iter: int = 1000) -> KMeans1D:
    """Cluster 1-D ``values`` (NaN not allowed) into min(k, distinct values) clusters."""
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    v = np.sort(np.asarray(values).ravel())  # float32 losses sort exactly as float32
    if len(v) == 0:
        raise ValueError("kmeans1d needs at least one value")
    if np.isnan(v[-1]) or np.isnan(v[0]):
        raise ValueError("kmeans1d: values contain NaN")
    M = len(v)
    chg = np.flatnonzero(v[1:] != v[:-1]) + 1  # positions where the sorted value changes
    U = len(chg) + 1
    k_eff = min(k, U)
    mean = float(np.mean(v, dtype=np.float64))
    if U <= b_max:
        cuts = chg
        binned = False
    else:
        raw = (np.arange(1, b_max, dtype=np.int64) * M) // b_max
        pos = np.searchsorted(chg, raw, side="left")
        cuts = np.unique(chg[pos[pos < len(chg)]])
        binned = True
    starts = np.concatenate([[0], cuts]).astype(np.int64)
    ends_ex = np.concatenate([cuts, [M]]).astype(np.int64)
    x = v.astype(np.float64) - mean
    S1 = np.concatenate([[0.0], np.cumsum(x)])
    S2 = np.concatenate([[0.0], np.cumsum(x * x)])
    c = (ends_ex - starts).astype(np.float64)
    s = S1[ends_ex] - S1[starts]
    q = S2[ends_ex] - S2[starts]
    if k_eff == 1:
        run_end = np.array([len(c) - 1])
        sse = float(max(q.sum() - s.sum() ** 2 / c.sum(), 0.0))
    else:
        run_end, sse = _dp(c, s, q, k_eff)
    # boundaries in sorted-value positions (end exclusive)
    bounds = ends_ex[run_end]
    if binned:
        bounds, sse = _lloyd(v, S1, S2, bounds, max_iter, mean)
    lo_idx = np.concatenate([[0], bounds[:-1]])
    counts = bounds - lo_idx
    sums = S1[bounds] - S1[lo_idx]
    return KMeans1D(
        upper=v[bounds - 1].astype(np.float64),
        lower=v[lo_idx].astype(np.float64),
        counts=counts.astype(np.int64),
        centroids=sums / counts + mean,
        sse=sse,
        k_eff=k_eff,
        binned=binned,
    )


def _lloyd(
    v: np.ndarray, S1: np.ndarray, S2: np.ndarray, bounds: np.ndarray, max_iter: int, mean: float
) -> tuple[np.ndarray, float]:
    """Lloyd polish on the full sorted values (§3.5 step 4); S1, S2 are prefix sums of
    (v - mean) and its square."""
    M = len(v)

    def sse_of(b: np.ndarray) -> float:
        lo = np.concatenate([[0], b[:-1]])
        cnt = b - lo
        sm = S1[b] - S1[lo]
        return float(np.sum(np.maximum(S2[b] - S2[lo] - sm * sm / cnt, 0.0)))

    for _ in range(max_iter):
        lo = np.concatenate([[0], bounds[:-1]])
        mu = (S1[bounds] - S1[lo]) / (bounds - lo) + mean
        mid = (mu[:-1] + mu[1:]) / 2
        # count of values <= mid, searched in v's own dtype (no 15M-element cast per call):
        # the largest value of v's dtype that is <= mid gives the same count
        mid_v = mid.astype(v.dtype)
        over = mid_v.astype(np.float64) > mid
        mid_v[over] = np.nextafter(mid_v[over], v.dtype.type(-np.inf))
        new = np.append(np.searchsorted(v, mid_v, side="right"), M).astype(np.int64)
        lo_new = np.concatenate([[0], new[:-1]])
        if np.any(new - lo_new <= 0):
            break
        if np.array_equal(new, bounds):
            break
        bounds = new
    return bounds, sse_of(bounds)
