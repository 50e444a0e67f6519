"""Every policy's steps form (map/reduce over buckets) gives bit for bit the plan of its
whole-table function: rows (keep, weight, reason, cluster, score) and summary, for any number
of buckets and any split of the rows into buckets."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from policy_helpers import split_plan, whole_plan

from seta_stream.policies import POLICIES

CASES = [
    ("full", {}),
    ("random", {"r": 0.3}),
    ("random", {"r": 0.5, "delta": 0.5}),
    ("static", {"r": 0.7}),
    ("infobatch", {}),
    ("infobatch", {"r": 0.3, "score": "ema", "rescale": "exact"}),
    ("infobatch", {"unseen_score": 2.0, "delta": 0.5}),
    ("es", {"beta2": 0.9}),
    ("eswp", {"beta2": 0.9}),
    ("eswp", {"beta2": 0.9, "r": 0.6, "anneal_ratio": 0.0}),
    ("seta", {"r": 0.1, "k": 5, "alpha": 0.6}),
    ("seta", {"r": 0.0, "k": 3, "alpha": 0.5, "order": "h2e"}),
    ("seta", {"r": 0.3, "k": 8, "alpha": 0.4, "target_keep": 0.5}),
    ("seta", {"r": 0.2, "k": 4, "alpha": 0.5, "target_keep": 0.1, "order": "h2e"}),
    ("seta", {"r": 0.1, "k": 5, "alpha": 0.6, "unseen_score": 1.5, "delta": 0.5}),
    ("full", {"noise": True}),
    ("full", {"noise": True, "noise_scale": "log1p"}),
    ("random", {"r": 0.3, "noise": True, "noise_recheck": 0.5}),
    ("random", {"r": 0.4, "mode": "static", "noise": True, "noise_warmup": 1}),
    ("infobatch", {"noise": True, "noise_recheck": 0.3}),
    ("infobatch", {"r": 0.3, "score": "ema", "rescale": "exact", "noise": True, "delta": 0.5}),
    ("seta", {"r": 0.1, "k": 5, "alpha": 0.6, "noise": True, "noise_recheck": 0.2}),
    ("seta", {"r": 0.1, "k": 5, "alpha": 0.6, "noise": True, "noise_scale": "log1p"}),
    ("seta", {"r": 0.3, "k": 8, "alpha": 0.4, "target_keep": 0.5, "noise": True, "noise_warmup": 1}),
    # the rule's first version (the components' crossing), and the second's floor (§12.12)
    ("full", {"noise": True, "noise_rule": 1}),
    ("seta", {"r": 0.1, "k": 5, "alpha": 0.6, "noise": True, "noise_rule": 1, "noise_scale": "log1p"}),
    ("full", {"noise": True, "noise_posterior": 0.75, "floor": 2.0}),
    ("infobatch", {"noise": True, "floor": 0.5}),
]


def table(n: int, seed: int, ties: bool, unseen: float, nan: float, noisy: float = 0.0) -> dict[str, np.ndarray]:
    """``noisy``: a share of the rows whose last loss and history mean sit in a high second mode
    (the noise rule's suspects)."""
    rng = np.random.default_rng(seed)
    uid = rng.choice(np.iinfo(np.int64).max, size=n, replace=False).astype(np.uint64) * np.uint64(3)
    loss = rng.lognormal(size=n).astype(np.float32)
    if ties:  # few distinct values: ties everywhere
        loss = np.round(loss * 2).astype(np.float32) / np.float32(2)
    seen = rng.integers(1, 4, size=n).astype(np.int32)
    seen[rng.random(n) < unseen] = 0
    loss[seen == 0] = np.nan
    loss[(rng.random(n) < nan) & (seen > 0)] = np.nan  # recorded, non-finite
    ema = np.where(np.isfinite(loss), loss.astype(np.float64) * 0.9 + 0.01, np.nan)
    ema[(seen > 0) & ~np.isfinite(loss)] = 0.5
    history = np.random.default_rng(seed + 7)  # the history columns, without changing the others
    high = history.random(n) < noisy
    loss[high] += np.float32(8)
    count = np.minimum(seen, history.integers(0, 4, size=n)).astype(np.int32)
    mean = np.where(np.isfinite(loss), loss * history.uniform(0.8, 1.2, size=n), history.lognormal(size=n))
    if ties:
        mean = np.round(mean * 2) / 2
    mean[count == 0] = np.nan
    return {
        "uid": uid,
        "last_loss": loss,
        "ema": ema,
        "seen": seen,
        "last_epoch": np.zeros(n, np.int32),
        "loss_count": count,
        "loss_mean": mean,
    }


def assert_same(whole, rows, summary, n):
    assert summary == whole.summary
    got = {f: None for f in ("keep", "weight", "reason", "cluster", "score")}
    for f in got:
        ref = getattr(whole, f)
        if ref is None:
            assert all(getattr(r, f) is None for _, r in rows.values()), f
            continue
        out = np.empty(n, dtype=np.asarray(ref).dtype)
        for idx, r in rows.values():
            out[idx] = getattr(r, f) if getattr(r, f) is not None else -1
        a, b = np.asarray(ref), out
        if a.dtype.kind == "f":
            assert np.array_equal(a.view(np.uint8), b.view(np.uint8)), f
        else:
            assert np.array_equal(a, b), f


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    case=st.sampled_from(CASES),
    n=st.integers(0, 300),
    seed=st.integers(0, 2**16),
    buckets=st.integers(1, 7),
    epoch=st.integers(0, 9),
    ties=st.booleans(),
    unseen=st.sampled_from([0.0, 0.2, 1.0]),
    nan=st.sampled_from([0.0, 0.1]),
    noisy=st.sampled_from([0.0, 0.25]),
)
def test_steps_equal_the_whole_table_plan(case, n, seed, buckets, epoch, ties, unseen, nan, noisy):
    name, params = case
    cols = table(n, seed, ties, unseen, nan, noisy)
    whole = whole_plan(name, params, cols, epoch, 10, seed)
    rows, summary = split_plan(name, params, cols, epoch, 10, seed, buckets, np.random.default_rng(seed + 1))
    assert_same(whole, rows, summary, n)


