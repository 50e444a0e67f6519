"""Kept-only reading through a shard index versus streaming the tar + keep_filter, on CIFAR-10
train shards (gunzipped into bench-out/, read from the page cache).

Targets at 50% kept: without decode >= 5x the samples/s of streaming + stage; with JPEG decode
>= 1.9x the samples/s of the unfiltered pipeline. Also bytes read per kept sample, and the cost
against the keep fraction from 10% to 100%. "samples/s" counts data-set samples processed per
second (an epoch over the whole data set finishes that much sooner).

    python benchmarks/bench_reader.py --repeat 3
"""

from __future__ import annotations

import argparse
import os
import shutil
import time

import webdataset as wds
from bench_stage import plain_shards
from common import OUT, ROOT, machine


def timed(stages: list) -> tuple[float, int]:
    t0 = time.perf_counter()
    n = sum(1 for _ in wds.DataPipeline(*stages))
    return time.perf_counter() - t0, n


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", default=str(ROOT.parent / "shared/data/cifar10"))
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args()
    import seta_stream as seta
    from seta_stream._reader import read_kept
    from seta_stream.index import index_shard

    urls = plain_shards(args.data)
    t0 = time.perf_counter()
    for u in urls:
        index_shard(u, force=True)
    index_s = (time.perf_counter() - t0) / len(urls)
    pop = seta.list_samples(urls)
    total = pop.num_rows
    shard_bytes = sum(os.path.getsize(u) for u in urls)

    def run_for(fraction: float) -> str:
        path = str(OUT / f"reader-{int(fraction * 100)}")
        shutil.rmtree(path, ignore_errors=True)
        policy, params = ("full", {}) if fraction >= 1 else ("random", {"r": 1 - fraction})
        seta.plan_epoch(
            seta.RunDir(path, create=True), 0, policy=policy, params=params, epochs=1, seed=0, population=pop
        )
        return path

    def best(make) -> tuple[float, int]:
        return min((timed(make()) for _ in range(args.repeat)), key=lambda r: r[0])

    half = run_for(0.5)
    src = lambda: [wds.SimpleShardList(urls)]  # noqa: E731
    rows = {}
    rows["stream + keep_filter (50%), no decode"] = best(
        lambda: src() + [wds.tarfile_to_samples(), seta.keep_filter(half)]
    )
    rows["kept_tar_samples (50%), no decode"] = best(lambda: src() + [seta.kept_tar_samples(half)])
    c0 = seta.stage_counters().get("bytes_read", 0)
    rows["read_kept (50%), no decode"] = best(lambda: src() + [read_kept(half)])
    kept_bytes = (seta.stage_counters().get("bytes_read", 0) - c0) / args.repeat
    c0 = seta.stage_counters().get("bytes_read", 0)
    rows["read_kept (50%, gap=0), no decode"] = best(lambda: src() + [read_kept(half, gap=0)])
    exact_bytes = (seta.stage_counters().get("bytes_read", 0) - c0) / args.repeat
    rows["stream, decode all (unfiltered)"] = best(lambda: src() + [wds.tarfile_to_samples(), wds.decode("pil")])
    rows["read_kept (50%) + decode"] = best(lambda: src() + [read_kept(half), wds.decode("pil")])

    print(
        f"## Kept-only reading on CIFAR-10 train shards, {total:,} samples, {shard_bytes / 1e6:.0f} MB ({machine()})\n"
    )
    print(f"Index: {index_s * 1000:.0f} ms per shard of {shard_bytes / len(urls) / 1e6:.1f} MB (headers only).\n")
    print("| pipeline | samples out | wall s | data-set samples/s |")
    print("| --- | --- | --- | --- |")
    for name, (wall, n) in rows.items():
        print(f"| {name} | {n:,} | {wall:.3f} | {total / wall:,.0f} |")
    kept = rows["read_kept (50%), no decode"][1]
    print(
        "\nBytes read per kept sample at 50%: streaming "
        f"{shard_bytes / kept:,.0f} B; read_kept (64 KB coalescing) {kept_bytes / kept:,.0f} B; "
        f"read_kept (gap=0) {exact_bytes / kept:,.0f} B."
    )
    nd = rows["stream + keep_filter (50%), no decode"][0] / rows["read_kept (50%), no decode"][0]
    dec = rows["stream, decode all (unfiltered)"][0] / rows["read_kept (50%) + decode"][0]
    print(f"\nWithout decode: read_kept {nd:.1f}x streaming + stage (target >= 5x).")
    vs_fast = rows["kept_tar_samples (50%), no decode"][0] / rows["read_kept (50%), no decode"][0]
    print(f"Without decode: read_kept {vs_fast:.1f}x kept_tar_samples (what attach installs).")
    print(f"With JPEG decode: {dec:.2f}x the unfiltered pipeline (target >= 1.9x, ideal 2x).\n")
    print("| keep fraction | read_kept wall s | stream + keep_filter wall s | ratio |")
    print("| --- | --- | --- | --- |")
    for f in (0.1, 0.3, 0.5, 0.7, 1.0):
        path = run_for(f)
        a = best(lambda path=path: src() + [read_kept(path)])[0]
        b = best(lambda path=path: src() + [wds.tarfile_to_samples(), seta.keep_filter(path)])[0]
        print(f"| {f:.0%} | {a:.3f} | {b:.3f} | {b / a:.1f}x |")


if __name__ == "__main__":
    main()
