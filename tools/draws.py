"""The seeded draws of the data tools and the studies: one keyed hash and one generator per purpose, the only
source of them (the data tools here import it, and the studies import it from here: one owner).

Every seeded choice of a data tool or a study (the samples given a wrong label and their offsets, cleanlab's folds,
the mismatched pairs of a generated set, a shuffle, the training order, an augmentation draw) comes
from here, each under a purpose of its own:

* :func:`digest` / :func:`uniform` / :func:`order`: BLAKE2b keyed by
  ``seta_stream.study/<purpose>/<seed>`` over a text (a sample's key). No linear structure (unlike
  a salted CRC32, whose values for two salts differ by one constant XOR on keys of one length, so
  two "independent" choices made with it are not), a function of (purpose, seed, text) alone: the
  same on every machine, whatever the order or the set of the other texts.
* :func:`generator`: a NumPy ``Generator`` seeded by (purpose constant, ints...), for draws that
  take a stream (a permutation).
* :func:`seed_int`: an integer for a library that takes its own seed (scikit-learn's
  ``random_state``, webdataset's ``detshuffle``, ``random.Random``, a torch generator).

tests/test_study_draws.py checks that each choice built on these is what its name says.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

PREFIX = "seta_stream.study"
#: recorded by the data tools (``"draws"`` in a set's info.json / summary): a set made with other draws
#: (an older CRC32- or ``random.Random``-seeded tool) is made again by the studies, not reused
VERSION = "blake2b-1"

# the purposes: one a choice, never shared
NOISE_PICK = "noise-pick"  # the samples given a wrong label (symmetric noise)
NOISE_OFFSET = "noise-offset"  # their label offset 1..C-1
ASYM_PICK = "asym-pick"  # the samples of a source class flipped (asymmetric noise)
CLEANLAB_FOLDS = "cleanlab-folds"  # StratifiedKFold's random_state
PAIR_SCENE = "pair-scene"  # a generated pair set's scenes and clean captions (per shard)
PAIR_MISMATCH = "pair-mismatch"  # the pairs given another image's caption
PAIR_DONOR = "pair-donor"  # the image whose caption a mismatched pair gets
WORD_SAMPLE = "word-sample"  # a generated word set's words, casing, hard samples (per shard)
WORD_RENDER = "word-render"  # their rendering (font, position, distortions; per shard)
WORD_NOISE_PICK = "word-noise-pick"  # the samples shown a random label
WORD_NOISE_LABEL = "word-noise-label"  # that label
TEXT_SHUFFLE = "text-shuffle"  # tools.text_to_shards --shuffle
SHARD_ORDER = "shard-order"  # the training loader's shard order (+ epoch)
SAMPLE_ORDER = "sample-order"  # its sample order (+ epoch)
AUGMENT = "augment"  # a sample's crop and flip in an epoch
GPU_ORDER = "gpu-order"  # studies/cifar_gpu.py's per-epoch permutation
GPU_AUGMENT = "gpu-augment"  # its crops and flips (a torch generator)

_MAX_KEY = 64  # BLAKE2b's key length limit
_TWO_M53 = 2.0**-53


def _key(purpose: str, seed: int) -> bytes:
    key = f"{PREFIX}/{purpose}/{int(seed)}".encode()
    if len(key) > _MAX_KEY:
        raise ValueError(f"purpose {purpose!r} with seed {seed}: {len(key)} bytes of key, BLAKE2b takes {_MAX_KEY}")
    return key


def digest(purpose: str, seed: int, text: str) -> int:
    """A 64-bit integer: BLAKE2b of ``text`` keyed by ``seta_stream.study/<purpose>/<seed>``."""
    return int.from_bytes(hashlib.blake2b(text.encode(), key=_key(purpose, seed), digest_size=8).digest(), "little")


def digests(purpose: str, seed: int, texts: Iterable[str]) -> np.ndarray:
    """:func:`digest` of every text, as uint64."""
    key = _key(purpose, seed)
    raw = b"".join(hashlib.blake2b(t.encode(), key=key, digest_size=8).digest() for t in texts)
    return np.frombuffer(raw, dtype="<u8").astype(np.uint64)


def uniform(purpose: str, seed: int, text: str) -> float:
    """A uniform in [0, 1) of (purpose, seed, text): the digest's top 53 bits."""
    return (digest(purpose, seed, text) >> 11) * _TWO_M53


