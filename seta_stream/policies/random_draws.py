"""Per-sample randomness and the two selection primitives (algorithms.md §0.3, §0.4).

Every draw is a function of (uid, seed, epoch, stream) only, so plans are identical on any
machine, independent of row order, and mergeable across partitions (a uniform m-subset is the
m smallest uniforms). No process-wide RNG is touched.
"""

from __future__ import annotations

import math

import numpy as np

from ..ids import mix64, mix64_array

__all__ = [
    "STREAM_RANDOM",
    "STREAM_ANNEAL",
    "STREAM_INFOBATCH",
    "STREAM_ESWP",
    "STREAM_STATIC",
    "STREAM_ES_BATCH",
    "STREAM_GUARD",
    "salt",
    "uniforms",
    "uniform_of",
    "keep_count",
    "prune_epochs",
    "uniform_subset",
    "weighted_subset",
]

STREAM_RANDOM, STREAM_ANNEAL, STREAM_INFOBATCH, STREAM_ESWP = 1, 2, 3, 4
STREAM_STATIC, STREAM_ES_BATCH, STREAM_GUARD = 5, 6, 7

_MASK = (1 << 64) - 1
_BLOCK = 1 << 20
_TWO_M53 = 2.0**-53


def salt(seed: int, epoch: int, stream: int) -> int:
    """salt = mix(mix(mix(seed) XOR epoch) XOR stream) (§0.4)."""
    return mix64(mix64(mix64(int(seed) & _MASK) ^ (int(epoch) & _MASK)) ^ (int(stream) & _MASK))


def uniforms(uid: np.ndarray, seed: int, epoch: int, stream: int) -> np.ndarray:
    """u_i = (mix(uid_i XOR salt) >> 11) * 2^-53 in [0, 1), float64 (§0.4)."""
    uid = np.asarray(uid, dtype=np.uint64)
    s = np.uint64(salt(seed, epoch, stream))
    out = np.empty(len(uid), dtype=np.float64)
    for lo in range(0, len(uid), _BLOCK):  # small temporaries are much faster here
        z = mix64_array(uid[lo : lo + _BLOCK] ^ s)
        z >>= np.uint64(11)
        np.multiply(z, _TWO_M53, out=out[lo : lo + _BLOCK], casting="unsafe")
    return out


def uniform_of(uid: int, seed: int, epoch: int, stream: int) -> float:
    """u of one sample (pure Python; equal to :func:`uniforms` elementwise)."""
    return (mix64(int(uid) ^ salt(seed, epoch, stream)) >> 11) * _TWO_M53


def keep_count(fraction: float, size: int) -> int:
    """m = floor(f * M + 1e-9) in float64 (§0.3)."""
    return int(math.floor(float(fraction) * float(size) + 1e-9))


def prune_epochs(delta: float, epochs: int, override: int | None = None) -> int:
    """P = floor(delta * E + 1e-9), or the explicit override (§0.3)."""
    if override is not None:
        return int(override)
    return int(math.floor(float(delta) * float(epochs) + 1e-9))


def _smallest(keys: np.ndarray, tie1: np.ndarray, tie2: np.ndarray | None, m: int) -> np.ndarray:
    """Indices (into keys) of the m smallest keys; ties broken by tie1 then tie2."""
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


def uniform_subset(candidates: np.ndarray, m: int, u: np.ndarray, uid: np.ndarray) -> np.ndarray:
    """Bool mask: the m candidates with the smallest u_i, ties by smaller uid (§0.4)."""
    candidates = np.asarray(candidates, dtype=bool)
    if m >= len(u) and candidates.all():  # keep everything (r = 0): no selection needed
        return candidates.copy()
    out = np.zeros(len(u), dtype=bool)
    idx = np.flatnonzero(candidates)
    chosen = _smallest(u[idx], uid[idx], None, m)
    out[idx[chosen]] = True
    return out


def weighted_subset(candidates: np.ndarray, weights: np.ndarray, m: int, u: np.ndarray, uid: np.ndarray) -> np.ndarray:
    """Bool mask: successive sampling without replacement proportional to ``weights`` (§0.4).

    Efraimidis-Spirakis keys k_i = -ln(1 - u_i) / w_i (+inf for w_i = 0), the m smallest keys;
    ties broken by smaller u_i, then smaller uid.
    """
    candidates = np.asarray(candidates, dtype=bool)
    out = np.zeros(len(u), dtype=bool)
    idx = np.flatnonzero(candidates)
    w = np.asarray(weights, dtype=np.float64)[idx]
    if np.any(w < 0) or not np.all(np.isfinite(w)):
        raise ValueError("weighted_subset: weights must be finite and >= 0")
    with np.errstate(divide="ignore"):
        keys = np.where(w > 0, -np.log1p(-u[idx]) / np.where(w > 0, w, 1.0), np.inf)
    chosen = _smallest(keys, u[idx], uid[idx], m)
    out[idx[chosen]] = True
    return out
