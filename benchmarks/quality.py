"""Does pruning keep accuracy? Every policy trained through the real pipeline on real data.

Shards -> ``seta.attach`` (skip_shards + keep_filter) -> DataLoader worker -> model -> recorded
per-sample losses -> compaction -> plan of the next epoch, exactly as a user's loop does it.

Data (from ``--data``, never copied into the repository):

* CIFAR-10: train shards 0-8 (45,000 images) train, train shard 9 (5,000) is the held-out
  validation split, the 10,000 test images are the test split. Small CNN, CPU.
* SST-2: ``train.tsv`` converted to shards with ``tools/text_to_shards.py`` (shuffled, seed 0):
  shards 0-12 (65,000 sentences) train, shard 13 (2,349) held-out validation; GLUE's ``dev.tsv``
  (872) is the test split (GLUE's test labels are not public). Hashed uni+bigram bag of words
  (fastText-like), CPU.

Runs at the same number of epochs: full; dynamic random, static random, InfoBatch and SeTa at
settings that land near 30/50/70% pruned; ES and ESWP at their defaults; and with 40% of the
training labels replaced (a fixed, seeded corruption): full, InfoBatch, SeTa, ES and ESWP.
InfoBatch's and SeTa's settings for a pruned level are chosen on training losses only (the
per-epoch losses the full run of seed 0 recorded), never on a test split; see ``calibrate``.

Each finished run is one JSON file under ``docs/quality-runs/`` (committed, small); a rerun
skips finished runs, so a partial study resumes. ``--report-only`` rewrites docs/quality.md
and the plots from those files.

    python benchmarks/quality.py --data ../shared/data            # everything (hours on 2 cores)
    python benchmarks/quality.py --datasets sst2 --seeds 5        # one data set
    python benchmarks/quality.py --report-only
"""

from __future__ import annotations

import argparse
import glob
import json
import math
import os
import re
import shutil
import subprocess
import sys
import time
import zlib
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "docs" / "quality-runs"
DOC = ROOT / "docs" / "quality.md"
LEVELS = (0.3, 0.5, 0.7)
NOISE = 0.4
NOISE_SEED = 20261122
BEGIN, END = "<!-- generated:begin -->", "<!-- generated:end -->"


# ---------------------------------------------------------------------------------- data sets
class Dataset:
    name: str
    classes: int
    epochs: int
    batch: int
    workers: int

    def __init__(self, data: Path, out: Path) -> None:
        self.data, self.out = data, out

    def prepare(self) -> None: ...

    train: list[str]
    val: list[str]
    test: list[str]


class Cifar(Dataset):
    name, classes, epochs, batch, workers = "cifar10", 10, 6, 128, 1

    def prepare(self) -> None:
        d = self.data / "cifar10"
        shards = sorted(glob.glob(str(d / "train-*.tar.gz")))
        if len(shards) != 10:
            raise SystemExit(f"{d}: expected 10 train-*.tar.gz shards, found {len(shards)}; see {d}/README.md")
        self.train, self.val = shards[:9], shards[9:]
        self.test = sorted(glob.glob(str(d / "test-*.tar.gz")))


class Sst2(Dataset):
    name, classes, epochs, batch, workers = "sst2", 2, 5, 128, 2

    def prepare(self) -> None:
        d = self.out / "sst2-shards"
        if not (d / "sst2-test.json").exists():
            tool = ROOT / "tools" / "text_to_shards.py"
            common = ["--text", "sentence", "--label", "label", "--labels", "0,1", "--shard-size", "5000"]
            src = self.data / "sst2"
            for split, extra in (("train", ["--shuffle", "0"]), ("test", [])):
                tsv = src / ("train.tsv" if split == "train" else "dev.tsv")
                subprocess.run(
                    [sys.executable, str(tool), str(tsv), "--out", str(d), "--prefix", f"sst2-{split}", "--json"]
                    + common
                    + extra,
                    check=True,
                    stdout=subprocess.DEVNULL,
                )
        shards = sorted(glob.glob(str(d / "sst2-train-*.tar")))
        self.train, self.val = shards[:-1], shards[-1:]
        self.test = sorted(glob.glob(str(d / "sst2-test-*.tar")))


# ------------------------------------------------------------------------------ label noise
def _hash01(text: str, salt: int) -> float:
    return zlib.crc32(f"{salt}:{text}".encode()) / 2**32


def noise_offsets(population: Any, classes: int) -> dict[str, int]:
    """key -> label offset (1..C-1) for exactly round(40%) of the training samples.

    Fixed and seeded (NOISE_SEED), derived from the keys alone, so every policy and seed sees
    the same corrupted labels; the new label (y + offset) mod C is always a different class.
    """
    keys = sorted(population.column("key").to_pylist())
    order = sorted(keys, key=lambda k: (_hash01(k, NOISE_SEED), k))
    chosen = order[: round(NOISE * len(keys))]
    return {k: 1 + int(_hash01(k, NOISE_SEED + 1) * (classes - 1)) for k in chosen}


