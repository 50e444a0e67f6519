"""Kept-only reading through a shard index versus streaming the tar + keep_filter, on CIFAR-10
train shards (gunzipped into bench-out/, read from the page cache) and on shards of ST+MJ-sized
samples (a few KB: a JPEG-sized payload and a text label; as many samples as the CIFAR-10
shards hold, written into bench-out/).

Targets at 50% kept, without decode: ``read_kept`` >= 6x the data-set samples/s of streaming +
keep_filter and >= 1.5x that of ``kept_tar_samples`` (what ``attach`` installs); with JPEG
decode >= 1.9x the unfiltered pipeline. "samples/s" counts data-set samples processed per second
(an epoch over the whole data set finishes that much sooner). Also the bytes read per kept
sample (read_kept with its default 64 KB coalescing and with gap=0) beside the kept members' own
bytes (their data, without tar headers), and the cost against the keep fraction (10% to 100%).

Every round runs every pipeline once, in the same process, the order reversed every other round;
ratios are paired within a round (mean over rounds and its standard error, SE; a target is met
where the mean clears it by 2 SE), in wall time and in CPU time (the shards are in the page
cache, so the two differ by the CPU the process waited for on a loaded machine). Peak RSS is each
pipeline's own (the process's peak reset before it, /proc/self/clear_refs).

    python -m benchmarks bench_reader --repeat 5
"""

from __future__ import annotations

import argparse
import os
import random
import shutil

import webdataset as wds

from benchmarks.bench_stage import plain_shards, rounds
from benchmarks.common import OUT, ROOT, Result, load_info, machine, paired_ratio, ratio_note
from tools.results import mean_se, path_label


def stmj_shards(samples: int, shards: int, seed: int = 0) -> list[str]:
    """``shards`` tar shards of ``samples`` samples in all, shaped like ST+MJ: a JPEG-sized
    payload (1.5 to 8 KB, log-normal around 3 KB; random bytes, not decoded here) and a text label."""
    out = OUT / f"stmj-tar-{samples}-{shards}"
    done = out / "done"
    urls = [str(out / f"stmj-train-{s:06d}.tar") for s in range(shards)]
    if done.exists():
        return urls
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    rnd = random.Random(seed)
    per = -(-samples // shards)
    for s, url in enumerate(urls):
        with wds.TarWriter(url) as w:
            for i in range(s * per, min(samples, (s + 1) * per)):
                size = int(min(8192, max(1536, rnd.lognormvariate(8.0, 0.45))))
                word = "".join(rnd.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rnd.randint(3, 12)))
                w.write({"__key__": f"mj/{i // 1000 % 3000:04d}/{i % 7}/{i:08d}_{word}", "jpg": os.urandom(size),
                         "txt": word})  # fmt: skip
    done.write_text("")
    return urls


def planned(name: str, urls: list[str], fraction: float) -> str:
    import seta_stream as seta

    path = str(OUT / f"reader-{name}-{int(fraction * 100)}")
    shutil.rmtree(path, ignore_errors=True)
    policy, params = ("full", {}) if fraction >= 1 else ("random", {"r": 1 - fraction})
    pop = seta.list_samples(urls)
    seta.plan_epoch(seta.RunDir(path, create=True), 0, policy=policy, params=params, epochs=1, seed=0, population=pop)
    return path


def pipelines(urls: list[str], half: str, decode: bool) -> dict:
    """name -> stages of each pipeline compared at 50% kept (the plan ``half``)."""
    import seta_stream as seta
    from seta_stream import read_kept

    def src() -> list:
        return [wds.SimpleShardList(urls)]

    out = {
        "stream + keep_filter": lambda: src() + [wds.tarfile_to_samples(), seta.keep_filter(half)],
        "kept_tar_samples": lambda: src() + [seta.kept_tar_samples(half)],
        "read_kept": lambda: src() + [read_kept(half)],
        "read_kept (gap=0)": lambda: src() + [read_kept(half, gap=0)],
    }
    if decode:
        out["stream, decode all (unfiltered)"] = lambda: src() + [wds.tarfile_to_samples(), wds.decode("pil")]
        out["read_kept + decode"] = lambda: src() + [read_kept(half), wds.decode("pil")]
    return out


