"""Exact, deterministic 1-D k-means (docs/algorithms.md §3.5).

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

import contextlib
import math
import os
import tempfile
import time
from collections.abc import Callable, Generator, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np

from ..errors import InvalidInputError
from .arrays import group_order
from .exact import Distinct, digit_histogram, exact_sum, float_keys, key_values
from .mapreduce import Step

__all__ = [
    "KMeans1D",
    "kmeans1d",
    "kmeans1d_steps",
    "assign",
    "B_MAX",
    "sum_cells",
    "cells_sum",
    "Points",
    "points1d",
    "points1d_steps",
    "split_points",
]

B_MAX = 65_536
_CHUNK = 1 << 20  # elements per block: small temporaries avoid page faults on fresh memory
_POLARS_SORT_MIN = 1 << 20  # below this np.sort is as fast (and the sample the two sorts are timed on)


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


@dataclass(frozen=True)
class Points:
    """The weighted points k-means runs its DP on (§3.5 item 2): the distinct values with their
    multiplicities (``binned`` False), or at most ``B_MAX`` bins of the sorted values. Point j
    holds ``counts[j]`` values between ``lower[j]`` and ``upper[j]``; ``s1[j]`` and ``s2[j]`` are
    the sums of x and x^2 over them, x = value - ``mean`` (the exact mean of all values). The
    same numbers, bit for bit, whether computed whole (:func:`points1d`) or over buckets
    (:func:`points1d_steps`)."""

    counts: np.ndarray  # int64[P]
    s1: np.ndarray  # float64[P]
    s2: np.ndarray  # float64[P]
    lower: np.ndarray  # float64[P]
    upper: np.ndarray  # float64[P]
    mean: float
    binned: bool

    @property
    def total(self) -> int:
        return int(self.counts.sum())


def split_points(points: Points, k: int) -> tuple[np.ndarray, float]:
    """The optimal split of ``points`` into k <= len(points) contiguous runs (the exact DP of
    §3.5 item 3, leftmost among equal costs): (index of the last point of each run, SSE)."""
    c = points.counts.astype(np.float64)
    if k == 1:
        return np.array([len(c) - 1]), float(max(points.s2.sum() - points.s1.sum() ** 2 / c.sum(), 0.0))
    return _dp(c, points.s1, points.s2, k)


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
    # counted in one byte a value, in reused block buffers, then widened once (at 15M values
    # and k = 10, 0.02 s against 0.03 - 0.06 s for adding each comparison into the int16 output)
    step = _CHUNK // 4
    acc = np.empty(min(step, flat.size), dtype=np.uint8)
    above = np.empty(len(acc), dtype=bool)
    for lo in range(0, flat.size, step):
        seg = flat[lo : lo + step]
        a, x = acc[: len(seg)], above[: len(seg)]
        a[:] = 0
        for t in thresholds:  # the last cluster takes every value above the previous upper
            np.greater(seg, t, out=x)
            a += x.view(np.uint8)
        o[lo : lo + step] = a
    return out


def _dp(c: np.ndarray, s: np.ndarray, q: np.ndarray, k: int) -> tuple[np.ndarray, float]:
    """Optimal split of weighted points into k contiguous runs. Returns run ends (inclusive).

    One recursion level of every layer is a handful of passes over the candidates: for each
    interval's middle point i, the candidates a of its range, their cost D[j-1][a-1] +
    SSE(a..i), and the leftmost minimum per range (first position equal to the range minimum).
    """
    B = len(c)
    P0 = np.concatenate([[0.0], np.cumsum(c)])
    P1 = np.concatenate([[0.0], np.cumsum(s)])
    P2 = np.concatenate([[0.0], np.cumsum(q)])
    cnt, sm = P0[1:], P1[1:]
    D_prev = np.maximum(P2[1:] - sm * sm / cnt, 0.0)  # one run: points 0..i
    opts = []
    for j in range(1, k):  # layer j = j+1 clusters; valid i >= j
        D_cur = np.full(B, np.inf)
        opt = np.zeros(B, dtype=np.int64)
        before = np.concatenate([[np.inf], D_prev[:-1]])  # before[a] = D[j-1][a-1]
        # intervals of i with candidate ranges of a; the last layer is read at i = B-1 alone
        # (the split's last run and the SSE): one level, its candidates the whole range, the
        # same minimum and leftmost a as the recursion finds there (1/k of the DP's time less)
        ilo = np.array([j if j < k - 1 else B - 1], dtype=np.int64)
        ihi = np.array([B - 1], dtype=np.int64)
        alo = np.array([j], dtype=np.int64)
        ahi = np.array([B - 1], dtype=np.int64)
        while len(ilo):
            mid = (ilo + ihi) // 2
            lengths = np.minimum(ahi, mid) - alo + 1
            ends = np.cumsum(lengths)
            starts = ends - lengths
            cand = np.arange(int(ends[-1]))
            cand += np.repeat(alo - starts, lengths)
            # SSE(a..mid) = Q - S^2 / C over points a..mid, from prefix sums
            cnt = np.repeat(P0[mid + 1], lengths)
            cnt -= P0[cand]
            sm = np.repeat(P1[mid + 1], lengths)
            sm -= P1[cand]
            vals = np.repeat(P2[mid + 1], lengths)
            vals -= P2[cand]
            sm *= sm
            sm /= cnt
            vals -= sm
            np.maximum(vals, 0.0, out=vals)
            vals += before[cand]
            mins = np.minimum.reduceat(vals, starts)
            hits = np.flatnonzero(vals == np.repeat(mins, lengths))
            best_a = cand[hits[np.searchsorted(hits, starts)]]  # leftmost minimum of each range
            D_cur[mid] = mins
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


def _sorted_values(values: np.ndarray) -> np.ndarray:
    """Sorted copy in float32 when the input is float32 (exact: float32 order is the order of
    the float64 copies), else in float64; NaN last.

    Large inputs are sorted by whichever of np.sort and polars (on all cores) sorts faster on
    this machine (:func:`_polars_sorts_faster`): NumPy's SIMD sort, where the CPU has it, sorts
    15M float32 in 0.06 s, polars in 0.25 s; without it np.sort took 0.7 s, polars 0.3 - 0.4 s.
    The values are the same either way (only the order of -0.0 and 0.0 among themselves may
    differ, and no comparison can tell them apart), so plans do not depend on the choice."""
    a = np.asarray(values).ravel()
    if a.dtype != np.float32 and a.dtype != np.float64:
        a = a.astype(np.float64)
    if len(a) < _POLARS_SORT_MIN or not _polars_sorts_faster(a):
        return np.sort(a)
    return _polars_sort(a)


def _polars_sort(a: np.ndarray) -> np.ndarray:
    import polars as pl

    if a.dtype == np.float32 and _sign_bits_clear(a):
        # non-negative float32 values (losses, scores; a NaN is one without its sign bit) sort
        # as their bits do as int32: the same values, 0.44 s of CPU for 15M here against 0.54 s
        # for polars' float sort (which orders NaN and the signed zeros apart)
        return pl.Series(a.view(np.int32)).sort().to_numpy().view(np.float32)
    out = pl.Series(a).sort().to_numpy()
    return out if out.dtype == a.dtype else out.astype(a.dtype)


#: dtype -> whether polars sorted a sample of that dtype faster than np.sort in this process
_FASTER: dict[str, bool] = {}


def _polars_sorts_faster(a: np.ndarray) -> bool:
    """Whether polars sorts ``a``'s dtype faster than np.sort here: timed once a process, on
    the first :data:`_POLARS_SORT_MIN` values of the first large input (a few ms), best of 2."""
    key = a.dtype.str
    if key not in _FASTER:
        sample = np.array(a[:_POLARS_SORT_MIN])
        times = []
        for sort in (np.sort, _polars_sort):
            best = math.inf
            for _ in range(2):
                t = time.perf_counter()
                sort(sample)
                best = min(best, time.perf_counter() - t)
            times.append(best)
        _FASTER[key] = times[1] < times[0]
    return _FASTER[key]


def _sign_bits_clear(a: np.ndarray) -> bool:
    """Whether no float32 value of ``a`` has its sign bit set (-0.0 and negative values do)."""
    return bool(len(a) == 0 or a.view(np.int32).min() >= 0)


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


def sum_cells(values: np.ndarray) -> np.ndarray:
    """The exact sum of float32 values as 512 int64 cells, one per (sign, exponent): cell
    256 s + e holds the sum of the 24-bit significands of the values with that sign and biased
    exponent e. Cells of several arrays add up (exactly: int64 holds 2^39 values a cell), so
    the sum of a column split into buckets is the sum of the whole column.

    Float32 only, beside the general ``_exact.ExactSums``: it is its result (the same rounded
    sum) about 3x faster, 0.22 s against 0.65 s for 15M losses here, which keeps the exact mean
    inside the one-bucket plan's time budget."""
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    cells = np.zeros(512, np.int64)
    for lo in range(0, len(bits), _CHUNK):
        b = bits[lo : lo + _CHUNK]
        exponent = (b >> np.uint32(23)) & np.uint32(0xFF)
        significand = (b & np.uint32(0x7FFFFF)) | ((exponent != 0).astype(np.uint32) << np.uint32(23))
        cell = exponent | ((b >> np.uint32(31)) << np.uint32(8))
        cells += np.bincount(cell, weights=significand, minlength=512).astype(np.int64)  # exact: < 2^44
    return cells


