"""Does the noise rule drop noisy samples, and does that pay? Pairs with mismatched captions, noisy labels.

Issue 26 (item 3): the noise rule (``noise=True``, a parameter of every policy; alone: ``full``
with it) trained through the real pipeline beside full data, dynamic random, SeTa and InfoBatch:

* **Pairs** (``studies.engines.pairs`` on ``tools.make_pair_shards`` sets, 20% and 0%
  mismatched): full data at E and 2E (the convergence check), the rule alone, the rule with
  dynamic random and with SeTa near 30% and 50% pruned, dynamic random, SeTa and InfoBatch there.
* **Noisy labels** (CIFAR-10 and SST-2 with 40% of the labels replaced, the short schedule:
  ``configs.noise_label_configs``; CIFAR-10 on a 20-epoch schedule: ``noise_label_long_configs``).

Per epoch a run records its held-out metric, the kept count, the noisy share of what the loader
delivered, the suspected set (``SUSPECT_REASONS``) with its precision and recall against the
known noise, and whether the loader delivered exactly the plan's kept samples. Settings come from
training losses only: SeTa's and InfoBatch's from ``pairs.calibrate``; the rule's combinations
from :func:`replay` (the library planning a scratch run fed full data's recorded losses), their
``r`` (SeTa: then ``alpha``) searched until the simulated pruned % is nearest the level. Runs go
through ``harness`` in :func:`plan`'s order; each is a JSON file under ``docs/quality-runs/noise-study/``.

    python -m studies noise_study --jobs 14 --deadline 480        # = python -m studies quality --study noise
    python -m studies noise_study --only 'pairs-n20-.*-s0'         # 20% mismatched, seed 0
    python -m studies noise_study --smoke --jobs 1                 # the code paths, minutes
    python -m studies noise_study --report-only                    # the reports from the run files
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np

from studies.quality import harness
from studies.quality.configs import params_id
from studies.quality.harness import Job
from studies.quality.layout import ROOT
from tools.results import path_label

RESULTS = ROOT / "docs" / "quality-runs" / "noise-study"
OUT = ROOT / "bench-out" / "noise-study"
LABEL_DATA = ROOT.parent / "shared" / "data"

# E = 10: full data trained 20 epochs on the 20%-mismatched set stopped rising after 6 (files
# e-choice/*.json; 2E checks it); the clean set rose for 17 of them (compared before convergence).
# A 2E run takes about 5 minutes on one core: the first wave fits one 9-minute call on 16 cores.
DATA = dict(train=10000, test=1000, shard_size=1000, size=32, seed=0)
TRAIN = dict(epochs=10, batch_size=128, lr=2e-3, workers=1)
NOISE_LEVELS = (0.2, 0.0)
LEVELS = (0.3, 0.5)
SEEDS = 2
RULE: dict[str, Any] = {"noise": True}  # the rule at its defaults (warm-up, re-check share)
# the rule alone, and with its mixture on the log1p scale (docs/algorithms.md §12.11) beside it
RULE_ALONE = ((RULE, "rule"), ({**RULE, "noise_scale": "log1p"}, "rule-log1p"))
SUSPECT_REASONS = ("suspected_noise", "noise_recheck")  # the suspected set of a plan
LABEL_SEEDS = {"cifar10": 2, "sst2": 5}  # as the short study's noisy-label runs (SST-2: 5)
LABEL_FIRST_SEEDS = 2  # label seeds before the remaining 2E runs; SST-2's others come last
# prior seconds per trained sample (training, evaluation, planning), for --deadline until runs
# of this invocation have measured their own
PRIOR_RATE = {"pairs": 1.6e-3, "cifar10": 1.0e-3, "sst2": 0.2e-3, "cal": 60.0}
CAL_TOL = 0.005  # a search stops when the simulated pruned fraction is this close to its level


def Ctx(**kw: Any) -> harness.Ctx:
    """The study's context (``harness.Ctx``) at its defaults, ``kw`` replacing them."""
    defaults = {"results": RESULTS, "out": OUT, "label_data": LABEL_DATA, "epochs": TRAIN["epochs"], "seeds": SEEDS,
                "data": dict(DATA)}  # fmt: skip
    return harness.Ctx(**{**defaults, **kw})


