"""Does pruning keep retrieval quality on web-crawled image-text pairs, and does it drop mismatched pairs?

Every run trains ``studies.engines.pairs``' small CLIP through the real pipeline on a set from
``tools.make_pair_shards`` with 0% and with 20% of the training pairs given another image's
caption: full data; dynamic random, SeTa and InfoBatch near 30% and 50% pruned (SeTa's and
InfoBatch's settings chosen on the training losses of full data's seed 0: ``calibrate``); 2
seeds. Reported: recall@1/@5 both ways on the clean held-out pairs and, per epoch, the share of
mismatched pairs the loader delivered and the plan's loss of mismatched and clean pairs; every
epoch is checked to deliver exactly the plan's kept pairs. Each finished run is a file
``docs/quality-runs/pairs-*.json`` (a rerun skips it); ``report`` rewrites docs/quality-pairs.md,
its summary in docs/results.md and ``docs/quality/pairs-*.png`` from those files.

    python -m studies pairs_study --snapshot        # everything, from a frozen copy of HEAD (~1 h)
    python -m studies pairs_study --report-only     # (= python -m studies quality --study pairs ...)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from studies.quality import harness
from studies.quality.collapses import window
from studies.quality.configs import params_id
from studies.quality.docs import fmt_params, interp_gap, mean_sd, row, splice, table_head
from studies.quality.harness import Job
from studies.quality.instability import MARK, curve, findings, footnote, unstable
from studies.quality.layout import ROOT, child_env, python_m
from studies.quality.reading_short import DISPLAY
from tools import draws
from tools.results import path_label

RESULTS = ROOT / "docs" / "quality-runs"
DOC = ROOT / "docs" / "quality-pairs.md"
OUT = ROOT / "bench-out" / "pairs"
LEVELS = (0.3, 0.5)
NOISE_LEVELS = (0.0, 0.2)
SEEDS = 2
POLICIES = ("full", "random", "seta", "infobatch")
ORDER = {p: i for i, p in enumerate(POLICIES)}
# the study's fixed shape (about an hour of CPU on 2 cores: 1 torch thread + 1 loader worker)
DATA = dict(train=20000, test=1000, shard_size=2000, size=32, seed=0)
TRAIN = dict(epochs=6, batch_size=128, lr=2e-3, workers=1, threads=1)
PRIOR_RATE = {"pairs": 1.6e-3, "cal": 60.0}


# ---------------------------------------------------------------------------------- data
def data_dir(out: Path, noise: float) -> Path:
    return out / f"data-noise{round(noise * 100)}"


def make_pairs(d: Path, data: dict, noise: float, workers: int) -> Path:
    """``tools/make_pair_shards.py``'s set of ``data``'s shape at ``noise`` in ``d`` (once)."""
    if not draws.made_with_these_draws(d / "info.json"):
        shutil.rmtree(d, ignore_errors=True)  # none yet, or made with an older tool's draws: made again
        cmd = python_m("tools.make_pair_shards", "--out", d, "--noise", noise, "--train", data["train"],
                       "--test", data["test"], "--shard-size", data["shard_size"], "--size", data["size"],
                       "--seed", data["seed"], "--workers", max(1, workers))  # fmt: skip
        subprocess.run(cmd, check=True, env=child_env())
    return d


# ---------------------------------------------------------------------------------- runs
def run_id(noise: float, cfg: dict, seed: int) -> str:
    return f"pairs-noise{round(noise * 100)}-{cfg['policy']}-{cfg['label']}-{params_id(cfg['params'])}-seed{seed}"


def plan_checks(run_dir: str, delivered: list[list[tuple[str, str]]], noise_keys: set) -> list[dict]:
    """Per epoch: delivered == plan's kept set (exactly), the plan's loss of mismatched vs clean
    pairs, the noise rule's suspects in the plan (reason ``suspected_noise`` or ``noise_recheck``)
    with their precision and recall among the mismatched pairs the plan holds, and the detection
    AUC of the rule's score: each recorded pair's mean of the finite losses folded before the plan
    (from the run's loss parts), mismatched against clean (Mann-Whitney, ties at half)."""
    import pyarrow.compute as pc
    import pyarrow.dataset as pads

    import seta_stream as seta

    def mean(x: np.ndarray, where: np.ndarray) -> float | None:
        return float(x[where].mean()) if where.any() else None

    parts = sorted(Path(run_dir).glob("losses*/rank=*/epoch=*/*.parquet"))
    recorded = pads.dataset([str(p) for p in parts], format="parquet").to_table(
        columns=["shard", "key", "epoch", "loss"]
    ) if parts else None  # fmt: skip
    out = []
    for e, got in enumerate(delivered):
        t = seta.load_plan(run_dir, e, columns=["shard", "key", "keep", "loss", "reason"])
        keep = t.column("keep").to_numpy(zero_copy_only=False)
        pairs = list(zip(t.column("shard").to_pylist(), t.column("key").to_pylist()))
        kept = {p for p, k in zip(pairs, keep) if k}
        noisy = np.array([p in noise_keys for p in pairs])
        loss = t.column("loss").to_numpy(zero_copy_only=False).astype(np.float64)
        seen = np.isfinite(loss)
        reason = np.asarray(t.column("reason").cast("string").to_pylist(), dtype=object)
        suspect = (reason == "suspected_noise") | (reason == "noise_recheck")
        tp = int((suspect & noisy).sum())
        auc = None
        if recorded is not None:
            before = recorded.filter(pc.less(recorded.column("epoch"), e))
            finite = before.filter(pc.is_finite(before.column("loss")))
            if finite.num_rows:
                means = finite.group_by(["shard", "key"]).aggregate([("loss", "mean")])
                keys = zip(means.column("shard").to_pylist(), means.column("key").to_pylist())
                label = np.fromiter((k in noise_keys for k in keys), bool, means.num_rows)
                auc = auc_of(means.column("loss_mean").to_numpy(zero_copy_only=False), label)
        out.append({"epoch": e, "delivered": len(got), "delivered_unique": len(set(got)),
                    "delivered_equals_plan": len(got) == len(set(got)) and set(got) == kept,
                    "plan_loss_clean": mean(loss, seen & ~noisy), "plan_loss_mismatched": mean(loss, seen & noisy),
                    "kept_share_clean": mean(keep, ~noisy), "kept_share_mismatched": mean(keep, noisy),
                    "suspected": int(suspect.sum()), "suspected_mismatched": tp,
                    "suspect_precision": tp / int(suspect.sum()) if suspect.any() else None,
                    "suspect_recall": tp / int(noisy.sum()) if noisy.any() else None,
                    "auc": auc, "suspects": sorted(p for p, s_ in zip(pairs, suspect) if s_)})  # fmt: skip
    return out


def run_suspects(checks: list[dict], noise_keys: set) -> dict:
    """The suspects over the whole run: the pairs any plan held as suspects (``plan_checks``'
    ``suspects``), against the mismatched pairs: count, true positives, precision, recall."""
    found = {tuple(p) for c in checks for p in c["suspects"]}
    tp = len(found & noise_keys)
    return {"suspected": len(found), "true_positives": tp, "precision": tp / len(found) if found else None,
            "recall": tp / len(noise_keys) if noise_keys else None}  # fmt: skip


def auc_of(score: np.ndarray, positive: np.ndarray) -> float | None:
    """P(score of a positive > score of a negative) + P(equal) / 2; None without both classes."""
    n1 = int(positive.sum())
    n0 = len(positive) - n1
    if not n1 or not n0:
        return None
    order = np.argsort(score, kind="stable")
    values = score[order]
    starts = np.flatnonzero(np.r_[True, values[1:] != values[:-1]])  # ties: their mean rank
    ends = np.r_[starts[1:], len(values)]
    ranks = np.empty(len(score), dtype=np.float64)
    ranks[order] = np.repeat((starts + 1 + ends) / 2.0, ends - starts)
    return float((ranks[positive].sum() - n1 * (n1 + 1) / 2.0) / (n1 * n0))


def train_example(data: Path, run_dir: str, cfg: dict, seed: int, train: dict, log: Any) -> tuple[dict, list, set]:
    """``studies.engines.pairs`` trained on ``data`` with ``cfg``'s policy and the schedule ``train``:
    its result (without the delivered keys), the per-epoch ``plan_checks`` and the mismatched pairs."""
    from studies.engines import pairs as tp

    args = argparse.Namespace(data=str(data), seed=seed, quiet=True, **train)
    res = tp.run(args, cfg["policy"], dict(cfg["params"]), run_dir, keep_keys=True, log=log)
    truth = tp.load_noise(str(data))
    return res, plan_checks(run_dir, res.pop("delivered"), truth), truth


def train_run(noise: float, cfg: dict, seed: int, out: Path) -> dict:
    run_dir = str(out / "runs" / run_id(noise, cfg, seed))
    train = {k: v for k, v in TRAIN.items() if k != "threads"}
    res, checks, _ = train_example(data_dir(out, noise), run_dir, cfg, seed, train, lambda s: print(s, flush=True))
    res["run_dir"] = path_label(res["run_dir"])  # no folder of this machine in a committed file
    return {"study": "pairs", "noise": noise, **cfg, **res, "checks": checks, "data": {**DATA, "noise": noise},
            "train": TRAIN, "library_rev": os.environ.get("STUDY_REV", "working tree")}  # fmt: skip


# ------------------------------------------------------------------------------ settings
def calibrate(full_run: Path, epochs: int) -> dict:
    """SeTa and InfoBatch settings whose pruned % lands nearest 30/50%, on training losses only
    (``calibrate.choose``): the plan of epoch e of the full run holds every pair's loss recorded in
    epoch e-1. Pruned runs see stale losses for the pairs they skipped, so the measured % differs
    somewhat; the report shows the measured one."""
    import seta_stream as seta
    from studies.quality.calibrate import choose

    uid = seta.load_plan(str(full_run), 0, columns=["uid"]).column("uid").to_numpy()
    order = np.argsort(uid)
    lasts = [np.full(len(uid), np.nan, np.float32)]
    for e in range(1, epochs):
        t = seta.load_plan(str(full_run), e, columns=["uid", "loss"])
        loss = np.full(len(uid), np.nan, np.float32)
        loss[order[np.searchsorted(uid[order], t.column("uid").to_numpy())]] = t.column("loss").to_numpy(
            zero_copy_only=False
        )
        lasts.append(loss)
    return choose(uid, lasts, LEVELS, 0.5, full_run.name)


def configs(cal: dict) -> list[dict]:
    out = [dict(FULL)]
    out += [{"policy": "random", "params": {"r": lv}, "label": f"p{int(lv * 100)}"} for lv in LEVELS]
    for policy in ("seta", "infobatch"):
        chosen: list[dict] = []
        for lv in LEVELS:
            p = cal["levels"][policy][f"{int(lv * 100)}"]["params"]
            if p not in chosen:  # e.g. InfoBatch's largest r may serve both levels: one run
                chosen.append(p)
                out.append({"policy": policy, "params": p, "label": f"p{int(lv * 100)}"})
    return out


# ---------------------------------------------------------------------------------- study
def load_results(results: Path = RESULTS) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(results.glob("pairs-noise*-seed*.json"))]


