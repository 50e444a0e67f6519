"""Policies over a partitioned table: rounds of map (per bucket) and reduce (exact merge).

A partitioned run (docs/format.md, format version 2) plans bucket by bucket, one or a few
buckets in memory at a time (or as Ray tasks), so a policy cannot look at all rows at once. A
policy's *steps* form is a generator::

    def steps(ctx: PlanContext, params) -> Generator[Step, Any, Decide]

It yields :class:`Step` s; the planner applies ``step.map`` to the :class:`PolicyInput` of every
bucket, hands the list of results to ``step.reduce`` and sends the reduced value back. When the
generator returns, its :class:`Decide` holds the global decisions (thresholds, clusters...):
``decide.rows(inp)`` gives the rows of one bucket (keep, weight, reason[, cluster, score]),
``decide.summary`` the policy's summary fields.

Every reduce is exact (integer counts, :mod:`seta_stream._exact` sums and order statistics),
so the plan does not depend on the number of buckets, the split of rows into buckets, their
order or the engine: it is bit for bit the plan of the policy's whole-table function
(tests/test_policy_steps.py checks every policy, hypothesis over sizes, bucket counts, ties,
NaN and unseen rows). :func:`run_steps` is the local engine.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .._exact import RankSelect, float_keys, key_values
from ..ids import mix64_array
from .base import AbsentRule, PolicyInput, PolicyResult
from .random_draws import salt

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


@dataclass(frozen=True)
class Step:
    """One round: ``map(inp)`` on every bucket (a small, picklable result), then ``reduce``."""

    map: Callable[[PolicyInput], Any]
    reduce: Callable[[list[Any]], Any]


@dataclass
class Decide:
    """A policy's decisions once its steps ran: ``rows(inp)`` gives one bucket's rows (its
    ``summary`` is ignored); ``summary`` the policy's own summary fields."""

    rows: Callable[[PolicyInput], PolicyResult]
    summary: dict[str, Any] = field(default_factory=dict)
    absent_rule: AbsentRule = field(default_factory=AbsentRule)


Steps = Generator[Step, Any, Decide]


def run_steps(steps: Steps, inputs: Callable[[int], PolicyInput], buckets: int) -> Decide:
    """Run a policy's steps over ``buckets`` buckets, ``inputs(b)`` giving bucket b's input,
    one bucket at a time (the local engine)."""
    try:
        step = next(steps)
        while True:
            step = steps.send(step.reduce([step.map(inputs(b)) for b in range(buckets)]))
    except StopIteration as stop:
        return stop.value


def _sum(pieces: list[Any]) -> Any:
    out = pieces[0]
    for p in pieces[1:]:
        out = out + p
    return out


def total(count: Callable[[PolicyInput], Any]) -> Step:
    """A step summing ``count(inp)`` (an int or an int array) over the buckets."""
    return Step(count, _sum)


# ---------------------------------------------------------------------------------- keys
def uniform_keys(uid: np.ndarray, seed: int, epoch: int, stream: int) -> np.ndarray:
    """uint64 keys in the order of the per-sample uniforms u (random_draws.uniforms): u is
    (mix(uid XOR salt) >> 11) * 2^-53, so the top 53 bits of the mixed word order it exactly."""
    z = mix64_array(np.asarray(uid, dtype=np.uint64) ^ np.uint64(salt(seed, epoch, stream)))
    z >>= np.uint64(11)
    z <<= np.uint64(11)
    return z


def float_order_keys(values: np.ndarray) -> np.ndarray:
    """uint64 keys in the order of float32 or float64 values (no NaN; -0.0 and 0.0 alike)."""
    keys = float_keys(values)
    return keys.astype(np.uint64) if keys.dtype != np.uint64 else keys


