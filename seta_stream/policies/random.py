"""`random` (dynamic: a fresh uniform subset every epoch) and `static` (one subset for the run).

docs/algorithms.md §2. Score-free: seen and unseen samples are treated alike (§0.5). Samples
absent from the plan (no listing) are kept by the stage with probability 1 - r using the same
per-sample uniform (§0.2), so epoch 0 is down-sampled too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from ..errors import InvalidInputError
from .base import AbsentRule, PolicyInput, PolicyResult, PolicySpec, reason_code, reason_codes
from .random_draws import STREAM_RANDOM, STREAM_STATIC, keep_count, prune_epochs, uniform_subset, uniforms
from .steps import Decide, PlanContext, Steps, smallest, uniform_keys_of


@dataclass(frozen=True)
class RandomParams:
    """r: fraction removed (keep 1 - r); delta: dynamic only, epochs >= floor(delta E) keep all."""

    r: float = 0.3
    mode: Literal["dynamic", "static"] = "dynamic"
    delta: float | None = None
    prune_epochs: int | None = None

    def __post_init__(self) -> None:
        if not 0 <= self.r < 1:
            raise InvalidInputError(f"random: r={self.r} is outside the valid range 0 <= r < 1")
        if self.mode not in ("dynamic", "static"):
            raise InvalidInputError(f"random: mode={self.mode!r}, expected 'dynamic' or 'static'")
        if self.delta is not None and not 0 <= self.delta <= 1:
            raise InvalidInputError(f"random: delta={self.delta} is outside the valid range 0 <= delta <= 1")
        if self.mode == "static" and self.delta is not None:
            raise InvalidInputError("random: delta applies to mode='dynamic' only")
        if self.prune_epochs is not None and self.prune_epochs < 0:
            raise InvalidInputError(f"random: prune_epochs={self.prune_epochs} must be >= 0")


@dataclass(frozen=True)
class StaticParams:
    """r: fraction removed; the same uniform subset (stream 5, epoch 0) in every epoch."""

    r: float = 0.3

    def __post_init__(self) -> None:
        if not 0 <= self.r < 1:
            raise InvalidInputError(f"static: r={self.r} is outside the valid range 0 <= r < 1")


def _draw(params: RandomParams, epoch: int, epochs: int) -> tuple[int, int, str] | None:
    """(stream, epoch of the uniforms, phase) of the draw, or None in an annealing epoch."""
    if params.mode == "static":
        return STREAM_STATIC, 0, "prune"
    anneal_from = (
        prune_epochs(params.delta or 0.0, epochs, params.prune_epochs)
        if params.delta is not None or params.prune_epochs is not None
        else epochs
    )
    if epoch >= anneal_from:
        return None
    return STREAM_RANDOM, epoch, "prune"


def _anneal(n: int) -> PolicyResult:
    return PolicyResult(
        keep=np.ones(n, dtype=bool),
        weight=np.ones(n, dtype=np.float32),
        reason=np.full(n, reason_code("anneal"), dtype=np.int8),
        summary={"phase": "anneal"},
    )


def _rows(keep: np.ndarray, f: float, stream: int, epoch: int, phase: str) -> PolicyResult:
    reason = reason_codes(keep, "kept", "dropped")
    return PolicyResult(
        keep=keep,
        weight=keep.astype(np.float32),
        reason=reason,
        summary={"phase": phase, "keep_fraction": f},
        absent_rule=AbsentRule("bernoulli", f, stream, epoch),
    )


def _random(inp: PolicyInput, params: RandomParams) -> PolicyResult:
    n, f = inp.n, 1.0 - params.r
    draw = _draw(params, inp.epoch, inp.epochs)
    if draw is None:
        return _anneal(n)
    stream, epoch, phase = draw
    u = uniforms(inp.uid, inp.seed, epoch, stream)
    keep = uniform_subset(np.ones(n, dtype=bool), keep_count(f, n), u, inp.uid)
    return _rows(keep, f, stream, epoch, phase)


def _random_steps(ctx: PlanContext, params: RandomParams) -> Steps:
    """:func:`random_policy` over buckets: the m = floor(f N) smallest uniforms of all rows."""
    f = 1.0 - params.r
    draw = _draw(params, ctx.epoch, ctx.epochs)
    if draw is None:
        return Decide(lambda inp: _anneal(inp.n), {"phase": "anneal"})
    stream, epoch, phase = draw

    def key_of(inp: PolicyInput) -> tuple[np.ndarray, np.ndarray, None, None]:
        return uniform_keys_of(inp, ctx.seed, epoch, stream), np.asarray(inp.uid, np.uint64), None, None

    cut = yield from smallest(key_of, keep_count(f, ctx.n), ctx.n)
    return Decide(
        lambda inp: _rows(cut.mask(*key_of(inp)), f, stream, epoch, phase),
        {"phase": phase, "keep_fraction": f},
        AbsentRule("bernoulli", f, stream, epoch),
    )


def static_steps(ctx: PlanContext, params: StaticParams) -> Steps:
    return (yield from _random_steps(ctx, RandomParams(r=params.r, mode="static")))


def static_policy(inp: PolicyInput, params: StaticParams) -> PolicyResult:
    return _random(inp, RandomParams(r=params.r, mode="static"))


def _columns(params: RandomParams | StaticParams) -> frozenset[str]:
    """Score-free: only the uid, whose uniforms make the draw."""
    return frozenset({"uid"})


random_policy = _random
random_steps = _random_steps
columns = _columns


SPECS = (
    PolicySpec(
        "random",
        RandomParams,
        random_policy,
        "dynamic random: a fresh uniform (1-r) subset every epoch (baseline)",
        columns,
        steps=random_steps,
        noise=True,
    ),
    PolicySpec(
        "static",
        StaticParams,
        static_policy,
        "static random: one uniform (1-r) subset for the whole run (baseline)",
        _columns,
        steps=static_steps,
    ),
)