def bytes_read(stages: list) -> tuple[int, int, int, int]:
    """(samples, bytes read_kept read, its reads, kept members' own bytes) of one pass."""
    import seta_stream as seta

    before = seta.stage_counters()
    samples = list(wds.DataPipeline(*stages))
    after = seta.stage_counters()
    own = sum(len(v) for s in samples for k, v in s.items() if not k.startswith("__") and isinstance(v, bytes))
    reads = after.get("range_reads", 0) - before.get("range_reads", 0)
    return len(samples), after.get("bytes_read", 0) - before.get("bytes_read", 0), reads, own


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", default=str(ROOT.parent / "shared/data/cifar10"))
    p.add_argument("--repeat", type=int, default=5, help="rounds (every pipeline once a round)")
    args = p.parse_args()
    res = Result("reader", title="Kept-only reading (read_kept) on CIFAR-10 and ST+MJ-sized shards")
    import seta_stream as seta
    from seta_stream import index_shard, read_kept

    sets = {"CIFAR-10": plain_shards(args.data)}
    total = len(seta.list_samples(sets["CIFAR-10"]))
    sets["ST+MJ-sized"] = stmj_shards(total, len(sets["CIFAR-10"]))
    for urls in sets.values():
        for u in urls:
            index_shard(u, force=True)
    load_start = load_info()
    rows, notes, figures, bytes_rows = [], [], {}, []
    for name, urls in sets.items():
        half = planned(name, urls, 0.5)
        variants = pipelines(urls, half, decode=name == "CIFAR-10")
        results = rounds(variants, args.repeat, warm_up=True)
        n = sum(1 for u in urls for _ in wds.DataPipeline(wds.SimpleShardList([u]), wds.tarfile_to_samples()))
        for variant, rs in results.items():
            wall, wall_se = mean_se([r["wall_s"] for r in rs])
            cpu, _ = mean_se([r["cpu_s"] for r in rs])
            rows.append(
                {
                    "shards": name,
                    "pipeline (50% kept)": variant,
                    "samples out": rs[0]["samples"],
                    "wall s (mean)": wall,
                    "wall s (SE)": wall_se,
                    "CPU s (mean)": cpu,
                    "data-set samples/s": n / wall,
                    "peak RSS MB": max(r["peak_rss_mb"] for r in rs),
                    "RSS added MB": max(r["rss_added_mb"] for r in rs),
                }
            )
        targets = [
            ("streaming + keep_filter", "stream + keep_filter", 6.0),
            ("kept_tar_samples", "kept_tar_samples", 1.5),
        ]
        for label, base, bar in targets:
            for key, unit in (("wall_s", "wall"), ("cpu_s", "CPU")):
                fig = paired_ratio(results, base, "read_kept", key)
                figures[f"{name}: read_kept / {label} ({unit})"] = fig
                text = f"{name}, 50% kept, no decode: read_kept against {label} in {unit} time"
                notes.append(ratio_note(text, fig, bar, at_most=False))
        if name == "CIFAR-10":
            fig = paired_ratio(results, "stream, decode all (unfiltered)", "read_kept + decode", "wall_s")
            figures[f"{name}: read_kept + decode / unfiltered"] = fig
            text = f"{name}, 50% kept + JPEG decode: read_kept against the unfiltered pipeline's samples/s"
            notes.append(ratio_note(text, fig, 1.9, at_most=False))
        shard_bytes = sum(os.path.getsize(u) for u in urls)
        kept, coalesced, reads, own = bytes_read(variants["read_kept"]())
        _, exact, exact_reads, _ = bytes_read(variants["read_kept (gap=0)"]())
        bytes_rows.append(
            {
                "shards": name,
                "samples": n,
                "kept": kept,
                "shard bytes / kept": shard_bytes / kept,
                "read_kept (64 KB gap) / kept": coalesced / kept,
                "read_kept (gap=0) / kept": exact / kept,
                "kept members' own bytes / kept": own / kept,
                "reads (64 KB gap)": reads,
                "reads (gap=0)": exact_reads,
            }
        )
        figures[f"{name}: bytes per kept sample"] = bytes_rows[-1]

    # the cost against the keep fraction (CIFAR-10)
    urls = sets["CIFAR-10"]
    sweep = []
    for f in (0.1, 0.3, 0.5, 0.7, 1.0):
        path = planned("CIFAR-10", urls, f)
        results = rounds(
            {
                "read_kept": lambda path=path: [wds.SimpleShardList(urls), read_kept(path)],
                "stream": lambda path=path: [
                    wds.SimpleShardList(urls),
                    wds.tarfile_to_samples(),
                    seta.keep_filter(path),
                ],
            },
            max(1, args.repeat // 2),
        )
        fig = paired_ratio(results, "stream", "read_kept", "wall_s")
        sweep.append(
            {
                "keep fraction": f,
                "read_kept wall s": mean_se([r["wall_s"] for r in results["read_kept"]])[0],
                "stream + keep_filter wall s": mean_se([r["wall_s"] for r in results["stream"]])[0],
                "ratio (mean)": fig["mean"],
                "ratio (SE)": fig["se"],
            }
        )
    figures["keep fraction sweep (CIFAR-10)"] = sweep

    print(f"## Kept-only reading, {total:,} samples a set ({machine()})")
    loads = f"load average {load_start['loadavg']} at the start, {load_info()['loadavg']} at the end"
    print(f"{args.repeat} rounds; {loads}\n")
    for table in (rows, bytes_rows, sweep):
        print("| " + " | ".join(table[0]) + " |")
        print("|" + " --- |" * len(table[0]))
        for row in table:
            cells = (
                f"{v:,.3f}" if isinstance(v, float) else f"{v:,}" if isinstance(v, int) else str(v)
                for v in row.values()
            )
            print("| " + " | ".join(cells) + " |")
        print()
    for line in notes:
        print(line)
    base = next(r for r in rows if r["pipeline (50% kept)"] == "stream + keep_filter")
    res.write(
        baseline={
            "what": "streaming + keep_filter and kept_tar_samples on the same shards and plan, in the same round "
            "(paired ratios)",
            "stream + keep_filter, CIFAR-10 (wall s, mean)": base["wall s (mean)"],
        },
        rows=rows,
        peak_rss_mb=max(r["peak RSS MB"] for r in rows),
        figures=figures,
        notes=notes,
        params={"data": path_label(args.data), "rounds": args.repeat, "samples per set": total, "gap": 65536},
    )


if __name__ == "__main__":
    main()
