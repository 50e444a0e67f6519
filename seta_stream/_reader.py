"""Kept-only reading: fetch only the bytes of the samples the plan keeps.

``read_kept(run)`` is a webdataset stage that replaces ``tarfile_to_samples() + keep_filter()``:
for each shard URL it loads the shard's index (``seta_stream.index``), asks the plan of the
current epoch which samples to keep, and reads only their members' byte ranges, in file order,
coalescing ranges separated by less than ``gap`` bytes into one read (one range request on
object stores and HTTP). Member bytes are grouped into samples by webdataset's own
``group_by_keys``, one sample per run of consecutive members with the same key, so samples are
exactly those of the streaming reader (same ``__key__``, ``__url__``, field names and bytes; a
key that comes back later in the shard is another sample, as webdataset has it), with
``__weight__`` (and ``__score__``) attached as by ``keep_filter``. The tar header in front of
every member read is checked against the index (name, size, checksum): an index that describes
other bytes is refused, never used to cut samples.

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
:class:`~seta_stream.index.IndexMissing` or :class:`~seta_stream.index.IndexMismatch` instead.
A URL with a query string has its index only in ``index_dir`` (see ``seta_stream.index``);
without one it is streamed, with a warning once per process and folder. No sample is yielded twice and no
kept sample is skipped: the index lists every member of the shard.
"""

from __future__ import annotations

import re
import warnings
from collections import Counter, deque
from collections.abc import Iterable, Iterator
from typing import Any

from fsspec.implementations.local import LocalFileSystem
from webdataset.filters import pipelinefilter
from webdataset.tariterators import tar_file_expander, tarfile_samples

from ._planview import Decision, PlanView, StageCounts, kept_samples
from ._runfs import RunDir
from ._wds import group_by_keys
from .errors import InvalidInputError
from .ids import shard_location
from .index import (
    IndexMismatch,
    IndexMissing,
    byte_source,
    has_query,
    load_index,
    member_header_matches,
    open_fs,
)

__all__ = ["read_kept"]

_SKIP_META = re.compile(r"__[^/]*__($|/)")
_HEADER = 512
#: a coalesced read stops growing at this size (a single larger member is still one read)
_MAX_BLOCK = 8 << 20
#: bytes fetched by one batch of concurrent range requests on remote filesystems
_MAX_BATCH = 64 << 20
_WARNED: set[tuple[str, str]] = set()

Member = tuple[str, int, int]  # (tar member name, data offset, size)


def _is_meta(name: str) -> bool:
    """Members webdataset's tar reader skips (``__x__`` and the default ``skip_meta``)."""
    return ("/" not in name and name.startswith("__") and name.endswith("__")) or bool(_SKIP_META.match(name))


def _warn_once(kind: str, url: str, message: str) -> None:
    """Warn once per process for each kind of problem and host (or local folder) of the shards."""
    where = url.split("?", 1)[0].rsplit("/", 1)[0]
    if (kind, where) not in _WARNED:
        _WARNED.add((kind, where))
        warnings.warn(message, UserWarning, stacklevel=3)


def _samples_of(idx: dict[str, Any]) -> list[tuple[str, list[Member]]]:
    """The shard's samples as the streaming reader groups them: runs of consecutive members with
    the same key, members webdataset skips (meta members) left out."""
    out: list[tuple[str, list[Member]]] = []
    for key, members in idx["samples"]:
        kept = [(n, int(o), int(s)) for n, o, s in members if not _is_meta(n)]
        if not kept:
            continue
        if out and out[-1][0] == key:  # only skipped members stood between them
            out[-1][1].extend(kept)
        else:
            out.append((key, kept))
    return out


def _ranges(members: list[Member], gap: int, max_block: int = _MAX_BLOCK) -> list[tuple[int, int, list[Member]]]:
    """Coalesce member byte ranges (in file order) into reads [start, end); each read starts at
    its first member's tar header (512 bytes before the data) so the header can be checked."""
    blocks: list[tuple[int, int, list[Member]]] = []
    for name, off, size in members:
        head = off - _HEADER
        if blocks and head - blocks[-1][1] <= gap and off + size - blocks[-1][0] <= max_block:
            start, _, group = blocks[-1]
            group.append((name, off, size))
            blocks[-1] = (start, off + size, group)
        else:
            blocks.append((head, off + size, [(name, off, size)]))
    return blocks


def _read_blocks(url: str, source: str, blocks: list[tuple[int, int, list[Member]]]) -> Iterator[bytes]:
    """The bytes of each block, in order: one seek+read per block on local files, one range
    request per block (issued in concurrent batches) elsewhere."""
    fs, path = open_fs(source)
    if isinstance(fs, LocalFileSystem):
        with fs.open(path, "rb") as fh:
            for start, end, _ in blocks:
                fh.seek(start)
                yield _checked(url, fh.read(end - start), start, end)
        return
    i = 0
    while i < len(blocks):
        j, total = i, 0
        # the first read goes alone: a server that ignores Range sends the whole shard once, not per read
        while j < len(blocks) and (j == i or (i > 0 and total + blocks[j][1] - blocks[j][0] <= _MAX_BATCH)):
            total += blocks[j][1] - blocks[j][0]
            j += 1
        batch = blocks[i:j]
        datas = fs.cat_ranges([path] * len(batch), [b[0] for b in batch], [b[1] for b in batch], on_error="raise")
        for (start, end, _), data in zip(batch, datas):
            yield _checked(url, data, start, end)
        i = j


