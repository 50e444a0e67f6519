"""The noise study's report (``benchmarks/noise_study.py``): generated sections of
docs/quality-pairs.md and docs/quality.md between ``<!-- noise:begin -->`` and ``<!-- noise:end -->``.

Every number comes from the run files under the results folder. Only runs of one machine are
compared: the machine with the most finished runs; the others are listed, not used. The pairs study
run again on another machine lives in a folder of its own beside the study's
(``noise-study-<machine>``, :func:`pairs_folders`) and gets a section of its own. A run enters
the tables only if it finished its schedule with finite losses and its loader delivered exactly
each plan's kept samples (status ``ok``); crashed runs, runs cut short at a deadline, diverged
runs and runs whose loader disagreed with the plan are listed with what happened.

Gaps are paired by seed: the gap of a configuration to a reference is the mean over the seeds
both have of (its value - the reference's value on the same seed), the per-seed gaps in
brackets. A gap is *beyond the noise* when it has at least 2 seeds, every seed's gap has the
same sign, and its magnitude exceeds 2 SE (SE = standard deviation of the per-seed gaps /
sqrt(seeds); with 2 seeds half their difference, so 2 SE is the difference between the seeds).
A target is *met* only where the mean clears its bar by 2 SE (mean - 2 SE at or above it; for a
bar to stay under, mean + 2 SE under it); where only the mean clears it the verdict is *mean
above (under), not resolved*; with one seed, *open (1 seed)*.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.instability import MARK, footnote, unstable
from benchmarks.instability import write as write_instability

from . import docs
from .docs import fmt_params, interp_gap, mean_sd, row, table_head
from .layout import ROOT

BEGIN, END = "<!-- noise:begin -->", "<!-- noise:end -->"
CONV_TOL = 1.0  # points of mean R@1: full data at 2E at most this far above E = stopped rising
TARGET_R1_GAIN = 3.0  # points of mean R@1 above full data (20% mismatched)
TARGET_PRUNED = 0.25  # ... while training at least 25% fewer pairs
TARGET_MISMATCHED = 0.05  # share of mismatched pairs trained once the warm-up is over
TARGET_PR = 0.9  # precision and recall of the suspected set
ORDER = {"full": 0, "random": 1, "seta": 2, "infobatch": 3}
TARGET_HEAD = table_head("| target | configuration | measured (mean over seeds; per seed) | verdict |")
RUN_STEM = re.compile(r"^(pairs|cifar10|sst2)-.*-s\d+$")


# ------------------------------------------------------------------------------ reading
def load_files(results: Path) -> dict[str, Any]:
    """Finished runs, cut-short and crashed runs, calibrations of a results folder (name order)."""
    out: dict[str, Any] = {"runs": [], "cut": [], "crashed": [], "cal": {}}
    if not results.exists():
        return out
    for p in sorted(results.glob("*.json")):
        stem = p.name[: -len(".json")]
        if stem.endswith(".cut"):
            out["cut"].append(json.loads(p.read_text()))
        elif stem.endswith(".crashed"):
            out["crashed"].append(json.loads(p.read_text()))
        elif "-cal-" in stem:
            out["cal"][stem] = json.loads(p.read_text())
        elif RUN_STEM.match(stem):
            out["runs"].append(json.loads(p.read_text()))
    return out


def machine_name(m: dict | None) -> str:
    if not m:
        return "unknown machine"
    return (
        f"{m.get('cpu', '?')}, {m.get('cores', '?')} cores, torch {m.get('torch', '?')} "
        f"({m.get('cpu_capability', '?')})"
    )


STATUS_TEXT = {
    "diverged": "diverged (a non-finite training loss)",
    "plan_mismatch": "its loader did not deliver exactly the plan's kept samples in some epoch",
    "short": "fewer epochs than its schedule",
}


def comparison_group(r: dict) -> str:
    """The runs compared with each other, which must come from one machine: the pairs study, and
    each data set of the noisy-label study."""
    return r.get("study", "?") + ("/" + r["dataset"] if r.get("dataset") else "")


def group_machines(runs: list[dict]) -> dict[str, str]:
    """Each comparison group's machine: the one with the most finished runs of the group (ties: name order)."""
    counts = Counter((comparison_group(r), machine_name(r.get("machine"))) for r in runs)
    out: dict[str, str] = {}
    for (g, m), _ in sorted(counts.items(), key=lambda x: (-x[1], x[0][1])):
        out.setdefault(g, m)
    return out


def on_its_machine(r: dict, machines: dict[str, str]) -> bool:
    return machine_name(r.get("machine")) == machines.get(comparison_group(r))


def split_runs(files: dict) -> tuple[dict[str, str], list[dict], list[str]]:
    """(each comparison group's machine, the runs that enter the tables, a line per run left out)."""
    runs = files["runs"]
    machines = group_machines(runs)
    used, left_out = [], []
    for r in runs:
        if not on_its_machine(r, machines):
            left_out.append(f"`{r['id']}`: ran on another machine ({machine_name(r.get('machine'))}) than the other "
                            "runs it is compared with; not compared")  # fmt: skip
        elif r.get("status") != "ok":
            left_out.append(f"`{r['id']}`: {STATUS_TEXT.get(r.get('status'), r.get('status'))}; left out")
        else:
            used.append(r)
    finished = {r["id"] for r in runs}
    for c in files["crashed"]:
        if c["id"] not in finished:
            when = "" if "-cal-" in c["id"] else f" after {_epochs(c)}"
            left_out.append(f"`{c['id']}`: crashed{when} ({_last_line(c)}); no result")
    for c in files["cut"]:
        if c["id"] not in finished:
            left_out.append(f"`{c['id']}`: cut short at the deadline after {_epochs(c)}; no result")
    return machines, used, left_out


def _epochs(c: dict) -> str:
    k = int(c.get("epochs_done", 0))
    return f"{k} epoch" + ("" if k == 1 else "s")


def _last_line(c: dict) -> str:
    lines = [x for x in str(c.get("error", "")).strip().splitlines() if x.strip()]
    return lines[-1].strip().replace("|", "/").replace("`", "'")[:160] if lines else "no message"


# ------------------------------------------------------------------------------ numbers
def r1(r: dict) -> float:
    """Mean of the final (or an epoch's row's) image->text and text->image R@1, in %."""
    return 50.0 * (r["i2t_r1"] + r["t2i_r1"])


