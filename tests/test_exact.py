"""Exact mergeable kernels: ExactSums against math.fsum and an integer reference for every split
and merge order; RankSelect against np.sort (the m smallest rows built on it: tests/test_steps.py);
Distinct against np.unique; float keys' order; error messages."""

from __future__ import annotations

import math
import pickle
import random
import re
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from seta_stream._kernels import exact as _exact
from seta_stream._kernels.exact import (
    Distinct,
    ExactSums,
    RankCounts,
    RankSelect,
    digit_histogram,
    exact_sum,
    float_keys,
    key_values,
)
from seta_stream.errors import InvalidInputError

FAST = settings(max_examples=200, deadline=None, database=None)
MAX = float(np.finfo(np.float64).max)
TINY = 5e-324  # smallest subnormal
MIN_NORMAL = 2.2250738585072014e-308
SPECIAL = [
    0.0, -0.0, 1.0, -1.0, 0.1, -0.1, 3.0, 2.0**-53, 1 + 2.0**-52, 2.0**53, 1e16, -1e16, 1e-16,
    TINY, -TINY, 3 * TINY, MIN_NORMAL, -MIN_NORMAL, MIN_NORMAL - TINY, 1e-300, 1e300, -1e300, 1.5e300,
]  # fmt: skip


def bits(a) -> np.ndarray:
    return np.asarray(a, dtype=np.float64).view(np.int64)


def same_bits(a, b) -> bool:
    return np.array_equal(bits(a), bits(b))


