"""The per-sample uniform draw: a function of (uid, seed, epoch, stream) only (docs/algorithms.md §0.4).

u_i = (mix(uid_i XOR salt) >> 11) * 2^-53 in [0, 1), salt = mix(mix(mix(seed) XOR epoch) XOR stream):
no process-wide RNG is touched, so a draw is the same on any machine, in any row order and in
any bucket. Planning draws with it (the policies, through ``policies.random_draws``, and the
steps' uint64 keys, :func:`uniform_keys`), and the readers draw the plan's absent rule for a
sample the plan does not list with the same function (``_reading.planview``), so both live
here, below both. Pure: no I/O.
"""

from __future__ import annotations

import numpy as np

from ..ids import mix64, mix64_array

__all__ = ["salt", "uniforms", "uniform_of", "uniform_keys"]

_MASK = (1 << 64) - 1
_UNIFORM_BLOCK = 1 << 16  # uniforms(): a block's words stay in the CPU's cache
_TWO_M53 = 2.0**-53


def salt(seed: int, epoch: int, stream: int) -> int:
    """salt = mix(mix(mix(seed) XOR epoch) XOR stream) (§0.4)."""
    return mix64(mix64(mix64(int(seed) & _MASK) ^ (int(epoch) & _MASK)) ^ (int(stream) & _MASK))


def uniforms(uid: np.ndarray, seed: int, epoch: int, stream: int) -> np.ndarray:
    """u_i = (mix(uid_i XOR salt) >> 11) * 2^-53 in [0, 1), float64 (§0.4)."""
    uid = np.asarray(uid, dtype=np.uint64)
    s = np.uint64(salt(seed, epoch, stream))
    out = np.empty(len(uid), dtype=np.float64)
    words = np.empty(min(len(uid), _UNIFORM_BLOCK), dtype=np.uint64)  # one block's, reused
    for lo in range(0, len(uid), _UNIFORM_BLOCK):  # small temporaries are much faster here
        z = np.bitwise_xor(uid[lo : lo + _UNIFORM_BLOCK], s, out=words[: min(len(uid) - lo, _UNIFORM_BLOCK)])
        mix64_array(z, out=z)
        z >>= np.uint64(11)
        np.multiply(z, _TWO_M53, out=out[lo : lo + _UNIFORM_BLOCK], casting="unsafe")
    return out


def uniform_of(uid: int, seed: int, epoch: int, stream: int) -> float:
    """u of one sample (pure Python; equal to :func:`uniforms` elementwise)."""
    return (mix64(int(uid) ^ salt(seed, epoch, stream)) >> 11) * _TWO_M53


def uniform_keys(uid: np.ndarray, seed: int, epoch: int, stream: int) -> np.ndarray:
    """uint64 keys in the order of the per-sample uniforms u (:func:`uniforms`): u is
    (mix(uid XOR salt) >> 11) * 2^-53, so the top 53 bits of the mixed word order it exactly."""
    z = np.bitwise_xor(np.asarray(uid, dtype=np.uint64), np.uint64(salt(seed, epoch, stream)))
    mix64_array(z, out=z)
    z >>= np.uint64(11)
    z <<= np.uint64(11)
    return z
