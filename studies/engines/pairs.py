"""The pairs studies' training: a small CLIP-style model on image-text pairs streamed from tar shards,
with pruning (the noise, pairs and baselines-pairs studies train through :func:`run`; ``bash
tools/demo.sh`` runs :func:`main`).

A loop shaped like an OpenCLIP user's (its own code, not OpenCLIP's; for OpenCLIP itself see
``seta_stream.openclip`` and docs/openclip.md), with the three seta_stream calls: the stage around the
pipeline of the training shards, ``pruner.record`` of one loss per pair in the step, ``pruner.start_epoch``
before each epoch. The model is a small CNN image tower and a bag of hashed words text tower, each with a
linear projection into a shared space, and CLIP's learnable temperature; the loss is the symmetric InfoNCE
(CLIP) loss. CPU only; data from ``tools.make_pair_shards``. Evaluation: image-to-text and text-to-image
recall@1/@5 on the clean held-out pairs.

Per-pair loss recorded (``pair_losses``): for pair i of a batch of B, the mean of the image-to-text
cross-entropy of row i of the similarity matrix and the text-to-image cross-entropy of column i,
unweighted. Their batch mean is exactly CLIP's loss, so ``seta.weighted_mean(pair_losses, w)`` is CLIP's
loss with InfoBatch's weights (all 1 for the other policies). Why a loss that depends on the rest of the
batch still ranks pairs: see README.md, "Image-text pairs (contrastive training)".

The last batch of an epoch holds ``kept % batch_size`` pairs, a different count every epoch when a policy
keeps a different number of pairs. Its loss is divided by the nominal batch size
(``seta.weighted_mean(..., batch_size=B)``), so a batch of 3 pairs makes a step 3/B the size of a full one
instead of a full-size step on 3 pairs' gradient, which threw models off (docs/algorithms.md §0.10); every
kept pair is still trained once per epoch.

What the studies record beyond a user's loop: the mismatched share of the pairs trained (against the
set's ``noise.parquet``), the keys delivered every epoch (``keep_keys``, checked against the plans), a
validation split's recalls (``val``) and an equal-compute budget (``budget``).

:func:`main` trains the chosen policy and full data, each in a run directory of its own under
``--run-dir`` named after the policy and its parameters (``random-r0.19-noise``, ``full``), with its
result file ``<name>.json`` beside it, and prints the comparison:

    python -m tools.make_pair_shards --out demo-out/pairs --train 10000 --test 1000 --shard-size 1000
    python -m studies.engines.pairs --data demo-out/pairs --run-dir demo-out/pair-runs --epochs 10 \
        --policy random --params '{"r": 0.19}' --noise
"""

from __future__ import annotations

import argparse
import glob
import math
import os
import shutil
import time
import zlib

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

BUCKETS = 1 << 12  # hashed word and word-pair ids of the text tower
EMBED = 64  # shared embedding width
MEAN = np.array([0.5, 0.5, 0.5], np.float32) * 255
STD = np.array([0.25, 0.25, 0.25], np.float32) * 255


# ------------------------------------------------------------------------------------ model
def tokens(text: str) -> list[int]:
    """Hashed unigrams and bigrams of a lower-cased caption (the text tower's tokenizer)."""
    words = "".join(c if c.isalnum() else " " for c in text.lower()).split()
    grams = words + [a + " " + b for a, b in zip(words, words[1:])]
    return [zlib.crc32(g.encode()) % BUCKETS for g in grams] or [0]