FULL = {"policy": "full", "params": {}, "label": "full"}


def cal_name(noise: float) -> str:
    return f"pairs-noise{round(noise * 100)}-settings"


def plan(ctx: harness.Ctx) -> list[Job]:
    """Rounds (seed, noise level), every configuration of a round before the next one, seed 0 of both
    levels first: full data of seed 0, its calibration, then the configurations it decides."""
    jobs = []
    for seed in range(ctx.seeds):
        for noise in NOISE_LEVELS:
            full0, cal = run_id(noise, FULL, 0), cal_name(noise)
            jobs += [Job(full0, "pairs", {"noise": noise, "cfg": FULL, "seed": 0}, (), DATA["train"] * TRAIN["epochs"]),
                     Job(cal, "cal", {"noise": noise, "full": full0}, (full0,))]  # fmt: skip
            if (c := harness.load(ctx, cal)) is None:  # the runs its settings decide, not known yet
                jobs.append(
                    Job(f"pairs-noise{round(noise * 100)}-tbd-seed{seed}", "pending", {"wildcard": True}, (cal,))
                )
            for cfg in configs(c) if c else []:
                jobs.append(Job(run_id(noise, cfg, seed), "pairs", {"noise": noise, "cfg": cfg, "seed": seed}, (cal,),
                                DATA["train"] * TRAIN["epochs"]))  # fmt: skip
    return list({j.rid: j for j in jobs}.values())


