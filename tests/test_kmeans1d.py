"""Exact 1-D k-means: optimum vs brute force and an O(k M^2) DP, ties, degenerate inputs."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from seta_stream.kmeans1d import assign, kmeans1d


def sse_of(x, bounds):
    x = np.sort(x)
    lo = 0
    total = 0.0
    for b in bounds:
        seg = x[lo:b]
        total += float(((seg - seg.mean()) ** 2).sum())
        lo = b
    return total


def brute_force(x, k):
    x = np.sort(x)
    n = len(x)
    best = np.inf
    for cuts in itertools.combinations(range(1, n), k - 1):
        if any(x[c - 1] == x[c] for c in cuts):
            continue  # equal values are never split
        best = min(best, sse_of(x, [*cuts, n]))
    return best


def quadratic_dp(x, k):
    x = np.sort(x)
    n = len(x)
    cost = np.full((n, n), np.inf)
    for a in range(n):
        for b in range(a, n):
            seg = x[a : b + 1]
            cost[a, b] = ((seg - seg.mean()) ** 2).sum()
    D = cost[0].copy()
    for _ in range(1, k):
        D = np.array([min([D[a - 1] + cost[a, i] for a in range(1, i + 1)] or [np.inf]) for i in range(n)])
    return D[n - 1]


@settings(max_examples=150, deadline=None)
@given(st.lists(st.integers(0, 8), min_size=1, max_size=12), st.integers(1, 4))
def test_matches_exhaustive_search(values, k):
    x = np.array(values, dtype=np.float64) * 0.5
    r = kmeans1d(x, k)
    assert r.k_eff == min(k, len(set(values)))
    assert r.sse == pytest.approx(brute_force(x, r.k_eff), abs=1e-9)
    assert r.counts.sum() == len(x)
    assert np.all(np.diff(r.centroids) > 0)


@pytest.mark.parametrize("seed", [0, 1])
def test_matches_quadratic_dp(seed):
    rng = np.random.default_rng(seed)
    x = rng.lognormal(size=300).astype(np.float32)
    r = kmeans1d(x, 6)
    assert r.sse == pytest.approx(quadratic_dp(x.astype(np.float64), 6), rel=1e-9)


def test_ties_are_never_split_and_membership_follows_upper_bounds():
    x = np.array([1, 1, 1, 2, 2, 5, 5, 5, 5, 9], dtype=np.float32)
    r = kmeans1d(x, 3)
    c = assign(x, r.upper)
    for v in np.unique(x):
        assert len(set(c[x == v])) == 1
    assert list(r.counts) == [np.sum(c == j) for j in range(r.k_eff)]
    assert list(r.upper) == [2.0, 5.0, 9.0] and list(r.lower) == [1.0, 5.0, 9.0]


@pytest.mark.parametrize(
    ("values", "k", "k_eff", "counts"),
    [
        ([3.0] * 10, 5, 1, [10]),  # all equal: one cluster
        ([1.0, 2.0, 5.0] * 50, 5, 3, [50, 50, 50]),  # fewer distinct values than k (reference: NaN centroids)
        ([1.0, 2.0, 3.0], 3, 3, [1, 1, 1]),  # U == k
        ([7.0], 10, 1, [1]),
    ],
)
def test_degenerate_inputs(values, k, k_eff, counts):
    r = kmeans1d(np.array(values), k)
    assert r.k_eff == k_eff and list(r.counts) == counts
    assert np.all(np.isfinite(r.centroids))


def test_binned_mode_is_close_to_optimal_and_deterministic():
    rng = np.random.default_rng(3)
    x = rng.lognormal(size=200_000).astype(np.float32)
    r1 = kmeans1d(x, 10, b_max=2000)
    r2 = kmeans1d(x[::-1].copy(), 10, b_max=2000)
    exact = kmeans1d(x, 10)  # U ~ 200k > 65,536: also binned, with finer bins
    assert r1.binned and exact.binned
    assert np.array_equal(r1.upper, r2.upper) and r1.sse == r2.sse
    assert r1.sse <= exact.sse * 1.005  # 2,000 bins + Lloyd: within 0.5% of 65,536 bins


def test_errors():
    with pytest.raises(ValueError, match="k must be >= 1"):
        kmeans1d(np.array([1.0]), 0)
    with pytest.raises(ValueError, match="contain NaN"):
        kmeans1d(np.array([1.0, np.nan]), 2)
    with pytest.raises(ValueError, match="at least one value"):
        kmeans1d(np.array([]), 2)
