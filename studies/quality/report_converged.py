"""The converged study's sections of docs/quality.md, generated from its run files (partial results too):
per study its status, convergence check, a table of every configuration beside full data at E (the
papers' comparison) and beside full data trained for round(E (1 - p)) epochs (the same samples trained:
the equal-compute baseline), its figures, kept fractions, calibration and checks."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from studies.quality.checks import check_results, check_run_dir, finished_run_dirs
from studies.quality.collapses import collapse_epochs, converged_trace
from studies.quality.configs import (
    CONVERGED_SEEDS,
    augments,
    conv_calibration_name,
    conv_full,
    conv_pruned,
    conv_run_id,
    conv_tag,
    converged_plan,
    model_of,
)
from studies.quality.docs import ORDER, fmt_params, interp_gap, load_results, mean_acc, mean_sd, row, table_head
from studies.quality.instability import MARK, footnote, unstable
from studies.quality.layout import Layout
from studies.quality.machine import machine_of
from studies.quality.plots import acc_point, plot_curves, plot_vs_pruned
from studies.quality.report import calibration_rows, checked, splice


@dataclass(frozen=True)
class Section:
    """One generated section of docs/quality.md: its run files (a folder of ``docs/quality-runs``),
    its markers, its figures' folder (under ``docs/quality``) and whether it is still run (a
    stopped section lists no missing runs and checks no run directories: the ones on this machine
    are those of the current runs, under the same ids)."""

    folder: str
    marker: str
    plots: str = ""
    stopped: str = ""  # why a stopped section's study was not continued

    def results(self, layout: Layout) -> Path:
        return layout.results / self.folder

    def figures(self, layout: Layout) -> Path:
        return layout.plots / self.plots if self.plots else layout.plots

    def link(self, name: str) -> str:
        return f"quality/{self.plots + '/' if self.plots else ''}{name}"


CURRENT = Section("converged", "converged")
SAME_ORDER = Section(
    "converged-same-order", "converged-same-order", "same-order",
    "its runs trained every epoch in the same order (see above), and it was not continued",
)  # fmt: skip
SHARED = 0.10  # a run "shared the machine" when other processes kept > 10% of its cores busy on average


def run_name(r: dict) -> str:
    """A run's id: the name of its result file without ``.json``."""
    return conv_run_id(r, r["seed"])


def config_name(c: dict) -> str:
    """A configuration's run id without the seed (the keys of ``Study.groups``)."""
    return conv_run_id(c, 0).rsplit("-s", 1)[0]


def pruned_pct(rs: list[dict]) -> float:
    """The runs' mean measured pruned %."""
    return 100 * float(np.mean([r["pruned"] for r in rs]))


def other_share(r: dict) -> float:
    """Mean share of the machine other processes used during the run's epochs."""
    return float(np.mean([e.get("other_cpu", 0.0) for e in r["epochs"]]))


def same_machine_gaps(rs: list[dict], ref: list[dict] | None) -> tuple[dict[int, float], list[int]]:
    """(seed -> test accuracy of ``rs``'s run minus ``ref``'s run of the same seed, for the seeds
    whose two runs ran on one machine; the seeds in both whose runs ran on two machines, left out:
    runs of different machines are never compared)."""
    by = {r["seed"]: r for r in ref or []}
    gaps, other = {}, []
    for r in rs:
        if (b := by.get(r["seed"])) is None:
            continue
        if machine_of(r) == machine_of(b):
            gaps[r["seed"]] = 100 * (r["test_acc"] - b["test_acc"])
        else:
            other.append(r["seed"])
    return gaps, sorted(other)


def _full_pruned(n: int, E: int) -> str:
    """The pruned-% cell of a full-data run of n epochs: the samples it saves against full data at E."""
    if n == E:
        return "0.0"
    return f"{100 * (1 - n / E):.1f} (fewer epochs)" if n < E else f"none ({n / E:g}x the samples)"


def _checks(layout: Layout, section: Section, tag: str, results: list[dict]) -> dict:
    """Check the result files of one study (``tag``) and its kept run directories (seed 0), keeping
    earlier findings for directories no longer on this machine. The folder's checks.json holds every
    study of the folder: the findings per run directory, and per study the result files' check.
    Returns this study's part: runs_checked, results_problems and run_dirs (its own only)."""
    path = section.results(layout) / "checks.json"
    old = json.loads(path.read_text()) if path.exists() else {}
    per_dir: dict[str, list[str]] = dict(old.get("run_dirs", {}))

    ids = {run_name(r) for r in results}
    for d in [] if section.stopped else finished_run_dirs(layout.runs, results, run_name):
        per_dir[d.name] = check_run_dir(d)
    mine = {"runs_checked": len(results), "results_problems": check_results(results)}
    studies = {k: v for k, v in old.get("studies", {}).items() if k != tag} | {tag: mine}
    path.write_text(json.dumps({"studies": dict(sorted(studies.items())), "run_dirs": per_dir}, indent=1))
    return mine | {"run_dirs": {k: v for k, v in per_dir.items() if k in ids}}


