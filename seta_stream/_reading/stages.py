"""webdataset stages that apply the plan of the current epoch inside DataLoader workers.

* :func:`skip_shards` (url stage, before the tar opener): drops shards the plan keeps nothing
  of, before they are opened.
* :func:`keep_filter` (sample stage, after the tar reader, before decode): drops samples the
  plan does not keep and attaches ``__weight__`` (and ``__score__`` for ES/ESWP plans).
* :func:`kept_tar_samples` (URL stage, replaces ``tarfile_to_samples() + keep_filter()``): the
  same samples, but the tar reader skips the data of members of samples the plan drops
  (webdataset's ``select_files`` hook) instead of reading them and dropping them afterwards.
  Plain tar shards are read by :func:`seta_stream._reading.tario.tar_members` (what webdataset's
  ``tar_file_iterator`` yields, with cheaper header parsing); compressed ones by webdataset.
* :func:`attach` inserts them into an existing ``wds.WebDataset(...)``.
* :func:`weighted_mean` is the training loop's one-line loss helper.

Epoch discovery: when an iterator of a stage starts (every ``iter(loader)``, in every worker,
fork or spawn, persistent or not), the stage reads ``state.json`` of the run directory and uses
its ``current_epoch``, which ``plan_epoch`` / ``Pruner.start_epoch`` set. So the user publishes
the plan of epoch e *before* ``iter(loader)`` of epoch e; nothing else is passed to workers.
An explicit ``epoch=`` pins a stage to one epoch instead.

Memory: a worker reads the plan's summary and shards.arrow when an iterator starts, then the
rows of a shard (one record batch of stage.arrow: a slice of the memory-mapped file locally, one
range request on object stores) when it decides a sample of that shard, and turns only the
current shard's rows into a Python dict, so what it fetches and holds grows with the shards it
opens, not with the data set (``seta_stream._reading.planview``). Stages write nothing; they count
(``stage_counters()``, per process).

Samples absent from the plan (new data, or never recorded) follow the plan's absent rule:
kept with weight 1 (default), or, for score-free policies, kept iff their per-sample uniform
is below the keep fraction (the same draw the planner makes, docs/algorithms.md §0.2).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import numpy as np
from webdataset.filters import pipelinefilter
from webdataset.handlers import reraise_exception
from webdataset.tariterators import url_opener

from .._kernels.batches import check_batch_size
from .._store.runfs import RunDir
from ..errors import InvalidInputError, UnsupportedPipelineError
from .balance import (
    BalancedView,
    note_balanced_reader,
    noting_stage,
    ranks_here,
    replace_splitters,
    split_balanced_shared,
)
from .planview import Decision, PlanView, StageCounts, kept_samples, stage_counters, tally
from .tario import tar_members
from .wds import drop_check_empty, find_tar_reader, group_by_keys

__all__ = [
    "keep_filter",
    "kept_tar_samples",
    "skip_shards",
    "attach",
    "weighted_mean",
    "stage_counters",
    "PlanView",
]


class _Views:
    """Where a stage gets the plan view of its iterator. Each stage alone opens its own; the
    two stages :func:`attach` puts into one pipeline share one: the sample stage opens it when
    the worker's iterator starts, and the shard stage upstream of it, which starts when the
    sample stage first pulls, takes that view instead of opening another. So a worker reads
    the summary and the shard index of each bucket it meets once an epoch, not once per stage
    (on an object store: one GET each), and both stages decide with the same epoch's plan
    even if the current epoch changed between their starts.

    ``balance`` (a dict, possibly empty: rank and world_size when known): the views are
    :class:`~seta_stream._reading.balance.BalancedView` of the worker's slot (docs/ranks.md)."""

    def __init__(
        self, run: str | RunDir, epoch: int | None, shared: bool = False, balance: dict[str, int] | None = None
    ) -> None:
        self.run, self.epoch, self.shared, self.balance = run, epoch, shared, balance
        self._handed: PlanView | None = None

    def _new(self) -> PlanView:
        if self.balance is None:
            return PlanView(self.run, self.epoch)
        return BalancedView(self.run, self.epoch, **self.balance)

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_handed": None}  # a worker opens its own

    def open(self) -> PlanView:
        """A new view (the sample stage, at its iterator's start)."""
        view = self._new()
        if self.shared:
            self._handed = view
        return view

    def take(self) -> PlanView:
        """The view the sample stage just opened, or a new one (the shard stage)."""
        view, self._handed = self._handed, None
        return view if view is not None else self._new()


def _keep_filter(
    src: Iterable[dict[str, Any]], run: str | RunDir, epoch: int | None = None, balance: bool = False
) -> Iterator[dict[str, Any]]:
    return _keep_filter_of(src, _Views(run, epoch, balance={} if balance else None))