def acc(r: dict) -> float | None:
    """Test accuracy of a run (or after an epoch: None where the run did not record it), in %."""
    return None if r.get("test_acc") is None else 100.0 * r["test_acc"]


class Gap:
    """A gap paired by seed: ``per_seed`` {seed: gap}."""

    def __init__(self, per_seed: dict[int, float]) -> None:
        self.per_seed = dict(sorted(per_seed.items()))
        g = np.array(list(self.per_seed.values()), dtype=np.float64)
        self.n = len(g)
        self.mean = float(g.mean()) if self.n else math.nan
        self.se = float(g.std(ddof=1) / math.sqrt(self.n)) if self.n > 1 else math.nan

    def beyond_noise(self) -> bool:
        g = list(self.per_seed.values())
        same_sign = all(x > 0 for x in g) or all(x < 0 for x in g)
        return self.n >= 2 and same_sign and abs(self.mean) > 2 * self.se

    def text(self, digits: int = 1) -> str:
        if not self.n:
            return "-"
        seeds = ", ".join(f"{x:+.{digits}f}" for x in self.per_seed.values())
        return f"{self.mean:+.{digits}f} ({seeds})"

    def noise_text(self, digits: int = 1) -> str:
        return f"2 SE = {2 * self.se:.{digits}f}" if self.n > 1 else "1 seed: no noise estimate"


def by_seed(rs: list[dict]) -> dict[int, dict]:
    return {r["seed"]: r for r in rs}


def paired(rs: list[dict], ref: list[dict], value: Callable[[dict], float]) -> Gap:
    a, b = by_seed(rs), by_seed(ref)
    return Gap({s: value(a[s]) - value(b[s]) for s in a if s in b})


def vs_random(rs: list[dict], full: list[dict], randoms: list[list[dict]], value: Callable[[dict], float]) -> Gap:
    """Paired by seed against dynamic random at the same measured pruned %: for each seed, random's
    value linearly interpolated between full data (0%) and random's points of that seed."""
    out = {}
    f = by_seed(full)
    for s, r in by_seed(rs).items():
        pts = ([(0.0, value(f[s]))] if s in f else []) + [
            (g[s]["pruned"], value(g[s])) for g in map(by_seed, randoms) if s in g
        ]
        if (v := interp_gap(r["pruned"], value(r), pts)) is not None:
            out[s] = v
    return Gap(out)


def ms(xs: list[float], digits: int = 1) -> str:
    return mean_sd(xs, 1.0, digits)


def mean_pruned(g: list[dict]) -> float:
    return float(np.mean([r["pruned"] for r in g]))


def is_rule(r: dict) -> bool:
    return bool(r["params"].get("noise"))


def active_epochs(r: dict) -> list[dict]:
    """The epochs after the rule's warm-up: the summary says the rule is active (``noise_active``);
    for a plan without that field, from the first epoch with a suspected sample on."""
    rows = r["rows"]
    if any(row.get("noise_active") is not None for row in rows):
        return [row for row in rows if row.get("noise_active")]
    first = next((i for i, row in enumerate(rows) if row.get("suspected")), None)
    return rows[first:] if first is not None else []


def noisy_share(rows: list[dict]) -> float | None:
    """Noisy samples among the trained ones over ``rows`` (pairs: delivered keys; labels: the plan's
    kept samples, which the loader delivered exactly)."""
    if not rows:
        return None
    if "mismatched_trained" in rows[0]:
        t = sum(x["trained"] for x in rows)
        return sum(x["mismatched_trained"] for x in rows) / t if t else None
    t = sum(x["plan_kept"] for x in rows)
    return sum(x["plan_noisy_kept"] for x in rows) / t if t else None


def noisy_kept(x: dict) -> float:
    """Noisy samples among an epoch's planned ones (labels)."""
    return x["plan_noisy_kept"] / max(x["plan_kept"], 1)


def last_active(r: dict) -> dict | None:
    a = active_epochs(r)
    return a[-1] if a else None


def mean_or_none(xs: list[float | None]) -> float | None:
    v = [x for x in xs if x is not None]
    return float(np.mean(v)) if v and len(v) == len(xs) else None


def or_dash(x: float | None, fmt: str, scale: float = 1.0) -> str:
    """``scale * x`` formatted, a dash where there is no value."""
    return "-" if x is None else format(scale * x, fmt)


def pr_text(precision: float | None, recall: float | None, fmt: str = ".2f") -> str:
    return f"{or_dash(precision, fmt)} / {or_dash(recall, fmt)}"


# ------------------------------------------------------------------------------ grouping
def group(runs: list[dict]) -> dict[tuple, list[dict]]:
    g: dict[tuple, list[dict]] = {}
    for r in runs:
        g.setdefault((r["policy"], r["label"], json.dumps(r["params"], sort_keys=True)), []).append(r)
    return {k: sorted(v, key=lambda r: r["seed"]) for k, v in g.items()}


def _sorted_keys(groups: dict) -> list[tuple]:
    def key(k: tuple) -> tuple:
        policy, label, _ = k
        rule = label.startswith("rule") or label.startswith("nz-rule")
        level = re.search(r"p(\d+)", label)
        scale = "noise_scale" in json.loads(k[2])  # the rule on another scale after the default's
        return (int(level.group(1)) if level else 0, rule, ORDER.get(policy, 9), scale, label)

    return sorted(groups, key=key)


def _name(k: tuple) -> str:
    if not json.loads(k[2]).get("noise"):
        return k[0]
    return "rule alone" if k[0] == "full" else f"rule + {k[0]}"


def _setting(k: tuple) -> str:
    return fmt_params(json.loads(k[2]))


# ------------------------------------------------------------------------------ the pairs
def pairs_lines(ctx: Any, files: dict, missing: list[str]) -> list[str]:
    machines, used, left_out = split_runs(files)
    pairs = [r for r in used if r.get("study") == "noise-pairs"]
    lines = [f"{len(pairs)} finished pairs runs enter the tables below"
             + (f"; all ran on one machine: {machines.get('noise-pairs')}." if pairs else ".")]  # fmt: skip
    if pairs:
        E, d, t = pairs[0]["E"], pairs[0]["data"], pairs[0]["train"]
        rule = next((r["params"] for r in pairs if r["label"] == "rule"), None)
        lines += ["", f"Set-up of these runs: {d['train']:,} training pairs in shards of {d['shard_size']:,}, "
                  f"{d['test']:,} clean held-out pairs, {d['size']}x{d['size']} images; E = {E} epochs "
                  f"(full data also at 2E = {2 * E}), batch {t['batch_size']}, peak lr {t['lr']}, "
                  f"{t['workers']} loader worker and 1 torch thread per run"
                  + (f"; the rule alone: `full` with `{json.dumps(rule, sort_keys=True)}`." if rule else "."),
                  ]  # fmt: skip
    lines += ["", *_loader_lines(files, machines, "noise-pairs", "pairs"), *_rule_lines(),
              *e_choice_lines(ctx.results, ctx.epochs)]  # fmt: skip
    for noise in (0.2, 0.0):
        if rs := [r for r in pairs if r["noise"] == noise]:
            lines += pairs_level(rs, noise)
    return lines + pairs_targets(pairs) + _cal_lines(files["cal"], "pairs") + _left_out_lines(left_out, missing)


