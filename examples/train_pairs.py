"""Train a small CLIP-style model on image-text pairs streamed from WebDataset tar shards, pruning with
seta_stream.

A training loop adds three calls, marked (1) to (3) below: ``seta.attach`` around the pipeline (it skips the
pairs the epoch's plan leaves out, whole shards unopened and single pairs before decode, and adds each
pair's ``__weight__``), ``pruner.record`` of one unweighted loss per pair in the step, and
``pruner.start_epoch`` before each epoch's iterator starts. ``seta.weighted_mean(losses, w, batch_size=B)``
applies the weights and divides by the nominal batch size B: a pruned epoch ends on a short batch, which
then makes a step in proportion to its pairs instead of a full step on a few pairs' gradient.

The loss is CLIP's symmetric InfoNCE, split into one loss per pair (``pair_losses``: its batch mean is
CLIP's loss); the model a CNN image tower and a bag-of-words text tower. CPU is enough for the generated
pairs below. Copy this file and change the model, the data and the schedule; it uses seta_stream's public
API only.

    python -m tools.make_pair_shards --out demo-out/pairs --train 10000 --test 1000 --shard-size 1000 --noise 0.2
    python examples/train_pairs.py --data demo-out/pairs --run-dir demo-out/my-pairs --policy random \\
        --params '{"r": 0.19, "noise": true}'
    seta-stream inspect demo-out/my-pairs
"""

from __future__ import annotations

import argparse
import glob
import json
import math
import os
import zlib

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import webdataset as wds

import seta_stream as seta

BUCKETS = 1 << 12  # hashed word and word-pair ids of the text tower


def tokens(text: str) -> list[int]:
    """Hashed words and word pairs of a lower-cased caption."""
    words = "".join(c if c.isalnum() else " " for c in text.lower()).split()
    return [zlib.crc32(g.encode()) % BUCKETS for g in words + [a + " " + b for a, b in zip(words, words[1:])]] or [0]


