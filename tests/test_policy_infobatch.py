"""InfoBatch (docs/algorithms.md §4): mean test, uniform draw of below-mean samples, rescaling,
annealing without leaked weights, unseen samples, edge cases, validation, declared columns."""

from __future__ import annotations

import numpy as np
import pytest

from seta_stream.policies import PolicyInput, get_policy, run_policy
from seta_stream.policies.infobatch import InfoBatchParams
from seta_stream.policies.random_draws import uniforms


def lognormal_input(n=4000, epoch=2, epochs=10, seed=0, rs=0):
    rng = np.random.default_rng(rs)
    uid = rng.integers(0, 2**63, n, dtype=np.uint64)
    return PolicyInput.from_losses(uid, rng.lognormal(size=n).astype(np.float32), epoch=epoch, epochs=epochs, seed=seed)


def test_rule_summary_and_stream_3_draw():
    inp = lognormal_input()
    res = run_policy("infobatch", inp, r=0.5)
    loss = inp.last_loss.astype(np.float64)
    below = loss < loss.mean()
    s = res.summary
    assert s["phase"] == "prune" and s["mu"] == pytest.approx(loss.mean()) and s["n_seen"] == 4000
    assert s["n_below_mean"] == int(below.sum()) and s["m"] == int(below.sum()) // 2 and s["weight"] == 2.0
    assert np.all(res.keep[~below]) and np.all(res.weight[~below] == 1.0)
    u = uniforms(inp.uid, 0, 2, 3)
    drawn = below & (u <= np.sort(u[below])[s["m"] - 1])  # the m smallest u of stream 3 among L
    assert np.array_equal(res.keep[below], drawn[below]) and np.all(res.weight[drawn] == 2.0)
    assert s["weight_histogram"] == {"1.0": int((~below).sum()), "2.0": s["m"]}
    assert s["kept_by_reason"] == {"above_mean": int((~below).sum()), "below_mean_drawn": s["m"]}
    assert res.summary["absent_rule"]["kind"] == "keep"
    assert 0.62 < s["kept"] / inp.n < 0.70  # docs/algorithms.md §11: 0.652 on log-normal losses at r = 0.5


def test_samples_equal_to_the_mean_are_not_candidates():
    loss = np.array([1.0, 2.0, 3.0, 2.0, 2.0], np.float32)  # mean = 2.0
    inp = PolicyInput.from_losses(np.arange(5, dtype=np.uint64), loss, epoch=1, epochs=10)
    s = run_policy("infobatch", inp, r=0.9).summary
    assert s["n_below_mean"] == 1 and s["m"] == 0 and s["kept"] == 4  # floor(0.1 * 1) = 0


@pytest.mark.parametrize("losses", ["one_table", "a_table_per_seed"])
@pytest.mark.parametrize("rescale", ["reference", "exact"])
def test_weighted_count_of_kept_below_mean_samples_matches_their_number(rescale, losses):
    # sum of weights over the kept below-mean samples estimates |L|. Over 200 fixed seeds the
    # mean ratio is within 0.5% of 1 (reference: 1/(1-r) floor((1-r)|L|) is within one weight
    # of |L|, i.e. about 0.3% at |L| ~ 700, r = 0.7); "exact" is exact in every epoch. The
    # seeds draw on one table of losses, or each on its own.
    totals = []
    for seed in range(200):
        inp = lognormal_input(n=1001, seed=seed, rs=seed if losses == "a_table_per_seed" else 0)
        res = run_policy("infobatch", inp, r=0.7, rescale=rescale)
        below = inp.last_loss < inp.last_loss.astype(np.float64).mean()
        totals.append(float(res.weight[below & res.keep].sum()) / int(below.sum()))
    assert abs(np.mean(totals) - 1.0) < 0.005
    if rescale == "exact":
        assert np.allclose(totals, 1.0, atol=1e-6)


