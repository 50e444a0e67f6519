"""The noise study's report (``studies/noise_study.py``): the generated sections of
docs/quality-pairs.md and docs/quality.md between ``<!-- noise:begin -->`` and ``<!-- noise:end -->``,
and docs/results.md's summary and its table against full data's last epoch.

Every number comes from the run files under the results folder. Only runs of one machine are
compared: in each comparison group, the machine with the most finished runs; the others are listed,
not used. The pairs study run again on another machine lives in a folder of its own beside the
study's (``noise-study-<machine>``, :func:`pairs_folders`) and gets a section of its own. Which runs
enter the tables, how gaps are paired by seed and when a target is *met* is said once per section
(``RULES``); :class:`Gap` and :func:`target_verdict` apply it.
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

from studies.quality import docs
from studies.quality.docs import fmt_params, interp_gap, mean_sd, row, table_head
from studies.quality.instability import MARK, footnote, unstable
from studies.quality.instability import write as write_instability
from studies.quality.layout import ROOT

BEGIN, END = "<!-- noise:begin -->", "<!-- noise:end -->"
README_BEGIN, README_END = "<!-- noise-summary:begin -->", "<!-- noise-summary:end -->"
TABLE_BEGIN, TABLE_END = "<!-- results-readme:begin -->", "<!-- results-readme:end -->"
CONV_TOL = 1.0  # points of mean R@1: full data at 2E at most this far above E = stopped rising
TARGET_R1_GAIN = 3.0  # points of mean R@1 above full data (20% mismatched)
TARGET_PRUNED = 0.25  # ... while training at least 25% fewer pairs
TARGET_MISMATCHED = 0.05  # share of mismatched pairs trained once the warm-up is over
TARGET_PR = 0.9  # precision and recall of the suspected set
ORDER = {"full": 0, "random": 1, "seta": 2, "infobatch": 3}
TARGET_HEAD = table_head("| target | configuration | measured (mean over seeds; per seed) | verdict |")
RUN_STEM = re.compile(r"^(pairs|cifar10|sst2)-.*-s\d+$")
REPLICA = "noise-study-"  # a folder named so beside the study's folder: the pairs study on another machine
RULES = (
    "A run enters the tables only if it finished its schedule with finite losses and its loader delivered exactly "
    "each plan's kept samples; crashed runs, runs cut short at a deadline, diverged runs and runs from another "
    "machine are listed at the end, not averaged in. Gaps are paired by seed: mean over the seeds of (run - reference "
    "on the same seed), per-seed gaps in brackets; *beyond the noise* = every seed the same sign and |mean| > 2 SE "
    "(SE = SD of the per-seed gaps / sqrt(seeds)). A target is *met* only where mean - 2 SE clears its bar (mean + 2 "
    "SE for a bar to stay under); where only the mean clears it: *mean above (under), not resolved*; one seed: "
    "*open (1 seed)*."
)
STATUS_TEXT = {
    "diverged": "diverged (a non-finite training loss)",
    "plan_mismatch": "its loader did not deliver exactly the plan's kept samples in some epoch",
    "short": "fewer epochs than its schedule",
}


# ------------------------------------------------------------------------------ reading
def load_files(results: Path) -> dict[str, Any]:
    """Finished runs, cut-short and crashed runs, calibrations of a results folder (name order)."""
    out: dict[str, Any] = {"runs": [], "cut": [], "crashed": [], "cal": {}}
    for p in sorted(results.glob("*.json")):
        stem = p.name[: -len(".json")]
        if stem.endswith((".cut", ".crashed")):
            out[stem.rsplit(".", 1)[1]].append(json.loads(p.read_text()))
        elif "-cal-" in stem:
            out["cal"][stem] = json.loads(p.read_text())
        elif RUN_STEM.match(stem):
            out["runs"].append(json.loads(p.read_text()))
    return out


def machine_name(m: dict | None) -> str:
    if not m:
        return "unknown machine"
    cpu, cores, torch, cap = (m.get(k, "?") for k in ("cpu", "cores", "torch", "cpu_capability"))
    return f"{cpu}, {cores} cores, torch {torch} ({cap})"


def comparison_group(r: dict) -> str:
    """The runs compared with each other, which must come from one machine: the pairs study, and
    each data set of the noisy-label study."""
    return r.get("study", "?") + ("/" + r["dataset"] if r.get("dataset") else "")


def split_runs(files: dict) -> tuple[dict[str, str], list[dict], list[str]]:
    """(each comparison group's machine: the one with the most finished runs of the group, ties in name
    order; the runs that enter the tables; a line per run left out)."""
    counts = Counter((comparison_group(r), machine_name(r.get("machine"))) for r in files["runs"])
    machines: dict[str, str] = {}
    for (g, m), _ in sorted(counts.items(), key=lambda x: (-x[1], x[0][1])):
        machines.setdefault(g, m)
    used, left_out = [], []
    for r in files["runs"]:
        if machine_name(r.get("machine")) != machines[comparison_group(r)]:
            left_out.append(f"`{r['id']}`: ran on another machine ({machine_name(r.get('machine'))}) than the other "
                            "runs it is compared with; not compared")  # fmt: skip
        elif r.get("status") != "ok":
            left_out.append(f"`{r['id']}`: {STATUS_TEXT.get(r.get('status'), r.get('status'))}; left out")
        else:
            used.append(r)
    finished = {r["id"] for r in files["runs"]}
    for c in (c for c in files["crashed"] if c["id"] not in finished):
        msg = [x.strip() for x in str(c.get("error", "")).splitlines() if x.strip()]
        msg_text = msg[-1].replace("|", "/").replace("`", "'")[:160] if msg else "no message"
        when = "" if "-cal-" in c["id"] else f" after {epochs_text(c)}"
        left_out.append(f"`{c['id']}`: crashed{when} ({msg_text}); no result")
    for c in (c for c in files["cut"] if c["id"] not in finished):
        left_out.append(f"`{c['id']}`: cut short at the deadline after {epochs_text(c)}; no result")
    return machines, used, left_out


def epochs_text(c: dict) -> str:
    k = int(c.get("epochs_done", 0))
    return f"{k} epoch" + ("" if k == 1 else "s")


# ------------------------------------------------------------------------------ numbers
def r1(r: dict) -> float:
    """Mean of the final (or an epoch's row's) image->text and text->image R@1, in %."""
    return 50.0 * (r["i2t_r1"] + r["t2i_r1"])


def acc(r: dict) -> float | None:
    """Test accuracy of a run (or after an epoch: None where the run did not record it), in %."""
    return None if r.get("test_acc") is None else 100.0 * r["test_acc"]


class Gap:
    """A gap paired by seed: ``per_seed`` {seed: gap}; SE = SD (ddof 1) of the per-seed gaps / sqrt(seeds)."""

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
        seeds = ", ".join(f"{x:+.{digits}f}" for x in self.per_seed.values())
        return f"{self.mean:+.{digits}f} ({seeds})" if self.n else "-"

    def noise_text(self, digits: int = 1) -> str:
        return f"2 SE = {2 * self.se:.{digits}f}" if self.n > 1 else "1 seed: no noise estimate"


def paired(rs: list[dict], ref: list[dict], value: Callable[[dict], float]) -> Gap:
    b = {r["seed"]: r for r in ref}
    return Gap({r["seed"]: value(r) - value(b[r["seed"]]) for r in rs if r["seed"] in b})


def vs_random(rs: list[dict], full: list[dict], randoms: list[list[dict]], value: Callable[[dict], float]) -> Gap:
    """Paired by seed against dynamic random at the same measured pruned %: for each seed, random's
    value linearly interpolated between full data (0%) and random's points of that seed."""
    out = {}
    for r in rs:
        pts = [(0.0, value(f)) for f in full if f["seed"] == r["seed"]]
        pts += [(x["pruned"], value(x)) for g in randoms for x in g if x["seed"] == r["seed"]]
        if (v := interp_gap(r["pruned"], value(r), pts)) is not None:
            out[r["seed"]] = v
    return Gap(out)