class Clip(nn.Module):
    def __init__(self, embed: int = 64) -> None:
        super().__init__()

        def block(i: int, o: int) -> nn.Module:
            return nn.Sequential(nn.Conv2d(i, o, 3, 1, 1, bias=False), nn.BatchNorm2d(o), nn.ReLU(), nn.MaxPool2d(2))

        self.image = nn.Sequential(block(3, 32), block(32, 64), block(64, 128), nn.AdaptiveAvgPool2d(4), nn.Flatten())
        self.image_proj = nn.Linear(128 * 16, embed)
        self.text = nn.EmbeddingBag(BUCKETS, 128, mode="mean")
        self.text_proj = nn.Sequential(nn.ReLU(), nn.Linear(128, embed))
        self.logit_scale = nn.Parameter(torch.tensor(math.log(1 / 0.07)))  # CLIP's initial temperature

    def encode_image(self, x: torch.Tensor) -> torch.Tensor:
        return F.normalize(self.image_proj(self.image(x)), dim=-1)

    def encode_text(self, text: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        return F.normalize(self.text_proj(self.text(*text)), dim=-1)

    def forward(self, x: torch.Tensor, text: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        """B x B logits: row i is image i against every caption of the batch."""
        return self.logit_scale.clamp(max=math.log(100)).exp() * self.encode_image(x) @ self.encode_text(text).t()


def pair_losses(logits: torch.Tensor) -> torch.Tensor:
    """One loss per pair: the mean of its row's image-to-text and its column's text-to-image cross-entropy
    (their batch mean is CLIP's loss)."""
    target = torch.arange(len(logits))
    return 0.5 * (
        F.cross_entropy(logits, target, reduction="none") + F.cross_entropy(logits.t(), target, reduction="none")
    )


def collate(samples: list) -> tuple:
    """(image, caption, *rest) samples -> (NCHW float tensor, (token ids, offsets), *rest as lists)."""
    cols = list(zip(*samples))
    x = torch.from_numpy((np.stack(cols[0]).astype(np.float32) - 127.5) / 64).permute(0, 3, 1, 2).contiguous()
    ids = [tokens(t) for t in cols[1]]
    text = (torch.tensor([i for t in ids for i in t]), torch.tensor(np.cumsum([0] + [len(t) for t in ids[:-1]])))
    return (x, text, *[list(c) for c in cols[2:]])


def train_loader(urls: list[str], run_dir: str, batch_size: int, workers: int, seed: int) -> wds.WebLoader:
    ds = wds.DataPipeline(
        wds.SimpleShardList(urls),
        wds.split_by_node,
        wds.split_by_worker,
        wds.detshuffle(len(urls), seed=seed),  # a new shard order every epoch
        wds.tarfile_to_samples(),
        wds.detshuffle(1000, seed=seed + 1),  # and new batch neighbours
        wds.decode("rgb8"),
        wds.to_tuple("jpg", "txt", "__key__", "__url__", "__weight__"),
        wds.batched(batch_size, collation_fn=collate, partial=True),  # every kept pair trained once an epoch
    )
    seta.attach(ds, run_dir)  # (1) the plan's pairs only, each with its __weight__
    return wds.WebLoader(ds, batch_size=None, num_workers=workers, persistent_workers=workers > 0)


def recall_at_1(model: Clip, urls: list[str]) -> float:
    """Recall@1 on held-out pairs, the mean of image-to-text and text-to-image."""
    ds = wds.DataPipeline(wds.SimpleShardList(urls), wds.tarfile_to_samples(), wds.decode("rgb8"),
                          wds.to_tuple("jpg", "txt"), wds.batched(500, collation_fn=collate))  # fmt: skip
    model.eval()
    with torch.no_grad():
        parts = [(model.encode_image(x), model.encode_text(text)) for x, text in ds]
    model.train()
    sim = torch.cat([i for i, _ in parts]) @ torch.cat([t for _, t in parts]).t()  # image i, caption j
    own = torch.arange(len(sim))
    return 0.5 * float((sim.argmax(1) == own).float().mean() + (sim.argmax(0) == own).float().mean())


def lr_at(t: float, epochs: int, peak: float) -> float:
    """Warm-up over the first 10% of the epochs, then cosine to 0; ``t`` = epoch + its share done."""
    w = 0.1 * epochs
    return peak * (t / w if t < w else 0.5 * (1 + math.cos(math.pi * min(1.0, (t - w) / (epochs - w)))))


def main(argv: list[str] | None = None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", default="demo-out/pairs", help="folder with train/ and test/ shards")
    p.add_argument("--run-dir", default="demo-out/my-pairs", help="the run directory (losses, plans)")
    p.add_argument("--policy", default="random", help="full, random, seta, infobatch, ... (seta-stream policies)")
    p.add_argument("--params", default='{"r": 0.2}', help="the policy's parameters as JSON")
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--workers", type=int, default=2, help="DataLoader workers")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    train = sorted(glob.glob(os.path.join(args.data, "train", "*.tar")))
    test = sorted(glob.glob(os.path.join(args.data, "test", "*.tar")))
    torch.manual_seed(args.seed)
    model = Clip()
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.05)
    # the population (every pair of the shards) lets epoch 0 be planned too; no batch_size: the plan would
    # warn of a short last batch, which weighted_mean(..., batch_size=B) below already handles
    pruner = seta.Pruner(args.run_dir, policy=args.policy, params=json.loads(args.params), epochs=args.epochs,
                         seed=args.seed, population=seta.list_samples(train))  # fmt: skip
    loader = train_loader(train, args.run_dir, args.batch_size, args.workers, args.seed)
    rows = []
    for epoch in range(args.epochs):
        summary = pruner.start_epoch(epoch)  # (3) plan this epoch before its iterator starts
        steps = max(1, math.ceil(summary["kept"] / args.batch_size))  # the kept count varies with the epoch
        trained, loss_sum = 0, 0.0
        for step, (x, text, keys, urls, w) in enumerate(loader):
            for g in opt.param_groups:
                g["lr"] = lr_at(epoch + step / steps, args.epochs, args.lr)
            losses = pair_losses(model(x, text))
            pruner.record(keys, urls, losses)  # (2) the unweighted loss of every pair
            opt.zero_grad(set_to_none=True)
            seta.weighted_mean(losses, w, batch_size=args.batch_size).backward()  # sum(w * loss) / B
            opt.step()
            trained += len(keys)
            loss_sum += float(losses.detach().sum())
        r1 = recall_at_1(model, test)
        loss = loss_sum / max(trained, 1)
        rows.append({"epoch": epoch, "kept": summary["kept"], "trained": trained, "loss": loss, "r1": r1})
        print(f"epoch {epoch}: trained {trained:,} of {summary['n']:,} pairs, loss {loss:.3f}, "
              f"held-out R@1 {100 * r1:.1f}%", flush=True)  # fmt: skip
    pruner.close()
    return rows


if __name__ == "__main__":
    main()
