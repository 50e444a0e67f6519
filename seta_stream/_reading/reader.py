"""Kept-only reading: fetch only the bytes of the samples the plan keeps.

``read_kept(run)`` is a webdataset stage that replaces ``tarfile_to_samples() + keep_filter()``:
for each shard URL it loads the shard's index (``seta_stream.index``), asks the plan of the
current epoch which samples to keep, and reads only their members' byte ranges, in file order.
Each member is read with the 512-byte tar header in front of it (one contiguous range: header,
data, and the padding up to the next header when the next member is read too), and ranges
separated by at most ``gap`` bytes are coalesced into one read (one range request on object
stores and HTTP). Member bytes are grouped into samples by webdataset's own ``group_by_keys``,
one sample per run of consecutive members with the same key, so samples are exactly those of
the streaming reader (same ``__key__``, ``__url__``, field names and bytes; a key that comes
back later in the shard is another sample, as webdataset has it), with ``__weight__`` (and
``__score__``) attached as by ``keep_filter``.

The tar header in front of every member read is checked against the index (name, size,
checksum; all of a batch's at once, ``index.member_headers_match``): an index that describes
other bytes is refused, never used to cut samples. Reads go in batches of up to 64 MB (the
first read of a remote shard alone, then the rest of the batch at once), and every header of a
batch is checked before any sample of it is yielded. A shard whose kept ranges fit in one batch
(the whole shard below 64 MB) is therefore checked whole before its first sample: a shard
rewritten after indexing (same size, members moved) is refused and, by default, streamed. In a
larger shard a change found in a later batch stops with :class:`~seta_stream.errors.IndexMismatch`
(samples of it were delivered).

Which URLs:

* local paths, ``file://`` and fsspec URLs (``s3://``, ``gs://``, ``https://``, ...) are
  range-read through fsspec, with the full URL (a signed URL's query string is kept);
* ``pipe:`` commands: the shard the command reads (``seta_stream.ids.shard_location``, read
  with its query string as the command has it) is range-read through fsspec when it has an
  index; otherwise the command runs and its stream is filtered.

A shard without an index, or whose index does not match it, is streamed and filtered instead
(``on_missing``/``on_mismatch="stream"``, counted in ``stage_counters()`` as ``index_missing``
and ``index_mismatch``): local and fsspec URLs through fsspec, ``pipe:`` URLs through
webdataset's ``gopen`` (the command runs). A refused index also warns (once per process and
folder, naming the shard and why), since the user wrote it expecting it to be used; a missing
one is only counted (indexing some shards is a choice). ``"raise"`` stops with
:class:`~seta_stream.errors.IndexMissing` or :class:`~seta_stream.errors.IndexMismatch` instead.
A URL with a query string has its index only in ``index_dir`` (see ``seta_stream.index``);
without one it is streamed, with a warning once per process and folder. No sample is yielded twice and no
kept sample is skipped: the index lists every member of the shard.
"""

from __future__ import annotations

import gc
import re
import warnings
from collections import Counter, deque
from collections.abc import Iterable, Iterator
from itertools import chain
from typing import Any, NamedTuple

import numpy as np
from fsspec.implementations.local import LocalFileSystem
from webdataset.filters import pipelinefilter
from webdataset.tariterators import tar_file_expander, tarfile_samples

from .._store.runfs import RunDir
from ..errors import IndexMismatch, IndexMissing, InvalidInputError
from .planview import Decision, PlanView, StageCounts, kept_samples, tally_all
from .shardindex import load_shard_index, member_headers_match, open_fs
from .shardurl import Shard
from .wds import group_by_keys

__all__ = ["read_kept"]

_SKIP_META = re.compile(r"__[^/]*__($|/)")
_HEADER = 512
#: a coalesced read stops growing at this size (a single larger member is still one read)
_MAX_BLOCK = 8 << 20
#: bytes fetched by one batch of concurrent range requests on remote filesystems
_MAX_BATCH = 64 << 20
_WARNED: set[tuple[str, str]] = set()