def ms(xs: list[float], digits: int = 1) -> str:
    return mean_sd(xs, 1.0, digits)


def mean_pruned(g: list[dict]) -> float:
    return float(np.mean([r["pruned"] for r in g]))


def is_rule(r: dict) -> bool:
    return bool(r["params"].get("noise"))


def active_epochs(r: dict) -> list[dict]:
    """The epochs after the rule's warm-up: those whose plan summary says the rule is active."""
    return [x for x in r["rows"] if x.get("noise_active")]


def noisy_share(rows: list[dict]) -> float | None:
    """Noisy samples among the trained ones over ``rows`` (pairs: delivered keys; labels: the plan's
    kept samples, which the loader delivered exactly)."""
    pairs = bool(rows) and "mismatched_trained" in rows[0]
    noisy, of = ("mismatched_trained", "trained") if pairs else ("plan_noisy_kept", "plan_kept")
    t = sum(x[of] for x in rows)
    return sum(x[noisy] for x in rows) / t if t else None


def mean_or_none(xs: list[float | None]) -> float | None:
    v = [x for x in xs if x is not None]
    return float(np.mean(v)) if v and len(v) == len(xs) else None


def or_dash(x: float | None, fmt: str, scale: float = 1.0) -> str:
    """``scale * x`` formatted, a dash where there is no value."""
    return "-" if x is None else format(scale * x, fmt)


def pr_text(precision: float | None, recall: float | None, fmt: str = ".2f") -> str:
    return f"{or_dash(precision, fmt)} / {or_dash(recall, fmt)}"


def rule_stats(g: list[dict]) -> dict[str, Any]:
    """A group's noise-rule figures: the noisy share of what its runs trained; with the rule, the same
    after the warm-up, and each run's last epoch with the rule active (``last``) with their mean
    precision, recall and suspects."""
    out: dict[str, Any] = {"rule": is_rule(g[0]), "share": noisy_share([x for r in g for x in r["rows"]])}
    if out["rule"]:
        last = [(active_epochs(r) or [None])[-1] for r in g]
        out.update(after=mean_or_none([noisy_share(active_epochs(r)) for r in g]), last=last)
        for c in ("precision", "recall", "suspected"):
            out[c] = mean_or_none([x.get(c) if x else None for x in last])
    return out


# ------------------------------------------------------------------------------ tables
def group(runs: list[dict]) -> dict[tuple, list[dict]]:
    g: dict[tuple, list[dict]] = {}
    for r in runs:
        g.setdefault((r["policy"], r["label"], json.dumps(r["params"], sort_keys=True)), []).append(r)
    return {k: sorted(v, key=lambda r: r["seed"]) for k, v in g.items()}


def sorted_keys(groups: dict) -> list[tuple]:
    """Level, then the rule after the policy alone, then the policy, then the rule on another scale."""

    def key(k: tuple) -> tuple:
        level = re.search(r"p(\d+)", k[1])
        rule = k[1].startswith(("rule", "nz-rule"))
        return (int(level.group(1)) if level else 0, rule, ORDER.get(k[0], 9), "noise_scale" in k[2], k[1])

    return sorted(groups, key=key)


def references(groups: dict) -> tuple[tuple | None, list[dict], list[list[dict]]]:
    """A table's references: full data's key and runs, and dynamic random's runs at each level."""
    full = next((k for k in groups if k[0] == "full" and k[2] == "{}"), None)
    randoms = [v for k, v in groups.items() if k[0] == "random" and not json.loads(k[2]).get("noise")]
    return full, groups.get(full, []), randoms