def pct(x: float) -> int:
    return round(100 * x)


# ------------------------------------------------------------------------------ the pairs
def pairs_data(ctx: harness.Ctx, noise: float) -> Path:
    return ctx.out / f"data-noise{pct(noise)}"


def prepare_pairs(ctx: harness.Ctx, noise: float, workers: int) -> Path:
    from studies.quality.pairs import make_pairs

    return make_pairs(pairs_data(ctx, noise), ctx.data, noise, workers)


def pairs_cfg(policy: str, params: dict, label: str, epochs: int) -> dict:
    return {"policy": policy, "params": dict(params), "label": label, "epochs": epochs}


def pairs_rid(noise: float, E: int, cfg: dict, seed: int) -> str:
    """e.g. ``pairs-n20-E12-random-rule-p30-noiseTrue-r0.18-s0``; the 2E run is ``...-full-full2E-...``."""
    return f"pairs-n{pct(noise)}-E{E}-{cfg['policy']}-{cfg['label']}-{params_id(cfg['params'])}-s{seed}"


def pairs_cal(noise: float, E: int, name: str) -> str:
    """A calibration's file stem: ``base`` (SeTa, InfoBatch), ``rule-random``, ``rule-seta``."""
    return f"pairs-n{pct(noise)}-E{E}-cal-{name}"


# ------------------------------------------------------------------------------ the plan
def _pairs_job(
    ctx: harness.Ctx, noise: float, cfg: dict, seed: int, needs: tuple[str, ...] = (), keep: float = 1.0
) -> Job:
    rid = pairs_rid(noise, ctx.epochs, cfg, seed)
    spec = {"noise": noise, "cfg": cfg, "seed": seed}
    return Job(rid, "pairs", spec, needs, ctx.data["train"] * cfg["epochs"] * keep)


def _pending(rid: str, cal: str) -> Job:
    """A run whose setting ``cal`` decides (its id names the setting ``tbd``)."""
    return Job(rid, "pending", {"cal": cal}, (cal,))


def _pairs_round(ctx: harness.Ctx, noise: float, seed: int, with_2e: bool) -> list[Job]:
    """One noise level and seed, in priority order (seed 0: its calibrations right after full data)."""
    E = ctx.epochs
    full_rid = pairs_rid(noise, E, pairs_cfg("full", {}, "full", E), 0)
    cals = {name: pairs_cal(noise, E, name) for name in ("base", "rule-random", "rule-seta")}
    jobs = [_pairs_job(ctx, noise, pairs_cfg("full", {}, "full", E), seed)]
    if seed == 0:
        spec = {"study": "pairs", "noise": noise, "full": full_rid}
        jobs += [Job(stem, "cal", {**spec, "name": name}, (full_rid, cals["base"]) if name == "rule-seta" else
                     (full_rid,)) for name, stem in cals.items()]  # fmt: skip
    jobs += [_pairs_job(ctx, noise, pairs_cfg("full", params, label, E), seed) for params, label in RULE_ALONE]
    if with_2e:
        jobs.append(_pairs_job(ctx, noise, pairs_cfg("full", {}, "full2E", 2 * E), seed))
    settings = {name: harness.load(ctx, stem) for name, stem in cals.items()}
    seen_ib: list[dict] = []
    for lv in LEVELS:
        tag = f"p{pct(lv)}"
        # (policy, label, the calibration that decides its setting: None for dynamic random at the level)
        for policy, label, cal in (("random", f"rule-{tag}", "rule-random"), ("random", tag, None),
                                   ("seta", tag, "base"), ("infobatch", tag, "base"),
                                   ("seta", f"rule-{tag}", "rule-seta")):  # fmt: skip
            if cal is None:
                p, needs = {"r": lv}, ()
            elif settings[cal] is None:  # not calibrated yet: the run waits, its id naming the setting ``tbd``
                rid = pairs_rid(noise, E, pairs_cfg(policy, {}, label, E), seed).replace("-default-", "-tbd-")
                jobs.append(_pending(rid, cals[cal]))
                continue
            else:
                levels = settings[cal]["levels"]
                p, needs = (levels[policy] if cal == "base" else levels)[str(pct(lv))]["params"], (cals[cal],)
            if policy == "infobatch":  # InfoBatch's largest r may be nearest both levels: one run
                if p in seen_ib:
                    continue
                seen_ib.append(p)
            jobs.append(_pairs_job(ctx, noise, pairs_cfg(policy, p, label, E), seed, needs, 1 - lv))
    return jobs


