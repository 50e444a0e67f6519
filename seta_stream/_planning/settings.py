"""The settings of a plan besides the run and the epoch, in one value.

``plan_epoch`` takes them as keywords; :class:`PlanSettings` holds them for the planning
transaction (``seta_stream._planning.transaction.plan``) and for a ``Pruner``, which plans every
epoch of its run with the same ones instead of repeating the keywords.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .._kernels.engine import Engine

__all__ = ["PlanSettings"]


@dataclass(frozen=True)
class PlanSettings:
    """What :func:`~seta_stream.plan_epoch` is asked (its keywords, with their meaning there).

    ``policy``, ``params``, ``epochs`` and ``seed`` are fixed by the run's first plan
    (state.json; None: the run's); ``population`` lists every (shard, key) of the data set;
    ``engine`` and ``ray_address`` say where a partitioned run's buckets are planned;
    ``batch_size`` is the training loop's, if known; ``force`` plans an epoch whose plan exists."""

    policy: str | None = None
    params: dict[str, Any] | None = None
    epochs: int | None = None
    seed: int | None = None
    population: Any = field(default=None, repr=False)
    engine: str | Engine | None = None
    ray_address: str | None = None
    batch_size: int | None = None
    force: bool = False

    def run_settings(self) -> dict[str, Any]:
        """The settings the run's first plan fixes, as given here (None: not given)."""
        return {"policy": self.policy, "params": self.params, "epochs": self.epochs, "seed": self.seed}
