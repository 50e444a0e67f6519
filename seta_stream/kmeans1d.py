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

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

__all__ = ["KMeans1D", "kmeans1d", "assign", "B_MAX"]

B_MAX = 65_536
_CHUNK = 1 << 20  # elements per block: small temporaries avoid page faults on fresh memory
_PARALLEL_MIN = 1 << 21  # below this, splitting work over two threads does not pay


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
    """Cluster index (int16 for up to 32,767 clusters, else int32) of each value: the first
    cluster whose upper value is >= the value; values above the last upper value get the last
    cluster. Values must not be NaN.

    Counts, block by block, the upper values below each value; the comparison runs in float32
    when the values are float32 and the upper values are float32-exact (they are, for clusters
    of float32 values), else in float64.
    """
    v = np.asarray(values)
    up = np.asarray(upper, dtype=np.float64)
    k = len(up)
    out = np.zeros(v.shape, dtype=np.int16 if k <= 32_767 else np.int32)
    if k <= 1 or v.size == 0:
        return out
    if v.dtype == np.float32 and np.array_equal(up.astype(np.float32).astype(np.float64), up):
        thresholds = list(up[:-1].astype(np.float32))
    else:
        v = v.astype(np.float64, copy=False) if v.dtype != np.float64 else v
        thresholds = list(up[:-1])
    flat, o = v.ravel(), out.ravel()
    if k > 32:  # binary search beats k comparison passes
        for lo in range(0, flat.size, _CHUNK):
            o[lo : lo + _CHUNK] = np.searchsorted(np.asarray(thresholds, flat.dtype), flat[lo : lo + _CHUNK])
        return out
    step = _CHUNK // 4
    for lo in range(0, flat.size, step):
        seg, dst = flat[lo : lo + step], o[lo : lo + step]
        for t in thresholds:  # the last cluster takes every value above the previous upper
            dst += seg > t
    return out


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


def _parallel() -> bool:
    return (os.cpu_count() or 1) >= 2