class Clip(nn.Module):
    """Small CLIP: CNN image tower, bag of words text tower, projections, learnable temperature."""

    def __init__(self, embed: int = EMBED) -> None:
        super().__init__()

        def block(i: int, o: int) -> nn.Module:
            return nn.Sequential(
                nn.Conv2d(i, o, 3, 1, 1, bias=False), nn.BatchNorm2d(o), nn.ReLU(inplace=True), nn.MaxPool2d(2)
            )

        # 32x32 -> 4x4x128; the flattened map keeps where the object is (captions name it)
        self.image = nn.Sequential(block(3, 32), block(32, 64), block(64, 128), nn.AdaptiveAvgPool2d(4), nn.Flatten())
        self.image_proj = nn.Linear(128 * 16, embed)
        self.text = nn.EmbeddingBag(BUCKETS, 128, mode="mean")
        self.text_proj = nn.Sequential(nn.ReLU(), nn.Linear(128, embed))
        self.logit_scale = nn.Parameter(torch.tensor(math.log(1 / 0.07)))  # CLIP's initial temperature

    def encode_image(self, x: torch.Tensor) -> torch.Tensor:
        return F.normalize(self.image_proj(self.image(x)), dim=-1)

    def encode_text(self, text: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        ids, offsets = text
        return F.normalize(self.text_proj(self.text(ids, offsets)), dim=-1)

    def forward(self, x: torch.Tensor, text: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        """B x B logits: row i = image i against every text of the batch."""
        scale = self.logit_scale.clamp(max=math.log(100)).exp()  # CLIP clamps the scale at 100
        return scale * self.encode_image(x) @ self.encode_text(text).t()


def pair_losses(logits: torch.Tensor) -> torch.Tensor:
    """One loss per pair: mean of its row's image-to-text and its column's text-to-image CE.

    ``pair_losses(logits).mean()`` equals CLIP's symmetric InfoNCE loss of the batch.
    """
    target = torch.arange(len(logits), device=logits.device)
    i2t = F.cross_entropy(logits, target, reduction="none")
    t2i = F.cross_entropy(logits.t(), target, reduction="none")
    return 0.5 * (i2t + t2i)


# ------------------------------------------------------------------------------ pipelines
def collate(samples: list) -> tuple:
    """(image HxWx3 uint8, caption, *rest) samples -> (NCHW tensor, (ids, offsets), *rest lists)."""
    cols = list(zip(*samples))
    x = (np.stack(cols[0]).astype(np.float32) - MEAN) / STD
    ids = [tokens(t) for t in cols[1]]
    offsets = np.cumsum([0] + [len(t) for t in ids[:-1]])
    text = (torch.tensor([i for t in ids for i in t]), torch.from_numpy(offsets))
    return (torch.from_numpy(x).permute(0, 3, 1, 2).contiguous(), text, *[list(c) for c in cols[2:]])


def has_pair(sample: dict) -> bool:
    return "jpg" in sample and "txt" in sample  # OpenCLIP's filter_no_caption_or_no_image


def train_loader(urls: list[str], run_dir: str, batch_size: int, workers: int, seed: int) -> wds.WebLoader:
    """A webdataset training pipeline shaped like OpenCLIP's (a wds.DataPipeline of stages, not OpenCLIP's
    code; the same stages on webdataset 0.2.86, which OpenCLIP pins, and 1.x), with the seta stage after
    the shard list; OpenCLIP itself: seta_stream.openclip, docs/openclip.md."""
    ds = wds.DataPipeline(
        wds.SimpleShardList(urls),
        wds.split_by_node,
        wds.split_by_worker,
        # each worker's shards in a new order every epoch, the same for a seed; detshuffle seeds by
        # seed + epoch, so each (run seed, stage) takes a range of ORDER_SEED seeds of its own
        wds.detshuffle(len(urls), seed=ORDER_SEED * (2 * seed)),
        wds.tarfile_to_samples(),
        # a new sample order (so new batch neighbours) every epoch, the same for a seed: detshuffle
        # seeds by seed + epoch, where shuffle(1000, seed=seed) would reseed every epoch alike
        wds.detshuffle(1000, seed=ORDER_SEED * (2 * seed + 1)),
        wds.select(has_pair),
        wds.decode("rgb8"),
        wds.to_tuple("jpg", "txt", "__key__", "__url__", "__weight__"),
        # partial: every kept pair is trained and recorded once per epoch (OpenCLIP drops the tail)
        wds.batched(batch_size, collation_fn=collate, partial=True),
    )
    seta.attach(ds, run_dir)  # (1) skips unkept shards unopened and unkept pairs before decode; attaches __weight__
    return wds.WebLoader(ds, batch_size=None, num_workers=workers, persistent_workers=workers > 0)


def embed_all(model: Clip, urls: list[str], batch_size: int = 500) -> tuple[torch.Tensor, torch.Tensor]:
    ds = wds.DataPipeline(
        wds.SimpleShardList(urls),
        wds.tarfile_to_samples(),
        wds.decode("rgb8"),
        wds.to_tuple("jpg", "txt"),
        wds.batched(batch_size, collation_fn=collate),
    )
    imgs, txts = [], []
    model.eval()
    with torch.no_grad():
        for x, text in ds:
            imgs.append(model.encode_image(x))
            txts.append(model.encode_text(text))
    model.train()
    return torch.cat(imgs), torch.cat(txts)


def recall_at(sim: torch.Tensor, ks: tuple[int, ...] = (1, 5)) -> dict[int, float]:
    """Share of rows whose own column (the diagonal) is among their k highest similarities."""
    own = sim.diagonal().unsqueeze(1)
    rank = (sim > own).sum(1)  # ties count in the row's favour
    return {k: float((rank < k).float().mean()) for k in ks}


def evaluate(model: Clip, urls: list[str]) -> dict[str, float]:
    """Retrieval recall@1/@5 over the held-out pairs: image->text (rows) and text->image."""
    img, txt = embed_all(model, urls)
    sim = img @ txt.t()
    i2t, t2i = recall_at(sim), recall_at(sim.t())
    return {"i2t_r1": i2t[1], "i2t_r5": i2t[5], "t2i_r1": t2i[1], "t2i_r5": t2i[5]}


def load_noise(data: str) -> set[tuple[str, str]]:
    """(shard, key) of the mismatched training pairs (``noise.parquet`` of ``tools.make_pair_shards``)."""
    path = os.path.join(data, "noise.parquet")
    if not os.path.exists(path):
        return set()
    import pyarrow.parquet as pq

    t = pq.read_table(path, columns=["shard", "key"])
    return set(zip(t.column("shard").to_pylist(), t.column("key").to_pylist()))


def shards(data: str, split: str) -> list[str]:
    urls = sorted(glob.glob(os.path.join(data, split, "*.tar")))
    if not urls:
        raise SystemExit(
            f"{data}/{split}: no .tar shards; write them with python -m tools.make_pair_shards --out {data}"
        )
    return urls


# ------------------------------------------------------------------------------------ loop
def lr_at(t: float, epochs: int, peak: float) -> float:
    """Epoch-based warm-up (first 10%) then cosine decay; t = epoch + fraction of its steps."""
    w = 0.1 * epochs
    return peak * (t / w if t < w else 0.5 * (1 + math.cos(math.pi * min(1.0, (t - w) / (epochs - w)))))


def run(
    args: argparse.Namespace,
    policy: str,
    params: dict,
    run_dir: str,
    keep_keys: bool = False,
    log=None,
    *,
    val: list[str] | None = None,
    budget: int | None = None,
) -> dict:
    """Train one model with ``policy``; per epoch: kept, trained, loss, mismatched share, recall,
    the number of steps and the length of the last batch.

    ``keep_keys``: also return the (shard, key) pairs the loader delivered in every epoch. ``log``: takes
    each epoch's line (default: printed at once). ``val``: shards also evaluated after every epoch (a
    validation split; its recalls go into each row as ``val_i2t_r1``...). ``budget``: train exactly this many
    pairs instead of ``args.epochs`` epochs (equal compute): the schedule's length is ``budget / n`` epochs
    (n: the population), warm-up and cosine over it, and the last epoch stops once ``budget`` pairs are trained
    (its last batch cut to the pairs left, its step divided by the nominal batch size like any short batch).
    """
    log = log or (lambda line: print(line, flush=True))
    train, test = shards(args.data, "train"), shards(args.data, "test")
    noise = load_noise(args.data)
    if os.path.exists(run_dir):
        shutil.rmtree(run_dir)  # a fresh run each time
    population = list_samples(train)
    length = args.epochs if budget is None else budget / max(population.num_rows, 1)  # schedule, in epochs
    epochs = args.epochs if budget is None else math.ceil(length)
    torch.manual_seed(args.seed)
    model = Clip()
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.05)
    pruner = seta.Pruner(
        run_dir,
        policy=policy,
        params=params,
        epochs=epochs,
        seed=args.seed,
        population=population,
        batch_size=args.batch_size,  # the plan summary records it (seta-stream inspect shows it)
    )
    loader = train_loader(train, run_dir, args.batch_size, args.workers, args.seed)
    rows, delivered = [], []
    t_run = time.perf_counter()
    for epoch in range(epochs):
        t0 = time.perf_counter()
        summary = start_epoch(pruner, epoch)  # (3) compact + plan, before iter(loader)
        # pairs this epoch trains: all it keeps, or what is left of a budget
        cap = summary["kept"] if budget is None else min(summary["kept"], budget - sum(r["trained"] for r in rows))
        span = cap / max(summary["kept"], 1)  # the share of an epoch of the schedule it takes
        steps = max(1, math.ceil(cap / args.batch_size))
        step = seen = noisy_seen = learnt = noisy_learnt = last_batch = 0
        loss_sum = 0.0
        keys_this_epoch: list[tuple[str, str]] = []
        bar = tqdm(total=summary["kept"], desc=f"{policy} epoch {epoch}", unit="pair", leave=False, disable=args.quiet)
        for x, text, keys, urls, w in loader:
            if seen + len(keys) > cap:  # a budget's last batch: the pairs left
                take = cap - seen
                x, keys, urls, w = x[:take], keys[:take], urls[:take], w[:take]
                text = (text[0][: int(text[1][take])], text[1][:take])
            for g in opt.param_groups:  # step-based schedule sized from the plan (kept varies per epoch)
                g["lr"] = lr_at(epoch + span * min(step, steps) / steps, length, args.lr)
            losses = pair_losses(model(x, text))
            pruner.record(keys, urls, losses)  # (2) unweighted per-pair losses
            opt.zero_grad(set_to_none=True)
            # CLIP loss with InfoBatch's 1/(1-r) on rescaled pairs, summed and divided by the nominal
            # batch size: a short last batch makes a step in proportion to its pairs
            seta.weighted_mean(losses, w, batch_size=args.batch_size).backward()
            opt.step()
            pairs = [(shard_name(u), k) for u, k in zip(urls, keys)]
            noisy_seen += sum(p in noise for p in pairs)
            # pairs kept with weight 0 (the noise rule's re-checks) are measured, not learnt from
            learnt += sum(float(x) > 0 for x in w)
            noisy_learnt += sum(p in noise and float(x) > 0 for p, x in zip(pairs, w))
            if keep_keys:
                keys_this_epoch += pairs
            step += 1
            seen += len(keys)
            last_batch = len(keys)
            loss_sum += float(losses.detach().sum())
            bar.update(len(keys))
            if seen >= cap and cap < summary["kept"]:  # a budget spent mid-epoch
                break
        bar.close()
        train_s = time.perf_counter() - t0
        metrics = evaluate(model, test)
        if val:
            metrics.update({f"val_{k}": v for k, v in evaluate(model, val).items()})
        rows.append(
            {
                "epoch": epoch,
                "phase": summary["phase"],
                "kept": summary["kept"],
                "n": summary["n"],
                "trained": seen,
                "mismatched_trained": noisy_seen,
                "mismatched_share": noisy_seen / max(seen, 1),
                "learnt": learnt,
                "mismatched_learnt": noisy_learnt,
                "steps": step,
                "last_batch": last_batch,
                "noise_suspected": summary.get("noise_suspected"),
                "loss": loss_sum / max(seen, 1),
                "logit_scale": float(model.logit_scale.detach().exp()),
                **metrics,
                "train_s": round(train_s, 2),
            }
        )
        delivered.append(keys_this_epoch)
        log(
            f"  [{policy:>9}] epoch {epoch}  {summary['phase']:<6} kept {100 * summary['kept'] / summary['n']:5.1f}%"
            f"  loss {loss_sum / max(seen, 1):.3f}"
            + (f"  mismatched {100 * noisy_seen / max(seen, 1):4.1f}%" if noise else "")
            + (f" (learnt from: {100 * noisy_learnt / max(learnt, 1):4.1f}%)" if noise and learnt < seen else "")
            + (f"  suspected {summary['noise_suspected']}" if "noise_suspected" in summary else "")
            + f"  R@1 i2t {100 * metrics['i2t_r1']:4.1f} t2i {100 * metrics['t2i_r1']:4.1f}"
            f"  R@5 i2t {100 * metrics['i2t_r5']:4.1f} t2i {100 * metrics['t2i_r5']:4.1f}  {train_s:5.1f}s"
        )
    pruner.close()
    del loader
    total = time.perf_counter() - t_run
    trained = sum(r["trained"] for r in rows)
    result = {
        "policy": policy,
        "params": params,
        "seed": args.seed,
        "rows": rows,
        **{k: rows[-1][k] for k in ("i2t_r1", "i2t_r5", "t2i_r1", "t2i_r5")},
        "pruned": 1 - trained / sum(r["n"] for r in rows),
        "mismatched_in_data": len(noise) / max(rows[0]["n"], 1),
        "seconds": round(total, 1),
        "run_dir": run_dir,
    }
    if keep_keys:
        result["delivered"] = delivered
    return result


def r1(result_or_row: dict) -> float:
    """Recall@1 in %: the mean of image->text and text->image on the clean held-out pairs."""
    return 50.0 * (result_or_row["i2t_r1"] + result_or_row["t2i_r1"])


def report(results: list[dict]) -> list[str]:
    """The comparison table of ``main``: one line per run, then what each trained."""
    lines = [
        "  run                                pruned %   pairs trained   R@1 final   R@1 best (epoch)   wall s",
    ]
    for r in results:
        best = max(r["rows"], key=r1)
        trained = sum(row["trained"] for row in r["rows"])
        lines.append(
            f"  {os.path.basename(r['run_dir']):<34} {100 * r['pruned']:8.1f}   {trained:13,}   {r1(r):9.1f}"
            f"   {r1(best):8.1f} ({best['epoch']:>2})     {r['seconds']:6.0f}"
        )
    lines.append(
        "  R@1: mean of image->text and text->image recall@1 on the clean held-out pairs, in %; "
        "same data, epochs, seed and initialisation"
    )
    full = [r for r in results if r["policy"] == "full" and not r["params"]]
    if full:
        base = sum(row["trained"] for row in full[0]["rows"])
        for r in results:
            if r is not full[0]:
                trained = sum(row["trained"] for row in r["rows"])
                lines.append(
                    f"  {os.path.basename(r['run_dir'])} trained {100 * trained / base:.1f}% of the pairs full data "
                    f"trained ({trained:,} of {base:,}); R@1 {r1(r) - r1(full[0]):+.1f} points at the end"
                )
    return lines


def parser() -> argparse.ArgumentParser:
    return engine_parser(
        __doc__.split("\n\n")[0],
        data="demo-out/pairs",
        run_dir="demo-out/pair-runs",
        tool="tools.make_pair_shards",
        unit="pairs",
        batch_size=128,
        batch_help="pairs per batch (= negatives + 1 per pair)",
        noise_scale_help="with --noise: the scale the rule's mixture is fitted on (noise_scale; log1p fits skewed "
        "clean losses better, docs/algorithms.md §12.11)",
    )


def main(argv: list[str] | None = None, keep_keys: bool = False) -> list[dict]:
    """Train the chosen policy, then full data; print the comparison and the follow-up commands.
    ``keep_keys``: the results also hold the (shard, key) pairs delivered in every epoch."""
    args = parser().parse_args(argv)
    return compare(args, run, report, keep_keys, truth=os.path.abspath(os.path.join(args.data, "noise.parquet")))


if __name__ == "__main__":
    main()
