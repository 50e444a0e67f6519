"""A two-component 1-D Gaussian mixture on k-means' points, and Ashman's D (docs/algorithms.md §12.3).

The noise rule (``policies.noise``) asks whether the per-sample history scores form two modes.
The answer of the literature is a two-component Gaussian mixture fitted by EM (DivideMix fits
one to per-sample losses) whose components are separated by Ashman's D >= 2 (Ashman, Bird &
Zepf 1994). The fit runs on the :class:`seta_stream._kernels.kmeans1d.Points` of the scores (at most
65,536 weighted points: the distinct values, or bins of the sorted values), which are the same
numbers, bit for bit, whether the scores were held whole or gathered from buckets, so the
mixture is too: it is computed once, in one process, from those points alone.

Why not Ashman's D of the two halves of the 2-means split itself: the halves of one Gaussian
are truncated Gaussians whose D is 2.65 (and 2.6 for an exponential, 3.5 for a uniform), so
that test would call every unimodal loss distribution two-moded. The fitted components of one
Gaussian, or of the right-skewed distributions clean losses have, give D < 2 (§12.3).

Pure: arrays in, numbers out; no RNG. EM evaluates NumPy's exp and log on the points, as the
ESWP draw evaluates its log on every row (docs/algorithms.md §0.4).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .kmeans1d import Points, split_points

__all__ = ["Mixture", "fit_two_gaussians", "posterior_threshold", "ASHMAN_D", "MAX_ITER", "TOL", "VAR_FLOOR"]

#: Ashman's D at and above which two Gaussian components are "clearly separated" (Ashman,
#: Bird & Zepf 1994): the mixture of two equal components is bimodal from D > 2 on.
ASHMAN_D = 2.0
#: EM iterations at most, and the relative gain of the log-likelihood under which it stops.
MAX_ITER = 1000
TOL = 1e-10
#: Smallest component variance, as a share of the variance of all values: a component of
#: one distinct value would otherwise have variance 0 and an unbounded likelihood.
VAR_FLOOR = 1e-6


@dataclass(frozen=True)
class Mixture:
    """Two Gaussian components, the lower mean first: weights, means, standard deviations;
    Ashman's D; the threshold (the value between the means above which the upper component
    is the more likely, None if none: then no value is attributed to it); EM iterations."""

    weight: tuple[float, float]
    mean: tuple[float, float]
    sd: tuple[float, float]
    separation: float
    threshold: float | None
    iterations: int
    #: the fit's own coordinates (centred on the points' exact mean ``centre``): the means and
    #: variances EM ended with, from which every threshold is found (:func:`posterior_threshold`)
    centre: float = 0.0
    centred_mean: tuple[float, float] = (math.nan, math.nan)
    variance: tuple[float, float] = (math.nan, math.nan)

    @property
    def two_modes(self) -> bool:
        """Ashman's D >= 2 and a threshold between the means (§12.3)."""
        return self.separation >= ASHMAN_D and self.threshold is not None


def _log_density(y: np.ndarray, w: float, mu: float, var: float) -> np.ndarray:
    """log(w) + log N(y; mu, var) + log(sqrt(2 pi)) (the constant both components share)."""
    return (math.log(w) - 0.5 * math.log(var)) - (y - mu) ** 2 / (2.0 * var)


