"""Where the study's inputs and outputs live (one place for every path)."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def python_m(module: str, *args: object) -> list[str]:
    """The command running ``module`` in a fresh interpreter: ``python -m module args...`` (with
    :func:`child_env`: a data tool ``tools.NAME``, a study's worker)."""
    return [sys.executable, "-m", module, *map(str, args)]


def child_env(root: Path = ROOT) -> dict[str, str]:
    """This process's environment with ``root`` (the repository) first on the child's ``PYTHONPATH``:
    a :func:`python_m` child finds ``tools``, ``studies`` and the checkout's ``seta_stream`` from any
    working directory."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(root), os.environ.get("PYTHONPATH")) if p)}


@dataclass(frozen=True)
class Layout:
    """``results``: the committed run files (docs/quality-runs); ``out``: scratch (bench-out/quality)."""

    results: Path = ROOT / "docs" / "quality-runs"
    out: Path = ROOT / "bench-out" / "quality"
    data: Path = ROOT.parent / "shared" / "data"

    @property
    def doc(self) -> Path:
        return self.results.parent / "quality.md"

    @property
    def results_doc(self) -> Path:
        """docs/results.md, whose table of the converged study is generated (``reading.report_readings``)."""
        return self.results.parent / "results.md"

    @property
    def plots(self) -> Path:
        return self.results.parent / "quality"

    @property
    def runs(self) -> Path:
        """Run directories (the loss table and plans); seed 0's stay for the checks."""
        return self.out / "runs"

    @property
    def converged(self) -> Path:
        """The converged study's run files."""
        return self.results / "converged"
