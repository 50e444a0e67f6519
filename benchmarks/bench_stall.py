"""The stall between two epochs at N samples: from the last ``record()`` of epoch 1 to the plan
of epoch 2 published, split into the recorder's last flush, compaction and planning (what
``Pruner.start_epoch`` does on rank 0 while the loaders wait).

The run (``common.make_table_run``, ``dataset_size`` = N, so partitioned as a run of that size
is: one bucket up to 16,777,216 samples, else ceil(N / 8,388,608) buckets) holds epoch 0 in its
table. Epoch 1's records are on disk as a training run leaves them when its last batch is
recorded: every sample once, in parts of ``flush_rows`` = 65,536 records (``LossRecorder``'s
default: the parts a recorder flushes while the epoch runs), except the last 65,535 records,
which are in a real ``LossRecorder``'s buffer (the largest last flush). Each repetition, in a
fresh process: ``recorder.flush()``, ``compact()``,
the plan of epoch 2 (SeTa, r=0.1, k=10, alpha=0.5) until its whole folder is published (the
stall ends there), each timed; then the run is put back as it
was (the manifest of epoch 0, the new part and the plan removed) for the next one.

What folding the flushed parts during the epoch could save: compaction with every part of the
epoch pending, against the same compaction with only the last part pending (``compact_one_s``:
the table read, merged and written with one part's records, what remains at the boundary if
every earlier part had been folded while the epoch ran). Their difference bounds what moving
the folding off the boundary can take out of the stall (the table is rewritten at the boundary
either way, and the plan is computed from the final table either way: plans stay identical).

Baseline in the same run: the floor of planning N samples (read the table's losses, np.sort).

    python -m benchmarks bench_stall --n 10000000 --repeat 2
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import time
from pathlib import Path

from benchmarks.common import OUT, Result, machine, make_table_run, measure, table_files_code, write_epoch_parts

FLUSH_ROWS = 65_536
PLAN = "dict(r=0.1, k=10, alpha=0.5)"


def prepared(n: int, flush_rows: int) -> tuple[Path, int]:
    """The run with epoch 0 compacted and epoch 1's parts but the last ``flush_rows - 1`` records
    written (made once; kept in bench-out/); returns the run and where the tail starts."""
    tail = min(n, flush_rows - 1)
    run = make_table_run(OUT / f"stall-{n}", n, settings={"dataset_size": n})
    marker = run / f"bench-epoch1-{flush_rows}.json"
    if not marker.exists():
        for p in run.glob("losses/rank=*/epoch=1/*.parquet"):
            p.unlink()
        write_epoch_parts(run, n - tail, 1, part_rows=flush_rows)
        # epoch 0's table, hard-linked (compactions remove the table files older than the last two)
        shutil.rmtree(run / "bench-epoch0", ignore_errors=True)
        shutil.copytree(run / "table", run / "bench-epoch0", copy_function=os.link)
        marker.write_text(json.dumps({"tail_start": n - tail}))
    return run, n - tail


def restore(run: Path, parts_before: set[Path]) -> None:
    """Put the run back as prepared: epoch 0's manifest, no part written since, no plan."""
    for p in set(run.glob("losses/rank=*/epoch=*/*.parquet")) - parts_before:
        p.unlink()
    shutil.rmtree(run / "plans", ignore_errors=True)
    (run / "state.json").unlink(missing_ok=True)
    saved = run / "bench-epoch0"
    for src in saved.rglob("*"):
        dst = run / "table" / src.relative_to(saved)
        if src.is_dir():
            dst.mkdir(exist_ok=True)
        elif src.name != "manifest.json" and not dst.exists():
            os.link(src, dst)
    tmp = run / "table/manifest.json.bench"
    shutil.copyfile(saved / "manifest.json", tmp)
    os.replace(tmp, run / "table/manifest.json")


