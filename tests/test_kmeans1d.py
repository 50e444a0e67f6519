"""Exact 1-D k-means: optimum vs brute force and an O(k M^2) DP, ties, degenerate inputs."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from seta_stream._kernels.kmeans1d import assign, kmeans1d


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


def direct_sse(x, counts):
    x = np.sort(np.asarray(x, dtype=np.float64))
    edges = np.concatenate([[0], np.cumsum(counts)])
    return sum(float(((x[a:b] - x[a:b].mean()) ** 2).sum()) for a, b in zip(edges[:-1], edges[1:]))


def test_exact_mode_across_blocks_with_multiplicities():
    # 1.5M values, 200 distinct (quantised losses): exact mode, change positions span blocks
    rng = np.random.default_rng(4)
    q = (rng.lognormal(size=1_500_000) * 20).round().astype(np.float32) / 20
    q = np.minimum(q, 9.95)
    r = kmeans1d(q, 8)
    vals, mult = np.unique(q, return_counts=True)
    assert not r.binned and r.counts.sum() == len(q)
    assert r.sse == pytest.approx(direct_sse(q, r.counts), rel=1e-9)
    # the optimum over weighted points equals the optimum over the expanded values
    assert r.sse == pytest.approx(quadratic_dp_weighted(vals, mult, 8), rel=1e-9)
    c = assign(q, r.upper)
    assert np.array_equal(np.bincount(c, minlength=8), r.counts)


def quadratic_dp_weighted(vals, mult, k):
    vals, mult = np.asarray(vals, float), np.asarray(mult, float)
    n = len(vals)
    P0, P1, P2 = (np.concatenate([[0.0], np.cumsum(a)]) for a in (mult, mult * vals, mult * vals**2))

    def cost(a, b):
        c, s = P0[b + 1] - P0[a], P1[b + 1] - P1[a]
        return P2[b + 1] - P2[a] - s * s / c

    D = np.array([cost(0, i) for i in range(n)])
    for _ in range(1, k):
        D = np.array([min([D[a - 1] + cost(a, i) for a in range(1, i + 1)] or [np.inf]) for i in range(n)])
    return D[n - 1]


def test_binned_mode_sse_and_centroids_are_those_of_the_returned_clusters():
    rng = np.random.default_rng(8)
    x = rng.lognormal(size=300_000).astype(np.float32)
    r = kmeans1d(x, 10, b_max=4096)
    assert r.binned and r.k_eff == 10 and r.counts.sum() == len(x)
    assert r.sse == pytest.approx(direct_sse(x, r.counts), rel=1e-7)
    xs = np.sort(x).astype(np.float64)
    edges = np.concatenate([[0], np.cumsum(r.counts)])
    assert np.allclose(r.centroids, [xs[a:b].mean() for a, b in zip(edges[:-1], edges[1:])], rtol=1e-9)
    assert np.all(r.upper[:-1] < r.lower[1:])
    # Lloyd fixed point: each boundary sits at the midpoint rule of its neighbouring centroids
    mids = (r.centroids[:-1] + r.centroids[1:]) / 2
    assert np.all(r.upper[:-1] <= mids) and np.all(r.lower[1:] > mids)


def test_input_order_and_dtype_do_not_change_the_result():
    rng = np.random.default_rng(9)
    x = rng.lognormal(size=5000).astype(np.float32)
    a = kmeans1d(x, 7)
    b = kmeans1d(rng.permutation(x), 7)
    c = kmeans1d(x.astype(np.float64), 7)  # float64 copies of float32 values: same problem
    assert np.array_equal(a.upper, b.upper) and a.sse == b.sse
    assert np.array_equal(a.upper, c.upper) and a.sse == pytest.approx(c.sse, rel=1e-12)
    assert kmeans1d(np.array([3, 1, 2, 2]), 2).k_eff == 2  # integer input


def test_assign_paths_agree():
    rng = np.random.default_rng(10)
    x = rng.lognormal(size=2_500_000).astype(np.float32)
    r = kmeans1d(x, 40)  # > 32 clusters: binary-search path
    ref = np.minimum(np.searchsorted(r.upper, x.astype(np.float64), side="left"), r.k_eff - 1)
    c = assign(x, r.upper)
    assert c.dtype == np.int16 and np.array_equal(c, ref)
    small = kmeans1d(x[:10_000], 5)
    ref5 = np.minimum(np.searchsorted(small.upper, x.astype(np.float64), side="left"), 4)
    assert np.array_equal(assign(x, small.upper), ref5)  # values beyond the last upper -> last
    odd = np.array([0.1, 0.3000001, 5.0])  # upper values not float32-exact: float64 comparison
    v32 = np.array([0.1, 0.3, 0.3000001, 0.0999, 9.0], np.float32)  # float32(0.1) > 0.1
    assert assign(v32, odd).tolist() == [1, 1, 2, 0, 2]
    assert assign(np.zeros(3, np.float32), np.array([1.0])).tolist() == [0, 0, 0]


def test_large_input_takes_the_binned_path():
    # its time is measured by benchmarks (docs/benchmarks.md), not asserted here
    x = np.random.default_rng(11).lognormal(size=3_000_000).astype(np.float32)
    assert kmeans1d(x, 10).binned


@pytest.mark.parametrize(
    "values",
    [
        np.random.default_rng(0).lognormal(size=5000).astype(np.float32),
        np.random.default_rng(1).normal(size=5000),  # negative values, float64
        np.r_[np.zeros(4000), np.random.default_rng(2).random(1000)].astype(np.float32),  # mostly one value
        np.r_[np.full(10, -0.0), np.zeros(10), np.random.default_rng(3).random(4000) - 0.5].astype(np.float32),
        np.r_[np.random.default_rng(4).random(3000), [np.nan] * 5].astype(np.float32),
        np.r_[[np.nan] * 3000, np.random.default_rng(5).random(2000)].astype(np.float32),  # mostly NaN
        np.random.default_rng(6).integers(0, 5, 5000).astype(np.int64),  # integers: float64 copy
        # no sign bit set (sorted as int32 bits): zeros, subnormals, the largest float32, inf, NaN
        np.r_[
            np.zeros(50),
            [1e-45, 1e-40, 3.4028235e38, np.inf, np.inf, np.nan],
            np.random.default_rng(7).lognormal(size=3000),
        ].astype(np.float32),
        np.r_[np.random.default_rng(8).lognormal(size=3000), [-1e-45]].astype(np.float32),  # one negative
    ],
)
@pytest.mark.parametrize("polars", [True, False], ids=["polars", "numpy"])
def test_polars_sort_equals_np_sort(values, polars, monkeypatch):
    import seta_stream._kernels.kmeans1d as K

    monkeypatch.setattr(K, "_POLARS_SORT_MIN", 16)
    monkeypatch.setattr(K, "_polars_sorts_faster", lambda a: polars)
    got = K._sorted_values(values)
    want = np.sort(values.astype(np.float64) if values.dtype.kind == "i" else values)
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)  # NaN positions equal too (-0.0 == 0.0)


def test_the_faster_sort_is_timed_once_a_dtype_and_either_gives_the_same_values(monkeypatch):
    """Large inputs go to whichever of np.sort and polars sorted the first 2^20 values of the
    first large input of their dtype faster, timed once a process; the values are np.sort's."""
    import seta_stream._kernels.kmeans1d as K

    monkeypatch.setattr(K, "_FASTER", {})
    calls = []
    real = K._polars_sort
    monkeypatch.setattr(K, "_polars_sort", lambda a: calls.append(len(a)) or real(a))
    v = np.random.default_rng(3).lognormal(size=K._POLARS_SORT_MIN + 5).astype(np.float32)
    np.testing.assert_array_equal(K._sorted_values(v), np.sort(v))
    assert set(K._FASTER) == {"<f4"} and calls[:2] == [K._POLARS_SORT_MIN] * 2  # the timing, best of 2
    K._sorted_values(v)
    assert len(calls) == 2 + 2 * K._FASTER["<f4"]  # not timed again; polars sorts the inputs if it won
    np.testing.assert_array_equal(K._sorted_values(v.astype(np.float64)), np.sort(v.astype(np.float64)))
    assert set(K._FASTER) == {"<f4", "<f8"}


