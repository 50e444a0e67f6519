"""Shard index: where every member of every sample lies in an uncompressed tar shard.

``index_shard(url)`` reads only the tar headers (the data blocks are skipped by seeking) and
writes a sidecar ``<shard>.idx.json`` next to the shard, or into ``index_dir``::

    {"format": "seta-stream-tar-index", "version": 1,
     "shard": "part-000000.tar", "location": "s3://bucket/train/part-000000.tar",
     "size": 1048576000, "mtime_ns": 1731000000000000000,
     "samples": [["<key>", [["<key>.jpg", 1536, 8211], ["<key>.cls", 10240, 1]]], ...]}

``samples`` is in file order; each member is (tar member name, byte offset of its data, size in
bytes). A sample's members are consecutive in a webdataset shard; the reader only needs the data
offsets (and checks the 512-byte tar header right before each member's data, see
:func:`member_header_matches`, and :func:`member_headers_match` for many members at once). An
index describes the shard's bytes, not where they lie: it stays valid wherever shard and index
are copied together (``aws s3 sync``, ``rsync``), as long as the shard has the ``size`` it
records and the tar header in front of every member the reader reads is that member's; either
check failing refuses it (:class:`IndexMismatch`). ``mtime_ns`` (the shard's modification time
where it was indexed) is informative only: a copy gets another one (an object's LastModified is
its upload time), so readers do not compare it; :func:`index_shard` without ``force`` rescans a
shard whose time differs. Compressed shards (.tar.gz) cannot be range-read and are not indexed
(the reader streams them).

Where indexes live:

* without ``index_dir``: ``<location>.idx.json``, where the location is
  :func:`seta_stream.ids.shard_location` of the URL (a ``pipe:`` command's shard URL or path;
  ``file://`` dropped). A URL with a query string (a signed URL, ``...tar?X-Amz-Signature=...``)
  has no such place: the signature authorises the shard only, and appending ``.idx.json`` to it
  would fetch the shard itself. Such shards need ``index_dir``.
* in ``index_dir``: ``<file name>.<hash>.idx.json``, the hash being the first 16 hex digits of
  SHA-256 of the shard's canonical location (:func:`canonical_location`: the location without
  query string, local paths made absolute). Two shards with the same file name in different
  folders, buckets or hosts get different indexes, and the index records ``location``: an index
  of another shard is refused (:class:`IndexMismatch`), never used.

Indexes of other tools are not read: wids' JSON lists shards and sample counts but no member
offsets, so it cannot drive range reads; DALI's ``.idx`` has offsets, but its line format
differs between DALI versions and no DALI install was available to verify a converter against,
so rather than guess, ``seta-stream index`` (a header scan, well under a second per shard)
writes ours. ``index_while_streaming()`` writes missing indexes as shards first stream by.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tarfile
from typing import Any

import fsspec
import numpy as np
from webdataset.filters import pipelinefilter
from webdataset.tariterators import base_plus_ext

from ..errors import IndexMismatch, IndexMissing, InvalidInputError
from .shardurl import Shard

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
    "index_while_streaming",
    "INDEX_SUFFIX",
]

INDEX_FORMAT = "seta-stream-tar-index"
INDEX_VERSION = 1
INDEX_SUFFIX = ".idx.json"
_COMPRESSED = (".gz", ".tgz", ".bz2", ".xz", ".zst", ".lz4")
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
_EXTRAS = {"http": "http", "https": "http", "s3": "s3", "s3a": "s3", "gs": "gcs", "gcs": "gcs"}


def canonical_location(url: str) -> str:
    """The shard's location as indexes record it: :func:`~seta_stream.ids.shard_location`
    (no query string, no ``file://``, the path inside a ``pipe:`` command), local paths absolute."""
    return Shard.of(url).canonical


def has_query(url: str) -> bool:
    """True if the shard's URL carries a query string or fragment (a signed URL), also inside a ``pipe:`` command."""
    return Shard.of(url).has_query


def byte_source(url: str) -> str | None:
    """What fsspec opens to read the shard's bytes: the URL itself (query string kept), or for a
    ``pipe:`` command the URL or path it reads, as written in the command (query string kept).
    None if that cannot be found verbatim in the command (shell escapes): only running the
    command can read it."""
    if not url.startswith("pipe:"):
        return url  # nothing to parse
    return Shard.of(url).byte_source


def open_fs(url: str) -> tuple[Any, str]:
    """``fsspec.core.url_to_fs(url)``; a missing protocol package names the extra that installs it."""
    try:
        return fsspec.core.url_to_fs(url)
    except ImportError as exc:
        match = _SCHEME.match(url)
        protocol = match.group(0)[:-3].lower() if match else "file"
        extra = _EXTRAS.get(protocol)
        hint = f"; install it with: pip install 'seta-stream[{extra}]'" if extra else ""
        raise ImportError(f"reading {url}: {exc}{hint}") from exc


def index_name(url: str) -> str:
    """File name of the shard's index in an index_dir: ``<file name>.<16 hex of SHA-256(location)>.idx.json``."""
    return _index_name(Shard.of(url))


def _index_name(shard: Shard) -> str:
    loc = shard.canonical
    digest = hashlib.sha256(loc.encode("utf-8", "surrogateescape")).hexdigest()[:16]
    base = loc.replace("\\", "/").rstrip("/").rsplit("/", 1)[-1] or "shard"
    return f"{base}.{digest}{INDEX_SUFFIX}"


def index_path(shard: str, index_dir: str | None = None) -> str:
    """Where the index of ``shard`` lives: ``<location>.idx.json``, or :func:`index_name` in ``index_dir``.

    Raises :class:`IndexMissing` for a URL with a query string and no ``index_dir``.
    """
    return _index_path(Shard.of(shard), index_dir)


def _index_path(shard: Shard, index_dir: str | None) -> str:
    if index_dir is not None:
        return index_dir.rstrip("/") + "/" + _index_name(shard)
    if shard.has_query:
        raise IndexMissing(
            f"{shard.url}: the URL has a query string (a signed URL?), so its index cannot sit beside it "
            f"({shard.location}{INDEX_SUFFIX} would need its own signature); expected an index_dir. "
            f"Write the index with `seta-stream index URL --index-dir DIR` and read with read_kept(run, index_dir=DIR)"
        )
    return shard.location + INDEX_SUFFIX


def _stat(fs: Any, path: str) -> tuple[int, int]:
    info = fs.info(path)
    mtime = info.get("mtime") or info.get("LastModified") or info.get("created") or 0
    if hasattr(mtime, "timestamp"):
        mtime = mtime.timestamp()
    return int(info["size"]), int(float(mtime) * 1e9)


def _source(shard: Shard) -> str:
    src = shard.byte_source
    if src is None:
        raise InvalidInputError(
            f"{shard.url}: the shard {shard.location} is not written verbatim in the pipe: command (shell escapes?), "
            "so only the command can read it and it cannot be indexed or range-read through it; expected the URL "
            "or path as a plain or quoted argument. Index the URL or path itself (`seta-stream index URL`)"
        )
    return src


def build_index(url: str) -> dict[str, Any]:
    """The index of one uncompressed tar shard (headers only)."""
    return _build(Shard.of(url))


def _build(shard: Shard) -> dict[str, Any]:
    loc = shard.canonical
    if loc.endswith(_COMPRESSED):
        raise InvalidInputError(f"{shard.url}: compressed shards cannot be range-read; index the plain .tar")
    fs, path = open_fs(_source(shard))
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
        "shard": loc.replace("\\", "/").rsplit("/", 1)[-1],
        "location": loc,
        "size": size,
        "mtime_ns": mtime,
        "samples": samples,
    }


