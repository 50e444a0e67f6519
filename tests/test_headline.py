"""README's headline table is what the baseline studies' result files give (studies/headline.py)."""

from __future__ import annotations

import json

from studies import headline
from tools.results import gap_verdict


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
        assert line.split(" | ")[6:8] == ["-" if se2 is None else f"{se2:.1f}", words]
    assert headline.cell([1.0, -0.5]) == "+0.2 (+1.0, -0.5)"


def test_results_finding_is_generated_and_follows_the_signs_and_verdicts() -> None:
    """docs/results.md's first finding: each rule-alone row in the sentence its verdict puts it in, with
    its mean; never 'ended above full data' for a row below it."""
    text = headline.RESULTS_DOC.read_text()
    assert headline.splice(text, headline.verdict_block(), headline.VERDICT_BEGIN, headline.VERDICT_END) == text
    block = text[text.index(headline.VERDICT_BEGIN) : text.index(headline.VERDICT_END)]
    lines = block.splitlines()
    words = {"met": "ended **above**", "below": "ended **below**"}
    for r in headline.rows():
        if not r["es"] or not r["config"].startswith("rule alone") or r.get("superseded"):
            continue
        mean, _, verdict = gap_verdict(r["es"])
        (line,) = [x for x in lines if words.get(verdict, "not resolved") in x]
        assert f"{r['level']}: {mean:+.1f} {r['metric']} points ({verdict}" in line, r["data"]
    # the rows on the salted CRC32 label noise are named as superseded, their figures not used
    assert (
        "The rows on the salted CRC32 label noise (CIFAR-10, ResNet-18, GPU; SST-2, bag of n-grams, CPU) are "
        "superseded and not part of this finding"
    ) in block
    # (by its data, not its figure: the GPU row's -7.4 may recur in another study's row)
    assert "ResNet-18, GPU, with" not in block and "ResNet-18, GPU" in headline.README.read_text()
    assert "40% noisy labels: -3.4 accuracy points" not in block
    readme = headline.README.read_text()
    (gpu,) = [x for x in readme.splitlines() if x.startswith("| CIFAR-10, 40% symmetric noisy labels | ResNet-18, GPU")]
    assert "| rule alone | 1, salted CRC32 label noise (superseded) | 0.63 |" in gpu
    assert "ended above full data" not in text
    # rule + random is set beside the rule alone of its own version and draws
    for r in headline.rows():
        if r["es"] and r["config"].startswith("rule + random") and not r.get("superseded"):
            (a,) = [x for x in headline.rows() if x["config"] == "rule alone" and x["data"] == r["data"]
                    and x["model"] == r["model"] and x["rule"] == r["rule"]]  # fmt: skip
            version = r["rule"].split(",")[0]
            got, alone = gap_verdict(r["es"])[0], gap_verdict(a["es"])[0]
            head = f"{r['level']} (rule version {version}):"
            assert f"{head} {got:+.1f} (" in block
            assert f"against the rule alone's {alone:+.1f} (" in block.split(head)[1]


def test_each_cell_says_the_seeds_it_covers_and_the_pairs_are_named_as_what_they_are() -> None:
    readme = headline.README.read_text()
    (sst2,) = [x for x in readme.splitlines() if x.startswith("| SST-2, 40% noisy labels |") and "CRC32" in x]
    assert "| -3.4 (-1.7, -7.5, -0.9) accuracy |" in sst2 and "| -22.5 (-22.1, -22.8; seeds 0, 1) | 0, 1, 2 |" in sst2
    assert headline.cell([1.0, 2.0], [0, 1], [0, 1]) == "+1.5 (+1.0, +2.0)"
    assert headline.cell([1.0, 2.0], [0, 2], [0, 1, 2]) == "+1.5 (+1.0, +2.0; seeds 0, 2)"
    for r in headline.rows():
        assert len(r["oracle"]) == len(r["oracle_seeds"]) and set(r["oracle_seeds"]) <= set(r["seeds"])
    root = headline.ROOT
    for page in (readme, (root / "docs" / "results.md").read_text(), (root / "docs" / "baselines.md").read_text()):
        assert "web pairs" not in page
    assert "| generated shape pairs (32-pixel shape images, template captions), 20% mismatched captions |" in readme


def test_a_row_with_an_unstable_run_is_marked_and_the_run_named(monkeypatch) -> None:
    from studies.quality import instability

    old = json.loads((headline.ROOT / "docs/quality-runs/baselines-labels/sst2-n40-E11-full-s1.json").read_text())

    def flag(run: dict, name: str = "") -> bool:  # that run of the superseded study alone
        return run.get("method") == "full" and run.get("seed") == 1 and run.get("seconds") == old["seconds"]

    monkeypatch.setattr(instability, "unstable", flag)
    lines = headline.block().splitlines()
    (sst2,) = [x for x in lines if x.startswith("| SST-2, 40% noisy labels |") and "CRC32" in x]
    assert "| rule alone (never active) † |" in sst2
    assert sum("†" in x for x in lines if x.startswith("| ")) == 1
    assert lines[-1].startswith("† a run of this configuration collapsed to chance")
    assert "`baselines-labels/sst2-n40-E11-full-s1.json`" in lines[-1]
