"""Kept-only reading: fetch only the bytes of the samples the plan keeps.

``read_kept(run)`` is a webdataset stage that replaces ``tarfile_to_samples() + keep_filter()``:
for each shard URL it loads the shard's index (``seta_stream.index``), asks the plan of the
current epoch which samples to keep, and reads only their members' byte ranges, in file order,
coalescing ranges separated by less than ``gap`` bytes into one read (one range request on
object stores). Member bytes are grouped into samples by webdataset's own ``group_by_keys``, so
samples are exactly those of the streaming reader (same ``__key__``, ``__url__``, field names
and bytes), with ``__weight__`` (and ``__score__``) attached as by ``keep_filter``.

A shard without an index, or whose index does not match it, is streamed and filtered instead
(``on_missing``/``on_mismatch="stream"``, counted in ``stage_counters()``), or stops with
:class:`~seta_stream.index.IndexMismatch` (``on_mismatch="raise"``). No sample is yielded twice
and no kept sample is skipped: the index lists every member of the shard.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from typing import Any

import fsspec
from webdataset.filters import pipelinefilter
from webdataset.tariterators import group_by_keys, tarfile_samples

from .ids import shard_name
from .index import IndexMismatch, load_index
from .runfs import RunDir
from .stage import _COUNTERS, PlanView, _keep_filter

__all__ = ["read_kept"]

_SKIP_META = re.compile(r"__[^/]*__($|/)")


def _is_meta(name: str) -> bool:
    return ("/" not in name and name.startswith("__") and name.endswith("__")) or bool(_SKIP_META.match(name))


def _ranges(members: list[tuple[str, int, int]], gap: int) -> list[tuple[int, int, list[tuple[str, int, int]]]]:
    """Coalesce member byte ranges (in file order) into reads [start, end)."""
    blocks: list[tuple[int, int, list[tuple[str, int, int]]]] = []
    for name, off, size in members:
        if blocks and off - blocks[-1][1] <= gap:
            start, _, group = blocks[-1]
            group.append((name, off, size))
            blocks[-1] = (start, off + size, group)
        else:
            blocks.append((off, off + size, [(name, off, size)]))
    return blocks


def _files_of_kept(
    url: str,
    idx: dict[str, Any],
    view: PlanView,
    gap: int,
    stats: dict[str, int],
    kept: dict[str, tuple[bool, float, float | None, bool]],
) -> Iterator[dict]:
    """Member files of the kept samples; fills ``kept`` with each kept key's decision."""
    shard = shard_name(url, view.depth)
    members: list[tuple[str, int, int]] = []
    for key, sample_members in idx["samples"]:
        decision = view.decide(shard, key)
        keep, _, _, known = decision
        if not known:
            _COUNTERS["absent_kept" if keep else "absent_dropped"] += 1
        if not keep:
            _COUNTERS["dropped"] += 1
            continue
        _COUNTERS["kept"] += 1
        kept[key] = decision
        members.extend((n, o, s) for n, o, s in sample_members if not _is_meta(n))
    if not members:
        return
    fs, path = fsspec.core.url_to_fs(url)
    with fs.open(path, "rb") as fh:
        for start, end, group in _ranges(members, gap):
            fh.seek(start)
            buf = fh.read(end - start)
            stats["bytes_read"] += end - start
            stats["reads"] += 1
            for name, off, size in group:
                yield {"fname": name, "data": buf[off - start : off - start + size], "__url__": url}


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
        raise ValueError("on_missing and on_mismatch must be 'stream' or 'raise'")
    view = PlanView(run, epoch)
    stats = {"bytes_read": 0, "reads": 0}
    for item in src:
        url = item["url"]
        if view.shard_is_empty(shard_name(url, view.depth)):
            _COUNTERS["shards_skipped"] += 1
            continue
        try:
            idx = load_index(url, index_dir)
        except FileNotFoundError:
            if on_missing == "raise":
                raise
            _COUNTERS["index_missing"] += 1
            idx = None
        except IndexMismatch:
            if on_mismatch == "raise":
                raise
            _COUNTERS["index_mismatch"] += 1
            idx = None
        if idx is None:  # stream this shard and filter it
            yield from _keep_filter(tarfile_samples(iter([item])), view.run, view.epoch)
            continue
        kept: dict[str, tuple[bool, float, float | None, bool]] = {}
        for sample in group_by_keys(_files_of_kept(url, idx, view, gap, stats, kept)):
            _, weight, score, _ = kept.pop(sample["__key__"])  # decided once, when reading
            sample["__weight__"] = weight
            if view.has_score:
                sample["__score__"] = score if score is not None else float("nan")
            yield sample
    _COUNTERS["bytes_read"] += stats["bytes_read"]
    _COUNTERS["range_reads"] += stats["reads"]


read_kept = pipelinefilter(_read_kept)
read_kept.__doc__ = """URL stage: ``read_kept(run, epoch=None, index_dir=None, on_missing="stream",
on_mismatch="stream", gap=65536)``; replaces ``tarfile_to_samples() + keep_filter()`` and reads
only the kept samples' bytes of indexed shards."""
