"""Plan safeguards shared by every policy (docs/algorithms.md §0.10): an opt-in floor on the
samples an epoch keeps (``min_keep_fraction``), an opt-in cap on the weights (``max_weight``),
and the warnings a plan summary carries about properties of a plan that training may not
survive (``warnings``).

They act after the policy, in the layer that finalizes every plan (``policies.finalize`` for a
whole table, ``policies.plan_partitioned`` over buckets), so no policy knows of them; they are
given with the policy's parameters (``params={"r": 0.3, "min_keep_fraction": 0.1}``, the CLI's
``-p min_keep_fraction=0.1``) and fixed for a run with them by its first plan.

The batch-size check and the small-final-batch warning (``SMALL_FINAL_BATCH``,
``check_batch_size``, ``final_batch_warning``) are :mod:`seta_stream._kernels.batches`, which the
readers use too; they are re-exported here.

Pure: no I/O.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from .._kernels.batches import SMALL_FINAL_BATCH, check_batch_size, final_batch_warning
from ..errors import InvalidInputError
from .base import reason_code
from .random_draws import STREAM_FLOOR, keep_count, smallest_mask, uniforms

__all__ = [
    "SAFEGUARD_PARAMS",
    "Safeguards",
    "LOW_KEEP_FRACTION",
    "HIGH_WEIGHT",
    "SMALL_FINAL_BATCH",
    "split_params",
    "fill_mask",
    "fillable",
    "cap_weights",
    "plan_warnings",
    "final_batch_warning",
    "check_batch_size",
]

#: The parameter names every policy accepts besides its own.
SAFEGUARD_PARAMS: tuple[str, ...] = ("min_keep_fraction", "max_weight")

#: A pruning epoch that keeps less than this fraction of its rows is warned about (``low_keep``).
LOW_KEEP_FRACTION = 0.1
#: A plan whose largest weight exceeds this is warned about (``high_weight``).
HIGH_WEIGHT = 4.0


@dataclass(frozen=True)
class Safeguards:
    """``min_keep_fraction`` f: every epoch keeps at least floor(f N) of its N rows (a uniform
    draw among the rows the policy dropped fills up to it); ``max_weight`` c: no kept sample
    weighs more than c. None: off (the default: plans are the policy's own)."""

    min_keep_fraction: float | None = None
    max_weight: float | None = None

    def __post_init__(self) -> None:
        f, c = self.min_keep_fraction, self.max_weight
        if f is not None and not (isinstance(f, (int, float)) and not isinstance(f, bool) and 0 < f <= 1):
            raise InvalidInputError(
                f"min_keep_fraction={f!r} is outside the valid range 0 < min_keep_fraction <= 1 (None: no floor)"
            )
        if c is not None and not (
            isinstance(c, (int, float)) and not isinstance(c, bool) and math.isfinite(c) and c >= 1
        ):
            raise InvalidInputError(f"max_weight={c!r} is outside the valid range max_weight >= 1 (None: no cap)")

    @property
    def active(self) -> bool:
        return self.min_keep_fraction is not None or self.max_weight is not None

    def floor(self, n: int) -> int:
        """The least number of rows an epoch of ``n`` rows keeps: floor(f n + 1e-9) (§0.3), 0
        without a floor."""
        return 0 if self.min_keep_fraction is None else keep_count(self.min_keep_fraction, n)

    def cap(self) -> np.float32 | None:
        return None if self.max_weight is None else np.float32(self.max_weight)

    def to_params(self) -> dict[str, float]:
        """The safeguards that are set, as parameters (what the summary's ``params`` adds)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if getattr(self, f.name) is not None}


def split_params(params: Mapping[str, Any]) -> tuple[dict[str, Any], Safeguards]:
    """(the policy's own parameters, the :class:`Safeguards` among ``params``)."""
    own = {k: v for k, v in params.items() if k not in SAFEGUARD_PARAMS}
    return own, Safeguards(**{k: params[k] for k in SAFEGUARD_PARAMS if k in params})


def fillable(keep: np.ndarray, reason: np.ndarray) -> np.ndarray:
    """The rows the floor may add: not kept, and not left out as suspected noise (§0.10: the
    floor refills an epoch with samples the policy pruned, never with samples the noise rule
    holds as mislabelled or mismatched, §12)."""
    return ~np.asarray(keep, bool) & (np.asarray(reason) != reason_code("suspected_noise"))


def fill_mask(keep: np.ndarray, reason: np.ndarray, uid: np.ndarray, seed: int, epoch: int, m: int) -> np.ndarray:
    """The m rows the floor adds: among the :func:`fillable` rows, the m with the smallest
    uniform of stream 9 (§0.4), ties by smaller uid (all of them when fewer than m)."""
    u = uniforms(uid, seed, epoch, STREAM_FLOOR)
    return smallest_mask(u, m, np.asarray(uid, np.uint64), None, fillable(keep, reason))


def cap_weights(weight: np.ndarray, keep: np.ndarray, cap: np.float32) -> tuple[np.ndarray, int]:
    """(weights with every kept weight above ``cap`` set to ``cap``, how many were)."""
    weight = np.asarray(weight, dtype=np.float32)
    over = keep & (weight > cap)
    capped = int(np.count_nonzero(over))
    if capped:
        weight = np.where(over, cap, weight)
    return weight, capped


def _max_weight(summary: Mapping[str, Any]) -> float | None:
    weights = [float(w) for w, c in (summary.get("weight_histogram") or {}).items() if c]
    return max(weights) if weights else None


def _window(summary: Mapping[str, Any]) -> str:
    """SeTa's window as the summary gives it, for a message ('' for other policies)."""
    s, w, k = summary.get("s"), summary.get("w"), summary.get("k_eff")
    if not isinstance(s, int) or not w or not k:
        return ""
    hardest = " (the hardest)" if s + w == k and s > 0 else ""
    return f"; window: loss clusters {s}..{s + w - 1} of {k}{hardest}"


def plan_warnings(summary: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The warnings of a plan from its summary: ``low_keep`` (a pruning epoch keeps less than
    :data:`LOW_KEEP_FRACTION` of its rows) and ``high_weight`` (a kept weight above
    :data:`HIGH_WEIGHT`). Each is ``{"code", "value", "limit", "message"}``; the message says
    where, what was found, the limit, and the remedy."""
    out: list[dict[str, Any]] = []
    n, kept, epoch = int(summary.get("n") or 0), int(summary.get("kept") or 0), summary.get("epoch")
    policy = summary.get("policy")
    if n and summary.get("phase") == "prune" and kept / n < LOW_KEEP_FRACTION:
        frac = kept / n
        out.append(
            {
                "code": "low_keep",
                "value": frac,
                "limit": LOW_KEEP_FRACTION,
                "message": (
                    f"plan of epoch {epoch} ({policy}): keeps {kept} of {n} samples ({100 * frac:.1f}%, below "
                    f"{100 * LOW_KEEP_FRACTION:.0f}%{_window(summary)}): the epoch trains few steps on a narrow "
                    "part of the data, and accuracy may fall while it does. To keep at least a fraction f of every "
                    "epoch, add min_keep_fraction=f to the policy's params (docs/algorithms.md §0.10)"
                ),
            }
        )
    top = _max_weight(summary)
    if top is not None and top > HIGH_WEIGHT:
        out.append(
            {
                "code": "high_weight",
                "value": top,
                "limit": HIGH_WEIGHT,
                "message": (
                    f"plan of epoch {epoch} ({policy}): kept samples weigh up to {top:g}, above {HIGH_WEIGHT:g}: "
                    f"their loss is multiplied by {top:g}, as if they trained at {top:g} times the learning rate. "
                    "To cap the weights at c, add max_weight=c to the policy's params (docs/algorithms.md §0.10)"
                ),
            }
        )
    return out
