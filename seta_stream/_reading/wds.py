"""What differs between the webdataset releases seta_stream supports (0.2.86 to 1.x).

* ``group_by_keys``: webdataset's grouper, with an empty dict ``{}`` in the member stream ending
  the current sample on every release. webdataset 1.x does that itself (its tar reader marks
  each shard's end with ``{}``); 0.2.x's grouper reads ``{}`` as a member and fails with
  ``KeyError: 'fname'``, so there each run of members between two markers is grouped on its
  own. The readers use the marker to keep two samples apart (a shard's end, a key that comes
  back after a dropped sample), so they yield the same samples on every release. (webdataset
  0.2.x's own ``tarfile_to_samples`` has no marker: a shard whose first key equals the
  previous shard's last key continues that sample, which 1.x fixed.)
* ``WEBDATASET_MARKS_SHARD_ENDS``: whether the installed grouper understands the marker.

And how a webdataset pipeline (its ``pipeline`` list of stages) is recognised, on every release:

* :func:`find_tar_reader`: where the pipeline reads tar shards (:class:`TarReader`): a stage
  given by the caller; ``wds.tarfile_to_samples(...)`` (anywhere, also 0.2's ``wds.WebDataset``);
  a tar reader known by name (OpenCLIP's ``tarfile_to_samples_nothrow``, ``READER_NAMES``) or
  0.2's caching reader; 1.x's ``wds.WebDataset`` (an opener, ``StreamingOpen`` or ``FileCache``,
  then ``tar_file_expander`` + ``group_by_keys``, then ``check_empty``); a grouper alone. It
  says which of them seta_stream's own reader may replace (webdataset's, configured only with
  ``handler``, ``select_files``, ``rename_files``) and where the shard stage goes.
* :func:`splitter_positions`, :func:`resampled_source`: the shard splitters
  (``split_by_node``, ``split_by_worker``, ``single_node_only``, as stages and as 1.x
  ``wds.WebDataset``'s nodesplitter/workersplitter) and a shard source drawing with replacement.
* :func:`drop_check_empty`: the pipeline without webdataset's ``check_empty``.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Generator, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from webdataset.handlers import reraise_exception
from webdataset.tariterators import group_by_keys as _wds_group_by_keys
from webdataset.tariterators import tar_file_expander, tarfile_samples

from ..errors import UnsupportedPipelineError

__all__ = [
    "group_by_keys",
    "WEBDATASET_MARKS_SHARD_ENDS",
    "TarReader",
    "find_tar_reader",
    "READER_NAMES",
    "SPLITTER_NAMES",
    "splitter_positions",
    "resampled_source",
    "drop_check_empty",
]


def _marks_shard_ends() -> bool:
    members = [{"fname": "a.x", "data": b"", "__url__": "u"}, {}, {"fname": "a.y", "data": b"", "__url__": "u"}]
    try:
        return len(list(_wds_group_by_keys(iter(members)))) == 2
    except KeyError:  # 0.2.x: the marker is read as a member
        return False


WEBDATASET_MARKS_SHARD_ENDS = _marks_shard_ends()


def group_by_keys(
    data: Iterable[dict[str, Any]], handler: Callable[[Exception], bool] = reraise_exception
) -> Iterator[dict[str, Any]]:
    """webdataset's ``group_by_keys(data, handler=handler)``; ``{}`` ends the current sample."""
    if WEBDATASET_MARKS_SHARD_ENDS:
        yield from _wds_group_by_keys(data, handler=handler)
        return
    members = iter(data)
    ended = False

    def segment() -> Generator[dict[str, Any], None, None]:
        nonlocal ended
        for member in members:
            if not member:
                return
            yield member
        ended = True

    while not ended:
        run = segment()
        yield from _wds_group_by_keys(run, handler=handler)
        # the grouper stopped early (its handler said stop): so does 1.x's
        if inspect.getgeneratorstate(run) != inspect.GEN_CLOSED:
            return


# ------------------------------------------------------------------ recognising a pipeline

#: tar readers recognised in a DataPipeline by their function's name: OpenCLIP's
#: (open_clip_train.data, copied into many training codebases), which groups members without
#: raising on a repeated file name. The keep filter goes after them.
READER_NAMES = ("tarfile_to_samples_nothrow",)

#: the shard splitters: webdataset's (both in wds.WebDataset's nodesplitter/workersplitter and as
#: DataPipeline stages), recognised by function name
SPLITTER_NAMES = ("split_by_node", "split_by_worker", "single_node_only")

#: the keyword arguments webdataset's tar reader may have for seta_stream's to take its place
_READER_KW = frozenset({"handler", "select_files", "rename_files"})


@dataclass(frozen=True)
class TarReader:
    """Where a pipeline reads its tar shards: stages ``start`` to ``stop - 1``.

    ``replace``: the keyword arguments (``handler``, ``select_files``, ``rename_files``) of a
    webdataset tar reader seta_stream's own reader may take the place of, None where the reader
    stays and the keep filter goes after it. ``opened``: the reader reads opened shards (1.x
    ``wds.WebDataset``'s ``tar_file_expander`` + ``group_by_keys``, or a grouper), not URLs.
    ``shards_at``: where the shard stage goes (right before a reader of URLs, before the opener
    of a reader of opened shards), None where no place is known (a grouper without an opener).
    ``check_empty``: the pipeline holds webdataset's ``check_empty`` after an opener."""

    start: int
    stop: int
    replace: dict[str, Any] | None
    opened: bool
    shards_at: int | None
    check_empty: bool = False


