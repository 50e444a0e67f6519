"""Planning one SeTa epoch of N samples from a loss table, in fresh processes, beside the
machine's speed measured in the same run (issue 35 targets at 15M: median <= 1.2 s and peak RSS
<= 1.0 GB; with ``noise=True`` at most 25% more time and memory; issue 49: the whole plan within
1.6x the floor measured beside it).

The run is the one ``common.make_table_run`` builds with the library itself: two epochs of
ST+MJ-shaped parts (5,000 samples per shard, MJSynth-like keys; 20% of the samples with a high,
persistent loss, which the noise rule finds) written as ``LossRecorder`` writes them and
compacted by ``compact()``, so the table, its keys file and manifest are those of a training run.

Each repetition plans the next epoch of the run in a fresh process (a new plan directory, as in
training): SeTa (r=0, k, alpha=0.5), then the same with ``noise=True``, then the baseline. A
plan's folder is removed once measured (``--keep-plans`` keeps them): 14 plans of about 460 MB
each, written within a few minutes, filled this VM's page cache, and the later plans then paid
for reclaiming it (each repetition slower than the one before, while the floor, which writes
nothing, stayed flat), which a training run, one plan an epoch, does not. The
baseline is the floor the issue names, in its own fresh process: a ``np.sort`` of the N float32
losses after reading the columns a SeTa plan reads (``pq.read_table`` of uid, last_loss and seen,
memory-mapped). Ratios are medians against medians of the same run. Peak RSS is the child's
VmHWM (the interpreter with seta_stream and its imports included; ``rss before`` is that part).

Two more fresh processes measure the noise rule alone: its own work (the candidates' scores,
their points, the mixture, the suspects) after reading the table, and the sort of the
candidates' scores alone, which §12.3 requires and the policy's clusters wait for.

Also, with ``--sklearn``, the reference's clustering call (scikit-learn ``KMeans(n_clusters=k,
random_state=0)`` on ``--baseline-n`` losses, extrapolated linearly to N; the reference's whole
step measured 285 s and 16.2 GB at 15M, algorithms.md §11).

With ``--codecs``, the plan.parquet parts of the last SeTa plan are encoded again on one thread
with the format's writer options (docs/format.md: LZ4, dictionary pages for shard and reason,
statistics for loss, cluster and weight) and with other codecs, each part the best of 3: the CPU
planning spends on them and the bytes every plan keeps on disk (result file plan-codecs-N).

    python -m benchmarks bench_plan --n 15000000 --repeat 7 [--sklearn] [--codecs]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import time
from pathlib import Path

from benchmarks import seam
from benchmarks.common import (
    OUT,
    Result,
    machine,
    make_table_run,
    measure,
    own_peak_rss_mb,
    read_through,
    table_files_code,
    timed_plan_code,
)

SETA = "dict(r=0.0, k={k}, alpha=0.5{extra})"


def prepared(n: int) -> object:
    """The run (made once, kept in bench-out/), its plans of earlier invocations removed and the
    table's files read once (in the page cache, as after the compaction that wrote them)."""
    run = make_table_run(OUT / f"plan-{n}", n, epochs=2, noisy=0.2)
    shutil.rmtree(run / "plans", ignore_errors=True)
    (run / "state.json").unlink(missing_ok=True)
    read_through(run / "table")
    return run


#: Setup code asking NumPy for 4 KB pages, as planning does (seta_stream._plan's normal pages).
SMALL_PAGES = "import numpy._core.multiarray as multiarray\nmultiarray._set_madvise_hugepage(False)\n"