def run(ctx: harness.Ctx, job: Job, progress: list[str]) -> dict:
    s = job.spec
    if job.kind == "cal":
        return calibrate(ctx.runs / s["full"], TRAIN["epochs"])
    return train_run(s["noise"], s["cfg"], s["seed"], ctx.out)


def prepare(ctx: harness.Ctx, jobs: int) -> None:
    for noise in NOISE_LEVELS:
        make_pairs(data_dir(ctx.out, noise), DATA, noise, 2)


def context(args: argparse.Namespace) -> harness.Ctx:
    if args.smoke:
        DATA.update(train=2000, test=200, shard_size=500)
        TRAIN.update(epochs=3)
    out = Path(args.out).resolve() if args.out else OUT
    return harness.context(args, Path(args.results or RESULTS).resolve(), out, seeds=args.seeds or SEEDS)


def after(ctx: harness.Ctx) -> None:
    pass


# ---------------------------------------------------------------------------------- report
GUIDED = ("seta", "infobatch")  # the loss-guided policies
BEGIN, END = "<!-- generated:begin -->", "<!-- generated:end -->"


def _r1(r: dict) -> float:
    """A run's mean R@1 (image->text and text->image), a fraction."""
    return 0.5 * (r["i2t_r1"] + r["t2i_r1"])


