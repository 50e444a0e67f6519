"""Does pruning keep retrieval quality on web-crawled image-text pairs, and does it drop mismatched pairs?

Every run trains ``examples/train_pairs.py``'s small CLIP through the real pipeline (tar shards
-> ``seta.attach`` -> DataLoader worker -> symmetric InfoNCE -> one recorded loss per pair ->
compaction -> plan of the next epoch) on a set from ``tools/make_pair_shards.py`` with 0% and
with 20% of the training pairs given another image's caption (same images, same clean captions,
same held-out pairs). Runs at the same number of epochs: full data; dynamic random, SeTa and
InfoBatch at settings that land near 30% and 50% pruned; 2 seeds. Reported: recall@1/@5
image->text and text->image on the clean held-out pairs; per epoch, the share of mismatched
pairs among the pairs the loader delivered (keys delivered vs ``noise.parquet``), and the mean
recorded loss of mismatched and clean pairs; every epoch of every run is checked to deliver
exactly the plan's kept pairs.

SeTa's and InfoBatch's settings per level are chosen on training losses only: the policy is
replayed over the per-epoch losses of the full run of seed 0 at the same noise level (the loss
column of its plans) for a grid of settings, and the setting whose simulated pruned % is nearest
the level is taken (``calibrate``). No held-out data is used.

Each finished run is one JSON file ``docs/quality-runs/pairs-*.json`` (a rerun skips finished
runs, so an interrupted study resumes); ``docs/quality-pairs.md``, its summary in ``docs/results.md``
and ``docs/quality/pairs-*.png`` are rewritten from those files after every run and by ``--report-only``.

    python benchmarks/pairs_study.py --snapshot        # everything, from a frozen copy of HEAD (~1 h)
    python benchmarks/pairs_study.py --report-only     # (= python -m benchmarks.quality --study pairs ...)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.instability import MARK, curve, findings, footnote, unstable

from . import harness
from .collapses import window
from .docs import and_list, fmt_params, interp_gap, mean_sd, row, splice
from .harness import Job
from .layout import ROOT
from .reading_short import DISPLAY

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


def import_example() -> Any:
    if str(ROOT / "examples") not in sys.path:
        sys.path.insert(0, str(ROOT / "examples"))
    import train_pairs

    return train_pairs


# ---------------------------------------------------------------------------------- data
def data_dir(out: Path, noise: float) -> Path:
    return out / f"data-noise{round(noise * 100)}"


def make_pairs(d: Path, data: dict, noise: float, workers: int) -> Path:
    """``tools/make_pair_shards.py``'s set of ``data``'s shape at ``noise`` in ``d`` (once)."""
    if not (d / "info.json").exists():
        cmd = [sys.executable, str(ROOT / "tools" / "make_pair_shards.py"), "--out", str(d), "--noise", str(noise),
               "--train", str(data["train"]), "--test", str(data["test"]), "--shard-size", str(data["shard_size"]),
               "--size", str(data["size"]), "--seed", str(data["seed"]), "--workers", str(max(1, workers))]  # fmt: skip
        subprocess.run(cmd, check=True)
    return d


# ---------------------------------------------------------------------------------- runs
def run_id(noise: float, cfg: dict, seed: int) -> str:
    p = "-".join(f"{k}{v}" for k, v in sorted(cfg["params"].items())) or "default"
    return f"pairs-noise{round(noise * 100)}-{cfg['policy']}-{cfg['label']}-{p}-seed{seed}"


def plan_checks(run_dir: str, delivered: list[list[tuple[str, str]]], noise_keys: set) -> list[dict]:
    """Per epoch: delivered == plan's kept set (exactly), and the plan's loss of mismatched vs clean pairs."""
    import seta_stream as seta

    out = []
    for e, got in enumerate(delivered):
        t = seta.load_plan(run_dir, e, columns=["shard", "key", "keep", "loss"])
        keep = t.column("keep").to_numpy(zero_copy_only=False)
        pairs = list(zip(t.column("shard").to_pylist(), t.column("key").to_pylist()))
        kept = {p for p, k in zip(pairs, keep) if k}
        noisy = np.array([p in noise_keys for p in pairs])
        loss = t.column("loss").to_numpy(zero_copy_only=False).astype(np.float64)
        seen = np.isfinite(loss)
        out.append(
            {
                "epoch": e,
                "delivered": len(got),
                "delivered_unique": len(set(got)),
                "delivered_equals_plan": len(got) == len(set(got)) and set(got) == kept,
                "plan_loss_clean": float(loss[seen & ~noisy].mean()) if (seen & ~noisy).any() else None,
                "plan_loss_mismatched": float(loss[seen & noisy].mean()) if (seen & noisy).any() else None,
                "kept_share_clean": float(keep[~noisy].mean()) if (~noisy).any() else None,
                "kept_share_mismatched": float(keep[noisy].mean()) if noisy.any() else None,
            }
        )
    return out


def train_example(data: Path, run_dir: str, cfg: dict, seed: int, train: dict, log: Any) -> tuple[dict, list, set]:
    """``examples/train_pairs.py`` trained on ``data`` with ``cfg``'s policy and the schedule ``train``:
    its result (without the delivered keys), the per-epoch ``plan_checks`` and the mismatched pairs."""
    tp = import_example()
    args = argparse.Namespace(data=str(data), seed=seed, quiet=True, **train)
    res = tp.run(args, cfg["policy"], dict(cfg["params"]), run_dir, keep_keys=True, log=log)
    truth = tp.load_noise(str(data))
    return res, plan_checks(run_dir, res.pop("delivered"), truth), truth


def train_run(noise: float, cfg: dict, seed: int, out: Path) -> dict:
    run_dir = str(out / "runs" / run_id(noise, cfg, seed))
    train = {k: v for k, v in TRAIN.items() if k != "threads"}
    res, checks, _ = train_example(data_dir(out, noise), run_dir, cfg, seed, train, lambda s: print(s, flush=True))
    return {"study": "pairs", "noise": noise, **cfg, **res, "checks": checks, "data": {**DATA, "noise": noise},
            "train": TRAIN, "library_rev": os.environ.get("STUDY_REV", "working tree")}  # fmt: skip


# ------------------------------------------------------------------------------ settings
def calibrate(full_run: Path, epochs: int) -> dict:
    """SeTa and InfoBatch settings whose pruned % lands nearest 30/50%, on training losses only
    (``calibrate.choose``): the plan of epoch e of the full run holds every pair's loss recorded in
    epoch e-1. Pruned runs see stale losses for the pairs they skipped, so the measured % differs
    somewhat; the report shows the measured one."""
    import seta_stream as seta

    from .calibrate import choose

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


def _r1(r: dict) -> float:
    return 0.5 * (r["i2t_r1"] + r["t2i_r1"])


def _key(noise: float, cfg: dict) -> tuple:
    """The key of a configuration (or of one of its runs) in ``group_runs``."""
    return noise, cfg["policy"], cfg["label"], json.dumps(cfg["params"], sort_keys=True)


def group_runs(results: list[dict]) -> dict[tuple, list[dict]]:
    groups: dict[tuple, list[dict]] = {}
    for r in results:
        groups.setdefault(_key(r["noise"], r), []).append(r)
    return groups


def _keys(groups: dict, noise: float) -> list[tuple]:
    return sorted((k for k in groups if k[0] == noise), key=lambda k: (ORDER[k[1]], k[2]))


def _guided(groups: dict, noise: float, policies: tuple[str, ...] = GUIDED) -> list[list[dict]]:
    """The runs of each configuration of ``policies`` at ``noise``, in table order."""
    return [groups[k] for k in _keys(groups, noise) if k[1] in policies]


def _vs_random(groups: dict, noise: float, rs: list[dict]) -> str:
    """Mean R@1 minus dynamic random's at the same measured pruned % (linear between its points and full)."""
    if rs[0]["policy"] in ("full", "random"):
        return "-"
    pts = [(0.0, groups.get(_key(noise, FULL)))]
    pts += [(float(np.mean([r["pruned"] for r in g])), g) for k, g in groups.items() if k[:2] == (noise, "random")]
    r1 = [(p, float(np.mean([_r1(r) for r in g]))) for p, g in pts if g]
    v = interp_gap(float(np.mean([r["pruned"] for r in rs])), float(np.mean([_r1(r) for r in rs])), r1)
    return "-" if v is None else f"{100 * v:+.1f}"