def _loader_lines(files: dict, machines: dict[str, str], study: str, what: str) -> list[str]:
    """How many run-epochs of the finished runs (each on its group's machine) delivered exactly the
    plan's kept samples."""
    runs = [r for r in files["runs"] if on_its_machine(r, machines) and r.get("study") == study]
    if not runs:
        return []
    bad = [f"`{r['id']}` e{x['epoch']}" for r in runs for x in r["rows"] if not x.get("delivered_equals_plan")]
    n = sum(len(r["rows"]) for r in runs)
    return [f"**Loader vs plan:** in {n - len(bad)} of {n} run-epochs the loader delivered exactly the plan's kept "
            f"{what}" + (f" (not in {', '.join(bad[:20])})." if bad else "."), ""]  # fmt: skip


def e_choice_lines(results: Path, E: int) -> list[str]:
    """How E was chosen: full data trained far longer (one schedule) on the development machine,
    its mean R@1 after every epoch (files ``e-choice/*.json``), the epochs it rose for (up to the
    last epoch that no later one beats by more than ``CONV_TOL``), and the study's E against those."""
    runs = [json.loads(p.read_text()) for p in sorted((results / "e-choice").glob("*.json"))]
    if not runs:
        return []
    out = ["**How E was chosen:** before the study, full data was trained for one long schedule on the development "
           "machine; its mean R@1 after every epoch (these runs are not compared with the study's):", ""]  # fmt: skip
    verdicts = []
    for r in sorted(runs, key=lambda r: -r["data"]["noise"]):
        curve = [r1(x) for x in r["rows"]]
        stop = next(e for e in range(len(curve)) if max(curve[e:]) <= curve[e] + CONV_TOL)
        d = r["data"]
        name = f"{round(100 * d['noise'])}% mismatched"
        out.append(f"* {name}, {d['train']:,} pairs, {len(curve)} epochs, seed {r['seed']} "
                   f"({machine_name(r.get('machine'))}): " + ", ".join(f"{x:.1f}" for x in curve) + ". No later epoch "
                   f"is more than {CONV_TOL:.1f} point above epoch {stop} ({curve[stop]:.1f}): R@1 rose for {stop + 1} "
                   f"of its {len(curve)} epochs.")  # fmt: skip
        verdicts.append(f"covers the {stop + 1} epochs the {name} set rose for" if stop + 1 <= E else
                        f"is shorter than the {stop + 1} epochs the {name} set rose for: its comparisons are before "
                        "convergence (the 2E check below measures by how much)")  # fmt: skip
    return out + ["", f"The study's E = {E} " + "; it ".join(verdicts) + ".", ""]


def _rule_lines() -> list[str]:
    return [  # fmt: skip
        "A run enters the tables only if it finished its schedule with finite losses and its loader "
        "delivered exactly each plan's kept samples; crashed runs, runs cut short at a deadline, diverged "
        "runs and runs from another machine are listed at the end, not averaged in. Gaps are paired by seed: "
        "mean over the seeds of (run - reference on the same seed), per-seed gaps in brackets; *beyond the "
        "noise* = every seed the same sign and |mean| > 2 SE (SE = SD of the per-seed gaps / sqrt(seeds)). A "
        "target is *met* only where mean - 2 SE clears its bar (mean + 2 SE for a bar to stay under); where only "
        "the mean clears it: *mean above (under), not resolved*; one seed: *open (1 seed)*.", ""]  # fmt: skip


def _convergence(rs: list[dict], noise: float) -> list[str]:
    full = [r for r in rs if r["label"] == "full"]
    full2 = [r for r in rs if r["label"] == "full2E"]
    if not full:
        return []
    E = full[0]["E"]
    out = [f"**Convergence, {round(100 * noise)}% mismatched:** full data's mean R@1 (i2t and t2i) after every epoch:",
           ""]  # fmt: skip
    width = max(len(r["rows"]) for r in full + full2)
    out += table_head(row(["run", "seed", *(f"e{e}" for e in range(width))]))
    for r in full + full2:
        cells = [f"{r1(x):.1f}" for x in r["rows"]] + [""] * (width - len(r["rows"]))
        out.append(row([f"{'E' if r['label'] == 'full' else '2E'} = {len(r['rows'])}", str(r["seed"]), *cells]))
    out.append("")
    gap = paired(full2, full, r1)
    if gap.n:
        a = np.mean([r1(r) for r in full if r["seed"] in gap.per_seed])
        b = np.mean([r1(r) for r in full2 if r["seed"] in gap.per_seed])
        verdict = (f"at most {CONV_TOL:.1f} point: full data's R@1 has stopped rising at E" if gap.mean <= CONV_TOL
                   else f"**more than {CONV_TOL:.1f} point: full data's R@1 is still rising at E** (a longer E is "
                   "needed for the comparisons to be at convergence)")  # fmt: skip
        out += [f"Full data at E = {E}: {a:.1f}, at 2E = {2 * E}: {b:.1f} (mean R@1 over seeds "
                f"{', '.join(str(s) for s in gap.per_seed)}); 2E - E {gap.text()}: {verdict}.", ""]  # fmt: skip
    else:
        out += [f"Full data at 2E = {2 * E} is not in yet: convergence not shown.", ""]
    return out


