"""Arrow columns as NumPy arrays, without whole-column temporaries.

Shared by the loss-table reader (``table.load_numeric``) and the compaction fold (``fold``).
Columns here hold no nulls (the formats forbid them), so a chunk converts without a mask.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

__all__ = ["column_to_numpy", "copy_column_into", "utf8_lengths"]


def column_to_numpy(col: pa.ChunkedArray | pa.Array | np.ndarray) -> np.ndarray:
    """A numeric column without nulls as one NumPy array (zero-copy for a single chunk, which
    is then read-only)."""
    if isinstance(col, np.ndarray):
        return col
    if isinstance(col, pa.ChunkedArray):
        if col.num_chunks == 1:
            return col.chunk(0).to_numpy(zero_copy_only=False)
        return col.to_numpy()
    return col.to_numpy(zero_copy_only=False)


def copy_column_into(dst: np.ndarray, col: pa.ChunkedArray | pa.Array | np.ndarray) -> None:
    """Copy a numeric column into ``dst[:len(col)]`` chunk by chunk (no whole-column temporary)."""
    if isinstance(col, np.ndarray):
        dst[: len(col)] = col
        return
    o = 0
    for chunk in col.chunks if isinstance(col, pa.ChunkedArray) else [col]:
        n = len(chunk)
        dst[o : o + n] = chunk.to_numpy(zero_copy_only=False)
        o += n


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
