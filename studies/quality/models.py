"""The models: a small CNN and ResNet-18 for CIFAR-10, a fastText-like bag of hashed n-grams for SST-2."""

from __future__ import annotations

import zlib
from typing import Any

BUCKETS = 1 << 18


def cifar_model() -> Any:
    """4 conv-BN-ReLU blocks (16-32-64-128 channels), ~100k parameters."""
    import torch.nn as nn

    def block(i: int, o: int) -> nn.Module:
        return nn.Sequential(nn.Conv2d(i, o, 3, 1, 1, bias=False), nn.BatchNorm2d(o), nn.ReLU(inplace=True))

    return nn.Sequential(
        block(3, 16), nn.MaxPool2d(2), block(16, 32), nn.MaxPool2d(2), block(32, 64), nn.MaxPool2d(2),
        block(64, 128), nn.AdaptiveMaxPool2d(1), nn.Flatten(), nn.Linear(128, 10),
    )  # fmt: skip


IMAGE_MODELS = ("cnn", "resnet18", "resnet8")


def image_model(name: str) -> Any:
    """The CIFAR-10 model called ``name`` (one of :data:`IMAGE_MODELS`)."""
    if name not in IMAGE_MODELS:
        raise ValueError(f"unknown image model {name!r}; expected one of {', '.join(IMAGE_MODELS)}")
    if name == "resnet18":
        return resnet18()
    if name == "resnet8":
        return resnet8()
    return cifar_model()


def resnet18(classes: int = 10) -> Any:
    """ResNet-18 in its CIFAR form (3x3 stem with stride 1, no max-pool; 11,173,962 parameters),
    the model of the SeTa and InfoBatch papers' CIFAR-10 tables.

    Written out here rather than taken from torchvision (``resnet18()`` with its stem replaced is
    the same network): torchvision is not a dependency of this project, and a pinned CPU build of
    it is not on this machine's package index.
    """
    return cifar_resnet((64, 128, 256, 512), 2, classes)


def resnet8(classes: int = 10) -> Any:
    """A small residual network for CPU studies: He et al.'s CIFAR ResNet with one basic block
    a stage and widths 16, 32, 64 (78,042 parameters): about 32 s an epoch of 45,000 images on one
    core of the development machine, against hours for ResNet-18."""
    return cifar_resnet((16, 32, 64), 1, classes)


def cifar_resnet(widths: tuple[int, ...], blocks: int, classes: int = 10) -> Any:
    """A CIFAR-form ResNet of basic blocks: a 3x3 stem of ``widths[0]`` channels (stride 1), then
    ``blocks`` blocks a stage, one stage a width (stride 2 from the second on), average pool,
    linear."""
    import torch.nn as nn

    class Block(nn.Module):
        def __init__(self, i: int, o: int, stride: int) -> None:
            super().__init__()
            self.body = nn.Sequential(
                nn.Conv2d(i, o, 3, stride, 1, bias=False), nn.BatchNorm2d(o), nn.ReLU(inplace=True),
                nn.Conv2d(o, o, 3, 1, 1, bias=False), nn.BatchNorm2d(o),
            )  # fmt: skip
            self.skip = (
                nn.Sequential(nn.Conv2d(i, o, 1, stride, bias=False), nn.BatchNorm2d(o))
                if stride != 1 or i != o
                else nn.Identity()
            )
            self.relu = nn.ReLU(inplace=True)

        def forward(self, x: Any) -> Any:
            return self.relu(self.body(x) + self.skip(x))

    first = widths[0]
    layers: list[nn.Module] = [nn.Conv2d(3, first, 3, 1, 1, bias=False), nn.BatchNorm2d(first), nn.ReLU(inplace=True)]
    i = first
    for stage, o in enumerate(widths):
        layers += [Block(i, o, 1 if stage == 0 else 2)] + [Block(o, o, 1) for _ in range(blocks - 1)]
        i = o
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(i, classes))


def tokens(text: str) -> list[int]:
    """Hashed unigrams and bigrams of a lower-cased, whitespace-tokenised sentence."""
    words = text.lower().split()
    grams = words + [a + " " + b for a, b in zip(words, words[1:])]
    return [zlib.crc32(g.encode()) % BUCKETS for g in grams] or [0]


def text_model() -> Any:
    """fastText-like: mean of hashed n-gram embeddings, then a linear layer."""
    import torch.nn as nn

    class TextModel(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb = nn.EmbeddingBag(BUCKETS, 64, mode="mean", sparse=True)
            self.out = nn.Linear(64, 2)

        def forward(self, batch: Any) -> Any:
            ids, offsets = batch
            return self.out(self.emb(ids, offsets))

    return TextModel()
