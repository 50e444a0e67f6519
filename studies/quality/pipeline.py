"""Samples in, tensors out: the training loader through ``seta.attach``, collation and evaluation.

Shards (a new order every epoch) -> ``seta.attach`` (skip_shards + keep_filter) -> shuffle (a new order
every epoch) -> decode -> batches of 128,
collated (and for images augmented) in one DataLoader worker; evaluation reads its split in
order, 500 at a time.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from studies.quality.data import Dataset
from studies.quality.models import tokens
from tools import draws

MEAN = np.array([0.4914, 0.4822, 0.4465], np.float32) * 255
STD = np.array([0.2470, 0.2435, 0.2616], np.float32) * 255

ORDER = "reshuffled every epoch"  # what a result file says of its epochs' sample order


def crop_and_flip(seed: int, epoch: int, key: str) -> tuple[int, int, bool]:
    """(row, column) offset 0..8 of a sample's 32x32 crop of its 4-pixel zero-padded image, and
    whether it is flipped, in epoch ``epoch`` of seed ``seed``: three disjoint bit fields of a keyed
    hash of (seed, epoch, key) (purpose ``augment``), so a sample's draw is the same in every run of
    the seed (whatever the policy kept, the batch it fell in, or where a resumed run restarted) and
    new every epoch."""
    d = draws.digest(draws.AUGMENT, seed, f"{epoch}/{key}")
    return ((d & 0xFFFFFF) * 9) >> 24, (((d >> 24) & 0xFFFFFF) * 9) >> 24, bool((d >> 48) & 1)


class _Augment:
    """The loader's augmentation stage (after decode): every image cropped and flipped by
    :func:`crop_and_flip` of its key and the epoch, counted like webdataset's ``detshuffle`` (one
    more at every iteration of the persistent worker's pipeline, from ``start_epoch``)."""

    def __init__(self, seed: int, start_epoch: int) -> None:
        self.seed, self.epoch = seed, start_epoch - 1

    def __call__(self, src: Any) -> Any:
        self.epoch += 1  # now, not at the first sample: as detshuffle counts
        return self._run(src, self.epoch)

    def _run(self, src: Any, epoch: int) -> Any:
        for sample in src:
            dy, dx, flip = crop_and_flip(self.seed, epoch, sample["__key__"])
            pad = np.zeros((40, 40, 3), np.uint8)
            pad[4:36, 4:36] = sample["jpg"]
            x = pad[dy : dy + 32, dx : dx + 32]
            sample["jpg"] = np.ascontiguousarray(x[:, ::-1] if flip else x)
            yield sample


def _images(batch: list) -> Any:
    """Batch of HWC uint8 images -> normalised NCHW float tensor (channels-last memory)."""
    import torch

    x = (np.stack(batch).astype(np.float32) - MEAN) / STD
    return torch.from_numpy(x).permute(0, 3, 1, 2).contiguous(memory_format=torch.channels_last)


def _texts(batch: list) -> Any:
    import torch

    ids = [tokens(t) for t in batch]
    offsets = np.cumsum([0] + [len(t) for t in ids[:-1]])
    return torch.tensor([i for t in ids for i in t]), torch.from_numpy(offsets)


def _collate(samples: list) -> tuple:
    cols = list(zip(*samples))
    x = _images(list(cols[0])) if isinstance(cols[0][0], np.ndarray) else _texts(list(cols[0]))
    return (x, *[list(c) for c in cols[1:]])


def _relabel(offsets: dict[str, int], classes: int) -> Any:
    def fn(sample: dict) -> dict:
        off = offsets.get(sample["__key__"])
        if off:  # before decode: the label is still the member's bytes
            sample["cls"] = str((int(sample["cls"]) + off) % classes).encode()
        return sample

    return fn