def _at_2e(rs: list[dict], noise: float) -> list[str]:
    """The rule alone trained for 2E epochs beside full data at 2E (paired by seed): its R@1, the
    pairs it suspected (at most, in any plan) and, with mismatched pairs, the precision and recall of
    its last plan."""
    full2 = [r for r in rs if r["label"] == "full2E"]
    groups = group([r for r in rs if r["label"].endswith("2E") and r["label"] != "full2E"])
    if not groups:
        return []
    out = [f"The rule alone at 2E = {2 * rs[0]['E']} epochs, beside full data at 2E (same seeds):", "",
           *table_head("| policy | setting | seeds | pruned % | mean R@1 | mean R@1 vs full data at 2E "
                       "| suspected pairs (most in a plan) | mismatched % of trained pairs after warm-up "
                       "| suspected set: precision / recall (last epoch) |")]  # fmt: skip
    for k in _sorted_keys(groups):
        g = groups[k]
        _, _, after, _, prec, rec = _rule_cells(g)
        most = [max(x.get("suspected") or 0 for x in r["rows"]) for r in g]
        share = "-" if not noise else or_dash(after, ".1f", 100)
        out.append(row([*_lead_cells(k, g), ms([r1(r) for r in g]), paired(g, full2, r1).text(),
                        ", ".join(str(m) for m in most), share, pr_text(prec, rec) if noise
                        else "-"]))  # fmt: skip
    return [*out, "", *_unstable_note(list(groups.values()))]


def _full_name(k: tuple, g: list[dict]) -> str:
    """The configuration's marked name and its setting."""
    return f"{_marked(k, g)} {_setting(k)}"


def _lead_cells(k: tuple, g: list[dict]) -> list[str]:
    """A table row's first cells: the policy, its setting, the seeds, the pruned %."""
    return [_marked(k, g), _setting(k), str(len(g)), ms([100 * r["pruned"] for r in g])]


def _marked(k: tuple, g: list[dict]) -> str:
    """The configuration's name, marked where a run of it collapsed to chance or fell 20 points in one
    epoch (``benchmarks.instability``)."""
    return _name(k) + (f" {MARK}" if any(unstable(r) for r in g) else "")


def _unstable_note(gs: list[list[dict]]) -> list[str]:
    """The footnote under a table whose rows hold the runs ``gs`` and a blank line (none where no run is unstable)."""
    files = sorted({f"{r.get('id', '?')}.json" for g in gs for r in g if unstable(r)})
    return [footnote(files), ""] if files else []


def _rule_cells(g: list[dict]) -> tuple[bool, float | None, float | None, list, float | None, float | None]:
    """A group's noise-rule figures: (whether its runs use the rule, the noisy share of what was
    trained over the runs, the same after the warm-up (rule only), each run's last epoch with the
    rule active, and their mean precision and recall (rule only))."""
    rule = is_rule(g[0])
    share = noisy_share([x for r in g for x in r["rows"]])
    after = mean_or_none([noisy_share(active_epochs(r)) for r in g]) if rule else None
    la = [last_active(r) for r in g]
    prec = mean_or_none([x.get("precision") if x else None for x in la]) if rule else None
    rec = mean_or_none([x.get("recall") if x else None for x in la]) if rule else None
    return rule, share, after, la, prec, rec


def pairs_level(rs: list[dict], noise: float) -> list[str]:
    pct = round(100 * noise)
    title = f"{pct}% mismatched training pairs" if noise else "clean pairs (0% mismatched)"
    lines = [f"#### {title}", ""] + _convergence(rs, noise) + _at_2e(rs, noise)
    main = [r for r in rs if not r["label"].endswith("2E")]
    groups = group(main)
    full_key, full, randoms = _references(groups)
    head = ("| policy | setting | seeds | pruned % | R@1 i2t | R@1 t2i | R@5 i2t | R@5 t2i | mean R@1 vs full data "
            "| mean R@1 vs dynamic random at that pruned % | mismatched % of trained pairs (run / after warm-up) "
            "| suspected set: precision / recall (last epoch of the rule) |")  # fmt: skip
    lines += table_head(head)
    keys = _sorted_keys(groups)
    for k in keys:
        g = groups[k]
        rule, share, after, la, prec, rec = _rule_cells(g)
        sus = f"{or_dash(mean_or_none([x.get('suspected') if x else None for x in la]), '.0f')} suspected"
        lines.append(row([
            *_lead_cells(k, g), *(ms([100 * r[c] for r in g]) for c in ("i2t_r1", "t2i_r1", "i2t_r5", "t2i_r5")),
            "-" if k[0] == "full" and not rule else paired(g, full, r1).text(),
            "-" if (k[0] == "random" and not rule) or k == full_key
            else vs_random(g, full, randoms, r1).text(),
            ("-" if not noise else f"{100 * share:.1f}" if share is not None else "-")
            + (f" / {100 * after:.1f}" if rule and noise and after is not None else ""),
            pr_text(prec, rec) if rule and noise else (sus if rule else "-")]))  # fmt: skip
    lines += ["", *_unstable_note([groups[k] for k in keys])]
    E = len(main[0]["rows"]) if main else 0

    def table(title: str, cell: Callable[[list[dict], int], str], keys: list[tuple] = keys) -> list[str]:
        return _epoch_table(title, groups, keys, E, cell)

    lines += table("Mean R@1 after each epoch (mean over seeds):",
                   lambda g, e: f"{np.mean([r1(r['rows'][e]) for r in g]):.1f}")  # fmt: skip
    lines += table("Kept fraction per epoch (plan, mean over seeds):",
                   lambda g, e: f"{np.mean([r['rows'][e]['kept'] / r['rows'][e]['n'] for r in g]):.2f}")  # fmt: skip
    if noise:
        lines += table("Mismatched % of the pairs the loader delivered, per epoch (mean over seeds):",
                       lambda g, e: f"{100 * np.mean([r['rows'][e]['mismatched_share'] for r in g]):.1f}")  # fmt: skip

    def pr(g: list[dict], e: int) -> str:
        rows = [r["rows"][e] for r in g]
        n = np.mean([x.get("suspected") or 0 for x in rows])
        if not noise:
            return f"{n:.0f}"
        p, q = mean_or_none([x.get("precision") for x in rows]), mean_or_none([x.get("recall") for x in rows])
        return f"{n:.0f}: {or_dash(p, '.2f')}/{or_dash(q, '.2f')}"

    if not any(is_rule(g[0]) for g in groups.values()):
        return lines
    return lines + table("Suspected pairs per epoch" + (": count: precision/recall against `noise.parquet`" if noise
                                                        else " (every one a clean pair)")
                         + " (mean over seeds; the plan's rows with reason `suspected_noise` or `noise_recheck`):",
                         pr, [k for k in keys if is_rule(groups[k][0])])  # fmt: skip


