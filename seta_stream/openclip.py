"""OpenCLIP (``open_clip_train``) training data read through a plan, without copying its code.

``open_clip_train.data.get_wds_dataset`` builds a ``wds.DataPipeline`` (shard list or
``ResampledShards2``, ``detshuffle2``, ``split_by_node``, ``split_by_worker``,
``tarfile_to_samples_nothrow``, ``shuffle``, ``select``, ``decode``, ``rename``, ``map_dict``,
``to_tuple("image", "text")``, ``batched(partial=False)``), sizes every epoch once with
``with_epoch(num_worker_batches)`` and wraps it in a ``WebLoader`` with persistent workers. For
pruned epochs that size is wrong (the workers restart their shards and re-read kept samples
until the full-data number of batches), and the cosine schedule, sized from ``num_batches``,
would jump at every epoch start. :func:`adapt` changes the returned pipeline in place, before
the workers start:

* :func:`seta_stream.attach`: ``skip_shards`` before ``tarfile_to_samples_nothrow`` (after the
  node and worker splits), ``keep_filter`` right after it; with several ranks (``balance``),
  ``split_balanced`` in place of the node and worker splits, so every rank takes the same number
  of steps and the gathered ``ClipLoss`` never waits on a rank (docs/ranks.md);
* ``to_tuple("image", "text")`` also carries ``__key__``, ``__url__`` and ``__weight__``, so a
  batch is ``(images, texts, keys, urls, weights)``;
* :func:`seta_stream.one_pass_per_epoch`: each worker's epoch is one pass over its kept
  samples, the last batch short, so every kept sample is trained once per epoch.

Everything is checked before anything changes: a refused pipeline (``--dataset-resampled``, a
second ``adapt``, started workers) is left exactly as it was.

The training loop then records :func:`pair_losses` and steps the schedule with
:class:`seta_stream.EpochClock` (docs/openclip.md has the whole change). The population is
listed with :data:`MEMBERS`, so pairs OpenCLIP drops (no ``.txt`` caption, no image) are not
planned as kept. Nothing here imports
open_clip; torch is imported by :func:`pair_losses` only.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from ._reading.balance import slot_info
from ._reading.epochs import one_pass_per_epoch, resampled_stage
from ._reading.stages import attach
from ._store.runfs import RunDir
from .errors import UnsupportedPipelineError

__all__ = ["adapt", "pair_losses", "training_pipeline", "IDS", "MEMBERS"]

#: the fields adapt() adds to the batch tuple, in this order
IDS = ("__key__", "__url__", "__weight__")

#: the members a pair needs to pass OpenCLIP's ``filter_no_caption_or_no_image`` (a ``.txt``
#: caption and an image): ``seta_stream.list_samples(urls, members=MEMBERS)`` leaves the pairs
#: OpenCLIP drops out of the population, so the plans count only pairs training receives
MEMBERS = ("txt", "png;jpg;jpeg;webp")


def training_pipeline(train_data: Any) -> Any:
    """The ``wds.DataPipeline`` inside OpenCLIP's ``DataInfo`` (``data["train"]``), its
    ``dataloader`` (a ``WebLoader``), a ``torch.utils.data.DataLoader``, or the pipeline itself.
    Refuses a loader whose persistent workers already started (they hold their own copy)."""
    loader = getattr(train_data, "dataloader", train_data)
    stages = getattr(loader, "pipeline", None)
    if isinstance(stages, list) and stages and hasattr(stages[0], "dataset"):  # WebLoader(DataLoader(...))
        loader = stages[0]
    if getattr(loader, "_iterator", None) is not None:
        raise UnsupportedPipelineError(
            "seta_stream.openclip: this DataLoader's persistent workers have started and hold their own copy of "
            "the pipeline; expected adapt() right after get_data(), before the first epoch's iter(dataloader)"
        )
    ds = getattr(loader, "dataset", loader)
    if not isinstance(getattr(ds, "pipeline", None), list):
        raise UnsupportedPipelineError(
            f"seta_stream.openclip: expected OpenCLIP's webdataset training data (data['train'] from get_data with "
            f"--dataset-type webdataset), got {type(train_data).__name__} holding {type(ds).__name__}"
        )
    return ds


def adapt(train_data: Any, run: str | RunDir, *, epoch: int | None = None, balance: bool | None = None) -> Any:
    """Make OpenCLIP's training data follow the plans of ``run`` (see the module docstring).

    ``train_data`` is ``data["train"]`` as ``get_data``/``get_wds_dataset`` return it (or its
    dataloader). Returns the adapted ``wds.DataPipeline``. Call it once, before the first epoch.
    Everything is checked before anything changes: a refused pipeline is left exactly as it was.

    ``balance``: deal every epoch's kept pairs evenly to the (rank, worker) slots
    (``attach(..., balance=True)``; the plans need the population listing); None (default):
    balanced when the job has several ranks (``RANK``/``WORLD_SIZE`` or torch.distributed, as
    webdataset reads them), so call it after ``init_distributed_device``, as ``get_data`` is.
    """
    if balance is None:
        balance = slot_info()[1] > 1
    ds = training_pipeline(train_data)
    to_tuple = _check(ds, run, epoch, balance)
    _edit(ds, run, epoch, to_tuple, balance)
    return ds


def _check(ds: Any, run: str | RunDir, epoch: int | None, balance: bool = False) -> Any:
    """Every refusal of :func:`adapt`, before any change; returns the ``to_tuple`` stage."""
    import webdataset as wds

    resampled = resampled_stage(ds)
    if resampled is not None:
        raise UnsupportedPipelineError(
            f"seta_stream.openclip.adapt: this training data draws shards with replacement ({resampled}, "
            "OpenCLIP's --dataset-resampled), so an epoch never runs out of shards and cannot be one pass over "
            "the plan's kept pairs; expected shards read once per epoch. Fix: drop --dataset-resampled "
            "(OpenCLIP then reads each shard once per epoch). The pipeline was left unchanged"
        )
    tuples = [st for st in ds.pipeline if getattr(st, "f", None) is wds.to_tuple.f]
    if len(tuples) != 1:
        raise UnsupportedPipelineError(
            f"seta_stream.openclip.adapt: expected one to_tuple(...) stage (OpenCLIP's to_tuple('image', 'text')), "
            f"found {len(tuples)}; add {', '.join(IDS)} to your batch yourself and call seta_stream.attach and "
            "seta_stream.one_pass_per_epoch. The pipeline was left unchanged"
        )
    if any(name in tuples[0].args for name in IDS):
        raise UnsupportedPipelineError(
            f"seta_stream.openclip.adapt: to_tuple{tuples[0].args} already carries {', '.join(IDS)}: this "
            "pipeline was adapted before; adapt it once"
        )
    # attach's own refusals (no run directory, no tar reader), tried on a copy of the stage list
    attach(SimpleNamespace(pipeline=list(ds.pipeline)), run, epoch=epoch, balance=balance)
    return tuples[0]


def _edit(ds: Any, run: str | RunDir, epoch: int | None, to_tuple: Any, balance: bool = False) -> None:
    """The changes of :func:`adapt`, in order, on a pipeline :func:`_check` accepted."""
    attach(ds, run, epoch=epoch, balance=balance)
    to_tuple.args = (*to_tuple.args, *IDS)
    one_pass_per_epoch(ds)


def pair_losses(image_features: Any, text_features: Any, logit_scale: Any) -> Any:
    """One loss per pair of the batch: the mean of the image-to-text cross-entropy of its row
    and the text-to-image cross-entropy of its column of ``logit_scale * image @ text.T``.
    Their mean is OpenCLIP's ``ClipLoss`` on one rank (the features as the model returns them,
    normalised), so ``seta.weighted_mean(pair_losses(...), weights)`` replaces it."""
    import torch
    import torch.nn.functional as F

    logits = logit_scale * image_features @ text_features.T
    target = torch.arange(len(logits), device=logits.device)
    return 0.5 * (
        F.cross_entropy(logits, target, reduction="none") + F.cross_entropy(logits.T, target, reduction="none")
    )
