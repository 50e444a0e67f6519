"""Planning computation of every policy at N samples (policy function only: no table read, no
plan write), each in a fresh subprocess, beside the reference's clustering step.

Inputs: N synthetic log-normal(0, 1) float32 losses, random uint64 uids, every sample seen,
epoch 1 of 10 (a pruning epoch with an active SeTa window). Reported per policy: wall time of
the call and the peak RSS reached during the call minus the RSS just before it (the kernel's
VmHWM, reset after building the inputs by writing 5 to /proc/self/clear_refs; ``ru_maxrss``
cannot be reset and Linux carries the parent's peak across exec, so it is not used).

Baseline: scikit-learn ``KMeans(n_clusters=k, random_state=0)`` on the same 1-D losses, the
k-means call of the SeTa reference (the cheapest part of its planning step, algorithms.md §11).
At large N it runs on ``--baseline-n`` samples and is extrapolated linearly to N; both numbers
are printed. Also times :func:`seta_stream.policies.es_select` per meta-batch of 512.

    python -m benchmarks bench_policies --n 15000000 [--baseline-n 1000000]

Targets at 15M: every policy <= 3 s and <= 2 GB.
"""

from __future__ import annotations

import argparse
import timeit

import numpy as np

from benchmarks import seam
from benchmarks.common import Result, machine
from benchmarks.common import measure as common_measure

CASES: list[tuple[str, str, dict]] = [
    ("full", "full", {}),
    ("random (dynamic, r=0.3)", "random", {"r": 0.3}),
    ("static (r=0.3)", "static", {"r": 0.3}),
    ("seta (class defaults: r=0, k=10, alpha=0.5)", "seta", {}),
    ("seta (cifar: r=0.1, k=5, alpha=0.9)", "seta", {"r": 0.1, "k": 5, "alpha": 0.9}),
    ("seta (defaults + target_keep=0.5)", "seta", {"target_keep": 0.5}),
    ("infobatch (r=0.5)", "infobatch", {"r": 0.5}),
    ("es", "es", {}),
    ("eswp (r=0.2)", "eswp", {"r": 0.2}),
]


def setup_code(n: int, extra_import: str = "") -> str:
    return "\n".join(
        [
            extra_import,
            "import numpy as np",
            "from seta_stream.policies import PolicyInput, get_policy",
            "rng = np.random.default_rng(0)",
            f"uid = rng.integers(0, 2**64 - 1, {n}, dtype=np.uint64, endpoint=True)",
            f"loss = rng.lognormal(size={n}).astype(np.float32)",
            "inp = PolicyInput.from_losses(uid, loss, epoch=1, epochs=10, seed=0)",
            "del rng",
        ]
    )


def measure(code: str, setup: str) -> dict:
    """Wall time of ``code`` in a fresh interpreter after ``setup``; peak RSS during ``code``
    (VmHWM reset after setup) and the RSS before it, in MB."""
    return common_measure(code, setup, reset_peak=True)


