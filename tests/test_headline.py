"""README's headline table is what the baseline studies' result files give (benchmarks/headline.py)."""

from __future__ import annotations

from benchmarks import headline


def test_readme_headline_is_generated_from_the_result_files() -> None:
    text = headline.README.read_text()
    assert headline.BEGIN in text and headline.END in text
    assert headline.splice(text, headline.block()) == text


def test_verdict_rule() -> None:
    assert headline._verdict([1.0]) == ("-", "one seed")
    assert headline._verdict([3.0, 3.2]) == ("0.2", "above")
    assert headline._verdict([-3.0, -3.2]) == ("0.2", "below")
    assert headline._verdict([3.0, -1.0]) == ("4.0", "not resolved")
    assert headline._cell([1.0, -0.5]) == "+0.2 (+1.0, -0.5)"