def cells_sum(cells: np.ndarray) -> float:
    """The float64 nearest the exact sum that :func:`sum_cells` cells hold (ties to even)."""
    total = 0
    for cell in np.flatnonzero(cells).tolist():
        e = max(cell & 0xFF, 1)  # subnormals: exponent 1, no implicit bit
        term = int(cells[cell]) << (e - 1)  # in units of 2^-149
        total += -term if cell >> 8 else term
    return float(Fraction(total, 1 << 149))


def _mean(v: np.ndarray) -> float:
    """The mean of the sorted values: their exact sum rounded once, over their number (the
    same for any split of the values into buckets)."""
    if v.dtype == np.float32:
        return cells_sum(_sorted_sum_cells(v)) / len(v)
    return exact_sum(v) / len(v)


def _sorted_sum_cells(v: np.ndarray) -> np.ndarray:
    """:func:`sum_cells` of float32 values sorted in ascending order (no NaN), the same cells,
    in one pass instead of four: sorted values of one sign and exponent are contiguous (the
    bits of non-negative values ascend with them, those of negative values descend), so each
    cell is the sum over a run of the bits, in exact uint64 arithmetic, less the run's length
    times the cell's bits above the significand (plus the implicit bit of normal values). The
    zeros (either sign, in any order among themselves) add nothing and are skipped."""
    v = np.ascontiguousarray(v, dtype=np.float32)
    bits = v.view(np.uint32)
    zero = np.float32(0.0)  # a float32 needle: a float64 one converts the whole array
    zero_lo, zero_hi = int(np.searchsorted(v, zero, side="left")), int(np.searchsorted(v, zero, side="right"))
    cells = np.zeros(512, np.int64)
    for run in (bits[:zero_lo][::-1], bits[zero_hi:]):  # negative, positive: bits ascending
        if not len(run):
            continue
        first, last = int(run[0]) >> 23, int(run[-1]) >> 23
        starts = np.array([min(c << 23, 2**32 - 1) for c in range(first, last + 2)], dtype=np.uint32)  # same dtype
        cuts = np.searchsorted(run, starts)
        cuts[-1] = len(run)
        for cell, lo, hi in zip(range(first, last + 1), cuts[:-1].tolist(), cuts[1:].tolist()):
            if hi > lo:
                total = int(np.sum(run[lo:hi], dtype=np.uint64)) - (hi - lo) * (cell << 23)
                cells[cell] = total + ((hi - lo) << 23 if cell & 0xFF else 0)
    return cells