def _labels_round(ctx: harness.Ctx, dataset: str, seed: int) -> list[Job]:
    from studies.quality.configs import NOISE_LABEL_FULL, noise_label_configs, run_id

    full_rid = run_id(dataset, NOISE_LABEL_FULL, 0)
    jobs = []
    cal = f"{dataset}-noisy-cal-rule-random"  # the rule + random at 50%, on full data's losses
    quality_cal = _quality_calibration(dataset)
    rr = harness.load(ctx, cal)
    n = {"cifar10": 45000, "sst2": 65000}[dataset] * (3 if ctx.smoke else {"cifar10": 6, "sst2": 5}[dataset])
    for cfg in noise_label_configs(quality_cal, rr["levels"]["50"]["params"] if rr else None):
        needs = (cal,) if cfg["label"].startswith("nz-rule-p") else ()
        spec = {"dataset": dataset, "cfg": cfg, "seed": seed}  # kind: the data set, whose rate estimates it
        jobs.append(
            Job(run_id(dataset, cfg, seed), dataset, spec, needs, n * (0.5 if cfg["policy"] != "full" else 1.0))
        )
        if cfg == NOISE_LABEL_FULL and seed == 0:  # its calibration right after full data of seed 0
            jobs.append(Job(cal, "cal", {"study": "labels", "dataset": dataset, "full": full_rid}, (full_rid,)))
    if rr is None:
        cfg = {**NOISE_LABEL_FULL, "policy": "random", "params": {"r": "tbd"}, "label": "nz-rule-p50"}
        jobs.append(_pending(run_id(dataset, cfg, seed).replace("-rtbd-", "-tbd-"), cal))
    return jobs


def _labels_long_round(ctx: harness.Ctx, seed: int) -> list[Job]:
    """CIFAR-10's long schedule (``noise_label_long_configs``): full data, the rule alone on both scales."""
    from studies.quality.configs import noise_label_long_configs, run_id

    cfgs = noise_label_long_configs()
    if ctx.smoke:
        cfgs = [{**c, "n_epochs": 4} for c in cfgs]
    return [Job(run_id("cifar10", c, seed), "cifar10", {"dataset": "cifar10", "cfg": c, "seed": seed}, (),
                45000 * c["n_epochs"] * (0.9 if c["params"] else 1.0)) for c in cfgs]  # fmt: skip


def _quality_calibration(dataset: str) -> dict | None:
    """The short study's calibration of ``dataset`` (SeTa's and InfoBatch's 50% settings, chosen
    on the training losses of its clean full run): the noisy-label runs use those settings."""
    from studies.quality.layout import Layout

    p = Layout().results / f"{dataset}-calibration.json"
    return json.loads(p.read_text()) if p.exists() else None