def _epoch_table(
    title: str,
    groups: dict,
    keys: list[tuple],
    E: int,
    cell: Callable[[list[dict], int], str],
    extra: tuple[list[str], Callable[[list[dict]], list[str]]] = ([], lambda g: []),
) -> list[str]:
    """A table with a row per configuration of ``keys`` and a column per epoch (``cell(runs, epoch)``),
    then the ``extra`` columns (names, cells of a row's runs), and its footnote."""
    lines = [title, "", *table_head(row(["policy", "setting", *(f"e{e}" for e in range(E)), *extra[0]]))]
    for k in keys:
        lines.append(row([_marked(k, groups[k]), _setting(k), *(cell(groups[k], e) for e in range(E)),
                          *extra[1](groups[k])]))  # fmt: skip
    return [*lines, "", *_unstable_note([groups[k] for k in keys])]


def _references(groups: dict) -> tuple[tuple | None, list[dict], list[list[dict]]]:
    """A table's references: full data's key and runs, and dynamic random's runs at each level."""
    full = next((k for k in groups if k[0] == "full" and k[2] == "{}"), None)
    randoms = [v for k, v in groups.items() if k[0] == "random" and not json.loads(k[2]).get("noise")]
    return full, groups.get(full, []), randoms


def pairs_targets(pairs: list[dict]) -> list[str]:
    rows: list[list[str]] = []
    g20, g0 = (group([r for r in pairs if r["noise"] == noise and not r["label"].endswith("2E")]) for noise in (0.2, 0))
    full20 = _references(g20)[1]
    rule20 = {k: v for k, v in g20.items() if is_rule(v[0])}
    # 1. R@1 at least 3 points above full data while training at least 25% fewer pairs
    cands = {k: v for k, v in rule20.items() if mean_pruned(v) >= TARGET_PRUNED}
    what = "mean R@1 >= full data + 3 points at >= 25% fewer pairs (20% mismatched)"
    if not full20 or not rule20:
        rows.append([what, "-", "not measured (runs missing)", "open"])
    elif not cands:
        most = max(rule20, key=lambda k: mean_pruned(rule20[k]))
        p = mean_pruned(rule20[most])
        rows.append([what, _name(most), f"no rule run pruned 25% (most: {100 * p:.1f}%)",
                     f"missed by {100 * (TARGET_PRUNED - p):.1f} points of pruned %"])  # fmt: skip
    for k in _sorted_keys(cands) if full20 else []:  # every rule configuration that pruned enough
        gap = paired(cands[k], full20, r1)
        measured = f"{gap.text()} points at {100 * mean_pruned(cands[k]):.1f}% pruned ({gap.noise_text()})"
        verdict = target_verdict(list(gap.per_seed.values()), TARGET_R1_GAIN, "points")
        rows.append([what, _full_name(k, cands[k]), measured, verdict])
    # 2-4. per rule configuration: mismatched share after warm-up, precision, recall
    for k in _sorted_keys(rule20):
        v = rule20[k]
        share = [noisy_share(active_epochs(r)) for r in v]
        la = [last_active(r) for r in v]
        name = _full_name(k, v)
        what = "mismatched < 5% of trained pairs after the warm-up"
        if any(s is None for s in share):
            rows.append([what, name, "the rule never became active", "missed"])
        else:
            verdict = target_verdict(share, TARGET_MISMATCHED, "points", scale=100, under=True)
            per = ", ".join(f"{100 * s:.1f}" for s in share)
            rows.append([what, name, f"{100 * float(np.mean(share)):.1f}% ({per})",
                         verdict + (under_from(v) if verdict.startswith("missed") else "")])  # fmt: skip
        for what in ("precision", "recall"):
            vals = [x.get(what) if x else None for x in la]
            measured = f"{float(np.mean(vals)):.3f} ({', '.join(f'{x:.3f}' for x in vals)})" if None not in vals else ""
            rows.append([f"{what} of the suspected set >= 0.9", name, measured or "no suspected set",
                         target_verdict(vals, TARGET_PR, "") if measured else "missed"])  # fmt: skip
    # 5. clean pairs: no worse than dynamic random at the same pruned % beyond the noise
    _, full0, randoms0 = _references(g0)
    rule0 = [k for k in _sorted_keys(g0) if is_rule(g0[k][0])]
    for k in rule0:
        v = g0[k]
        gap = vs_random(v, full0, randoms0, r1)
        what, name = "clean pairs: mean R@1 no worse than dynamic random at the same pruned %", _full_name(k, v)
        if not gap.n:
            rows.append([what, name, "no random reference at that pruned %", "open"])
            continue
        if gap.n < 2:
            rows.append([what, name, f"{gap.text()} points (1 seed)", "open (1 seed)"])
            continue
        verdict = target_verdict(list(gap.per_seed.values()), 0.0, "points")
        if gap.mean < 0 and gap.beyond_noise():
            verdict = f"missed: {-gap.mean:.1f} points below, beyond the noise"
        elif verdict.startswith("missed"):  # below, within the noise
            verdict = "mean below, not resolved"
        silent = _silent(v, k) if verdict.startswith(("missed", "mean below", "at the bar")) else ""
        rows.append([what, name, f"{gap.text()} points ({gap.noise_text()})", verdict + silent])
    note = _unstable_note(list(rule20.values()) + [g0[k] for k in rule0])
    return ["#### Targets (issue 26)", "", *TARGET_HEAD, *map(row, rows), "", *note]


def _silent(v: list[dict], k: tuple) -> str:
    """Why a rule configuration on clean pairs missed or sits at the bar, where the rule suspected nothing
    in any plan: its plans are the policy's own at that setting, so the gap is the policy's, not the rule's."""
    if any(x.get("suspected") for r in v for x in r["rows"]):
        return ""
    p = {a: b for a, b in json.loads(k[2]).items() if not a.startswith("noise")}
    own = "full data's own plans" if k[0] == "full" else f"{k[0]}'s own plans at {fmt_params(p)}"
    return f"; the rule suspected nothing in any plan: these are {own}"


def under_from(v: list[dict]) -> str:
    """Why the mean after the warm-up missed: from which epoch on every later epoch trained under 5%
    mismatched pairs (mean over the seeds), and the epochs of the warm-up's wake before it."""
    rows = [active_epochs(r) for r in v]
    n = min(len(x) for x in rows)
    per_epoch = [float(np.mean([noisy_share([x[i]]) or 0.0 for x in rows])) for i in range(n)]
    first = next((i for i in range(n) if all(p < TARGET_MISMATCHED for p in per_epoch[i:])), None)
    if first is None or first == 0:
        return ""
    e0 = rows[0][first]["epoch"]
    before = ", ".join(f"e{rows[0][i]['epoch']} {100 * per_epoch[i]:.1f}%" for i in range(first))
    return f"; under 5% in every epoch from e{e0} on, above it in the rule's first active epochs ({before})"


