"""Routing cost against the number of shard names one compaction's routing meets: parts of
200 records, each of 200 shards not seen before (the worst case for the per-name tables of
_route.RoutedRecords). Run it with two source trees to compare them in the same period: the
routing runs in a fresh interpreter importing seta_stream from ``--tree`` (``common.tree_setup``).

    python -m benchmarks bench_route --tree /tmp/prev --parts 3000
    python -m benchmarks bench_route --tree . --parts 3000
"""

from __future__ import annotations

import argparse
import textwrap

from benchmarks import seam
from benchmarks.common import Result, measure, tree_setup

PER = 200  # records a part, each of a shard not seen before

#: the parts, built untimed after ``tree_setup`` imported the tree's seta_stream
SETUP = """
    import tempfile
    import numpy as np, pyarrow as pa
    IMPORTS

    def part(k):
        return pa.table(
            {
                "shard": pa.array([f"s-{k:06d}-{i:03d}.tar" for i in range(PER)]).dictionary_encode(),
                "key": pa.array(["a"] * PER),
                "uid": pa.array(np.arange(PER, dtype=np.uint64)),
                "loss": pa.array(np.ones(PER, np.float32)),
                "epoch": pa.array(np.zeros(PER, np.int32)),
                "rank": pa.array(np.zeros(PER, np.int32)),
                "seq": pa.array(np.arange(PER, dtype=np.int64)),
            }
        )

    parts = [part(k) for k in range(PARTS)]
"""

#: the baseline (the same parts' shard columns dictionary-encoded: the least any routing does per
#: part), then the routing
CODE = """
    for t in parts:
        t.column("shard").combine_chunks().indices.to_numpy()
    t1 = time.perf_counter()
    routed = RoutedRecords(24, folder=tempfile.mkdtemp() + "/route")
    for k, t in enumerate(parts):
        routed.add(k, t)
    routed.close()
    routed.remove()
    marks = {"base_s": t1 - t0, "route_s": time.perf_counter() - t1}
"""


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tree", default=".", help="source tree holding seta_stream/")
    p.add_argument("--parts", type=int, default=1000)
    p.add_argument("--result", default="route", help="result file name")
    args = p.parse_args()
    res = Result(args.result, title="Routing parts of 200 new shards each")
    setup = textwrap.dedent(tree_setup(args.tree)) + textwrap.dedent(SETUP).replace("PARTS", str(args.parts))
    setup = setup.replace("IMPORTS", seam.imports("RoutedRecords").strip())
    setup = setup.replace("PER", str(PER))
    m = measure(CODE, setup)
    base, wall = m["base_s"], m["route_s"]
    print(f"{args.tree}: {args.parts * PER:,} shards routed in {wall:.2f} s (baseline {base:.3f} s)")
    res.write(
        baseline={"what": "read every part's shard codes (no routing)", "wall_s": base},
        rows=[
            {
                "tree": args.tree,
                "shards": args.parts * PER,
                "wall_s": wall,
                "us_per_shard": 1e6 * wall / (args.parts * PER),
            }
        ],
        peak_rss_mb=None,
        figures={"wall_s": wall},
        params=vars(args),
    )


if __name__ == "__main__":
    main()