def plan(ctx: harness.Ctx) -> list[Job]:
    """Every job of the study, the most informative first (a run id appears once): full data at E and 2E
    of seed 0 with its calibrations, then round by round (seed, noise level) the rule alone and the
    levels, the noisy-label runs, the remaining 2E runs."""
    jobs: list[Job] = []
    # first what the other runs wait for (full data of seed 0, its calibrations) and the longest
    # runs (full data at 2E of seed 0, the convergence check), which must start in the first wave
    # or an invocation bound by a deadline never reaches them
    for noise in NOISE_LEVELS:
        head = _pairs_round(ctx, noise, 0, with_2e=True)
        jobs += [j for j in head if j.kind == "cal" or j.spec.get("cfg", {}).get("label") in ("full", "full2E")]
    for seed in range(ctx.seeds):
        for noise in NOISE_LEVELS:
            jobs += _pairs_round(ctx, noise, seed, with_2e=False)
    if ctx.labels:
        for dataset in ("cifar10", "sst2"):
            for seed in range(min(LABEL_FIRST_SEEDS, _label_seeds(ctx, dataset))):
                jobs += _labels_round(ctx, dataset, seed)
        # CIFAR-10's long schedule after the short one's first seeds: the loss scale's seeds first
        long = [j for seed in range(_label_seeds(ctx, "cifar10")) for j in _labels_long_round(ctx, seed)]
        jobs += sorted(long, key=lambda j: "log1p" in j.rid)
    for seed in range(1, ctx.seeds):
        for noise in NOISE_LEVELS:
            jobs.append(_pairs_job(ctx, noise, pairs_cfg("full", {}, "full2E", 2 * ctx.epochs), seed))
    # the rule alone at 2E, beside full data at 2E: does it stay silent on clean pairs trained longer
    # (their losses spread as the model fits them), and what does it do to mismatched ones
    for noise in sorted(NOISE_LEVELS):
        for seed in range(ctx.seeds):
            jobs += [_pairs_job(ctx, noise, pairs_cfg("full", params, f"{label}2E", 2 * ctx.epochs), seed)
                     for params, label in RULE_ALONE]  # fmt: skip
    if ctx.labels:
        for seed in range(LABEL_FIRST_SEEDS, _label_seeds(ctx, "sst2")):
            jobs += _labels_round(ctx, "sst2", seed)
    return list({j.rid: j for j in jobs}.values())  # a run id once, where it first comes


def _label_seeds(ctx: harness.Ctx, dataset: str) -> int:
    return 1 if ctx.smoke else LABEL_SEEDS[dataset]


# ------------------------------------------------------------------------------ measurements
def suspect_stats(ids: list, reasons: list[str], truth: set) -> dict:
    """The suspected set of one plan against the known noisy samples.

    ``ids[i]`` and ``reasons[i]``: a plan row's identity (as ``truth`` names samples) and reason.
    Suspected = reason ``suspected_noise`` (left out) or ``noise_recheck`` (kept to be
    re-measured). Precision = suspected and noisy / suspected (None when nothing is suspected);
    recall = suspected and noisy / noisy (None when nothing is noisy); the same for the left-out
    part alone.
    """
    sus = {i for i, r in zip(ids, reasons) if r in SUSPECT_REASONS}
    out = {i for i, r in zip(ids, reasons) if r == SUSPECT_REASONS[0]}
    hit, out_hit = len(sus & truth), len(out & truth)
    return {"suspected": len(sus), "left_out": len(out), "rechecked": len(sus) - len(out), "suspected_noisy": hit,
            "precision": hit / len(sus) if sus else None, "recall": hit / len(truth) if truth else None,
            "left_out_precision": out_hit / len(out) if out else None,
            "left_out_recall": out_hit / len(truth) if truth else None}  # fmt: skip


def _summary_noise(run_dir: str, epoch: int) -> dict:
    """The plan summary's noise fields: counts, whether the rule acted, and why not (its test:
    ``one_mode``, ``upper_majority``...), the separation D and the upper component's weight."""
    import seta_stream as seta

    s = seta.load_summary(run_dir, epoch)
    out = {k: s.get(k) for k in ("noise_suspected", "noise_rechecked", "noise_active", "noise_test")}
    comp = s.get("noise_components") or {}
    out["noise_separation"] = s.get("noise_separation")
    out["noise_upper_weight"] = comp["weight"][int(np.argmax(comp["mean"]))] if comp.get("weight") else None
    return out


