"""Cost and benefit of the filter stage on real shards (CIFAR-10 from ../shared/data, gunzipped
into bench-out/; never copied into the repository).

(a) Without decode, everything kept: CPU time of reading the tar shards with webdataset's reader
    (``wds.tarfile_to_samples``) and with OpenCLIP's (``tarfile_to_samples_nothrow``, copied
    in openclip_replica.py), each with and without ``keep_filter`` after it (target: <= 3% more CPU), and of
    ``kept_tar_samples`` (what ``attach`` puts in a ``wds.WebDataset``: a tar reader that yields
    what webdataset's does and skips the members of dropped samples) against webdataset's reader.
(b) 50% kept, PIL JPEG decode after the stage, versus the same pipeline without the stage
    decoding everything (target: >= 1.5x the data-set samples processed per second).

Every round runs every pipeline once, in the same process, the order reversed every other time
(``--repeat`` rounds with decode; ``--ab-rounds``, three times as many by default, without: their
differences are a few percent, so those run two shards at a time, every pipeline on two shards
before the next two, and each (round, two shards) is one pair); each pipeline is compared with the
baseline of the same round or pair (paired ratios: the machine's speed drifts between rounds, far
less within one). The pipelines compared without decode run next to each other: alternating A/B
pairs, A first in one pair and B first in the next. Webdataset's reader also runs twice in a row
(A/A): what the measurement gives where there is no difference. Before the rounds every pipeline
runs once uncounted (a process's first pass pays one-off costs: pyarrow imports pandas on its
first ``pa.array``, about 0.4 s here). (a') times keep_filter alone, over the samples of
webdataset's reader held in memory, against the reader's CPU per sample. Reported: the mean
ratio over the rounds or pairs and its standard error (SE), in CPU time (process_time) and wall
time; a target is met where the mean clears it by 2 SE. Peak RSS is each pipeline's own (the
process's peak reset before it, /proc/self/clear_refs) and the process's.

    python -m benchmarks bench_stage --data ../shared/data/cifar10 --repeat 5
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import glob
import gzip
import os
import shutil
import time

import webdataset as wds

from benchmarks.common import OUT, ROOT, Result, fmt, load_info, machine, paired_ratio, ratio_note
from benchmarks.openclip_replica import tarfile_to_samples_nothrow
from tools.results import mean_se, path_label


def plain_shards(data: str, pattern: str = "train-*.tar.gz") -> list[str]:
    out = OUT / "cifar10-tar"
    out.mkdir(parents=True, exist_ok=True)
    urls = []
    for src in sorted(glob.glob(os.path.join(data, pattern))):
        dst = out / os.path.basename(src)[: -len(".gz")]
        if not dst.exists():
            with gzip.open(src, "rb") as fi, open(str(dst) + ".tmp", "wb") as fo:
                shutil.copyfileobj(fi, fo)
            os.replace(str(dst) + ".tmp", dst)
        urls.append(str(dst))
    return urls


# ---------------------------------------------------------------------------------- measuring
def rss_kb(key: str) -> int:
    with contextlib.suppress(OSError):
        for line in open("/proc/self/status"):
            if line.startswith(key):
                return int(line.split()[1])
    return 0


def run_pipeline(stages: list) -> dict:
    """CPU and wall seconds of one pass over a pipeline, its samples, and the peak RSS it reached
    above the RSS at its start (the process's peak is reset first where Linux allows it)."""
    gc.collect()  # every pass starts with the garbage of the one before it collected
    with contextlib.suppress(OSError):
        open("/proc/self/clear_refs", "w").write("5")
    rss0 = rss_kb("VmRSS:")
    ds = wds.DataPipeline(*stages)
    c0, t0 = time.process_time(), time.perf_counter()
    n = sum(1 for _ in ds)
    return {
        "cpu_s": time.process_time() - c0,
        "wall_s": time.perf_counter() - t0,
        "samples": n,
        "peak_rss_mb": rss_kb("VmHWM:") / 1024,
        "rss_added_mb": (rss_kb("VmHWM:") - rss0) / 1024,
    }


def rounds(
    variants: dict, repeat: int, parts: list[list[str]] | None = None, warm_up: bool = False
) -> dict[str, list[dict]]:
    """Every variant once a round, ``repeat`` rounds, the order reversed every other time. With
    ``parts`` (lists of shard URLs; the variants then take one) every variant runs on each part in
    turn: one measurement per (round, part), the variants compared within one part close in time.
    Variants listed next to each other make alternating A/B pairs: one right after the other, A
    first in one pair and B first in the next. ``warm_up``: every variant runs once on the first
    part before the rounds, not counted (a process's first pass pays one-off costs: imports,
    first calls of Arrow kernels, the page cache)."""
    out: dict[str, list[dict]] = {name: [] for name in variants}
    names = list(variants)
    if warm_up:
        for name in names:
            run_pipeline(variants[name]() if parts is None else variants[name](parts[0]))
    for r in range(repeat):
        t0 = time.perf_counter()
        for k, part in enumerate(parts or [None]):
            for name in names if (r + k) % 2 == 0 else names[::-1]:
                out[name].append(run_pipeline(variants[name]() if part is None else variants[name](part)))
        print(f"round {r + 1}/{repeat} of {len(names)} pipelines: {time.perf_counter() - t0:.1f} s", flush=True)
    return out


def stage_alone(stages: list, run: str, repeat: int) -> dict[str, list[float]]:
    """CPU microseconds per sample of keep_filter alone and of a pass-through generator, over
    the samples ``stages`` yields, read once and held in memory (no reader cost, so the stage's
    own cost is not lost in the reader's variation)."""
    import seta_stream as seta

    samples = list(wds.DataPipeline(*stages))

    def through(src):
        yield from src

    out: dict[str, list[float]] = {"pass-through": [], "keep_filter": []}
    for _ in range(repeat):
        for name, stage in (("pass-through", through), ("keep_filter", seta.keep_filter(run))):
            c0 = time.process_time()
            for _ in stage(iter(samples)):
                pass
            out[name].append(1e6 * (time.process_time() - c0) / max(1, len(samples)))
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", default=str(ROOT.parent / "shared/data/cifar10"))
    p.add_argument("--repeat", type=int, default=5, help="rounds with decode (every pipeline once a round)")
    p.add_argument("--ab-rounds", type=int, default=None, help="rounds without decode (default 3 x --repeat)")
    args = p.parse_args()
    ab_rounds = 3 * args.repeat if args.ab_rounds is None else args.ab_rounds
    res = Result("stage", title="The filter stage on CIFAR-10 train shards")
    import seta_stream as seta
    from seta_stream import list_samples

    urls = plain_shards(args.data)
    pop = list_samples(urls)
    total = pop.num_rows
    full_run, half_run = str(OUT / "stage-full"), str(OUT / "stage-half")
    for path in (full_run, half_run):
        shutil.rmtree(path, ignore_errors=True)
    seta.plan_epoch(seta.RunDir(full_run, create=True), 0, policy="full", epochs=1, population=pop)
    seta.plan_epoch(
        seta.RunDir(half_run, create=True), 0, policy="random", params={"r": 0.5}, epochs=1, seed=0, population=pop
    )

    def src(part: list[str] = urls) -> list:
        return [wds.SimpleShardList(part), wds.tarfile_to_samples()]

    def openclip(part: list[str]) -> list:
        return [wds.SimpleShardList(part), tarfile_to_samples_nothrow]

    def kept(run: str, part: list[str] = urls) -> list:
        return [wds.SimpleShardList(part), seta.kept_tar_samples(run)]

    # two shards at a time (each a new iterator: the stage's start, ~0.5 ms, counts 5 times); pairs
    # of neighbours: the reader read twice (A/A: what the measurement gives for no difference), and
    # each reader without and with keep_filter (A/B)
    no_decode = {
        "read (again)": lambda part: src(part),
        "read": lambda part: src(part),
        "read + keep_filter (all kept)": lambda part: src(part) + [seta.keep_filter(full_run)],
        "OpenCLIP read": lambda part: openclip(part),
        "OpenCLIP read + keep_filter (all kept)": lambda part: openclip(part) + [seta.keep_filter(full_run)],
        "kept_tar_samples (all kept)": lambda part: kept(full_run, part),
    }
    decode = {
        "read + decode": lambda: src() + [wds.decode("pil")],
        "read + keep_filter (50%) + decode": lambda: src() + [seta.keep_filter(half_run), wds.decode("pil")],
        "kept_tar_samples (50%) + decode": lambda: kept(half_run) + [wds.decode("pil")],
        "kept_tar_samples (all kept) + decode": lambda: kept(full_run) + [wds.decode("pil")],
    }
    # (a)'s differences are a few percent of a few seconds: three times the rounds (they are cheap)
    parts = [urls[i : i + 2] for i in range(0, len(urls), 2)]
    # the decode rounds need no warm-up of their own: the rounds without decode warmed the process up
    results = {**rounds(no_decode, ab_rounds, parts, warm_up=True), **rounds(decode, args.repeat)}
    stage_us = stage_alone(src(), full_run, 3 * args.repeat)
    load = load_info()

    # (a): CPU overhead against the reader it follows; (b): speed-up in wall time against decoding everything
    overheads = [
        ("webdataset's reader read twice (A/A: no difference)", "read (again)", "read"),
        ("keep_filter after webdataset's reader", "read + keep_filter (all kept)", "read"),
        ("keep_filter after OpenCLIP's reader", "OpenCLIP read + keep_filter (all kept)", "OpenCLIP read"),
        ("kept_tar_samples against webdataset's reader", "kept_tar_samples (all kept)", "read"),
    ]
    speedups = [
        ("keep_filter, 50% kept + decode", "read + decode", "read + keep_filter (50%) + decode"),
        ("kept_tar_samples, 50% kept + decode", "read + decode", "kept_tar_samples (50%) + decode"),
        # kept_tar_samples reads tar headers faster than webdataset's reader (seta_stream._tario):
        # the same comparison with that reader on both sides isolates what skipping gains
        (
            "kept_tar_samples 50% vs all kept, both + decode",
            "kept_tar_samples (all kept) + decode",
            "kept_tar_samples (50%) + decode",
        ),
    ]
    figures: dict = {}
    notes = []
    print(f"## The filter stage on CIFAR-10 train shards, {total:,} samples ({machine()})")
    print(f"{ab_rounds} rounds without decode, {args.repeat} with; load average {load['loadavg']} at the end\n")
    rows = []
    for name, rs in results.items():
        if name in no_decode:  # one measurement per part: the sums over a round's parts
            rs = [
                {k: sum(r[k] for r in rs[i : i + len(parts)]) for k in ("cpu_s", "wall_s", "samples")}
                | {k: max(r[k] for r in rs[i : i + len(parts)]) for k in ("peak_rss_mb", "rss_added_mb")}
                for i in range(0, len(rs), len(parts))
            ]
        cpu_m, cpu_se = mean_se([r["cpu_s"] for r in rs])
        wall_m, _ = mean_se([r["wall_s"] for r in rs])
        rows.append(
            {
                "pipeline": name,
                "samples out": rs[0]["samples"],
                "CPU s (mean)": cpu_m,
                "CPU s (SE)": cpu_se,
                "wall s (mean)": wall_m,
                "data-set samples/s": total / wall_m,
                "peak RSS MB": max(r["peak_rss_mb"] for r in rs),
                "RSS added MB": max(r["rss_added_mb"] for r in rs),
            }
        )
    print("| " + " | ".join(rows[0]) + " |")
    print("|" + " --- |" * len(rows[0]))
    for row in rows:
        print("| " + " | ".join(f"{v:,.3f}" if isinstance(v, float) else str(v) for v in row.values()) + " |")
    print()
    for label, a, b in overheads:
        cpu = paired_ratio(results, a, b, "cpu_s", overhead=True)
        wall = paired_ratio(results, a, b, "wall_s", overhead=True)
        us = mean_se([1e6 * (x["cpu_s"] - y["cpu_s"]) / y["samples"] for x, y in zip(results[a], results[b])])
        figures[f"CPU overhead: {label}"] = cpu
        figures[f"wall overhead: {label}"] = wall
        figures[f"CPU us per sample added: {label}"] = {"mean": us[0], "se": us[1]}
        control = b == "read" and a == "read (again)"
        text = f"(a) CPU {'difference' if control else 'overhead'} of {label}, everything kept, no decode"
        notes.append(
            ratio_note(text, cpu, None if control else 0.03, at_most=True, pct=True)
            + f"; in wall time {fmt(wall['mean'], wall['se'], True)}; "
            + f"{us[0]:+.2f} us of CPU a sample (SE {us[1] or 0:.2f})"
        )
    for label, a, b in speedups:
        fig = paired_ratio(results, a, b, "wall_s")
        figures[f"speed-up: {label}"] = fig
        text = f"(b) {label}, data-set samples/s against the unfiltered pipeline"
        notes.append(ratio_note(text, fig, None if "vs all kept" in label else 1.5, at_most=False))
    m, se = mean_se(stage_us["keep_filter"])
    reader_us = 1e6 * next(r for r in rows if r["pipeline"] == "read")["CPU s (mean)"] / total
    figures["keep_filter alone, us of CPU per sample (all kept)"] = {"mean": m, "se": se}
    figures["webdataset's reader, us of CPU per sample"] = reader_us
    notes.append(
        f"(a') keep_filter alone (everything kept) over the samples webdataset's reader yielded, held in memory: "
        f"{m:.2f} us of CPU per sample (SE {se or 0:.2f}; a pass-through generator "
        f"{mean_se(stage_us['pass-through'])[0]:.2f} us), {100 * m / reader_us:.1f}% of the reader's "
        f"{reader_us:.1f} us per sample"
    )
    for line in notes:
        print(line)
    res.write(
        baseline={
            "what": "the same pipeline without the stage, in the same round (paired ratios)",
            "read (CPU s, mean)": next(r for r in rows if r["pipeline"] == "read")["CPU s (mean)"],
            "read + decode (wall s, mean)": next(r for r in rows if r["pipeline"] == "read + decode")["wall s (mean)"],
        },
        rows=rows,
        peak_rss_mb=max(r["peak RSS MB"] for r in rows),
        figures=figures,
        notes=notes,
        params={
            "data": path_label(args.data),
            "rounds (decode)": args.repeat,
            "rounds (no decode)": ab_rounds,
            "shards a pass without decode": 2,
            "samples": total,
            "shards": len(urls),
        },
    )


if __name__ == "__main__":
    main()
