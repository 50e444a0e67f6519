"""One training run through the real pipeline -> its result dict (the content of a run file)."""

from __future__ import annotations

import math
import os
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np

from studies.quality.data import NOISE, Dataset, noise_offsets
from studies.quality.machine import machine_cpu, other_cpu, software
from studies.quality.models import image_model, text_model
from studies.quality.pipeline import ORDER, eval_batches, evaluate, select_text, train_loader


def lr_at(t: float, epochs: int, peak: float) -> float:
    """Epoch-based one-cycle: linear warm-up over the first 15% of training, then linear decay."""
    w = 0.15 * epochs
    return peak * (t / w if t < w else max(0.0, (epochs - t) / (epochs - w)))


def _set_lr(opts: list, lr: float) -> None:
    for o in opts:
        for g in o.param_groups:
            g["lr"] = lr


def _step(opts: list, loss: Any) -> None:
    """One optimiser step of every optimiser on ``loss``."""
    for o in opts:
        o.zero_grad(set_to_none=True)
    loss.backward()
    for o in opts:
        o.step()


def resume_path(runs: Path, rid: str) -> Path:
    """The checkpoint of run ``rid`` after its last finished epoch (removed once its result
    file is written)."""
    return runs / f"{rid}.resume.pt"


def _save_resume(path: Path, state: dict) -> None:
    import torch

    tmp = path.with_name(path.name + ".tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)


def train_run(ds: Dataset, cfg: dict, seed: int, runs: Path, population: Any, rid: str, device: str = "cpu",
              until: int | None = None, probe: Any = None, nominal_batch: bool = True,
              exclude: frozenset[str] | None = None) -> dict:  # fmt: skip
    """Train ``cfg`` (policy, params, noisy; converged study: n_epochs) with ``seed`` in ``runs/rid``.

    ``cfg["noise_rate"]``: the share of noisy labels (``noise_offsets``; 40% unless set).
    ``exclude``: keys of samples left out of the run altogether (the population the plans are made
    of and the loader both lack them; the oracle filter, a cross-validation fold); the noisy labels
    are those of the whole population. ``cfg["budget"]``: full data trained on exactly that many
    samples (an equal-compute run): training stops once the budget is spent, mid-batch if need
    be, within ``n_epochs`` epochs, and the learning-rate schedule spans budget / N epochs.

    ``nominal_batch``: every step's (weighted) loss is summed and divided by the nominal batch size
    ``ds.batch`` (``seta.weighted_mean(..., batch_size=ds.batch)``; Evolved Sampling's selected
    mini-batches alike), so the short last batch of an epoch makes a step in proportion to its
    samples (the small-final-batch remedy, docs/algorithms.md §0.10; the plan summaries record the
    batch size). False: each batch's loss is averaged over its own length, the loop of the result
    files written before the remedy (result ``nominal_batch``; the collapse experiments reproduce
    those runs' collapses with it).

    The converged study's runs (``cfg["study"] == "converged"``, or ``cfg["curve"]``) also record, after every epoch,
    the test accuracy, the samples trained so far, the training wall time so far (evaluation
    excluded) and the share of the machine other processes used meanwhile; and they resume: after
    every epoch the model, optimiser and per-epoch records go to :func:`resume_path` (after
    ``pruner.flush()``, the library's resume contract), and a rerun continues from the epoch after
    it (``start_epoch`` sets the interrupted epoch's loss parts aside). The result then lists the
    epochs resumed at and the library revision of each attempt (``resumed``); its wall times count
    the finished epochs of every attempt, not the lost part of an interrupted epoch. The data
    augmentation draws are not seeded (in 6-epoch runs either), so a resumed run is another
    sample of the same configuration, not a replay.

    ``device``: where the model trains (``cuda``: forward passes under bf16 autocast, each batch
    copied there); the result names it.

    ``until``, ``probe``: the collapse experiments (``collapse``): stop after epoch ``until`` (the
    schedule stays that of the whole run); ``probe.train_batch(model, opts, x, y, w)`` before each
    batch (False: the batch is not trained) and ``probe.after_epoch(model, opts, test_set,
    device)`` after each epoch's test accuracy, whose dict is the epoch's ``probe``.
    """
    import torch
    import torch.nn.functional as F

    import seta_stream as seta
    from seta_stream.ids import sample_uid, shard_name
    from seta_stream.policies import es_select

    policy, params, noisy = cfg["policy"], dict(cfg["params"]), cfg["noisy"]
    run_dir = str(runs / rid)
    # test accuracy after every epoch (split read once): the converged study, and runs that ask
    curve = cfg.get("study") == "converged" or bool(cfg.get("curve"))
    ckpt = resume_path(runs, rid)
    state = torch.load(ckpt, weights_only=False) if curve and ckpt.exists() else None
    if state is not None and (state["cfg"], state["seed"]) != (cfg, seed):
        state = None  # another configuration under this id: start afresh
    if state is None:
        ckpt.unlink(missing_ok=True)
        shutil.rmtree(run_dir, ignore_errors=True)
    torch.manual_seed(seed)
    image = ds.image
    model = image_model(cfg.get("model", "cnn")).to(memory_format=torch.channels_last) if image else text_model()
    model = model.to(device)
    cast = torch.autocast("cuda", dtype=torch.bfloat16, enabled=device.startswith("cuda"))
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
    test_set = list(eval_batches(ds, ds.test)) if curve else None
    meta = int(ds.batch / mini) if es_like else ds.batch
    noise = noise_offsets(population, ds.classes, cfg.get("noise_rate", NOISE)) if noisy else None
    if exclude:
        import pyarrow as pa
        import pyarrow.compute as pc

        population = population.filter(pc.invert(pc.is_in(population.column("key"), pa.array(sorted(exclude)))))
    budget = cfg.get("budget")
    if budget is not None and es_like:
        raise ValueError("a sample budget applies to the plain training loop, not to ES's selection")
    horizon = budget / len(population) if budget is not None else n_epochs  # the lr schedule's length in epochs
    # the loader's batch size: the plan summaries record it (and warn of a short last batch)
    pruner = seta.Pruner(run_dir, policy=policy, params=params, epochs=n_epochs, seed=seed, population=population,
                         batch_size=meta)  # fmt: skip
    divisor = ds.batch if nominal_batch else None  # None: the batch's own length
    start = len(state["epochs"]) if state is not None else 0
    loader = train_loader(ds, run_dir, seed, noise, es_like, meta, augment=cfg.get("augment", True), start_epoch=start,
                          exclude=exclude)  # fmt: skip
    epochs: list[dict] = []
    train_s = 0.0  # wall time without the per-epoch evaluation
    samples = 0
    elapsed = 0.0  # wall time of the finished epochs of earlier attempts
    rev = os.environ.get("STUDY_REV", "working tree")
    attempts = [{"epoch": 0, "library_rev": rev}]
    if state is not None:
        model.load_state_dict(state["model"])
        for o, o_state in zip(opts, state["opts"]):
            o.load_state_dict(o_state)
        torch.set_rng_state(state["torch_rng"])
        epochs, train_s, samples, elapsed = state["epochs"], state["train_s"], state["samples"], state["seconds"]
        attempts = state["attempts"] + [{"epoch": len(epochs), "library_rev": rev}]
        print(f"    resumed at epoch {len(epochs)}", flush=True)
    t_run = time.perf_counter() - elapsed
    for epoch in range(len(epochs), n_epochs):
        t0 = time.perf_counter()
        cpu0 = machine_cpu()
        summary = pruner.start_epoch(epoch)
        active = es_like and bool(summary.get("active"))
        steps = max(1, math.ceil(summary["kept"] / (meta if active else ds.batch)))
        step = streamed = backprop = 0
        loss_sum = 0.0
        for batch in loader:
            x, y, keys, urls, w = batch[:5]
            x = x.to(device, non_blocking=True) if image else x
            y = torch.as_tensor([int(v) for v in y]).to(device)
            streamed += len(keys)
            if es_like:
                with torch.no_grad(), cast:
                    losses = F.cross_entropy(model(x), y, reduction="none").float()
                if active:
                    uids = [sample_uid(shard_name(u), k) for u, k in zip(urls, keys)]
                    scores = np.asarray(batch[5], np.float64)
                    pick = es_select(losses.cpu(), scores, mini_ratio=mini, beta1=0.2, seed=seed, epoch=epoch, rank=0,
                                     step=step, uids=uids)  # fmt: skip
                    chunks = [torch.from_numpy(np.flatnonzero(pick))]
                else:  # warm-up / annealing: the meta-batch as ordinary mini-batches
                    pick = np.ones(len(keys), bool)
                    chunks = list(torch.arange(len(keys)).split(ds.batch))
                pruner.record(keys, urls, losses, trained=pick)
                loss_sum += float(losses.sum())
                for idx in chunks:
                    _set_lr(opts, lr_at(epoch + min(step, steps) / steps, n_epochs, peak))
                    xs = x[idx] if image else select_text(x, idx)
                    with cast:
                        loss = F.cross_entropy(model(xs), y[idx], reduction="sum") / (divisor or len(idx))
                    _step(opts, loss)
                    step += 1
                    backprop += len(idx)
                continue
            if budget is not None:  # an equal-compute run: its first ``budget`` samples, then no more
                left = budget - sum(e["backprop"] for e in epochs) - backprop
                if left <= 0:
                    continue
                if left < len(keys):
                    idx = torch.arange(left)
                    x, y, w = (x[idx] if image else select_text(x, idx)), y[:left], w[:left]
                    keys, urls = keys[:left], urls[:left]
            _set_lr(opts, lr_at(epoch + min(step, steps) / steps, horizon, peak))
            if probe is not None and not probe.train_batch(model, opts, x, y, w):
                continue
            with cast:
                losses = F.cross_entropy(model(x), y, reduction="none").float()
            pruner.record(keys, urls, losses)
            _step(opts, seta.weighted_mean(losses, w, batch_size=divisor))
            step += 1
            loss_sum += float(losses.detach().sum())
            backprop += len(keys)
        record = {"epoch": epoch, **{k: summary[k] for k in ("phase", "n", "kept")}, "streamed": streamed}
        record.update(
            backprop=backprop, train_loss=loss_sum / max(streamed, 1), seconds=round(time.perf_counter() - t0, 2)
        )
        epochs.append(record)
        if curve:
            train_s += time.perf_counter() - t0
            samples += streamed
            epochs[-1].update(other_cpu=round(other_cpu(cpu0, machine_cpu()), 3), load1=round(os.getloadavg()[0], 2),
                              samples=samples, train_seconds=round(train_s, 2),
                              test_acc=evaluate(model, test_set, device))  # fmt: skip
            if probe is not None:
                epochs[-1]["probe"] = probe.after_epoch(model, opts, test_set, device)
        print(
            f"    epoch {epoch} {summary['phase']:<6} kept {100 * summary['kept'] / summary['n']:5.1f}% "
            f"loss {loss_sum / max(streamed, 1):.3f} {time.perf_counter() - t0:5.1f}s",
            flush=True,
        )
        if curve:
            pruner.flush()
            _save_resume(ckpt, {"cfg": cfg, "seed": seed, "model": model.state_dict(),
                                "opts": [o.state_dict() for o in opts], "torch_rng": torch.get_rng_state(),
                                "epochs": epochs, "train_s": train_s, "samples": samples,
                                "seconds": time.perf_counter() - t_run, "attempts": attempts})  # fmt: skip
        if until is not None and epoch >= until:
            break
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
        "val_acc": evaluate(model, eval_batches(ds, ds.val), device),
        "test_acc": evaluate(model, test_set or eval_batches(ds, ds.test), device),
        "device": device,
        "nominal_batch": nominal_batch,
        "seconds": round(seconds, 1),
        "torch_threads": torch.get_num_threads(),
        "order": ORDER,
        "library_rev": attempts[0]["library_rev"],
        "software": software(),
    }
    if len(attempts) > 1:
        result["resumed"] = attempts[1:]
    del loader
    return result