def _mean(rs: list[dict], value: Callable[[dict], float]) -> float:
    """``value`` of the runs ``rs``, mean over seeds."""
    return float(np.mean([value(r) for r in rs]))


def _key(noise: float, cfg: dict) -> tuple:
    """The key of a configuration (or of one of its runs) in ``group_runs``."""
    return noise, cfg["policy"], cfg["label"], json.dumps(cfg["params"], sort_keys=True)


def group_runs(results: list[dict]) -> dict[tuple, list[dict]]:
    groups: dict[tuple, list[dict]] = {}
    for r in results:
        groups.setdefault(_key(r["noise"], r), []).append(r)
    return groups


def _keys(groups: dict, noise: float, policies: tuple[str, ...] = POLICIES) -> list[tuple]:
    """The configurations of ``policies`` at ``noise``, in table order."""
    return sorted((k for k in groups if k[0] == noise and k[1] in policies), key=lambda k: (ORDER[k[1]], k[2]))


def _guided(groups: dict, noise: float, policies: tuple[str, ...] = GUIDED) -> list[list[dict]]:
    return [groups[k] for k in _keys(groups, noise, policies)]


def _name(rs: list[dict]) -> str:
    """e.g. 'SeTa (alpha = 0.6, k = 5, r = 0.0)'."""
    r0 = rs[0]
    return f"{DISPLAY.get(r0['policy'], r0['policy'])} ({fmt_params(r0['params']).replace('=', ' = ')})"


def _gap(groups: dict, noise: float, rs: list[dict]) -> tuple[float, float | None] | None:
    """(mean R@1 minus dynamic random's, in points; None, or random's pruned % where ``rs`` lies beyond
    random's points): at the same measured pruned %, linear between random's points and full data, or
    else random's nearest level. None for full data and random themselves."""
    if rs[0]["policy"] in ("full", "random"):
        return None
    rnd = [(100 * _mean(g, lambda r: r["pruned"]), 100 * _mean(g, _r1)) for g in _guided(groups, noise, ("random",))]
    full = groups.get(_key(noise, FULL))
    x, y = 100 * _mean(rs, lambda r: r["pruned"]), 100 * _mean(rs, _r1)
    v = interp_gap(x, y, rnd + ([(0.0, 100 * _mean(full, _r1))] if full else []))
    if v is not None or not rnd:
        return None if v is None else (v, None)
    near = min(rnd, key=lambda p: abs(p[0] - x))
    return y - near[1], near[0]


def _gap_cell(groups: dict, noise: float, rs: list[dict]) -> str:
    g = _gap(groups, noise, rs)
    if g is None:
        return "-"
    return f"{g[0]:+.1f}" + ("" if g[1] is None else f" (against random at {g[1]:.1f}%, beyond its points)")


def _at(rs: list[dict], e: int, field: str, part: str = "rows") -> float:
    """``r[part][e][field]`` of the runs ``rs``, mean over seeds."""
    return float(np.mean([r[part][e][field] for r in rs]))


def _share(rs: list[dict], e: int) -> float:
    """The mismatched share (%) of the pairs trained in epoch ``e``, mean over seeds."""
    return 100 * _at(rs, e, "mismatched_share")


def _loss_cell(rs: list[dict], e: int) -> str:
    a = [r["checks"][e]["plan_loss_mismatched"] for r in rs]
    b = [r["checks"][e]["plan_loss_clean"] for r in rs]
    return "-" if None in a or None in b else f"{np.mean(a):.2f} / {np.mean(b):.2f}"


def _plan_losses(full: list[dict]) -> tuple[list[float], list[float]]:
    """Full data's mean plan loss of mismatched and of clean pairs in each epoch after the first (mean over seeds)."""
    epochs = range(1, len(full[0]["rows"]))
    return [_at(full, e, "plan_loss_mismatched", "checks") for e in epochs], [
        _at(full, e, "plan_loss_clean", "checks") for e in epochs
    ]


def _mark(rs: list[dict]) -> str:
    """' †' where a run of ``rs`` collapsed to chance or fell 20 points in one epoch (``instability``)."""
    return f" {MARK}" if any(unstable(r) for r in rs) else ""


