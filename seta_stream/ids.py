"""Sample identity: one definition used by the recorder, the loss table, the plans and the stage.

A sample is identified by ``(shard, key)``: ``shard`` is the shard's file name taken from
webdataset's ``__url__`` (its last ``shard_depth`` path components, 1 by default) and ``key``
is ``__key__``. ``__key__`` alone repeats across shards.

For hashing and randomness every identity also has a 64-bit ``uid``:

    h = fold(OFFSET, UTF-8(shard)); uid = fold(h, UTF-8(key))
    fold(h, b): for each 8-byte little-endian word w of b (the last one zero-padded):
                    h = (h XOR w) * P;  h = h XOR (h >> 29)     (mod 2^64)
                then h = mix(h XOR len(b))

where ``mix`` is SplitMix64's finalizer (docs/algorithms.md §0.4), OFFSET = 0xCBF29CE484222325 and
P = 0x9FB21C651E98DF25 (odd, so every step is a bijection of h).
This hash (the uid of docs/algorithms.md §0.4) is used rather than a cryptographic one: it can be
computed for 15M strings at once with NumPy (compaction) and for one string in pure Python
(the stage), with identical results. Two identities with the same uid are rejected
(:func:`check_identity_collisions`).

This module does no I/O.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping, Sequence
from functools import lru_cache

import numpy as np
import pyarrow as pa

from ._kernels.arrays import one_array
from .errors import InvalidInputError, SampleIdCollisionError, ShardNameConflictError, ShardNameError

#: what a user needs of sample identity; the other names here (the hash, the shard checks, the
#: buckets) are the package's own
__all__ = ["shard_location", "shard_name", "sample_uid", "sample_uids"]

_MASK = (1 << 64) - 1
_OFFSET = 0xCBF29CE484222325
_P = 0x9FB21C651E98DF25


def shard_location(url: str) -> str:
    """Where a webdataset ``__url__`` reads its shard from: a URL or path, without query string.

    * a plain path or URL is returned as given, without its query string (``?X-Amz-...`` of a
      signed URL) or fragment; ``file://`` is dropped, so ``file:///d/a.tar`` is ``/d/a.tar``;
    * a ``pipe:`` command is parsed like a shell line (quotes, ``||``, ``&&``, ``|``, ``;``),
      and the location is the one URL (``scheme://...``) in its first command, or else its one
      argument that names a tar file (``*.tar``, ``*.tar.gz``, ``*.tgz``, ...):
      ``pipe:curl -s -L https://h/d/shard-0.tar || true`` -> ``https://h/d/shard-0.tar``,
      ``pipe:aws s3 cp s3://b/t/shard-0.tar -`` -> ``s3://b/t/shard-0.tar``,
      ``pipe:cat /d/shard-0.tar`` -> ``/d/shard-0.tar``.

    Raises :class:`ShardNameError` for a ``pipe:`` command with no such argument, or with
    several different ones, because naming its shard by any other word (``true``, ``-``,
    ``cat``) would give every shard of a run the same name.
    """
    if not isinstance(url, str) or not url.strip():
        raise InvalidInputError(f"__url__ must be a non-empty string, found {url!r}; pass the batch's '__url__' list")
    if url.startswith("pipe:"):
        return _pipe_location(url)
    return _strip_url(url)


def shard_name(url: str, depth: int = 1) -> str:
    """Return the shard name of a webdataset ``__url__``: the last ``depth`` path components of
    its :func:`shard_location`.

    ``shard_name("s3://b/train/shard-000.tar") == "shard-000.tar"``; with ``depth=2`` it is
    ``"train/shard-000.tar"``; ``shard_name("pipe:curl -s https://h/t/shard-000.tar || true")``
    is ``"shard-000.tar"``.
    """
    if depth < 1:
        raise InvalidInputError(f"shard_depth must be >= 1, found {depth}")
    parts = shard_location(url).replace("\\", "/").rstrip("/").split("/")
    name = "/".join(parts[-depth:])
    if not name:
        raise ShardNameError(
            f"__url__ {url!r} has no file name to name its shard by; expected a path or URL ending in the "
            "shard's file name (e.g. '/data/shard-000.tar')"
        )
    return name


def separating_depth(location_a: str, location_b: str) -> int | None:
    """The smallest ``shard_depth`` at which two shard locations get different names (None if
    no depth separates them); error messages suggest it."""
    a = location_a.replace("\\", "/").rstrip("/").split("/")
    b = location_b.replace("\\", "/").rstrip("/").split("/")
    for depth in range(1, max(len(a), len(b)) + 1):
        if a[-depth:] != b[-depth:]:
            return depth
    return None


def depth_hint(location_a: str, location_b: str) -> str:
    """How to fix two locations that share a shard name (the end of an error message)."""
    depth = separating_depth(location_a, location_b)
    if depth is None:
        return "Give the shards different file names"
    return (
        f"Start a new run directory with a larger shard_depth, so that shard names keep {depth} path components: "
        f"Pruner(..., settings={{'shard_depth': {depth}}}) or RunDir(url, create=True, "
        f"settings={{'shard_depth': {depth}}}) (and list_samples(urls, shard_depth={depth}))"
    )


class ShardLocations:
    """One location per shard name: ``check`` remembers where each name was first seen and
    raises :class:`ShardNameConflictError` naming both places when a name comes back with
    another location (two different shards whose samples would be merged).

    ``known`` is {shard name: location} already held somewhere (the loss table), described by
    ``known_where``; ``consequence`` ends the first sentence of the error (what was not done).
    A conflict with a known location ends with ``known_hint`` and raises ``known_error`` when
    they are given (the population against the table: two places, not two shards), otherwise
    with :func:`depth_hint`.
    """

    def __init__(
        self,
        known: Mapping[str, str],
        known_where: str,
        consequence: str,
        known_hint: str | None = None,
        known_error: type[ShardNameConflictError] = ShardNameConflictError,
    ) -> None:
        self.first = {name: (location, known_where) for name, location in known.items()}
        self.consequence = consequence
        self.known = frozenset(known)
        self.known_hint, self.known_error = known_hint, known_error

    def check(self, shard: str, location: str, where: str) -> None:
        other = self.first.setdefault(shard, (location, where))
        if other[0] != location:
            error, hint = ShardNameConflictError, depth_hint(other[0], location)
            if shard in self.known and self.known_hint is not None:
                error, hint = self.known_error, self.known_hint
            raise error(
                f"shard name {shard!r} stands for two shards: {other[0]!r} (in {other[1]}) and {location!r} "
                f"(in {where}); {self.consequence}. {hint}"
            )

    def locations(self) -> dict[str, str]:
        """{shard name: location} of every name seen, the known ones included."""
        return {name: location for name, (location, _) in self.first.items()}


_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
_TAR_SUFFIX = re.compile(r"\.(tar|tgz|tar\.(gz|bz2|xz|zst|lz4))$", re.IGNORECASE)
_SHELL_OPERATORS = {"|", "||", "&&", ";", "&", "|&"}


def _strip_url(text: str) -> str:
    if text.startswith("file://"):
        text = text[len("file://") :]
    if _SCHEME.match(text) or "?" in text:
        text = text.split("#", 1)[0].split("?", 1)[0]
    return text


def _pipe_location(url: str) -> str:
    command = url[len("pipe:") :]
    try:
        lexer = shlex.shlex(command, posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        words = list(lexer)
    except ValueError as exc:
        raise ShardNameError(f"cannot parse the pipe: command {url!r} ({exc}); expected a shell command") from None
    first: list[str] = []
    for word in words:
        if word in _SHELL_OPERATORS:
            break
        first.append(word)
    args = [w for w in first[1:] if not w.startswith("-") and not w.startswith(">")]
    urls = {_strip_url(w) for w in args if _SCHEME.match(w)}
    found = urls or {_strip_url(w) for w in args if _TAR_SUFFIX.search(_strip_url(w))}
    if len(found) == 1:
        return found.pop()
    what = f"{len(found)} candidates {sorted(found)}" if found else "no URL or tar file path"
    raise ShardNameError(
        f"cannot tell which shard the pipe: URL {url!r} reads: its command has {what}; expected exactly one "
        "URL (scheme://...) or *.tar path among the arguments of its first command, e.g. "
        "'pipe:curl -s -L https://host/data/shard-000.tar || true'. Put the shard's URL or path in the command "
        "as a plain argument (shard names come from it)"
    )


def mix64(x: int) -> int:
    """SplitMix64 finalizer on a Python int (wrap-around uint64 arithmetic)."""
    z = (x + 0x9E3779B97F4A7C15) & _MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return z ^ (z >> 31)


def mix64_array(x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """SplitMix64 finalizer applied elementwise to a uint64 array.

    Works in place on ``out`` (a new array by default; pass ``out=x`` to overwrite ``x``). A
    1-D array is mixed :data:`_MIX_BLOCK` words at a time through one block-sized scratch
    buffer: the steps then run on a block in the CPU's cache, and no temporary as large as the
    array is faulted in (docs/benchmarks.md, "Web scale")."""
    z = np.add(np.asarray(x, dtype=np.uint64), _GOLDEN, out=out)
    if z.ndim != 1:
        _mix_in_place(z, np.empty_like(z))
        return z
    scratch = np.empty(min(len(z), _MIX_BLOCK), dtype=np.uint64)
    for lo in range(0, len(z), _MIX_BLOCK):
        block = z[lo : lo + _MIX_BLOCK]
        _mix_in_place(block, scratch[: len(block)])
    return z


def _mix_in_place(z: np.ndarray, t: np.ndarray) -> None:
    """The finalizer's steps after the golden-ratio add, in place on ``z`` (``t``: scratch)."""
    np.right_shift(z, _S30, out=t)
    z ^= t
    z *= _M1
    np.right_shift(z, _S27, out=t)
    z ^= t
    z *= _M2
    np.right_shift(z, _S31, out=t)
    z ^= t


#: Words per block of :func:`mix64_array`.
_MIX_BLOCK = 1 << 16


_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_S30, _S27, _S31, _S29 = np.uint64(30), np.uint64(27), np.uint64(31), np.uint64(29)
_P_U64 = np.uint64(0x9FB21C651E98DF25)
# _TAIL_MASK[r] keeps the first r bytes of a little-endian word (r = 0..8).
_TAIL_MASK = np.array([(1 << (8 * r)) - 1 for r in range(8)] + [(1 << 64) - 1], dtype=np.uint64)


def _fold(state: int, data: bytes) -> int:
    for i in range(0, len(data), 8):
        state = ((state ^ int.from_bytes(data[i : i + 8], "little")) * _P) & _MASK
        state ^= state >> 29
    return mix64(state ^ len(data))


@lru_cache(maxsize=4096)
def _shard_state(shard: str) -> int:
    return _fold(_OFFSET, shard.encode("utf-8"))


_BUCKET_SALT = 0x5EB0C4E7B0C4E75E


def shard_bucket(shard: str, buckets: int) -> int:
    """The bucket of a shard in a partitioned run (docs/format.md): mix64(h(shard) XOR salt) mod
    ``buckets``, where h is the uid's hash of the UTF-8 shard name. Every sample of a shard is
    in one bucket, so a bucket's table and plan rows are whole shards."""
    if buckets <= 1:
        return 0
    return mix64(_shard_state(shard) ^ _BUCKET_SALT) % int(buckets)


def sample_uid(shard: str, key: str) -> int:
    """uid of one sample identity (pure Python: the stage computes it for every sample it
    decides). :func:`_fold` and :func:`mix64` inlined, and the key's words taken from one int:
    about 20% less time a sample than calling them."""
    data = key.encode("utf-8")
    n = len(data)
    h = _shard_state(shard)
    words = int.from_bytes(data, "little")
    for _ in range((n + 7) >> 3):
        h = ((h ^ (words & _MASK)) * _P) & _MASK
        h ^= h >> 29
        words >>= 64
    z = ((h ^ n) + 0x9E3779B97F4A7C15) & _MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return z ^ (z >> 31)


def _string_buffers(arr: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """(offsets int64[n+1], data uint8) of a string array without nulls."""
    arr = one_array(arr)
    if pa.types.is_dictionary(arr.type):
        arr = arr.dictionary_decode()
    if pa.types.is_string(arr.type):
        arr = arr.cast(pa.large_string())
    elif not pa.types.is_large_string(arr.type):
        raise InvalidInputError(f"expected a string array, found type {arr.type}")
    if arr.null_count:
        raise InvalidInputError(f"string array has {arr.null_count} null value(s)")
    bufs = arr.buffers()
    offsets = np.frombuffer(bufs[1], dtype=np.int64)[arr.offset : arr.offset + len(arr) + 1]
    data = np.frombuffer(bufs[2], dtype=np.uint8) if bufs[2] is not None else np.zeros(0, np.uint8)
    return offsets, data


def sample_uids(
    shards: pa.Array | pa.ChunkedArray | Sequence[str],
    keys: pa.Array | pa.ChunkedArray | Sequence[str],
) -> np.ndarray:
    """uids of many identities at once (vectorised; equal to :func:`sample_uid` elementwise)."""
    shards_arr = shards if isinstance(shards, (pa.Array, pa.ChunkedArray)) else pa.array(shards)
    keys_arr = keys if isinstance(keys, (pa.Array, pa.ChunkedArray)) else pa.array(keys)
    if len(shards_arr) != len(keys_arr):
        raise InvalidInputError(f"{len(shards_arr)} shard names but {len(keys_arr)} keys; one shard per key expected")
    n = len(keys_arr)
    if n == 0:
        return np.zeros(0, dtype=np.uint64)
    # Start state per row: the state after folding the shard name, once per distinct shard.
    shards_arr = one_array(shards_arr)
    enc = shards_arr if pa.types.is_dictionary(shards_arr.type) else shards_arr.dictionary_encode()
    names = enc.dictionary.to_pylist()
    indices = enc.indices.to_numpy(zero_copy_only=False)
    starts_by_shard = np.array([_shard_state(s) for s in names], dtype=np.uint64)
    h = starts_by_shard[indices]

    offsets, data = _string_buffers(keys_arr)
    # Unaligned little-endian uint64 view at every byte position (8 zero bytes of padding).
    padded = np.concatenate([data, np.zeros(8, np.uint8)])
    words_at = np.ndarray(shape=(len(data) + 1,), dtype="<u8", buffer=padded.data, strides=(1,))
    # Blocks of 2^18 rows keep temporaries small: whole-array temporaries at 15M rows are
    # about 10x slower per element here (page faults on every fresh allocation).
    out = np.empty(n, dtype=np.uint64)
    for lo in range(0, n, _ROWS_PER_BLOCK):
        hi = min(n, lo + _ROWS_PER_BLOCK)
        out[lo:hi] = _fold_block(h[lo:hi], offsets[lo : hi + 1], words_at)
    return out


_ROWS_PER_BLOCK = 1 << 18


def _fold_block(h: np.ndarray, offsets: np.ndarray, words_at: np.ndarray) -> np.ndarray:
    n = len(h)
    begin = offsets[:-1]
    lengths = offsets[1:] - begin
    nwords = (lengths + 7) // 8
    # Process rows with the most words first so that the rows still active are a prefix.
    order = np.argsort(-nwords, kind="stable")
    h_sorted = h[order]
    begin_sorted = begin[order]
    len_sorted = lengths[order]
    nw_sorted = nwords[order]
    max_words = int(nw_sorted[0])
    active = np.searchsorted(-nw_sorted, -np.arange(max_words), side="left")
    for j in range(max_words):
        m = int(active[j])
        seg = h_sorted[:m]
        w = words_at[begin_sorted[:m] + 8 * j]
        w &= _TAIL_MASK[np.minimum(len_sorted[:m] - 8 * j, 8)]
        seg ^= w
        seg *= _P_U64
        np.right_shift(seg, _S29, out=w)
        seg ^= w
    h_sorted ^= len_sorted.astype(np.uint64)
    mix64_array(h_sorted, out=h_sorted)
    out = np.empty(n, dtype=np.uint64)
    out[order] = h_sorted
    return out


def check_identity_collisions(
    uids: np.ndarray, shards: Sequence[str] | pa.Array, keys: Sequence[str] | pa.Array
) -> None:
    """Raise :class:`SampleIdCollisionError` if two different (shard, key) share a uid.

    Rows may repeat the same identity; only different identities with equal uids are errors.
    """
    uids = np.asarray(uids, dtype=np.uint64)
    if len(uids) < 2:
        return
    order = np.argsort(uids, kind="stable")
    su = uids[order]
    dup = np.flatnonzero(su[1:] == su[:-1])
    if len(dup) == 0:
        return
    sh = shards.to_pylist() if isinstance(shards, (pa.Array, pa.ChunkedArray)) else list(shards)
    ks = keys.to_pylist() if isinstance(keys, (pa.Array, pa.ChunkedArray)) else list(keys)
    for d in dup:
        a, b = int(order[d]), int(order[d + 1])
        if sh[a] != sh[b] or ks[a] != ks[b]:
            raise SampleIdCollisionError(
                f"sample ids collide: ({sh[a]!r}, {ks[a]!r}) and ({sh[b]!r}, {ks[b]!r}) both "
                f"hash to uid {int(su[d]):#018x}; expected distinct uids for distinct samples. "
                "Rename one of the keys (a 64-bit collision is astronomically rare; check that "
                "the keys are not corrupted)"
            )