def _is_meta(name: str) -> bool:
    """Members webdataset's tar reader skips (``__x__`` and the default ``skip_meta``)."""
    return ("/" not in name and name.startswith("__") and name.endswith("__")) or bool(_SKIP_META.match(name))


def _warn_once(kind: str, url: str, message: str) -> None:
    """Warn once per process for each kind of problem and host (or local folder) of the shards."""
    where = url.split("?", 1)[0].rsplit("/", 1)[0]
    if (kind, where) not in _WARNED:
        _WARNED.add((kind, where))
        warnings.warn(message, UserWarning, stacklevel=3)


class _Members(NamedTuple):
    """A shard's samples as the streaming reader groups them, from its index: sample ``i`` is
    ``keys[i]`` with members ``first[i]`` to ``first[i + 1] - 1`` (name, data offset, size)."""

    keys: list[str]
    first: np.ndarray  # int64[len(keys) + 1]
    names: list[str]
    offsets: np.ndarray  # int64, data offsets
    sizes: np.ndarray  # int64


def _samples_of(idx: dict[str, Any]) -> _Members:
    """The shard's samples as the streaming reader groups them: runs of consecutive members with
    the same key, members webdataset skips (meta members) left out. Built from the index's
    lists without a Python object per member (a shard has thousands)."""
    samples = idx["samples"]
    keys = [key for key, _ in samples]
    counts = np.fromiter(map(len, (members for _, members in samples)), dtype=np.int64, count=len(samples))
    flat = list(chain.from_iterable(members for _, members in samples))
    names, offsets, sizes = (list(c) for c in zip(*flat)) if flat else ([], [], [])
    offsets_arr = np.array(offsets, dtype=np.int64)
    sizes_arr = np.array(sizes, dtype=np.int64)
    owner = np.repeat(np.arange(len(keys)), counts)  # the index sample of each member
    meta = [i for i, n in enumerate(names) if n.startswith("__") and _is_meta(n)]
    if meta:
        keep = np.ones(len(names), dtype=bool)
        keep[meta] = False
        names = [n for n, k in zip(names, keep.tolist()) if k]
        offsets_arr, sizes_arr, owner = offsets_arr[keep], sizes_arr[keep], owner[keep]
    # a sample starts at each member whose index sample differs from the previous member's in
    # key (index samples with the same key are one sample when only skipped members stood between)
    change = np.flatnonzero(owner[1:] != owner[:-1]) + 1
    if len(change):
        pairs = zip(owner[change - 1].tolist(), owner[change].tolist())
        change = change[np.array([keys[a] != keys[b] for a, b in pairs], dtype=bool)]
    first = np.concatenate([[0], change, [len(names)]]).astype(np.int64) if len(names) else np.zeros(1, np.int64)
    sample_keys = [keys[i] for i in owner[first[:-1]].tolist()] if len(names) else []
    return _Members(sample_keys, first, names, offsets_arr, sizes_arr)


