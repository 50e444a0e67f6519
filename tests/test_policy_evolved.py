"""Evolved Sampling (docs/algorithms.md §5): phases, the ESWP set-level weighted draw, the score
column, the batch-level helper ``es_select``, and what ES/ESWP declare: the ``ema`` column and
the run's ``ema_beta2``, which planning checks against the policy's ``beta2``."""

from __future__ import annotations

import numpy as np
import pytest
from policy_helpers import successive_inclusion

from seta_stream import RunDir, compact, load_plan, plan_epoch
from seta_stream.errors import InvalidInputError
from seta_stream.ids import mix64
from seta_stream.policies import PolicyInput, es_select, get_policy, run_policy
from seta_stream.policies.evolved import EsParams, EswpParams, anneal_epochs
from seta_stream.policies.random_draws import salt, uniforms, weighted_subset
from seta_stream.testing import LossRecorder


def lognormal_input(n=4000, epoch=2, epochs=40, seed=0, rs=0, unseen=0, n_ref=0):
    rng = np.random.default_rng(rs)
    uid = rng.integers(0, 2**63, n, dtype=np.uint64)
    loss = rng.lognormal(size=n).astype(np.float32)
    loss[:unseen] = np.nan
    i = PolicyInput.from_losses(uid, loss, epoch=epoch, epochs=epochs, seed=seed)
    return PolicyInput(i.uid, i.last_loss, i.ema, i.seen, i.last_epoch, epoch, epochs, seed, n_ref)


# ---------------------------------------------------------------- phases
def test_anneal_epochs_round_up():
    assert anneal_epochs(0.05, 200) == 10 and anneal_epochs(0.05, 40) == 2 and anneal_epochs(0.05, 10) == 1
    assert anneal_epochs(0.0, 10) == 0 and anneal_epochs(0.5, 10) == 5


def test_phases_keep_counts_and_scores():
    inp = lognormal_input(epoch=0)
    for e, phase in [(0, "warmup"), (1, "warmup"), (2, "prune"), (37, "prune"), (38, "anneal"), (39, "anneal")]:
        i = PolicyInput(inp.uid, inp.last_loss, inp.ema, inp.seen, inp.last_epoch, e, 40, 0)
        es_r, eswp_r = run_policy("es", i), run_policy("eswp", i)
        assert es_r.summary["phase"] == eswp_r.summary["phase"] == phase
        assert es_r.summary["E_a"] == 2 and es_r.summary["active"] == (phase == "prune")
        assert es_r.summary["kept"] == 4000
        assert eswp_r.summary["kept"] == (4000 if phase != "prune" else 3200)
        assert np.array_equal(es_r.score, inp.ema) and es_r.score.dtype == np.float64
        assert set(np.unique(eswp_r.weight[eswp_r.keep])) == {1.0}
    q = run_policy("eswp", lognormal_input(epoch=5)).summary["score_quantiles"]
    assert list(q) == ["0", "0.1", "0.25", "0.5", "0.75", "0.9", "1"] and q["0.5"] == pytest.approx(1.0, rel=0.1)


def test_no_active_epoch_is_full_with_a_warning():
    s = run_policy("eswp", lognormal_input(epoch=1, epochs=2), anneal_ratio=0.5).summary
    assert s["kept"] == 4000 and "no active epoch" in s["warning"]


# ---------------------------------------------------------------- ESWP set level (§5.3)
def test_eswp_draw_is_successive_sampling_of_stream_4_and_keeps_unseen():
    inp = lognormal_input(epoch=5, unseen=500, n_ref=10_000)
    res = run_policy("eswp", inp, r=0.2)
    seen = np.isfinite(inp.ema)
    u = uniforms(inp.uid, 0, 5, 4)
    expected = weighted_subset(seen, np.where(seen, inp.ema, 0.0), int(0.8 * 3500), u, inp.uid)
    assert np.array_equal(res.keep, expected | ~seen)
    assert res.summary["m"] == 2800 and res.summary["n_seen"] == 3500 and res.summary["kept"] == 3300
    assert np.all(res.score[~seen] == 1e-4) and np.array_equal(res.score[seen], inp.ema[seen])
    assert res.summary["kept_by_reason"] == {"drawn": 2800, "unseen": 500}
    # drawn samples have larger scores on average (probability proportional to s)
    assert inp.ema[res.keep & seen].mean() > inp.ema[seen & ~res.keep].mean()


