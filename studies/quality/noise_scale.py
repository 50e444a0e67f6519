"""Closed-loop check of the noise rule's scale (docs/algorithms.md §12.11): the rule alone
(policy ``full``, ``noise=True``) on the noise study's pairs (10,000 pairs, E = 10), with the
mixture fitted on the loss (``noise_scale="loss"``, the default the noise study measured) or on
log1p of it (``"log1p"``), beside full data; one process, one torch thread. Also the replay of
both fits on the per-epoch losses of the full-data run (``--replay``), with the label-free
criterion the choice rests on: the Kolmogorov-Smirnov distance between the scores and the
fitted mixture (invariant under the monotone log1p, so the two fits are compared on one footing).

    .venv/bin/python -m studies noise_scale_check --variant full --seed 0
    .venv/bin/python -m studies noise_scale_check --variant log1p --seed 0 [--noise 0.0]
    .venv/bin/python -m studies noise_scale_check --replay pairs --seed 0

Run files: docs/quality-runs/noise-scale/ (run directories under bench-out/noise-study/runs/).
Data: the noise study's generated pairs (``studies/noise_study.py`` prepares them).
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import numpy as np

from seta_stream.policies.noise import NoiseFit, on_scale
from studies.quality import noise as ns
from studies.quality.docs import row, splice, table_head
from studies.quality.layout import ROOT
from studies.quality.noise_report import machine_name, or_dash, pr_text, r1
from studies.seam import fit_two_gaussians, points1d
from tools.results import write_json

RESULTS = ROOT / "docs" / "quality-runs" / "noise-scale"


def run_id(variant: str, seed: int, noise: float, r: float | None = None, epochs: int | None = None) -> str:
    return (f"scale-{variant}" + ("" if r is None else f"-random{r:g}") + ("" if epochs is None else f"-e{epochs}")
            + f"-n{round(100 * noise)}-s{seed}")  # fmt: skip


def train(variant: str, seed: int, noise: float, r: float | None = None, epochs: int | None = None) -> dict:
    """One closed-loop run of ``variant`` (full: no rule; loss / log1p: the rule alone, or with
    dynamic random pruning at ``r`` on top), for the study's E epochs or ``epochs``."""
    import torch

    torch.set_num_threads(1)
    params = {} if variant == "full" else {"noise": True, "noise_scale": variant}
    label = "full" if variant == "full" else f"rule-{variant}"
    E = epochs or ns.TRAIN["epochs"]
    if r is None:
        cfg = ns.pairs_cfg("full", params, label, E)
    else:
        cfg = ns.pairs_cfg("random", {"r": r, **params}, f"{label}-random", E)
    rid = run_id(variant, seed, noise, r, epochs)
    ctx = ns.Ctx(results=RESULTS, labels=False)
    job = ns.Job(rid, "pairs", {"noise": noise, "cfg": cfg, "seed": seed}, (), 1.0)
    ns.prepare_pairs(ctx, noise, 1)
    t = time.time()
    res = ns.train_pairs_job(ctx, job, [])
    res.update(study="noise-scale", seconds=round(time.time() - t, 1))
    return res


def ks_distance(scores: np.ndarray, weight: tuple, mean: tuple, sd: tuple) -> float:
    """sup |empirical CDF - mixture CDF| over the sorted scores."""
    s = np.sort(scores.astype(np.float64))
    n = len(s)
    erf = np.vectorize(math.erf)
    cdf = sum(w * 0.5 * (1 + erf((s - m) / (d * math.sqrt(2)))) for w, m, d in zip(weight, mean, sd))
    return float(max(np.max(np.abs(np.arange(1, n + 1) / n - cdf)), np.max(np.abs(np.arange(n) / n - cdf))))