def _blocks(
    offsets: np.ndarray, sizes: np.ndarray, gap: int, max_block: int = _MAX_BLOCK
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Reads [start, end) covering members (in file order, given by data offset and size), each
    with its tar header (512 bytes before the data): members closer than ``gap`` bytes (the
    padding after a member's data is no gap: a member read with the next one is read up to its
    header) share a read, which stops growing at ``max_block`` bytes unless one member is larger.
    Returns (starts, ends, index of the first member of each read)."""
    n = len(offsets)
    if n == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64)
    heads = offsets - _HEADER
    ends = offsets + sizes
    padded = ends + (-sizes % _HEADER)
    breaks = np.flatnonzero(heads[1:] - padded[:-1] > gap) + 1
    bounds = [0, *breaks.tolist(), n]
    firsts: list[int] = []
    for a, b in zip(bounds[:-1], bounds[1:]):
        i = a
        while i < b:  # the longest run from i whose read stays within max_block (at least one member)
            j = int(np.searchsorted(ends[i:b], heads[i] + max_block, side="right")) + i
            firsts.append(i)
            i = max(j, i + 1)
    first = np.array(firsts, dtype=np.int64)
    last = np.concatenate([first[1:], [n]]) - 1
    return heads[first], ends[last], first


def _batches(starts: np.ndarray, ends: np.ndarray) -> list[tuple[int, int]]:
    """Reads [i, j) fetched together: up to _MAX_BATCH bytes, at least one read."""
    out: list[tuple[int, int]] = []
    lengths = (ends - starts).tolist()
    i, n = 0, len(lengths)
    while i < n:
        j, total = i + 1, lengths[i]
        while j < n and total + lengths[j] <= _MAX_BATCH:
            total += lengths[j]
            j += 1
        out.append((i, j))
        i = j
    return out


def _read_batches(
    url: str, source: str, starts: np.ndarray, ends: np.ndarray
) -> Iterator[tuple[tuple[int, int], memoryview, np.ndarray]]:
    """((i, j), the bytes of reads i..j-1 one after the other, where each read begins in them),
    a batch (:func:`_batches`) at a time: one seek and read per read into one buffer on local
    files, concurrent range requests elsewhere. On a remote filesystem the first read of a
    shard is requested alone, then the rest of its batch: a server that ignores Range sends the
    whole shard once, not once per read."""
    fs, path = open_fs(source)
    local = isinstance(fs, LocalFileSystem)
    fh = fs.open(path, "rb") if local else None
    try:
        for i, j in _batches(starts, ends):
            lo, hi = starts[i:j].tolist(), ends[i:j].tolist()
            begin = np.concatenate([[0], np.cumsum(ends[i:j] - starts[i:j])[:-1]]).astype(np.int64)
            if fh is not None:
                buf = bytearray(int(begin[-1]) + hi[-1] - lo[-1])
                view = memoryview(buf)
                for a, b, at in zip(lo, hi, begin.tolist()):
                    fh.seek(a)
                    _check_length(url, fh.readinto(view[at : at + b - a]), a, b)
                yield (i, j), view, begin
                continue
            parts: list[bytes] = []
            for a, b in [(0, 1), (1, j - i)] if i == 0 else [(0, j - i)]:
                if a < b:
                    parts += fs.cat_ranges([path] * (b - a), lo[a:b], hi[a:b], on_error="raise")
            for a, b, data in zip(lo, hi, parts):
                _check_length(url, len(data), a, b)
            yield (i, j), memoryview(b"".join(parts)), begin
    finally:
        if fh is not None:
            fh.close()


def _check_length(url: str, got: int | None, start: int, end: int) -> None:
    if got != end - start:
        raise IndexMismatch(
            f"{url}: asked for bytes {start}-{end - 1} ({end - start} bytes), got {got}; expected the "
            "exact range. The shard is shorter than its index says, or the server does not honour range "
            "requests (HTTP 'Range' headers); rebuild the index, or let read_kept stream such shards "
            "(on_mismatch='stream', the default)"
        )


def _kept_files(
    url: str,
    source: str,
    members: _Members,
    keep: np.ndarray,
    gap: int,
    stats: Counter[str],
    rebuild: str,
) -> Iterator[dict[str, Any]]:
    """Member files of the kept samples, a ``{}`` after each sample (so that two samples are
    never grouped into one), with every member's tar header checked, a batch of reads at a time
    before any member of it is yielded.

    Yields ``{"__checked__": True}`` once the first batch is read and checked; raises
    IndexMismatch before that if it does not match the index."""
    counts = np.diff(members.first)
    chosen = np.flatnonzero(np.repeat(keep, counts))  # the kept samples' members, in file order
    last = np.zeros(len(members.names), dtype=bool)
    last[members.first[1:][keep] - 1] = True  # the last member of each kept sample
    offsets, sizes = members.offsets[chosen], members.sizes[chosen]
    starts, ends, firsts = _blocks(offsets, sizes, gap)
    block_of = np.repeat(np.arange(len(firsts)), np.diff(np.concatenate([firsts, [len(chosen)]])))
    names = members.names
    first = True
    for (i, j), buf, begin in _read_batches(url, source, starts, ends):
        stats["bytes_read"] += int((ends[i:j] - starts[i:j]).sum())
        stats["range_reads"] += j - i
        lo, hi = int(firsts[i]), int(firsts[j]) if j < len(firsts) else len(chosen)
        picked = chosen[lo:hi]
        heads = begin[block_of[lo:hi] - i] + offsets[lo:hi] - _HEADER - starts[block_of[lo:hi]]
        batch_names = [names[m] for m in picked.tolist()]
        ok = member_headers_match(buf, heads, batch_names, sizes[lo:hi])
        if not ok.all():
            bad = int(np.flatnonzero(~ok)[0])
            raise IndexMismatch(
                f"{url}: the tar header at byte {int(offsets[lo + bad]) - _HEADER} is not that of member "
                f"{batch_names[bad]!r} ({int(sizes[lo + bad])} bytes) as the index says; expected the index to "
                "describe this shard. "
                + (
                    f"The index is stale or belongs to another shard: rebuild it with `{rebuild}`"
                    if first
                    else "The shard changed while it was read (samples of it were already delivered): "
                    f"rebuild the index with `{rebuild}`"
                )
            )
        if first:
            first = False
            yield {"__checked__": True}
        ends_here = last[picked].tolist()
        for name, at, size, end in zip(batch_names, (heads + _HEADER).tolist(), sizes[lo:hi].tolist(), ends_here):
            yield {"fname": name, "data": bytes(buf[at : at + size]), "__url__": url}
            if end:
                yield {}


def _streamed(item: dict[str, Any], view: PlanView, counts: StageCounts) -> Iterator[dict[str, Any]]:
    """The shard streamed whole and filtered: ``pipe:`` through webdataset's gopen (the command
    runs), everything else through fsspec, as the indexed path reads."""
    url = item["url"]
    if url.startswith("pipe:"):
        yield from kept_samples(tarfile_samples(iter([dict(item)])), view, counts)
        return
    fs, path = open_fs(url)
    protocols = fs.protocol if isinstance(fs.protocol, (tuple, list)) else (fs.protocol,)
    options = {"block_size": 0} if "http" in protocols else {}  # one streaming GET, not ranged blocks
    with fs.open(path, "rb", **options) as fh:
        source = {k: v for k, v in item.items() if k != "stream"}
        source["stream"] = fh
        yield from kept_samples(group_by_keys(tar_file_expander(iter([source]))), view, counts)


def _mismatch_fallback(shard: Shard, exc: IndexMismatch, counts: StageCounts) -> None:
    """Count a shard streamed because its index was refused, and say so once per folder."""
    counts["index_mismatch"] += 1
    _warn_once(
        "mismatch",
        shard.location,
        f"read_kept streams {shard.url} instead of reading only its kept samples: {exc}. Warned once per process "
        "and folder; every shard streamed so is counted in seta_stream.stage_counters()['index_mismatch'], "
        "and read_kept(..., on_mismatch='raise') stops instead",
    )


def _find_index(
    shard: Shard, index_dir: str | None, on_missing: str, on_mismatch: str, counts: StageCounts
) -> dict[str, Any] | None:
    url = shard.url
    if index_dir is None and shard.has_query:
        counts["index_missing"] += 1
        message = (
            f"read_kept: {url} has a query string (a signed URL?); its index is looked up only in an "
            "index_dir (an index beside the shard would need its own signature). Streaming shards like it; "
            "write indexes with `seta-stream index URL --index-dir DIR` and pass read_kept(run, index_dir=DIR)"
        )
        if on_missing == "raise":
            raise IndexMissing(message)
        _warn_once("query", shard.location, message)
        return None
    if shard.byte_source is None:  # a pipe: command whose shard cannot be read around it
        if on_missing == "raise":
            raise IndexMissing(f"{url}: the shard the pipe: command reads cannot be range-read around the command")
        counts["index_missing"] += 1
        return None
    try:
        return load_shard_index(shard, index_dir)
    except FileNotFoundError:
        if on_missing == "raise":
            raise
        counts["index_missing"] += 1
    except IndexMismatch as exc:
        if on_mismatch == "raise":
            raise
        _mismatch_fallback(shard, exc, counts)
    except Exception as exc:
        if not shard.is_pipe:
            raise
        # the shard a pipe: command reads may not be reachable through fsspec (credentials,
        # protocol packages): the command itself can still read it
        if on_missing == "raise":
            raise IndexMissing(f"{url}: its index could not be read through fsspec ({exc!r})") from exc
        counts["index_missing"] += 1
        _warn_once(
            "pipe",
            shard.location,
            f"read_kept: the index of {url} could not be read through fsspec ({exc!r}); streaming "
            "pipe: shards like it by running their command",
        )
    return None


def _index_members(
    shard: Shard, index_dir: str | None, on_missing: str, on_mismatch: str, counts: StageCounts
) -> _Members | None:
    """The shard's samples from its index (:func:`_find_index`, :func:`_samples_of`), None if
    it has no usable index. The cyclic garbage collector is paused meanwhile: the parsed JSON is
    some 4 lists a sample, none in a cycle, all freed before this returns, and each collection
    the allocations would set off walks every object of the process (half of read_kept's time
    on small samples, more in a worker that imported torch)."""
    paused = gc.isenabled()
    if paused:
        gc.disable()
    try:
        idx = _find_index(shard, index_dir, on_missing, on_mismatch, counts)
        return None if idx is None else _samples_of(idx)
    finally:
        if paused:
            gc.enable()


def _read_kept(
    src: Iterable[dict[str, Any]],
    run: str | RunDir,
    epoch: int | None = None,
    index_dir: str | None = None,
    on_missing: str = "stream",
    on_mismatch: str = "stream",
    gap: int = 1 << 16,
) -> Iterator[dict[str, Any]]:
    if on_missing not in ("stream", "raise") or on_mismatch not in ("stream", "raise"):
        raise InvalidInputError(
            f"read_kept: on_missing={on_missing!r}, on_mismatch={on_mismatch!r}; expected 'stream' or 'raise'"
        )
    view = PlanView(run, epoch)
    counts = StageCounts()
    stats: Counter[str] = Counter()
    try:
        for item in src:
            shard = Shard.of(item["url"], view.depth)  # the URL parsed here, once
            plan = view.shard(shard.name)
            if plan.is_empty:
                counts["shards_skipped"] += 1
                continue
            members = _index_members(shard, index_dir, on_missing, on_mismatch, counts)
            source = shard.byte_source if members is not None else None
            if members is None or source is None:
                yield from _streamed(item, view, counts)
                continue
            decisions = plan.decide_all(members.keys)
            keep = np.fromiter((d.keep for d in decisions), dtype=bool, count=len(decisions))
            pending: deque[Decision] = deque(d for d in decisions if d.keep)
            rebuild = f"seta-stream index {shard.location} --force" + (
                f" --index-dir {index_dir}" if index_dir is not None else ""
            )
            files = _kept_files(shard.url, source, members, keep, gap, stats, rebuild)
            try:
                head = next(files, None)  # the first read and its headers checked, nothing yielded yet
            except IndexMismatch as exc:
                if on_mismatch == "raise":
                    raise
                _mismatch_fallback(shard, exc, counts)
                yield from _streamed(item, view, counts)
                continue
            tally_all(counts, decisions)
            if head is None:
                continue
            for sample in group_by_keys(files):
                pending.popleft().attach(sample, view.has_score)  # decided once, when reading
                yield sample
    finally:
        counts.update(stats)


read_kept = pipelinefilter(_read_kept)
read_kept.__doc__ = """URL stage: ``read_kept(run, epoch=None, index_dir=None, on_missing="stream",
on_mismatch="stream", gap=65536)``; replaces ``tarfile_to_samples() + keep_filter()`` and reads
only the kept samples' bytes of indexed shards (range requests on object stores and HTTP).
Shards without a usable index are streamed and filtered (``"raise"`` stops instead)."""