def _keep_filter_of(src: Iterable[dict[str, Any]], views: _Views) -> Iterator[dict[str, Any]]:
    # kept_samples' generator itself (no generator around it: each costs every sample a step);
    # it opens the view when the iterator starts
    return kept_samples(src, views.open, StageCounts())


#: keys of a uniformly decided shard held at most before they are counted (bounds memory)
_PENDING_KEYS = 1 << 16

#: webdataset.tariterators.base_plus_ext's pattern, compiled (it is matched once per member):
#: group 1 is the sample key webdataset's group_by_keys gives the member.
_BASE_PLUS_EXT = re.compile(r"^((?:.*/|)[^.]+)[.]([^/]*)$")


class _KeptMembers:
    """The ``select_files`` predicate of one shard: True for the members of kept samples.

    A sample is a run of consecutive members with the same key (as group_by_keys groups them);
    each run is decided once with the plan and counted once, like keep_filter counts samples.
    """

    def __init__(self, view: PlanView, url: str, select_files: Callable[[str], bool] | None) -> None:
        self.url, self.user_select = url, select_files
        self.plan = view.shard_of(url)
        self.shard = self.plan.shard
        # nothing to skip in a shard the plan keeps whole: its members are read unfiltered and
        # its samples decided after grouping, as keep_filter does
        self.keeps_all = self.plan.keeps_all
        self.key: str | None = None  # key of the current run of members, and its decision
        self.keep = False
        self.run = 0  # ordinal of the current run within the shard
        self.kept: dict[str, Decision] = {}
        self.counts = Counter[str]()

    def __call__(self, fname: str) -> bool:
        if self.user_select is not None and not self.user_select(fname):
            return False
        match = _BASE_PLUS_EXT.match(fname)
        if match is None:  # group_by_keys skips it as well
            return False
        key = match.group(1)
        if key == self.key:
            return self.keep
        decision = self.plan.decide(key)
        tally(self.counts, decision)
        self.key, self.keep, self.run = key, decision.keep, self.run + 1
        if self.keep:
            self.kept[key] = decision
        return self.keep


def _kept_samples_of_streams(
    src: Iterable[dict[str, Any]],
    views: _Views,
    handler: Callable[[Exception], bool] = reraise_exception,
    select_files: Callable[[str], bool] | None = None,
    rename_files: Callable[[str], str] | None = None,
) -> Iterator[dict[str, Any]]:
    """Opened shards ({url, stream}) -> kept samples: webdataset's tar_file_expander and
    group_by_keys, with a select_files that consults the plan of the shard."""
    view = views.open()
    has_score = view.has_score
    counts = StageCounts()
    # the current shard's selector and the previous one's: group_by_keys yields the last sample
    # of a shard when it reads the end-of-shard marker, or, after a read error the handler
    # skipped, the first member of the next shard
    recent: list[_KeptMembers] = []

    def files() -> Iterator[dict[str, Any]]:
        for source in src:
            url = source["url"]
            local_path = source.get("local_path")
            select = _KeptMembers(view, url, select_files)
            recent[:] = [*recent[-1:], select]
            try:
                last_key, last_run = None, 0
                for sample in tar_members(
                    source["stream"],
                    handler=handler,
                    select_files=select_files if select.keeps_all else select,
                    rename_files=rename_files,
                ):
                    if select.run != last_run:
                        if select.key == last_key:
                            # the same key again after a dropped sample: group_by_keys saw the
                            # dropped one in between, so this is a new sample, not a continuation
                            yield {}
                        last_key, last_run = select.key, select.run
                    sample["__url__"] = url
                    if local_path is not None:
                        sample["__local_path__"] = local_path
                    yield sample
                yield {}  # end of shard, as tar_file_expander marks it
            except Exception as exn:
                exn.args = exn.args + (source.get("stream"), source.get("url"))
                if handler(exn):
                    continue
                break
            finally:
                counts.update(select.counts)
                select.counts.clear()

    kept = absent_kept = 0  # samples of shards kept whole, decided here
    # a shard whose every sample gets the same decision (ShardDecisions.uniform) is decided once:
    # its samples' keys are counted as listed or absent when its run of samples ends, hashed at once
    pending: list[str] = []
    pending_of: _KeptMembers | None = None  # the selector of the shard the pending keys are of

    def settle() -> None:
        nonlocal absent_kept
        if pending_of is not None and pending:
            absent_kept += pending_of.plan.count_unlisted(pending)
        pending.clear()

    try:
        for sample in group_by_keys(files(), handler=handler):
            url, key = sample["__url__"], sample["__key__"]
            select = recent[-1]
            if select.url != url:
                select = next(s for s in recent if s.url == url)
            if select.keeps_all:
                kept += 1
                uniform = select.plan.uniform
                if uniform is not None:
                    if select is not pending_of or len(pending) >= _PENDING_KEYS:
                        settle()
                        pending_of = select
                    pending.append(key)
                    uniform.attach(sample, has_score)
                    yield sample
                    continue
                decision = select.plan.decide(key)
                absent_kept += not decision.known
            else:
                decision = select.kept[key]
            decision.attach(sample, has_score)
            yield sample
    finally:
        settle()
        counts.update(kept=kept, absent_kept=absent_kept)