def floor_code(run, pages: str = "4k") -> tuple[str, str]:
    """(code, setup) of the baseline: read the columns a SeTa plan reads, sort the losses; with
    ``pages="default"``, NumPy's arrays on the pages it asks for by default (a row beside the
    baseline: what the 4 KB pages save on this machine)."""
    # the same imports as the plan's process (seta_stream: its RSS before is comparable); the
    # dataset module pq.read_table uses is imported untimed; NumPy's arrays on 4 KB pages, as
    # planning asks for them (seta_stream._plan's normal pages: the 2 MB pages NumPy asks for by
    # default can cost this VM a compaction of memory; the "default" row measures it)
    setup = (
        "import numpy as np, pyarrow.dataset, pyarrow.parquet as pq\n"
        + (SMALL_PAGES if pages == "4k" else "")
        + table_files_code(run)
    )
    code = """
        t = pq.read_table(files[0], columns=['uid', 'last_loss', 'seen'], memory_map=True)
        loss = t.column('last_loss').to_numpy()
        np.sort(loss)
    """
    return code, setup


def fit_code(run) -> tuple[str, str]:
    """(code, setup) of the noise rule's own work alone (§12.2-12.4), without the policy: after
    reading the columns as planning reads them (untimed in ``fit_s``), the candidates' scores,
    their points (a sort of every candidate's score: the spec's sums run over the sorted scores),
    the mixture and the suspects. What noise=True must add to SeTa's plan at the least, beside
    the bar's 25%."""
    setup = (  # planning's pages (as the floor's) and its imports (polars sorts), untimed
        "import numpy as np, polars, seta_stream as P\n"
        + SMALL_PAGES
        + seam.imports("load_numeric")
        + "from seta_stream.policies.base import PolicyInput\n"
        "from seta_stream.policies.noise import NOISE_DEFAULTS, noise_fit\n"
    )
    code = noise_input_code(run) + (
        "t1 = time.perf_counter()\n"
        "fit = noise_fit(inp, NOISE_DEFAULTS['noise_warmup'])\n"
        "suspects = int(np.count_nonzero(fit.suspects(inp, NOISE_DEFAULTS['noise_warmup'])))\n"
        'marks = {"fit_s": time.perf_counter() - t1, "suspects": suspects}\n'
    )
    return code, setup


def noise_input_code(run) -> str:
    """Code making ``inp``, the PolicyInput of the columns a noise plan reads, read as planning
    reads them (``loss_mean`` as float32), for :func:`fit_code` and :func:`sort_code`."""
    return (
        f"cols = load_numeric({str(run)!r}, ['uid', 'seen', 'last_loss', 'loss_count', 'loss_mean'], "
        "dtypes={'loss_mean': np.float32})\n"
        "inp = PolicyInput.from_columns(cols, epoch=1, epochs=40, seed=0)\n"
    )


def sort_code(run) -> tuple[str, str]:
    """(code, setup) of the sort alone that the noise rule's points make (§12.3: the sums run
    over the candidates' scores in ascending order): the scores made untimed in the setup, then
    sorted as the library sorts large float arrays (np.sort or polars, whichever sorted faster
    on this machine, timed once in the setup). The part of the rule that no implementation of
    the spec can leave out, beside the bar's 25% (a candidate's score is the mean of its losses,
    never negative here)."""
    setup = (
        fit_code(run)[1] + noise_input_code(run) + "from seta_stream.policies.noise import candidate_scores\n"
        "x = candidate_scores(inp, NOISE_DEFAULTS['noise_warmup'])[1]\n"
        "del cols, inp\n"
        "assert x.min() >= 0\n" + seam.imports("_polars_sorts_faster", "_sorted_values") + "_polars_sorts_faster(x)\n"
    )
    code = """
        s = _sorted_values(x)
        marks = {"scores": len(x)}
    """
    return code, setup


#: plan.parquet's writer options as docs/format.md gives them, and the variants --codecs compares.
FORMAT_OPTIONS = {
    "compression": "lz4",
    "use_dictionary": ["shard", "reason"],
    "write_statistics": ["loss", "cluster", "weight"],
    "write_batch_size": 1 << 16,
    "max_rows_per_page": 1 << 20,
}
PLAN_COLUMNS = ["shard", "key", "uid", "loss", "cluster", "keep", "weight", "reason"]
CODECS = {
    "lz4 (the format's)": {},
    "uncompressed": {"compression": "none"},
    "key uncompressed, other columns lz4": {"compression": {c: "none" if c == "key" else "lz4" for c in PLAN_COLUMNS}},
    "key lz4, other columns uncompressed": {"compression": {c: "lz4" if c == "key" else "none" for c in PLAN_COLUMNS}},
    "snappy": {"compression": "snappy"},
    "zstd level 1": {"compression": "zstd", "compression_level": 1},
}


