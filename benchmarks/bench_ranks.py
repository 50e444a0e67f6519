"""Several ranks: per-rank cost of reading + filtering + recording with 1 rank versus 2 ranks
(torch.distributed, gloo), and the waiting rank's idle time at the epoch boundary against rank
0's compaction + planning time.

Each rank streams the same amount of data (its own shards via split_by_node) without DataLoader
workers, so the CPU seconds per sample of the rank's process (time.process_time) measure what
recording and filtering cost it; on this 2-core machine two ranks share the cores, so wall time
per rank is not comparable, CPU time is.

    python -m benchmarks bench_ranks --shards-per-rank 4 --samples 4000 --epochs 3
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys

from benchmarks.common import OUT, ROOT, Result, machine

#: A rank's process. It imports seta_stream from this checkout: the path setting is the child process's
#: own, part of what is measured, not of how the repository imports.
WORKER = r"""
import json, os, sys, time, torch, webdataset as wds
sys.path.insert(0, ROOT)
import seta_stream as seta
urls, run, epochs, out = json.loads(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4]
dist = int(os.environ.get("WORLD_SIZE", "1")) > 1
if dist:
    torch.distributed.init_process_group("gloo")
rank = torch.distributed.get_rank() if dist else 0
pop = seta.list_samples(urls)
pruner = seta.Pruner(run, policy="seta", params=dict(r=0.1, k=5, alpha=0.6), epochs=epochs, seed=0, population=pop)
ds = seta.attach(wds.WebDataset(urls, shardshuffle=False, nodesplitter=wds.split_by_node if dist else None,
                                empty_check=False), run).to_tuple("__key__", "__url__", "__weight__").batched(256)
stats = []
for e in range(epochs):
    pruner.start_epoch(e)
    boundary = dict(pruner.last_boundary)
    c0, t0, n = time.process_time(), time.perf_counter(), 0
    for keys, urls_, w in ds:
        pruner.record(keys, urls_, torch.rand(len(keys)))
        n += len(keys)
    stats.append({"epoch": e, "samples": n, "cpu_s": time.process_time() - c0, "wall_s": time.perf_counter() - t0,
                  **boundary})
pruner.close()
json.dump(stats, open(os.path.join(out, f"rank{rank}.json"), "w"))
if dist:  # a gloo group left to the interpreter's exit can abort the process ("terminate called ...")
    torch.distributed.destroy_process_group()
""".replace("ROOT", repr(str(ROOT)))


def shards(root, n_shards: int, per_shard: int) -> list[str]:
    import webdataset as wds

    root.mkdir(parents=True, exist_ok=True)
    urls = []
    for s in range(n_shards):
        path = root / f"bench-{s:04d}.tar"
        if not path.exists():
            with wds.TarWriter(str(path)) as w:
                for i in range(per_shard):
                    w.write({"__key__": f"k{i:06d}", "jpg": os.urandom(900), "cls": str(i % 10)})
        urls.append(str(path))
    return urls


def run_ranks(world: int, urls: list[str], epochs: int) -> list[list[dict]]:
    run, out = OUT / f"ranks-{world}", OUT / f"ranks-{world}-out"
    shutil.rmtree(run, ignore_errors=True)
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for rank in range(world):
        env = {
            **os.environ,
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "RANK": str(rank),
            "WORLD_SIZE": str(world),
        }
        procs.append(
            subprocess.Popen([sys.executable, "-c", WORKER, json.dumps(urls), str(run), str(epochs), str(out)], env=env)
        )
    for p in procs:
        if p.wait() != 0:
            raise RuntimeError(f"rank process failed with {p.returncode}")
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(world)]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shards-per-rank", type=int, default=4)
    p.add_argument("--samples", type=int, default=4000, help="samples per shard")
    p.add_argument("--epochs", type=int, default=3)
    args = p.parse_args()
    res = Result("ranks", title="1 rank against 2 ranks (gloo)")
    urls = shards(OUT / "rank-shards", 2 * args.shards_per_rank, args.samples)
    one = run_ranks(1, urls[: args.shards_per_rank], args.epochs)
    two = run_ranks(2, urls, args.epochs)
    print(f"## 1 rank vs 2 ranks, {args.shards_per_rank} shards of {args.samples:,} samples per rank ({machine()})\n")
    print("| ranks | rank | epoch | samples | CPU us/sample (read, filter, record) | compact s | plan s | wait s |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    rows = []
    for world, ranks in ((1, one), (2, two)):
        for rank, stats in enumerate(ranks):
            for st in stats[1:]:  # epoch 0 includes imports warming up
                us = 1e6 * st["cpu_s"] / st["samples"]
                print(
                    f"| {world} | {rank} | {st['epoch']} | {st['samples']:,} | {us:.1f} | "
                    f"{st['compact_s']:.3f} | {st['plan_s']:.3f} | {st['wait_s']:.3f} |"
                )
                rows.append(
                    {
                        "ranks": world,
                        "rank": rank,
                        "epoch": st["epoch"],
                        "samples": st["samples"],
                        "cpu_us_per_sample": us,
                        "compact_s": st["compact_s"],
                        "plan_s": st["plan_s"],
                        "wait_s": st["wait_s"],
                    }
                )
    cost = lambda res: sum(s["cpu_s"] for r in res for s in r[1:]) / sum(s["samples"] for r in res for s in r[1:])  # noqa: E731
    print(
        f"\nCPU per sample per rank: 1 rank {1e6 * cost(one):.1f} us, 2 ranks {1e6 * cost(two):.1f} us "
        f"(ratio {cost(two) / cost(one):.2f})."
    )
    waits = [s["wait_s"] for s in two[1][1:]]
    work = [s["compact_s"] + s["plan_s"] for s in two[0][1:]]
    print(
        f"Rank 1 waited {sum(waits):.2f} s at the boundaries while rank 0 compacted and planned for {sum(work):.2f} s."
    )
    res.write(
        baseline={"what": "1 rank, same shards per rank, same run", "cpu_us_per_sample": 1e6 * cost(one)},
        rows=rows,
        peak_rss_mb=None,
        figures={"cpu_ratio_2_to_1": cost(two) / cost(one), "wait_s": sum(waits), "boundary_work_s": sum(work)},
        notes=[
            f"CPU per sample per rank: 1 rank {1e6 * cost(one):.1f} us, 2 ranks {1e6 * cost(two):.1f} us "
            f"(ratio {cost(two) / cost(one):.2f}). Rank 1 waited {sum(waits):.2f} s at the boundaries while rank 0 "
            f"compacted and planned for {sum(work):.2f} s."
        ],
        params=vars(args),
    )


if __name__ == "__main__":
    main()