def _log_sum(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """log(exp(a) + exp(b)) = max(a, b) + log1p(exp(-|a - b|)) (np.logaddexp is several times
    slower here)."""
    d = a - b
    np.abs(d, out=d)
    np.negative(d, out=d)
    np.exp(d, out=d)
    np.log1p(d, out=d)
    d += np.maximum(a, b)
    return d


def _log_density_at(x: float, w: float, mu: float, var: float) -> float:
    return (math.log(w) - 0.5 * math.log(var)) - (x - mu) ** 2 / (2.0 * var)


def fit_two_gaussians(points: Points) -> Mixture | None:
    """The two-component Gaussian mixture of the values ``points`` stand for (§12.3), or None
    when they have fewer than two points or EM empties a component.

    Start: the exact 2-means split of the points (:func:`seta_stream._kernels.kmeans1d.split_points`),
    each run's weight, mean and variance. EM on the points: each point j (count c_j, mean y_j of
    its values, within-point sum of squares w_j) takes its responsibilities from y_j; the
    M-step counts the point's values with their spread (variance = sum_j r_j (w_j + c_j (y_j -
    mu)^2) / N), floored at :data:`VAR_FLOOR` of the total variance; stop when the
    log-likelihood gains less than :data:`TOL` of itself, or after :data:`MAX_ITER`
    iterations. Coordinates are centred on the points' exact mean throughout."""
    P = len(points.counts)
    if P < 2:
        return None
    c = points.counts.astype(np.float64)
    s1, s2 = points.s1, points.s2
    M = float(c.sum())
    y = s1 / c
    within = np.maximum(s2 - s1 * y, 0.0)
    total_var = max(float(s2.sum()) / M - (float(s1.sum()) / M) ** 2, 0.0)
    if total_var <= 0.0:
        return None
    floor = VAR_FLOOR * total_var
    ends, _ = split_points(points, 2)
    cut = int(ends[0]) + 1
    params = []
    for lo, hi in ((0, cut), (cut, P)):
        n = float(c[lo:hi].sum())
        mu = float(s1[lo:hi].sum()) / n
        var = max(float(s2[lo:hi].sum()) / n - mu * mu, floor)
        params.append((n / M, mu, var))
    (w1, m1, v1), (w2, m2, v2) = params
    previous = -math.inf
    iterations = 0
    for iterations in range(1, MAX_ITER + 1):
        a1 = _log_density(y, w1, m1, v1)
        a2 = _log_density(y, w2, m2, v2)
        total = _log_sum(a1, a2)
        loglik = float(np.sum(c * total))
        if iterations > 1 and loglik - previous <= TOL * abs(loglik):
            break
        previous = loglik
        r1 = np.exp(a1 - total)
        r2 = np.exp(a2 - total)
        n1, n2 = float(np.sum(c * r1)), float(np.sum(c * r2))
        if not (n1 > 0.0 and n2 > 0.0):
            return None
        m1, m2 = float(np.sum(r1 * s1)) / n1, float(np.sum(r2 * s1)) / n2
        v1 = max(float(np.sum(r1 * (within + c * (y - m1) ** 2))) / n1, floor)
        v2 = max(float(np.sum(r2 * (within + c * (y - m2) ** 2))) / n2, floor)
        w1, w2 = n1 / M, n2 / M
    if m2 < m1:  # the lower mean first
        (w1, m1, v1), (w2, m2, v2) = (w2, m2, v2), (w1, m1, v1)
    separation = math.sqrt(2.0) * (m2 - m1) / math.sqrt(v1 + v2)
    threshold = _threshold(w1, m1, v1, w2, m2, v2)
    mean = points.mean
    return Mixture(
        weight=(w1, w2),
        mean=(m1 + mean, m2 + mean),
        sd=(math.sqrt(v1), math.sqrt(v2)),
        separation=separation,
        threshold=None if threshold is None else threshold + mean,
        iterations=iterations,
        centre=mean,
        centred_mean=(m1, m2),
        variance=(v1, v2),
    )


def posterior_threshold(m: Mixture, posterior: float) -> float | None:
    """The largest float64 t in [mean1, mean2] (in the scores' units, found by the same bisection
    as the crossing) where the upper component's posterior is still below ``posterior``:
    f(t) = log(w1 N1(t)) - log(w2 N2(t)) + log(posterior / (1 - posterior)) > 0, given
    f(mean1) > 0 > f(mean2) (§12.12); None when the posterior does not reach ``posterior``
    between the means. At ``posterior`` 0.5 it is the crossing (:attr:`Mixture.threshold`)."""
    (w1, w2), (m1, m2), (v1, v2) = m.weight, m.centred_mean, m.variance
    t = _threshold(w1, m1, v1, w2, m2, v2, math.log(posterior / (1.0 - posterior)))
    return None if t is None else t + m.centre


def _threshold(w1: float, m1: float, v1: float, w2: float, m2: float, v2: float, odds: float = 0.0) -> float | None:
    """The largest float64 t in [m1, m2] (found by bisection) where the lower component is
    still the more likely, f(t) = log(w1 N1(t)) - log(w2 N2(t)) + ``odds`` > 0, given
    f(m1) > 0 > f(m2); None when the components do not cross between their means that way
    (``odds`` 0: where they cross; log(q / (1 - q)): where the upper one's posterior reaches q)."""

    def f(x: float) -> float:
        return _log_density_at(x, w1, m1, v1) - _log_density_at(x, w2, m2, v2) + odds

    lo, hi = m1, m2
    if not (lo < hi and f(lo) > 0.0 and f(hi) < 0.0):
        return None
    while True:
        mid = lo + (hi - lo) / 2.0
        if mid <= lo or mid >= hi:
            return lo
        if f(mid) > 0.0:
            lo = mid
        else:
            hi = mid
