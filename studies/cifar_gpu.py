"""CIFAR-10 with noisy labels, ResNet-18 on one GPU: the noise rule against the baselines.

Issue 33's device check. The data are the real CIFAR-10 shards (``../shared/data/cifar10``):
train shards 0-8 (45,000 images) train, train shard 9 (5,000) is the held-out validation split,
the 10,000 test images the test split (``studies.quality.data``'s splits). Two kinds of label
noise, fixed before any run and seeded by key hash (``studies.quality.data``): ``sym40``, 40%
of the labels replaced by another class (``noise_offsets``), and ``asym40``, 40% of each of
truck, bird, deer, cat, dog flipped to automobile, airplane, horse, dog, cat
(``asymmetric_offsets``, 20% of all labels). The validation split carries the same noise as the
training split (a practitioner's held-out split is drawn from the same noisy source); the test
labels are clean.

Methods, paired by seed (the same initialisation and the same data order where the kept sets
agree), every one through ``seta_stream.Pruner`` (record every loss, compact and plan every epoch):

* ``full``: full data; its test accuracy at the last epoch and at the epoch of best validation
  accuracy (early stopping on the noisy validation split; ties: the earlier epoch);
* ``rule``: the noise rule alone (policy ``full``, ``noise=True``, its defaults);
* ``oracle``: full data without the known noisy samples (the ceiling of a perfect detector);
* ``dynrand``: dynamic random (``random``) with ``r`` = the rule's measured pruned fraction of
  the same seed (the same number of samples trained);
* ``equal``: full data at equal compute: its schedule (warm-up, cosine) over exactly the number
  of samples the rule trained in the same seed, the last epoch cut where the budget ends;
* ``cleanlab``: cleanlab as its documentation recommends: out-of-sample predicted
  probabilities by K-fold cross-validation (``clfold<k>`` jobs: the same model and schedule
  trained on the other K-1 folds; the folds stratified by the noisy label and shuffled, per seed,
  as cleanlab makes them: :func:`fold_of`), ``cleanlab.filter.find_label_issues`` with its
  defaults, then full data on what it keeps; its compute is the K fold trainings plus the final
  one.

Training: SGD (Nesterov, momentum 0.9, weight decay 5e-4), batch 512, peak lr 0.2, warm-up over
the first 10% then cosine to 0, random crop (4-pixel zero padding) and horizontal flip on the
GPU, bf16 autocast, channels-last. The images sit decoded in GPU memory; every epoch the plan's
kept keys select them (the plan, the weights and the recorded losses are the library's; the
filter stage in a webdataset pipeline is not what this measures). Every step divides the
weighted loss sum by the nominal batch size (``seta.weighted_mean(..., batch_size=B)``), the
small-final-batch remedy.

Jobs run ``--jobs`` at a time on the one GPU in priority order, each in its own process; a job
whose inputs are not in yet (``dynrand``, ``equal``: the rule's run; ``cleanlab``: its folds)
waits. At ``--deadline`` seconds the running jobs are stopped: a stopped run keeps its epochs so
far and is marked ``cut``. Every finished epoch is in ``OUT/results.json`` (all runs, rewritten
whole after every change) and ``OUT/log.txt``.

    python -m studies cifar_gpu --data ../shared/data/cifar10 --out bench-out/cifar-gpu --jobs 4 --deadline 520
    python -m studies cifar_gpu --smoke --out bench-out/cifar-gpu-smoke      # CPU, tiny, the code paths
    python -m studies cifar_gpu --report docs/quality-runs/cifar-gpu/results.json   # docs/cifar-gpu.md
"""

from __future__ import annotations

import argparse
import glob
import io
import json
import math
import os
import re
import signal
import subprocess
import sys
import tarfile
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from studies.quality import instability
from studies.quality.data import asymmetric_offsets, noise_offsets
from studies.quality.layout import child_env, python_m
from studies.quality.pairs import auc_of
from tools import draws
from tools.results import argv_labels, gap_verdict, path_label, precision_recall, rule_targets, write_json

ROOT = Path(__file__).resolve().parent.parent
#: how an invocation ran this study, recorded with it (``program``); one recorded before that field was
#: added ran the study under its earlier path
PROGRAM = "python -m studies cifar_gpu"
EARLIER_PROGRAM = "python benchmarks/cifar_gpu.py"
B, LR, WD, EPOCHS, FOLDS = 512, 0.2, 5e-4, 15, 4
#: the training settings of a job (the GPU study's); a CPU study passes its own (--batch, --lr, --threads)
TRAIN = {"batch": B, "lr": LR, "threads": 2}
SEEDS = (0, 1)
KINDS = ("sym40", "asym40")
MEAN = np.array([0.4914, 0.4822, 0.4465], dtype=np.float32)
STD = np.array([0.2470, 0.2435, 0.2616], dtype=np.float32)


# ------------------------------------------------------------------------------------ data
def _decode_shard(url: str, limit: int | None = None) -> tuple[list[str], list[int], np.ndarray]:
    """Keys, labels and decoded images of one shard (its first ``limit`` samples)."""
    from PIL import Image

    keys, labels, images = [], [], []
    with tarfile.open(url, "r:*") as tar:
        members: dict[str, dict[str, bytes]] = {}
        for m in tar:
            if not m.isfile():
                continue
            key, _, ext = m.name.rpartition("/")[2].partition(".")
            if limit is not None and key not in members and len(members) == limit + 1:
                break  # the sample before this one is complete: limit + 1 read, the last maybe partial
            members.setdefault(key, {})[ext] = tar.extractfile(m).read()
    for key, fields in list(members.items())[:limit]:
        keys.append(key)
        labels.append(int(fields["cls"].decode()))
        images.append(np.asarray(Image.open(io.BytesIO(fields["jpg"])).convert("RGB"), dtype=np.uint8))
    return keys, labels, np.stack(images)


def prepare(data: str, cache: Path, limit: int | None = None) -> None:
    """Decode every shard once into ``cache`` (npz) with the population listing of the train split."""
    if cache.exists():
        return
    import multiprocessing as mp

    import seta_stream as seta
    from seta_stream.ids import shard_name

    shards = sorted(glob.glob(os.path.join(data, "train-*.tar.gz")))
    tests = sorted(glob.glob(os.path.join(data, "test-*.tar.gz")))
    if len(shards) != 10 or len(tests) != 2:
        raise SystemExit(f"{data}: expected 10 train-*.tar.gz and 2 test-*.tar.gz shards (../shared/data/cifar10)")
    with mp.get_context("fork").Pool(min(12, os.cpu_count() or 1)) as pool:
        decoded = pool.starmap(_decode_shard, [(u, limit) for u in shards + tests])
    out: dict[str, Any] = {}
    for split, parts, urls in (
        ("train", decoded[:9], shards[:9]),
        ("val", decoded[9:10], shards[9:10]),
        ("test", decoded[10:], tests),
    ):
        keys = [k for p in parts for k in p[0]]
        shard = [shard_name(u) for u, p in zip(urls, parts) for _ in p[0]]
        url = [u for u, p in zip(urls, parts) for _ in p[0]]
        x, y = np.concatenate([p[2] for p in parts]), np.array([v for p in parts for v in p[1]], dtype=np.int64)
        n = len(keys) if limit is None else min(limit, len(keys))
        out.update(
            {
                f"{split}_keys": np.array(keys[:n]),
                f"{split}_shard": np.array(shard[:n]),
                f"{split}_url": np.array(url[:n]),
                f"{split}_x": x[:n],
                f"{split}_y": y[:n],
            }
        )
    listed = seta.list_samples(shards[:9])  # the population as the library lists it
    got = set(zip(listed.column("shard").to_pylist(), listed.column("key").to_pylist()))
    if limit is None and got != set(zip(out["train_shard"].tolist(), out["train_keys"].tolist())):
        raise SystemExit("the decoded train split differs from seta.list_samples of its shards")
    cache.parent.mkdir(parents=True, exist_ok=True)
    tmp = cache.with_suffix(".tmp.npz")
    np.savez(tmp, **out)
    os.replace(tmp, cache)