def _runs(st: Any, f: Any) -> bool:
    """Whether pipeline stage ``st`` is ``f`` or a pipelinefilter stage of ``f``."""
    return st is f or getattr(st, "f", None) is f


def _reader_name(st: Any) -> str | None:
    return getattr(getattr(st, "f", st), "__name__", None)


def _plain(st: Any, allowed: frozenset[str] | set[str]) -> bool:
    """A pipelinefilter stage given no positional argument and only keywords of ``allowed``."""
    return not getattr(st, "args", ()) and set(getattr(st, "kw", {})) <= allowed


def find_tar_reader(pipeline: list[Any], reader: Any = None) -> TarReader:
    """The tar reader of ``pipeline`` (a ``wds.WebDataset``'s or ``wds.DataPipeline``'s stages)
    on webdataset 0.2.86 to 1.x: ``reader`` itself when given; else the first
    ``wds.tarfile_to_samples(...)`` (before any reader known by name) and where no opener
    precedes it, a reader known by name (``READER_NAMES``, 0.2's caching reader), 1.x
    ``wds.WebDataset``'s expander + grouper, or a grouper alone (see :class:`TarReader`).

    Raises :class:`~seta_stream.errors.UnsupportedPipelineError` where none is found."""
    import webdataset as wds
    from webdataset import cache as wds_cache
    from webdataset import compat as wds_compat

    def find(test: Callable[[Any], bool]) -> int | None:
        return next((i for i, st in enumerate(pipeline) if test(st)), None)

    if reader is not None:
        at = find(lambda st: _runs(st, reader))
        if at is None:
            raise UnsupportedPipelineError(
                f"attach(reader={getattr(reader, '__name__', reader)!r}): that stage is not in this pipeline; "
                "pass the object the pipeline holds (the tar reader function or stage), or leave reader out"
            )
        return TarReader(at, at + 1, None, opened=False, shards_at=at)
    openers = tuple(c for c in (getattr(wds_cache, name, None) for name in ("StreamingOpen", "FileCache")) if c)
    cached = getattr(wds_cache, "cached_tarfile_samples", None)  # webdataset 0.2's WebDataset(cache_dir=...)
    opener = find(lambda st: bool(openers) and isinstance(st, openers))
    grouper = find(lambda st: _runs(st, _wds_group_by_keys) or st is wds.tarfile_to_samples)
    tar_reader = find(lambda st: getattr(st, "f", None) is tarfile_samples)
    named = find(lambda st: _reader_name(st) in READER_NAMES or (cached is not None and _runs(st, cached)))
    if opener is None and tar_reader is not None and (named is None or tar_reader < named):
        # wds.tarfile_to_samples(...), also 0.2's wds.WebDataset
        st = pipeline[tar_reader]
        replace = dict(st.kw) if _plain(st, _READER_KW) else None
        return TarReader(tar_reader, tar_reader + 1, replace, opened=False, shards_at=tar_reader)
    if opener is None and named is not None:
        return TarReader(named, named + 1, None, opened=False, shards_at=named)
    check_empty = getattr(wds_compat, "check_empty", None)
    empty = opener is not None and check_empty is not None and any(st is check_empty for st in pipeline)
    if (
        grouper is not None
        and grouper > 0
        and getattr(pipeline[grouper - 1], "f", None) is tar_file_expander
        and _plain(pipeline[grouper - 1], _READER_KW)
        and _plain(pipeline[grouper], {"handler"})
    ):  # webdataset 1.x's wds.WebDataset: tar_file_expander(...) + group_by_keys(handler=...)
        kw = {**pipeline[grouper - 1].kw, **pipeline[grouper].kw}
        return TarReader(grouper - 1, grouper + 1, kw, opened=True, shards_at=opener, check_empty=empty)
    if grouper is not None:
        return TarReader(grouper, grouper + 1, None, opened=True, shards_at=opener, check_empty=empty)
    raise UnsupportedPipelineError(
        "attach(): no tar reader found in this pipeline; expected wds.tarfile_to_samples(), a wds.WebDataset, "
        f"or a stage named {' or '.join(READER_NAMES)}; pass your tar reader stage as attach(ds, run, "
        "reader=...), or put seta_stream.kept_tar_samples(run) in place of the tar reader yourself"
    )


def drop_check_empty(pipeline: list[Any]) -> None:
    """Remove webdataset's ``check_empty`` from ``pipeline`` (in place)."""
    from webdataset import compat as wds_compat

    check_empty = getattr(wds_compat, "check_empty", None)
    pipeline[:] = [st for st in pipeline if st is not check_empty]


def splitter_positions(pipeline: list[Any]) -> list[int]:
    """The positions of the pipeline's shard splitters (``SPLITTER_NAMES``: webdataset's, or
    stages of functions of those names)."""
    import webdataset as wds

    known = [f for f in (getattr(wds, n, None) for n in SPLITTER_NAMES) if f is not None]

    def splits(st: Any) -> bool:
        f = getattr(st, "f", st)  # a stage, or a pipelinefilter stage of a function
        return any(f is k for k in known) or getattr(f, "__name__", None) in SPLITTER_NAMES

    return [i for i, st in enumerate(pipeline) if splits(st)]


def resampled_source(pipeline: list[Any]) -> str | None:
    """The type name of the pipeline's shard source where it draws shards with replacement
    (webdataset's ``ResampledShards``, ``ResampledShardList``), else None."""
    if pipeline and "Resampled" in type(pipeline[0]).__name__:
        return type(pipeline[0]).__name__
    return None