def index_shard(url: str, index_dir: str | None = None, *, force: bool = False) -> str:
    """Write the index of ``url``; idempotent. Returns its path.

    Without ``force`` an index is kept if :func:`load_index` accepts it and it records the
    shard's current modification time (or either time is unknown); a shard whose time differs
    (rewritten, or copied with its index) is scanned again and its index rewritten.
    """
    return _index(Shard.of(url), index_dir, force)


def _index(shard: Shard, index_dir: str | None, force: bool) -> str:
    url = shard.url
    out = _index_path(shard, index_dir)
    if not force:
        try:
            idx, mtime = _checked(shard, index_dir)
            if not (mtime and idx.get("mtime_ns") and mtime != idx["mtime_ns"]):
                return out
        except (FileNotFoundError, IndexMismatch):
            pass
    data = json.dumps(_build(shard), separators=(",", ":")).encode()
    fs, path = open_fs(out)
    tmp = path + ".tmp"
    try:
        fs.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        with fs.open(tmp, "wb") as fh:
            fh.write(data)
        fs.mv(tmp, path)
    except (NotImplementedError, OSError) as exc:
        raise InvalidInputError(
            f"{url}: cannot write its index at {out} ({type(exc).__name__}: {exc}); expected a writable place "
            "(HTTP servers are read-only). Write the indexes elsewhere with `seta-stream index URL --index-dir DIR` "
            "and read with read_kept(run, index_dir=DIR)"
        ) from exc
    return out