def noisy_labels(kind: str, keys: np.ndarray, y: np.ndarray) -> np.ndarray:
    """The labels of ``kind`` for these keys: ``clean``; ``symNN``, NN% of the labels replaced by
    another class, the offset uniform (``noise_offsets``); ``asymNN``, NN% of each of truck, bird,
    deer, cat, dog flipped to automobile, airplane, horse, dog, cat (``asymmetric_offsets``)."""
    import pyarrow as pa

    y = y.copy()
    match = re.fullmatch(r"(clean|sym|asym)(\d*)", kind)
    if match is None or (match.group(1) == "clean") != (match.group(2) == ""):
        raise ValueError(f"unknown noise kind {kind!r}; expected clean, symNN or asymNN (NN: a percentage)")
    if kind == "clean":
        return y
    rate = int(match.group(2)) / 100
    pos = {k: i for i, k in enumerate(keys.tolist())}
    if match.group(1) == "sym":
        for k, off in noise_offsets(pa.table({"key": keys.tolist()}), 10, rate).items():
            y[pos[k]] = (y[pos[k]] + off) % 10
        return y
    for k, new in asymmetric_offsets(keys.tolist(), y.tolist(), rate).items():
        y[pos[k]] = new
    return y


def fold_of(keys: np.ndarray, labels: np.ndarray, folds: int, seed: int) -> np.ndarray:
    """Fold of every key for cleanlab's cross-validation of seed ``seed``: stratified by the
    (noisy) ``labels`` and shuffled as cleanlab makes its folds (``draws.stratified_folds``:
    ``StratifiedKFold(shuffle=True)`` with a random state of the seed, over the keys in sorted
    order)."""
    return draws.stratified_folds(keys.tolist(), labels.tolist(), folds, seed)


# ------------------------------------------------------------------------------------ jobs
def job_list(
    kinds: tuple[str, ...] = KINDS,
    seeds: tuple[int, ...] = SEEDS,
    epochs: int = EPOCHS,
    train: dict[str, Any] | None = None,
) -> list[dict]:
    """Every job in priority order: the rule against full data (early-stopped) and the oracle on
    both kinds of noise, then dynamic random and equal compute, then cleanlab, seed by seed.
    ``train``: the training settings every job carries (batch, lr, threads: :data:`TRAIN`)."""
    jobs: list[dict] = []
    settings = {**TRAIN, **(train or {})}

    def add(kind: str, method: str, seed: int, **extra: Any) -> None:
        jobs.append(
            {"id": f"{kind}-{method}-s{seed}", "kind": kind, "method": method, "seed": seed, "epochs": epochs,
             **settings, **extra}
        )  # fmt: skip

    for kind in kinds:
        for seed in seeds:
            for method in ("full", "rule", "oracle", "rulerand", "rule1"):
                add(kind, method, seed)
    for seed in seeds:
        for kind in kinds:
            add(kind, "dynrand", seed, needs=[f"{kind}-rule-s{seed}"])
            add(kind, "equal", seed, needs=[f"{kind}-rule-s{seed}"])
        for kind in kinds:
            for k in range(FOLDS):
                add(kind, f"clfold{k}", seed, fold=k)
            add(kind, "cleanlab", seed, needs=[f"{kind}-clfold{k}-s{seed}" for k in range(FOLDS)])
    return jobs


#: Random pruning's r on top of the rule (``rulerand``): the pairs studies' calibrated share
#: (docs/baselines.md), not tuned here.
RULE_RANDOM_R = 0.19


def _policy(job: dict, results: dict) -> tuple[str, dict]:
    m = job["method"]
    if m == "rule":
        return "full", {"noise": True, **job.get("rule_params", {})}
    if m == "rulerand":
        return "random", {"r": RULE_RANDOM_R, "noise": True, **job.get("rule_params", {})}
    if m == "rule1":  # the rule's first version (docs/algorithms.md §12.12), the failure it replaces
        return "full", {"noise": True, "noise_rule": 1}
    if m == "dynrand":
        rule = results[f"{job['kind']}-rule-s{job['seed']}"]
        return "random", {"r": round(rule["pruned"], 4)}
    return "full", {}


def history_auc(run_dir: str, pos: dict[str, int], noisy: np.ndarray) -> float | None:
    """The detection AUC of the rule's score after the epoch's compaction: each recorded
    sample's mean of its losses so far (the loss table's ``loss_mean``), noisy against clean
    (Mann-Whitney, ties at half); None where the table holds no noisy or no clean sample. Read
    for the report only, never by a run."""
    import seta_stream as seta

    t = seta.load_table(run_dir, columns=["key", "loss_mean"])
    mean = t.column("loss_mean").to_numpy(zero_copy_only=False)
    label = noisy[np.fromiter((pos[k] for k in t.column("key").to_pylist()), np.int64, t.num_rows)]
    ok = np.isfinite(mean)
    return auc_of(mean[ok], label[ok])


def _lr(p: float, peak: float = LR) -> float:
    """Warm-up over the first 10% of training, then cosine to 0; ``p`` in [0, 1]."""
    return peak * (p / 0.1 if p < 0.1 else 0.5 * (1 + math.cos(math.pi * min(1.0, (p - 0.1) / 0.9))))


def _augment(torch: Any, xb: Any, gen: Any) -> Any:
    """Random 32x32 crop of the 4-pixel zero-padded image and a horizontal flip, on the device."""
    n = xb.shape[0]
    padded = torch.nn.functional.pad(xb, (4, 4, 4, 4))
    oy = torch.randint(0, 9, (n,), device=xb.device, generator=gen)
    ox = torch.randint(0, 9, (n,), device=xb.device, generator=gen)
    ar = torch.arange(32, device=xb.device)
    iy, ix = (oy[:, None] + ar)[:, :, None], (ox[:, None] + ar)[:, None, :]
    out = padded[torch.arange(n, device=xb.device)[:, None, None], :, iy, ix].permute(0, 3, 1, 2)
    flip = torch.rand(n, device=xb.device, generator=gen) < 0.5
    return torch.where(flip[:, None, None, None], out.flip(3), out)