def uniforms(purpose: str, seed: int, texts: Iterable[str]) -> np.ndarray:
    """:func:`uniform` of every text, as float64."""
    return (digests(purpose, seed, texts) >> np.uint64(11)).astype(np.float64) * _TWO_M53


def below(purpose: str, seed: int, text: str, n: int) -> int:
    """An integer in 0..n-1 of (purpose, seed, text) (the digest mod n: a bias below n / 2^64)."""
    return digest(purpose, seed, text) % int(n)


def order(purpose: str, seed: int, texts: Sequence[str]) -> list[str]:
    """``texts`` in the order of their digests (ties, never seen in practice, by the text): a uniform
    random order, the same for any order of the input, and a text's place among a subset the same."""
    d = digests(purpose, seed, texts)
    return [texts[i] for i in sorted(range(len(texts)), key=lambda i: (int(d[i]), texts[i]))]


def purpose_constant(purpose: str) -> int:
    """The 64-bit constant that opens a purpose's generator seed (BLAKE2b of its name)."""
    return int.from_bytes(hashlib.blake2b(f"{PREFIX}/{purpose}".encode(), digest_size=8).digest(), "little")


def generator(purpose: str, *ints: int) -> np.random.Generator:
    """A NumPy generator of (purpose, ints...): ``np.random.default_rng([purpose constant, *ints])``."""
    return np.random.default_rng([purpose_constant(purpose), *(int(i) for i in ints)])


def seed_int(purpose: str, *ints: int, bits: int = 63) -> int:
    """A ``bits``-bit integer of (purpose, ints...) for a library that seeds itself (63 bits leave room
    for webdataset's ``detshuffle`` to add the epoch; scikit-learn's ``random_state`` takes 32)."""
    key = f"{PREFIX}/{purpose}/seed".encode()
    text = "/".join(str(int(i)) for i in ints).encode()
    return int.from_bytes(hashlib.blake2b(text, key=key, digest_size=8).digest(), "little") >> (64 - bits)


def stratified_folds(keys: Sequence[str], labels: Sequence[int], folds: int, seed: int) -> np.ndarray:
    """The fold (0..folds-1) of every key, as cleanlab makes its cross-validation folds
    (``cleanlab.count.estimate_cv_predicted_probabilities``: scikit-learn's
    ``StratifiedKFold(n_splits=folds, shuffle=True, random_state=seed)`` split on the given, noisy
    labels): each label's samples shuffled and dealt to the folds as evenly as possible (a fold's
    size, and its count of each label, within one of the others'). ``random_state`` is the seed's
    (purpose ``cleanlab-folds``), and the split runs over the keys in sorted order, so the folds are
    a function of the (key, label) pairs and the seed, not of the order they come in."""
    from sklearn.model_selection import StratifiedKFold

    if len(keys) != len(labels):
        raise ValueError(f"{len(keys)} keys but {len(labels)} labels")
    pos = sorted(range(len(keys)), key=lambda i: keys[i])
    y = np.asarray([int(labels[i]) for i in pos])
    out = np.empty(len(keys), dtype=np.int64)
    split = StratifiedKFold(n_splits=folds, shuffle=True, random_state=seed_int(CLEANLAB_FOLDS, seed, bits=32))
    for k, (_, held) in enumerate(split.split(np.zeros((len(y), 1)), y)):
        out[np.asarray(pos)[held]] = k
    return out


def made_with_these_draws(info: Path) -> bool:
    """Whether the data set whose ``info.json`` (or summary) is ``info`` exists and was made with
    these draws (its ``"draws"`` is :data:`VERSION`)."""
    try:
        return json.loads(Path(info).read_text()).get("draws") == VERSION
    except (OSError, ValueError):
        return False
