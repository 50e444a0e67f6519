"""seta_stream: loss-guided dynamic data pruning for streamed WebDataset shards.

Record per-sample losses (:class:`LossRecorder` / :class:`Pruner`), fold them into a loss table
(:func:`compact`), plan each epoch with a policy (:func:`plan_epoch`), and skip what the plan
drops inside the webdataset pipeline (:func:`attach`, :func:`kept_tar_samples`,
:func:`keep_filter`, :func:`skip_shards`). See README.md and docs/.

The public API is ``__all__``: the names below and the public modules ``errors`` (the exception
tree), ``ids`` (sample identity), ``index`` (shard indexes), ``inspect`` (views of a run) and
``policies`` (the policies and ``es_select``), and ``openclip`` (OpenCLIP's training data
adapted in place). Every other module is private (``_name``);
docs/architecture.md maps them.
"""

from . import errors, ids, index, openclip, policies
from ._balance import BalancedEpoch, balanced_epoch, split_balanced
from ._epochs import EpochClock, epoch_steps, one_pass_per_epoch
from ._listing import list_samples
from ._losses.compaction import CompactionReport, compact
from ._losses.record import LossRecorder
from ._plan import load_plan, load_summary, plan_epoch, set_current_epoch
from ._reader import read_kept
from ._session import Pruner
from ._stage import PlanView, attach, keep_filter, kept_tar_samples, skip_shards, stage_counters, weighted_mean
from ._store.runfs import RunDir
from ._store.table import load_table
from .errors import (
    BalanceError,
    CorruptPartError,
    EpochOrderError,
    InvalidInputError,
    PlanMissingError,
    PlanWarning,
    PopulationLocationError,
    RunFormatError,
    RunLockedError,
    SampleIdCollisionError,
    SetaStreamError,
    SetaStreamWarning,
    ShardNameConflictError,
    ShardNameError,
    UnsupportedPipelineError,
)
from .ids import sample_uid, shard_location, shard_name
from .index import index_shard
from .policies import POLICIES, PolicyInput, describe_policies, run_policy

__version__ = "0.1.0"


def __getattr__(name: str):  # noqa: ANN202  (PEP 562)
    """``seta_stream.inspect`` is imported on first use: it imports polars, which a training
    process (and every spawned DataLoader worker) does not need; importing it with the package
    took about a fifth of ``import seta_stream`` (``python -X importtime``)."""
    if name == "inspect":
        import importlib

        return importlib.import_module(".inspect", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "errors",
    "ids",
    "index",
    "openclip",
    "policies",
    "POLICIES",
    "BalanceError",
    "BalancedEpoch",
    "CompactionReport",
    "EpochClock",
    "CorruptPartError",
    "EpochOrderError",
    "InvalidInputError",
    "LossRecorder",
    "PlanMissingError",
    "PlanView",
    "PlanWarning",
    "PolicyInput",
    "PopulationLocationError",
    "Pruner",
    "RunDir",
    "RunFormatError",
    "RunLockedError",
    "SampleIdCollisionError",
    "SetaStreamError",
    "SetaStreamWarning",
    "ShardNameConflictError",
    "ShardNameError",
    "UnsupportedPipelineError",
    "__version__",
    "attach",
    "balanced_epoch",
    "compact",
    "describe_policies",
    "epoch_steps",
    "index_shard",
    "inspect",
    "keep_filter",
    "kept_tar_samples",
    "list_samples",
    "load_plan",
    "load_summary",
    "load_table",
    "one_pass_per_epoch",
    "plan_epoch",
    "read_kept",
    "run_policy",
    "sample_uid",
    "set_current_epoch",
    "shard_location",
    "shard_name",
    "skip_shards",
    "split_balanced",
    "stage_counters",
    "weighted_mean",
]
