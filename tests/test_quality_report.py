"""The generated prose of the accuracy reports (studies/quality reading, reading_short,
report_collapses; studies/quality/pairs reading): exact sentences from synthetic run files, so
that a number in the prose cannot drift from the files, and collapsed runs are marked."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("matplotlib")

from studies.quality.collapses import (  # noqa: E402
    COMMAND,
    CONTROL,
    Trace,
    collapse_epochs,
    control_file,
    dip_epochs,
    events,
    largest_weight,
    seta_window,
)
from studies.quality.configs import conv_cfg, conv_full, conv_run_id  # noqa: E402
from studies.quality.layout import Layout  # noqa: E402
from studies.quality.reading import readings, report_readings, report_results_table, summary  # noqa: E402
from studies.quality.report_converged import report_converged  # noqa: E402

SETA = {"alpha": 0.5, "k": 10, "r": 0.2}


def _run(cfg: dict, seed: int, accs: list[float], pruned: float, loss: float = 1.0, sw: dict | None = None) -> dict:
    n, kept = 45000, round(45000 * (1 - pruned))
    epochs = [{"epoch": e, "phase": "prune", "n": n, "kept": kept, "streamed": kept, "backprop": kept,
               "train_loss": loss, "seconds": 20.0, "other_cpu": 0.0, "load1": 1.0, "samples": kept * (e + 1),
               "train_seconds": 20.0 * (e + 1), "test_acc": a} for e, a in enumerate(accs)]  # fmt: skip
    r = {"dataset": "cifar10", **cfg, "seed": seed, "epochs": epochs, "pruned": pruned, "pruned_backprop": pruned,
         "val_acc": accs[-1], "test_acc": accs[-1], "seconds": 100.0, "library_rev": "abc1234"}  # fmt: skip
    if sw:
        r["software"] = sw
    return r


def _study(seta_s1: list[float] | None = None, seta_s0: list[float] | None = None) -> list[dict]:
    """A converged no-augmentation study at E = 4, 2 seeds: full data at 4, 8 and 2 epochs,
    dynamic random and SeTa at 50%. SeTa is 3.00 and 1.50 below full data by seed."""
    full, ran = (lambda n: conv_full(4, n, augment=False)), conv_cfg(4, "random", {"r": 0.5}, "p50", augment=False)
    seta = conv_cfg(4, "seta", SETA, "p50", augment=False)
    return [
        _run(full(4), 0, [0.6, 0.7, 0.75, 0.80], 0.0, 0.05), _run(full(4), 1, [0.6, 0.7, 0.75, 0.79], 0.0, 0.07),
        _run(full(8), 0, [0.6] * 7 + [0.801], 0.0, 0.01), _run(full(8), 1, [0.6] * 7 + [0.792], 0.0, 0.03),
        _run(full(2), 0, [0.6, 0.795], 0.0), _run(full(2), 1, [0.6, 0.80], 0.0),
        _run(ran, 0, [0.6, 0.7, 0.75, 0.79], 0.5), _run(ran, 1, [0.6, 0.7, 0.75, 0.78], 0.5),
        _run(seta, 0, seta_s0 or [0.6, 0.7, 0.75, 0.77], 0.5), _run(seta, 1, seta_s1 or [0.6, 0.7, 0.75, 0.775], 0.5),
    ]  # fmt: skip


def _layout(tmp_path: Path, runs: list[dict], reruns: list[dict] = ()) -> Layout:
    layout = Layout(results=tmp_path / "docs" / "quality-runs", out=tmp_path / "out")
    layout.converged.mkdir(parents=True)
    for r in runs:
        (layout.converged / f"{conv_run_id(r, r['seed'])}.json").write_text(json.dumps(r))
    if reruns:
        (layout.results / "converged-reruns").mkdir()
        for r in reruns:
            (layout.results / "converged-reruns" / f"{conv_run_id(r, r['seed'])}.json").write_text(json.dumps(r))
    return layout


# --------------------------------------------------------------------------------- the rule
def test_a_collapse_is_chance_plus_two_points_after_chance_plus_ten() -> None:
    assert collapse_epochs([0.5, 0.1, 0.6, 0.12, 0.7], 0.1) == [1, 3]
    assert collapse_epochs([0.5, 0.1201], 0.1) == []  # above chance + 2 points
    assert collapse_epochs([0.1, 0.15, 0.1, 0.19, 0.2, 0.11], 0.1) == [5]  # had not learned before epoch 4
    assert dip_epochs([0.5, 0.1, 0.15, 0.2, 0.21], 0.1) == [2, 3]
    assert collapse_epochs([0.28, 0.017, 0.32], 0.001) == [1]  # pairs: R@1 over 1,000 pairs


def test_the_plan_before_a_collapse_follows_the_policy_rule() -> None:
    assert seta_window({"alpha": 0.4, "k": 10, "r": 0.3}, 6, "prune") == "clusters 6-9 of 10 (hard end)"
    assert seta_window({"alpha": 0.6, "k": 5, "r": 0.1}, 42, "prune") == "clusters 0-2 of 5 (easy end)"
    assert seta_window({"alpha": 0.3, "k": 10}, 4, "prune") == "clusters 4-6 of 10 (middle)"
    assert seta_window({"alpha": 0.6, "k": 10, "target_keep": 0.5}, 1, "prune") == (
        "clusters 1-6 of 10 (middle), band of 0.5 N centred on them"
    )
    assert seta_window(SETA, 0, "prune") == "every cluster (epoch 0)"
    assert seta_window(SETA, 5, "anneal") == "none (annealing)"
    assert largest_weight("infobatch", {"r": 0.5}, 9, "prune") == 2.0
    assert largest_weight("infobatch", {"r": 0.5}, 0, "prune") == 1.0
    assert largest_weight("infobatch", {"r": 0.5}, 33, "anneal") == 1.0
    assert largest_weight("seta", SETA, 3, "prune") == 1.0


def test_the_collapse_table_gives_the_plan_lr_losses_and_the_experiments_of_the_epoch() -> None:
    from studies.quality.report_collapses import collapse_rows

    t = Trace("cifar10-E36-infobatch-p30-r0.5-s0", "converged", "infobatch", {"r": 0.5}, 0, [0.6, 0.7, 0.1, 0.65],
              0.1, [1.0, 0.7, 0.64, 0.63], ["prune"] * 4, [1.5, 1.1, 0.98, 1.62], lambda t: 0.01 * t, 0.65,
              True)  # fmt: skip
    col, dips = events([t])
    assert [e.epoch for e in col] == [2] and dips == []
    assert collapse_rows(col, [entry(t.run, 3, 5)])[0][11:] == ["-", "-", "-"]  # no entry for the epoch
    assert collapse_rows(col, [entry(t.run, 3, 5), entry(t.run, 2, 1)]) == [[
        "`cifar10-E36-infobatch-p30-r0.5-s0`", "converged", 2, "70.0 -> **10.0** -> 65.0", "65.0", "prune, 0.64",
        "-", "2", "0.02 -> 0.03", "1.10 -> 0.98 -> 1.62", "yes", "1 (kept 129 = 1 x 128 + 1), lr 0.0850",
        "`--run x --until 3`", "`r.json`",
    ]]  # fmt: skip


def entry(run: str, epoch: int, final_batch: int) -> dict:
    """A collapses.json entry as collapses.py writes it (the keys the report reads)."""
    return {"run_id": run, "epoch": epoch, "acc": 0.1,
            "prev_epoch_plan": {"kept": 128 + final_batch, "final_batch": final_batch},
            "lr": {"first_step": 0.09, "final_batch_step": 0.085},
            "experiment": {"command": [f"{COMMAND} --run x --until 3", f"{COMMAND} {CONTROL}"],
                           "result_files": ["d/r.json", f"d/{control_file()}"], "outcome": ["o"]}}  # fmt: skip


# ------------------------------------------------------------------- converged: table, prose
def test_the_summary_states_the_gaps_paired_by_seed_against_the_seed_spread(tmp_path: Path) -> None:
    layout = _layout(tmp_path, _study())
    assert summary(layout) == [
        "Once full data has converged (CIFAR-10, E = 4, no augmentation, 2 seeds), 1 of 2 pruned configurations "
        "(50% pruned) stayed within the noise of full data's accuracy at E (the seed spread, 1.00 point, or 2 SE of "
        "their paired gaps); SeTa p50 (-2.25; by seed -3.00, -1.50) was below it on every seed, by more than the "
        "spread and 2 SE. Full data trained for 2 of the 4 "
        "epochs scored 79.75% (+0.25 against E); no pruned configuration beat full data at equal compute by more "
        "than the seed spread, and no loss-guided one beat dynamic random by more than it."
    ]


def test_a_gap_beyond_the_seed_spread_on_every_seed_is_a_deficit_and_one_within_is_not(tmp_path: Path) -> None:
    """SeTa -1.25 (by seed -1.50, -1.00) against a seed spread of 1.00: a deficit; dynamic random -1.00
    (-1.00, -1.00): within the spread, though below on every seed."""
    rd = readings(_layout(tmp_path, _study(seta_s0=[0.6, 0.785], seta_s1=[0.6, 0.78])))[0]
    assert [(c[1], c[3], c[4]) for c in map(rd.cells, rd.pruned)] == [
        ("dynamic random p50", "-1.00 (-1.00, -1.00)", "below on every seed, within the seed spread"),
        ("SeTa p50", "-1.25 (-1.50, -1.00)", "below on every seed, by more than the seed spread"),
    ]
    assert "; SeTa p50 (-1.25; by seed -1.50, -1.00) was below it on every seed, by more than the spread and 2 SE." in (
        rd.one_line()
    )


def test_a_gap_beyond_the_seed_spread_but_within_2_se_of_its_paired_gaps_is_not_a_deficit(tmp_path: Path) -> None:
    """SeTa -1.30 against a seed spread of 1.00, below on every seed (-2.20, -0.40), but its paired gaps'
    2 SE is 1.80 (with 2 seeds their difference): the mean does not clear 2 SE, so it is not read as below."""
    rd = readings(_layout(tmp_path, _study(seta_s0=[0.6, 0.778], seta_s1=[0.6, 0.786])))[0]
    assert [(c[1], c[4]) for c in map(rd.cells, rd.pruned)] == [
        ("dynamic random p50", "below on every seed, within the seed spread"),
        ("SeTa p50", "below on every seed, by more than the seed spread, within 2 SE of its paired gaps"),
    ]
    line = rd.one_line()
    assert "2 of 2 pruned configurations (50% pruned) stayed within the noise of full data's accuracy at E" in line
    assert "was below it" not in line


def test_reruns_are_compared_only_with_the_rerun_of_full_data(tmp_path: Path) -> None:
    sw = {"cpu": "CPU X", "cpu_capability": "AVX2", "torch": "2.0"}
    reruns = [_run(conv_full(4, 4, augment=False), 0, [0.6, 0.81], 0.0, sw=sw),
              _run(conv_cfg(4, "seta", SETA, "p50", augment=False), 0, [0.6, 0.79], 0.5, sw=sw)]  # fmt: skip
    layout = _layout(tmp_path, _study(), reruns)
    text = summary(layout)[0]
    assert (
        ". In 2 runs repeated later as a second set (on average +1.50 above the same runs of the study, so compared "
        "only among themselves), every rerun pruned configuration was below the rerun of full data: SeTa p50 -2.00 "
        "(seed 0). Full data"
    ) in text
    rd = readings(layout)[0]
    lines = rd.rerun_lines()
    assert rd.second_set_cell(rd.pruned[1]) == "-2.00 (seed 0)" and rd.second_set_cell(rd.pruned[0]) == "-"
    assert "| `converged-reruns/` | 2 | abc1234 (2) | CPU X, cpu_capability AVX2, torch 2.0 |" in lines
    assert "| `converged/cifar10-noaug-E4-*` | 10 | abc1234 (10) | not recorded |" in lines
    assert "| SeTa p50 (0) | 77.00 | 79.00 | +2.00 |" in lines


def test_a_collapsed_run_is_marked_in_the_table_the_reading_and_the_summary(tmp_path: Path) -> None:
    layout = _layout(tmp_path, _study(seta_s1=[0.6, 0.1, 0.75, 0.775]))
    layout.doc.write_text("<!-- converged:begin -->\n<!-- converged:end -->\n<!-- converged-reading:begin -->\n"
                          "<!-- converged-reading:end -->\n<!-- summary:begin -->\n<!-- summary:end -->\n")  # fmt: skip
    layout.results_doc.write_text("# r\n<!-- quality-summary:begin -->\nold\n<!-- quality-summary:end -->\ntail\n")
    report_converged(layout)
    report_readings(layout)
    report_results_table(layout)
    doc = layout.doc.read_text()
    assert (
        "| seta p50 † | alpha=0.5, k=10, r=0.2 | 2 | 50.0 ± 0.0 | 77.25 ± 0.35 | -2.25 | 2 | 79.75 ± 0.35 | -2.50 "
        "| -1.25 | **s1: e1 10.0%**; without it: 77.00 (seed 0), -3.00 vs full at E (same seeds) |"
    ) in doc
    assert (
        "| CIFAR-10, E = 4, no augmentation | SeTa p50 † | 50.0 | -2.25 (-3.00, -1.50) | below on every seed, by more "
        "than the seed spread | -2.50 (-2.50) against 2 epochs | one seed, not resolved | -1.25 (beyond the seed "
        "spread) | - | collapsed: seed 1 at epoch 1; without it -3.00 |"
    ) in doc.splitlines()
    assert (  # the instability scan's mark, and the file under the table
        "† a run of this configuration collapsed to chance, fell 20 points or more in one epoch, diverged or was cut "
        "short (instability scan, `docs/quality-runs/instability.json`): `cifar10-noaug-E4-seta-p50-alpha0.5-k10-r0.2-"
        "s1.json` (collapse at e1; drop at e1 (60.0 -> 10.0))."
    ) in doc.splitlines()
    assert sum(line.startswith("| seta p50 †") for line in doc.splitlines()) == 1
    s = summary(layout)[0]
    assert "; SeTa p50 (seed 1) includes a run whose test accuracy fell to chance during training, counted in " in s
    results = layout.results_doc.read_text()  # docs/results.md's table: the same numbers, a row per configuration
    assert results.startswith("# r\n<!-- quality-summary:begin -->\n| study | configuration | pruned % |")
    assert results.endswith("<!-- quality-summary:end -->\ntail\n")
    assert (
        "| CIFAR-10, E = 4, no augmentation | SeTa p50 † | 50.0 | -2.25 (-3.00, -1.50) | below on every seed, by more "
        "than the seed spread | -2.50 (-2.50) against 2 epochs | one seed, not resolved | -1.25 (beyond the seed "
        "spread) | - | collapsed: seed 1 at epoch 1; without it -3.00 |"
    ) in results
    assert (
        "* CIFAR-10, E = 4, no augmentation (seeds 0, 1): full data has converged (E to 2E); full data at E 79.50%; "
        "seed spread 1.00 point. Full data trained for 2 of the 4 epochs scored 79.75% (+0.25 against E).\n"
    ) in results
    report_converged(layout)
    report_readings(layout)
    report_results_table(layout)
    assert layout.doc.read_text() == doc and layout.results_doc.read_text() == results  # byte for byte


def test_a_study_still_improving_names_its_collapsed_runs_and_leaves_them_out(tmp_path: Path) -> None:
    full = [_run(conv_full(4, 4), 0, [0.6, 0.8], 0.0), _run(conv_full(4, 8), 0, [0.6, 0.82], 0.0)]
    pruned = [_run(conv_cfg(4, "random", {"r": 0.5}, "p50"), 0, [0.6, 0.79], 0.5),
              _run(conv_cfg(4, "infobatch", {"r": 0.5}, "p30"), 0, [0.6, 0.1, 0.7], 0.3)]  # fmt: skip
    layout = _layout(tmp_path, full + pruned)
    assert summary(layout) == [
        "Where full data still improves (CIFAR-10, E = 4, seed 0 so far), pruning cost 1.00 to 1.00 points against "
        "full data at E in the 1 pruned configurations without a collapsed run; InfoBatch p30 (seed 0) includes a "
        "run whose test accuracy fell to chance during training, not read as a policy result."
    ]
    rd = readings(layout)[0]
    assert rd.cells(rd.pruned[1])[3:] == ["-10.00 (-10.00)", "one seed, not resolved", "-", "-", "-9.40", "-",
                                          "collapsed: seed 0 at epoch 1; no seed left without it"]  # fmt: skip
    assert rd.findings()[:5] == [
        "#### CIFAR-10, E = 4", "", f"**So far.** {summary(layout)[0]}", "",
        "* No equal-compute run has finished yet: nothing yet about pruning against fewer epochs.",
    ]  # fmt: skip


def test_equal_compute_is_compared_only_between_runs_of_one_machine(tmp_path: Path) -> None:
    """Seed 0's pruned run ran on machine A and its equal-compute run on machine B: only seed 1
    (both on A) is compared, and seed 0 is named as left out, in the table and the reading."""
    a, b = {"cpu": "CPU A", "torch": "2.13.0"}, {"cpu": "CPU B", "torch": "2.13.0"}
    full, ran = (lambda n: conv_full(4, n)), conv_cfg(4, "random", {"r": 0.5}, "p50")
    runs = [_run(full(4), 0, [0.6, 0.80], 0.0, sw=a), _run(full(4), 1, [0.6, 0.81], 0.0, sw=a),
            _run(full(8), 0, [0.6, 0.82], 0.0, sw=a),
            _run(full(2), 0, [0.6, 0.70], 0.0, sw=b), _run(full(2), 1, [0.6, 0.77], 0.0, sw=a),
            _run(ran, 0, [0.6, 0.79], 0.5, sw=a), _run(ran, 1, [0.6, 0.78], 0.5, sw=a)]  # fmt: skip
    layout = _layout(tmp_path, runs)
    reading = readings(layout)[0]
    study = reading.s
    rs = study.groups[conv_run_id(ran, 0).rsplit("-s", 1)[0]]
    n, eq, gaps, other = study.equal_gap(rs)
    assert (n, len(eq), other) == (2, 2, [0])
    assert list(gaps) == [1] and gaps[1] == pytest.approx(1.0)
    assert study.row(rs)[8] == "+1.00 (seed 1; seed 0: other machine)"
    assert reading.cells(rs)[5:7] == ["+1.00 (+1.00) against 2 epochs; seed 0: other machine", "one seed, not resolved"]
    assert reading.improving_line().endswith(
        "Against full data trained for fewer epochs at the same compute (runs of one machine, seeds without a "
        "collapse), the 1 pruned configurations landed +1.00 to +1.00 points (one seed each: not resolved)."
    )


# ----------------------------------------------------------------------------------- pairs
def _pair_run(seed: int, r1: list[float], share: list[float], kept_mis: list[float]) -> dict:
    rows = [{"epoch": e, "phase": "prune" if e < 3 else "anneal", "kept": 1000, "n": 1000, "trained": 1000,
             "mismatched_trained": int(1000 * s), "mismatched_share": s, "loss": 2.0, "i2t_r1": a, "t2i_r1": a}
            for e, (a, s) in enumerate(zip(r1, share))]  # fmt: skip
    checks = [{"epoch": e, "plan_loss_clean": None if e == 0 else 2.0 - e / 2,
               "plan_loss_mismatched": None if e == 0 else 7.0, "kept_share_clean": 1.0, "kept_share_mismatched": k}
              for e, k in enumerate(kept_mis)]  # fmt: skip
    return {"study": "pairs", "noise": 0.2, "policy": "seta", "params": {"alpha": 0.6, "k": 5, "r": 0.0},
            "label": "p30", "seed": seed, "rows": rows, "i2t_r1": r1[-1], "t2i_r1": r1[-1], "pruned": 0.3,
            "checks": checks, "data": {"test": 1000}, "train": {"epochs": 4, "lr": 0.002}}  # fmt: skip


def test_the_pairs_reading_gives_each_setting_its_share_its_window_and_its_collapse() -> None:
    import studies.quality.pairs as ps

    seta = [_pair_run(0, [0.2, 0.3, 0.017, 0.35], [0.2, 0.22, 0.94, 0.2], [1.0, 0.69, 0.94, 1.0]),
            _pair_run(1, [0.2, 0.3, 0.25, 0.33], [0.2, 0.21, 0.9, 0.2], [1.0, 0.7, 0.9, 1.0])]  # fmt: skip
    full = [{**_pair_run(s, [0.2, 0.3, 0.4, 0.5], [0.2] * 4, [1.0] * 4), "policy": "full", "params": {},
             "label": "full"} for s in (0, 1)]  # fmt: skip
    groups = ps.group_runs(full + seta)
    assert ps.collapse_cell(groups, 0.2, seta) == "**s0: e2 1.7%**; without them: mean R@1 33.0"
    lines = ps.reading(groups)
    assert lines == [
        "**Mismatched pairs** have the highest losses (full data's plans: 7.00-7.00 against 0.50-1.50 for clean "
        "pairs once training has begun): although a pair's loss depends on the rest of its batch, it finds them. "
        "But the loss-guided policies treat high loss as informative:",
        "",
        "| data | policy (setting) | pruned % | mean R@1 minus dynamic random's | mismatched % of the pairs trained "
        "in its pruning epochs | collapse |",
        "| --- | --- | --- | --- | --- | --- |",
        # no dynamic random to compare with; e2 (clusters 2-4 of 5) is the hard end, seed 0 fell to 1.7% there
        "| 20% mismatched | SeTa (alpha = 0.6, k = 5, r = 0.0) † | 30.0 | - | 21.5 to 92.0 with its window; the most "
        "in e2, whose window reaches the hardest cluster | fell to chance (0.1%): s0 e2 1.7%; every seed recovered "
        "by the last epoch |",
        "",
        "† a run of this configuration collapsed to chance, fell 20 points or more in one epoch, diverged or was cut "
        "short (instability scan, `docs/quality-runs/instability.json`): `pairs-noise20-seta-p30-alpha0.6-k5-r0.0-"
        "seed0.json` (collapse at e2; drop at e2 (30.0 -> 1.7)).",
        "",
    ]


def test_the_collapse_section_counts_runs_per_policy_and_says_the_short_study_cannot_show_one() -> None:
    from studies.quality.report_collapses import collapse_section

    def trace(run: str, study: str, policy: str, metric: list[float]) -> Trace:
        return Trace(run, study, policy, {}, 0, metric, 0.1, [1.0] * len(metric), ["prune"] * len(metric),
                     [1.0] * len(metric), lambda t: 0.1, metric[-1])  # fmt: skip

    # the same run id in two folders is two runs: only the one that collapsed counts
    traces = [trace("a-s0", "converged", "seta", [0.5, 0.1, 0.6]), trace("a-s0", "converged-same-order", "seta",
              [0.5, 0.15, 0.6]), trace("f-s0", "converged", "full", [0.5, 0.6, 0.7])]  # fmt: skip
    lines = collapse_section(traces, [], 7, [entry("a-s0", 1, 1), entry("x-s0", 4, 3)])
    assert lines[0].startswith("**2 epochs of the converged CIFAR-10 runs fell to chance, each after a final batch of "
                               "1 to 3 samples** (the epoch's kept count modulo 128).")  # fmt: skip
    assert lines[6:9] == [
        "| CIFAR-10, test accuracy (`docs/quality-runs/{converged,converged-same-order,converged-reruns}/`) | 3 | 10% "
        "| 1 | 1 | full 0 of 1, seta 1 of 2 | 1 in 1 runs |",
        "| the short study (`docs/quality-runs/{cifar10,sst2}-*.json`): test accuracy at the end only, so a collapse "
        "inside a run cannot be seen | 7 | - | - | - | - | - |",
        "",
    ]
    assert lines[11] == (
        "| `a-s0` | converged | 1 | 50.0 -> **10.0** -> 60.0 | 60.0 | prune, 1.00 | clusters 1-5 of 10 (middle) | 1 "
        "| 0.1 -> 0.1 | 1.00 -> 1.00 -> 1.00 | not kept | 1 (kept 129 = 1 x 128 + 1), lr 0.0850 | `--run x --until 3` "
        "| `r.json` |"
    )
    assert lines[13] == (
        f"The experiments on every collapse also cite the full-data control `{CONTROL}` (`{control_file()}`). Epochs "
        "at chance that are not a collapse by the rule: `x-s0` epoch 4."
    )
    assert lines[-2] == "| `a-s0` | converged-same-order | 1 | 15.0% |"  # a dip
    assert collapse_section(traces[2:], [], 7, [])[0] == "No epoch of the converged CIFAR-10 runs fell to chance."


def test_the_noise_alone_costs_the_entropy_of_the_label_distribution() -> None:
    from studies.quality.reading_short import noise_entropy

    assert f"{noise_entropy(0.4, 10):.2f} / {noise_entropy(0.4, 2):.2f}" == "1.55 / 0.67"
