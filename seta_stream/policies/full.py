"""`full`: keep every sample with weight 1 in every epoch (docs/algorithms.md §1)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .base import PolicyInput, PolicyResult, PolicySpec, reason_code
from .steps import Decide, PlanContext, Steps


@dataclass(frozen=True)
class FullParams:
    """No parameter of its own. With the noise rule's stage in front (``noise=True``, §12) it
    leaves out suspected noise and keeps everything else: "the rule alone"."""


def _full(inp: PolicyInput, params: FullParams) -> PolicyResult:
    n = inp.n
    return PolicyResult(
        keep=np.ones(n, dtype=bool),
        weight=np.ones(n, dtype=np.float32),
        reason=np.full(n, reason_code("all"), dtype=np.int8),
        summary={"phase": "prune"},
    )


def _full_steps(ctx: PlanContext, params: FullParams) -> Steps:
    """No global statistic: every bucket keeps all its rows."""
    return Decide(lambda inp: _full(inp, params), {"phase": "prune"})
    yield  # a generator with no step


def _columns(params: FullParams) -> frozenset[str]:
    """No column: the number of rows is all ``full`` needs."""
    return frozenset()


full = _full
full_steps = _full_steps
columns = _columns

SPECS = (
    PolicySpec(
        "full",
        FullParams,
        full,
        "keep every sample, weight 1 (baseline); noise=True leaves out suspected noise",
        columns,
        steps=full_steps,
        noise=True,
    ),
)