def name(k: tuple, g: list[dict]) -> str:
    """The configuration's name, marked where a run of it collapsed to chance or fell 20 points in one
    epoch (``studies.quality.instability``)."""
    base = k[0] if not json.loads(k[2]).get("noise") else "rule alone" if k[0] == "full" else f"rule + {k[0]}"
    return base + (f" {MARK}" if any(unstable(r) for r in g) else "")


def unstable_note(gs: list[list[dict]]) -> list[str]:
    """The footnote under a table whose rows hold the runs ``gs`` and a blank line (none where no run is unstable)."""
    files = sorted({f"{r.get('id', '?')}.json": r for g in gs for r in g if unstable(r)}.items(), key=lambda x: x[0])
    return [footnote(files), ""] if files else []


Cell = Callable[[tuple, list[dict]], str]


def config_table(groups: dict, keys: list[tuple], columns: list[tuple[str, Cell]], lead: bool = True) -> list[str]:
    """A row per configuration of ``keys``: the policy and its setting (``lead``: and the seeds and the
    pruned %), then each column's cell of the configuration's runs; the footnote under it."""
    head = ["policy", "setting", *(["seeds", "pruned %"] if lead else []), *(c[0] for c in columns)]
    lines = table_head(row(head))
    for k in keys:
        g = groups[k]
        cells = [name(k, g), fmt_params(json.loads(k[2]))]
        cells += [str(len(g)), ms([100 * r["pruned"] for r in g])] if lead else []
        lines.append(row([*cells, *(cell(k, g) for _, cell in columns)]))
    return [*lines, "", *unstable_note([groups[k] for k in keys])]


def epoch_table(title: str, groups: dict, keys: list[tuple], E: int, cell: Callable[[list[dict], int], str],
                extra: tuple[tuple[str, Cell], ...] = ()) -> list[str]:  # fmt: skip
    """A row per configuration and a column per epoch (``cell(runs, epoch)``), then the ``extra`` columns."""
    return [title, "", *config_table(groups, keys, [(f"e{e}", lambda k, g, e=e: cell(g, e)) for e in range(E)]
                                     + list(extra), lead=False)]  # fmt: skip


def epoch_mean(value: Callable[[dict], float], fmt: str, scale: float = 1.0) -> Callable[[list[dict], int], str]:
    """A per-epoch cell: ``scale`` times the mean over the runs of ``value`` of their epoch's row."""
    return lambda g, e: format(scale * float(np.mean([value(r["rows"][e]) for r in g])), fmt)


# ------------------------------------------------------------------------------ the pairs
def pairs_lines(ctx: Any, files: dict, missing: list[str]) -> list[str]:
    machines, used, left_out = split_runs(files)
    pairs = [r for r in used if r.get("study") == "noise-pairs"]
    lines = [f"{len(pairs)} finished pairs runs enter the tables below"
             + (f"; all ran on one machine: {machines.get('noise-pairs')}." if pairs else "."), ""]  # fmt: skip
    if pairs:
        E, d, t = pairs[0]["E"], pairs[0]["data"], pairs[0]["train"]
        rule = next((json.dumps(r["params"], sort_keys=True) for r in pairs if r["label"] == "rule"), None)
        lines += [f"Set-up of these runs: {d['train']:,} training pairs in shards of {d['shard_size']:,}, "
                  f"{d['test']:,} clean held-out pairs, {d['size']}x{d['size']} images; E = {E} epochs "
                  f"(full data also at 2E = {2 * E}), batch {t['batch_size']}, peak lr {t['lr']}, "
                  f"{t['workers']} loader worker and 1 torch thread per run"
                  + (f"; the rule alone: `full` with `{rule}`." if rule else "."), ""]  # fmt: skip
    lines += [*loader_lines(files, machines, "noise-pairs", "pairs"), RULES, ""]
    lines += e_choice_lines(ctx.results, ctx.epochs)
    for noise in (0.2, 0.0):
        if rs := [r for r in pairs if r["noise"] == noise]:
            lines += pairs_level(rs, noise)
    return lines + pairs_targets(pairs) + cal_lines(files["cal"], ("pairs-",)) + left_out_lines(left_out, missing)


def loader_lines(files: dict, machines: dict[str, str], study: str, what: str) -> list[str]:
    """How many run-epochs of the finished runs (each on its group's machine) delivered exactly the
    plan's kept samples."""
    runs = [r for r in files["runs"] if r.get("study") == study and machines[comparison_group(r)] ==
            machine_name(r.get("machine"))]  # fmt: skip
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
    runs.sort(key=lambda r: -r["data"]["noise"])
    width = max(len(r["rows"]) for r in runs)
    lines = ["**How E was chosen:** before the study, full data was trained for one long schedule on the development "
             "machine (not compared with the study's runs). Its mean R@1 after every epoch, and the epochs it rose for "
             f"(up to the last epoch no later one beats by more than {CONV_TOL:.1f} point):", "",
             *table_head(row(["mismatched", "pairs", "seed", "machine", *(f"e{e}" for e in range(width)),
                              "rose for"]))]  # fmt: skip
    verdicts = []
    for r in runs:
        curve = [r1(x) for x in r["rows"]]
        rose = 1 + next(e for e in range(len(curve)) if max(curve[e:]) <= curve[e] + CONV_TOL)
        what = f"{round(100 * r['data']['noise'])}% mismatched"
        lines.append(row([what, f"{r['data']['train']:,}", str(r["seed"]), machine_name(r.get("machine")),
                          *(f"{x:.1f}" for x in curve), *[""] * (width - len(curve)),
                          f"{rose} of {len(curve)} epochs"]))  # fmt: skip
        verdicts.append(f"covers the {rose} epochs the {what} set rose for" if rose <= E else
                        f"is shorter than the {rose} epochs the {what} set rose for: its comparisons are before "
                        "convergence (the 2E check below measures by how much)")  # fmt: skip
    return [*lines, "", f"The study's E = {E} " + "; it ".join(verdicts) + ".", ""]