def run_job(job: dict, cache: Path, work: Path, results: dict, model_name: str, emit: Any) -> dict:
    import pyarrow as pa
    import torch
    import torch.nn.functional as F

    import seta_stream as seta
    from studies.quality.models import image_model

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    torch.backends.cudnn.benchmark = True
    batch, peak = job.get("batch", B), job.get("lr", LR)
    torch.set_num_threads(job.get("threads", 2) if dev == "cuda" else job.get("threads", 1))
    d = np.load(cache)
    kind, method, seed, epochs = job["kind"], job["method"], job["seed"], job["epochs"]
    keys, shard, url, y_true = d["train_keys"], d["train_shard"], d["train_url"], d["train_y"]
    y = noisy_labels(kind, keys, y_true)
    noisy = y != y_true
    val_y = noisy_labels(kind, d["val_keys"], d["val_y"])
    use = np.ones(len(keys), dtype=bool)  # the training population of this job
    if method == "oracle":
        use = ~noisy
    elif method.startswith("clfold"):
        use = fold_of(keys, y, FOLDS, seed) != job["fold"]
    elif method == "cleanlab":
        from cleanlab.filter import find_label_issues

        probs = np.zeros((len(keys), 10), dtype=np.float32)
        folds = fold_of(keys, y, FOLDS, seed)
        for k in range(FOLDS):
            probs[folds == k] = np.load(work / f"{kind}-clfold{k}-s{seed}.probs.npy")
        issues = find_label_issues(labels=y, pred_probs=probs)
        use = ~issues
    population = pa.table({"shard": shard[use].tolist(), "key": keys[use].tolist(), "url": url[use].tolist()})
    pos = {k: i for i, k in enumerate(keys.tolist())}
    policy, params = _policy(job, results)
    budget = None
    if method == "equal":
        budget = results[f"{kind}-rule-s{seed}"]["trained"]
        epochs = math.ceil(budget / int(use.sum()))
    run_dir = work / f"run-{job['id']}"
    if run_dir.exists():
        import shutil

        shutil.rmtree(run_dir)

    torch.manual_seed(seed)
    model = image_model(model_name).to(dev).to(memory_format=torch.channels_last)
    decay = [p for p in model.parameters() if p.ndim > 1]
    rest = [p for p in model.parameters() if p.ndim <= 1]
    opt = torch.optim.SGD(
        [{"params": decay, "weight_decay": WD}, {"params": rest, "weight_decay": 0.0}],
        lr=peak,
        momentum=0.9,
        nesterov=True,
    )
    mean = torch.tensor(MEAN, device=dev).view(1, 3, 1, 1) * 255
    std = torch.tensor(STD, device=dev).view(1, 3, 1, 1) * 255
    x_all = torch.from_numpy(d["train_x"]).to(dev).permute(0, 3, 1, 2).contiguous()
    y_all = torch.from_numpy(y).to(dev)
    evals = {
        name: (torch.from_numpy(d[f"{src}_x"]).to(dev).permute(0, 3, 1, 2).contiguous(), torch.from_numpy(lab).to(dev))
        for name, src, lab in (("val", "val", val_y), ("val_clean", "val", d["val_y"]), ("test", "test", d["test_y"]))
    }
    amp = torch.autocast(dev, dtype=torch.bfloat16, enabled=dev == "cuda")
    gen = torch.Generator(device=dev)
    gen.manual_seed(draws.seed_int(draws.GPU_AUGMENT, seed))  # crops and flips: a stream of their own

    def prep(xb: Any) -> Any:
        return ((xb.float() - mean) / std).contiguous(memory_format=torch.channels_last)

    def evaluate() -> dict:
        model.eval()
        out = {}
        with torch.no_grad(), amp:
            for name, (xe, ye) in evals.items():
                correct = sum(
                    int((model(prep(xe[i : i + 2000])).argmax(1) == ye[i : i + 2000]).sum())
                    for i in range(0, len(ye), 2000)
                )
                out[f"{name}_acc"] = correct / len(ye)
        model.train()
        return out

    pruner = seta.Pruner(
        str(run_dir), policy=policy, params=params, epochs=epochs, seed=seed, population=population, batch_size=batch
    )
    rows: list[dict] = []
    result = {
        **job,
        "policy": policy,
        "params": params,
        "population": int(use.sum()),
        "noisy_in_population": int((noisy & use).sum()),
        "rows": rows,
        "status": "running",
        "device": dev,
        "model": model_name,
        "dataset": "cifar10",
    }
    if method == "cleanlab":
        result.update(
            suspected=int(use.size - use.sum()),
            precision=float((noisy & ~use).sum() / max(1, (~use).sum())),
            recall=float((noisy & ~use).sum() / max(1, noisy.sum())),
        )
    if budget is not None:
        result["budget"] = budget
    seen_total, t_run = 0, time.perf_counter()
    rng = draws.generator(draws.GPU_ORDER, seed)  # the epochs' sample order
    for epoch in range(epochs):
        t0 = time.perf_counter()
        with warnings.catch_warnings(record=True) as caught:  # the remedy is applied below (weighted_mean)
            warnings.simplefilter("always")
            summary = pruner.start_epoch(epoch)
        for w in caught:
            if getattr(w.message, "code", None) != "small_final_batch":
                warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
        auc = history_auc(str(run_dir), pos, noisy)  # what the rule scores, against the known noise
        plan = seta.load_plan(str(run_dir), epoch, columns=["key", "keep", "weight", "reason"])
        keep = plan.column("keep").to_numpy(zero_copy_only=False)
        pkeys = np.asarray(plan.column("key").to_pylist(), dtype=object)
        reason = np.asarray(plan.column("reason").to_pylist(), dtype=object)
        weight = plan.column("weight").to_numpy(zero_copy_only=False)
        idx = np.array([pos[k] for k in pkeys[keep]], dtype=np.int64)
        w = weight[keep].astype(np.float32)
        suspected = np.array(
            [pos[k] for k in pkeys[(reason == "suspected_noise") | (reason == "noise_recheck")]], dtype=np.int64
        )
        order = rng.permutation(len(idx))
        idx, w = idx[order], w[order]
        if budget is not None:
            left = budget - seen_total
            idx, w = idx[:left], w[:left]
        steps = math.ceil(len(idx) / batch)
        idx_dev, w_dev = torch.from_numpy(idx).to(dev), torch.from_numpy(w).to(dev)
        losses = torch.empty(len(idx), device=dev)
        for s in range(steps):
            sl = slice(s * batch, (s + 1) * batch)
            if budget is not None:
                p = (seen_total + s * batch) / budget
            else:
                p = (epoch + s / steps) / epochs
            for g in opt.param_groups:
                g["lr"] = _lr(p, peak)
            bi = idx_dev[sl]
            with amp:
                logits = model(prep(_augment(torch, x_all[bi], gen)))
            per = F.cross_entropy(logits.float(), y_all[bi], reduction="none")
            opt.zero_grad(set_to_none=True)
            seta.weighted_mean(per, w_dev[sl], batch_size=batch).backward()
            opt.step()
            losses[sl] = per.detach()
        lo = losses.cpu().numpy()
        for s in range(0, len(idx), 8192):
            j = idx[s : s + 8192]
            pruner.record(keys[j].tolist(), url[j].tolist(), lo[s : s + 8192])
        seen_total += len(idx)
        if dev == "cuda":
            torch.cuda.synchronize()
        train_s = time.perf_counter() - t0
        metrics = evaluate()
        tp = int(noisy[suspected].sum())
        rows.append(
            {
                "epoch": epoch,
                "kept": int(summary["kept"]),
                "n": int(summary["n"]),
                "trained": len(idx),
                "learnt": int((w > 0).sum()),
                "noisy_trained": int(noisy[idx].sum()),
                "noisy_learnt": int((noisy[idx] & (w > 0)).sum()),
                "suspected": int(len(suspected)),
                "precision": tp / len(suspected) if len(suspected) else None,
                "recall": tp / max(1, int((noisy & use).sum())),
                "auc": auc,
                "loss": float(lo.mean()) if len(lo) else None,
                **{k: v for k, v in summary.items() if k.startswith("noise")},
                **metrics,
                "train_s": round(train_s, 2),
            }
        )
        result.update(
            trained=seen_total,
            pruned=1 - seen_total / (int(use.sum()) * (epoch + 1)),
            seconds=round(time.perf_counter() - t_run, 1),
        )
        emit(result)
        if budget is not None and seen_total >= budget:
            break
    pruner.close()
    result["status"] = "done"
    if method.startswith("clfold"):  # out-of-sample predicted probabilities of the held-out fold
        model.eval()
        held = np.flatnonzero(fold_of(keys, y, FOLDS, seed) == job["fold"])
        probs = []
        with torch.no_grad(), amp:
            for s in range(0, len(held), 2000):
                xb = x_all[torch.from_numpy(held[s : s + 2000]).to(dev)]
                probs.append(torch.softmax(model(prep(xb)).float(), 1).cpu().numpy())
        np.save(work / f"{job['id']}.probs.npy", np.concatenate(probs))
    emit(result)
    return result