def reference_sum(values) -> float:
    """Exact sum (every float64 is an integer multiple of 2**-1074), then int / int: correctly rounded.
    Raises OverflowError beyond the float64 range."""
    k = 0
    for x in values:
        n, d = float(x).as_integer_ratio()
        k += n * ((1 << 1074) // d)
    return k / (1 << 1074)


floats = st.one_of(
    st.sampled_from(SPECIAL),
    st.floats(min_value=-1e300, max_value=1e300, allow_nan=False),
    st.floats(min_value=-1e-300, max_value=1e-300, allow_nan=False),  # tiny and subnormal
    st.integers(-20, 20).map(float),  # ties and cancellation
)


@st.composite
def columns(draw, elements=floats, max_size=50) -> np.ndarray:
    vals = draw(st.lists(elements, max_size=max_size))
    if vals and draw(st.booleans()):  # exact cancellation, in another order
        vals = vals + [-v for v in draw(st.permutations(vals))]
    return np.array(vals, dtype=np.float64)


def split_points(data, n: int) -> list[int]:
    return sorted(data.draw(st.lists(st.integers(0, n), max_size=7)))


def random_merge(states: list, rnd: random.Random):
    """Merge in a random tree shape and random left/right order."""
    states = list(states)
    while len(states) > 1:
        a = states.pop(rnd.randrange(len(states)))
        b = states.pop(rnd.randrange(len(states)))
        states.append(a.merge(b))
    return states[0]


# ---------------------------------------------------------------------------------------------
# ExactSums
# ---------------------------------------------------------------------------------------------


@FAST
@given(st.data())
def test_exact_sums_equal_fsum_per_group_for_every_split_and_merge_order(data):
    v = data.draw(columns())
    n_groups = data.draw(st.integers(1, 4))
    g = np.array(data.draw(st.lists(st.integers(0, n_groups - 1), min_size=len(v), max_size=len(v))), np.int64)
    whole = ExactSums.of(v, g, n_groups)
    expected = [math.fsum(v[g == i]) for i in range(n_groups)]
    assert same_bits(whole.to_float(), expected)

    order = np.array(data.draw(st.permutations(range(len(v)))), np.int64)
    cuts = split_points(data, len(v))
    parts = [ExactSums.of(pv, pg, n_groups) for pv, pg in zip(np.split(v[order], cuts), np.split(g[order], cuts))]
    merged = random_merge(parts, data.draw(st.randoms(use_true_random=False)))
    assert merged == whole
    assert pickle.dumps(merged) == pickle.dumps(whole)  # canonical state: bit-identical pickles
    assert same_bits(merged.to_float(), expected)


@FAST
@given(st.data())
def test_exact_sums_over_the_whole_float64_range_match_exact_rounding(data):
    v = data.draw(columns(st.floats(allow_nan=False, allow_infinity=False), max_size=20))
    cuts = split_points(data, len(v))
    merged = random_merge([ExactSums.of(p) for p in np.split(v, cuts)], data.draw(st.randoms(use_true_random=False)))
    assert merged == ExactSums.of(v)
    try:
        expected = reference_sum(v)
    except OverflowError:
        with pytest.raises(InvalidInputError, match="beyond the float64 range"):
            merged.to_float()
        return
    assert same_bits(merged.to_float(), [expected])
    try:
        assert same_bits([math.fsum(v)], [expected])  # fsum too, where its partials do not overflow
    except OverflowError:
        pass


@FAST
@given(columns(st.floats(width=32, allow_nan=False, allow_infinity=False)))
def test_float32_values_are_converted_exactly(v):
    v32 = v.astype(np.float32)
    assert same_bits([exact_sum(v32)], [math.fsum(v32.astype(np.float64))])


@pytest.mark.parametrize(
    "values, expected",
    [
        ([], 0.0),
        ([-0.0], 0.0),  # fsum([-0.0]) is +0.0: an exactly zero sum is +0.0
        ([-0.0, -0.0, -0.0], 0.0),
        ([1.0, -1.0], 0.0),
        ([-TINY, TINY], 0.0),
        ([-TINY], -TINY),
        ([TINY, TINY, TINY], 3 * TINY),
        ([MIN_NORMAL, -TINY], MIN_NORMAL - TINY),  # largest subnormal
        ([1.0, 2.0**-53], 1.0),  # a tie: rounds to the even neighbour
        ([1 + 2.0**-52, 2.0**-53], 1 + 2.0**-51),  # a tie: rounds up to the even neighbour
        ([1.0, 2.0**-53, TINY], 1 + 2.0**-52),  # just above the tie
        ([1.0, 2.0**-53, -TINY], 1.0),
        ([1e16, 1.0, 1e-16], 1e16 + 2.0),
        ([2.0**1000, -(2.0**1000), 1e-300, TINY], 1e-300),
        ([MAX, 2.0**969], MAX),
        ([MAX, -MAX, MAX], MAX),
    ],
)
def test_exact_sums_fixed_cases(values, expected):
    got = exact_sum(np.array(values, dtype=np.float64))
    assert same_bits([got], [expected])
    assert same_bits([got], [math.fsum(values)])


def test_sums_beyond_float64_range_raise_where_fsum_overflows_midway_we_do_not():
    with pytest.raises(InvalidInputError, match=re.escape("the exact sum of group 0 is beyond the float64 range")):
        exact_sum(np.array([MAX, 2.0**970]))  # a tie between MAX and 2**1024: rounds to even = overflow
    with pytest.raises(InvalidInputError, match=re.escape("group 1 is beyond")):
        ExactSums.of(np.array([1.0, -MAX, -MAX]), np.array([0, 1, 1]), 2).to_float()
    with pytest.raises(OverflowError):
        math.fsum([1.7e308, 1.7e308, -1.7e308])
    assert exact_sum(np.array([1.7e308, 1.7e308, -1.7e308])) == 1.7e308


def test_many_values_per_cell_across_chunk_boundaries_stay_exact():
    rng = np.random.default_rng(0)
    n = 3 * _exact._CHUNK_MAX + 17  # several chunks, odd tail
    g = rng.integers(0, 3, n)
    e = np.where(g == 0, 40, rng.integers(-40, 41, n))  # group 0: every value in the same cells
    sign = np.where(g == 0, 1, rng.choice([1, 1, -1], n))
    top = np.nextafter(2.0, 0.0)  # (2**53 - 1) * 2**-52: all mantissa bits set, the largest limbs
    v = sign * np.ldexp(top, e)
    got = ExactSums.of(v, g, 3).to_float()
    for i in range(3):  # exact: top * sum(sign * 2**e), the integer sum counted per exponent
        per_e = np.zeros(81, np.int64)
        np.add.at(per_e, e[g == i] + 40, sign[g == i])
        k = sum(int(c) << j for j, c in enumerate(per_e))
        assert same_bits([got[i]], [((1 << 53) - 1) * k / (1 << 92)])
        assert same_bits([got[i]], [math.fsum(v[g == i])])


def test_chunks_spanning_different_exponent_ranges():
    rng = np.random.default_rng(6)
    n = 5 * _exact._CHUNK + 3
    v = 10.0 ** np.linspace(-310, 300, n) * rng.choice([-1.0, 1.0], n)  # each chunk its own binades
    g = (np.arange(n) % 2).astype(np.int64)
    for order in (np.arange(n), np.arange(n)[::-1], rng.permutation(n)):
        s = ExactSums.of(v[order], g[order], 2)
        assert same_bits(s.to_float(), [math.fsum(v[g == i]) for i in range(2)])
        assert s == ExactSums.of(v, g, 2)


def test_65536_groups_match_fsum_and_the_state_stays_small():
    rng = np.random.default_rng(1)
    n, n_groups = 1_000_000, 65_536
    v = rng.lognormal(0.0, 2.0, n)
    g = rng.integers(0, n_groups, n)
    s = ExactSums.of(v, g, n_groups)
    order = np.argsort(g, kind="stable")
    per_group = np.split(v[order], np.searchsorted(g[order], np.arange(1, n_groups)))
    assert same_bits(s.to_float(), [math.fsum(p) for p in per_group])
    assert s.nbytes <= 4 * n_groups * 6  # a few 32-bit columns per group: <= 1.5 MB
    assert len(pickle.dumps(s)) < 2_000_000
    half = ExactSums.of(v[: n // 2], g[: n // 2], n_groups).merge(ExactSums.of(v[n // 2 :], g[n // 2 :], n_groups))
    assert half == s


def test_state_size_does_not_grow_with_the_number_of_values():
    rng = np.random.default_rng(2)
    small = ExactSums.of(rng.uniform(1.0, 2.0, 10))
    big = ExactSums.of(rng.uniform(1.0, 2.0, 1_000_000))
    assert small.nbytes <= 16 and big.nbytes <= 16


def test_exact_sums_input_errors():
    with pytest.raises(
        InvalidInputError,
        match=re.escape("ExactSums: found 2 NaN and 1 infinite value(s) (first at index 1); expected finite values"),
    ):
        ExactSums.of(np.array([1.0, np.nan, -np.inf, np.nan]))
    big = np.zeros(3 * _exact._CHUNK + 5)
    big[-2] = np.inf
    with pytest.raises(InvalidInputError, match=re.escape(f"(first at index {len(big) - 2})")):
        exact_sum(big)
    with pytest.raises(InvalidInputError, match=re.escape("found values of dtype int64; expected float64 or float32")):
        ExactSums.of(np.arange(3))
    with pytest.raises(InvalidInputError, match=re.escape("found group id 3 at index 1; expected ids in [0, 3)")):
        ExactSums.of(np.ones(3), np.array([0, 3, 1]), 3)
    with pytest.raises(InvalidInputError, match=re.escape("found groups=None with n_groups=2")):
        ExactSums.of(np.ones(3), None, 2)
    with pytest.raises(InvalidInputError, match=re.escape("found n_groups=0; expected an int >= 1")):
        ExactSums.of(np.ones(3), np.zeros(3, np.int64), 0)
    with pytest.raises(InvalidInputError, match=re.escape("found states with 1 and 2 groups")):
        ExactSums.of(np.ones(3)).merge(ExactSums.of(np.ones(3), np.zeros(3, np.int64), 2))


# ---------------------------------------------------------------------------------------------
# float keys
# ---------------------------------------------------------------------------------------------


@FAST
@given(st.data())
def test_float_keys_preserve_order_and_invert(data):
    width = data.draw(st.sampled_from([32, 64]))
    dtype = np.float32 if width == 32 else np.float64
    v = np.array(data.draw(st.lists(st.floats(width=width, allow_nan=False) | st.sampled_from([0.0, -0.0]))), dtype)
    k = float_keys(v)
    assert k.dtype == (np.uint32 if width == 32 else np.uint64)
    assert np.array_equal(k[:, None] < k[None, :], v[:, None] < v[None, :])
    assert np.array_equal(k[:, None] == k[None, :], v[:, None] == v[None, :])
    back = key_values(k, dtype)
    assert back.dtype == dtype and np.array_equal(back, v) and not np.signbit(back[v == 0]).any()


def test_float_keys_errors():
    with pytest.raises(
        InvalidInputError,
        match=re.escape(
            "float_keys: found 2 NaN value(s) (first at index 1); expected no NaN (NaN has no place in the order)"
        ),
    ):
        float_keys(np.array([0.0, np.nan, np.nan], np.float32))
    with pytest.raises(InvalidInputError, match=re.escape("found dtype int64; expected float32 or float64")):
        float_keys(np.arange(3))
    with pytest.raises(InvalidInputError, match=re.escape("found keys of dtype uint32; expected uint64 for float64")):
        key_values(np.zeros(2, np.uint32), np.float64)


def whole_array_keys(v: np.ndarray) -> np.ndarray:
    """float_keys' definition as one whole-array expression (what the block loop must equal)."""
    ut = np.uint32 if v.dtype == np.float32 else np.uint64
    sign = ut(1 << (8 * v.itemsize - 1))
    b = (v + v.dtype.type(0.0)).view(ut)
    return np.where(b >= sign, ~b, b | sign)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_float_keys_over_several_blocks_equal_the_whole_array_expression(dtype):
    rng = np.random.default_rng(5)
    n = 2 * _exact._KEY_BLOCK + 12_345  # two whole blocks and a tail
    v = (rng.standard_normal(n) * 1e3).astype(dtype)
    special = [-0.0, 0.0, np.inf, -np.inf, np.finfo(dtype).smallest_subnormal, -np.finfo(dtype).max]
    for start in (0, _exact._KEY_BLOCK - 3, n - len(special)):  # in the first block, across a boundary, the tail
        v[start : start + len(special)] = special
    k = float_keys(v)
    assert k.dtype == (np.uint32 if dtype == np.float32 else np.uint64) and k.shape == (n,)
    assert np.array_equal(k, whole_array_keys(v))
    assert np.array_equal(float_keys(v[::-1]), whole_array_keys(v[::-1].copy()))  # a strided view
    two_d = v[: 2 * 1000].reshape(2, 1000)
    assert np.array_equal(float_keys(two_d), whole_array_keys(two_d))


def test_float_keys_report_every_nan_when_one_is_in_a_later_block():
    v = np.zeros(3 * _exact._KEY_BLOCK, np.float32)
    v[[2 * _exact._KEY_BLOCK + 7, 2 * _exact._KEY_BLOCK + 9]] = np.nan
    want = f"float_keys: found 2 NaN value(s) (first at index {2 * _exact._KEY_BLOCK + 7}); expected no NaN"
    with pytest.raises(InvalidInputError, match=re.escape(want)):
        float_keys(v)


@pytest.mark.parametrize("dtype", [np.uint32, np.uint64])
def test_digit_histogram_counts_each_digit_of_every_key(dtype):
    rng = np.random.default_rng(6)
    bits = 8 * np.dtype(dtype).itemsize
    keys = rng.integers(0, 2**bits, 3 * _exact._COUNT_BLOCK + 77, dtype=np.uint64).astype(dtype)
    keys[:1000] = keys[5000]  # one digit many times
    for shift in (bits - 16, 8, 0):
        want = np.bincount(
            ((keys.astype(np.uint64) >> np.uint64(shift)) & np.uint64(0xFFFF)).astype(np.int64), minlength=1 << 16
        )
        got = digit_histogram(keys, shift)
        assert got.dtype == np.int64 and np.array_equal(got, want) and got.sum() == len(keys)


# ---------------------------------------------------------------------------------------------
# RankSelect
# ---------------------------------------------------------------------------------------------


def select(pieces, ranks, bits: int = 32) -> RankSelect:
    total = sum(len(p) for p in pieces)
    sel = RankSelect(ranks, total, bits)
    rounds = 0
    while not sel.done:
        sel.advance([sel.count(p) for p in pieces])
        rounds += 1
    assert rounds == (bits // 16 if len(ranks) else 0)
    return sel


def check_select(keys: np.ndarray, pieces, ranks, bits: int) -> None:
    sel = select(pieces, ranks, bits)
    srt = np.sort(keys)
    want = srt[np.asarray(ranks, np.int64)]
    assert sel.values().dtype == keys.dtype and np.array_equal(sel.values(), want)
    assert np.array_equal(sel.below(), np.searchsorted(srt, want, "left"))
    assert np.array_equal(sel.equal(), np.searchsorted(srt, want, "right") - np.searchsorted(srt, want, "left"))


SHAPES = ["full", "small", "shifted", "one_bin"]


def shaped(raw: list[int], shape: str, bits: int) -> np.ndarray:
    dt = np.uint32 if bits == 32 else np.uint64
    x = np.array(raw, dtype=np.uint64)
    if shape == "small":  # many ties, every key in the lowest top-16-bit bins
        x %= np.uint64(5)
    elif shape == "shifted":  # top bits collide: x << 40 (64-bit) / x << 8 (32-bit), few distinct
        x = (x % np.uint64(50)) << np.uint64(bits - 24)
    elif shape == "one_bin":  # every key in one top-16-bit bin
        x = (np.uint64(0xABCD) << np.uint64(bits - 16)) | (x % np.uint64(1000))
    return (x & np.uint64((1 << bits) - 1)).astype(dt)


@settings(max_examples=250, deadline=None, database=None)
@given(st.data())
def test_rank_select_matches_sorting(data):
    bits = data.draw(st.sampled_from([32, 64]))
    shape = data.draw(st.sampled_from(SHAPES))
    keys = shaped(data.draw(st.lists(st.integers(0, 2**64 - 1), min_size=1, max_size=300)), shape, bits)
    n = len(keys)
    ranks = data.draw(st.lists(st.integers(0, n - 1), max_size=12)) + [0, n - 1]
    ranks += data.draw(st.lists(st.sampled_from(ranks), max_size=3))  # duplicated ranks
    ranks = data.draw(st.permutations(ranks))
    check_select(keys, np.split(keys, split_points(data, n)), ranks, bits)


@FAST
@given(st.data())
def test_rank_select_over_float_keys(data):
    width = data.draw(st.sampled_from([32, 64]))
    dtype = np.float32 if width == 32 else np.float64
    elems = st.floats(width=width, allow_nan=False) | st.sampled_from([0.0, -0.0, 1.0, -1.0])
    v = np.array(data.draw(st.lists(elems, min_size=1, max_size=200)), dtype)
    ranks = data.draw(st.lists(st.integers(0, len(v) - 1), min_size=1, max_size=10))
    pieces = [float_keys(p) for p in np.split(v, split_points(data, len(v)))]
    got = key_values(select(pieces, ranks, width).values(), dtype)
    assert np.array_equal(got, np.sort(v)[ranks]) and not np.signbit(got[got == 0]).any()


def test_65535_ranks_over_a_million_keys():
    rng = np.random.default_rng(3)
    keys = rng.integers(0, 2**32, 1_000_000, dtype=np.uint32)
    keys[:200_000] = keys[200_000:400_000]  # duplicates
    ranks = np.concatenate([[0, len(keys) - 1], rng.integers(0, len(keys), 65_533)])
    pieces = np.array_split(keys, 5) + [keys[:0]]
    check_select(keys, pieces, ranks, 32)


@pytest.mark.parametrize("shape", ["small", "shifted", "one_bin", "full"])
def test_uint64_keys_with_colliding_top_bits(shape):
    rng = np.random.default_rng(4)
    keys = shaped(rng.integers(0, 2**63, 20_000).tolist(), shape, 64)
    ranks = np.concatenate([[0, len(keys) - 1], rng.integers(0, len(keys), 300)])
    check_select(keys, np.array_split(keys, 3), ranks, 64)


def test_rank_select_trivial_and_picklable():
    sel = RankSelect([], 0, 64)
    assert sel.done and len(sel.values()) == 0 and sel.values().dtype == np.uint64
    keys = np.array([5, 1, 9, 1], np.uint32)
    sel = RankSelect(np.array([3, 0]), 4)
    worker = pickle.loads(pickle.dumps(sel))  # a Ray task gets a copy of the state
    counts = pickle.loads(pickle.dumps(worker.count(keys)))
    assert isinstance(counts, RankCounts) and len(counts.codes) <= len(keys)
    sel.advance([counts, worker.count(keys[:0])])
    sel.advance([pickle.loads(pickle.dumps(sel)).count(keys)])
    assert sel.values().tolist() == [9, 1] and sel.below().tolist() == [3, 0] and sel.equal().tolist() == [1, 2]


def test_rank_select_errors():
    def raises(text, fn, *args):
        with pytest.raises(InvalidInputError, match=re.escape(text)):
            fn(*args)

    raises("RankSelect: found rank 10 (at position 1); expected 0 <= rank < total = 10", RankSelect, [0, 10], 10)
    raises("RankSelect: found rank -1 (at position 0); expected 0 <= rank < total = 5", RankSelect, [-1], 5)
    raises("found rank 0 (at position 0); expected 0 <= rank < total = 0", RankSelect, [0], 0)
    raises("RankSelect: found key_bits=16; expected 32 or 64", RankSelect, [0], 3, 16)
    raises("RankSelect: found total=-1; expected an int >= 0", RankSelect, [], -1)
    raises("expected 1-D ints", RankSelect, [0.5], 3)
    sel = RankSelect([1], 3)
    raises("found keys of dtype int64 and shape (3,); expected a 1-D array of uint32", sel.count, np.arange(3))
    raises(
        "found keys of dtype uint64 and shape (3,); expected a 1-D array of uint32",
        sel.count,
        np.arange(3, dtype=np.uint64),
    )
    keys = np.array([1, 2, 3], np.uint32)
    raises("pass 0 counted 2 keys under an open prefix, expected 3", sel.advance, [sel.count(keys[:2])])
    raises("found pass 0 of 2; expected the selection done", sel.values)
    stale = sel.count(keys)
    sel.advance([stale])
    raises("RankSelect.advance: piece 0 was counted for pass 0; expected pass 1", sel.advance, [stale])
    sel.advance([sel.count(keys)])
    raises("RankSelect.count: found the selection done", sel.count, keys)


# ---------------------------------------------------------------------------------------------
# Distinct
# ---------------------------------------------------------------------------------------------


@FAST
@given(st.data())
def test_distinct_merges_to_unique_or_overflow(data):
    keys = np.array(data.draw(st.lists(st.integers(0, 12), max_size=80)), np.uint32)
    cap = data.draw(st.integers(0, 14))
    parts = [Distinct.of(p, cap) for p in np.split(keys, split_points(data, len(keys)))]
    merged = random_merge(parts, data.draw(st.randoms(use_true_random=False)))
    values, counts = np.unique(keys, return_counts=True)
    assert merged.overflow == (len(values) > cap)
    if not merged.overflow:
        assert np.array_equal(merged.values, values) and np.array_equal(merged.counts, counts)
        assert merged.values.dtype == np.uint32 and merged.counts.dtype == np.int64
    else:
        assert len(merged.values) == 0 and len(merged.counts) == 0


def test_distinct_errors():
    a = Distinct.of(np.array([1, 2], np.uint32), 3)
    with pytest.raises(
        InvalidInputError,
        match=re.escape("Distinct.merge: found cap=4, dtype uint32; expected a Distinct with cap=3 and dtype uint32"),
    ):
        a.merge(Distinct.of(np.array([1], np.uint32), 4))
    with pytest.raises(InvalidInputError, match=re.escape("found cap=3, dtype int64")):
        a.merge(Distinct.of(np.array([1], np.int64), 3))
    with pytest.raises(InvalidInputError, match=re.escape("Distinct.of: found keys of dtype float64 and shape (2,)")):
        Distinct.of(np.array([1.0, 2.0]), 3)
    with pytest.raises(InvalidInputError, match=re.escape("Distinct.of: found cap=-1; expected an int >= 0")):
        Distinct.of(np.array([1], np.uint32), -1)


def test_fraction_reference_agrees_with_itself():
    """The integer reference used above is exact: cross-check it with Fraction on awkward values."""
    vals = [MAX, -MAX, 1e-300, TINY, 0.1, -0.3]
    assert reference_sum(vals) == float(sum(Fraction(x) for x in vals))
