"""Train a tiny CLIP with OpenCLIP's own data and model code through seta_stream's plans.

Run by tools/openclip_check.sh in its own venv (open-clip-torch[training] 3.3.0, which pins
webdataset<=0.2.86). The data come from ``open_clip_train.data.get_wds_dataset`` and the model
from ``open_clip.create_model_and_transforms`` (a tiny config registered here, no pretrained
weights: nothing is loaded from a hub); the loop is OpenCLIP's ``train_one_epoch`` with the
changes docs/openclip.md lists, the loss averaged over the nominal batch size (the last batch of
a one-pass epoch is short). Checks, and writes to ``--result`` (JSON; tools/openclip_report.py
turns it into docs/openclip.md's tables):

* ``main``: SeTa over 4 epochs, 2 workers: every epoch delivers exactly the plan's kept pairs,
  each once, in the steps they fill (``epoch_steps``), and OpenCLIP's cosine schedule, sized
  from ``num_batches`` before training, ends each epoch where the next starts and reaches 0 at
  the end of the last;
* ``attach_alone``: for contrast, the same plans through ``seta.attach`` alone (OpenCLIP's
  ``with_epoch`` kept): full-data steps, re-read pairs;
* ``resampled``: ``--dataset-resampled`` is refused and the pipeline left exactly as it was
  (stages and their arguments compared before and after), a second ``adapt`` refused for the
  same reason, and the loader still gives OpenCLIP's (images, texts) batches;
* ``workers0``: ``--workers 0`` trains every kept pair once in ``epoch_steps(..., workers=0)``;
* ``caption``: shards where 3 of every 20 pairs keep their caption as ``.caption``, not
  ``.txt`` (OpenCLIP's ``filter_no_caption_or_no_image`` drops them): listed without
  ``members`` the epoch delivers fewer pairs than planned, the schedule ends early and
  ``Pruner(check_delivered=True)`` names them; listed with ``members=openclip.MEMBERS`` the
  plan counts only the pairs OpenCLIP keeps and the schedule ends at 0;
* ``train_num_samples``: ``--train-num-samples`` a fraction of the data: the epoch still trains
  every kept pair, ``num_batches`` only scales the schedule.

Exits 1 if a check fails.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import subprocess
import sys
import tempfile
import time
import warnings
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
from seta_stream.testing import set_current_epoch  # noqa: E402

TINY = {  # a CLIP small enough for a CPU: 32-pixel images, 2-layer towers
    "embed_dim": 32,
    "vision_cfg": {"image_size": 32, "layers": 2, "width": 64, "head_width": 32, "patch_size": 8},
    "text_cfg": {"context_length": 32, "vocab_size": 49408, "width": 64, "heads": 2, "layers": 2},
}
SETA = dict(r=0.3, k=3, alpha=0.5)
CAPTIONED = (2, 9, 15)  # of every 20 pairs, the caption stored as .caption


def kept_pairs(run: str, epoch: int) -> set[tuple[str, str]]:
    plan = pl.from_arrow(seta.load_plan(run, epoch)).filter(pl.col("keep"))
    return set(zip(plan["shard"].to_list(), plan["key"].to_list()))


def openclip_args(shards: list[str], a: argparse.Namespace, **changes: object) -> SimpleNamespace:
    """The arguments get_wds_dataset reads (open_clip_train.params), as OpenCLIP's CLI sets them."""
    args = dict(
        train_data="::".join(shards),
        val_data=None,
        dataset_resampled=False,
        train_num_samples=None,
        train_data_upsampling_factors=None,
        seed=0,
        batch_size=a.batch_size,
        workers=a.workers,
        world_size=1,
    )
    return SimpleNamespace(**{**args, **changes})


def new_model() -> tuple[torch.nn.Module, object, object]:
    torch.manual_seed(0)
    model, preprocess_train, _ = open_clip.create_model_and_transforms(
        "seta-tiny-clip", pretrained=None, output_dict=True
    )
    return model, preprocess_train, open_clip.get_tokenizer("seta-tiny-clip")


