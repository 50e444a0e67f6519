"""Runs a study's plan: one result file per finished run, finished runs skipped (a study resumes)."""

from __future__ import annotations

import argparse
import fcntl
import json
import re
import shutil
from pathlib import Path
from typing import IO, Any

from benchmarks.common import write_json

from .calibrate import calibrate
from .configs import (
    CONVERGED_E,
    CONVERGED_SEEDS,
    DEFAULT_ORDER,
    FULL,
    configs,
    conv_calibration_name,
    conv_full,
    conv_pruned,
    conv_run_id,
    converged_plan,
    parse_order,
    run_id,
)
from .data import DATASETS, Cifar, Dataset
from .layout import Layout
from .train import resume_path, train_run


def run_one(ds: Dataset, cfg: dict, seed: int, rid: str, results: Path, layout: Layout, population: Any,
            args: argparse.Namespace) -> dict | None:  # fmt: skip
    """Train one configuration unless its result file exists; the result, or None if it failed."""
    path = results / f"{rid}.json"
    if path.exists():
        return json.loads(path.read_text())
    print(f"== {rid}", flush=True)
    try:
        result = train_run(ds, cfg, seed, layout.runs, population, rid, device=args.device)
    except Exception:  # one broken configuration must not stop a study of hours; it is rerun next time
        import traceback

        traceback.print_exc()
        print(f"   -> FAILED: {rid} (no result written)", flush=True)
        return None
    write_json(path, result)
    resume_path(layout.runs, rid).unlink(missing_ok=True)
    print(
        f"   -> pruned {100 * result['pruned']:.1f}% (backprop {100 * result['pruned_backprop']:.1f}%), "
        f"val {100 * result['val_acc']:.2f}%, test {100 * result['test_acc']:.2f}%, {result['seconds']:.0f}s",
        flush=True,
    )
    if not args.keep_runs and seed != 0:  # seed 0 run directories stay for inspection and the checks
        shutil.rmtree(layout.runs / rid, ignore_errors=True)
    return result


def short_study(args: argparse.Namespace, layout: Layout) -> None:
    """Every policy at 6 / 5 epochs, data set by data set in rounds of seeds (``--order``)."""
    import torch
    from tqdm import tqdm

    from seta_stream import list_samples

    from .report import report_short

    torch.set_num_threads(args.threads)
    layout.results.mkdir(parents=True, exist_ok=True)
    wanted = [d for d in args.datasets.split(",") if d]
    order = parse_order(args.order or DEFAULT_ORDER, wanted)
    if args.seeds:
        order = [(name, list(range(args.seeds))) for name in wanted]
    loaded: dict[str, tuple[Dataset, Any]] = {}
    bar = tqdm(desc="runs", unit="run")
    # rounds (data set, seeds): every configuration of a round before the next round, so an
    # interrupted study has whole seeds of each data set rather than a few configurations
    for name, seeds in order:
        if name not in loaded:
            ds: Dataset = DATASETS[name](layout.data, layout.out)
            ds.prepare()
            if args.smoke:  # every code path on one shard for 3 epochs (results are meaningless)
                ds.train, ds.epochs = ds.train[:1], 3
            loaded[name] = (ds, list_samples(ds.train))
        ds, population = loaded[name]

        cal_path = layout.results / f"{name}-calibration.json"
        todo: list[tuple[dict, int]] = []  # nothing more if full data (the calibration needs it) failed
        if (layout.results / f"{run_id(name, FULL, 0)}.json").exists() or run_one(
            ds, FULL, 0, run_id(name, FULL, 0), layout.results, layout, population, args
        ):
            if not cal_path.exists():
                cal = calibrate(layout.runs / run_id(name, FULL, 0), population, ds.epochs)
                write_json(cal_path, cal)
            cfgs = configs(json.loads(cal_path.read_text()))
            if args.only:
                cfgs = [c for c in cfgs if re.search(args.only, run_id(name, c, 0))]
            todo = [(c, s) for s in seeds for c in cfgs]
        for cfg, seed in todo:
            rid = run_id(name, cfg, seed)
            if not (layout.results / f"{rid}.json").exists() and run_one(
                ds, cfg, seed, rid, layout.results, layout, population, args
            ):
                bar.update(1)
        report_short(layout)
    bar.close()


