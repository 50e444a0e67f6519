"""Web scale: record -> compact -> plan on synthetic ST+MJ-shaped runs of N samples (5,000 per
shard, MJSynth-like keys), partitioned as a run whose dataset_size is N is by default (one bucket
up to 16,777,216 samples, else B = ceil(N / 8,388,608) buckets; ``--buckets`` sets B), one process
on this machine.

Per size: epoch 0's parts (every sample new) and their first compaction, epoch 1's parts (every
sample known) and the steady compaction, then a SeTa plan of epoch 1 (k-means window), the same
with ``noise=True`` (20% of the samples, ``--noisy``, have a high loss in both epochs: the rule
finds them) and a dynamic random plan. Baseline in the same run, at each N: the floor of any
planner, reading the losses and sorting them (``floor``). Wall time, peak RSS (each step in a
fresh process), time per sample, and disk per epoch. Parts are written as LossRecorder writes
them, 1,048,576 records each, in samples order (the same shards in every part: records of one
rank arrive shard by shard).

    python -m benchmarks bench_scale --n 15000000 100000000 200000000
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

from benchmarks.common import OUT, Result, machine, measure, table_files_code, write_epoch_parts

#: The plans of epoch 1 measured at each size (here and, on the runs kept, by bench_scale_plan.py).
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


def write_epoch(run_path: Path, n: int, epoch: int, noisy: float = 0.0) -> float:
    """Parts of one epoch: every sample once, rank = part parity; returns seconds."""
    return write_epoch_parts(run_path, n, epoch, noisy=noisy)


def floor(run: Path) -> dict:
    """The baseline measured beside the steps: read the losses of every table file and sort them
    (np.sort, float32), in a fresh process: what any planner of N losses pays at least."""
    return measure(
        """
        loss = np.concatenate([pq.read_table(f, columns=['last_loss'], memory_map=True).column('last_loss')
                               .to_numpy() for f in files])
        np.sort(loss)
        """,
        "import numpy as np, pyarrow.dataset, pyarrow.parquet as pq\n" + table_files_code(run),
    )


def disk(path: Path, pattern: str) -> int:
    return sum(p.stat().st_size for p in path.glob(pattern) if p.is_file())


def one_size(n: int, keep: bool, buckets: int | None, noisy: float = 0.2) -> dict:
    from seta_stream import RunDir

    run = OUT / f"scale-{n}"
    shutil.rmtree(run, ignore_errors=True)
    RunDir(run, create=True, settings={"dataset_size": n, "buckets": buckets})
    buckets = RunDir(run).buckets
    setup = f"from seta_stream import compact, plan_epoch\nrun = {str(run)!r}"
    out: dict = {"n": n, "buckets": buckets}
    out["write_epoch0_s"] = write_epoch(run, n, 0, noisy)
    out["compact_first"] = measure("compact(run)", setup)
    out["write_epoch1_s"] = write_epoch(run, n, 1, noisy)
    parts1 = disk(run, "losses/rank=*/epoch=1/*.parquet")
    out["compact_steady"] = measure("compact(run)", setup)
    for step, code in PLANS.items():  # the SeTa plans, then the random one
        out[step] = measure(code, setup)
    summary = json.loads((run / "plans/epoch=1/summary.json").read_text())
    out["kept"] = summary["kept"]
    out["floor"] = floor(run)
    table = json.loads((run / "table/manifest.json").read_text())["table"]
    out["disk_mb"] = {
        "parts_per_epoch": parts1 / 1e6,
        "table": disk(run, table + "/*" if (run / table).is_dir() else table) / 1e6,
        "plan": disk(run, "plans/epoch=1/**/*") / 1e6,  # plan.parquet, stage files (stage/ when partitioned)
    }
    if not keep:
        shutil.rmtree(run, ignore_errors=True)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, nargs="+", default=[15_000_000])
    p.add_argument("--keep", action="store_true", help="keep the run directories")
    p.add_argument("--buckets", type=int, help="buckets of every run (default: from N)")
    p.add_argument("--noisy", type=float, default=0.2, help="share of samples with a high, persistent loss")
    p.add_argument("--result", default=None, help="result file name (default scale-N1-N2...)")
    args = p.parse_args()
    res = Result(args.result or "scale-" + "-".join(str(n) for n in args.n), title="Web scale: record, compact, plan")
    rows = []
    for n in args.n:
        r = one_size(n, args.keep, args.buckets, args.noisy)
        rows.append(r)
        print(json.dumps(r), flush=True)
    print(f"\n## Web scale: record -> compact -> plan, one process ({machine()})\n")
    print("| N | buckets | step | wall s | ns / sample | over floor | peak RSS MB |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    table = []
    for r in rows:
        for step in ("floor", "compact_first", "compact_steady", *PLANS):
            m = r[step]
            table.append(
                {
                    "n": r["n"],
                    "buckets": r["buckets"],
                    "step": step,
                    "wall_s": m["wall_s"],
                    "ns_per_sample": m["wall_s"] / r["n"] * 1e9,
                    "over_floor": m["wall_s"] / r["floor"]["wall_s"],
                    "peak_rss_mb": m["peak_rss_mb"],
                }
            )
            print(
                f"| {r['n']:,} | {r['buckets']} | {step} | {m['wall_s']:.1f} | "
                f"{m['wall_s'] / r['n'] * 1e9:.0f} | {table[-1]['over_floor']:.2f} | {m['peak_rss_mb']:.0f} |"
            )
    print("\n| N | parts per epoch MB | table MB | plan MB |\n| --- | --- | --- | --- |")
    for r in rows:
        d = r["disk_mb"]
        print(f"| {r['n']:,} | {d['parts_per_epoch']:.0f} | {d['table']:.0f} | {d['plan']:.0f} |")
    res.write(
        baseline={
            "what": "floor at each N: read the table's losses and np.sort them, fresh process (rows 'floor')",
            **{f"wall_s_at_{r['n']}": r["floor"]["wall_s"] for r in rows},
        },
        rows=table,
        peak_rss_mb=max(t["peak_rss_mb"] for t in table if t["step"] != "floor"),
        figures={"runs": rows},
        params=vars(args),
    )


if __name__ == "__main__":
    main()