def train(
    args: SimpleNamespace, run: str, epochs: int, a: argparse.Namespace, *, population, policy="seta", params=SETA
) -> dict:
    """OpenCLIP's main.py + train_one_epoch with the changes of docs/openclip.md; per epoch the
    plan's kept pairs, what was delivered, the steps, the schedule; the warnings emitted."""
    model, preprocess_train, tokenizer = new_model()
    pruner = seta.Pruner(
        run, policy=policy, params=params, epochs=epochs, seed=0, population=population, check_delivered=True
    )
    data = get_wds_dataset(args, preprocess_train, is_train=True, epoch=0, tokenizer=tokenizer)
    num_batches = data.dataloader.num_batches
    seta_openclip.adapt(data, run)  # change 1: the plan, ids in the batch, one pass per epoch
    optimizer = torch.optim.AdamW(model.parameters(), lr=a.lr, weight_decay=0.1)
    total_steps = num_batches * epochs  # as open_clip_train.main sizes it
    scheduler = cosine_lr(optimizer, a.lr, a.warmup, total_steps)
    clock = seta.EpochClock(steps_per_epoch=num_batches)  # change 2: the schedule follows the pairs
    rows, failures = [], []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", seta.errors.SetaStreamWarning)
        for epoch in range(epochs):
            t0 = time.perf_counter()
            summary = pruner.start_epoch(epoch)  # change 3: plan the epoch before iter(dataloader)
            clock.start_epoch(epoch, summary["kept"] / args.world_size)
            data.set_epoch(epoch)
            model.train()
            delivered, lrs, steps, loss_sum = [], [], 0, 0.0
            for images, texts, keys, urls, weights in data.dataloader:
                lrs.append(scheduler(clock.step(len(images))))  # was: scheduler(num_batches * epoch + i)
                optimizer.zero_grad()
                out = model(images, texts)
                losses = seta_openclip.pair_losses(out["image_features"], out["text_features"], out["logit_scale"])
                pruner.record(keys, urls, losses)  # change 4: one loss per pair
                # ClipLoss on one rank, averaged over the nominal batch: the short last batch of a
                # one-pass epoch makes a step in proportion to its pairs
                loss = seta.weighted_mean(losses, weights, batch_size=args.batch_size)
                loss.backward()
                optimizer.step()
                with torch.no_grad():
                    model.logit_scale.clamp_(0, math.log(100))
                delivered += [(seta.ids.shard_name(u), k) for u, k in zip(urls, keys)]
                steps += 1
                loss_sum += loss.item()
            pruner.flush()
            kept = kept_pairs(run, epoch)
            fewest, most = seta.epoch_steps(len(kept), args.batch_size, workers=args.workers)
            rows.append(
                dict(
                    epoch=epoch,
                    kept=summary["kept"],
                    delivered=len(delivered),
                    distinct=len(set(delivered)),
                    kept_delivered=len(set(delivered) & kept),
                    steps=steps,
                    fewest=fewest,
                    most=most,
                    openclip_steps=num_batches,
                    lr_first=lrs[0],
                    lr_last=lrs[-1],
                    position_end=clock.position,
                    loss=loss_sum / max(steps, 1),
                    seconds=round(time.perf_counter() - t0, 1),
                )
            )
            if set(delivered) != kept or len(delivered) != len(kept) or summary["kept"] != len(kept):
                failures.append(
                    f"epoch {epoch}: delivered {len(delivered)} ({len(set(delivered))} distinct), "
                    f"plan keeps {len(kept)}"
                )
            if not fewest <= steps <= most:
                failures.append(f"epoch {epoch}: {steps} steps, expected {fewest}-{most}")
            if clock.position != num_batches * (epoch + 1):
                failures.append(
                    f"epoch {epoch}: the schedule ends at {clock.position}, expected {num_batches * (epoch + 1)}"
                )
        pruner.close()
    final_lr = scheduler(clock.position)
    if abs(final_lr) > 1e-12:
        failures.append(f"the schedule ends at lr {final_lr}, expected 0")
    return dict(
        num_batches=num_batches,
        total_steps=total_steps,
        train_num_samples=args.train_num_samples,
        population=population.num_rows,
        rows=rows,
        final_lr=final_lr,
        warnings=[
            dict(code=w.message.code, message=str(w.message))
            for w in caught
            if isinstance(w.message, seta.errors.PlanWarning)
        ],
        failures=failures,
    )


