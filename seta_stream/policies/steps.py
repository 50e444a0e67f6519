"""Policies over a partitioned table: rounds of map (per bucket) and reduce (exact merge).

A partitioned run (docs/format.md, format version 2) plans bucket by bucket, one or a few
buckets in memory at a time (or as Ray tasks), so a policy cannot look at all rows at once. A
policy's *steps* form is a generator::

    def steps(ctx: PlanContext, params) -> Generator[Step, Any, Decide]

It yields :class:`Step` s; the planner applies ``step.map`` to the :class:`PolicyInput` of every
bucket, hands the list of results to ``step.reduce`` and sends the reduced value back. When the
generator returns, its :class:`Decide` holds the global decisions (thresholds, clusters...):
``decide.rows(inp)`` gives the rows of one bucket (keep, weight, reason[, cluster, score]),
``decide.summary`` the policy's summary fields. A map's input holds the columns the policy
declares (``PolicySpec.columns``) and ``uid``, the others as constants; ``decide.rows`` gets
:data:`~seta_stream.policies.base.PLAN_COLUMNS` too.

Every reduce is exact (integer counts, :mod:`seta_stream._kernels.exact` sums and order statistics),
so the plan does not depend on the number of buckets, the split of rows into buckets, their
order or the engine: it is bit for bit the plan of the policy's whole-table function
(tests/test_policy_steps.py checks every policy, hypothesis over sizes, bucket counts, ties,
NaN and unseen rows). :func:`run_steps` is the local engine.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .._kernels.draws import uniform_keys
from .._kernels.mapreduce import Cut, Step, float_order_keys, order_statistics, run_steps, smallest, total
from .base import AbsentRule, PolicyInput, PolicyResult

__all__ = [
    "PlanContext",
    "Step",
    "Decide",
    "Steps",
    "Cut",
    "run_steps",
    "total",
    "smallest",
    "uniform_keys",
    "float_order_keys",
    "order_statistics",
    "memo",
    "uniform_keys_of",
]


@dataclass(frozen=True)
class PlanContext:
    """What every bucket's input shares: the epoch planned, the run's epochs and seed, the
    number of rows over all buckets (``n``) and the ES start denominator (``n_ref``)."""

    epoch: int
    epochs: int
    seed: int
    n: int
    n_ref: int


@dataclass
class Decide:
    """A policy's decisions once its steps ran: ``rows(inp)`` gives one bucket's rows (its
    ``summary`` is ignored); ``summary`` the policy's own summary fields."""

    rows: Callable[[PolicyInput], PolicyResult]
    summary: dict[str, Any] = field(default_factory=dict)
    absent_rule: AbsentRule = field(default_factory=AbsentRule)


Steps = Generator[Step, Any, Decide]


def memo(inp: PolicyInput, key: str, make: Callable[[], Any]) -> Any:
    """``make()``, kept in ``inp.memo`` under ``key`` when the planner gives the bucket a memo
    (its rows stay in memory between passes); ``key`` must name everything the value depends
    on besides the rows."""
    if inp.memo is None:
        return make()
    if key not in inp.memo:
        inp.memo[key] = make()
    return inp.memo[key]


def uniform_keys_of(inp: PolicyInput, seed: int, epoch: int, stream: int) -> np.ndarray:
    """:func:`uniform_keys` of a bucket's uids, memoised."""
    return memo(inp, f"uniform_keys/{seed}/{epoch}/{stream}", lambda: uniform_keys(inp.uid, seed, epoch, stream))