def convergence(rs: list[dict], noise: float) -> list[str]:
    """Full data's mean R@1 after every epoch at E and at 2E, and whether it still rose after E."""
    full, full2 = ([r for r in rs if r["label"] == label] for label in ("full", "full2E"))
    if not full:
        return []
    E, width = full[0]["E"], max(len(r["rows"]) for r in full + full2)
    out = [f"**Convergence, {round(100 * noise)}% mismatched:** full data's mean R@1 (i2t and t2i) after every epoch:",
           "", *table_head(row(["run", "seed", *(f"e{e}" for e in range(width))]))]  # fmt: skip
    for r in full + full2:
        cells = [f"{r1(x):.1f}" for x in r["rows"]] + [""] * (width - len(r["rows"]))
        out.append(row([f"{'E' if r['label'] == 'full' else '2E'} = {len(r['rows'])}", str(r["seed"]), *cells]))
    gap = paired(full2, full, r1)
    if not gap.n:
        return [*out, "", f"Full data at 2E = {2 * E} is not in yet: convergence not shown.", ""]
    a, b = (np.mean([r1(r) for r in x if r["seed"] in gap.per_seed]) for x in (full, full2))
    verdict = (f"at most {CONV_TOL:.1f} point: full data's R@1 has stopped rising at E" if gap.mean <= CONV_TOL
               else f"**more than {CONV_TOL:.1f} point: full data's R@1 is still rising at E** (a longer E is "
               "needed for the comparisons to be at convergence)")  # fmt: skip
    return [*out, "", f"Full data at E = {E}: {a:.1f}, at 2E = {2 * E}: {b:.1f} (mean R@1 over seeds "
            f"{', '.join(str(s) for s in gap.per_seed)}); 2E - E {gap.text()}: {verdict}.", ""]  # fmt: skip


def pairs_level(rs: list[dict], noise: float) -> list[str]:
    """One level of mismatched pairs: convergence, the rule at 2E, every configuration at E and its
    curves per epoch."""
    title = f"{round(100 * noise)}% mismatched training pairs" if noise else "clean pairs (0% mismatched)"
    lines = [f"#### {title}", "", *convergence(rs, noise)]
    full2 = [r for r in rs if r["label"] == "full2E"]
    if at_2e := group([r for r in rs if r["label"].endswith("2E") and r["label"] != "full2E"]):
        lines += [f"The rule alone at 2E = {2 * rs[0]['E']} epochs, beside full data at 2E (same seeds):", "",
                  *config_table(at_2e, sorted_keys(at_2e), [
                      ("mean R@1", lambda k, g: ms([r1(r) for r in g])),
                      ("mean R@1 vs full data at 2E", lambda k, g: paired(g, full2, r1).text()),
                      ("suspected pairs (most in a plan)",
                       lambda k, g: ", ".join(str(max(x.get("suspected") or 0 for x in r["rows"])) for r in g)),
                      ("mismatched % of trained pairs after warm-up",
                       lambda k, g: or_dash(rule_stats(g).get("after"), ".1f", 100) if noise else "-"),
                      ("suspected set: precision / recall (last epoch)",
                       lambda k, g: pr_text(rule_stats(g).get("precision"), rule_stats(g).get("recall")) if noise
                       else "-"),
                  ])]  # fmt: skip
    main = [r for r in rs if not r["label"].endswith("2E")]
    groups = group(main)
    full_key, full, randoms = references(groups)
    keys = sorted_keys(groups)

    def shares(k: tuple, g: list[dict]) -> str:
        s = rule_stats(g)
        after = f" / {100 * s['after']:.1f}" if s["rule"] and s.get("after") is not None else ""
        return f"{or_dash(s['share'], '.1f', 100)}{after}" if noise else "-"

    def suspects(k: tuple, g: list[dict]) -> str:
        s = rule_stats(g)
        if not s["rule"]:
            return "-"
        return pr_text(s["precision"], s["recall"]) if noise else f"{or_dash(s['suspected'], '.0f')} suspected"

    lines += config_table(groups, keys, [
        *((f"R@{c[-1]} {c[:3]}", lambda k, g, c=c: ms([100 * r[c] for r in g]))
          for c in ("i2t_r1", "t2i_r1", "i2t_r5", "t2i_r5")),
        ("mean R@1 vs full data", lambda k, g: "-" if k[0] == "full" and not is_rule(g[0])
         else paired(g, full, r1).text()),
        ("mean R@1 vs dynamic random at that pruned %", lambda k, g: "-" if k == full_key or (
            k[0] == "random" and not is_rule(g[0])) else vs_random(g, full, randoms, r1).text()),
        ("mismatched % of trained pairs (run / after warm-up)", shares),
        ("suspected set: precision / recall (last epoch of the rule)", suspects),
    ])  # fmt: skip
    E = len(main[0]["rows"]) if main else 0
    lines += epoch_table("Mean R@1 after each epoch (mean over seeds):", groups, keys, E, epoch_mean(r1, ".1f"))
    lines += epoch_table("Kept fraction per epoch (plan, mean over seeds):", groups, keys, E,
                         epoch_mean(lambda x: x["kept"] / x["n"], ".2f"))  # fmt: skip
    if noise:
        lines += epoch_table("Mismatched % of the pairs the loader delivered, per epoch (mean over seeds):", groups,
                             keys, E, epoch_mean(lambda x: x["mismatched_share"], ".1f", 100))  # fmt: skip

    def suspected(g: list[dict], e: int) -> str:
        rows = [r["rows"][e] for r in g]
        n = f"{np.mean([x.get('suspected') or 0 for x in rows]):.0f}"
        pr = [or_dash(mean_or_none([x.get(c) for x in rows]), ".2f") for c in ("precision", "recall")]
        return f"{n}: {'/'.join(pr)}" if noise else n

    if rule_keys := [k for k in keys if is_rule(groups[k][0])]:
        what = ": count: precision/recall against `noise.parquet`" if noise else " (every one a clean pair)"
        lines += epoch_table(f"Suspected pairs per epoch{what} (mean over seeds; the plan's rows with reason "
                             "`suspected_noise` or `noise_recheck`):", groups, rule_keys, E, suspected)  # fmt: skip
    return lines