def load_index(url: str, index_dir: str | None = None) -> dict[str, Any]:
    """Read and check the index of ``url``.

    Raises :class:`IndexMissing` (a FileNotFoundError) if there is none and :class:`IndexMismatch`
    if it does not match the shard: an index in ``index_dir`` that records another location, or
    a shard of another size. The modification time is not compared (an index copied with its
    shard stays valid); the reader checks the tar header of every member it reads.
    """
    return _checked(Shard.of(url), index_dir)[0]


def load_shard_index(shard: Shard, index_dir: str | None = None) -> dict[str, Any]:
    """:func:`load_index` of a :class:`~seta_stream._reading.shardurl.Shard` (``read_kept``'s
    way in: the URL parsed once)."""
    return _checked(shard, index_dir)[0]


def _checked(shard: Shard, index_dir: str | None) -> tuple[dict[str, Any], int]:
    """(the index :func:`load_index` accepts, the shard's modification time in ns, 0 if unknown)."""
    url = shard.url
    ipath = _index_path(shard, index_dir)
    fs, path = open_fs(ipath)
    try:
        with fs.open(path, "rb") as fh:
            raw = fh.read()
    except FileNotFoundError:
        raise IndexMissing(
            f"{url}: no index at {ipath}; write it with `seta-stream index {shard.location}"
            + (f" --index-dir {index_dir}`" if index_dir is not None else "`")
        ) from None
    try:
        idx = json.loads(raw)
        if not isinstance(idx, dict):
            raise ValueError("not a JSON object")
    except ValueError as exc:
        raise IndexMismatch(
            f"{ipath}: not a seta-stream index ({exc}); expected JSON of format {INDEX_FORMAT!r}. "
            f"Rebuild it with `seta-stream index {shard.location} --force`"
        ) from None
    if idx.get("format") != INDEX_FORMAT or int(idx.get("version", 0)) > INDEX_VERSION:
        raise IndexMismatch(
            f"{ipath}: format {idx.get('format')!r} version {idx.get('version')!r}, expected "
            f"{INDEX_FORMAT!r} <= {INDEX_VERSION}; rebuild it with `seta-stream index {shard.location} --force`"
        )
    loc = shard.canonical
    if index_dir is not None and idx.get("location") != loc:
        raise IndexMismatch(
            f"shard {loc}: index {ipath} describes the shard at {idx.get('location')!r}, expected {loc!r}; "
            f"it belongs to another shard. Rebuild it with `seta-stream index {loc} --index-dir {index_dir} --force`"
        )
    sfs, spath = open_fs(_source(shard))
    size, mtime = _stat(sfs, spath)
    if size != idx["size"]:
        raise IndexMismatch(
            f"shard {os.path.basename(loc)}: index {ipath} describes {idx['size']} bytes, the shard has {size} "
            f"bytes; the shard changed after indexing (or the index is another shard's). "
            f"Rebuild the index with `seta-stream index {loc} --force"
            + (f" --index-dir {index_dir}`" if index_dir is not None else "`")
        )
    return idx, mtime


def _text(raw: bytes) -> str:
    end = raw.find(b"\0")
    return (raw if end < 0 else raw[:end]).decode("utf-8", "surrogateescape")


def member_header_matches(header: bytes, name: str, size: int) -> bool:
    """True if ``header`` (the 512 bytes right before a member's data) is a valid tar header of
    a regular member of ``size`` bytes named ``name``.

    Names that do not fit a plain ustar header (over 99 bytes, or not ASCII: GNU long-name and
    pax records carry them, the header keeps a truncated or replaced copy) are not compared.
    """
    if len(header) != 512 or header[156:157] not in (b"0", b"\0", b"7"):
        return False
    try:
        stored = int(_text(header[148:156]).strip() or "0", 8)
        field = header[124:136]
        if field[0] in (0o200, 0o377):
            hsize = int.from_bytes(field[1:], "big")
        else:
            hsize = int(_text(field).strip() or "0", 8)
    except ValueError:
        return False
    unsigned = sum(header) - sum(header[148:156]) + 256  # the checksum field counts as 8 spaces
    if stored != unsigned:
        high = sum(1 for i, b in enumerate(header) if b >= 128 and not 148 <= i < 156)
        if stored != unsigned - 256 * high:  # some tars sum signed bytes
            return False
    if hsize != size and not (hsize == 0 and size >= 8**11):  # pax size record of a huge member
        return False
    encoded = name.encode("utf-8", "surrogateescape")
    if len(encoded) > 99 or not name.isascii():
        return True
    hname = _text(header[0:100])
    prefix = _text(header[345:500])
    if prefix:
        hname = prefix + "/" + hname
    return hname == name


