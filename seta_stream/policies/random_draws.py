"""Per-sample randomness and the two selection primitives (docs/algorithms.md §0.3, §0.4).

Every draw is a function of (uid, seed, epoch, stream) only, so plans are identical on any
machine, independent of row order, and mergeable across partitions (a uniform m-subset is the
m smallest uniforms). No process-wide RNG is touched.

The draw itself (``salt``, ``uniforms``, ``uniform_of``) is :mod:`seta_stream._kernels.draws`,
which the readers use too (the plan's absent rule); it is re-exported here beside the
policy-level helpers: the stream numbers, keep counts, uniform and weighted subsets, the m
smallest keys.
"""

from __future__ import annotations

import math

import numpy as np

from .._kernels.draws import salt, uniform_of, uniforms
from ..errors import InvalidInputError

__all__ = [
    "STREAM_RANDOM",
    "STREAM_ANNEAL",
    "STREAM_INFOBATCH",
    "STREAM_ESWP",
    "STREAM_STATIC",
    "STREAM_ES_BATCH",
    "STREAM_GUARD",
    "STREAM_NOISE",
    "STREAM_FLOOR",
    "salt",
    "uniforms",
    "uniform_of",
    "keep_count",
    "prune_epochs",
    "uniform_subset",
    "weighted_subset",
    "successive_keys",
    "smallest_mask",
    "smallest_indices",
    "kth_smallest",
]

STREAM_RANDOM, STREAM_ANNEAL, STREAM_INFOBATCH, STREAM_ESWP = 1, 2, 3, 4
STREAM_STATIC, STREAM_ES_BATCH, STREAM_GUARD = 5, 6, 7
STREAM_NOISE = 8  # the noise rule's re-check draw (§12)
STREAM_FLOOR = 9  # the floor's fill (safeguards, §0.10)

_DRAW_BLOCK_ROWS = 1 << 20


def keep_count(fraction: float, size: int) -> int:
    """m = floor(f * M + 1e-9) in float64 (§0.3)."""
    return int(math.floor(float(fraction) * float(size) + 1e-9))


def prune_epochs(delta: float, epochs: int, override: int | None = None) -> int:
    """P = floor(delta * E + 1e-9), or the explicit override (§0.3)."""
    if override is not None:
        return int(override)
    return int(math.floor(float(delta) * float(epochs) + 1e-9))


def smallest_indices(keys: np.ndarray, tie1: np.ndarray, tie2: np.ndarray | None, m: int) -> np.ndarray:
    """Indices (into keys) of the m smallest keys; ties broken by tie1 then tie2 (for small
    arrays such as a meta-batch; :func:`smallest_mask` is the O(N) version for a table)."""
    n = len(keys)
    if m <= 0:
        return np.zeros(0, dtype=np.int64)
    if m >= n:
        return np.arange(n, dtype=np.int64)
    part = np.argpartition(keys, m - 1)
    threshold = keys[part[m - 1]]
    below = np.flatnonzero(keys < threshold)
    at = np.flatnonzero(keys == threshold)
    need = m - len(below)
    if len(at) > need:
        order = np.lexsort((tie2[at], tie1[at])) if tie2 is not None else np.argsort(tie1[at], kind="stable")
        at = at[order[:need]]
    return np.concatenate([below, at])


_SAMPLE = 1 << 16


