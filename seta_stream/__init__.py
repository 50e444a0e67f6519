"""seta_stream: loss-guided dynamic data pruning for streamed WebDataset shards.

Record per-sample losses and plan each epoch with :class:`Pruner`, and skip what the plan drops
inside the webdataset pipeline (:func:`attach`); docs/usage.md's first table says which entry
point serves which task. The public API is ``__all__``, each name in one place:

* the training loop: ``Pruner``; ``attach`` and the stages it installs (``skip_shards``,
  ``kept_tar_samples``, ``keep_filter``, their ``stage_counters``), ``read_kept`` and
  ``index_shard`` (kept-only reads through a shard index), ``weighted_mean``; several ranks:
  ``balanced_epoch``, ``split_balanced``; epochs that follow the plan: ``one_pass_per_epoch``,
  ``epoch_steps``, ``EpochClock``; the population: ``list_samples``;
* offline: ``compact``, ``plan_epoch``, ``load_plan``, ``load_summary``, ``load_table``,
  ``inspect`` (views of a run), and ``RunDir`` (a run on remote storage, opened with its
  ``storage_options``, or created with its settings; every function takes one or a path);
* the public modules: ``errors`` (the exception tree: every error and warning, only there),
  ``policies`` (the policies, their parameters, ``describe_policies``), ``ids`` (sample
  identity: ``shard_name``, ``shard_location``, ``sample_uid``), ``index`` (the rest of the shard
  indexes), ``inspect`` and ``openclip`` (OpenCLIP's training data adapted in place).

Every other module is private: the subpackages ``_store`` (the run directory's formats),
``_kernels`` (array kernels), ``_losses`` (recording and compaction), ``_planning``
(plan_epoch), ``_reading`` (what DataLoader workers run), and ``_session`` and ``_cli``;
docs/architecture.md maps them. ``seta_stream.testing`` is not the API either: the internals the
project's own tests, benchmarks and tools drive. The reading side is imported with the package;
the policies, planning, recording, compaction and ``inspect`` on first use of one of their names.
"""

import importlib as _importlib
import sys as _sys
import types as _types
import warnings as _warnings

from . import errors, ids, index, openclip
from ._reading.balance import balanced_epoch, split_balanced
from ._reading.epochs import EpochClock, epoch_steps, one_pass_per_epoch
from ._reading.listing import list_samples
from ._reading.reader import read_kept
from ._reading.shardindex import index_shard
from ._reading.stages import attach, keep_filter, kept_tar_samples, skip_shards, stage_counters, weighted_mean
from ._store.planfiles import load_plan, load_summary
from ._store.runfs import RunDir
from ._store.table import load_table

__version__ = "0.1.0"

#: Public names imported on first use: ``{name: (module, attribute)}`` (attribute None: the module
#: itself). A DataLoader worker imports this package to unpickle its stages: without these it
#: imports no policy, nothing of planning or of the loss table's writers (the recording and
#: compaction), and not polars (``inspect``: about a fifth of ``import seta_stream``, ``python
#: -X importtime``). tests/test_worker_imports.py holds a worker to that.
_ON_FIRST_USE: dict[str, tuple[str, str | None]] = {
    "policies": (".policies", None),
    "plan_epoch": ("._planning.transaction", "plan_epoch"),
    "Pruner": ("._session", "Pruner"),
    "compact": ("._losses.compaction", "compact"),
    "inspect": (".inspect", None),
}

#: Names the package exported before its face was narrowed, and the module each lives in now:
#: still resolved, with a DeprecationWarning naming that place, and in no listing (``__all__``,
#: ``dir``, ``vars``). tests/test_exports.py checks each resolves to its new home's object.
_MOVED: dict[str, str] = {
    **{
        name: ".errors"
        for name in (
            "BalanceError",
            "CorruptPartError",
            "EpochOrderError",
            "InvalidInputError",
            "PlanMissingError",
            "PlanWarning",
            "PopulationLocationError",
            "RunFormatError",
            "RunLockedError",
            "SampleIdCollisionError",
            "SetaStreamError",
            "SetaStreamWarning",
            "ShardNameConflictError",
            "ShardNameError",
            "UnsupportedPipelineError",
        )
    },
    **{name: ".ids" for name in ("sample_uid", "shard_location", "shard_name")},
    **{name: ".policies" for name in ("POLICIES", "PolicyInput", "describe_policies", "run_policy")},
    **{name: ".testing" for name in ("LossRecorder", "PlanView", "set_current_epoch")},
    "CompactionReport": "._losses.compaction",  # what compact returns
    "BalancedEpoch": "._reading.balance",  # what balanced_epoch returns
}


def __getattr__(name: str):  # noqa: ANN202  (PEP 562)
    """A name of :data:`_ON_FIRST_USE`, imported now (``from seta_stream import Pruner`` too), or
    one of :data:`_MOVED`, with a DeprecationWarning."""
    where = _ON_FIRST_USE.get(name)
    moved = _MOVED.get(name)
    if where is None and moved is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    if moved is not None:
        where = (moved, name)
        _warnings.warn(
            f"seta_stream.{name} moved to seta_stream{moved}.{name}; import it from there",
            DeprecationWarning,
            stacklevel=2,
        )
    module = _importlib.import_module(where[0], __name__)
    value = module if where[1] is None else getattr(module, where[1])
    if moved is None:
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
    # the training loop
    "Pruner",
    "attach",
    "skip_shards",
    "kept_tar_samples",
    "keep_filter",
    "stage_counters",
    "read_kept",
    "index_shard",
    "weighted_mean",
    "balanced_epoch",
    "split_balanced",
    "one_pass_per_epoch",
    "epoch_steps",
    "EpochClock",
    "list_samples",
    # offline
    "RunDir",
    "compact",
    "plan_epoch",
    "load_plan",
    "load_summary",
    "load_table",
    # the public modules
    "errors",
    "ids",
    "index",
    "inspect",
    "openclip",
    "policies",
    "__version__",
]
