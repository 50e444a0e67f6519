"""Checks of the study's runs against algorithms.md (read like a reviewer).

Run on the run directories the study keeps (seed 0) and on every run's result file:

1. the loader delivered exactly the samples each plan kept (every run, every epoch);
2. the loss in each plan is the loss recorded for that very sample in the previous epoch
   (losses land on the right keys through workers, parts and compaction);
3. each policy's plans follow its rule: random keeps floor((1-r)N), static keeps the same set
   every epoch, InfoBatch keeps N - |L| + floor((1-r)|L|) with weight 1/(1-r) on the drawn
   below-mean samples and weight 1 everywhere in annealing, SeTa's window width and start are
   w = min(k', max(1, round(alpha k'))) and s = e mod (k' - w + 1) with every cluster at e = 0,
   clusters ordered by centroid, and annealing keeps floor((1-r)N); with ``target_keep`` t every
   pruning epoch keeps exactly floor(t N).

``python -m benchmarks.quality.checks [RUNS_DIR] [RESULTS_DIR]`` prints the findings for the
short study; the report writes them to ``docs/quality-runs/checks.json`` (the converged study:
``docs/quality-runs/converged/checks.json``) and docs/quality.md lists them.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np


def _floor(x: float) -> int:
    return int(math.floor(x + 1e-9))


def check_run_dir(run: Path) -> list[str]:
    """Problems found in one kept run directory ([] if it follows algorithms.md)."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    state = json.loads((run / "state.json").read_text())
    policy, params, E = state["policy"], state["params"], state["epochs"]
    problems: list[str] = []
    plans = {}
    for e in range(E):
        d = run / "plans" / f"epoch={e}"
        s = json.loads((d / "summary.json").read_text())
        t = pq.read_table(d / "plan.parquet", columns=["shard", "key", "loss", "keep", "weight", "cluster"])
        plans[e] = (s, t)
        n, kept = s["n"], s["kept"]
        keep = t.column("keep").to_numpy(zero_copy_only=False)
        weight = t.column("weight").to_numpy(zero_copy_only=False)
        if int(keep.sum()) != kept or t.num_rows != n:
            problems.append(f"{run.name} e{e}: summary kept/n {kept}/{n} but plan rows {int(keep.sum())}/{t.num_rows}")
        r = float(params.get("r", 0.0))
        P = _floor(float(params.get("delta", 0.875)) * E)
        if policy in ("random", "static") and kept != _floor((1 - r) * n):
            problems.append(f"{run.name} e{e}: kept {kept}, expected floor((1-r)N) = {_floor((1 - r) * n)}")
        if policy == "infobatch":
            if e >= P:
                if kept != n or not np.all(weight == 1.0):
                    problems.append(
                        f"{run.name} e{e} (anneal): kept {kept}/{n}, weights {sorted(set(weight.tolist()))}"
                    )
            elif s.get("n_below_mean"):
                L, m = s["n_below_mean"], s["m"]
                if m != _floor((1 - r) * L) or kept != n - L + m:
                    problems.append(f"{run.name} e{e}: |L|={L}, m={m}, kept={kept}; expected m=floor((1-r)|L|)")
                w_drawn = weight[keep & (weight != 1.0)]
                if len(w_drawn) != m or not np.allclose(w_drawn, np.float32(1 / (1 - r))):
                    problems.append(f"{run.name} e{e}: {len(w_drawn)} rescaled weights, expected {m} at 1/(1-r)")
        if policy == "seta":
            k, alpha = int(params.get("k", 10)), float(params.get("alpha", 0.5))
            budget = params.get("target_keep")
            if e >= P:
                if kept != _floor((1 - r) * n):
                    problems.append(f"{run.name} e{e} (anneal): kept {kept}, expected {_floor((1 - r) * n)}")
            elif budget is not None and kept != _floor(float(budget) * n):
                problems.append(f"{run.name} e{e}: kept {kept}, expected floor(target_keep N) = {_floor(budget * n)}")
            elif e == 0:
                if s.get("s") != "all":
                    problems.append(f"{run.name} e0: window {s.get('s')}, expected every cluster")
            elif s.get("k_eff") is not None:
                kk = s["k_eff"]
                w = min(kk, max(1, round(alpha * kk)))
                if kk != min(k, kk) or s["w"] != w or s["s"] != e % (kk - w + 1):
                    problems.append(
                        f"{run.name} e{e}: k'={kk}, w={s['w']}, s={s['s']}; expected w={w}, s={e % (kk - w + 1)}"
                    )
                if list(s["centroids"]) != sorted(s["centroids"]):
                    problems.append(f"{run.name} e{e}: centroids not ascending")
                if budget is None:  # with a budget the band is centred on the window, not the window
                    cluster = t.column("cluster").to_numpy(zero_copy_only=False)
                    in_window = (cluster >= s["s"]) & (cluster < s["s"] + s["w"])
                    seen_kept = keep & (cluster >= 0)
                    if not np.array_equal(seen_kept, keep & in_window & (cluster >= 0)):
                        problems.append(f"{run.name} e{e}: kept clustered samples outside the window")
    if policy == "static":
        first = _kept_keys(plans[0][1])
        for e in range(1, E):
            if _kept_keys(plans[e][1]) != first:
                problems.append(f"{run.name} e{e}: static kept set differs from epoch 0")
    # the plan of e carries the loss recorded in e-1 for every sample trained in e-1
    for e in range(1, E):
        parts = sorted((run / "losses").glob(f"rank=*/epoch={e - 1}/part-*.parquet"))
        rec = pq.read_table(parts[0]) if len(parts) == 1 else _concat(parts)
        recorded = dict(
            zip(zip(rec.column("shard").to_pylist(), rec.column("key").to_pylist()), rec.column("loss").to_pylist())
        )
        plan = plans[e][1]
        shard = plan.column("shard")
        shard = pc.cast(shard, "string") if not hasattr(shard.type, "value_type") else shard.cast(shard.type.value_type)
        planned = dict(zip(zip(shard.to_pylist(), plan.column("key").to_pylist()), plan.column("loss").to_pylist()))
        wrong = sum(1 for k, v in recorded.items() if not np.float32(planned.get(k, np.nan)) == np.float32(v))
        if wrong:
            problems.append(
                f"{run.name} e{e}: {wrong} of {len(recorded)} samples recorded in e{e - 1} carry another loss"
            )
    return problems