def test_every_built_in_policy_has_a_steps_form():
    built_in = ["es", "eswp", "full", "infobatch", "random", "seta", "static"]
    assert [name for name in built_in if POLICIES[name].steps is None] == []


@pytest.mark.parametrize(
    ("params", "epoch"),
    [
        ({"r": 0.1, "k": 10, "alpha": 0.5}, 3),
        ({"r": 0.2, "k": 6, "alpha": 0.5, "target_keep": 0.4, "order": "h2e"}, 5),
    ],
)
def test_seta_window_with_binned_kmeans_equals_the_whole_table_plan(params, epoch):
    """100,000 distinct losses: k-means on 65,536 bins and Lloyd iterations, over 4 buckets."""
    cols = table(100_000, 11, ties=False, unseen=0.05, nan=0.01)
    whole = whole_plan("seta", params, cols, epoch, 10, 11)
    assert whole.summary["k_eff"] == params["k"] and whole.summary["rows_by_reason"]["window"] > 0
    rows, summary = split_plan("seta", params, cols, epoch, 10, 11, 4, np.random.default_rng(2))
    assert_same(whole, rows, summary, 100_000)


@pytest.mark.parametrize("case", CASES)
def test_steps_equal_the_whole_table_plan_with_full_radix_passes(case, monkeypatch):
    """``smallest`` with every radix pass and the tie round (no early gathering of a small
    prefix), on ties and unseen rows."""
    import seta_stream._kernels.mapreduce as steps

    monkeypatch.setattr(steps, "GATHER_KEYS", 0)
    name, params = case
    for seed in range(3):
        cols = table(250, seed, ties=True, unseen=0.2, nan=0.1, noisy=0.25)
        whole = whole_plan(name, params, cols, 3, 10, seed)
        rows, summary = split_plan(name, params, cols, 3, 10, seed, 3, np.random.default_rng(seed))
        assert_same(whole, rows, summary, 250)


@pytest.mark.parametrize(
    ("name", "params"),
    [
        ("seta", {"r": 0.1, "k": 10, "alpha": 0.5, "noise": True, "noise_rule": 1}),
        ("infobatch", {"noise": True, "noise_warmup": 1, "noise_rule": 1}),
        ("seta", {"r": 0.1, "k": 10, "alpha": 0.5, "noise": True}),
        ("full", {"noise": True, "floor": 7.0}),
    ],
)
def test_noise_rule_with_binned_points_equals_the_whole_table_plan(name, params):
    """100,000 distinct history means: the mixture is fitted on 65,536 bins gathered from 4
    buckets through scratch files, and must give the whole table's suspects and plan (rule 1,
    rule 2, rule 2 held to a previous threshold)."""
    cols = table(100_000, 12, ties=False, unseen=0.05, nan=0.01, noisy=0.2)
    whole = whole_plan(name, params, cols, 3, 10, 12)
    assert whole.summary["noise_active"] and whole.summary["noise_suspected"] > (
        10_000 if "noise_rule" in params else 5_000
    )
    rows, summary = split_plan(name, params, cols, 3, 10, 12, 4, np.random.default_rng(3))
    assert_same(whole, rows, summary, 100_000)


def test_noise_cases_exercise_the_rule():
    """The hypothesis table activates the rule (so the cases above test the suspects' rows)."""
    active = 0
    for seed in range(10):
        r = whole_plan("full", {"noise": True}, table(300, seed, False, 0.2, 0.1, 0.25), 3, 10, seed)
        active += bool(r.summary["noise_active"] and r.summary["noise_suspected"])
    assert active >= 8
