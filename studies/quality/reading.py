"""The reading of the converged study ("Reading the converged study", the summary at the top of
docs/quality.md) and docs/results.md's table of it, generated from the run files, so that prose and
tables cannot drift apart. Both docs show one table, a row per pruned configuration (``config_table``).

Rules the reading follows (docs/quality.md states them above the reading):

* *seed spread*: the largest difference between the two seeds of one configuration of the
  study; a gap is *beyond the seed spread* when its absolute value is larger;
* *paired by seed*: a pruned run minus the reference run of the same seed; a configuration is
  *below on every seed* when every paired difference is negative;
* *resolved*: a configuration is read as below (above) its reference only when it is below
  (above) on every seed, its gap is beyond the seed spread, and the mean of its paired gaps
  exceeds 2 SE of them (SE = their SD (ddof 1) / sqrt(seeds); with 2 seeds, half their
  difference): the project's bar, "mean - 2 SE clears it";
* runs of different machines (``machine.machine_of``: the recorded CPU and packages, or not
  recorded) or different run sets (``converged-reruns``) are never compared with each other:
  a rerun is compared with the rerun of full data of its own set;
* a configuration with a collapsed seed (``collapses.py``) is named as such, and its gap is
  given without the collapsed seed where another seed is left.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable

import numpy as np

from studies.quality import docs
from studies.quality.docs import ORDER, and_list, load_results, mean_acc, row, table_head
from studies.quality.instability import MARK, events_text, findings, footnote, unstable
from studies.quality.layout import Layout
from studies.quality.machine import machine_of
from studies.quality.report import splice
from studies.quality.report_converged import (
    CURRENT,
    SAME_ORDER,
    SHARED,
    Study,
    config_name,
    other_share,
    pruned_pct,
    run_name,
    studies,
)

RERUNS = "converged-reruns"
CRITERION = 0.5  # full data has converged when every seed gains at most this from E to 2E


def pct(x: float) -> str:
    return f"{x:.2f}"


def gap(x: float) -> str:
    return f"{x:+.2f}"


def name(r0: dict) -> str:
    """The configuration's name in prose: ``SeTa p30``, ``SeTa `target_keep```, ``dynamic random p50``."""
    if r0["policy"] == "full":
        return f"full data, {r0['n_epochs']} epochs"
    if "target_keep" in r0["params"]:
        return "SeTa `target_keep`"
    return {"seta": "SeTa", "infobatch": "InfoBatch", "random": "dynamic random"}.get(r0["policy"], r0["policy"]) + (
        f" {r0['label']}"
    )


def acc(r: dict) -> float:
    return 100 * r["test_acc"]


def paired(rs: list[dict], ref: list[dict] | None) -> dict[int, float]:
    """seed -> test accuracy minus the reference run's of the same seed (seeds in both)."""
    by = {r["seed"]: r for r in ref or []}
    return {r["seed"]: acc(r) - acc(by[r["seed"]]) for r in rs if r["seed"] in by}


def beyond_2se(p: dict[int, float]) -> bool:
    """The mean of the paired gaps ``p`` exceeds 2 SE of them (at least 2 seeds; SE = SD (ddof 1) /
    sqrt(seeds), with 2 seeds half their difference)."""
    if len(p) < 2:
        return False
    v = np.array(list(p.values()), dtype=np.float64)
    return abs(float(v.mean())) > 2 * float(v.std(ddof=1)) / math.sqrt(len(v))


def mean_gap(gaps: dict[int, float]) -> float | None:
    """The mean of gaps paired by seed (None without any)."""
    return float(np.mean(list(gaps.values()))) if gaps else None


def by_seed(p: dict[int, float]) -> str:
    return ", ".join(gap(v) for _, v in sorted(p.items()))


def revision(r: dict) -> str:
    """The library revision a run file records (``?`` where none)."""
    return r.get("library_rev", "?")


def slashed(seeds: Iterable[int]) -> str:
    """``0/1``: the seeds, sorted."""
    return "/".join(map(str, sorted(seeds)))