def kth_smallest(keys: np.ndarray, r: int) -> float:
    """The exact value of rank r (0-based) among ``keys`` (no NaN) in O(N) compares.

    A strided sample of 65,536 keys brackets the rank; only the keys inside the bracket (a few
    percent) are partitioned. Falls back to a full partition if the bracket misses. The value
    returned does not depend on the row order.
    """
    n = len(keys)
    if n <= 4 * _SAMPLE:
        return keys[np.argpartition(keys, r)[r]].item()
    sample = np.sort(keys[:: n // _SAMPLE])
    ns = len(sample)
    pos = r / n * ns
    margin = 4.0 * math.sqrt(ns) + 8.0
    i_lo, i_hi = int(math.floor(pos - margin)), int(math.ceil(pos + margin))
    lo_v = sample[i_lo] if i_lo >= 0 else None
    hi_v = sample[i_hi] if i_hi < ns else None
    below = int(np.count_nonzero(keys < lo_v)) if lo_v is not None else 0
    if lo_v is None and hi_v is None:
        band = np.ones(n, dtype=bool)
    elif lo_v is None:
        band = keys <= hi_v
    elif hi_v is None:
        band = keys >= lo_v
    else:
        band = keys >= lo_v
        band &= keys <= hi_v
    inside = keys[band]
    if below <= r < below + len(inside):
        return np.partition(inside, r - below)[r - below].item()
    return keys[np.argpartition(keys, r)[r]].item()  # pathological row order: exact fallback


def smallest_mask(
    keys: np.ndarray,
    m: int,
    tie1: np.ndarray,
    tie2: np.ndarray | None = None,
    valid: np.ndarray | None = None,
    prepared: bool = False,
) -> np.ndarray:
    """Bool mask of the m smallest ``keys`` among the ``valid`` rows (all by default); ties
    broken by smaller tie1, then smaller tie2. Row-order independent; O(N) for any N.
    ``prepared``: the keys of invalid rows are already +inf (saves a copy)."""
    n = len(keys)
    out = np.zeros(n, dtype=bool)
    n_valid = n if valid is None else int(np.count_nonzero(valid))
    m = min(int(m), n_valid)
    if m <= 0:
        return out
    if valid is not None and n_valid < n and not prepared:
        keys = np.where(valid, keys, np.inf)  # invalid rows sort last; excluded from ties below
    thr = kth_smallest(keys, m - 1)
    np.less(keys, thr, out=out)
    need = m - int(np.count_nonzero(out))
    at_mask = keys == thr
    if valid is not None and n_valid < n:
        at_mask &= valid
    at = np.flatnonzero(at_mask)
    if len(at) > need:
        order = np.lexsort((tie2[at], tie1[at])) if tie2 is not None else np.argsort(tie1[at], kind="stable")
        at = at[order[:need]]
    out[at] = True
    return out


def _as_mask(candidates: np.ndarray, n: int) -> np.ndarray:
    """A bool mask from a bool mask or an array of row indices."""
    c = np.asarray(candidates)
    if c.dtype == bool:
        if len(c) != n:
            raise InvalidInputError(f"candidate mask has {len(c)} rows, expected {n}")
        return c
    mask = np.zeros(n, dtype=bool)
    mask[c.astype(np.int64)] = True
    return mask


def uniform_subset(candidates: np.ndarray, m: int, u: np.ndarray, uid: np.ndarray) -> np.ndarray:
    """Bool mask: the m candidates with the smallest u_i, ties by smaller uid (§0.4).

    ``candidates`` is a bool mask over the rows or an array of row indices; ``u`` the uniforms
    of the stream (:func:`uniforms`) and ``uid`` the sample ids of all rows.
    """
    mask = _as_mask(candidates, len(u))
    all_rows = bool(mask.all())
    if all_rows and m >= len(u):  # keep everything (r = 0): no selection needed
        return mask.copy()
    return smallest_mask(u, m, uid, None, None if all_rows else mask)


def successive_keys(u: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Efraimidis-Spirakis keys -ln(1 - u_i) / w_i of successive sampling proportional to w
    (§0.4): +inf where w_i is not > 0 (never drawn before a positive weight)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        keys = np.negative(np.log1p(-u))
        keys /= w
    keys[~(w > 0)] = np.inf
    return keys


def weighted_subset(candidates: np.ndarray, weights: np.ndarray, m: int, u: np.ndarray, uid: np.ndarray) -> np.ndarray:
    """Bool mask: successive sampling without replacement proportional to ``weights`` (§0.4).

    Efraimidis-Spirakis keys k_i = -ln(1 - u_i) / w_i (+inf for w_i = 0), the m smallest keys;
    ties broken by smaller u_i, then smaller uid. ``candidates``: bool mask or row indices.
    """
    mask = _as_mask(candidates, len(u))
    w = np.asarray(weights, dtype=np.float64)
    if len(w) != len(u):
        raise InvalidInputError(f"weighted_subset: {len(w)} weights for {len(u)} rows")
    keys = np.empty(len(u), dtype=np.float64)
    for lo in range(0, len(u), _DRAW_BLOCK_ROWS):  # blockwise: small temporaries
        hi = lo + _DRAW_BLOCK_ROWS
        wb, cb = w[lo:hi], mask[lo:hi]
        positive = wb > 0
        if np.any(cb & ~(positive | (wb == 0))):  # negative, NaN or inf weight of a candidate
            raise InvalidInputError("weighted_subset: weights must be finite and >= 0")
        if np.any(cb & np.isinf(wb)):
            raise InvalidInputError("weighted_subset: weights must be finite and >= 0")
        kb = successive_keys(u[lo:hi], wb)
        kb[~cb] = np.inf  # non-candidates: never drawn
        keys[lo:hi] = kb
    return smallest_mask(keys, m, u, uid, mask, prepared=True)
