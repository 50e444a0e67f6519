"""The noise rule beside the baselines a reviewer names, on labelled data (issue 33; SST-2).

Every run trains ``studies.quality``'s fastText-like model on SST-2 through the real pipeline
(``quality.train.train_run``; its data splits, noisy labels and loop), the test accuracy and the
held-out validation accuracy (whose labels carry the same noise, as a practitioner's would)
after every epoch. Studies (:func:`registry`):

* **A**, 40% symmetric noisy labels, ``E`` epochs: full data (read early-stopped at its best
  validation epoch, and at its last epoch), the rule alone (``full`` + ``noise=True``), the rule +
  dynamic random (r = 0.19, the pairs setting, not re-tuned), dynamic random at the rule's
  measured pruned %, full data at equal compute (exactly the rule run's samples trained), the
  oracle filter (full data without the known noisy samples), and cleanlab as its documentation
  recommends (out-of-sample predicted probabilities by ``K``-fold cross-validation with the same
  model and schedule, the folds stratified by the noisy label and shuffled as cleanlab makes them,
  :func:`fold_keys`; ``cleanlab.filter.find_label_issues(labels, pred_probs)`` at its defaults,
  then full data on what it keeps).
* **B**, low noise rates (3% and 10% wrong labels, the same key-hash corruption at a lower rate;
  and 5% and 20% for the rule alone): full data, the rule alone and the oracle.

Runs go through the studies' one runner (``studies/quality/harness.py``: claims, resume by
result file, whole-file writes with the machine, ``.crashed`` files): :func:`plan` and :func:`run`.
Each finished run is one JSON file in ``docs/quality-runs/baselines-labels/`` (the machine
recorded, per-epoch curves); a rerun skips finished runs, and a killed run resumes from its last
finished epoch (``train_run``'s checkpoint). One run at a time, one torch thread. ``--only``
selects runs by id, with the runs whose figures they take (the rule run of their seed, the folds).

    python -m studies baselines_labels run            # the whole plan, resumable
    python -m studies baselines_labels report         # docs/baselines-labels.md from the result files
    python -m studies baselines_labels report --check # exit 1 if the committed report differs
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from studies.quality import harness, instability
from studies.quality.configs import NOISE_RULE
from studies.quality.data import Sst2, noise_offsets, shard_labels, symmetric_offsets
from studies.quality.harness import Job
from studies.quality.layout import Layout
from studies.quality.machine import machine_of
from studies.quality.pipeline import eval_batches, evaluate
from tools.draws import stratified_folds
from tools.results import (
    PROVENANCE,
    gap_verdict,
    mean_cell,
    path_label,
    precision_recall,
    provenance_lines,
    read_provenance,
    rule_targets,
)

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "docs" / "quality-runs" / "baselines-labels"
OUT = ROOT / "bench-out" / "baselines-labels"
DOC = ROOT / "docs" / "baselines-labels.md"

E = 11  # the schedule (epochs), chosen on full data's training signal (:func:`schedule_choice`)
K = 4  # cross-validation folds of cleanlab
SEEDS = 2
RULE_RANDOM = {"r": 0.19, "noise": True}  # the pairs study's rule + random setting, fixed
#: study A's rates: every method (issue 50 asks 20% and 40% symmetric noisy labels)
RATES_A = (0.2, 0.4)
LOW_RATES = (0.03, 0.10)
EXTRA_RATES = (0.05,)  # the rule alone, to find the rate from which it acts
SUSPECT_REASONS = ("suspected_noise", "noise_recheck")
PRIOR_RATE = {"sst2": 0.2e-3, "cal": 60.0}  # seconds per trained sample (the runner's deadline estimate)


@dataclass(frozen=True)
class Run:
    rate: float
    method: str  # full, rule, rule-random, random-eq, equal, oracle, fold<k>, cleanlab
    seed: int

    def rid(self, epochs: int) -> str:
        return f"sst2-n{round(100 * self.rate)}-E{epochs}-{self.method}-s{self.seed}"


METHODS_A = (
    ("full", "rule", "rule-random", "random-eq", "equal", "oracle")
    + tuple(f"fold{k}" for k in range(K))
    + ("cleanlab",)
)


def registry(seeds: int = SEEDS, folds: int = K) -> list[Run]:
    """Every run of the study in run order, seed by seed: study A's single trainings at each of
    :data:`RATES_A`, study B, (after seed 0) the extra rates for the rule alone, then cleanlab's
    folds and retraining (the costliest method last in each seed); then a third seed of study A's
    single trainings, on which the verdicts of the rule and its baselines depend."""
    cleanlab = tuple(f"fold{k}" for k in range(folds)) + ("cleanlab",)
    out: list[Run] = []
    for seed in range(seeds):
        out += [Run(rate, m, seed) for rate in RATES_A for m in METHODS_A[:6]]
        out += [Run(rate, m, seed) for rate in LOW_RATES for m in ("full", "rule", "oracle")]
        if seed == 0:
            out += [Run(rate, "rule", 0) for rate in EXTRA_RATES]
        out += [Run(rate, m, seed) for rate in RATES_A for m in cleanlab]
    if seeds == SEEDS:
        out += [Run(rate, m, SEEDS) for rate in RATES_A for m in METHODS_A[:6]]
    return out


def fold_keys(keys: list[str], labels: list[int], folds: int, seed: int) -> list[frozenset[str]]:
    """cleanlab's ``folds`` cross-validation folds of ``keys`` (``labels``: their noisy labels, in
    the same order): disjoint, covering the keys, stratified by label and shuffled as cleanlab's
    documentation makes them (``draws.stratified_folds``: ``StratifiedKFold(shuffle=True)`` with a
    random state of the seed, over the keys in sorted order)."""
    fold = stratified_folds(keys, labels, folds, seed)
    return [frozenset(k for k, f in zip(keys, fold.tolist()) if f == part) for part in range(folds)]


# ------------------------------------------------------------------------------------ one run
class Probe:
    """``train_run``'s probe: trains every batch; after every epoch the validation accuracy (on
    the noisy validation labels) and, for a cross-validation fold, the held-out part's predicted
    probabilities (kept: the last epoch's are the fold's out-of-sample predictions)."""

    def __init__(self, ds: Any, val_noise: dict[str, int], held_out: frozenset[str] | None,
                 train_noise: dict[str, int], progress: list[str] | None = None) -> None:  # fmt: skip
        self.val = list(eval_batches(ds, ds.val, noise=val_noise))
        self.held = list(eval_batches(ds, ds.train, noise=train_noise, keys=held_out)) if held_out else None
        self.probs: tuple[list[str], np.ndarray, np.ndarray] | None = None
        self.progress = [] if progress is None else progress  # a line per epoch (the runner's epochs done)

    def train_batch(self, *args: Any) -> bool:
        return True

    def after_epoch(self, model: Any, opts: Any, test_set: Any, device: str) -> dict:
        import torch

        if self.held is not None:
            model.eval()
            with torch.no_grad():
                p = [torch.softmax(model(x), 1).numpy() for x, _, _ in self.held]
            model.train()
            self.probs = ([k for _, _, ks in self.held for k in ks],
                          np.asarray([int(v) for _, ys, _ in self.held for v in ys]), np.concatenate(p))  # fmt: skip
        val = evaluate(model, self.val, device)
        self.progress.append(f"epoch {len(self.progress)}: validation accuracy {val:.4f}")
        return {"val_acc": val}


@dataclass
class Ctx(harness.Ctx):
    """The runner's context at the study's defaults: where it reads and writes, its data set and
    population, and its size (the smoke test uses a tiny one)."""

    results: Path = RESULTS
    out: Path = OUT
    epochs: int = E
    seeds: int = SEEDS
    ds: Any = None
    population: Any = None
    folds: int = K
    keep_runs: bool = False

    def path(self, run: Run) -> Path:
        return self.results / f"{run.rid(self.epochs)}.json"

    def load(self, run: Run) -> dict | None:
        p = self.path(run)
        return json.loads(p.read_text()) if p.exists() else None

    def probs_path(self, run: Run) -> Path:
        return self.out / "probs" / f"{run.rid(self.epochs)}.npz"


def noisy_keys(ctx: Ctx, rate: float) -> dict[str, int]:
    return noise_offsets(ctx.population, ctx.ds.classes, rate)


_LABELS: dict[tuple[str, ...], dict[str, int]] = {}  # the training shards' labels, read once per process


def run_folds(ctx: Ctx, run: Run) -> list[frozenset[str]]:
    """The cross-validation folds of ``run``'s seed: :func:`fold_keys` of the training population,
    stratified by its labels as trained (the noise of ``run.rate`` applied)."""
    key = tuple(ctx.ds.train)
    if key not in _LABELS:
        _LABELS[key] = shard_labels(ctx.ds.train)
    clean, noise, classes = _LABELS[key], noisy_keys(ctx, run.rate), ctx.ds.classes
    keys = ctx.population.column("key").to_pylist()
    return fold_keys(keys, [(clean[k] + noise.get(k, 0)) % classes for k in keys], ctx.folds, run.seed)


SAME_AS_FULL = "same as full data"  # dynamic random at 0% pruned, equal compute of a rule that pruned nothing


def cfg_of(ctx: Ctx, run: Run) -> tuple[dict, frozenset[str] | None] | str | None:
    """``train_run``'s configuration and excluded keys of ``run``; None while a run it depends on
    (the rule run of its seed; cleanlab's folds) has no result yet; :data:`SAME_AS_FULL` for
    dynamic random at the rule's pruned % and full data at the rule's compute where the rule
    pruned nothing: both are then full data's run itself (the same plans, order and steps), not
    trained again."""
    cfg = {"policy": "full", "params": {}, "label": run.method, "noisy": True, "noise_rate": run.rate,
           "n_epochs": ctx.epochs, "curve": True}  # fmt: skip
    exclude = None
    m = run.method
    if m == "rule":
        cfg["params"] = dict(NOISE_RULE)
    elif m == "rule-random":
        cfg.update(policy="random", params=dict(RULE_RANDOM))
    elif m in ("random-eq", "equal"):
        rule = ctx.load(Run(run.rate, "rule", run.seed))
        if rule is None:
            return None
        if rule["samples_trained"] == ctx.epochs * len(ctx.population):
            return SAME_AS_FULL
        if m == "random-eq":
            cfg.update(policy="random", params={"r": round(rule["pruned"], 4)})
        else:
            n = len(ctx.population)
            cfg.update(budget=rule["samples_trained"], n_epochs=math.ceil(rule["samples_trained"] / n))
    elif m == "oracle":
        exclude = frozenset(noisy_keys(ctx, run.rate))
    elif m.startswith("fold"):
        exclude = run_folds(ctx, run)[int(m[4:])]
    elif m == "cleanlab":
        found = cleanlab_issues(ctx, run)
        if found is None:
            return None
        exclude = frozenset(found["flagged_keys"])
    return cfg, exclude


def cleanlab_issues(ctx: Ctx, run: Run) -> dict | None:
    """cleanlab's label issues from the folds' out-of-sample probabilities (None while a fold is
    missing): ``find_label_issues(labels, pred_probs)`` at its defaults."""
    from cleanlab.filter import find_label_issues  # the study's optional dependency (extra "study")

    parts = []
    for k in range(ctx.folds):
        p = ctx.probs_path(Run(run.rate, f"fold{k}", run.seed))
        if not p.exists() or ctx.load(Run(run.rate, f"fold{k}", run.seed)) is None:
            return None
        parts.append(np.load(p, allow_pickle=False))
    keys = np.concatenate([p["keys"] for p in parts])
    labels = np.concatenate([p["labels"] for p in parts])
    probs = np.concatenate([p["probs"] for p in parts])
    issues = find_label_issues(labels, probs)
    return {"flagged_keys": sorted(keys[issues].tolist()), "n": len(keys)}


def detection(flagged: set[str], truth: set[str]) -> dict:
    hit = len(flagged & truth)
    return {"flagged": len(flagged), "true_positives": hit, "precision": hit / len(flagged) if flagged else None,
            "recall": hit / len(truth) if truth else None}  # fmt: skip


def history_signal(run_dir: Path, epochs: int, noisy: set[str]) -> list[dict]:
    """Per epoch e, over the per-sample mean of the losses recorded in epochs 0..e (the loss
    parts of the run directory): the AUC of that mean for noisy vs clean samples, and the
    two-mode test of the noise rule fitted to it (samples with 2 records or more, as the rule's
    warm-up): Ashman's D and the upper component's weight."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from sklearn.metrics import roc_auc_score

    from studies.seam import fit_two_gaussians, points1d

    total: dict[str, float] = {}
    count: dict[str, int] = {}
    out = []
    for e in range(epochs):
        files = sorted((run_dir / "losses").glob(f"rank=*/epoch={e}/*.parquet"))
        t = pa.concat_tables([pq.read_table(f, columns=["key", "loss"]) for f in files])
        for k, x in zip(t.column("key").to_pylist(), t.column("loss").to_numpy(zero_copy_only=False)):
            if np.isfinite(x):
                total[k] = total.get(k, 0.0) + float(x)
                count[k] = count.get(k, 0) + 1
        keys = sorted(total)
        mean = np.asarray([total[k] / count[k] for k in keys])
        y = np.asarray([k in noisy for k in keys])
        row: dict[str, Any] = {"epoch": e, "auc": float(roc_auc_score(y, mean)) if 0 < y.sum() < len(y) else None}
        cand = np.asarray([count[k] >= 2 for k in keys])
        mix = fit_two_gaussians(points1d(mean[cand].astype(np.float32))) if cand.sum() > 1 else None
        row.update(D=None if mix is None else mix.separation, upper_weight=None if mix is None else mix.weight[1])
        out.append(row)
    return out


def plan(ctx: Ctx) -> list[Job]:
    """:func:`registry` as the runner's jobs: dynamic random at the rule's pruned % and equal compute need
    the rule run of their seed (and are none where it pruned nothing: :data:`SAME_AS_FULL`), cleanlab its
    folds."""
    jobs = []
    for r in registry(ctx.seeds, ctx.folds):
        needs: tuple[str, ...] = ()
        if r.method in ("random-eq", "equal"):
            if cfg_of(ctx, r) == SAME_AS_FULL:
                continue
            needs = (Run(r.rate, "rule", r.seed).rid(ctx.epochs),)
        elif r.method == "cleanlab":
            needs = tuple(Run(r.rate, f"fold{k}", r.seed).rid(ctx.epochs) for k in range(ctx.folds))
        spec = {"rate": r.rate, "method": r.method, "seed": r.seed}
        jobs.append(Job(r.rid(ctx.epochs), "sst2", spec, needs, ctx.epochs * len(ctx.population)))
    return jobs


def run(ctx: Ctx, job: Job, progress: list[str]) -> dict:
    """Train one job of :func:`plan`; its result (the runner writes it, with the machine)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    import seta_stream as seta
    from studies.quality.train import resume_path, train_run

    this = Run(job.spec["rate"], job.spec["method"], job.spec["seed"])
    spec = cfg_of(ctx, this)
    if not isinstance(spec, tuple):  # the runner's needs are done: cleanlab lacks a fold's probabilities
        folds = [Run(this.rate, f"fold{k}", this.seed) for k in range(ctx.folds)]
        lost = [f"{f.rid(ctx.epochs)}.json" for f in folds if not ctx.probs_path(f).exists()]
        raise RuntimeError(f"{job.rid}: the out-of-sample probabilities of {', '.join(lost)} are missing from "
                           f"{ctx.out / 'probs'}; delete those result files to train the folds again")  # fmt: skip
    cfg, exclude = spec
    rid = job.rid
    train_noise = noisy_keys(ctx, this.rate)
    val_keys = seta.list_samples(ctx.ds.val).column("key").to_pylist()
    val_noise = symmetric_offsets(val_keys, ctx.ds.classes, this.rate)
    held = exclude if this.method.startswith("fold") else None
    probe = Probe(ctx.ds, val_noise, held, train_noise, progress)
    runs = ctx.runs
    result = train_run(ctx.ds, cfg, this.seed, runs, ctx.population, rid, probe=probe, exclude=exclude)
    truth = set(train_noise)
    out: dict[str, Any] = {"study": "baselines-labels", "id": rid, "method": this.method, "rate": this.rate,
                           "schedule": ctx.epochs, **result}  # fmt: skip
    out["samples_trained"] = sum(e["backprop"] for e in result["epochs"])
    out["excluded"] = len(exclude or ())
    out["excluded_noisy"] = len((exclude or frozenset()) & truth)
    out["noisy_in_train"] = len(truth)
    out["val_noisy"] = len(val_noise)
    run_dir = runs / rid
    if this.method in ("full",):
        out["signal"] = history_signal(run_dir, len(result["epochs"]), truth)
    if cfg["params"].get("noise"):
        from seta_stream.inspect import suspect_report

        names = ctx.population.filter(pa.compute.is_in(ctx.population.column("key"), pa.array(sorted(truth))))
        tpath = ctx.out / f"truth-n{round(100 * this.rate)}.parquet"
        pq.write_table(names.select(["shard", "key"]), tpath)
        rep = suspect_report(str(run_dir), truth=str(tpath))
        out["suspects"] = {k: rep[k] for k in ("plans", "active_epochs", "suspected", "left_out", "true_positives",
                                               "precision", "recall", "truth_in_plans")}  # fmt: skip
    if this.method.startswith("fold"):
        assert probe.probs is not None
        keys, labels, probs = probe.probs
        ctx.probs_path(this).parent.mkdir(parents=True, exist_ok=True)
        np.savez(ctx.probs_path(this), keys=np.asarray(keys), labels=labels, probs=probs)
        out["held_out"] = len(keys)
    if this.method == "cleanlab":
        found = cleanlab_issues(ctx, this)
        assert found is not None
        folds = [ctx.load(Run(this.rate, f"fold{k}", this.seed)) for k in range(ctx.folds)]
        out["cleanlab"] = {"version": _version("cleanlab"), "folds": ctx.folds, "call": "find_label_issues(labels, "
                           "pred_probs) at its defaults", **detection(set(found["flagged_keys"]), truth),
                           "folds_samples_trained": [f["samples_trained"] for f in folds if f]}  # fmt: skip
    out.pop("software")  # the runner adds the machine (the same software, cores, torch threads)
    resume_path(runs, rid).unlink(missing_ok=True)
    if not ctx.keep_runs:
        shutil.rmtree(run_dir, ignore_errors=True)
    print(f"   -> test {100 * out['test_acc']:.2f}% pruned {100 * out['pruned']:.1f}%", flush=True)
    return out


def _version(pkg: str) -> str:
    from importlib.metadata import version

    return version(pkg)


def context(seeds: int = SEEDS, results: Path = RESULTS) -> Ctx:
    import seta_stream as seta

    layout = Layout()
    ds = Sst2(layout.data, OUT)
    ds.prepare()
    results.mkdir(parents=True, exist_ok=True)
    return Ctx(results=results, ds=ds, population=seta.list_samples(ds.train), seeds=seeds)


# ------------------------------------------------------------------------------------ report
LABELS = {
    "full-es": "full data, early-stopped (best validation epoch)",
    "full": "full data, last epoch",
    "rule": "the rule alone (full, noise=True)",
    "rule-random": "the rule + dynamic random (r=0.19, noise=True)",
    "random-eq": "dynamic random at the rule's pruned %",
    "equal": "full data at the rule's compute",
    "oracle": "the oracle filter (full data without the noisy samples)",
    "cleanlab": "cleanlab (K-fold, find_label_issues, retrain)",
}
RULES = ("rule", "rule-random")
BASELINES = ("full-es", "full", "random-eq", "equal", "cleanlab")


def load_all(folder: Path) -> dict[str, Any]:
    """The study's result files: ``runs`` (rate, method, seed) -> result, the schedule pilot, and the
    runner's crashed and cut-short runs without a result (``unfinished``)."""
    runs, pilot = {}, None
    for p in sorted(folder.glob("*.json")):
        if p.name.endswith((".crashed.json", ".cut.json")) or p.name == PROVENANCE:
            continue
        d = json.loads(p.read_text())
        d["_file"] = p.name
        if p.name.startswith("schedule-"):
            pilot = d
        else:
            runs[(d["rate"], d["method"], d["seed"])] = d
    return {"runs": runs, "pilot": pilot, "unfinished": harness.unfinished(folder), "folder": folder}


def schedule_choice(signal: list[dict]) -> int:
    """The schedule (epochs) read off full data's training signal: the fewest epochs after which
    the two-mode test's D of the history means is within 1% of its maximum over the pilot's run
    (the separation a longer schedule no longer improves)."""
    ds = [r["D"] for r in signal if r["D"] is not None]
    return next(r["epoch"] for r in signal if r["D"] is not None and r["D"] >= 0.99 * max(ds)) + 1


def es_acc(r: dict) -> tuple[float, int]:
    """Test accuracy at the epoch of best validation accuracy (the first such epoch), and that epoch."""
    vals = [e["probe"]["val_acc"] for e in r["epochs"]]
    best = int(np.argmax(vals))
    return r["epochs"][best]["test_acc"], best


def acc(runs: dict, rate: float, method: str, seed: int) -> float | None:
    """A method's test accuracy (%) in one seed; full data early-stopped is ``full-es``; dynamic
    random at 0% and equal compute of a rule that pruned nothing are full data's run."""
    if method == "full-es":
        r = runs.get((rate, "full", seed))
        return None if r is None else 100 * es_acc(r)[0]
    r = runs.get((rate, method, seed))
    if r is None and method in ("random-eq", "equal") and same_as_full(runs, rate, seed):
        r = runs.get((rate, "full", seed))
    return None if r is None else 100 * r["test_acc"]


def same_as_full(runs: dict, rate: float, seed: int) -> bool:
    rule = runs.get((rate, "rule", seed))
    return rule is not None and rule["pruned"] == 0


def seeds_of(runs: dict, rate: float) -> list[int]:
    return sorted({s for (r, _, s) in runs if r == rate})


def paired(runs: dict, rate: float, a: str, b: str) -> list[tuple[int, float]]:
    """(seed, accuracy of a - accuracy of b) for every seed with both (points)."""
    out = []
    for s in seeds_of(runs, rate):
        x, y = acc(runs, rate, a, s), acc(runs, rate, b, s)
        if x is not None and y is not None:
            out.append((s, x - y))
    return out


def se2_verdict(gaps: list[float]) -> tuple[str, str]:
    """(2 SE as the tables print it, verdict) of paired gaps against 0: :func:`tools.results.gap_verdict`."""
    _, se2, v = gap_verdict(gaps)
    return ("-" if se2 is None else f"{se2:.2f}"), v


def compute(runs: dict, rate: float, method: str, seed: int, n: int) -> tuple[float, int] | None:
    """(samples trained / (E N), trainings) of a method in one seed (cleanlab: its folds and its
    final training)."""
    if method == "full-es":
        method = "full"
    r = runs.get((rate, method, seed))
    if r is None and method in ("random-eq", "equal") and same_as_full(runs, rate, seed):
        r = runs.get((rate, "full", seed))
    if r is None:
        return None
    if method == "cleanlab":
        folds = r["cleanlab"]["folds_samples_trained"]
        return (sum(folds) + r["samples_trained"]) / (r["schedule"] * n), len(folds) + 1
    return r["samples_trained"] / (r["schedule"] * n), 1


def _largest_d(plans: list[dict]) -> str:
    """'1.66 (0.41), e10': the plan with the largest Ashman's D, its upper weight and epoch."""
    fitted = [p for p in plans if p["noise_separation"] is not None]
    if not fitted:
        return "-"
    p = max(fitted, key=lambda p: p["noise_separation"])
    return f"{p['noise_separation']:.2f} ({p['noise_upper_weight']:.2f}), e{p['epoch']}"


def _entropy(rate: float) -> float:
    """The cross-entropy (nats) of labels flipped with probability ``rate`` (two classes) for a
    model that predicts the true class with probability 1 - rate: the noise's floor."""
    return -((1 - rate) * math.log(1 - rate) + rate * math.log(rate))


def _f(x: float | None, d: int = 2) -> str:
    return "-" if x is None else f"{x:.{d}f}"


def _marked(runs: dict, rate: float, method: str) -> list[tuple[str, dict]]:
    """(file, run) of the unstable runs of ``method`` at ``rate`` (the instability scan)."""
    base = "full" if method == "full-es" else method
    return [(r["_file"], r) for (ra, m, _), r in sorted(runs.items()) if ra == rate and m == base
            and instability.unstable(r, r["_file"])]  # fmt: skip


def render(data: dict[str, Any], doc: Path = DOC) -> str:
    runs, pilot = data["runs"], data["pilot"]
    n = next((r["epochs"][0]["n"] for r in runs.values() if r["method"] == "full"), 65000)
    folder = Path(data.get("folder", RESULTS)).resolve()
    rel = Path(os.path.relpath(folder, doc.resolve().parent)).as_posix() + "/"
    command = "python -m studies baselines_labels report" + (
        "" if folder == RESULTS and doc.resolve() == DOC else f" --results {path_label(folder)} --doc {path_label(doc)}"
    )
    L = [
        "# The noise rule beside the baselines, on labelled data (SST-2)",
        "",
        f"Generated by `{command}` from the result files in",
        f"[`{rel}`]({rel}); every number below comes from them.",
        "Issue 33's baselines for the noise rule (docs/algorithms.md §12) on noisy labels: the quality study's",
        "fastText-like model on SST-2 (65,000 training sentences, the held-out shard of 2,349 as validation split,",
        "GLUE's 872 dev sentences as test split; [quality.md](quality.md)), one torch thread, one run at a time,",
        "the small-final-batch remedy (loss over the nominal batch size). The validation labels carry the same",
        "noise as the training labels (the same key-hash corruption at the same rate), as a practitioner's would.",
        "Gaps are paired by seed, in points of test accuracy; 2 SE = 2 sd / sqrt(seeds) of the paired gaps;",
        'the verdict is "met" only where mean - 2 SE > 0, "below" where mean + 2 SE < 0, "mean above (below),',
        'not resolved" where 0 lies within mean ± 2 SE, "at the bar" where every gap is 0 (the same accuracy),',
        '"one seed: ..." where one seed has both runs. Compute is the samples trained (forward and backward',
        "passes, the rule's weight-0 re-checks included) over E x N.",
        "",
        *(provenance_lines(data["folder"]) if "folder" in data else []),
    ]
    every = list(runs.values()) + ([pilot] if pilot else [])
    machines = sorted({machine_of({"software": r["machine"]}) for r in every})
    L += [f"Machine of every run: {'; '.join(machines) or '-'}.", ""]
    # ----------------------------------------------------------------- the schedule
    if pilot is not None:
        sig = pilot["signal"]
        best_auc = max(sig[1:], key=lambda r: r["auc"])
        ds = [r for r in sig if r["D"] is not None]
        best_d = max(ds, key=lambda r: r["D"])
        shaky = instability.unstable(pilot, pilot["_file"])  # the instability scan: marked and named below
        L += [
            "## The schedule: do the noisy samples' losses separate?",
            "",
            f"Full data on 40% noisy labels for {pilot['schedule']} epochs (seed 0; `{pilot['_file']}`): after each "
            "epoch, over every sample's mean of its recorded losses so far (what the rule scores), the AUC of that "
            "mean for noisy against clean samples, and the rule's two-mode test fitted to it (Ashman's D, the upper "
            "component's weight; samples with 2 records or more). Training signal only; the test accuracy is shown, "
            "not used.",
            "",
            "| epoch | " + " | ".join(str(r["epoch"]) for r in sig) + " |",
            "| --- | " + " | ".join("---" for _ in sig) + " |",
            "| AUC of the mean loss | " + " | ".join(_f(r["auc"], 3) for r in sig) + " |",
            "| Ashman's D | " + " | ".join(_f(r["D"]) for r in sig) + " |",
            "| upper weight | " + " | ".join(_f(r["upper_weight"]) for r in sig) + " |",
            f"| test acc %{f' {instability.MARK}' if shaky else ''} | "
            + " | ".join(_f(100 * e["test_acc"], 1) for e in pilot["epochs"])
            + " |",
            "",
            *([instability.footnote([(pilot["_file"], pilot)]), ""] if shaky else []),
            (
                f"The losses do not separate on any schedule up to {pilot['schedule']} epochs: "
                if best_d["D"] < 2
                else f"The rule's test passes on full data's history from epoch "
                f"{next(r['epoch'] for r in ds if r['D'] >= 2)}: "
            )
            + f"the AUC peaks at {best_auc['auc']:.3f} after epoch {best_auc['epoch']} and then falls as the model "
            f"fits the wrong labels (training loss {pilot['epochs'][-1]['train_loss']:.3f} at the end, below the "
            f"{_entropy(0.4):.3f} nats 40% flipped labels cost a model that predicts the true class with the noise's "
            f"odds); D peaks at {best_d['D']:.2f} (epoch {best_d['epoch']}; the test needs 2), with the upper "
            f"component at {best_d['upper_weight']:.2f} of the samples. The study's schedule: E = "
            f"{schedule_choice(sig)} epochs, the fewest after which D is within 1% of its maximum (the separation "
            "no longer grows with the schedule).",
            "",
        ]
    L += _summary(runs, n)
    # ----------------------------------------------------------------- study A
    if not read_provenance(Path(data.get("folder", RESULTS))).get("superseded_by"):  # a superseded study's runs
        L += _targets(runs)  # measure other noise: the targets are not read off them
    L += _study_a(runs, n)
    L += _study_b(runs)
    L += _missing(runs)
    if data.get("unfinished"):
        L += ["Crashed or cut short (run again by the next invocation): " + "; ".join(data["unfinished"]) + ".", ""]
    return "\n".join(L).rstrip("\n") + "\n"


def _missing(runs: dict) -> list[str]:
    """The registry's runs without a result file (dynamic random and equal compute of a rule that
    pruned nothing are full data's run: not missing)."""
    left = [r for r in registry() if (r.rate, r.method, r.seed) not in runs
            and not (r.method in ("random-eq", "equal") and same_as_full(runs, r.rate, r.seed))]  # fmt: skip
    if not left:
        return []
    return ["## Not run", "", f"{len(left)} runs of the plan have no result file (not trained when this report was "
            "generated; `python -m studies baselines_labels run` trains them, skipping the finished ones): "
            + ", ".join(f"`{r.rid(E)}`" for r in left) + ".", ""]  # fmt: skip


def _mean_gap(runs: dict, rate: float, a: str, b: str) -> str:
    g = [x for _, x in paired(runs, rate, a, b)]
    if not g:
        return "-"
    se2, v = se2_verdict(g)
    return f"{np.mean(g):+.2f} points ({len(g)} seed{'s' if len(g) > 1 else ''}" + (
        f", 2 SE {se2}: {v})" if len(g) > 1 else ")"
    )


def _summary(runs: dict, n: int) -> list[str]:
    """The findings in a few lines, every number from the tables below."""
    L = ["## Summary", ""]
    for rate in RATES_A:
        L += _summary_a(runs, rate, n)
    if len(L) == 2:
        return []
    low = sorted({k[0] for k in runs if k[0] not in RATES_A})
    if low:
        reading = _rate_reading(runs, sorted({k[0] for k in runs if k[1] == "rule"}))
        L.append("* **Low rates**: t" + reading.split(";")[0][1:] + " (section B).")
    return L + [""]


def _summary_a(runs: dict, rate: float, n: int) -> list[str]:
    """Study A's findings at one rate."""
    rules = [r for (ra, m, _), r in runs.items() if m in RULES and ra == rate]
    if not rules:
        return []
    plans = sum(len(r["suspects"]["plans"]) for r in rules)
    active = sum(len(r["suspects"]["active_epochs"]) for r in rules)
    nothing = "" if active else ", so it left nothing out"
    L = [f"* **{round(100 * rate)}% noisy labels**: the rule's two-mode test passed in {active} of the {plans} "
         f"plans of its runs (the rule alone and with random){nothing}; the rule alone minus full data at its last "
         f"epoch: {_mean_gap(runs, rate, 'rule', 'full')}; minus full data early-stopped on the noisy validation "
         f"split: {_mean_gap(runs, rate, 'rule', 'full-es')}. The oracle filter minus early-stopped full data: "
         f"{_mean_gap(runs, rate, 'oracle', 'full-es')}."]  # fmt: skip
    cl = [r for (ra, m, _), r in runs.items() if m == "cleanlab" and ra == rate]
    if cl:
        c = [compute(runs, rate, "cleanlab", r["seed"], n) for r in cl]
        L.append(
            f"* **cleanlab** ({cl[0]['cleanlab']['folds']}-fold out-of-sample probabilities, `find_label_issues` at "
            f"its defaults, retrained on the rest): precision {_span([r['cleanlab']['precision'] for r in cl], 3)}, "
            f"recall {_span([r['cleanlab']['recall'] for r in cl], 3)} of the noisy samples, "
            f"{c[0][1]} trainings and {_span([x[0] for x in c])} x the samples of one full training; minus full data "
            f"early-stopped: {_mean_gap(runs, rate, 'cleanlab', 'full-es')}; minus the rule alone: "
            f"{_mean_gap(runs, rate, 'cleanlab', 'rule')}."
        )
    return L


def _method_table(runs: dict, rate: float, methods: tuple[str, ...], n: int) -> list[str]:
    seeds = seeds_of(runs, rate)
    L = ["| method | " + " | ".join(f"seed {s}" for s in seeds) + " | mean | gap to the oracle (mean, 2 SE) | "
         "samples trained / (E N) | trainings |",
         "| --- | " + " | ".join("---" for _ in seeds) + " | --- | --- | --- | --- |"]  # fmt: skip
    marked: list[tuple[str, dict]] = []
    for m in methods:
        xs = [acc(runs, rate, m, s) for s in seeds]
        got = [x for x in xs if x is not None]
        if not got:
            continue
        files = _marked(runs, rate, m)
        marked += files
        name = LABELS[m] + (f" {instability.MARK}" if files else "") + (" (one seed)" if len(got) == 1 else "")
        cells = []
        for s, x in zip(seeds, xs):
            extra = f" (e{es_acc(runs[(rate, 'full', s)])[1]})" if m == "full-es" and x is not None else ""
            if m in ("random-eq", "equal") and x is not None and (rate, m, s) not in runs:
                extra = " (= full data)"
            cells.append(_f(x) + extra)
        gaps = [g for _, g in paired(runs, rate, m, "oracle")] if m != "oracle" else []
        gap = f"{np.mean(gaps):+.2f}, {se2_verdict(gaps)[0]}" if gaps else "-"
        comp = [c for s in seeds if (c := compute(runs, rate, m, s, n)) is not None]
        L.append(f"| {name} | " + " | ".join(cells) + f" | {np.mean(got):.2f} | {gap} | "
                 f"{np.mean([c[0] for c in comp]):.3f} | {comp[0][1]} |")  # fmt: skip
    if marked:
        L += ["", instability.footnote(sorted(marked, key=lambda x: x[0]))]
    return L


def _study_a(runs: dict, n: int) -> list[str]:
    return [line for rate in RATES_A for line in _study_a_rate(runs, rate, n)]


def _study_a_rate(runs: dict, rate: float, n: int) -> list[str]:
    if not any(k[0] == rate for k in runs):
        return []
    E_ = next(r["schedule"] for k, r in runs.items() if k[0] == rate)
    L = [f"## A. {round(100 * rate)}% symmetric noisy labels, {E_} epochs", "", "Test accuracy (%) per seed:", ""]
    L += _method_table(runs, rate, ("full-es", "full", "rule", "rule-random", "random-eq", "equal", "cleanlab",
                                    "oracle"), n)  # fmt: skip
    if any(same_as_full(runs, rate, s) for s in seeds_of(runs, rate)):
        L += ["", "(= full data): the rule pruned nothing in that seed, so dynamic random at its pruned % (0%) and "
              "full data at its compute are full data's run itself (the same plans, order and steps); not trained "
              "again."]  # fmt: skip
    L += ["", "Paired gaps (points of test accuracy; the rule's run minus the baseline's, per seed):", "",
          "| policy | baseline | per seed | mean | 2 SE | verdict |",
          "| --- | --- | --- | --- | --- | --- |"]  # fmt: skip
    for a in RULES:
        for b in BASELINES if a == "rule" else ("full-es", "full", "cleanlab"):
            g = paired(runs, rate, a, b)
            if not g:
                continue
            gaps = [x for _, x in g]
            se2, v = se2_verdict(gaps)
            L.append(f"| {LABELS[a]} | {LABELS[b]} | " + ", ".join(f"{x:+.2f} (s{s})" for s, x in g)
                     + f" | {np.mean(gaps):+.2f} | {se2} | {v} |")  # fmt: skip
    L += ["", "Finding the noisy samples (whole run: every sample any plan held as a suspect, `seta-stream suspects "
          "--truth`; cleanlab: the samples `find_label_issues` flagged):", "",
          "| method | seed | flagged | precision | recall | compute (trainings, samples trained / (E N)) | "
          "plans with two modes | largest D of a plan (its upper weight) |",
          "| --- | --- | --- | --- | --- | --- | --- | --- |"]  # fmt: skip
    for m in ("rule", "rule-random", "cleanlab"):
        for s in seeds_of(runs, rate):
            r = runs.get((rate, m, s))
            if r is None:
                continue
            c = compute(runs, rate, m, s, n)
            if m == "cleanlab":
                d = r["cleanlab"]
                L.append(f"| cleanlab {d['version']}, K={d['folds']} | {s} | {d['flagged']} | {_f(d['precision'], 3)} "
                         f"| {_f(d['recall'], 3)} | {c[1]}, {c[0]:.3f} | - | - |")  # fmt: skip
            else:
                d = r["suspects"]
                L.append(f"| {LABELS[m]} | {s} | {d['suspected']} | {_f(d['precision'], 3)} | {_f(d['recall'], 3)} | "
                         f"{c[1]}, {c[0]:.3f} | {len(d['active_epochs'])} of {len(d['plans'])} | "
                         f"{_largest_d(d['plans'])} |")  # fmt: skip
    return L + [""] + _per_epoch(runs, rate)


def _per_epoch(runs: dict, rate: float) -> list[str]:
    """Per epoch, means over the seeds: the detection AUC of the rule's score (each sample's mean loss so far)
    in full data's runs, where every sample is trained every epoch, with the two-mode test fitted to those
    scores (Ashman's D, the upper component's weight); and the rule alone's plan of the next epoch (its test's
    D, the suspects, their precision and recall among the noisy samples)."""
    full = [r for (ra, m, _), r in sorted(runs.items()) if ra == rate and m == "full" and r.get("signal")]
    rules = [r for (ra, m, _), r in sorted(runs.items()) if ra == rate and m == "rule"]
    if not full and not rules:
        return []
    n = max([len(r["signal"]) for r in full] + [len(r["suspects"]["plans"]) for r in rules])
    L = ["Per epoch, means over the seeds: the detection AUC of the rule's score (each sample's mean loss so far) in "
         f"full data's runs ({len(full)} seed{'s' if len(full) != 1 else ''}; every sample trained every epoch) and "
         "the two-mode test fitted to those scores; the rule alone's plan for that epoch (its test's D, the samples "
         f"it suspected, their precision and recall among the noisy samples; {len(rules)} "
         f"seed{'s' if len(rules) != 1 else ''}):", "",
         "| epoch | AUC, full data | D, full data | upper weight | rule: D | suspected | precision | recall |",
         "| --- | --- | --- | --- | --- | --- | --- | --- |"]  # fmt: skip
    for e in range(n):
        sig = [next((x for x in r["signal"] if x["epoch"] == e), None) for r in full]
        plan = [next((x for x in r["suspects"]["plans"] if x["epoch"] == e), None) for r in rules]
        sig, plan = [x for x in sig if x], [x for x in plan if x]
        L.append(f"| {e} | {mean_cell([x['auc'] for x in sig])} | {mean_cell([x['D'] for x in sig], 2)} | "
                 f"{mean_cell([x['upper_weight'] for x in sig], 2)} | "
                 f"{mean_cell([x['noise_separation'] for x in plan], 2)} | "
                 f"{mean_cell([x['suspected'] for x in plan], 0) if plan else '-'} | "
                 f"{mean_cell([x['precision'] for x in plan])} | "
                 f"{mean_cell([x['recall'] for x in plan])} |")  # fmt: skip
    return L + [""]


def es_of(runs: dict, rate: float, method: str, seed: int) -> float | None:
    """A method's early-stopped test accuracy (%) in one seed: at its epoch of best accuracy on the noisy
    validation split (:func:`es_acc`)."""
    r = runs.get((rate, method, seed))
    return None if r is None else 100 * es_acc(r)[0]


def _targets(runs: dict) -> list[str]:
    """The targets of a rule that never costs accuracy (issue 50), the rule alone at each rate where it and
    full data ran, paired by seed, every run early-stopped on the noisy validation split: rule minus full
    data, mean + 2 SE >= 0; the oracle filter's margin over full data; where that margin is 2 points or more,
    rule minus full data mean - 2 SE > 0 and the rule within 1 point of the oracle (mean); and the rule's
    suspects over the whole run (precision and recall, mean over seeds)."""
    rates = sorted({r for (r, m, _) in runs if m == "rule"})
    L = ["## The targets of a rule that never costs accuracy (the rule alone)", "",
         "Per rate, paired by seed, each run read at its epoch of best accuracy on the noisy validation split "
         "(early-stopped; points of test accuracy): the rule alone minus full data (target: mean + 2 SE >= 0); "
         "the oracle filter's margin over full data; where that margin is 2 points or more, the rule minus full "
         "data must clear 0 by 2 SE and end within 1 point of the oracle (mean); and the samples any of the "
         "rule's plans suspected, against the noisy ones (precision / recall, mean over seeds).", "",
         "| noisy labels | seeds | rule - full: mean + 2 SE | oracle - full (margin) | rule - full: mean - 2 SE "
         "| rule - oracle | suspects over the run |",
         "| --- | --- | --- | --- | --- | --- | --- |"]  # fmt: skip
    shown = 0
    for rate in rates:
        seeds = [s for s in seeds_of(runs, rate) if (rate, "rule", s) in runs and (rate, "full", s) in runs]
        if not seeds:
            continue
        shown += 1
        gap = [es_of(runs, rate, "rule", s) - es_of(runs, rate, "full", s) for s in seeds]
        have = [s for s in seeds if (rate, "oracle", s) in runs]
        t = rule_targets(gap, [es_of(runs, rate, "oracle", s) - es_of(runs, rate, "full", s) for s in have],
                         [es_of(runs, rate, "rule", s) - es_of(runs, rate, "oracle", s) for s in have])  # fmt: skip
        m, om = t["mean"], t["margin"]
        upper = (
            f"{m:+.2f} (one seed)"
            if t["upper"] is None
            else f"{t['upper']:+.2f} ({'met' if t['upper_met'] else 'not met'})"
        )
        if t["applies"]:
            lower = (
                f"{m:+.2f} (one seed)"
                if t["lower"] is None
                else f"{t['lower']:+.2f} ({'met' if t['lower_met'] else 'not met'})"
            )
            oracle_cell = f"{t['to_oracle']:+.2f} ({'met' if t['to_oracle_met'] else 'not met'})"
        else:
            lower = oracle_cell = "-" if om is not None else "no oracle run"
        sus = [runs[(rate, "rule", s)]["suspects"] for s in seeds]
        found = precision_recall(sus) if any(d["suspected"] for d in sus) else "none suspected"
        L.append(f"| {round(100 * rate)}% | {len(seeds)} | {upper} | {'-' if om is None else f'{om:+.2f}'} | {lower} "
                 f"| {oracle_cell} | {found} |")  # fmt: skip
    return L + [""] if shown else []


def _span(xs: list[float], d: int = 2) -> str:
    lo, hi = f"{min(xs):.{d}f}", f"{max(xs):.{d}f}"
    return lo if lo == hi else f"{lo}-{hi}"


def _rate_reading(runs: dict, rates: list[float]) -> str:
    """From which rate on the rule found noise in these runs, with the fits that say why."""
    rules = {(ra, s): r for (ra, m, s), r in runs.items() if m == "rule"}
    active = sorted({ra for (ra, _), r in rules.items() if r["suspects"]["active_epochs"]})
    pct = ", ".join(f"{round(100 * ra)}%" for ra in rates)
    fits, tail, overlap = [], [], []
    for ra in rates:
        plans = [p for (r2, _), r in sorted(rules.items()) if r2 == ra for p in r["suspects"]["plans"]
                 if p["noise_separation"] is not None]  # fmt: skip
        full = [r["signal"][-1]["auc"] for (r2, m, _), r in sorted(runs.items()) if r2 == ra and m == "full"]
        if not plans:
            continue
        d, w = [p["noise_separation"] for p in plans], [p["noise_upper_weight"] for p in plans]
        fits.append(f"{round(100 * ra)}%: D {_span(d)}, upper weight {_span(w)}"
                    + (f", full data's AUC {_span(full, 3)}" if full else ""))  # fmt: skip
        if min(w[-1:]) >= 2 * ra:
            tail.append(f"{round(100 * ra)}% ({w[-1] / ra:.1f} times the noisy share at the last plan)")
        if full and max(full) < 0.75:
            overlap.append(f"{round(100 * ra)}% (AUC {_span(full, 3)})")
    head = (
        f"The rule passed its two-mode test in no plan at any rate measured ({pct})"
        if not active
        else f"The rule passed its two-mode test from {round(100 * active[0])}% on (rates measured: {pct})"
    )
    out = head + "; over every plan with a fit (all seeds): " + "; ".join(fits) + "."
    if tail:
        out += (" Where the upper component holds far more than the noisy samples, at " + ", ".join(tail)
                + ", it has taken up the clean losses' right-skewed tail with them: the mean loss ranks the noisy "
                "samples high (the AUC), but they form no mode of their own, and D stays below 2.")  # fmt: skip
    if overlap:
        out += (" At " + ", ".join(overlap) + " the mean losses of noisy and clean samples overlap: there is no "
                "second mode to find.")  # fmt: skip
    return out


def _study_b(runs: dict) -> list[str]:
    rates = sorted({k[0] for k in runs if k[0] not in RATES_A or k[1] == "rule"})
    if not rates:
        return []
    L = ["## B. Does the rule find noise at low rates?", "",
         "The same key-hash corruption at a lower rate (a subset of the 40% run's flipped samples), the same "
         "schedule. Per run of the rule: the plans where its test passed (two modes), Ashman's D and the upper "
         "component's weight over the plans with a fit (first - last), and the whole run's suspects against the "
         "known noisy samples; full data's signal at its last epoch (the AUC of the mean loss, and the two-mode "
         "test on its history means).", "",
         "| noise | seed | full data: AUC, D, upper weight (last epoch) | rule: plans with two modes | D (first - last "
         "plan) | upper weight (first - last) | suspected | precision | recall |",
         "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]  # fmt: skip
    for rate in rates:
        for s in seeds_of(runs, rate):
            r = runs.get((rate, "rule", s))
            f = runs.get((rate, "full", s))
            if r is None:
                continue
            sig = f["signal"][-1] if f else None
            fs = f"{sig['auc']:.3f}, {sig['D']:.2f}, {sig['upper_weight']:.2f}" if sig else "-"
            plans = [p for p in r["suspects"]["plans"] if p["noise_separation"] is not None]
            d = r["suspects"]
            dd = f"{plans[0]['noise_separation']:.2f} - {plans[-1]['noise_separation']:.2f}" if plans else "-"
            ww = f"{plans[0]['noise_upper_weight']:.2f} - {plans[-1]['noise_upper_weight']:.2f}" if plans else "-"
            act = ", ".join(f"e{e}" for e in d["active_epochs"]) or "none"
            L.append(f"| {round(100 * rate)}% | {s} | {fs} | {act} | {dd} | {ww} | {d['suspected']} | "
                     f"{_f(d['precision'], 3)} | {_f(d['recall'], 3)} |")  # fmt: skip
    L += ["", _rate_reading(runs, rates), "", "Test accuracy (%):", ""]
    for rate in sorted({k[0] for k in runs if k[0] not in RATES_A}):
        L += [f"**{round(100 * rate)}% wrong labels**", ""]
        L += _method_table(runs, rate, ("full-es", "full", "rule", "oracle"), 65000) + [""]
        for b in ("full-es", "full"):
            g = paired(runs, rate, "rule", b)
            if g:
                gaps = [x for _, x in g]
                se2, v = se2_verdict(gaps)
                L.append(f"* the rule alone - {LABELS[b]}: " + ", ".join(f"{x:+.2f} (s{s})" for s, x in g)
                         + f"; mean {np.mean(gaps):+.2f}, 2 SE {se2}: {v}")  # fmt: skip
        L.append("")
    return L


# ------------------------------------------------------------------------------ command line
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("what", choices=("run", "report"))
    ap.add_argument("--only", help="a regular expression: only the runs whose id it finds, and those whose "
                    "figures they take (run)")  # fmt: skip
    ap.add_argument("--seeds", type=int, default=SEEDS)
    ap.add_argument("--check", action="store_true", help="report: exit 1 if the committed report differs")
    ap.add_argument("--results", type=Path, default=RESULTS, help="the result files' folder (default: %(default)s)")
    ap.add_argument("--doc", type=Path, default=DOC, help="the page the report writes (default: %(default)s)")
    args = ap.parse_args(argv)
    results, doc = args.results.resolve(), args.doc.resolve()
    if args.what == "run":
        ctx = context(args.seeds, results)
        ctx.only = args.only
        harness.worker(ctx, sys.modules[__name__])  # one process, one torch thread
        return 0
    text = render(load_all(results), doc)
    if args.check:
        same = doc.exists() and doc.read_text() == text
        print(f"{path_label(doc)} is " + ("up to date" if same else "out of date"))
        return 0 if same else 1
    doc.write_text(text)
    print(f"wrote {path_label(doc)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
