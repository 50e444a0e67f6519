"""The array helpers shared by compaction and planning."""

from __future__ import annotations

import numpy as np
import pytest

from seta_stream._kernels.arrays import group_order


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
    import seta_stream._kernels.arrays as A

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


def test_numeric_columns_convert_in_place_without_importing_pandas(tmp_path):
    """Integer and floating-point chunks (sliced too) convert to the values pyarrow gives, as
    read-only views of their buffers, and reading a Parquet file's numeric columns this way
    imports no pandas (pyarrow's to_numpy does: a fresh planning process would wait for it);
    the file is read by row group, as the table reader reads it (pq.read_table imports pandas)."""
    import subprocess
    import sys

    import pyarrow as pa
    import pyarrow.parquet as pq

    from seta_stream._kernels.arrays import column_to_numpy, copy_column_into, numpy_dtype

    rng = np.random.default_rng(0)
    types = [pa.uint64(), pa.int32(), pa.int8(), pa.float32(), pa.float64(), pa.int16()]
    for t in types:
        values = rng.integers(0, 100, 1000).astype(numpy_dtype(t))
        chunk = pa.array(values, type=t).slice(7, 500)
        got = column_to_numpy(chunk)
        assert got.dtype == values.dtype and not got.flags.writeable
        assert np.array_equal(got, values[7:507])
        col = pa.chunked_array([chunk, pa.array(values[:3], type=t), pa.array([], type=t)])
        assert np.array_equal(column_to_numpy(col), np.r_[values[7:507], values[:3]])
        dst = np.zeros(600, dtype=values.dtype)
        copy_column_into(dst, col)
        assert np.array_equal(dst[:503], np.r_[values[7:507], values[:3]]) and not dst[503:].any()
    assert column_to_numpy(pa.chunked_array([], type=pa.float32())).dtype == np.float32
    with_nulls = pa.array([1.5, None, 2.5], type=pa.float32())
    assert np.array_equal(column_to_numpy(with_nulls), [1.5, np.nan, 2.5], equal_nan=True)
    assert column_to_numpy(pa.array([True, False])).tolist() == [True, False]

    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({"uid": np.arange(10, dtype=np.uint64), "loss": np.arange(10, dtype=np.float32)}), path)
    code = f"""
import sys
import pyarrow.parquet as pq
from seta_stream._kernels.arrays import column_to_numpy, copy_column_into, numpy_dtype
import numpy as np
t = pq.ParquetFile({str(path)!r}, memory_map=True).read_row_group(0, use_threads=False)
out = np.zeros(10, np.float32)
copy_column_into(out, t.column("loss"))
print(int(column_to_numpy(t.column("uid")).sum()), float(out.sum()), "pandas" in sys.modules)
"""
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert res.stdout.split() == ["45", "45.0", "False"]
