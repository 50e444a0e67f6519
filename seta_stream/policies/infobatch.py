"""`infobatch`: InfoBatch (docs/algorithms.md §4).

Pruning epochs e < P = floor(delta E): among the seen samples S, those with a score strictly
below the mean score are "well learned" (L); a uniform (1 - r) share of L is kept (stream 3)
with weight 1/(1 - r) (``rescale="reference"``) or |L|/m (``"exact"``, unbiased for the drawn
count); everything else (S \\ L and unseen samples) is kept with weight 1. Annealing epochs keep
everything with weight 1: weights are recomputed by every plan, so no rescaled weight can leak
into annealing, whatever delta*E is (the released reference leaks them, §10 item 9).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from .._kernels.exact import ExactSums
from ..errors import InvalidInputError
from .base import PolicyInput, PolicyResult, PolicySpec, reason_code, reason_codes
from .random_draws import STREAM_INFOBATCH, keep_count, prune_epochs, uniform_subset, uniforms
from .steps import Decide, PlanContext, Step, Steps, smallest, total, uniform_keys_of


@dataclass(frozen=True)
class InfoBatchParams:
    """r: probability of pruning a well-learned sample; delta: share of pruning epochs."""

    r: float = 0.5
    delta: float = 0.875
    score: Literal["last", "ema"] = "last"
    rescale: Literal["reference", "exact"] = "reference"
    unseen_score: float | None = None
    prune_epochs: int | None = None

    def __post_init__(self) -> None:
        if not 0 <= self.r <= 0.9:
            raise InvalidInputError(f"infobatch: r={self.r} is outside the valid range 0 <= r <= 0.9")
        if not 0 <= self.delta <= 1:
            raise InvalidInputError(f"infobatch: delta={self.delta} is outside the valid range 0 <= delta <= 1")
        if self.score not in ("last", "ema"):
            raise InvalidInputError(f"infobatch: score={self.score!r}, expected 'last' or 'ema'")
        if self.rescale not in ("reference", "exact"):
            raise InvalidInputError(f"infobatch: rescale={self.rescale!r}, expected 'reference' or 'exact'")
        if self.prune_epochs is not None and self.prune_epochs < 0:
            raise InvalidInputError(f"infobatch: prune_epochs={self.prune_epochs} must be >= 0")


def _scores(inp: PolicyInput, p: InfoBatchParams) -> tuple[np.ndarray, np.ndarray]:
    """(score as float64, seen): the samples with a finite score recorded at least once (all of
    them with ``unseen_score``, which scores the others)."""
    score = (inp.last_loss if p.score == "last" else inp.ema).astype(np.float64)
    seen = (inp.seen > 0) & np.isfinite(score)
    if p.unseen_score is not None:  # reference compatibility (§0.5)
        score = np.where(seen, score, float(p.unseen_score))
        seen = np.ones(inp.n, dtype=bool)
    return score, seen


def _seen_sum(score: np.ndarray, seen: np.ndarray) -> ExactSums:
    return ExactSums.of(score[seen])


def _mean(sums: ExactSums, n_seen: int) -> float:
    """The mean score: the exact sum of the seen scores, rounded once, over their number (the
    same for any split of the rows, unlike a floating-point running sum)."""
    return float(sums.to_float()[0]) / n_seen


def _weight(p: InfoBatchParams, n_below: int, m: int) -> np.float32:
    if p.rescale == "exact" and m > 0:
        return np.float32(n_below / m)
    return np.float32(1.0 / (1.0 - p.r))


def _rows(inp: PolicyInput, p: InfoBatchParams, mu: float | None, drawn_of: Any, w: np.float32) -> PolicyResult:
    """Rows of a pruning epoch given the mean (None: no seen sample) and the draw."""
    score, seen = _scores(inp, p)
    keep = np.ones(inp.n, dtype=bool)
    weight = np.ones(inp.n, dtype=np.float32)
    reason = reason_codes(seen, "above_mean", "unseen")
    if mu is None:
        return PolicyResult(keep, weight, reason, {})
    below = seen & (score < mu)  # strict: samples equal to the mean are not candidates
    drawn = drawn_of(below)
    keep[below & ~drawn] = False
    weight[drawn] = w
    reason[below & ~drawn] = reason_code("below_mean_pruned")
    reason[drawn] = reason_code("below_mean_drawn")
    return PolicyResult(keep, weight, reason, {})


def _summary(mu: float, n_seen: int, n_below: int, m: int, w: np.float32) -> dict[str, Any]:
    """A pruning epoch's summary fields (every one of the m drawn samples is rescaled)."""
    return {
        "phase": "prune",
        "mu": mu,
        "n_seen": n_seen,
        "n_below_mean": n_below,
        "m": m,
        "weight": float(w),
        "rescaled": m,
    }