def _unstable_note(rss: list[list[dict]]) -> list[str]:
    """The footnote under a table whose rows hold the runs ``rss``, naming the files of the marked runs."""
    files = [(f"{run_id(r['noise'], r, r['seed'])}.json", r) for rs in rss for r in rs if unstable(r)]
    return [footnote(files), ""] if files else []


def _collapsed(rs: list[dict]) -> dict[int, list[int]]:
    """seed -> the epochs its mean R@1 (the instability scan's ``curve``) fell to chance."""
    return {r["seed"]: es for r in rs if (es := findings(r)["collapse_epochs"])}


def _fallen(rs: list[dict]) -> list[tuple[int, int, float]]:
    """(seed, epoch, mean R@1 %) of every epoch in which a seed of ``rs`` fell to chance."""
    by = {r["seed"]: r for r in rs}
    return [(s, e, 100 * curve(by[s])[0][e]) for s, es in _collapsed(rs).items() for e in es]


def collapse_cell(groups: dict, noise: float, rs: list[dict]) -> str:
    bad = _collapsed(rs)
    if not bad:
        return "-"
    fallen = _fallen(rs)
    at = "; ".join(f"s{s}: " + ", ".join(f"e{e} {v:.1f}%" for s2, e, v in fallen if s2 == s) for s in bad)
    rest = [r for r in rs if r["seed"] not in bad]
    if not rest:
        return f"**{at}**; without them: no seed left"
    return f"**{at}**; without them: mean R@1 {100 * _mean(rest, _r1):.1f}"


def _prune_epochs(rs: list[dict]) -> list[int]:
    """The epochs after the first in which the policy of ``rs`` pruned (its first run's phases)."""
    return [e for e in range(1, len(rs[0]["rows"])) if rs[0]["rows"][e]["phase"] == "prune"]


def _missing(groups: dict, results: Path) -> list[str]:
    out = []
    for noise in NOISE_LEVELS:
        cal_path = results / f"{cal_name(noise)}.json"
        if not cal_path.exists():
            out.append(f"every run at {round(noise * 100)}% mismatched")
            continue
        for c in configs(json.loads(cal_path.read_text())):
            if (have := len(groups.get(_key(noise, c), []))) < SEEDS:
                out.append(f"{c['policy']} {fmt_params(c['params'])} at {round(noise * 100)}% ({SEEDS - have} seed(s))")
    return out


def _epoch_table(groups: dict, keys: list, title: str, cell: Callable[[list[dict], int], str]) -> list[str]:
    """A table with a column per epoch: ``cell(runs, epoch)`` for each configuration of ``keys``."""
    E = len(groups[keys[0]][0]["rows"])
    head = "| policy | setting | " + " | ".join(f"e{e}" for e in range(E)) + " |"
    cells = [[k[1] + _mark(groups[k]), fmt_params(groups[k][0]["params"]), *(cell(groups[k], e) for e in range(E))]
             for k in keys]  # fmt: skip
    return [title, "", *table_head(head), *map(row, cells), ""]


def _seed_table(groups: dict, noise: float) -> list[str]:
    """Per epoch and seed, for SeTa and InfoBatch: SeTa's window, the share of mismatched pairs among
    those trained, the shares of all mismatched and of all clean pairs the plan kept, mean R@1."""
    L = ["Per epoch and seed (s0 / s1), the loss-guided policies; window: SeTa's (algorithms.md §3.2: clusters of "
         "the plan's losses, 0 the easiest); **bold**: a collapse:", "",
         *table_head("| policy | setting | epoch | window | mismatched % of trained | mismatched pairs kept % "
                     "| clean pairs kept % | mean R@1 % after the epoch |")]  # fmt: skip
    for rs in _guided(groups, noise):
        rs, bad = sorted(rs, key=lambda r: r["seed"]), _collapsed(rs)
        policy, params = rs[0]["policy"], rs[0]["params"]
        for e in range(len(rs[0]["rows"])):
            per_seed = []
            for r in rs:
                r1, c = f"{100 * curve(r)[0][e]:.1f}", r["checks"][e]
                per_seed.append([f"{100 * r['rows'][e]['mismatched_share']:.1f}",
                                 f"{100 * c['kept_share_mismatched']:.0f}", f"{100 * c['kept_share_clean']:.0f}",
                                 f"**{r1}**" if e in bad.get(r["seed"], []) else r1])  # fmt: skip
            window_e = window(policy, params, e, rs[0]["rows"][e]["phase"])
            L.append(row([policy + _mark(rs), fmt_params(params), str(e), window_e,
                          *(" / ".join(cells) for cells in zip(*per_seed))]))  # fmt: skip
    return L + [""]


