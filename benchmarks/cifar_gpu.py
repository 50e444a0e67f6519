"""CIFAR-10 with noisy labels, ResNet-18 on one GPU: the noise rule against the baselines.

Issue 33's device check. The data are the real CIFAR-10 shards (``../shared/data/cifar10``):
train shards 0-8 (45,000 images) train, train shard 9 (5,000) is the held-out validation split,
the 10,000 test images the test split (``benchmarks.quality.data``'s splits). Two kinds of label
noise, fixed before any run and seeded by key hash (``benchmarks.quality.data``): ``sym40``, 40%
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
  trained on the other K-1 folds, folds by key hash), ``cleanlab.filter.find_label_issues`` with
  its defaults, then full data on what it keeps; its compute is the K fold trainings plus the
  final one.

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

    python benchmarks/cifar_gpu.py --data ../shared/data/cifar10 --out bench-out/cifar-gpu --jobs 4 --deadline 520
    python benchmarks/cifar_gpu.py --smoke --out bench-out/cifar-gpu-smoke      # CPU, tiny, the code paths
    python benchmarks/cifar_gpu.py --report docs/quality-runs/cifar-gpu/results.json   # docs/cifar-gpu.md
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

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script: benchmarks.* importable
    sys.path.insert(0, str(ROOT))

from benchmarks.quality.data import NOISE_SEED, _hash01, asymmetric_offsets, noise_offsets  # noqa: E402

B, LR, WD, EPOCHS, FOLDS = 512, 0.2, 5e-4, 15, 4
SEEDS = (0, 1)
KINDS = ("sym40", "asym40")
MEAN = np.array([0.4914, 0.4822, 0.4465], dtype=np.float32)
STD = np.array([0.2470, 0.2435, 0.2616], dtype=np.float32)


# ------------------------------------------------------------------------------------ data
def _decode_shard(url: str) -> tuple[list[str], list[int], np.ndarray]:
    from PIL import Image

    keys, labels, images = [], [], []
    with tarfile.open(url, "r:*") as tar:
        members: dict[str, dict[str, bytes]] = {}
        for m in tar:
            if not m.isfile():
                continue
            key, _, ext = m.name.rpartition("/")[2].partition(".")
            members.setdefault(key, {})[ext] = tar.extractfile(m).read()
    for key, fields in members.items():
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

    shards = sorted(glob.glob(os.path.join(data, "train-*.tar.gz")))
    tests = sorted(glob.glob(os.path.join(data, "test-*.tar.gz")))
    if len(shards) != 10 or len(tests) != 2:
        raise SystemExit(f"{data}: expected 10 train-*.tar.gz and 2 test-*.tar.gz shards (../shared/data/cifar10)")
    with mp.get_context("fork").Pool(min(12, os.cpu_count() or 1)) as pool:
        decoded = pool.map(_decode_shard, shards + tests)
    out: dict[str, Any] = {}
    for split, parts, urls in (
        ("train", decoded[:9], shards[:9]),
        ("val", decoded[9:10], shards[9:10]),
        ("test", decoded[10:], tests),
    ):
        keys = [k for p in parts for k in p[0]]
        shard = [seta.shard_name(u) for u, p in zip(urls, parts) for _ in p[0]]
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
    """The labels of ``kind`` (``clean``, ``sym40``, ``asym40``) for these keys."""
    import pyarrow as pa

    y = y.copy()
    if kind == "clean":
        return y
    if kind == "sym40":
        offsets = noise_offsets(pa.table({"key": keys.tolist()}), 10)
        pos = {k: i for i, k in enumerate(keys.tolist())}
        for k, off in offsets.items():
            y[pos[k]] = (y[pos[k]] + off) % 10
        return y
    if kind == "asym40":
        flips = asymmetric_offsets(keys.tolist(), y.tolist(), 0.4)
        pos = {k: i for i, k in enumerate(keys.tolist())}
        for k, new in flips.items():
            y[pos[k]] = new
        return y
    raise ValueError(f"unknown noise kind {kind!r}; expected clean, sym40 or asym40")


def fold_of(keys: np.ndarray, folds: int) -> np.ndarray:
    """Fold of every key for cleanlab's cross-validation: a hash of the key (fixed, seed-free)."""
    return np.array([int(_hash01(k, NOISE_SEED + 7) * folds) for k in keys.tolist()], dtype=np.int64)