def _gaps(groups: dict) -> list[tuple[float, list[dict], str]]:
    """(noise, runs, ``_vs_random``) of every loss-guided configuration inside dynamic random's points."""
    return [(n, rs, v) for n in NOISE_LEVELS for rs in _guided(groups, n) if (v := _vs_random(groups, n, rs)) != "-"]


def _kept(rs: list[dict], e: int) -> float:
    """The plan's kept fraction in epoch ``e``, mean over seeds."""
    return float(np.mean([r["rows"][e]["kept"] / r["rows"][e]["n"] for r in rs]))


def _mismatched(rs: list[dict], e: int) -> float:
    """The mismatched share (%) of the pairs trained in epoch ``e``, mean over seeds."""
    return float(100 * np.mean([r["rows"][e]["mismatched_share"] for r in rs]))


def _loss_cell(rs: list[dict], e: int) -> str:
    a = [r["checks"][e]["plan_loss_mismatched"] for r in rs]
    b = [r["checks"][e]["plan_loss_clean"] for r in rs]
    return "-" if None in a or None in b else f"{np.mean(a):.2f} / {np.mean(b):.2f}"


def report(ctx: harness.Ctx | None = None) -> None:
    results_dir = ctx.results if ctx else RESULTS
    doc = Path(ctx.args.doc).resolve() if ctx and getattr(ctx.args, "doc", None) else DOC
    results = load_results(results_dir)
    if not results:
        return
    groups = group_runs(results)
    missing = _missing(groups, results_dir)
    bad = [f"{r['policy']} {fmt_params(r['params'])} noise {r['noise']} seed {r['seed']} epoch {c['epoch']}"
           for r in results for c in r["checks"] if not c["delivered_equals_plan"]]  # fmt: skip
    n_epochs = sum(len(r["checks"]) for r in results)
    lines = [
        f"{len(results)} finished runs ({len(NOISE_LEVELS)} noise levels x up to {1 + 3 * len(LEVELS)} settings x "
        f"{SEEDS} seeds; one run where a setting serves both pruned levels). "
        + ("Still missing (the study resumes with them): " + "; ".join(missing) + "." if missing else "None missing."),
        "",
        f"**Loader vs plan:** in {n_epochs - len(bad)} of {n_epochs} run-epochs the loader delivered exactly "
        "the plan's kept pairs (same (shard, key) set, each once)"
        + (": mismatches in " + "; ".join(bad[:20]) + "." if bad else "."),
        "",
    ]
    for noise in NOISE_LEVELS:
        keys = _keys(groups, noise)
        if not keys:
            continue
        title = f"{round(noise * 100)}% mismatched training pairs" if noise else "clean pairs (0% mismatched)"
        full = groups.get(_key(noise, FULL))
        full_s = float(np.min([r["seconds"] for r in full])) if full else None
        lines += [
            f"### {title}",
            "",
            "| policy | setting | seeds | pruned % (measured) | R@1 i2t | R@1 t2i | R@5 i2t | R@5 t2i "
            "| mean R@1 vs dynamic random | mismatched % of trained pairs | collapsed seeds (epoch, mean R@1) "
            "| wall s (fastest seed) | time vs full |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
        ]
        for k in keys:
            rs = groups[k]
            secs = float(np.min([r["seconds"] for r in rs]))
            trained = sum(row["trained"] for r in rs for row in r["rows"])
            mism = sum(row["mismatched_trained"] for r in rs for row in r["rows"])
            lines.append(row([k[1] + _mark(rs), fmt_params(rs[0]["params"]), str(len(rs)),
                              *(mean_sd([r[c] for r in rs], digits=1) for c in ("pruned", "i2t_r1", "t2i_r1", "i2t_r5",
                                                                                "t2i_r5")),
                              _vs_random(groups, noise, rs), f"{100 * mism / max(trained, 1):.1f}" if noise else "-",
                              collapse_cell(groups, noise, rs), f"{secs:.0f}",
                              f"{secs / full_s:.2f}" if full_s else "-"]))  # fmt: skip
        note = _unstable_note([groups[k] for k in keys])
        lines += ["", *note]
        t = partial(_table, groups, keys, note)
        lines += t("Kept fraction per epoch (plan, mean over seeds):", lambda rs, e: f"{_kept(rs, e):.2f}")
        if noise:
            lines += t(
                f"Share of mismatched pairs among the pairs each policy trained on, per epoch (%, mean over "
                f"seeds; counted from the keys the loader delivered against `noise.parquet`; "
                f"{round(noise * 100)}% of the training set):",
                lambda rs, e: f"{_mismatched(rs, e):.1f}",
            )
            lines += t("Mean loss of mismatched / clean pairs in each epoch's plan (the loss each pair had when "
                       "last trained; e0 has none), mean over seeds:", _loss_cell)  # fmt: skip
            lines += _per_epoch_table(groups, noise)
        _plot(noise, groups, keys, doc)
        lines += [f"![{title}](quality/pairs-noise{round(noise * 100)}.png)", ""]
    cal = []
    for p in sorted(results_dir.glob("pairs-noise*-settings.json")):
        c = json.loads(p.read_text())
        for policy, levels in c["levels"].items():
            for lv, v in levels.items():
                cal.append(row([p.name.split("-")[1], policy, f"{lv}%", fmt_params(v["params"]),
                                f"{100 * v['simulated']:.1f}"]))  # fmt: skip
    if cal:
        lines += ["### Settings chosen for the pruned levels (on training losses of the full run, seed 0)", "",
                  "| data | policy | level | setting | simulated pruned % |", "| --- | --- | --- | --- | --- |", *cal,
                  ""]  # fmt: skip
    revs = sorted({r.get("library_rev", "?") for r in results})
    machines = sorted({", ".join(f"{k} {v}" for k, v in r["software"].items()) if r.get("software") else
                       "not recorded" for r in results})  # fmt: skip
    lines += [f"Library revision of the runs: {', '.join(revs)}. Machine, as the run files record it: "
              f"{'; '.join(machines)}.", ""]  # fmt: skip
    splice(doc, BEGIN, END, lines, "Image-text pairs under pruning", skip_missing=True)
    splice(doc, "<!-- reading:begin -->", "<!-- reading:end -->", reading(groups), skip_missing=True)
    splice(doc.parent / "results.md", "<!-- pairs-summary:begin -->", "<!-- pairs-summary:end -->",
           summary_lines(groups), skip_missing=True)  # fmt: skip


