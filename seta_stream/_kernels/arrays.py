"""Arrow columns as NumPy arrays, without whole-column temporaries.

Shared by the loss-table reader (``table.load_numeric``) and the compaction fold (``fold``).
Columns here hold no nulls (the formats forbid them), so a chunk converts without a mask.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from ..errors import RunFormatError

__all__ = [
    "column_to_numpy",
    "copy_column_into",
    "float32_array",
    "gather_rows",
    "group_order",
    "is_broadcast",
    "numpy_dtype",
    "scatter_rows",
    "shard_runs",
    "utf8_lengths",
]


def group_order(codes: np.ndarray, n_groups: int) -> np.ndarray:
    """The stable order that groups ``codes`` (integers in [0, ``n_groups``)): rows of group
    0 first, each group in row order.

    Why: NumPy's stable argsort is a radix sort for 8- and 16-bit integers and a merge sort
    otherwise; 8.3M codes of 12 groups take 0.06 s as uint8 and 0.49 s as int64, 1M codes of
    24 groups 5.5 ms as uint16 and 43 ms as int32 (this machine). Callers group rows by
    bucket, range or shard, almost always fewer than 65,536 groups."""
    if n_groups <= 1 << 8:
        codes = codes.astype(np.uint8, copy=False)
    elif n_groups <= 1 << 16:
        codes = codes.astype(np.uint16, copy=False)
    return np.argsort(codes, kind="stable")


def is_broadcast(a: np.ndarray) -> bool:
    """Whether ``a`` (at least 1-D) holds one value for every element without storing it for
    each: every stride 0, as ``np.broadcast_to`` makes a constant column. Such an array stays a
    constant where rows are taken or arrays saved."""
    return a.ndim >= 1 and not any(a.strides)


def float32_array(values: Any) -> pa.Array:
    """A float32 Arrow array of ``values`` built from its NumPy buffer: ``pa.array`` imports
    pandas on its first call (about 0.4 s and 30 MB in a fresh process), which a stage worker
    reading a plan's weights has no other use for."""
    a = np.ascontiguousarray(np.asarray(values, dtype=np.float32).ravel())
    return pa.Array.from_buffers(pa.float32(), len(a), [None, pa.py_buffer(a)])


def column_to_numpy(col: pa.ChunkedArray | pa.Array | np.ndarray) -> np.ndarray:
    """A numeric column without nulls as one NumPy array (zero-copy for a single chunk, which
    is then read-only)."""
    if isinstance(col, np.ndarray):
        return col
    if isinstance(col, pa.ChunkedArray):
        if col.num_chunks == 1:
            return _chunk_values(col.chunk(0))
        if col.num_chunks == 0:
            return np.empty(0, dtype=numpy_dtype(col.type))
        return np.concatenate([_chunk_values(c) for c in col.chunks])
    return _chunk_values(col)


def copy_column_into(dst: np.ndarray, col: pa.ChunkedArray | pa.Array | np.ndarray) -> None:
    """Copy a numeric column into ``dst[:len(col)]`` chunk by chunk (no whole-column temporary)."""
    if isinstance(col, np.ndarray):
        dst[: len(col)] = col
        return
    o = 0
    for chunk in col.chunks if isinstance(col, pa.ChunkedArray) else [col]:
        n = len(chunk)
        dst[o : o + n] = _chunk_values(chunk)
        o += n


def one_array(col: pa.ChunkedArray | pa.Array) -> pa.Array:
    """A column's values as one Arrow array: an array as is, a chunked array's only chunk as
    is, the chunks of any other concatenated. Why not ``ChunkedArray.combine_chunks`` alone:
    it copies even a single chunk (a plan's 15M-row float32 weight column: 0.16 s here)."""
    if isinstance(col, pa.ChunkedArray):
        return col.chunk(0) if col.num_chunks == 1 else col.combine_chunks()
    return col


def numpy_dtype(t: pa.DataType) -> np.dtype | None:
    """The NumPy dtype of an Arrow integer or floating-point type (None for other types).

    Why not ``DataType.to_pandas_dtype``: pyarrow before 26 imports pandas for it and raises
    ModuleNotFoundError where pandas is not installed (it is no dependency of seta_stream)."""
    if pa.types.is_integer(t):
        return np.dtype(f"{'int' if pa.types.is_signed_integer(t) else 'uint'}{t.bit_width}")
    if pa.types.is_floating(t):
        return np.dtype(f"float{t.bit_width}")
    return None


