"""Map/reduce rounds over buckets: the protocol of partitioned planning and its generic steps.

A computation over a partitioned table is a generator that yields :class:`Step` s: the planner
(or a Ray engine) applies ``step.map`` to every bucket's input, hands the list of results to
``step.reduce`` and sends the reduced value back (:func:`run_steps` is the local engine). The
generic steps here select exactly: :func:`smallest` (the m smallest (key, tie1, tie2) triples,
by :class:`seta_stream._kernels.exact.RankSelect` radix passes and one tie round) and
:func:`order_statistics`. Every reduce is exact, so results do not depend on how rows are split
into buckets. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .exact import RankSelect, float_keys, key_values

__all__ = ["Step", "Cut", "run_steps", "total", "smallest", "float_order_keys", "order_statistics", "KeyOf"]


@dataclass(frozen=True)
class Step:
    """One round: ``map(inp)`` on every bucket (a small, picklable result), then ``reduce``
    on the list of results. ``streamed``: ``reduce`` is called on each result alone, in
    bucket order, as it arrives (for results too large to hold together, such as values
    being spilled to scratch files); the last call's value is the round's."""

    map: Callable[[Any], Any]
    reduce: Callable[[list[Any]], Any]
    streamed: bool = False


class _Apply:
    """``map_fn(inputs(b))``: a step's map on bucket b (picklable for a Ray engine)."""

    def __init__(self, map_fn: Callable[[Any], Any], inputs: Callable[[int], Any]) -> None:
        self.map_fn, self.inputs = map_fn, inputs

    def __call__(self, b: int) -> Any:
        return self.map_fn(self.inputs(b))


def run_steps(steps: Generator[Step, Any, Any], inputs: Callable[[int], Any], buckets: int, engine: Any = None) -> Any:
    """Run ``steps`` over ``buckets`` buckets, ``inputs(b)`` giving bucket b's input; returns
    the generator's value. ``engine`` (``_engine``): where the maps run; None: here, one bucket
    at a time."""
    try:
        step = next(steps)
        while True:
            apply = _Apply(step.map, inputs)
            results = engine.map(apply, range(buckets)) if engine is not None else (apply(b) for b in range(buckets))
            if step.streamed:  # one bucket's result at a time: reduced as it arrives, then dropped
                value = None
                for piece in results:
                    value = step.reduce([piece])
                    del piece
                step = steps.send(value)
            else:
                step = steps.send(step.reduce(list(results)))
    except StopIteration as stop:
        return stop.value


def _sum(pieces: list[Any]) -> Any:
    out = pieces[0]
    for p in pieces[1:]:
        out = out + p
    return out


def total(count: Callable[[Any], Any]) -> Step:
    """A step summing ``count(inp)`` (an int or an int array) over the buckets."""
    return Step(count, _sum)


def float_order_keys(values: np.ndarray) -> np.ndarray:
    """uint64 keys in the order of float32 or float64 values (no NaN; -0.0 and 0.0 alike).

    float32 values are keyed a block of :data:`_ORDER_BLOCK` at a time into the uint64 output,
    instead of keying them all and widening a copy (a temporary half the output's size)."""
    v = np.asarray(values)
    if v.dtype != np.float32 or v.ndim != 1:
        keys = float_keys(v)
        return keys.astype(np.uint64) if keys.dtype != np.uint64 else keys
    out = np.empty(len(v), dtype=np.uint64)
    for lo in range(0, len(v), _ORDER_BLOCK):
        out[lo : lo + _ORDER_BLOCK] = float_keys(v[lo : lo + _ORDER_BLOCK])
    return out


#: Values per block of :func:`float_order_keys`.
_ORDER_BLOCK = 1 << 16


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
KeyOf = Callable[[Any], tuple[np.ndarray, np.ndarray, "np.ndarray | None", "np.ndarray | None"]]