def _level(groups: dict, noise: float, doc: Path) -> list[str]:
    """The section of one noise level: its configurations, their per-epoch tables, its plot."""
    keys = _keys(groups, noise)
    title = f"{round(noise * 100)}% mismatched training pairs" if noise else "clean pairs (0% mismatched)"
    full = groups.get(_key(noise, FULL))
    full_s = min(r["seconds"] for r in full) if full else None
    head = ("| policy | setting | seeds | pruned % (measured) | R@1 i2t | R@1 t2i | R@5 i2t | R@5 t2i | mean R@1 vs "
            "dynamic random | mismatched % of trained pairs | collapsed seeds (epoch, mean R@1) "
            "| wall s (fastest seed) | time vs full |")  # fmt: skip
    L = [f"### {title}", "", *table_head(head)]
    for k in keys:
        rs = groups[k]
        secs = min(r["seconds"] for r in rs)
        trained = sum(x["trained"] for r in rs for x in r["rows"])
        mism = sum(x["mismatched_trained"] for r in rs for x in r["rows"])
        recall = [mean_sd([r[c] for r in rs], digits=1) for c in ("pruned", "i2t_r1", "t2i_r1", "i2t_r5", "t2i_r5")]
        L.append(row([k[1] + _mark(rs), fmt_params(rs[0]["params"]), str(len(rs)), *recall,
                      _gap_cell(groups, noise, rs), f"{100 * mism / max(trained, 1):.1f}" if noise else "-",
                      collapse_cell(groups, noise, rs), f"{secs:.0f}",
                      f"{secs / full_s:.2f}" if full_s else "-"]))  # fmt: skip
    L += ["", *_unstable_note([groups[k] for k in keys])]
    L += _epoch_table(groups, keys, "Kept fraction per epoch (plan, mean over seeds):",
                      lambda rs, e: f"{_mean(rs, lambda r: r['rows'][e]['kept'] / r['rows'][e]['n']):.2f}")  # fmt: skip
    if noise:
        L += _epoch_table(groups, keys, f"Mismatched % of the pairs trained per epoch (the keys the loader delivered "
                          f"against `noise.parquet`; {round(noise * 100)}% of the training set), mean over seeds:",
                          lambda rs, e: f"{_share(rs, e):.1f}")  # fmt: skip
        L += _epoch_table(groups, keys, "Mean loss of mismatched / clean pairs in each epoch's plan (each pair's loss "
                          "when last trained; e0 has none), mean over seeds:", _loss_cell)  # fmt: skip
        L += _seed_table(groups, noise)
    _plot(noise, groups, keys, doc)
    return L + [f"![{title}](quality/pairs-noise{round(noise * 100)}.png)", ""]


def report(ctx: harness.Ctx | None = None) -> None:
    """docs/quality-pairs.md's results and reading, docs/results.md's summary, the plots: from the run files."""
    results_dir = ctx.results if ctx else RESULTS
    doc = Path(ctx.args.doc).resolve() if ctx and getattr(ctx.args, "doc", None) else DOC
    results = load_results(results_dir)
    if not results:
        return
    groups = group_runs(results)
    missing = _missing(groups, results_dir)
    bad = [f"{run_id(r['noise'], r, r['seed'])} e{c['epoch']}" for r in results for c in r["checks"]
           if not c["delivered_equals_plan"]]  # fmt: skip
    n_epochs = sum(len(r["checks"]) for r in results)
    lines = [f"{len(results)} finished runs ({len(NOISE_LEVELS)} noise levels x up to {1 + 3 * len(LEVELS)} settings "
             f"x {SEEDS} seeds); " + (f"still missing: {'; '.join(missing)}." if missing else "none missing.")
             + f" In {n_epochs - len(bad)} of {n_epochs} run-epochs the loader delivered exactly the plan's kept pairs"
             + (f"; not in {'; '.join(bad[:20])}." if bad else "."), ""]  # fmt: skip
    for noise in NOISE_LEVELS:
        lines += _level(groups, noise, doc) if _keys(groups, noise) else []
    cal = [row([p.name.split("-")[1], policy, f"{lv}%", fmt_params(v["params"]), f"{100 * v['simulated']:.1f}"])
           for p in sorted(results_dir.glob("pairs-noise*-settings.json"))
           for policy, levels in json.loads(p.read_text())["levels"].items() for lv, v in levels.items()]  # fmt: skip
    if cal:
        lines += ["### Settings chosen for the pruned levels (on training losses of the full run, seed 0)", "",
                  *table_head("| data | policy | level | setting | simulated pruned % |"), *cal, ""]  # fmt: skip
    machines = sorted({", ".join(f"{k} {v}" for k, v in r["software"].items()) if r.get("software") else
                       "not recorded" for r in results})  # fmt: skip
    lines += [f"Library revision of the runs: {', '.join(sorted({r.get('library_rev', '?') for r in results}))}. "
              f"Machine, as the run files record it: {'; '.join(machines)}.", ""]  # fmt: skip
    splice(doc, BEGIN, END, lines, "Image-text pairs under pruning", skip_missing=True)
    splice(doc, "<!-- reading:begin -->", "<!-- reading:end -->", reading(groups), skip_missing=True)
    splice(doc.parent / "results.md", "<!-- pairs-summary:begin -->", "<!-- pairs-summary:end -->",
           summary_lines(groups), skip_missing=True)  # fmt: skip