def stall_code(run: Path, tail_start: int, n: int, flush_rows: int, phases: Path) -> tuple[str, str]:
    """(code, setup) of one measured boundary. Setup: a LossRecorder of epoch 1 holding the last
    records in its buffer (batches of 256, as a training loop records them)."""
    setup = f"""
        import json, sys, time, numpy as np
        from benchmarks.common import st_mj_range, shard_url
        from seta_stream import compact
        from seta_stream.testing import LossRecorder
        from seta_stream import plan_epoch
        rec = LossRecorder({str(run)!r}, rank=0, epoch=1, flush_rows={flush_rows})
        shards, keys = st_mj_range({tail_start}, {n})
        names = shards.dictionary.to_pylist()
        urls = [shard_url(names[i]) for i in shards.indices.to_numpy()]
        keys = keys.to_pylist()
        loss = np.random.default_rng(7).lognormal(size=len(keys)).astype(np.float32)
        for lo in range(0, len(keys), 256):
            rec.record(keys[lo : lo + 256], urls[lo : lo + 256], loss[lo : lo + 256])
    """
    code = f"""
        t0 = time.perf_counter()
        rec.flush()
        t1 = time.perf_counter()
        compact({str(run)!r})
        t2 = time.perf_counter()
        plan_epoch({str(run)!r}, 2, policy='seta', params={PLAN}, epochs=10, seed=0)
        t3 = time.perf_counter()  # the whole plan published (Pruner's stall ends here)
        json.dump({{"flush_s": t1 - t0, "compact_s": t2 - t1, "plan_s": t3 - t2, "stall_s": t3 - t0}},
                  open({str(phases)!r}, "w"))
    """
    return code, setup


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=10_000_000)
    p.add_argument("--repeat", type=int, default=2)
    p.add_argument("--flush-rows", type=int, default=FLUSH_ROWS, help="LossRecorder's flush_rows")
    p.add_argument("--parts", type=int, default=None, help="epoch 1's parts (default: N / flush_rows)")
    p.add_argument("--result", default=None, help="result file name (default stall-N)")
    args = p.parse_args()
    flush_rows = args.flush_rows if args.parts is None else max(2, -(-args.n // args.parts))
    res = Result(args.result or f"stall-{args.n}", title=f"The stall between two epochs at {args.n:,} samples")
    t = time.perf_counter()
    run, tail_start = prepared(args.n, flush_rows)
    made_s = time.perf_counter() - t
    parts_before = set(run.glob("losses/rank=*/epoch=*/*.parquet"))
    restore(run, parts_before)
    phases_file = OUT / f"stall-{args.n}-phases.json"
    runs = []
    for i in range(args.repeat):
        m = measure(*stall_code(run, tail_start, args.n, flush_rows, phases_file))
        ph = json.loads(phases_file.read_text())
        runs.append({**ph, "peak_rss_mb": m["peak_rss_mb"]})
        restore(run, parts_before)
        print(f"repetition {i + 1}: " + ", ".join(f"{k} {v:.2f}" for k, v in runs[-1].items()), flush=True)
    # the boundary's compaction if the earlier parts had been folded during the epoch: the table
    # with epoch 1's parts folded but the last one, then the tail flushed and compacted
    one = []
    for _ in range(args.repeat):
        m_pre = measure(f"compact({str(run)!r})", "from seta_stream import compact")  # folds the flushed parts
        m = measure(*stall_code(run, tail_start, args.n, flush_rows, phases_file))
        ph = json.loads(phases_file.read_text())
        one.append({**ph, "prefold_s": m_pre["wall_s"], "peak_rss_mb": m["peak_rss_mb"]})
        restore(run, parts_before)
    floor = measure(
        """
        loss = np.concatenate([pq.read_table(f, columns=['last_loss'], memory_map=True).column('last_loss')
                               .to_numpy() for f in files])
        np.sort(loss)
        """,
        "import numpy as np, pyarrow.dataset, pyarrow.parquet as pq\n" + table_files_code(run),
    )
    med = {k: statistics.median(r[k] for r in runs) for k in ("flush_s", "compact_s", "plan_s", "stall_s")}
    med_one = {k: statistics.median(r[k] for r in one) for k in ("flush_s", "compact_s", "plan_s", "stall_s")}
    n_parts = len([q for q in parts_before if "epoch=1" in str(q)]) + 1
    saving = med["compact_s"] - med_one["compact_s"]
    prefold = statistics.median(r["prefold_s"] for r in one)
    rows = [
        {"what": f"stall, every part of epoch 1 pending ({n_parts:,} parts)", **med,
         "peak_rss_mb": max(r["peak_rss_mb"] for r in runs)},
        {"what": "stall if the earlier parts were folded during the epoch (only the last part pending)", **med_one,
         "peak_rss_mb": max(r["peak_rss_mb"] for r in one)},
    ]  # fmt: skip
    notes = [
        f"At {args.n:,} samples ({machine()}): the stall from the last record() to the next plan published is "
        f"{med['stall_s']:.1f} s (median of {args.repeat}): flush {med['flush_s']:.2f} s, compaction "
        f"{med['compact_s']:.1f} s, planning {med['plan_s']:.1f} s. Folding the flushed parts while the epoch runs "
        f"would leave a compaction of {med_one['compact_s']:.1f} s at the boundary (the table rewritten with the "
        f"last part's records): {saving:.1f} s less, a stall of {med['stall_s'] - saving:.1f} s "
        f"({100 * saving / med['stall_s']:.0f}% shorter); the folding itself ({prefold:.1f} s) would run beside "
        "training.",
    ]
    print("\n".join(notes))
    res.write(
        baseline={"what": "floor: read the table's losses and np.sort them, fresh process", **floor},
        rows=rows,
        peak_rss_mb=max(r["peak_rss_mb"] for r in rows),
        figures={
            "n": args.n,
            "parts": n_parts,
            "flush_rows": flush_rows,
            "runs": runs,
            "last_part_only": one,
            "saving_s": saving,
            "made_s": made_s,
        },
        notes=notes,
        params=vars(args),
    )


if __name__ == "__main__":
    main()
