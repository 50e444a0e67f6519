"""Planning only, on the runs bench_scale.py kept (--keep; made here when missing): a SeTa plan
of epoch 1, the same with ``noise=True``, and a dynamic random plan, each in a fresh process
(wall time, peak RSS), beside the floor (read the losses, sort them) measured in the same run.
Time per sample against the smallest N tells whether planning stays flat with N. With
``--repeat R`` each plan and the floor are measured R times, round by round (each round plans
every step once, at every N one after the other), and the median is reported with the fastest
and slowest, beside each round's ratio of the time per sample (the sizes paired in one period).

    python -m benchmarks bench_scale_plan --n 15000000 200000000 --repeat 3
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from benchmarks.bench_scale import PLANS, floor, one_size
from benchmarks.common import OUT, Result, measure, read_through
from tools.results import mean_se


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, nargs="+", default=[15_000_000])
    p.add_argument("--repeat", type=int, default=1, help="rounds at each N (the median is reported)")
    p.add_argument("--result", default=None, help="result file name (default scale-plan-N1-N2...)")
    args = p.parse_args()
    res = Result(args.result or "scale-plan-" + "-".join(str(n) for n in args.n), title="Planning at web scale")
    rows, floors = [], {}
    runs_at = {n: OUT / f"scale-{n}" for n in args.n}
    for n, run in runs_at.items():
        if not (run / "table/manifest.json").exists():
            one_size(n, keep=True, buckets=None)
    # every N in each round, one after the other: the sizes are compared in the same period
    # (timings on this VM drift by 30% over minutes), and each round's ratio is paired
    runs: dict[int, dict[str, list[dict]]] = {n: {k: [] for k in [*PLANS, "floor"]} for n in args.n}
    for _ in range(args.repeat):
        for n, run in runs_at.items():
            _warm(run)
            setup = f"from seta_stream import plan_epoch\nrun = {str(run)!r}"
            for k, code in PLANS.items():
                runs[n][k].append(measure(code, setup))
            runs[n]["floor"].append(floor(run))
            print(json.dumps({"n": n, **{k: v[-1] for k, v in runs[n].items()}}), flush=True)
    for n in args.n:
        m = {k: _median(v) for k, v in runs[n].items()}
        floors[n] = m["floor"]
        for step, r in m.items():
            rows.append(
                {
                    "n": n,
                    "step": step,
                    "wall_s": r["wall_s"],
                    "fastest_s": r["fastest_s"],
                    "slowest_s": r["slowest_s"],
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
        # the same ratio round by round (each round's two sizes measured minutes apart at most)
        paired = [
            (a["wall_s"] / row["n"]) / (b["wall_s"] / first)
            for a, b in zip(runs[row["n"]][row["step"]], runs[first][row["step"]])
        ]
        mean, se = mean_se(paired)
        row["per_sample_vs_smallest_n_rounds"] = paired
        row["per_sample_vs_smallest_n_paired_mean"] = mean
        row["per_sample_vs_smallest_n_paired_se"] = float("nan") if se is None else se
    for n in args.n:
        if n != first:
            for step in PLANS:
                row = next(r for r in rows if r["n"] == n and r["step"] == step)
                rounds = ", ".join(f"{x:.2f}" for x in row["per_sample_vs_smallest_n_rounds"])
                notes.append(
                    f"{step} at {n:,}: {row['per_sample_vs_smallest_n']:.2f}x the time per sample at {first:,} "
                    f"(medians; round by round {rounds}: mean {row['per_sample_vs_smallest_n_paired_mean']:.2f}x, "
                    f"SE {row['per_sample_vs_smallest_n_paired_se']:.2f}), peak RSS {row['peak_rss_mb']:,.0f} MB."
                )
    res.write(
        baseline={
            "what": "floor at each N: read the table's losses and np.sort them, fresh process (rows 'floor'; "
            "the median of the rounds, as every step's)",
            **{f"wall_s_at_{n}": f["wall_s"] for n, f in floors.items()},
        },
        rows=rows,
        peak_rss_mb=max(r["peak_rss_mb"] for r in rows if r["step"] != "floor"),
        notes=notes,
        params=vars(args),
    )


def _warm(run: Path) -> None:
    """Read the run's table folder once, untimed: each size's plans start with its table in the
    page cache as far as it fits (as compaction leaves it), not after the other size's plans
    evicted it (in one probe the 15M noise plans, which read two columns more than SeTa's, took
    3.2, 4.5 and 5.3 s in three rounds after the 200M plans)."""
    read_through(run / "table")


def _median(results: list[dict]) -> dict:
    """The median wall time of ``results`` with the fastest and slowest, and the highest peak RSS."""
    walls = [r["wall_s"] for r in results]
    return {
        "wall_s": statistics.median(walls),
        "fastest_s": min(walls),
        "slowest_s": max(walls),
        "peak_rss_mb": max(r["peak_rss_mb"] for r in results),
    }


if __name__ == "__main__":
    main()