def train_loader(ds: Dataset, run_dir: str, seed: int, noise: dict[str, int] | None, with_score: bool, bs: int,
                 augment: bool = True, start_epoch: int = 0, exclude: frozenset[str] | None = None) -> Any:  # fmt: skip
    """Batches of (input, labels, keys, urls, weights[, scores]) of the samples the plan keeps
    (images cropped and flipped at random unless ``augment`` is false: :func:`crop_and_flip`),
    without the samples whose keys are in ``exclude`` (a filter applied before a run: the oracle,
    a cross-validation fold).

    Every epoch reads the shards and the samples in a new order, the same for a seed and epoch:
    webdataset's ``detshuffle`` stages in the (persistent) worker, each seeded by ``s + epoch``
    with ``s`` a 63-bit integer of the seed and its own purpose (``draws.seed_int``: shard order,
    sample order), so no two seeds, epochs or stages share a stream. webdataset's
    ``shuffle(n, seed=s)`` and ``shardshuffle`` without ``detshuffle`` seed a new generator at
    every iteration, so each epoch would repeat the first one's order and full data would train
    the same batches every epoch. ``start_epoch``: the epoch the loader's first iteration trains
    (a resumed run replays that epoch's order and crops).
    """
    import webdataset as wds

    import seta_stream as seta

    shard_seed = draws.seed_int(draws.SHARD_ORDER, seed)
    shards = wds.WebDataset(ds.train, shardshuffle=len(ds.train), detshuffle=True, seed=shard_seed,
                            empty_check=False)  # fmt: skip
    for stage in shards.pipeline:
        if isinstance(stage, wds.filters.detshuffle):
            stage.epoch = start_epoch - 1  # detshuffle adds 1 before each iteration
    pipe = seta.attach(shards, run_dir)
    if exclude:
        pipe = pipe.select(lambda s: s["__key__"] not in exclude)
    if noise:
        pipe = pipe.map(_relabel(noise, ds.classes))
    fields = ["jpg" if ds.image else "txt", "cls", "__key__", "__url__", "__weight__"] + (
        ["__score__"] if with_score else []
    )
    pipe = pipe.compose(wds.filters.detshuffle(2000, seed=draws.seed_int(draws.SAMPLE_ORDER, seed),
                                               epoch=start_epoch - 1))  # fmt: skip
    pipe = pipe.decode(*(["rgb8"] if ds.image else []))
    if augment and ds.image:
        pipe = pipe.compose(_Augment(seed, start_epoch))
    pipe = pipe.to_tuple(*fields).batched(bs, collation_fn=_collate, partial=True)
    return wds.WebLoader(pipe, batch_size=None, num_workers=ds.workers, persistent_workers=True)


def eval_batches(ds: Dataset, urls: list[str], noise: dict[str, int] | None = None,
                 keys: frozenset[str] | None = None) -> Any:  # fmt: skip
    """The evaluation split as batches of (model input, labels), read through webdataset.

    ``noise``: key -> label offset applied as in training (a split whose labels carry the
    training data's noise, as a practitioner's held-out split would). ``keys``: only the samples
    with these keys, as batches of (model input, labels, keys) (out-of-sample predictions on a
    part of the training shards)."""
    import webdataset as wds

    pipe = wds.WebDataset(urls, shardshuffle=False, empty_check=False)
    if keys is not None:
        pipe = pipe.select(lambda s: s["__key__"] in keys)
    if noise:
        pipe = pipe.map(_relabel(noise, ds.classes))
    fields = ["jpg" if ds.image else "txt", "cls"] + (["__key__"] if keys is not None else [])
    return pipe.decode(*(["rgb8"] if ds.image else [])).to_tuple(*fields).batched(500, collation_fn=_collate)


def evaluate(model: Any, batches: Any, device: str = "cpu") -> float:
    """Accuracy over ``batches`` (``eval_batches``, or a list of them read once and reused) of
    ``model`` on ``device`` (``cuda``: under bf16 autocast, as it trains)."""
    import torch

    model.eval()
    correct = total = 0
    cuda = device.startswith("cuda")
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16, enabled=cuda):
        for x, y in batches:
            y = torch.as_tensor([int(v) for v in y])
            x = x.to(device) if cuda and not isinstance(x, tuple) else x  # a text batch: (ids, offsets)
            correct += int((model(x).argmax(1).cpu() == y).sum())
            total += len(y)
    model.train()
    return correct / max(total, 1)


def select_text(x: Any, idx: Any) -> Any:
    """The rows ``idx`` of a text batch (ids, offsets)."""
    import torch

    ids, offsets = x
    ends = torch.cat([offsets[1:], torch.tensor([len(ids)])])
    parts = [ids[offsets[i] : ends[i]] for i in idx.tolist()]
    lens = torch.tensor([len(p) for p in parts])
    return torch.cat(parts), torch.cat([torch.tensor([0]), lens.cumsum(0)[:-1]])