BEGIN, END = "<!-- generated:begin -->", "<!-- generated:end -->"


# ------------------------------------------------------------------------ collapses, reading
def _mark(rs: list[dict]) -> str:
    """' †' where a run of ``rs`` collapsed to chance or fell 20 points in one epoch (benchmarks/instability.py)."""
    return f" {MARK}" if any(unstable(r) for r in rs) else ""


def _unstable_note(rss: list[list[dict]]) -> list[str]:
    """The footnote under a table whose rows hold the runs ``rss``, naming the files of the marked runs."""
    files = [f"{run_id(r['noise'], r, r['seed'])}.json" for rs in rss for r in rs if unstable(r)]
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
    return f"**{at}**; without them: mean R@1 {100 * float(np.mean([_r1(r) for r in rest])):.1f}"


def _prune_epochs(rs: list[dict]) -> list[int]:
    """The epochs after the first in which the policy of ``rs`` pruned (its first run's phases)."""
    return [e for e in range(1, len(rs[0]["rows"])) if rs[0]["rows"][e]["phase"] == "prune"]


def _per_epoch_table(groups: dict, noise: float) -> list[str]:
    """Per epoch and seed, for SeTa and InfoBatch: the window (rule), the share of mismatched pairs
    among those trained, the shares of mismatched and of clean pairs the plan kept, mean R@1."""
    L = [
        "Per epoch and seed (s0 / s1), SeTa and InfoBatch: the window (SeTa's rule, algorithms.md §3.2: clusters "
        "of the plan's losses, 0 the easiest), the share of mismatched pairs among the pairs trained, the share "
        "of all mismatched and of all clean pairs the plan kept, and the mean R@1 after the epoch "
        "(**bold**: a collapse):",
        "",
        "| policy | setting | epoch | window | mismatched % of trained | mismatched pairs kept % "
        "| clean pairs kept % | mean R@1 % after the epoch |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for rs in _guided(groups, noise):
        rs = sorted(rs, key=lambda r: r["seed"])
        policy, params, bad = rs[0]["policy"], rs[0]["params"], _collapsed(rs)
        for e in range(len(rs[0]["rows"])):
            per_seed = [
                [f"{100 * r['rows'][e]['mismatched_share']:.1f}",
                 f"{100 * r['checks'][e]['kept_share_mismatched']:.0f}",
                 f"{100 * r['checks'][e]['kept_share_clean']:.0f}",
                 ("**{:.1f}**" if e in bad.get(r["seed"], []) else "{:.1f}").format(100 * curve(r)[0][e])]
                for r in rs
            ]  # fmt: skip
            window_e = window(policy, params, e, rs[0]["rows"][e]["phase"])
            L.append(row([policy + _mark(rs), fmt_params(params), str(e), window_e,
                          *(" / ".join(cells) for cells in zip(*per_seed))]))  # fmt: skip
    return L + ["", *_unstable_note(_guided(groups, noise))]


def _missing(groups: dict, results: Path) -> list[str]:
    out = []
    for noise in NOISE_LEVELS:
        cal_path = results / f"{cal_name(noise)}.json"
        if not cal_path.exists():
            out.append(f"every run at {round(noise * 100)}% mismatched")
            continue
        for c in configs(json.loads(cal_path.read_text())):
            have = len(groups.get(_key(noise, c), []))
            if have < SEEDS:
                out.append(f"{c['policy']} {fmt_params(c['params'])} at {round(noise * 100)}% ({SEEDS - have} seed(s))")
    return out


def _name(rs: list[dict]) -> str:
    r0 = rs[0]
    return f"{DISPLAY.get(r0['policy'], r0['policy'])} ({fmt_params(r0['params']).replace('=', ' = ')})"


def _mean_r1(rs: list[dict]) -> float:
    return 100 * float(np.mean([_r1(r) for r in rs]))


def _pruned(rs: list[dict]) -> float:
    return 100 * float(np.mean([r["pruned"] for r in rs]))


def _shares(rs: list[dict], e: int) -> tuple[float, list[float]]:
    """The mismatched share of the pairs trained in epoch e: mean over seeds and per seed (%)."""
    per = [100 * r["rows"][e]["mismatched_share"] for r in sorted(rs, key=lambda r: r["seed"])]
    return float(np.mean(per)), per


def _plan_losses(full: list[dict]) -> tuple[list[float], list[float]]:
    """Full data's mean plan loss of mismatched and of clean pairs in each epoch after the first (mean over seeds)."""
    epochs = range(1, len(full[0]["rows"]))
    mis = [float(np.mean([r["checks"][e]["plan_loss_mismatched"] for r in full])) for e in epochs]
    return mis, [float(np.mean([r["checks"][e]["plan_loss_clean"] for r in full])) for e in epochs]


def _vs_random_value(groups: dict, noise: float, rs: list[dict]) -> str:
    """The table's interpolated gap, or the plain gap to random's nearest level beyond its points."""
    v = _vs_random(groups, noise, rs)
    if v != "-":
        return f"{v} against dynamic random at the same pruned %"
    rnd = _guided(groups, noise, ("random",))
    if not rnd:
        return ""
    near = min(rnd, key=lambda g: abs(_pruned(g) - _pruned(rs)))
    return (f"{_mean_r1(rs) - _mean_r1(near):+.1f} against dynamic random at {_pruned(near):.1f}% (beyond random's "
            "points, not interpolated)")  # fmt: skip


def reading(groups: dict) -> list[str]:
    """'What the measurements say', numbers from the run files (means over seeds unless per seed)."""
    noisy = max(NOISE_LEVELS)
    full = groups.get(_key(noisy, FULL))
    if not full:
        return []
    E = len(full[0]["rows"])
    mis, cln = _plan_losses(full)
    L = [
        f"* **The per-pair contrastive loss finds the mismatched pairs.** In full data's plans (epochs 1-{E - 1}, "
        f"mean over seeds) a mismatched pair's last loss is {min(mis):.2f}-{max(mis):.2f} while a clean pair's "
        f"falls from {cln[0]:.2f} to {cln[-1]:.2f} (the loss table above): although the loss of a pair depends on "
        "the rest of its batch, it ranks pairs by how well their image and caption match, which is the difficulty "
        "a pruning policy is meant to see.",
    ]
    ib = _guided(groups, noisy, ("infobatch",))
    if ib:
        prune = _prune_epochs(ib[0])
        kept_m = [100 * r["checks"][e]["kept_share_mismatched"] for rs in ib for r in rs for e in prune]
        tops = [f"{_shares(rs, prune[-1])[0]:.1f}% (r = {rs[0]['params']['r']:g})" for rs in ib]
        L.append(
            f"* **InfoBatch keeps the mismatched pairs.** It prunes only below-mean pairs, which are clean ones: in "
            f"its pruning epochs (e{prune[0]}-e{prune[-1]}) it kept {min(kept_m):.0f}-{max(kept_m):.0f}% of the "
            f"mismatched pairs, and their share of the pairs it trained climbs epoch after epoch to "
            f"{and_list(tops)} in e{prune[-1]}, against {100 * noisy:.0f}% in the data."
        )
    for rs in _guided(groups, noisy, ("seta",)):
        p = rs[0]["params"]
        prune = _prune_epochs(rs)
        items = []
        for e in prune:
            m, per = _shares(rs, e)
            kept = [100 * r["checks"][e]["kept_share_mismatched"] for r in rs]
            items.append(f"e{e} {window('seta', p, e, 'prune')}: {m:.1f}% ({' / '.join(f'{x:.1f}' for x in per)}), "
                         f"keeping {' / '.join(f'{x:.0f}' for x in kept)}% of the mismatched pairs")  # fmt: skip
        hard = [e for e in prune if "hard end" in window("seta", p, e, "prune")]
        top = max(prune, key=lambda e: _shares(rs, e)[0])
        text = (f"* **SeTa ({fmt_params(p).replace('=', ' = ')}) trains on a share of mismatched pairs that swings "
                f"with its window**, by epoch (mean over seeds, then per seed): {'; '.join(items)}. ")  # fmt: skip
        if top in hard:
            text += f"The largest share, e{top}, is the epoch whose window reaches the hardest cluster"
        else:
            text += (f"The largest share, e{top}, comes in an epoch whose window does not reach the hardest cluster "
                     f"{'(no window of this setting does)' if not hard else ''}: pairs change clusters as their "
                     "losses change")  # fmt: skip
        bad = _collapsed(rs)
        if bad:
            by = {r["seed"]: r for r in rs}
            text += ("; after it the mean R@1 of " + and_list([f"seed {s} fell to {v:.1f}% (e{e})" for s, e, v in
                     _fallen(rs)]) + f", chance being {100 * curve(rs[0])[1]:.1f}%: a collapse, from which every seed "
                     "recovered by the last epoch" if all(curve(by[s])[0][-1] > curve(by[s])[0][es[0] - 1] for s, es in
                     bad.items()) else "; after it the mean R@1 fell to chance")  # fmt: skip
        L.append(text + ".")
    # retrieval
    parts = []
    for noise in NOISE_LEVELS:
        items = [f"{_name(rs)} at {_pruned(rs):.1f}% pruned {_vs_random_value(groups, noise, rs)}"
                 + (" [collapsed]" if _collapsed(rs) else "") for rs in _guided(groups, noise)]  # fmt: skip
        if items:
            title = f"{round(noise * 100)}% mismatched" if noise else "Clean pairs"
            parts.append(f"{title}: " + "; ".join(items))
    spreads = [abs(_r1(g[0]) - _r1(g[1])) * 100 for g in groups.values() if len(g) == 2]
    text = "* **Retrieval** (mean R@1, points): " + ". ".join(parts) + "."
    if spreads:
        beat = any(float(v) > max(spreads) for _, _, v in _gaps(groups))
        text += (f" Two seeds of one configuration differ by {min(spreads):.1f}-{max(spreads):.1f} points of mean "
                 "R@1; " + ("a loss-guided setting beat dynamic random by more." if beat else
                            "no loss-guided setting beat dynamic random by more than that."))  # fmt: skip
    L.append(text)
    return L + [""]


def summary_lines(groups: dict) -> list[str]:
    """docs/results.md's section on the pairs study: a sentence and two tables, numbers from the run files."""
    noisy = max(NOISE_LEVELS)
    full = groups.get(_key(noisy, FULL))
    if not full:
        return []
    mis, cln = _plan_losses(full)
    L = [f"`benchmarks/pairs_study.py` ({full[0]['data']['train']:,} pairs, {len(full[0]['rows'])} epochs, "
         f"{len(full)} seeds; tables, plots and the per-epoch shares: [docs/quality-pairs.md](quality-pairs.md)). "
         f"**Mismatched pairs** have the highest losses (full data's plans: {min(mis):.1f}-{max(mis):.1f} against "
         f"{cln[-1]:.1f}-{cln[0]:.1f} for clean pairs once training has begun), so the per-pair loss finds them, but "
         f"the policies treat high loss as informative. With {100 * noisy:.0f}% mismatched pairs, what the "
         "loss-guided policies trained in their pruning epochs:", "",
         "| policy (setting) | mismatched % of the pairs trained in its pruning epochs | mean R@1 |",
         "| --- | --- | --- |"]  # fmt: skip
    for rs in _guided(groups, noisy, ("infobatch",)):
        last = _prune_epochs(rs)[-1]
        L.append(f"| {_name(rs)}{_mark(rs)} | up to {_shares(rs, last)[0]:.1f} (it prunes only below-mean pairs) | - |")
    for rs in _guided(groups, noisy, ("seta",)):
        sh = [_shares(rs, e)[0] for e in _prune_epochs(rs)]
        fell = "-"
        if _collapsed(rs):
            at = ", ".join(f"{v:.1f}%" for _, _, v in _fallen(rs))
            fell = f"fell to chance after its {max(sh):.1f}% epoch (seed by seed: {at})"
        L.append(
            f"| {_name(rs)}{_mark(rs)} | {min(sh):.1f} to {max(sh):.1f}, depending on the epoch's window | {fell} |"
        )
    rows = [f"| {f'{100 * n:.0f}% mismatched' if n else 'clean pairs'} | {_name(rs)}{_mark(rs)} | {_pruned(rs):.1f} "
            f"| {v} |" for n, rs, v in _gaps(groups)]  # fmt: skip
    if rows:
        L += ["", "Against dynamic random at the same pruned % (mean R@1, points):", "",
              "| data | policy (setting) | pruned % | mean R@1 minus dynamic random's |", "| --- | --- | --- | --- |",
              *rows]  # fmt: skip
    if note := _unstable_note([rs for n in NOISE_LEVELS for rs in _guided(groups, n)]):
        L += ["", *note[:-1]]
    return L


def _table(groups: dict, keys: list, note: list[str], title: str, cell: Any) -> list[str]:
    """A table with a column per epoch: ``cell(runs, epoch)`` for each configuration of ``keys``."""
    E = len(groups[keys[0]][0]["rows"])
    return [title, "", "| policy | setting | " + " | ".join(f"e{e}" for e in range(E)) + " |",
            "| --- | --- |" + " --- |" * E,
            *(row([f"{k[1]}{_mark(groups[k])}", fmt_params(groups[k][0]["params"]), *(cell(groups[k], e)
                   for e in range(E))]) for k in keys), "", *note]  # fmt: skip


def _plot(noise: float, groups: dict, keys: list, doc: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, axes = plt.subplots(1, 3 if noise else 2, figsize=(16 if noise else 11, 4.5))
    a = axes[0]
    by_policy: dict[str, list] = {}
    for k in keys:
        rs = groups[k]
        y = np.array([_r1(r) for r in rs]) * 100
        by_policy.setdefault(k[1], []).append(
            (np.mean([r["pruned"] for r in rs]) * 100, y.mean(), y.std(ddof=1) if len(y) > 1 else 0.0)
        )
    for policy, pts in sorted(by_policy.items(), key=lambda kv: ORDER[kv[0]]):
        pts.sort()
        a.errorbar([p[0] for p in pts], [p[1] for p in pts], yerr=[p[2] for p in pts], marker="o", capsize=3,
                   label=policy, color=f"C{ORDER[policy]}")  # fmt: skip
    a.set_xlabel("measured pruned %")
    a.set_ylabel("held-out R@1 % (mean of i2t and t2i)")
    a.set_title(f"{round(noise * 100)}% mismatched: R@1 vs pruned")
    a.grid(alpha=0.3)
    a.legend(fontsize=8)
    # per epoch: the kept fraction; with mismatched pairs, also their share of the pairs trained
    panels = [(_kept, "kept fraction (plan)", "kept fraction per epoch"),
              (_mismatched, "mismatched % of trained pairs", "share of mismatched pairs trained on")]  # fmt: skip
    for ax, (value, ylabel, title) in zip(axes[1:], panels):
        for k in keys:  # one colour per policy (as in the recall panel); dashed for its 50% setting
            rs, epochs = groups[k], range(len(groups[k][0]["rows"]))
            ax.plot(epochs, [value(rs, e) for e in epochs], marker=".", color=f"C{ORDER[k[1]]}",
                    ls="--" if k[2] == "p50" else "-", label=f"{k[1]} {fmt_params(rs[0]['params'])}")  # fmt: skip
        if value is _mismatched:
            ax.axhline(100 * noise, color="gray", ls="--", lw=1)
        ax.set_xlabel("epoch")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6)
    fig.tight_layout()
    (doc.parent / "quality").mkdir(exist_ok=True)
    fig.savefig(doc.parent / "quality" / f"pairs-noise{round(noise * 100)}.png", dpi=90)
    plt.close(fig)


# ------------------------------------------------------------------------------ snapshot
def snapshot(argv: list[str]) -> None:
    """Re-run this study from a frozen copy of HEAD (library, benchmarks, example, data tool): edits
    meanwhile do not affect it."""
    snap = ROOT / "bench-out" / "pairs-src"
    shutil.rmtree(snap, ignore_errors=True)
    snap.mkdir(parents=True)
    paths = ["seta_stream", "benchmarks", "examples/train_pairs.py", "tools/make_pair_shards.py"]
    archive = subprocess.run(["git", "archive", "HEAD", *paths], cwd=ROOT, check=True, capture_output=True)
    subprocess.run(["tar", "-x", "-C", str(snap)], input=archive.stdout, check=True)
    rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, check=True, capture_output=True, text=True)
    env = {**os.environ, "PYTHONPATH": str(snap), "STUDY_REV": rev.stdout.strip()}
    rest = [a for a in argv if a != "--snapshot"]
    cmd = [sys.executable, "-m", "benchmarks.quality", *rest, "--results", str(RESULTS), "--doc", str(DOC)]
    os.execve(sys.executable, cmd + ["--out", str(OUT)], env)
