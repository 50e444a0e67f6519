"""The prose of the converged study that states measured numbers ("Reading the converged
study", the summary at the top of docs/quality.md) and docs/results.md's table of it, generated
from the run files, so that prose and tables cannot drift apart.

Rules the text follows (each sentence is built from them, none is written by hand):

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

import json
import math
from collections import Counter
from collections.abc import Iterable

import numpy as np

from benchmarks.instability import MARK, footnote, unstable

from . import docs
from .docs import ORDER, and_list, last_loss, load_results, mean_acc, row
from .layout import Layout
from .machine import machine_of
from .report import splice
from .report_converged import (
    CURRENT,
    PAPER,
    PAPER_FULL,
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


def seeds_of(rs: list[dict]) -> str:
    """``0/1``: the seeds of the runs ``rs``."""
    return "/".join(str(r["seed"]) for r in rs)


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


class Reading:
    """The numbers of one converged study (one E, augmentation, model) and its reruns."""

    def __init__(self, study: Study, reruns: list[dict]) -> None:
        self.s = study
        self.E = study.E
        self.pruned = sorted(
            (rs for rs in study.groups.values() if rs[0]["policy"] != "full"),
            key=lambda rs: (ORDER[rs[0]["policy"]], rs[0]["label"]),
        )
        self.fulls = sorted((rs for rs in study.groups.values() if rs[0]["policy"] == "full"),
                            key=lambda rs: rs[0]["n_epochs"])  # fmt: skip
        self.shorter = [rs for rs in self.fulls if rs[0]["n_epochs"] < self.E]  # full data, fewer epochs than E
        two = [rs for rs in study.groups.values() if len(rs) > 1]
        spreads = [(max(acc(r) for r in rs) - min(acc(r) for r in rs), rs) for rs in two]
        self.noise, self.noise_rs = max(spreads, key=lambda x: x[0]) if spreads else (None, None)
        self.sds = [float(np.std([acc(r) for r in rs], ddof=1)) for rs in two]
        self.reruns = sorted((r for r in reruns if run_name(r).startswith(f"cifar10-{study.tag}-")),
                             key=lambda r: (ORDER[r["policy"]], r["label"], r["seed"]))  # fmt: skip
        self.rerun_full = {r["seed"]: r for r in self.reruns if r["policy"] == "full" and r["n_epochs"] == self.E}
        self.rerun_random = {r["seed"]: r for r in self.reruns if r["policy"] == "random"}
        self.full2 = study.full_at(2 * self.E)

    # ---------------------------------------------------------------- facts
    def converged(self) -> bool | None:
        """Every seed with a run at E and 2E gains at most CRITERION (None without such a pair)."""
        p = paired(self.full2 or [], self.s.full)
        return None if not p else all(v <= CRITERION for v in p.values())

    def collapsed(self, rs: list[dict]) -> list[dict]:
        return self.s.collapses_of(rs)

    def cname(self, rs: list[dict]) -> str:
        """The name with its pruned % and, for a configuration with a collapsed seed, a mark."""
        bad = self.collapsed(rs)
        return f"{name(rs[0])} ({pruned_pct(rs):.1f}% pruned)" + (f" [collapsed: seed {seeds_of(bad)}]" if bad else "")

    @property
    def full_acc(self) -> float:
        """Full data's mean test accuracy at E (the paragraphs that use it are written only with it)."""
        assert self.s.full_acc is not None
        return self.s.full_acc

    def gap_full(self, rs: list[dict]) -> float:
        return mean_acc(rs) - self.full_acc

    def equal_without_collapses(self, rs: list[dict]) -> dict[int, float]:
        """seed -> gap to full data at equal compute, runs of one machine only, without the seeds
        whose pruned run collapsed."""
        bad = {r["seed"] for r in self.collapsed(rs)}
        return {k: v for k, v in self.s.equal_gap(rs)[2].items() if k not in bad}

    def other_machine_note(self) -> str:
        """The pruned configurations whose equal-compute run of some seed ran on another machine."""
        left = []
        for rs in self.pruned:
            n, _, _, other = self.s.equal_gap(rs)
            if other:
                left.append(f"{self.cname(rs)} (seed {slashed(other)}, {n} epochs)")
        if not left:
            return ""
        return (" Not compared, because the pruned run and its equal-compute full-data run ran on different "
                "machines: " + and_list(left) + ".")  # fmt: skip

    def shortest_note(self) -> str:
        """'. Full data trained for 18 of the 36 epochs scored ...' where such a run exists, else ''."""
        if not self.shorter:
            return ""
        a = mean_acc(self.shorter[0])
        return (f". Full data trained for {self.shorter[0][0]['n_epochs']} of the {self.E} epochs scored {pct(a)}% "
                f"({gap(a - self.full_acc)} against E)")  # fmt: skip

    def beyond(self, x: float) -> bool:
        return self.noise is not None and abs(x) > self.noise + 1e-9

    # ---------------------------------------------------------------- paragraphs
    def noise_par(self) -> list[str]:
        if self.noise is None or self.noise_rs is None:
            return []
        return [
            f"**How large the noise is.** Two seeds of one configuration differ by up to {pct(self.noise)} point "
            f"({name(self.noise_rs[0])}; the standard deviation of a configuration is {pct(min(self.sds))}-"
            f"{pct(max(self.sds))}). Below, a gap is *beyond the seed spread* when it is larger than "
            f"{pct(self.noise)}, and *by seed* lists a configuration's runs minus the reference run of the same "
            "seed; a configuration below (above) on every seed by more than the spread is read as such only where the "
            "mean of its paired gaps also exceeds 2 SE of them (SE = their SD / sqrt(seeds)).",
            "",
        ]

    def machines(self) -> list[str]:
        """Which machine and library revision the study's run files and its reruns record."""
        L = ["| run files | runs | library revision (runs) | machine, as the file records it |",
             "| --- | --- | --- | --- |"]  # fmt: skip
        for where, rs in ((f"`converged/cifar10-{self.s.tag}-*`", self.s.results), (f"`{RERUNS}/`", self.reruns)):
            for m in sorted({machine_of(r) for r in rs}):
                revs = Counter(revision(r) for r in rs if machine_of(r) == m)
                rev = ", ".join(f"{k} ({v})" for k, v in revs.most_common())
                L.append(f"| {where} | {revs.total()} | {rev} | {m} |")
        return L + [""]

    def odd_revisions(self) -> str:
        """The runs trained by another revision than most of the study's runs."""
        main = Counter(map(revision, self.s.results)).most_common(1)[0][0]
        odd = [f"`{run_name(r)}` ({revision(r)})" for r in sorted(self.s.results, key=revision) if revision(r) != main]
        return f"Most of this study's runs were trained by revision {main}; {and_list(odd)} by another. " if odd else ""

    def rerun_par(self) -> list[str]:
        if not self.reruns:
            return []
        rows = ["| run (seed) | study's run | rerun | change |", "| --- | --- | --- | --- |"]
        marked: list[str] = []
        for r, o in self.rerun_pairs():
            mark = f" {MARK}" if unstable(r) or unstable(o) else ""  # the instability scan
            marked += [f"{RERUNS}/{run_name(r)}.json"] * unstable(r) + [f"converged/{run_name(o)}.json"] * unstable(o)
            rows.append(f"| {name(r)} ({r['seed']}){mark} | {pct(acc(o))} | {pct(acc(r))} | {gap(acc(r) - acc(o))} |")
        changes = [acc(r) - acc(o) for r, o in self.rerun_pairs()]

        def where(rs: list[dict]) -> tuple[set[str], set[str]]:
            return {machine_of(r) for r in rs}, set(map(revision, rs))

        (m1, v1), (m2, v2) = where(self.s.results), where(self.reruns)
        facts = []
        if m1 == {"not recorded"} and m2 != m1:
            facts.append("record a machine where the study's record none")
        elif m1 != m2:
            facts.append("record other machines than the study's")
        if v1 != v2:
            facts.append("come from other library revisions")
        L = [
            f"**Reruns.** {len(self.reruns)} runs of this study were trained again with the same configuration and "
            f"seed (`docs/quality-runs/{RERUNS}/`). Their files " + (and_list(facts) if facts else
                                                                   "record the study's machine and revision")
            + " (table below); they are kept as a second set, and runs of one set are compared with each other "
            "only.",
            "",
        ]  # fmt: skip
        L += self.machines()
        L += rows + [""] + ([footnote(marked), ""] if marked else [])
        L += [
            f"Mean change {gap(self.rerun_shift())} (from {gap(min(changes))} to {gap(max(changes))}; "
            f"{sum(c > CRITERION for c in changes)} of {len(changes)} above +{CRITERION}), full data's own rerun "
            f"included: the second set sits {'higher' if self.rerun_shift() > 0 else 'lower'} than the first on "
            "average, so a rerun is compared with the rerun of full data, never with the study's full data.",
            "",
        ]
        if self.rerun_full:
            parts = [f"{name(r)} {gap(g)} (seed {r['seed']})" for r, g in self.vs_rerun("full")]
            unpaired = [f"{name(r)} seed {r['seed']} ({pct(acc(r))})" for r in self.reruns
                        if r["policy"] != "full" and r["seed"] not in self.rerun_full]  # fmt: skip
            text = (f"On the second set, against its own full data at E (seed {slashed(self.rerun_full)}: "
                    f"{', '.join(pct(acc(r)) for r in self.rerun_full.values())}): {and_list(parts)}.")  # fmt: skip
            if unpaired:
                text += f" No full-data rerun pairs with {and_list(unpaired)}."
            if vs_r := [f"{name(r)} {gap(g)}" for r, g in self.vs_rerun("random")]:
                text += f" Against the rerun of dynamic random of the same seed ({slashed(self.rerun_random)}): "
                text += f"{and_list(vs_r)}."
            L += [text, ""]
        return L

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

    def rerun_vs_full(self, rs: list[dict]) -> str:
        """The second set's gap of this configuration to its full data (paired), or ''."""
        mine = [
            f"{gap(g)} (seed {r['seed']})" for r, g in self.vs_rerun("full") if config_name(r) == config_name(rs[0])
        ]
        return "; second set " + ", ".join(mine) if mine else ""

    def convergence_par(self) -> list[str]:
        full, full2 = self.s.full, self.full2
        if not full or not full2:
            return []
        p = paired(full2, full)
        ok = self.converged()
        head = ("**Full data has converged by the criterion.**" if ok else
                f"**Full data has NOT converged by the criterion** (at most +{CRITERION} from E to 2E on every "
                "seed).")  # fmt: skip
        both = [r for r in full if r["seed"] in p]
        both2 = [r for r in full2 if r["seed"] in p]
        a, b = mean_acc(both), mean_acc(both2)
        per = ", ".join(f"seed {r['seed']}: {pct(acc(r))} -> {pct(acc(r) + p[r['seed']])}"
                        for r in sorted(both, key=lambda r: r["seed"]))  # fmt: skip
        text = (f"{head} {pct(a)}% at E = {self.E} epochs and {pct(b)}% at 2E = {2 * self.E} (the seeds with both "
                f"runs): {gap(b - a)} point ({per}). Training loss of the last epoch: {last_loss(both):.2f} nats at E, "
                f"{last_loss(both2):.2f} at 2E.")  # fmt: skip
        if shorter := self.shorter:
            accs = [mean_acc(rs) for rs in self.fulls]
            best = max(self.fulls, key=mean_acc)
            text += (f" Full data at {' / '.join(str(rs[0]['n_epochs']) for rs in self.fulls)} epochs: "
                     f"{' / '.join(pct(a) for a in accs)}%, a spread of {pct(max(accs) - min(accs))} point "
                     f"(best: {best[0]['n_epochs']} epochs).")  # fmt: skip
            low = [rs for rs in shorter if self.noise is not None and self.full_acc - mean_acc(rs) > self.noise]
            if self.noise is not None and not low:
                text += (f" Every shorter schedule measured ({shorter[0][0]['n_epochs']}-{shorter[-1][0]['n_epochs']}"
                         f" epochs) is within the seed spread of full data at E or above it: the {self.E}-epoch "
                         "schedule has slack.")  # fmt: skip
        return [text, ""]

    def deficit(self, g: float, p: dict[int, float]) -> bool:
        """Below the reference on every seed, by more than the seed spread and beyond 2 SE of the paired
        gaps (resolved)."""
        return side(p) == "below on every seed" and self.beyond(g) and beyond_2se(p)

    def classify(self, items: list[tuple[list[dict], float, dict[int, float]]]) -> list[str]:
        """Sentences sorting configurations by side and size against the seed spread."""
        sizes = ["by more than the seed spread", "by more than the seed spread, within 2 SE of its paired gaps",
                 "within the seed spread"]  # fmt: skip
        groups: dict[str, list[str]] = {}
        for rs, g, p in items:
            size = sizes[2] if not self.beyond(g) else sizes[1] if len(p) > 1 and not beyond_2se(p) else sizes[0]
            groups.setdefault(f"{side(p)}, {size}", []).append(name(rs[0]))
        # from the largest deficit to the largest gain: below most resolved first, above least resolved first
        order = (
            [f"below on every seed, {x}" for x in sizes]
            + [f"seeds on both sides, {x}" for x in sizes[2::-2]]
            + [f"above on every seed, {x}" for x in sizes[::-1]]
            + [f"one seed, {x}" for x in sizes[2::-2]]
        )
        return [f"{k}: {and_list(groups[k])}" for k in order if k in groups]

    def second_set(self) -> str:
        """'dynamic random p30 -1.25, SeTa p30 -1.15 (seed 0)': the reruns against their own full data."""
        parts = [f"{name(r)} {gap(g)}" for r, g in self.vs_rerun("full")]
        return f"{and_list(parts)} (seed {slashed(self.rerun_full)})" if parts else ""

    def full_par(self) -> list[str]:
        if self.s.full_acc is None or not self.pruned:
            return []
        items = [(rs, self.gap_full(rs), paired(rs, self.s.full)) for rs in self.pruned]
        each = "; ".join(
            f"{self.cname(rs)} {gap(g)} (by seed {by_seed(p)}{self.rerun_vs_full(rs)})" for rs, g, p in items
        )
        text = f"**Against full data at E (the papers' comparison).** {each}. Sorted: " + "; ".join(
            self.classify(items)
        )
        if self.second_set():
            text += (". On the second set every rerun pruned configuration was below its own full data: "
                     f"{self.second_set()}")  # fmt: skip
        lv = sorted(PAPER["seta"])
        text += (". The paper reports " + "; ".join(
            f"{and_list(['/'.join(f'{PAPER[p][x] - PAPER_FULL:+.1f}' for x in lv)])} for {n}"
            for p, n in (("seta", "SeTa"), ("infobatch", "InfoBatch"), ("random", "dynamic random")))
            + f" at {' / '.join(str(x) for x in lv)}% pruned.")  # fmt: skip
        return [text, ""]

    def equal_par(self) -> list[str]:
        items, each = [], []
        for rs in self.pruned:
            n, _, p, _ = self.s.equal_gap(rs)
            if (g := mean_gap(p)) is None:
                continue
            items.append((rs, g, p))
            each.append(f"{self.cname(rs)} {gap(g)} against {n} epochs (by seed {by_seed(p)})")
        if not items:
            return []
        text = (
            "**Against full data at equal compute** (paired by seed, runs of one machine only). "
            + "; ".join(each)
            + ". Sorted: "
            + "; ".join(self.classify(items))
            + "."
            + self.other_machine_note()
        )
        best = max(items, key=lambda x: x[1])
        if not self.beyond(best[1]) or best[1] < 0:
            text += (f" No pruned configuration beat full data at equal compute by more than the seed spread "
                     f"(largest: {self.cname(best[0])}, {gap(best[1])}).")  # fmt: skip
        if len(shorter := self.shorter) > 1:
            accs = [mean_acc(rs) for rs in shorter]
            low = min(shorter, key=mean_acc)
            text += (f" The full-data references ({shorter[0][0]['n_epochs']}-{shorter[-1][0]['n_epochs']} epochs) "
                     f"themselves span {pct(max(accs) - min(accs))} point (lowest: {low[0]['n_epochs']} epochs, "
                     f"{pct(mean_acc(low))}), so which length a pruned run is held against moves its gap by up to "
                     "that much.")  # fmt: skip
        return [text, ""]

    def random_note(self) -> str:
        """'; dynamic random's points include a run that collapsed' where they do, else ''."""
        bad = [rs for rs in self.s.groups.values() if rs[0]["policy"] == "random" and self.collapsed(rs)]
        return "; dynamic random's points include a run that collapsed" if bad else ""

    def random_par(self) -> list[str]:
        items = [(rs, v) for rs in self.pruned if (v := self.s.vs_random_value(rs)) is not None]
        if not items:
            return []
        each = "; ".join(f"{self.cname(rs)} {gap(v)}" for rs, v in items)
        beyond = [f"{name(rs[0])} ({gap(v)})" for rs, v in items if self.beyond(v)]
        text = (f"**Against dynamic random at the same pruned %** (the table's interpolation, means over "
                f"seeds{self.random_note()}): {each}. ")  # fmt: skip
        text += (f"Beyond the seed spread: {and_list(beyond)}; every other within it." if beyond
                 else "Every one within the seed spread.")  # fmt: skip
        if not any(v > 0 and self.beyond(v) for _, v in items):
            text += " No loss-guided configuration beat dynamic random by more than the seed spread."
        if vs := [f"{name(r)} {gap(g)} (seed {r['seed']})" for r, g in self.vs_rerun("random")]:
            text += f" On the second set, against the rerun of dynamic random of the same seed: {and_list(vs)}."
        return [text, ""]

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
            text += (f" {'was' if len(below) == 1 else 'were'} below it on every seed, by more than the spread and "
                     "2 SE")  # fmt: skip
        bad = [(rs, self.collapsed(rs)) for rs in self.pruned if self.collapsed(rs)]
        if bad:
            text += ("; " + and_list([f"{name(rs[0])} (seed {seeds_of(b)})" for rs, b in bad])
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

    def improving_par(self) -> list[str]:
        """A study whose full data still improves from E to 2E (so far): its gaps, collapses marked."""
        full, full2 = self.s.full, self.full2
        if not full:
            return []
        text = f"**Where full data still improves ({self.s.title()}; {seed_list(self.s.results)} so far).** "
        p = paired(full2 or [], full)
        if p:
            at_e = {r["seed"]: acc(r) for r in full}
            per = ", ".join(f"seed {s}: {pct(at_e[s])} -> {pct(at_e[s] + v)}" for s, v in sorted(p.items()))
            text += (f"Full data gains {gap(float(np.mean(list(p.values()))))} point from {self.E} to {2 * self.E} "
                     f"epochs on the seeds with both runs ({per}). ")  # fmt: skip
        items = []
        for rs in self.pruned:
            t = f"{name(rs[0])} ({pruned_pct(rs):.1f}% pruned) {gap(self.gap_full(rs))}"
            bad = self.collapsed(rs)
            if bad:
                g = self.s.without_collapsed(rs)[1]
                epochs = {r["seed"]: ", ".join(map(str, self.s.collapsed[run_name(r)])) for r in bad}
                at = and_list([f"seed {s} at epoch {es}" for s, es in epochs.items()])
                t += (f" (test accuracy fell to chance: {at}; "
                      + (f"without {'it' if len(bad) == 1 else 'them'} {gap(g)} against full data at E over the same "
                         "seeds)" if g is not None else
                         "no seed left without a collapse, so not read as the policy's result)"))  # fmt: skip
            items.append(t)
        text += "Against full data at E: " + "; ".join(items) + "."
        vr = [(rs, v) for rs in self.pruned if (v := self.s.vs_random_value(rs)) is not None and not self.collapsed(rs)]
        if vr:
            text += (f" Against dynamic random at the same pruned % (configurations without a collapsed run"
                     f"{self.random_note()}): ") + "; ".join(
                f"{self.cname(rs)} {gap(v)}" for rs, v in vr) + "."  # fmt: skip
        eq = [rs for rs in self.pruned if self.s.equal_compute(rs)[1]]
        eq_ok = [(rs, g) for rs in eq if (g := self.equal_without_collapses(rs))]
        if eq_ok:
            text += (
                " Against full data at equal compute (paired by seed, runs of one machine only, seeds whose "
                "test accuracy fell to chance left out): "
                + "; ".join(
                    f"{self.cname(rs)} {gap(mean_gap(g))} against {self.s.equal_compute(rs)[0]} epochs "
                    f"(" + ", ".join(f"seed {k}: {gap(v)}" for k, v in sorted(g.items())) + ")"
                    for rs, g in eq_ok
                )
                + "."
            )
            if all(len(g) == 1 for _, g in eq_ok):
                text += " Each of these gaps rests on one seed, so none of them is resolved."
        elif eq:
            text += (" Every equal-compute run so far has a collapsed pruned run or ran on another machine than its "
                     "pruned run.")  # fmt: skip
        text += self.other_machine_note() if eq else (" No equal-compute run has finished yet, so this study "
                                                      "says nothing yet about pruning against training fewer "
                                                      "epochs.")  # fmt: skip
        if len({r["seed"] for r in self.s.results}) < 2:
            text += (" One seed per configuration: this study has no seed spread of its own yet, so none of these "
                     "gaps is resolved.")  # fmt: skip
        return [text, ""]

    def checks_par(self, checks: dict) -> list[str]:
        mine = checks.get("studies", {}).get(self.s.tag)
        if not mine:
            return []
        ids = {run_name(r) for r in self.s.results}
        dirs = {k: v for k, v in checks.get("run_dirs", {}).items() if k in ids}
        problems = len(mine["results_problems"]) + sum(len(v) for v in dirs.values())
        text = (f"**Checks ({self.s.title()}).** `checks.py` found {problems} problems in the {mine['runs_checked']} "
                f"result files and the {len(dirs)} run directories of seed 0 it checked (the section above lists "
                "them).")  # fmt: skip
        if ratios := self.s.sample_ratios():
            text += f" Each equal-compute full-data run trains {span(ratios, 2)} times the samples of its pruned run "
            text += "(seed 0)."
        return [text, ""]

    def machine_par(self) -> list[str]:
        machines = sorted({machine_of(r) for r in self.s.results})
        shares = [other_share(r) for r in self.s.results]
        shared = sum(s > SHARED for s in shares)
        text = (f"**Machine ({self.s.title()}).** Other processes used {100 * min(shares):.0f}-"
                f"{100 * max(shares):.0f}% of the machine's cores during these runs ({shared} of {len(shares)} above "
                f"{100 * SHARED:.0f}%), so their wall times compare only roughly. {self.odd_revisions()}"
                + ("Its files record no machine." if machines == ["not recorded"] else
                   "The machine, as its files record it: " + and_list(machines) + "."))  # fmt: skip
        return [text, ""]


def readings(layout: Layout) -> list[Reading]:
    folder = layout.results / RERUNS
    reruns = load_results(folder) if folder.exists() else []
    return [Reading(s, reruns) for s in studies(layout, CURRENT)]


def converged_reading(layout: Layout) -> list[str]:
    """The generated part of "Reading the converged study"."""
    rd = readings(layout)
    conv = [r for r in rd if r.converged()]
    improving = [r for r in rd if r.converged() is False or (r.converged() is None and r.s.full)]
    checks_path = CURRENT.results(layout) / "checks.json"
    checks = json.loads(checks_path.read_text()) if checks_path.exists() else {}
    L: list[str] = []
    for r in conv:
        L += [f"#### {r.s.title()}", ""]
        L += r.noise_par() + r.rerun_par() + r.convergence_par() + r.full_par() + r.equal_par() + r.random_par()
        L += [f"**In one line.** {r.one_line()}", ""]
    for r in improving:
        L += [f"#### {r.s.title()}", ""] + r.improving_par()
    for r in rd:
        L += r.checks_par(checks) + r.machine_par()
    return L


def summary(layout: Layout) -> list[str]:
    """The measured part of the summary at the top of docs/quality.md."""
    rd = readings(layout)
    L = [r.one_line() for r in rd if r.converged() and r.pruned]
    for r in rd:
        if r.converged() is False and r.pruned:
            ok = [rs for rs in r.pruned if not r.collapsed(rs)]
            bad = [rs for rs in r.pruned if r.collapsed(rs)]
            gaps = [r.gap_full(rs) for rs in ok]
            text = f"Where full data still improves ({r.s.title()}, {seed_list(r.s.results)} so far), "
            if gaps and max(gaps) < 0:
                text += (f"pruning cost {pct(-max(gaps))} to {pct(-min(gaps))} points against full data at E in the "
                         f"{len(ok)} pruned configurations without a collapsed run")  # fmt: skip
            elif gaps:
                text += (f"the {len(ok)} pruned configurations without a collapsed run landed {gap(min(gaps))} to "
                         f"{gap(max(gaps))} points from full data at E")  # fmt: skip
            else:
                text += "every pruned configuration includes a collapsed run"
            if bad:
                items = [f"{name(rs[0])} (seed {seeds_of(r.collapsed(rs))}"
                         + ("" if (g := r.s.without_collapsed(rs)[1]) is None else f"; without it {gap(g)}") + ")"
                         for rs in bad]  # fmt: skip
                text += (f"; {and_list(items)} {'includes a run' if len(bad) == 1 else 'include runs'} whose test "
                         "accuracy fell to chance during training, not read as a policy result")  # fmt: skip
            eq = [g for rs in r.pruned if (g := r.equal_without_collapses(rs))]
            if eq:
                means = [m for g in eq if (m := mean_gap(g)) is not None]
                one = all(len(g) == 1 for g in eq)
                text += (f". Against full data trained for fewer epochs at the same compute (runs of one machine, "
                         f"seeds without a collapse), the {len(eq)} pruned configurations landed {gap(min(means))} to "
                         f"{gap(max(means))} points" + (" (one seed each: not resolved)" if one else ""))  # fmt: skip
            L.append(text + ".")
    return [x for t in L for x in (t, "")][:-1]


def same_order_note(layout: Layout) -> list[str]:
    """The note above the superseded, hand-written reading of the same-order runs: where its
    numbers come from, what the reshuffled runs changed, and which of its runs collapsed."""
    old = studies(layout, SAME_ORDER)
    if not old:
        return []
    new = {(s.E, s.augment, s.model): s for s in studies(layout, CURRENT)}
    text = ("*Kept as written, by hand, before the sample order was found and before this report generated its "
            "prose: its numbers come from the files in `docs/quality-runs/converged-same-order/` (the tables "
            "above), and the reading of the reshuffled runs supersedes it.")  # fmt: skip
    for s in old:
        n = new.get((s.E, s.augment, s.model))
        if s.full and n and n.full:

            def machines(rs: list[dict]) -> str:
                return and_list(sorted({machine_of(r) for r in rs}))

            a, b = mean_acc(s.full), mean_acc(n.full)
            text += (f" Full data at E ({s.title()}): {pct(a)}% in the same order, {pct(b)}% reshuffled ({gap(b - a)}; "
                     f"{len(s.full)} and {len(n.full)} seeds; machine of the same-order files: {machines(s.full)}; of "
                     f"the reshuffled ones: {machines(n.full)}).")  # fmt: skip
    bad = []
    for s in old:
        for rs in s.groups.values():
            for r in s.collapses_of(rs):
                es = s.collapsed[run_name(r)]
                bad.append(f"{s.title()}: {name(r)} seed {r['seed']} (epoch {and_list([str(e) for e in es])})")
    if bad:
        text += (" Runs of these files whose test accuracy fell to chance during training ([Runs that "
                 f"collapsed](#runs-that-collapsed)), which the numbers below include without saying so: "
                 f"{'; '.join(bad)}.")  # fmt: skip
    return [text + "*", ""]


def report_readings(layout: Layout) -> None:
    """Rewrite the generated prose of the converged study in docs/quality.md (its table in docs/results.md:
    ``report_results_table``)."""
    splice(layout.doc, "<!-- converged-reading:begin -->", "<!-- converged-reading:end -->", converged_reading(layout))
    splice(layout.doc, "<!-- same-order-note:begin -->", "<!-- same-order-note:end -->", same_order_note(layout))
    splice(layout.doc, "<!-- summary:begin -->", "<!-- summary:end -->", summary(layout))


def _table_row(rd: Reading, rs: list[dict]) -> str:
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
    """docs/results.md's table of the converged study, from the same run files and by the same rules as the
    summary at the top of docs/quality.md (``summary``): one row per study (with full data at E and a pruned
    configuration) and pruned configuration with its gap to full data at E paired by seed, where that gap sits
    against the noise as the reading sorts it (the seed spread and 2 SE of the paired gaps; studies whose full
    data has converged), its gap at equal compute and against dynamic random, and the seeds whose test accuracy
    fell to chance; each study's facts (seed spread, full data at E, the second set, shorter full data) in a
    list below the table."""
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
        L += [_table_row(r, rs) for rs in r.pruned]
    files = [f"{r.s.section.folder}/{run_name(x)}.json" for r in rd for rs in r.pruned for x in rs
             if unstable(x)]  # fmt: skip
    return [*L, "", *([footnote(files), ""] if files else []), *[_facts(r) for r in rd]]


def report_results_table(layout: Layout) -> None:
    """Rewrite docs/results.md's table of the converged study (where the doc has its markers)."""
    docs.splice(layout.results_doc, "<!-- quality-summary:begin -->", "<!-- quality-summary:end -->",
                results_lines(layout), skip_missing=True)  # fmt: skip