def _anneal(n: int) -> PolicyResult:
    return PolicyResult(
        np.ones(n, dtype=bool),
        np.ones(n, dtype=np.float32),
        np.full(n, reason_code("anneal"), dtype=np.int8),
        {"phase": "anneal"},
    )


_NO_SEEN = {"phase": "prune", "mu": None, "n_seen": 0, "n_below_mean": 0, "m": 0, "weight": 1.0}


def _infobatch(inp: PolicyInput, p: InfoBatchParams) -> PolicyResult:
    n = inp.n
    P = prune_epochs(p.delta, inp.epochs, p.prune_epochs)
    if inp.epoch >= P:
        return _anneal(n)
    score, seen = _scores(inp, p)
    n_seen = int(np.count_nonzero(seen))
    if not n_seen:
        result = _rows(inp, p, None, None, np.float32(1.0))
        result.summary = dict(_NO_SEEN)
        return result
    mu = _mean(_seen_sum(score, seen), n_seen)
    below = seen & (score < mu)
    n_below = int(below.sum())
    m = keep_count(1.0 - p.r, n_below)
    w = _weight(p, n_below, m)
    u = uniforms(inp.uid, inp.seed, inp.epoch, STREAM_INFOBATCH)
    result = _rows(inp, p, mu, lambda below: uniform_subset(below, m, u, inp.uid), w)
    result.summary = _summary(mu, n_seen, n_below, m, w)
    return result


def _infobatch_steps(ctx: PlanContext, p: InfoBatchParams) -> Steps:
    """:func:`infobatch` over buckets: the exact sum of the seen scores, the count below the
    mean, the m smallest uniforms among those."""
    if ctx.epoch >= prune_epochs(p.delta, ctx.epochs, p.prune_epochs):
        return Decide(lambda inp: _anneal(inp.n), {"phase": "anneal"})

    def seen_sum(inp: PolicyInput) -> tuple[int, ExactSums]:
        score, seen = _scores(inp, p)
        return int(np.count_nonzero(seen)), _seen_sum(score, seen)

    def merge(pieces: list[tuple[int, ExactSums]]) -> tuple[int, ExactSums]:
        count, sums = pieces[0]
        for c, s in pieces[1:]:
            count, sums = count + c, sums.merge(s)
        return count, sums

    n_seen, sums = yield Step(seen_sum, merge)
    if not n_seen:
        return Decide(lambda inp: _rows(inp, p, None, None, np.float32(1.0)), dict(_NO_SEEN))
    mu = _mean(sums, n_seen)

    def below_of(inp: PolicyInput) -> np.ndarray:
        score, seen = _scores(inp, p)
        return seen & (score < mu)

    n_below = yield total(lambda inp: int(np.count_nonzero(below_of(inp))))
    m = keep_count(1.0 - p.r, n_below)
    w = _weight(p, n_below, m)

    def key_of(inp: PolicyInput) -> tuple[np.ndarray, np.ndarray, None, np.ndarray]:
        uid = np.asarray(inp.uid, np.uint64)
        return uniform_keys_of(inp, ctx.seed, ctx.epoch, STREAM_INFOBATCH), uid, None, below_of(inp)

    cut = yield from smallest(key_of, m, n_below)

    def rows(inp: PolicyInput) -> PolicyResult:
        keys, uid, _, below = key_of(inp)
        return _rows(inp, p, mu, lambda _: cut.mask(keys, uid, None, below), w)

    summary = _summary(mu, n_seen, n_below, m, w)
    return Decide(rows, summary)


def _columns(p: InfoBatchParams) -> frozenset[str]:
    """The score column (``last_loss`` or ``ema``), ``seen`` and the uid."""
    return frozenset({"uid", "seen", "last_loss" if p.score == "last" else "ema"})


infobatch = _infobatch
infobatch_steps = _infobatch_steps
columns = _columns


SPECS = (
    PolicySpec(
        "infobatch",
        InfoBatchParams,
        infobatch,
        "InfoBatch: prune a (r) share of below-mean-loss samples, rescale the kept ones by 1/(1-r)",
        columns,
        steps=infobatch_steps,
        noise=True,
    ),
)
