"""The models: a small CNN for CIFAR-10 and a fastText-like bag of hashed n-grams for SST-2."""

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
