"""webdataset stages that apply the plan of the current epoch inside DataLoader workers.

* :func:`skip_shards` (url stage, before the tar opener): drops shards the plan keeps nothing
  of, before they are opened.
* :func:`keep_filter` (sample stage, after the tar reader, before decode): drops samples the
  plan does not keep and attaches ``__weight__`` (and ``__score__`` for ES/ESWP plans).
* :func:`attach` inserts both into an existing ``wds.WebDataset(...)``.
* :func:`weighted_mean` is the training loop's one-line loss helper.

Epoch discovery: when an iterator of a stage starts (every ``iter(loader)``, in every worker,
fork or spawn, persistent or not), the stage reads ``state.json`` of the run directory and uses
its ``current_epoch``, which ``plan_epoch`` / ``Pruner.start_epoch`` set. So the user publishes
the plan of epoch e *before* ``iter(loader)`` of epoch e; nothing else is passed to workers.
An explicit ``epoch=`` pins a stage to one epoch instead.

Memory: the plan's lookup (keys.arrow + lookup.arrow) is uncompressed Arrow IPC, memory-mapped
(local runs; read once per iterator for remote URLs), shared by every worker through the page
cache. A worker
turns only the current shard's rows into a Python dict, so its own memory does not grow with
the data set. Stages write nothing; they count (``stage_counters()``, per process).

Samples absent from the plan (new data, or never recorded) follow the plan's absent rule:
kept with weight 1 (default), or, for score-free policies, kept iff their per-sample uniform
is below the keep fraction (the same draw the planner makes, algorithms.md §0.2).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np
import pyarrow as pa
from webdataset.filters import pipelinefilter

from .errors import PlanMissingError, RunFormatError
from .ids import sample_uid, shard_name
from .policies.random_draws import uniform_of
from .runfs import RunDir

__all__ = ["keep_filter", "skip_shards", "attach", "weighted_mean", "stage_counters", "PlanView"]

_COUNTERS: Counter[str] = Counter()


def stage_counters() -> dict[str, int]:
    """Counters of the stages in this process (a DataLoader worker counts its own)."""
    return dict(_COUNTERS)


def _current_epoch(run: RunDir) -> int:
    state = run.read_json("state.json", default=None) or {}
    epoch = state.get("current_epoch")
    if epoch is None:
        raise PlanMissingError(
            f"{run.display('state.json')}: no epoch has been planned in this run; call "
            "pruner.start_epoch(e) (or seta_stream.plan_epoch(run, e)) before iter(loader)"
        )
    return int(epoch)


def _read_arrow(run: RunDir, rel: str) -> pa.Table:
    local = run.local_path(rel)
    if local is not None:
        return pa.ipc.open_file(pa.memory_map(local, "r")).read_all()
    return pa.ipc.open_file(pa.BufferReader(run.read_bytes(rel))).read_all()


class PlanView:
    """Read-only view of one epoch's plan for the stages (and the kept-only reader)."""

    def __init__(self, run: str | RunDir, epoch: int | None = None) -> None:
        self.run = run if isinstance(run, RunDir) else RunDir(run)
        self.epoch = _current_epoch(self.run) if epoch is None else int(epoch)
        d = f"plans/epoch={self.epoch}"
        summary = self.run.read_json(f"{d}/summary.json", default=None)
        if summary is None:
            raise PlanMissingError(
                f"{self.run.display(d, 'summary.json')}: no plan for epoch {self.epoch}; call "
                f"pruner.start_epoch({self.epoch}) (or plan_epoch) before iter(loader)"
            )
        self.depth = int(self.run.settings["shard_depth"])
        rule = summary.get("absent_rule") or {"kind": "keep"}
        self.absent_kind = rule.get("kind", "keep")
        self.absent_fraction = float(rule.get("fraction", 1.0))
        self.absent_stream = int(rule.get("stream", 1))
        self.absent_epoch = self.epoch if rule.get("epoch") is None else int(rule["epoch"])
        self.seed = int(summary.get("seed", 0))
        # with a population listing every sample of a known shard is a plan row, so a shard
        # with no kept row holds nothing to train; without one it may hold unknown samples
        self.population_listed = bool(summary.get("population_listed", False))
        self.lookup = _read_arrow(self.run, f"{d}/lookup.arrow")
        if "key" in self.lookup.column_names:  # a plan written before keys.arrow existed
            self.keys = self.lookup.column("key")
        else:
            self.keys = _read_arrow(self.run, f"{d}/keys.arrow").column("key")
            if len(self.keys) != self.lookup.num_rows:
                raise RunFormatError(
                    f"{self.run.display(d)}: keys.arrow has {len(self.keys)} rows, lookup.arrow "
                    f"{self.lookup.num_rows}; expected the same rows. The plan directory is "
                    f"inconsistent: plan the epoch again with force=True"
                )
        shards = _read_arrow(self.run, f"{d}/shards.arrow").to_pydict()
        self.shards = {
            s: (a, b, k) for s, a, b, k in zip(shards["shard"], shards["start"], shards["stop"], shards["kept"])
        }
        self.has_score = "score" in self.lookup.column_names
        self._cache_name: str | None = None
        self._cache: dict[str, tuple[bool, float, float | None, bool]] = {}

    def shard_is_empty(self, shard: str) -> bool:
        """True if the plan knows the shard and keeps none of its samples, and samples the
        plan does not know would be dropped too (so the shard need not be opened)."""
        entry = self.shards.get(shard)
        if entry is None or entry[2] > 0:
            return False
        return self.population_listed or (self.absent_kind == "bernoulli" and self.absent_fraction <= 0.0)

    def _load_shard(self, shard: str) -> None:
        entry = self.shards.get(shard)
        self._cache_name = shard
        if entry is None:
            self._cache = {}
            return
        a, b, _ = entry
        part = self.lookup.slice(a, b - a)
        # key -> (keep, weight, score, known) as Python objects: one dict look-up per sample
        scores = part.column("score").to_pylist() if self.has_score else [None] * (b - a)
        self._cache = {
            k: (keep, weight, score, True)
            for k, keep, weight, score in zip(
                self.keys.slice(a, b - a).to_pylist(),
                part.column("keep").to_pylist(),
                part.column("weight").to_pylist(),
                scores,
            )
        }

    def decide(self, shard: str, key: str) -> tuple[bool, float, float | None, bool]:
        """(keep, weight, score, known) for one sample."""
        if shard != self._cache_name:
            self._load_shard(shard)
        hit = self._cache.get(key)
        if hit is not None:
            return hit
        if self.absent_kind == "keep":
            return True, 1.0, None, False
        u = uniform_of(sample_uid(shard, key), self.seed, self.absent_epoch, self.absent_stream)
        return u < self.absent_fraction, 1.0, None, False


