"""The word-image study's training: a small CNN on rendered word images streamed from tar shards, with
pruning (the words-noise study trains through :func:`run`).

The loop a user adopts (three seta_stream calls: the stage in the pipeline, ``pruner.record`` in the step,
``pruner.start_epoch`` before each epoch), recording what the study reads: per epoch the kept and trained
counts, the loss, the test accuracy, the steps and the last batch's length, and on request the keys
delivered in every epoch (``keep_keys``). CPU only; data from ``tools.make_word_shards``.

The last batch of an epoch holds ``kept % batch_size`` samples, a different count every epoch when a policy
keeps a different number of samples. Its loss is divided by the nominal batch size
(``seta.weighted_mean(..., batch_size=B)``), so a batch of 3 samples makes a step 3/B the size of a full one
instead of a full-size step on 3 samples' gradient, which threw models off (docs/algorithms.md §0.10); every
kept sample is still trained once per epoch.

:func:`main` trains the chosen policy and full data (same seed, same model init, same code path), each in a
run directory of its own under ``--run-dir`` named after the policy and its parameters
(``seta-r0.1-k5-alpha0.6-delta0.875``, ``full``) with its result file ``<name>.json`` beside it, and prints
the comparison:

    python -m tools.make_word_shards --out demo-out/data --train 24000 --test 2400
    python -m studies.engines.words --data demo-out/data --run-dir demo-out/runs --epochs 6
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
from seta_stream.ids import shard_name
from studies.engines.common import ORDER_SEED, compare, start_epoch
from studies.engines.common import parser as engine_parser


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
    # a wds.DataPipeline of stages: the same on webdataset 0.2.86 (OpenCLIP's pin) and 1.x
    ds = wds.DataPipeline(
        wds.SimpleShardList(urls),
        wds.single_node_only,
        wds.split_by_worker,
        # each worker's shards in a new order every epoch, the same for a seed; detshuffle seeds by
        # seed + epoch, so each (run seed, stage) takes a range of ORDER_SEED seeds of its own
        wds.detshuffle(len(urls), seed=ORDER_SEED * (2 * seed)),
        wds.tarfile_to_samples(),
        # a new sample order every epoch, the same for a seed (runs of one seed are paired by it):
        # detshuffle seeds by seed + epoch; shuffle(1000) without a seed differs from run to run
        wds.detshuffle(1000, seed=ORDER_SEED * (2 * seed + 1)),
        wds.decode("l8"),
        wds.to_tuple("png", "cls", "__key__", "__url__", "__weight__"),
        wds.map_tuple(to_tensor, int),
        # partial: every kept sample is trained once per epoch; its loss is divided by the nominal
        # batch size in the step (the remedy for a short last batch)
        wds.batched(batch_size, partial=True),
    )
    seta.attach(ds, run_dir)  # (1) skip unkept shards/samples before decode; attach __weight__
    return wds.WebLoader(ds, batch_size=None, num_workers=workers, persistent_workers=workers > 0)


def evaluate(model: nn.Module, urls: list[str], batch_size: int) -> float:
    ds = wds.DataPipeline(
        wds.SimpleShardList(urls),
        wds.tarfile_to_samples(),
        wds.decode("l8"),
        wds.to_tuple("png", "cls"),
        wds.map_tuple(to_tensor, int),
        wds.batched(batch_size),
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


def run(args: argparse.Namespace, policy: str, params: dict, run_dir: str, keep_keys: bool = False, log=None) -> dict:
    """Train one model with ``policy``; per epoch: kept, trained, loss, test accuracy, the number of
    steps and the length of the last batch.

    ``keep_keys``: also return the (shard, key) pairs the loader delivered in every epoch. ``log``: takes
    each epoch's line (default: printed at once).
    """
    log = log or (lambda line: print(line, flush=True))
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
        run_dir,
        policy=policy,
        params=params,
        epochs=args.epochs,
        seed=args.seed,
        population=list_samples(train),
        batch_size=args.batch_size,  # the plan summary records it (seta-stream inspect shows it)
    )
    loader = train_loader(train, run_dir, args.batch_size, args.workers, args.seed)
    rows, delivered = [], []
    t_run = time.perf_counter()
    for epoch in range(args.epochs):
        t0 = time.perf_counter()
        summary = start_epoch(pruner, epoch)  # (3) compact + plan, before iter(loader)
        seen = steps = last_batch = 0
        loss_sum = 0.0
        keys_this_epoch: list[tuple[str, str]] = []
        bar = tqdm(total=summary["kept"], desc=f"{policy} epoch {epoch}", unit="img", leave=False, disable=args.quiet)
        for x, y, keys, urls, w in loader:
            losses = F.cross_entropy(model(x), torch.as_tensor(y), reduction="none")
            pruner.record(keys, urls, losses)  # (2) unweighted per-sample losses
            opt.zero_grad(set_to_none=True)
            # weighted sum over the nominal batch size: a short last batch makes a step in proportion to its samples
            seta.weighted_mean(losses, w, batch_size=args.batch_size).backward()
            opt.step()
            if keep_keys:
                keys_this_epoch += [(shard_name(u), k) for u, k in zip(urls, keys)]
            steps += 1
            seen += len(keys)
            last_batch = len(keys)
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
                "trained": seen,
                "steps": steps,
                "last_batch": last_batch,
                "noise_suspected": summary.get("noise_suspected"),
                "loss": loss_sum / max(seen, 1),
                "acc": acc,
                "train_s": round(train_s, 2),
            }
        )
        delivered.append(keys_this_epoch)
        log(
            f"  [{policy:>5}] epoch {epoch}  {summary['phase']:<6} kept {100 * summary['kept'] / summary['n']:5.1f}%"
            f"  train loss {loss_sum / max(seen, 1):.3f}"
            + (f"  suspected {summary['noise_suspected']}" if "noise_suspected" in summary else "")
            + f"  test acc {100 * acc:5.1f}%  {train_s:5.1f}s"
        )
    pruner.close()
    total = time.perf_counter() - t_run
    trained = sum(r["trained"] for r in rows)
    full = sum(r["n"] for r in rows)
    result = {
        "policy": policy,
        "params": params,
        "seed": args.seed,
        "rows": rows,
        "acc": rows[-1]["acc"],
        "pruned": 1 - trained / full,
        "seconds": round(total, 1),
        "run_dir": run_dir,
    }
    if keep_keys:
        result["delivered"] = delivered
    return result


def report(results: list[dict]) -> list[str]:
    """The comparison table of ``main``: one line per run, then what each trained."""
    lines = ["  run                                pruned %   samples trained   acc final   acc best (epoch)   wall s"]
    for r in results:
        best = max(r["rows"], key=lambda row: row["acc"])
        trained = sum(row["trained"] for row in r["rows"])
        lines.append(
            f"  {os.path.basename(r['run_dir']):<34} {100 * r['pruned']:8.1f}   {trained:15,}   {100 * r['acc']:9.1f}"
            f"   {100 * best['acc']:8.1f} ({best['epoch']:>2})     {r['seconds']:6.0f}"
        )
    lines.append("  acc: test accuracy in %; same data, epochs, seed and initialisation")
    full = [r for r in results if r["policy"] == "full" and not r["params"]]
    if full:
        base = sum(row["trained"] for row in full[0]["rows"])
        for r in results:
            if r is not full[0]:
                trained = sum(row["trained"] for row in r["rows"])
                lines.append(
                    f"  {os.path.basename(r['run_dir'])} trained {100 * trained / base:.1f}% of the samples full data "
                    f"trained ({trained:,} of {base:,}); accuracy {100 * (r['acc'] - full[0]['acc']):+.1f} points "
                    "at the end"
                )
    return lines


def parser() -> argparse.ArgumentParser:
    return engine_parser(
        __doc__.split("\n\n")[0],
        data="demo-out/data",
        run_dir="demo-out/runs",
        tool="tools.make_word_shards",
        unit="samples",
        batch_size=64,
        batch_help=None,
        noise_scale_help="with --noise: the scale the rule's mixture is fitted on (noise_scale, docs/algorithms.md "
        "§12.11)",
    )


def main(argv: list[str] | None = None, keep_keys: bool = False) -> list[dict]:
    """Train the chosen policy, then full data; print the comparison and the follow-up commands.
    ``keep_keys``: the results also hold the (shard, key) pairs delivered in every epoch."""
    return compare(parser().parse_args(argv), run, report, keep_keys)


if __name__ == "__main__":
    main()
