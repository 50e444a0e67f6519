"""Compacting one epoch of N recorded losses (spread over tens of parts) into an existing
N-row loss table (issue target at 15M: <= 15 s wall, <= 4 GB peak RSS).

Baselines in the same run: only reading the same parts and the table with pyarrow (the I/O any
compaction needs), with pyarrow's defaults and with the options compact uses, so the ratio shows
what folding, checking and writing cost on top of reading. Parts and the existing table are
written exactly as LossRecorder and compact write them (LZ4).

    python benchmarks/bench_compact.py --n 15000000 --parts 40
"""

from __future__ import annotations

import argparse
import shutil

import numpy as np
import pyarrow as pa
from common import OUT, machine, make_table_run, measure, st_mj_identities


def make_parts(run, n: int, parts: int) -> None:
    from seta_stream._parts import PART_SCHEMA, write_part
    from seta_stream._runfs import RunDir
    from seta_stream.ids import sample_uids

    shards, keys = st_mj_identities(n)
    uids = sample_uids(shards, keys)
    loss = np.random.default_rng(1).lognormal(size=n).astype(np.float32)
    rd = RunDir(run)
    per = (n + parts - 1) // parts
    seq0 = 10**18
    for p in range(parts):
        lo, hi = p * per, min(n, (p + 1) * per)
        rank = p % 2
        t = pa.Table.from_arrays(
            [
                shards.slice(lo, hi - lo),
                keys.slice(lo, hi - lo),
                pa.array(uids[lo:hi]),
                pa.array(loss[lo:hi]),
                pa.array(np.full(hi - lo, 1, np.int32)),
                pa.array(np.full(hi - lo, rank, np.int32)),
                pa.array(np.arange(seq0 + lo, seq0 + hi)),
            ],
            schema=PART_SCHEMA,
        )
        write_part(rd, rank, 1, t)  # exactly as LossRecorder writes parts


def as_written_by_compact(run) -> None:
    """Rewrite the base table with the Parquet options compact() uses (the existing table of a
    run is always one that compaction wrote)."""
    from seta_stream._runfs import RunDir
    from seta_stream._table import TABLE_WRITE_OPTIONS

    rd = RunDir(run)
    rel = rd.read_json("table/manifest.json")["table"]
    rd.publish_parquet(rel, rd.read_parquet(rel), **TABLE_WRITE_OPTIONS)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=15_000_000)
    p.add_argument("--parts", type=int, default=40)
    args = p.parse_args()
    base = make_table_run(OUT / f"compact-base-{args.n}", args.n)
    run = OUT / f"compact-{args.n}"
    shutil.rmtree(run, ignore_errors=True)
    shutil.copytree(base, run)
    as_written_by_compact(run)
    make_parts(run, args.n, args.parts)
    read_only = measure(
        """
        tables = [pq.read_table(p) for p in glob.glob(run + '/losses/rank=*/epoch=*/part-*.parquet')]
        t = pq.read_table(glob.glob(run + '/table/table-*.parquet')[0])
        """,
        f"import glob, pyarrow.parquet as pq\nrun = {str(run)!r}",
    )
    read_like_compact = measure(
        """
        tables = [pq.read_table(p, memory_map=True, read_dictionary=['shard'])
                  for p in glob.glob(run + '/losses/rank=*/epoch=*/part-*.parquet')]
        t = pq.read_table(glob.glob(run + '/table/table-*.parquet')[0], memory_map=True)
        """,
        f"import glob, pyarrow.parquet as pq\nrun = {str(run)!r}",
    )
    ours = measure("r = compact(run)", f"from seta_stream import compact\nrun = {str(run)!r}")
    print(f"## Compacting {args.n:,} records in {args.parts} parts into a {args.n:,}-row table ({machine()})\n")
    print("| what | wall s | peak RSS MB |")
    print("| --- | --- | --- |")
    for what, m in (
        ("baseline: read the parts and the table with pyarrow (defaults)", read_only),
        ("baseline: the same reads as compact does them (memory-mapped, shard as dictionary)", read_like_compact),
        ("seta_stream compact (read, fold, EMA, identity checks, write, publish)", ours),
    ):
        print(f"| {what} | {m['wall_s']:.2f} | {m['peak_rss_mb']:.0f} |")
    print(
        f"\ncompact / read-only: {ours['wall_s'] / read_only['wall_s']:.1f}x (defaults), "
        f"{ours['wall_s'] / read_like_compact['wall_s']:.1f}x (same reads)"
    )


if __name__ == "__main__":
    main()
