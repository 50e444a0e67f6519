"""seta_stream: loss-guided dynamic data pruning for streamed WebDataset shards.

Record per-sample losses (:class:`LossRecorder` / :class:`Pruner`), fold them into a loss table
(:func:`compact`), plan each epoch with a policy (:func:`plan_epoch`), and skip what the plan
drops inside the webdataset pipeline (:func:`attach`, :func:`kept_tar_samples`,
:func:`keep_filter`, :func:`skip_shards`). See README.md and docs/.

The public API is ``__all__``: the names below and the public modules ``errors`` (the exception
tree), ``ids`` (sample identity), ``index`` (shard indexes), ``inspect`` (views of a run) and
``policies`` (the policies and ``es_select``), and ``openclip`` (OpenCLIP's training data
adapted in place). Every other module is private: the private subpackages ``_store`` (the
run directory's formats), ``_kernels`` (array kernels), ``_losses`` (recording and compaction),
``_planning`` (plan_epoch), ``_reading`` (what DataLoader workers run), and ``_session`` and
``_cli``; docs/architecture.md maps them. The reading side is imported with the package; the
policies, planning, recording and compaction on first use of one of their names.
"""

import importlib as _importlib
import sys as _sys
import types as _types

from . import errors, ids, index, openclip
from ._reading.balance import BalancedEpoch, balanced_epoch, split_balanced
from ._reading.epochs import EpochClock, epoch_steps, one_pass_per_epoch
from ._reading.listing import list_samples
from ._reading.reader import read_kept
from ._reading.shardindex import index_shard
from ._reading.stages import PlanView, attach, keep_filter, kept_tar_samples, skip_shards, stage_counters, weighted_mean
from ._store.planfiles import load_plan, load_summary
from ._store.runfs import RunDir
from ._store.state import set_current_epoch
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

__version__ = "0.1.0"

#: Public names imported on first use: ``{name: (module, attribute)}`` (attribute None: the module
#: itself). A DataLoader worker imports this package to unpickle its stages: without these it
#: imports no policy, nothing of planning or of the loss table's writers (the recording and
#: compaction), and not polars (``inspect``: about a fifth of ``import seta_stream``, ``python
#: -X importtime``). tests/test_worker_imports.py holds a worker to that.
_ON_FIRST_USE: dict[str, tuple[str, str | None]] = {
    "policies": (".policies", None),
    "POLICIES": (".policies", "POLICIES"),
    "PolicyInput": (".policies", "PolicyInput"),
    "describe_policies": (".policies", "describe_policies"),
    "run_policy": (".policies", "run_policy"),
    "plan_epoch": ("._planning.transaction", "plan_epoch"),
    "Pruner": ("._session", "Pruner"),
    "CompactionReport": ("._losses.compaction", "CompactionReport"),
    "compact": ("._losses.compaction", "compact"),
    "LossRecorder": ("._losses.record", "LossRecorder"),
    "inspect": (".inspect", None),
}


def __getattr__(name: str):  # noqa: ANN202  (PEP 562)
    """A name of :data:`_ON_FIRST_USE`, imported now (``from seta_stream import Pruner`` too)."""
    where = _ON_FIRST_USE.get(name)
    if where is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module = _importlib.import_module(where[0], __name__)
    value = module if where[1] is None else getattr(module, where[1])
    globals()[name] = value
    return value


class _Package(_types.ModuleType):
    """This package's module object: the import system binds each submodule on it once loaded
    (``setattr``), and the names of :data:`_ON_FIRST_USE` that submodule completes are bound with
    it, so that ``vars(seta_stream)`` holds every public name whose module is loaded, however it
    was imported (tests/test_exports.py compares it with ``__all__``)."""

    def __setattr__(self, name: str, value: object) -> None:
        super().__setattr__(name, value)
        for public, (module, attribute) in _ON_FIRST_USE.items():
            if attribute is None or public in self.__dict__:
                continue
            loaded = _sys.modules.get(self.__name__ + module)
            if loaded is not None and hasattr(loaded, attribute):
                self.__dict__[public] = getattr(loaded, attribute)


_sys.modules[__name__].__class__ = _Package

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
