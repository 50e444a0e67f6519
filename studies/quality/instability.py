"""The instability scan: every result file with a per-epoch held-out curve, in every study folder
under ``docs/quality-runs/`` (all depths), read for two events:

* a **collapse to chance** (``quality.collapses.collapse_epochs``): the metric after an epoch at
  most chance + 2 points after an earlier epoch of the same run had reached chance + 10 points;
* a **one-epoch drop** of ``DROP`` (20 points) or more: the metric after epoch e at least 20
  points below its value after epoch e - 1;
* a **divergence**: a non-finite value of the metric or of the training loss (``loss``,
  ``train_loss``) after an epoch, or the status ``diverged`` (``quality.noise.run_status``);
* a run **cut short**: a status the runners give a run stopped before its last epoch (:data:`STOPPED`:
  ``cut`` and ``cut_short`` at a deadline, ``crashed``, ``running``), whose epochs a file may keep.

The curves: ``epochs[e].test_acc`` (the converged studies, the collapse experiments), ``rows[e].
test_acc`` (the noise study's noisy-label runs with a per-epoch curve), and for image-text pairs
the mean of ``rows[e].i2t_r1`` and ``rows[e].t2i_r1`` (the pairs study, the noise study, the scale
check, the baselines studies in ``baselines-pairs/`` and ``baselines-labels/``), and ``rows[e].acc``
of the word-image runs (``words-noise/``). Chance: CIFAR-10 10%, SST-2 50%, the word images 2% (50
classes), pairs 1 / the held-out pairs (``data.test``). Files without such a curve (the short
study's runs record no per-epoch accuracy, calibrations, checks, replays) are counted and not read.
A file of many runs (``{"meta": ..., "runs": {id: run}}``: ``cifar-gpu/results.json``) is read run by
run, each named ``FILE#id``.

A run with any of these events is *unstable*; the reports mark it with a dagger (:data:`MARK`) in every
table that shows it and list its file, with what happened to it, under the table (:func:`footnote`).
``python -m studies instability`` writes the findings to ``docs/quality-runs/instability.json``
(one entry per unstable file) and the section of docs/quality.md that names every such run
(between ``<!-- instability:begin -->`` and ``<!-- instability:end -->``); the noise study's
report rewrites both too.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from studies.quality.collapses import LEARNED, MARGIN, collapse_epochs
from studies.quality.layout import ROOT
from tools.results import PROVENANCE, write_json

RESULTS = ROOT / "docs" / "quality-runs"
OUT = "instability.json"
DROP = 0.20  # a one-epoch drop of 20 points of the held-out metric (as a fraction)
MARK = "†"
BEGIN, END = "<!-- instability:begin -->", "<!-- instability:end -->"
CHANCE = {"cifar10": 0.1, "sst2": 0.5, "words": 1 / 50}
#: a run's status (the runners' word) -> how the pages name a run stopped before its last epoch
STOPPED = {"cut": "cut short", "cut_short": "cut short", "crashed": "crashed", "running": "not finished"}


def curve(d: Any, name: str = "") -> tuple[list[float], float, str] | None:
    """(the held-out metric after each epoch, as fractions; chance; the metric's name) of a result
    file's contents ``d`` (``name``: its file name, whose prefix names the data set where the file
    does not), or None without a per-epoch curve."""
    if not isinstance(d, dict):
        return None
    rows = d.get("rows") if isinstance(d.get("rows"), list) else d.get("epochs")
    if not isinstance(rows, list) or not rows or not all(isinstance(x, dict) for x in rows):
        return None
    if all("i2t_r1" in x and "t2i_r1" in x for x in rows):
        test = (d.get("data") or {}).get("test")
        if not test:
            return None
        return [0.5 * (x["i2t_r1"] + x["t2i_r1"]) for x in rows], 1.0 / test, "mean R@1"
    key = next((k for k in ("test_acc", "acc") if all(k in x for x in rows)), None)
    if key is not None:
        dataset = d.get("dataset") or name.split("-", 1)[0].removeprefix("collapse")
        chance = CHANCE.get(dataset) or CHANCE.get(name.removeprefix("collapse-").split("-", 1)[0])
        if chance is None:
            return None
        return [x[key] for x in rows], chance, "test accuracy"
    return None


def _finite(x: Any) -> bool:
    return not isinstance(x, (int, float)) or math.isfinite(x)


def findings(d: Any, name: str = "") -> dict[str, Any] | None:
    """The events of one result file (None without a curve): its collapse epochs, its drops
    (epoch, metric before, metric after), whether it diverged and, where it was stopped before its
    last epoch, how (:data:`STOPPED`; else None)."""
    c = curve(d, name)
    if c is None:
        return None
    metric, chance, what = c
    drops = [
        {"epoch": e, "before": metric[e - 1], "after": metric[e]}
        for e in range(1, len(metric))
        if _finite(metric[e - 1]) and _finite(metric[e]) and metric[e - 1] - metric[e] >= DROP - 1e-12
    ]
    rows = d.get("rows") if isinstance(d.get("rows"), list) else d.get("epochs")
    losses = [x.get(k) for x in rows for k in ("loss", "train_loss") if k in x]
    diverged = d.get("status") == "diverged" or not all(_finite(x) for x in [*metric, *losses])
    stopped = f"{STOPPED[d['status']]} after {len(metric)} epochs" if d.get("status") in STOPPED else None
    return {"metric": what, "chance": chance, "collapse_epochs": collapse_epochs(metric, chance), "drops": drops,
            "diverged": diverged, "stopped": stopped}  # fmt: skip


def is_unstable(f: dict[str, Any] | None) -> bool:
    """Whether the findings ``f`` (:func:`findings`, or an entry of :func:`scan`) hold an event."""
    return bool(f and (f["collapse_epochs"] or f["drops"] or f.get("diverged") or f.get("stopped")))


def unstable(r: dict, name: str = "") -> bool:
    """The run ``r`` (a result file's contents) collapsed to chance, dropped 20 points in one epoch,
    diverged or was cut short."""
    return is_unstable(findings(r, name))


def scan(root: Path = RESULTS) -> dict[str, Any]:
    """Every result file under ``root``: how many were read and had a curve, and each unstable one
    (its path relative to ``root``, policy, label, seed and events), in path order."""
    files = sorted(p for p in root.rglob("*.json") if p.name not in (OUT, PROVENANCE))
    runs, with_curve = [], 0
    for p in files:
        try:
            doc = json.loads(p.read_text())
        except (OSError, ValueError):
            continue
        # a file of many runs ({"meta", "runs": {id: run}}, studies/cifar_gpu.py) is read run by run
        many = isinstance(doc, dict) and isinstance(doc.get("runs"), dict)
        for rid, d in doc["runs"].items() if many else [(None, doc)]:
            f = findings(d, p.name)
            if f is None:
                continue
            with_curve += 1
            if is_unstable(f):
                where = p.relative_to(root).as_posix() + (f"#{rid}" if many else "")
                runs.append({"file": where, "policy": d.get("policy"), "label": d.get("label"), "seed": d.get("seed"),
                             **f})  # fmt: skip
    return {
        "rule": {
            "collapse": f"held-out metric at most chance + {100 * MARGIN:g} points after an epoch at least chance + "
            f"{100 * LEARNED:g} points",
            "drop": f"held-out metric {100 * DROP:g} points or more below the epoch before",
            "diverged": "a non-finite held-out metric or training loss after an epoch, or the status diverged",
            "stopped": "a status of a run stopped before its last epoch: " + ", ".join(STOPPED),
        },
        "files": len(files),
        "with_curve": with_curve,
        "runs": runs,
    }


def _pct(x: float) -> str:
    return f"{100 * x:.1f}"


def events_text(run: dict) -> str:
    """'collapse at e9; drop at e9 (69.6 -> 10.0)' for one entry of :func:`scan` (or :func:`findings`);
    'diverged', 'cut short after 3 epochs' where those happened."""
    parts = []
    if run["collapse_epochs"]:
        parts.append("collapse at " + ", ".join(f"e{e}" for e in run["collapse_epochs"]))
    if run["drops"]:
        parts.append(
            ("drop at " if len(run["drops"]) == 1 else "drops at ")
            + ", ".join(f"e{x['epoch']} ({_pct(x['before'])} -> {_pct(x['after'])})" for x in run["drops"])
        )
    if run.get("diverged"):
        parts.append("diverged")
    if run.get("stopped"):
        parts.append(run["stopped"])
    return "; ".join(parts)


#: the generated pages whose tables mark every unstable run they show
PAGES = (
    "docs/quality.md, docs/quality-pairs.md, docs/results.md, docs/baselines.md, docs/baselines-labels.md and README.md"
)
#: what :data:`MARK` means, as every footnote and legend says it
MEANING = f"collapsed to chance, fell {100 * DROP:g} points or more in one epoch, diverged or was cut short"


def footnote(files: Sequence[str | tuple[str, dict]], where: str = "") -> str:
    """The line under a table with marked rows: what the mark means and the files it stands for;
    an entry ``(file, run)`` is named with what happened to the run (:func:`events_text`)."""
    runs: dict[str, dict | None] = {}  # each file once, in the order given
    for f in files:
        name, run = (f, None) if isinstance(f, str) else f
        runs[name] = runs.get(name) or run
    names = []
    for name, run in runs.items():
        found = findings(run, name.rsplit("/", 1)[-1].split("#")[0]) if run is not None else None
        events = events_text(found) if found else ""
        names.append(f"`{name}`" + (f" ({events})" if events else ""))
    return (f"{MARK} a run of this configuration {MEANING} (instability scan, `docs/quality-runs/{OUT}`{where}): "
            f"{', '.join(names)}.")  # fmt: skip


def report_lines(found: dict[str, Any]) -> list[str]:
    """The section naming every unstable run: one row per file (where it stands, what happened)."""
    runs = found["runs"]
    L = [
        f"`python -m studies instability` read all {found['files']} result files under `docs/quality-runs/` (every "
        f"study folder); {found['with_curve']} have a held-out metric after every epoch (the short study's files do "
        f"not). {len(runs)} of them collapsed to chance ({found['rule']['collapse']}), dropped "
        f"{100 * DROP:g} points or more in one epoch, diverged or were cut short; every table of {PAGES} that shows "
        f"such a run marks its row with {MARK} and names its file under the table. The list "
        f"(`docs/quality-runs/{OUT}`):",
        "",
        "| file | policy | seed | metric | events |",
        "| --- | --- | --- | --- | --- |",
    ]
    for r in runs:
        L.append(f"| `{r['file']}` | {r['policy']} | {r['seed']} | {r['metric']} | {events_text(r)} |")
    return L


def splice(doc: Path, lines: list[str]) -> None:
    """Replace the text between the markers of ``doc`` (appended at its end the first time)."""
    text = doc.read_text() if doc.exists() else ""
    if BEGIN not in text:
        text = text.rstrip("\n") + f"\n\n{BEGIN}\n{END}\n"
    head, _, rest = text.partition(BEGIN)
    _, _, tail = rest.partition(END)
    doc.write_text(head + BEGIN + "\n" + "\n".join(lines) + "\n" + END + tail)


def write(root: Path = RESULTS, doc: Path | None = ROOT / "docs" / "quality.md") -> dict[str, Any]:
    """Scan ``root``, write ``root/instability.json`` whole and the section of ``doc``."""
    found = scan(root)
    write_json(root / OUT, found)
    if doc is not None:
        splice(doc, report_lines(found))
    return found


def main(argv: list[str] | None = None) -> int:
    found = write()
    print(f"{len(found['runs'])} unstable runs among {found['with_curve']} result files with a curve "
          f"({found['files']} read); docs/quality-runs/{OUT} and docs/quality.md rewritten")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
