"""The section of docs/quality.md that lists every run whose held-out accuracy fell to chance
during training (``collapses``: the rule, the plan before each collapse), in every study whose run
files record a per-epoch curve, and the experiments on their cause (``collapses.json``)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from .collapses import (
    MARGIN,
    Trace,
    chance_note,
    collapse_rows,
    converged_trace,
    dip_line,
    events,
    experiment_lines,
    load_experiments,
    policy_counts,
)
from .configs import conv_run_id
from .data import DATASETS
from .docs import load_results
from .layout import Layout
from .report import splice

MARKER = "collapses"
# the folders of docs/quality-runs whose run files record a test accuracy after every epoch
CURVE_FOLDERS = ("converged", "converged-same-order", "converged-reruns")


def _checked(folder: Path) -> dict[str, list[str]]:
    """The run directories checks.py verified (run id -> its problems), from the folder's checks.json."""
    p = folder / "checks.json"
    return json.loads(p.read_text()).get("run_dirs", {}) if p.exists() else {}


def converged_traces(layout: Layout) -> list[Trace]:
    out = []
    for folder in CURVE_FOLDERS:
        d = layout.results / folder
        checked = _checked(d)
        for r in load_results(d) if d.exists() else []:
            t = converged_trace(r, conv_run_id(r, r["seed"]), folder, checked if checked else None)
            if t is not None:
                out.append(t)
    return out


def pairs_lr() -> Callable[[int, float], Callable[[float], float]]:
    """examples/train_pairs.py's schedule (warm-up then cosine), as (epochs, peak) -> lr(t)."""
    import importlib.util

    path = layout_root() / "examples" / "train_pairs.py"
    spec = importlib.util.spec_from_file_location("_train_pairs_schedule", path)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return lambda n, peak: lambda t: mod.lr_at(t, n, peak)


def layout_root() -> Path:
    from .layout import ROOT

    return ROOT


def pairs_trace(r: dict, lr: Callable[[int, float], Callable[[float], float]]) -> Trace:
    """The trace of a pairs-study result: mean recall@1 (i2t, t2i) after every epoch."""
    from .pairs import run_id

    rows = r["rows"]
    noise = round(100 * r["noise"])
    rid = run_id(r["noise"], r, r["seed"])
    extra = [f"{100 * row['mismatched_share']:.1f}% mismatched" for row in rows] if r["noise"] else []
    return Trace(rid, f"pairs, {noise}% mismatched", r["policy"], r["params"], r["seed"],
                 [0.5 * (row["i2t_r1"] + row["t2i_r1"]) for row in rows], 1.0 / r["data"]["test"],
                 [row["kept"] / row["n"] for row in rows], [row["phase"] for row in rows],
                 [row["loss"] for row in rows], lr(r["train"]["epochs"], r["train"]["lr"]),
                 0.5 * (r["i2t_r1"] + r["t2i_r1"]), None, extra)  # fmt: skip


def all_pairs_traces(results: Path) -> list[Trace]:
    files = sorted(results.glob("pairs-noise*-seed*.json"))
    if not files:
        return []
    lr = pairs_lr()
    return [pairs_trace(json.loads(p.read_text()), lr) for p in files]


def collapse_section(traces: list[Trace], pairs: list[Trace], short_runs: int, experiments: list[dict],
                     source: str) -> list[str]:  # fmt: skip
    """The generated section (lines) from the traces of the image runs and of the pairs runs."""
    col, dips = events(traces)
    pcol, pdips = events(pairs)
    runs = {(ev.trace.study, ev.trace.run) for ev in col}
    pruns = {(ev.trace.study, ev.trace.run) for ev in pcol}
    L = [
        f"**The rule** (`benchmarks/quality/collapses.py`): a run *collapsed at epoch e* when its held-out "
        f"metric after epoch e was at most chance + {100 * MARGIN:g} points while an earlier epoch of the same "
        f"run had reached chance + 10 points ({chance_note('CIFAR-10 test accuracy:', 0.1)}; pairs: mean "
        "R@1 over the held-out pairs, chance 1 / their number). Each row gives the plan that trained just "
        "before that evaluation. The window and the largest weight are not in the run files: they are the "
        "policy's rule for the run's parameters and epoch (docs/algorithms.md §3.2, §4.2), which "
        "`checks.py` verified on the run's directory where the last column says so; the learning rate "
        "is the training loop's schedule at the start and end of that epoch (CIFAR-10: "
        "`benchmarks/quality/train.py`, peak 0.1 at every revision of these files; pairs: "
        "`examples/train_pairs.py`, the peak its run file records), not a recorded value.",
        "",
        f"**CIFAR-10 runs with a test accuracy after every epoch** ({len(traces)} run files in "
        f"`docs/quality-runs/{{{','.join(CURVE_FOLDERS)}}}/`): {len(runs)} runs collapsed, {len(col)} times in "
        f"all. Collapsed runs per policy: {policy_counts(traces, col)}.",
        "",
    ]
    if col:
        L += collapse_rows(col, experiments) + [""]
    L += [dip_line(dips), ""]
    if pairs:
        L += [
            f"**Image-text pairs** ({len(pairs)} run files `docs/quality-runs/pairs-*.json`, metric: mean R@1, "
            f"chance {100 * pairs[0].chance:g}%): {len(pruns)} runs collapsed, {len(pcol)} times in all. "
            f"Collapsed runs per policy: {policy_counts(pairs, pcol)}.",
            "",
        ]
        if pcol:
            L += collapse_rows(pcol, experiments, "mean R@1 %") + [""]
        L += [dip_line(pdips), ""]
    L += [
        f"**The short study** ({short_runs} run files `docs/quality-runs/{{cifar10,sst2}}-*.json`): its run "
        "files record the test accuracy at the end only, so a collapse inside one of its runs cannot be "
        "seen; its tables are not marked.",
        "",
    ]
    L += experiment_lines(experiments, {(ev.trace.run, ev.epoch) for ev in col + pcol}, source)
    return L


def report_collapses(layout: Layout) -> list[str]:
    """Rewrite the collapse section of docs/quality.md; returns its lines."""
    path = layout.results / "collapses.json"
    experiments = load_experiments(path)
    short = load_results(layout.results, tuple(f"{d}-" for d in DATASETS))
    lines = collapse_section(converged_traces(layout), all_pairs_traces(layout.results), len(short), experiments,
                             "docs/quality-runs/collapses.json")  # fmt: skip
    splice(layout.doc, f"<!-- {MARKER}:begin -->", f"<!-- {MARKER}:end -->", lines)
    return lines
