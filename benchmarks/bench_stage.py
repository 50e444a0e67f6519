"""Cost and benefit of the filter stage on real shards (CIFAR-10 from ../shared/data, gunzipped
into bench-out/; never copied into the repository).

(a) Without decode, everything kept: CPU time of reading the tar shards with webdataset's reader
    (``wds.tarfile_to_samples``) and with OpenCLIP's (``tarfile_to_samples_nothrow``, copied
    below), each with and without ``keep_filter`` after it (target: <= 3% more CPU), and of
    ``kept_tar_samples`` (what ``attach`` puts in a ``wds.WebDataset``: a tar reader that yields
    what webdataset's does and skips the members of dropped samples) against webdataset's reader.
(b) 50% kept, PIL JPEG decode after the stage, versus the same pipeline without the stage
    decoding everything (target: >= 1.5x the data-set samples processed per second).

Every round runs every pipeline once, in the same process, the order reversed every other time
(``--repeat`` rounds with decode, three times as many without: their differences are a few
percent, so those run two shards at a time, every pipeline on two shards before the next two, and
each (round, two shards) is one pair); each pipeline is compared with the baseline of the same
round or pair (paired ratios: the machine's speed drifts between rounds, far less within one).
(a') times keep_filter alone, over the samples of webdataset's reader held in memory, against the
reader's CPU per sample. Reported: the mean ratio over the rounds or pairs and its standard error
(SE); a target is met where the mean clears it by 2 SE. Peak RSS is each pipeline's own (the
process's peak reset before it, /proc/self/clear_refs) and the process's.

    python benchmarks/bench_stage.py --data ../shared/data/cifar10 --repeat 5
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import gzip
import logging
import math
import os
import shutil
import time

import webdataset as wds
from common import OUT, ROOT, Result, load_info, machine
from webdataset.tariterators import base_plus_ext, tar_file_expander, url_opener, valid_sample


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


# OpenCLIP's tar reader, as open_clip_train/data.py (open_clip_torch 3.3.0) defines it: a grouper
# that never raises on a repeated file name. seta_stream.openclip.adapt puts keep_filter after it.
# One line added (as tests/test_openclip.py has it): webdataset 1.x's end-of-shard marker is skipped
# (OpenCLIP pins webdataset <= 0.2.86, which has none).
def log_and_continue(exn):
    logging.warning(f"Handling webdataset error ({exn!r}). Ignoring.")
    return True


def group_by_keys_nothrow(data, keys=base_plus_ext, lcase=True, suffixes=None, handler=None):
    current_sample = None
    for filesample in data:
        if not filesample:  # added: webdataset 1.x's end-of-shard marker
            continue
        assert isinstance(filesample, dict)
        fname, value = filesample["fname"], filesample["data"]
        prefix, suffix = keys(fname)
        if prefix is None:
            continue
        if lcase:
            suffix = suffix.lower()
        if current_sample is None or prefix != current_sample["__key__"] or suffix in current_sample:
            if valid_sample(current_sample):
                yield current_sample
            current_sample = dict(__key__=prefix, __url__=filesample["__url__"])
        if suffixes is None or suffix in suffixes:
            current_sample[suffix] = value
    if valid_sample(current_sample):
        yield current_sample


def tarfile_to_samples_nothrow(src, handler=log_and_continue):
    streams = url_opener(src, handler=handler)
    files = tar_file_expander(streams, handler=handler)
    return group_by_keys_nothrow(files, handler=handler)


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


def rounds(variants: dict, repeat: int, parts: list[list[str]] | None = None) -> dict[str, list[dict]]:
    """Every variant once a round, ``repeat`` rounds, the order reversed every other time. With
    ``parts`` (lists of shard URLs; the variants then take one) every variant runs on each part in
    turn: one measurement per (round, part), the variants compared within one part close in time."""
    out: dict[str, list[dict]] = {name: [] for name in variants}
    names = list(variants)
    for r in range(repeat):
        for k, part in enumerate(parts or [None]):
            for name in names if (r + k) % 2 == 0 else names[::-1]:
                out[name].append(run_pipeline(variants[name]() if part is None else variants[name](part)))
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


def mean_se(values: list[float]) -> tuple[float, float | None]:
    m = sum(values) / len(values)
    if len(values) < 2:
        return m, None
    var = sum((v - m) ** 2 for v in values) / (len(values) - 1)
    return m, math.sqrt(var / len(values))


def paired(results: dict, a: str, b: str, key: str) -> list[float]:
    """Per round: ``a``'s ``key`` over ``b``'s (the same round)."""
    return [x[key] / y[key] for x, y in zip(results[a], results[b])]


def verdict(m: float, se: float | None, bar: float, at_most: bool) -> str:
    if se is None:
        return "one round: no SE"
    ok = m + 2 * se <= bar if at_most else m - 2 * se >= bar
    return "met" if ok else "not met"


def fmt(m: float, se: float | None, pct: bool = False) -> str:
    if pct:
        return f"{100 * m:+.1f}%" + (f" (SE {100 * se:.1f}%)" if se is not None else "")
    return f"{m:.2f}x" + (f" (SE {se:.2f})" if se is not None else "")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", default=str(ROOT.parent / "shared/data/cifar10"))
    p.add_argument("--repeat", type=int, default=5, help="rounds (every pipeline once a round)")
    args = p.parse_args()
    res = Result("stage", title="The filter stage on CIFAR-10 train shards")
    import seta_stream as seta
    from seta_stream._listing import list_samples

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

    no_decode = {  # two shards at a time (each a new iterator: the stage's start, ~1 ms, counts 5 times)
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
    results = {**rounds(no_decode, 3 * args.repeat, parts), **rounds(decode, args.repeat)}
    stage_us = stage_alone(src(), full_run, 3 * args.repeat)
    load = load_info()

    # (a): CPU overhead against the reader it follows; (b): speed-up in wall time against decoding everything
    overheads = [
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
    print(f"{3 * args.repeat} rounds without decode, {args.repeat} with; load average {load['loadavg']} at the end\n")
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
        pairs = [x - 1 for x in paired(results, a, b, "cpu_s")]
        m, se = mean_se(pairs)
        median = sorted(pairs)[len(pairs) // 2]
        figures[f"CPU overhead: {label}"] = {"mean": m, "se": se, "median": median, "pairs": len(pairs)}
        notes.append(
            f"(a) CPU overhead of {label}, everything kept, no decode: {fmt(m, se, True)}, median "
            f"{100 * median:+.1f}% of {len(pairs)} pairs; "
            f"target <= +3%: {verdict(m, se, 0.03, True)}"
        )
    for label, a, b in speedups:
        m, se = mean_se(paired(results, a, b, "wall_s"))
        figures[f"speed-up: {label}"] = {"mean": m, "se": se}
        target = "" if "vs all kept" in label else f"; target >= 1.5x: {verdict(m, se, 1.5, False)}"
        notes.append(f"(b) {label}, data-set samples/s against the unfiltered pipeline: {fmt(m, se)}{target}")
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
            "read (CPU s, mean)": rows[0]["CPU s (mean)"],
            "read + decode (wall s, mean)": next(r for r in rows if r["pipeline"] == "read + decode")["wall s (mean)"],
        },
        rows=rows,
        peak_rss_mb=max(r["peak RSS MB"] for r in rows),
        figures=figures,
        notes=notes,
        params={
            "data": args.data,
            "rounds (decode)": args.repeat,
            "rounds (no decode)": 3 * args.repeat,
            "samples": total,
            "shards": len(urls),
        },
    )


if __name__ == "__main__":
    main()
