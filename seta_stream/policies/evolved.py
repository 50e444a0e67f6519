"""`es` and `eswp`: Evolved Sampling, with set-level Pruning (docs/algorithms.md §5).

The score s_i is the loss table's ``ema`` column: the decoupled EMA s <- beta2 s + (1 - beta2)
loss over every recorded loss, from 1/n (compaction keeps it; beta2 is the run setting
``ema_beta2``, which both policies declare in their ``SPECS``: their ``beta2`` must equal it).
Epochs are split into warm-up e < E_a, active E_a <= e < E - E_a and annealing e >= E - E_a,
with E_a = ceil(anneal_ratio * E - 1e-9).

* ``eswp`` (set level, the plan): in active epochs keep (1 - r) of the seen samples drawn
  without replacement with probability proportional to s_i (successive sampling, stream 4)
  plus every unseen sample; weight 1. Otherwise everything.
* ``es``: the plan keeps everything; selection happens per meta-batch in the training loop
  with :func:`es_select` (w_i = beta1 s_i + (1 - beta1) loss_i, b = ceil(mini_ratio B) samples,
  stream 6). Both attach ``score`` to the plan, which the stage passes on as ``__score__``.

Training pattern that saves time with ES: forward the whole meta-batch of B samples without
gradients, record all B losses, select b with :func:`es_select`, then forward and backward only
those b (the loss is their plain mean).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import InvalidInputError
from ..ids import mix64, mix64_array
from .base import PolicyInput, PolicyResult, PolicySpec, RunSetting, reason_code, reason_codes
from .random_draws import (
    STREAM_ES_BATCH,
    STREAM_ESWP,
    keep_count,
    salt,
    smallest_indices,
    successive_keys,
    uniforms,
    weighted_subset,
)
from .steps import Decide, PlanContext, Steps, float_order_keys, order_statistics, smallest, total, uniform_keys_of

__all__ = ["EsParams", "EswpParams", "es", "eswp", "es_select", "anneal_epochs", "SPECS"]


def _check(name: str, beta1: float, beta2: float, r: float, mini_ratio: float, anneal_ratio: float) -> None:
    if not 0 <= beta1 <= 1:
        raise InvalidInputError(f"{name}: beta1={beta1} is outside the valid range 0 <= beta1 <= 1")
    if not 0 <= beta2 < 1:
        raise InvalidInputError(f"{name}: beta2={beta2} is outside the valid range 0 <= beta2 < 1")
    if not 0 <= r < 1:
        raise InvalidInputError(f"{name}: r={r} is outside the valid range 0 <= r < 1")
    if not 0 < mini_ratio <= 1:
        raise InvalidInputError(f"{name}: mini_ratio={mini_ratio} is outside the valid range 0 < mini_ratio <= 1")
    if not 0 <= anneal_ratio <= 0.5:
        raise InvalidInputError(
            f"{name}: anneal_ratio={anneal_ratio} is outside the valid range 0 <= anneal_ratio <= 0.5"
        )


@dataclass(frozen=True)
class EsParams:
    """ES (batch-level selection in the loop): defaults from the paper's §3.1."""

    beta1: float = 0.2
    beta2: float = 0.9
    r: float = 0.0
    mini_ratio: float = 0.25
    anneal_ratio: float = 0.05

    def __post_init__(self) -> None:
        _check("es", self.beta1, self.beta2, self.r, self.mini_ratio, self.anneal_ratio)
        if self.r != 0:
            raise InvalidInputError(f"es: r={self.r}; ES has no set-level pruning (use policy 'eswp')")


@dataclass(frozen=True)
class EswpParams:
    """ESWP (set-level weighted pruning + batch-level selection): defaults from §3.1."""

    beta1: float = 0.2
    beta2: float = 0.8
    r: float = 0.2
    mini_ratio: float = 0.25
    anneal_ratio: float = 0.05

    def __post_init__(self) -> None:
        _check("eswp", self.beta1, self.beta2, self.r, self.mini_ratio, self.anneal_ratio)


def anneal_epochs(anneal_ratio: float, epochs: int) -> int:
    """E_a = ceil(rho E - 1e-9) (docs/algorithms.md A10)."""
    return int(math.ceil(anneal_ratio * epochs - 1e-9))


def _phase(e: int, E: int, Ea: int) -> str:
    if e < Ea:
        return "warmup"
    if e >= E - Ea:
        return "anneal"
    return "prune"


