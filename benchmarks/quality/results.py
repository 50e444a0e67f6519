"""Reading run files, grouping runs of one configuration, and the numbers' formatting."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

ORDER = {"full": 0, "random": 1, "static": 2, "infobatch": 3, "seta": 4, "es": 5, "eswp": 6}


def load_results(folder: Path, prefixes: tuple[str, ...] = ("",)) -> list[dict]:
    """Every run file (``*-s<seed>.json``) directly in ``folder`` whose name starts with one of
    ``prefixes`` (other studies keep their files there too), in name order."""
    return [json.loads(p.read_text()) for p in sorted(folder.glob("*-s[0-9]*.json")) if p.name.startswith(prefixes)]


def group(results: list[dict]) -> dict[tuple, list[dict]]:
    """(dataset, noisy, policy, label, params) -> the runs of that configuration (one per seed)."""
    groups: dict[tuple, list[dict]] = {}
    for r in results:
        key = (r["dataset"], r["noisy"], r["policy"], r["label"], json.dumps(r["params"], sort_keys=True))
        groups.setdefault(key, []).append(r)
    return groups


def fmt_params(p: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(p.items())) or "defaults"


def scaled_mean(xs: list[float], scale: float = 100.0) -> float:
    """The mean of the scaled values (percentages by default): the one mean every table cell and
    every gap computed from those cells uses, so a gap and its two numbers round alike."""
    return float((np.asarray(xs) * scale).mean())


def mean_sd(xs: list[float], scale: float = 100.0, digits: int = 2) -> str:
    """'mean ± sd' over seeds (sd with ddof 1), just the mean for one seed."""
    m = scaled_mean(xs, scale)
    return f"{m:.{digits}f} ± {(np.asarray(xs) * scale).std(ddof=1):.{digits}f}" if len(xs) > 1 else f"{m:.{digits}f}"
