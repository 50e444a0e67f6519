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