# ---------------------------------------------------------------------------------- models
def cifar_model() -> Any:
    import torch.nn as nn

    def block(i: int, o: int) -> nn.Module:
        return nn.Sequential(nn.Conv2d(i, o, 3, 1, 1, bias=False), nn.BatchNorm2d(o), nn.ReLU(inplace=True))

    return nn.Sequential(
        block(3, 16), nn.MaxPool2d(2), block(16, 32), nn.MaxPool2d(2), block(32, 64), nn.MaxPool2d(2),
        block(64, 128), nn.AdaptiveMaxPool2d(1), nn.Flatten(), nn.Linear(128, 10),
    )  # fmt: skip


BUCKETS = 1 << 18


def tokens(text: str) -> list[int]:
    """Hashed unigrams and bigrams of a lower-cased, whitespace-tokenised sentence."""
    words = text.lower().split()
    grams = words + [a + " " + b for a, b in zip(words, words[1:])]
    return [zlib.crc32(g.encode()) % BUCKETS for g in grams] or [0]


class TextModel:
    """fastText-like: mean of hashed n-gram embeddings, then a linear layer."""

    def __new__(cls) -> Any:
        import torch.nn as nn

        class _M(nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.emb = nn.EmbeddingBag(BUCKETS, 64, mode="mean", sparse=True)
                self.out = nn.Linear(64, 2)

            def forward(self, batch: Any) -> Any:
                ids, offsets = batch
                return self.out(self.emb(ids, offsets))

        return _M()


# ------------------------------------------------------------------------------ pipelines
MEAN = np.array([0.4914, 0.4822, 0.4465], np.float32) * 255
STD = np.array([0.2470, 0.2435, 0.2616], np.float32) * 255


_RNG: list[np.random.Generator] = []


def _images(batch: list, augment: bool = False) -> Any:
    """Batch of HWC uint8 images -> normalised NCHW float tensor (channels-last memory).

    ``augment``: random 32x32 crop of the 4-pixel zero-padded image and a random horizontal
    flip, drawn per sample for the whole batch at once.
    """
    import torch

    x = np.stack(batch)
    if augment:
        if not _RNG:  # one generator per worker process, created on first use
            _RNG.append(np.random.default_rng())
        b = len(x)
        pad = np.zeros((b, 40, 40, 3), np.uint8)
        pad[:, 4:36, 4:36] = x
        d = _RNG[0].integers(0, 9, (b, 2))
        flip = _RNG[0].random(b) < 0.5
        x = np.stack([pad[i, d[i, 0] : d[i, 0] + 32, d[i, 1] : d[i, 1] + 32] for i in range(b)])
        x[flip] = x[flip, :, ::-1]
    x = (x.astype(np.float32) - MEAN) / STD
    return torch.from_numpy(x).permute(0, 3, 1, 2).contiguous(memory_format=torch.channels_last)


def _texts(batch: list) -> Any:
    import torch

    ids = [tokens(t) for t in batch]
    offsets = np.cumsum([0] + [len(t) for t in ids[:-1]])
    return torch.tensor([i for t in ids for i in t]), torch.from_numpy(offsets)


def _collate(samples: list, augment: bool = False) -> tuple:
    cols = list(zip(*samples))
    x = _images(list(cols[0]), augment) if isinstance(cols[0][0], np.ndarray) else _texts(list(cols[0]))
    return (x, *[list(c) for c in cols[1:]])


def _collate_train(samples: list) -> tuple:
    return _collate(samples, augment=True)


def _relabel(offsets: dict[str, int], classes: int) -> Any:
    def fn(sample: dict) -> dict:
        off = offsets.get(sample["__key__"])
        if off:  # before decode: the label is still the member's bytes
            sample["cls"] = str((int(sample["cls"]) + off) % classes).encode()
        return sample

    return fn


def train_loader(ds: Dataset, run_dir: str, seed: int, noise: dict[str, int] | None, with_score: bool, bs: int) -> Any:
    import webdataset as wds

    import seta_stream as seta

    image = ds.name == "cifar10"
    pipe = seta.attach(wds.WebDataset(ds.train, shardshuffle=len(ds.train), seed=seed, empty_check=False), run_dir)
    if noise:
        pipe = pipe.map(_relabel(noise, ds.classes))
    fields = ["jpg" if image else "txt", "cls", "__key__", "__url__", "__weight__"] + (
        ["__score__"] if with_score else []
    )
    pipe = pipe.shuffle(2000, seed=seed).decode(*(["rgb8"] if image else [])).to_tuple(*fields)
    pipe = pipe.batched(bs, collation_fn=_collate_train, partial=True)
    return wds.WebLoader(pipe, batch_size=None, num_workers=ds.workers, persistent_workers=True)


def eval_batches(ds: Dataset, urls: list[str]) -> Any:
    """The evaluation split as batches of (model input, labels), read through webdataset."""
    import webdataset as wds

    image = ds.name == "cifar10"
    return (
        wds.WebDataset(urls, shardshuffle=False, empty_check=False)
        .decode(*(["rgb8"] if image else []))
        .to_tuple("jpg" if image else "txt", "cls")
        .batched(500, collation_fn=_collate)
    )


def evaluate(model: Any, ds: Dataset, urls: list[str] | list[tuple]) -> float:
    """Accuracy on ``urls`` (shards) or on batches already read by ``eval_batches``."""
    import torch

    pipe = urls if urls and isinstance(urls[0], tuple) else eval_batches(ds, urls)  # type: ignore[arg-type]
    model.eval()
    correct = total = 0
    with torch.no_grad():
        for x, y in pipe:
            y = torch.as_tensor([int(v) for v in y])
            correct += int((model(x).argmax(1) == y).sum())
            total += len(y)
    model.train()
    return correct / max(total, 1)


# ------------------------------------------------------------------------------ one run
def lr_at(t: float, epochs: int, peak: float) -> float:
    """Epoch-based one-cycle: linear warm-up over the first 15% of training, then linear decay."""
    w = 0.15 * epochs
    return peak * (t / w if t < w else max(0.0, (epochs - t) / (epochs - w)))


def train_run(ds: Dataset, cfg: dict, seed: int, out: Path, population: Any, rid: str | None = None) -> dict:
    import torch
    import torch.nn.functional as F

    import seta_stream as seta
    from seta_stream.ids import sample_uid, shard_name
    from seta_stream.policies import es_select

    policy, params, noisy = cfg["policy"], dict(cfg["params"]), cfg["noisy"]
    run_dir = str(out / "runs" / (rid or run_id(ds.name, cfg, seed)))
    shutil.rmtree(run_dir, ignore_errors=True)
    torch.manual_seed(seed)
    image = ds.name == "cifar10"
    model = cifar_model().to(memory_format=torch.channels_last) if image else TextModel()
    if image:
        peak = 0.1
        opts = [torch.optim.SGD(model.parameters(), lr=peak, momentum=0.9, nesterov=True, weight_decay=5e-4)]
    else:
        peak = 0.01
        opts = [
            torch.optim.SparseAdam(model.emb.parameters(), lr=peak),
            torch.optim.Adam(model.out.parameters(), lr=peak),
        ]
    es_like = policy in ("es", "eswp")
    mini = 0.25
    n_epochs = cfg.get("n_epochs", ds.epochs)  # the converged study's runs set their own length
    curve = cfg.get("study") == "converged"  # test accuracy after every epoch (decoded once)
    test_set = list(eval_batches(ds, ds.test)) if curve else None
    pruner = seta.Pruner(run_dir, policy=policy, params=params, epochs=n_epochs, seed=seed, population=population)
    noise = noise_offsets(population, ds.classes) if noisy else None
    meta = int(ds.batch / mini) if es_like else ds.batch
    loader = train_loader(ds, run_dir, seed, noise, es_like, meta)
    epochs: list[dict] = []
    t_run = time.perf_counter()
    train_s = 0.0  # wall time without the per-epoch evaluation
    samples = 0
    for epoch in range(n_epochs):
        t0 = time.perf_counter()
        cpu0 = machine_cpu()
        summary = pruner.start_epoch(epoch)
        active = es_like and bool(summary.get("active"))
        steps = max(1, math.ceil(summary["kept"] / (meta if active else ds.batch)))
        step = streamed = backprop = 0
        loss_sum = 0.0
        for batch in loader:
            x, y, keys, urls, w = batch[:5]
            y = torch.as_tensor([int(v) for v in y])
            streamed += len(keys)
            if es_like:
                with torch.no_grad():
                    losses = F.cross_entropy(model(x), y, reduction="none")
                if active:
                    uids = [sample_uid(shard_name(u), k) for u, k in zip(urls, keys)]
                    pick = es_select(losses, np.asarray(batch[5], np.float64), mini_ratio=mini, beta1=0.2, seed=seed,
                                     epoch=epoch, rank=0, step=step, uids=uids)  # fmt: skip
                    chunks = [torch.from_numpy(np.flatnonzero(pick))]
                else:  # warm-up / annealing: the meta-batch as ordinary mini-batches
                    pick = np.ones(len(keys), bool)
                    chunks = list(torch.arange(len(keys)).split(ds.batch))
                pruner.record(keys, urls, losses, trained=pick)
                loss_sum += float(losses.sum())
                for idx in chunks:
                    _set_lr(opts, lr_at(epoch + min(step, steps) / steps, n_epochs, peak))
                    xs = x[idx] if image else _select_text(x, idx)
                    loss = F.cross_entropy(model(xs), y[idx])
                    for o in opts:
                        o.zero_grad(set_to_none=True)
                    loss.backward()
                    for o in opts:
                        o.step()
                    step += 1
                    backprop += len(idx)
                continue
            _set_lr(opts, lr_at(epoch + min(step, steps) / steps, n_epochs, peak))
            losses = F.cross_entropy(model(x), y, reduction="none")
            pruner.record(keys, urls, losses)
            for o in opts:
                o.zero_grad(set_to_none=True)
            seta.weighted_mean(losses, w).backward()
            for o in opts:
                o.step()
            step += 1
            loss_sum += float(losses.detach().sum())
            backprop += len(keys)
        epochs.append(
            {
                "epoch": epoch,
                "phase": summary["phase"],
                "n": summary["n"],
                "kept": summary["kept"],
                "streamed": streamed,
                "backprop": backprop,
                "train_loss": loss_sum / max(streamed, 1),
                "seconds": round(time.perf_counter() - t0, 2),
            }
        )
        if curve:
            train_s += time.perf_counter() - t0
            samples += streamed
            epochs[-1].update(other_cpu=round(other_cpu(cpu0, machine_cpu()), 3), load1=round(os.getloadavg()[0], 2),
                              samples=samples, train_seconds=round(train_s, 2),
                              test_acc=evaluate(model, ds, test_set))  # fmt: skip
        print(
            f"    epoch {epoch} {summary['phase']:<6} kept {100 * summary['kept'] / summary['n']:5.1f}% "
            f"loss {loss_sum / max(streamed, 1):.3f} {time.perf_counter() - t0:5.1f}s",
            flush=True,
        )
    pruner.close()
    seconds = time.perf_counter() - t_run
    n_total = sum(e["n"] for e in epochs)
    result = {
        "dataset": ds.name,
        **cfg,
        "seed": seed,
        "epochs": epochs,
        "pruned": 1 - sum(e["streamed"] for e in epochs) / n_total,
        "pruned_backprop": 1 - sum(e["backprop"] for e in epochs) / n_total,
        "val_acc": evaluate(model, ds, ds.val),
        "test_acc": evaluate(model, ds, test_set or ds.test),
        "seconds": round(seconds, 1),
        "torch_threads": torch.get_num_threads(),
        "library_rev": os.environ.get("STUDY_REV", "working tree"),
    }
    del loader
    return result


def machine_cpu() -> tuple[float, float, float]:
    """(time, CPU seconds busy on the whole machine, CPU seconds of this process and its children).

    Linux /proc only (zeros elsewhere); the difference between two readings tells how much of
    the machine other work took meanwhile (``other_cpu``).
    """
    try:
        hz = os.sysconf("SC_CLK_TCK")
        f = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
        busy = (sum(f) - f[3] - f[4]) / hz  # all but idle and iowait
        pids = {os.getpid()}
        for task in Path("/proc/self/task").iterdir():
            pids.update(int(c) for c in (task / "children").read_text().split())
        ours = 0.0
        for pid in pids:
            try:
                stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:  # a child that ended meanwhile
                continue
            ours += (int(stat[11]) + int(stat[12]) + int(stat[13]) + int(stat[14])) / hz
        return time.monotonic(), busy, ours
    except (OSError, ValueError):
        return time.monotonic(), 0.0, 0.0


def other_cpu(a: tuple[float, float, float], b: tuple[float, float, float]) -> float:
    """Fraction of the machine's cores other processes kept busy between readings ``a`` and ``b``."""
    span = (b[0] - a[0]) * (os.cpu_count() or 1)
    return max(0.0, (b[1] - a[1]) - (b[2] - a[2])) / span if span > 0 else 0.0


def _set_lr(opts: list, lr: float) -> None:
    for o in opts:
        for g in o.param_groups:
            g["lr"] = lr


def _select_text(x: Any, idx: Any) -> Any:
    import torch

    ids, offsets = x
    ends = torch.cat([offsets[1:], torch.tensor([len(ids)])])
    parts = [ids[offsets[i] : ends[i]] for i in idx.tolist()]
    lens = torch.tensor([len(p) for p in parts])
    return torch.cat(parts), torch.cat([torch.tensor([0]), lens.cumsum(0)[:-1]])


# ------------------------------------------------------------------------------ settings
def run_id(ds: str, cfg: dict, seed: int) -> str:
    p = "-".join(f"{k}{v}" for k, v in sorted(cfg["params"].items())) or "default"
    return f"{ds}-{'noisy' if cfg['noisy'] else 'clean'}-{cfg['policy']}-{cfg['label']}-{p}-s{seed}"


def calibrate(ds: Dataset, full_run: Path, population: Any, epochs: int | None = None) -> dict:
    """InfoBatch and SeTa settings whose pruned % lands nearest 30/50/70%, chosen on training losses.

    Replays the policy over the per-epoch losses that the full-data run of seed 0 recorded
    (plan of epoch e sees the losses of epoch e-1) for a grid of settings, and takes per
    level the setting whose simulated pruned % is nearest. Pruned runs see stale losses for
    samples they skipped, so the measured % differs somewhat; the report shows the measured one.
    """
    import pyarrow.parquet as pq

    from seta_stream.ids import sample_uids

    n_epochs = epochs or ds.epochs
    from seta_stream.policies import PolicyInput, run_policy

    shards = population.column("shard")
    keys = population.column("key")
    uid = sample_uids(shards, keys)
    order = np.argsort(uid)
    per_epoch = []
    for e in range(n_epochs):
        files = sorted(glob.glob(str(full_run / f"losses/rank=0/epoch={e}/*.parquet")))
        t = (
            pq.read_table(files[0])
            if len(files) == 1
            else __import__("pyarrow").concat_tables([pq.read_table(f) for f in files])
        )
        u = sample_uids(t.column("shard"), t.column("key"))
        loss = np.full(len(uid), np.nan, np.float32)
        pos = order[np.searchsorted(uid[order], u)]
        loss[pos] = t.column("loss").to_numpy(zero_copy_only=False)
        per_epoch.append(loss)
    n = len(uid)

    def simulate(policy: str, params: dict) -> float:
        kept = 0
        for e in range(n_epochs):
            last = per_epoch[e - 1] if e else np.full(n, np.nan, np.float32)
            seen = np.isfinite(last).astype(np.int32)
            inp = PolicyInput(uid=uid, last_loss=last, ema=last.astype(np.float64), seen=seen,
                              last_epoch=np.where(seen > 0, e - 1, -1).astype(np.int32), epoch=e, epochs=n_epochs,
                              seed=0)  # fmt: skip
            kept += int(run_policy(policy, inp, **params).keep.sum())
        return 1 - kept / (n * n_epochs)

    grids = {
        "infobatch": [dict(r=r) for r in (0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)],
        "seta": [
            dict(r=r, k=k, alpha=a)
            for r in (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6)
            for k in (5, 10)
            for a in (0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)
        ],
    }
    chosen: dict[str, Any] = {"source": str(full_run.name), "levels": {}}
    for policy, grid in grids.items():
        sims = [(simulate(policy, p), p) for p in grid]
        for level in LEVELS:
            # nearest; among near-equal (within 2 points) prefer the paper's ranges: small r, k=5
            best = min(sims, key=lambda s: (round(abs(s[0] - level) / 0.02), s[1].get("r", 0), s[1].get("k", 0)))
            chosen["levels"].setdefault(policy, {})[f"{int(level * 100)}"] = {"params": best[1], "simulated": best[0]}
    return chosen


def configs(calibration: dict | None) -> list[dict]:
    out: list[dict] = [{"policy": "full", "params": {}, "label": "full", "noisy": False}]
    for policy in ("random", "static"):
        out += [{"policy": policy, "params": {"r": lv}, "label": f"p{int(lv * 100)}", "noisy": False} for lv in LEVELS]
    for policy in ("infobatch", "seta"):
        chosen: list[dict] = []
        for lv in LEVELS:
            if calibration is None:
                continue
            p = calibration["levels"][policy][f"{int(lv * 100)}"]["params"]
            if p in chosen:  # e.g. InfoBatch's largest r serves two levels: one run, not two
                continue
            chosen.append(p)
            out.append({"policy": policy, "params": p, "label": f"p{int(lv * 100)}", "noisy": False})
    out += [{"policy": p, "params": {}, "label": "default", "noisy": False} for p in ("es", "eswp")]

    def noisy_too(c: dict) -> bool:  # InfoBatch and SeTa run with label noise at their 50% setting
        if c["policy"] in ("infobatch", "seta"):
            return calibration is not None and c["params"] == calibration["levels"][c["policy"]]["50"]["params"]
        return c["policy"] in ("full", "es", "eswp")

    return out + [{**c, "noisy": True} for c in out if noisy_too(c)]


# ------------------------------------------------------------------------------ study
def load_results() -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(RESULTS.glob("*-s[0-9]*.json"))]


