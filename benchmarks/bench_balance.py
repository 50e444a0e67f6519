"""Balanced epochs at scale: a 15M-sample pruned epoch dealt to ranks x 8 DataLoader workers,
split_by_node + split_by_worker's natural dealing against the balanced deal (docs/ranks.md).

Plans: 15,000,000 samples in 1,500 shards of 10,000, two shapes of per-shard kept counts:

* ``seta``: the SeTa policy itself (``run_policy``, class defaults k=10, alpha=0.5, E=10, every
  sample seen) on log-normal losses whose location differs per shard (N(0, 0.5)): shards of
  unlike difficulty, as in a mix of sources, so the window keeps more of some shards than of
  others; epochs 1, 2, 3 of the run keep about 50%, 24% and 11%;
* ``random``: the random policy (r=0.6) in the same epochs: a uniform 40% of every shard.

For each plan and each of ``--ranks`` (x ``--workers``), on epoch 1's plan: the kept samples per
slot under the natural dealing (rank r reads shards r, r + W, ...; its worker w every
``workers``-th of those, shards in URL order) and under the balanced deal; the step imbalance
(max over min kept samples per slot; "inf" when a slot gets nothing) and the steps per rank at
``--batch-size`` (each worker's last batch short); the time one DataLoader worker spends
dealing the epoch (hashing the shard names, the kernel, its own pieces:
``EpochDeal(...).pieces(slot)``, median of ``--repeat``) beside the natural dealing's (its
islice over the URL list), and the peak RSS the deal adds (VmHWM reset before it). Over the
deals of epochs 1-3: the most samples deferred in an epoch, the deferred samples outside the
epoch's deferring half (summed), the most shards read by more than one slot, the most shard
opens over the shards with a kept sample.

    python -m benchmarks bench_balance [--n 15000000 --shards 1500 --ranks 8 64 512 --workers 8]
    python -m benchmarks bench_balance --doc   # render the result into docs/benchmarks.md

Writes docs/benchmarks/balance.json (``common.Result``); ``--doc`` renders it between
``<!-- balance:begin -->`` and ``<!-- balance:end -->`` in docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from itertools import islice
from pathlib import Path

import numpy as np

from benchmarks.common import ROOT, Result, results_dir
from benchmarks.seam import EpochDeal
from seta_stream.policies import PolicyInput, run_policy

DOC = ROOT / "docs" / "benchmarks.md"
BEGIN, END = "<!-- balance:begin -->", "<!-- balance:end -->"


def status_kb(key: str) -> int:
    for line in open("/proc/self/status"):
        if line.startswith(key):
            return int(line.split()[1])
    return 0


PEAK_KB = [0]  # the script's peak RSS over the resets of VmHWM


def reset_peak() -> None:
    PEAK_KB[0] = max(PEAK_KB[0], status_kb("VmHWM:"))
    open("/proc/self/clear_refs", "w").write("5")


def kept_counts(shape: str, n: int, shards: int, seed: int, epochs: list[int]) -> dict[int, np.ndarray]:
    """Kept samples per shard of each epoch's plan (``shape``: seta or random)."""
    rng = np.random.default_rng(seed)
    per = n // shards
    shard = np.repeat(np.arange(shards), per)
    uid = rng.integers(0, 2**63, n, dtype=np.uint64)
    if shape == "seta":
        loss = np.exp(rng.normal(np.repeat(rng.normal(0.0, 0.5, shards), per), 1.0)).astype(np.float32)
        cols = (loss, loss.astype(np.float64), np.ones(n, np.int32))
    else:
        cols = (np.full(n, np.nan, np.float32), np.full(n, np.nan), np.zeros(n, np.int32))
    out = {}
    for e in epochs:
        inp = PolicyInput(uid, *cols, None, epoch=e, epochs=10, seed=seed)
        keep = run_policy("seta", inp).keep if shape == "seta" else run_policy("random", inp, r=0.6).keep
        out[e] = np.bincount(shard, weights=keep, minlength=shards).astype(np.int64)
    return out