def _keep_filter(
    src: Iterable[dict[str, Any]], run: str | RunDir, epoch: int | None = None
) -> Iterator[dict[str, Any]]:
    view = PlanView(run, epoch)
    depth, has_score = view.depth, view.has_score
    kept = dropped = absent_kept = absent_dropped = 0
    # hot loop: the current shard's decisions are a local dict, refreshed when the url changes
    last_url: str | None = None
    shard = ""
    decisions: dict[str, tuple[bool, float, float | None, bool]] = {}
    try:
        for sample in src:
            url = sample["__url__"]
            if url != last_url:
                shard = shard_name(url, depth)
                if shard != view._cache_name:
                    view._load_shard(shard)
                decisions, last_url = view._cache, url
            key = sample["__key__"]
            hit = decisions.get(key)
            if hit is None:  # absent from the plan: the plan's absent rule
                keep, weight, score, _ = view.decide(shard, key)
                if keep:
                    absent_kept += 1
                else:
                    absent_dropped += 1
            else:
                keep, weight, score, _ = hit
            if not keep:
                dropped += 1
                continue
            kept += 1
            sample["__weight__"] = weight
            if has_score:
                sample["__score__"] = score if score is not None else float("nan")
            yield sample
    finally:
        _COUNTERS["kept"] += kept
        _COUNTERS["dropped"] += dropped
        _COUNTERS["absent_kept"] += absent_kept
        _COUNTERS["absent_dropped"] += absent_dropped


def _skip_shards(
    src: Iterable[dict[str, Any]], run: str | RunDir, epoch: int | None = None
) -> Iterator[dict[str, Any]]:
    view = PlanView(run, epoch)
    for item in src:
        if view.shard_is_empty(shard_name(item["url"], view.depth)):
            _COUNTERS["shards_skipped"] += 1
            continue
        _COUNTERS["shards_passed"] += 1
        yield item


keep_filter = pipelinefilter(_keep_filter)
keep_filter.__doc__ = """Sample stage: ``keep_filter(run, epoch=None)``; put it after the tar
reader (``wds.tarfile_to_samples()``) and before decode. Drops samples the current plan does
not keep; attaches ``__weight__`` (float) and, for ES/ESWP plans, ``__score__``."""
skip_shards = pipelinefilter(_skip_shards)
skip_shards.__doc__ = """URL stage: ``skip_shards(run, epoch=None)``; put it after
split_by_node/split_by_worker and before the tar reader. Drops shards the current plan keeps
no sample of, without opening them."""


def attach(ds: Any, run: str | RunDir, *, epoch: int | None = None) -> Any:
    """Insert :func:`skip_shards` and :func:`keep_filter` into a ``wds.WebDataset``.

    ``skip_shards`` goes right before the tar opener, ``keep_filter`` right after the stage
    that groups tar members into samples. Returns ``ds`` (modified in place) for chaining.
    """
    import webdataset as wds
    from webdataset import cache as wds_cache
    from webdataset.tariterators import group_by_keys

    run_url = run if isinstance(run, RunDir) else RunDir(run)
    pipeline = getattr(ds, "pipeline", None)
    if pipeline is None:
        raise TypeError(f"attach() needs a wds.WebDataset or wds.DataPipeline, got {type(ds).__name__}")
    opener = next(
        (i for i, st in enumerate(pipeline) if isinstance(st, (wds_cache.StreamingOpen, wds_cache.FileCache))),
        None,
    )
    grouper = next(
        (i for i, st in enumerate(pipeline) if getattr(st, "f", None) is group_by_keys or st is wds.tarfile_to_samples),
        None,
    )
    if grouper is None:
        raise TypeError(
            "attach(): no tar reader found in this pipeline; for a custom wds.DataPipeline put "
            "seta_stream.keep_filter(run) after wds.tarfile_to_samples() yourself"
        )
    pipeline.insert(grouper + 1, keep_filter(run_url, epoch=epoch))
    if opener is not None:
        pipeline.insert(opener, skip_shards(run_url, epoch=epoch))
    return ds


def weighted_mean(losses: Any, weights: Any) -> Any:
    """mean_j(weight_j * loss_j) over the batch (divided by the batch size, algorithms.md §0.7).

    ``weights`` is the batch's ``__weight__`` (tensor or list), or the collated batch dict.
    """
    if isinstance(weights, dict):
        weights = weights["__weight__"]
    try:
        import torch
    except ImportError:  # numpy inputs
        return float(np.mean(np.asarray(losses) * np.asarray(weights)))
    if isinstance(losses, torch.Tensor):
        w = torch.as_tensor(weights, dtype=losses.dtype, device=losses.device).reshape(losses.shape)
        return (losses * w).mean()
    return float(np.mean(np.asarray(losses) * np.asarray(weights)))