def _kept_tar_samples(
    src: Iterable[dict[str, Any]],
    run: str | RunDir,
    epoch: int | None = None,
    handler: Callable[[Exception], bool] = reraise_exception,
    select_files: Callable[[str], bool] | None = None,
    rename_files: Callable[[str], str] | None = None,
    balance: bool = False,
) -> Iterator[dict[str, Any]]:
    views = _Views(run, epoch, balance={} if balance else None)
    yield from _kept_tar_samples_of(src, views, handler, select_files, rename_files)


def _kept_tar_samples_of(
    src: Iterable[dict[str, Any]],
    views: _Views,
    handler: Callable[[Exception], bool] = reraise_exception,
    select_files: Callable[[str], bool] | None = None,
    rename_files: Callable[[str], str] | None = None,
) -> Iterator[dict[str, Any]]:
    streams = url_opener(src, handler=handler)
    yield from _kept_samples_of_streams(streams, views, handler, select_files, rename_files)


def _skip_shards(
    src: Iterable[dict[str, Any]], run: str | RunDir, epoch: int | None = None, empty_check: bool = False
) -> Iterator[dict[str, Any]]:
    yield from _skip_shards_of(src, _Views(run, epoch), empty_check)


def _skip_shards_of(
    src: Iterable[dict[str, Any]], views: _Views, empty_check: bool = False
) -> Iterator[dict[str, Any]]:
    if views.balance is not None:  # split_balanced, upstream, passes only the slot's shards (and takes the view)
        yield from src
        return
    view = views.take()
    counts = StageCounts()
    shards = 0
    for item in src:
        shards += 1
        if view.shard_of(item["url"]).is_empty:
            counts["shards_skipped"] += 1
            continue
        counts["shards_passed"] += 1
        yield item
    if empty_check and shards == 0:
        # webdataset's check_empty, moved here by attach(): a worker whose shards the plan
        # emptied yields no sample, which is a normal epoch under pruning; a worker that was
        # given no shard at all still is an error
        raise InvalidInputError(
            "No samples found in dataset; perhaps you have fewer shards than workers. This DataLoader worker "
            "was given no shard (webdataset's check, made before the plan filters samples); use at most as "
            "many workers x ranks as shards, or turn the check off with empty_check=False in the WebDataset constructor"
        )


keep_filter = noting_stage(_keep_filter, "keep_filter(run, balance=True)")
keep_filter.__doc__ = """Sample stage: ``keep_filter(run, epoch=None, balance=False)``; put it after
the tar reader (``wds.tarfile_to_samples()``) and before decode. Drops samples the current plan
does not keep; attaches ``__weight__`` (float) and, for ES/ESWP plans, ``__score__``.
``balance=True``: keeps only this (rank, worker) slot's share of a balanced epoch, behind
``split_balanced(run)`` (docs/ranks.md)."""
kept_tar_samples = noting_stage(_kept_tar_samples, "kept_tar_samples(run, balance=True)")
kept_tar_samples.__doc__ = """URL stage: ``kept_tar_samples(run, epoch=None, handler=reraise_exception,
select_files=None, rename_files=None, balance=False)``; replaces ``wds.tarfile_to_samples() +
keep_filter(run)`` and yields exactly their samples (same order, fields, ``__weight__`` and
``__score__``, same counters), but the data of members of dropped samples is skipped, not read
into memory. ``select_files``/``rename_files`` are webdataset's, applied before the plan.
``balance=True``: this slot's share of a balanced epoch, behind ``split_balanced(run)``."""
_kept_streams = pipelinefilter(_kept_samples_of_streams)
_kept_tar_samples_shared = pipelinefilter(_kept_tar_samples_of)
_keep_filter_shared = pipelinefilter(_keep_filter_of)
_skip_shards_shared = pipelinefilter(_skip_shards_of)
skip_shards = pipelinefilter(_skip_shards)
skip_shards.__doc__ = """URL stage: ``skip_shards(run, epoch=None)``; put it after
split_by_node/split_by_worker and before the tar reader. Drops shards the current plan keeps
no sample of, without opening them."""


