"""The section of docs/quality.md on the runs whose held-out metric fell to chance during training
(the rule and ``collapses.json``: ``collapses``), in every study whose run files record a per-epoch
curve, with the experiments on their cause."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from studies.quality.collapses import (
    BATCH,
    COMMAND,
    CONTROL,
    DIP,
    IMAGE_PEAK_LR,
    LEARNED,
    MARGIN,
    Event,
    Trace,
    control_file,
    converged_trace,
    events,
    largest_weight,
    window,
    write,
)
from studies.quality.configs import conv_run_id
from studies.quality.data import DATASETS
from studies.quality.docs import ORDER, load_results, row, splice, table_head
from studies.quality.layout import Layout
from studies.quality.pairs import run_id

MARKER = "collapses"
COUNTS = "| runs with a curve | run files | chance | runs collapsed | collapses | collapsed runs per policy | dips |"
SHORT = (
    "the short study (`docs/quality-runs/{cifar10,sst2}-*.json`): test accuracy at the end only, so a collapse "
    "inside a run cannot be seen"
)
#: The table of collapses: one row per collapse (``collapse_rows``).
COLUMNS = (
    "| run | study | epoch | held-out %: epoch before -> that epoch -> after | final | plan of that epoch: phase, "
    "kept fraction | SeTa window (rule) | largest weight (rule) | lr over the epoch (schedule) | training loss: "
    "epoch before -> that epoch -> after | rule checked on its run directory | final batch, lr of its step "
    "| experiments (`collapse` arguments) | result files |"
)
DIPS = "| dip: run | study | epoch | held-out % |"
# the folders of docs/quality-runs whose run files record a test accuracy after every epoch
CURVE_FOLDERS = ("converged", "converged-same-order", "converged-reruns")


def converged_traces(layout: Layout) -> list[Trace]:
    """The CIFAR-10 runs with a curve, each with its run directory's check from the folder's checks.json."""
    out = []
    for folder in CURVE_FOLDERS:
        checks = layout.results / folder / "checks.json"
        checked = json.loads(checks.read_text()).get("run_dirs", {}) if checks.exists() else None
        traces = (converged_trace(r, conv_run_id(r, r["seed"]), folder, checked) for r in load_results(checks.parent))
        out += [t for t in traces if t is not None]
    return out


def pairs_trace(r: dict, lr_at: Callable[[float, int, float], float]) -> Trace:
    """The trace of a pairs-study result: mean recall@1 (i2t, t2i) after every epoch; ``lr_at``:
    studies.engines.pairs' schedule (warm-up then cosine)."""
    rows, epochs, peak = r["rows"], r["train"]["epochs"], r["train"]["lr"]
    extra = [f"{100 * row['mismatched_share']:.1f}% mismatched" for row in rows] if r["noise"] else []
    return Trace(run_id(r["noise"], r, r["seed"]), f"pairs, {round(100 * r['noise'])}% mismatched", r["policy"],
                 r["params"], r["seed"], [0.5 * (row["i2t_r1"] + row["t2i_r1"]) for row in rows],
                 1.0 / r["data"]["test"], [row["kept"] / row["n"] for row in rows], [row["phase"] for row in rows],
                 [row["loss"] for row in rows], lambda t: lr_at(t, epochs, peak),
                 0.5 * (r["i2t_r1"] + r["t2i_r1"]), None, extra)  # fmt: skip


def all_pairs_traces(results: Path) -> list[Trace]:
    files = sorted(results.glob("pairs-noise*-seed*.json"))
    if not files:
        return []
    from studies.engines.pairs import lr_at

    return [pairs_trace(json.loads(p.read_text()), lr_at) for p in files]


def table(header: str, rows: list[list]) -> list[str]:
    """A markdown table under the header row ``header``, then a blank line."""
    return [*table_head(header), *(row([str(c) for c in r]) for r in rows), ""]


def _pct(x: float) -> str:
    return f"{100 * x:.1f}"


def policy_counts(traces: list[Trace], col: list[Event]) -> str:
    """'seta 5 of 40, infobatch 1 of 6, ...': collapsed runs per policy among the runs with a curve."""
    hit = {id(ev.trace) for ev in col}  # a run id can stand in several folders
    runs = Counter(t.policy for t in traces)
    hits = Counter(t.policy for t in traces if id(t) in hit)
    return ", ".join(f"{p} {hits[p]} of {runs[p]}" for p in sorted(runs, key=ORDER.get))


def _runs(evs: list[Event]) -> int:
    return len({(ev.trace.study, ev.trace.run) for ev in evs})  # a run id can stand in several folders


def count_row(what: str, traces: list[Trace]) -> list[str]:
    """A study's row of the counts: run files, chance, collapses, collapsed runs per policy, dips."""
    col, dips = events(traces)
    chance = f"{100 * traces[0].chance:g}%" if traces else "-"
    dip = f"{len(dips)} in {_runs(dips)} runs" if dips else "none"
    return [what, len(traces), chance, _runs(col), len(col), policy_counts(traces, col), dip]