def test_eswp_inclusion_frequencies_follow_the_exact_successive_sampling_probabilities():
    scores = np.array([0.5, 1.0, 2.0, 4.0, 8.0])
    uid = np.arange(5, dtype=np.uint64) + 100
    exact = successive_inclusion(scores, 3)  # m = floor(0.6 * 5) = 3
    hits = np.zeros(5)
    trials = 6000
    ones = np.ones(5, np.int32)
    for seed in range(trials):
        inp = PolicyInput(uid, scores.astype(np.float32), scores, ones, ones, 5, 20, seed)
        hits += run_policy("eswp", inp, r=0.4).keep
    # 4 standard errors of a proportion at 6,000 trials < 0.026
    assert np.allclose(hits / trials, exact, atol=0.026)
    assert np.all(np.diff(hits) > 0)  # monotone in the score


# ---------------------------------------------------------------- es_select (§5.4)
def test_es_select_follows_w_and_picks_b():
    losses, scores = np.array([0.1, 0.5, 1.0, 2.0]), np.array([1.0, 1.0, 0.2, 0.2])
    w = 0.2 * scores + 0.8 * losses
    exact = successive_inclusion(w, 2)  # b = ceil(0.5 * 4) = 2
    uids = np.random.default_rng(0).integers(0, 2**63, 4, dtype=np.uint64)
    hits = np.zeros(4)
    for step in range(6000):
        mask = es_select(losses, scores, 0.5, 0.2, seed=1, epoch=3, rank=0, step=step, uids=uids)
        assert mask.sum() == 2
        hits += mask
    # 4 standard errors of a proportion at 6,000 steps < 0.026
    assert np.allclose(hits / 6000, exact, atol=0.026)


def test_es_select_uses_stream_6_with_rank_and_step_in_the_salt():
    rng = np.random.default_rng(2)
    B = 64
    losses, scores = rng.lognormal(size=B), rng.lognormal(size=B)
    uids = rng.integers(0, 2**63, B, dtype=np.uint64)
    mask = es_select(losses, scores, 0.25, 0.2, seed=9, epoch=4, rank=2, step=17, uids=uids)
    st = mix64(salt(9, 4, 6) ^ mix64((2 << 32) + 17))
    u = np.array([(mix64(int(x) ^ st) >> 11) * 2.0**-53 for x in uids])
    keys = -np.log1p(-u) / (0.2 * scores + 0.8 * losses)
    assert mask.sum() == 16 and np.array_equal(np.flatnonzero(mask), np.sort(np.argsort(keys)[:16]))
    again = es_select(losses, scores, 0.25, 0.2, seed=9, epoch=4, rank=2, step=17, uids=uids)
    other_rank = es_select(losses, scores, 0.25, 0.2, seed=9, epoch=4, rank=3, step=17, uids=uids)
    assert np.array_equal(mask, again) and not np.array_equal(mask, other_rank)
    perm = rng.permutation(B)  # row order inside the meta-batch does not matter
    shuffled = es_select(losses[perm], scores[perm], 0.25, 0.2, seed=9, epoch=4, rank=2, step=17, uids=uids[perm])
    assert np.array_equal(shuffled, mask[perm])


def test_es_select_torch_inputs_give_the_numpy_selection():
    torch = pytest.importorskip("torch")
    losses, scores = np.array([0.1, 0.5, 1.0, 2.0]), np.array([1.0, 1.0, 0.2, 0.2])
    uids = np.arange(4, dtype=np.uint64)
    m1 = es_select(torch.tensor(losses), torch.tensor(scores), 0.5, seed=1, epoch=3, rank=0, step=1, uids=uids)
    m2 = es_select(losses, scores, 0.5, seed=1, epoch=3, rank=0, step=1, uids=uids)
    assert np.array_equal(m1, m2)
    other_rank = es_select(losses, scores, 0.5, seed=1, epoch=3, rank=1, step=1, uids=uids)
    assert m1.sum() == other_rank.sum() == 2