def attach_alone(args: SimpleNamespace, run: str, epochs: int) -> list[dict]:
    """The plans of ``run`` through seta.attach alone, OpenCLIP's with_epoch left in place."""
    _, preprocess_train, tokenizer = new_model()
    data = get_wds_dataset(args, preprocess_train, is_train=True, epoch=0, tokenizer=tokenizer)
    ds = seta_openclip.training_pipeline(data)
    seta.attach(ds, run)
    to_tuple = next(st for st in ds.pipeline if getattr(st, "f", None) is wds.to_tuple.f)
    to_tuple.args = (*to_tuple.args, "__key__", "__url__")
    rows = []
    for epoch in range(epochs):
        set_current_epoch(run, epoch)
        data.set_epoch(epoch)
        got, steps = [], 0
        for _, _, keys, urls in data.dataloader:
            got += [(seta.ids.shard_name(u), k) for u, k in zip(urls, keys)]
            steps += 1
        rows.append(
            dict(epoch=epoch, steps=steps, delivered=len(got), distinct=len(set(got)), kept=len(kept_pairs(run, epoch)))
        )
    return rows


def snapshot(data) -> tuple:
    """What adapt may change: every stage (identity, type, args, kw) and the epoch limits."""
    ds = seta_openclip.training_pipeline(data)
    stages = tuple(
        (id(st), type(st).__name__, repr(getattr(st, "args", None)), repr(getattr(st, "kw", None)))
        for st in ds.pipeline
    )
    return stages, ds.repetitions, ds.nsamples


def resampled(args: SimpleNamespace, run: str) -> dict:
    _, preprocess_train, tokenizer = new_model()
    data = get_wds_dataset(args, preprocess_train, is_train=True, epoch=0, tokenizer=tokenizer)
    before = snapshot(data)
    messages, unchanged = [], []
    for _ in range(2):
        try:
            seta_openclip.adapt(data, run)
            messages.append(None)
        except seta.errors.UnsupportedPipelineError as exc:
            messages.append(str(exc))
        unchanged.append(snapshot(data) == before)
    images, texts = next(iter(data.dataloader))  # OpenCLIP's own batch, as without seta_stream
    failures = []
    if None in messages or messages[0] != messages[1]:
        failures.append(f"resampled: adapt twice gave {messages}, expected the same refusal twice")
    if not all(unchanged):
        failures.append("resampled: a refused adapt changed the pipeline")
    if "adapted before" in (messages[1] or ""):
        failures.append("resampled: the second adapt was refused as adapted before")
    return dict(
        stages=len(before[0]),
        unchanged_after_each=unchanged,
        messages=messages,
        batch=[type(images).__name__, list(images.shape), type(texts).__name__, list(texts.shape)],
        failures=failures,
    )


def caption_shards(shards: list[str], out: Path) -> list[str]:
    """The shards again, the caption of pairs CAPTIONED of every 20 stored as .caption."""
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for shard in shards:
        path = out / Path(shard).name
        with wds.TarWriter(str(path)) as w:
            for i, sample in enumerate(wds.WebDataset(shard, shardshuffle=False)):
                sample = {k: v for k, v in sample.items() if k != "__url__"}
                if i % 20 in CAPTIONED:
                    sample["caption"] = sample.pop("txt")
                w.write(sample)
        written.append(str(path))
    return written


def git(*cmd: str) -> str:
    return subprocess.run(["git", *cmd], capture_output=True, text=True, check=False).stdout