# ------------------------------------------------------------------------------------ manager
def manage(args: argparse.Namespace) -> None:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    log = open(out / "log.txt", "a", buffering=1)

    def say(line: str) -> None:
        print(line, flush=True)
        log.write(line + "\n")

    t_start = time.time()
    cache = work / "cifar10.npz"
    prepare(args.data, cache, limit=args.limit)
    say(f"prepared {path_label(cache)} in {time.time() - t_start:.1f}s")  # no folder of this machine in the log
    train = {"batch": args.batch, "lr": args.lr, "threads": args.threads}
    if args.rule_params:
        train["rule_params"] = json.loads(args.rule_params)
    jobs = job_list(tuple(args.kinds.split(",")), tuple(int(s) for s in args.seeds.split(",")), args.epochs, train)
    if args.only:
        jobs = [j for j in jobs if re.search(args.only, j["id"])]
    results: dict[str, dict] = {}
    before: dict = {}
    if (out / "results.json").exists():
        before = json.loads((out / "results.json").read_text())
        results = before["runs"]
    # this invocation, as every run it starts records it (``runs[id]["invocation"]``); meta keeps the list
    invocation = {"commit": args.commit, "program": PROGRAM, "argv": argv_labels(sys.argv[1:]),
                  "started": time.strftime("%Y-%m-%d %H:%M")}  # fmt: skip
    started_here: set[str] = set()
    meta = {
        "noise_draws": draws.VERSION,  # the noise and folds of tools/draws.py's keyed hash (superseded_note)
        "commit": args.commit,  # the last invocation's; each run's own: runs[id]["invocation"]
        "program": PROGRAM,
        "argv": invocation["argv"],
        "invocations": [*before.get("meta", {}).get("invocations", []), invocation],
        **train,
        "weight_decay": WD,
        "folds": FOLDS,
        "model": args.model,
    }
    try:
        import torch

        meta.update(torch=torch.__version__, gpu=torch.cuda.get_device_name(0) if torch.cuda.is_available() else None)
    except ImportError:
        pass

    def save() -> None:
        for f in work.glob("*.result.json"):
            try:
                r = json.loads(f.read_text())
            except ValueError:
                continue
            stamp = invocation if r["id"] in started_here else results.get(r["id"], {}).get("invocation")
            results[r["id"]] = {**r, **({"invocation": stamp} if stamp else {})}
        tmp = out / "results.json.tmp"
        tmp.write_text(json.dumps({"meta": meta, "runs": results}, indent=1))
        os.replace(tmp, out / "results.json")

    # runs the work folder finished before (another invocation's, or a copied work folder's) count as
    # done from the start: a job whose input is one of them is ready, not "an input failed"
    for f in work.glob("*.result.json"):
        try:
            r = json.loads(f.read_text())
        except ValueError:
            continue
        if r.get("status") == "done" and results.get(r["id"], {}).get("status") != "done":
            results[r["id"]] = r
    running: dict[str, subprocess.Popen] = {}
    pending = [j for j in jobs if results.get(j["id"], {}).get("status") != "done"]
    while pending or running:
        for jid, proc in list(running.items()):
            if proc.poll() is not None:
                del running[jid]
                save()
                r = results.get(jid, {})
                if proc.returncode != 0 and r.get("status") != "done":
                    r["status"] = "crashed"
                    results[jid] = r
                say(
                    f"{time.time() - t_start:6.0f}s  {jid}: {r.get('status')} rc={proc.returncode}"
                    + (f"  test {r['rows'][-1]['test_acc']:.4f}" if r.get("rows") else "")
                )
        if time.time() - t_start > args.deadline:
            for proc in running.values():
                proc.send_signal(signal.SIGTERM)
            for proc in running.values():
                proc.wait()
            save()
            for jid in running:
                if results.get(jid, {}).get("status") != "done":
                    results.setdefault(jid, {"id": jid})["status"] = "cut"
            for j in pending:
                results.setdefault(j["id"], {**j, "status": "not started"})
            running.clear()
            save()
            say(f"deadline {args.deadline}s: stopped")
            break
        while len(running) < args.jobs:
            done = {jid for jid, r in results.items() if r.get("status") == "done"}
            ready = next((j for j in pending if set(j.get("needs", [])) <= done), None)
            if ready is None:
                break
            pending.remove(ready)
            started_here.add(ready["id"])
            (work / f"{ready['id']}.job.json").write_text(json.dumps({"job": ready, "results": results}))
            cmd = python_m(
                "studies.cifar_gpu", "--job", work / f"{ready['id']}.job.json", "--work", work, "--model", args.model
            )
            running[ready["id"]] = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=child_env())
            say(f"{time.time() - t_start:6.0f}s  start {ready['id']}")
        if (
            not running
            and pending
            and all(any(results.get(n, {}).get("status") != "done" for n in j.get("needs", [])) for j in pending)
        ):
            for j in pending:
                results.setdefault(j["id"], {**j, "status": "not started (an input failed)"})
            break
        time.sleep(1)
    save()
    say(f"all done in {time.time() - t_start:.0f}s")


def job_main(args: argparse.Namespace) -> None:
    spec = json.loads(Path(args.job).read_text())
    job, work = spec["job"], Path(args.work)
    target = work / f"{job['id']}.result.json"

    def emit(result: dict) -> None:
        tmp = target.with_suffix(".tmp")
        tmp.write_text(json.dumps(result))
        os.replace(tmp, target)

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(3))
    run_job(job, work / "cifar10.npz", work, spec["results"], args.model, emit)


# ------------------------------------------------------------------------------------ report
METHODS = {
    "full": "full data",
    "rule": "the noise rule (full, noise=True)",
    "rulerand": f"the noise rule + dynamic random (r={RULE_RANDOM_R})",
    "rule1": "the noise rule's first version (full, noise=True, noise_rule=1)",
    "oracle": "oracle filter (full data without the noisy samples)",
    "dynrand": "dynamic random at the rule's pruned share",
    "equal": "full data at equal compute (the rule's samples trained)",
    "cleanlab": f"cleanlab ({FOLDS}-fold out-of-sample probabilities, find_label_issues, then full data)",
}
KIND_TEXT = {
    "sym20": "20% symmetric noisy labels (9,000 of 45,000 training labels replaced by another class)",
    "sym40": "40% symmetric noisy labels (18,000 of 45,000 training labels replaced by another class)",
    "asym40": "40% asymmetric noisy labels (truck->automobile, bird->airplane, deer->horse, cat<->dog at 40% "
    "of each of those classes: 9,004 of 45,000 training labels)",
}


def early_stopped(r: dict) -> dict:
    """The epoch of best accuracy on the (noisy) validation split; ties: the earlier epoch."""
    return max(r["rows"], key=lambda row: (row["val_acc"], -row["epoch"]))


def identical_runs(runs: dict) -> dict[tuple[str, int], float]:
    """(kind, seed) -> the final test-accuracy difference between the rule's run and full data's
    where both trained the same samples in the same order with the same seed (the rule never
    fired): what the GPU's non-deterministic kernels alone give."""
    out = {}
    for r in runs.values():
        f = runs.get(f"{r['kind']}-full-s{r['seed']}")
        if r["method"] != "rule" or not f or not r.get("rows") or len(r["rows"]) != len(f.get("rows", [])):
            continue
        if all(a["kept"] == b["kept"] and a["learnt"] == b["learnt"] for a, b in zip(f["rows"], r["rows"])):
            out[(r["kind"], r["seed"])] = abs(f["rows"][-1]["test_acc"] - r["rows"][-1]["test_acc"])
    return out


def gpu_floor(runs: dict) -> float | None:
    """The largest difference of :func:`identical_runs`: the GPU's run-to-run floor. None without such a pair."""
    diffs = identical_runs(runs).values()
    return max(diffs) if diffs else None


def _gap_line(name: str, gaps: list[float], floor: float | None) -> str:
    m, se2, v = gap_verdict(gaps, floor=floor)
    per = ", ".join(f"{100 * g:+.2f}" for g in gaps)
    return f"| {name} | {per} | {100 * m:+.2f} | {'-' if se2 is None else f'{100 * se2:.2f}'} | {v} |"