def test_blockwise_run_sums_are_exact_and_clusters_do_not_depend_on_the_block_size(monkeypatch):
    """Run sums are added up block by block (reduceat); runs crossing block boundaries, blocks
    starting on a run boundary, and the prefix sums at arbitrary positions are all exact."""
    import math

    import seta_stream._kernels.kmeans1d as K

    x = np.random.default_rng(7).lognormal(size=20_000).astype(np.float32)
    v = np.sort(x)
    mean = float(v.astype(np.float64).mean())
    positions = np.array([0, 1, 999, 1000, 1001, 7777, 15_000, 19_999, 20_000])
    results = []
    for chunk in (1000, 4096, 1 << 20):
        monkeypatch.setattr(K, "_CHUNK", chunk)
        pre = K._Prefix(v, positions, mean)
        d = v.astype(np.float64) - mean
        for t in range(len(positions) - 1):
            seg = d[positions[t] : positions[t + 1]]
            assert pre.bin_s1[t] == pytest.approx(math.fsum(seg), rel=1e-12, abs=1e-9)
            assert pre.bin_s2[t] == pytest.approx(math.fsum(seg * seg), rel=1e-12)
        for p in (0, 5, 1000, 12_345, 20_000):
            s1, s2 = pre.at(np.array([p]))
            assert s1[0] == pytest.approx(math.fsum(d[:p]), rel=1e-9, abs=1e-6)
            assert s2[0] == pytest.approx(math.fsum(d[:p] ** 2), rel=1e-12)
        results.append(K.kmeans1d(x, 6, b_max=500))
    for r in results[1:]:
        assert r.binned
        np.testing.assert_array_equal(r.upper, results[0].upper)
        np.testing.assert_array_equal(r.counts, results[0].counts)
        np.testing.assert_allclose(r.centroids, results[0].centroids, rtol=1e-12)


