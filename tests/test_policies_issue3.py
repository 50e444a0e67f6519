"""InfoBatch, ES/ESWP and the batch-level ES helper (algorithms.md §4, §5)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from policy_helpers import successive_inclusion

from seta_stream import LossRecorder, RunDir, compact, load_plan, plan_epoch
from seta_stream.errors import InvalidInputError
from seta_stream.policies import PolicyInput, es_select, run_policy


def lognormal_input(n=4000, epoch=2, epochs=10, seed=0, rs=0):
    rng = np.random.default_rng(rs)
    uid = rng.integers(0, 2**63, n, dtype=np.uint64)
    return PolicyInput.from_losses(uid, rng.lognormal(size=n).astype(np.float32), epoch=epoch, epochs=epochs, seed=seed)


# ---------------------------------------------------------------- InfoBatch
def test_infobatch_rule_and_summary():
    inp = lognormal_input()
    r = run_policy("infobatch", inp, r=0.5)
    loss = inp.last_loss.astype(np.float64)
    mu = loss.mean()
    below = loss < mu
    s = r.summary
    assert s["mu"] == pytest.approx(mu) and s["n_below_mean"] == int(below.sum())
    assert s["m"] == int(below.sum()) // 2 and s["weight"] == 2.0
    assert np.all(r.keep[~below]) and np.all(r.weight[~below] == 1.0)
    assert int(r.keep[below].sum()) == s["m"] and np.all(r.weight[below & r.keep] == 2.0)
    assert s["weight_histogram"] == {"1.0": int((~below).sum()), "2.0": s["m"]}
    assert 0.62 < s["kept"] / inp.n < 0.70  # algorithms.md §11: 0.652 on log-normal losses


@pytest.mark.parametrize("rescale", ["reference", "exact"])
def test_infobatch_weighted_count_matches_the_below_mean_count_in_expectation(rescale):
    # sum of weights over kept below-mean samples estimates |L|; over 200 seeds the mean is
    # within 0.5% of |L| (reference: 1/(1-r) * floor((1-r)|L|) is within one weight of |L|).
    totals = []
    for seed in range(200):
        inp = lognormal_input(n=1001, seed=seed)
        r = run_policy("infobatch", inp, r=0.7, rescale=rescale)
        below = inp.last_loss < inp.last_loss.astype(np.float64).mean()
        totals.append(float(r.weight[below & r.keep].sum()) / int(below.sum()))
    assert abs(np.mean(totals) - 1.0) < 0.005
    if rescale == "exact":
        assert np.allclose(totals, 1.0, atol=1e-6)


def test_infobatch_annealing_weights_are_all_one_for_non_integer_delta_e():
    # E=10, delta=0.875: delta*E = 8.75; epochs 8 and 9 anneal (the reference leaks weights there)
    for e, phase in [(7, "prune"), (8, "anneal"), (9, "anneal")]:
        r = run_policy("infobatch", lognormal_input(epoch=e, epochs=10), r=0.5, delta=0.875)
        assert r.summary["phase"] == phase
        if phase == "anneal":
            assert r.summary["kept"] == 4000 and set(np.unique(r.weight)) == {1.0}


def test_infobatch_unseen_and_edge_cases():
    inp = lognormal_input(n=100)
    loss = inp.last_loss.copy()
    loss[:10] = np.nan
    inp2 = PolicyInput.from_losses(inp.uid, loss, epoch=2, epochs=10)
    r = run_policy("infobatch", inp2, r=0.5)
    assert np.all(r.keep[:10]) and np.all(r.weight[:10] == 1.0) and r.summary["n_seen"] == 90
    equal = PolicyInput.from_losses(inp.uid, np.full(100, 3.0, np.float32), epoch=2, epochs=10)
    assert run_policy("infobatch", equal, r=0.5).summary["kept"] == 100  # nothing strictly below
    assert run_policy("infobatch", inp, r=0.0).summary["kept"] == 100


# ---------------------------------------------------------------- ES / ESWP
def test_eswp_inclusion_frequencies_follow_successive_sampling_of_the_scores():
    scores = np.array([0.5, 1.0, 2.0, 4.0, 8.0])
    uid = np.arange(5, dtype=np.uint64) + 100
    inp0 = PolicyInput(uid, scores.astype(np.float32), scores, np.ones(5, np.int32), np.ones(5, np.int32), 5, 20, 0)
    exact = successive_inclusion(scores, 3)  # m = floor(0.6 * 5) = 3
    hits = np.zeros(5)
    trials = 6000
    for seed in range(trials):
        inp = PolicyInput(inp0.uid, inp0.last_loss, inp0.ema, inp0.seen, inp0.last_epoch, 5, 20, seed)
        r = run_policy("eswp", inp, r=0.4)
        hits += r.keep
    # 4 standard errors of a proportion at 6,000 trials < 0.026
    assert np.allclose(hits / trials, exact, atol=0.026)
    assert np.all(np.diff(hits) > 0)


def test_es_phases_and_scores():
    inp = lognormal_input(epoch=0, epochs=40)
    for e, phase in [(0, "warmup"), (1, "warmup"), (2, "prune"), (37, "prune"), (38, "anneal")]:
        i = PolicyInput(inp.uid, inp.last_loss, inp.ema, inp.seen, inp.last_epoch, e, 40, 0)
        es_r, eswp_r = run_policy("es", i), run_policy("eswp", i)
        assert es_r.summary["phase"] == eswp_r.summary["phase"] == phase
        assert es_r.summary["kept"] == 4000
        assert eswp_r.summary["kept"] == (4000 if phase != "prune" else 3200)
        assert np.array_equal(es_r.score, inp.ema)


def test_es_select_follows_w_and_picks_b():
    rng = np.random.default_rng(0)
    losses, scores = np.array([0.1, 0.5, 1.0, 2.0]), np.array([1.0, 1.0, 0.2, 0.2])
    w = 0.2 * scores + 0.8 * losses
    exact = successive_inclusion(w, 2)  # b = ceil(0.5 * 4) = 2
    uids = rng.integers(0, 2**63, 4, dtype=np.uint64)
    hits = np.zeros(4)
    for step in range(6000):
        mask = es_select(losses, scores, 0.5, 0.2, seed=1, epoch=3, rank=0, step=step, uids=uids)
        assert mask.sum() == 2
        hits += mask
    assert np.allclose(hits / 6000, exact, atol=0.026)
    # torch inputs, ranks differ, zero weights are filled uniformly
    m1 = es_select(torch.tensor(losses), torch.tensor(scores), 0.5, seed=1, epoch=3, rank=0, step=1, uids=uids)
    m2 = es_select(losses, scores, 0.5, seed=1, epoch=3, rank=1, step=1, uids=uids)
    assert m1.sum() == m2.sum() == 2
    zeros = es_select(np.zeros(8), np.zeros(8), 0.5, 0.2, seed=0, epoch=0, rank=0, step=0, uids=np.arange(8))
    assert zeros.sum() == 4
    with pytest.raises(ValueError, match="es_select: 3 losses, 4 scores and 4 uids"):
        es_select(np.zeros(3), np.zeros(4), seed=0, epoch=0, rank=0, step=0, uids=np.arange(4))


@pytest.mark.parametrize(
    ("policy", "params", "message"),
    [
        ("infobatch", {"r": 0.95}, r"infobatch: r=0.95 is outside the valid range 0 <= r <= 0.9"),
        ("infobatch", {"score": "x"}, r"infobatch: score='x', expected 'last' or 'ema'"),
        ("infobatch", {"rescale": "y"}, r"infobatch: rescale='y', expected 'reference' or 'exact'"),
        ("eswp", {"beta2": 1.0}, r"eswp: beta2=1.0 is outside the valid range 0 <= beta2 < 1"),
        ("eswp", {"mini_ratio": 0}, r"eswp: mini_ratio=0 is outside the valid range 0 < mini_ratio <= 1"),
        ("es", {"anneal_ratio": 0.6}, r"es: anneal_ratio=0.6 is outside the valid range 0 <= anneal_ratio <= 0.5"),
        ("es", {"r": 0.2}, r"es: r=0.2; ES has no set-level pruning"),
        ("eswp", {"beta1": -0.1}, r"eswp: beta1=-0.1 is outside the valid range 0 <= beta1 <= 1"),
    ],
)
def test_parameter_errors(policy, params, message):
    with pytest.raises(ValueError, match=message):
        run_policy(policy, lognormal_input(n=10), **params)


def test_eswp_plan_has_scores_and_the_run_beta2_must_match(tmp_path):
    run = RunDir(tmp_path / "r", create=True)  # ema_beta2 = 0.9
    with LossRecorder(run) as rec:
        rec.record([f"k{i}" for i in range(50)], ["s.tar"] * 50, torch.rand(50))
    compact(run)
    with pytest.raises(InvalidInputError, match=r"EMA uses beta2=0.9, policy eswp asks beta2=0.8"):
        plan_epoch(run, 3, policy="eswp", epochs=20)
    plan_epoch(run, 3, policy="eswp", params={"beta2": 0.9}, epochs=20)
    plan = load_plan(run, 3)
    assert plan.schema.names[-1] == "score" and plan.num_rows == 50
    assert sum(plan.column("keep").to_pylist()) == 40