# ---------------------------------------------------------------------------------- m smallest
@dataclass(frozen=True)
class Cut:
    """The m smallest (key, tie1, tie2) triples over all buckets: a row is selected iff its
    key < ``key``, or key == ``key`` and (tie1, tie2) <= (``tie1``, ``tie2``). ``everything``:
    every candidate; ``nothing``: none."""

    key: int = 0
    tie1: int = 0
    tie2: int = 0
    everything: bool = False
    nothing: bool = False

    def mask(self, keys: np.ndarray, tie1: np.ndarray, tie2: np.ndarray | None, valid: np.ndarray | None) -> np.ndarray:
        n = len(keys)
        if self.nothing:
            return np.zeros(n, dtype=bool)
        out = np.ones(n, dtype=bool) if self.everything else keys < np.uint64(self.key)
        if not self.everything:
            at = np.flatnonzero(keys == np.uint64(self.key))
            if len(at):
                t1 = tie1[at]
                take = t1 < np.uint64(self.tie1)
                same = t1 == np.uint64(self.tie1)
                if tie2 is None:
                    take |= same
                else:
                    take |= same & (tie2[at] <= np.uint64(self.tie2))
                out[at[take]] = True
        if valid is not None:
            out &= valid
        return out


#: ``key_of(inp)`` -> (keys uint64[n], tie1 uint64[n], tie2 uint64[n] or None, valid bool[n] or None)
KeyOf = Callable[[PolicyInput], tuple[np.ndarray, np.ndarray, "np.ndarray | None", "np.ndarray | None"]]


def _valid_keys(key_of: KeyOf, inp: PolicyInput) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    keys, tie1, tie2, valid = key_of(inp)
    if valid is None:
        return keys, tie1, tie2
    return keys[valid], tie1[valid], None if tie2 is None else tie2[valid]


def _ties_at(key_of: KeyOf, key: int, need: int) -> Callable[[PolicyInput], np.ndarray]:
    def ties(inp: PolicyInput) -> np.ndarray:
        keys, tie1, tie2 = _valid_keys(key_of, inp)
        at = np.flatnonzero(keys == np.uint64(key))
        pairs = np.stack([tie1[at], tie2[at] if tie2 is not None else np.zeros(len(at), np.uint64)], axis=1)
        if len(pairs) > need:  # only the need smallest of this bucket can be among the need smallest
            pairs = pairs[np.lexsort((pairs[:, 1], pairs[:, 0]))[:need]]
        return pairs

    return ties


def _nth_pair(pieces: list[np.ndarray], need: int) -> tuple[int, int]:
    pairs = np.concatenate(pieces)
    order = np.lexsort((pairs[:, 1], pairs[:, 0]))
    tie1, tie2 = pairs[order[need - 1]]
    return int(tie1), int(tie2)


def smallest(key_of: KeyOf, m: int, candidates: int) -> Generator[Step, Any, Cut]:
    """Steps selecting the m smallest (key, tie1, tie2) triples among the ``candidates`` valid
    rows of all buckets (``key_of`` as :data:`KeyOf`): the key of rank m - 1 by radix passes
    (:class:`seta_stream._exact.RankSelect`), then the (tie1, tie2) of rank m - 1 among the rows
    with that key. Use as ``cut = yield from smallest(...)``."""
    if m <= 0 or candidates == 0:
        return Cut(nothing=True)
    if m >= candidates:
        return Cut(everything=True)
    select = RankSelect([m - 1], candidates, 64)
    while not select.done:
        select.advance((yield Step(lambda inp, s=select: s.count(_valid_keys(key_of, inp)[0]), list)))
    key = int(select.values()[0])
    need = m - int(select.below()[0])
    tie1, tie2 = yield Step(_ties_at(key_of, key, need), lambda pieces: _nth_pair(pieces, need))
    return Cut(key, tie1, tie2)


def order_statistics(
    values_of: Callable[[PolicyInput], np.ndarray], ranks: Sequence[int], count: int, dtype: Any
) -> Generator[Step, Any, np.ndarray]:
    """Steps giving the values (``dtype`` float32 or float64, no NaN) of the given 0-based
    ranks among the ``count`` values ``values_of`` returns over all buckets (-0.0 as 0.0)."""
    select = RankSelect(list(ranks), count, 64)
    while not select.done:
        select.advance((yield Step(lambda inp, s=select: s.count(float_order_keys(values_of(inp))), list)))
    out = select.values()
    if np.dtype(dtype) == np.float32:
        return key_values(out.astype(np.uint32), np.float32)
    return key_values(out, np.float64)
