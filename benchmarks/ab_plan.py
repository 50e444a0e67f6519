"""Alternating A/B of planning at N samples between two source trees of seta_stream (this
checkout and, say, a `git worktree` of an earlier commit): timings on this VM drift by 30%
over minutes, so two versions are only compared in the same period, interleaved.

Each round plans epochs 1 and 2 of the run ``bench_plan.py`` made (``OUT/plan-N``), each in a
fresh process after 5 s idle, with tree A and then tree B; prints every plan and the medians.

    git worktree add /tmp/prev <commit>
    python benchmarks/ab_plan.py /tmp/prev . [--rounds 5] [--n 15000000]
    python benchmarks/ab_plan.py /tmp/prev . --rounds 2 --run bench-out/scale-100000000   # a partitioned run
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import time
from pathlib import Path

from common import OUT, measure, tree_setup


def plan_twice(tree: Path, run: Path) -> list[float]:
    """Epochs 1 and 2 of a new run over ``run``'s table, each in a fresh process importing
    seta_stream from ``tree``, after 5 s idle."""
    shutil.rmtree(run / "plans", ignore_errors=True)
    (run / "state.json").unlink(missing_ok=True)
    os.sync()
    setup = tree_setup(tree)
    walls = []
    for code in (
        f"P.plan_epoch(P.RunDir({str(run)!r}), 1, policy='seta', params=dict(r=0.0, k=10, alpha=0.5), "
        "epochs=10, seed=0)",
        f"P.plan_epoch(P.RunDir({str(run)!r}), 2)",
    ):
        time.sleep(5)
        walls.append(measure(code, setup)["wall_s"])
    return walls


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("a", type=Path, help="source tree A (holds seta_stream/)")
    p.add_argument("b", type=Path, help="source tree B")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--n", type=int, default=15_000_000)
    p.add_argument("--run", type=Path, help="plan this run instead (e.g. one bench_scale.py --keep made)")
    args = p.parse_args()
    run = args.run.resolve() if args.run else OUT / f"plan-{args.n}"
    if not (run / "table/manifest.json").exists():
        raise SystemExit(f"{run}: no loss table; run bench_plan.py --n {args.n} first")
    walls: dict[str, list[list[float]]] = {"A": [], "B": []}
    for r in range(args.rounds):
        for name, tree in (("A", args.a), ("B", args.b)):
            w = plan_twice(tree, run)
            walls[name].append(w)
            print(f"round {r + 1} {name}: epoch 1 {w[0]:.2f} s, epoch 2 {w[1]:.2f} s", flush=True)
    for name, tree in (("A", args.a), ("B", args.b)):
        e1 = statistics.median(w[0] for w in walls[name])
        e2 = statistics.median(w[1] for w in walls[name])
        every = [x for w in walls[name] for x in w]
        print(
            f"{name} ({tree}): medians {e1:.2f} / {e2:.2f} s (epochs 1 / 2); "
            f"all {min(every):.2f} - {max(every):.2f} s, median {statistics.median(every):.2f} s"
        )


if __name__ == "__main__":
    main()