def plan_noise(run_dir: str, epochs: int, truth: set, key_only: bool = False) -> list[dict]:
    """Per epoch: the suspected set's counts, precision and recall (``suspect_stats``), the
    summary's noise fields, the plan's kept count and its noisy share. Identity: (shard, key),
    or the key alone where the noisy set is named by keys (``key_only``)."""
    import seta_stream as seta

    rows = []
    for e in range(epochs):
        t = seta.load_plan(run_dir, e, columns=["shard", "key", "keep", "reason"])
        keys = t.column("key").to_pylist()
        ids = keys if key_only else list(zip(t.column("shard").to_pylist(), keys))
        keep = t.column("keep").to_numpy(zero_copy_only=False)
        noisy = np.fromiter((i in truth for i in ids), bool, len(ids))
        rows.append({"epoch": e, **suspect_stats(ids, t.column("reason").to_pylist(), truth),
                     **_summary_noise(run_dir, e), "plan_kept": int(keep.sum()),
                     "plan_noisy_kept": int((keep & noisy).sum())})  # fmt: skip
    return rows


def run_status(rows: list[dict], epochs: int, loss_key: str, check_key: str) -> str:
    """``ok``; ``diverged`` (a non-finite training loss); ``plan_mismatch`` (an epoch whose loader
    did not deliver exactly the plan's kept samples); ``short`` (fewer epochs than scheduled)."""
    if len(rows) < epochs:
        return "short"
    if any(not np.isfinite(r[loss_key]) for r in rows):
        return "diverged"
    if not all(r[check_key] for r in rows):
        return "plan_mismatch"
    return "ok"


machine = harness.machine


# ------------------------------------------------------------------------------ one run
def train_pairs_job(ctx: harness.Ctx, job: Job, progress: list[str]) -> dict:
    from studies.quality.pairs import train_example

    noise, cfg, seed = job.spec["noise"], job.spec["cfg"], job.spec["seed"]
    run_dir, train = str(ctx.runs / job.rid), {**TRAIN, "epochs": cfg["epochs"]}

    def log(line: str) -> None:
        progress.append(line)
        print(f"  {job.rid}: {line.strip()}", flush=True)

    res, checks, truth = train_example(pairs_data(ctx, noise), run_dir, cfg, seed, train, log)
    res["run_dir"] = path_label(res["run_dir"])  # no folder of this machine in a committed file
    noise_rows = plan_noise(run_dir, cfg["epochs"], truth)
    rows = [{**r, **c, **nz} for r, c, nz in zip(res.pop("rows"), checks, noise_rows)]
    result = {"study": "noise-pairs", "id": job.rid, "status": run_status(rows, cfg["epochs"], "loss",
              "delivered_equals_plan"), "noise": noise, "E": ctx.epochs, **cfg, **res, "rows": rows,
              "data": {**ctx.data, "noise": noise}, "train": train, "machine": machine(),
              "library_rev": os.environ.get("STUDY_REV", "working tree")}  # fmt: skip
    if seed != 0:
        shutil.rmtree(run_dir, ignore_errors=True)
    return result


label_dataset = harness.dataset  # the quality study's data set (prepared once per process) and its population


