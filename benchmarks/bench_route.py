"""Routing cost against the number of shard names one compaction's routing meets: parts of
200 records, each of 200 shards not seen before (the worst case for the per-name tables of
_route.RoutedRecords). Run it with two source trees to compare them in the same period.

    python benchmarks/bench_route.py --tree /tmp/prev --parts 3000
    python benchmarks/bench_route.py --tree . --parts 3000
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time

import numpy as np
import pyarrow as pa
from common import Result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tree", default=".", help="source tree holding seta_stream/")
    p.add_argument("--parts", type=int, default=1000)
    p.add_argument("--result", default="route", help="result file name")
    args = p.parse_args()
    res = Result(args.result, title="Routing parts of 200 new shards each")
    sys.path.insert(0, args.tree)
    from seta_stream._route import RoutedRecords

    per = 200

    def part(k: int) -> pa.Table:
        return pa.table(
            {
                "shard": pa.array([f"s-{k:06d}-{i:03d}.tar" for i in range(per)]).dictionary_encode(),
                "key": pa.array(["a"] * per),
                "uid": pa.array(np.arange(per, dtype=np.uint64)),
                "loss": pa.array(np.ones(per, np.float32)),
                "epoch": pa.array(np.zeros(per, np.int32)),
                "rank": pa.array(np.zeros(per, np.int32)),
                "seq": pa.array(np.arange(per, dtype=np.int64)),
            }
        )

    parts = [part(k) for k in range(args.parts)]
    # baseline: the same parts' shard columns dictionary-encoded (the least any routing does per part)
    t0 = time.perf_counter()
    for t in parts:
        t.column("shard").combine_chunks().indices.to_numpy()
    base = time.perf_counter() - t0
    routed = RoutedRecords(24, folder=tempfile.mkdtemp() + "/route")
    t0 = time.perf_counter()
    for k, t in enumerate(parts):
        routed.add(k, t)
    routed.close()
    routed.remove()
    wall = time.perf_counter() - t0
    print(f"{args.tree}: {args.parts * per:,} shards routed in {wall:.2f} s (baseline {base:.3f} s)")
    res.write(
        baseline={"what": "read every part's shard codes (no routing)", "wall_s": base},
        rows=[
            {
                "tree": args.tree,
                "shards": args.parts * per,
                "wall_s": wall,
                "us_per_shard": 1e6 * wall / (args.parts * per),
            }
        ],
        peak_rss_mb=None,
        figures={"wall_s": wall},
        params=vars(args),
    )


if __name__ == "__main__":
    main()