def replay(full_run: Path, epochs: int, truth: set, key_only: bool) -> list[dict]:
    """Per plan epoch e (2 .. epochs): both fits on the history means of epochs 0 .. e-1 and the
    last loss of epoch e-1 (every sample trained every epoch: a full-data run); D, the KS
    distance, the upper component's weight, and the suspects' precision and recall (reported,
    not used to choose)."""
    hist, noisy, order0 = [], None, None
    for uids, shards, keys, loss in ns.epoch_losses(full_run, epochs):
        o = np.argsort(uids)
        if order0 is None:
            order0 = uids[o]
            ids = [keys[i] if key_only else (shards[i], keys[i]) for i in o]
            noisy = np.fromiter((i in truth for i in ids), bool, len(ids))
        if not np.array_equal(uids[o], order0):
            raise SystemExit(f"{full_run}: epoch losses do not cover the same samples (not a full-data run)")
        hist.append(loss[o].astype(np.float64))
    assert noisy is not None
    out = []
    for e in range(2, epochs + 1):
        H = np.stack(hist[:e])
        mean, last = H.mean(axis=0).astype(np.float32), H[-1]
        entry: dict = {"plan_epoch": e}
        for scale in ("loss", "log1p"):
            # the library's scores (float32 of the scale applied to float32 means) and last losses
            x = on_scale(mean, scale).astype(np.float32)
            g = on_scale(last, scale)
            m = fit_two_gaussians(points1d(x))
            if m is None:
                entry[scale] = None
                continue
            fit = NoiseFit(len(x), m, scale)  # the library's test (on log1p: the upper mode a minority)
            r = {"D": m.separation, "ks": ks_distance(x, m.weight, m.mean, m.sd), "upper_weight": m.weight[1],
                 "active": fit.active}  # fmt: skip
            if fit.active and m.threshold is not None:
                sus = (x.astype(np.float64) > m.threshold) & (g > m.threshold)
                tp = int((sus & noisy).sum())
                r.update(suspected=int(sus.sum()), precision=tp / max(int(sus.sum()), 1), recall=tp / int(noisy.sum()))
            entry[scale] = r
        out.append(entry)
    return out


def _scale(r: dict) -> str:
    """The run's rule as the report names it: full (no rule), loss, log1p, and + random r."""
    params = r.get("params") or {}
    name = params.get("noise_scale", "loss") if params.get("noise") else "full"
    return name + (f" + random r={params['r']:g}" if r.get("policy") == "random" else "")


def _after_share(r: dict) -> float:
    """Mismatched % of the pairs trained after the warm-up (the plans of epochs 2 on)."""
    after = r["rows"][2:]
    return 100 * sum(x["mismatched_trained"] for x in after) / max(sum(x["trained"] for x in after), 1)


def _runs() -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(RESULTS.glob("scale-*.json"))]


def _run_row(r: dict) -> str:
    """A run's row: R@1, pruned %, what the rule trained and suspected (its precision at every plan)."""
    rows, scale, last = r["rows"], _scale(r), r["rows"][-1]
    rule, noisy = scale != "full", scale != "full" and r["noise"]
    active = noisy and any(x.get("noise_active") for x in rows)
    return row([f"{round(100 * r['noise'])}%", scale, str(len(rows)), str(r["seed"]), f"{r1(r):.1f}",
                f"{100 * r['pruned']:.1f}", or_dash(_after_share(r) if r["noise"] and rows[2:] else None, ".1f"),
                str(last.get("suspected", 0)) if rule else "-",
                pr_text(last.get("precision"), last.get("recall"), ".3f") if active else "-",
                ", ".join(or_dash(x.get("precision"), ".3f") for x in rows[2:]) if noisy else "-"])  # fmt: skip


# precision and recall at the last plan, the mismatched % after the warm-up: shown as loss -> log1p
CHANGES = ((lambda r: r["rows"][-1].get("precision") or 0, ".3f"), (lambda r: r["rows"][-1].get("recall") or 0, ".3f"),
           (_after_share, ".1f"))  # fmt: skip


def _comparisons(runs: list[dict]) -> list[str]:
    """The tables both sections show: per seed, each rule (on either scale) minus full data of the same
    seed and length, and log1p against loss; the schedule length."""
    full = {(r["noise"], len(r["rows"]), r["seed"]): r for r in runs if _scale(r) == "full"}
    by: dict[tuple, dict[str, dict]] = {}
    for r in runs:
        if (name := _scale(r)) != "full":
            scale, _, rest = name.partition(" ")
            by.setdefault((r["noise"], rest, len(r["rows"]), r["seed"]), {})[scale] = r
    rows = []
    for (noise, rest, epochs, seed), s in sorted(by.items()):
        f, a, b = full.get((noise, epochs, seed)), s.get("log1p"), s.get("loss")
        cells = [format(r1(s[x]) - r1(f), "+.1f") if f and x in s else "-" for x in ("loss", "log1p")]
        both = a is not None and b is not None
        cells += [f"{r1(a) - r1(b):+.1f}", f"{100 * (a['pruned'] - b['pruned']):+.1f}"] if both else ["-"] * 2
        cells += [f"{format(v(b), spec)} -> {format(v(a), spec)}" if both and noise else "-" for v, spec in CHANGES]
        rows.append(row([f"{round(100 * noise)}%", str(epochs), f"the rule {rest or 'alone'}", str(seed), *cells]))
    lines = ["Each rule's mean R@1 minus full data's (same seed and length), and log1p against loss (paired by seed; "
             "precision and recall at the last plan and the mismatched % of the pairs trained after the warm-up as "
             "loss -> log1p):", "",
             *table_head("| mismatched | epochs | rule | seed | mean R@1 minus full data: loss | mean R@1 minus full "
                         "data: log1p | mean R@1, log1p minus loss | pruned %, log1p minus loss | precision | recall "
                         "| mismatched % after the warm-up |"), *rows, ""] if rows else []  # fmt: skip
    return lines + _length_lines(runs)


