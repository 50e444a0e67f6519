"""The studies' one command: ``python -m studies quality [--study NAME] ...`` (the runner: ``harness``).

python -m studies quality --data ../shared/data            # the short study (hours on 2 cores)
python -m studies quality --datasets sst2 --seeds 5        # one data set
python -m studies quality --study converged --threads 1    # the converged study (CIFAR-10)
python -m studies quality --study converged --model resnet18 --device cuda --workers 9 --epochs 30
python -m studies quality --study noise --jobs 14 --deadline 480   # = python -m studies noise_study ...
python -m studies quality --study pairs --snapshot         # = python -m studies pairs_study ...
python -m studies quality --report-only                    # every generated section of the docs
"""

from __future__ import annotations

import argparse
import importlib
import sys

from studies.quality.configs import CONVERGED_E, DEFAULT_ORDER
from studies.quality.models import IMAGE_MODELS

STUDIES = {"short": "study", "converged": "study", "noise": "noise", "pairs": "pairs"}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m studies quality", description="The accuracy studies.")
    p.add_argument("--study", choices=tuple(STUDIES), help="short (default): every policy at 6 (CIFAR-10) / 5 "
                   "(SST-2) epochs; converged: CIFAR-10 at E, full data at 2E and at equal compute; noise: the noise "
                   "rule (studies/noise_study.py); pairs: image-text pairs (studies/pairs_study.py)")  # fmt: skip
    p.add_argument("--jobs", type=int, default=1, help="parallel processes sharing the plan")
    p.add_argument("--only", help="regex over run ids: only the matching runs (and what they need)")
    p.add_argument("--deadline", type=float, help="seconds from now: start no run that would not finish by then, "
                   "stop the running ones there (.cut.json files)")  # fmt: skip
    p.add_argument("--results", help="folder of the per-run JSON files (default: the study's in docs/quality-runs)")
    p.add_argument("--out", help="data sets, run directories, claims (default: the study's in bench-out)")
    p.add_argument("--data", "--label-data", dest="data", help="folder with cifar10/ and sst2/ (../shared/data)")
    p.add_argument("--epochs", type=int, default=0, help=f"E (converged default {CONVERGED_E}; noise 10)")
    p.add_argument("--seeds", type=int, default=0, help="seeds 0..N-1 (default: the study's)")
    p.add_argument("--smoke", action="store_true", help="tiny data, 3 epochs: checks the code paths only")
    p.add_argument("--report-only", action="store_true", help="rewrite the generated docs from the run files")
    p.add_argument("--no-report", action="store_true", help="do not rewrite the reports at the end")
    q = p.add_argument_group("short and converged studies")
    q.add_argument("--no-augment", action="store_true", help="converged: no random crops and flips (noaug-E<E>)")
    q.add_argument("--model", choices=IMAGE_MODELS, default="cnn", help="converged: the network (<model>-E<E>)")
    q.add_argument("--device", default="cpu", help="torch device to train on, e.g. cuda (bf16 autocast there)")
    q.add_argument("--workers", type=int, default=0, help="converged: DataLoader workers (default 1)")
    q.add_argument("--datasets", default="sst2,cifar10", help="short study: the data sets")
    q.add_argument("--order", default=DEFAULT_ORDER, help=f"short study: rounds of data set:seeds ({DEFAULT_ORDER})")
    q.add_argument("--threads", type=int, default=1, help="torch threads of the training process")
    q.add_argument("--keep-runs", action="store_true", help="keep every run directory (default: seed 0 only)")
    p.add_argument("--no-labels", action="store_true", help="noise study: the pairs only")
    p.add_argument("--doc", help="pairs study: the generated report (default docs/quality-pairs.md)")
    p.add_argument("--snapshot", action="store_true", help="pairs study: run from a frozen copy of HEAD")
    for hidden in ("--started", "--until"):
        p.add_argument(hidden, type=float, default=None, help=argparse.SUPPRESS)
    p.add_argument("--procs", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    return p


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parser().parse_args(argv)
    if args.report_only and args.study is None:
        from studies.quality.reports import report_all

        return report_all()
    args.study = args.study or "short"
    study = importlib.import_module(f"{__package__}.{STUDIES[args.study]}")
    if args.snapshot:
        study.snapshot(["--study", args.study, *argv])
    ctx = study.context(args)
    if args.report_only:
        return study.report(ctx)
    from studies.quality import harness

    if args.worker:
        return harness.worker(ctx, study)
    harness.launch(ctx, study, ["--study", args.study, *argv], args.jobs)
    study.after(ctx)
    if not args.no_report:
        study.report(ctx)


if __name__ == "__main__":
    main()
