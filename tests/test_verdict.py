"""tools.results.gap_verdict: the one verdict rule and wording of every report (baselines pages, the CIFAR
GPU page, README's headline, the benchmarks' paired-ratio notes), case by case on hand-computed gaps; and the
other cells every study page shares: the targets of a rule that never costs accuracy, precision / recall of
suspects, a mean cell."""

from __future__ import annotations

from benchmarks import common
from tools.results import gap_verdict, mean_cell, precision_recall, rule_targets


def _r(result: tuple[float, float | None, str]) -> tuple[float, float | None, str]:
    m, se2, v = result
    return round(m, 9), None if se2 is None else round(se2, 9), v


def test_met_and_below_need_the_bar_outside_mean_plus_minus_two_se() -> None:
    # gaps 3 and 5: mean 4, sd sqrt(2), SE = sqrt(2) / sqrt(2) = 1, 2 SE = 2
    assert _r(gap_verdict([3.0, 5.0])) == (4.0, 2.0, "met")
    assert _r(gap_verdict([-3.0, -5.0])) == (-4.0, 2.0, "below")
    # gaps 1, 2, 3: mean 2, sd 1, 2 SE = 2 / sqrt(3) = 1.154700538
    assert _r(gap_verdict([1.0, 2.0, 3.0])) == (2.0, 1.154700538, "met")
    # against a bar: mean - 2 SE = 2 > 1.5; 2 < 2.5 < 6; mean + 2 SE = 6 < 6.5
    assert gap_verdict([3.0, 5.0], bar=1.5)[2] == "met"
    assert gap_verdict([3.0, 5.0], bar=2.5)[2] == "mean above, not resolved"
    assert gap_verdict([3.0, 5.0], bar=6.5)[2] == "below"


def test_not_resolved_on_either_side() -> None:
    # gaps 1 and 3: mean 2, 2 SE 2: mean - 2 SE = 0 does not clear 0
    assert _r(gap_verdict([1.0, 3.0])) == (2.0, 2.0, "mean above, not resolved")
    # gaps 1 and -3: mean -1, sd 2 sqrt(2), SE 2, 2 SE 4
    assert _r(gap_verdict([1.0, -3.0])) == (-1.0, 4.0, "mean below, not resolved")
    assert _r(gap_verdict([-1.0, 1.0])) == (0.0, 2.0, "mean at the bar, not resolved")


def test_one_seed_and_every_gap_at_the_bar() -> None:
    assert gap_verdict([2.5]) == (2.5, None, "one seed: mean above, not resolved")
    assert gap_verdict([-0.5]) == (-0.5, None, "one seed: mean below, not resolved")
    assert gap_verdict([0.0]) == (0.0, None, "one seed: mean at the bar, not resolved")
    assert gap_verdict([0.0, 0.0, 0.0]) == (0.0, 0.0, "at the bar")  # identical runs
    assert gap_verdict([1.0], unit="round") == (1.0, None, "one round: mean above, not resolved")


def test_a_floor_demotes_a_resolved_gap_no_larger_than_it() -> None:
    # gaps -0.4 and -0.6: mean -0.5, 2 SE 0.2: below, resolved
    assert _r(gap_verdict([-0.4, -0.6], floor=0.4)) == (-0.5, 0.2, "below")
    assert _r(gap_verdict([-0.4, -0.6], floor=0.5)) == (-0.5, 0.2, "within the run-to-run floor")
    assert gap_verdict([3.0, 5.0], floor=4.0)[2] == "within the run-to-run floor"
    assert gap_verdict([3.0, 5.0], floor=3.9)[2] == "met"
    # not resolved stays not resolved, whatever the floor
    assert gap_verdict([1.0, -3.0], floor=5.0)[2] == "mean below, not resolved"


def test_at_most_clears_the_bar_from_under_it() -> None:
    # values 1 and 3: mean 2, 2 SE 2: mean + 2 SE = 4 < 5; 0 < 1 < 4; mean - 2 SE = 0 > -1
    assert gap_verdict([1.0, 3.0], bar=5.0, at_most=True)[2] == "met"
    assert gap_verdict([1.0, 3.0], bar=1.0, at_most=True)[2] == "mean above, not resolved"
    assert gap_verdict([1.0, 3.0], bar=3.0, at_most=True)[2] == "mean below, not resolved"
    assert gap_verdict([1.0, 3.0], bar=-1.0, at_most=True)[2] == "above"


def test_paired_ratio_notes_use_the_same_words() -> None:
    fig = {"mean": 1.2, "se": 0.1, "median": 1.2, "pairs": 3}  # 1.2 + 2 x 0.1 = 1.4 < 1.5
    assert common.ratio_note("reader", fig, 1.5, at_most=False) == (
        "reader: 1.20x (SE 0.10), median 1.20x of 3 pairs; target >= 1.5x: below"
    )
    assert common.ratio_note("reader", fig, 0.9, at_most=False).endswith("target >= 0.9x: met")  # 1.0 > 0.9
    one = {"mean": 0.02, "se": None, "median": 0.02, "pairs": 1}
    assert common.ratio_note("stage", one, 0.03, pct=True) == (
        "stage: +2.0%, median +2.0% of 1 pairs; target <= +3%: one round: mean below, not resolved"
    )


def test_precision_is_over_the_runs_that_suspected_something():
    some = {"precision": 0.9, "recall": 0.6}
    none = {"precision": None, "recall": 0.0}
    assert precision_recall([some, some]) == "0.900 / 0.600"
    assert precision_recall([some, none]) == "0.900 / 0.300 (precision of the 1 of 2 runs that suspected any)"
    assert precision_recall([none]) == "- / 0.000 (nothing suspected)"


def test_mean_cell_leaves_out_missing_values():
    assert (mean_cell([0.5, None, 0.25]), mean_cell([2.0, 3.0], 0), mean_cell([None])) == ("0.375", "2", "-")


def test_rule_targets_on_hand_computed_gaps():
    # gaps 1 and 3 points: mean 2, 2 SE = 2; oracle margins 3 and 5 (mean 4 >= 2: the stricter targets apply)
    t = rule_targets([1.0, 3.0], [3.0, 5.0], [-2.0, -1.0])
    assert {k: t[k] for k in ("mean", "se2", "upper", "upper_met", "margin", "applies")} == {
        "mean": 2.0, "se2": 2.0, "upper": 4.0, "upper_met": True, "margin": 4.0, "applies": True}  # fmt: skip
    assert (t["lower"], t["lower_met"], t["to_oracle"], t["to_oracle_met"]) == (0.0, False, -1.5, False)
    # the same in fractions, one point = 0.01: a margin of 0.019 does not apply, the rule just within 2 SE
    f = rule_targets([-0.01, 0.01], [0.019], [], point=0.01)
    assert (f["upper_met"], f["margin"], f["applies"], f["lower"], f["to_oracle"]) == (True, 0.019, False, None, None)
    # one seed: no 2 SE, no verdict on either bound; within 1 point of the oracle is still read from the mean
    one = rule_targets([-0.5], [2.5], [-1.0])
    assert (one["se2"], one["upper"], one["upper_met"], one["lower"], one["lower_met"], one["to_oracle_met"]) == (
        None, None, None, None, False, True)  # fmt: skip
    # no oracle run: nothing stricter applies
    assert rule_targets([1.0, 2.0], [], [])["applies"] is False
