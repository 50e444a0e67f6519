"""Alternating A/B of compaction at N samples between two source trees of seta_stream (this
checkout and, say, a `git worktree` of an earlier commit), in the same period: timings on this
VM drift by 30% over minutes.

The run is the one ``bench_compact.py`` builds: an N-row loss table (written as compaction
writes it) and N new records of known samples in ``--parts`` loss parts. Each round copies that
run afresh for tree A and then tree B, and compacts it in a fresh process importing
seta_stream from the tree (5 s idle before each); prints every compaction and the medians.

    git worktree add /tmp/prev <commit>
    python benchmarks/ab_compact.py /tmp/prev . [--rounds 3] [--n 15000000] [--parts 40]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import time
from pathlib import Path

from bench_compact import as_written_by_compact, make_parts
from common import OUT, make_table_run, measure, tree_setup


def prepared(n: int, parts: int) -> Path:
    """The run with its table and pending parts, built once."""
    run = OUT / f"ab-compact-{n}-{parts}"
    if not (run / "losses").exists():
        base = make_table_run(OUT / f"compact-base-{n}", n)
        shutil.rmtree(run, ignore_errors=True)
        shutil.copytree(base, run)
        as_written_by_compact(run)
        make_parts(run, n, parts)
    return run


def compact_once(tree: Path, source: Path) -> dict:
    run = OUT / "ab-compact-scratch"
    shutil.rmtree(run, ignore_errors=True)
    shutil.copytree(source, run)
    time.sleep(5)
    result = measure(f"P.compact({str(run)!r})", tree_setup(tree))
    shutil.rmtree(run, ignore_errors=True)
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("a", type=Path, help="source tree A (holds seta_stream/)")
    p.add_argument("b", type=Path, help="source tree B")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--n", type=int, default=15_000_000)
    p.add_argument("--parts", type=int, default=40)
    args = p.parse_args()
    source = prepared(args.n, args.parts)
    results: dict[str, list[dict]] = {"A": [], "B": []}
    for r in range(args.rounds):
        for name, tree in (("A", args.a), ("B", args.b)):
            m = compact_once(tree, source)
            results[name].append(m)
            print(f"round {r + 1} {name}: {m['wall_s']:.2f} s, peak RSS {m['peak_rss_mb']:.0f} MB", flush=True)
    for name, tree in (("A", args.a), ("B", args.b)):
        walls = [m["wall_s"] for m in results[name]]
        rss = [m["peak_rss_mb"] for m in results[name]]
        print(
            f"{name} ({tree}): median {statistics.median(walls):.2f} s ({min(walls):.2f} - {max(walls):.2f}), "
            f"peak RSS {max(rss):.0f} MB"
        )
    ratio = statistics.median(m["wall_s"] for m in results["B"]) / statistics.median(m["wall_s"] for m in results["A"])
    print(f"B / A (medians): {ratio:.2f}x")


if __name__ == "__main__":
    main()
