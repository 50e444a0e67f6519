"""A deterministic stand-in for a training job, run as a real process by the tests.

The "loss" of a sample is a fixed function of its identity and the epoch, so two runs that train
the same samples record the same losses, which lets tests compare an interrupted-and-resumed
run with an uninterrupted one exactly. Calls ``pruner.flush()`` before each epoch's output
file (its checkpoint). Optionally kills itself with SIGKILL mid-epoch or right after an epoch's
checkpoint, and
optionally joins a torch.distributed (gloo) group.

Writes OUT/rank{R}-epoch{E}.json: the keys this rank trained in epoch E (with their shard).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys

import numpy as np
import torch
import webdataset as wds

import seta_stream as seta
from seta_stream.ids import sample_uid, shard_name


def fake_loss(urls: list[str], keys: list[str], epoch: int) -> torch.Tensor:
    vals = [((sample_uid(shard_name(u), k) % 997) / 100.0 + 0.05) * (1.0 + 0.3 * epoch) for u, k in zip(urls, keys)]
    return torch.tensor(vals, dtype=torch.float32)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--run", required=True)
    p.add_argument("--shards", nargs="+", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--start-epoch", type=int, default=0)
    p.add_argument("--kill-epoch", type=int, default=-1)
    p.add_argument("--kill-batch", type=int, default=-1)
    p.add_argument("--kill-after-epoch", type=int, default=-1, help="SIGKILL right after this epoch's checkpoint")
    p.add_argument("--policy", default="seta")
    p.add_argument("--params", default='{"r": 0.2, "k": 4, "alpha": 0.5, "delta": 0.75}')
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--context", default="fork")
    p.add_argument("--flush-rows", type=int, default=32)
    p.add_argument("--dist", action="store_true")
    args = p.parse_args()

    if args.dist:
        torch.distributed.init_process_group("gloo")
    rank = torch.distributed.get_rank() if args.dist else 0
    # a listing of every sample: plans then cover the whole data set (exact accounting)
    population = [
        (shard_name(u), sample["__key__"])
        for u in args.shards
        for sample in wds.DataPipeline(wds.SimpleShardList([u]), wds.tarfile_to_samples())
    ]
    pruner = seta.Pruner(
        args.run,
        policy=args.policy,
        params=json.loads(args.params),
        epochs=args.epochs,
        seed=7,
        flush_rows=args.flush_rows,
        population=population,
        verbose=True,
    )
    ds = seta.attach(
        wds.WebDataset(
            args.shards,
            shardshuffle=False,
            nodesplitter=wds.split_by_node if args.dist else None,
            empty_check=False,
        ),
        args.run,
    ).to_tuple("__key__", "__url__", "__weight__")
    loader = torch.utils.data.DataLoader(
        ds.batched(8),
        batch_size=None,
        num_workers=args.workers,
        multiprocessing_context=args.context if args.workers else None,
    )
    os.makedirs(args.out, exist_ok=True)
    for epoch in range(args.start_epoch, args.epochs):
        summary = pruner.start_epoch(epoch)
        trained: list[list[str]] = []
        for i, (keys, urls, weights) in enumerate(loader):
            losses = fake_loss(list(urls), list(keys), epoch)
            pruner.record(list(keys), list(urls), losses)
            trained += [[shard_name(u), k] for u, k in zip(urls, keys)]
            assert np.allclose(np.asarray(weights, dtype=np.float32), 1.0)
            if epoch == args.kill_epoch and i == args.kill_batch:
                sys.stdout.flush()
                os.kill(os.getpid(), signal.SIGKILL)
        pruner.flush()  # then the "checkpoint": this epoch's output file
        with open(os.path.join(args.out, f"rank{rank}-epoch{epoch}.json"), "w") as fh:
            json.dump(
                {
                    "trained": trained,
                    "summary_kept": summary["kept"],
                    "superseded": pruner.superseded,
                    "boundary": pruner.last_boundary,
                },
                fh,
            )
        if epoch == args.kill_after_epoch:  # between the checkpoint and the next start_epoch
            sys.stdout.flush()
            os.kill(os.getpid(), signal.SIGKILL)
    pruner.close()
    if args.dist:
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