def test_annealing_weights_are_all_one_for_non_integer_delta_e():
    # E = 10, delta = 0.875: delta E = 8.75, epochs 8 and 9 anneal (the reference leaks 1/(1-r) there)
    for e, phase in [(7, "prune"), (8, "anneal"), (9, "anneal")]:
        res = run_policy("infobatch", lognormal_input(epoch=e, epochs=10), r=0.5, delta=0.875)
        assert res.summary["phase"] == phase
        if phase == "anneal":
            assert res.summary["kept"] == 4000 and set(np.unique(res.weight)) == {1.0}
    # E = 300 (imagenet): 262 pruning epochs
    assert run_policy("infobatch", lognormal_input(epoch=262, epochs=300)).summary["phase"] == "anneal"
    assert run_policy("infobatch", lognormal_input(epoch=261, epochs=300)).summary["phase"] == "prune"
    assert run_policy("infobatch", lognormal_input(epoch=2), prune_epochs=2).summary["phase"] == "anneal"


def test_unseen_first_epoch_and_edge_cases():
    inp = lognormal_input(n=100)
    loss = inp.last_loss.copy()
    loss[:10] = np.nan
    res = run_policy("infobatch", PolicyInput.from_losses(inp.uid, loss, epoch=2, epochs=10), r=0.5)
    assert np.all(res.keep[:10]) and np.all(res.weight[:10] == 1.0) and res.summary["n_seen"] == 90
    assert res.summary["kept_by_reason"]["unseen"] == 10
    nothing_seen = PolicyInput.from_losses(inp.uid, np.full(100, np.nan, np.float32), epoch=0, epochs=10)
    assert run_policy("infobatch", nothing_seen).summary["kept"] == 100  # epoch 0 keeps everything
    equal = PolicyInput.from_losses(inp.uid, np.full(100, 3.0, np.float32), epoch=2, epochs=10)
    assert run_policy("infobatch", equal, r=0.5).summary["kept"] == 100  # nothing strictly below
    zero = run_policy("infobatch", inp, r=0.0)
    assert zero.summary["kept"] == 100 and set(np.unique(zero.weight)) == {1.0}


def test_unseen_score_and_ema_score():
    inp = lognormal_input(n=1000)
    loss = inp.last_loss.copy()
    loss[:100] = np.nan
    partly = PolicyInput.from_losses(inp.uid, loss, epoch=2, epochs=10)
    ref = run_policy("infobatch", partly, r=0.5, unseen_score=0.0)  # unseen become the easiest
    assert ref.summary["n_seen"] == 1000 and ref.keep[:100].sum() < 100
    ema = PolicyInput(inp.uid, inp.last_loss, inp.ema[::-1].copy(), inp.seen, inp.last_epoch, 2, 10, 0)
    a = run_policy("infobatch", ema, score="ema")
    below = ema.ema < ema.ema.mean()
    assert np.all(a.keep[~below]) and a.summary["n_below_mean"] == int(below.sum())


def test_infobatch_reads_the_column_of_its_score():
    spec = get_policy("infobatch")
    last, ema = InfoBatchParams(), InfoBatchParams(score="ema")
    assert set(spec.columns(last)) == {"uid", "seen", "last_loss"}
    assert set(spec.columns(ema)) == {"uid", "seen", "ema"}
    assert spec.table_columns(last) == ["uid", "last_loss", "seen"]
    assert spec.table_columns(ema) == ["uid", "last_loss", "ema", "seen"]
    assert spec.settings == () and spec.run_settings(ema) == {}  # any EMA factor of the run will do


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"r": 0.95}, r"infobatch: r=0.95 is outside the valid range 0 <= r <= 0.9"),
        ({"r": -0.5}, r"infobatch: r=-0.5 is outside the valid range"),
        ({"delta": 2.0}, r"infobatch: delta=2.0 is outside the valid range 0 <= delta <= 1"),
        ({"score": "x"}, r"infobatch: score='x', expected 'last' or 'ema'"),
        ({"rescale": "y"}, r"infobatch: rescale='y', expected 'reference' or 'exact'"),
        ({"prune_epochs": -2}, r"infobatch: prune_epochs=-2 must be >= 0"),
    ],
)
def test_parameters_out_of_range_are_rejected(params, message):
    with pytest.raises(ValueError, match=message):
        InfoBatchParams(**params)