def natural(kept: np.ndarray, world: int, workers: int) -> np.ndarray:
    """Kept samples per slot (rank-major) under split_by_node + split_by_worker, shards in URL order."""
    idx = np.arange(len(kept))
    rank, within = idx % world, idx // world
    slot = rank * workers + within % workers
    return np.bincount(slot, weights=kept, minlength=world * workers).astype(np.int64)


def rank_steps(per_slot: np.ndarray, world: int, workers: int, batch: int) -> np.ndarray:
    return np.ceil(per_slot / batch).astype(np.int64).reshape(world, workers).sum(axis=1)


def ratio(a: np.ndarray) -> float:
    return float(a.max() / a.min()) if a.min() > 0 else math.inf


def median_time(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def measure(shape: str, kept_by_epoch: dict[int, np.ndarray], world: int, workers: int, a: argparse.Namespace) -> dict:
    first = min(kept_by_epoch)
    kept = kept_by_epoch[first]
    names = [f"shard-{i:06d}.tar" for i in range(len(kept))]
    slots = world * workers
    deferred, split, opens, outside = [], [], [], []
    for epoch, counts in kept_by_epoch.items():
        d = EpochDeal(dict(zip(names, counts.tolist())), a.seed, epoch, slots)
        p = d.deal
        got = np.bincount(p.slot, weights=p.hi - p.lo, minlength=slots + 1)[:slots]
        assert np.all(got == p.per_slot)  # the deal's promise, checked on every plan
        deferred.append(p.deferred)
        outside.append(p.deferred_outside_half)
        opens.append(int((p.slot < slots).sum()) / int((counts > 0).sum()))
        split.append(len(np.unique(p.shard[(p.lo > 0) | (p.hi < d.kept[p.shard])])))
    per = natural(kept, world, workers)
    steps = rank_steps(per, world, workers, a.batch_size)
    counts = dict(zip(names, kept.tolist()))
    slot = slots // 2 + 1
    urls = [{"url": f"/data/{n}"} for n in names]
    rank, worker = slot // workers, slot % workers
    t_nat = median_time(lambda: list(islice(islice(urls, rank, None, world), worker, None, workers)), a.repeat)
    reset_peak()
    before = status_kb("VmRSS:")
    t_deal = median_time(lambda: EpochDeal(counts, a.seed, first, slots).pieces(slot), a.repeat)
    peak_mb = (status_kb("VmHWM:") - before) / 1024
    q = int(kept.sum()) // slots
    return {
        "plan": shape,
        "ranks x workers": f"{world} x {workers}",
        "kept": int(kept.sum()),
        "natural max/min per slot": ratio(per),
        "natural empty slots": int((per == 0).sum()),
        "natural steps per rank": f"{int(steps.min())}-{int(steps.max())}",
        "balanced max/min": 1.0,
        "balanced steps per rank": workers * math.ceil(q / a.batch_size),
        "deferred (max)": max(deferred),
        "deferred outside half": sum(outside),
        "shards split (max)": max(split),
        "opens / shards (max)": round(max(opens), 3),
        "deal, one worker (ms)": round(t_deal * 1e3, 3),
        "natural (ms)": round(t_nat * 1e3, 4),
        "deal peak RSS (MB)": round(peak_mb, 1),
    }


def render(result: dict) -> str:
    rows = result["rows"]
    cols = list(rows[0])
    prm = result["params"]
    commit = (result.get("commit") or "?")[:10]
    lines = [
        "## Balanced epochs: every rank takes the same steps (`bench_balance.py`, issue 34)",
        "",
        f"`{result['command']}` at {commit} ({result['machine']['cpu']}, {result['machine']['cores']} cores; "
        f"load {result['load_start']['loadavg']}). {prm['n']:,} samples in {prm['shards']:,} shards; the "
        f"figures are epoch 1's plan, the deferred, split and opens columns the most over epochs 1-{prm['epochs']}; "
        f"steps at batch size {prm['batch_size']}. Natural = split_by_node + split_by_worker on the URL order; "
        "balanced = `attach(ds, run, balance=True)` (docs/ranks.md). The plans: the script's docstring.",
        "",
        "| " + " | ".join(cols) + " |",
        "|" + "---|" * len(cols),
    ]

    def cell(v: object) -> str:
        if v is None:
            return "inf"  # a ratio over a slot with no sample (JSON has no infinity)
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            return str(v)
        return f"{v:,}" if isinstance(v, int) else f"{v:.3g}"

    for r in rows:
        lines.append("| " + " | ".join(cell(r[c]) for c in cols) + " |")
    rss = result["figures"]["script_peak_rss_mb"]
    lines += [
        "",
        *[line for note in result["notes"] for line in (note, "")],
        f"Peak RSS of the whole script: {rss:,.0f} MB (the 15M-sample plans it draws the kept counts from; the "
        "deal itself adds the last column's figure).",
    ]
    return "\n".join(lines)


def write_doc(result_path: Path) -> None:
    result = json.loads(result_path.read_text())
    text = DOC.read_text()
    block = f"{BEGIN}\n{render(result)}\n{END}"
    if BEGIN in text:
        head, rest = text.split(BEGIN, 1)
        text = head + block + rest.split(END, 1)[1]
    else:
        text = text.rstrip("\n") + "\n\n" + block + "\n"
    DOC.write_text(text)
    print(f"updated {DOC}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=15_000_000)
    p.add_argument("--shards", type=int, default=1500)
    p.add_argument("--ranks", type=int, nargs="+", default=[8, 64, 512])
    p.add_argument("--workers", type=int, default=8)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--repeat", type=int, default=21)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--doc", action="store_true", help="only render the result file into docs/benchmarks.md")
    a = p.parse_args()
    name = "balance" if a.n == 15_000_000 else f"balance-{a.n}"
    if a.doc:
        write_doc(results_dir() / f"{name}.json")
        return
    res = Result(name, title="Balanced epochs: a pruned epoch dealt to ranks x workers")
    rows = []
    for shape in ("seta", "random"):
        kept = kept_counts(shape, a.n, a.shards, a.seed, list(range(1, a.epochs + 1)))
        for world in a.ranks:
            rows.append(measure(shape, kept, world, a.workers, a))
            print(rows[-1], flush=True)
    finite = [r["natural max/min per slot"] for r in rows if math.isfinite(r["natural max/min per slot"])]
    empty = max(r["natural empty slots"] for r in rows)
    notes = [
        f"Natural dealing: up to {max(finite):.2f}x the kept samples of one slot on another where every slot gets "
        f"a shard"
        + (f"; {empty:,} slots get no shard at all where there are more slots than shards" if empty else "")
        + ".",
        f"Balanced: every slot the same samples; at most {max(r['deferred (max)'] for r in rows):,} samples of an "
        f"epoch deferred (fewer than ranks x workers), {sum(r['deferred outside half'] for r in rows)} of them "
        f"outside the epoch's deferring half; one worker deals an epoch in at most "
        f"{max(r['deal, one worker (ms)'] for r in rows):.1f} ms.",
    ]
    res.write(
        baseline={"what": "split_by_node + split_by_worker on the same shards: the natural columns, same run"},
        rows=rows,
        peak_rss_mb=max(r["deal peak RSS (MB)"] for r in rows),
        figures={
            "max_deferred": max(r["deferred (max)"] for r in rows),
            "max_deal_ms": max(r["deal, one worker (ms)"] for r in rows),
            "worst_finite_natural_ratio": max(finite),
            "most_empty_natural_slots": empty,
            "script_peak_rss_mb": round(max(PEAK_KB[0], status_kb("VmHWM:")) / 1024, 1),
        },
        notes=notes,
        params={k: getattr(a, k) for k in ("n", "shards", "ranks", "workers", "epochs", "batch_size", "repeat")},
    )


if __name__ == "__main__":
    main()