# ---------------------------------------------------------------------------------- partitioned
from hypothesis import HealthCheck, assume, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from seta_stream._kernels.kmeans1d import kmeans1d_steps  # noqa: E402
from seta_stream._kernels.mapreduce import run_steps  # noqa: E402


def split_kmeans(values, k, buckets, seed, **kw):
    rng = np.random.default_rng(seed)
    where = rng.integers(0, buckets, size=len(values))
    order = rng.permutation(len(values))
    parts = [values[order[where[order] == b]] for b in range(buckets)]
    return run_steps(kmeans1d_steps(lambda v: v, len(values), k, **kw), lambda b: parts[b], buckets)


def assert_same_kmeans(a, b):
    for f in ("upper", "lower", "counts", "centroids"):
        x, y = np.asarray(getattr(a, f)), np.asarray(getattr(b, f))
        assert x.dtype == y.dtype and np.array_equal(x.view(np.uint8), y.view(np.uint8)), f
    assert (a.k_eff, a.binned) == (b.k_eff, b.binned)
    assert np.float64(a.sse).tobytes() == np.float64(b.sse).tobytes()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    n=st.integers(1, 400),
    k=st.integers(1, 12),
    b_max=st.sampled_from([2, 3, 16, 64, 65_536]),
    buckets=st.integers(1, 6),
    seed=st.integers(0, 2**16),
    shape=st.sampled_from(["lognormal", "ties", "zeros", "negative"]),
    gather=st.sampled_from([5, 60, 1 << 23]),
)
def test_kmeans_steps_equal_kmeans1d(n, k, b_max, buckets, seed, shape, gather):
    """``gather``: values per range of the external sort (binned case), so that the values are
    split into many ranges by their 16-bit prefixes, or into one."""
    import seta_stream._kernels.kmeans1d as km

    assume(k <= b_max)  # kmeans1d's binned path needs at least k bins
    rng = np.random.default_rng(seed)
    v = rng.lognormal(size=n).astype(np.float32)
    if shape == "ties":
        v = np.round(v * 3).astype(np.float32)
    elif shape == "zeros":
        v[rng.random(n) < 0.5] = 0.0
        v[rng.random(n) < 0.1] = -0.0
    elif shape == "negative":
        v = (v - np.float32(1.0)).astype(np.float32)
    default, km.GATHER_VALUES = km.GATHER_VALUES, gather
    try:
        assert_same_kmeans(split_kmeans(v, k, buckets, seed, b_max=b_max), kmeans1d(v, k, b_max=b_max))
    finally:
        km.GATHER_VALUES = default


