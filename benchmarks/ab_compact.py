"""Alternating A/B of compaction at N samples between two source trees of seta_stream (this
checkout and, say, a `git worktree` of an earlier commit), in the same period: timings on this
VM drift by 30% over minutes.

The run is the one ``bench_compact.py`` builds: an N-row loss table (written as compaction
writes it) and N new records of known samples in ``--parts`` loss parts. Each round copies that
run afresh for tree A and then tree B, and compacts it in a fresh process importing
seta_stream from the tree (5 s idle before each); prints every compaction and the medians.

    git worktree add /tmp/prev <commit>
    python -m benchmarks ab_compact /tmp/prev . [--rounds 3] [--n 15000000] [--parts 40]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import time
from pathlib import Path

from benchmarks.bench_compact import make_parts
from benchmarks.common import OUT, Result, make_table_run, measure, tree_commit, tree_label, tree_setup
from tools.results import path_label


def prepared(n: int, parts: int) -> Path:
    """The run with its table and pending parts, built once."""
    run = OUT / f"ab-compact-{n}-{parts}"
    if not (run / "losses").exists():
        base = make_table_run(OUT / f"compact-base-{n}", n)
        shutil.rmtree(run, ignore_errors=True)
        shutil.copytree(base, run)
        make_parts(run, n, parts)
    return run


def compact_once(tree: Path, source: Path, idle: float = 5.0) -> dict:
    run = OUT / "ab-compact-scratch"
    shutil.rmtree(run, ignore_errors=True)
    shutil.copytree(source, run)
    time.sleep(idle)
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
    p.add_argument("--idle", type=float, default=5.0, help="seconds idle before each compaction")
    args = p.parse_args()
    res = Result(f"ab-compact-{args.n}", title=f"Compaction at {args.n:,}: tree A against tree B, alternating")
    source = prepared(args.n, args.parts)
    results: dict[str, list[dict]] = {"A": [], "B": []}
    for r in range(args.rounds):
        for name, tree in (("A", args.a), ("B", args.b)):
            m = compact_once(tree, source, args.idle)
            results[name].append(m)
            print(f"round {r + 1} {name}: {m['wall_s']:.2f} s, peak RSS {m['peak_rss_mb']:.0f} MB", flush=True)
    rows = []
    for name, tree in (("A", args.a), ("B", args.b)):
        walls = [m["wall_s"] for m in results[name]]
        rss = [m["peak_rss_mb"] for m in results[name]]
        print(
            f"{name} ({tree}): median {statistics.median(walls):.2f} s ({min(walls):.2f} - {max(walls):.2f}), "
            f"peak RSS {max(rss):.0f} MB"
        )
        rows.append(
            {
                "tree": f"{name}: {tree_label(tree)}",
                "commit": (tree_commit(tree) or "?")[:10],
                "median_s": statistics.median(walls),
                "min_s": min(walls),
                "max_s": max(walls),
                "peak_rss_mb": max(rss),
            }
        )
    ratio = rows[1]["median_s"] / rows[0]["median_s"]
    print(f"B / A (medians): {ratio:.2f}x")
    res.write(
        baseline={"what": f"tree A ({tree_label(args.a)}), alternating with B in the same period", **rows[0]},
        rows=rows,
        peak_rss_mb=rows[1]["peak_rss_mb"],  # tree B's: the code measured against A
        figures={"b_over_a": ratio},
        notes=[f"B / A (medians of {args.rounds} alternating rounds): {ratio:.2f}x"],
        params={k: path_label(v) if isinstance(v, Path) else str(v) for k, v in vars(args).items()},
    )


if __name__ == "__main__":
    main()
