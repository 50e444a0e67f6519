"""Planning only, on the runs bench_scale.py kept (--keep; made here when missing): a SeTa plan
of epoch 1, the same with ``noise=True``, and a dynamic random plan, each in a fresh process
(wall time, peak RSS), beside the floor (read the losses, sort them) measured in the same run.
Time per sample against the smallest N tells whether planning stays flat with N.

    python benchmarks/bench_scale_plan.py --n 15000000 200000000
"""

from __future__ import annotations

import argparse
import json

from common import OUT, Result, measure

PLANS = {
    "plan_seta": (
        "plan_epoch(run, 1, force=True, policy='seta', params=dict(r=0.1, k=10, alpha=0.5), epochs=10, seed=0)"
    ),
    "plan_seta_noise": (
        "plan_epoch(run, 1, force=True, policy='seta', params=dict(r=0.1, k=10, alpha=0.5, noise=True), "
        "epochs=10, seed=0)"
    ),
    "plan_random": "plan_epoch(run, 1, force=True, policy='random', params=dict(r=0.3))",
}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, nargs="+", default=[15_000_000])
    p.add_argument("--result", default=None, help="result file name (default scale-plan-N1-N2...)")
    args = p.parse_args()
    from bench_scale import floor, one_size

    res = Result(args.result or "scale-plan-" + "-".join(str(n) for n in args.n), title="Planning at web scale")
    rows, floors = [], {}
    for n in args.n:
        run = OUT / f"scale-{n}"
        if not (run / "table/manifest.json").exists():
            one_size(n, keep=True, buckets=None)
        setup = f"from seta_stream import plan_epoch\nrun = {str(run)!r}"
        m = {k: measure(code, setup) for k, code in PLANS.items()}
        floors[n] = floor(run)
        print(json.dumps({"n": n, **m, "floor": floors[n]}), flush=True)
        for step, r in [*m.items(), ("floor", floors[n])]:
            rows.append(
                {
                    "n": n,
                    "step": step,
                    "wall_s": r["wall_s"],
                    "ns_per_sample": r["wall_s"] / n * 1e9,
                    "over_floor": r["wall_s"] / floors[n]["wall_s"],
                    "peak_rss_mb": r["peak_rss_mb"],
                }
            )
    first = min(args.n)
    notes = []
    for row in rows:
        base = next(r for r in rows if r["n"] == first and r["step"] == row["step"])
        row["per_sample_vs_smallest_n"] = row["ns_per_sample"] / base["ns_per_sample"]
    for n in args.n:
        if n != first:
            for step in PLANS:
                row = next(r for r in rows if r["n"] == n and r["step"] == step)
                notes.append(
                    f"{step} at {n:,}: {row['per_sample_vs_smallest_n']:.2f}x the time per sample at {first:,}, "
                    f"peak RSS {row['peak_rss_mb']:,.0f} MB."
                )
    res.write(
        baseline={
            "what": "floor at each N: read the table's losses and np.sort them, fresh process (rows 'floor')",
            **{f"wall_s_at_{n}": f["wall_s"] for n, f in floors.items()},
        },
        rows=rows,
        peak_rss_mb=max(r["peak_rss_mb"] for r in rows if r["step"] != "floor"),
        notes=notes,
        params=vars(args),
    )


if __name__ == "__main__":
    main()