def train_labels_job(ctx: harness.Ctx, job: Job, progress: list[str]) -> dict:
    from studies.quality.data import noise_offsets
    from studies.quality.train import train_run

    ds, population = label_dataset(ctx, job.spec["dataset"])
    cfg, seed = job.spec["cfg"], job.spec["seed"]
    result = train_run(ds, cfg, seed, ctx.runs, population, job.rid)
    truth = set(noise_offsets(population, ds.classes))
    run_dir = str(ctx.runs / job.rid)
    noise_rows = plan_noise(run_dir, len(result["epochs"]), truth, key_only=True)
    rows = [{**e, **nz, "delivered_equals_plan": e["streamed"] == e["kept"]}
            for e, nz in zip(result.pop("epochs"), noise_rows)]  # fmt: skip
    out = {"study": "noise-labels", "id": job.rid, "status": run_status(rows, cfg.get("n_epochs", ds.epochs),
           "train_loss", "delivered_equals_plan"), **result, "rows": rows,
           "noisy_in_data": len(truth) / max(rows[0]["n"], 1), "machine": machine()}  # fmt: skip
    out.pop("software", None)
    if seed != 0:
        shutil.rmtree(run_dir, ignore_errors=True)
    return out


# ------------------------------------------------------------------------------ calibration
def epoch_losses(full_run: Path, epochs: int) -> list[tuple[np.ndarray, list[str], list[str], np.ndarray]]:
    """The losses the run recorded in each epoch: (uids, shard names, keys, losses)."""
    import glob

    import pyarrow as pa
    import pyarrow.parquet as pq

    from seta_stream.ids import sample_uids

    out = []
    for e in range(epochs):
        files = sorted(glob.glob(str(full_run / f"losses/rank=*/epoch={e}/*.parquet")))
        if not files:
            raise SystemExit(f"{full_run}: no recorded losses of epoch {e}; the calibration needs the run directory")
        t = pa.concat_tables([pq.read_table(f, columns=["shard", "key", "loss"]) for f in files])
        out.append((sample_uids(t.column("shard"), t.column("key")), t.column("shard").to_pylist(),
                    t.column("key").to_pylist(), t.column("loss").to_numpy(zero_copy_only=False)))  # fmt: skip
    return out


def replay(losses: list, population: Any, policy: str, params: dict, scratch: Path) -> dict:
    """The library's plans of ``policy`` if each epoch's kept samples had the losses full data
    recorded in that epoch (``losses``: :func:`epoch_losses`): a scratch run directory is planned
    epoch by epoch (seed 0) and fed those losses for the samples its plan keeps (the others keep
    their older loss, as in a pruned run). Returns the simulated pruned fraction, the kept count per
    epoch and the suspected count per epoch (the plan rows the rule suspects; nothing is compared
    with the known noise)."""
    import seta_stream as seta

    shutil.rmtree(scratch, ignore_errors=True)
    url_of = dict(zip(population.column("shard").to_pylist(), population.column("url").to_pylist()))
    epochs = len(losses)
    pruner = seta.Pruner(str(scratch), policy=policy, params=params, epochs=epochs, seed=0, population=population)
    kept, suspected = [], []
    for e in range(epochs):
        s = pruner.start_epoch(e)
        plan_t = seta.load_plan(str(scratch), e, columns=["uid", "keep", "reason"])
        keep = plan_t.column("keep").to_numpy(zero_copy_only=False)
        kept.append(int(s["kept"]))
        suspected.append(sum(r in SUSPECT_REASONS for r in plan_t.column("reason").to_pylist()))
        uid, shards, keys, loss = losses[e]
        idx = np.flatnonzero(np.isin(uid, plan_t.column("uid").to_numpy()[keep]))
        if len(idx):
            pruner.record([keys[i] for i in idx], [url_of[shards[i]] for i in idx], loss[idx])
    pruner.close()
    n = len(population)
    shutil.rmtree(scratch, ignore_errors=True)
    return {"pruned": 1 - sum(kept) / (n * epochs), "kept": kept, "suspected": suspected}