def span(xs: list[float], digits: int) -> str:
    """``1.02-1.05``: the range of ``xs``, one number where both ends round alike."""
    lo, hi = f"{min(xs):.{digits}f}", f"{max(xs):.{digits}f}"
    return lo if lo == hi else f"{lo}-{hi}"


def seed_list(results: list[dict]) -> str:
    """``seed 0`` or ``seeds 0, 1``: the seeds a study's runs have."""
    seeds = sorted({r["seed"] for r in results})
    return f"seed{'s' if len(seeds) > 1 else ''} {', '.join(map(str, seeds))}"


def side(p: dict[int, float]) -> str:
    """'below on every seed' / 'above on every seed' / 'seeds on both sides' / 'one seed'."""
    if len(p) < 2:
        return "one seed"
    if all(v < 0 for v in p.values()):
        return "below on every seed"
    if all(v > 0 for v in p.values()):
        return "above on every seed"
    return "seeds on both sides"


def machines_table(sets: list[tuple[str, list[dict]]]) -> list[str]:
    """Which machine and library revision each set of run files records (a row per machine)."""
    lines = table_head("| run files | runs | library revision (runs) | machine, as the file records it |")
    for where, rs in sets:
        for m in sorted({machine_of(r) for r in rs}):
            revs = Counter(revision(r) for r in rs if machine_of(r) == m)
            lines.append(row([where, str(revs.total()), ", ".join(f"{k} ({v})" for k, v in revs.most_common()), m]))
    return lines + [""]


