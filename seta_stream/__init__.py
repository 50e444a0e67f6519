"""seta_stream: loss-guided dynamic data pruning for streamed WebDataset shards."""

from .errors import (
    CorruptPartError,
    EpochOrderError,
    InvalidInputError,
    PlanMissingError,
    RunFormatError,
    RunLockedError,
    SampleIdCollisionError,
    SetaStreamError,
)
from .runfs import RunDir

__version__ = "0.1.0"

__all__ = [
    "CorruptPartError",
    "EpochOrderError",
    "InvalidInputError",
    "PlanMissingError",
    "RunDir",
    "RunFormatError",
    "RunLockedError",
    "SampleIdCollisionError",
    "SetaStreamError",
    "__version__",
]