def provenance(meta: dict, runs: dict, log: Path | None = None) -> str:
    """Which code and command line the runs come from: each run's own invocation where every run records
    one (``runs[id]["invocation"]``), else the file's, said to be its last invocation's."""
    stamps = [r.get("invocation") for r in runs.values()]
    if stamps and all(stamps):
        by: dict[tuple[str, str], int] = {}
        for s in stamps:
            key = (s["commit"][:10], " ".join([s.get("program", EARLIER_PROGRAM), *s["argv"]]))
            by[key] = by.get(key, 0) + 1
        return (
            "Runs by invocation: "
            + "; ".join(f"{n} at commit {c or 'unrecorded'} (`{a}`)" for (c, a), n in by.items())
            + "."
        )
    calls = sum(line.startswith("prepared ") for line in log.read_text().splitlines()) if log and log.exists() else 0
    unstamped = sum(not s for s in stamps)
    return (
        f"The file records the commit ({meta['commit'][:10]}), command line (`{meta.get('program', EARLIER_PROGRAM)} "
        f"{' '.join(meta['argv'])}`), torch and GPU of its last invocation only; {unstamped} of its {len(runs)} runs "
        "record no invocation of their own, so they may come from earlier invocations at other commits"
        + (f" (the log, `log.txt` beside the file, shows {calls} invocations)" if calls > 1 else "")
        + "."
    )


#: The CPU study's methods that run the noise rule (their removal cell: the suspects)
RULE_METHODS = ("rule", "rulerand", "rule1")


def method_line(
    kind: str, method: str, text: str, got: list[dict], runs: dict, where: str, name: str,
    rule_methods: tuple[str, ...], over_run: bool,
) -> tuple[str, list[tuple[str, dict]]]:  # fmt: skip
    """A method's row of a page's table (``got``: its runs, one a seed) and the runs of it the
    instability scan flags. The removal cell of ``rule_methods``: the suspects over the whole run where
    ``over_run`` and every run has them (``run_suspects``), else the last plan's."""
    final = [g["rows"][-1]["test_acc"] for g in got]
    es = [early_stopped(g)["test_acc"] for g in got]
    trained = [g["trained"] for g in got]
    if method == "cleanlab":
        folds = [sum(runs[f"{kind}-clfold{k}-s{g['seed']}"]["trained"] for k in range(FOLDS)
                     if f"{kind}-clfold{k}-s{g['seed']}" in runs) for g in got]  # fmt: skip
        trained_text = f"{np.mean(trained):,.0f} (+ {np.mean(folds):,.0f} in the {FOLDS} folds)"
    else:
        trained_text = f"{np.mean(trained):,.0f}"
    last = [g["rows"][-1] for g in got]
    share = np.mean([row["noisy_learnt"] / max(1, row["learnt"]) for row in last])
    whole = [g.get("run_suspects") for g in got]
    if method in rule_methods and over_run and all(whole):
        removal = f"{precision_recall(whole)} (suspects over the run)"
    elif method in rule_methods:
        removal = f"{precision_recall(last)} (suspects, last plan)"
    elif method == "cleanlab":
        removal = f"{np.mean([g['precision'] for g in got]):.3f} / {np.mean([g['recall'] for g in got]):.3f}"
    elif method == "oracle":
        removal = "1 / 1"
    else:
        removal = "-"
    # collapsed, fell 20 points, diverged or cut short
    shaky = [(f"{where}#{g['id']}", g) for g in got if instability.unstable(g, name)]
    text += f" {instability.MARK}" if shaky else ""
    line = (f"| {text} | {', '.join(f'{100 * v:.2f}' for v in final)} | {100 * np.mean(final):.2f} | "
            f"{100 * np.mean(es):.2f} | {trained_text} | {100 * share:.1f}% | {removal} |")  # fmt: skip
    return line, shaky


def report(results_path: Path) -> str:
    """docs/cifar-gpu.md, every figure from ``results_path``."""
    doc = json.loads(results_path.read_text())
    meta, runs = doc["meta"], doc["runs"]
    where = f"{results_path.parent.name}/{results_path.name}"  # as the footnote names it: cifar-gpu/results.json
    marked: list[tuple[str, dict]] = []  # the instability scan's runs of the tables
    seeds = sorted({r["seed"] for r in runs.values()})
    bad = sorted(k for k, r in runs.items() if r.get("status") != "done")
    epochs = sorted({r["epochs"] for r in runs.values()})
    floor = gpu_floor(runs)
    lines = [
        "# CIFAR-10 with noisy labels: ResNet-18 on one GPU",
        "",
        "<!-- generated by `python -m studies cifar_gpu --report docs/quality-runs/cifar-gpu/results.json`;"
        " do not edit -->",
        "",
        *superseded_note(meta),
        f"The noise rule against the baselines a reviewer names, on a real data set and a real model: CIFAR-10, "
        f"ResNet-18 (CIFAR form), {epochs[0]} epochs, batch {meta['batch']}, SGD (Nesterov) peak lr {meta['lr']}, "
        f"weight decay {meta['weight_decay']}, random crop and flip, bf16 autocast, on one {meta['gpu']} "
        f"(torch {meta['torch']}). {provenance(meta, runs, results_path.parent / 'log.txt')} "
        f"Seeds {', '.join(map(str, seeds))}, "
        f"paired by seed. {len(runs)} runs, "
        + (f"not finished: {', '.join(bad)}." if bad else "all finished.")
        + (
            f" A gap no larger than {100 * floor:.2f} points (the largest difference between two runs that trained"
            " the same samples in the same order, below) is read as the GPU's run-to-run floor."
            if floor is not None
            else ""
        )
        + " Train shards 0-8 (45,000 images) train, shard 9 (5,000, its labels as noisy as the training"
        " labels) is the validation split, the 10,000 test images (clean labels) the test split. What runs and"
        " why: `studies/cifar_gpu.py`'s docstring; every run's per-epoch rows: `docs/quality-runs/cifar-gpu/"
        "results.json`. Reproduce (one GPU, about 9 minutes): `python -m studies cifar_gpu --data "
        "../shared/data/cifar10 --out OUT --jobs 4`.",
        "",
        "Early stopping reads the noisy validation split only; the test split is read for the table, never to"
        " choose. The images sit decoded in GPU memory and every epoch's plan selects them, so this measures"
        " what the plans do to the model, not the webdataset reader.",
    ]
    for kind in [k for k in KINDS if any(r["kind"] == k for r in runs.values())]:
        rs = {(r["method"], r["seed"]): r for r in runs.values() if r["kind"] == kind and r.get("rows")}
        lines += ["", f"## {KIND_TEXT[kind]}", ""]
        lines += [
            "| method | final test acc. (per seed) | mean | early-stopped test acc. (mean) | samples trained (mean)"
            " | noisy share of what is learnt, last epoch | removed: precision / recall |",
            "| --- | --- | --- | --- | --- | --- | --- |",
        ]
        for method, text in METHODS.items():
            got = [rs[(method, s)] for s in seeds if (method, s) in rs]
            if not got:
                continue
            line, shaky = method_line(kind, method, text, got, runs, where, results_path.name, ("rule",), False)
            marked += shaky
            lines.append(line)
        for subject in ("rule", "cleanlab"):
            if not any(m == subject for m, _ in rs):
                continue
            lines += ["", f"Paired gaps of {METHODS[subject]}, test accuracy points, per seed:", ""]
            lines += ["| against | per seed | mean | 2 SE | verdict |", "| --- | --- | --- | --- | --- |"]
            sub = {s: rs[(subject, s)] for s in seeds if (subject, s) in rs}
            for base, label, pick in (
                ("full", "full data, last epoch (both last epoch)", lambda r: r["rows"][-1]),
                ("full", "full data early-stopped (both early-stopped)", early_stopped),
                ("oracle", "oracle filter (both last epoch)", lambda r: r["rows"][-1]),
                ("dynrand", "dynamic random, same samples trained", lambda r: r["rows"][-1]),
                ("equal", "full data at equal compute", lambda r: r["rows"][-1]),
                ("cleanlab", "cleanlab", lambda r: r["rows"][-1]),
                ("rule", "the noise rule", lambda r: r["rows"][-1]),
            ):
                if base == subject or (subject == "cleanlab" and base in ("dynrand", "equal")):
                    continue
                gaps = [pick(sub[s])["test_acc"] - pick(rs[(base, s)])["test_acc"] for s in sub if (base, s) in rs]
                if gaps:
                    lines.append(_gap_line(label, gaps, floor))
        lines += ["", *readings(kind, rs, seeds)]
    if marked:
        lines += ["", instability.footnote(marked)]
    lines += ["", "## What this says", "", *conclusions(runs, seeds)]
    return "\n".join(lines) + "\n"