class Reading:
    """The numbers of one converged study (one E, augmentation, model) and its reruns."""

    def __init__(self, study: Study, reruns: list[dict]) -> None:
        self.s = study
        self.E = study.E
        self.pruned = sorted(
            (rs for rs in study.groups.values() if rs[0]["policy"] != "full"),
            key=lambda rs: (ORDER[rs[0]["policy"]], rs[0]["label"]),
        )
        fulls = sorted(
            (rs for rs in study.groups.values() if rs[0]["policy"] == "full"), key=lambda rs: rs[0]["n_epochs"]
        )
        self.shorter = [rs for rs in fulls if rs[0]["n_epochs"] < self.E]  # full data, fewer epochs than E
        two = [rs for rs in study.groups.values() if len(rs) > 1]
        spreads = [(max(acc(r) for r in rs) - min(acc(r) for r in rs), rs) for rs in two]
        self.noise, self.noise_rs = max(spreads, key=lambda x: x[0]) if spreads else (None, None)
        self.sds = [float(np.std([acc(r) for r in rs], ddof=1)) for rs in two]
        self.reruns = sorted((r for r in reruns if run_name(r).startswith(f"cifar10-{study.tag}-")),
                             key=lambda r: (ORDER[r["policy"]], r["label"], r["seed"]))  # fmt: skip
        self.rerun_full = {r["seed"]: r for r in self.reruns if r["policy"] == "full" and r["n_epochs"] == self.E}
        self.rerun_random = {r["seed"]: r for r in self.reruns if r["policy"] == "random"}
        self.full2 = study.full_at(2 * self.E)

    def converged(self) -> bool | None:
        """Every seed with a run at E and 2E gains at most CRITERION (None without such a pair)."""
        p = paired(self.full2 or [], self.s.full)
        return None if not p else all(v <= CRITERION for v in p.values())

    def collapsed(self, rs: list[dict]) -> list[dict]:
        return self.s.collapses_of(rs)

    @property
    def full_acc(self) -> float:
        """Full data's mean test accuracy at E (the parts that use it are written only with it)."""
        assert self.s.full_acc is not None
        return self.s.full_acc

    def gap_full(self, rs: list[dict]) -> float:
        return mean_acc(rs) - self.full_acc

    def equal_without_collapses(self, rs: list[dict]) -> dict[int, float]:
        """seed -> gap to full data at equal compute, runs of one machine only, without the seeds
        whose pruned run collapsed."""
        bad = {r["seed"] for r in self.collapsed(rs)}
        return {k: v for k, v in self.s.equal_gap(rs)[2].items() if k not in bad}

    def beyond(self, x: float) -> bool:
        return self.noise is not None and abs(x) > self.noise + 1e-9

    def verdict(self, g: float, p: dict[int, float]) -> str:
        """Where a gap paired by seed sits against the noise: its side, then its size against the seed
        spread and 2 SE of the paired gaps; judged only once full data has converged ("-" before)."""
        if len(p) < 2:
            return "one seed, not resolved"
        if not self.converged():
            return "-"
        if self.noise is None:
            return "no seed spread yet"
        size = "within the seed spread" if not self.beyond(g) else "by more than the seed spread"
        return f"{side(p)}, {size}" + (
            ", within 2 SE of its paired gaps" if self.beyond(g) and not beyond_2se(p) else ""
        )

    def deficit(self, g: float, p: dict[int, float]) -> bool:
        """Below the reference on every seed, by more than the seed spread and beyond 2 SE (resolved)."""
        return side(p) == "below on every seed" and self.beyond(g) and beyond_2se(p)

    # ---------------------------------------------------------------- the second set (reruns)
    def rerun_pairs(self) -> list[tuple[dict, dict]]:
        """(rerun, the study's run of the same configuration and seed) for the reruns with such a run."""
        study_by = {run_name(r): r for r in self.s.results}
        return [(r, study_by[run_name(r)]) for r in self.reruns if run_name(r) in study_by]

    def rerun_shift(self) -> float:
        """The mean change of the reruns from the study's runs of the same configuration and seed."""
        return float(np.mean([acc(r) - acc(o) for r, o in self.rerun_pairs()]))

    def vs_rerun(self, ref: str) -> list[tuple[dict, float]]:
        """(pruned rerun, its test accuracy minus the rerun of ``ref`` (``full``: full data at E;
        ``random``: dynamic random) of the same seed), for the reruns of a seed with such a rerun."""
        by = self.rerun_full if ref == "full" else self.rerun_random
        return [(r, acc(r) - acc(by[r["seed"]])) for r in self.reruns
                if r["policy"] not in ("full", ref) and r["seed"] in by]  # fmt: skip

    def second_set(self) -> str:
        """'dynamic random p30 -1.25, SeTa p30 -1.15 (seed 0)': the reruns against their own full data;
        a rerun that the instability scan flags (or whose full-data rerun it flags) is marked and its
        events named."""
        parts = []
        for r, g in self.vs_rerun("full"):
            bad = [x for x in (r, self.rerun_full[r["seed"]]) if unstable(x)]
            note = "; ".join(f"{name(x)} {events_text(findings(x))}" for x in bad)
            parts.append(f"{name(r)} {gap(g)}" + (f" ({MARK} unstable rerun: {note})" if bad else ""))
        return f"{and_list(parts)} (seed {slashed(self.rerun_full)})" if parts else ""

    def second_set_runs(self, rs: list[dict]) -> list[tuple[dict, list[dict]]]:
        """(this configuration's rerun, the reruns it is held against: full data's and, for a loss-guided
        policy, dynamic random's of its seed) for each rerun the second-set column shows."""
        out = []
        for r in self.reruns:
            if config_name(r) == config_name(rs[0]) and r["seed"] in self.rerun_full:
                ran = self.rerun_random.get(r["seed"]) if r["policy"] != "random" else None
                out.append((r, [self.rerun_full[r["seed"]], *([ran] if ran else [])]))
        return out

    def second_set_cell(self, rs: list[dict]) -> str:
        """This configuration's reruns minus the rerun of full data / of dynamic random of their seed,
        marked where the instability scan flags one of the runs of the cell."""
        cells = []
        for r, (full, *ran) in self.second_set_runs(rs):
            mark = f" {MARK}" if any(unstable(x) for x in (r, full, *ran)) else ""
            cells.append(f"{gap(acc(r) - acc(full))}" + (f" / {gap(acc(r) - acc(ran[0]))}" if ran else "")
                         + f" (seed {r['seed']}){mark}")  # fmt: skip
        return "; ".join(cells) or "-"

    def rerun_lines(self) -> list[str]:
        if not self.reruns:
            return []
        changes = [acc(r) - acc(o) for r, o in self.rerun_pairs()]
        unpaired = [f"{name(r)} seed {r['seed']}" for r in self.reruns
                    if r["policy"] != "full" and r["seed"] not in self.rerun_full]  # fmt: skip
        L = [f"**Reruns.** {len(self.reruns)} runs of this study were trained again with the same configuration and "
             f"seed (`docs/quality-runs/{RERUNS}/`; machines and revisions below). Mean change "
             f"{gap(self.rerun_shift())} "
             f"({sum(c > CRITERION for c in changes)} of {len(changes)} above +{CRITERION}), full data's own rerun "
             "included, so they are kept as a second set: a rerun is compared with the rerun of full data of its seed "
             "only (the table's last columns)" + (f"; no full-data rerun pairs with {and_list(unpaired)}." if unpaired
                                                    else "."), ""]  # fmt: skip
        L += machines_table([(f"`converged/cifar10-{self.s.tag}-*`", self.s.results), (f"`{RERUNS}/`", self.reruns)])
        L += table_head("| run (seed) | study's run | rerun | change |")
        marked = []
        for r, o in self.rerun_pairs():
            marked += [(f"{RERUNS}/{run_name(r)}.json", r)] * unstable(r)
            marked += [(f"converged/{run_name(o)}.json", o)] * unstable(o)
            mark = f" {MARK}" if unstable(r) or unstable(o) else ""  # the instability scan
            L.append(row([f"{name(r)} ({r['seed']}){mark}", pct(acc(o)), pct(acc(r)), gap(acc(r) - acc(o))]))
        return L + [""] + ([footnote(marked), ""] if marked else [])

    # ---------------------------------------------------------------- what the study found
    def shortest_note(self) -> str:
        """'. Full data trained for 6 of the 20 epochs scored ...' where such a run exists, else ''."""
        if not self.shorter:
            return ""
        a = mean_acc(self.shorter[0])
        return (f". Full data trained for {self.shorter[0][0]['n_epochs']} of the {self.E} epochs scored {pct(a)}% "
                f"({gap(a - self.full_acc)} against E)")  # fmt: skip

    def one_line(self) -> str:
        """The summary of a converged study (top of docs/quality.md)."""
        items = [(rs, self.gap_full(rs), paired(rs, self.s.full)) for rs in self.pruned]
        below = [(rs, g, p) for rs, g, p in items if self.deficit(g, p)]
        seeds = max(len(rs) for rs in self.s.groups.values())
        pruned = span([pruned_pct(rs) for rs in self.pruned], 0)
        if self.noise is None:
            return (f"Full data has converged ({self.s.title()}); no configuration has two seeds yet, so no gap of "
                    f"its {len(items)} pruned configurations ({pruned}% pruned) is resolved.")  # fmt: skip
        text = (f"Once full data has converged ({self.s.title()}, {seeds} seeds), {len(items) - len(below)} of "
                f"{len(items)} pruned configurations ({pruned}% pruned) stayed within the noise of full data's "
                f"accuracy at E (the seed spread, {pct(self.noise)} point, or 2 SE of their paired gaps)")  # fmt: skip
        if below:
            text += "; " + and_list([f"{name(rs[0])} ({gap(g)}; by seed {by_seed(p)})" for rs, g, p in below])
            text += f" {'was' if len(below) == 1 else 'were'} below it on every seed, by more than the spread and 2 SE"
        if bad := [(rs, self.collapsed(rs)) for rs in self.pruned if self.collapsed(rs)]:
            text += ("; " + and_list([f"{name(rs[0])} (seed {slashed(r['seed'] for r in b)})" for rs, b in bad])
                     + f" {'includes a run' if len(bad) == 1 else 'include runs'} whose test accuracy fell to chance "
                     "during training, counted in these means")  # fmt: skip
        if self.second_set():
            text += (f". In {len(self.reruns)} runs repeated later as a second set (on average "
                     f"{gap(self.rerun_shift())} above the same runs of the study, so compared only among "
                     f"themselves), every rerun pruned configuration was below the rerun of full data: "
                     f"{self.second_set()}")  # fmt: skip
        text += self.shortest_note()
        eq = [g for rs in self.pruned if (g := mean_gap(self.s.equal_gap(rs)[2])) is not None]
        vr = [v for rs in self.pruned if (v := self.s.vs_random_value(rs)) is not None]
        if eq and not any(g > 0 and self.beyond(g) for g in eq):
            text += "; no pruned configuration beat full data at equal compute by more than the seed spread"
        if vr and not any(v > 0 and self.beyond(v) for v in vr):
            text += ", and no loss-guided one beat dynamic random by more than it"
        return text + "."

    def improving_line(self) -> str:
        """The summary of a study whose full data still improves from E to 2E (so far)."""
        ok = [rs for rs in self.pruned if not self.collapsed(rs)]
        bad = [rs for rs in self.pruned if self.collapsed(rs)]
        gaps = [self.gap_full(rs) for rs in ok]
        text = f"Where full data still improves ({self.s.title()}, {seed_list(self.s.results)} so far), "
        if gaps and max(gaps) < 0:
            text += (f"pruning cost {pct(-max(gaps))} to {pct(-min(gaps))} points against full data at E in the "
                     f"{len(ok)} pruned configurations without a collapsed run")  # fmt: skip
        elif gaps:
            text += (f"the {len(ok)} pruned configurations without a collapsed run landed {gap(min(gaps))} to "
                     f"{gap(max(gaps))} points from full data at E")  # fmt: skip
        else:
            text += "every pruned configuration includes a collapsed run"
        if bad:
            items = [f"{name(rs[0])} (seed {slashed(r['seed'] for r in self.collapsed(rs))}"
                     + ("" if (g := self.s.without_collapsed(rs)[1]) is None else f"; without it {gap(g)}") + ")"
                     for rs in bad]  # fmt: skip
            text += (f"; {and_list(items)} {'includes a run' if len(bad) == 1 else 'include runs'} whose test "
                     "accuracy fell to chance during training, not read as a policy result")  # fmt: skip
        if eq := [m for rs in self.pruned if (m := mean_gap(self.equal_without_collapses(rs))) is not None]:
            one = all(len(self.equal_without_collapses(rs)) < 2 for rs in self.pruned)
            text += (f". Against full data trained for fewer epochs at the same compute (runs of one machine, "
                     f"seeds without a collapse), the {len(eq)} pruned configurations landed {gap(min(eq))} to "
                     f"{gap(max(eq))} points" + (" (one seed each: not resolved)" if one else ""))  # fmt: skip
        return text + "."

    def findings(self) -> list[str]:
        """The study's part of the reading: what it found, then the facts the table does not hold (its
        convergence check is in the study's section above)."""
        L = [f"#### {self.s.title()}", "", f"**{'In one line' if self.converged() else 'So far'}.** "
             + (self.one_line() if self.converged() else self.improving_line()), ""]  # fmt: skip
        if self.noise_rs and self.converged():
            L.append(f"* Seed spread: up to {pct(self.noise)} point ({name(self.noise_rs[0])}); standard deviations "
                     f"{pct(min(self.sds))}-{pct(max(self.sds))}.")  # fmt: skip
        if len(self.shorter) > 1 and self.converged():
            accs = [mean_acc(rs) for rs in self.shorter]
            low, best = min(self.shorter, key=mean_acc), max(self.shorter, key=mean_acc)
            slack = all(self.full_acc - a <= (self.noise or 0) for a in accs)
            L.append(f"* Full data at {self.shorter[0][0]['n_epochs']}-{self.shorter[-1][0]['n_epochs']} epochs (the "
                     f"equal-compute references) spans {pct(max(accs) - min(accs))} point (best: {best[0]['n_epochs']}"
                     f" epochs; lowest: {low[0]['n_epochs']} epochs at {pct(mean_acc(low))}), so the length a pruned "
                     "run is held against moves its gap by up to that much"
                     + (f"; each is within the seed spread of full data at E or above it: the {self.E}-epoch "
                        "schedule has slack." if slack else "."))  # fmt: skip
        if not any(self.s.equal_compute(rs)[1] for rs in self.pruned):
            L.append("* No equal-compute run has finished yet: nothing yet about pruning against fewer epochs.")
        if any(rs[0]["policy"] == "random" and self.collapsed(rs) for rs in self.s.groups.values()):
            L.append("* Dynamic random's points (the interpolation against it) include a run that collapsed.")
        return L + [""] + self.rerun_lines()

    def cells(self, rs: list[dict]) -> list[str]:
        """One row of ``config_table``: the configuration against full data at E, at equal compute and
        dynamic random, where each gap sits against the noise, its second set and its collapses."""
        p, eq = paired(rs, self.s.full), self.equal_without_collapses(rs)
        n, _, _, other = self.s.equal_gap(rs)
        left = f"; seed {slashed(other)}: other machine" if other else ""
        m = mean_gap(eq)
        eq_cell = f"-{left}" if m is None else f"{gap(m)} ({by_seed(eq)}) against {n} epochs{left}"
        v = self.s.vs_random_value(rs)
        v_cell = "-" if v is None else gap(v) + (f" ({'beyond' if self.beyond(v) else 'within'} the seed spread)"
                                                 if self.converged() and self.noise is not None else "")  # fmt: skip
        note = "-"
        if bad := self.collapsed(rs):
            without = self.s.without_collapsed(rs)[1]
            at = [f"seed {r['seed']} at epoch {', '.join(map(str, self.s.collapsed[run_name(r)]))}" for r in bad]
            note = f"collapsed: {and_list(at)}"
            note += "; no seed left without it" if without is None else f"; without it {gap(without)}"
        mark = f" {MARK}" if any(unstable(r) for r in rs) else ""  # the instability scan
        return [self.s.title(), name(rs[0]) + mark, f"{pruned_pct(rs):.1f}", f"{gap(self.gap_full(rs))} ({by_seed(p)})",
                self.verdict(self.gap_full(rs), p), eq_cell, "-" if m is None else self.verdict(m, eq), v_cell,
                self.second_set_cell(rs), note]  # fmt: skip

    def machine_line(self) -> list[str]:
        shares = [other_share(r) for r in self.s.results]
        return [
            f"**Machine ({self.s.title()}).** Other processes used {100 * min(shares):.0f}-{100 * max(shares):.0f}% "
            f"of the machine's cores during these runs ({sum(s > SHARED for s in shares)} of {len(shares)} above "
            f"{100 * SHARED:.0f}%), so their wall times compare only roughly."
            + (" Its machines and revisions: under **Reruns** above." if self.reruns else ""),
            "",
            *([] if self.reruns else machines_table([(f"`converged/cifar10-{self.s.tag}-*`", self.s.results)])),
        ]


