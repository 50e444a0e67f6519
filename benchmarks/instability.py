"""The instability scan: every result file with a per-epoch held-out curve, in every study folder
under ``docs/quality-runs/`` (all depths), read for two events:

* a **collapse to chance** (``quality.collapses.collapse_epochs``): the metric after an epoch at
  most chance + 2 points after an earlier epoch of the same run had reached chance + 10 points;
* a **one-epoch drop** of ``DROP`` (20 points) or more: the metric after epoch e at least 20
  points below its value after epoch e - 1.

The curves: ``epochs[e].test_acc`` (the converged studies, the collapse experiments), ``rows[e].
test_acc`` (the noise study's noisy-label runs with a per-epoch curve), and for image-text pairs
the mean of ``rows[e].i2t_r1`` and ``rows[e].t2i_r1`` (the pairs study, the noise study, the scale
check, the baselines studies in ``baselines-pairs/`` and ``baselines-labels/``), and ``rows[e].acc``
of the word-image runs (``words-noise/``). Chance: CIFAR-10 10%, SST-2 50%, the word images 2% (50
classes), pairs 1 / the held-out pairs (``data.test``). Files without such a curve (the short
study's runs record no per-epoch accuracy, calibrations, checks, replays) are counted and not read.

A run with either event is *unstable*; the reports mark it with a dagger (:data:`MARK`) in every
table that shows it and list its file under the table (:func:`footnote`).
``python -m benchmarks.instability`` writes the findings to ``docs/quality-runs/instability.json``
(one entry per unstable file) and the section of docs/quality.md that names every such run
(between ``<!-- instability:begin -->`` and ``<!-- instability:end -->``); the noise study's
report rewrites both too.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from benchmarks.common import write_json
from benchmarks.quality.collapses import LEARNED, MARGIN, collapse_epochs

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "docs" / "quality-runs"
OUT = "instability.json"
DROP = 0.20  # a one-epoch drop of 20 points of the held-out metric (as a fraction)
MARK = "†"
BEGIN, END = "<!-- instability:begin -->", "<!-- instability:end -->"
CHANCE = {"cifar10": 0.1, "sst2": 0.5, "words": 1 / 50}


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


def findings(d: Any, name: str = "") -> dict[str, Any] | None:
    """The events of one result file (None without a curve): its collapse epochs and its drops
    (epoch, metric before, metric after)."""
    c = curve(d, name)
    if c is None:
        return None
    metric, chance, what = c
    drops = [
        {"epoch": e, "before": metric[e - 1], "after": metric[e]}
        for e in range(1, len(metric))
        if metric[e - 1] - metric[e] >= DROP - 1e-12
    ]
    return {"metric": what, "chance": chance, "collapse_epochs": collapse_epochs(metric, chance), "drops": drops}


def unstable(r: dict, name: str = "") -> bool:
    """The run ``r`` (a result file's contents) collapsed to chance or dropped 20 points in one epoch."""
    f = findings(r, name)
    return bool(f and (f["collapse_epochs"] or f["drops"]))


def scan(root: Path = RESULTS) -> dict[str, Any]:
    """Every result file under ``root``: how many were read and had a curve, and each unstable one
    (its path relative to ``root``, policy, label, seed and events), in path order."""
    files = sorted(p for p in root.rglob("*.json") if p.name != OUT)
    runs, with_curve = [], 0
    for p in files:
        try:
            doc = json.loads(p.read_text())
        except (OSError, ValueError):
            continue
        # a file of many runs ({"meta", "runs": {id: run}}, benchmarks/cifar_gpu.py) is read run by run
        many = isinstance(doc, dict) and isinstance(doc.get("runs"), dict)
        for rid, d in doc["runs"].items() if many else [(None, doc)]:
            f = findings(d, p.name)
            if f is None:
                continue
            with_curve += 1
            if f["collapse_epochs"] or f["drops"]:
                where = p.relative_to(root).as_posix() + (f"#{rid}" if many else "")
                runs.append({"file": where, "policy": d.get("policy"), "label": d.get("label"), "seed": d.get("seed"),
                             **f})  # fmt: skip
    return {
        "rule": {
            "collapse": f"held-out metric at most chance + {100 * MARGIN:g} points after an epoch at least chance + "
            f"{100 * LEARNED:g} points",
            "drop": f"held-out metric {100 * DROP:g} points or more below the epoch before",
        },
        "files": len(files),
        "with_curve": with_curve,
        "runs": runs,
    }


def _pct(x: float) -> str:
    return f"{100 * x:.1f}"


def events_text(run: dict) -> str:
    """'collapse at e9; drop at e9 (69.6 -> 10.0)' for one entry of :func:`scan`."""
    parts = []
    if run["collapse_epochs"]:
        parts.append("collapse at " + ", ".join(f"e{e}" for e in run["collapse_epochs"]))
    if run["drops"]:
        parts.append(
            ("drop at " if len(run["drops"]) == 1 else "drops at ")
            + ", ".join(f"e{x['epoch']} ({_pct(x['before'])} -> {_pct(x['after'])})" for x in run["drops"])
        )
    return "; ".join(parts)


def footnote(files: list[str], where: str = "") -> str:
    """The line under a table with marked rows: what the mark means and the files it stands for."""
    names = ", ".join(f"`{f}`" for f in files)
    return (f"{MARK} a run of this configuration collapsed to chance or fell {100 * DROP:g} points or more in one "
            f"epoch (instability scan, `docs/quality-runs/{OUT}`{where}): {names}.")  # fmt: skip


def report_lines(found: dict[str, Any]) -> list[str]:
    """The section naming every unstable run: one row per file (where it stands, what happened)."""
    runs = found["runs"]
    L = [
        f"`python -m benchmarks.instability` read all {found['files']} result files under `docs/quality-runs/` (every "
        f"study folder); {found['with_curve']} have a held-out metric after every epoch (the short study's files do "
        f"not). {len(runs)} of them collapsed to chance ({found['rule']['collapse']}) or dropped "
        f"{100 * DROP:g} points or more in one epoch; every table of docs/quality.md, docs/quality-pairs.md, "
        f"docs/baselines.md and docs/baselines-labels.md that shows such a run marks its row with {MARK}. The list "
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
