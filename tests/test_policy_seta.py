"""SeTa (docs/algorithms.md §3): window arithmetic, down-sampling, clustering, annealing, unseen
samples, degenerate losses, summary, validation, row-order freedom, the opt-in budget
(``target_keep``) and the columns SeTa declares."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from seta_stream._kernels.kmeans1d import kmeans1d
from seta_stream.policies import PolicyInput, get_policy, run_policy
from seta_stream.policies.base import reason_code
from seta_stream.policies.random_draws import uniforms
from seta_stream.policies.seta import SetaParams, rank_range, window_start, window_width


def make_input(n=2000, epoch=1, epochs=10, seed=0, dist="lognormal", unseen=0, rs=0, mean=0.0):
    rng = np.random.default_rng(rs)
    uid = rng.integers(0, 2**63, n, dtype=np.uint64)
    loss = rng.lognormal(mean, 1.0, size=n).astype(np.float32) if dist == "lognormal" else np.full(n, 2.0, np.float32)
    loss[:unseen] = np.nan
    return PolicyInput.from_losses(uid, loss, epoch=epoch, epochs=epochs, seed=seed)


def windows(k, alpha, epochs):
    """The window start of every pruning epoch, 'all' for e = 0 (§3.2)."""
    w = window_width(k, alpha)
    return ["all"] + [window_start(e, k, w) for e in range(1, epochs)]


# ---------------------------------------------------------------- §3.2 examples
def test_window_width_examples():
    cases = [((10, 0.5), 5), ((5, 0.9), 4), ((5, 0.6), 3), ((10, 0.6), 6), ((5, 0.5), 2), ((5, 0.3), 2)]
    assert [window_width(k, a) for (k, a), _ in cases] == [w for _, w in cases]
    assert window_width(1, 0.5) == 1 and window_width(3, 0.1) == 1  # max(1, .) on k' < k


def test_window_sequences_of_the_spec():
    assert windows(10, 0.5, 10) == ["all", 1, 2, 3, 4, 5, 0, 1, 2, 3]
    assert windows(5, 0.9, 6) == ["all", 1, 0, 1, 0, 1]
    assert windows(5, 0.6, 8) == ["all", 1, 2, 0, 1, 2, 0, 1]
    assert [window_start(e, 10, 5) for e in range(1, 9)] == [1, 2, 3, 4, 5, 0, 1, 2]
    assert [window_start(e, 5, 4) for e in range(1, 5)] == [1, 0, 1, 0]
    assert [window_start(e, 5, 3) for e in range(1, 7)] == [1, 2, 0, 1, 2, 0]


def test_plans_follow_the_window_sequence_over_epochs():
    seq = []
    for e in range(10):
        res = run_policy("seta", make_input(epoch=e, epochs=20), r=0.0, k=10, alpha=0.5)
        s = res.summary["s"]
        seq.append(s)
        if s != "all":
            assert res.summary["w"] == 5 and res.summary["k_eff"] == 10
            assert np.array_equal(res.keep, (res.cluster >= s) & (res.cluster < s + 5))
            assert res.summary["kept"] == sum(res.summary["cluster_sizes"][s : s + 5])
    assert seq == windows(10, 0.5, 10)


def test_clusters_are_the_exact_kmeans_of_the_downsampled_seen_losses():
    inp = make_input(n=3000, epoch=4, unseen=100)
    res = run_policy("seta", inp, r=0.2, k=6, alpha=0.5)
    R = res.reason != reason_code("downsampled_out")
    Rs = R & np.isfinite(inp.last_loss)
    km = kmeans1d(inp.last_loss[Rs], 6)
    s = res.summary
    assert s["n_downsampled"] == 2400 and s["n_unseen_in_R"] == int((R & ~np.isfinite(inp.last_loss)).sum())
    assert s["cluster_sizes"] == km.counts.tolist() and s["centroids"] == pytest.approx(km.centroids.tolist())
    assert s["cluster_max"] == km.upper.tolist() and s["cluster_min"] == km.lower.tolist()
    assert np.all(res.cluster[~Rs] == -1) and np.all(res.cluster[Rs] >= 0)
    # membership: the first cluster whose upper value is >= the loss
    c = res.cluster[Rs]
    assert np.all(inp.last_loss[Rs] <= np.array(km.upper)[c])
    assert np.all(inp.last_loss[Rs] >= np.array(km.lower)[c])


def test_h2e_reverses_the_cluster_order():
    inp = make_input(epoch=1)
    e2h = run_policy("seta", inp, r=0.0, k=10, alpha=0.5)
    h2e = run_policy("seta", inp, r=0.0, k=10, alpha=0.5, order="h2e")
    assert h2e.summary["cluster_sizes"] == e2h.summary["cluster_sizes"][::-1]
    assert np.array_equal(h2e.cluster, 9 - e2h.cluster)
    assert h2e.summary["s"] == 1 and np.array_equal(h2e.keep, (e2h.cluster >= 4) & (e2h.cluster <= 8))


# ---------------------------------------------------------------- §3.3 down-sampling, epoch 0, annealing
def test_epoch0_keeps_the_uniform_downsampled_set():
    inp = make_input(epoch=0, unseen=2000)  # nothing seen yet
    res = run_policy("seta", inp, r=0.2, k=5, alpha=0.6)
    u = uniforms(inp.uid, 0, 0, 1)
    assert res.summary["kept"] == 1600 and res.summary["s"] == "all" and res.summary["phase"] == "prune"
    assert np.array_equal(res.keep, u <= np.sort(u)[1599])  # the 1,600 smallest u of stream 1
    assert res.summary["absent_rule"] == {"kind": "bernoulli", "fraction": 0.8, "stream": 1, "epoch": None}
    seen0 = run_policy("seta", make_input(epoch=0), r=0.2)  # warm start: e = 0 still has no window
    assert seen0.summary["kept"] == 1600 and seen0.summary["kept_by_reason"] == {"no_window": 1600}


def test_downsampling_is_redrawn_every_epoch():
    a = run_policy("seta", make_input(epoch=1), r=0.3, k=1, alpha=1.0)
    b = run_policy("seta", make_input(epoch=2), r=0.3, k=1, alpha=1.0)
    # k = 1: SeTa degenerates into dynamic random (§3.4)
    assert a.summary["kept"] == b.summary["kept"] == 1400 and not np.array_equal(a.keep, b.keep)
    rnd = run_policy("random", make_input(epoch=1), r=0.3)
    assert np.array_equal(a.keep, rnd.keep)  # same stream 1 draw


def test_partial_annealing_draws_stream_2_with_non_integer_delta_e():
    # E = 10, delta = 0.875: P = 8, epochs 8 and 9 anneal
    phases = [run_policy("seta", make_input(epoch=e), r=0.2).summary["phase"] for e in (7, 8, 9)]
    assert phases == ["prune", "anneal", "anneal"]
    inp = make_input(epoch=9)
    res = run_policy("seta", inp, r=0.2, k=5, alpha=0.6)
    u = uniforms(inp.uid, 0, 9, 2)
    assert res.summary["kept"] == 1600 and np.array_equal(res.keep, u <= np.sort(u)[1599])
    assert res.summary["absent_rule"]["stream"] == 2 and res.summary["absent_rule"]["fraction"] == 0.8
    assert set(np.unique(res.weight[res.keep])) == {1.0}
    assert run_policy("seta", make_input(epoch=9), r=0.0).summary["kept"] == 2000  # r = 0: full data
    assert run_policy("seta", make_input(epoch=3), r=0.0, prune_epochs=3).summary["phase"] == "anneal"
    first = run_policy("seta", make_input(epoch=0), r=0.2, k=5, alpha=0.6)  # stream 1, not stream 2
    assert first.summary["kept"] == 1600 and not np.array_equal(first.keep, res.keep)


# ---------------------------------------------------------------- unseen, degenerate
def test_unseen_samples_of_R_are_kept_and_counted():
    inp = make_input(epoch=3, unseen=300)
    res = run_policy("seta", inp, r=0.1, k=5, alpha=0.4)
    R = res.reason != reason_code("downsampled_out")
    assert res.summary["unseen"] == 300
    assert np.array_equal(res.keep[:300], R[:300])
    assert res.summary["kept_by_reason"]["unseen"] == int(R[:300].sum())
    assert set(res.summary["kept_by_reason"]) == {"unseen", "window"}


def test_unseen_score_puts_unseen_into_the_clustering():
    res = run_policy("seta", make_input(epoch=3, unseen=300), r=0.0, k=5, alpha=0.4, unseen_score=3.0)
    assert "unseen" not in res.summary["kept_by_reason"]
    assert len(set(res.cluster[:300].tolist())) == 1 and res.cluster[0] >= 0


@pytest.mark.parametrize(
    ("losses", "k", "k_eff", "w", "kept"),
    [
        ([2.0] * 50, 10, 1, 1, 50),  # U = 1 keeps all of R_s
        ([1.0, 5.0] * 25, 10, 2, 1, 25),  # U < k: w on k' = 2 -> one cluster at s = 1 mod 2
        ([1.0, 2.0, 3.0, 4.0, 5.0] * 10, 5, 5, 2, 20),  # U = k
    ],
)
def test_degenerate_losses(losses, k, k_eff, w, kept):
    n = len(losses)
    inp = PolicyInput.from_losses(np.arange(n, dtype=np.uint64), np.array(losses, np.float32), epoch=1, epochs=10)
    s = run_policy("seta", inp, r=0.0, k=k, alpha=0.5).summary
    assert (s["k_eff"], s["w"], s["kept"]) == (k_eff, w, kept)
    assert all(np.isfinite(s["centroids"]))


def test_degenerate_losses_of_the_whole_table():
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


def test_tiny_inputs_use_the_guard():
    one = PolicyInput.from_losses(np.array([1], np.uint64), np.array([1.0], np.float32), epoch=3, epochs=10)
    s = run_policy("seta", one, r=0.9, k=10, alpha=0.5).summary  # floor(0.1 * 1) = 0: |R| = 0
    assert s["empty_plan_guard"] is True and s["kept"] == 1 and s["n_downsampled"] == 0


def test_cifar_recipe_kept_fraction_swings():
    # docs/algorithms.md §11: the CIFAR recipe alternates about 0.90 / 0.26-0.31
    params = vars(SetaParams.preset("cifar"))
    fr = [run_policy("seta", make_input(n=20_000, epoch=e), **params).summary["kept"] / 20_000 for e in range(1, 5)]
    assert fr[0] < 0.4 and fr[1] > 0.85 and fr[2] < 0.4 and fr[3] > 0.85


# ---------------------------------------------------------------- summary, row order
def test_summary_has_the_common_and_the_seta_fields():
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


# ---------------------------------------------------------------- declaration
def test_seta_reads_the_last_loss_seen_and_uid_and_fixes_no_run_setting():
    spec = get_policy("seta")
    for params in (SetaParams(), SetaParams(unseen_score=1.0), SetaParams(r=0.2, target_keep=0.5)):
        assert set(spec.columns(params)) == {"uid", "last_loss", "seen"}
        assert spec.table_columns(params) == ["uid", "last_loss", "seen"]
        assert spec.settings == () and spec.run_settings(params) == {}


# ---------------------------------------------------------------- parameters
def test_presets():
    c = SetaParams.preset("cifar")
    assert (c.r, c.k, c.alpha, c.delta) == (0.1, 5, 0.9, 0.875)
    i = SetaParams.preset("imagenet", k=10)
    assert (i.r, i.k, i.alpha, i.delta) == (0.0, 10, 0.6, 0.875)
    with pytest.raises(ValueError, match=r"seta: unknown preset 'mnist'; valid: \['cifar', 'imagenet'\]"):
        SetaParams.preset("mnist")


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"r": 0.95}, r"seta: r=0.95 is outside the valid range 0 <= r <= 0.9"),
        ({"r": -0.1}, r"seta: r=-0.1 is outside the valid range"),
        ({"k": 0}, r"seta: k=0 is outside the valid range: integer 1 <= k <= 256"),
        ({"k": 257}, r"seta: k=257 is outside the valid range"),
        ({"k": 2.5}, r"seta: k=2.5 is outside the valid range"),
        ({"alpha": 0.0}, r"seta: alpha=0.0 is outside the valid range 0 < alpha <= 1"),
        ({"alpha": 1.5}, r"seta: alpha=1.5 is outside the valid range"),
        ({"alpha": 0.05, "k": 5}, r"seta: alpha=0.05 with k=5 gives a window of round\(alpha\*k\) = 0"),
        ({"delta": 1.5}, r"seta: delta=1.5 is outside the valid range 0 <= delta <= 1"),
        ({"order": "x"}, r"seta: order='x', expected 'e2h' or 'h2e'"),
        ({"prune_epochs": -1}, r"seta: prune_epochs=-1 must be >= 0"),
        ({"r": 0.5, "target_keep": 0.6}, r"seta: target_keep=0.6 is outside the valid range 0 < target_keep <= 1 - r"),
        ({"target_keep": 0.0}, r"seta: target_keep=0.0 is outside the valid range"),
    ],
)
def test_parameters_out_of_range_are_rejected(params, message):
    with pytest.raises(ValueError, match=message):
        SetaParams(**params)


# ---------------------------------------------------------------- budget (target_keep)
def test_rank_range_selects_consecutive_ranks_with_uid_ties():
    vals = np.array([3, 1, 2, 2, 2, 5, 0], np.float32)
    uid = np.array([10, 11, 14, 12, 13, 15, 16], np.uint64)
    # ascending (value, uid): 0(16) 1(11) 2(12) 2(13) 2(14) 3(10) 5(15)
    assert np.flatnonzero(rank_range(vals, uid, 2, 4)).tolist() == [3, 4]
    assert np.flatnonzero(rank_range(vals, uid, 0, 2)).tolist() == [1, 6]
    assert rank_range(vals, uid, 3, 7).sum() == 4


@pytest.mark.parametrize(("target", "r", "k", "alpha"), [(0.5, 0.1, 10, 0.5), (0.3, 0.0, 10, 0.5), (0.6, 0.1, 5, 0.9)])
def test_budget_holds_within_two_points_over_many_epochs(target, r, k, alpha):
    """Log-normal losses that shift every epoch (as in §11): plain SeTa swings, the budget holds,
    and the kept band still follows the window's easy-to-hard cycle."""
    n, epochs = 5000, 40
    plain, budget, centres = [], [], []
    for e in range(1, 35):  # P = floor(0.875 * 40) = 35: all pruning epochs
        inp = make_input(n=n, epoch=e, epochs=epochs, rs=e, mean=1.0 - 0.05 * e, unseen=e * 20)
        a = run_policy("seta", inp, r=r, k=k, alpha=alpha)
        b = run_policy("seta", inp, r=r, k=k, alpha=alpha, target_keep=target)
        plain.append(a.summary["kept"] / n)
        budget.append(b.summary["kept"] / n)
        assert abs(b.summary["kept"] / n - target) <= 0.02
        assert b.summary["kept"] == int(np.floor(target * n + 1e-9))
        assert b.summary["s"] == a.summary["s"] and b.summary["k_eff"] == a.summary["k_eff"]
        R = b.reason != reason_code("downsampled_out")
        assert not (b.keep & ~R).any()  # the budget stays inside R
        seen_kept = b.keep & np.isfinite(inp.last_loss)
        ranks = np.argsort(np.argsort(inp.last_loss[R & np.isfinite(inp.last_loss)], kind="stable"))
        centres.append(float(np.mean(ranks[seen_kept[R & np.isfinite(inp.last_loss)]])))
        assert np.array_equal(b.keep[: e * 20], R[: e * 20])  # unseen of R kept, counted in the budget
    assert max(plain) - min(plain) > 0.2  # plain SeTa swings on skewed losses
    # the band moves with the window: epochs with a later window start train harder samples
    starts = [window_start(e, k, window_width(k, alpha)) for e in range(1, 35)]
    lo = np.mean([c for c, s in zip(centres, starts) if s == 0])
    hi = np.mean([c for c, s in zip(centres, starts) if s == max(starts)])
    assert hi > lo


def test_budget_epoch0_and_unseen_over_budget():
    inp = make_input(n=1000, epoch=0)
    res = run_policy("seta", inp, r=0.2, target_keep=0.4)
    u = uniforms(inp.uid, 0, 0, 1)
    assert res.summary["kept"] == 400 and np.array_equal(res.keep, u <= np.sort(u)[399])
    assert res.summary["absent_rule"]["fraction"] == 0.4
    many_unseen = make_input(n=1000, epoch=2, unseen=700)
    res = run_policy("seta", many_unseen, r=0.0, target_keep=0.5)
    assert res.summary["kept"] == 500 and res.keep[700:].sum() == 0  # all slots go to unseen


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