def machine() -> dict:
    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        platform.processor(),
    )
    return dict(cpu=cpu, cores=os.cpu_count(), system=platform.platform(), python=sys.version.split()[0])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", required=True, help="tools/make_pair_shards.py output folder")
    p.add_argument("--out", required=True, help="folder for the run directories")
    p.add_argument("--result", required=True, help="JSON file to write (docs/openclip-check.json)")
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--lr", type=float, default=5e-4)
    p.add_argument("--warmup", type=int, default=4)
    a = p.parse_args()
    t0 = time.perf_counter()
    # the code this run starts from (other commits may land while it runs)
    commit = git("rev-parse", "HEAD").strip()
    uncommitted = [line[3:] for line in git("status", "--porcelain", "--", "seta_stream", "tools").splitlines()]
    out = Path(a.out)
    shards = sorted(str(s) for s in Path(a.data, "train").glob("*.tar"))
    n_train = json.loads(Path(a.data, "info.json").read_text())["train"]["pairs"]
    config_dir = Path(tempfile.mkdtemp(prefix="openclip-config-"))
    (config_dir / "seta-tiny-clip.json").write_text(json.dumps(TINY))
    open_clip.add_model_config(config_dir)
    members = seta_openclip.MEMBERS

    args = openclip_args(shards, a, train_num_samples=n_train)
    result: dict = {}
    result["main"] = train(args, str(out / "main"), a.epochs, a, population=seta.list_samples(shards, members=members))
    result["attach_alone"] = attach_alone(args, str(out / "main"), a.epochs)
    result["resampled"] = resampled(
        openclip_args(shards, a, train_num_samples=n_train, dataset_resampled=True), str(out / "main")
    )
    result["workers0"] = train(
        openclip_args(shards, a, train_num_samples=n_train, workers=0),
        str(out / "workers0"),
        2,
        a,
        population=seta.list_samples(shards, members=members),
    )
    captioned = caption_shards(shards, out / "caption-shards")
    cap_args = openclip_args(captioned, a, train_num_samples=n_train)
    result["caption"] = {
        "captioned_per_20": len(CAPTIONED),
        "all_listed": train(
            cap_args, str(out / "caption-all"), 1, a, population=seta.list_samples(captioned), policy="full", params={}
        ),
        "members": train(
            cap_args,
            str(out / "caption-members"),
            1,
            a,
            population=seta.list_samples(captioned, members=members),
            policy="full",
            params={},
        ),
    }
    small = n_train // 8
    result["train_num_samples"] = train(
        openclip_args(shards, a, train_num_samples=small),
        str(out / "small"),
        1,
        a,
        population=seta.list_samples(shards, members=members),
    )

    failures = [*result["main"]["failures"], *result["resampled"]["failures"]]
    failures += [f"workers 0: {f}" for f in result["workers0"]["failures"]]
    failures += [f"--train-num-samples {small}: {f}" for f in result["train_num_samples"]["failures"]]
    failures += [f"caption, members: {f}" for f in result["caption"]["members"]["failures"]]
    if result["caption"]["members"]["warnings"]:
        failures.append("caption, members: a warning was emitted")
    all_listed = result["caption"]["all_listed"]
    if [w["code"] for w in all_listed["warnings"]] != ["undelivered"] or not all_listed["failures"]:
        failures.append("caption, all listed: expected the short epoch and one 'undelivered' warning")
    result["failures"] = failures
    result["run"] = dict(
        machine=machine(),
        commit=commit,
        uncommitted=uncommitted,
        versions={
            "open_clip": open_clip.__version__,
            "torch": torch.__version__,
            "webdataset": wds.__version__,
            "seta_stream": seta.__version__,
            "python": sys.version.split()[0],
        },
        settings=dict(
            pairs=n_train,
            shards=len(shards),
            batch_size=a.batch_size,
            workers=a.workers,
            epochs=a.epochs,
            lr=a.lr,
            warmup=a.warmup,
            seta=SETA,
        ),
        seconds=round(time.perf_counter() - t0),
    )
    Path(a.result).write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")
    print(f"wrote {a.result} in {result['run']['seconds']} s")
    if failures:
        print("FAILED:\n" + "\n".join(failures))
        return 1
    print("OK: every check passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