DEFAULT_ORDER = "cifar10:0,sst2:0-1,cifar10:1,sst2:2-4"


def _order(spec: str, datasets: list[str]) -> list[tuple[str, list[int]]]:
    """'cifar10:0,sst2:0-1' -> [('cifar10', [0]), ('sst2', [0, 1])], keeping only ``datasets``."""
    out = []
    for item in spec.split(","):
        name, _, seeds = item.partition(":")
        lo, _, hi = seeds.partition("-")
        if name in datasets:
            out.append((name, list(range(int(lo), int(hi or lo) + 1))))
    return out


def study(args: argparse.Namespace) -> None:
    import torch
    from tqdm import tqdm

    from seta_stream.listing import list_samples

    torch.set_num_threads(args.threads)
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = Path(args.out)
    wanted = [d for d in args.datasets.split(",") if d]
    order = _order(args.order, wanted)
    if args.seeds:
        order = [(name, list(range(args.seeds))) for name in wanted]
    loaded: dict[str, tuple[Dataset, Any]] = {}
    done = {p.stem for p in RESULTS.glob("*.json")}
    full = {"policy": "full", "params": {}, "label": "full", "noisy": False}
    bar = tqdm(desc="runs", unit="run")
    # rounds (data set, seeds): every configuration of a round before the next round, so an
    # interrupted study has whole seeds of each data set rather than a few configurations
    for name, seeds in order:
        if name not in loaded:
            ds: Dataset = {"cifar10": Cifar, "sst2": Sst2}[name](Path(args.data), out)
            ds.prepare()
            if args.smoke:  # every code path on one shard for 3 epochs (results are meaningless)
                ds.train, ds.epochs = ds.train[:1], 3
            loaded[name] = (ds, list_samples(ds.train))
        ds, population = loaded[name]
        _one(ds, full, 0, out, population, done, bar, args)  # the calibration needs it
        cal_path = RESULTS / f"{name}-calibration.json"
        if not cal_path.exists():
            cal = calibrate(ds, out / "runs" / run_id(name, full, 0), population)
            cal_path.write_text(json.dumps(cal, indent=1))
        cal = json.loads(cal_path.read_text())
        todo = configs(cal)
        if args.only:
            todo = [c for c in todo if re.search(args.only, run_id(name, c, 0))]
        for seed in seeds:
            for cfg in todo:
                _one(ds, cfg, seed, out, population, done, bar, args)
        report(out / "runs")
    bar.close()


