"""Policies: SeTa semantics (algorithms.md §3), random baselines, registry, common summary."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from seta_stream.policies import PolicyInput, describe_policies, get_policy, run_policy
from seta_stream.policies.random_draws import (
    salt,
    uniform_of,
    uniforms,
    weighted_subset,
)
from seta_stream.policies.seta import SetaParams, window_start, window_width


def make_input(n=2000, epoch=1, epochs=10, seed=0, dist="lognormal", unseen=0, rs=0):
    rng = np.random.default_rng(rs)
    uid = rng.integers(0, 2**63, n, dtype=np.uint64)
    loss = rng.lognormal(size=n).astype(np.float32) if dist == "lognormal" else np.full(n, 2.0, np.float32)
    loss[:unseen] = np.nan
    return PolicyInput.from_losses(uid, loss, epoch=epoch, epochs=epochs, seed=seed)


# ---------------------------------------------------------------- randomness primitives
def test_uniforms_match_the_scalar_definition_and_are_in_range():
    uid = np.array([0, 1, 2**64 - 1, 123456789], dtype=np.uint64)
    u = uniforms(uid, 42, 3, 1)
    assert u.tolist() == [uniform_of(int(x), 42, 3, 1) for x in uid]
    assert np.all((u >= 0) & (u < 1))
    assert salt(42, 3, 1) != salt(42, 3, 2) != salt(42, 4, 1)


def test_weighted_subset_inclusion_follows_successive_sampling():
    # exact inclusion probabilities of successive sampling for N=4, m=2
    w = np.array([1.0, 2.0, 3.0, 4.0])
    tot = w.sum()
    exact = np.zeros(4)
    for i in range(4):
        for j in range(4):
            if i != j:
                p = w[i] / tot * w[j] / (tot - w[i])
                exact[i] += p
                exact[j] += p
    hits = np.zeros(4)
    trials = 20000
    uid = np.arange(4, dtype=np.uint64)
    for t in range(trials):
        u = uniforms(uid, t, 0, 4)
        hits += weighted_subset(np.ones(4, bool), w, 2, u, uid)
    # 4 standard errors of a binomial proportion at 20,000 trials is < 0.014
    assert np.allclose(hits / trials, exact, atol=0.014)


# ---------------------------------------------------------------- SeTa
def test_window_width_and_start_follow_the_spec_examples():
    assert [window_width(k, a) for k, a in [(10, 0.5), (5, 0.9), (5, 0.6), (10, 0.6), (5, 0.5), (5, 0.3)]] == [
        5,
        4,
        3,
        6,
        2,
        2,
    ]
    assert [window_start(e, 10, 5) for e in range(1, 9)] == [1, 2, 3, 4, 5, 0, 1, 2]
    assert [window_start(e, 5, 4) for e in range(1, 5)] == [1, 0, 1, 0]
    assert [window_start(e, 5, 3) for e in range(1, 7)] == [1, 2, 0, 1, 2, 0]


def test_seta_window_cycle_over_epochs():
    starts = []
    for e in range(1, 9):
        r = run_policy("seta", make_input(epoch=e, epochs=20), r=0.0, k=10, alpha=0.5)
        starts.append(r.summary["s"])
        c = r.cluster
        assert np.array_equal(r.keep, (c >= r.summary["s"]) & (c < r.summary["s"] + 5))
    assert starts == [1, 2, 3, 4, 5, 0, 1, 2]


def test_seta_epoch0_keeps_the_downsampled_set_and_annealing_draws_stream2():
    r0 = run_policy("seta", make_input(epoch=0), r=0.2, k=5, alpha=0.6)
    assert r0.summary["kept"] == 1600 and r0.summary["s"] == "all"
    ra = run_policy("seta", make_input(epoch=9, epochs=10), r=0.2, k=5, alpha=0.6)
    assert ra.summary["phase"] == "anneal" and ra.summary["kept"] == 1600
    assert ra.summary["absent_rule"]["stream"] == 2
    assert not np.array_equal(r0.keep, ra.keep)


def test_seta_unseen_are_kept_and_counted():
    r = run_policy("seta", make_input(epoch=3, unseen=300), r=0.1, k=5, alpha=0.4)
    inp = make_input(epoch=3, unseen=300)
    R = r.reason != 7  # not downsampled_out
    assert r.summary["unseen"] == 300
    assert np.all(r.keep[:300] == R[:300])  # every unseen sample of R is kept
    assert r.summary["kept_by_reason"]["unseen"] == int(R[:300].sum())
    assert inp.n == 2000


def test_seta_unseen_score_puts_unseen_into_the_clustering():
    r = run_policy("seta", make_input(epoch=3, unseen=300), r=0.0, k=5, alpha=0.4, unseen_score=3.0)
    assert "unseen" not in r.summary["kept_by_reason"]
    assert np.all(r.cluster[:300] == r.cluster[:300][0])


def test_seta_degenerate_losses():
    r = run_policy("seta", make_input(epoch=2, dist="equal"), r=0.0, k=10, alpha=0.5)
    assert r.summary["k_eff"] == 1 and r.summary["kept"] == 2000  # U = 1 keeps all of R
    tiny = PolicyInput.from_losses(np.array([1, 2], np.uint64), np.array([1.0, 5.0], np.float32), epoch=3, epochs=10)
    r = run_policy("seta", tiny, r=0.0, k=10, alpha=0.5)
    assert r.summary["k_eff"] == 2 and r.summary["w"] == 1 and r.summary["kept"] == 1
    one = PolicyInput.from_losses(np.array([1], np.uint64), np.array([1.0], np.float32), epoch=3, epochs=10)
    r = run_policy("seta", one, r=0.9, k=10, alpha=0.5)  # floor(0.1 * 1) = 0 kept -> guard
    assert r.summary["empty_plan_guard"] is True and r.summary["kept"] == 1
    empty = PolicyInput.from_losses(np.zeros(0, np.uint64), np.zeros(0, np.float32), epoch=3, epochs=10)
    assert run_policy("seta", empty).summary["kept"] == 0


def test_seta_kept_fraction_swings_like_the_reference_cifar_recipe():
    # algorithms.md §11: CIFAR recipe alternates ~0.90 / ~0.26-0.31
    fr = [
        run_policy("seta", make_input(n=20000, epoch=e, epochs=10), **vars(SetaParams.preset("cifar"))).summary["kept"]
        / 20000
        for e in range(1, 5)
    ]
    assert fr[0] < 0.4 and fr[1] > 0.85 and fr[2] < 0.4 and fr[3] > 0.85


def test_seta_budget_holds_within_two_points_on_skewed_losses():
    for e in range(1, 8):
        inp = make_input(n=20000, epoch=e, epochs=10, rs=e)
        r = run_policy("seta", inp, r=0.1, k=10, alpha=0.5, target_keep=0.5)
        assert abs(r.summary["kept"] / 20000 - 0.5) <= 0.02
        # the band follows the window: its mean loss moves with the window start
    lows = [
        run_policy("seta", make_input(n=20000, epoch=e, epochs=10), r=0.0, k=10, alpha=0.5, target_keep=0.3)
        for e in (1, 5)
    ]
    m1, m5 = (float(np.mean(make_input(n=20000, epoch=e, epochs=10).last_loss[x.keep])) for e, x in zip((1, 5), lows))
    assert m5 > m1  # later window start = harder band


@settings(max_examples=40, deadline=None)
@given(
    st.integers(1, 400),
    st.integers(0, 12),
    st.floats(0, 0.9),
    st.integers(1, 12),
    st.floats(0.1, 1.0),
    st.integers(0, 2**32),
)
def test_seta_properties(n, epoch, r, k, alpha, seed):
    if round(alpha * k) < 1:
        return
    inp = make_input(n=n, epoch=epoch, epochs=13, seed=seed, unseen=n // 5)
    a = run_policy("seta", inp, r=r, k=k, alpha=alpha)
    assert 0 <= a.summary["kept"] <= n
    assert a.summary["kept"] >= 1  # guard
    perm = np.random.default_rng(seed % 1000).permutation(n)
    shuffled = PolicyInput(
        inp.uid[perm], inp.last_loss[perm], inp.ema[perm], inp.seen[perm], inp.last_epoch[perm], epoch, 13, seed
    )
    b = run_policy("seta", shuffled, r=r, k=k, alpha=alpha)
    assert set(inp.uid[a.keep]) == set(shuffled.uid[b.keep])  # same plan in any row order
    again = run_policy("seta", inp, r=r, k=k, alpha=alpha)
    assert np.array_equal(a.keep, again.keep)


# ---------------------------------------------------------------- random baselines
def test_dynamic_random_redraws_and_static_does_not():
    a = run_policy("random", make_input(epoch=1), r=0.3)
    b = run_policy("random", make_input(epoch=2), r=0.3)
    assert a.summary["kept"] == b.summary["kept"] == 1400
    assert not np.array_equal(a.keep, b.keep)
    s1 = run_policy("static", make_input(epoch=1), r=0.3)
    s2 = run_policy("static", make_input(epoch=5), r=0.3)
    assert np.array_equal(s1.keep, s2.keep) and s1.summary["kept"] == 1400
    assert s1.summary["absent_rule"] == {"kind": "bernoulli", "fraction": 0.7, "stream": 5, "epoch": 0}
    anneal = run_policy("random", make_input(epoch=9, epochs=10), r=0.3, delta=0.8)
    assert anneal.summary["phase"] == "anneal" and anneal.summary["kept"] == 2000


# ---------------------------------------------------------------- validation and registry
@pytest.mark.parametrize(
    ("policy", "params", "message"),
    [
        ("seta", {"r": 0.95}, r"seta: r=0.95 is outside the valid range 0 <= r <= 0.9"),
        ("seta", {"k": 0}, r"seta: k=0 is outside the valid range: integer 1 <= k <= 256"),
        ("seta", {"alpha": 0.0}, r"seta: alpha=0.0 is outside the valid range 0 < alpha <= 1"),
        ("seta", {"alpha": 0.05, "k": 5}, r"round\(alpha\*k\) = 0"),
        ("seta", {"delta": 1.5}, r"seta: delta=1.5 is outside the valid range 0 <= delta <= 1"),
        ("seta", {"order": "x"}, r"seta: order='x', expected 'e2h' or 'h2e'"),
        (
            "seta",
            {"r": 0.5, "target_keep": 0.6},
            r"target_keep=0.6 is outside the valid range 0 < target_keep <= 1 - r = 0.5",
        ),
        ("random", {"r": 1.0}, r"random: r=1.0 is outside the valid range 0 <= r < 1"),
        ("random", {"mode": "x"}, r"random: mode='x', expected 'dynamic' or 'static'"),
        ("seta", {"bogus": 1}, r"seta: unknown parameter\(s\) \['bogus'\]"),
        ("nope", {}, r"unknown policy 'nope'; valid policies: "),
    ],
)
def test_parameters_out_of_range_are_rejected(policy, params, message):
    with pytest.raises(ValueError, match=message):
        run_policy(policy, make_input(n=10), **params)


def test_registry_describes_every_policy():
    names = [d["name"] for d in describe_policies()]
    assert {"full", "random", "static", "seta"} <= set(names)
    seta = next(d for d in describe_policies() if d["name"] == "seta")
    assert {p["name"]: p["default"] for p in seta["params"]}["k"] == 10
    assert get_policy("seta").make_params(k=5).k == 5


def test_common_summary_fields():
    s = run_policy("seta", make_input(epoch=2), r=0.1, k=5, alpha=0.6).summary
    for field in (
        "policy",
        "params",
        "epoch",
        "epochs",
        "phase",
        "n",
        "kept",
        "pruned_fraction",
        "unseen",
        "nonfinite",
        "weight_histogram",
        "empty_plan_guard",
        "absent_rule",
        "k_eff",
        "w",
        "s",
        "cluster_sizes",
        "centroids",
        "cluster_min",
        "cluster_max",
        "n_downsampled",
        "kept_by_reason",
    ):
        assert field in s, field
    assert s["weight_histogram"] == {"1.0": s["kept"]}
    assert s["pruned_fraction"] == pytest.approx(1 - s["kept"] / 2000)


def test_summary_counts_are_exact_across_blocks(monkeypatch):
    """The reason counts are made block by block and the weight histogram from the kept
    weights other than 1.0: both equal plain counts, here over 286 blocks of 7 rows."""
    import seta_stream.policies as policies
    from seta_stream.policies import REASONS, PolicyResult, summarize

    monkeypatch.setattr(policies, "_BLOCK", 7)
    rng = np.random.default_rng(5)
    inp = make_input()
    n = inp.n
    keep = rng.random(n) < 0.6
    weight = np.where(keep, rng.choice(np.array([1.0, 2.0, 0.5], np.float32), n), np.float32(0.0))
    weight[~keep & (rng.random(n) < 0.5)] = 3.0  # not kept: not counted, whatever the weight
    reason = rng.integers(0, len(REASONS), n).astype(np.int8)
    result = PolicyResult(keep, weight, reason, {}, None)
    summarize(result, inp, "test", {}, False)
    s = result.summary
    assert s["weight_histogram"] == {
        repr(float(v)): int(np.count_nonzero(keep & (weight == v))) for v in (np.float32(0.5), 1.0, 2.0)
    }
    assert s["rows_by_reason"] == {
        REASONS[i]: int(np.count_nonzero(reason == i)) for i in range(len(REASONS)) if (reason == i).any()
    }
    assert s["kept_by_reason"] == {
        REASONS[i]: int(np.count_nonzero(keep & (reason == i)))
        for i in range(len(REASONS))
        if (keep & (reason == i)).any()
    }
