"""Train a tiny CLIP with OpenCLIP's own data and model code through seta_stream's plans.

Run by tools/openclip_check.sh in its own venv (open-clip-torch[training] 3.3.0, which pins
webdataset<=0.2.86). The data come from ``open_clip_train.data.get_wds_dataset`` and the model
from ``open_clip.create_model_and_transforms`` (a tiny config registered here, no pretrained
weights: nothing is loaded from a hub); the loop is OpenCLIP's ``train_one_epoch`` with the
changes docs/openclip.md lists. Checks, for every epoch, that the pairs delivered are exactly
the plan's kept pairs, each once, that the steps are what those pairs fill, and that OpenCLIP's
cosine schedule, sized from ``num_batches`` before training, ends each epoch where the next
starts and reaches 0 at the end of the last. Then, for contrast, the same plans through
``seta.attach`` alone (OpenCLIP's ``with_epoch`` kept). Prints a Markdown table; exits 1 if a
check fails.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing may come from a hub

import open_clip  # noqa: E402
import polars as pl  # noqa: E402
import torch  # noqa: E402
import webdataset as wds  # noqa: E402
from open_clip_train.data import get_wds_dataset  # noqa: E402
from open_clip_train.scheduler import cosine_lr  # noqa: E402

import seta_stream as seta  # noqa: E402
from seta_stream import openclip as seta_openclip  # noqa: E402

TINY = {  # a CLIP small enough for a CPU: 32-pixel images, 2-layer towers
    "embed_dim": 32,
    "vision_cfg": {"image_size": 32, "layers": 2, "width": 64, "head_width": 32, "patch_size": 8},
    "text_cfg": {"context_length": 32, "vocab_size": 49408, "width": 64, "heads": 2, "layers": 2},
}


def kept_pairs(run: str, epoch: int) -> set[tuple[str, str]]:
    plan = pl.from_arrow(seta.load_plan(run, epoch)).filter(pl.col("keep"))
    return set(zip(plan["shard"].to_list(), plan["key"].to_list()))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", required=True, help="tools/make_pair_shards.py output folder")
    p.add_argument("--out", required=True, help="folder for the run directories")
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--lr", type=float, default=5e-4)
    p.add_argument("--warmup", type=int, default=4)
    a = p.parse_args()
    torch.manual_seed(0)
    shards = sorted(str(s) for s in Path(a.data, "train").glob("*.tar"))
    info = json.loads(Path(a.data, "info.json").read_text())
    n_train = info["train"]["pairs"]
    urls = "::".join(shards)
    args = SimpleNamespace(  # the arguments get_wds_dataset reads (open_clip_train.params)
        train_data=urls,
        val_data=None,
        dataset_resampled=False,
        train_num_samples=n_train,
        train_data_upsampling_factors=None,
        seed=0,
        batch_size=a.batch_size,
        workers=a.workers,
        world_size=1,
    )

    config_dir = Path(tempfile.mkdtemp(prefix="openclip-config-"))
    (config_dir / "seta-tiny-clip.json").write_text(json.dumps(TINY))
    open_clip.add_model_config(config_dir)
    model, preprocess_train, _ = open_clip.create_model_and_transforms(
        "seta-tiny-clip", pretrained=None, output_dict=True
    )
    tokenizer = open_clip.get_tokenizer("seta-tiny-clip")

    run = str(Path(a.out, "run"))
    pruner = seta.Pruner(
        run,
        policy="seta",
        params=dict(r=0.3, k=3, alpha=0.5),
        epochs=a.epochs,
        seed=0,
        population=seta.list_samples(shards),
    )
    data = get_wds_dataset(args, preprocess_train, is_train=True, epoch=0, tokenizer=tokenizer)
    num_batches = data.dataloader.num_batches
    seta_openclip.adapt(data, run)  # change 1: the plan, ids in the batch, one pass per epoch

    optimizer = torch.optim.AdamW(model.parameters(), lr=a.lr, weight_decay=0.1)
    total_steps = num_batches * a.epochs  # as open_clip_train.main sizes it
    scheduler = cosine_lr(optimizer, a.lr, a.warmup, total_steps)
    clock = seta.EpochClock(steps_per_epoch=num_batches)  # change 2: the schedule follows the pairs

    rows, failures = [], []
    for epoch in range(a.epochs):
        t0 = time.perf_counter()
        summary = pruner.start_epoch(epoch)  # change 3: plan the epoch before iter(dataloader)
        clock.start_epoch(epoch, summary["kept"])
        data.set_epoch(epoch)
        model.train()
        delivered, lrs, steps, loss_sum = [], [], 0, 0.0
        for images, texts, keys, urls_, weights in data.dataloader:
            lrs.append(scheduler(clock.step(len(images))))  # was: scheduler(num_batches * epoch + i)
            optimizer.zero_grad()
            out = model(images, texts)
            losses = seta_openclip.pair_losses(out["image_features"], out["text_features"], out["logit_scale"])
            pruner.record(keys, urls_, losses)  # change 4: one loss per pair
            loss = seta.weighted_mean(losses, weights)  # = ClipLoss on one rank
            loss.backward()
            optimizer.step()
            with torch.no_grad():
                model.logit_scale.clamp_(0, math.log(100))
            delivered += [(seta.shard_name(u), k) for u, k in zip(urls_, keys)]
            steps += 1
            loss_sum += loss.item()
        pruner.flush()
        kept = kept_pairs(run, epoch)
        fewest, most = seta.epoch_steps(len(kept), a.batch_size, workers=a.workers)
        row = dict(
            epoch=epoch,
            kept=summary["kept"],
            delivered=len(delivered),
            distinct=len(set(delivered)),
            steps=steps,
            bounds=f"{fewest}-{most}",
            openclip_steps=num_batches,
            lr_first=lrs[0],
            lr_last=lrs[-1],
            position_end=clock.position,
            loss=loss_sum / max(steps, 1),
            seconds=time.perf_counter() - t0,
        )
        rows.append(row)
        if set(delivered) != kept or len(delivered) != len(kept) or summary["kept"] != len(kept):
            failures.append(
                f"epoch {epoch}: delivered {len(delivered)} ({len(set(delivered))} distinct), plan keeps {len(kept)}"
            )
        if not fewest <= steps <= most:
            failures.append(f"epoch {epoch}: {steps} steps, expected {fewest}-{most}")
        end = num_batches * (epoch + 1)
        if clock.position != end:
            failures.append(f"epoch {epoch}: the schedule ends at {clock.position}, expected {end}")
    pruner.close()
    final_lr = scheduler(clock.position)
    if abs(final_lr) > 1e-12:
        failures.append(f"the schedule ends at lr {final_lr}, expected 0")

    # for contrast: the same plans through attach alone, OpenCLIP's with_epoch left in place
    baseline = []
    data2 = get_wds_dataset(args, preprocess_train, is_train=True, epoch=0, tokenizer=tokenizer)
    ds2 = seta_openclip.training_pipeline(data2)
    seta.attach(ds2, run)
    to_tuple = next(st for st in ds2.pipeline if getattr(st, "f", None) is wds.to_tuple.f)
    to_tuple.args = (*to_tuple.args, "__key__", "__url__")
    for epoch in range(a.epochs):
        seta.set_current_epoch(run, epoch)
        data2.set_epoch(epoch)
        got, steps = [], 0
        for _, _, keys, urls_ in data2.dataloader:
            got += [(seta.shard_name(u), k) for u, k in zip(urls_, keys)]
            steps += 1
        baseline.append((epoch, steps, len(got), len(set(got))))

    print(
        f"webdataset {wds.__version__}, open_clip {open_clip.__version__}, torch {torch.__version__}, "
        f"seta_stream {seta.__version__}, Python {sys.version.split()[0]}"
    )
    print(
        f"{n_train} pairs in {len(shards)} shards, batch {a.batch_size}, {a.workers} workers, "
        f"OpenCLIP's num_batches {num_batches}, cosine_lr(lr={a.lr}, warmup={a.warmup}, steps={total_steps})\n"
    )
    print(
        "| epoch | kept (plan) | delivered | distinct | steps | epoch_steps | OpenCLIP's steps | lr at first step | "
        "lr at last step | schedule position at end | mean loss |"
    )
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        print(
            f"| {r['epoch']} | {r['kept']} | {r['delivered']} | {r['distinct']} | {r['steps']} | {r['bounds']} | "
            f"{r['openclip_steps']} | {r['lr_first']:.3e} | {r['lr_last']:.3e} | {r['position_end']:g} | "
            f"{r['loss']:.3f} |"
        )
    print(f"\nlr after the last epoch: {final_lr:.3e}\n")
    print("The same plans through attach alone (OpenCLIP's with_epoch kept):\n")
    print("| epoch | steps | delivered | distinct |")
    print("| ---: | ---: | ---: | ---: |")
    for e, s, n, d in baseline:
        print(f"| {e} | {s} | {n} | {d} |")
    if failures:
        print("\nFAILED:\n" + "\n".join(failures))
        return 1
    print("\nOK: every epoch delivered exactly its kept pairs once, in the steps they fill; the schedule followed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