def test_kmeans_steps_equal_kmeans1d_binned_across_prefix_blocks(monkeypatch):
    import seta_stream._kernels.kmeans1d as km

    monkeypatch.setattr(km, "GATHER_VALUES", 777)  # many gather rounds
    rng = np.random.default_rng(5)
    v = np.concatenate([rng.lognormal(size=3_000_000), rng.normal(5, 0.01, size=200_000)]).astype(np.float32)
    monkeypatch.setattr(km, "GATHER_VALUES", 1 << 20)
    whole = kmeans1d(v, 10)
    assert whole.binned
    assert_same_kmeans(split_kmeans(v, 10, 3, 1), whole)


@pytest.mark.parametrize("signed", [False, True], ids=["non-negative", "signed"])
def test_kmeans_steps_equal_kmeans1d_when_a_gathered_range_is_sorted_by_polars(signed):
    """A gathered range of more than 2^20 values is sorted as kmeans1d sorts (polars: by the
    float32 bits as int32 when no sign bit is set, else as floats, -0.0 and 0.0 among them)."""
    import seta_stream._kernels.kmeans1d as km

    rng = np.random.default_rng(11)
    v = rng.lognormal(size=2_500_000).astype(np.float32)
    v[rng.random(len(v)) < 0.05] = 0.0
    if signed:
        v[rng.random(len(v)) < 0.05] = -0.0
        v[rng.random(len(v)) < 0.3] *= np.float32(-1.0)
    assert km.GATHER_VALUES > len(v) > km._POLARS_SORT_MIN  # one range, sorted by polars
    whole = kmeans1d(v, 10)
    assert whole.binned
    assert_same_kmeans(split_kmeans(v, 10, 2, 3), whole)
    assert_same_kmeans(split_kmeans(v, 10, 2, 3), kmeans1d(np.sort(v), 10))  # NumPy's sort: the same


def test_heavy_ties_leave_fewer_bins_than_k():
    """Most bin cuts fall in one run of zeros: k' is capped by the bins left (it used to fail)."""
    v = np.concatenate([np.zeros(1000), np.arange(1, 101)]).astype(np.float32)
    km = kmeans1d(v, 10, b_max=64)
    assert km.binned and km.k_eff == 7 and km.counts.sum() == 1100
    assert km.lower.tolist() == [0, 7, 21, 35, 50, 66, 83] and km.counts.tolist() == [1006, 14, 14, 15, 16, 17, 18]
    assert_same_kmeans(split_kmeans(v, 10, 3, 0, b_max=64), km)


def test_sorted_ranges_sort_each_file_in_order_and_stop_with_no_thread_left(tmp_path):
    """The external sort's ranges come sorted, in file order, each file removed once read (the
    next one read ahead on a thread); closed early, the read-ahead ends with it: the file read
    ahead is removed, the later ones are not, and no sorting thread is left."""
    import threading

    import seta_stream._kernels.kmeans1d as km

    rng = np.random.default_rng(2)
    values = [rng.lognormal(size=size).astype(np.float32) for size in (5, 0, 3000, 7)]
    files = []
    for i, v in enumerate(values):
        files.append(str(tmp_path / f"range-{i}.f32"))
        v.tofile(files[-1])
    got = list(km._sorted_ranges(files))
    assert [g.view(np.uint32).tolist() for g in got] == [np.sort(v).view(np.uint32).tolist() for v in values]
    assert sorted(p.name for p in tmp_path.iterdir()) == []

    for i, v in enumerate(values):
        v.tofile(files[i])
    ranges = km._sorted_ranges(files)
    first = next(ranges)
    assert np.array_equal(first, np.sort(values[0]))
    ranges.close()  # the consumer stops after one range (an error in its work)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["range-2.f32", "range-3.f32"]
    assert not [t.name for t in threading.enumerate() if t.name.startswith("seta-stream-sort")]