def _one(ds: Dataset, cfg: dict, seed: int, out: Path, population: Any, done: set, bar: Any, args: Any) -> None:
    rid = run_id(ds.name, cfg, seed)
    if rid in done:
        return
    print(f"== {rid}", flush=True)
    try:
        result = train_run(ds, cfg, seed, out, population)
    except Exception:  # one broken configuration must not stop a study of hours; it is rerun next time
        import traceback

        traceback.print_exc()
        print(f"   -> FAILED: {rid} (no result written)", flush=True)
        return
    (RESULTS / f"{rid}.json").write_text(json.dumps(result, indent=1))
    done.add(rid)
    bar.update(1)
    print(
        f"   -> pruned {100 * result['pruned']:.1f}% (backprop {100 * result['pruned_backprop']:.1f}%), "
        f"val {100 * result['val_acc']:.2f}%, test {100 * result['test_acc']:.2f}%, {result['seconds']:.0f}s",
        flush=True,
    )
    if not args.keep_runs and seed != 0:  # seed 0 run directories stay for inspection (a few MB each)
        shutil.rmtree(out / "runs" / rid, ignore_errors=True)


# ------------------------------------------------------------------------------ converged study
CONVERGED_E = 36  # full data's test accuracy at E within 0.5 point of 2E (docs/quality.md says how it was chosen)