def _trained_cell(rs: list[dict], kept: bool) -> str:
    """What a loss-guided configuration trained in its pruning epochs: the mismatched % of the pairs, and why
    (``kept``: with InfoBatch's kept % of the mismatched pairs)."""
    prune = _prune_epochs(rs)
    shares = {e: _share(rs, e) for e in prune}
    if rs[0]["policy"] == "infobatch":
        of = ""
        if kept:
            k = [100 * r["checks"][e]["kept_share_mismatched"] for r in rs for e in prune]
            of = f": it kept {min(k):.0f}-{max(k):.0f}% of the mismatched ones"
        return f"up to {shares[prune[-1]]:.1f} (it prunes only below-mean pairs{of})"
    top = max(prune, key=shares.__getitem__)
    hard = [e for e in prune if "hard end" in window("seta", rs[0]["params"], e, "prune")]
    where = "reaches" if top in hard else "does not reach"
    why = "" if top in hard else " (no window of this setting does)" if not hard else ""
    return (f"{min(shares.values()):.1f} to {shares[top]:.1f} with its window; the most in e{top}, whose window "
            f"{where} the hardest cluster{why}")  # fmt: skip


def _collapse_note(rs: list[dict], chance: bool) -> str:
    """'-', or the seeds whose mean R@1 fell to chance (``chance``: its value), where, and whether they recovered."""
    bad = _collapsed(rs)
    if not bad:
        return "-"
    back = all(curve(r)[0][-1] > curve(r)[0][bad[r["seed"]][0] - 1] for r in rs if r["seed"] in bad)
    at = ", ".join(f"s{s} e{e} {v:.1f}%" for s, e, v in _fallen(rs))
    level = f" ({100 * curve(rs[0])[1]:.1f}%)" if chance else ""
    return f"fell to chance{level}: {at}; " + ("every seed recovered by the last epoch" if back else "not recovered")


def _findings(groups: dict, page: bool) -> list[str]:
    """The study's findings (``page``: the reading of docs/quality-pairs.md, with the losses to 2 decimals, else
    docs/results.md's summary): the losses of mismatched and of clean pairs, the loss-guided settings in one
    table, their gaps to random against the spread of two seeds."""
    noisy = max(NOISE_LEVELS)
    full = groups.get(_key(noisy, FULL))
    if not full:
        return []
    digits = 2 if page else 1
    mis, cln = [f"{min(v):.{digits}f}-{max(v):.{digits}f}" for v in _plan_losses(full)]
    L = [f"**Mismatched pairs** have the highest losses (full data's plans: {mis} against {cln} for clean pairs once "
         "training has begun): although a pair's loss depends on the rest of its batch, it finds them. But the "
         "loss-guided policies treat high loss as informative:", "",
         *table_head("| data | policy (setting) | pruned % | mean R@1 minus dynamic random's | mismatched % of the "
                     "pairs trained in its pruning epochs | collapse |")]  # fmt: skip
    for noise in NOISE_LEVELS:
        for rs in _guided(groups, noise):
            if not noise and ((g := _gap(groups, noise, rs)) is None or g[1] is not None):
                continue  # clean pairs: the settings inside dynamic random's points
            L.append(row([f"{100 * noise:.0f}% mismatched" if noise else "clean pairs", _name(rs) + _mark(rs),
                          f"{100 * _mean(rs, lambda r: r['pruned']):.1f}", _gap_cell(groups, noise, rs),
                          _trained_cell(rs, page) if noise else "-", _collapse_note(rs, page)]))  # fmt: skip
    gaps = [g[0] for n in NOISE_LEVELS for rs in _guided(groups, n) if (g := _gap(groups, n, rs)) and g[1] is None]
    spreads = [100 * abs(_r1(g[0]) - _r1(g[1])) for g in groups.values() if len(g) == 2]
    if gaps and spreads:
        beat = "a loss-guided setting beat" if max(gaps) > max(spreads) else "no loss-guided setting beat"
        L += ["", f"Two seeds of one configuration differ by {min(spreads):.1f}-{max(spreads):.1f} points of mean "
              f"R@1; {beat} dynamic random by more than that."]  # fmt: skip
    if note := _unstable_note([rs for n in NOISE_LEVELS for rs in _guided(groups, n)]):
        L += ["", *note[:-1]]
    return L


