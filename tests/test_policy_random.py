"""Random baselines (docs/algorithms.md §2): dynamic (stream 1, fresh every epoch, optional
delta) and static (stream 5, epoch 0, the same subset every epoch); the columns they declare."""

from __future__ import annotations

import numpy as np
import pytest

from seta_stream.policies import PolicyInput, get_policy, run_policy
from seta_stream.policies.random import RandomParams, StaticParams
from seta_stream.policies.random_draws import uniforms


def make_input(n=2000, epoch=1, epochs=10, seed=0, unseen=0):
    rng = np.random.default_rng(0)
    uid = rng.integers(0, 2**63, n, dtype=np.uint64)
    loss = rng.lognormal(size=n).astype(np.float32)
    loss[:unseen] = np.nan
    return PolicyInput.from_losses(uid, loss, epoch=epoch, epochs=epochs, seed=seed)


def test_dynamic_is_the_smallest_u_of_stream_1_and_redraws():
    plans = []
    for e in range(1, 4):
        inp = make_input(epoch=e)
        res = run_policy("random", inp, r=0.3)
        u = uniforms(inp.uid, 0, e, 1)
        assert res.summary["kept"] == 1400 and np.array_equal(res.keep, u <= np.sort(u)[1399])
        assert res.summary["absent_rule"] == {"kind": "bernoulli", "fraction": 0.7, "stream": 1, "epoch": e}
        assert set(np.unique(res.weight[res.keep])) == {1.0}
        plans.append(res.keep)
    assert not np.array_equal(plans[0], plans[1])
    other_seed = run_policy("random", make_input(epoch=1, seed=1), r=0.3)
    assert not np.array_equal(other_seed.keep, plans[0])


def test_dynamic_treats_unseen_like_seen():
    res = run_policy("random", make_input(epoch=1, unseen=1000), r=0.5)
    assert 400 < res.keep[:1000].sum() < 600 and res.summary["kept"] == 1000


def test_dynamic_delta_anneals_with_full_data():
    # floor(0.8 * 10) = 8: epochs 8, 9 keep everything
    assert run_policy("random", make_input(epoch=7), r=0.3, delta=0.8).summary["kept"] == 1400
    anneal = run_policy("random", make_input(epoch=8), r=0.3, delta=0.8)
    assert anneal.summary["phase"] == "anneal" and anneal.summary["kept"] == 2000
    assert anneal.summary["absent_rule"]["kind"] == "keep"
    last = run_policy("random", make_input(epoch=9, epochs=10), r=0.3, delta=0.8)
    assert last.summary["phase"] == "anneal" and last.summary["kept"] == 2000
    assert run_policy("random", make_input(epoch=9), r=0.3).summary["kept"] == 1400  # delta=None: never
    assert run_policy("random", make_input(epoch=3), r=0.3, prune_epochs=3).summary["phase"] == "anneal"


def test_static_is_one_subset_for_the_run():
    first = run_policy("static", make_input(epoch=0), r=0.3)
    u0 = uniforms(make_input().uid, 0, 0, 5)
    assert np.array_equal(first.keep, u0 <= np.sort(u0)[1399])
    for e in (1, 5, 9):
        res = run_policy("static", make_input(epoch=e), r=0.3)
        assert np.array_equal(res.keep, first.keep)
        assert res.summary["absent_rule"] == {"kind": "bernoulli", "fraction": 0.7, "stream": 5, "epoch": 0}
    mode = run_policy("random", make_input(epoch=4), r=0.3, mode="static")
    assert np.array_equal(mode.keep, first.keep)


def test_random_and_static_read_only_the_uid():
    for name, params in (("random", RandomParams()), ("random", RandomParams(delta=0.5)), ("static", StaticParams())):
        spec = get_policy(name)
        assert set(spec.columns(params)) == {"uid"}
        assert spec.table_columns(params) == ["uid", "last_loss", "seen"]  # the plan's own columns
        assert spec.settings == () and spec.run_settings(params) == {}


@pytest.mark.parametrize(
    ("cls", "params", "message"),
    [
        (RandomParams, {"r": 1.0}, r"random: r=1.0 is outside the valid range 0 <= r < 1"),
        (RandomParams, {"r": -0.1}, r"random: r=-0.1 is outside the valid range"),
        (RandomParams, {"mode": "x"}, r"random: mode='x', expected 'dynamic' or 'static'"),
        (RandomParams, {"delta": 1.2}, r"random: delta=1.2 is outside the valid range 0 <= delta <= 1"),
        (RandomParams, {"mode": "static", "delta": 0.5}, r"random: delta applies to mode='dynamic' only"),
        (RandomParams, {"prune_epochs": -1}, r"random: prune_epochs=-1 must be >= 0"),
        (StaticParams, {"r": 1.5}, r"static: r=1.5 is outside the valid range 0 <= r < 1"),
    ],
)
def test_parameters_out_of_range_are_rejected(cls, params, message):
    with pytest.raises(ValueError, match=message):
        cls(**params)
