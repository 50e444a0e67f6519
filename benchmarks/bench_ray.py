"""The Ray engine beside the local engine on a run bench_scale.py kept (--keep): plan epoch 1
with SeTa on each engine (a local 2-CPU Ray cluster, started here) and check that the two plan
folders are the same bytes; optionally compact a fresh run on each engine too.

    python -m benchmarks bench_ray --n 100000000
"""

from __future__ import annotations

import argparse
import hashlib
import json
import time

from benchmarks.common import OUT, Result, machine, measure

PLAN = (
    "plan_epoch(run, 1, force=True, policy='seta', params=dict(r=0.1, k=10, alpha=0.5), epochs=10, seed=0, "
    "engine={engine!r})"
)


def digest(run) -> dict[str, str]:
    out = {}
    for p in sorted((run / "plans/epoch=1").rglob("*")):
        if p.is_file():
            out[str(p.relative_to(run))] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=100_000_000)
    p.add_argument("--cpus", type=int, default=2, help="CPUs of the local Ray cluster")
    args = p.parse_args()
    res = Result(f"ray-{args.n}", title=f"SeTa plan of {args.n:,} samples, local engine against Ray")
    run = OUT / f"scale-{args.n}"
    if not (run / "table/manifest.json").exists():
        from benchmarks.bench_scale import one_size

        one_size(args.n, keep=True, buckets=None)
    setup = f"from seta_stream import plan_epoch\nrun = {str(run)!r}"
    ray_setup = setup + f"\nimport ray\nray.init(num_cpus={args.cpus}, include_dashboard=False, log_to_driver=False)"
    local = measure(PLAN.format(engine="local"), setup)
    local_digest = digest(run)
    t0 = time.perf_counter()
    on_ray = measure(PLAN.format(engine="ray"), ray_setup)
    ray_digest = digest(run)
    same = local_digest == ray_digest
    print(
        json.dumps(
            {
                "n": args.n,
                "local": local,
                "ray": on_ray,
                "same_files": same,
                "files": len(local_digest),
                "elapsed": time.perf_counter() - t0,
            }
        )
    )
    print(f"\n## SeTa plan of {args.n:,} samples, local engine vs Ray on 2 CPUs ({machine()})\n")
    print("| engine | wall s | driver peak RSS MB |\n| --- | --- | --- |")
    print(f"| local | {local['wall_s']:.1f} | {local['peak_rss_mb']:.0f} |")
    print(f"| ray (local cluster, 2 CPUs) | {on_ray['wall_s']:.1f} | {on_ray['peak_rss_mb']:.0f} |")
    print(f"\nplan folders byte-identical: {same} ({len(local_digest)} files)")
    res.write(
        baseline={"what": "the local engine, same plan, same run", **local},
        rows=[
            {"engine": "local", "wall_s": local["wall_s"], "driver_peak_rss_mb": local["peak_rss_mb"]},
            {
                "engine": f"ray (local cluster, {args.cpus} CPUs)",
                "wall_s": on_ray["wall_s"],
                "driver_peak_rss_mb": on_ray["peak_rss_mb"],
            },
        ],
        peak_rss_mb=max(local["peak_rss_mb"], on_ray["peak_rss_mb"]),
        figures={"same_files": same, "files": len(local_digest)},
        notes=[f"Plan folders byte-identical: {same} ({len(local_digest)} files)."],
        params=vars(args),
    )


if __name__ == "__main__":
    main()
