"""Helpers shared by the policy tests."""

from __future__ import annotations

import itertools
import math

import numpy as np


def successive_inclusion(w, m):
    """Exact inclusion probabilities of successive sampling without replacement (small N)."""
    w = np.asarray(w, float)
    probs = np.zeros(len(w))
    for order in itertools.permutations(range(len(w)), m):
        p, left = 1.0, w.sum()
        for i in order:
            p *= w[i] / left
            left -= w[i]
        probs[list(order)] += p
    return probs


def two_gaussians(values, max_iter=1000, tol=1e-10, var_floor=1e-6, posterior=None):
    """Independent EM for a two-component 1-D Gaussian mixture (docs/algorithms.md §12.3) on the
    raw values, in plain float64 NumPy: start from the exhaustive 2-means split of the sorted
    values (least SSE, leftmost), stop when the log-likelihood gains <= tol of itself. Returns
    (weights, means, sds, Ashman's D, threshold or None), the lower mean first; with
    ``posterior`` q, the threshold is where the upper component's posterior reaches q
    (§12.12: the crossing of the log densities shifted by log(q / (1 - q)))."""
    x = np.sort(np.asarray(values, np.float64))
    n = len(x)
    best, cut = None, None
    for i in range(1, n):  # split between x[i-1] and x[i], only where the value changes
        if x[i] == x[i - 1]:
            continue
        a, b = x[:i], x[i:]
        sse = ((a - a.mean()) ** 2).sum() + ((b - b.mean()) ** 2).sum()
        if best is None or sse < best:
            best, cut = sse, i
    floor = var_floor * x.var()
    a, b = x[:cut], x[cut:]
    w = [len(a) / n, len(b) / n]
    mu = [a.mean(), b.mean()]
    var = [max(a.var(), floor), max(b.var(), floor)]
    prev = None
    for _ in range(max_iter):
        la = [np.log(w[k]) - 0.5 * np.log(var[k]) - (x - mu[k]) ** 2 / (2 * var[k]) for k in (0, 1)]
        top = np.maximum(la[0], la[1])
        total = top + np.log(np.exp(la[0] - top) + np.exp(la[1] - top))
        ll = total.sum()
        if prev is not None and ll - prev <= tol * abs(ll):
            break
        prev = ll
        r = [np.exp(la[k] - total) for k in (0, 1)]
        nk = [r[k].sum() for k in (0, 1)]
        mu = [(r[k] * x).sum() / nk[k] for k in (0, 1)]
        var = [max((r[k] * (x - mu[k]) ** 2).sum() / nk[k], floor) for k in (0, 1)]
        w = [nk[k] / n for k in (0, 1)]
    if mu[1] < mu[0]:
        w, mu, var = w[::-1], mu[::-1], var[::-1]
    d = np.sqrt(2) * (mu[1] - mu[0]) / np.sqrt(var[0] + var[1])

    odds = 0.0 if posterior is None else np.log(posterior / (1 - posterior))

    def f(t):
        return (
            (np.log(w[0]) - 0.5 * np.log(var[0]) - (t - mu[0]) ** 2 / (2 * var[0]))
            - (np.log(w[1]) - 0.5 * np.log(var[1]) - (t - mu[1]) ** 2 / (2 * var[1]))
            + odds
        )

    threshold = None
    if f(mu[0]) > 0 > f(mu[1]):
        lo, hi = mu[0], mu[1]
        for _ in range(200):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if f(mid) > 0 else (lo, mid)
        threshold = lo
    return w, mu, [float(np.sqrt(v)) for v in var], float(d), threshold


