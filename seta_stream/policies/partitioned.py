"""A policy's steps over the buckets of a partitioned table, finalized as a whole-table plan is.

:func:`plan_partitioned` runs a policy's steps form (``PolicySpec.steps``, ``steps``) over every
bucket, then each bucket's rows with the safeguards and the empty-plan guard applied exactly as
``guard.finalize`` applies them to a whole table (the floor's and the guard's rows found over all
buckets by exact m-smallest cuts), and merges the buckets' :class:`~.summary.SummaryCounts` into
the summary: bit for bit the whole table's plan and summary. Pure: the rows go to the
``emit`` callable planning gives (``seta_stream._planning``), which writes them.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import InvalidInputError
from .base import PolicyInput, PolicyResult, PolicySpec
from .guard import settle
from .noise import NoiseParams, with_noise_steps
from .random_draws import STREAM_FLOOR, STREAM_GUARD
from .safeguards import Safeguards, fillable
from .steps import Cut, PlanContext, run_steps, smallest, total, uniform_keys
from .summary import SummaryCounts, summary_counts, summary_of, summary_params

__all__ = ["plan_partitioned"]


def _guard_key(ctx: PlanContext) -> Any:
    def key_of(inp: PolicyInput) -> tuple[np.ndarray, np.ndarray, None, None]:
        return uniform_keys(inp.uid, ctx.seed, ctx.epoch, STREAM_GUARD), np.asarray(inp.uid, np.uint64), None, None

    return key_of


def _fill_key(ctx: PlanContext, decide: Any) -> Any:
    """The floor's keys (§0.10): the uniforms of stream 9 of the rows it may fill (:func:`fillable`:
    not kept by the policy, not suspected noise; ``result``: the policy's rows of this bucket,
    None: decided again here)."""

    def key_of(inp: PolicyInput, result: PolicyResult | None = None) -> tuple[np.ndarray, np.ndarray, None, np.ndarray]:
        if result is None:
            result = decide.rows(inp)
        uid = np.asarray(inp.uid, np.uint64)
        return uniform_keys(uid, ctx.seed, ctx.epoch, STREAM_FLOOR), uid, None, fillable(result.keep, result.reason)

    return key_of


def _kept(decide: Any) -> Any:
    """Steps counting the rows the policy keeps over every bucket."""
    return (yield total(lambda inp: int(np.count_nonzero(decide.rows(inp).keep))))


def _fillable(decide: Any) -> Any:
    """Steps counting the rows the floor may add (:func:`fillable`) over every bucket."""

    def count(inp: PolicyInput) -> int:
        result = decide.rows(inp)
        return int(np.count_nonzero(fillable(result.keep, result.reason)))

    return (yield total(count))


def _bucket_rows(
    decide: Any,
    inp: PolicyInput,
    guard: Cut | None,
    key_of: Any,
    fill: Cut | None = None,
    fill_key_of: Any = None,
    cap: np.float32 | None = None,
) -> PolicyResult:
    """One bucket's rows: the policy's decisions, the floor's rows and the guard's row if they
    are here, weights capped, weight 0 where not kept (as :func:`apply_guard` does for a whole
    table)."""
    result = decide.rows(inp)
    fill_rows = None if fill is None else fill.mask(*fill_key_of(inp, result))
    settle(result, None if guard is None else guard.mask(*key_of(inp)), fill_rows, cap)
    return result


class _BucketRows:
    """Bucket b's rows, handed to ``emit`` where they are decided, and its summary counts
    (picklable, for a Ray engine: only what ``emit`` returns and the counts travel back)."""

    def __init__(
        self,
        decide: Any,
        inputs: Any,
        guard: Cut | None,
        key_of: Any,
        emit: Any,
        fill: Cut | None = None,
        fill_key_of: Any = None,
        cap: np.float32 | None = None,
    ) -> None:
        self.decide, self.inputs, self.guard, self.key_of, self.emit = decide, inputs, guard, key_of, emit
        self.fill, self.fill_key_of, self.cap = fill, fill_key_of, cap

    def __call__(self, b: int) -> tuple[Any, SummaryCounts]:
        inp = self.inputs(b)
        result = _bucket_rows(self.decide, inp, self.guard, self.key_of, self.fill, self.fill_key_of, self.cap)
        return self.emit(b, inp, result), summary_counts(result, inp)


def plan_partitioned(
    spec: PolicySpec,
    params: Any,
    ctx: PlanContext,
    inputs: Any,
    buckets: int,
    emit: Any,
    restart: Any,
    engine: Any = None,
    received: Any = None,
    row_inputs: Any = None,
    safeguards: Safeguards | None = None,
    noise: NoiseParams | None = None,
    noise_floor: float | None = None,
) -> dict[str, Any]:
    """Plan ``buckets`` buckets (``inputs(b)``: bucket b's :class:`PolicyInput` for the steps;
    ``row_inputs(b)``, default ``inputs``: its input for the pass that decides its rows, with
    every column the plan files and the summary read) with the policy's steps.
    ``emit(b, inp, result)`` receives each bucket's rows where they are decided:
    in this process, in bucket order, or with an ``engine`` where it runs bucket b's map (a
    Ray task, then ``emit`` must be picklable and writes the rows wherever they go; a thread of
    ``ThreadEngine``, then buckets are emitted several at a time); ``received(b, value)``,
    if given, gets here, in bucket order, what ``emit`` returned. If no row is kept anywhere,
    the empty-plan guard keeps the row of smallest guard uniform (ties by uid) exactly as
    :func:`finalize` would: ``restart()`` is called and every bucket is emitted again. Returns
    the summary, equal to :func:`finalize`'s on the whole table.

    ``safeguards`` (§0.10): with a floor, the rows the policy keeps are counted first; if they
    are fewer than the floor, the dropped rows of smallest stream-9 uniform (ties by uid) that
    fill up to it are found over all buckets (the m smallest keys, as for the guard) before any
    bucket is emitted. The cap applies row by row. ``noise`` (§12): the noise rule's stage in
    front of the policy's steps (``noise_floor``: rule 2's previous threshold)."""
    if spec.steps is None:
        raise InvalidInputError(
            f"policy {spec.name!r} has no partitioned form (PolicySpec.steps), so it cannot plan a run "
            "with several buckets; use a run with buckets=1"
        )
    sg = safeguards or Safeguards()
    noise = noise or NoiseParams()
    decide = run_steps(with_noise_steps(spec.steps, noise, noise_floor)(ctx, params), inputs, buckets, engine)
    key_of = _guard_key(ctx)
    guard: Cut | None = None
    fill: Cut | None = None
    fill_key_of = _fill_key(ctx, decide)
    floor = sg.floor(ctx.n)
    if floor:
        kept = run_steps(_kept(decide), inputs, buckets, engine)
        if kept < floor:
            candidates = run_steps(_fillable(decide), inputs, buckets, engine)
            fill = run_steps(smallest(fill_key_of, floor - kept, candidates), inputs, buckets, engine)
    while True:
        counts: SummaryCounts | None = None
        rows = _BucketRows(decide, row_inputs or inputs, guard, key_of, emit, fill, fill_key_of, sg.cap())
        done = engine.map(rows, range(buckets)) if engine is not None else (rows(b) for b in range(buckets))
        for b, (value, piece) in enumerate(done):
            counts = piece if counts is None else counts + piece
            if received is not None:
                received(b, value)
        assert counts is not None
        if guard is not None or counts.n == 0 or counts.kept > 0:
            break
        guard = run_steps(smallest(key_of, 1, counts.n), inputs, buckets, engine)
        restart()
    named = summary_params(params, noise, spec)
    return summary_of(counts, decide.summary, ctx, spec.name, named, guard is not None, decide.absent_rule, sg)
