"""The headline claim on generated shape pairs against the baselines a reviewer names (issue 33).

The claim (README, ``bash tools/demo.sh``): on 10,000 generated pairs (``tools.make_pair_shards``: 32-pixel
images of one shape each, captions from a few templates, laid out as img2dataset writes SS1M-like sets), 20% of
them given another image's caption, E = 10 and batch 128, the noise rule with dynamic random pruning on top
(``random``, r = 0.19, ``noise=True``: "rule + random") retrieves better than full data of the same length and
seed. r = 0.19 is read from the noise study's calibration file (:data:`CAL`, chosen on full data's training
losses before these runs). Here it is set beside, paired by seed (one machine, one torch thread, one loader
worker, one run at a time):

* ``full``: full data; its last epoch, and **early-stopped**: the test R@1 after the epoch of best validation
  R@1 (the first such epoch where several tie). The validation split is the last training shard
  (:data:`VAL_SHARD`: 1,000 pairs, as mismatched as the rest, never the test split); every method trains on the
  other shards.
* ``full-equal``: full data at **equal compute**: exactly the pairs rule + random of that seed trained
  (delivered, its weight-0 re-checks included), the schedule (warm-up 10%, cosine to 0) stretched over that
  budget's length in epochs, the last epoch stopped when the budget is spent
  (``studies.engines.pairs.run(budget=...)``).
* ``random-same``: **dynamic random** at the pruned fraction rule + random of that seed measured.
* ``oracle``: full data **without the known mismatched pairs** (``noise.parquet``): the training shards
  rewritten without them, same schedule; the ceiling a perfect detector reaches.
* ``rule-random`` and ``rule`` (the rule alone: ``full`` with ``noise=True``), trained again now with the
  small-final-batch remedy (``studies.engines.pairs.run`` divides every step by the nominal batch size).
* ``full-equal-rule`` and ``random-rule``: full data at equal compute and dynamic random at the **rule
  alone's** own share (its pairs trained, its measured pruned fraction), so that the rule alone is held
  against the same two baselines as rule + random. The report shows them beside the rule alone, and says
  "not run" while their result files are missing.

cleanlab needs class labels and predicted class probabilities; image-text pairs have neither, so it is not
run here (the labelled data sets are another study's).

Runs go through the studies' one runner (``studies/quality/harness.py``: claims, resume by result file,
whole-file writes with the machine, ``.crashed`` files). Each run is
``docs/quality-runs/baselines-pairs/<id>.json`` (per-epoch test and validation recalls, pairs trained, the
machine); a rerun skips finished runs, so the queue resumes after a kill. ``--report-only`` writes
docs/baselines.md from the result files alone.

    python -m studies baselines_pairs                   # the queue (resumes), then the report
    python -m studies baselines_pairs --limit 600       # start no run after 600 minutes
    python -m studies baselines_pairs --report-only     # docs/baselines.md from the result files
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tarfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from studies.quality import harness
from studies.quality.harness import Job, load
from studies.quality.layout import child_env, python_m
from tools import draws
from tools.results import gap_verdict, path_label, precision_recall, provenance_lines, rule_targets

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "docs" / "quality-runs" / "baselines-pairs"
OUT = ROOT / "bench-out" / "baselines-pairs"
DOC = ROOT / "docs" / "baselines.md"
CAL = ROOT / "docs" / "quality-runs" / "noise-study-2core" / "pairs-n20-E10-cal-rule-random.json"
DATA = dict(train=10000, test=1000, shard_size=1000, size=32, seed=0)  # the noise study's set
TRAIN = dict(epochs=10, batch_size=128, lr=2e-3, workers=1)
VAL_SHARD = -1  # the last training shard (sorted by name) is the validation split
#: (mismatched share, seed) in queue order; the last is run only where a 40% gap is within 2 SE
ROUNDS = ((0.2, 0), (0.2, 1), (0.2, 2), (0.4, 0), (0.4, 1))
EXTRA = (0.4, 2)
#: (mismatched share, seed) of the low shares, after the rounds: does the rule find a few percent of mismatched
#: pairs? Only :data:`LOW_METHODS` run there (the rule alone against full data, early-stopped or not).
LOW_ROUNDS = ((0.03, 0), (0.03, 1), (0.05, 0), (0.05, 1), (0.1, 0), (0.1, 1), (0.0, 0), (0.0, 1))


def low_rounds(seeds: int) -> tuple:
    """:data:`LOW_ROUNDS` with ``seeds`` seeds of each share: seeds 0 and 1 of every share first, then each
    further seed of every share."""
    shares = list(dict.fromkeys(n for n, _ in LOW_ROUNDS))
    return tuple(r for r in LOW_ROUNDS if r[1] < seeds) + tuple((n, s) for s in range(2, seeds) for n in shares)


#: the oracle filter too, to tell whether the noise leaves a margin to gain (clean data: the oracle is full data)
LOW_METHODS = ("full", "rule", "oracle")
PRIOR_RATE = {"pairs": 1.6e-3, "cal": 60.0}  # seconds per trained pair (the runner's deadline estimate)


def calibrated_r() -> float:
    """r of rule + random: the calibration's 30% level (chosen on full data's training losses)."""
    return json.loads(CAL.read_text())["levels"]["30"]["params"]["r"]


@dataclass(frozen=True)
class Method:
    """One configuration: the policy and parameters, the training set (``fit``: the shards less the
    validation shard; ``oracle``: those without the mismatched pairs), and what it takes from the run ``ref``
    (rule + random, or the rule alone) of the same seed (``matches``: ``"pruned"``, its measured pruned
    fraction as r; ``"pairs"``, its pairs trained as the budget)."""

    name: str
    label: str
    policy: str
    params: dict = field(default_factory=dict, hash=False)
    data: str = "fit"
    matches: str | None = None
    ref: str = "rule-random"


def methods(r: float) -> list[Method]:
    """The registry, in queue order within a round (rule + random first and the rule alone before the two
    baselines that take each one's figures)."""
    return [
        Method("rule-random", f"rule + random r={r}", "random", {"r": r, "noise": True}),
        Method("full", "full data", "full"),
        Method("oracle", "oracle filter", "full", data="oracle"),
        Method("full-equal", "full data, equal compute", "full", matches="pairs"),
        Method("random-same", "dynamic random, same pruned %", "random", matches="pruned"),
        Method("rule", "rule alone", "full", {"noise": True}),
        Method("full-equal-rule", "full data, equal compute (the rule alone's)", "full", matches="pairs", ref="rule"),
        Method("random-rule", "dynamic random, the rule alone's pruned %", "random", matches="pruned", ref="rule"),
    ]


@dataclass
class Ctx(harness.Ctx):
    """The runner's context at the study's defaults: its data set, schedule and queue."""

    results: Path = RESULTS
    doc: Path = DOC
    out: Path = OUT
    data: dict = field(default_factory=lambda: dict(DATA))
    train: dict = field(default_factory=lambda: dict(TRAIN))
    rounds: tuple = ROUNDS
    extra: tuple | None = EXTRA
    low: tuple = LOW_ROUNDS
    r: float = field(default_factory=calibrated_r)
    quiet: bool = False


def pct(x: float) -> int:
    return round(100 * x)


def run_id(noise: float, method: str, seed: int) -> str:
    return f"pairs-n{pct(noise)}-{method}-s{seed}"


# ------------------------------------------------------------------------------------ the data
def prepare(ctx: Ctx, noise: float) -> dict[str, Path | list[str]]:
    """The generated set, and its views: ``fit`` (train/ = the shards less the validation shard, as links;
    test/; noise.parquet of those shards), ``oracle`` (train/ = those shards rewritten without the mismatched
    pairs; an empty noise.parquet), ``val`` (the validation shard's URL)."""
    import pyarrow.parquet as pq

    base = ctx.out / f"data-n{pct(noise)}"
    D = ctx.data
    if not draws.made_with_these_draws(base / "info.json"):
        shutil.rmtree(base, ignore_errors=True)  # none yet, or made with an older tool's draws: made again
        args = ["--out", base, "--noise", noise, "--train", D["train"], "--test", D["test"]]
        args += ["--shard-size", D["shard_size"], "--size", D["size"], "--seed", D["seed"], "--workers", 1]
        subprocess.run(
            python_m("tools.make_pair_shards", *args), check=True, stdout=subprocess.DEVNULL, env=child_env()
        )
    shards = sorted((base / "train").glob("*.tar"))
    val, fit = shards[VAL_SHARD], [s for s in shards if s != shards[VAL_SHARD]]
    noise_table = pq.read_table(base / "noise.parquet")
    fit_names = {s.name for s in fit}
    keep = [s in fit_names for s in noise_table.column("shard").to_pylist()]
    import pyarrow as pa

    fit_noise = noise_table.filter(pa.array(keep, type=pa.bool_()))  # typed: no mismatched pair at 0%
    mismatched = set(zip(fit_noise.column("shard").to_pylist(), fit_noise.column("key").to_pylist()))
    views = {}
    for view in ("fit", "oracle"):
        d = base / view
        if not (d / "done").exists():
            shutil.rmtree(d, ignore_errors=True)
            (d / "train").mkdir(parents=True)
            (d / "test").symlink_to(base / "test", target_is_directory=True)
            for s in fit:
                if view == "fit":
                    (d / "train" / s.name).symlink_to(s)
                else:
                    drop_pairs(s, d / "train" / s.name, {k for sh, k in mismatched if sh == s.name})
            pq.write_table(fit_noise if view == "fit" else fit_noise.slice(0, 0), d / "noise.parquet")
            (d / "done").write_text("")
        views[view] = d
    return {**views, "val": [str(val)]}


def drop_pairs(src: Path, dst: Path, keys: set[str]) -> None:
    """Copy the tar ``src`` to ``dst`` without the members of the samples ``keys`` (the same bytes and
    headers for every other member)."""
    tmp = dst.with_name(dst.name + ".tmp")
    with tarfile.open(src) as fin, tarfile.open(tmp, "w", format=tarfile.USTAR_FORMAT) as fout:
        for m in fin:
            if m.name.split(".", 1)[0] not in keys:
                fout.addfile(m, fin.extractfile(m) if m.isfile() else None)
    os.replace(tmp, dst)


# ------------------------------------------------------------------------------------ the runs
def queue(ctx: Ctx) -> list[tuple[float, int, Method]]:
    """Every run in order: the rounds, the extra round where a 40% gap is within 2 SE, then the low shares'
    runs of :data:`LOW_METHODS`."""
    rounds = list(ctx.rounds)
    if ctx.extra and ctx.extra not in rounds and needs_extra(ctx, ctx.extra[0]):
        rounds.append(ctx.extra)
    low = [m for m in methods(ctx.r) if m.name in LOW_METHODS]
    return [(noise, seed, m) for noise, seed in rounds for m in methods(ctx.r)] + [
        (noise, seed, m) for noise, seed in ctx.low for m in low if noise or m.name != "oracle"
    ]


def needs_extra(ctx: Ctx, noise: float) -> bool:
    """Whether a gap of rule + random to a baseline at ``noise`` is within 2 SE (needs the rounds' seeds)."""
    seeds = [s for n, s in ctx.rounds if n == noise]
    table = gaps(read(ctx), noise, seeds)
    return any(row["se2"] is not None and abs(row["mean"]) <= row["se2"] for row in table)


def params_for(ctx: Ctx, noise: float, seed: int, m: Method) -> tuple[dict, int | None] | None:
    """(policy parameters, pair budget) of a run, or None while the run it takes its figures from (``m.ref``
    of its seed) is missing."""
    if m.matches is None:
        return dict(m.params), None
    ref = load(ctx, run_id(noise, m.ref, seed))
    if ref is None:
        return None
    if m.matches == "pruned":
        return {**m.params, "r": round(ref["pruned"], 4)}, None
    return dict(m.params), ref["pairs_trained"]


def plan(ctx: Ctx) -> list[Job]:
    """:func:`queue` as the runner's jobs; equal compute and dynamic random need the run whose figures they
    take (rule + random or the rule alone of their seed)."""
    pairs = (ctx.data["train"] - ctx.data["shard_size"]) * ctx.train["epochs"]  # less the validation shard
    return [Job(run_id(noise, m.name, seed), "pairs", {"noise": noise, "method": m.name, "seed": seed},
                (run_id(noise, m.ref, seed),) if m.matches else (), pairs)
            for noise, seed, m in queue(ctx)]  # fmt: skip


def run(ctx: Ctx, job: Job, progress: list[str]) -> dict:
    """Train one job of :func:`plan`; its result (the runner writes it, with the machine)."""
    from studies.engines import pairs as tp
    from studies.quality.pairs import plan_checks, run_suspects

    noise, seed = job.spec["noise"], job.spec["seed"]
    (m,) = [m for m in methods(ctx.r) if m.name == job.spec["method"]]
    got = params_for(ctx, noise, seed, m)
    if got is None:
        raise RuntimeError(f"{job.rid}: {run_id(noise, m.ref, seed)}.json, whose figures it takes, is missing")
    params, budget = got
    views = prepare(ctx, noise)
    rid, T = job.rid, ctx.train
    args = argparse.Namespace(data=str(views[m.data]), seed=seed, quiet=True, **T)
    run_dir = ctx.runs / rid

    def log(line: str) -> None:
        progress.append(line.strip())
        if not ctx.quiet:
            print(f"  {rid}: {line.strip()}", flush=True)

    res = tp.run(args, m.policy, params, str(run_dir), keep_keys=True, log=log, val=views["val"], budget=budget)
    truth = tp.load_noise(str(views[m.data]))
    checks = plan_checks(str(run_dir), res.pop("delivered"), truth)
    whole = run_suspects(checks, truth) if params.get("noise") else None
    kept_fields = ("delivered_equals_plan", "suspect_precision", "suspect_recall", "auc")
    rows = [{**row, **{k: c[k] for k in kept_fields}} for row, c in zip(res.pop("rows"), checks)]
    epochs = len(rows)
    cut_last = budget is not None and rows[-1]["trained"] < rows[-1]["kept"]
    exact = all(r["delivered_equals_plan"] for r in (rows[:-1] if cut_last else rows))
    ok = exact and all(np.isfinite(r["loss"]) for r in rows)
    res.pop("run_dir")
    result = {
        "study": "baselines-pairs",
        "id": rid,
        "method": m.name,
        "label": m.label,
        "status": "ok" if ok else "check_failed",
        "noise": noise,
        **res,
        "params": params,
        "budget": budget,
        "schedule_epochs": T["epochs"] if budget is None else budget / rows[0]["n"],  # the cosine's length
        "r_from": CAL.relative_to(ROOT).as_posix(),
        "pairs_trained": sum(r["trained"] for r in rows),
        **({"run_suspects": whole} if whole is not None else {}),
        "epochs_run": epochs,
        "rows": rows,
        "data": {
            **ctx.data,
            "noise": noise,
            "set": m.data,
            "val_shard": Path(views["val"][0]).name,
            "train_pairs": rows[0]["n"],
        },  # fmt: skip
        "train": {**T, "epochs": T["epochs"]},
    }
    shutil.rmtree(run_dir, ignore_errors=True)
    return result


# ------------------------------------------------------------------------------------ readings
def r1(row: dict, prefix: str = "") -> float:
    """Mean of image->text and text->image recall@1, in %."""
    return 50.0 * (row[prefix + "i2t_r1"] + row[prefix + "t2i_r1"])


def early_stop_epoch(rows: list[dict]) -> int:
    """The epoch of best validation R@1; the first of them where several tie."""
    vals = [r1(r, "val_") for r in rows]
    return vals.index(max(vals))


def read(ctx: Ctx) -> dict[tuple[float, str, int], dict]:
    """(noise, method, seed) -> a finished run's readings."""
    from studies.quality.instability import unstable

    out = {}
    for p in sorted(ctx.results.glob("*.json")):
        d = json.loads(p.read_text())
        if d.get("study") != "baselines-pairs":
            continue
        es = early_stop_epoch(d["rows"])
        out[(d["noise"], d["method"], d["seed"])] = {
            "file": p.name,
            "val_shard": d["data"]["val_shard"],
            "final": r1(d["rows"][-1]),
            "es": r1(d["rows"][es]),
            "es_epoch": es,
            "pairs": d["pairs_trained"],
            "pruned": d["pruned"],
            "r": d["params"].get("r"),
            "unstable": unstable(d, p.name),  # the instability scan
            "status": d["status"],
            "machine": d["machine"],
            "epochs": len(d["rows"]),
            "length": d["schedule_epochs"],
            "plans": plan_readings(d["rows"]) if d["method"] == "rule" else [],  # valid for the rule alone
            "run_suspects": d.get("run_suspects"),
            "auc": [r.get("auc") for r in d["rows"]],
        }
    return out


def plan_readings(rows: list[dict]) -> list[dict]:
    """Per epoch, what the rule left out and how much of it was mismatched: the suspected pairs are every pair
    not learnt from (the rule alone keeps every other pair with weight 1; its re-checks have weight 0), so
    precision = mismatched among them / suspected and recall = mismatched among them / all mismatched pairs
    (the epoch-0 plan trains every pair). Only for the rule alone: with a policy that prunes too, the pairs not
    learnt from are not the suspects. Empty for a run whose rows carry no ``noise_suspected``."""
    if not rows or "noise_suspected" not in rows[0] or rows[0]["kept"] != rows[0]["n"]:
        return []
    total = rows[0]["mismatched_trained"]
    out = []
    for r in rows:
        out_n, caught = r["n"] - r["learnt"], total - r["mismatched_learnt"]
        if r["noise_suspected"] and out_n != r["noise_suspected"]:
            raise ValueError(f"epoch {r['epoch']}: {r['noise_suspected']} suspected, {out_n} pairs not learnt from")
        out.append({"epoch": r["epoch"], "suspected": r["noise_suspected"], "mismatched": total,
                    "precision": caught / out_n if out_n else None,
                    "recall": caught / total if total else None})  # fmt: skip
    return out


#: rule + random's final test R@1 against each baseline's reading (``final``: its last epoch; ``es``: early-stopped)
COMPARISONS = (
    ("full", "final", "full data, last epoch"),
    ("full", "es", "full data, early-stopped"),
    ("full-equal", "final", "full data, equal compute"),
    ("random-same", "final", "dynamic random, same pruned %"),
    ("rule", "final", "rule alone"),
    ("oracle", "final", "oracle filter (the ceiling)"),
)


def verdict_text(g: dict) -> str:
    """:func:`~tools.results.gap_verdict`'s verdict of a row of :func:`gaps`, with the bound of mean ± 2 SE
    nearer 0 where the gap is not met."""
    if g["verdict"] == "met" or g["se2"] is None:
        return g["verdict"]
    bound = g["mean"] - g["se2"] if g["mean"] > 0 else g["mean"] + g["se2"]
    return f"{g['verdict']} (mean {'-' if g['mean'] > 0 else '+'} 2 SE = {bound:+.1f})"


#: the rule alone's last epoch against each baseline's reading, the two at its own share included
RULE_COMPARISONS = (
    ("full", "final", "full data, last epoch"),
    ("full", "es", "full data, early-stopped"),
    ("full-equal-rule", "final", "full data, equal compute (the rule alone's pairs)"),
    ("random-rule", "final", "dynamic random, the rule alone's pruned %"),
    ("oracle", "final", "oracle filter (the ceiling)"),
)


def gaps(runs: dict, noise: float, seeds: list[int], own: str = "final", subject: str = "rule-random",
         comparisons: tuple = COMPARISONS) -> list[dict]:  # fmt: skip
    """Per comparison, ``subject`` (rule + random) minus the baseline, per seed where both runs exist.
    ``own="final"``: its last epoch against each baseline's reading of ``comparisons``; ``"es"``: both
    early-stopped."""
    out = []
    for base, kind, label in comparisons:
        if own == "es" and (base, kind) == ("full", "final"):
            continue
        per = {}
        for s in seeds:
            a, b = runs.get((noise, subject, s)), runs.get((noise, base, s))
            if a and b:
                per[s] = a[own] - b[kind if own == "final" else "es"]
        if per:
            mean, se2, v = gap_verdict(list(per.values()))
            label = label if own == "final" else label.replace(", last epoch", "").replace(", early-stopped", "")
            out.append({"baseline": base, "kind": kind, "label": label, "per": per, "mean": mean, "se2": se2,
                        "verdict": v})  # fmt: skip
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--report-only", action="store_true", help="write docs/baselines.md from the result files")
    p.add_argument("--limit", type=float, help="start no run after this many minutes")
    p.add_argument("--results", type=Path, default=RESULTS, help="the result files' folder (default: %(default)s)")
    p.add_argument("--doc", type=Path, default=DOC, help="the page the report writes (default: %(default)s)")
    p.add_argument("--low-seeds", type=int, default=2, help="seeds of each low share, 0 first (default: %(default)s)")
    a = p.parse_args(argv)
    ctx = Ctx(results=a.results.resolve(), doc=a.doc.resolve(), low=low_rounds(a.low_seeds))
    if not a.report_only:
        ctx.last_start = None if a.limit is None else ctx.started + 60 * a.limit
        harness.worker(ctx, sys.modules[__name__])  # one process, one torch thread
    write_report(ctx)
    return 0


# ------------------------------------------------------------------------------------ the report
def _seeds(per: dict) -> str:
    return ", ".join(f"{v:+.1f} (s{s})" for s, v in per.items())


def _se(se2: float | None) -> str:
    return "n/a (one seed)" if se2 is None else f"{se2:.1f}"


def report(ctx: Ctx) -> str:
    """docs/baselines.md, every number from the result files of ``ctx.results``."""
    from studies.quality.instability import MARK, MEANING

    runs = read(ctx)
    rel = ctx.results.relative_to(ROOT).as_posix() if ctx.results.is_relative_to(ROOT) else ctx.results.name
    reg = methods(ctx.r)
    names = {m.name: m.label for m in reg}
    machines = sorted({f"{v['machine']['cpu']}, {v['machine']['cores']} cores, torch {v['machine']['torch']}"
                       for v in runs.values()})  # fmt: skip
    unstable = sorted(v["file"] for v in runs.values() if v["unstable"])
    failed = sorted(v["file"] for v in runs.values() if v["status"] != "ok")
    missing = [run_id(n, m.name, s) for n, s, m in queue(ctx) if (n, m.name, s) not in runs]
    D, T = ctx.data, ctx.train
    vals = sorted({v["val_shard"] for v in runs.values()}) or ["none yet"]
    levels = sorted({n for n, _ in ctx.rounds} | ({ctx.extra[0]} if ctx.extra else set()))
    low = sorted({n for n, _ in ctx.low} - set(levels))
    threads = sorted({v["machine"]["torch_threads"] for v in runs.values()})
    command = (
        "python -m studies baselines_pairs --report-only"
        + ("" if ctx.results == RESULTS else f" --results {path_label(ctx.results)} --doc {path_label(ctx.doc)}")
        + ("" if ctx.low == LOW_ROUNDS else f" --low-seeds {1 + max((s for _, s in ctx.low), default=-1)}")
    )
    L = [
        "# Baselines: the noise rule on generated shape pairs against what a reviewer would set beside it",
        "",
        f"<!-- generated by `{command}` from the result files in `{rel}/`; do not edit by hand -->",
        "",
        *provenance_lines(ctx.results),
        f"The headline claim ([README](../README.md), `bash tools/demo.sh`): on {D['train']:,} generated shape pairs "
        f"({D['size']}-pixel images of one shape each, captions from a few templates, in img2dataset's SS1M-like "
        "layout) with a share of mismatched captions, the noise rule with dynamic random pruning on top (`random`, "
        f"r = {ctx.r}, `noise=True`: *rule + random*) retrieves better than full data of the same length and seed. "
        f"r = {ctx.r} is read from the noise study's calibration file (`{CAL.relative_to(ROOT).as_posix()}`, "
        "chosen on full data's training losses before these runs) and is not tuned again for 40% mismatched (tuning "
        "on a known noise rate would leak it).",
        "",
        "Here rule + random is set beside the baselines of issue 33, paired by seed: "
        f"{len(runs)} finished runs on one machine ({'; '.join(machines) or 'none yet'}), torch threads "
        f"{', '.join(map(str, threads)) or 'n/a'}, {T['workers']} loader worker, one run at a time. "
        "In short (rule + random's last epoch minus each baseline, R@1 points, mean over seeds, 2 SE):",
        "",
        *summary_lines(ctx, runs, levels),
        *low_summary(runs, low),
        "",
        *targets_section(runs, sorted({n for (n, _, _) in runs})),
        "## What was run",
        "",
        f"* **Data**: `tools/make_pair_shards.py --train {D['train']} --test {D['test']} --shard-size "
        f"{D['shard_size']} --size {D['size']} --seed {D['seed']}` with "
        + ", ".join(f"`--noise {n}`" for n in low + levels)
        + " (the same images; only the mismatched captions differ)."
        " Test R@1: the mean of image-to-text and text-to-image "
        f"recall@1 on the {D['test']:,} clean held-out pairs, in %.",
        f"* **Validation split**: the last training shard (`{'`, `'.join(vals)}`, {D['shard_size']:,} pairs, "
        "as mismatched as the other shards; never the test split). Every method trains on the other shards. "
        "*Early-stopped* = the test R@1 after the epoch of best validation R@1 (mean of both directions' "
        "recall@1 on the validation shard, its mismatched captions included, as a practitioner's would be); "
        "where several epochs tie, the first.",
        f"* **Schedule**: E = {T['epochs']}, batch {T['batch_size']}, AdamW lr {T['lr']}, warm-up over the first 10% "
        "of the schedule then cosine to 0, every step divided by the nominal batch size (the small-final-batch "
        "remedy, `studies/engines/pairs.py`).",
        "* **Full data at equal compute**: exactly the pairs rule + random of the same seed trained (delivered, "
        "its weight-0 re-checks included), full epochs then a cut last one: the schedule's length is that budget / "
        "the training pairs in epochs (warm-up 10% of it, cosine to 0 at its end), the last epoch stops once the "
        "budget is spent, its last batch cut to the pairs left (`studies.engines.pairs.run(budget=...)`).",
        "* **Dynamic random at the same pruned %**: `random` with r = the pruned fraction rule + random of the same "
        "seed measured (1 - pairs trained / pairs in its epochs), a fresh uniform subset every epoch.",
        "* **Oracle filter**: full data on the training shards rewritten without the known mismatched pairs "
        "(`noise.parquet`), same schedule: what a perfect detector would reach.",
        "* **The rule alone** (`full` with `noise=True`) and rule + random, trained again with the remedy.",
        "* **cleanlab** is not run here: it needs class labels and out-of-sample class probabilities, and image-text "
        "pairs have neither. It is run on the labelled data sets by another study.",
        "",
    ]
    for noise in levels:
        seeds = sorted({s for (n, _, s) in runs if n == noise})
        L += [f"## {pct(noise)}% mismatched", ""]
        if not seeds:
            L += ["No finished run yet.", ""]
            continue
        L += [
            "### Each run",
            "",
            f"Test R@1 in %; {MARK}: the run {MEANING} (instability scan, `docs/quality-runs/instability.json`).",
            "",
            "| method | seed | pairs trained | pruned % | test R@1, last epoch | test R@1, early-stopped (epoch) |",
            "| --- | --- | --- | --- | --- | --- |",
        ]
        for m in reg:
            for s in seeds:
                v = runs.get((noise, m.name, s))
                if v is None:
                    continue
                mark = f" {MARK}" if v["unstable"] else ""
                length = f"(a {v['length']:.2f}-epoch schedule)"  # equal compute: its budget's length
                pruned = f"{100 * v['pruned']:.1f}" if m.matches != "pairs" else length
                L.append(f"| {m.label}{mark} | {s} | {v['pairs']:,} | {pruned} | {v['final']:.1f} | "
                         f"{v['es']:.1f} ({v['es_epoch']}) |")  # fmt: skip
        for own, title in (
            ("final", "Rule + random (last epoch) against each baseline"),
            ("es", "Rule + random early-stopped against each baseline early-stopped"),
        ):
            rows = gaps(runs, noise, seeds, own)
            L += [
                "",
                f"### {title}",
                "",
                "Paired gap in R@1 points (rule + random minus the baseline, per seed), mean and 2 SE over seeds "
                "(SE = sample standard deviation / sqrt(seeds)); met: mean - 2 SE > 0.",
                "",
                "| baseline | seeds | gap per seed | mean | 2 SE | verdict |",
                "| --- | --- | --- | --- | --- | --- |",
            ]
            for g in rows:
                mark = f" {MARK}" if any(runs[(noise, b, s)]["unstable"] for s in g["per"]
                                         for b in ("rule-random", g["baseline"])) else ""  # fmt: skip
                L.append(f"| {g['label']}{mark} | {len(g['per'])} | {_seeds(g['per'])} | {g['mean']:+.1f} | "
                         f"{_se(g['se2'])} | {verdict_text(g)} |")  # fmt: skip
        L += rule_section(runs, noise, seeds)
        L += [
            "",
            "### Every method against the oracle filter",
            "",
            "Method minus the oracle filter, R@1 points, paired by seed (last epoch; early-stopped against the "
            "oracle early-stopped).",
            "",
            "| method | seeds | last epoch: mean (2 SE) | early-stopped: mean (2 SE) |",
            "| --- | --- | --- | --- |",
        ]
        for m in reg:
            if m.name == "oracle":
                continue
            cells, k = [], 0
            for kind in ("final", "es"):
                per = [runs[(noise, m.name, s)][kind] - runs[(noise, "oracle", s)][kind] for s in seeds
                       if (noise, m.name, s) in runs and (noise, "oracle", s) in runs]  # fmt: skip
                k = len(per)
                if per:
                    mean, se2, _ = gap_verdict(per)
                    cells.append(f"{mean:+.1f} (" + ("one seed" if se2 is None else f"2 SE {se2:.1f}") + ")")
            if cells:
                L.append(f"| {names[m.name]} | {k} | {cells[0]} | {cells[1]} |")
        L.append("")
    L += low_section(runs, low)
    L += ["## Runs unstable, failed or not run", ""]
    L.append(f"* Unstable ({MARK}): " + (", ".join(f"`{f}`" for f in unstable) if unstable else "none") + ".")
    L.append("* A check failed (delivered pairs not the plan's, or a non-finite loss): "
             + (", ".join(f"`{f}`" for f in failed) if failed else "none") + ".")  # fmt: skip
    L.append(
        "* Not run (cut by the time limit or not reached): "
        + (", ".join(f"`{r}`" for r in missing) if missing else "none")
        + "."
    )
    if unfinished := harness.unfinished(ctx.results):  # the runner's .crashed/.cut files
        L.append("* Crashed or cut short (run again by the next invocation): " + "; ".join(unfinished) + ".")
    L += [
        "",
        "## Reproduce",
        "",
        "```",
        "python -m studies baselines_pairs                # the runs whose result file is missing, then this page",
        "python -m studies baselines_pairs --report-only  # this page from the result files",
        "```",
    ]
    return "\n".join(L) + "\n"


def rule_section(runs: dict, noise: float, seeds: list[int]) -> list[str]:
    """The rule alone's last epoch against each baseline, those at its own share (equal compute, dynamic random)
    included; a baseline without a result file of a seed with the rule alone is "not run"."""
    from studies.quality.instability import MARK

    have = [s for s in seeds if (noise, "rule", s) in runs]
    if not have:
        return []
    L = ["", "### The rule alone (last epoch) against each baseline, at its own share", "",
         "Paired gap in R@1 points (the rule alone minus the baseline, per seed), mean and 2 SE over seeds; equal "
         "compute and dynamic random here take the rule alone's own pairs trained and pruned fraction (rule + "
         "random's are above).", "",
         "| baseline | seeds | gap per seed | mean | 2 SE | verdict |",
         "| --- | --- | --- | --- | --- | --- |"]  # fmt: skip
    rows = {(g["baseline"], g["kind"]): g for g in gaps(runs, noise, have, "final", "rule", RULE_COMPARISONS)}
    for base, kind, label in RULE_COMPARISONS:
        g = rows.get((base, kind))
        if g is None:
            missing = ", ".join(f"`{run_id(noise, base, s)}`" for s in have)
            L.append(f"| {label} | 0 | not run ({missing}: no result file yet) | - | - | - |")
            continue
        mark = f" {MARK}" if any(runs[(noise, b, s)]["unstable"] for s in g["per"] for b in ("rule", base)) else ""
        L.append(f"| {label}{mark} | {len(g['per'])} | {_seeds(g['per'])} | {g['mean']:+.1f} | {_se(g['se2'])} | "
                 f"{verdict_text(g)} |")  # fmt: skip
    return L


def rule_summary(runs: dict, noise: float, seeds: list[int]) -> str | None:
    """The rule alone's line of the summary: against each baseline of :data:`RULE_COMPARISONS`, "not run" where
    a baseline has no result file yet."""
    have = [s for s in seeds if (noise, "rule", s) in runs]
    if not have:
        return None
    rows = {(g["baseline"], g["kind"]): g for g in gaps(runs, noise, have, "final", "rule", RULE_COMPARISONS)}
    parts = []
    for base, kind, label in RULE_COMPARISONS:
        g = rows.get((base, kind))
        if base == "oracle":
            continue
        if g is None:
            parts.append(f"{label}: not run")
            continue
        se = "" if g["se2"] is None else f", 2 SE {g['se2']:.1f}"
        parts.append(f"{label} {g['mean']:+.1f}{se}: {verdict_text(g)}")
    return f"  The rule alone ({len(have)} seed{'s' if len(have) != 1 else ''}): " + "; ".join(parts) + "."


def summary_lines(ctx: Ctx, runs: dict, levels: list[float]) -> list[str]:
    """One list item per mismatched share of the rounds: rule + random against early-stopped full data, full
    data's last epoch, equal compute, dynamic random and the oracle filter."""
    out = []
    for noise in sorted({n for (n, _, _) in runs} & set(levels)):
        seeds = sorted({s for (n, _, s) in runs if n == noise})
        parts = []
        for g in gaps(runs, noise, seeds):
            if g["baseline"] == "rule":
                continue
            se = "" if g["se2"] is None else f", 2 SE {g['se2']:.1f}"
            parts.append(f"{g['label']} {g['mean']:+.1f}{se}: {verdict_text(g)}")
        k = len({s for s in seeds if (noise, "rule-random", s) in runs})
        body = "; ".join(parts) if parts else "no baseline run of a seed with rule + random has finished yet"
        out.append(f"* {pct(noise)}% mismatched ({k} seed{'s' if k != 1 else ''}): {body}.")
        if (line := rule_summary(runs, noise, seeds)) is not None:
            out.append(line)
    return out or ["* no finished run yet."]


def targets_section(runs: dict, shares: list[float]) -> list[str]:
    """The targets of a rule that never costs accuracy, per mismatched share, for the rule alone
    (docs/algorithms.md §12.12): early-stopped against early-stopped full data, mean + 2 SE >= 0; where the
    oracle filter beats early-stopped full data by 2 points or more, mean - 2 SE > 0 and within 1 point of the
    oracle; its suspects over the whole run (precision and recall, mean over seeds); nothing suspected on
    clean pairs."""
    if not shares:
        return []
    L = [
        "## The targets of a rule that never costs accuracy (the rule alone)",
        "",
        "Per share, paired by seed (R@1 points): the rule alone early-stopped minus full data early-stopped "
        "(target: mean + 2 SE >= 0); the oracle filter's margin over full data, both early-stopped; where that "
        "margin is 2 points or more, the rule minus full data must clear 0 by 2 SE and end within 1 point of the "
        "oracle (both early-stopped, mean); and the pairs any of the rule's plans suspected, against the "
        "mismatched ones (precision / recall, mean over seeds; on clean pairs, how many).",
        "",
        "| share | seeds | rule - full, early-stopped: mean + 2 SE | oracle - full (margin) | rule - full: mean - 2 SE "
        "| rule - oracle | suspects over the run |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for noise in shares:
        seeds = sorted({s for (n, m, s) in runs if n == noise and m == "rule" and (n, "full", s) in runs})
        if not seeds:
            continue
        gap = [runs[(noise, "rule", s)]["es"] - runs[(noise, "full", s)]["es"] for s in seeds]
        have = [s for s in seeds if (noise, "oracle", s) in runs]
        t = rule_targets(gap, [runs[(noise, "oracle", s)]["es"] - runs[(noise, "full", s)]["es"] for s in have],
                         [runs[(noise, "rule", s)]["es"] - runs[(noise, "oracle", s)]["es"] for s in have])  # fmt: skip
        upper = "one seed" if t["upper"] is None else f"{t['upper']:+.1f} ({'met' if t['upper_met'] else 'not met'})"
        om = t["margin"]
        if t["applies"]:
            lower = (
                "one seed" if t["lower"] is None else f"{t['lower']:+.1f} ({'met' if t['lower_met'] else 'not met'})"
            )
            oracle_cell = f"{t['to_oracle']:+.1f} ({'met' if t['to_oracle_met'] else 'not met'})"
        else:
            lower = oracle_cell = "-" if om is not None else "no oracle run"
        whole = [runs[(noise, "rule", s)].get("run_suspects") for s in seeds]
        if all(whole) and noise:
            sus = precision_recall(whole)
        elif all(whole):
            sus = f"{', '.join(str(w['suspected']) for w in whole)} suspected"
        else:
            sus = "not recorded"
        margin_cell = "-" if om is None else f"{om:+.1f}"
        L.append(f"| {pct(noise)}% | {len(seeds)} | {upper} | {margin_cell} | {lower} | {oracle_cell} | {sus} |")
    return L + [""]


def write_report(ctx: Ctx, doc: Path | None = None) -> str:
    text = report(ctx)
    (doc or ctx.doc).write_text(text)
    return text


# ------------------------------------------------------------------------------------ the low shares
def low_rows(runs: dict, noise: float) -> list[dict]:
    """Per seed with both runs at a low share: the rule's plans (active, last suspected, precision, recall) and
    its last epoch's R@1 against full data's last epoch and early-stopped."""
    out = []
    for s in sorted({s for (n, m, s) in runs if n == noise and m == "rule"}):
        rule, full = runs[(noise, "rule", s)], runs.get((noise, "full", s))
        if full is None:
            continue
        active = [p["epoch"] for p in rule["plans"] if p["suspected"]]
        last = rule["plans"][-1] if rule["plans"] else None
        most = max(rule["plans"], key=lambda p: p["suspected"], default=None)  # the first of the largest
        out.append({"seed": s, "rule": rule, "full": full, "active": active, "plans": len(rule["plans"]), "last": last,
                    "most": most if most and most["suspected"] else None,
                    "vs_final": rule["final"] - full["final"], "vs_es": rule["final"] - full["es"]})  # fmt: skip
    return out


def _share(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.3f}"


def low_section(runs: dict, low: list[float]) -> list[str]:
    """The section on the low mismatched shares: does the rule fire, whom does it leave out, what it costs."""
    if not low:
        return []
    L = [
        "## Low mismatched shares: does the rule find them?",
        "",
        "The rule alone (`full`, `noise=True`) against full data at "
        + ", ".join(f"{pct(n)}%" for n in low)
        + " mismatched, the same schedule, validation split and seeds as above. Per run: the epochs whose plan "
        "left pairs out as suspected (the rule active), the plan that left out the most (and the share of them "
        "mismatched), the last plan's suspected pairs, the share of them that "
        "is mismatched (precision) and the share of the mismatched pairs among them (recall), and the last "
        "epoch's test R@1 against full data's (last epoch and early-stopped, R@1 points).",
        "",
        "| mismatched | seed | plans with the rule active | most suspected in one plan (epoch): precision | "
        "suspected, last plan (mismatched in the data) | precision | recall | "
        "rule, last epoch | full data, last epoch | full data, early-stopped | rule minus early-stopped |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for noise in low:
        for r in low_rows(runs, noise):
            last = r["last"] or {}
            epochs = ", ".join(map(str, r["active"])) if r["active"] else "none"
            m = r["most"]
            most = "none" if m is None else f"{m['suspected']:,} ({m['epoch']}): {_share(m['precision'])}"
            L.append(f"| {pct(noise)}% | {r['seed']} | {len(r['active'])} of {r['plans']} (epochs {epochs}) | {most} | "
                     f"{last.get('suspected', 0):,} ({last.get('mismatched', 0):,}) | "
                     f"{_share(last.get('precision'))} | {_share(last.get('recall'))} | {r['rule']['final']:.1f} | "
                     f"{r['full']['final']:.1f} | {r['full']['es']:.1f} ({r['full']['es_epoch']}) | "
                     f"{r['vs_es']:+.1f} |")  # fmt: skip
    L += ["", "Paired gaps over seeds (rule alone minus full data, R@1 points):", ""]
    L += ["| mismatched | seeds | against full data's last epoch: mean, verdict | "
          "against full data early-stopped: mean, verdict |", "| --- | --- | --- | --- |"]  # fmt: skip
    for noise in low:
        rows = low_rows(runs, noise)
        if not rows:
            L.append(f"| {pct(noise)}% | 0 | no pair of finished runs yet | |")
            continue
        cells = []
        for key in ("vs_final", "vs_es"):
            mean, se2, v = gap_verdict([r[key] for r in rows])
            cells.append(f"{mean:+.1f}{'' if se2 is None else f' (2 SE {se2:.1f})'}, {v}")
        L.append(f"| {pct(noise)}% | {len(rows)} | {cells[0]} | {cells[1]} |")
    return L + [""]


def low_summary(runs: dict, low: list[float]) -> list[str]:
    """One list item for the low shares: in how many plans the rule fired, and the gap to early-stopped full data."""
    parts = []
    for noise in low:
        rows = low_rows(runs, noise)
        if not rows:
            continue
        active = sum(len(r["active"]) for r in rows)
        plans = sum(r["plans"] for r in rows)
        mean, se2, _ = gap_verdict([r["vs_es"] for r in rows])
        se = "" if se2 is None else f", 2 SE {se2:.1f}"
        seeds = f"{len(rows)} seed{'s' if len(rows) != 1 else ''}"
        parts.append(f"{pct(noise)}% ({seeds}): active in {active} of {plans} plans, {mean:+.1f}{se} against "
                     "early-stopped full data")  # fmt: skip
    if not parts:
        return []
    return ["* The rule alone at low mismatched shares (its own section below): " + "; ".join(parts) + "."]


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