def studies(layout: Layout, section: Section = CURRENT) -> list[Study]:
    """The studies (E, augmentation, model) of one section's run files, in the report's order:
    the small CNN first, augmented studies before the others, shorter E first."""
    results = load_results(section.results(layout)) if section.results(layout).exists() else []

    def key(r: dict) -> tuple[int, bool, str]:
        return r["E"], augments(r), model_of(r)

    keys = sorted({key(r) for r in results}, key=lambda k: (k[2] != "cnn", k[2], not k[1], k[0]))
    return [Study(layout, E, a, [r for r in results if key(r) == (E, a, m)], m, section) for E, a, m in keys]


def report_converged(layout: Layout, section: Section = CURRENT) -> None:
    """Rewrite one generated section of the converged study in docs/quality.md, and its figures."""
    lines: list[str] = []
    all_studies = studies(layout, section)
    if not all_studies:
        lines += ["No run of the converged study has finished yet.", ""]
    for s in all_studies:
        lines += [f"### {s.title(' epochs')}", ""]
        lines += s.status() + s.convergence() + s.table() + s.figures() + s.kept()
        lines += s.calibration() + s.checks()
    splice(layout.doc, f"<!-- {section.marker}:begin -->", f"<!-- {section.marker}:end -->", lines)


class Study:
    """The finished runs of the converged study at one E (with or without augmentation, of one
    model), and the report's parts drawn from them."""

    def __init__(self, layout: Layout, E: int, augment: bool, results: list[dict], model: str = "cnn",
                 section: Section = CURRENT) -> None:  # fmt: skip
        self.layout, self.E, self.augment, self.results, self.model = layout, E, augment, results, model
        self.section = section
        self.tag = conv_tag(E, augment, model)
        self.groups: dict[str, list[dict]] = {}  # configuration_name -> its runs, seed order
        for r in sorted(results, key=lambda r: r["seed"]):
            self.groups.setdefault(config_name(r), []).append(r)
        cal_path = section.results(layout) / conv_calibration_name(E, augment, model)
        self.cal = json.loads(cal_path.read_text()) if cal_path.exists() else None
        self.pruned_cfgs = conv_pruned(E, self.cal, augment, model) if self.cal else []
        self.by_id = {run_name(r): r for r in results}
        self.measured = [self.by_id[i]["pruned"] for c in self.pruned_cfgs if (i := conv_run_id(c, 0)) in self.by_id]
        self.full = self.full_at(E)
        self.full_acc = mean_acc(self.full) if self.full else None
        # run id -> the epochs it collapsed at (collapses.py: test accuracy back at chance)
        self.collapsed: dict[str, list[int]] = {}
        for r in results:
            t = converged_trace(r, run_name(r), section.folder)
            if t is not None and (es := collapse_epochs(t.metric, t.chance)):
                self.collapsed[t.run] = es

    def title(self, unit: str = "") -> str:
        """``CIFAR-10, E = 36``; the model when it is not the small CNN (and the device it trained
        on), and ``no augmentation`` where that applies."""
        devices = sorted({r.get("device", "cpu") for r in self.results} - {"cpu"})
        model = "" if self.model == "cnn" else f", {self.model.replace('resnet', 'ResNet-')}"
        on = f" on {'/'.join(d.split(':')[0].upper().replace('CUDA', 'GPU') for d in devices)}" if devices else ""
        return f"CIFAR-10{model}{on}, E = {self.E}{unit}" + ("" if self.augment else ", no augmentation")

    def full_at(self, n: int) -> list[dict] | None:
        return self.groups.get(config_name(conv_full(self.E, n, self.augment, self.model)))

    def equal_compute(self, rs: list[dict]) -> tuple[int, list[dict] | None]:
        """The epochs and runs of full data at the compute of the pruned runs ``rs`` (seed 0's pruned %)."""
        p = rs[0]["pruned"] if rs[0]["seed"] == 0 else float(np.mean([r["pruned"] for r in rs]))
        n = round(self.E * (1 - p))
        return n, self.full_at(n)

    def equal_gap(self, rs: list[dict]) -> tuple[int, list[dict] | None, dict[int, float], list[int]]:
        """The equal-compute epochs and runs of ``rs``, the gaps paired by seed on one machine, and
        the seeds left out because their two runs ran on different machines."""
        n, eq = self.equal_compute(rs)
        return (n, eq, *same_machine_gaps(rs, eq))

    @staticmethod
    def gap_cell(gaps: dict[int, float], other: list[int], seeds: int) -> str:
        """The mean of the same-machine paired gaps, saying which seeds it covers when not all of them
        and which were left out for their other machine; "-" without any gap."""
        left = f"seed {'/'.join(map(str, other))}: other machine" if other else ""
        if not gaps:
            return f"- ({left})" if left else "-"
        text = f"{float(np.mean(list(gaps.values()))):+.2f}"
        if len(gaps) < seeds:
            text += f" (seed {'/'.join(map(str, sorted(gaps)))}" + (f"; {left})" if left else ")")
        return text

    def status(self) -> list[str]:
        plan = converged_plan(self.E, CONVERGED_SEEDS, self.cal, self.measured, self.augment, self.model)
        missing = [conv_run_id(c, s) for c, s in plan if conv_run_id(c, s) not in self.by_id]
        L = [f"**Status:** {len(self.results)} of the {len(plan)} runs planned so far have finished."]
        if self.section.stopped:
            return L[:1] + [f" The study was stopped: {self.section.stopped}.", ""] if missing else L + [""]
        if missing:
            L += [f" Still missing, in run order: {', '.join(f'`{m}`' for m in missing)}."]
        if self.cal is None:
            L += [" The pruned runs are planned once full data at E (seed 0) has finished and calibrated them."]
        if len(self.measured) < len(self.pruned_cfgs):
            L += [" The equal-compute runs of the pruned runs that have not finished yet are not planned yet."]
        return L + [""]

    def convergence(self) -> list[str]:
        """Full data at E against 2E, seed by seed: converged where every seed gains at most 0.5 point."""
        full, full2 = self.full, self.full_at(2 * self.E)
        if not full:
            return []
        head = f"**Convergence check:** full data at E = {self.E} and 2E = {2 * self.E} epochs"
        at_e = {r["seed"]: r for r in full}
        both = [(at_e[r["seed"]], r) for r in full2 or [] if r["seed"] in at_e]
        if not both:
            return [f"{head}: {100 * full[0]['test_acc']:.2f}% at E (seed 0); the run at 2E has not finished yet.", ""]
        gains = [100 * (b["test_acc"] - a["test_acc"]) for a, b in both]
        per = [f"seed {a['seed']}: {100 * a['test_acc']:.2f} -> {100 * b['test_acc']:.2f} ({g:+.2f})"
               for (a, b), g in zip(both, gains)]  # fmt: skip
        text = f"{head}: {', '.join(per)}"
        if len(both) > 1:
            ma, mb = mean_acc([a for a, _ in both]), mean_acc([b for _, b in both])
            text += f"; over {len(both)} seeds {ma:.2f}% -> {mb:.2f}% ({mb - ma:+.2f} points)"
        loss = [float(np.mean([x["epochs"][-1]["train_loss"] for x in rs])) for rs in zip(*both)]
        text += f"; training loss of the last epoch {loss[0]:.2f} -> {loss[1]:.2f} nats. " + (
            "Within 0.5 point on every seed: full data has converged at E."
            if max(gains) <= 0.5
            else "**More than 0.5 point: full data has NOT converged at E**; the next step is a larger E (`--epochs`)."
        )
        return [text, ""]

    def collapses_of(self, rs: list[dict]) -> list[dict]:
        """The runs of ``rs`` that collapsed."""
        return [r for r in rs if run_name(r) in self.collapsed]

    def collapse_cell(self, rs: list[dict]) -> str:
        """Which seeds collapsed (epoch, test accuracy), and the configuration without them: mean
        test accuracy of the other seeds and its gap to full data at E over the same seeds."""
        bad = self.collapses_of(rs)
        if not bad:
            return "-"
        at = "; ".join(
            f"s{r['seed']}: " + ", ".join(f"e{e} {100 * r['epochs'][e]['test_acc']:.1f}%"
                                          for e in self.collapsed[run_name(r)])
            for r in bad
        )  # fmt: skip
        rest, g = self.without_collapsed(rs)
        if not rest:
            return f"**{at}**; without it: no seed left"
        seeds = "/".join(str(r["seed"]) for r in rest)
        gap = "-" if g is None else f"{g:+.2f}"
        return f"**{at}**; without it: {mean_acc(rest):.2f} (seed {seeds}), {gap} vs full at E (same seeds)"

    def without_collapsed(self, rs: list[dict]) -> tuple[list[dict], float | None]:
        """The runs of ``rs`` that did not collapse, and their mean test accuracy minus full data at
        E's over the same seeds (None without full data at E for each of those seeds)."""
        bad = self.collapses_of(rs)
        rest = [r for r in rs if r not in bad]
        full = {r["seed"]: r for r in self.full or []}
        if not rest or rs is self.full or not all(r["seed"] in full for r in rest):
            return rest, None
        return rest, mean_acc(rest) - mean_acc([full[r["seed"]] for r in rest])

    def vs_random_value(self, rs: list[dict]) -> float | None:
        """Test accuracy minus dynamic random's, interpolated at the same measured pruned % (None
        for full data and random, or outside random's points)."""
        pts = [(0.0, self.full_acc)] if self.full_acc is not None else []
        pts += [(float(np.mean([r["pruned"] for r in g])), mean_acc(g)) for g in self.groups.values()
                if g[0]["policy"] == "random"]  # fmt: skip
        if rs[0]["policy"] in ("full", "random"):
            return None
        return interp_gap(float(np.mean([r["pruned"] for r in rs])), mean_acc(rs), pts)

    def row(self, rs: list[dict]) -> list[str]:
        r0, full_acc = rs[0], self.full_acc
        is_full = r0["policy"] == "full"
        n, eq, gaps, other = self.equal_gap(rs)
        vs_full = "-" if full_acc is None or rs is self.full else f"{mean_acc(rs) - full_acc:+.2f}"
        if is_full and self.full and rs is not self.full:  # paired by seed, where that is not every seed of both
            gaps, other = same_machine_gaps(rs, self.full)
            if other or len(gaps) < max(len(rs), len(self.full)):
                vs_full += f" (paired, one machine: {self.gap_cell(gaps, other, len(self.full))})"
        v = self.vs_random_value(rs)
        return [
            (f"full, {r0['n_epochs']} epochs" if is_full else f"{r0['policy']} {r0['label']}")
            + (f" {MARK}" if any(unstable(r) for r in rs) else ""),  # instability scan
            "-" if is_full else fmt_params(r0["params"], "defaults"),
            str(len(rs)),
            _full_pruned(r0["n_epochs"], self.E) if is_full else mean_sd([r["pruned"] for r in rs], digits=1),
            mean_sd([r["test_acc"] for r in rs]),
            vs_full,
            "-" if is_full else str(n),
            "-" if is_full else mean_sd([r["test_acc"] for r in eq]) if eq else "(not run yet)",
            "-" if is_full or not eq else self.gap_cell(gaps, other, len(rs)),
            "-" if v is None else f"{v:+.2f}",
            self.collapse_cell(rs),
            f"{min(r['epochs'][-1].get('train_seconds', r['seconds']) for r in rs) / 60:.1f}",  # fastest seed
            " / ".join(f"{100 * other_share(r):.0f}%" for r in rs),
        ]

    def table(self) -> list[str]:
        """Every configuration (docs/quality.md explains the columns above the section), and the files
        of the marked rows."""
        L = table_head(
            "| run | setting | seeds | pruned % (measured) | test acc % | vs full at E | equal-compute full data: "
            "epochs | its test acc % | vs equal compute | vs dynamic random at that pruned % | collapsed seeds "
            "(epoch, test acc) | training min (fastest seed) | other work's CPU share |"
        )
        order = sorted(self.groups.values(), key=lambda rs: (rs[0]["policy"] != "full", ORDER[rs[0]["policy"]],
                                                             -rs[0]["n_epochs"], rs[0]["label"]))  # fmt: skip
        L += [row(self.row(rs)) for rs in order]
        files = [(f"{run_name(r)}.json", r) for rs in order for r in rs if unstable(r)]
        return L + ["", *([footnote(files), ""] if files else [])]

    def seed0_curves(self) -> list[dict]:
        return [r for r in self.results if r["seed"] == 0 and "test_acc" in r["epochs"][-1]]

    def figures(self) -> list[str]:
        E, figs, L, tag, link = self.E, self.section.figures(self.layout), [], self.tag, self.section.link
        title = self.title()
        s0 = self.seed0_curves()
        if s0:
            plot_curves(figs / f"cifar10-{tag}-curves.png", s0, f"{title}: test accuracy per epoch (seed 0)")
            L += [f"![test accuracy against samples trained and wall time]({link(f'cifar10-{tag}-curves.png')})", ""]
        points: dict[str, list] = {}
        equal = []
        for rs in self.groups.values():
            if rs[0]["policy"] != "full":
                label = rs[0]["policy"] + (" target_keep" if "target_keep" in rs[0]["params"] else "")
                points.setdefault(label, []).append((pruned_pct(rs), *acc_point(rs)))
            elif rs[0]["n_epochs"] < E:
                equal.append((100 * (1 - rs[0]["n_epochs"] / E), *acc_point(rs)))
        if points or equal:
            full = acc_point(self.full) if self.full else None
            plot_vs_pruned(
                figs / f"cifar10-{tag}-pruned.png", points, equal, full, f"{title}: accuracy against pruned %"
            )
            L += [f"![accuracy against measured pruned %]({link(f'cifar10-{tag}-pruned.png')})", ""]
        return L

    def kept(self) -> list[str]:
        """The kept fraction per epoch of the loss-guided runs (seed 0)."""
        guided = [r for r in self.seed0_curves() if r["policy"] in ("seta", "infobatch")]
        if not guided:
            return []
        L = ["Kept fraction per epoch (plan of seed 0):", ""]
        for r in sorted(guided, key=lambda r: (ORDER[r["policy"]], r["label"])):
            es = self.collapsed.get(run_name(r), [])
            L.append(f"* {r['policy']} {r['label']} ({fmt_params(r['params'], 'defaults')}): "
                     + " ".join(f"{e['kept'] / e['n']:.2f}" for e in r["epochs"])
                     + (f" (collapsed after epoch {', '.join(map(str, es))})" if es else ""))  # fmt: skip
        return L + [""]

    def calibration(self) -> list[str]:
        if not self.cal:
            return []
        return ["Settings chosen on the training losses of full data at E (seed 0; `calibrate`, the same grid "
                "as the short study):", "", "| policy | level | setting | simulated pruned % |",
                "| --- | --- | --- | --- |", *calibration_rows(self.cal), ""]  # fmt: skip

    def sample_ratios(self) -> list[float]:
        """Samples trained by each equal-compute full-data run over those of its pruned run (seed 0)."""
        ratios = []
        for rs in self.groups.values():
            if rs[0]["policy"] != "full" and rs[0]["seed"] == 0:
                n, eq = self.equal_compute(rs)
                if eq and eq[0]["seed"] == 0 and n != self.E:
                    trained = [sum(e["streamed"] for e in r["epochs"]) for r in (eq[0], rs[0])]
                    ratios.append(trained[0] / trained[1])
        return ratios

    def checks(self) -> list[str]:
        c = _checks(self.layout, self.section, self.tag, self.results)
        problems = c["results_problems"] + [p for ps in c["run_dirs"].values() for p in ps]
        problems += [  # the curve's last point is the run's final test accuracy
            f"{run_name(r)}: last epoch's test accuracy {r['epochs'][-1]['test_acc']} != final {r['test_acc']}"
            for r in self.results
            if abs(r["epochs"][-1].get("test_acc", r["test_acc"]) - r["test_acc"]) > 1e-12
        ]
        rules = "plan rules, window sequence, target_keep budget, the last per-epoch test accuracy the final one"
        L = [f"Checks (`studies/quality/checks.py`, written to `docs/quality-runs/{self.section.folder}/"
             f"checks.json`): {checked(c['runs_checked'], len(c['run_dirs']), rules, problems)}", ""]  # fmt: skip
        L += [f"* {x}" for x in problems[:50]] + ([""] if problems else [])
        if samples := self.sample_ratios():
            L += [f"Samples trained by each equal-compute full-data run over those of its pruned run (seed 0): "
                  f"{min(samples):.3f} to {max(samples):.3f} (1 = the same compute; whole epochs).", ""]  # fmt: skip
        resumed = [f"`{run_name(r)}` (at epoch {', '.join(str(a['epoch']) for a in r['resumed'])})"
                   for r in self.results if r.get("resumed")]  # fmt: skip
        return L + [
            "Runs resumed after an interruption, from the checkpoint of their last finished epoch (wall "
            "times count the finished epochs of every attempt): " + (", ".join(resumed) or "none") + ".",
            "",
        ]