def reading(groups: dict) -> list[str]:
    """'What the measurements say' on docs/quality-pairs.md."""
    return _findings(groups, True) + [""]


def summary_lines(groups: dict) -> list[str]:
    """docs/results.md's section on the pairs study: the findings, their source and a link to every table."""
    lines = _findings(groups, False)
    if not lines:
        return []
    runs = groups[_key(max(NOISE_LEVELS), FULL)]
    source = (f"`studies/pairs_study.py` ({runs[0]['data']['train']:,} pairs, {len(runs[0]['rows'])} epochs, "
              f"{len(runs)} seeds; every table: [docs/quality-pairs.md](quality-pairs.md)). ")  # fmt: skip
    return [source + lines[0], *lines[1:]]


def _plot(noise: float, groups: dict, keys: list, doc: Path) -> None:
    """Mean R@1 against the measured pruned % (mean ± sd over seeds); per epoch, the mismatched % of the pairs
    trained (clean pairs: the plan's kept fraction). One colour per policy; dashed: its 50% setting."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.5))
    for policy in sorted({k[1] for k in keys}, key=ORDER.get):
        ys = {k: np.array([100 * _r1(r) for r in groups[k]]) for k in keys if k[1] == policy}
        pts = sorted((100 * _mean(groups[k], lambda r: r["pruned"]), y.mean(), y.std(ddof=1) if len(y) > 1 else 0.0)
                     for k, y in ys.items())  # fmt: skip
        a.errorbar([p[0] for p in pts], [p[1] for p in pts], yerr=[p[2] for p in pts], marker="o", capsize=3,
                   label=policy, color=f"C{ORDER[policy]}")  # fmt: skip
    a.set(xlabel="measured pruned %", ylabel="held-out R@1 % (mean of i2t and t2i)", title=f"{noise:.0%} mismatched")
    ylabel = "mismatched % of trained pairs" if noise else "kept fraction (plan)"
    for k in keys:
        epochs, rs = range(len(groups[k][0]["rows"])), groups[k]
        y = [_share(rs, e) if noise else _at(rs, e, "kept") / _at(rs, e, "n") for e in epochs]
        b.plot(epochs, y, marker=".", color=f"C{ORDER[k[1]]}", ls="--" if k[2] == "p50" else "-",
               label=f"{k[1]} {fmt_params(rs[0]['params'])}")  # fmt: skip
    b.set(xlabel="epoch", ylabel=ylabel, title=f"{ylabel} per epoch")
    for ax in (a, b):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    (doc.parent / "quality").mkdir(exist_ok=True)
    fig.savefig(doc.parent / "quality" / f"pairs-noise{round(noise * 100)}.png", dpi=90)
    plt.close(fig)


# ------------------------------------------------------------------------------ snapshot
def snapshot(argv: list[str]) -> None:
    """Re-run this study from a frozen copy of HEAD (library, studies, tools): edits
    meanwhile do not affect it."""
    snap = ROOT / "bench-out" / "pairs-src"
    shutil.rmtree(snap, ignore_errors=True)
    snap.mkdir(parents=True)
    paths = ["seta_stream", "studies", "tools"]
    archive = subprocess.run(["git", "archive", "HEAD", *paths], cwd=ROOT, check=True, capture_output=True)
    subprocess.run(["tar", "-x", "-C", str(snap)], input=archive.stdout, check=True)
    rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, check=True, capture_output=True, text=True)
    env = {**os.environ, "PYTHONPATH": str(snap), "STUDY_REV": rev.stdout.strip()}
    rest = [a for a in argv if a != "--snapshot"]
    cmd = [sys.executable, "-m", "studies.quality", *rest, "--results", str(RESULTS), "--doc", str(DOC)]
    os.execve(sys.executable, cmd + ["--out", str(OUT)], env)
