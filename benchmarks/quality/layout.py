"""Where the study's inputs and outputs live (one place for every path)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


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
