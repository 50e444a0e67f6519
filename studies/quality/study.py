"""The accuracy studies' jobs for the runner (``harness``): the short study and the converged study.

Short: rounds of (data set, seeds) (``--order``), each round's configurations before the next
round, so an interrupted study has whole seeds; full data of seed 0 first, then its calibration
(``calibrate``), then the configurations it decides. Converged: ``configs.converged_plan``, read again
after every run (the calibration on seed 0's full run decides the pruned settings, the pruned
fractions seed 0 measures decide the equal-compute runs); several processes may share it.
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

from studies.quality import harness
from studies.quality.calibrate import calibrate
from studies.quality.configs import (
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
from studies.quality.harness import Job
from studies.quality.layout import Layout

PRIOR_RATE = {"pairs": 1.6e-3, "cifar10": 1.0e-3, "sst2": 0.2e-3, "cal": 60.0}
TRAIN_SIZE = {"cifar10": 45000, "sst2": 65000}


def _job(name: str, cfg: dict, seed: int, rid: str, needs: tuple[str, ...] = ()) -> Job:
    epochs = cfg.get("n_epochs") or {"cifar10": 6, "sst2": 5}[name]
    return Job(rid, name, {"dataset": name, "cfg": cfg, "seed": seed}, needs, TRAIN_SIZE[name] * epochs)


def short_plan(ctx: harness.Ctx) -> list[Job]:
    a = ctx.args
    wanted = [d for d in a.datasets.split(",") if d]
    order = [(n, list(range(a.seeds))) for n in wanted] if a.seeds else parse_order(a.order or DEFAULT_ORDER, wanted)
    jobs = []
    for name, seeds in order:
        full0, cal = run_id(name, FULL, 0), f"{name}-calibration"
        jobs += [_job(name, FULL, 0, full0), Job(cal, "cal", {"dataset": name, "full": full0}, (full0,))]
        if (c := harness.load(ctx, cal)) is None:  # the runs its settings decide, not known yet
            jobs += [Job(f"{name}-tbd-s{s}", "pending", {"wildcard": True}, (cal,)) for s in seeds]
        jobs += [_job(name, cfg, s, run_id(name, cfg, s), (cal,)) for s in seeds for cfg in (configs(c) if c else [])]
    return list({j.rid: j for j in jobs}.values())


def converged_plan_jobs(ctx: harness.Ctx) -> list[Job]:
    E, augment, model = ctx.args.epochs or (3 if ctx.smoke else CONVERGED_E), not ctx.args.no_augment, ctx.args.model
    cal = conv_calibration_name(E, augment, model)[: -len(".json")]
    full0 = conv_run_id(conv_full(E, E, augment, model), 0)
    c = harness.load(ctx, cal)
    measured = [r["pruned"] for x in (conv_pruned(E, c, augment, model) if c else [])
                if (r := harness.load(ctx, conv_run_id(x, 0)))]  # fmt: skip
    jobs = [] if c else [Job(f"cifar10-{E}-tbd", "pending", {"wildcard": True}, (cal,))]
    for cfg, seed in converged_plan(E, ctx.seeds, c, measured, augment, model):
        jobs.append(_job("cifar10", cfg, seed, conv_run_id(cfg, seed), (cal,) if cfg["policy"] != "full" else ()))
        if cfg == conv_full(E, E, augment, model) and seed == 0:
            jobs.append(Job(cal, "cal", {"dataset": "cifar10", "full": full0, "epochs": E}, (full0,)))
    return jobs


def plan(ctx: harness.Ctx) -> list[Job]:
    return converged_plan_jobs(ctx) if ctx.args.study == "converged" else short_plan(ctx)


def run(ctx: harness.Ctx, job: Job, progress: list[str]) -> dict:
    from studies.quality.train import resume_path, train_run

    s = job.spec
    ds, population = harness.dataset(ctx, s["dataset"])
    if job.kind == "cal":
        full_dir = ctx.runs / s["full"]
        if not (full_dir / "state.json").exists():
            raise SystemExit(f"{full_dir}: the calibration needs the run directory of full data of seed 0")
        return calibrate(full_dir, population, s.get("epochs") or ds.epochs)
    result = train_run(ds, s["cfg"], s["seed"], ctx.runs, population, job.rid, device=ctx.args.device)
    resume_path(ctx.runs, job.rid).unlink(missing_ok=True)
    print(f"   -> pruned {100 * result['pruned']:.1f}% (backprop {100 * result['pruned_backprop']:.1f}%), "
          f"val {100 * result['val_acc']:.2f}%, test {100 * result['test_acc']:.2f}%", flush=True)  # fmt: skip
    if not ctx.args.keep_runs and s["seed"] != 0:  # seed 0 run directories stay for inspection and the checks
        shutil.rmtree(ctx.runs / job.rid, ignore_errors=True)
    return result


def prepare(ctx: harness.Ctx, jobs: int) -> None:
    """The data sets are prepared by the first job that reads them (under a lock)."""


def layout(args: argparse.Namespace) -> Layout:
    d = Layout()
    return Layout(
        Path(args.results or d.results).resolve(), Path(args.out or d.out).resolve(), Path(args.data or d.data)
    )


def context(args: argparse.Namespace) -> harness.Ctx:
    d = layout(args)
    results = d.converged if args.study == "converged" else d.results
    seeds = args.seeds or (CONVERGED_SEEDS if args.study == "converged" else 0)
    return harness.context(args, results, d.out, label_data=d.data, seeds=seeds)


def report(ctx: harness.Ctx) -> None:
    from studies.quality.reports import report_quality

    report_quality(layout(ctx.args))


def after(ctx: harness.Ctx) -> None:
    left = harness.todo(ctx, plan(ctx))
    print(f"== {len(left)} runs left (crashed ones run again in the next invocation)", flush=True)
