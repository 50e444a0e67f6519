"""The array helpers shared by compaction and planning."""

from __future__ import annotations

import numpy as np
import pytest

from seta_stream._arrays import group_order


@pytest.mark.parametrize("n_groups", [1, 2, 256, 257, 65536, 65537, 1 << 20])
@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.uint16])
def test_group_order_is_the_stable_order_for_every_code_width(n_groups, dtype):
    codes = np.random.default_rng(n_groups).integers(0, min(n_groups, np.iinfo(dtype).max + 1), 50_000)
    codes = codes.astype(dtype)
    codes[:3] = min(n_groups, np.iinfo(dtype).max + 1) - 1  # the largest code, first
    order = group_order(codes, n_groups)
    assert np.array_equal(order, np.argsort(codes, kind="stable"))
    assert codes.dtype == dtype  # the caller's array is left as it is


@pytest.mark.parametrize("block", [7, 1024, 1 << 20])
@pytest.mark.parametrize("share", [0.0, 0.3, 1.0])
def test_gather_and_scatter_rows_are_boolean_indexing(block, share, monkeypatch):
    """gather_rows / scatter_rows give what a[mask] and dst[mask] = values give, for every
    dtype the planner passes (uid, losses, the seen mask, int8 reasons, int16 clusters), with
    blocks cutting the rows anywhere and masks with no row, some rows and every row."""
    import seta_stream._arrays as A

    monkeypatch.setattr(A, "_MASK_BLOCK", block)
    rng = np.random.default_rng(block)
    n = 10_007
    mask = rng.random(n) < share
    arrays = [
        rng.integers(0, 2**63, n, dtype=np.uint64),
        rng.random(n, dtype=np.float32),
        rng.random(n) < 0.5,
        rng.integers(-128, 128, n).astype(np.int8),
        rng.integers(-1, 10, n).astype(np.int16),
        rng.random(n),
    ]
    got = A.gather_rows(arrays, mask)
    assert [g.dtype for g in got] == [a.dtype for a in arrays]
    for g, a in zip(got, arrays):
        assert np.array_equal(g, a[mask])
    assert [len(g) for g in A.gather_rows(arrays[:1], mask, int(mask.sum()))] == [int(mask.sum())]
    dst = [np.full(n, 3, dtype=a.dtype) for a in arrays]
    want = [d.copy() for d in dst]
    for w, g in zip(want, got):
        w[mask] = g
    A.scatter_rows(list(zip(dst, got)), mask)
    for d, w in zip(dst, want):
        assert np.array_equal(d, w)
