"""Shard indexes: where every member of every sample lies in an uncompressed tar shard.

``index_shard(url)`` writes a sidecar ``<shard>.idx.json`` (or one in ``index_dir``) from the
shard's tar headers; ``read_kept`` range-reads kept samples through it. The format, where
indexes live and how a shard copied elsewhere is checked are described in the module that
implements them, ``seta_stream._reading.shardindex`` (docs/format.md, "Shard indexes"); this
module is their public face, with the same names.
"""

from __future__ import annotations

# every public name the module had before it moved; INDEX_FORMAT, INDEX_VERSION and build_index
# were public outside __all__, and stay so
from ._reading.shardindex import (  # noqa: F401
    INDEX_FORMAT,
    INDEX_SUFFIX,
    INDEX_VERSION,
    IndexMismatch,
    IndexMissing,
    build_index,
    byte_source,
    canonical_location,
    has_query,
    index_name,
    index_path,
    index_shard,
    index_while_streaming,
    load_index,
    member_header_matches,
    member_headers_match,
    open_fs,
)

__all__ = [
    "index_shard",
    "load_index",
    "index_path",
    "index_name",
    "canonical_location",
    "byte_source",
    "has_query",
    "member_header_matches",
    "member_headers_match",
    "open_fs",
    "IndexMismatch",
    "IndexMissing",
    "index_while_streaming",
    "INDEX_SUFFIX",
]