# ------------------------------------------------------------------------------ targets
def pairs_targets(pairs: list[dict]) -> list[str]:
    """The targets of issue 26 on the pairs, a row per configuration and target."""
    rows: list[list[str]] = []
    g20, g0 = (group([r for r in pairs if r["noise"] == noise and not r["label"].endswith("2E")]) for noise in (0.2, 0))
    full20 = references(g20)[1]
    rule20 = {k: v for k, v in g20.items() if is_rule(v[0])}
    # 1. R@1 at least 3 points above full data while training at least 25% fewer pairs
    cands = {k: v for k, v in rule20.items() if mean_pruned(v) >= TARGET_PRUNED}
    what = "mean R@1 >= full data + 3 points at >= 25% fewer pairs (20% mismatched)"
    if not full20 or not rule20:
        rows.append([what, "-", "not measured (runs missing)", "open"])
    elif not cands:
        most = max(rule20, key=lambda k: mean_pruned(rule20[k]))
        p = mean_pruned(rule20[most])
        rows.append([what, name(most, []), f"no rule run pruned 25% (most: {100 * p:.1f}%)",
                     f"missed by {100 * (TARGET_PRUNED - p):.1f} points of pruned %"])  # fmt: skip
    for k in sorted_keys(cands) if full20 else []:
        gap = paired(cands[k], full20, r1)
        measured = f"{gap.text()} points at {100 * mean_pruned(cands[k]):.1f}% pruned ({gap.noise_text()})"
        rows.append([what, full_name(k, cands[k]), measured, target_verdict(list(gap.per_seed.values()),
                                                                            TARGET_R1_GAIN, "points")])  # fmt: skip
    # 2-4. per rule configuration: the mismatched share after the warm-up, precision, recall
    for k in sorted_keys(rule20):
        v, who = rule20[k], full_name(k, rule20[k])
        share = [noisy_share(active_epochs(r)) for r in v]
        what = "mismatched < 5% of trained pairs after the warm-up"
        if None in share:
            rows.append([what, who, "the rule never became active", "missed"])
        else:
            verdict = target_verdict(share, TARGET_MISMATCHED, "points", scale=100, under=True)
            per = ", ".join(f"{100 * s:.1f}" for s in share)
            rows.append([what, who, f"{100 * float(np.mean(share)):.1f}% ({per})",
                         verdict + (under_from(v) if verdict.startswith("missed") else "")])  # fmt: skip
        for c in ("precision", "recall"):
            vals = [x.get(c) if x else None for x in rule_stats(v)["last"]]
            measured = f"{float(np.mean(vals)):.3f} ({', '.join(f'{x:.3f}' for x in vals)})" if None not in vals else ""
            rows.append([f"{c} of the suspected set >= 0.9", who, measured or "no suspected set",
                         target_verdict(vals, TARGET_PR, "") if measured else "missed"])  # fmt: skip
    # 5. clean pairs: no worse than dynamic random at the same pruned % beyond the noise
    _, full0, randoms0 = references(g0)
    rule0 = [k for k in sorted_keys(g0) if is_rule(g0[k][0])]
    for k in rule0:
        gap, v = vs_random(g0[k], full0, randoms0, r1), g0[k]
        what = "clean pairs: mean R@1 no worse than dynamic random at the same pruned %"
        if gap.n < 2:
            measured = f"{gap.text()} points (1 seed)" if gap.n else "no random reference at that pruned %"
            rows.append([what, full_name(k, v), measured, "open (1 seed)" if gap.n else "open"])
            continue
        verdict = target_verdict(list(gap.per_seed.values()), 0.0, "points")
        if gap.mean < 0 and gap.beyond_noise():
            verdict = f"missed: {-gap.mean:.1f} points below, beyond the noise"
        elif verdict.startswith("missed"):  # below, within the noise
            verdict = "mean below, not resolved"
        silent = silent_note(v, k) if verdict.startswith(("missed", "mean below", "at the bar")) else ""
        rows.append([what, full_name(k, v), f"{gap.text()} points ({gap.noise_text()})", verdict + silent])
    note = unstable_note(list(rule20.values()) + [g0[k] for k in rule0])
    return ["#### Targets (issue 26)", "", *TARGET_HEAD, *map(row, rows), "", *note]


def full_name(k: tuple, g: list[dict]) -> str:
    """The configuration's marked name and its setting."""
    return f"{name(k, g)} {fmt_params(json.loads(k[2]))}"


def silent_note(v: list[dict], k: tuple) -> str:
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
    if not first:
        return ""
    before = ", ".join(f"e{rows[0][i]['epoch']} {100 * per_epoch[i]:.1f}%" for i in range(first))
    since = rows[0][first]["epoch"]
    return f"; under 5% in every epoch from e{since} on, above it in the rule's first active epochs ({before})"


