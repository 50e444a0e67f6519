"""docs/results.md's table of the converged study (between ``<!-- quality-summary:begin -->`` and
``<!-- quality-summary:end -->``), from the same run files and by the same rules as the summary at the
top of docs/quality.md (``reading.summary``): one row per study and pruned configuration with its gap
to full data at E paired by seed, where that gap sits against the noise as the reading sorts it (the
seed spread and 2 SE of the paired gaps; studies whose full data has converged), its gap at equal compute
and against dynamic random, and the seeds whose test accuracy fell to chance; each study's facts (seed
spread, full data at E, the second set, shorter full data) in a list below the table.
"""

from __future__ import annotations

from benchmarks.instability import MARK, footnote, unstable

from .docs import and_list, row, splice
from .layout import Layout
from .reading import Reading, by_seed, gap, mean_gap, name, paired, pct, readings, seed_list, seeds_of
from .report_converged import pruned_pct, run_name


def _row(rd: Reading, rs: list[dict]) -> str:
    p = paired(rs, rd.s.full)
    g = rd.gap_full(rs)
    if not rd.converged():
        spread = "-"  # judged against the spread once full data has converged (as the summary does)
    elif rd.noise is None:
        spread = "no seed spread yet"
    else:  # the reading's own sorting of this configuration (seed spread, 2 SE of the paired gaps)
        spread = rd.classify([(rs, g, p)])[0].split(": ")[0]
    eq = rd.equal_without_collapses(rs)
    n = rd.s.equal_compute(rs)[0]
    m = mean_gap(eq)
    eq_cell = f"{gap(m)} ({by_seed(eq)}) against {n} epochs" if m is not None else "-"
    v = rd.s.vs_random_value(rs)
    bad = rd.collapsed(rs)
    note = "-"
    if bad:
        without = rd.s.without_collapsed(rs)[1]
        note = f"test accuracy fell to chance: seed {seeds_of(bad)}"
        note += "; no seed left without it" if without is None else f"; without it {gap(without)}"
    mark = f" {MARK}" if any(unstable(r) for r in rs) else ""  # the instability scan
    return row([rd.s.title(), name(rs[0]) + mark, f"{pruned_pct(rs):.1f}", f"{gap(g)} ({by_seed(p)})", spread,
                eq_cell, "-" if v is None else gap(v), note])  # fmt: skip


def _facts(rd: Reading) -> str:
    state = {True: "full data has converged (E to 2E)", False: "full data still improves from E to 2E"}
    text = (f"* {rd.s.title()} ({seed_list(rd.s.results)}"
            f"{'' if rd.converged() else ' so far'}): {state.get(rd.converged(), 'no run at 2E yet')}; full data at "
            f"E {pct(rd.full_acc)}%")  # fmt: skip
    if rd.noise is not None and rd.converged():
        text += f"; seed spread {pct(rd.noise)} point"
    if rd.second_set():
        text += (f". A second set of {len(rd.reruns)} runs repeated later (on average {gap(rd.rerun_shift())} above "
                 f"the same runs of the study, so compared only among themselves), against its own full data: "
                 f"{rd.second_set()}")  # fmt: skip
    if rd.converged():
        text += rd.shortest_note()
    bad = [rs for rs in rd.pruned if rd.collapsed(rs)]
    if bad and rd.converged():
        text += f". {and_list([name(rs[0]) for rs in bad])}: a run fell to chance, counted in its gap at E"
    return text + "."


def results_lines(layout: Layout) -> list[str]:
    """The table and the studies' facts (the studies with full data at E and a pruned configuration)."""
    rd = [r for r in readings(layout) if r.s.full and r.pruned and r.converged() is not None]
    if not rd:
        return ["(no converged-study run with full data at E and at 2E yet)"]
    L = [
        "| study | configuration | pruned % | minus full data at E (by seed) | against the noise (seed spread, 2 SE) "
        "| minus full data at equal compute (by seed; seeds without a collapse) | minus dynamic random at the same "
        "pruned % | runs that collapsed |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rd:
        L += [_row(r, rs) for rs in r.pruned]
    files = [f"{r.s.section.folder}/{run_name(x)}.json" for r in rd for rs in r.pruned for x in rs
             if unstable(x)]  # fmt: skip
    return [*L, "", *([footnote(files), ""] if files else []), *[_facts(r) for r in rd]]


def report_results_table(layout: Layout) -> None:
    """Rewrite docs/results.md's table of the converged study (where the doc has its markers)."""
    splice(layout.results_doc, "<!-- quality-summary:begin -->", "<!-- quality-summary:end -->", results_lines(layout),
           skip_missing=True)  # fmt: skip