def _chunk_values(chunk: pa.Array) -> np.ndarray:
    """An Arrow array as NumPy: an integer or floating-point one without nulls viewed in place
    from its data buffer (read-only), any other converted by pyarrow.

    Why not ``to_numpy`` for every array: it goes through pyarrow's pandas conversion, whose
    first call imports pandas (0.2 - 0.3 s of CPU, a sixth of a fresh process's plan of 15M
    rows here), and the table's columns are read on two threads that would both wait for it;
    planning imports it beside the policy instead (``_planning.tuning``)."""
    dtype = numpy_dtype(chunk.type)
    if dtype is None or chunk.null_count:
        return chunk.to_numpy(zero_copy_only=False)
    if not len(chunk):
        return np.empty(0, dtype=dtype)
    out = np.frombuffer(chunk.buffers()[1], dtype=dtype, count=len(chunk), offset=chunk.offset * dtype.itemsize)
    out.flags.writeable = False  # Arrow data is immutable (a view of a mutable buffer would not say so)
    return out


def utf8_lengths(col: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """UTF-8 byte length of every string (int32), from the offsets buffers, no string copies."""
    chunks = col.chunks if isinstance(col, pa.ChunkedArray) else [col]
    out = np.empty(len(col), dtype=np.int32)
    o = 0
    for chunk in chunks:
        n = len(chunk)
        if n:
            width = np.int64 if pa.types.is_large_string(chunk.type) else np.int32
            offsets = np.frombuffer(chunk.buffers()[1], dtype=width)[chunk.offset : chunk.offset + n + 1]
            np.subtract(offsets[1:], offsets[:-1], out=out[o : o + n], casting="unsafe")
        o += n
    return out


#: Rows per block of :func:`gather_rows` and :func:`scatter_rows`.
_MASK_BLOCK = 1 << 20


def gather_rows(arrays: list[np.ndarray], mask: np.ndarray, count: int | None = None) -> list[np.ndarray]:
    """``[a[mask] for a in arrays]`` (``mask``: bool, as long as each array; ``count``: its
    number of True, if known), block by block: each block's row indices are found once and
    every array takes them (``np.take`` into the output). Why: a boolean index walks the mask
    again for every array; at 15M rows and 80% True, three columns take 82 ms this way against
    136 ms (this machine), with a block's indices (8 MB) as the only temporary. The take is in
    ``mode="clip"`` (the indices are in range, so the values are the same): in the default
    mode NumPy buffers ``out`` (a temporary as large as it, then a copy), which at 15M rows
    was 43,000 more page faults and 0.22 s against 0.14 s here."""
    n = len(mask)
    count = int(np.count_nonzero(mask)) if count is None else count
    out = [np.empty(count, dtype=a.dtype) for a in arrays]
    k = 0
    for lo in range(0, n, _MASK_BLOCK):
        idx = np.flatnonzero(mask[lo : lo + _MASK_BLOCK])
        m = len(idx)
        for a, o in zip(arrays, out):
            np.take(a[lo : lo + _MASK_BLOCK], idx, out=o[k : k + m], mode="clip")
        k += m
    return out


def scatter_rows(pairs: list[tuple[np.ndarray, np.ndarray]], mask: np.ndarray) -> None:
    """``dst[mask] = values`` for each (dst, values) of ``pairs`` (``values`` holds one value
    per True of ``mask``, in row order), block by block, the indices of a block found once
    (:func:`gather_rows`' reason: 45 ms against 87 ms for two columns at 15M rows)."""
    k = 0
    for lo in range(0, len(mask), _MASK_BLOCK):
        idx = np.flatnonzero(mask[lo : lo + _MASK_BLOCK])
        m = len(idx)
        for dst, values in pairs:
            dst[lo : lo + _MASK_BLOCK][idx] = values[k : k + m]
        k += m


def shard_runs(shard: pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray, pa.Array, np.ndarray]:
    """Row ranges [start, stop) of the shards of a dictionary-encoded shard column whose rows
    are grouped by shard, their names and their codes in the column's dictionary (one
    dictionary for all chunks). RunFormatError if a shard's rows are not contiguous."""
    n = len(shard)
    if n == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64), pa.array([], pa.string()), np.zeros(0, np.int32)
    starts, codes, o = [], [], 0
    for chunk in shard.chunks:
        c = chunk.indices.to_numpy(zero_copy_only=False)
        if len(c):
            change = np.flatnonzero(c[1:] != c[:-1]) + 1
            first = np.concatenate([[0], change])
            starts.append(first + o)
            codes.append(c[first])
        o += len(chunk)
    start = np.concatenate(starts).astype(np.int64)
    code = np.concatenate(codes)
    joined = np.concatenate([[True], code[1:] != code[:-1]])  # a shard spanning chunks is one run
    start, code = start[joined], code[joined]
    if len(np.unique(code)) != len(code):
        raise RunFormatError("plan rows are not grouped by shard; the loss table is not sorted")
    stop = np.concatenate([start[1:], [n]]).astype(np.int64)
    return start, stop, shard.chunk(0).dictionary.take(pa.array(code)), code