def _checked(url: str, data: bytes, start: int, end: int) -> bytes:
    if len(data) != end - start:
        raise IndexMismatch(
            f"{url}: asked for bytes {start}-{end - 1} ({end - start} bytes), got {len(data)}; expected the "
            "exact range. The shard is shorter than its index says, or the server does not honour range "
            "requests (HTTP 'Range' headers); rebuild the index, or let read_kept stream such shards "
            "(on_mismatch='stream', the default)"
        )
    return bytes(data)


def _kept_files(
    url: str,
    source: str,
    samples: list[tuple[str, list[Member]]],
    decisions: list[Decision],
    gap: int,
    stats: Counter[str],
    rebuild: str,
) -> Iterator[dict[str, Any]]:
    """Member files of the kept samples, a ``{}`` after each sample (so that two samples are
    never grouped into one), with every member's tar header checked.

    Raises IndexMismatch before yielding anything if the first read does not match the index.
    """
    members: list[Member] = []
    last_of_sample: set[int] = set()  # offsets of the last member of each kept sample
    for (_, sample_members), decision in zip(samples, decisions):
        if decision.keep:
            members.extend(sample_members)
            last_of_sample.add(sample_members[-1][1])
    first = True
    blocks = _ranges(members, gap)
    for (start, end, group), buf in zip(blocks, _read_blocks(url, source, blocks)):
        stats["bytes_read"] += end - start
        stats["range_reads"] += 1
        for name, off, size in group:
            if not member_header_matches(buf[off - _HEADER - start : off - start], name, size):
                raise IndexMismatch(
                    f"{url}: the tar header at byte {off - _HEADER} is not that of member {name!r} ({size} bytes) "
                    "as the index says; expected the index to describe this shard. "
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
        for name, off, size in group:
            yield {"fname": name, "data": buf[off - start : off - start + size], "__url__": url}
            if off in last_of_sample:
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


def _mismatch_fallback(url: str, exc: IndexMismatch, counts: StageCounts) -> None:
    """Count a shard streamed because its index was refused, and say so once per folder."""
    counts["index_mismatch"] += 1
    _warn_once(
        "mismatch",
        shard_location(url),
        f"read_kept streams {url} instead of reading only its kept samples: {exc}. Warned once per process "
        "and folder; every shard streamed so is counted in seta_stream.stage_counters()['index_mismatch'], "
        "and read_kept(..., on_mismatch='raise') stops instead",
    )


def _find_index(
    url: str, index_dir: str | None, on_missing: str, on_mismatch: str, counts: StageCounts
) -> dict[str, Any] | None:
    if index_dir is None and has_query(url):
        counts["index_missing"] += 1
        message = (
            f"read_kept: {url} has a query string (a signed URL?); its index is looked up only in an "
            "index_dir (an index beside the shard would need its own signature). Streaming shards like it; "
            "write indexes with `seta-stream index URL --index-dir DIR` and pass read_kept(run, index_dir=DIR)"
        )
        if on_missing == "raise":
            raise IndexMissing(message)
        _warn_once("query", shard_location(url), message)
        return None
    if byte_source(url) is None:  # a pipe: command whose shard cannot be read around it
        if on_missing == "raise":
            raise IndexMissing(f"{url}: the shard the pipe: command reads cannot be range-read around the command")
        counts["index_missing"] += 1
        return None
    try:
        return load_index(url, index_dir)
    except FileNotFoundError:
        if on_missing == "raise":
            raise
        counts["index_missing"] += 1
    except IndexMismatch as exc:
        if on_mismatch == "raise":
            raise
        _mismatch_fallback(url, exc, counts)
    except Exception as exc:
        if not url.startswith("pipe:"):
            raise
        # the shard a pipe: command reads may not be reachable through fsspec (credentials,
        # protocol packages): the command itself can still read it
        if on_missing == "raise":
            raise IndexMissing(f"{url}: its index could not be read through fsspec ({exc!r})") from exc
        counts["index_missing"] += 1
        _warn_once(
            "pipe",
            shard_location(url),
            f"read_kept: the index of {url} could not be read through fsspec ({exc!r}); streaming "
            "pipe: shards like it by running their command",
        )
    return None


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
            url = item["url"]
            plan = view.shard_of(url)
            if plan.is_empty:
                counts["shards_skipped"] += 1
                continue
            idx = _find_index(url, index_dir, on_missing, on_mismatch, counts)
            source = byte_source(url) if idx is not None else None
            if idx is None or source is None:
                yield from _streamed(item, view, counts)
                continue
            samples = _samples_of(idx)
            decisions = [plan.decide(key) for key, _ in samples]
            pending: deque[Decision] = deque(d for d in decisions if d.keep)
            rebuild = f"seta-stream index {shard_location(url)} --force" + (
                f" --index-dir {index_dir}" if index_dir is not None else ""
            )
            files = _kept_files(url, source, samples, decisions, gap, stats, rebuild)
            try:
                head = next(files, None)  # the first read and its headers checked, nothing yielded yet
            except IndexMismatch as exc:
                if on_mismatch == "raise":
                    raise
                _mismatch_fallback(url, exc, counts)
                yield from _streamed(item, view, counts)
                continue
            for decision in decisions:
                counts.count(decision)
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