def es_select_us(reps: int = 2000) -> float:
    from seta_stream.policies import es_select

    rng = np.random.default_rng(0)
    losses, scores = rng.lognormal(size=512), rng.lognormal(size=512)
    uids = rng.integers(0, 2**63, 512, dtype=np.uint64)
    step = iter(range(10**9))

    def call() -> None:
        es_select(losses, scores, 0.25, 0.2, seed=0, epoch=1, rank=0, step=next(step), uids=uids)

    call()
    return min(timeit.repeat(call, number=reps, repeat=3)) / reps * 1e6


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=15_000_000)
    p.add_argument("--baseline-n", type=int, default=1_000_000, help="samples for the scikit-learn baseline")
    p.add_argument("--k", type=int, default=10)
    args = p.parse_args()
    res = Result(f"policies-{args.n}", title=f"Policies' planning functions at N = {args.n:,}")
    setup = setup_code(args.n)

    rows = []
    for label, name, params in CASES:
        code = f"spec = get_policy({name!r}); p = spec.make_params(**{params!r}); res = spec.fn(inp, p)"
        r = measure(code, setup)
        rows.append((label, r["wall_s"], r["peak_rss_mb"] - r["rss_before_mb"]))
        print(f"  {label}: {r['wall_s']:.2f} s, +{rows[-1][2]:.0f} MB", flush=True)

    km = measure(seam.imports("kmeans1d") + f"km = kmeans1d(loss, {args.k})", setup)
    base_n = min(args.n, args.baseline_n)
    base = measure(
        f"km = KMeans(n_clusters={args.k}, random_state=0).fit(loss[:{base_n}].reshape(-1, 1))",
        setup_code(args.n, "from sklearn.cluster import KMeans"),
    )
    scale = args.n / base_n
    base_extrap = base["wall_s"] * scale
    base_mem = base["peak_rss_mb"] - base["rss_before_mb"]
    seta_wall = next(w for label, w, _ in rows if label.startswith("seta (class"))

    print(f"\n### Policy planning at N = {args.n:,} (log-normal losses; {machine()})\n")
    print("| policy (planning function only) | wall s | peak RSS over inputs MB |")
    print("| --- | --- | --- |")
    for label, wall, mem in rows:
        print(f"| {label} | {wall:.2f} | {mem:.0f} |")
    print(f"| kmeans1d alone (k={args.k}) | {km['wall_s']:.2f} | {km['peak_rss_mb'] - km['rss_before_mb']:.0f} |")
    print(f"\n### Clustering: ours vs the reference's k-means call (k={args.k})\n")
    print("| step | N | wall s | peak RSS over inputs MB | ratio to kmeans1d at N |")
    print("| --- | --- | --- | --- | --- |")
    print(f"| kmeans1d (exact DP on bins + Lloyd, ours) | {args.n:,} | {km['wall_s']:.2f} | "
          f"{km['peak_rss_mb'] - km['rss_before_mb']:.0f} | 1.0 |")  # fmt: skip
    print(f"| scikit-learn KMeans(random_state=0), measured | {base_n:,} | {base['wall_s']:.2f} | {base_mem:.0f} | - |")
    if scale != 1:
        print(f"| same, linear extrapolation (not measured) | {args.n:,} | {base_extrap:.1f} | "
              f"{base_mem * scale:.0f} | {base_extrap / km['wall_s']:.0f}x |")  # fmt: skip
    else:
        print(f"| (ratio) | | | | {base['wall_s'] / km['wall_s']:.0f}x |")
    print(f"\nWhole SeTa planning step (ours, class defaults) vs the baseline's k-means call alone "
          f"(extrapolated to N): {base_extrap / seta_wall:.0f}x faster.")  # fmt: skip
    es_us = es_select_us()
    print(f"\nes_select per meta-batch of 512 (b = 128): {es_us:.1f} us (target <= 50 us)")
    table = [{"what": label, "wall_s": wall, "peak_rss_over_inputs_mb": mem} for label, wall, mem in rows]
    table.append(
        {
            "what": f"kmeans1d alone (k={args.k})",
            "wall_s": km["wall_s"],
            "peak_rss_over_inputs_mb": km["peak_rss_mb"] - km["rss_before_mb"],
        }
    )
    res.write(
        baseline={
            "what": f"scikit-learn KMeans(n_clusters={args.k}, random_state=0) on {base_n:,} of the losses",
            "wall_s": base["wall_s"],
            "peak_rss_over_inputs_mb": base_mem,
            "extrapolated_to_n_s": base_extrap,
        },
        rows=table,
        peak_rss_mb=max(r["peak_rss_over_inputs_mb"] for r in table),
        figures={"es_select_us": es_us, "seta_wall_s": seta_wall, "kmeans1d_s": km["wall_s"]},
        notes=[
            f"Whole SeTa planning function (class defaults) against the baseline's k-means call extrapolated to "
            f"N: {base_extrap / seta_wall:.0f}x faster. es_select per meta-batch of 512 (b = 128): {es_us:.1f} us "
            "(target <= 50 us). Peak RSS is over the inputs (VmHWM reset after building them)."
        ],
        params=vars(args),
    )


if __name__ == "__main__":
    main()