def conv_results_dir() -> Path:
    return RESULTS / "converged"


def conv_cfg(E: int, policy: str, params: dict, label: str, n_epochs: int | None = None) -> dict:
    return {"policy": policy, "params": params, "label": label, "noisy": False, "study": "converged",
            "E": E, "n_epochs": n_epochs or E}  # fmt: skip


def conv_full(E: int, n: int) -> dict:
    return conv_cfg(E, "full", {}, f"e{n}", n)


def conv_run_id(cfg: dict, seed: int) -> str:
    p = "-".join(f"{k}{v}" for k, v in sorted(cfg["params"].items())) or "default"
    return f"cifar10-E{cfg['E']}-{cfg['policy']}-{cfg['label']}-{p}-s{seed}"


def conv_pruned(E: int, cal: dict) -> list[dict]:
    """Pruned runs at E in the order they are most informative: SeTa and dynamic random side by
    side at 30/50/70%, InfoBatch near 30%, SeTa with target_keep 0.5 (its 50% setting's r, k, alpha)."""
    out = []
    for lv in ("30", "50", "70"):
        out.append(conv_cfg(E, "seta", cal["levels"]["seta"][lv]["params"], f"p{lv}"))
        out.append(conv_cfg(E, "random", {"r": int(lv) / 100}, f"p{lv}"))
    out.append(conv_cfg(E, "infobatch", cal["levels"]["infobatch"]["30"]["params"], "p30"))
    tk = dict(cal["levels"]["seta"]["50"]["params"])
    tk["target_keep"] = min(0.5, round(1 - tk.get("r", 0.0), 6))
    out.append(conv_cfg(E, "seta", tk, "p50tk"))
    return out