def readings(layout: Layout) -> list[Reading]:
    folder = layout.results / RERUNS
    reruns = load_results(folder) if folder.exists() else []
    return [Reading(s, reruns) for s in studies(layout, CURRENT)]


def config_table(rd: list[Reading]) -> list[str]:
    """A row per study (with full data at E) and pruned configuration, with the files of marked rows."""
    L = table_head("| study | configuration | pruned % | minus full data at E (by seed) | against the noise (seed "
                   "spread, 2 SE) | minus full data at equal compute (by seed; seeds without a collapse) | against the "
                   "noise | minus dynamic random at the same pruned % | second set: minus its full data / its dynamic "
                   "random | runs that collapsed |")  # fmt: skip
    L += [row(r.cells(rs)) for r in rd if r.s.full for rs in r.pruned]
    files = [(f"{r.s.section.folder}/{run_name(x)}.json", x) for r in rd if r.s.full for rs in r.pruned for x in rs
             if unstable(x)]  # fmt: skip
    files += [(f"{RERUNS}/{run_name(x)}.json", x) for r in rd if r.s.full for rs in r.pruned  # the second set
              for y, refs in r.second_set_runs(rs) for x in (y, *refs) if unstable(x)]  # fmt: skip
    return [*L, "", *([footnote(files), ""] if files else [])]


