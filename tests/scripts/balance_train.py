"""A rank of a balanced, pruned training job, run as a real process by tests/test_balance_ranks.py.

Started like torchrun starts a rank (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT in the
environment; gloo on the CPU). It reads real tar shards through ``attach(..., balance=True)``
with real DataLoader workers, and trains a tiny two-tower model with a contrastive loss whose
features are gathered from every rank with gradients at every step (OpenCLIP's ``ClipLoss``
with ``gather_with_grad=True``, replicated here: open_clip is not installed in .venv), so a
rank that ran out of batches first would leave the others waiting in the all-gather.

The loss recorded for planning is a fixed function of the shard (0.1 for even shard numbers,
5.0 for odd ones), so SeTa with k=2 and a one-cluster window keeps every sample of the odd
shards and none of the even ones in odd epochs, and the reverse in even epochs: plans as skewed
as they get. Writes OUT/rank{R}-epoch{E}.json: the samples trained, the batch sizes, the schedule
positions and the balanced_epoch report of the epoch.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os

import torch
import torch.distributed as dist
import torch.distributed.nn
import torch.nn.functional as F
import webdataset as wds

import seta_stream as seta
from seta_stream.ids import sample_uid, shard_name

DIM = 8


def planning_loss(urls: list[str]) -> torch.Tensor:
    """0.1 for samples of even-numbered shards, 5.0 for odd ones (``part-0003.tar``: 3)."""
    return torch.tensor([5.0 if int(shard_name(u).split("-")[1][:4]) % 2 else 0.1 for u in urls])


def inputs(urls: list[str], keys: list[str]) -> torch.Tensor:
    """A fixed input vector per sample, from its uid."""
    rows = []
    for u, k in zip(urls, keys):
        g = torch.Generator().manual_seed(sample_uid(shard_name(u), k) % (2**63))
        rows.append(torch.randn(DIM, generator=g))
    return torch.stack(rows)


def gathered_clip_loss(image: torch.Tensor, text: torch.Tensor, scale: torch.Tensor, batch_size: int) -> torch.Tensor:
    """OpenCLIP's ClipLoss(local_loss=False, gather_with_grad=True): features of every rank
    gathered with gradients, logits of all images against all texts; here summed per pair and
    divided by the nominal global batch (the small-final-batch remedy)."""
    all_image = torch.cat(torch.distributed.nn.all_gather(image), dim=0)  # OpenCLIP's gather_features
    all_text = torch.cat(torch.distributed.nn.all_gather(text), dim=0)
    logits = scale * all_image @ all_text.T
    labels = torch.arange(len(logits))
    per_pair = 0.5 * (
        F.cross_entropy(logits, labels, reduction="none") + F.cross_entropy(logits.T, labels, reduction="none")
    )
    return per_pair.sum() / (batch_size * dist.get_world_size())


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--run", required=True)
    p.add_argument("--shards", nargs="+", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--start-epoch", type=int, default=0)
    p.add_argument("--stop-epoch", type=int, default=None, help="exit after this epoch (a resume follows)")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--workers-by-rank", default=None, help="a DataLoader num_workers per rank, e.g. 2,3")
    p.add_argument("--no-population", action="store_true", help="a Pruner without the population listing")
    p.add_argument("--context", default="fork")
    p.add_argument("--batch-size", type=int, default=3)
    p.add_argument("--pipeline", choices=["webdataset", "datapipeline"], default="webdataset")
    p.add_argument("--init-method", default=None, help="tcp://...: join with --rank/--world-size, not the env")
    p.add_argument("--rank", type=int, default=None)
    p.add_argument("--world-size", type=int, default=None)
    p.add_argument("--unbalanced", action="store_true", help="attach() without balance, for contrast")
    p.add_argument("--timeout", type=float, default=60.0, help="gloo's timeout, seconds")
    p.add_argument("--clip-loss", choices=["replica", "openclip"], default="replica",
                   help="openclip: open_clip.loss.ClipLoss itself (where open_clip is installed)")  # fmt: skip
    args = p.parse_args()

    timeout = datetime.timedelta(seconds=args.timeout)
    if args.init_method is None:  # as torchrun starts a rank: RANK, WORLD_SIZE, MASTER_ADDR/PORT
        dist.init_process_group("gloo", timeout=timeout)
    else:  # as mp.spawn scripts do: no RANK in the environment, so workers cannot read it there
        dist.init_process_group(
            "gloo", init_method=args.init_method, rank=args.rank, world_size=args.world_size, timeout=timeout
        )
    rank, world = dist.get_rank(), dist.get_world_size()
    if args.workers_by_rank:
        args.workers = int(args.workers_by_rank.split(",")[rank])
    os.makedirs(args.out, exist_ok=True)
    try:
        train(args, rank, world)
    except Exception as exc:  # what this rank stopped with, for the test
        with open(os.path.join(args.out, f"rank{rank}-error.json"), "w") as fh:
            json.dump({"type": type(exc).__name__, "message": str(exc)}, fh)
        raise


def train(args: argparse.Namespace, rank: int, world: int) -> None:
    torch.manual_seed(0)
    B = args.batch_size
    pruner = seta.Pruner(
        args.run,
        policy="seta",
        params={"r": 0.0, "k": 2, "alpha": 0.5},
        epochs=args.epochs,
        seed=11,
        population=None if args.no_population else seta.list_samples(args.shards),
    )
    if args.pipeline == "webdataset":
        ds = wds.WebDataset(args.shards, shardshuffle=False, nodesplitter=wds.split_by_node)
    else:  # OpenCLIP's shape: shard list, node and worker splits, tar reader, then the tuple
        ds = wds.DataPipeline(
            wds.SimpleShardList(args.shards), wds.split_by_node, wds.split_by_worker, wds.tarfile_to_samples()
        )
    seta.attach(ds, args.run, balance=not args.unbalanced)
    ds.append(wds.to_tuple("__key__", "__url__", "__weight__"))
    ds.append(wds.batched(B, partial=True))
    loader = torch.utils.data.DataLoader(
        ds,
        batch_size=None,
        num_workers=args.workers,
        multiprocessing_context=args.context if args.workers else None,
        persistent_workers=args.workers > 0,
    )
    image_tower, text_tower = torch.nn.Linear(DIM, 4), torch.nn.Linear(DIM, 4)
    scale = torch.nn.Parameter(torch.tensor(2.0))
    params = [*image_tower.parameters(), *text_tower.parameters(), scale]
    clock = seta.EpochClock(steps_per_epoch=10.0)
    clip_loss = None
    if args.clip_loss == "openclip":
        from open_clip.loss import ClipLoss

        clip_loss = ClipLoss(local_loss=False, gather_with_grad=True, rank=rank, world_size=world)
    total = 10.0 * args.epochs
    last = args.epochs - 1 if args.stop_epoch is None else args.stop_epoch
    delivered = open(os.path.join(args.out, f"rank{rank}-delivered.jsonl"), "a")
    for epoch in range(args.start_epoch, last + 1):
        summary = pruner.start_epoch(epoch)
        report = seta.balanced_epoch(args.run, epoch, workers=args.workers)
        clock.start_epoch(epoch, report.per_rank if not args.unbalanced else summary["kept"] / world)
        trained, sizes, lrs = [], [], []
        for keys, urls, weights in loader:
            keys, urls = list(keys), list(urls)
            assert torch.all(torch.as_tensor(weights) == 1.0)  # SeTa never rescales
            position = clock.step(len(keys))
            lr = 0.1 * 0.5 * (1 + math.cos(math.pi * position / total))
            x = inputs(urls, keys)
            image = F.normalize(image_tower(x), dim=-1)
            text = F.normalize(text_tower(x.flip(-1)), dim=-1)
            if clip_loss is None:
                loss = gathered_clip_loss(image, text, scale, B)
            else:  # its mean over the gathered batch, as a sum over the nominal global batch
                loss = clip_loss(image, text, scale) * (len(keys) / B)
            loss.backward()
            with torch.no_grad():  # plain SGD (torch.optim imports torch._dynamo: seconds per process)
                for param in params:
                    param -= lr * param.grad
                    param.grad = None
            pruner.record(keys, urls, planning_loss(urls))
            trained += [[shard_name(u), k] for u, k in zip(urls, keys)]
            delivered.write(json.dumps([epoch, [[shard_name(u), k] for u, k in zip(urls, keys)]]) + "\n")
            delivered.flush()
            sizes.append(len(keys))
            lrs.append(lr)
        pruner.flush()
        end = clock.position
        with open(os.path.join(args.out, f"rank{rank}-epoch{epoch}.json"), "w") as fh:
            json.dump(
                {
                    "rank": rank,
                    "world_size": world,
                    "trained": trained,
                    "sizes": sizes,
                    "end_position": end,
                    "end_lr": 0.1 * 0.5 * (1 + math.cos(math.pi * end / total)),
                    "summary_kept": summary["kept"],
                    "report": {**report._asdict(), "steps": report.steps(B), "batch_sizes": report.batch_sizes(B)},
                },
                fh,
            )
    pruner.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