def superseded_note(meta: dict) -> list[str]:
    """A results file made before the studies' draws were the keyed hash (its meta names no
    ``noise_draws``) measured other noise than its page names: the earlier salted CRC32 chose the
    noisy samples and their new labels dependently (its "symmetric" noise used 5 of the 9 other
    classes) and cleanlab's folds correlated with the noisy set. Its page says so at the top."""
    if meta.get("noise_draws") == draws.VERSION:
        return []
    return [
        "**Superseded.** These runs were made before the studies' seeded choices came from a keyed hash "
        "(`tools/draws.py`): their label noise and cleanlab's folds came from a salted CRC32, which is affine, so "
        'the samples chosen for noise and their new labels were dependent (the "40% symmetric" noise used label '
        "offsets 5-9 only: each class's wrong labels on 5 of the 9 other classes) and cleanlab's folds held out "
        "the noisy samples together. They measure other noise and a crippled cleanlab, and stand here as the "
        "record of what was run; the rerun needs a GPU (`studies/device_resnet18.sh`). The same regime on the CPU, "
        "on the corrected noise and with both versions of the rule: [cifar-cpu.md](cifar-cpu.md).",
        "",
    ]


def readings(kind: str, rs: dict, seeds: list[int]) -> list[str]:
    """Generated sentences on what the rule did in this kind's runs."""
    out = []
    for s in seeds:
        r = rs.get(("rule", s))
        if r is None:
            continue
        active = [row for row in r["rows"] if row.get("noise_test") == "two_modes"]
        tests = sorted({row.get("noise_test") for row in r["rows"]})
        d = [row["noise_separation"] for row in r["rows"] if row.get("noise_separation") is not None]
        if not active:
            out.append(
                f"- Seed {s}: the rule never found two modes (tests: {', '.join(tests)}; Ashman's D "
                f"{min(d):.2f}-{max(d):.2f}, below the bar of 2), so it left every sample in and trained what "
                f"full data trained."
            )
            continue
        first, last = active[0], r["rows"][-1]
        clean_out = round(first["suspected"] * (1 - first["precision"]))
        out.append(
            f"- Seed {s}: first active in epoch {first['epoch']} (D {first['noise_separation']:.2f}, "
            f"full data then at {100 * rs[('full', s)]['rows'][first['epoch']]['val_clean_acc']:.1f}% on the "
            f"validation images' clean labels): suspected {first['suspected']:,} with precision "
            f"{first['precision']:.3f} and recall "
            f"{first['recall']:.3f}, so {clean_out:,} clean samples left out with the noisy ones; by the last epoch "
            f"{last['suspected']:,} suspected (precision {last['precision']:.3f}), {last['learnt']:,} samples learnt "
            f"from of 45,000 ({45000 - r['noisy_in_population']:,} are clean)."
        )
    same = identical_runs({r["id"]: r for r in rs.values()})
    diffs = [same[(kind, s)] for s in seeds if (kind, s) in same]
    if diffs:
        out.append(
            f"- Where the rule never fired, its runs trained the same samples in the same order as full data, yet "
            f"their final test accuracies differ by {', '.join(f'{100 * x:.2f}' for x in diffs)} points: the "
            f"GPU's non-deterministic kernels (cuDNN autotuning, atomic adds), a floor under every gap above."
        )
    return out


def conclusions(runs: dict, seeds: list[int]) -> list[str]:
    def final(kind: str, method: str) -> float:
        v = [runs[f"{kind}-{method}-s{s}"]["rows"][-1]["test_acc"] for s in seeds if f"{kind}-{method}-s{s}" in runs]
        return 100 * float(np.mean(v))

    out = []
    if "sym40-rule-s0" in runs:
        out.append(
            f"- Symmetric noise: full data is not ruined by 40% noisy labels in {runs['sym40-full-s0']['epochs']} "
            f"epochs with augmentation ({final('sym40', 'full'):.2f} against the oracle's "
            f"{final('sym40', 'oracle'):.2f}). The rule removes the noisy samples (recall near 1) but also many"
            f" clean ones it suspects early, when the model still gets them wrong, and does not take them back: it"
            f" ends at {final('sym40', 'rule'):.2f}, below full data and below dynamic random at the same samples"
            f" trained ({final('sym40', 'dynrand'):.2f}). cleanlab ({final('sym40', 'cleanlab'):.2f}, at"
            f" {FOLDS + 1} trainings' compute) removes more precisely and also ends below full data here."
        )
    if "asym40-rule-s0" in runs:
        out.append(
            f"- Asymmetric noise: the losses never form two modes, the rule stays off and equals full data "
            f"({final('asym40', 'rule'):.2f} against {final('asym40', 'full'):.2f}); the oracle reaches "
            f"{final('asym40', 'oracle'):.2f}, cleanlab {final('asym40', 'cleanlab'):.2f}."
        )
    out.append(
        "- So on this model and schedule the rule is not a drop-in gain: docs/policies.md says where it pays"
        " (the pairs studies) and where it does not (here)."
    )
    return out


# ------------------------------------------------------------------------------------ the CPU study
#: The CPU study's methods in its tables, in order (the rule's two versions and its baselines).
CPU_METHODS = ("full", "oracle", "rule", "rulerand", "rule1", "dynrand", "equal", "cleanlab")
#: The subjects of the paired gaps, and the baselines each is set against.
CPU_GAPS = {
    "rule": ("full", "full-es", "oracle", "dynrand", "equal", "cleanlab", "rule1"),
    "rulerand": ("full", "full-es", "oracle", "rule"),
    "rule1": ("full", "full-es", "oracle"),
    "cleanlab": ("full", "full-es", "oracle", "rule"),
}
_BASE_TEXT = {
    "full": "full data, last epoch (both last epoch)",
    "full-es": "full data early-stopped (both early-stopped)",
    "oracle": "oracle filter (both last epoch)",
    "dynrand": "dynamic random, same samples trained",
    "equal": "full data at equal compute",
    "cleanlab": "cleanlab",
    "rule": "the noise rule",
    "rule1": "the rule's first version",
}


def merge_results(docs: list[dict]) -> dict:
    """One results file from several invocations' (drivers run side by side on one work folder, or
    one after another into other folders): each run id once, a finished run over an unfinished
    one, else the one with more epochs, else the later file's; ``meta`` is the last file's, its
    ``invocations`` every file's in order, each once. Each run keeps its own ``invocation``. A run
    both files hold with the same rows (a work folder's copy, which the later file's driver found
    finished and did not start) keeps what either added to it (its invocation, ``run_suspects``)."""
    runs: dict[str, dict] = {}
    invocations: list[dict] = []
    for doc in docs:
        for inv in doc["meta"].get("invocations", []):
            if inv not in invocations:
                invocations.append(inv)
        for rid, r in doc["runs"].items():
            old = runs.get(rid)
            rank = (r.get("status") == "done", len(r.get("rows", [])))
            before = None if old is None else (old.get("status") == "done", len(old.get("rows", [])))
            if old is None or rank >= before:
                if rank == before and r.get("rows") == old.get("rows"):
                    # the same run copied into another work folder, whose driver found it finished: what
                    # the earlier file added to it (its invocation, its suspects over the run) stays
                    r = {**old, **r}
                runs[rid] = r
    return {"meta": {**docs[-1]["meta"], "invocations": invocations}, "runs": dict(sorted(runs.items()))}