def _length_lines(runs: list[dict]) -> list[str]:
    """For each rule (and full data) run at the study's E and at a longer schedule, seed by seed:
    mean R@1 after each, and the longer run's best epoch (is full data still rising at E?)."""
    by: dict[tuple, dict[int, dict]] = {}
    for r in runs:
        by.setdefault((r["noise"], _scale(r), r["seed"]), {})[len(r["rows"])] = r
    rows = []
    for (noise, scale, seed), lengths in sorted(by.items()):
        if len(lengths) > 1:
            E, longer = min(lengths), max(lengths)
            curve = [r1(x) for x in lengths[longer]["rows"]]
            who = "full data" if scale == "full" else f"the rule ({scale})"
            rows.append(row([who, f"{round(100 * noise)}%", str(seed), f"{r1(lengths[E]):.1f} after {E} epochs",
                             f"{curve[-1]:.1f} after {longer}", f"{max(curve):.1f} after {1 + int(np.argmax(curve))} "
                             "epochs"]))  # fmt: skip
    if not rows:
        return []
    return ["Schedule length: mean R@1 at the study's E and at the end of a longer run, and the longer run's best:",
            "", *table_head("| run | mismatched | seed | at E | longer run | longer run's best |"), *rows,
            ""]  # fmt: skip


def _replay_lines(path: Path) -> list[str]:
    """A replay's table: at each plan, both fits' D, KS distance, upper weight and suspects' precision / recall."""
    rep = json.loads(path.read_text())
    lines = [f"Replay of both fits on the per-epoch losses of `{rep['run']}` (`{path.name}`): at each plan, Ashman's "
             "D, the Kolmogorov-Smirnov distance between the scores and the fitted mixture (no labels: what the "
             "choice of scale rests on), the upper component's weight, and (from the labels, reported only) the "
             "suspects' precision / recall.", "",
             *table_head("| plan of epoch | loss: D | loss: KS | loss: upper weight | loss: precision / recall "
                         "| log1p: D | log1p: KS | log1p: upper weight | log1p: precision / recall |")]  # fmt: skip
    for x in rep["rows"]:
        cells = [str(x["plan_epoch"])]
        for scale, f in (("loss", x.get("loss") or {}), ("log1p", x.get("log1p") or {})):
            majority = scale == "log1p" and f.get("D", 0) >= 2 and f.get("upper_weight", 0) >= 0.5
            cells += [or_dash(f.get(c), spec) for c, spec in (("D", ".2f"), ("ks", ".4f"), ("upper_weight", ".3f"))]
            inactive = "inactive (upper mode the majority)" if majority else "inactive"
            cells.append(pr_text(f.get("precision"), f.get("recall"), ".3f") if f.get("active") else inactive)
        lines.append(row(cells))
    return [*lines, ""]


def report_lines() -> list[str]:
    """The section of docs/quality-pairs.md, every number from the files in RESULTS."""
    runs = _runs()
    lines = ["### The rule's scale: loss or log1p (closed loop, this machine)", "",
             "Generated by `python -m studies noise_scale_check --report` from `docs/quality-runs/noise-scale/`. The "
             'rule alone (policy `full`, `noise=True`) with the mixture fitted on the loss (`noise_scale="loss"`, what '
             "the study above measured) or on log1p of it (docs/algorithms.md §12.11), on the same pairs (10,000, E = "
             "10), one process with one torch thread. Not compared with the study's tables: another machine.",
             ""]  # fmt: skip
    if not runs:
        return [*lines, "No run has finished yet.", ""]
    order = {"full": 0, "loss": 1, "log1p": 2}
    runs.sort(key=lambda r: (r["noise"], len(r["rows"]), r.get("policy") == "random", r["seed"],
                             order.get(_scale(r).split(" ")[0], 9)))  # fmt: skip
    head = ("| mismatched | rule (scale) | epochs | seed | mean R@1 (last epoch) | pruned % | mismatched % of trained "
            "pairs after the warm-up | suspects, last plan | precision / recall, last plan | precision, plans of "
            "epochs 2 .. E-1 |")  # fmt: skip
    lines += [f"Machine: {_machines(runs)}.", "", *table_head(head), *map(_run_row, runs), "", *_comparisons(runs)]
    for path in sorted(RESULTS.glob("replay-*.json")):
        lines += _replay_lines(path)
    return lines