def codec_rows(folder: Path, scratch: Path, reps: int = 3) -> list[dict]:
    """Encode every part of the plan.parquet ``folder`` with each of :data:`CODECS` on this
    thread (each part the best of ``reps``): CPU and wall seconds, bytes, and the time to read
    the folder back with pyarrow."""
    import pyarrow.parquet as pq

    parts = sorted(folder.glob("part-*.parquet"))
    tables = [pq.read_table(p) for p in parts]
    meta = pq.ParquetFile(parts[0]).metadata.row_group(0)
    written = {meta.column(i).path_in_schema: meta.column(i).compression for i in range(meta.num_columns)}
    assert set(written.values()) == {"LZ4_RAW"} or set(written.values()) == {"LZ4"}, written  # the format's
    rows = []
    for name, extra in CODECS.items():
        out = scratch / f"codec-{len(rows)}"
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir(parents=True)
        cpu = wall = 0.0
        for i, table in enumerate(tables):
            best_cpu = best_wall = float("inf")
            for _ in range(reps):
                c0, t0 = time.thread_time(), time.perf_counter()
                pq.write_table(table, out / f"part-{i:05d}.parquet", **{**FORMAT_OPTIONS, **extra})
                best_cpu, best_wall = min(best_cpu, time.thread_time() - c0), min(best_wall, time.perf_counter() - t0)
            cpu, wall = cpu + best_cpu, wall + best_wall
        size = sum(os.path.getsize(p) for p in out.iterdir())
        t0 = time.perf_counter()
        assert pq.read_table(out).num_rows == sum(t.num_rows for t in tables)
        rows.append(
            {
                "what": name,
                "encode_cpu_s": cpu,
                "encode_wall_s": wall,
                "mb": size / 1e6,
                "read_s": time.perf_counter() - t0,
            }
        )
        shutil.rmtree(out)
    for row in rows:
        row["cpu_vs_lz4"] = row["encode_cpu_s"] / rows[0]["encode_cpu_s"]
        row["size_vs_lz4"] = row["mb"] / rows[0]["mb"]
    return rows


def write_codecs(args, run: Path, epoch: int) -> None:
    """The --codecs result file (plan-codecs-N): :func:`codec_rows` of epoch ``epoch``'s plan."""
    res = Result(f"plan-codecs-{args.n}", title=f"plan.parquet's codec: encoding one plan of {args.n:,} rows")
    rows = codec_rows(run / "plans" / f"epoch={epoch}" / "plan.parquet", OUT / f"plan-codecs-{args.n}")
    base, other = rows[0], {r["what"]: r for r in rows}
    key_none = other["key uncompressed, other columns lz4"]
    none = other["uncompressed"]
    notes = [
        f"Encoding the {args.n:,} rows of one SeTa plan on one thread: LZ4 (the format's) "
        f"{base['encode_cpu_s']:.2f} s of CPU and {base['mb']:,.0f} MB; uncompressed {none['cpu_vs_lz4']:.2f}x "
        f"the CPU and {none['size_vs_lz4']:.2f}x the bytes; the key column alone uncompressed "
        f"{key_none['cpu_vs_lz4']:.2f}x the CPU and {key_none['size_vs_lz4']:.2f}x the bytes."
    ]
    print("\n".join(f"{r['what']}: cpu {r['encode_cpu_s']:.2f} s, {r['mb']:.0f} MB" for r in rows))
    res.write(
        baseline=base,
        rows=rows,
        peak_rss_mb=own_peak_rss_mb()["process_mb"],
        figures={r["what"]: {k: v for k, v in r.items() if k != "what"} for r in rows},
        notes=notes,
        params=vars(args),
    )