def target_verdict(values: list[float], target: float, unit: str, scale: float = 1.0, under: bool = False,
                   digits: int | None = None) -> str:  # fmt: skip
    """The verdict on a target from the per-seed values (or per-seed gaps): *met* only where the mean
    clears ``target`` by 2 SE (mean - 2 SE > target; ``under``: mean + 2 SE < target), *at the bar* where
    every value equals it (identical runs: 2 SE = 0, as in ``common.gap_verdict``), *mean above (under),
    not resolved* where only the mean clears it, *missed by* how much where the mean does not; open with
    fewer than 2 seeds. With 2 seeds 2 SE is the difference between the seeds."""
    if len(values) < 2:
        return "open (1 seed)"
    gap = Gap(dict(enumerate(values)))
    m, two_se = gap.mean, 2 * gap.se
    u, digits = f" {unit}" if unit else "", digits if digits is not None else 1 if unit else 3
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


def cal_lines(cals: dict, prefixes: tuple[str, ...]) -> list[str]:
    """The settings the calibrations chose (each policy's levels, or the rule's with a policy on top
    beside the rule alone), of the data sets named by ``prefixes``."""
    rows = []
    for stem, c in sorted(cals.items()):
        if not stem.startswith(prefixes):
            continue
        data, cal = stem.split("-cal-")
        if cal == "base":
            levels = [(p, lv, v, "-") for p, lvs in sorted(c["levels"].items()) for lv, v in sorted(lvs.items())]
        else:
            alone = or_dash(c.get("rule_alone", {}).get("pruned"), ".1f", 100)
            levels = [(f"rule + {cal.split('-')[1]}", lv, v, alone) for lv, v in sorted(c["levels"].items())]
        rows += [row([data, p, f"{lv}%", fmt_params(v["params"]), f"{100 * v['simulated']:.1f}", alone])
                 for p, lv, v, alone in levels]  # fmt: skip
    if not rows:
        return []
    head = "| data | policy | level | setting | simulated pruned % | the rule alone, simulated pruned % |"
    return ["#### Settings chosen on training losses (replays over full data's recorded losses, seed 0)", "",
            *table_head(head), *rows, ""]  # fmt: skip


def left_out_lines(left_out: list[str], missing: list[str]) -> list[str]:
    out = ["**Runs left out of the tables:**", "", *[f"* {x}" for x in left_out], ""] if left_out else []
    if not missing:
        return [*out, "Every run of the study's plan is in.", ""]
    return [*out, f"**Not run yet ({len(missing)}; the same command resumes with them):** {'; '.join(missing)}.", ""]


# ------------------------------------------------------------------------------ noisy labels
def labels_lines(ctx: Any, files: dict, missing: list[str]) -> list[str]:
    """Each data set and schedule: every configuration against full data and dynamic random, the noisy
    share per epoch, the test accuracy per epoch where the runs record it; then CIFAR-10's target."""
    machines, used, left_out = split_runs(files)
    runs = [r for r in used if r.get("study") == "noise-labels"]
    each = "; ".join(f"{d}: {m}" for d, m in sorted({(r["dataset"], machines[comparison_group(r)]) for r in runs}))
    lines = [f"{len(runs)} finished noisy-label runs enter the tables below" + (f"; the runs of each data set ran on "
             f"one machine ({each}), and only runs of one data set and schedule are compared" if runs else "") + ".",
             "", *loader_lines(files, machines, "noise-labels", "samples"), RULES, ""]  # fmt: skip
    targets: list[list[str]] = []
    target_groups: list[list[dict]] = []
    for dataset, (E, augmented) in sorted({(r["dataset"], schedule(r)) for r in runs}):
        groups = group([r for r in runs if r["dataset"] == dataset and schedule(r) == (E, augmented)])
        lines += [f"#### {dataset}, 40% noisy labels ({E} epochs{'' if augmented else ', no augmentation'})", ""]
        lines += labels_table(groups)
        for k in (k for k in sorted_keys(groups) if is_rule(groups[k][0]) and dataset == "cifar10"):
            gap = paired(groups[k], references(groups)[1], acc)
            v = target_verdict(list(gap.per_seed.values()), 0.0, "points", digits=2) if gap.n else "open"
            targets.append([f"CIFAR-10 with 40% noisy labels, {E} epochs: test accuracy above full data",
                            full_name(k, groups[k]), f"{gap.text(2)} points ({gap.noise_text(2)})", v])  # fmt: skip
            target_groups.append(groups[k])
        noisy = epoch_mean(lambda x: x["plan_noisy_kept"] / max(x["plan_kept"], 1), ".1f", 100)
        lines += epoch_table("Noisy % of the samples trained per epoch (the plan's kept samples; mean over seeds):",
                             groups, sorted_keys(groups), E, noisy)  # fmt: skip
        lines += curve_lines(groups, sorted_keys(groups), E)
    if targets:
        lines += ["#### Target (issue 26)", "", *TARGET_HEAD, *map(row, targets), "", *unstable_note(target_groups)]
    left = [x for x in left_out if not x.startswith("`pairs-")]
    todo = [x for x in missing if not x.startswith("pairs-")]
    return lines + cal_lines(files["cal"], ("cifar10-", "sst2-")) + left_out_lines(left, todo)


def labels_table(groups: dict) -> list[str]:
    """Every configuration of one data set and schedule against full data and dynamic random."""
    full_key, full, randoms = references(groups)

    def shares(k: tuple, g: list[dict]) -> str:
        s = rule_stats(g)
        return or_dash(s["share"], ".1f", 100) + (f" / {or_dash(s['after'], '.1f', 100)}" if s["rule"] else "")

    return config_table(groups, sorted_keys(groups), [
        ("test acc %", lambda k, g: ms([100 * r["test_acc"] for r in g], 2)),
        ("val acc %", lambda k, g: ms([100 * r["val_acc"] for r in g], 2)),
        ("test acc vs full data", lambda k, g: "-" if k == full_key else paired(g, full, acc).text(2)),
        ("test acc vs dynamic random at that pruned %", lambda k, g: "-" if k == full_key or (
            k[0] == "random" and not is_rule(g[0])) else vs_random(g, full, randoms, acc).text(2)),
        ("noisy % of trained samples (run / after warm-up)", shares),
        ("suspected set: precision / recall (last epoch of the rule)", lambda k, g: pr_text(
            rule_stats(g)["precision"], rule_stats(g)["recall"]) if is_rule(g[0]) else "-"),
    ])  # fmt: skip


