"""Train a small CNN on rendered word images streamed from tar shards, with SeTa pruning.

The complete loop a user adopts (three seta_stream calls: the stage in the pipeline,
``pruner.record`` in the step, ``pruner.start_epoch`` before each epoch), run twice: once with
the chosen policy and once with ``full`` (same seed, same model init, same code path), then a
side-by-side comparison. CPU only; data from ``tools/make_word_shards.py``.

    python examples/train_words.py --data demo-out/data --run-dir demo-out/runs --epochs 6
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import webdataset as wds
from tqdm import tqdm

import seta_stream as seta
from seta_stream import list_samples


def make_model(n_classes: int) -> nn.Module:
    def block(i: int, o: int, stride: int = 1) -> nn.Module:
        return nn.Sequential(nn.Conv2d(i, o, 3, stride, 1, bias=False), nn.BatchNorm2d(o), nn.ReLU(inplace=True))

    return nn.Sequential(
        block(1, 16, 2),
        block(16, 32),
        nn.MaxPool2d(2),
        block(32, 64),
        nn.MaxPool2d(2),
        block(64, 96),
        nn.AdaptiveAvgPool2d((1, 8)),
        nn.Flatten(),
        nn.Dropout(0.2),
        nn.Linear(768, n_classes),
    )


def to_tensor(img: object) -> torch.Tensor:
    t = torch.from_numpy(np.array(img, dtype=np.float32))  # decode("l8"): uint8 HxW arrays
    return ((t / 255.0) - 0.5).unsqueeze(0) / 0.25


def train_loader(urls: list[str], run_dir: str, batch_size: int, workers: int, seed: int):
    ds = seta.attach(
        wds.WebDataset(urls, shardshuffle=len(urls), detshuffle=True, seed=seed, empty_check=False), run_dir
    )  # (1) skip unkept shards/samples before decode; attach __weight__
    ds = (
        ds.shuffle(1000)
        .decode("l8")
        .to_tuple("png", "cls", "__key__", "__url__", "__weight__")
        .map_tuple(to_tensor, int)
        .batched(batch_size, partial=True)
    )
    return wds.WebLoader(ds, batch_size=None, num_workers=workers, persistent_workers=workers > 0)


def evaluate(model: nn.Module, urls: list[str], batch_size: int) -> float:
    ds = (
        wds.WebDataset(urls, shardshuffle=False, empty_check=False)
        .decode("l8")
        .to_tuple("png", "cls")
        .map_tuple(to_tensor, int)
        .batched(batch_size)
    )
    model.eval()
    correct = total = 0
    with torch.no_grad():
        for x, y in ds:
            y = torch.as_tensor(y)
            correct += int((model(x).argmax(1) == y).sum())
            total += len(y)
    model.train()
    return correct / max(total, 1)


def run(args: argparse.Namespace, policy: str, params: dict, run_dir: str) -> dict:
    info = json.load(open(os.path.join(args.data, "info.json")))
    train = sorted(glob.glob(os.path.join(args.data, "stmj-train-*.tar")))
    test = sorted(glob.glob(os.path.join(args.data, "stmj-test-*.tar")))
    if os.path.exists(run_dir):
        shutil.rmtree(run_dir)  # a fresh run each time the demo is started
    torch.manual_seed(args.seed)
    model = make_model(len(info["vocab"]))
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=5e-4)
    # epoch-based schedule: the number of steps per epoch varies with pruning
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=args.epochs)
    pruner = seta.Pruner(
        run_dir, policy=policy, params=params, epochs=args.epochs, seed=args.seed, population=list_samples(train)
    )
    loader = train_loader(train, run_dir, args.batch_size, args.workers, args.seed)
    rows = []
    t_run = time.perf_counter()
    for epoch in range(args.epochs):
        t0 = time.perf_counter()
        summary = pruner.start_epoch(epoch)  # (3) compact + plan, before iter(loader)
        seen = loss_sum = 0.0
        bar = tqdm(total=summary["kept"], desc=f"{policy} epoch {epoch}", unit="img", leave=False, disable=args.quiet)
        for x, y, keys, urls, w in loader:
            losses = F.cross_entropy(model(x), torch.as_tensor(y), reduction="none")
            pruner.record(keys, urls, losses)  # (2) unweighted per-sample losses
            opt.zero_grad(set_to_none=True)
            seta.weighted_mean(losses, w).backward()
            opt.step()
            seen += len(keys)
            loss_sum += float(losses.detach().sum())
            bar.update(len(keys))
        bar.close()
        sched.step()
        train_s = time.perf_counter() - t0
        acc = evaluate(model, test, 512)
        rows.append(
            {
                "epoch": epoch,
                "phase": summary["phase"],
                "kept": summary["kept"],
                "n": summary["n"],
                "trained": int(seen),
                "loss": loss_sum / max(seen, 1),
                "acc": acc,
                "train_s": train_s,
            }
        )
        print(
            f"  [{policy:>5}] epoch {epoch}  {summary['phase']:<6} kept {100 * summary['kept'] / summary['n']:5.1f}%"
            f"  train loss {loss_sum / max(seen, 1):.3f}  test acc {100 * acc:5.1f}%  {train_s:5.1f}s",
            flush=True,
        )
    pruner.close()
    total = time.perf_counter() - t_run
    trained = sum(r["trained"] for r in rows)
    full = sum(r["n"] for r in rows)
    return {
        "policy": policy,
        "params": params,
        "rows": rows,
        "acc": rows[-1]["acc"],
        "pruned": 1 - trained / full,
        "seconds": total,
        "run_dir": run_dir,
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", default="demo-out/data", help="folder written by tools/make_word_shards.py")
    p.add_argument("--run-dir", default="demo-out/runs", help="parent folder of the run directories")
    p.add_argument("--epochs", type=int, default=6)
    p.add_argument("--policy", default="seta", help="policy to compare against full data")
    p.add_argument("--r", type=float, default=0.1, help="SeTa/random: fraction removed by down-sampling")
    p.add_argument("--k", type=int, default=5, help="SeTa: number of loss clusters")
    p.add_argument("--alpha", type=float, default=0.6, help="SeTa: window scale")
    p.add_argument("--delta", type=float, default=0.875, help="SeTa: share of pruning epochs")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--no-compare", action="store_true", help="skip the full-data run")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    args = p.parse_args(argv)
    torch.set_num_threads(max(1, os.cpu_count() or 1))

    if args.policy == "seta":
        params = dict(r=args.r, k=args.k, alpha=args.alpha, delta=args.delta)
    elif args.policy in ("random", "static"):
        params = dict(r=args.r)
    else:
        params = {}
    results = [run(args, args.policy, params, os.path.join(args.run_dir, args.policy))]
    if not args.no_compare and args.policy != "full":
        results.append(run(args, "full", {}, os.path.join(args.run_dir, "full")))

    print("\n  policy   pruned %   test acc %   wall s   (same epochs, seed and model init)")
    for r in results:
        print(f"  {r['policy']:<7} {100 * r['pruned']:8.1f}   {100 * r['acc']:10.1f}   {r['seconds']:6.0f}")
    if len(results) == 2:
        a, b = results
        print(
            f"\n  {a['policy']} trained {100 * (1 - a['pruned']):.1f}% of the samples of the full run "
            f"in {a['seconds'] / b['seconds']:.2f}x its time; accuracy {100 * (a['acc'] - b['acc']):+.1f} points."
        )
    print(f"\n  inspect: .venv/bin/seta-stream inspect {results[0]['run_dir']} --plot {args.run_dir}/{args.policy}.png")
    with open(os.path.join(args.run_dir, "results.json"), "w") as fh:
        json.dump(results, fh, indent=1)


if __name__ == "__main__":
    main()