def noise_suspects(cols, warmup, threshold_of=two_gaussians, scale="loss", posterior=None, floor=None):
    """The noise rule's suspects (§12.2, 12.4), recomputed row by row from the table columns:
    (candidate mask, suspect mask, the fit). None fit: fewer than two distinct scores. With
    ``scale="log1p"`` each score is float32(math.log1p(score)) and each last loss math.log1p of it.
    ``posterior`` (version 2, §12.12): the threshold where the noise mode's posterior reaches it,
    raised to ``floor`` (the previous plan's threshold) where one is given."""

    def on(v):
        return v if scale == "loss" else math.log1p(v)

    n = len(cols["uid"])
    cand = np.zeros(n, bool)
    x = np.full(n, np.nan)
    for i in range(n):
        with np.errstate(over="ignore"):  # a mean beyond float32's range: inf, not a candidate
            mean = np.float32(cols["loss_mean"][i]) if np.isfinite(cols["loss_mean"][i]) else np.float32(np.nan)
        if cols["seen"][i] > 0 and np.isfinite(cols["last_loss"][i]) and cols["loss_count"][i] >= warmup:
            if np.isfinite(mean):
                cand[i], x[i] = True, float(np.float32(on(float(mean))))
    fit = None
    if len(np.unique(x[cand])) >= 2:
        fit = threshold_of(x[cand])
        if posterior is not None:
            crossing = fit[4]  # version 2 needs the crossing too (the test), and its own threshold
            fit = (*threshold_of(x[cand], posterior=posterior)[:4], crossing)
            own = threshold_of(x[cand], posterior=posterior)[4]
    suspect = np.zeros(n, bool)
    upper_majority = scale == "log1p" and fit is not None and fit[0][1] >= 0.5  # §12.11
    if fit is not None and fit[3] >= 2 and fit[4] is not None and not upper_majority:
        t = fit[4]
        if posterior is not None:
            if own is None:
                return cand, suspect, fit
            t = own if floor is None else max(own, floor)
        for i in np.flatnonzero(cand):
            suspect[i] = x[i] > t and on(float(cols["last_loss"][i])) > t
    return cand, suspect, fit


def chain(name, params):
    """(spec, policy params, safeguards, noise params, floor) of ``params``, which may name
    ``floor``: rule 2's previous threshold (the planner reads it from the plan before)."""
    from seta_stream.policies import plan_params

    params = dict(params)
    floor = params.pop("floor", None)
    spec, p, sg, noise = plan_params(name, **params)
    return spec, p, sg, noise, floor


def whole_plan(name, params, cols, epoch, epochs, seed, spec=None):
    """The finalized whole-table plan of policy ``name`` with ``params`` (its own, the noise
    rule's, the safeguards) on the columns ``cols``: the chain the planner runs (the noise
    rule's stage, the policy, the safeguards, the summary). ``spec``: another spec in place of
    the registered one (same parameters)."""
    from seta_stream.policies import PolicyInput, finalize
    from seta_stream.policies.registry import planned_function, planned_table_columns
    from seta_stream.policies.summary import summary_params

    registered, p, sg, noise, floor = chain(name, params)
    spec = spec or registered
    inp = PolicyInput.from_columns(
        {c: cols[c] for c in planned_table_columns(spec, p, noise)},
        epoch=epoch,
        epochs=epochs,
        seed=seed,
        n_ref=len(cols["uid"]),
    )
    return finalize(planned_function(spec, noise, floor)(inp, p), inp, name, summary_params(p, noise, spec), sg)


def split_plan(name, params, cols, epoch, epochs, seed, buckets, rng, spec=None):
    """The same plan over ``buckets`` buckets (each row in a random bucket, in any order) with
    ``plan_partitioned``: {bucket: (its rows' indices, its rows)} and the summary."""
    from seta_stream.policies import PolicyInput, plan_partitioned
    from seta_stream.policies.registry import planned_table_columns
    from seta_stream.policies.steps import PlanContext

    registered, p, sg, noise, floor = chain(name, params)
    spec = spec or registered
    n = len(cols["uid"])
    where = rng.integers(0, buckets, size=n)
    order = rng.permutation(n)  # rows in any order inside a bucket
    parts = [order[where[order] == b] for b in range(buckets)]
    ctx = PlanContext(epoch=epoch, epochs=epochs, seed=seed, n=n, n_ref=n)
    columns = planned_table_columns(spec, p, noise)

    def inputs(b):
        return PolicyInput.from_columns(
            {c: cols[c][parts[b]] for c in columns}, epoch=epoch, epochs=epochs, seed=seed, n_ref=n
        )

    rows = {}

    def emit(b, inp, result):
        rows[b] = (parts[b], result)

    summary = plan_partitioned(
        spec, p, ctx, inputs, buckets, emit, rows.clear, safeguards=sg, noise=noise, noise_floor=floor
    )
    return rows, summary
