"""The report layer's helpers: result readers, splicing a generated section between its markers, tables, lists."""

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


def mean_acc(rs: list[dict]) -> float:
    """The runs' mean test accuracy in %, the same mean as the tables' cells (``scaled_mean``)."""
    return scaled_mean([r["test_acc"] for r in rs])


def last_loss(rs: list[dict]) -> float:
    """The runs' mean training loss of their last epoch."""
    return float(np.mean([r["epochs"][-1]["train_loss"] for r in rs]))


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


def table_head(header: str) -> list[str]:
    """A markdown table's header row and its separator row (one ``---`` per column of ``header``)."""
    return [header, "|" + " --- |" * (header.count("|") - 1)]


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