def equal_compute_epochs(E: int, pruned: list[float]) -> list[int]:
    """round(E (1 - p)) for each measured pruned fraction p, distinct, longest first, E itself left out."""
    return sorted({round(E * (1 - p)) for p in pruned} - {E, 0}, reverse=True)


def converged_study(args: argparse.Namespace) -> None:
    """Full data at E and 2E, the pruned runs at E, the equal-compute full-data runs; seed by seed."""
    import torch

    from seta_stream.listing import list_samples

    torch.set_num_threads(args.threads)
    res_dir = conv_results_dir()
    res_dir.mkdir(parents=True, exist_ok=True)
    out = Path(args.out)
    ds = Cifar(Path(args.data), out)
    ds.prepare()
    E = args.epochs or CONVERGED_E
    if args.smoke:  # every code path on one shard (results are meaningless)
        ds.train, E = ds.train[:1], args.epochs or 3
    population = list_samples(ds.train)
    done = {p.stem for p in res_dir.glob("*.json")}

    def one(cfg: dict, seed: int) -> dict | None:
        rid = conv_run_id(cfg, seed)
        path = res_dir / f"{rid}.json"
        if rid not in done and not (args.only and not re.search(args.only, rid)):
            print(f"== {rid}", flush=True)
            try:
                result = train_run(ds, cfg, seed, out, population, rid)
            except Exception:  # one broken configuration must not stop a study of hours; rerun next time
                import traceback

                traceback.print_exc()
                print(f"   -> FAILED: {rid} (no result written)", flush=True)
                return None
            path.write_text(json.dumps(result, indent=1))
            done.add(rid)
            print(f"   -> pruned {100 * result['pruned']:.1f}%, test {100 * result['test_acc']:.2f}%, "
                  f"{result['seconds']:.0f}s", flush=True)  # fmt: skip
            if not args.keep_runs and seed != 0:
                shutil.rmtree(out / "runs" / rid, ignore_errors=True)
        return json.loads(path.read_text()) if path.exists() else None

    for seed in range(args.seeds or 2):
        one(conv_full(E, E), seed)
        if seed == 0:
            one(conv_full(E, 2 * E), 0)  # the convergence check (one seed)
        cal_path = res_dir / f"cifar10-E{E}-calibration.json"
        if not cal_path.exists():
            full_dir = out / "runs" / conv_run_id(conv_full(E, E), 0)
            if not (full_dir / "state.json").exists():
                raise SystemExit(f"{full_dir}: the calibration needs the run directory of full data at E, seed 0")
            cal_path.write_text(json.dumps(calibrate(ds, full_dir, population, E), indent=1))
        cal = json.loads(cal_path.read_text())
        pruned = conv_pruned(E, cal)
        for cfg in pruned:
            one(cfg, seed)
        # the equal-compute baseline: from seed 0's measured pruned % (the same epochs for every seed)
        measured = [json.loads(p.read_text())["pruned"] for c in pruned
                    if (p := res_dir / f"{conv_run_id(c, 0)}.json").exists()]  # fmt: skip
        for n in equal_compute_epochs(E, measured):
            one(conv_full(E, n), seed)