def _sorted_values(values: np.ndarray) -> np.ndarray:
    """Sorted copy in float32 when the input is float32 (exact: float32 order is the order of
    the float64 copies), else in float64."""
    a = np.asarray(values).ravel()
    if a.dtype != np.float32 and a.dtype != np.float64:
        a = a.astype(np.float64)
    if len(a) < _PARALLEL_MIN or not _parallel():
        return np.sort(a)
    # split at a pivot (median of a strided sample) and sort the parts below and from it on two
    # cores, in place (NumPy releases the GIL): the lower part then precedes the upper one, so
    # no merge is needed. Same result as np.sort, about half its wall time.
    pivot = np.median(a[:: max(1, len(a) // 8192)])
    below = a < pivot  # NaN (sorted last by np.sort) is never below, so it lands in the upper part
    n_lo = int(np.count_nonzero(below))
    if not 0 < n_lo < len(a):  # NaN pivot, or the pivot is the minimum
        return np.sort(a)
    out = np.empty_like(a)
    np.compress(below, a, out=out[:n_lo])
    np.logical_not(below, out=below)
    np.compress(below, a, out=out[n_lo:])
    del below
    with ThreadPoolExecutor(2) as pool:
        list(pool.map(np.ndarray.sort, (out[:n_lo], out[n_lo:])))
    return out


def _count_changes(v: np.ndarray) -> int:
    """Number of positions p >= 1 with v[p] != v[p-1] (blockwise, no M-sized temporaries)."""
    total = 0
    for lo in range(0, len(v) - 1, _CHUNK):
        hi = min(len(v) - 1, lo + _CHUNK)
        total += int(np.count_nonzero(v[lo + 1 : hi + 1] != v[lo:hi]))
    return total


def _change_positions(v: np.ndarray) -> np.ndarray:
    """All positions p >= 1 with v[p] != v[p-1] (only called when there are few)."""
    parts = [np.zeros(0, dtype=np.int64)]
    for lo in range(0, len(v) - 1, _CHUNK):
        hi = min(len(v) - 1, lo + _CHUNK)
        parts.append(np.flatnonzero(v[lo + 1 : hi + 1] != v[lo:hi]).astype(np.int64) + lo + 1)
    return np.concatenate(parts)


class _Prefix:
    """Prefix sums of x = v - mean and x^2 at chosen positions of the sorted values v.

    ``at`` holds exact block sums at the point boundaries (one blockwise pass); prefix sums at
    any other position add the partial run from the nearest stored position (Lloyd needs only
    k' - 1 of them per iteration).

    Blocks of ``_CHUNK`` values are summed independently (on two threads for large inputs) and
    joined by adding the running total of the earlier blocks, in block order: the result does
    not depend on the number of threads.
    """

    def __init__(self, v: np.ndarray, positions: np.ndarray, mean: float) -> None:
        self.v, self.mean = v, mean
        self.pos = positions  # sorted, starts with 0, ends with M
        n_blocks = -(-len(v) // _CHUNK)
        if len(v) >= _PARALLEL_MIN and _parallel():
            h = n_blocks // 2
            with ThreadPoolExecutor(2) as pool:
                parts = list(pool.map(self._blocks, (range(0, h), range(h, n_blocks))))
            blocks = parts[0] + parts[1]
        else:
            blocks = self._blocks(range(n_blocks))
        s1 = np.zeros(len(positions))
        s2 = np.zeros(len(positions))
        carry1 = carry2 = 0.0
        for a, b, c1, c2, total1, total2 in blocks:
            s1[a:b] = carry1 + c1
            s2[a:b] = carry2 + c2
            carry1 += total1
            carry2 += total2
        self.s1, self.s2 = s1, s2

    def _blocks(self, blocks: range) -> list[tuple[int, int, np.ndarray, np.ndarray, float, float]]:
        """Per block: the stored positions in (lo, hi] as the slice [a, b) of ``pos``, the
        block's cumulative sums of x and x^2 at them, and the block's totals."""
        v, positions = self.v, self.pos
        x = np.empty(min(_CHUNK, len(v)), dtype=np.float64)
        sq = np.empty_like(x)
        out = []
        for blk in blocks:
            lo = blk * _CHUNK
            hi = min(len(v), lo + _CHUNK)
            xc, qc = x[: hi - lo], sq[: hi - lo]
            np.subtract(v[lo:hi], self.mean, out=xc, dtype=np.float64)
            np.multiply(xc, xc, out=qc)
            np.cumsum(xc, out=xc)
            np.cumsum(qc, out=qc)
            a, b = np.searchsorted(positions, [lo + 1, hi + 1])  # stored positions in (lo, hi]
            sel = positions[a:b] - lo - 1
            out.append((int(a), int(b), xc[sel], qc[sel], float(xc[-1]), float(qc[-1])))
        return out

    def at(self, p: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(sum of x, sum of x^2) over v[:p] for each position p."""
        p = np.asarray(p, dtype=np.int64)
        j = np.searchsorted(self.pos, p, side="right") - 1
        r1, r2 = self.s1[j].copy(), self.s2[j].copy()
        for t in np.flatnonzero(self.pos[j] != p):
            seg = self.v[self.pos[j[t]] : p[t]].astype(np.float64) - self.mean
            r1[t] += float(seg.sum())
            r2[t] += float(np.dot(seg, seg))
        return r1, r2


def kmeans1d(values: np.ndarray, k: int, *, b_max: int = B_MAX, max_iter: int = 1000) -> KMeans1D:
    """Cluster 1-D ``values`` (NaN not allowed) into min(k, distinct values) clusters (§3.5)."""
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    if b_max < 2:
        raise ValueError(f"b_max must be >= 2, got {b_max}")
    v = _sorted_values(values)
    if len(v) == 0:
        raise ValueError("kmeans1d needs at least one value")
    if np.isnan(v[-1]) or np.isnan(v[0]):  # np.sort puts NaN last
        raise ValueError("kmeans1d: values contain NaN")
    M = len(v)
    U = _count_changes(v) + 1
    k_eff = min(k, U)
    mean = float(np.mean(v, dtype=np.float64))
    if U <= b_max:  # points = distinct values with multiplicities: exact optimum (§3.5 item 2)
        cuts = _change_positions(v)
        binned = False
    else:  # bins: cut floor(t M / B) moved right to the next value change, duplicates dropped
        raw = (np.arange(1, b_max, dtype=np.int64) * M) // b_max
        cuts = np.unique(np.searchsorted(v, v[raw - 1], side="right"))
        cuts = cuts[cuts < M]
        binned = True
    positions = np.concatenate([[0], cuts, [M]]).astype(np.int64)
    pre = _Prefix(v, positions, mean)
    c = np.diff(positions).astype(np.float64)
    s = np.diff(pre.s1)
    q = np.diff(pre.s2)
    if k_eff == 1:
        run_end = np.array([len(c) - 1])
        sse = float(max(q.sum() - s.sum() ** 2 / c.sum(), 0.0))
    else:
        run_end, sse = _dp(c, s, q, k_eff)
    bounds = positions[run_end + 1]  # end (exclusive) of each cluster in sorted positions
    if binned:
        bounds, sse = _lloyd(v, pre, bounds, max_iter, mean)
    lo_idx = np.concatenate([[0], bounds[:-1]])
    counts = bounds - lo_idx
    s_hi, _ = pre.at(bounds)
    s_lo, _ = pre.at(lo_idx)
    return KMeans1D(
        upper=v[bounds - 1].astype(np.float64),
        lower=v[lo_idx].astype(np.float64),
        counts=counts.astype(np.int64),
        centroids=(s_hi - s_lo) / counts + mean,
        sse=sse,
        k_eff=k_eff,
        binned=binned,
    )


def _sse(pre: _Prefix, bounds: np.ndarray) -> float:
    lo = np.concatenate([[0], bounds[:-1]])
    a1, a2 = pre.at(lo)
    b1, b2 = pre.at(bounds)
    sm = b1 - a1
    return float(np.sum(np.maximum(b2 - a2 - sm * sm / (bounds - lo), 0.0)))


def _lloyd(v: np.ndarray, pre: _Prefix, bounds: np.ndarray, max_iter: int, mean: float) -> tuple[np.ndarray, float]:
    """Lloyd polish on the full sorted values (§3.5 item 4): each boundary moves to the midpoint
    of the neighbouring centroids (ties at the midpoint go to the lower cluster)."""
    M = len(v)
    for _ in range(max_iter):
        lo = np.concatenate([[0], bounds[:-1]])
        mu = (pre.at(bounds)[0] - pre.at(lo)[0]) / (bounds - lo) + mean
        mid = (mu[:-1] + mu[1:]) / 2
        # count of values <= mid, searched in v's own dtype (no M-element cast): the largest
        # value of v's dtype that is <= mid gives the same count
        mid_v = mid.astype(v.dtype)
        over = mid_v.astype(np.float64) > mid
        mid_v[over] = np.nextafter(mid_v[over], v.dtype.type(-np.inf))
        new = np.append(np.searchsorted(v, mid_v, side="right"), M).astype(np.int64)
        lo_new = np.concatenate([[0], new[:-1]])
        if np.any(new - lo_new <= 0):  # a cluster would become empty: keep the previous ones
            break
        if np.array_equal(new, bounds):
            break
        bounds = new
    return bounds, _sse(pre, bounds)
