"""Alternating A/B of planning at N samples between two source trees of seta_stream (this
checkout and, say, a `git worktree` of an earlier commit): timings on this VM drift by 30%
over minutes, so two versions are only compared in the same period, interleaved.

Each round plans epochs 1 and 2 of the run ``bench_plan.py`` made (``OUT/plan-N``), each in a
fresh process after 5 s idle, with tree A and then tree B; prints every plan and the medians.

    git worktree add /tmp/prev <commit>
    python benchmarks/ab_plan.py /tmp/prev . [--rounds 5] [--n 15000000]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

from common import OUT

PLAN_TWO_EPOCHS = """
import json, os, shutil, sys, time
sys.path.insert(0, {tree!r})
import seta_stream.plan as P
from seta_stream import RunDir
assert P.__file__.startswith({tree!r}), P.__file__
run = {run!r}
shutil.rmtree(run + "/plans", ignore_errors=True)
if os.path.exists(run + "/state.json"):
    os.remove(run + "/state.json")
os.sync()
walls = []
for e in (1, 2):
    time.sleep(5)
    t0 = time.perf_counter()
    if e == 1:
        P.plan_epoch(RunDir(run), 1, policy="seta", params=dict(r=0.0, k=10, alpha=0.5), epochs=10, seed=0)
    else:
        P.plan_epoch(RunDir(run), 2)
    walls.append(time.perf_counter() - t0)
print("RESULT" + json.dumps(walls))
"""


def plan_twice(tree: Path, run: Path) -> list[float]:
    prog = PLAN_TWO_EPOCHS.format(tree=str(tree.resolve()), run=str(run))
    proc = subprocess.run([sys.executable, "-c", prog], capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"planning with {tree} failed:\n{proc.stderr[-3000:]}")
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT"))
    return json.loads(line[len("RESULT") :])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("a", type=Path, help="source tree A (holds seta_stream/)")
    p.add_argument("b", type=Path, help="source tree B")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--n", type=int, default=15_000_000)
    args = p.parse_args()
    run = OUT / f"plan-{args.n}"
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