def _concat(parts: list[Path]) -> Any:
    import pyarrow as pa
    import pyarrow.parquet as pq

    return pa.concat_tables([pq.read_table(p) for p in parts])


def _kept_keys(t: Any) -> set:
    keep = t.column("keep").to_numpy(zero_copy_only=False)
    return set(np.asarray(t.column("key").to_pylist(), dtype=object)[keep].tolist())


def check_results(results: list[dict]) -> list[str]:
    """Every run: the loader delivered exactly the plan's kept count in every epoch."""
    problems = []
    for r in results:
        for e in r["epochs"]:
            if e["streamed"] != e["kept"]:
                problems.append(
                    f"{r['dataset']} {r['policy']} seed {r['seed']} e{e['epoch']}: plan kept {e['kept']}, "
                    f"loader delivered {e['streamed']}"
                )
    return problems


def finished_run_dirs(runs: Path, results: list[dict], rid: Callable[[dict], str]) -> list[Path]:
    """Run directories of finished runs only (a study running meanwhile writes the others)."""
    done = {rid(r) for r in results}
    return sorted(p for p in runs.glob("*") if p.name in done and (p / "state.json").exists())


def run_checks(dirs: list[Path], results: list[dict]) -> dict:
    problems = check_results(results)
    checked = []
    for d in dirs:
        problems += check_run_dir(d)
        checked.append(d.name)
    return {"runs_checked": len(results), "run_dirs_checked": checked, "problems": problems}


if __name__ == "__main__":
    from .configs import run_id
    from .docs import load_results
    from .layout import Layout

    layout = Layout()
    runs = Path(sys.argv[1]) if len(sys.argv) > 1 else layout.runs
    res = load_results(Path(sys.argv[2]) if len(sys.argv) > 2 else layout.results)
    dirs = finished_run_dirs(runs, res, lambda r: run_id(r["dataset"], r, r["seed"]))
    print(json.dumps(run_checks(dirs, res), indent=1))