def search(simulate: Any, level: float, lo: float = 0.0, hi: float = 0.95, tries: int = 8) -> tuple[float, list]:
    """The value x in [lo, hi] (3 decimals) whose ``simulate(x)`` (a pruned fraction that grows
    with x) lands nearest ``level``: a first try at ``lo``, then bisection guided by the
    secant, at most ``tries`` evaluations. Returns x and every (x, simulated) tried."""
    tried: list[tuple[float, float]] = []

    def ev(x: float) -> float:
        x = round(min(hi, max(lo, x)), 3)
        for a, b in tried:
            if a == x:
                return b
        p = simulate(x)
        tried.append((x, p))
        return p

    a, pa_ = lo, ev(lo)
    if pa_ >= level - CAL_TOL:
        return lo, tried
    b, pb = hi, None
    x = lo + (level - pa_) / max(1e-9, 1 - pa_) * (1 - lo)  # the guess if the rest were pruned uniformly
    while len(tried) < tries:
        p = ev(x)
        if abs(p - level) <= CAL_TOL:
            break
        if p < level:
            a, pa_ = round(x, 3), p
        else:
            b, pb = round(x, 3), p
        if b - a <= 0.001:
            break
        if pb is None:
            x = min(hi, a + (level - pa_) / max(1e-9, 1 - pa_) * (1 - a) + 0.01)
            if round(x, 3) <= a:
                x = (a + hi) / 2
        else:  # secant inside the bracket, kept off its ends
            x = a + (level - pa_) / max(1e-9, pb - pa_) * (b - a)
            x = min(max(x, a + 0.1 * (b - a)), b - 0.1 * (b - a))
    best = min(tried, key=lambda t: (abs(t[1] - level), t[0]))
    return best[0], tried


def calibrate_rule(
    losses: list, population: Any, scratch: Path, policy: str, levels: tuple[float, ...], base: dict | None = None
) -> dict:
    """The rule combined with ``policy`` (random, seta) at each level, on training losses only.

    random: its r searched (``search``). seta: SeTa's own setting of the level (``base``: its k,
    alpha, r) with the rule; where that lands below the level, its down-sampling r is searched
    upward; where the rule's removal already takes it past the level, it prunes less: r down to 0
    and the window widened (alpha from its own up to 1), the nearest of those. Ties: the first
    tried. Every setting tried is kept with its simulated pruned fraction."""
    out: dict[str, Any] = {"levels": {}, "rule_alone": replay(losses, population, "full", dict(RULE), scratch)}

    def sim(policy: str, params: dict) -> float:
        return float(replay(losses, population, policy, params, scratch)["pruned"])

    for lv in levels:
        tried: list[tuple[dict, float]] = []
        if policy == "random":
            _, xs = search(lambda r: sim("random", {**RULE, "r": r}), lv)
            tried = [({**RULE, "r": x}, p) for x, p in xs]
        else:
            assert base is not None
            own = dict(base["levels"]["seta"][str(pct(lv))]["params"])
            r0 = float(own.get("r", 0.0))
            first = sim("seta", {**own, **RULE})
            if first <= lv + CAL_TOL:  # below (or at) the level: more down-sampling
                _, xs = search(lambda r, own=own: sim("seta", {**own, **RULE, "r": r}), lv, lo=r0)
                tried = [({**own, **RULE, "r": x}, p) for x, p in xs]
            else:  # past the level: less down-sampling, a wider window
                tried = [({**own, **RULE}, first)]
                for r in sorted({0.0, r0}):
                    for a in (0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0):
                        q = {**own, **RULE, "r": r, "alpha": a}
                        if a >= float(own["alpha"]) and q != tried[0][0]:
                            tried.append((q, sim("seta", q)))
        params, best = min(tried, key=lambda t: abs(t[1] - lv))
        out["levels"][str(pct(lv))] = {
            "params": params,
            "simulated": best,
            "tried": [{"params": q, "simulated": p} for q, p in tried],
        }
    return out


