"""The short study's section of docs/quality.md (tables, kept fractions, plots, checks), and the
splicing of a generated section between its markers."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from studies.quality import docs
from studies.quality.checks import finished_run_dirs, run_checks
from studies.quality.configs import run_id
from studies.quality.data import DATASETS
from studies.quality.docs import ORDER, fmt_params, group, interp_gap, load_results, mean_sd, row, table_head
from studies.quality.layout import Layout
from studies.quality.plots import plot_short

BEGIN, END = "<!-- generated:begin -->", "<!-- generated:end -->"
HEAD = ("| policy | setting | seeds | pruned % (measured) | back-propagated pruned % | test acc % | val acc % | wall s "
        "(fastest seed) | time vs full | test acc vs dynamic random at that pruned % |")  # fmt: skip


def splice(doc: Path, begin: str, end: str, lines: list[str]) -> None:
    """``docs.splice`` into docs/quality.md (created with its title where missing)."""
    docs.splice(doc, begin, end, lines, "Accuracy under pruning")


def checked(runs: int, dirs: int, rules: str, problems: list[str]) -> str:
    """What ``checks.py`` checked (result files, run directories against ``rules``) and found."""
    return (f"{runs} result files (loader delivered exactly the planned samples in every epoch) and {dirs} run "
            f"directories of seed 0 ({rules}, weights, losses landing on their own keys): "
            + (f"**{len(problems)} problems**:" if problems else "no problem found."))  # fmt: skip


def calibration_rows(cal: dict, *lead: str) -> list[str]:
    """One table row per level a calibration file chose a setting for: the ``lead`` cells, then
    policy, level, setting and simulated pruned %."""
    return [row([*lead, policy, f"{lv}%", fmt_params(v["params"], "defaults"), f"{100 * v['simulated']:.1f}"])
            for policy, levels in cal["levels"].items() for lv, v in levels.items()]  # fmt: skip


def vs_random(groups: dict, dataset: str, rs: list[dict]) -> str:
    """Test accuracy minus dynamic random's (clean labels), linearly interpolated at the same
    measured pruned % (ES/ESWP: back-propagated %) between random's points and full data (0%)."""
    policy = rs[0]["policy"]
    if policy in ("full", "random") or rs[0]["noisy"]:  # random runs have clean labels
        return "-"
    pts = [(0.0, groups.get((dataset, False, "full", "full", "{}")))]
    pts += [(r[0]["pruned"], r) for k, r in groups.items() if k[:3] == (dataset, False, "random")]
    x = float(np.mean([r["pruned_backprop" if policy in ("es", "eswp") else "pruned"] for r in rs]))
    acc = [(p, float(np.mean([r["test_acc"] for r in g]))) for p, g in pts if g]
    v = interp_gap(x, float(np.mean([r["test_acc"] for r in rs])), acc)
    return "-" if v is None else f"{100 * v:+.2f}"


def report_short(layout: Layout) -> None:
    """Rewrite the short study's generated section of docs/quality.md and its plots."""
    results = load_results(layout.results, tuple(f"{d}-" for d in DATASETS))
    if not results:
        return
    checks_path = layout.results / "checks.json"
    dirs = finished_run_dirs(layout.runs, results, lambda r: run_id(r["dataset"], r, r["seed"]))
    if dirs:  # the checks need the kept run directories (seed 0); without them the last findings stay
        checks_path.write_text(json.dumps(run_checks(dirs, results), indent=1))
    groups = group(results)
    lines = []
    for dataset, noisy in [(d, n) for d in ("cifar10", "sst2") for n in (False, True)]:
        keys = sorted((k for k in groups if k[:2] == (dataset, noisy)), key=lambda k: (ORDER[k[2]], k[3]))
        if not keys:
            continue
        full = groups.get((dataset, noisy, "full", "full", "{}"))
        full_s = min(r["seconds"] for r in full) if full else None
        title, name = (
            f"{dataset}, {'40% noisy labels' if noisy else 'clean labels'}",
            f"{dataset}-{'noisy' if noisy else 'clean'}",
        )
        lines += [f"### {title}", "", *table_head(HEAD)]
        for k in keys:
            rs = groups[k]
            secs = min(r["seconds"] for r in rs)  # other work on the VM only adds time
            lines.append(row([k[2], fmt_params(rs[0]["params"], "defaults"), str(len(rs)),
                              *(mean_sd([r[c] for r in rs], digits=1) for c in ("pruned", "pruned_backprop")),
                              *(mean_sd([r[c] for r in rs]) for c in ("test_acc", "val_acc")),
                              f"{secs:.0f}", f"{secs / full_s:.2f}" if full_s else "-",
                              vs_random(groups, dataset, rs)]))  # fmt: skip
        first = groups[keys[0]][0]
        epochs = " | ".join(f"e{e}" for e in range(len(first["epochs"])))
        lines += ["", f"Kept fraction per epoch (plan of seed {first['seed']}):", "",
                  *table_head(f"| policy | setting | {epochs} |")]  # fmt: skip
        lines += [row([k[2], fmt_params(groups[k][0]["params"], "defaults"),
                       *(f"{e['kept'] / e['n']:.2f}" for e in groups[k][0]["epochs"])]) for k in keys]  # fmt: skip
        plot_short(layout.plots / f"{name}.png", dataset, noisy, groups, keys)
        lines += ["", f"![{title}](quality/{name}.png)", ""]
    cal = [x for p in sorted(p for d in DATASETS for p in layout.results.glob(f"{d}-calibration.json"))
           for x in calibration_rows(json.loads(p.read_text()), p.name.split("-")[0])]  # fmt: skip
    if cal:
        lines += ["### Settings chosen for the pruned levels (on training losses, `calibrate`)", "",
                  *table_head("| data | policy | level | setting | simulated pruned % |"), *cal, ""]  # fmt: skip
    if checks_path.exists():
        c = json.loads(checks_path.read_text())
        lines += ["### Checks of the runs against algorithms.md (`studies/quality/checks.py`)", "",
                  checked(c["runs_checked"], len(c["run_dirs_checked"]), "plan rules, window sequence", c["problems"]),
                  "", *[f"* {x}" for x in c["problems"][:50]], ""]  # fmt: skip
    splice(layout.doc, BEGIN, END, lines)
