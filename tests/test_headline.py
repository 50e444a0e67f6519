"""README's headline table is what the baseline studies' result files give (benchmarks/headline.py)."""

from __future__ import annotations

from benchmarks import headline
from benchmarks.common import gap_verdict


def test_readme_headline_is_generated_from_the_result_files() -> None:
    text = headline.README.read_text()
    assert headline.BEGIN in text and headline.END in text
    assert headline.splice(text, headline.block()) == text


def test_verdict_column_is_common_gap_verdict() -> None:
    rows = [r for r in headline.rows() if r["es"]]
    table = [line for line in headline.block().splitlines() if line.startswith("| ") and "[" in line]
    assert len(table) == len(rows) > 0
    for r, line in zip(rows, table):
        _, se2, words = gap_verdict(r["es"])
        assert line.split(" | ")[5:7] == ["-" if se2 is None else f"{se2:.1f}", words]
    assert headline.cell([1.0, -0.5]) == "+0.2 (+1.0, -0.5)"
