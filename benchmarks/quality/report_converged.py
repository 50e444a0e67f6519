"""The converged study's section of docs/quality.md, generated from its run files (partial results too).

Every pruned run beside full data at E (the papers' comparison) and beside full data trained for
round(E (1 - p)) epochs (the same samples trained: the equal-compute baseline), the paper's
figures beside ours, which runs are still missing, which runs shared the machine, the checks,
and three figures.
"""

from __future__ import annotations

import json

import numpy as np

from .checks import check_results, check_run_dir, finished_run_dirs
from .configs import CONVERGED_SEEDS, conv_calibration_name, conv_pruned, conv_run_id, converged_plan
from .layout import Layout
from .plots import plot_curves, plot_vs_pruned
from .report import splice
from .results import ORDER, fmt_params, load_results, mean_sd

BEGIN, END = "<!-- converged:begin -->", "<!-- converged:end -->"
SHARED = 0.10  # a run "shared the machine" when other processes kept > 10% of its cores busy on average

# SeTa paper (CIFAR-10, ResNet-18, 200 epochs), test accuracy % at 30 / 50 / 70% pruned
PAPER_FULL = 95.6
PAPER = {
    "seta": {30: 95.7, 50: 95.3, 70: 95.0},
    "infobatch": {30: 95.6, 50: 95.1, 70: 94.7},
    "random": {30: 94.8, 50: 94.5, 70: 93.0},
}


def _acc(rs: list[dict]) -> float:
    return 100 * float(np.mean([r["test_acc"] for r in rs]))


def other_share(r: dict) -> float:
    """Mean share of the machine other processes used during the run's epochs."""
    return float(np.mean([e.get("other_cpu", 0.0) for e in r["epochs"]]))


def _train_min(r: dict) -> float:
    return r["epochs"][-1].get("train_seconds", r["seconds"]) / 60


def _full_pruned(n: int, E: int) -> str:
    """The pruned-% cell of a full-data run of n epochs: the samples it saves against full data at E."""
    if n == E:
        return "0.0"
    return f"{100 * (1 - n / E):.1f} (fewer epochs)" if n < E else f"none ({n / E:g}x the samples)"


def _groups(results: list[dict]) -> dict[str, list[dict]]:
    """Configuration (run id without the seed) -> its runs, seed order."""
    out: dict[str, list[dict]] = {}
    for r in sorted(results, key=lambda r: r["seed"]):
        out.setdefault(conv_run_id(r, r["seed"]).rsplit("-s", 1)[0], []).append(r)
    return out


def _checks(layout: Layout, results: list[dict]) -> dict:
    """Check the result files and the kept run directories (seed 0), keeping earlier findings for
    directories no longer on this machine; written to converged/checks.json."""
    path = layout.converged / "checks.json"
    old = json.loads(path.read_text()) if path.exists() else {}
    per_dir: dict[str, list[str]] = dict(old.get("run_dirs", {}))
    for d in finished_run_dirs(layout.runs, results, lambda r: conv_run_id(r, r["seed"])):
        per_dir[d.name] = check_run_dir(d)
    c = {"runs_checked": len(results), "results_problems": check_results(results), "run_dirs": per_dir}
    path.write_text(json.dumps(c, indent=1))
    return c


def report_converged(layout: Layout) -> None:
    """Rewrite the converged study's generated section of docs/quality.md and its figures."""
    results = load_results(layout.converged)
    lines: list[str] = []
    if not results:
        lines += ["No run of the converged study has finished yet.", ""]
    for E in sorted({r["E"] for r in results}):
        lines += _section(layout, E, [r for r in results if r["E"] == E])
    splice(layout.doc, BEGIN, END, lines)


