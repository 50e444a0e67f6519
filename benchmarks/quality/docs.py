"""The report layer: every generated section of the docs, and the helpers every study's report uses.

``report_all`` rewrites, from the committed run files, every section the studies generate:

* docs/quality.md: the short study (``report``, ``reading_short``), the converged study and its
  same-order runs (``report_converged``, ``reading``: prose and the summary at the top), the
  collapses (``report_collapses``), the noise rule on noisy labels and the instability scan
  (``noise_report``, ``benchmarks.instability``);
* docs/quality-pairs.md: the pairs study (``pairs``), the noise study on pairs and its replicas
  (``noise_report``), the rule's scale (``noise_scale``);
* docs/results.md: the tables of the converged study, the pairs study, the noise study and the
  scale; README.md: the results table (``noise_report``);
* the plots under docs/quality/.

Every number in those sections comes from the run files; nothing is written by hand between markers.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

ORDER = {"full": 0, "random": 1, "static": 2, "infobatch": 3, "seta": 4, "es": 5, "eswp": 6}


def load_results(folder: Path, prefixes: tuple[str, ...] = ("",)) -> list[dict]:
    """Every run file (``*-s<seed>.json``, not a crashed or cut-short run's) directly in ``folder``
    whose name starts with one of ``prefixes`` (other studies keep their files there too), in name order."""
    paths = sorted(p for p in folder.glob("*-s[0-9]*.json") if not p.name.endswith((".crashed.json", ".cut.json")))
    return [json.loads(p.read_text()) for p in paths if p.name.startswith(prefixes)]


def group(results: list[dict]) -> dict[tuple, list[dict]]:
    """(dataset, noisy, policy, label, params) -> the runs of that configuration (one per seed)."""
    groups: dict[tuple, list[dict]] = {}
    for r in results:
        key = (r["dataset"], r["noisy"], r["policy"], r["label"], json.dumps(r["params"], sort_keys=True))
        groups.setdefault(key, []).append(r)
    return groups


def scaled_mean(xs: list[float], scale: float = 100.0) -> float:
    """The mean of the scaled values (percentages by default): the one mean every table cell and
    every gap computed from those cells uses, so a gap and its two numbers round alike."""
    return float((np.asarray(xs) * scale).mean())


def splice(doc: Path, begin: str, end: str, lines: list[str], title: str = "", skip_missing: bool = False) -> None:
    """Replace what stands between the markers ``begin`` and ``end`` of ``doc`` by ``lines``. Where
    the markers are absent they are appended (a missing doc starts with ``# title``), or, with
    ``skip_missing``, the doc is left alone."""
    text = doc.read_text() if doc.exists() else (f"# {title}\n\n{begin}\n{end}\n" if title else "")
    if begin not in text:
        if skip_missing:
            return
        text = text.rstrip("\n") + f"\n\n{begin}\n{end}\n"
    head, _, rest = text.partition(begin)
    _, _, tail = rest.partition(end)
    doc.write_text(head + begin + "\n" + "\n".join(lines) + "\n" + end + tail)


def row(cells: list[str]) -> str:
    """A markdown table row."""
    return "| " + " | ".join(cells) + " |"


def and_list(items: list[str]) -> str:
    if len(items) <= 1:
        return "".join(items)
    return ", ".join(items[:-1]) + " and " + items[-1]


def fmt_params(p: dict, empty: str = "-") -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(p.items())) or empty


def mean_sd(xs: list[float], scale: float = 100.0, digits: int = 2) -> str:
    """'mean ± sd' of the scaled values over seeds (sd with ddof 1), just the mean for one seed."""
    a = np.asarray(xs, dtype=np.float64) * scale
    return f"{a.mean():.{digits}f} ± {a.std(ddof=1):.{digits}f}" if len(a) > 1 else f"{a.mean():.{digits}f}"


def interp_gap(x: float, value: float, pts: list[tuple[float, float]]) -> float | None:
    """``value`` minus the reference's value interpolated linearly at ``x`` between the points
    ``pts`` (pruned %, value); None with fewer than 2 points or ``x`` outside them."""
    pts = sorted(pts)
    if len(pts) < 2 or not pts[0][0] <= x <= pts[-1][0]:
        return None
    return value - float(np.interp(x, [p[0] for p in pts], [p[1] for p in pts]))


def epoch_table(keys: list, cells: list[list[str]], lead: list[str], E: int) -> list[str]:
    """A table of one row per configuration (``lead[i]``: its first cells joined) and a column per epoch."""
    head = ["| policy | setting | " + " | ".join(f"e{e}" for e in range(E)) + " |", "| --- | --- |" + " --- |" * E]
    return head + [f"| {lead[i]} | " + " | ".join(cells[i]) + " |" for i in range(len(keys))]


def report_quality(layout: object | None = None) -> None:
    """docs/quality.md's sections of the short and converged studies and the collapses, and
    docs/results.md's table of the converged study (``python -m benchmarks.quality --study short --report-only``)."""
    from .layout import Layout
    from .reading import report_readings
    from .reading_short import report_short_reading
    from .report import report_short
    from .report_collapses import report_collapses
    from .report_converged import SAME_ORDER, report_converged

    layout = layout or Layout()
    report_short(layout)
    report_converged(layout)
    report_converged(layout, SAME_ORDER)
    report_collapses(layout)
    report_readings(layout)
    report_short_reading(layout)


def report_all() -> None:
    """Every generated section of the docs, from the committed run files."""
    from . import noise, noise_scale, pairs

    report_quality()
    noise.report(noise.Ctx())
    pairs.report()
    noise_scale.report()
