"""The exception tree of seta_stream.

Every error the library raises on purpose derives from :class:`SetaStreamError`, so a
training script can catch one type. Messages follow one rule: where (run directory, file,
shard, key), what was found, what was expected, how to fix it.

    SetaStreamError
    ├── RunFormatError          run directory missing, not a run, or written by a newer version
    ├── RunLockedError          another process holds the run's lock (compaction/planning)
    ├── CorruptPartError        a loss part cannot be read or has the wrong schema
    ├── SampleIdCollisionError  two different (shard, key) pairs map to the same 64-bit uid
    ├── PlanMissingError        no plan for the epoch a stage or a query asked for
    ├── EpochOrderError         planning an epoch below the last planned one
    ├── UnsupportedPipelineError attach() found no tar reader to filter (also a TypeError)
    └── InvalidInputError       bad arguments, parameters or shard specs (also a ValueError)
        ├── BalanceError            an epoch cannot be dealt evenly to ranks x workers (docs/ranks.md)
        ├── ShardNameError          a shard cannot be named from its URL (a pipe: command)
        │   └── ShardNameConflictError  two shard locations with one shard name
        │       └── PopulationLocationError  the population lists a shard elsewhere than training reads it
        ├── IndexMismatch           a shard index does not describe its shard (seta_stream.index)
        └── IndexMissing            a shard has no index where it is looked up (also a FileNotFoundError)

Warnings derive from :class:`SetaStreamWarning` (a ``UserWarning``), so a script can filter
them with one category::

    SetaStreamWarning
    └── PlanWarning             a plan has a property training may not survive, or an epoch
                                delivered fewer samples than its plan kept (Pruner.start_epoch)

This module is the one place of these names: ``from seta_stream.errors import PlanWarning``.
"""

from __future__ import annotations

__all__ = [
    "SetaStreamError",
    "RunFormatError",
    "RunLockedError",
    "CorruptPartError",
    "SampleIdCollisionError",
    "PlanMissingError",
    "EpochOrderError",
    "UnsupportedPipelineError",
    "InvalidInputError",
    "BalanceError",
    "ShardNameError",
    "ShardNameConflictError",
    "PopulationLocationError",
    "IndexMismatch",
    "IndexMissing",
    "SetaStreamWarning",
    "PlanWarning",
]


class SetaStreamError(Exception):
    """Base class of every error raised on purpose by seta_stream."""


class RunFormatError(SetaStreamError):
    """The run directory is missing, is not a seta_stream run, or has a newer format."""


class RunLockedError(SetaStreamError):
    """Another live process holds the lock of this run directory."""


class CorruptPartError(SetaStreamError):
    """A loss part (Parquet sidecar) is unreadable or does not have the expected schema."""

    def __init__(self, message: str, path: str = "") -> None:
        super().__init__(message)
        self.path = path


class SampleIdCollisionError(SetaStreamError):
    """Two different sample identities hash to the same 64-bit uid."""


class PlanMissingError(SetaStreamError):
    """There is no published plan for the requested epoch."""


class EpochOrderError(SetaStreamError):
    """An epoch was requested out of order (below the last planned epoch)."""


class InvalidInputError(SetaStreamError, ValueError):
    """Arguments that cannot be used as given (lengths, shapes, dtypes, ranges)."""


class BalanceError(InvalidInputError):
    """An epoch cannot be dealt evenly to the (rank, worker) slots of a job: its plan has no
    population listing (kept counts per shard not exact), it keeps fewer samples than there are
    slots, or the pipeline's shard list and the plan name different shards."""


class ShardNameError(InvalidInputError):
    """A shard cannot be named from its URL, or two different shards would get the same name.

    Sample identity is (shard name, ``__key__``): two shards with one name would have their
    samples merged, so this stops before anything is recorded or planned.
    """


class ShardNameConflictError(ShardNameError):
    """Two different shard locations (URLs or paths) have the same shard name."""


class PopulationLocationError(ShardNameConflictError):
    """A listed population names a shard at another location than the URL training reads it from
    (e.g. listed from a local mirror, trained from http:// URLs of the same files).

    The population's shard names and the recorded ones would then stand for different locations,
    so the fix is to list the population from the URLs the training pipeline reads, not a larger
    ``shard_depth`` (which would make them two unrelated sets of samples).
    """


class IndexMismatch(InvalidInputError):
    """An index does not describe its shard (location in an index dir, size or member headers differ)."""


class IndexMissing(InvalidInputError, FileNotFoundError):
    """A shard has no index where it is looked up (also a FileNotFoundError)."""


class UnsupportedPipelineError(SetaStreamError, TypeError):
    """``attach()`` was given something it cannot install the filter stages into."""


class SetaStreamWarning(UserWarning):
    """Base class of the warnings seta_stream emits on purpose."""


class PlanWarning(SetaStreamWarning):
    """A plan has a property that training may not survive: an epoch keeping a few percent of
    the data (``low_keep``), large weights (``high_weight``), a last batch of a few samples
    (``small_final_batch``). ``Pruner.start_epoch`` emits one per entry of the plan summary's
    ``warnings`` (docs/algorithms.md §0.10); ``code``, ``value``, ``limit`` and ``epoch`` are
    that entry's. With ``Pruner(check_delivered=True)`` also an epoch that recorded fewer losses
    than its plan kept (``undelivered``: ``value`` the losses recorded, ``limit`` the kept count),
    at the next ``start_epoch`` or ``close``."""

    def __init__(self, message: str, code: str = "", value: float | None = None, limit: float | None = None,
                 epoch: int | None = None) -> None:  # fmt: skip
        super().__init__(message)
        self.code, self.value, self.limit, self.epoch = code, value, limit, epoch