def _machines(runs: list[dict]) -> str:
    return ", ".join(sorted({machine_name(r.get("machine")) for r in runs}))


def summary_lines() -> list[str]:
    """docs/results.md's section on the scale: the comparisons' tables and what the rule did on clean pairs."""
    runs = _runs()
    lines = _comparisons(runs)
    if clean := [r for r in runs if not r["noise"] and _scale(r) == "log1p"]:
        most = max(max(x.get("suspected") or 0 for x in r["rows"]) for r in clean)
        lines += [f"Clean pairs, log1p, {len(clean)} seed{'s' if len(clean) > 1 else ''}: at most {most} pairs "
                  "suspected in any plan.", ""]  # fmt: skip
    if not lines:
        return ["(no closed-loop run of both scales yet)"]
    return [f"Closed loop on one machine (`studies/noise_scale_check.py`, 10,000 pairs, E = 10; {_machines(runs)};"
            " the whole section: "
            "[docs/quality-pairs.md](quality-pairs.md#the-rules-scale-loss-or-log1p-closed-loop-this-machine)).", "",
            *lines[:-1]]  # fmt: skip


def report() -> None:
    """The sections of docs/quality-pairs.md and docs/results.md."""
    splice(ROOT / "docs" / "quality-pairs.md", "<!-- noise-scale:begin -->", "<!-- noise-scale:end -->", report_lines())
    splice(ROOT / "docs" / "results.md", "<!-- noise-scale-summary:begin -->", "<!-- noise-scale-summary:end -->",
           summary_lines())  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--variant", choices=("full", "loss", "log1p"))
    p.add_argument("--replay", choices=("pairs", "cifar10"), help="replay both fits on a full-data run's losses")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--noise", type=float, default=0.2, help="share of mismatched pairs (0.2 or 0.0)")
    p.add_argument("--random", type=float, help="dynamic random pruning at this r on top of the rule")
    p.add_argument("--epochs", type=int, help="train this many epochs instead of the study's E (the 2E check)")
    p.add_argument("--report", action="store_true", help="rewrite the sections in docs/ (quality-pairs, results)")
    args = p.parse_args(argv)
    RESULTS.mkdir(parents=True, exist_ok=True)
    if args.report:
        return report()
    if args.replay == "pairs":
        run = ROOT / "bench-out" / "noise-study" / "runs" / run_id("full", args.seed, args.noise)
        import pyarrow.parquet as pq

        t = pq.read_table(ns.pairs_data(ns.Ctx(), args.noise) / "noise.parquet")
        truth = set(zip(t.column("shard").to_pylist(), t.column("key").to_pylist()))
        rows = replay(run, ns.TRAIN["epochs"], truth, key_only=False)
        out = RESULTS / f"replay-pairs-n{round(100 * args.noise)}-s{args.seed}.json"
    elif args.replay == "cifar10":
        from studies.quality.data import noise_offsets

        ctx = ns.Ctx()
        ds, population = ns.label_dataset(ctx, "cifar10")
        run = ctx.runs / f"cifar10-noisy-full-nz-full-default-s{args.seed}"
        rows = replay(run, ds.epochs, set(noise_offsets(population, ds.classes)), key_only=True)
        out = RESULTS / f"replay-cifar10-noisy-s{args.seed}.json"
    else:
        if args.variant is None:
            p.error("--variant or --replay")
        res = train(args.variant, args.seed, args.noise, args.random, args.epochs)
        out = RESULTS / f"{res['id']}.json"
        write_json(out, res)
        for r in res["rows"]:
            print(r["epoch"], r.get("suspected"), r.get("precision"), r.get("recall"), r["mismatched_share"],
                  r["i2t_r1"], r["t2i_r1"])  # fmt: skip
        return
    write_json(out, {"run": str(run.relative_to(ROOT)), "rows": rows})
    for r in rows:
        print(json.dumps(r))


if __name__ == "__main__":
    main()