def _section(layout: Layout, E: int, results: list[dict]) -> list[str]:
    res = layout.converged
    groups = _groups(results)
    cal_path = res / conv_calibration_name(E)
    cal = json.loads(cal_path.read_text()) if cal_path.exists() else None
    pruned_cfgs = conv_pruned(E, cal) if cal else []
    seed0 = {conv_run_id(r, r["seed"]): r for r in results}
    measured = [seed0[i]["pruned"] for c in pruned_cfgs if (i := conv_run_id(c, 0)) in seed0]
    plan = converged_plan(E, CONVERGED_SEEDS, cal, measured)
    missing = [conv_run_id(c, s) for c, s in plan if conv_run_id(c, s) not in seed0]
    full = groups.get(f"cifar10-E{E}-full-e{E}-default")
    full2 = groups.get(f"cifar10-E{E}-full-e{2 * E}-default")
    L = [f"### CIFAR-10, E = {E} epochs", ""]

    # ---- status
    L += [f"**Status:** {len(results)} of the {len(plan)} runs planned so far have finished."]
    if missing:
        L += [f" Still missing, in run order: {', '.join(f'`{m}`' for m in missing)}."]
    if cal is None:
        L += [" The pruned runs are planned once full data at E (seed 0) has finished and calibrated them."]
    if len(measured) < len(pruned_cfgs):
        L += [" The equal-compute runs of the pruned runs that have not finished yet are not planned yet."]
    L += [""]

    # ---- convergence check
    if full and full2:
        a, b = 100 * full[0]["test_acc"], 100 * full2[0]["test_acc"]
        ok = b - a <= 0.5
        L += [f"**Convergence check (seed 0):** full data reaches {a:.2f}% at E = {E} epochs and {b:.2f}% at "
              f"2E = {2 * E} ({b - a:+.2f} points). "
              + ("Within 0.5 point: full data has converged at E." if ok else
                 "**More than 0.5 point: full data has NOT converged at E**; the next step is a larger E "
                 "(`--epochs`)."), ""]  # fmt: skip
    elif full:
        L += [f"**Convergence check:** full data at E = {E}: {100 * full[0]['test_acc']:.2f}% (seed 0); "
              f"the run at 2E = {2 * E} has not finished yet.", ""]  # fmt: skip

    # ---- main table
    full_acc = _acc(full) if full else None

    def eq_of(rs: list[dict]) -> tuple[int, list[dict] | None]:
        p = rs[0]["pruned"] if rs[0]["seed"] == 0 else float(np.mean([r["pruned"] for r in rs]))
        n = round(E * (1 - p))
        return n, groups.get(f"cifar10-E{E}-full-e{n}-default") if n != E else full

    def vs_random(rs: list[dict]) -> str:
        pts = [(0.0, full_acc)] if full_acc is not None else []
        pts += [(float(np.mean([r["pruned"] for r in g])), _acc(g)) for k, g in groups.items()
                if g[0]["policy"] == "random"]  # fmt: skip
        pts.sort()
        x = float(np.mean([r["pruned"] for r in rs]))
        if rs[0]["policy"] in ("full", "random") or len(pts) < 2 or not pts[0][0] <= x <= pts[-1][0]:
            return "-"
        return f"{_acc(rs) - float(np.interp(x, [p[0] for p in pts], [p[1] for p in pts])):+.2f}"

    L += [
        "| run | setting | seeds | pruned % (measured) | test acc % | vs full at E | equal-compute full data: "
        "epochs | its test acc % | vs equal compute | vs dynamic random at that pruned % | training min "
        "(fastest seed) | other work's CPU share |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    keyed = sorted(groups.items(), key=lambda kv: (kv[1][0]["policy"] != "full", ORDER[kv[1][0]["policy"]],
                                                   -kv[1][0]["n_epochs"], kv[1][0]["label"]))  # fmt: skip
    for name, rs in keyed:
        r0 = rs[0]
        is_full = r0["policy"] == "full"
        cells = [
            f"full, {r0['n_epochs']} epochs" if is_full else f"{r0['policy']} {r0['label']}",
            "-" if is_full else fmt_params(r0["params"]),
            str(len(rs)),
            _full_pruned(r0["n_epochs"], E) if is_full else mean_sd([r["pruned"] for r in rs], digits=1),
            mean_sd([r["test_acc"] for r in rs]),
            f"{_acc(rs) - full_acc:+.2f}"
            if full_acc is not None and name != f"cifar10-E{E}-full-e{E}-default"
            else "-",
        ]
        if is_full:
            cells += ["-", "-", "-"]
        else:
            n, eq = eq_of(rs)
            cells += [str(n), mean_sd([r["test_acc"] for r in eq]) if eq else "(not run yet)",
                      f"{_acc(rs) - _acc(eq):+.2f}" if eq else "-"]  # fmt: skip
        cells += [
            vs_random(rs),
            f"{min(_train_min(r) for r in rs):.1f}",
            " / ".join(f"{100 * other_share(r):.0f}%" for r in rs),
        ]
        L.append("| " + " | ".join(cells) + " |")
    L += [
        "",
        "*vs equal compute*: test accuracy minus full data trained for round(E x (1 - p)) epochs, p = the "
        "pruned fraction seed 0 measured, with the same one-cycle schedule compressed to that length: the "
        "same number of samples trained. *other work's CPU share*: per seed, the mean share of the 2 cores "
        f"that other processes used during the run's epochs; above {100 * SHARED:.0f}% the run shared the "
        "machine and its wall time is inflated.",
        "",
    ]

    # ---- the paper beside ours
    def ours(policy: str, level: int) -> str:
        cfg = next((c for c in pruned_cfgs if c["policy"] == policy and c["label"] == f"p{level}"), None)
        rs = groups.get(conv_run_id(cfg, 0).rsplit("-s", 1)[0]) if cfg else None
        if not rs or full_acc is None:
            return "-"
        p = 100 * float(np.mean([r["pruned"] for r in rs]))
        return f"{_acc(rs):.2f} ({_acc(rs) - full_acc:+.2f}) at {p:.1f}%"

    def eq_cell(level: int) -> str:
        n = round(E * (1 - level / 100))
        g = groups.get(f"cifar10-E{E}-full-e{n}-default")
        return f"{_acc(g):.2f} ({_acc(g) - full_acc:+.2f}), {n} epochs" if g and full_acc is not None else "-"

    L += [
        "The paper's figures (SeTa paper, CIFAR-10, ResNet-18, 200 epochs; full data "
        f"{PAPER_FULL}%) beside ours (gap to full data in brackets; ours: mean over the finished seeds):",
        "",
        "| pruned | paper: SeTa | paper: InfoBatch | paper: dynamic random | ours: SeTa | ours: InfoBatch "
        "| ours: dynamic random | ours: full data, equal compute |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for lv in (30, 50, 70):
        paper = [f"{PAPER[p][lv]} ({PAPER[p][lv] - PAPER_FULL:+.1f})" for p in ("seta", "infobatch", "random")]
        L.append(f"| {lv}% | " + " | ".join(paper + [ours("seta", lv), ours("infobatch", lv) if lv == 30 else "-",
                                                     ours("random", lv), eq_cell(lv)]) + " |")  # fmt: skip
    L += [f"\nOurs: full data at E = {f'{full_acc:.2f}%' if full_acc is not None else '(not finished)'}.", ""]

    # ---- figures
    figs = layout.plots
    s0 = [r for r in results if r["seed"] == 0 and "test_acc" in r["epochs"][-1]]
    if s0:
        plot_curves(figs / f"cifar10-E{E}-curves.png", s0, f"CIFAR-10, E = {E}: test accuracy per epoch (seed 0)")
        L += [f"![test accuracy against samples trained and wall time](quality/cifar10-E{E}-curves.png)", ""]
    points: dict[str, list] = {}
    for rs in groups.values():
        if rs[0]["policy"] == "full":
            continue
        label = rs[0]["policy"] + (" target_keep" if "target_keep" in rs[0]["params"] else "")
        y = np.array([100 * r["test_acc"] for r in rs])
        points.setdefault(label, []).append((100 * float(np.mean([r["pruned"] for r in rs])), float(y.mean()),
                                             float(y.std(ddof=1)) if len(y) > 1 else 0.0))  # fmt: skip
    equal = []
    for rs in groups.values():
        if rs[0]["policy"] == "full" and rs[0]["n_epochs"] < E:
            y = np.array([100 * r["test_acc"] for r in rs])
            equal.append(
                (100 * (1 - rs[0]["n_epochs"] / E), float(y.mean()), float(y.std(ddof=1)) if len(y) > 1 else 0.0)
            )
    if points or equal:
        fy = np.array([100 * r["test_acc"] for r in full]) if full else None
        plot_vs_pruned(
            figs / f"cifar10-E{E}-pruned.png", points, equal,
            (float(fy.mean()), float(fy.std(ddof=1)) if len(fy) > 1 else 0.0) if fy is not None else None,
            {p: [(lv, v - PAPER_FULL) for lv, v in PAPER[p].items()] for p in PAPER},
            f"CIFAR-10, E = {E}: accuracy against pruned %",
        )  # fmt: skip
        L += [f"![accuracy against measured pruned %](quality/cifar10-E{E}-pruned.png)", ""]

    # ---- kept fractions of the loss-guided runs (seed 0)
    guided = [r for r in s0 if r["policy"] in ("seta", "infobatch")]
    if guided:
        L += ["Kept fraction per epoch (plan of seed 0):", ""]
        for r in sorted(guided, key=lambda r: (ORDER[r["policy"]], r["label"])):
            L.append(f"* {r['policy']} {r['label']} ({fmt_params(r['params'])}): "
                     + " ".join(f"{e['kept'] / e['n']:.2f}" for e in r["epochs"]))  # fmt: skip
        L += [""]

    # ---- calibration
    if cal:
        L += ["Settings chosen on the training losses of full data at E (seed 0; `calibrate`, the same grid "
              "as the short study):", "", "| policy | level | setting | simulated pruned % |",
              "| --- | --- | --- | --- |"]  # fmt: skip
        for policy, levels in cal["levels"].items():
            for lv, v in levels.items():
                L.append(f"| {policy} | {lv}% | {fmt_params(v['params'])} | {100 * v['simulated']:.1f} |")
        L += [""]

    # ---- checks
    c = _checks(layout, results)
    dir_problems = [p for ps in c["run_dirs"].values() for p in ps]
    problems = c["results_problems"] + dir_problems
    consistency = []
    for r in results:  # the curve's last point is the run's final test accuracy
        last = r["epochs"][-1].get("test_acc")
        if last is not None and abs(last - r["test_acc"]) > 1e-12:
            consistency.append(
                f"{conv_run_id(r, r['seed'])}: last epoch's test accuracy {last} != final {r['test_acc']}"
            )
    samples = []
    for rs in groups.values():
        if rs[0]["policy"] != "full" and rs[0]["seed"] == 0:
            n, eq = eq_of(rs)
            if eq and eq[0]["seed"] == 0 and n != E:
                samples.append(
                    sum(e["streamed"] for e in eq[0]["epochs"]) / sum(e["streamed"] for e in rs[0]["epochs"])
                )
    L += [
        "Checks (`benchmarks/quality/checks.py`, written to `docs/quality-runs/converged/checks.json`): "
        f"{c['runs_checked']} result files (loader delivered exactly the planned samples in every epoch) and "
        f"{len(c['run_dirs'])} run directories of seed 0 (plan rules, window sequence, target_keep budget, "
        "weights, losses landing on their own keys): "
        + (f"**{len(problems)} problems**:" if problems else "no problem found.")
        + " Every run's last per-epoch test accuracy equals its final one: "
        + ("yes." if not consistency else f"**no** ({len(consistency)} runs)."),
        "",
        *[f"* {x}" for x in (problems + consistency)[:50]],
    ]
    if samples:
        L += [f"Samples trained by each equal-compute full-data run over those of its pruned run (seed 0): "
              f"{min(samples):.3f} to {max(samples):.3f} (1 = the same compute; epochs are whole).", ""]  # fmt: skip
    shared = [
        f"`{conv_run_id(r, r['seed'])}` ({100 * other_share(r):.0f}%)" for r in results if other_share(r) > SHARED
    ]
    L += [f"Runs that shared the machine with other work (other processes used more than {100 * SHARED:.0f}% of "
          "the 2 cores on average): " + (", ".join(shared) if shared else "none") + ".", ""]  # fmt: skip
    return L
