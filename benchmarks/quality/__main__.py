"""The study's one command: ``python -m benchmarks.quality [--study short|converged] ...``.

python -m benchmarks.quality --data ../shared/data            # the short study (hours on 2 cores)
python -m benchmarks.quality --datasets sst2 --seeds 5        # one data set
python -m benchmarks.quality --study converged --threads 1    # the converged study (CIFAR-10)
python -m benchmarks.quality --study converged --model resnet18 --device cuda --workers 9 --epochs 30
python -m benchmarks.quality --report-only                    # docs/quality.md from the run files
"""

from __future__ import annotations

import argparse
from pathlib import Path

from .configs import CONVERGED_E, DEFAULT_ORDER
from .layout import Layout
from .models import IMAGE_MODELS


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.quality", description="Does pruning keep accuracy?")
    d = Layout()
    p.add_argument("--data", default=str(d.data))
    p.add_argument("--out", default=str(d.out))
    p.add_argument("--study", choices=("short", "converged"), default="short",
                   help="short: every policy at 6 (CIFAR-10) / 5 (SST-2) epochs; converged: CIFAR-10 at E, "
                        "full data at 2E and at equal compute")  # fmt: skip
    p.add_argument("--epochs", type=int, default=0, help=f"converged study: E (default {CONVERGED_E})")
    p.add_argument("--no-augment", action="store_true",
                   help="converged study: train without the random crops and flips (full data fits its training "
                        "set and stops improving sooner); its run files are named cifar10-noaug-E<E>-...")  # fmt: skip
    p.add_argument("--model", choices=IMAGE_MODELS, default="cnn",
                   help="converged study: the network (default the small CNN); another one's run files are named "
                        "cifar10-<model>-E<E>-...")  # fmt: skip
    p.add_argument("--device", default="cpu", help="torch device to train on, e.g. cuda (bf16 autocast there)")
    p.add_argument("--workers", type=int, default=0,
                   help="converged study: DataLoader workers decoding and augmenting (default 1; at most the 9 "
                        "training shards are read in parallel)")  # fmt: skip
    p.add_argument("--datasets", default="sst2,cifar10", help="short study: the data sets")
    p.add_argument("--seeds", type=int, default=0, help="seeds 0..N-1 (default: --order; converged: 2)")
    p.add_argument("--order", default=DEFAULT_ORDER, help=f"short study: rounds of data set:seeds ({DEFAULT_ORDER})")
    p.add_argument("--only", help="regex over run ids: run only the matching configurations")
    p.add_argument("--threads", type=int, default=1, help="torch threads of the training process")
    p.add_argument("--keep-runs", action="store_true", help="keep every run directory (default: seed 0 only)")
    p.add_argument("--results", default=str(d.results), help="folder of the per-run JSON files")
    p.add_argument("--report-only", action="store_true", help="rewrite docs/quality.md and its plots, train nothing")
    p.add_argument("--smoke", action="store_true", help="one shard, 3 epochs: checks the code paths only")
    args = p.parse_args(argv)
    layout = Layout(results=Path(args.results).resolve(), out=Path(args.out).resolve(), data=Path(args.data))
    if args.report_only:
        from .reading import report_readings
        from .reading_short import report_short_reading
        from .report import report_short
        from .report_collapses import report_collapses
        from .report_converged import SAME_ORDER, report_converged

        report_short(layout)
        report_converged(layout)
        report_converged(layout, SAME_ORDER)
        report_collapses(layout)
        report_readings(layout)
        report_short_reading(layout)
        return
    from .study import converged_study, short_study

    (converged_study if args.study == "converged" else short_study)(args, layout)


if __name__ == "__main__":
    main()
