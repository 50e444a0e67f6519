"""docs/algorithms.md §12.3 and §12.5 where an independent implementation found the text silent:
the per-point sums in blocks of 2^20 values, each run's SSE clipped at 0, a total variance <= 0
giving ``too_few``, and ``noise_threshold`` reported only where the rule is active."""

from __future__ import annotations

import numpy as np

from seta_stream._kernels.kmeans1d import Points, points1d, split_points
from seta_stream._kernels.mixture1d import fit_two_gaussians
from seta_stream.policies.noise import NoiseFit

BLOCK = 1 << 20


def test_the_sums_of_a_point_are_taken_block_by_block() -> None:
    """Scores whose distinct values make points that straddle the block boundary at position 2^20:
    each point's s1, s2 are its pieces' np.add.reduceat sums added in block order, from 0.0."""
    rng = np.random.default_rng(0)
    v = np.sort(rng.choice(np.float32(rng.lognormal(size=400)), size=BLOCK + 300_000).astype(np.float32))
    pts = points1d(v)
    assert not pts.binned and pts.total == len(v)
    ends = np.cumsum(pts.counts)
    j = int(np.searchsorted(ends, BLOCK, side="right"))  # the point holding position 2^20
    start, stop = int(ends[j - 1]), int(ends[j])
    assert start < BLOCK < stop  # it straddles the boundary
    x = v.astype(np.float64) - pts.mean
    first = np.concatenate([[0], ends[:-1]])  # each point's first position
    in0 = first[(first > 0) & (first < BLOCK)]
    in1 = first[(first > BLOCK) & (first < 2 * BLOCK)] - BLOCK
    for part, total in ((x, pts.s1[j]), (x * x, pts.s2[j])):
        head = np.add.reduceat(part[:BLOCK], np.concatenate([[0], in0]))[-1]  # its piece of block 0
        tail = np.add.reduceat(part[BLOCK:], np.concatenate([[0], in1]))[0]  # and of block 1
        assert total == (0.0 + head) + tail  # bit for bit


def test_each_run_of_the_2_means_start_costs_its_sse_clipped_at_0() -> None:
    """SSE(a, b) = max((Q_b - Q_a) - (S_b - S_a)^2 / (C_b - C_a), 0) from cumulative sums; the
    split minimises SSE(0, a) + SSE(a, P), the smallest a among equal costs."""
    rng = np.random.default_rng(1)
    pts = points1d(np.concatenate([rng.normal(0, 1, 500), rng.normal(6, 1, 200)]).astype(np.float32))
    c, s, q = (np.concatenate([[0.0], np.cumsum(a)]) for a in (pts.counts.astype(np.float64), pts.s1, pts.s2))
    P = len(pts.counts)

    def sse(a: int, b: int) -> float:
        return max((q[b] - q[a]) - (s[b] - s[a]) ** 2 / (c[b] - c[a]), 0.0)

    costs = [sse(0, a) + sse(a, P) for a in range(1, P)]
    a = 1 + int(np.argmin(costs))  # argmin: the first of equal minima
    ends, total = split_points(pts, 2)
    assert int(ends[0]) + 1 == a and total == min(costs)


def test_a_total_variance_of_0_is_too_few_and_the_threshold_is_reported_only_when_active() -> None:
    one = np.array([1, 1], np.int64)
    flat = Points(counts=one, s1=np.zeros(2), s2=np.zeros(2), lower=np.array([1.0, 1.0]),
                  upper=np.array([1.0, 1.0]), mean=1.0, binned=False)  # fmt: skip
    assert fit_two_gaussians(flat) is None
    assert NoiseFit(2, None).summary(0, 0)["noise_test"] == "too_few"
    # a log-normal: the fitted components cross between their means (a threshold exists), but
    # D < 2: one mode, and the summary reports no threshold
    m = fit_two_gaussians(points1d(np.random.default_rng(0).lognormal(0, 0.5, 20_000).astype(np.float32)))
    assert m is not None and m.threshold is not None and m.separation < 2
    s = NoiseFit(20_000, m).summary(0, 0)
    assert (s["noise_test"], s["noise_threshold"], s["noise_separation"]) == ("one_mode", None, m.separation)
    # two clear modes: active, and the threshold is the fit's
    rng = np.random.default_rng(2)
    m2 = fit_two_gaussians(
        points1d(np.concatenate([rng.normal(1, 0.2, 800), rng.normal(7, 0.3, 200)]).astype(np.float32))
    )
    s2 = NoiseFit(1000, m2).summary(0, 0)
    assert (s2["noise_test"], s2["noise_threshold"]) == ("two_modes", m2.threshold)