def suspect_history(suspected: np.ndarray, noisy: np.ndarray) -> dict[str, Any]:
    """A rule run's suspects over the whole run from ``suspected`` (bool, samples x plans in
    epoch order: whether each plan held the sample as a suspect, left out or re-checked at weight
    0) and ``noisy`` (bool, a sample: its recorded label is wrong): the samples any plan suspected
    (count, true positives, precision, recall), and how many of them were back in training at
    the last plan, clean and noisy apart (``clean_back``, ``noisy_back``): the rule's way back
    for a sample it took for noise."""
    ever = suspected.any(axis=1)
    back = ever & ~suspected[:, -1] if suspected.shape[1] else np.zeros_like(ever)
    found, tp = int(ever.sum()), int(np.count_nonzero(ever & noisy))
    return {
        "suspected": found,
        "true_positives": tp,
        "precision": tp / found if found else None,
        "recall": tp / int(noisy.sum()) if noisy.any() else None,
        "clean_suspected": found - tp,
        "clean_back": int(np.count_nonzero(back & ~noisy)),
        "noisy_back": int(np.count_nonzero(back & noisy)),
    }


def add_run_suspects(results_path: Path, work: Path) -> list[str]:
    """Each rule run's suspects over the whole run (``run_suspects``: :func:`suspect_history` of
    the run directory's plans against the known noisy labels), written into ``results_path``: the
    issue's "suspects over the whole run". Runs without a run directory here are left as they
    are, and so is a run whose directory here is another run of that id (a run cut and made again
    elsewhere: its plans' suspects, epoch by epoch, are not the ones the result file recorded).
    Returns a line for each run left out that way."""
    from seta_stream import load_plan
    from seta_stream.errors import PlanMissingError
    from studies.quality.noise import SUSPECT_REASONS

    doc = json.loads(results_path.read_text())
    d = np.load(work / "cifar10.npz")
    keys = d["train_keys"]
    pos = {k: i for i, k in enumerate(keys.tolist())}
    skipped = []
    for rid, r in doc["runs"].items():
        run_dir = work / f"run-{rid}"
        if r.get("status") != "done" or not r.get("params", {}).get("noise") or not run_dir.exists():
            continue
        noisy = noisy_labels(r["kind"], keys, d["train_y"]) != d["train_y"]
        suspected = np.zeros((len(keys), len(r["rows"])), dtype=bool)
        try:
            for e, row in enumerate(r["rows"]):
                plan = load_plan(str(run_dir), e, columns=["key", "reason"])
                held = np.isin(np.asarray(plan.column("reason").to_pylist(), dtype=object), SUSPECT_REASONS)
                if int(held.sum()) != row["suspected"]:
                    raise ValueError(f"epoch {e}'s plan suspects {int(held.sum())}, the result {row['suspected']}")
                at = np.fromiter((pos[k] for k in plan.column("key").to_pylist()), np.int64, len(plan))
                suspected[at, e] = held
        except (PlanMissingError, ValueError) as exc:
            skipped.append(f"{run_dir}: not the run {results_path} recorded as {rid} ({exc}); left as it was")
            continue
        r["run_suspects"] = suspect_history(suspected, noisy)
    write_json(results_path, doc)
    return skipped


def _cpu_rs(runs: dict, kind: str) -> dict[tuple[str, int], dict]:
    return {
        (r["method"], r["seed"]): r
        for r in runs.values()
        if r["kind"] == kind and r.get("rows") and r.get("status") == "done"
    }


def _pick(base: str) -> Any:
    return early_stopped if base == "full-es" else (lambda r: r["rows"][-1])


def cpu_gaps(rs: dict, seeds: list[int], subject: str, base: str) -> list[float]:
    """Per-seed gaps of ``subject`` against ``base`` (``full-es``: both early-stopped)."""
    other = "full" if base == "full-es" else base
    pick = _pick(base)
    return [
        pick(rs[(subject, s)])["test_acc"] - pick(rs[(other, s)])["test_acc"]
        for s in seeds
        if (subject, s) in rs and (other, s) in rs
    ]


def cpu_targets(rs: dict, seeds: list[int]) -> list[str]:
    """The targets of a rule that never costs accuracy (for the rule, version 2), each with its
    figure and verdict: never resolved below early-stopped full data; where the oracle beats it by
    2 points or more, above it and within 1 point of the oracle; suspects over the run."""
    out = ["| target | figure | verdict |", "| --- | --- | --- |"]
    rule_es = cpu_gaps(rs, seeds, "rule", "full-es")
    oracle = [early_stopped(rs[("oracle", s)])["test_acc"] - early_stopped(rs[("full", s)])["test_acc"]
              for s in seeds if ("oracle", s) in rs and ("full", s) in rs]  # fmt: skip
    to_oracle = [early_stopped(rs[("rule", s)])["test_acc"] - early_stopped(rs[("oracle", s)])["test_acc"]
                 for s in seeds if ("rule", s) in rs and ("oracle", s) in rs]  # fmt: skip
    t = rule_targets(rule_es, oracle, to_oracle, point=0.01)
    m, se2 = t["mean"], t["se2"]
    if rule_es:
        upper = m + (se2 or 0.0)
        ok = "met" if t["upper_met"] else "not met" if se2 is not None else "one seed: not judged"
        out.append(
            f"| rule (early-stopped) minus full data (early-stopped): mean + 2 SE >= 0 | {100 * m:+.2f} + "
            f"{'-' if se2 is None else f'{100 * se2:.2f}'} = {100 * upper:+.2f} | {ok} |"
        )
    if oracle:
        out.append(
            f"| the oracle filter minus full data, both early-stopped (the margin noise leaves) | "
            f"{100 * t['margin']:+.2f} | "
            f"{'2 points or more: the two targets below apply' if t['applies'] else 'under 2 points'} |"
        )
        if t["applies"] and rule_es:
            out.append(
                f"| rule minus full data, both early-stopped: mean - 2 SE > 0 | {100 * (m - (se2 or 0.0)):+.2f} | "
                f"{'met' if t['lower_met'] else 'not met'} |"
            )
            if t["to_oracle"] is not None:
                out.append(
                    f"| rule within 1 point of the oracle filter (both early-stopped, mean) | "
                    f"{100 * t['to_oracle']:+.2f} | {'met' if t['to_oracle_met'] else 'not met'} |"
                )
    whole = [rs[("rule", s)].get("run_suspects") for s in seeds if ("rule", s) in rs]
    whole = [w for w in whole if w]
    if whole:  # a run that suspected nothing has no precision: 0 here, so that the target is not met
        p = float(np.mean([w["precision"] or 0.0 for w in whole]))
        r = float(np.mean([w["recall"] or 0.0 for w in whole]))
        out.append(
            f"| the rule's suspects over the whole run: precision >= 0.9 at recall >= 0.9 (mean over seeds) | "
            f"{p:.3f} / {r:.3f} | {'met' if p >= 0.9 and r >= 0.9 else 'not met'} |"
        )
    return out


def cpu_epochs(rs: dict, seeds: list[int]) -> list[str]:
    """Per epoch, means over the seeds: the detection AUC of the rule's score in the full-data
    runs (every sample trained: what the score can tell), and each rule version's plan (its
    threshold, suspects, precision and recall)."""
    runs_of = {m: [rs[(m, s)] for s in seeds if (m, s) in rs] for m in ("full", "rule", "rule1")}
    if not runs_of["full"]:
        return []
    n = min(len(r["rows"]) for rs_ in runs_of.values() for r in rs_) if all(runs_of.values()) else 0
    n = n or min(len(r["rows"]) for r in runs_of["full"])

    def mean(method: str, e: int, key: str) -> str:
        vals = [r["rows"][e].get(key) for r in runs_of[method] if len(r["rows"]) > e]
        vals = [v for v in vals if v is not None]
        if not vals:
            return "-"
        v = float(np.mean(vals))
        return f"{v:,.0f}" if key == "suspected" else f"{v:.3f}"

    head = "| epoch | AUC, full data | rule: threshold | suspected | precision | recall | rule 1: threshold | "
    head += "suspected | precision | recall |"
    out = [head, "| " + " | ".join(["---"] * 10) + " |"]
    for e in range(n):
        cells = [str(e), mean("full", e, "auc")]
        for m in ("rule", "rule1"):
            cells += [mean(m, e, k) for k in ("noise_threshold", "suspected", "precision", "recall")]
        out.append("| " + " | ".join(cells) + " |")
    return out