def target_verdict(values: list[float], target: float, unit: str, scale: float = 1.0, under: bool = False,
             digits: int | None = None) -> str:  # fmt: skip
    """The verdict on a target from the per-seed values (or per-seed gaps): *met* only where the mean
    clears ``target`` by 2 SE (mean - 2 SE > target; ``under``: mean + 2 SE < target), *at the bar* where
    every value equals it (identical runs: 2 SE = 0, as in ``common.gap_verdict``), *mean above (under),
    not resolved* where only the mean clears it, *missed by* how much where the mean does not; open with
    fewer than 2 seeds. SE = SD (ddof 1) / sqrt(seeds): with 2 seeds, half their difference, so 2 SE is
    the difference between the seeds."""
    if len(values) < 2:
        return "open (1 seed)"
    gap = Gap(dict(enumerate(values)))
    m, two_se = gap.mean, 2 * gap.se
    u = f" {unit}" if unit else ""
    digits = digits if digits is not None else 1 if unit else 3
    if under:
        if m + two_se < target:
            return "met"
        if m < target:
            return f"mean under, not resolved (mean + 2 SE = {(m + two_se) * scale:.{digits}f}{u})"
        return f"missed by {(m - target) * scale:.{digits}f}{u}"
    if two_se == 0 and m == target:
        return "at the bar"
    if m - two_se > target:
        return "met"
    if m > target:
        return f"mean above, not resolved (mean - 2 SE = {(m - two_se) * scale:.{digits}f}{u})"
    return f"missed by {(target - m) * scale:.{digits}f}{u}"


def _cal_lines(cals: dict, study: str) -> list[str]:
    rows = []
    for stem, c in sorted(cals.items()):
        if not stem.startswith("pairs-" if study == "pairs" else ("cifar10-", "sst2-")):
            continue
        data, name = stem.split("-cal-")
        if name == "base":  # each policy's levels, or the rule's with a policy on top beside the rule alone
            levels = [(p, lv, v, "-") for p, lvs in sorted(c["levels"].items()) for lv, v in sorted(lvs.items())]
        else:
            alone = or_dash(c.get("rule_alone", {}).get("pruned"), ".1f", 100)
            levels = [(f"rule + {name.split('-')[1]}", lv, v, alone) for lv, v in sorted(c["levels"].items())]
        rows += [row([data, p, f"{lv}%", fmt_params(v["params"]), f"{100 * v['simulated']:.1f}", alone])
                 for p, lv, v, alone in levels]  # fmt: skip
    if not rows:
        return []
    return [
        "#### Settings chosen on training losses (replays over full data's recorded losses, seed 0)",
        "",
        *table_head("| data | policy | level | setting | simulated pruned % | the rule alone, simulated pruned % |"),
        *rows,
        "",
    ]


def _left_out_lines(left_out: list[str], missing: list[str]) -> list[str]:
    out = []
    if left_out:
        out += ["**Runs left out of the tables:**", "", *[f"* {x}" for x in left_out], ""]
    if not missing:
        return [*out, "Every run of the study's plan is in.", ""]
    return [*out, f"**Not run yet ({len(missing)}; the same command resumes with them):** {'; '.join(missing)}.", ""]


# ------------------------------------------------------------------------------ noisy labels
def labels_lines(ctx: Any, files: dict, missing: list[str]) -> list[str]:
    machines, used, left_out = split_runs(files)
    runs = [r for r in used if r.get("study") == "noise-labels"]
    where = sorted({(r["dataset"], machines.get(comparison_group(r))) for r in runs})
    each = "; ".join(f"{d}: {m}" for d, m in where)
    lines = [f"{len(runs)} finished noisy-label runs enter the tables below" + (f"; the runs of each data set ran on "
             f"one machine ({each}), and only runs of one data set and schedule are compared" if runs else "") + ".",
             "", *_loader_lines(files, machines, "noise-labels", "samples"), *_rule_lines()]  # fmt: skip
    targets: list[list[str]] = []
    target_groups: list[list[dict]] = []
    sections = sorted({(r["dataset"], schedule(r)) for r in runs})  # cifar10 before sst2, short before long
    for dataset, (E, augmented) in sections:
        rs = [r for r in runs if r["dataset"] == dataset and schedule(r) == (E, augmented)]
        groups = group(rs)
        full_key, full, randoms = _references(groups)
        lines += [f"#### {dataset}, 40% noisy labels ({E} epochs{'' if augmented else ', no augmentation'})", "",
                  *table_head("| policy | setting | seeds | pruned % | test acc % | val acc % | test acc vs full "
                              "data | test acc vs dynamic random at that pruned % | noisy % of trained samples "
                              "(run / after warm-up) | suspected set: precision / recall (last epoch of the rule) "
                              "|")]  # fmt: skip
        keys = _sorted_keys(groups)
        for k in keys:
            g = groups[k]
            rule, share, after, la, prec, rec = _rule_cells(g)
            lines.append(row([
                *_lead_cells(k, g), ms([100 * r["test_acc"] for r in g], 2), ms([100 * r["val_acc"] for r in g], 2),
                "-" if k == full_key else paired(g, full, acc).text(2),
                "-" if (k[0] == "random" and not rule) or k == full_key else vs_random(g, full, randoms, acc).text(2),
                f"{or_dash(share, '.1f', 100)}"
                + (f" / {or_dash(after, '.1f', 100)}" if rule else ""),
                pr_text(prec, rec) if rule else "-"]))  # fmt: skip
            if rule and dataset == "cifar10":
                gap = paired(g, full, acc)
                what = f"CIFAR-10 with 40% noisy labels, {E} epochs: test accuracy above full data"
                v = target_verdict(list(gap.per_seed.values()), 0.0, "points", digits=2) if gap.n else "open"
                targets.append([what, _full_name(k, g), f"{gap.text(2)} points ({gap.noise_text(2)})", v])
                target_groups.append(g)
        lines += ["", *_unstable_note([groups[k] for k in keys])]
        title = "Noisy % of the samples trained per epoch (the plan's kept samples; mean over seeds):"
        lines += _epoch_table(
            title, groups, keys, E, lambda g, e: f"{100 * np.mean([noisy_kept(x['rows'][e]) for x in g]):.1f}"
        )
        lines += _curve_lines(groups, keys, E)
    if targets:
        lines += ["#### Target (issue 26)", "", *TARGET_HEAD, *map(row, targets), ""]
        lines += _unstable_note(target_groups)
    left, todo = (
        [x for x in left_out if not x.startswith("`pairs-")],
        [x for x in missing if not x.startswith("pairs-")],
    )
    return lines + _cal_lines(files["cal"], "labels") + _left_out_lines(left, todo)


