"""Shard index: where every member of every sample lies in an uncompressed tar shard.

``index_shard(path)`` reads only the tar headers (the data blocks are skipped by seeking) and
writes a sidecar ``<shard>.idx.json`` next to the shard (or into ``index_dir``)::

    {"format": "seta-stream-tar-index", "version": 1,
     "shard": "part-000000.tar", "size": 1048576000, "mtime_ns": 1731000000000000000,
     "samples": [["<key>", [["<key>.jpg", 1536, 8211], ["<key>.cls", 10240, 1]]], ...]}

``samples`` is in file order; each member is (tar member name, byte offset of its data, size
in bytes). A sample's members are consecutive in a webdataset shard, so its bytes are the range
from its first member's header (data offset - 512, or earlier with long-name headers) to its
last member's data end; the reader only needs the data offsets. ``size`` and ``mtime_ns`` detect
an index that no longer matches its shard. Compressed shards (.tar.gz) cannot be range-read and
are not indexed (the reader streams them).

Indexes of other tools are not read: wids' JSON lists shards and sample counts but no member
offsets, so it cannot drive range reads; DALI's ``.idx`` has offsets, but its line format
differs between DALI versions and no DALI install was available to verify a converter against,
so rather than guess, ``seta-stream index`` (a header scan, well under a second per shard)
writes ours. ``index_while_streaming()`` writes missing indexes as shards first stream by.
"""

from __future__ import annotations

import json
import os
import tarfile
from typing import Any

import fsspec
from webdataset.filters import pipelinefilter
from webdataset.tariterators import base_plus_ext

from .errors import InvalidInputError

__all__ = ["index_shard", "load_index", "index_path", "IndexMismatch", "index_while_streaming", "INDEX_SUFFIX"]

INDEX_FORMAT = "seta-stream-tar-index"
INDEX_VERSION = 1
INDEX_SUFFIX = ".idx.json"


class IndexMismatch(InvalidInputError):
    """An index does not describe its shard (size, modification time or member names differ)."""


def index_path(shard: str, index_dir: str | None = None) -> str:
    """Where the index of ``shard`` lives: next to it, or in ``index_dir``."""
    if index_dir is None:
        return shard + INDEX_SUFFIX
    return os.path.join(index_dir, os.path.basename(shard) + INDEX_SUFFIX)


def _stat(fs: Any, path: str) -> tuple[int, int]:
    info = fs.info(path)
    mtime = info.get("mtime") or info.get("LastModified") or info.get("created") or 0
    if hasattr(mtime, "timestamp"):
        mtime = mtime.timestamp()
    return int(info["size"]), int(float(mtime) * 1e9)


def build_index(url: str) -> dict[str, Any]:
    """The index of one uncompressed tar shard (headers only)."""
    if url.endswith((".gz", ".tgz", ".bz2", ".xz", ".zst")):
        raise InvalidInputError(f"{url}: compressed shards cannot be range-read; index the plain .tar")
    fs, path = fsspec.core.url_to_fs(url)
    size, mtime = _stat(fs, path)
    samples: list[list[Any]] = []
    current: str | None = None
    with fs.open(path, "rb") as fh, tarfile.open(fileobj=fh, mode="r:") as tar:
        for member in tar:
            if not member.isfile():
                continue
            prefix, _ = base_plus_ext(member.name)
            if prefix is None:
                continue
            if prefix != current:
                samples.append([prefix, []])
                current = prefix
            samples[-1][1].append([member.name, member.offset_data, member.size])
    return {
        "format": INDEX_FORMAT,
        "version": INDEX_VERSION,
        "shard": os.path.basename(path),
        "size": size,
        "mtime_ns": mtime,
        "samples": samples,
    }


def index_shard(url: str, index_dir: str | None = None, *, force: bool = False) -> str:
    """Write the index of ``url``; idempotent (an up-to-date index is kept). Returns its path."""
    out = index_path(url, index_dir)
    if not force:
        try:
            load_index(url, index_dir)
            return out
        except (FileNotFoundError, IndexMismatch):
            pass
    data = json.dumps(build_index(url), separators=(",", ":")).encode()
    fs, path = fsspec.core.url_to_fs(out)
    fs.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    tmp = path + ".tmp"
    with fs.open(tmp, "wb") as fh:
        fh.write(data)
    fs.mv(tmp, path)
    return out


def load_index(url: str, index_dir: str | None = None) -> dict[str, Any]:
    """Read and check the index of ``url``.

    Raises FileNotFoundError if there is none and :class:`IndexMismatch` if it does not match
    the shard (size or modification time changed).
    """
    ipath = index_path(url, index_dir)
    fs, path = fsspec.core.url_to_fs(ipath)
    with fs.open(path, "rb") as fh:
        idx = json.loads(fh.read())
    if idx.get("format") != INDEX_FORMAT or int(idx.get("version", 0)) > INDEX_VERSION:
        raise IndexMismatch(
            f"{ipath}: format {idx.get('format')!r} version {idx.get('version')!r}, expected "
            f"{INDEX_FORMAT!r} <= {INDEX_VERSION}; rebuild it with `seta-stream index {url}`"
        )
    sfs, spath = fsspec.core.url_to_fs(url)
    size, mtime = _stat(sfs, spath)
    if size != idx["size"] or (mtime and idx.get("mtime_ns") and mtime != idx["mtime_ns"]):
        raise IndexMismatch(
            f"shard {os.path.basename(spath)}: index {ipath} describes {idx['size']} bytes modified at "
            f"{idx.get('mtime_ns')} ns, the shard has {size} bytes modified at {mtime} ns; the shard changed "
            f"after indexing. Rebuild the index with `seta-stream index {url}`"
        )
    return idx


def _index_missing(src: Any, index_dir: str | None = None) -> Any:
    for item in src:
        url = item["url"]
        if not url.endswith((".gz", ".tgz", ".bz2", ".xz", ".zst")):
            try:
                load_index(url, index_dir)
            except (FileNotFoundError, IndexMismatch):
                index_shard(url, index_dir, force=True)
        yield item


index_while_streaming = pipelinefilter(_index_missing)
index_while_streaming.__doc__ = """URL stage: ``index_while_streaming(index_dir=None)``; put it before
the tar reader. The first time a shard streams by, its index is written (one pass over its
headers, then the shard is read from the page cache); later epochs can use ``read_kept``."""
