"""The section of docs/quality.md that lists every run whose held-out accuracy fell to chance
during training (``collapses``: the rule, the plan before each collapse), in every study whose run
files record a per-epoch curve, and the experiments on their cause (``collapses.json``)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from .collapses import (
    MARGIN,
    Event,
    Trace,
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
from .docs import load_results, splice
from .layout import Layout
from .pairs import import_example, run_id

MARKER = "collapses"
# the folders of docs/quality-runs whose run files record a test accuracy after every epoch
CURVE_FOLDERS = ("converged", "converged-same-order", "converged-reruns")


def converged_traces(layout: Layout) -> list[Trace]:
    """The CIFAR-10 runs with a curve, each with its run directory's check from the folder's checks.json
    (run id -> its problems) where checks.py verified it."""
    out = []
    for folder in CURVE_FOLDERS:
        d = layout.results / folder
        checks = d / "checks.json"
        checked = json.loads(checks.read_text()).get("run_dirs", {}) if checks.exists() else None
        traces = (converged_trace(r, conv_run_id(r, r["seed"]), folder, checked) for r in load_results(d))
        out += [t for t in traces if t is not None]
    return out


def pairs_trace(r: dict, lr_at: Callable[[float, int, float], float]) -> Trace:
    """The trace of a pairs-study result: mean recall@1 (i2t, t2i) after every epoch; ``lr_at``:
    examples/train_pairs.py's schedule (warm-up then cosine)."""
    rows, epochs, peak = r["rows"], r["train"]["epochs"], r["train"]["lr"]
    extra = [f"{100 * row['mismatched_share']:.1f}% mismatched" for row in rows] if r["noise"] else []
    return Trace(run_id(r["noise"], r, r["seed"]), f"pairs, {round(100 * r['noise'])}% mismatched", r["policy"],
                 r["params"], r["seed"], [0.5 * (row["i2t_r1"] + row["t2i_r1"]) for row in rows],
                 1.0 / r["data"]["test"], [row["kept"] / row["n"] for row in rows], [row["phase"] for row in rows],
                 [row["loss"] for row in rows], lambda t: lr_at(t, epochs, peak),
                 0.5 * (r["i2t_r1"] + r["t2i_r1"]), None, extra)  # fmt: skip


def all_pairs_traces(results: Path) -> list[Trace]:
    files = sorted(results.glob("pairs-noise*-seed*.json"))
    lr_at = import_example().lr_at if files else None
    return [pairs_trace(json.loads(p.read_text()), lr_at) for p in files]


def _block(
    head: str, traces: list[Trace], experiments: list[dict], metric: str = "acc %"
) -> tuple[list[str], list[Event]]:
    """The collapses and dips of ``traces`` under the sentence ``head``, and the collapses."""
    col, dips = events(traces)
    runs = {(ev.trace.study, ev.trace.run) for ev in col}
    L = [f"{head}: {len(runs)} runs collapsed, {len(col)} times in all. Collapsed runs per policy: "
         f"{policy_counts(traces, col)}.", ""]  # fmt: skip
    if col:
        L += collapse_rows(col, experiments, metric) + [""]
    return L + [dip_line(dips), ""], col


def collapse_section(traces: list[Trace], pairs: list[Trace], short_runs: int, experiments: list[dict],
                     source: str) -> list[str]:  # fmt: skip
    """The generated section (lines) from the traces of the image runs and of the pairs runs."""
    L = [
        f"**The rule** (`benchmarks/quality/collapses.py`): a run *collapsed at epoch e* when its held-out "
        f"metric after epoch e was at most chance + {100 * MARGIN:g} points while an earlier epoch of the same "
        f"run had reached chance + 10 points (CIFAR-10 test accuracy: chance 10%, collapse at most "
        f"{100 * (0.1 + MARGIN):g}%; pairs: mean R@1 over the held-out pairs, chance 1 / their number). Each row "
        "gives the plan that trained just before that evaluation. The window and the largest weight are not in "
        "the run files: they are the policy's rule for the run's parameters and epoch (docs/algorithms.md §3.2, "
        "§4.2), which `checks.py` verified on the run's directory where the last column says so; the learning "
        "rate is the training loop's schedule at the start and end of that epoch (CIFAR-10: "
        "`benchmarks/quality/train.py`, peak 0.1 at every revision of these files; pairs: "
        "`examples/train_pairs.py`, the peak its run file records), not a recorded value.",
        "",
    ]
    block, col = _block(f"**CIFAR-10 runs with a test accuracy after every epoch** ({len(traces)} run files in "
                        f"`docs/quality-runs/{{{','.join(CURVE_FOLDERS)}}}/`)", traces, experiments)  # fmt: skip
    L += block
    if pairs:
        head = (f"**Image-text pairs** ({len(pairs)} run files `docs/quality-runs/pairs-*.json`, metric: mean R@1, "
                f"chance {100 * pairs[0].chance:g}%)")  # fmt: skip
        block, pcol = _block(head, pairs, experiments, "mean R@1 %")
        L += block
        col += pcol
    L += [
        f"**The short study** ({short_runs} run files `docs/quality-runs/{{cifar10,sst2}}-*.json`): its run "
        "files record the test accuracy at the end only, so a collapse inside one of its runs cannot be "
        "seen; its tables are not marked.",
        "",
    ]
    L += experiment_lines(experiments, {(ev.trace.run, ev.epoch) for ev in col}, source)
    return L


def report_collapses(layout: Layout) -> list[str]:
    """Rewrite the collapse section of docs/quality.md; returns its lines."""
    experiments = load_experiments(layout.results / "collapses.json")
    short = load_results(layout.results, tuple(f"{d}-" for d in DATASETS))
    lines = collapse_section(converged_traces(layout), all_pairs_traces(layout.results), len(short), experiments,
                             "docs/quality-runs/collapses.json")  # fmt: skip
    splice(layout.doc, f"<!-- {MARKER}:begin -->", f"<!-- {MARKER}:end -->", lines)
    return lines
