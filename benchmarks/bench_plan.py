"""Planning one SeTa epoch for N samples from an existing loss table (issue target at 15M:
<= 3 s wall, <= 2 GB peak RSS), beside the reference approach to the same step.

The reference implementation clusters the losses with scikit-learn ``KMeans(n_clusters=k,
random_state=0)`` and then walks the clusters in a Python loop (measured on this machine at
15M: 285 s and 16.2 GB, algorithms.md §11). The baseline here runs only its k-means call on the
same 1-D losses (the cheapest part of the reference step), at a subsample when N is large, and
extrapolates linearly to N; ratios are against that lower bound of the reference's time.

The table is written the way ``compact()`` writes tables (``TABLE_WRITE_OPTIONS``: LZ4, shard
dictionary-encoded); ``--table-compression zstd`` keeps the zstd file ``make_table_run`` writes
(``RunDir.publish_parquet``'s default), which reads about 2x slower.

Each repetition plans the next epoch of one run in a fresh process (a new plan directory, as in
training), beside one baseline run; the table reports medians and ranges.

    python benchmarks/bench_plan.py --n 15000000 [--repeat 5] [--baseline-n 1000000] [--table-compression zstd]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import time
from pathlib import Path

import pyarrow.parquet as pq
from common import OUT, machine, make_table_run, measure


def as_compacted(path: Path) -> Path:
    """Rewrite the run's table file with compact()'s write options (once; LZ4)."""
    from seta_stream._runfs import RunDir
    from seta_stream._table import TABLE_WRITE_OPTIONS

    rel = json.loads((path / "table/manifest.json").read_text())["table"]
    meta = pq.ParquetFile(path / rel).metadata
    codec = TABLE_WRITE_OPTIONS["compression"].upper()
    if meta.num_row_groups and meta.row_group(0).column(0).compression.startswith(codec):
        return path
    table = pq.read_table(path / rel)
    RunDir(path).publish_parquet(rel, table, **TABLE_WRITE_OPTIONS)
    return path


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=15_000_000)
    p.add_argument("--baseline-n", type=int, default=1_000_000)
    p.add_argument("--k", type=int, default=10)
    p.add_argument("--repeat", type=int, default=5, help="epochs planned (each in a fresh process)")
    p.add_argument("--table-compression", choices=["lz4", "zstd"], default="lz4")
    args = p.parse_args()
    if args.table_compression == "lz4":
        run = as_compacted(make_table_run(OUT / f"plan-{args.n}", args.n))
    else:
        run = make_table_run(OUT / f"plan-zstd-{args.n}", args.n)
    # plans of earlier invocations go first, then the disk settles: no timed run writes into
    # pages just freed by a deletion (a training run never deletes plans while planning)
    shutil.rmtree(run / "plans", ignore_errors=True)
    (run / "state.json").unlink(missing_ok=True)
    os.sync()
    # the table was just written by compact() in a training run, so its files are in the page
    # cache; after other work on this machine they may not be (one first run read them from
    # disk for 17 s): read them once, untimed
    manifest = json.loads((run / "table/manifest.json").read_text())
    for rel in (manifest["table"], manifest.get("keys")):
        if rel:
            with open(run / rel, "rb") as fh:
                while fh.read(1 << 24):
                    pass
    time.sleep(5)
    setup = f"""
        import seta_stream
        from seta_stream import plan_epoch, RunDir
        run = RunDir({str(run)!r})
    """
    base_n = min(args.n, args.baseline_n)
    ours, base = [], []
    for e in range(1, args.repeat + 1):  # epoch e of one run: a new plan directory each
        ours.append(
            measure(
                f"s = plan_epoch(run, {e}, policy='seta', params=dict(r=0.0, k={args.k}, alpha=0.5), "
                f"epochs={args.repeat + 1}, seed=0)",
                setup,
            )
        )
        base.append(
            measure(
                f"""
                KMeans(n_clusters={args.k}, random_state=0).fit(loss.reshape(-1, 1))
                """,
                f"""
                import numpy as np
                from sklearn.cluster import KMeans
                loss = np.random.default_rng(0).lognormal(size={base_n}).astype(np.float32)
                """,
            )
        )
    walls = [r["wall_s"] for r in ours]
    base_walls = [r["wall_s"] for r in base]
    med, base_med = statistics.median(walls), statistics.median(base_walls)
    rss = max(r["peak_rss_mb"] for r in ours)
    scale = args.n / base_n
    print(f"## Planning one SeTa epoch ({machine()}; {args.repeat} fresh-process runs)\n")
    print("| what | N | wall s: median (min - max) | peak RSS MB |")
    print("| --- | --- | --- | --- |")
    print(
        f"| seta_stream plan_epoch (SeTa, k={args.k}; {args.table_compression} table): read table, policy, "
        f"write plan + stage lookup | {args.n:,} | {med:.2f} ({min(walls):.2f} - {max(walls):.2f}) | {rss:.0f} |"
    )
    print(
        f"| baseline: sklearn KMeans fit only (reference's clustering call) | {base_n:,} | "
        f"{base_med:.2f} ({min(base_walls):.2f} - {max(base_walls):.2f}) | "
        f"{max(r['peak_rss_mb'] for r in base):.0f} |"
    )
    print(f"\nruns, in order: {', '.join(f'{w:.2f}' for w in walls)} s")
    est = base_med * scale
    print(
        f"\nBaseline extrapolated to N={args.n:,}: {est:.1f} s for the k-means call alone "
        f"(reference's whole step, measured in algorithms.md §11: 285 s, 16.2 GB at 15M)."
    )
    print(
        f"Speed-up (medians) vs the extrapolated k-means call: {est / med:.1f}x; "
        f"vs the reference's whole step: {285 / med:.0f}x."
    )


if __name__ == "__main__":
    main()