class _Prefix:
    """Sums of x = v - mean and x^2 over the points (runs between chosen positions of the sorted
    values v), and prefix sums at those positions.

    ``bin_s1``/``bin_s2`` hold each run's sums (one blockwise pass of ``np.add.reduceat``);
    ``s1``/``s2`` their running totals at the stored positions. Prefix sums at any other
    position add the partial run from the nearest stored position (Lloyd needs only k' - 1 of
    them per iteration). Blocks of ``_CHUNK`` values, a constant: the sums do not depend on the
    machine.
    """

    def __init__(self, v: np.ndarray, positions: np.ndarray, mean: float) -> None:
        self.v, self.mean = v, mean
        self.pos = positions  # sorted, starts with 0, ends with M
        n_bins = len(positions) - 1
        self.bin_s1, self.bin_s2 = np.zeros(n_bins), np.zeros(n_bins)
        _add_bin_sums(self.bin_s1, self.bin_s2, v, 0, positions, mean)
        self._finish()

    def _finish(self) -> None:
        self.s1 = np.concatenate([[0.0], np.cumsum(self.bin_s1)])
        self.s2 = np.concatenate([[0.0], np.cumsum(self.bin_s2)])

    def _run(self, start: int, stop: int) -> np.ndarray:
        """The sorted values at positions [start, stop) (inside one run)."""
        return self.v[start:stop]

    def at(self, p: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(sum of x, sum of x^2) over v[:p] for each position p."""
        p = np.asarray(p, dtype=np.int64)
        j = np.searchsorted(self.pos, p, side="right") - 1
        r1, r2 = self.s1[j].copy(), self.s2[j].copy()
        for t in np.flatnonzero(self.pos[j] != p):
            seg = self._run(int(self.pos[j[t]]), int(p[t])).astype(np.float64) - self.mean
            r1[t] += float(seg.sum())
            r2[t] += float(np.dot(seg, seg))
        return r1, r2


def _add_bin_sums(
    b1: np.ndarray, b2: np.ndarray, v: np.ndarray, start: int, positions: np.ndarray, mean: float
) -> None:
    """Add to ``b1``/``b2`` the sums of x = v - mean and x^2 over the runs between
    ``positions`` of the sorted values ``v``, which sit at positions [start, start + len(v)).

    Blocks of ``_CHUNK`` positions (a constant, aligned to position 0), each summed piece by
    piece with ``np.add.reduceat``: any range of whole runs gives the same sums as the whole
    array, so a partitioned plan that gathers the runs a range at a time gets the sums of the
    one-bucket plan, bit for bit."""
    end = start + len(v)
    lo = start
    x = np.empty(min(_CHUNK, len(v)), dtype=np.float64)
    sq = np.empty_like(x)
    while lo < end:
        hi = min(end, (lo // _CHUNK + 1) * _CHUNK)
        xc, qc = x[: hi - lo], sq[: hi - lo]
        np.subtract(v[lo - start : hi - start], mean, out=xc, dtype=np.float64)
        np.multiply(xc, xc, out=qc)
        # pieces of the block: from lo, and from every stored position inside (lo, hi)
        j = int(np.searchsorted(positions, lo, side="right")) - 1  # the run holding lo
        a, b = np.searchsorted(positions, [lo + 1, hi])
        starts = np.concatenate([[0], positions[a:b] - lo])
        b1[j : j + len(starts)] += np.add.reduceat(xc, starts)
        b2[j : j + len(starts)] += np.add.reduceat(qc, starts)
        lo = hi


def _whole_points(v: np.ndarray, b_max: int) -> tuple[np.ndarray, _Prefix, int, bool]:
    """(positions, prefix sums, number of distinct values U, binned) of the sorted values ``v``
    (§3.5 item 2): the distinct values when U <= ``b_max``, else bins."""
    if len(v) == 0:
        raise InvalidInputError("kmeans1d needs at least one value")
    if np.isnan(v[-1]) or np.isnan(v[0]):  # np.sort puts NaN last
        raise InvalidInputError("kmeans1d: values contain NaN")
    M = len(v)
    U = _count_changes(v) + 1
    mean = _mean(v)
    if U <= b_max:  # points = distinct values with multiplicities: exact optimum (§3.5 item 2)
        cuts = _change_positions(v)
        binned = False
    else:  # bins: cut floor(t M / B) moved right to the next value change, duplicates dropped
        raw = (np.arange(1, b_max, dtype=np.int64) * M) // b_max
        cuts = np.unique(np.searchsorted(v, v[raw - 1], side="right"))
        cuts = cuts[cuts < M]
        binned = True
    positions = np.concatenate([[0], cuts, [M]]).astype(np.int64)
    return positions, _Prefix(v, positions, mean), U, binned


def kmeans1d(values: np.ndarray, k: int, *, b_max: int = B_MAX, max_iter: int = 1000) -> KMeans1D:
    """Cluster 1-D ``values`` (NaN not allowed) into min(k, distinct values) clusters (§3.5)."""
    if k < 1:
        raise InvalidInputError(f"k must be >= 1, got {k}")
    if b_max < 2:
        raise InvalidInputError(f"b_max must be >= 2, got {b_max}")
    v = _sorted_values(values)
    positions, pre, U, binned = _whole_points(v, b_max)
    mean = pre.mean
    k_eff = min(k, U)
    c = np.diff(positions).astype(np.float64)
    s, q = pre.bin_s1, pre.bin_s2
    k_eff = min(k_eff, len(c))  # ties can merge bin cuts: never more clusters than points
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
    return KMeans1D(  # + 0.0: a cluster ending at a zero ends at +0.0, whichever zero sorted last
        upper=v[bounds - 1].astype(np.float64) + 0.0,
        lower=v[lo_idx].astype(np.float64) + 0.0,
        counts=counts.astype(np.int64),
        centroids=(s_hi - s_lo) / counts + mean,
        sse=sse,
        k_eff=k_eff,
        binned=binned,
    )


def points1d(values: np.ndarray, *, b_max: int = B_MAX) -> Points:
    """The :class:`Points` of the float32 ``values`` (NaN not allowed): what :func:`kmeans1d`
    clusters, for a computation of its own on them (the two-component mixture of §12)."""
    if b_max < 2:
        raise InvalidInputError(f"b_max must be >= 2, got {b_max}")
    v = _sorted_values(np.asarray(values, dtype=np.float32))
    positions, pre, _, binned = _whole_points(v, b_max)
    return Points(
        counts=np.diff(positions).astype(np.int64),
        s1=pre.bin_s1,
        s2=pre.bin_s2,
        lower=v[positions[:-1]].astype(np.float64) + 0.0,
        upper=v[positions[1:] - 1].astype(np.float64) + 0.0,
        mean=pre.mean,
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


# ---------------------------------------------------------------------------------- partitioned
#: Sorted values a partitioned k-means gathers at once (bin sums are added a range of bins at a
#: time): 32 MB of float32 plus the sort's temporaries.
GATHER_VALUES = 1 << 23
#: Ranges up to which a bucket's values are split into their ranges by one mask a range rather
#: than by grouping them (``group_order``) and gathering: 7.5M values in 2 ranges took 0.10 s
#: against 0.15 s here, in 24 ranges 0.17 s against 0.21 s (a pass a range grows with them).
_MASK_SPLIT_MAX = 32


class _GatheredPrefix(_Prefix):
    """:class:`_Prefix` of values no process holds whole: bin sums added a range of bins at a
    time (:func:`_add_bin_sums`); ``v`` is set when the sorted values are on disk."""

    def __init__(self, positions: np.ndarray, mean: float) -> None:
        self.v: Any = None
        self.mean, self.pos = mean, positions
        self.bin_s1, self.bin_s2 = np.zeros(len(positions) - 1), np.zeros(len(positions) - 1)


def _ranges(counts: np.ndarray, budget: int) -> list[tuple[int, int]]:
    """Consecutive bin ranges [j0, j1) of at most ``budget`` values each (at least one bin)."""
    out, j0, acc = [], 0, 0
    for j, c in enumerate(counts.tolist()):
        if acc and acc + c > budget:
            out.append((j0, j))
            j0, acc = j, 0
        acc += c
    out.append((j0, len(counts)))
    return out


def _range_of_prefix(bounds16: list[tuple[int, int]]) -> np.ndarray:
    """The range of :func:`_ranges` each 16-bit prefix of a float32 order key falls in, as a
    table of 65,536 entries (uint8 or uint16).

    Why: a binary search of every value among the ranges' first keys costs log2(ranges)
    compares a value, and the ranges grow with the values (one per 8M): at 200M samples, 22
    ranges, 3.5 s of a 45 s SeTa plan; a lookup by prefix costs the same at any size."""
    starts = np.array([hi for _, hi in bounds16[:-1]], np.int64)  # first prefix of each next range
    lut = np.searchsorted(starts, np.arange(1 << 16), side="right")
    return lut.astype(np.uint8 if len(bounds16) <= 1 << 8 else np.uint16)


def _first(pieces: list[Any]) -> Any:
    cells, distinct, hist = pieces[0]
    for c, d, h in pieces[1:]:
        cells, distinct, hist = cells + c, distinct.merge(d), hist + h
    return cells, distinct, hist


class _FirstPass:
    """The first map of :func:`kmeans1d_steps` and :func:`points1d_steps`: a bucket's exact-sum
    cells, its distinct values (or overflow past ``cap``) and the histogram of the top 16 bits
    of its float32 order keys."""

    def __init__(self, values_of: Callable[[Any], np.ndarray], cap: int) -> None:
        self.values_of, self.cap = values_of, cap

    def __call__(self, inp: Any) -> tuple[np.ndarray, Any, np.ndarray]:
        v = self.values_of(inp)
        keys = float_keys(v)
        head = Distinct.of(keys[: 4 * self.cap], self.cap)  # usually enough to see more than cap values
        hist = digit_histogram(keys, 16)
        return sum_cells(v), head if head.overflow else Distinct.of(keys, self.cap), hist


def _distinct_points(distinct: Any, mean: float) -> tuple[np.ndarray, np.ndarray, _GatheredPrefix]:
    """(distinct float32 values, positions, prefix sums) from the merged distinct values: the
    bin sums from the values repeated a range of bins at a time."""
    uniq = key_values(distinct.values, np.float32)
    counts = distinct.counts
    positions = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    pre = _GatheredPrefix(positions, mean)
    for j0, j1 in _ranges(counts, GATHER_VALUES):
        run = np.repeat(uniq[j0:j1], counts[j0:j1])
        _add_bin_sums(pre.bin_s1, pre.bin_s2, run, int(positions[j0]), positions, mean)
    pre._finish()
    return uniq, positions, pre


def kmeans1d_steps(
    values_of: Callable[[Any], np.ndarray], M: int, k: int, *, b_max: int = B_MAX, max_iter: int = 1000
) -> Generator[Step, Any, KMeans1D]:
    """:func:`kmeans1d` of the float32 values ``values_of(inp)`` of all buckets (``M`` of them,
    no NaN) as map/reduce steps (``_steps``), bit for bit :func:`kmeans1d`'s result.

    The same algorithm on the same numbers: the exact mean (:func:`sum_cells`), the distinct
    values (:class:`seta_stream._kernels.exact.Distinct`) or the bin cuts (order statistics by radix
    passes, then counts), the bin sums from the sorted values gathered a range of bins at a
    time (at most :data:`GATHER_VALUES` in memory), the same DP, and Lloyd's iterations on the
    sorted values kept in a scratch file (:func:`_binned_steps`)."""
    if k < 1:
        raise InvalidInputError(f"k must be >= 1, got {k}")
    if M < 1:
        raise InvalidInputError("kmeans1d needs at least one value")

    cells, distinct, hist = yield Step(_FirstPass(values_of, max(b_max, k)), _first)
    mean = cells_sum(cells) / M
    if not distinct.overflow and len(distinct.values) <= b_max:
        uniq, positions, pre = _distinct_points(distinct, mean)
        edges = uniq
        k_eff = min(k, len(uniq))
    else:  # more distinct values than b_max (U known exactly up to max(b_max, k))
        k_eff = k if distinct.overflow else min(k, len(distinct.values))
        with tempfile.TemporaryDirectory(prefix="seta-stream-kmeans-") as scratch:
            return (yield from _binned_steps(values_of, M, k_eff, b_max, max_iter, mean, scratch, hist))
    c = np.diff(positions).astype(np.float64)
    if k_eff == 1:
        run_end = np.array([len(c) - 1])
        sse = float(max(pre.bin_s2.sum() - pre.bin_s1.sum() ** 2 / c.sum(), 0.0))
    else:
        run_end, sse = _dp(c, pre.bin_s1, pre.bin_s2, k_eff)
    bounds = positions[run_end + 1]
    lo_idx = np.concatenate([[0], bounds[:-1]])
    n = bounds - lo_idx
    s_hi, _ = pre.at(bounds)
    s_lo, _ = pre.at(lo_idx)
    return KMeans1D(  # clusters end at distinct values
        upper=edges[np.searchsorted(positions, bounds) - 1].astype(np.float64),
        lower=edges[np.searchsorted(positions, lo_idx)].astype(np.float64),
        counts=n.astype(np.int64),
        centroids=(s_hi - s_lo) / n + mean,
        sse=sse,
        k_eff=k_eff,
        binned=False,
    )


def _binned_steps(
    values_of: Callable[[Any], np.ndarray],
    M: int,
    k_eff: int,
    b_max: int,
    max_iter: int,
    mean: float,
    scratch: str,
    hist: np.ndarray,
) -> Generator[Step, Any, KMeans1D]:
    """The binned case of :func:`kmeans1d_steps`: the values sorted externally and their bins
    (:func:`_gather_binned`), then the DP, Lloyd's iterations and the clusters' ends exactly as
    in :func:`kmeans1d`, on the sorted values memory-mapped from the scratch file."""
    positions, pre, v = yield from _gather_binned(values_of, M, b_max, mean, scratch, hist)
    c = np.diff(positions).astype(np.float64)
    k_eff = min(k_eff, len(c))  # ties can merge bin cuts: never more clusters than points
    if k_eff == 1:
        run_end = np.array([len(c) - 1])
    else:
        run_end, _ = _dp(c, pre.bin_s1, pre.bin_s2, k_eff)
    bounds, sse = _lloyd(v, pre, positions[run_end + 1], max_iter, mean)
    lo_idx = np.concatenate([[0], bounds[:-1]])
    n = bounds - lo_idx
    s_hi, _ = pre.at(bounds)
    s_lo, _ = pre.at(lo_idx)
    result = KMeans1D(
        upper=np.asarray(v[bounds - 1], np.float64) + 0.0,
        lower=np.asarray(v[lo_idx], np.float64) + 0.0,
        counts=n.astype(np.int64),
        centroids=(s_hi - s_lo) / n + mean,
        sse=sse,
        k_eff=k_eff,
        binned=True,
    )
    del v, pre
    return result


def _gather_binned(
    values_of: Callable[[Any], np.ndarray], M: int, b_max: int, mean: float, scratch: str, hist: np.ndarray
) -> Generator[Step, Any, tuple[np.ndarray, _GatheredPrefix, np.ndarray]]:
    """(positions, prefix sums, sorted values memory-mapped from ``scratch``) of the bins of
    :func:`kmeans1d`'s binned case, without any process holding all values. ``hist`` counts
    them by the top 16 bits of their float32 order keys; consecutive key ranges of at most
    :data:`GATHER_VALUES` values (or one 16-bit prefix, when it alone holds more) get a scratch
    file each, filled in one pass over the buckets. Each range is then read back and sorted:
    its cut positions and its bins' sums are those of :func:`kmeans1d` (equal values never
    straddle two ranges, and the sums run in the same fixed blocks), and it is appended to one
    sorted scratch file."""
    bounds16 = _ranges(hist, GATHER_VALUES)  # ranges of 16-bit prefixes
    range_of = _range_of_prefix(bounds16)

    def split(inp: Any) -> list[np.ndarray]:
        v = values_of(inp)
        keys = float_keys(v)
        keys >>= np.uint32(16)
        where = range_of[keys]
        del keys
        if len(bounds16) <= _MASK_SPLIT_MAX:  # the same pieces, in the same order
            return [v[where == r] for r in range(len(bounds16))]
        order = group_order(where, len(bounds16))
        cut = np.concatenate([[0], np.cumsum(np.bincount(where, minlength=len(bounds16)))])
        return [v[order[cut[r] : cut[r + 1]]] for r in range(len(bounds16))]

    files = [os.path.join(scratch, f"range-{r:05d}.f32") for r in range(len(bounds16))]
    for f in files:
        open(f, "wb").close()

    def append(pieces: list[list[np.ndarray]]) -> None:
        for r, f in enumerate(files):
            with open(f, "ab") as sink:
                for piece in pieces:
                    piece[r].astype(np.float32).tofile(sink)

    yield Step(split, append, streamed=True)  # one bucket's values in memory at a time
    raw = (np.arange(1, b_max, dtype=np.int64) * M) // b_max
    b1, b2 = np.zeros(b_max), np.zeros(b_max)
    positions = [0]
    path = os.path.join(scratch, "sorted.f32")
    start = 0
    # the values of the piece that runs on past the last range (from its first position): the
    # sums run over whole pieces only, as kmeans1d's do (a piece summed in two parts rounds
    # otherwise)
    held, held_start = np.zeros(0, np.float32), 0
    # closed on an error too: the range being read ahead is waited for before the scratch goes
    with contextlib.closing(_sorted_ranges(files)) as ranges, open(path, "wb") as sorted_sink:
        for run in ranges:
            end = start + len(run)
            # cuts floor(t M / B) moved right past the values equal to v[raw - 1] (kmeans1d's cuts)
            inside = raw[(raw - 1 >= start) & (raw - 1 < end)]
            cuts = start + np.searchsorted(run, run[inside - 1 - start], side="right")
            positions.extend(c for c in np.unique(cuts).tolist() if c < M and c > positions[-1])
            run.tofile(sorted_sink)
            piece = max(positions[-1], (end // _CHUNK) * _CHUNK, held_start)  # first position of the last piece
            values = np.concatenate([held, run])
            _add_bin_sums(b1, b2, values[: piece - held_start], held_start, np.asarray(positions, np.int64), mean)
            held, held_start = values[piece - held_start :], piece
            start = end
    if start != M:
        raise RuntimeError(f"kmeans1d over buckets: {start} values gathered, {M} expected")
    positions.append(M)
    cut_at = np.asarray(positions, np.int64)
    _add_bin_sums(b1, b2, held, held_start, cut_at, mean)
    del held
    pre = _GatheredPrefix(cut_at, mean)
    pre.bin_s1, pre.bin_s2 = b1[: len(cut_at) - 1], b2[: len(cut_at) - 1]
    pre._finish()
    v = np.memmap(path, dtype=np.float32, mode="r", shape=(M,))
    pre.v = v
    return cut_at, pre, v


def _sorted_ranges(files: list[str]) -> Iterator[np.ndarray]:
    """The values of each range file sorted as :func:`kmeans1d` sorts them, one file after the
    other (each removed once read), the next file read and sorted on another thread while the
    caller works on the one before.

    Why: the caller's work on a range (its cuts, its bins' sums, writing it to the sorted file)
    is one thread's, and the sort does not keep both cores busy either: overlapped, the loop over
    the ranges of 96M values in 12 buckets took 2.27 s against 3.0 s one range after the other
    (medians of 4, alternating in one process; docs/benchmarks.md, "Web scale"). Two ranges are
    in memory at once instead of one (32 MB each at most, beside the sort's own)."""

    def load(f: str) -> np.ndarray:
        run = _sorted_values(np.fromfile(f, dtype=np.float32))  # as kmeans1d sorts (polars past 1M)
        os.unlink(f)
        return run

    with ThreadPoolExecutor(1, thread_name_prefix="seta-stream-sort") as pool:
        ahead = pool.submit(load, files[0]) if files else None
        for i in range(len(files)):
            assert ahead is not None
            run = ahead.result()
            ahead = pool.submit(load, files[i + 1]) if i + 1 < len(files) else None
            yield run
            del run  # the range the caller is done with is not held while the next one is awaited


def points1d_steps(
    values_of: Callable[[Any], np.ndarray], M: int, *, b_max: int = B_MAX
) -> Generator[Step, Any, Points]:
    """:func:`points1d` of the float32 values ``values_of(inp)`` of all buckets (``M`` of them,
    no NaN) as map/reduce steps, bit for bit: the first pass of :func:`kmeans1d_steps`, then
    the distinct values or the bins gathered as it gathers them."""
    if M < 1:
        raise InvalidInputError("kmeans1d needs at least one value")
    cells, distinct, hist = yield Step(_FirstPass(values_of, b_max), _first)
    mean = cells_sum(cells) / M
    if not distinct.overflow and len(distinct.values) <= b_max:
        uniq, positions, pre = _distinct_points(distinct, mean)
        edges = uniq.astype(np.float64) + 0.0
        return Points(distinct.counts.astype(np.int64), pre.bin_s1, pre.bin_s2, edges, edges, mean, False)
    with tempfile.TemporaryDirectory(prefix="seta-stream-kmeans-") as scratch:
        positions, pre, v = yield from _gather_binned(values_of, M, b_max, mean, scratch, hist)
        lower = np.asarray(v[positions[:-1]], np.float64) + 0.0
        upper = np.asarray(v[positions[1:] - 1], np.float64) + 0.0
        points = Points(np.diff(positions).astype(np.int64), pre.bin_s1, pre.bin_s2, lower, upper, mean, True)
        del v, pre
    return points