def summarize(name: str, runs: list[dict]) -> dict:
    walls = [r["wall_s"] for r in runs]
    return {
        "what": name,
        "median_s": statistics.median(walls),
        "min_s": min(walls),
        "max_s": max(walls),
        "cpu_median_s": statistics.median(r["cpu_s"] for r in runs),
        "sys_median_s": statistics.median(r["sys_s"] for r in runs),
        "minor_faults_median": statistics.median(r["minflt"] for r in runs),
        "peak_rss_mb": max(r["peak_rss_mb"] for r in runs),
        "rss_before_mb": max(r["rss_before_mb"] for r in runs),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=15_000_000)
    p.add_argument("--k", type=int, default=10)
    p.add_argument("--repeat", type=int, default=7, help="epochs planned (each in a fresh process)")
    p.add_argument("--idle", type=float, default=2.0, help="seconds idle before each measured process")
    p.add_argument("--sklearn", action="store_true", help="also time scikit-learn's KMeans (the reference's call)")
    p.add_argument("--baseline-n", type=int, default=1_000_000, help="samples for the scikit-learn call")
    p.add_argument("--result", default=None, help="result file name (default plan-N)")
    p.add_argument("--codecs", action="store_true", help="also compare plan.parquet's codecs (plan-codecs-N)")
    p.add_argument("--keep-plans", action="store_true", help="keep every measured plan's folder (page cache fills)")
    args = p.parse_args()
    res = Result(args.result or f"plan-{args.n}", title=f"Planning one SeTa epoch of {args.n:,} samples")
    run = prepared(args.n)
    setup = "import seta_stream as P"
    floor = floor_code(run)
    floor_default = floor_code(run, pages="default")
    fit = fit_code(run)
    scores_sort = sort_code(run)
    epochs = 4 * args.repeat + 4  # every planned epoch stays a pruning epoch (delta = 0.875)
    names = ("seta", "seta_noise", "floor", "floor_default", "fit", "sort", "sklearn")
    samples: dict[str, list[dict]] = {name: [] for name in names}
    for i in range(args.repeat):
        for name, extra in (("seta", ""), ("seta_noise", ", noise=True")):
            e = 1 + 2 * i + (name == "seta_noise")  # epoch e of one run: a new plan directory each
            params = SETA.format(k=args.k, extra=extra)
            # force: the run's settings are fixed by its first plan; the two variants alternate
            code = timed_plan_code(run, f"{e}, policy='seta', params={params}, epochs={epochs}, seed=0, force=True")
            time.sleep(args.idle)
            samples[name].append(measure(code, setup))
            if not args.keep_plans and not (args.codecs and i == args.repeat - 1 and name == "seta"):
                shutil.rmtree(run / "plans" / f"epoch={e}")
        time.sleep(args.idle)
        samples["floor"].append(measure(*floor))
        time.sleep(args.idle)
        samples["floor_default"].append(measure(*floor_default))
        time.sleep(args.idle)
        samples["fit"].append(measure(*fit))
        time.sleep(args.idle)
        samples["sort"].append(measure(*scores_sort))
        if args.sklearn:
            base_n = min(args.n, args.baseline_n)
            samples["sklearn"].append(
                measure(
                    f"KMeans(n_clusters={args.k}, random_state=0).fit(loss.reshape(-1, 1))",
                    f"""
                    import numpy as np
                    from sklearn.cluster import KMeans
                    loss = np.random.default_rng(0).lognormal(size={base_n}).astype(np.float32)
                    """,
                )
            )
        print(f"repetition {i + 1}: " + ", ".join(f"{k} {v[-1]['wall_s']:.2f} s" for k, v in samples.items() if v))
    seta, noisy, base, default = (summarize(k, samples[k]) for k in ("seta", "seta_noise", "floor", "floor_default"))
    seta["what"] = (
        f"plan_epoch SeTa (r=0, k={args.k}, alpha=0.5): read table, policy, stage files, summary, plan.parquet"
    )
    noisy["what"] = "the same with noise=True (the noise rule in front of SeTa)"
    base["what"] = (
        "floor: read uid, last_loss, seen (pyarrow, memory-mapped) + np.sort of the losses (4 KB pages, as planning)"
    )
    default["what"] = "the floor with NumPy's default pages (2 MB where the kernel has them)"
    for row in (seta, noisy, base, default):
        row["median_over_floor"] = row["median_s"] / base["median_s"]
    fit_s = statistics.median(r["fit_s"] for r in samples["fit"])
    sort_s = statistics.median(r["wall_s"] for r in samples["sort"])
    sort_cpu_s = statistics.median(r["cpu_s"] for r in samples["sort"])
    figures = {
        "n": args.n,
        "seta_median_s": seta["median_s"],
        "seta_peak_rss_mb": seta["peak_rss_mb"],
        "noise_median_s": noisy["median_s"],
        "seta_median_over_floor": seta["median_s"] / base["median_s"],
        "noise_peak_rss_mb": noisy["peak_rss_mb"],
        "floor_median_s": base["median_s"],
        "noise_time_ratio": noisy["median_s"] / seta["median_s"],
        "noise_cpu_ratio": noisy["cpu_median_s"] / seta["cpu_median_s"],
        "seta_cpu_median_s": seta["cpu_median_s"],
        "floor_cpu_median_s": base["cpu_median_s"],
        "seta_sys_median_s": seta["sys_median_s"],
        "noise_sys_median_s": noisy["sys_median_s"],
        "floor_sys_median_s": base["sys_median_s"],
        "seta_minor_faults_median": seta["minor_faults_median"],
        "noise_minor_faults_median": noisy["minor_faults_median"],
        "floor_minor_faults_median": base["minor_faults_median"],
        "floor_default_pages_median_s": default["median_s"],
        "floor_default_pages_sys_median_s": default["sys_median_s"],
        "noise_rss_ratio": noisy["peak_rss_mb"] / seta["peak_rss_mb"],
        "noise_fit_median_s": fit_s,
        "noise_fit_over_seta": fit_s / seta["median_s"],
        "noise_fit_suspects": samples["fit"][0]["suspects"],
        "noise_sort_median_s": sort_s,
        "noise_sort_cpu_median_s": sort_cpu_s,
        "noise_sort_scores": samples["sort"][0]["scores"],
        "noise_sort_over_seta": sort_s / seta["median_s"],
        "seta_runs_s": [r["wall_s"] for r in samples["seta"]],
        "noise_runs_s": [r["wall_s"] for r in samples["seta_noise"]],
        "floor_runs_s": [r["wall_s"] for r in samples["floor"]],
    }
    notes = [
        f"{args.repeat} fresh-process runs of each, alternating. SeTa: the whole plan (stage files, plan.parquet, "
        f"summary.json, state.json: what plan_epoch and Pruner.start_epoch wait for) after a median "
        f"{seta['median_s']:.2f} s, {seta['median_s'] / base['median_s']:.2f}x the floor measured beside it; peak "
        f"RSS {seta['peak_rss_mb']:,.0f} MB. noise=True: {figures['noise_time_ratio']:.2f}x SeTa's median time, "
        f"{figures['noise_rss_ratio']:.2f}x its peak RSS. CPU time (all threads, user + system; what depends least "
        f"on the machine's load): SeTa {seta['cpu_median_s']:.2f} s, "
        f"{seta['cpu_median_s'] / base['cpu_median_s']:.2f}x the floor's {base['cpu_median_s']:.2f} s; noise=True "
        f"{figures['noise_cpu_ratio']:.2f}x SeTa's.",
        "Of that CPU time, the kernel's (system time: mostly faulting fresh memory in, which on this VM costs "
        "microseconds a 4 KB page; pyarrow's allocator asks for 2 MB pages, fewer faults whose cost is the "
        f"kernel's compaction of memory when none is free): SeTa {seta['sys_median_s']:.2f} s for "
        f"{seta['minor_faults_median']:,.0f} minor faults ({seta['minor_faults_median'] * 4096 / 1e6:,.0f} MB), "
        f"noise=True {noisy['sys_median_s']:.2f} s for {noisy['minor_faults_median']:,.0f} "
        f"({noisy['minor_faults_median'] * 4096 / 1e6:,.0f} MB), the floor {base['sys_median_s']:.2f} s for "
        f"{base['minor_faults_median']:,.0f} ({base['minor_faults_median'] * 4096 / 1e6:,.0f} MB).",
    ]
    notes.append(
        f"The noise rule's own work alone (§12.2-12.4: the candidates' scores, their points, which sort every "
        f"candidate's score, the mixture and the suspects; {figures['noise_fit_suspects']:,} suspects), without "
        f"reading the table or planning SeTa: median {fit_s:.2f} s, {figures['noise_fit_over_seta']:.2f}x "
        "SeTa's time, in fresh processes beside the plans. noise=True adds at least that to "
        "SeTa's plan; the bar (at most 1.25x) leaves it 0.25x."
    )
    # the least any implementation of §12.3 adds: its sort, which the policy's clusters of the
    # other rows wait for (they are the clusters of the rows the threshold leaves)
    allowance = 0.25 * seta["median_s"]
    cores = os.cpu_count() or 1
    notes.append(
        f"Of that, the sort of the {figures['noise_sort_scores']:,} candidates' scores alone (§12.3 sums over "
        f"them in ascending order), on all cores as the library sorts them: median {sort_s:.2f} s "
        f"({sort_cpu_s:.2f} s of CPU), {figures['noise_sort_over_seta']:.2f}x SeTa's time, of the "
        f"bar's {allowance:.2f} s (0.25x). The policy plans the rows the threshold leaves, so its clusters wait "
        "for the sort: it is on the path to a published plan whatever runs beside it. A plan takes at least its "
        f"CPU time over the cores ({cores}): noise=True ({noisy['cpu_median_s']:.2f} s of CPU) at least "
        f"{noisy['cpu_median_s'] / cores:.2f} s, {noisy['cpu_median_s'] / cores / seta['median_s']:.2f}x SeTa's "
        f"time; SeTa ({seta['cpu_median_s']:.2f} s of CPU) at least {seta['cpu_median_s'] / cores:.2f} s."
    )
    if samples["sklearn"]:
        sk = summarize("sklearn", samples["sklearn"])
        est = sk["median_s"] * args.n / min(args.n, args.baseline_n)
        figures["sklearn_median_s"], figures["sklearn_extrapolated_s"] = sk["median_s"], est
        notes.append(
            f"scikit-learn KMeans(k={args.k}) on {min(args.n, args.baseline_n):,} losses: median "
            f"{sk['median_s']:.2f} s, {est:.1f} s extrapolated to {args.n:,} ({est / seta['median_s']:.1f}x "
            "SeTa's whole plan)."
        )
    print(f"## Planning one SeTa epoch of {args.n:,} samples ({machine()})\n")
    notes.append(
        f"The floor with NumPy's default pages: median {default['median_s']:.2f} s, of which "
        f"{default['sys_median_s']:.2f} s of system time, against {base['median_s']:.2f} s and "
        f"{base['sys_median_s']:.2f} s on 4 KB pages (planning's)."
    )
    rows = [seta, noisy, base, default]
    for row in rows:
        print(
            f"{row['what']}: median {row['median_s']:.2f} s ({row['min_s']:.2f} - {row['max_s']:.2f}), "
            + f"{row['median_over_floor']:.2f}x floor, peak RSS {row['peak_rss_mb']:.0f} MB"
        )
    print("\n".join(notes))
    res.write(
        baseline=base,
        rows=rows,
        peak_rss_mb=max(seta["peak_rss_mb"], noisy["peak_rss_mb"]),
        figures=figures,
        notes=notes,
        params=vars(args),
    )
    if args.codecs:
        write_codecs(args, run, 2 * args.repeat - 1)  # the last SeTa plan


if __name__ == "__main__":
    main()
