"""Per-sample draws and selection primitives (docs/algorithms.md §0.3, §0.4): the uniforms, the
rounding of counts and epoch boundaries, uniform and weighted subsets, the m smallest keys."""

from __future__ import annotations

import numpy as np
import pytest
from policy_helpers import successive_inclusion

from seta_stream.ids import mix64
from seta_stream.policies.random_draws import (
    keep_count,
    kth_smallest,
    prune_epochs,
    salt,
    smallest_indices,
    smallest_mask,
    uniform_of,
    uniform_subset,
    uniforms,
    weighted_subset,
)


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


def test_uniforms_match_the_scalar_definition_and_are_in_range():
    uid = np.array([0, 1, 2**64 - 1, 123456789], dtype=np.uint64)
    u = uniforms(uid, 42, 3, 1)
    assert u.tolist() == [uniform_of(int(x), 42, 3, 1) for x in uid]
    assert np.all((u >= 0) & (u < 1))
    assert salt(42, 3, 1) != salt(42, 3, 2) != salt(42, 4, 1)


def test_uniforms_are_blockwise_consistent_and_uniform():
    uid = np.arange(3_000_000, dtype=np.uint64)  # crosses block boundaries (2^16 and 2^20 rows alike)
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


def test_smallest_indices_are_the_m_smallest_keys_with_two_tie_breakers():
    keys = np.array([3.0, 1.0, 2.0, 1.0, 2.0, 2.0])
    tie1 = np.array([0, 5, 1, 4, 1, 0], dtype=np.float64)
    tie2 = np.array([0, 0, 9, 0, 8, 0], dtype=np.uint64)
    # ascending (key, tie1, tie2): 3(1.0, 4) 1(1.0, 5) 5(2.0, 0) 4(2.0, 1, 8) 2(2.0, 1, 9) 0
    assert sorted(smallest_indices(keys, tie1, tie2, 4).tolist()) == [1, 3, 4, 5]
    assert sorted(smallest_indices(keys, tie1, None, 3).tolist()) == [1, 3, 5]
    assert smallest_indices(keys, tie1, tie2, 0).tolist() == []
    assert smallest_indices(keys, tie1, tie2, 9).tolist() == [0, 1, 2, 3, 4, 5]
    mask = smallest_mask(keys, 4, tie1, tie2)  # the O(N) version agrees
    assert np.flatnonzero(mask).tolist() == [1, 3, 4, 5]


def test_weighted_subset_inclusion_follows_successive_sampling():
    w = np.array([1.0, 2.0, 3.0, 4.0, 0.0])
    exact = successive_inclusion(w[:4], 2)
    # the same probabilities written out for N=4, m=2: P(i) = sum_j w_i/W w_j/(W - w_i) + w_j/W w_i/(W - w_j)
    tot = w.sum()
    by_hand = np.zeros(4)
    for i in range(4):
        for j in range(4):
            if i != j:
                p = w[i] / tot * w[j] / (tot - w[i])
                by_hand[i] += p
                by_hand[j] += p
    assert np.allclose(exact, by_hand)
    hits = np.zeros(5)
    trials = 20000
    uid = np.arange(5, dtype=np.uint64)
    for t in range(trials):
        hits += weighted_subset(np.ones(5, bool), w, 2, uniforms(uid, t, 0, 4), uid)
    # 4 standard errors of a binomial proportion at 20,000 trials is < 0.014; zero weight never
    # drawn while enough positive weights remain
    assert np.allclose(hits[:4] / trials, exact, atol=0.014) and hits[4] == 0
    # zero weights fill the rest in u order
    u = uniforms(uid, 0, 0, 4)
    full = weighted_subset(np.ones(5, bool), np.array([1.0, 0, 0, 0, 0]), 3, u, uid)
    assert full[0] and full.sum() == 3
    assert np.array_equal(np.flatnonzero(full)[1:], np.sort(np.argsort(u[1:])[:2] + 1))
    with pytest.raises(ValueError, match="weights must be finite and >= 0"):
        weighted_subset(np.ones(5, bool), -w, 2, u, uid)
