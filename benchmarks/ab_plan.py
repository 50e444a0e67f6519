"""Alternating A/B of planning at N samples between two source trees of seta_stream (this
checkout and, say, a `git worktree` of an earlier commit): timings on this VM drift by 30%
over minutes, so two versions are only compared in the same period, interleaved.

Each round plans epochs 1 and 2 of the run ``bench_plan.py`` made (``OUT/plan-N``), each in a
fresh process after --idle seconds idle (5), with tree A and then tree B; prints every plan and the medians.

    git worktree add /tmp/prev <commit>
    python -m benchmarks ab_plan /tmp/prev . [--rounds 5] [--n 15000000]
    python -m benchmarks ab_plan /tmp/prev . --rounds 2 --run bench-out/scale-100000000   # a partitioned run
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import time
from pathlib import Path

from benchmarks.bench_plan import prepared
from benchmarks.common import Result, measure, timed_plan_code, tree_commit, tree_label, tree_setup
from tools.results import path_label


def plan_twice(tree: Path, run: Path, idle: float = 5.0, params: str = "dict(r=0.0, k=10, alpha=0.5)") -> list[dict]:
    """Epochs 1 and 2 of a new run over ``run``'s table, each in a fresh process importing
    seta_stream from ``tree``, after 5 s idle (:func:`common.timed_plan_code`)."""
    shutil.rmtree(run / "plans", ignore_errors=True)
    (run / "state.json").unlink(missing_ok=True)
    os.sync()
    setup = tree_setup(tree)
    out = []
    for args in (f"1, policy='seta', params={params}, epochs=10, seed=0", "2"):
        time.sleep(idle)
        out.append(measure(timed_plan_code(run, args), setup))
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("a", type=Path, help="source tree A (holds seta_stream/)")
    p.add_argument("b", type=Path, help="source tree B")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--n", type=int, default=15_000_000)
    p.add_argument("--run", type=Path, help="plan this run instead (e.g. one bench_scale.py --keep made)")
    p.add_argument("--idle", type=float, default=5.0, help="seconds idle before each plan")
    p.add_argument("--params", default="dict(r=0.0, k=10, alpha=0.5)", help="SeTa's params (e.g. add noise=True)")
    p.add_argument("--result", default=None, help="result file name (default ab-plan-N, or ab-plan-RUN)")
    args = p.parse_args()
    name = args.result or (f"ab-plan-{args.n}" if not args.run else f"ab-plan-{args.run.name}")
    res = Result(name, title=f"Planning SeTa {args.params}: tree A against tree B, alternating")
    run = args.run.resolve() if args.run else prepared(args.n)
    if not (run / "table/manifest.json").exists():
        raise SystemExit(f"{run}: no loss table")
    walls: dict[str, list[list[float]]] = {"A": [], "B": []}
    rss: dict[str, list[float]] = {"A": [], "B": []}
    cpu: dict[str, list[float]] = {"A": [], "B": []}
    for r in range(args.rounds):
        for name, tree in (("A", args.a), ("B", args.b)):
            m = plan_twice(tree, run, args.idle, args.params)
            w = [x["wall_s"] for x in m]
            walls[name].append(w)
            rss[name].extend(x["peak_rss_mb"] for x in m)
            cpu[name].extend(x["cpu_s"] for x in m)
            print(f"round {r + 1} {name}: epoch 1 {w[0]:.2f} s, epoch 2 {w[1]:.2f} s", flush=True)
    rows = []
    for name, tree in (("A", args.a), ("B", args.b)):
        e1 = statistics.median(w[0] for w in walls[name])
        e2 = statistics.median(w[1] for w in walls[name])
        every = [x for w in walls[name] for x in w]
        print(
            f"{name} ({tree}): medians {e1:.2f} / {e2:.2f} s (epochs 1 / 2); "
            f"all {min(every):.2f} - {max(every):.2f} s, median {statistics.median(every):.2f} s"
        )
        rows.append(
            {
                "tree": f"{name}: {tree_label(tree)}",
                "commit": (tree_commit(tree) or "?")[:10],
                "epoch1_median_s": e1,
                "epoch2_median_s": e2,
                "median_s": statistics.median(every),
                "cpu_median_s": statistics.median(cpu[name]),
                "min_s": min(every),
                "max_s": max(every),
                "peak_rss_mb": max(rss[name]),
            }
        )
    ratio = rows[1]["median_s"] / rows[0]["median_s"]
    cpu_ratio = rows[1]["cpu_median_s"] / rows[0]["cpu_median_s"]
    rss_ratio = rows[1]["peak_rss_mb"] / rows[0]["peak_rss_mb"]
    print(f"B / A (medians): {ratio:.2f}x wall, {cpu_ratio:.2f}x CPU, {rss_ratio:.2f}x peak RSS")
    res.write(
        baseline={"what": f"tree A ({tree_label(args.a)}), alternating with B in the same period", **rows[0]},
        rows=rows,
        peak_rss_mb=rows[1]["peak_rss_mb"],  # tree B's: the code measured against A
        figures={
            "b_over_a": ratio,
            "b_over_a_cpu": cpu_ratio,
            "b_over_a_peak_rss": rss_ratio,
            "a_runs_s": walls["A"],
            "b_runs_s": walls["B"],
        },
        notes=[
            f"B / A (medians of {args.rounds} alternating rounds of two fresh-process plans each): {ratio:.2f}x "
            f"the wall time, {cpu_ratio:.2f}x the CPU time (all threads), {rss_ratio:.2f}x the peak RSS."
        ],
        params={k: path_label(v) if isinstance(v, Path) else str(v) for k, v in vars(args).items()},
    )


if __name__ == "__main__":
    main()