# ------------------------------------------------------------------------------------ jobs
def job_list(kinds: tuple[str, ...] = KINDS, seeds: tuple[int, ...] = SEEDS, epochs: int = EPOCHS) -> list[dict]:
    """Every job in priority order: the rule against full data (early-stopped) and the oracle on
    both kinds of noise, then dynamic random and equal compute, then cleanlab, seed by seed."""
    jobs: list[dict] = []

    def add(kind: str, method: str, seed: int, **extra: Any) -> None:
        jobs.append(
            {"id": f"{kind}-{method}-s{seed}", "kind": kind, "method": method, "seed": seed, "epochs": epochs, **extra}
        )

    for kind in kinds:
        for seed in seeds:
            for method in ("full", "rule", "oracle"):
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


def _policy(job: dict, results: dict) -> tuple[str, dict]:
    m = job["method"]
    if m == "rule":
        return "full", {"noise": True}
    if m == "dynrand":
        rule = results[f"{job['kind']}-rule-s{job['seed']}"]
        return "random", {"r": round(rule["pruned"], 4)}
    return "full", {}


def _lr(p: float) -> float:
    """Warm-up over the first 10% of training, then cosine to 0; ``p`` in [0, 1]."""
    return LR * (p / 0.1 if p < 0.1 else 0.5 * (1 + math.cos(math.pi * min(1.0, (p - 0.1) / 0.9))))


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
    from benchmarks.quality.models import image_model

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    torch.backends.cudnn.benchmark = True
    torch.set_num_threads(2 if dev == "cuda" else 1)
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
        use = fold_of(keys, FOLDS) != job["fold"]
    elif method == "cleanlab":
        from cleanlab.filter import find_label_issues

        probs = np.zeros((len(keys), 10), dtype=np.float32)
        folds = fold_of(keys, FOLDS)
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
        lr=LR,
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
    gen.manual_seed(seed)

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
        str(run_dir), policy=policy, params=params, epochs=epochs, seed=seed, population=population, batch_size=B
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
    rng = np.random.default_rng([seed, 20261127])
    for epoch in range(epochs):
        t0 = time.perf_counter()
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*small_final_batch.*|.*final batch.*")
            summary = pruner.start_epoch(epoch)
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
        steps = math.ceil(len(idx) / B)
        idx_dev, w_dev = torch.from_numpy(idx).to(dev), torch.from_numpy(w).to(dev)
        losses = torch.empty(len(idx), device=dev)
        for s in range(steps):
            sl = slice(s * B, (s + 1) * B)
            if budget is not None:
                p = (seen_total + s * B) / budget
            else:
                p = (epoch + s / steps) / epochs
            for g in opt.param_groups:
                g["lr"] = _lr(p)
            bi = idx_dev[sl]
            with amp:
                logits = model(prep(_augment(torch, x_all[bi], gen)))
            per = F.cross_entropy(logits.float(), y_all[bi], reduction="none")
            opt.zero_grad(set_to_none=True)
            seta.weighted_mean(per, w_dev[sl], batch_size=B).backward()
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
        held = np.flatnonzero(fold_of(keys, FOLDS) == job["fold"])
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
    say(f"prepared {cache} in {time.time() - t_start:.1f}s")
    jobs = job_list(tuple(args.kinds.split(",")), tuple(int(s) for s in args.seeds.split(",")), args.epochs)
    if args.only:
        jobs = [j for j in jobs if re.search(args.only, j["id"])]
    results: dict[str, dict] = {}
    if (out / "results.json").exists():
        results = json.loads((out / "results.json").read_text())["runs"]
    meta = {"commit": args.commit, "argv": sys.argv[1:], "batch": B, "lr": LR, "weight_decay": WD, "folds": FOLDS}
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
            results[r["id"]] = r
        tmp = out / "results.json.tmp"
        tmp.write_text(json.dumps({"meta": meta, "runs": results}, indent=1))
        os.replace(tmp, out / "results.json")

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
            (work / f"{ready['id']}.job.json").write_text(json.dumps({"job": ready, "results": results}))
            cmd = [
                sys.executable,
                __file__,
                "--job",
                str(work / f"{ready['id']}.job.json"),
                "--work",
                str(work),
                "--model",
                args.model,
            ]
            running[ready["id"]] = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
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
    p.add_argument("--model", default="resnet18", help="resnet18 (the study) or cnn (smoke runs on a CPU)")
    p.add_argument("--limit", type=int, help="samples per split (smoke runs)")
    p.add_argument("--commit", default="", help="the commit the run's code is at (recorded)")
    p.add_argument("--smoke", action="store_true", help="tiny CPU run: cnn, 400 samples a split, 3 epochs, one seed")
    p.add_argument("--job", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.job:
        return job_main(args)
    if args.smoke:
        args.model, args.limit, args.epochs, args.seeds, args.jobs = "cnn", args.limit or 400, 3, "0", 2
    args.work = args.work or str(Path(args.out) / "work")
    manage(args)


if __name__ == "__main__":
    main()