# ------------------------------------------------------------------------------ report
def _group(results: list[dict]) -> dict[tuple, list[dict]]:
    groups: dict[tuple, list[dict]] = {}
    for r in results:
        key = (r["dataset"], r["noisy"], r["policy"], r["label"], json.dumps(r["params"], sort_keys=True))
        groups.setdefault(key, []).append(r)
    return groups


ORDER = {"full": 0, "random": 1, "static": 2, "infobatch": 3, "seta": 4, "es": 5, "eswp": 6}


def _vs_random(groups: dict, dataset: str, rs: list[dict]) -> str:
    """Test accuracy minus dynamic random's (clean labels), linearly interpolated at the same
    measured pruned % (ES/ESWP: back-propagated %) between random's points and full data (0%)."""
    pts = [(0.0, groups.get((dataset, False, "full", "full", "{}")))]
    pts += [(r[0]["pruned"], r) for k, r in groups.items() if k[:3] == (dataset, False, "random")]
    pts = sorted((x, float(np.mean([r["test_acc"] for r in g]))) for x, g in pts if g)
    policy = rs[0]["policy"]
    if len(pts) < 2 or policy in ("full", "random") or rs[0]["noisy"]:  # random runs have clean labels
        return "-"
    x = float(np.mean([r["pruned_backprop" if policy in ("es", "eswp") else "pruned"] for r in rs]))
    if not pts[0][0] <= x <= pts[-1][0]:
        return "-"
    ref = float(np.interp(x, [p[0] for p in pts], [p[1] for p in pts]))
    return f"{100 * (float(np.mean([r['test_acc'] for r in rs])) - ref):+.2f}"


def _fmt_params(p: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(p.items())) or "defaults"


def _ms(xs: list[float], scale: float = 100.0, digits: int = 2) -> str:
    a = np.asarray(xs) * scale
    return f"{a.mean():.{digits}f} ± {a.std(ddof=1):.{digits}f}" if len(a) > 1 else f"{a.mean():.{digits}f}"


def report(runs: Path | None = None) -> None:
    results = load_results()
    if not results:
        return
    if runs is not None and runs.exists():  # the checks need the kept run directories (seed 0)
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from quality_checks import run_checks

        (RESULTS / "checks.json").write_text(json.dumps(run_checks(runs, results), indent=1))
    groups = _group(results)
    lines = []
    for dataset in ("cifar10", "sst2"):
        for noisy in (False, True):
            keys = sorted((k for k in groups if k[0] == dataset and k[1] == noisy), key=lambda k: (ORDER[k[2]], k[3]))
            if not keys:
                continue
            full = groups.get((dataset, noisy, "full", "full", "{}"))
            full_s = np.min([r["seconds"] for r in full]) if full else None
            title = f"{dataset}, {'40% noisy labels' if noisy else 'clean labels'}"
            lines += [f"### {title}", ""]
            lines += [
                "| policy | setting | seeds | pruned % (measured) | back-propagated pruned % | test acc % "
                "| val acc % | wall s (fastest seed) | time vs full | test acc vs dynamic random at that pruned % |",
                "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
            ]
            for k in keys:
                rs = groups[k]
                secs = float(np.min([r["seconds"] for r in rs]))  # other work on the VM only adds time
                cells = [
                    k[2],
                    _fmt_params(rs[0]["params"]),
                    str(len(rs)),
                    _ms([r["pruned"] for r in rs], digits=1),
                    _ms([r["pruned_backprop"] for r in rs], digits=1),
                    _ms([r["test_acc"] for r in rs]),
                    _ms([r["val_acc"] for r in rs]),
                    f"{secs:.0f}",
                    f"{secs / full_s:.2f}" if full_s else "-",
                    _vs_random(groups, dataset, rs),
                ]
                lines.append("| " + " | ".join(cells) + " |")
            lines.append("")
            kept_lines = [
                "| policy | setting | " + " | ".join(f"e{e}" for e in range(len(groups[keys[0]][0]["epochs"]))) + " |"
            ]
            kept_lines.append("| --- | --- |" + " --- |" * len(groups[keys[0]][0]["epochs"]))
            for k in keys:
                r = groups[k][0]
                kept_lines.append(
                    f"| {k[2]} | {_fmt_params(r['params'])} | "
                    + " | ".join(f"{e['kept'] / e['n']:.2f}" for e in r["epochs"])
                    + " |"
                )
            lines += [f"Kept fraction per epoch (plan of seed {groups[keys[0]][0]['seed']}):", ""] + kept_lines + [""]
            _plot(dataset, noisy, groups, keys)
            lines += [f"![{title}](quality/{dataset}-{'noisy' if noisy else 'clean'}.png)", ""]
    cal = []
    for p in sorted(RESULTS.glob("*-calibration.json")):
        c = json.loads(p.read_text())
        for policy, levels in c["levels"].items():
            for lv, v in levels.items():
                data = p.name.split("-")[0]
                cal.append(f"| {data} | {policy} | {lv}% | {_fmt_params(v['params'])} | {100 * v['simulated']:.1f} |")
    if cal:
        lines += [
            "### Settings chosen for the pruned levels (on training losses, `calibrate`)",
            "",
            "| data | policy | level | setting | simulated pruned % |",
            "| --- | --- | --- | --- | --- |",
            *cal,
            "",
        ]
    checks_path = RESULTS / "checks.json"
    if checks_path.exists():
        c = json.loads(checks_path.read_text())
        lines += [
            "### Checks of the runs against algorithms.md (`benchmarks/quality_checks.py`)",
            "",
            f"{c['runs_checked']} result files (loader delivered exactly the planned samples in every epoch) and "
            f"{len(c['run_dirs_checked'])} run directories of seed 0 (plan rules, window sequence, weights, "
            "losses landing on their own keys): "
            + (f"**{len(c['problems'])} problems**:" if c["problems"] else "no problem found."),
            "",
            *[f"* {x}" for x in c["problems"][:50]],
            "",
        ]
    text = DOC.read_text() if DOC.exists() else f"# Accuracy under pruning\n\n{BEGIN}\n{END}\n"
    head, _, rest = text.partition(BEGIN)
    _, _, tail = rest.partition(END)
    DOC.write_text(head + BEGIN + "\n" + "\n".join(lines) + "\n" + END + tail)