def schedule(r: dict) -> tuple[int, bool]:
    """(epochs, augmented) of a noisy-label run: the short study's schedule, or the long one."""
    return len(r["rows"]), bool(r.get("augment", True))


def _curve_lines(groups: dict, keys: list[tuple], E: int) -> list[str]:
    """Test accuracy after every epoch (runs that record it), and full data's best epoch: whether
    full data has stopped rising, and by how much it fell from its best by the end."""
    keys = [k for k in keys if all(r["rows"][0].get("test_acc") is not None for r in groups[k])]

    def curve(g: list[dict], e: int) -> float:
        return float(np.mean([100 * r["rows"][e]["test_acc"] for r in g]))

    def best(g: list[dict]) -> list[str]:
        c = [curve(g, e) for e in range(E)]
        b = int(np.argmax(c))
        return [f"e{b} ({c[b]:.1f})", f"{c[-1] - c[b]:+.1f}"]

    extra = (["best epoch (best)", "end - best"], best)
    title = "Test accuracy after every epoch (%, mean over seeds):"
    return _epoch_table(title, groups, keys, E, lambda g, e: f"{curve(g, e):.1f}", extra) if keys else []


# ------------------------------------------------------------------------------ writing
def splice(doc: Path, lines: list[str], begin: str = BEGIN, end: str = END, skip_missing: bool = False) -> None:
    docs.splice(doc, begin, end, lines, skip_missing=skip_missing)


# docs/results.md's summary of the targets (its table against full data's last epoch: TABLE_BEGIN)
README_BEGIN, README_END = "<!-- noise-summary:begin -->", "<!-- noise-summary:end -->"


def where(folder: Path, root: Path) -> str:
    """A results folder as the docs name it: relative to the repository where it lies in it."""
    return f"{folder.relative_to(root)}/" if folder.is_relative_to(root) else f"{folder}/"


def readme_lines(files: dict, folder: str = "docs/quality-runs/noise-study/") -> list[str]:
    """docs/results.md's summary of the measurement in ``folder``: the targets that every seed of a
    configuration has measured (rows still open for want of seeds are left to docs/quality-pairs.md)."""
    machines, used, _ = split_runs(files)
    m = machines.get("noise-pairs")
    pairs = [r for r in used if r.get("study") == "noise-pairs"]
    targets = pairs_targets(pairs)
    rows = [x for x in targets if x.startswith("| ") and x not in TARGET_HEAD and "open" not in x.rsplit("|", 2)[-2]]
    notes = [x for x in targets if x.startswith(MARK) and MARK in "".join(rows)]
    seeds = sorted({r["seed"] for r in pairs})
    size = f"{pairs[0]['data']['train']:,} pairs, E = {pairs[0]['E']}" if pairs else "no run yet"
    return [
        f"Measured by `benchmarks/noise_study.py` ({len(pairs)} finished pairs runs of {size}, seeds "
        f"{', '.join(map(str, seeds))}, on one machine: {m}; generated from `{folder}`, "
        "the whole comparison and the runs still missing in docs/quality-pairs.md), the targets measured on "
        "every seed so far:",
        "",
        *TARGET_HEAD,
        *rows,
        *(["", *notes] if notes else []),
    ]


def readme_summary(studies: list[tuple[int, Path, dict]], root: Path) -> list[str]:
    """docs/results.md's block: the targets of the study with the most finished pairs runs (one machine), and
    a line naming each other machine's study, whose section is in docs/quality-pairs.md."""

    ranked = sorted(studies, key=lambda x: -x[0])  # stable: the study's own folder wins a tie
    n, folder, files = ranked[0]
    out = readme_lines(files, where(folder, root))
    for n2, f2, files2 in ranked[1:]:
        if n2:
            runs = f"{n2} finished pairs run" + ("" if n2 == 1 else "s")
            m = split_runs(files2)[0].get("noise-pairs")
            out += ["", f"The same study on another machine ({m}, {runs}, `{where(f2, root)}`) has its own section in "
                        "docs/quality-pairs.md."]  # fmt: skip
    return out


TABLE_BEGIN, TABLE_END = "<!-- results-readme:begin -->", "<!-- results-readme:end -->"


def _table_row(data: str, k: tuple, g: list[dict], base: list[dict], value: Callable[[dict], Any], digits: int) -> str:
    """One row of README's results table: a configuration against full data of the same seeds (the
    best epoch of the mean curve over seeds where every epoch of every run recorded it: ``value`` of a row)."""
    points = [[value(r["rows"][e]) for r in g] for e in range(len(g[0]["rows"]))]
    best = "-"
    if points and all(None not in p for p in points):
        curve = [float(np.mean(p)) for p in points]
        best = f"{max(curve):.{digits}f} (e{int(np.argmax(curve))})"
    name = "full data (the baseline)" if k[0] == "full" and not is_rule(g[0]) else f"{_marked(k, g)} ({_setting(k)})"
    pruned, final = 100 * mean_pruned(g), float(np.mean([value(r) for r in g]))
    gap = paired(g, base, value)
    two_se = f"{2 * gap.se:.{digits}f}" if gap.n > 1 else "-"
    gap_cells = ["-"] * 3 if g is base else [gap.text(digits), two_se, "yes" if gap.beyond_noise() else "no"]
    seeds = ", ".join(str(r["seed"]) for r in g)
    return row([data, name, f"{pruned:.1f}", f"{final:.{digits}f}", best, *gap_cells, seeds])