def converged_reading(layout: Layout) -> list[str]:
    """The generated part of "Reading the converged study"."""
    rd = readings(layout)
    ordered = [r for r in rd if r.converged()] + [r for r in rd if not r.converged() and r.s.full]
    L = [x for r in ordered for x in r.findings()]
    L += ["#### Every pruned configuration", "", *config_table(rd)]
    return L + [x for r in rd for x in r.machine_line()]


def summary(layout: Layout) -> list[str]:
    """The measured part of the summary at the top of docs/quality.md."""
    rd = readings(layout)
    L = [r.one_line() for r in rd if r.converged() and r.pruned]
    L += [r.improving_line() for r in rd if r.converged() is False and r.pruned]
    return [x for t in L for x in (t, "")][:-1]


def same_order_note(layout: Layout) -> list[str]:
    """The note above the superseded, hand-written reading of the same-order runs: where its
    numbers come from, what the reshuffled runs changed, and which of its runs collapsed."""
    old = studies(layout, SAME_ORDER)
    if not old:
        return []
    new = {(s.E, s.augment, s.model): s for s in studies(layout, CURRENT)}
    L = ["*Kept as written, by hand, before the sample order was found and before this report generated its prose: "
         "its numbers come from the files in `docs/quality-runs/converged-same-order/` (the tables above), and the "
         "reading of the reshuffled runs supersedes it. Full data at E in the two orders (machines: the files' own "
         "records):*", "", *table_head("| study | same order | reshuffled | change | seeds | machines (same order; "
                                       "reshuffled) |")]  # fmt: skip
    for s in old:
        if s.full and (n := new.get((s.E, s.augment, s.model))) and n.full:
            a, b = mean_acc(s.full), mean_acc(n.full)
            machines = "; ".join(and_list(sorted({machine_of(r) for r in rs})) for rs in (s.full, n.full))
            L.append(
                row([s.title(), f"{pct(a)}%", f"{pct(b)}%", gap(b - a), f"{len(s.full)} and {len(n.full)}", machines])
            )
    bad = [f"{s.title()}: {name(r)} seed {r['seed']} (epoch {and_list([str(e) for e in s.collapsed[run_name(r)]])})"
           for s in old for rs in s.groups.values() for r in s.collapses_of(rs)]  # fmt: skip
    if bad:
        L += [
            "",
            "*Runs of these files whose test accuracy fell to chance during training ([Runs that collapsed]"
            f"(#runs-that-collapsed)), which the numbers below include without saying so: {'; '.join(bad)}.*",
        ]
    return L + [""]


