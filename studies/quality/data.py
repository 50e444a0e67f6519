"""The data sets (train / held-out validation / test shards) and the fixed label corruption.

* CIFAR-10: train shards 0-8 (45,000 images) train, train shard 9 (5,000) is the held-out
  validation split, the 10,000 test images are the test split.
* SST-2: ``train.tsv`` converted to shards with ``tools/text_to_shards.py`` (shuffled, seed 0):
  shards 0-12 (65,000 sentences) train, shard 13 (2,349) held-out validation; GLUE's ``dev.tsv``
  (872) is the test split (GLUE's test labels are not public).
"""

from __future__ import annotations

import glob
import shutil
import subprocess
import tarfile
from pathlib import Path
from typing import Any

from studies.quality.layout import child_env, python_m
from tools import draws

NOISE = 0.4
NOISE_SEED = 20261122


class Dataset:
    """A data set: its shards (``train``, ``val``, ``test``: set by ``prepare``) and how a run trains on it."""

    name: str
    classes: int
    epochs: int
    batch: int
    workers: int
    train: list[str]
    val: list[str]
    test: list[str]

    def __init__(self, data: Path, out: Path) -> None:
        self.data, self.out = data, out

    def prepare(self) -> None: ...

    @property
    def image(self) -> bool:
        return self.name == "cifar10"


class Cifar(Dataset):
    name, classes, epochs, batch, workers = "cifar10", 10, 6, 128, 1

    def prepare(self) -> None:
        d = self.data / "cifar10"
        shards = sorted(glob.glob(str(d / "train-*.tar.gz")))
        if len(shards) != 10:
            raise SystemExit(f"{d}: expected 10 train-*.tar.gz shards, found {len(shards)}; see {d}/README.md")
        self.train, self.val = shards[:9], shards[9:]
        self.test = sorted(glob.glob(str(d / "test-*.tar.gz")))


class Sst2(Dataset):
    name, classes, epochs, batch, workers = "sst2", 2, 5, 128, 2

    def prepare(self) -> None:
        d = self.out / "sst2-shards"
        if not ((d / "sst2-test.json").exists() and draws.made_with_these_draws(d / "sst2-train.json")):
            shutil.rmtree(d, ignore_errors=True)  # none yet, or shuffled by an older tool: made again
            tool = python_m("tools.text_to_shards", "--out", d, "--json")
            tool += ["--text", "sentence", "--label", "label", "--labels", "0,1", "--shard-size", "5000"]
            for split, tsv, extra in (("train", "train.tsv", ["--shuffle", "0"]), ("test", "dev.tsv", [])):
                args = [str(self.data / "sst2" / tsv), "--prefix", f"sst2-{split}", *extra]
                subprocess.run([*tool, *args], check=True, stdout=subprocess.DEVNULL, env=child_env())
        shards = sorted(glob.glob(str(d / "sst2-train-*.tar")))
        self.train, self.val = shards[:-1], shards[-1:]
        self.test = sorted(glob.glob(str(d / "sst2-test-*.tar")))


DATASETS: dict[str, type[Dataset]] = {"cifar10": Cifar, "sst2": Sst2}


def noise_offsets(population: Any, classes: int, rate: float = NOISE) -> dict[str, int]:
    """key -> label offset (1..C-1) for exactly round(rate * n) of the n training samples
    (``rate``: 40% unless told; :func:`symmetric_offsets` of the population's keys).

    Fixed and seeded (NOISE_SEED), derived from the keys alone, so every policy and seed sees
    the same corrupted labels; the new label (y + offset) mod C is always a different class.
    """
    return symmetric_offsets(population.column("key").to_pylist(), classes, rate)


def symmetric_offsets(keys: list[str], classes: int, rate: float = NOISE, seed: int = NOISE_SEED) -> dict[str, int]:
    """key -> label offset (1..C-1) for exactly round(rate * len(keys)) of ``keys``: the keys
    first in the order of a keyed hash of (seed, key) (purpose ``noise-pick``), each offset a
    second, independent keyed hash (purpose ``noise-offset``), uniform over 1..C-1. The order does
    not depend on ``rate``, so a lower rate corrupts a subset of a higher rate's samples, each with
    the same offset."""
    chosen = draws.order(draws.NOISE_PICK, seed, keys)[: round(rate * len(keys))]
    return {k: 1 + draws.below(draws.NOISE_OFFSET, seed, k, classes - 1) for k in chosen}


def shard_labels(urls: list[str]) -> dict[str, int]:
    """key -> label (the ``.cls`` member) of every sample of these tar shards (read in one pass, no
    decoding of the other members)."""
    out: dict[str, int] = {}
    for url in urls:
        with tarfile.open(url, "r:*") as tar:
            for m in tar:
                folder, _, base = m.name.rpartition("/")
                stem, _, ext = base.partition(".")  # webdataset's key: up to the first dot of the name
                if m.isfile() and ext == "cls":
                    key = f"{folder}/{stem}" if folder else stem
                    out[key] = int(tar.extractfile(m).read())  # type: ignore[union-attr]
    return out


# CIFAR-10's class-dependent flips (the asymmetric noise of the noisy-label literature):
# truck -> automobile, bird -> airplane, deer -> horse, cat <-> dog.
ASYMMETRIC_FLIPS = {9: 1, 2: 0, 4: 7, 3: 5, 5: 3}


def asymmetric_offsets(keys: list[str], labels: list[int], rate: float, seed: int = NOISE_SEED) -> dict[str, int]:
    """key -> new label for exactly round(rate * count) samples of each source class of
    :data:`ASYMMETRIC_FLIPS` (``count``: that class's samples among ``keys``), flipped to the
    class it maps to; the other classes keep their labels.

    Fixed and seeded like :func:`noise_offsets`: the samples of a class are ordered by a keyed
    hash of (seed, key) (purpose ``asym-pick``), so every policy and training seed sees the same
    corrupted labels, and a lower rate flips a subset of a higher rate's samples.
    """
    if len(keys) != len(labels):
        raise ValueError(f"{len(keys)} keys but {len(labels)} labels")
    out: dict[str, int] = {}
    for source, target in ASYMMETRIC_FLIPS.items():
        members = [k for k, y in zip(keys, labels) if y == source]
        out.update((k, target) for k in draws.order(draws.ASYM_PICK, seed, members)[: round(rate * len(members))])
    return out