def converged_study(args: argparse.Namespace, layout: Layout) -> None:
    """CIFAR-10 at E: full data at E and 2E, the pruned runs, the equal-compute full-data runs, seed by seed.

    The plan is recomputed after every run (``configs.converged_plan``): the calibration on
    seed 0's full run decides the pruned settings, and the pruned fractions seed 0 measures decide
    the equal-compute runs' lengths. Runs that fail are retried in the next invocation.
    """
    import torch

    from seta_stream import list_samples

    torch.set_num_threads(args.threads)
    res = layout.converged
    res.mkdir(parents=True, exist_ok=True)
    ds = Cifar(layout.data, layout.out)
    ds.workers = args.workers or ds.workers
    with _claim(layout.out / "claims" / "converged-plan.lock", wait=True):
        ds.prepare()  # once, if several processes start together
    E = args.epochs or CONVERGED_E
    if args.smoke:  # every code path on one shard (results are meaningless)
        ds.train, E = ds.train[:1], args.epochs or 3
    population = list_samples(ds.train)
    _converged_loop(args, layout, ds, E, population)


def _claim(path: Path, wait: bool) -> IO[str] | None:
    """An open file holding an exclusive ``flock`` on ``path`` (closing it releases the lock), or
    None when another process holds it and ``wait`` is false. The kernel drops a lock when its
    holder dies, so a killed study never leaves a claim behind."""
    path.parent.mkdir(parents=True, exist_ok=True)
    f = open(path, "a")  # noqa: SIM115 - the caller holds it open for as long as the claim lasts
    try:
        fcntl.flock(f, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
    except BlockingIOError:
        f.close()
        return None
    return f


def _converged_loop(args: argparse.Namespace, layout: Layout, ds: Dataset, E: int, population: Any) -> None:
    """Train the plan's next unclaimed run until none is left.

    Several processes may run this loop into the same results (one per core): a process claims a
    run by a lock it holds while training it, and reads the plan (the calibration, the runs left)
    under a lock of its own, so no run is trained by two processes at once.
    """
    failed: set[str] = set()
    claims = layout.out / "claims"
    while True:
        with _claim(claims / "converged-plan.lock", wait=True):
            todo = _converged_todo(args, layout, E, population, failed)
            held = None
            for cfg, seed in todo:
                if (held := _claim(claims / f"{conv_run_id(cfg, seed)}.lock", wait=False)) is None:
                    continue
                # the run may have been finished (and its claim dropped) since ``todo`` was read
                if (layout.converged / f"{conv_run_id(cfg, seed)}.json").exists():
                    held.close()
                    held = None
                    continue
                break
        if held is None:
            if todo:
                print(f"== the {len(todo)} runs left are being trained by other processes", flush=True)
            return
        with held:
            rid = conv_run_id(cfg, seed)
            if run_one(ds, cfg, seed, rid, layout.converged, layout, population, args) is None:
                failed.add(rid)


def _converged_todo(args: argparse.Namespace, layout: Layout, E: int, population: Any,
                    failed: set[str]) -> list[tuple[dict, int]]:  # fmt: skip
    """The plan's runs without a result file, in run order; writes the calibration once it can."""
    res = layout.converged
    augment, model = not args.no_augment, args.model
    cal_path = res / conv_calibration_name(E, augment, model)
    full_dir = layout.runs / conv_run_id(conv_full(E, E, augment, model), 0)
    if not cal_path.exists() and (res / f"{full_dir.name}.json").exists():
        if not (full_dir / "state.json").exists():
            raise SystemExit(f"{full_dir}: the calibration needs the run directory of full data at E, seed 0")
        write_json(cal_path, calibrate(full_dir, population, E))
    cal = json.loads(cal_path.read_text()) if cal_path.exists() else None
    measured = [json.loads(p.read_text())["pruned"] for c in (conv_pruned(E, cal, augment, model) if cal else [])
                if (p := res / f"{conv_run_id(c, 0)}.json").exists()]  # fmt: skip
    return [(c, s) for c, s in converged_plan(E, args.seeds or CONVERGED_SEEDS, cal, measured, augment, model)
            if (rid := conv_run_id(c, s)) not in failed and not (res / f"{rid}.json").exists()
            and not (args.only and not re.search(args.only, rid))]  # fmt: skip
