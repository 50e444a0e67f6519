"""Web scale: record -> compact -> plan on synthetic ST+MJ-shaped runs of N samples (5,000 per
shard, MJSynth-like keys), partitioned into B = ceil(N / 8,388,608) buckets (the default for a
run whose dataset_size is N), one process on this machine.

Per size: epoch 0's parts (every sample new) and their first compaction, epoch 1's parts (every
sample known) and the steady compaction, then a SeTa plan of epoch 1 (k-means window) and a
dynamic random plan. Wall time, peak RSS (each step in a fresh process), time per sample, and
disk per epoch. Parts are written as LossRecorder writes them, 1,048,576 records each, in
samples order (the same shards in every part: records of one rank arrive shard by shard).

    python benchmarks/bench_scale.py --n 15000000 100000000 200000000
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
from bench_scale_plan import PLANS
from common import OUT, machine, measure

PART_ROWS = 1 << 20
SHARD = 5000


def identities(lo: int, hi: int) -> tuple[pa.Array, pa.Array]:
    """(shard, key) of samples lo..hi-1, as common.st_mj_identities names them."""
    idx = np.arange(lo, hi)
    first, last = lo // SHARD, (hi - 1) // SHARD
    names = pa.array([f"stmj-train-{s:06d}.tar" for s in range(first, last + 1)])
    shards = pa.DictionaryArray.from_arrays(pa.array((idx // SHARD - first).astype(np.int32)), names)
    keys = pa.array([f"mj/{i // 1000 % 3000:04d}/{i % 7}/{i:08d}_Word" for i in range(lo, hi)], pa.string())
    return shards, keys


def write_epoch(run_path: Path, n: int, epoch: int) -> float:
    """Parts of one epoch: every sample once, rank = part parity; returns seconds."""
    from seta_stream._parts import PART_SCHEMA, write_part
    from seta_stream._runfs import RunDir
    from seta_stream.ids import sample_uids

    t0 = time.perf_counter()
    run = RunDir(run_path)
    rng = np.random.default_rng(epoch)
    seq0 = 10**18 + epoch * 10**12
    for p, lo in enumerate(range(0, n, PART_ROWS)):
        hi = min(n, lo + PART_ROWS)
        shards, keys = identities(lo, hi)
        loss = rng.lognormal(size=hi - lo).astype(np.float32)
        t = pa.Table.from_arrays(
            [
                shards.dictionary_decode(),
                keys,
                pa.array(sample_uids(shards, keys)),
                pa.array(loss),
                pa.array(np.full(hi - lo, epoch, np.int32)),
                pa.array(np.full(hi - lo, p % 2, np.int32)),
                pa.array(np.arange(seq0 + lo, seq0 + hi)),
            ],
            schema=PART_SCHEMA,
        )
        write_part(run, p % 2, epoch, t)
    return time.perf_counter() - t0


def disk(path: Path, pattern: str) -> int:
    return sum(p.stat().st_size for p in path.glob(pattern) if p.is_file())


def one_size(n: int, keep: bool, buckets: int | None) -> dict:
    from seta_stream import RunDir

    run = OUT / f"scale-{n}"
    shutil.rmtree(run, ignore_errors=True)
    RunDir(run, create=True, settings={"dataset_size": n, "buckets": buckets})
    buckets = RunDir(run).buckets
    setup = f"from seta_stream import compact, plan_epoch\nrun = {str(run)!r}"
    out: dict = {"n": n, "buckets": buckets}
    out["write_epoch0_s"] = write_epoch(run, n, 0)
    out["compact_first"] = measure("compact(run)", setup)
    out["write_epoch1_s"] = write_epoch(run, n, 1)
    parts1 = disk(run, "losses/rank=*/epoch=1/*.parquet")
    out["compact_steady"] = measure("compact(run)", setup)
    for step, code in PLANS.items():  # the SeTa plan, then the random one
        out[step] = measure(code, setup)
    summary = json.loads((run / "plans/epoch=1/summary.json").read_text())
    out["kept"] = summary["kept"]
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
    args = p.parse_args()
    rows = []
    for n in args.n:
        r = one_size(n, args.keep, args.buckets)
        rows.append(r)
        print(json.dumps(r), flush=True)
    print(f"\n## Web scale: record -> compact -> plan, one process ({machine()})\n")
    print("| N | buckets | step | wall s | ns / sample | peak RSS MB |")
    print("| --- | --- | --- | --- | --- | --- |")
    for r in rows:
        for step in ("compact_first", "compact_steady", "plan_seta", "plan_random"):
            m = r[step]
            print(
                f"| {r['n']:,} | {r['buckets']} | {step} | {m['wall_s']:.1f} | "
                f"{m['wall_s'] / r['n'] * 1e9:.0f} | {m['peak_rss_mb']:.0f} |"
            )
    print("\n| N | parts per epoch MB | table MB | plan MB |\n| --- | --- | --- | --- |")
    for r in rows:
        d = r["disk_mb"]
        print(f"| {r['n']:,} | {d['parts_per_epoch']:.0f} | {d['table']:.0f} | {d['plan']:.0f} |")


if __name__ == "__main__":
    main()
