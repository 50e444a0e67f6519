"""Shard indexes: where every member of every sample lies in an uncompressed tar shard.

``seta_stream.index_shard(url)`` writes a sidecar ``<shard>.idx.json`` (or one in
``index_dir``) from the shard's tar headers; ``read_kept`` range-reads kept samples through it.
This module holds the rest: :func:`load_index` (read and check one), :func:`index_path` (where
it lives), :func:`index_while_streaming` (a URL stage writing missing indexes as shards stream
by) and ``INDEX_SUFFIX``; the errors are :class:`~seta_stream.errors.IndexMismatch` and
:class:`~seta_stream.errors.IndexMissing`. The format, where indexes live and how a shard copied
elsewhere is checked are described in the module that implements them,
``seta_stream._reading.shardindex`` (docs/format.md, "Shard indexes").
"""

from __future__ import annotations

from ._reading.shardindex import INDEX_SUFFIX, index_path, index_while_streaming, load_index

__all__ = ["load_index", "index_path", "index_while_streaming", "INDEX_SUFFIX"]
