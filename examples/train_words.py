"""Train a small CNN on word images streamed from WebDataset tar shards, pruning with seta_stream.

A training loop adds three calls, marked (1) to (3) below: ``seta.attach`` around the pipeline (it skips the
samples the epoch's plan leaves out, whole shards unopened and single samples before decode, and adds each
sample's ``__weight__``), ``pruner.record`` of one unweighted loss per sample in the step, and
``pruner.start_epoch`` before each epoch's iterator starts. ``seta.weighted_mean(losses, w, batch_size=B)``
applies the weights and divides by the nominal batch size B: a pruned epoch ends on a short batch, which
then makes a step in proportion to its samples instead of a full step on a few samples' gradient. The
learning rate schedule is per epoch, so it does not depend on how many batches an epoch has.

CPU is enough for the generated word images below. Copy this file and change the model, the data and the
schedule; it uses seta_stream's public API only.

    python -m tools.make_word_shards --out demo-out/data --train 24000 --test 2400
    python examples/train_words.py --data demo-out/data --run-dir demo-out/my-words --policy seta \\
        --params '{"r": 0.1, "k": 5, "alpha": 0.6, "delta": 0.875}'
    seta-stream inspect demo-out/my-words
"""

from __future__ import annotations

import argparse
import glob
import json
import os

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import webdataset as wds

import seta_stream as seta


def make_model(n_classes: int) -> nn.Module:
    def block(i: int, o: int, stride: int = 1) -> nn.Module:
        return nn.Sequential(nn.Conv2d(i, o, 3, stride, 1, bias=False), nn.BatchNorm2d(o), nn.ReLU())

    convs = [block(1, 16, 2), block(16, 32), nn.MaxPool2d(2), block(32, 64), nn.MaxPool2d(2), block(64, 96)]
    return nn.Sequential(*convs, nn.AdaptiveAvgPool2d((1, 8)), nn.Flatten(), nn.Linear(768, n_classes))


def to_tensor(img: np.ndarray) -> torch.Tensor:
    """A decoded grey image (H x W uint8) as a 1 x H x W float tensor."""
    return (torch.from_numpy(np.asarray(img, dtype=np.float32)) / 255.0 - 0.5).unsqueeze(0) / 0.25


def train_loader(urls: list[str], run_dir: str, batch_size: int, workers: int, seed: int) -> wds.WebLoader:
    ds = wds.DataPipeline(
        wds.SimpleShardList(urls),
        wds.split_by_node,
        wds.split_by_worker,
        wds.detshuffle(len(urls), seed=seed),  # a new shard order every epoch
        wds.tarfile_to_samples(),
        wds.detshuffle(1000, seed=seed + 1),  # and new batch neighbours
        wds.decode("l8"),
        wds.to_tuple("png", "cls", "__key__", "__url__", "__weight__"),
        wds.map_tuple(to_tensor, int),
        wds.batched(batch_size, partial=True),  # every kept sample trained once an epoch
    )
    seta.attach(ds, run_dir)  # (1) the plan's samples only, each with its __weight__
    return wds.WebLoader(ds, batch_size=None, num_workers=workers, persistent_workers=workers > 0)


def accuracy(model: nn.Module, urls: list[str]) -> float:
    ds = wds.DataPipeline(wds.SimpleShardList(urls), wds.tarfile_to_samples(), wds.decode("l8"),
                          wds.to_tuple("png", "cls"), wds.map_tuple(to_tensor, int), wds.batched(512))  # fmt: skip
    model.eval()
    correct = total = 0
    with torch.no_grad():
        for x, y in ds:
            correct += int((model(x).argmax(1) == torch.as_tensor(y)).sum())
            total += len(y)
    model.train()
    return correct / max(total, 1)


def main(argv: list[str] | None = None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", default="demo-out/data", help="folder with stmj-train-*.tar, stmj-test-*.tar, info.json")
    p.add_argument("--run-dir", default="demo-out/my-words", help="the run directory (losses, plans)")
    p.add_argument("--policy", default="seta", help="full, random, seta, infobatch, ... (seta-stream policies)")
    p.add_argument("--params", default='{"r": 0.1}', help="the policy's parameters as JSON")
    p.add_argument("--epochs", type=int, default=6)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--workers", type=int, default=2, help="DataLoader workers")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    train = sorted(glob.glob(os.path.join(args.data, "stmj-train-*.tar")))
    test = sorted(glob.glob(os.path.join(args.data, "stmj-test-*.tar")))
    with open(os.path.join(args.data, "info.json")) as fh:
        classes = len(json.load(fh)["vocab"])
    torch.manual_seed(args.seed)
    model = make_model(classes)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=5e-4)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=args.epochs)
    # the population (every sample of the shards) lets epoch 0 be planned too; no batch_size: the plan would
    # warn of a short last batch, which weighted_mean(..., batch_size=B) below already handles
    pruner = seta.Pruner(args.run_dir, policy=args.policy, params=json.loads(args.params), epochs=args.epochs,
                         seed=args.seed, population=seta.list_samples(train))  # fmt: skip
    loader = train_loader(train, args.run_dir, args.batch_size, args.workers, args.seed)
    rows = []
    for epoch in range(args.epochs):
        summary = pruner.start_epoch(epoch)  # (3) plan this epoch before its iterator starts
        trained, loss_sum = 0, 0.0
        for x, y, keys, urls, w in loader:
            losses = F.cross_entropy(model(x), torch.as_tensor(y), reduction="none")
            pruner.record(keys, urls, losses)  # (2) the unweighted loss of every sample
            opt.zero_grad(set_to_none=True)
            seta.weighted_mean(losses, w, batch_size=args.batch_size).backward()  # sum(w * loss) / B
            opt.step()
            trained += len(keys)
            loss_sum += float(losses.detach().sum())
        sched.step()
        acc = accuracy(model, test)
        loss = loss_sum / max(trained, 1)
        rows.append({"epoch": epoch, "kept": summary["kept"], "trained": trained, "loss": loss, "acc": acc})
        print(f"epoch {epoch}: trained {trained:,} of {summary['n']:,} samples, loss {loss:.3f}, "
              f"test accuracy {100 * acc:.1f}%", flush=True)  # fmt: skip
    pruner.close()
    return rows


if __name__ == "__main__":
    main()