def results_table(studies: list[tuple[int, Path, dict]], files: dict, labels: Path, root: Path) -> list[str]:
    """docs/results.md's table against full data's last epoch (README's before the baseline studies):
    on pairs with 20% mismatched captions (the study with the most finished
    pairs runs) full data, the rule alone, pruning alone and the rule with pruning on top at the 30%
    level, the rule with pruning at 50%; the rule alone on clean pairs; CIFAR-10 with 40% noisy labels
    on the long schedule (``files``, the run files of the folder ``labels``). Each against full data
    trained as long from the same seed."""

    n, folder, pfiles = sorted(studies, key=lambda x: -x[0])[0]
    machines, used, _ = split_runs(pfiles)
    pairs = [r for r in used if r.get("study") == "noise-pairs" and not r["label"].endswith("2E")]
    lines = []
    shown: list[list[dict]] = []  # the runs of the rows, for the instability footnote
    for noise in (0.2, 0.0):
        groups = group([r for r in pairs if r["noise"] == noise])
        base = _references(groups)[1]
        if not base:
            continue
        data = f"pairs, {round(100 * noise)}% mismatched" if noise else "pairs, clean"
        for k in _sorted_keys(groups):
            rule, label = is_rule(groups[k][0]), k[1]
            if (noise and k[0] != "infobatch" and (label in ("full", "p30") or (rule and "2E" not in label))) or (
                not noise and k[0] == "full" and label == "rule"
            ):
                lines.append(_table_row(data, k, groups[k], base, r1, 1))
                shown.append(groups[k])
    lmachines, lused, _ = split_runs(files)
    cifar = [r for r in lused if r.get("study") == "noise-labels" and r["dataset"] == "cifar10"]
    long = max((schedule(r) for r in cifar), default=None)
    lab = [r for r in cifar if schedule(r) == long]
    lgroups = group(lab)
    lbase = _references(lgroups)[1]
    if lbase and long:
        data = f"CIFAR-10, 40% noisy labels, {long[0]} epochs"
        for k in (k for k in _sorted_keys(lgroups) if k[0] == "full"):
            lines.append(_table_row(data, k, lgroups[k], lbase, acc, 2))
            shown.append(lgroups[k])
    if not lines:
        return ["(no finished run of the noise study yet)"]
    L: list[str] = [
        "Generated by `benchmarks/noise_study.py --report-only` from the result files. The baseline is full data "
        "trained for the same epochs from the same seed; *minus full data* is the mean over seeds of (run - full "
        "data of that seed), each seed's in brackets; *beyond the noise*: every seed the same sign and |mean| > 2 SE.",
        "",
        *table_head(
            "| data | configuration | pruned % | final R@1 or accuracy % | best epoch | minus full data "
            "(per seed) | 2 SE | beyond the noise | seeds |"
        ),
        *lines,
        "",
        *(f"* {x}" for x in _unstable_note(shown)[:1]),
    ]
    if pairs:
        d = pairs[0]["data"]
        L.append(f"* Pairs: {d['train']:,} generated image-text pairs, E = {len(pairs[0]['rows'])}, {n} finished "
                 f"runs on one machine ({machines.get('noise-pairs')}), `{where(folder, root)}`; mean R@1 of "
                 f"image-to-text and text-to-image on {d['test']:,} clean held-out pairs. Every configuration and "
                 "target: [quality-pairs.md](quality-pairs.md), summed up in the tables below.")  # fmt: skip
    if lbase and long:
        L.append(f"* CIFAR-10: {len(lab)} runs on one machine ({lmachines.get('noise-labels/cifar10')}), "
                 f"`{where(labels, root)}`, test accuracy; the 6-epoch schedule and SST-2: "
                 "[quality.md](quality.md#the-noise-rule-on-noisy-labels).")  # fmt: skip
    return L


REPLICA = "noise-study-"  # a folder named so beside the study's folder: the pairs study on another machine


def is_study_folder(results: Path) -> bool:
    """Whether ``results`` is the study's own folder (``noise-study``), beside which replicas live."""
    return results.name + "-" == REPLICA


def pairs_folders(results: Path) -> list[Path]:
    """The results folders whose pairs study the report writes: ``results``, and where it is the
    study's own folder (``noise-study``), each replica beside it (``noise-study-<machine>``: the
    same plan and settings run on another machine, compared only within itself, in a section of its
    own). A replica given as ``results`` is written alone."""
    if not is_study_folder(results):
        return [results]
    return [results, *sorted(d for d in results.parent.glob(REPLICA + "*") if d.is_dir())]


def pairs_markers(results: Path) -> tuple[str, str]:
    """The section of docs/quality-pairs.md that ``results``' pairs study fills."""
    if not results.name.startswith(REPLICA):
        return BEGIN, END
    return f"<!-- noise:{results.name}:begin -->", f"<!-- noise:{results.name}:end -->"


def report(ctx: Any, missing_runs: Callable[[Any, dict], list[str]], pairs_doc: Path | None = None,
           labels_doc: Path | None = None) -> None:  # fmt: skip
    """Every section of the noise study (``missing_runs(ctx, files)``: the plan's runs not in ``files``)."""
    files = load_files(ctx.results)
    missing = missing_runs(ctx, files)
    docs = (ctx.out / "docs") if ctx.smoke else ROOT / "docs"
    repo_docs = pairs_doc is None and not ctx.smoke  # results.md's sections: the repository's docs only
    pairs_doc = pairs_doc or docs / "quality-pairs.md"
    labels_doc = labels_doc or docs / "quality.md"
    pairs_doc.parent.mkdir(parents=True, exist_ok=True)
    studies = []  # (finished pairs runs, folder, its files)
    for folder in pairs_folders(ctx.results):
        sub = dataclasses.replace(ctx, results=folder, labels=ctx.labels and folder == ctx.results)
        f = files if folder == ctx.results else load_files(folder)
        m = missing if folder == ctx.results else missing_runs(sub, f)
        splice(pairs_doc, pairs_lines(sub, f, [x for x in m if x.startswith("pairs-")]), *pairs_markers(folder))
        studies.append((sum(r.get("study") == "noise-pairs" for r in split_runs(f)[1]), folder, f))
    # docs/results.md and README sum up every folder: written from the study's own folder only
    if repo_docs and is_study_folder(ctx.results):
        write_instability(ROOT / "docs" / "quality-runs", docs / "quality.md")  # every study folder's runs
        results = docs / "results.md"  # the sections only where results.md has their markers
        splice(results, readme_summary(studies, ROOT), README_BEGIN, README_END, skip_missing=True)
        # the noise study's table against full data's last epoch (README's headline is benchmarks/headline.py's)
        splice(results, results_table(studies, files, ctx.results, ROOT), TABLE_BEGIN, TABLE_END, skip_missing=True)
    if ctx.labels or any(r.get("study") == "noise-labels" for r in files["runs"]):
        splice(labels_doc, labels_lines(ctx, files, missing))