def member_headers_match(
    buf: bytes | bytearray | memoryview, positions: np.ndarray, names: list[str], sizes: np.ndarray
) -> np.ndarray:
    """``member_header_matches(buf[p : p + 512], name, size)`` for every (p, name, size), as a
    bool array: the headers in the form tar writers give them (octal fields, no ustar prefix)
    are checked all at once with NumPy, any other header (and any that fails) one by one."""
    positions = np.asarray(positions, dtype=np.int64)
    n = len(positions)
    data = np.frombuffer(buf, dtype=np.uint8)
    if n == 0:
        return np.zeros(0, dtype=bool)
    if positions.min() < 0 or positions.max() + 512 > len(data):
        raise ValueError(f"header positions out of the buffer's {len(data)} bytes")
    headers = np.lib.stride_tricks.sliding_window_view(data, 512)[positions]  # (n, 512), a copy
    ok = np.isin(headers[:, 156], _REGULAR_FLAGS)
    digits_ok, stored = _octal_fields(headers[:, 148:156])
    ok &= digits_ok
    ok &= stored == headers.sum(axis=1, dtype=np.int64) - headers[:, 148:156].sum(axis=1, dtype=np.int64) + 256
    digits_ok, hsize = _octal_fields(headers[:, 124:136])
    ok &= digits_ok & (hsize == np.asarray(sizes, dtype=np.int64))
    ok &= _names_match(headers, names)
    for i in np.flatnonzero(~ok).tolist():  # anything else, as member_header_matches has it
        ok[i] = member_header_matches(headers[i].tobytes(), names[i], int(sizes[i]))
    return ok


_REGULAR_FLAGS = np.array([ord("0"), 0, ord("7")], dtype=np.uint8)


def _octal_fields(fields: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(parsed, value) of numeric header fields (rows of bytes) of the form spaces, octal digits,
    then only NULs and spaces: the value ``int(text.strip(), 8)`` gives them. Other forms (GNU
    base-256, no digit, anything after the digits) are not parsed here (``parsed`` False)."""
    space = fields == 32
    digit = (fields >= 48) & (fields <= 55)
    lead = np.logical_and.accumulate(space, axis=1)
    number = np.logical_and.accumulate(lead | digit, axis=1) & ~lead
    parsed = number.any(axis=1) & (number | lead | space | (fields == 0)).all(axis=1)
    value = np.zeros(len(fields), dtype=np.int64)
    for j in range(fields.shape[1]):
        value = np.where(number[:, j], value * 8 + (fields[:, j].astype(np.int64) - 48), value)
    return parsed, value


def _names_match(headers: np.ndarray, names: list[str]) -> np.ndarray:
    """Rows whose name field holds ``names`` (NUL-terminated, no ustar prefix), or whose name
    member_header_matches does not compare (over 99 bytes, or not ASCII)."""
    joined = "\0".join(names)
    if not joined.isascii():
        rows = [not name.isascii() or bool(_names_match(headers[i : i + 1], [name])[0]) for i, name in enumerate(names)]
        return np.array(rows, dtype=bool)
    lengths = np.fromiter(map(len, names), dtype=np.int64, count=len(names))
    starts = np.cumsum(lengths + 1) - (lengths + 1)
    text = np.frombuffer(joined.encode("ascii") + b"\0", dtype=np.uint8)
    width = int(min(lengths.max(), 99)) + 1
    column = np.arange(width)
    inside = column <= lengths[:, None]  # the name and its terminating NUL
    expected = np.where(column < lengths[:, None], text[np.minimum(starts[:, None] + column, len(text) - 1)], 0)
    same = ((headers[:, :width] == expected) | ~inside).all(axis=1) & (headers[:, 345] == 0)
    return same | (lengths > 99)


def _index_missing(src: Any, index_dir: str | None = None) -> Any:
    for item in src:
        shard = Shard.of(item["url"])
        indexable = shard.byte_source is not None and (index_dir is not None or not shard.has_query)
        if indexable and not shard.canonical.endswith(_COMPRESSED):
            try:
                _checked(shard, index_dir)
            except (FileNotFoundError, IndexMismatch):
                _index(shard, index_dir, force=True)
        yield item


index_while_streaming = pipelinefilter(_index_missing)
index_while_streaming.__doc__ = """URL stage: ``index_while_streaming(index_dir=None)``; put it before
the tar reader. The first time a shard streams by, its index is written (one pass over its
headers, then the shard is read from the page cache); later epochs can use ``read_kept``.
Signed URLs (with a query string) are indexed only with ``index_dir``."""
