"""Epochs that follow the plan: as many steps as the kept samples fill, and a schedule that
follows the steps actually taken.

* :func:`one_pass_per_epoch` makes each DataLoader worker's epoch one pass over its shards: the
  worker stops when its kept samples are exhausted and delivers its last batch even if it is
  short, so an epoch delivers every kept sample once and takes about ``kept / batch_size``
  steps. It undoes ``with_epoch(n)``/``repeat()``, which would otherwise restart the pipeline
  and re-read kept samples until the full-data number of batches is reached.
* :func:`epoch_steps` is what such an epoch takes, from the plan summary's ``kept``.
* :class:`EpochClock` places each step in a schedule sized for full-data epochs (OpenCLIP's
  ``cosine_lr(optimizer, lr, warmup, num_batches * epochs)``, or any function of a step):
  ``epoch + samples delivered / kept``, in full-data steps. Every epoch, pruned or not, covers
  one epoch of the schedule; each step advances it by the share of the epoch's kept samples it
  trained on, so the schedule follows the steps taken and no epoch ends early or spills over.
"""

from __future__ import annotations

import math
from typing import Any

from ..errors import InvalidInputError, UnsupportedPipelineError

__all__ = ["one_pass_per_epoch", "resampled_stage", "epoch_steps", "EpochClock"]


def resampled_stage(ds: Any) -> str | None:
    """The type name of ``ds``'s shard source if it draws shards with replacement
    (webdataset's ``ResampledShards``, OpenCLIP's ``ResampledShards2``), else None: such a
    pipeline never runs out of shards, so its epochs cannot be one pass. Checks only."""
    pipeline = getattr(ds, "pipeline", None)
    if isinstance(pipeline, list) and pipeline and "Resampled" in type(pipeline[0]).__name__:
        return type(pipeline[0]).__name__
    return None


def one_pass_per_epoch(ds: Any) -> Any:
    """Make every DataLoader worker's epoch one pass over its shards' kept samples.

    ``ds`` is a ``wds.DataPipeline`` or ``wds.WebDataset`` (modified in place and returned).
    Its ``with_epoch``/``repeat`` is undone (one pass, no sample limit) and every
    ``batched(..., partial=False)`` stage delivers its last, short batch. Call it, like
    :func:`attach`, before the DataLoader's workers start. Shards drawn with replacement
    (``ResampledShards``) never run out, so such a pipeline is refused, unchanged.
    """
    import webdataset as wds

    batched = wds.batched.f  # the function of a batched(...) stage
    pipeline = getattr(ds, "pipeline", None)
    if not isinstance(pipeline, list):
        raise UnsupportedPipelineError(
            f"one_pass_per_epoch() needs a wds.DataPipeline or wds.WebDataset, got {type(ds).__name__}"
        )
    resampled = resampled_stage(ds)
    if resampled is not None:
        raise UnsupportedPipelineError(
            f"one_pass_per_epoch(): the pipeline draws shards with replacement ({resampled}), which never run "
            "out, so an epoch cannot end after one pass over the kept samples; expected a shard list read once "
            "per epoch: wds.SimpleShardList(urls) or wds.WebDataset(urls) without resampled=True"
        )
    ds.repetitions, ds.nsamples = 1, -1
    for st in pipeline:
        if getattr(st, "f", None) is batched:
            if len(st.args) >= 3:  # batched(size, collation_fn, partial)
                st.args = (*st.args[:2], True, *st.args[3:])
            else:
                st.kw = {**st.kw, "partial": True}
    return ds


def epoch_steps(kept: int, batch_size: int, *, workers: int = 1, world_size: int = 1) -> tuple[int, int]:
    """(fewest, most) steps a rank takes in a :func:`one_pass_per_epoch` epoch of ``kept``
    samples (the plan summary's ``kept``): each of its ``workers`` DataLoader workers ends on a
    short batch, so ``ceil(kept / batch_size)`` to that plus ``workers - 1`` on one rank.
    ``workers=0`` (the DataLoader reads in the main process) is one reader, as ``workers=1``.
    With several ranks the bounds are for an even share, ``ceil(kept / world_size)``; ranks
    whose shards keep more samples take more steps."""
    if batch_size < 1 or workers < 0 or world_size < 1 or kept < 0:
        raise InvalidInputError(
            f"epoch_steps(kept={kept}, batch_size={batch_size}, workers={workers}, world_size={world_size}): "
            "expected kept >= 0, batch_size >= 1, workers >= 0 (0: the main process reads) and world_size >= 1"
        )
    readers = max(workers, 1)
    share = math.ceil(kept / world_size)
    fewest = math.ceil(share / batch_size)
    return fewest, min(fewest + readers - 1, share)


class EpochClock:
    """Where a step stands in a schedule sized for full-data epochs, counted in samples.

    ``clock.start_epoch(epoch, kept)`` at the start of each epoch, with the samples this process
    will be delivered (``summary["kept"]`` from ``pruner.start_epoch``, divided by the number of
    ranks); then ``clock.step(n)`` for each batch of ``n`` samples returns the batch's position,
    ``(epoch + samples before it / kept) * steps_per_epoch``, and counts the batch. With
    ``steps_per_epoch`` = the full-data steps of an epoch (OpenCLIP's ``num_batches``) the
    position is on the scale of a step-based schedule sized before training, and
    ``scheduler(clock.step(len(batch)))`` replaces ``scheduler(step)``: each epoch starts at
    ``epoch * steps_per_epoch`` and ends at the next one's start, whatever its number of steps.
    A rank given more than its share stays at the epoch's end for its extra batches.
    """

    def __init__(self, steps_per_epoch: float = 1.0) -> None:
        if not steps_per_epoch > 0:
            raise InvalidInputError(f"EpochClock(steps_per_epoch={steps_per_epoch}): expected a positive number")
        self.steps_per_epoch = steps_per_epoch
        self.epoch: int | None = None
        self.kept = 0.0
        self.done = 0

    def start_epoch(self, epoch: int, kept: float) -> None:
        if not kept > 0:
            raise InvalidInputError(
                f"EpochClock.start_epoch({epoch}, kept={kept}): expected the epoch's kept samples (> 0) for this "
                "process, summary['kept'] / world_size, from the summary pruner.start_epoch returns. A plan that "
                "keeps 0 samples knows none: plans count only the samples of the population or of the loss "
                "table, so a run's first epoch needs the population, Pruner(..., "
                "population=seta_stream.list_samples(urls))"
            )
        self.epoch, self.kept, self.done = epoch, float(kept), 0

    @property
    def position(self) -> float:
        """The schedule position after the batches counted so far."""
        if self.epoch is None:
            raise InvalidInputError("EpochClock: call clock.start_epoch(epoch, kept) before the epoch's first step")
        return (self.epoch + min(self.done / self.kept, 1.0)) * self.steps_per_epoch

    def step(self, batch_size: int) -> float:
        """The position of a batch of ``batch_size`` samples (where it starts); counts it."""
        position = self.position
        self.done += int(batch_size)
        return position