def run_cal(ctx: harness.Ctx, job: Job) -> dict:
    spec = job.spec
    scratch = ctx.out / "scratch" / job.rid
    t0 = time.perf_counter()
    if spec["study"] == "pairs":
        import glob

        import seta_stream as seta
        from studies.quality.pairs import calibrate

        full_run = ctx.runs / spec["full"]
        population = seta.list_samples(sorted(glob.glob(str(pairs_data(ctx, spec["noise"]) / "train" / "*.tar"))))
        if spec["name"] == "base":
            out = calibrate(full_run, ctx.epochs)
        else:
            losses = epoch_losses(full_run, ctx.epochs)
            policy = spec["name"].split("-")[1]
            base = harness.load(ctx, pairs_cal(spec["noise"], ctx.epochs, "base")) if policy == "seta" else None
            out = calibrate_rule(losses, population, scratch, policy, LEVELS, base)
    else:
        ds, population = label_dataset(ctx, spec["dataset"])
        losses = epoch_losses(ctx.runs / spec["full"], ds.epochs)
        out = calibrate_rule(losses, population, scratch, "random", (0.5,))
    return {**out, "id": job.rid, "source": spec["full"], "seconds": round(time.perf_counter() - t0, 1),
            "machine": machine()}  # fmt: skip


# ------------------------------------------------------------------------------ the study's hooks (harness)
def run(ctx: harness.Ctx, job: Job, progress: list[str]) -> dict:
    if job.kind == "cal":
        return run_cal(ctx, job)
    return (train_pairs_job if job.kind == "pairs" else train_labels_job)(ctx, job, progress)


def prepare(ctx: harness.Ctx, jobs: int) -> None:
    """The data every job reads, once, before the workers start."""
    for noise in NOISE_LEVELS:
        prepare_pairs(ctx, noise, min(jobs, 10))
    if ctx.labels:
        for name in ("cifar10", "sst2"):
            try:
                label_dataset(ctx, name)
            except (SystemExit, Exception) as exc:  # the label sets are optional: the pairs run without them
                print(f"!! {name}: {exc}; its runs are left out (--label-data)", flush=True)
                ctx.labels = False


def context(args: argparse.Namespace) -> harness.Ctx:
    out = Path(args.out).resolve() if args.out else (OUT / "smoke" if args.smoke else OUT)
    results = Path(args.results).resolve() if args.results else (out / "results" if args.smoke else RESULTS)
    data = Path(args.data or LABEL_DATA).resolve()
    ctx = harness.context(args, results, out, label_data=data, labels=not args.no_labels, data=dict(DATA))
    if args.smoke:
        ctx.data.update(train=600, test=100, shard_size=100)
    ctx.epochs = args.epochs or (3 if args.smoke else TRAIN["epochs"])
    ctx.seeds = args.seeds or SEEDS
    return ctx


def missing(ctx: harness.Ctx, files: dict) -> list[str]:
    """The plan's runs with no finished result (pending ones named by what they wait for)."""
    have = {r["id"] for r in files["runs"]} | {c["id"] for c in files["crashed"] + files["cut"]}  # listed
    return [j.rid + (f" (its setting from `{j.needs[0]}`)" if j.kind == "pending" else "")
            for j in plan(ctx) if j.kind != "cal" and j.rid not in have]  # fmt: skip


def report(ctx: harness.Ctx, pairs_doc: Path | None = None, labels_doc: Path | None = None) -> None:
    from studies.quality import noise_report

    noise_report.report(ctx, missing, pairs_doc, labels_doc)


def after(ctx: harness.Ctx) -> None:
    """What the command prints when its workers are through, and the reports."""
    from studies.quality.noise_report import load_files

    files = load_files(ctx.results)
    print(f"== {len(files['runs'])} finished runs, {len(files['cal'])} calibrations; crashed: "
          f"{', '.join(c['id'] for c in files['crashed']) or 'none'}; cut short: "
          f"{', '.join(c['id'] for c in files['cut']) or 'none'}; "
          f"{len(harness.todo(ctx, plan(ctx)))} jobs left for another invocation", flush=True)  # fmt: skip