_QUANTILES = (0.0, 0.1, 0.25, 0.5, 0.75, 0.9, 1.0)


def _quantile_ranks(n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(pos, lo, hi) of the linear-interpolation quantiles of n sorted values."""
    pos = np.array(_QUANTILES) * (n - 1)
    lo = np.floor(pos).astype(np.int64)
    hi = np.minimum(lo + 1, n - 1)
    return pos, lo, hi


def _interpolate(at_lo: np.ndarray, at_hi: np.ndarray, pos: np.ndarray, lo: np.ndarray) -> dict[str, float]:
    q = at_lo + (at_hi - at_lo) * (pos - lo)
    return {f"{t:g}": float(v) for t, v in zip(_QUANTILES, q)}


def _quantiles(x: np.ndarray) -> dict[str, float]:
    """Linear-interpolation quantiles of x (as ``np.quantile``) from one sort (faster than a
    multi-point partition at 15M)."""
    s = np.sort(x)
    pos, lo, hi = _quantile_ranks(len(s))
    return _interpolate(s[lo], s[hi], pos, lo)


def _scores(inp: PolicyInput, n_ref: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(seen, score): s_i = ema for samples recorded with a finite loss, else 1/n (n = the
    run's ``n_ref``, else the number of samples)."""
    seen = (inp.seen > 0) & np.isfinite(inp.ema)
    n_ref = n_ref or inp.n_ref or inp.n or 1
    return seen, np.where(seen, inp.ema, 1.0 / n_ref).astype(np.float64, copy=False)


def _draw_keys(inp: PolicyInput, score: np.ndarray, epoch: int) -> np.ndarray:
    """ESWP's draw keys: :func:`successive_keys` of the uniforms with w = max(s, 0)."""
    return successive_keys(uniforms(inp.uid, inp.seed, epoch, STREAM_ESWP), np.maximum(score, 0.0))


def _rows(inp: PolicyInput, seen: np.ndarray, score: np.ndarray, drawn: np.ndarray | None) -> PolicyResult:
    n = inp.n
    if drawn is None:
        keep = np.ones(n, dtype=bool)
        reason = np.full(n, reason_code("all"), dtype=np.int8)
    else:
        keep = drawn | ~seen
        reason = reason_codes(drawn, "drawn", "not_drawn")
        reason[~seen] = reason_code("unseen")
    return PolicyResult(keep, keep.astype(np.float32), reason, {}, score=score)


def _head(p: Any, e: int, E: int) -> tuple[str, dict[str, Any]]:
    Ea = anneal_epochs(p.anneal_ratio, E)
    phase = _phase(e, E, Ea)
    summary: dict[str, Any] = {"phase": phase, "E_a": Ea, "active": Ea <= e < E - Ea}
    if E - 2 * Ea <= 0:
        summary["warning"] = "no active epoch (E - 2 E_a <= 0): the policy is 'full'"
    return phase, summary


def _run(inp: PolicyInput, p: Any, set_level: bool) -> PolicyResult:
    phase, summary = _head(p, inp.epoch, inp.epochs)
    seen, score = _scores(inp)
    n_seen = int(np.count_nonzero(seen))
    if n_seen:
        summary["score_quantiles"] = _quantiles(score[seen])
    drawn = None
    if set_level and phase == "prune":
        m = keep_count(1.0 - p.r, n_seen)
        u = uniforms(inp.uid, inp.seed, inp.epoch, STREAM_ESWP)
        drawn = weighted_subset(seen, np.maximum(score, 0.0), m, u, inp.uid)  # successive sampling prop. to s_i
        summary.update(n_seen=n_seen, m=m)
    result = _rows(inp, seen, score, drawn)
    result.summary = summary
    return result


def _steps(ctx: PlanContext, p: Any, set_level: bool) -> Steps:
    """:func:`_run` over buckets: the seen count, the quantiles' order statistics, the m
    smallest draw keys (ties by u, then uid)."""
    phase, summary = _head(p, ctx.epoch, ctx.epochs)

    def scores(inp: PolicyInput) -> tuple[np.ndarray, np.ndarray]:
        return _scores(inp, ctx.n_ref)

    n_seen = yield total(lambda inp: int(np.count_nonzero(scores(inp)[0])))
    if n_seen:
        pos, lo, hi = _quantile_ranks(n_seen)
        values = yield from order_statistics(
            lambda inp: scores(inp)[1][scores(inp)[0]], np.concatenate([lo, hi]), n_seen, np.float64
        )
        summary["score_quantiles"] = _interpolate(values[: len(lo)], values[len(lo) :], pos, lo)
    if not (set_level and phase == "prune"):
        return Decide(lambda inp: _rows(inp, *scores(inp), None), summary)
    m = keep_count(1.0 - p.r, n_seen)
    summary.update(n_seen=n_seen, m=m)

    def key_of(inp: PolicyInput) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        seen, score = scores(inp)
        keys = _draw_keys(inp, score, ctx.epoch)
        uid = np.asarray(inp.uid, np.uint64)
        return float_order_keys(keys), uniform_keys_of(inp, ctx.seed, ctx.epoch, STREAM_ESWP), uid, seen

    cut = yield from smallest(key_of, m, n_seen)

    def rows(inp: PolicyInput) -> PolicyResult:
        seen, score = scores(inp)
        return _rows(inp, seen, score, cut.mask(*key_of(inp)))

    return Decide(rows, summary)


def es_steps(ctx: PlanContext, p: EsParams) -> Steps:
    return (yield from _steps(ctx, p, set_level=False))


def eswp_steps(ctx: PlanContext, p: EswpParams) -> Steps:
    return (yield from _steps(ctx, p, set_level=True))


def es(inp: PolicyInput, p: EsParams) -> PolicyResult:
    return _run(inp, p, set_level=False)


def eswp(inp: PolicyInput, p: EswpParams) -> PolicyResult:
    return _run(inp, p, set_level=True)


_TWO_M53 = 2.0**-53


def es_select(
    losses: Any,
    scores: Any,
    mini_ratio: float = 0.25,
    beta1: float = 0.2,
    *,
    seed: int,
    epoch: int,
    rank: int,
    step: int,
    uids: Any,
) -> np.ndarray:
    """Batch-level selection of ES (docs/algorithms.md §5.4): a bool mask of the b = ceil(mini_ratio B)
    samples of a meta-batch to back-propagate, drawn without replacement with probability
    proportional to w_i = beta1 s_i + (1 - beta1) loss_i (successive sampling; stream 6, salt
    extended with mix(rank * 2^32 + step)). Inputs are numpy arrays or torch tensors.
    """
    loss = losses.detach().float().cpu().numpy() if hasattr(losses, "detach") else np.asarray(losses, np.float64)
    s = scores.detach().double().cpu().numpy() if hasattr(scores, "detach") else np.asarray(scores, np.float64)
    uid = np.asarray(uids, dtype=np.uint64)
    B = len(loss)
    if not (len(s) == B == len(uid)):
        raise InvalidInputError(
            f"es_select: {B} losses, {len(s)} scores and {len(uid)} uids; expected one each per sample"
        )
    b = min(B, int(math.ceil(mini_ratio * B - 1e-9)))
    w = beta1 * s + (1.0 - beta1) * loss
    extra = mix64(((int(rank) & 0xFFFFFFFF) << 32) + (int(step) & 0xFFFFFFFF))
    st = np.uint64(mix64(salt(seed, epoch, STREAM_ES_BATCH) ^ extra))
    u = (mix64_array(uid ^ st) >> np.uint64(11)) * _TWO_M53
    with np.errstate(divide="ignore", invalid="ignore"):
        keys = -np.log1p(-u) / w  # Efraimidis-Spirakis keys; w <= 0 or NaN -> +inf below
    keys[~(w > 0)] = np.inf
    mask = np.zeros(B, dtype=bool)
    mask[smallest_indices(keys, u, uid, b)] = True
    return mask


def columns(p: EsParams | EswpParams) -> frozenset[str]:
    """The EMA score, ``seen`` and the uid."""
    return frozenset({"uid", "seen", "ema"})


#: The table's EMA is folded at compaction with the run's ``ema_beta2``: it must be the policy's beta2.
EMA_BETA2 = RunSetting("ema_beta2", "beta2", "the loss table's EMA")

SPECS = (
    PolicySpec(
        "es",
        EsParams,
        es,
        "Evolved Sampling: keep all; select per meta-batch with es_select",
        columns,
        (EMA_BETA2,),
        steps=es_steps,
    ),
    PolicySpec(
        "eswp",
        EswpParams,
        eswp,
        "Evolved Sampling with Pruning: keep (1-r) of samples drawn by EMA loss score",
        columns,
        (EMA_BETA2,),
        steps=eswp_steps,
    ),
)