def test_es_select_edge_cases():
    losses, scores = np.array([0.1, 0.5, 1.0, 2.0]), np.array([1.0, 1.0, 0.2, 0.2])
    uids = np.arange(4, dtype=np.uint64)
    assert es_select(np.zeros(8), np.zeros(8), 0.5, 0.2, seed=0, epoch=0, rank=0, step=0, uids=np.arange(8)).sum() == 4
    assert es_select(losses[:3], scores[:3], 0.25, seed=0, epoch=0, rank=0, step=0, uids=uids[:3]).sum() == 1  # ceil
    assert es_select(losses, scores, 1.0, seed=0, epoch=0, rank=0, step=0, uids=uids).all()
    with pytest.raises(ValueError, match="es_select: 3 losses, 4 scores and 4 uids"):
        es_select(np.zeros(3), np.zeros(4), seed=0, epoch=0, rank=0, step=0, uids=np.arange(4))


# ---------------------------------------------------------------- declaration, planning
def test_es_and_eswp_read_the_ema_and_fix_the_run_ema_beta2():
    for name, params, beta2 in (("es", EsParams(), 0.9), ("eswp", EswpParams(), 0.8), ("es", EsParams(beta2=0.5), 0.5)):
        spec = get_policy(name)
        assert set(spec.columns(params)) == {"uid", "seen", "ema"}
        assert spec.table_columns(params) == ["uid", "last_loss", "ema", "seen"]
        assert [(s.name, s.param) for s in spec.settings] == [("ema_beta2", "beta2")]
        assert spec.run_settings(params) == {"ema_beta2": beta2}


def test_eswp_plan_has_scores_and_the_run_beta2_must_match(tmp_path):
    run = RunDir(tmp_path / "r", create=True)  # ema_beta2 = 0.9
    with LossRecorder(run) as rec:
        rec.record([f"k{i}" for i in range(50)], ["s.tar"] * 50, np.random.default_rng(0).random(50, np.float32))
    compact(run)
    with pytest.raises(InvalidInputError, match=r"EMA uses beta2=0.9, policy eswp asks beta2=0.8"):
        plan_epoch(run, 3, policy="eswp", epochs=20)
    plan_epoch(run, 3, policy="eswp", params={"beta2": 0.9}, epochs=20)
    plan = load_plan(run, 3)
    assert plan.schema.names[-1] == "score" and plan.num_rows == 50
    assert sum(plan.column("keep").to_pylist()) == 40


def test_the_beta2_mismatch_says_which_setting_and_how_to_fix_it(tmp_path):
    run = RunDir(tmp_path / "r", create=True, settings={"ema_beta2": 0.7})
    with pytest.raises(InvalidInputError) as info:
        plan_epoch(run, 0, policy="es", epochs=20)
    assert str(info.value) == (
        f"{run.display('seta-stream.json')}: the loss table's EMA uses beta2=0.7, policy es asks beta2=0.9; "
        "ema_beta2 is fixed when the run is created. Create the run with settings={'ema_beta2': 0.9} "
        "(Pruner does this for policy es), or pass the run's beta2"
    )


# ---------------------------------------------------------------- validation
@pytest.mark.parametrize(
    ("cls", "params", "message"),
    [
        (EswpParams, {"beta1": -0.1}, r"eswp: beta1=-0.1 is outside the valid range 0 <= beta1 <= 1"),
        (EswpParams, {"beta2": 1.0}, r"eswp: beta2=1.0 is outside the valid range 0 <= beta2 < 1"),
        (EswpParams, {"r": 1.0}, r"eswp: r=1.0 is outside the valid range 0 <= r < 1"),
        (EswpParams, {"mini_ratio": 0}, r"eswp: mini_ratio=0 is outside the valid range 0 < mini_ratio <= 1"),
        (EswpParams, {"anneal_ratio": 0.6}, r"eswp: anneal_ratio=0.6 is outside the valid range 0 <= anneal_ratio"),
        (EsParams, {"beta1": 1.5}, r"es: beta1=1.5 is outside the valid range"),
        (EsParams, {"mini_ratio": 1.5}, r"es: mini_ratio=1.5 is outside the valid range"),
        (EsParams, {"r": 0.2}, r"es: r=0.2; ES has no set-level pruning"),
    ],
)
def test_parameters_out_of_range_are_rejected(cls, params, message):
    with pytest.raises(ValueError, match=message):
        cls(**params)