def attach(ds: Any, run: str | RunDir, *, epoch: int | None = None, reader: Any = None, balance: bool = False) -> Any:
    """Make a ``wds.WebDataset`` or a ``wds.DataPipeline`` read only what the plan keeps.

    ``skip_shards`` goes right before the tar reader (after the shard list and the node,
    worker and shuffle stages on shard URLs), or before the tar opener of a ``wds.WebDataset``
    of webdataset 1.x. webdataset's own tar reader (1.x ``wds.WebDataset``'s expander +
    grouper, or ``wds.tarfile_to_samples(...)`` anywhere) is replaced by the equivalent of
    :func:`kept_tar_samples`, keeping its ``handler``, ``select_files`` and ``rename_files``; any
    other tar reader keeps its place and gets :func:`keep_filter` right after it: a reader
    configured otherwise (a custom grouper), webdataset 0.2's caching reader, OpenCLIP's
    ``tarfile_to_samples_nothrow`` (recognised by name, ``READER_NAMES``), or the stage passed as
    ``reader``. Returns ``ds`` (modified in place) for chaining. Call it before the DataLoader's
    workers start (they take a copy of the pipeline).

    ``balance=True``: every (rank, DataLoader worker) slot gets exactly the same number of the
    epoch's kept samples, so every rank takes the same number of steps (docs/ranks.md).
    ``split_balanced`` replaces the pipeline's ``split_by_node``/``single_node_only`` and
    ``split_by_worker`` (or goes right after the shard source), and the keep stage keeps only
    the slot's share. The rank and world size of the calling process, when it is one of
    several, are handed to the workers. Needs plans made with the population listing.

    Which stages are webdataset's tar reader, opener and splitters, on each release, is
    :mod:`seta_stream._reading.wds`'s to say (:func:`~seta_stream._reading.wds.find_tar_reader`);
    this function puts the plan's stages around what it finds.
    """
    run_url = run if isinstance(run, RunDir) else RunDir(run)
    pipeline = getattr(ds, "pipeline", None)
    if not isinstance(pipeline, list):
        raise UnsupportedPipelineError(
            f"attach() needs a wds.WebDataset or wds.DataPipeline, got {type(ds).__name__}; wrap the shard "
            "list in wds.WebDataset(urls, ...) first, or put seta_stream.skip_shards(run) and "
            "seta_stream.kept_tar_samples(run) into your own pipeline"
        )
    views = _Views(run_url, epoch, shared=True, balance=ranks_here() if balance else None)
    if balance:
        replace_splitters(list(pipeline), None)  # its refusals, before any change
        note_balanced_reader(run_url, "attach(balance=True)")
    found = find_tar_reader(pipeline, reader)
    # the sample stage: ours in place of webdataset's tar reader, or the keep filter after a reader
    if found.replace is None:
        pipeline.insert(found.stop, _keep_filter_shared(views))
    elif found.opened:
        pipeline[found.start : found.stop] = [_kept_streams(views, **found.replace)]
    else:
        pipeline[found.start : found.stop] = [_kept_tar_samples_shared(views, **found.replace)]
    # the shard stage upstream, where the pipeline still holds shard URLs
    if found.shards_at is None:  # a grouper without an opener attach knows: the sample stage alone
        views.shared = False
    elif found.opened:
        # webdataset's check_empty fails a worker whose samples the plan dropped; the shard stage
        # checks instead that the worker was given shards at all
        if found.check_empty:
            drop_check_empty(pipeline)
        pipeline.insert(found.shards_at, _skip_shards_shared(views, empty_check=found.check_empty))
    else:
        pipeline.insert(found.shards_at, _skip_shards_shared(views))
    if balance:  # in place of the shard splitters (upstream of every stage inserted above)
        replace_splitters(pipeline, split_balanced_shared(views))
    return ds


def weighted_mean(losses: Any, weights: Any, batch_size: int | None = None) -> Any:
    """mean_j(weight_j * loss_j) over the batch (divided by the batch size, docs/algorithms.md §0.7).

    ``weights`` is the batch's ``__weight__`` (tensor or list), or the collated batch dict.
    ``batch_size``: divide the sum by this nominal batch size instead of the batch's length,
    so that every sample adds weight_j / batch_size to a step whatever the batch's length: the
    last, partial batch of an epoch then makes a step in proportion to its samples (a batch of
    one sample averaged on its own makes a full-size step on one sample's gradient, which
    threw models off in docs/quality-runs/collapses.json; §0.10).
    """
    if isinstance(weights, dict):
        weights = weights["__weight__"]
    check_batch_size(batch_size, "weighted_mean")
    try:
        import torch
    except ImportError:  # numpy inputs
        pass
    else:
        if isinstance(losses, torch.Tensor):
            w = torch.as_tensor(weights, dtype=losses.dtype, device=losses.device).reshape(losses.shape)
            return (losses * w).mean() if batch_size is None else (losses * w).sum() / batch_size
    product = np.asarray(losses) * np.asarray(weights)
    return float(np.mean(product) if batch_size is None else np.sum(product) / batch_size)
