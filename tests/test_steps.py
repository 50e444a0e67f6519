"""The map/reduce protocol's exact cuts: ``smallest`` selects exactly the m smallest (key, tie1,
tie2) rows over any split into buckets (against np.lexsort), with the early gather at a small
prefix and with every radix pass; ``order_statistics`` gives np.sort's values."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import seta_stream._kernels.mapreduce as steps
from seta_stream._kernels.exact import float_keys
from seta_stream._kernels.mapreduce import order_statistics, run_steps, smallest


def split(n: int, buckets: int, rng: np.random.Generator) -> list[np.ndarray]:
    where = rng.integers(0, buckets, size=n)
    order = rng.permutation(n)
    return [order[where[order] == b] for b in range(buckets)]


@pytest.mark.parametrize("gather", [steps.GATHER_KEYS, 0])
@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(0, 400),
    seed=st.integers(0, 2**16),
    buckets=st.integers(1, 6),
    shape=st.sampled_from(["wide", "ties", "top_bits"]),
    two_ties=st.booleans(),
)
def test_smallest_selects_the_m_smallest_rows(gather, n, seed, buckets, shape, two_ties):
    rng = np.random.default_rng(seed)
    keys = {
        "wide": rng.integers(0, 2**63, size=n, dtype=np.uint64) * np.uint64(2),
        "ties": rng.integers(0, 4, size=n).astype(np.uint64) << np.uint64(50),
        "top_bits": rng.integers(0, 3, size=n).astype(np.uint64) << np.uint64(62) | np.uint64(5),
    }[shape]
    tie1 = rng.integers(0, 3, size=n).astype(np.uint64) if two_ties else rng.permutation(n).astype(np.uint64)
    tie2 = rng.permutation(n).astype(np.uint64) if two_ties else None
    valid = rng.random(n) < 0.8
    parts = split(n, buckets, rng)
    candidates = int(valid.sum())
    m = int(rng.integers(-1, candidates + 2))

    def key_of(idx):
        return keys[idx], tie1[idx], None if tie2 is None else tie2[idx], valid[idx]

    old = steps.GATHER_KEYS
    steps.GATHER_KEYS = gather
    try:
        cut = run_steps(smallest(key_of, m, candidates), lambda b: parts[b], buckets)
    finally:
        steps.GATHER_KEYS = old
    got = np.zeros(n, dtype=bool)
    for idx in parts:
        got[idx] = cut.mask(*key_of(idx))
    rows = np.flatnonzero(valid)
    order = np.lexsort(((tie2 if tie2 is not None else np.zeros(n, np.uint64))[rows], tie1[rows], keys[rows]))
    expected = np.zeros(n, dtype=bool)
    expected[rows[order[: max(m, 0)]]] = True
    assert np.array_equal(got, expected)


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 300), seed=st.integers(0, 2**16), buckets=st.integers(1, 5), double=st.booleans())
def test_order_statistics_equal_sorting(n, seed, buckets, double):
    rng = np.random.default_rng(seed)
    values = np.round(rng.normal(size=n) * 4).astype(np.float64 if double else np.float32)
    values[rng.random(n) < 0.1] = -0.0
    ranks = rng.integers(0, n, size=7)
    parts = split(n, buckets, rng)
    got = run_steps(order_statistics(lambda idx: values[idx], ranks, n, values.dtype), lambda b: parts[b], buckets)
    assert got.dtype == values.dtype and np.array_equal(got, np.sort(values)[ranks] + values.dtype.type(0.0))


def _logged_steps(events: list[tuple], streamed: bool):
    def reduce(pieces):
        events.append(("reduce", list(pieces)))
        return sum(pieces)

    def mapped(inp):
        events.append(("map", inp))
        return inp * 10

    first = yield steps.Step(mapped, reduce, streamed=streamed)
    second = yield steps.Step(mapped, reduce)
    return first, second


@pytest.mark.parametrize("streamed", [True, False])
def test_a_streamed_step_reduces_each_bucket_before_the_next_is_mapped(streamed):
    """A streamed step's reduce gets one bucket's result at a time, in bucket order, before the
    next bucket is mapped (the caller never holds two buckets' results); the round's value is the
    last call's. A plain step's reduce gets every result at once."""
    events: list[tuple] = []
    result = run_steps(_logged_steps(events, streamed), lambda b: b + 1, 3)
    rest = [("map", 1), ("map", 2), ("map", 3), ("reduce", [10, 20, 30])]
    if streamed:
        one_by_one = [("map", 1), ("reduce", [10]), ("map", 2), ("reduce", [20]), ("map", 3), ("reduce", [30])]
        assert events == one_by_one + rest
        assert result == (30, 60)
    else:
        assert events == rest + rest
        assert result == (60, 60)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_float_order_keys_over_several_blocks_are_the_widened_float_keys(dtype):
    rng = np.random.default_rng(8)
    v = (rng.standard_normal(2 * steps._ORDER_BLOCK + 4321) * 50).astype(dtype)
    v[steps._ORDER_BLOCK - 2 : steps._ORDER_BLOCK + 2] = [-0.0, 0.0, np.inf, -np.inf]  # across a boundary
    keys = steps.float_order_keys(v)
    assert keys.dtype == np.uint64 and np.array_equal(keys, float_keys(v).astype(np.uint64))
    assert np.array_equal(np.argsort(keys, kind="stable"), np.argsort(v + dtype(0.0), kind="stable"))