def report_cpu(results_path: Path) -> str:
    """docs/cifar-cpu.md: the CPU study, every figure from ``results_path``."""
    doc = json.loads(results_path.read_text())
    meta, runs = doc["meta"], doc["runs"]
    where = f"{results_path.parent.name}/{results_path.name}"
    marked: list[tuple[str, dict]] = []
    seeds = sorted({r["seed"] for r in runs.values()})
    bad = sorted(k for k, r in runs.items() if r.get("status") != "done")
    epochs = sorted({r["epochs"] for r in runs.values() if r["method"] != "equal"})
    lines = [
        "# CIFAR-10 with noisy labels: a small residual network on the CPU",
        "",
        f"<!-- generated by `python -m studies cifar_gpu --report {results_path.parent.as_posix()}/results.json`;"
        " do not edit -->",
        "",
        f"The noise rule of both versions (docs/algorithms.md §12.12) against the baselines a reviewer names, "
        f"on CIFAR-10 with a model this 2-core machine can train: {meta.get('model', 'resnet8')} (He et al.'s "
        f"CIFAR ResNet, one basic block a stage, widths 16/32/64: 78,042 parameters), {epochs[0]} epochs, batch "
        f"{meta['batch']}, SGD (Nesterov) peak lr {meta['lr']}, weight decay {meta['weight_decay']}, warm-up then "
        f"cosine, random crop and flip, {meta.get('threads', 1)} torch thread a run, torch {meta.get('torch')}. "
        f"{provenance(meta, runs, results_path.parent / 'log.txt')} Seeds {', '.join(map(str, seeds))}, paired by"
        f" seed. {len(runs)} runs, " + (f"not finished: {', '.join(bad)}." if bad else "all finished.") + " The"
        " splits, the noise, early stopping and the baselines are docs/cifar-gpu.md's (ResNet-18 on a GPU, the"
        " measurement this study reproduces on a CPU): train shards 0-8 train, shard 9 (as noisy) validates, the"
        " 10,000 test images (clean labels) test. Early stopping reads the noisy validation split only; the test"
        " split is read for the tables, never to choose. Every training step divides the weighted loss sum by the"
        " nominal batch size (the small-final-batch remedy). Reproduce: `python -m studies cifar_gpu --data "
        "../shared/data/cifar10 --out OUT --jobs 2 --kinds sym40 --seeds 0,1,2 --model resnet8 --batch 256 "
        "--lr 0.1 --threads 1`, then `--union OUT/results.json` and `--report OUT/results.json`.",
    ]
    for kind in [k for k in ("sym20", "sym40", "asym40") if any(r["kind"] == k for r in runs.values())]:
        rs = _cpu_rs(runs, kind)
        lines += ["", f"## {KIND_TEXT[kind]}", ""]
        lines += [
            "| method | final test acc. (per seed) | mean | early-stopped test acc. (mean) | samples trained (mean)"
            " | noisy share of what is learnt, last epoch | removed: precision / recall |",
            "| --- | --- | --- | --- | --- | --- | --- |",
        ]
        for method in CPU_METHODS:
            got = [rs[(method, s)] for s in seeds if (method, s) in rs]
            if not got:
                continue
            text = METHODS[method]
            line, shaky = method_line(kind, method, text, got, runs, where, results_path.name, RULE_METHODS, True)
            marked += shaky
            lines.append(line)
        absent = [METHODS[m] for m in CPU_METHODS if not any(mm == m for mm, _ in rs)]
        short = {m: sorted(set(seeds) - {s for mm, s in rs if mm == m}) for m in CPU_METHODS}
        short = {m: ss for m, ss in short.items() if ss and any(mm == m for mm, _ in rs)}
        if absent or short:
            lines += [""]
        if absent:
            lines += [f"Not run for this kind of noise in the time the study had: {'; '.join(absent)}."]
        if short:
            fewer = [f"{METHODS[m]} (no finished run on seed {', '.join(map(str, ss))})" for m, ss in short.items()]
            lines += ["Run on fewer seeds: " + "; ".join(fewer) + "."]
        for subject, bases in CPU_GAPS.items():
            if not any(m == subject for m, _ in rs):
                continue
            rows = [_gap_line(_BASE_TEXT[b], g, None) for b in bases if (g := cpu_gaps(rs, seeds, subject, b))]
            if rows:
                lines += ["", f"Paired gaps of {METHODS[subject]}, test accuracy points, per seed:", ""]
                lines += ["| against | per seed | mean | 2 SE | verdict |", "| --- | --- | --- | --- | --- |", *rows]
        targets = cpu_targets(rs, seeds)
        if len(targets) > 2:
            lines += ["", "The targets of a rule that never costs accuracy (the rule of version 2):", "", *targets]
        per_epoch = cpu_epochs(rs, seeds)
        if per_epoch:
            lines += [
                "",
                "Per epoch, means over the seeds: the detection AUC of the rule's score (each sample's mean loss so"
                " far) in the full-data runs, where every sample is trained in every epoch, and each version's plan"
                " (threshold on the loss scale, suspects, precision and recall among the noisy samples):",
                "",
                *per_epoch,
            ]
    if marked:
        lines += ["", instability.footnote(marked)]
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", default=str(ROOT.parent / "shared" / "data" / "cifar10"))
    p.add_argument("--out", default=str(ROOT / "bench-out" / "cifar-gpu"), help="results.json and log.txt")
    p.add_argument("--work", default=None, help="decoded data, run directories (default: OUT/work)")
    p.add_argument("--jobs", type=int, default=4, help="runs at a time on the one GPU")
    p.add_argument("--deadline", type=float, default=1e9, help="seconds; then running jobs are stopped (cut)")
    p.add_argument("--kinds", default=",".join(KINDS))
    p.add_argument("--seeds", default=",".join(map(str, SEEDS)))
    p.add_argument("--epochs", type=int, default=EPOCHS)
    p.add_argument("--only", help="regex on job ids")
    p.add_argument(
        "--model", default="resnet18", help="resnet18 (the GPU study), resnet8 (the CPU study) or cnn (smoke)"
    )
    p.add_argument("--batch", type=int, default=B, help="batch size (the GPU study's 512)")
    p.add_argument("--lr", type=float, default=LR, help="peak learning rate (the GPU study's 0.2)")
    p.add_argument("--threads", type=int, default=TRAIN["threads"], help="torch threads a job")
    p.add_argument("--rule-params", default=None, help="JSON: the noise rule's parameters beyond noise=True")
    p.add_argument("--limit", type=int, help="samples per split (smoke runs)")
    p.add_argument("--commit", default="", help="the commit the run's code is at (recorded)")
    p.add_argument("--smoke", action="store_true", help="tiny CPU run: cnn, 400 samples a split, 3 epochs, one seed")
    p.add_argument(
        "--report", help="write docs/cifar-gpu.md (a GPU's results) or docs/cifar-cpu.md from this results.json"
    )
    p.add_argument("--union", help="add each rule run's suspects over the whole run (its plans) to this results.json")
    p.add_argument("--merge", nargs="+", metavar=("OUT", "RESULTS"),
                   help="write OUT from several results.json files (merge_results)")  # fmt: skip
    p.add_argument("--job", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.report:
        results = Path(args.report)
        cpu = json.loads(results.read_text())["meta"].get("gpu") is None and "cifar-gpu" not in results.parts
        page, text = ("cifar-cpu.md", report_cpu(results)) if cpu else ("cifar-gpu.md", report(results))
        (ROOT / "docs" / page).write_text(text)
        return None
    if args.merge:
        out, *inputs = (Path(x) for x in args.merge)
        write_json(out, merge_results([json.loads(x.read_text()) for x in inputs]))
        return None
    if args.union:
        for line in add_run_suspects(Path(args.union), Path(args.work or Path(args.union).parent / "work")):
            print(line)
        return None
    if args.job:
        return job_main(args)
    if args.smoke:
        args.model, args.limit, args.epochs, args.seeds, args.jobs = "cnn", args.limit or 400, 3, "0", 2
    args.work = args.work or str(Path(args.out) / "work")
    manage(args)


if __name__ == "__main__":
    main()
