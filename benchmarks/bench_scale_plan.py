"""Planning only, on the runs bench_scale.py kept (--keep): a SeTa and a dynamic random plan of
epoch 1, each in a fresh process (wall time, peak RSS).

    python benchmarks/bench_scale_plan.py --n 15000000 100000000
"""

from __future__ import annotations

import argparse
import json

from common import OUT, measure

PLANS = {
    "plan_seta": (
        "plan_epoch(run, 1, force=True, policy='seta', params=dict(r=0.1, k=10, alpha=0.5), epochs=10, seed=0)"
    ),
    "plan_random": "plan_epoch(run, 1, force=True, policy='random', params=dict(r=0.3))",
}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, nargs="+", default=[15_000_000])
    args = p.parse_args()
    for n in args.n:
        setup = f"from seta_stream import plan_epoch\nrun = {str(OUT / f'scale-{n}')!r}"
        print(json.dumps({"n": n, **{k: measure(code, setup) for k, code in PLANS.items()}}), flush=True)


if __name__ == "__main__":
    main()
