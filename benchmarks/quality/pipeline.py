"""Samples in, tensors out: the training loader through ``seta.attach``, collation and evaluation.

Shards (a new order every epoch) -> ``seta.attach`` (skip_shards + keep_filter) -> shuffle (a new order
every epoch) -> decode -> batches of 128,
collated (and for images augmented) in one DataLoader worker; evaluation reads its split in
order, 500 at a time.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import numpy as np

from .data import Dataset
from .models import tokens

MEAN = np.array([0.4914, 0.4822, 0.4465], np.float32) * 255
STD = np.array([0.2470, 0.2435, 0.2616], np.float32) * 255

_RNG: list[np.random.Generator] = []
ORDER = "reshuffled every epoch"  # what a result file says of its epochs' sample order
ORDER_SEED = 1000  # seed s orders epoch e by ORDER_SEED * s + e: distinct for every (seed, epoch < 1000)


def _images(batch: list, augment: bool = False) -> Any:
    """Batch of HWC uint8 images -> normalised NCHW float tensor (channels-last memory).

    ``augment``: random 32x32 crop of the 4-pixel zero-padded image and a random horizontal
    flip, drawn per sample for the whole batch at once.
    """
    import torch

    x = np.stack(batch)
    if augment:
        if not _RNG:  # one generator per worker process, created on first use
            _RNG.append(np.random.default_rng())
        b = len(x)
        pad = np.zeros((b, 40, 40, 3), np.uint8)
        pad[:, 4:36, 4:36] = x
        d = _RNG[0].integers(0, 9, (b, 2))
        flip = _RNG[0].random(b) < 0.5
        x = np.stack([pad[i, d[i, 0] : d[i, 0] + 32, d[i, 1] : d[i, 1] + 32] for i in range(b)])
        x[flip] = x[flip, :, ::-1]
    x = (x.astype(np.float32) - MEAN) / STD
    return torch.from_numpy(x).permute(0, 3, 1, 2).contiguous(memory_format=torch.channels_last)


def _texts(batch: list) -> Any:
    import torch

    ids = [tokens(t) for t in batch]
    offsets = np.cumsum([0] + [len(t) for t in ids[:-1]])
    return torch.tensor([i for t in ids for i in t]), torch.from_numpy(offsets)


def _collate(samples: list, augment: bool = False) -> tuple:
    cols = list(zip(*samples))
    x = _images(list(cols[0]), augment) if isinstance(cols[0][0], np.ndarray) else _texts(list(cols[0]))
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
    (images cropped and flipped at random unless ``augment`` is false), without the samples whose
    keys are in ``exclude`` (a filter applied before a run: the oracle, a cross-validation fold).

    Every epoch reads the shards and the samples in a new order, the same for a seed and epoch:
    webdataset's ``detshuffle`` stages, seeded by ``ORDER_SEED * seed + epoch`` in the (persistent)
    worker. webdataset's ``shuffle(n, seed=s)`` and ``shardshuffle`` without ``detshuffle`` seed a
    new generator at every iteration, so each epoch would repeat the first one's order and full
    data would train the same batches every epoch. ``start_epoch``: the epoch the loader's first
    iteration trains (a resumed run replays that epoch's order).
    """
    import webdataset as wds

    import seta_stream as seta

    base = ORDER_SEED * seed
    shards = wds.WebDataset(ds.train, shardshuffle=len(ds.train), detshuffle=True, seed=base, empty_check=False)
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
    pipe = pipe.compose(wds.filters.detshuffle(2000, seed=base, epoch=start_epoch - 1))
    pipe = pipe.decode(*(["rgb8"] if ds.image else [])).to_tuple(*fields)
    pipe = pipe.batched(bs, collation_fn=partial(_collate, augment=augment), partial=True)
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