def _valid_keys(key_of: KeyOf, inp: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    keys, tie1, tie2, valid = key_of(inp)
    if valid is None:
        return keys, tie1, tie2
    return keys[valid], tie1[valid], None if tie2 is None else tie2[valid]


#: ``smallest`` stops its radix passes once the rank's prefix holds at most this many keys and
#: sorts those instead: uniform keys need 2 passes instead of 4.
GATHER_KEYS = 1 << 16


def _under_prefix(key_of: KeyOf, prefix: int, shift: int, limit: int) -> Callable[[Any], np.ndarray]:
    """A bucket's (key, tie1, tie2) rows whose key has ``prefix`` in its top bits (all of the
    key when ``shift`` is 0), the ``limit`` smallest of them: only those can be among the
    ``limit`` smallest of all buckets."""

    def rows(inp: Any) -> np.ndarray:
        keys, tie1, tie2 = _valid_keys(key_of, inp)
        at = np.flatnonzero((keys >> np.uint64(shift)) == np.uint64(prefix))
        t2 = tie2[at] if tie2 is not None else np.zeros(len(at), np.uint64)
        triples = np.stack([keys[at], tie1[at], t2], axis=1)
        if len(triples) > limit:
            triples = triples[np.lexsort((triples[:, 2], triples[:, 1], triples[:, 0]))[:limit]]
        return triples

    return rows


def _nth_triple(pieces: list[np.ndarray], n: int) -> tuple[int, int, int]:
    rows = np.concatenate(pieces)
    order = np.lexsort((rows[:, 2], rows[:, 1], rows[:, 0]))
    key, tie1, tie2 = rows[order[n]]
    return int(key), int(tie1), int(tie2)


def smallest(key_of: KeyOf, m: int, candidates: int) -> Generator[Step, Any, Cut]:
    """Steps selecting the m smallest (key, tie1, tie2) triples among the ``candidates`` valid
    rows of all buckets (``key_of`` as :data:`KeyOf`): 16-bit radix passes over the keys
    (:class:`seta_stream._kernels.exact.RankSelect`) until the prefix of rank m - 1 holds at most
    :data:`GATHER_KEYS` keys, or the whole key is known; then the rows under that prefix are
    sorted by (key, tie1, tie2) and the triple of rank m - 1 is the cut. Use as
    ``cut = yield from smallest(...)``."""
    if m <= 0 or candidates == 0:
        return Cut(nothing=True)
    if m >= candidates:
        return Cut(everything=True)
    select = RankSelect([m - 1], candidates, 64)
    while True:
        select.advance((yield Step(lambda inp, s=select: s.count(_valid_keys(key_of, inp)[0]), list)))
        prefix, bits, resid, count = select.narrowed()
        if select.done or int(count[0]) <= GATHER_KEYS:
            break
    n = int(resid[0])  # rank m - 1 among the keys under the prefix
    rows = _under_prefix(key_of, int(prefix[0]), 64 - bits, n + 1)
    key, tie1, tie2 = yield Step(rows, lambda pieces: _nth_triple(pieces, n))
    return Cut(key, tie1, tie2)


def order_statistics(
    values_of: Callable[[Any], np.ndarray], ranks: Sequence[int], count: int, dtype: Any, *, counts: bool = False
) -> Generator[Step, Any, Any]:
    """Steps giving the values (``dtype`` float32 or float64, no NaN) of the given 0-based
    ranks among the ``count`` values ``values_of`` returns over all buckets (-0.0 as 0.0);
    with ``counts``, (values, how many values are below each, how many equal it)."""
    single = np.dtype(dtype) == np.float32
    select = RankSelect(list(ranks), count, 32 if single else 64)
    while not select.done:
        select.advance((yield Step(lambda inp, s=select: s.count(float_keys(values_of(inp))), list)))
    values = key_values(select.values(), np.float32 if single else np.float64)
    return (values, select.below(), select.equal()) if counts else values
