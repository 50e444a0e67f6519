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

The report (``python -m studies quality --report-only``) writes the findings to
``docs/quality-runs/checks.json`` (the converged study: ``docs/quality-runs/converged/checks.json``)
and docs/quality.md lists them.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np


def _floor(x: float) -> int:
    return int(math.floor(x + 1e-9))


def check_run_dir(run: Path) -> list[str]:
    """Problems found in one kept run directory ([] if it follows algorithms.md)."""
    import pyarrow.parquet as pq

    import seta_stream as seta

    state = json.loads((run / "state.json").read_text())
    policy, params, E = state["policy"], state["params"], state["epochs"]
    r, k, alpha = float(params.get("r", 0.0)), int(params.get("k", 10)), float(params.get("alpha", 0.5))
    P = _floor(float(params.get("delta", 0.875)) * E)  # the first annealing epoch
    budget = params.get("target_keep")
    problems: list[str] = []
    kept_sets = []
    for e in range(E):
        s = seta.load_summary(run, e)
        t = seta.load_plan(run, e, columns=["shard", "key", "loss", "keep", "weight", "cluster"])
        n, kept = s["n"], s["kept"]
        keep = t.column("keep").to_numpy(zero_copy_only=False)
        weight = t.column("weight").to_numpy(zero_copy_only=False)
        kept_sets.append(set(t.filter(t.column("keep")).column("key").to_pylist()))
        where = f"{run.name} e{e}"
        if int(keep.sum()) != kept or t.num_rows != n:
            problems.append(f"{where}: summary kept/n {kept}/{n} but plan rows {int(keep.sum())}/{t.num_rows}")
        if policy in ("random", "static") and kept != _floor((1 - r) * n):
            problems.append(f"{where}: kept {kept}, expected floor((1-r)N) = {_floor((1 - r) * n)}")
        if policy == "infobatch" and e >= P and (kept != n or not np.all(weight == 1.0)):
            problems.append(f"{where} (anneal): kept {kept}/{n}, weights {sorted(set(weight.tolist()))}")
        elif policy == "infobatch" and e < P and s.get("n_below_mean"):
            L, m = s["n_below_mean"], s["m"]
            if m != _floor((1 - r) * L) or kept != n - L + m:
                problems.append(f"{where}: |L|={L}, m={m}, kept={kept}; expected m=floor((1-r)|L|)")
            w_drawn = weight[keep & (weight != 1.0)]
            if len(w_drawn) != m or not np.allclose(w_drawn, np.float32(1 / (1 - r))):
                problems.append(f"{where}: {len(w_drawn)} rescaled weights, expected {m} at 1/(1-r)")
        if policy != "seta":
            continue
        if e >= P:
            if kept != _floor((1 - r) * n):
                problems.append(f"{where} (anneal): kept {kept}, expected {_floor((1 - r) * n)}")
        elif budget is not None and kept != _floor(float(budget) * n):
            problems.append(f"{where}: kept {kept}, expected floor(target_keep N) = {_floor(budget * n)}")
        elif e == 0:
            if s.get("s") != "all":
                problems.append(f"{where}: window {s.get('s')}, expected every cluster")
        elif s.get("k_eff") is not None:
            kk = s["k_eff"]
            w = min(kk, max(1, round(alpha * kk)))
            if kk != min(k, kk) or s["w"] != w or s["s"] != e % (kk - w + 1):
                problems.append(f"{where}: k'={kk}, w={s['w']}, s={s['s']}; expected w={w}, s={e % (kk - w + 1)}")
            if list(s["centroids"]) != sorted(s["centroids"]):
                problems.append(f"{where}: centroids not ascending")
            if budget is None:  # with a budget the band is centred on the window, not the window
                cluster = t.column("cluster").to_numpy(zero_copy_only=False)
                in_window = (cluster >= s["s"]) & (cluster < s["s"] + s["w"])
                seen_kept = keep & (cluster >= 0)
                if not np.array_equal(seen_kept, keep & in_window & (cluster >= 0)):
                    problems.append(f"{where}: kept clustered samples outside the window")
    for e in range(1, E) if policy == "static" else ():
        if kept_sets[e] != kept_sets[0]:
            problems.append(f"{run.name} e{e}: static kept set differs from epoch 0")
    # the plan of e carries the loss recorded in e-1 for every sample trained in e-1
    for e in range(1, E):
        parts = sorted((run / "losses").glob(f"rank=*/epoch={e - 1}/part-*.parquet"))
        recorded = _loss_by_sample(pq.read_table(parts, partitioning=None))
        planned = _loss_by_sample(seta.load_plan(run, e, columns=["shard", "key", "loss"]))
        wrong = sum(1 for k, v in recorded.items() if not np.float32(planned.get(k, np.nan)) == np.float32(v))
        if wrong:
            problems.append(
                f"{run.name} e{e}: {wrong} of {len(recorded)} samples recorded in e{e - 1} carry another loss"
            )
    return problems


def _loss_by_sample(t: Any) -> dict[tuple[str, str], float]:
    """(shard, key) -> loss of a table of recorded losses or of a plan."""
    return dict(zip(zip(t.column("shard").to_pylist(), t.column("key").to_pylist()), t.column("loss").to_pylist()))


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
