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


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tree", default=".", help="source tree holding seta_stream/")
    p.add_argument("--parts", type=int, default=1000)
    args = p.parse_args()
    sys.path.insert(0, args.tree)
    from seta_stream._route import RoutedRecords

    per = 200
    routed = RoutedRecords(24, folder=tempfile.mkdtemp() + "/route")
    t0 = time.perf_counter()
    for k in range(args.parts):
        part = pa.table(
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
        routed.add(k, part)
    routed.close()
    routed.remove()
    print(f"{args.tree}: {args.parts * per:,} shards routed in {time.perf_counter() - t0:.2f} s")


if __name__ == "__main__":
    main()