def report_readings(layout: Layout) -> None:
    """Rewrite the generated prose of the converged study in docs/quality.md (its table in docs/results.md:
    ``report_results_table``)."""
    splice(layout.doc, "<!-- converged-reading:begin -->", "<!-- converged-reading:end -->", converged_reading(layout))
    splice(layout.doc, "<!-- same-order-note:begin -->", "<!-- same-order-note:end -->", same_order_note(layout))
    splice(layout.doc, "<!-- summary:begin -->", "<!-- summary:end -->", summary(layout))


def results_lines(layout: Layout) -> list[str]:
    """docs/results.md's table of the converged study (``config_table``, the same as docs/quality.md's),
    and a line per study: whether full data has converged, full data at E, the seed spread, the second set."""
    rd = [r for r in readings(layout) if r.s.full and r.pruned and r.converged() is not None]
    if not rd:
        return ["(no converged-study run with full data at E and at 2E yet)"]
    facts = []
    for r in rd:
        state = "full data has converged (E to 2E)" if r.converged() else "full data still improves from E to 2E"
        text = f"* {r.s.title()} ({seed_list(r.s.results)}{'' if r.converged() else ' so far'}): {state}; full data "
        text += f"at E {pct(r.full_acc)}%" + (
            f"; seed spread {pct(r.noise)} point" if r.noise and r.converged() else ""
        )
        if r.second_set():
            text += (
                f". A second set of {len(r.reruns)} runs repeated later (on average {gap(r.rerun_shift())} above "
                "the same runs of the study, so compared only among themselves): the table's second-set column"
            )
        facts.append(text + (r.shortest_note() if r.converged() else "") + ".")
    return [*config_table(rd), *facts]


def report_results_table(layout: Layout) -> None:
    """Rewrite docs/results.md's table of the converged study (where the doc has its markers)."""
    docs.splice(layout.results_doc, "<!-- quality-summary:begin -->", "<!-- quality-summary:end -->",
                results_lines(layout), skip_missing=True)  # fmt: skip
