"""Recording cost per sample: a loop over batches with and without ``recorder.record`` (plus
the final flush), in the same process, same data (issue target: <= 1 us per sample).

    python -m benchmarks bench_record --batches 2000 --batch-size 256
"""

from __future__ import annotations

import argparse
import tempfile
import time

import torch

from benchmarks.common import Result, machine


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batches", type=int, default=2000)
    p.add_argument("--batch-size", type=int, default=256)
    args = p.parse_args()
    res = Result("record", title=f"Recording per-sample losses, batches of {args.batch_size}")
    from seta_stream.testing import LossRecorder

    B = args.batch_size
    batches = []
    for b in range(args.batches):
        keys = [f"mj/{b % 3000:04d}/{i % 7}/{b * B + i:08d}_Word" for i in range(B)]
        urls = [f"/data/stmj-train-{(b * B) // 5000:06d}.tar"] * B
        batches.append((keys, urls, torch.rand(B)))

    def loop(rec):
        acc = 0.0
        t0 = time.perf_counter()
        for keys, urls, loss in batches:
            acc += float(loss[0])  # stand-in for the rest of a training step
            if rec is not None:
                rec.record(keys, urls, loss)
        if rec is not None:
            rec.close()
        return time.perf_counter() - t0

    n = args.batches * B
    results = []
    for _ in range(3):
        base = loop(None)
        with tempfile.TemporaryDirectory() as d:
            ours = loop(LossRecorder(d))
        results.append((base, ours))
    base, ours = min(results, key=lambda r: r[1] - r[0])
    print(f"## Recording {n:,} per-sample losses in batches of {B} ({machine()})\n")
    print("| what | wall s | us per sample |")
    print("| --- | --- | --- |")
    print(f"| loop without recording (baseline) | {base:.3f} | {1e6 * base / n:.3f} |")
    print(f"| loop with recorder.record + flushes | {ours:.3f} | {1e6 * ours / n:.3f} |")
    overhead = 1e6 * (ours - base) / n
    print(f"\nrecording overhead: {overhead:.3f} us per sample (best of 3)")
    res.write(
        baseline={"what": "the same loop without recording", "wall_s": base, "us_per_sample": 1e6 * base / n},
        rows=[
            {"what": "loop without recording (baseline)", "wall_s": base, "us_per_sample": 1e6 * base / n},
            {"what": "loop with recorder.record + flushes", "wall_s": ours, "us_per_sample": 1e6 * ours / n},
        ],
        peak_rss_mb=None,
        figures={"overhead_us_per_sample": overhead, "samples": n},
        notes=[f"Recording overhead: {overhead:.3f} us per sample (the best of 3 paired loops; target <= 1 us)."],
        params=vars(args),
    )


if __name__ == "__main__":
    main()
