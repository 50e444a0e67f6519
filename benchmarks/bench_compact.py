"""Compacting one epoch of N recorded losses (spread over tens of parts) into an existing
N-row loss table (issue target at 15M: <= 15 s wall, <= 4 GB peak RSS).

Baselines in the same run: only reading the same parts and the table with pyarrow (the I/O any
compaction needs), with pyarrow's defaults and with the options compact uses, so the ratio shows
what folding, checking and writing cost on top of reading. Parts and the existing table are
written by the library, as LossRecorder and compact write them (``common.make_table_run``).

    python -m benchmarks bench_compact --n 15000000 --parts 40
"""

from __future__ import annotations

import argparse
import shutil

from benchmarks.common import OUT, Result, machine, make_table_run, measure, write_epoch_parts


def make_parts(run, n: int, parts: int) -> None:
    """Epoch 1's records of every sample in ``parts`` parts, written as LossRecorder writes them."""
    write_epoch_parts(run, n, 1, part_rows=-(-n // parts))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=15_000_000)
    p.add_argument("--parts", type=int, default=40)
    args = p.parse_args()
    res = Result(f"compact-{args.n}", title=f"Compacting {args.n:,} records into a {args.n:,}-row table")
    base = make_table_run(OUT / f"compact-base-{args.n}", args.n)
    run = OUT / f"compact-{args.n}"
    shutil.rmtree(run, ignore_errors=True)
    shutil.copytree(base, run)
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
    rows = []
    for what, m in (
        ("baseline: read the parts and the table with pyarrow (defaults)", read_only),
        ("baseline: the same reads as compact does them (memory-mapped, shard as dictionary)", read_like_compact),
        ("seta_stream compact (read, fold, EMA, identity checks, write, publish)", ours),
    ):
        print(f"| {what} | {m['wall_s']:.2f} | {m['peak_rss_mb']:.0f} |")
        rows.append({"what": what, "wall_s": m["wall_s"], "peak_rss_mb": m["peak_rss_mb"]})
    note = (
        f"compact / read-only: {ours['wall_s'] / read_only['wall_s']:.1f}x (defaults), "
        f"{ours['wall_s'] / read_like_compact['wall_s']:.1f}x (same reads)"
    )
    print(f"\n{note}")
    res.write(
        baseline={"what": rows[0]["what"][len("baseline: ") :], **read_only},
        rows=rows,
        peak_rss_mb=ours["peak_rss_mb"],
        figures={"compact_s": ours["wall_s"], "read_only_s": read_only["wall_s"]},
        notes=[note],
        params=vars(args),
    )


if __name__ == "__main__":
    main()
