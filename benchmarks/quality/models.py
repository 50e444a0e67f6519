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


IMAGE_MODELS = ("cnn", "resnet18")


def image_model(name: str) -> Any:
    """The CIFAR-10 model called ``name`` (one of :data:`IMAGE_MODELS`)."""
    if name not in IMAGE_MODELS:
        raise ValueError(f"unknown image model {name!r}; expected one of {', '.join(IMAGE_MODELS)}")
    return resnet18() if name == "resnet18" else cifar_model()


def resnet18(classes: int = 10) -> Any:
    """ResNet-18 in its CIFAR form (3x3 stem with stride 1, no max-pool; 11,173,962 parameters),
    the model of the SeTa and InfoBatch papers' CIFAR-10 tables.

    Written out here rather than taken from torchvision (``resnet18()`` with its stem replaced is
    the same network): torchvision is not a dependency of this project, and a pinned CPU build of
    it is not on this machine's package index.
    """
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

    layers: list[nn.Module] = [nn.Conv2d(3, 64, 3, 1, 1, bias=False), nn.BatchNorm2d(64), nn.ReLU(inplace=True)]
    i = 64
    for o, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
        layers += [Block(i, o, stride), Block(o, o, 1)]
        i = o
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(512, classes))


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