def _plot(dataset: str, noisy: bool, groups: dict, keys: list) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.5))
    by_policy: dict[str, list] = {}
    for k in keys:
        rs = groups[k]
        x = np.mean([r["pruned_backprop" if k[2] in ("es", "eswp") else "pruned"] for r in rs]) * 100
        y = np.array([r["test_acc"] for r in rs]) * 100
        by_policy.setdefault(k[2], []).append((x, y.mean(), y.std(ddof=1) if len(y) > 1 else 0.0))
    for policy, pts in sorted(by_policy.items(), key=lambda kv: ORDER[kv[0]]):
        pts.sort()
        a.errorbar(
            [p[0] for p in pts], [p[1] for p in pts], yerr=[p[2] for p in pts], marker="o", capsize=3, label=policy
        )
    a.set_xlabel("measured pruned % (ES/ESWP: back-propagated)")
    a.set_ylabel("test accuracy %")
    a.set_title(f"{dataset}, {'40% noisy labels' if noisy else 'clean'}: accuracy vs pruned")
    a.grid(alpha=0.3)
    a.legend(fontsize=8)
    for k in keys:
        r = groups[k][0]
        b.plot([e["epoch"] for e in r["epochs"]], [e["kept"] / e["n"] for e in r["epochs"]], marker=".",
               label=f"{k[2]} {_fmt_params(r['params'])}")  # fmt: skip
    b.set_xlabel("epoch")
    b.set_ylabel("kept fraction (plan)")
    b.set_title("kept fraction per epoch")
    b.grid(alpha=0.3)
    b.legend(fontsize=6, ncol=2)
    fig.tight_layout()
    (DOC.parent / "quality").mkdir(exist_ok=True)
    fig.savefig(DOC.parent / "quality" / f"{dataset}-{'noisy' if noisy else 'clean'}.png", dpi=90)
    plt.close(fig)


def main() -> None:
    global RESULTS, DOC
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", default=str(ROOT.parent / "shared" / "data"))
    p.add_argument("--out", default=str(ROOT / "bench-out" / "quality"))
    p.add_argument("--datasets", default="sst2,cifar10")
    p.add_argument("--seeds", type=int, default=0, help="seeds 0..N-1 for every data set (default: --order)")
    p.add_argument("--order", default=DEFAULT_ORDER, help=f"rounds of data set:seeds (default {DEFAULT_ORDER})")
    p.add_argument("--only", help="regex over run ids: run only the matching configurations")
    p.add_argument("--threads", type=int, default=1, help="torch threads of the training process")
    p.add_argument("--keep-runs", action="store_true", help="keep every run directory (default: seed 0 only)")
    p.add_argument("--results", default=str(RESULTS), help="folder of the per-run JSON files")
    p.add_argument("--report-only", action="store_true")
    p.add_argument("--smoke", action="store_true", help="one shard, 3 epochs: checks the code paths only")
    p.add_argument("--study", choices=("short", "converged"), default="short",
                   help="short: every policy at 6 (CIFAR-10) / 5 (SST-2) epochs; converged: CIFAR-10 at E and "
                        "the equal-compute baseline")  # fmt: skip
    p.add_argument("--epochs", type=int, default=0, help=f"converged study: E (default {CONVERGED_E})")
    args = p.parse_args()
    RESULTS = Path(args.results).resolve()
    DOC = RESULTS.parent / "quality.md"
    if args.report_only:
        report(Path(args.out) / "runs")
        return
    if args.study == "converged":
        converged_study(args)
        return
    study(args)


if __name__ == "__main__":
    main()