def schedule(r: dict) -> tuple[int, bool]:
    """(epochs, augmented) of a noisy-label run: the short study's schedule, or the long one."""
    return len(r["rows"]), bool(r.get("augment", True))


def curve_lines(groups: dict, keys: list[tuple], E: int) -> list[str]:
    """Test accuracy after every epoch (runs that record it), and each configuration's best epoch: whether
    full data has stopped rising, and by how much it fell from its best by the end."""
    keys = [k for k in keys if all(r["rows"][0].get("test_acc") is not None for r in groups[k])]
    cell = epoch_mean(lambda x: 100 * x["test_acc"], ".1f")

    def best(g: list[dict]) -> tuple[int, float, float]:
        c = [float(np.mean([100 * r["rows"][e]["test_acc"] for r in g])) for e in range(E)]
        return int(np.argmax(c)), max(c), c[-1] - max(c)

    extra = (("best epoch (best)", lambda k, g: "e{} ({:.1f})".format(*best(g)[:2])),
             ("end - best", lambda k, g: f"{best(g)[2]:+.1f}"))  # fmt: skip
    title = "Test accuracy after every epoch (%, mean over seeds):"
    return epoch_table(title, groups, keys, E, cell, extra) if keys else []


# ------------------------------------------------------------------------------ docs/results.md
def splice(doc: Path, lines: list[str], begin: str = BEGIN, end: str = END, skip_missing: bool = False) -> None:
    docs.splice(doc, begin, end, lines, skip_missing=skip_missing)


def where(folder: Path, root: Path) -> str:
    """A results folder as the docs name it: relative to the repository where it lies in it."""
    return f"{folder.relative_to(root)}/" if folder.is_relative_to(root) else f"{folder}/"


def study_pairs(files: dict) -> tuple[str | None, list[dict]]:
    """The pairs study's machine and its runs that enter the tables."""
    machines, used, _ = split_runs(files)
    return machines.get("noise-pairs"), [r for r in used if r.get("study") == "noise-pairs"]


def readme_lines(files: dict, folder: str = "docs/quality-runs/noise-study/") -> list[str]:
    """docs/results.md's summary of the measurement in ``folder``: the targets that every seed of a
    configuration has measured (rows still open for want of seeds are left to docs/quality-pairs.md)."""
    m, pairs = study_pairs(files)
    targets = pairs_targets(pairs)
    rows = [x for x in targets if x.startswith("| ") and x not in TARGET_HEAD and "open" not in x.rsplit("|", 2)[-2]]
    notes = [x for x in targets if x.startswith(MARK) and MARK in "".join(rows)]
    seeds = ", ".join(map(str, sorted({r["seed"] for r in pairs})))
    size = f"{pairs[0]['data']['train']:,} pairs, E = {pairs[0]['E']}" if pairs else "no run yet"
    return [f"Measured by `studies/noise_study.py` ({len(pairs)} finished pairs runs of {size}, seeds {seeds}, on "
            f"one machine: {m}; generated from `{folder}`, the whole comparison and the runs still missing in "
            "docs/quality-pairs.md), the targets measured on every seed so far:", "", *TARGET_HEAD, *rows,
            *(["", *notes] if notes else [])]  # fmt: skip


def readme_summary(studies: list[tuple[int, Path, dict]], root: Path) -> list[str]:
    """docs/results.md's block: the targets of the study with the most finished pairs runs (one machine), and
    a line naming each other machine's study, whose section is in docs/quality-pairs.md."""
    ranked = sorted(studies, key=lambda x: -x[0])  # stable: the study's own folder wins a tie
    out = readme_lines(ranked[0][2], where(ranked[0][1], root))
    for n, folder, files in ranked[1:]:
        if n:
            runs = f"{n} finished pairs run" + ("" if n == 1 else "s")
            out += ["", f"The same study on another machine ({study_pairs(files)[0]}, {runs}, `{where(folder, root)}`) "
                    "has its own section in docs/quality-pairs.md."]  # fmt: skip
    return out


def table_row(data: str, k: tuple, g: list[dict], base: list[dict], value: Callable[[dict], Any], digits: int) -> str:
    """One row of the table against full data of the same seeds (the best epoch of the mean curve over seeds
    where every epoch of every run recorded it: ``value`` of a row)."""
    points = [[value(r["rows"][e]) for r in g] for e in range(len(g[0]["rows"]))]
    best = "-"
    if points and all(None not in p for p in points):
        curve = [float(np.mean(p)) for p in points]
        best = f"{max(curve):.{digits}f} (e{int(np.argmax(curve))})"
    who = f"{name(k, g)} ({fmt_params(json.loads(k[2]))})"
    who = "full data (the baseline)" if k[0] == "full" and not is_rule(g[0]) else who
    gap = paired(g, base, value)
    two_se = f"{2 * gap.se:.{digits}f}" if gap.n > 1 else "-"
    gaps = ["-"] * 3 if g is base else [gap.text(digits), two_se, "yes" if gap.beyond_noise() else "no"]
    final = f"{float(np.mean([value(r) for r in g])):.{digits}f}"
    return row([data, who, f"{100 * mean_pruned(g):.1f}", final, best, *gaps, ", ".join(str(r["seed"]) for r in g)])