def collapse_rows(col: list[Event], entries: list[dict]) -> list[list[str]]:
    """One row per collapse: the metric around it, the plan trained just before it, and, where
    ``collapses.json`` lists the epoch, its final batch and the experiments on it."""
    out = []
    for ev in col:
        t, e = ev.trace, ev.epoch
        at = [_pct(t.metric[i]) if 0 <= i < len(t.metric) else "-" for i in (e - 1, e + 1)]
        loss = " -> ".join(f"{t.train_loss[i]:.2f}" if 0 <= i < len(t.train_loss) else "-" for i in (e - 1, e, e + 1))
        plan = f"{t.phase[e]}, {t.kept[e]:.2f}" + (f"; {t.extra[e]}" if t.extra else "")
        checked = {None: "not kept", True: "yes", False: "**problems** (checks.json)"}[t.checked]
        x = next((x for x in entries if (x["run_id"], x["epoch"]) == (t.run, e)), None)
        batch, runs, files = "-", "-", "-"
        if x is not None:
            f, kept = x["prev_epoch_plan"]["final_batch"], x["prev_epoch_plan"]["kept"]
            batch = f"{f} (kept {kept} = {kept // BATCH} x {BATCH} + {f}), lr {x['lr']['final_batch_step']:.4f}"
            runs = "<br>".join(f"`{c.removeprefix(COMMAND).strip()}`" for c in x["experiment"]["command"][:-1]) or "-"
            names = [p.rsplit("/", 1)[-1] for p in x["experiment"]["result_files"]]
            files = ", ".join(f"`{n}`" for n in names if n != control_file()) or "-"
        out.append([f"`{t.run}`", t.study, e, f"{at[0]} -> **{_pct(ev.acc)}** -> {at[1]}", _pct(t.final), plan,
                    window(t.policy, t.params, e, t.phase[e]), f"{largest_weight(t.policy, t.params, e, t.phase[e]):g}",
                    f"{t.lr(e):.3g} -> {t.lr(e + 1):.3g}", loss, checked, batch, runs, files])  # fmt: skip
    return out


def collapse_section(traces: list[Trace], pairs: list[Trace], short_runs: int, entries: list[dict]) -> list[str]:
    """The generated section (lines) from the traces of the image runs and of the pairs runs, and
    the entries of ``collapses.json``."""
    col, dips = events(traces + pairs)
    batches = sorted(x["prev_epoch_plan"]["final_batch"] for x in entries)
    L = [f"**{len(entries)} epochs of the converged CIFAR-10 runs fell to chance, each after a final batch of "
         f"{batches[0]} to {batches[-1]} samples** (the epoch's kept count modulo {BATCH}). SeTa and InfoBatch keep a "
         "different count every epoch, full data and dynamic random a fixed one. Reruns forked before the final "
         "batch (`studies/quality/collapse.py`; each collapse's cause and the readings in "
         "`docs/quality-runs/collapses.json`) find that the one optimiser step on those few samples, not BatchNorm, "
         "throws the model off; a rerun is another sample of its run, not a replay (augmentation draws are not "
         "seeded)." if entries else "No epoch of the converged CIFAR-10 runs fell to chance.", ""]  # fmt: skip
    L += [f"**The rule** (`studies/quality/collapses.py`): a run *collapsed at epoch e* when its held-out metric "
          f"after epoch e was at most chance + {100 * MARGIN:g} points while an earlier epoch of the run had reached "
          f"chance + {100 * LEARNED:g} points (CIFAR-10 test accuracy: collapse at most {100 * (0.1 + MARGIN):g}%); "
          f"a *dip* is an epoch at most {DIP:g} x chance that is not a collapse (not marked in the study tables). "
          "Each row gives the plan that trained just before the collapse: its window and largest weight are the "
          "policy's rule for the run's parameters and epoch (docs/algorithms.md §3.2, §4.2), which `checks.py` "
          "verified on the run's directory where the table says so; the learning rate is the training loop's "
          f"schedule (CIFAR-10: `studies/quality/train.py`, peak {IMAGE_PEAK_LR:g}; pairs: "
          "`studies/engines/pairs.py`, the peak its run file records), not a recorded value.", ""]  # fmt: skip
    curves = f"`docs/quality-runs/{{{','.join(CURVE_FOLDERS)}}}/`"
    counts = [count_row(f"CIFAR-10, test accuracy ({curves})", traces)]
    if pairs:
        counts.append(count_row("image-text pairs, mean R@1 (`docs/quality-runs/pairs-*.json`)", pairs))
    counts.append([SHORT, short_runs, "-", "-", "-", "-", "-"])
    L += table(COUNTS, counts)
    if col:
        L += table(COLUMNS, collapse_rows(col, entries))
    found = {(ev.trace.run, ev.epoch) for ev in col}
    stray = [f"`{x['run_id']}` epoch {x['epoch']}" for x in entries if (x["run_id"], x["epoch"]) not in found]
    stray = f" Epochs at chance that are not a collapse by the rule: {', '.join(stray)}." if stray else ""
    L += [
        f"The experiments on every collapse also cite the full-data control `{CONTROL}` (`{control_file()}`).{stray}",
        "",
    ]
    if dips:
        L += table(DIPS, [[f"`{ev.trace.run}`", ev.trace.study, ev.epoch, f"{_pct(ev.acc)}%"] for ev in dips])
    return L


def report_collapses(layout: Layout) -> list[str]:
    """Rewrite ``collapses.json`` and the collapse section of docs/quality.md; returns its lines."""
    entries = write(layout)
    short = load_results(layout.results, tuple(f"{d}-" for d in DATASETS))
    lines = collapse_section(converged_traces(layout), all_pairs_traces(layout.results), len(short), entries)
    splice(layout.doc, f"<!-- {MARKER}:begin -->", f"<!-- {MARKER}:end -->", lines)
    return lines
