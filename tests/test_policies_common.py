"""Shared policy machinery: per-sample draws (algorithms.md §0.3, §0.4), the registry and
``finalize`` (empty-plan guard, common summary, §0.7), and properties every policy keeps."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from policy_helpers import successive_inclusion

from seta_stream.ids import mix64
from seta_stream.policies import (
    POLICIES,
    PolicyInput,
    describe_policies,
    finalize,
    get_policy,
    run_policy,
)
from seta_stream.policies.random_draws import (
    STREAM_GUARD,
    keep_count,
    kth_smallest,
    prune_epochs,
    salt,
    smallest_mask,
    uniform_of,
    uniform_subset,
    uniforms,
    weighted_subset,
)


def lognormal_input(n=2000, epoch=2, epochs=10, seed=0, rs=0, unseen=0):
    rng = np.random.default_rng(rs)
    uid = rng.integers(0, 2**64 - 1, n, dtype=np.uint64, endpoint=True)
    loss = rng.lognormal(size=n).astype(np.float32)
    loss[:unseen] = np.nan
    return PolicyInput.from_losses(uid, loss, epoch=epoch, epochs=epochs, seed=seed)


def permuted(inp: PolicyInput, perm: np.ndarray) -> PolicyInput:
    return PolicyInput(
        inp.uid[perm], inp.last_loss[perm], inp.ema[perm], inp.seen[perm], inp.last_epoch[perm],
        inp.epoch, inp.epochs, inp.seed, inp.n_ref,
    )  # fmt: skip


# ---------------------------------------------------------------- §0.4 uniforms
def test_salt_and_uniforms_follow_the_formula():
    mask = (1 << 64) - 1
    assert salt(7, 3, 2) == mix64(mix64(mix64(7) ^ 3) ^ 2)
    uid = np.array([0, 1, 2**64 - 1, 0x123456789ABCDEF], dtype=np.uint64)
    u = uniforms(uid, 7, 3, 2)
    s = salt(7, 3, 2)
    assert u.tolist() == [(mix64(int(x) ^ s) >> 11) * 2.0**-53 for x in uid]
    assert u.tolist() == [uniform_of(int(x), 7, 3, 2) for x in uid]
    assert u.dtype == np.float64 and np.all((u >= 0) & (u < 1))
    assert salt(2**64 + 5, 0, 1) == salt(5 & mask, 0, 1)  # seeds wrap to uint64
    assert len({salt(1, e, st_) for e in range(4) for st_ in range(1, 8)}) == 28


def test_uniforms_are_blockwise_consistent_and_uniform():
    uid = np.arange(3_000_000, dtype=np.uint64)  # crosses the 2^20 block boundary
    u = uniforms(uid, 1, 0, 1)
    assert np.array_equal(u[1_048_570:1_048_580], uniforms(uid[1_048_570:1_048_580], 1, 0, 1))
    hist = np.bincount((u * 10).astype(int), minlength=10) / len(u)
    assert np.allclose(hist, 0.1, atol=0.002)


# ---------------------------------------------------------------- §0.3 rounding
def test_counts_and_epoch_boundaries_use_floor_with_epsilon():
    assert keep_count(0.29, 100) == 29  # 0.29 * 100 = 28.999999999999996
    assert keep_count(0.7, 10) == 7 and keep_count(0.5, 3) == 1 and keep_count(1.0, 0) == 0
    assert prune_epochs(0.29, 100) == 29  # the references give 28 here (float noise)
    assert prune_epochs(0.875, 10) == 8 and prune_epochs(0.875, 200) == 175 and prune_epochs(0.875, 300) == 262
    assert prune_epochs(0.875, 10, override=5) == 5 and prune_epochs(1.0, 7) == 7 and prune_epochs(0.0, 7) == 0


# ---------------------------------------------------------------- selection primitives
def test_uniform_subset_is_the_m_smallest_accepts_indices_and_is_row_order_free():
    rng = np.random.default_rng(1)
    uid = rng.integers(0, 2**63, 1000, dtype=np.uint64)
    u = uniforms(uid, 7, 0, 1)
    mask = uniform_subset(np.ones(1000, bool), 300, u, uid)
    assert mask.sum() == 300 and u[mask].max() < u[~mask].min()
    perm = rng.permutation(1000)
    mask_p = uniform_subset(np.ones(1000, bool), 300, u[perm], uid[perm])
    assert set(uid[perm][mask_p]) == set(uid[mask])
    cand = np.arange(0, 1000, 3)
    by_idx = uniform_subset(cand, 50, u, uid)
    by_mask = uniform_subset(np.isin(np.arange(1000), cand), 50, u, uid)
    assert np.array_equal(by_idx, by_mask) and by_idx.sum() == 50 and set(np.flatnonzero(by_idx)) <= set(cand)
    assert uniform_subset(cand, 10_000, u, uid).sum() == len(cand)  # m > |S|: all of S
    assert uniform_subset(cand, 0, u, uid).sum() == 0


def test_uniform_subset_breaks_ties_by_uid():
    uid = np.array([5, 3, 9, 1], dtype=np.uint64)
    u = np.array([0.5, 0.5, 0.1, 0.5])
    assert uniform_subset(np.ones(4, bool), 2, u, uid).tolist() == [False, False, True, True]


@pytest.mark.parametrize("layout", ["random", "sorted", "reversed", "ties", "periodic"])
def test_smallest_mask_matches_a_full_sort_at_scale(layout):
    n = 400_000  # above the sampled-bracket threshold
    rng = np.random.default_rng(5)
    keys = rng.random(n)
    if layout == "sorted":
        keys.sort()
    elif layout == "reversed":
        keys = np.sort(keys)[::-1].copy()
    elif layout == "ties":
        keys = rng.integers(0, 7, n).astype(np.float32)
    elif layout == "periodic":  # adversarial for a strided sample
        keys = np.tile(np.arange(n // 65_536 + 1, dtype=np.float64), 65_536)[:n] + rng.random(n) * 1e-3
    tie = rng.permutation(n).astype(np.uint64)
    for m in (1, 1234, n // 2, n - 3):
        mask = smallest_mask(keys, m, tie)
        expected = np.zeros(n, bool)
        expected[np.lexsort((tie, keys))[:m]] = True
        assert np.array_equal(mask, expected), (layout, m)
    r = 98_765
    assert kth_smallest(keys, r) == np.sort(keys)[r]


def test_weighted_subset_inclusion_follows_successive_sampling():
    w = np.array([1.0, 2.0, 3.0, 4.0, 0.0])
    exact = successive_inclusion(w[:4], 2)
    hits = np.zeros(5)
    trials = 8000
    uid = np.arange(5, dtype=np.uint64)
    for t in range(trials):
        hits += weighted_subset(np.ones(5, bool), w, 2, uniforms(uid, t, 0, 4), uid)
    # 4 standard errors of a proportion at 8,000 trials < 0.023; zero weight never drawn while
    # enough positive weights remain
    assert np.allclose(hits[:4] / trials, exact, atol=0.023) and hits[4] == 0
    # zero weights fill the rest in u order
    u = uniforms(uid, 0, 0, 4)
    full = weighted_subset(np.ones(5, bool), np.array([1.0, 0, 0, 0, 0]), 3, u, uid)
    assert full[0] and full.sum() == 3
    assert np.array_equal(np.flatnonzero(full)[1:], np.sort(np.argsort(u[1:])[:2] + 1))
    with pytest.raises(ValueError, match="weights must be finite and >= 0"):
        weighted_subset(np.ones(5, bool), -w, 2, u, uid)


# ---------------------------------------------------------------- registry
def test_registry_names_and_errors():
    assert {"full", "random", "static", "seta", "infobatch", "es", "eswp"} <= set(POLICIES)
    with pytest.raises(ValueError, match=r"unknown policy 'nope'; valid policies: es, eswp, full, infobatch"):
        get_policy("nope")
    with pytest.raises(ValueError, match=r"seta: unknown parameter\(s\) \['bogus'\]"):
        run_policy("seta", lognormal_input(n=10), bogus=1)


def test_describe_policies_lists_parameters_with_defaults():
    entries = {d["name"]: d for d in describe_policies()}
    assert set(entries) == set(POLICIES)
    assert all(d["description"] for d in entries.values())
    defaults = {p["name"]: p["default"] for p in entries["seta"]["params"]}
    assert defaults["k"] == 10 and defaults["alpha"] == 0.5 and defaults["target_keep"] is None
    assert {p["name"]: p["default"] for p in entries["eswp"]["params"]}["beta2"] == 0.8
    json.dumps(describe_policies())


# ---------------------------------------------------------------- finalize (§0.7)
COMMON = (
    "policy", "params", "epoch", "epochs", "phase", "n", "kept", "pruned_fraction", "unseen",
    "nonfinite", "weight_histogram", "empty_plan_guard", "absent_rule", "kept_by_reason",
)  # fmt: skip


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_every_policy_summary_has_the_common_fields_and_is_json(name):
    inp = lognormal_input(n=500, epoch=3, epochs=20, unseen=20)
    res = run_policy(name, inp)
    s = res.summary
    for field in COMMON:
        assert field in s, field
    assert s["policy"] == name and s["n"] == 500 and s["kept"] == int(res.keep.sum())
    assert s["unseen"] == 20 and s["nonfinite"] == 0
    assert s["pruned_fraction"] == pytest.approx(1 - s["kept"] / 500)
    assert sum(s["weight_histogram"].values()) == s["kept"]
    assert s["phase"] in ("warmup", "prune", "anneal")
    assert np.all(res.weight[~res.keep] == 0.0) and res.weight.dtype == np.float32
    assert json.loads(json.dumps(s, allow_nan=False)) == s


def test_empty_plan_guard_keeps_the_smallest_u_of_stream_7():
    inp = lognormal_input(n=5, epoch=2)
    res = get_policy("random").fn(inp, get_policy("random").make_params(r=0.3))
    res.keep[:] = False
    out = finalize(res, inp, "random", get_policy("random").make_params(r=0.3))
    u = uniforms(inp.uid, inp.seed, inp.epoch, STREAM_GUARD)
    assert out.keep.sum() == 1 and out.keep[np.argmin(u)] and out.weight[np.argmin(u)] == 1.0
    assert out.summary["empty_plan_guard"] is True and out.summary["kept_by_reason"] == {"empty_plan_guard": 1}
    one = PolicyInput.from_losses(np.array([9], np.uint64), np.array([1.0], np.float32), epoch=1, epochs=10)
    assert run_policy("random", one, r=0.5).summary["empty_plan_guard"] is True  # floor(0.5) = 0 kept
    empty = PolicyInput.from_losses(np.zeros(0, np.uint64), np.zeros(0, np.float32), epoch=1, epochs=10)
    for name in POLICIES:
        s = run_policy(name, empty).summary
        assert s["kept"] == 0 and s["empty_plan_guard"] is False


def test_nonfinite_losses_count_as_unseen_and_nonfinite():
    inp = lognormal_input(n=100)
    loss = inp.last_loss.copy()
    loss[:4] = [np.inf, -np.inf, np.nan, np.nan]
    bad = PolicyInput(inp.uid, loss, inp.ema, inp.seen, inp.last_epoch, 2, 10, 0)  # seen=1 everywhere
    s = run_policy("infobatch", bad).summary
    assert s["nonfinite"] == 4 and s["unseen"] == 4


# ---------------------------------------------------------------- properties of every policy
CASES = [
    ("full", {}),
    ("random", {"r": 0.4}),
    ("random", {"r": 0.4, "delta": 0.5}),
    ("static", {"r": 0.2}),
    ("seta", {"r": 0.1, "k": 5, "alpha": 0.6}),
    ("seta", {"r": 0.2, "k": 4, "alpha": 0.5, "target_keep": 0.5}),
    ("infobatch", {"r": 0.5}),
    ("es", {}),
    ("eswp", {"r": 0.3}),
]


@settings(max_examples=25, deadline=None)
@given(
    st.sampled_from(CASES),
    st.integers(0, 300),
    st.integers(0, 9),
    st.integers(0, 2**64 - 1),
    st.integers(0, 50),
    st.sampled_from(["lognormal", "ties", "equal"]),
)
def test_policy_properties(case, n, epoch, seed, unseen_pct, dist):
    name, params = case
    rng = np.random.default_rng(seed % 997)
    uid = rng.choice(2**62, size=n, replace=False).astype(np.uint64)
    if dist == "lognormal":
        loss = rng.lognormal(size=n).astype(np.float32)
    elif dist == "ties":
        loss = rng.integers(0, 3, n).astype(np.float32)
    else:
        loss = np.full(n, 2.5, np.float32)
    n_unseen = n * unseen_pct // 100
    loss[:n_unseen] = np.nan
    inp = PolicyInput.from_losses(uid, loss, epoch=epoch, epochs=10, seed=seed)
    a = run_policy(name, inp, **params)
    assert 0 <= a.summary["kept"] <= n and (n == 0 or a.summary["kept"] >= 1)
    assert a.keep.dtype == bool and len(a.keep) == n == len(a.weight) == len(a.reason)
    again = run_policy(name, inp, **params)
    assert np.array_equal(a.keep, again.keep) and np.array_equal(a.weight, again.weight)
    perm = rng.permutation(n)
    b = run_policy(name, permuted(inp, perm), **params)
    assert np.array_equal(a.keep[perm], b.keep) and np.array_equal(a.weight[perm], b.weight)
    if name in ("infobatch", "eswp", "es"):  # score-based: unseen samples always kept (§0.5)
        assert a.keep[:n_unseen].all()