def results_table(studies: list[tuple[int, Path, dict]], files: dict, labels: Path, root: Path) -> list[str]:
    """docs/results.md's table against full data's last epoch: on pairs with 20% mismatched captions (the
    study with the most finished pairs runs) full data, the rule alone, pruning alone and the rule with
    pruning on top at the 30% level, the rule with pruning at 50%; the rule alone on clean pairs; CIFAR-10
    with 40% noisy labels on the long schedule (``files``, the run files of the folder ``labels``). Each
    against full data trained as long from the same seed."""
    n, folder, pfiles = sorted(studies, key=lambda x: -x[0])[0]
    m, pairs = study_pairs(pfiles)
    pairs = [r for r in pairs if not r["label"].endswith("2E")]
    lines, shown = [], []  # the table's rows, the runs of the rows (for the instability footnote)
    for noise in (0.2, 0.0):
        groups = group([r for r in pairs if r["noise"] == noise])
        data = f"pairs, {round(100 * noise)}% mismatched" if noise else "pairs, clean"
        for k in sorted_keys(groups) if references(groups)[1] else []:
            rule = is_rule(groups[k][0])
            if (noise and k[0] != "infobatch" and (k[1] in ("full", "p30") or (rule and "2E" not in k[1]))) or (
                not noise and k[0] == "full" and k[1] == "rule"
            ):
                lines.append(table_row(data, k, groups[k], references(groups)[1], r1, 1))
                shown.append(groups[k])
    lmachines, lused, _ = split_runs(files)
    cifar = [r for r in lused if r.get("study") == "noise-labels" and r["dataset"] == "cifar10"]
    long = max((schedule(r) for r in cifar), default=None)
    lgroups = group([r for r in cifar if schedule(r) == long])
    lbase = references(lgroups)[1]
    for k in (k for k in sorted_keys(lgroups) if k[0] == "full") if lbase else []:
        lines.append(table_row(f"CIFAR-10, 40% noisy labels, {long[0]} epochs", k, lgroups[k], lbase, acc, 2))
        shown.append(lgroups[k])
    if not lines:
        return ["(no finished run of the noise study yet)"]
    out = ["Generated by `python -m studies noise_study --report-only` from the result files. The baseline is full "
           "data trained for the same epochs from the same seed; *minus full data* is the mean over seeds of (run - "
           "full data of that seed), each seed's in brackets; *beyond the noise*: every seed the same sign and |mean| "
           "> 2 SE.", "",
           *table_head("| data | configuration | pruned % | final R@1 or accuracy % | best epoch | minus "
                       "full data (per seed) | 2 SE | beyond the noise | seeds |"),
           *lines, "", *(f"* {x}" for x in unstable_note(shown)[:1])]  # fmt: skip
    if pairs:
        d = pairs[0]["data"]
        out.append(f"* Pairs: {d['train']:,} generated image-text pairs, E = {len(pairs[0]['rows'])}, {n} finished "
                   f"runs on one machine ({m}), `{where(folder, root)}`; mean R@1 of image-to-text and text-to-image "
                   f"on {d['test']:,} clean held-out pairs. Every configuration and target: "
                   "[quality-pairs.md](quality-pairs.md), summed up in the tables below.")  # fmt: skip
    if lbase:
        out.append(f"* CIFAR-10: {sum(map(len, lgroups.values()))} runs on one machine "
                   f"({lmachines.get('noise-labels/cifar10')}), `{where(labels, root)}`, test accuracy; the 6-epoch "
                   "schedule and SST-2: [quality.md](quality.md#the-noise-rule-on-noisy-labels).")  # fmt: skip
    return out


# ------------------------------------------------------------------------------ writing
def pairs_folders(results: Path) -> list[Path]:
    """The results folders whose pairs study the report writes: ``results``, and where it is the
    study's own folder (``noise-study``), each replica beside it (``noise-study-<machine>``: the
    same plan and settings run on another machine, compared only within itself, in a section of its
    own). A replica given as ``results`` is written alone."""
    if results.name + "-" != REPLICA:  # not the study's own folder (``noise-study``)
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
    docs_dir = (ctx.out / "docs") if ctx.smoke else ROOT / "docs"
    repo_docs = pairs_doc is None and not ctx.smoke  # results.md's sections: the repository's docs only
    pairs_doc = pairs_doc or docs_dir / "quality-pairs.md"
    pairs_doc.parent.mkdir(parents=True, exist_ok=True)
    studies = []  # (finished pairs runs, folder, its files)
    for folder in pairs_folders(ctx.results):
        sub = dataclasses.replace(ctx, results=folder, labels=ctx.labels and folder == ctx.results)
        f = files if folder == ctx.results else load_files(folder)
        m = missing if folder == ctx.results else missing_runs(sub, f)
        splice(pairs_doc, pairs_lines(sub, f, [x for x in m if x.startswith("pairs-")]), *pairs_markers(folder))
        studies.append((len(study_pairs(f)[1]), folder, f))
    # docs/results.md sums up every folder: written from the study's own folder only
    if repo_docs and ctx.results.name + "-" == REPLICA:
        write_instability(ROOT / "docs" / "quality-runs", docs_dir / "quality.md")  # every study folder's runs
        results = docs_dir / "results.md"  # the sections only where results.md has their markers
        splice(results, readme_summary(studies, ROOT), README_BEGIN, README_END, skip_missing=True)
        splice(results, results_table(studies, files, ctx.results, ROOT), TABLE_BEGIN, TABLE_END, skip_missing=True)
    if ctx.labels or any(r.get("study") == "noise-labels" for r in files["runs"]):
        splice(labels_doc or docs_dir / "quality.md", labels_lines(ctx, files, missing))
