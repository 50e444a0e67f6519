"""The noise study (studies/noise_study.py): its measures, its plan and job claiming, its report."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from studies.quality import harness as H
from studies.quality import noise as ns
from studies.quality import noise_report as nr

ROOT = Path(__file__).resolve().parents[1]
MACHINE = {"cpu": "Test CPU", "cores": 16, "torch": "2.13.0", "cpu_capability": "AVX2", "torch_threads": 1}


# ------------------------------------------------------------------------------ measures
def test_suspect_stats_on_a_hand_made_plan() -> None:
    ids = [("a", "1"), ("a", "2"), ("a", "3"), ("b", "1"), ("b", "2"), ("b", "3")]
    reasons = ["suspected_noise", "noise_recheck", "all", "suspected_noise", "window", "all"]
    truth = {("a", "1"), ("a", "3"), ("b", "1")}
    s = ns.suspect_stats(ids, reasons, truth)
    # suspected {a1, a2, b1}: two of them noisy; noisy {a1, a3, b1}: two of them suspected
    assert s == {
        "suspected": 3,
        "left_out": 2,
        "rechecked": 1,
        "suspected_noisy": 2,
        "precision": 2 / 3,
        "recall": 2 / 3,
        "left_out_precision": 1.0,
        "left_out_recall": 2 / 3,
    }
    none = ns.suspect_stats(ids, ["all"] * 6, set())
    assert (none["suspected"], none["precision"], none["recall"]) == (0, None, None)


def test_run_status_names_what_went_wrong() -> None:
    ok = [{"loss": 1.0, "delivered_equals_plan": True}] * 3
    assert ns.run_status(ok, 3, "loss", "delivered_equals_plan") == "ok"
    assert ns.run_status(ok[:2], 3, "loss", "delivered_equals_plan") == "short"
    assert (
        ns.run_status(
            [*ok[:2], {"loss": float("nan"), "delivered_equals_plan": True}], 3, "loss", "delivered_equals_plan"
        )
        == "diverged"
    )
    assert (
        ns.run_status([*ok[:2], {"loss": 1.0, "delivered_equals_plan": False}], 3, "loss", "delivered_equals_plan")
        == "plan_mismatch"
    )


def test_search_lands_nearest_the_level_on_a_monotone_curve() -> None:
    calls = []

    def sim(r: float) -> float:  # the rule removes 15%, random r of the rest
        calls.append(r)
        return 1 - 0.85 * (1 - r)

    r, tried = ns.search(sim, 0.5)
    assert abs(sim(r) - 0.5) <= ns.CAL_TOL and len(tried) <= 8
    assert ns.search(sim, 0.1)[0] == 0.0  # the rule alone is past the level: r = 0


def test_replay_plans_with_the_library_over_recorded_losses(tmp_path: Path) -> None:
    """A replay of dynamic random over a full run's losses keeps floor((1 - r) N) every epoch."""
    import numpy as np

    import seta_stream as seta
    from tests.conftest import write_shards

    urls = write_shards(tmp_path / "shards", [20, 20])
    population = seta.list_samples(urls)
    run = tmp_path / "full"
    pruner = seta.Pruner(str(run), policy="full", epochs=3, seed=0, population=population)
    keys, shard_urls = population.column("key").to_pylist(), population.column("url").to_pylist()
    for e in range(3):
        pruner.start_epoch(e)
        pruner.record(keys, shard_urls, np.linspace(0.1, 4.0, len(keys)).astype(np.float32) + e)
    pruner.close()
    losses = ns.epoch_losses(run, 3)
    out = ns.replay(losses, population, "random", {"r": 0.5}, tmp_path / "scratch")
    assert out["kept"] == [20, 20, 20] and out["pruned"] == 0.5
    assert ns.replay(losses, population, "full", {}, tmp_path / "scratch")["pruned"] == 0.0


def test_calibrate_rule_lands_each_level_through_the_library(tmp_path: Path, monkeypatch) -> None:
    """The search over the library's replays; the rule stubbed out (``RULE = {}``) so that the plans
    are dynamic random's and SeTa's own, whose pruned fractions are known."""
    import numpy as np

    import seta_stream as seta
    from tests.conftest import write_shards

    monkeypatch.setattr(ns, "RULE", {})
    urls = write_shards(tmp_path / "shards", [50, 50])
    population = seta.list_samples(urls)
    pruner = seta.Pruner(str(tmp_path / "full"), policy="full", epochs=4, seed=0, population=population)
    keys, shard_urls = population.column("key").to_pylist(), population.column("url").to_pylist()
    for e in range(4):
        pruner.start_epoch(e)
        pruner.record(keys, shard_urls, np.random.default_rng(e).gamma(2.0, size=len(keys)).astype(np.float32))
    pruner.close()
    losses = ns.epoch_losses(tmp_path / "full", 4)
    out = ns.calibrate_rule(losses, population, tmp_path / "scratch", "random", (0.3, 0.5))
    assert out["rule_alone"]["pruned"] == 0.0
    assert [out["levels"][lv]["params"] for lv in ("30", "50")] == [{"r": 0.3}, {"r": 0.5}]
    assert [out["levels"][lv]["simulated"] for lv in ("30", "50")] == pytest.approx([0.3, 0.5], abs=1e-12)
    base = {
        "levels": {
            "seta": {
                "30": {"params": {"r": 0.0, "k": 5, "alpha": 0.6}},
                "50": {"params": {"r": 0.0, "k": 5, "alpha": 0.3}},
            }
        }
    }
    out = ns.calibrate_rule(losses, population, tmp_path / "scratch", "seta", (0.3, 0.5), base)
    for lv, level in (("30", 0.3), ("50", 0.5)):
        got = out["levels"][lv]
        tried = [t["simulated"] for t in got["tried"]]
        assert got["simulated"] == min(tried, key=lambda p: abs(p - level))  # the nearest of those tried
        assert (
            got["params"]["k"] == 5
            and got["simulated"] == ns.replay(losses, population, "seta", got["params"], tmp_path / "s2")["pruned"]
        )


def test_the_noisy_label_runs_have_ids_of_their_own() -> None:
    from studies.quality.configs import configs, noise_label_configs, run_id

    cal = json.loads((ROOT / "docs" / "quality-runs" / "cifar10-calibration.json").read_text())
    ours = {run_id("cifar10", c, s) for c in noise_label_configs(cal, {"noise": True, "r": 0.2}) for s in (0, 1)}
    theirs = {run_id("cifar10", c, s) for c in configs(cal) for s in (0, 1)}
    assert len(ours) == 14 and not ours & theirs
    assert {
        "cifar10-noisy-full-nz-rule-noiseTrue-s0",
        "cifar10-noisy-full-nz-rule-log1p-noiseTrue-noise_scalelog1p-s1",
    } <= ours


# ------------------------------------------------------------------------------ plan and claims
CAL_BASE = {
    "levels": {
        "seta": {
            "30": {"params": {"alpha": 0.6, "k": 5, "r": 0.0}, "simulated": 0.3},
            "50": {"params": {"alpha": 0.3, "k": 10, "r": 0.0}, "simulated": 0.5},
        },
        "infobatch": {"30": {"params": {"r": 0.6}, "simulated": 0.28}, "50": {"params": {"r": 0.9}, "simulated": 0.42}},
    }
}
CAL_RULE = {
    "levels": {
        "30": {"params": {"noise": True, "r": 0.15}, "simulated": 0.3},
        "50": {"params": {"noise": True, "r": 0.4}, "simulated": 0.5},
    }
}


def test_the_plan_puts_the_core_comparison_first_and_waits_for_calibrations(tmp_path: Path) -> None:
    ctx = ns.Ctx(results=tmp_path / "r", out=tmp_path / "o", epochs=4, labels=False)
    ctx.results.mkdir()
    first = [j.rid for j in ns.plan(ctx)][:15]
    assert first == [  # what others wait for and the longest runs, then 20% mismatched seed 0
        "pairs-n20-E4-full-full-default-s0",
        "pairs-n20-E4-cal-base",
        "pairs-n20-E4-cal-rule-random",
        "pairs-n20-E4-cal-rule-seta",
        "pairs-n20-E4-full-full2E-default-s0",
        "pairs-n0-E4-full-full-default-s0",
        "pairs-n0-E4-cal-base",
        "pairs-n0-E4-cal-rule-random",
        "pairs-n0-E4-cal-rule-seta",
        "pairs-n0-E4-full-full2E-default-s0",
        "pairs-n20-E4-full-rule-noiseTrue-s0",
        "pairs-n20-E4-full-rule-log1p-noiseTrue-noise_scalelog1p-s0",
        "pairs-n20-E4-random-rule-p30-tbd-s0",
        "pairs-n20-E4-random-p30-r0.3-s0",
        "pairs-n20-E4-seta-p30-tbd-s0",
    ]
    for stem, cal in (("base", CAL_BASE), ("rule-random", CAL_RULE), ("rule-seta", CAL_RULE)):
        (ctx.results / f"pairs-n20-E4-cal-{stem}.json").write_text(json.dumps(cal))
    jobs = ns.plan(ctx)
    assert [j.rid for j in jobs][12:18] == [
        "pairs-n20-E4-random-rule-p30-noiseTrue-r0.15-s0",
        "pairs-n20-E4-random-p30-r0.3-s0",
        "pairs-n20-E4-seta-p30-alpha0.6-k5-r0.0-s0",
        "pairs-n20-E4-infobatch-p30-r0.6-s0",
        "pairs-n20-E4-seta-rule-p30-noiseTrue-r0.15-s0",
        "pairs-n20-E4-random-rule-p50-noiseTrue-r0.4-s0",
    ]
    assert len({j.rid for j in jobs}) == len(jobs)
    # --only keeps the selected runs and what they need that is not done (the calibration is)
    ctx.only = r"pairs-n20-E4-seta-p30-.*-s1"
    assert [j.rid for j in H.todo(ctx, ns.plan(ctx))] == [
        "pairs-n20-E4-full-full-default-s0",
        "pairs-n20-E4-seta-p30-alpha0.6-k5-r0.0-s1",
    ]
    (ctx.results / "pairs-n20-E4-cal-base.json").unlink()
    assert [j.rid for j in H.todo(ctx, ns.plan(ctx))] == [
        "pairs-n20-E4-full-full-default-s0",
        "pairs-n20-E4-cal-base",
        "pairs-n20-E4-seta-p30-tbd-s1",
    ]


def test_backfilling_keeps_processes_for_the_runs_that_wait_for_a_calibration(tmp_path: Path) -> None:
    ctx = ns.Ctx(results=tmp_path / "r", out=tmp_path / "o", epochs=4, labels=False, procs=3)
    ctx.results.mkdir()
    now = time.time()
    held = []
    for rid in ("pairs-n20-E4-full-full-default-s0", "pairs-n20-E4-full-full2E-default-s0"):  # "two other processes"
        held.append(H.claim(ctx.claims / f"{rid}.lock", wait=False))
        (ctx.claims / f"{rid}.started").write_text(repr(now))
    try:
        picked = [j.rid for j in H.pick(ctx, H.todo(ctx, ns.plan(ctx)), now, ns.PRIOR_RATE)]
        ctx.procs = 20  # enough processes free by then: nothing is held back
        many = [j.rid for j in H.pick(ctx, H.todo(ctx, ns.plan(ctx)), now, ns.PRIOR_RATE)]
    finally:
        for h in held:
            assert h is not None
            h.close()
    # one other process is free when full data of seed 0 ends, but the calibrations then ready
    # want two: a run ending after that (full data at 2E) waits; one ending by then (full data at E
    # of 0% mismatched) or before (random at 50%) starts; what others train is not offered
    assert "pairs-n0-E4-full-full2E-default-s0" not in picked
    assert "pairs-n0-E4-full-full-default-s0" in picked and "pairs-n20-E4-random-p50-r0.5-s0" in picked
    assert "pairs-n20-E4-full-full-default-s0" not in picked
    assert "pairs-n0-E4-full-full2E-default-s0" in many


_WORKER = r"""
import json, os, sys, time
from pathlib import Path
import studies.quality.noise as ns
from studies.quality import harness as H

root = Path(sys.argv[1])
CAL_BASE, CAL_RULE = json.loads(sys.argv[2]), json.loads(sys.argv[3])

def fake_execute(ctx, job, run):
    with open(root / "log", "a") as f:
        f.write(f"{os.getpid()} {job.rid} {' '.join(n for n in job.needs if not H.done(ctx, n))}\n")
    time.sleep(0.05)
    out = CAL_BASE if job.rid.endswith("cal-base") else CAL_RULE if "-cal-" in job.rid else {"id": job.rid}
    H.write_json(ctx.results / f"{job.rid}.json", out)

H.execute = fake_execute
H.worker(ns.Ctx(results=root / "results", out=root / "out", epochs=4, labels=False, procs=2), ns)
"""


def test_two_processes_share_the_plan_and_run_each_job_once(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    argv = [sys.executable, "-c", _WORKER, str(tmp_path), json.dumps(CAL_BASE), json.dumps(CAL_RULE)]
    procs = [subprocess.Popen(argv, env=env) for _ in range(2)]
    assert [p.wait(timeout=300) for p in procs] == [0, 0]
    log = [line.split() for line in (tmp_path / "log").read_text().splitlines()]
    ran = [x[1] for x in log]
    ctx = ns.Ctx(results=tmp_path / "results", out=tmp_path / "out", epochs=4, labels=False)
    planned = [j.rid for j in ns.plan(ctx)]
    assert sorted(ran) == sorted(planned)  # each job once, none left, none pending
    assert all(len(x) == 2 for x in log)  # no job started before its needs were in
    assert {x[0] for x in log} == {str(p.pid) for p in procs}


def test_a_crash_and_a_deadline_leave_files_that_are_not_results(tmp_path: Path, monkeypatch) -> None:
    ctx = ns.Ctx(results=tmp_path / "r", out=tmp_path / "o", epochs=4, labels=False)
    ctx.results.mkdir()
    job = ns.plan(ctx)[0]

    def crash(ctx: ns.Ctx, job: ns.Job, progress: list) -> dict:
        progress.append("epoch 0")
        raise ValueError("boom")

    monkeypatch.setattr(ns, "train_pairs_job", crash)
    monkeypatch.setattr(H, "machine", lambda: MACHINE)
    H.execute(ctx, job, ns.run)
    crashed = json.loads((ctx.results / f"{job.rid}.crashed.json").read_text())
    assert (crashed["status"], crashed["epochs_done"]) == ("crashed", 1) and "ValueError: boom" in crashed["error"]
    assert not H.done(ctx, job.rid) and H.failed_here(ctx, job.rid)
    assert job.rid not in [j.rid for j in H.todo(ctx, ns.plan(ctx))]  # not again in this invocation
    later = ns.Ctx(results=ctx.results, out=ctx.out, epochs=4, labels=False)  # the next invocation
    assert job.rid in [j.rid for j in H.todo(later, ns.plan(later))]

    def slow(ctx: ns.Ctx, job: ns.Job, progress: list) -> dict:
        progress.append("epoch 0")
        time.sleep(5)
        return {}

    import signal

    signal.signal(signal.SIGALRM, H.on_alarm)
    monkeypatch.setattr(ns, "train_pairs_job", slow)
    ctx.until = time.time() + 1
    H.execute(ctx, job, ns.run)
    cut = json.loads((ctx.results / f"{job.rid}.cut.json").read_text())
    assert (cut["status"], cut["epochs_done"]) == ("cut_short", 1) and not H.done(ctx, job.rid)


# ------------------------------------------------------------------------------ the report
def pairs_run(
    noise,
    policy,
    label,
    params,
    seed,
    r1,
    pruned,
    *,
    epochs=4,
    after=0.2,
    prec=None,
    rec=None,
    status="ok",
    machine=MACHINE,
) -> dict:
    """A pairs run file: R@1 rises one point an epoch to ``r1``; the rule active from epoch 1 on,
    where ``after`` of the trained pairs are mismatched (``noise`` before)."""
    rows = []
    for e in range(epochs):
        active = bool(params.get("noise")) and e >= 1
        kept = round(100 * (1 - pruned))
        mism = round(kept * (after if active else noise))
        r = (r1 - (epochs - 1 - e)) / 100
        rows.append(
            {
                "epoch": e,
                "kept": kept,
                "n": 100,
                "trained": kept,
                "mismatched_trained": mism,
                "mismatched_share": mism / kept,
                "loss": 1.0,
                "i2t_r1": r,
                "t2i_r1": r,
                "i2t_r5": 0.9,
                "t2i_r5": 0.9,
                "delivered_equals_plan": True,
                "suspected": 20 if active else 0,
                "precision": prec if active else None,
                "recall": rec if active else None,
                "noise_active": active if params.get("noise") else None,
            }
        )
    return {
        "study": "noise-pairs",
        "status": status,
        "noise": noise,
        "E": 4,
        "policy": policy,
        "params": params,
        "label": label,
        "epochs": epochs,
        "seed": seed,
        "rows": rows,
        "i2t_r1": r1 / 100,
        "t2i_r1": r1 / 100,
        "i2t_r5": 0.9,
        "t2i_r5": 0.9,
        "pruned": pruned,
        "seconds": 10.0,
        "machine": machine,
        "id": ns.pairs_rid(noise, 4, ns.pairs_cfg(policy, params, label, epochs), seed),
        "data": {"train": 100, "test": 10, "shard_size": 50, "size": 32, "noise": noise},
        "train": {"epochs": epochs, "batch_size": 128, "lr": 0.002, "workers": 1},
    }


def _synthetic(tmp_path: Path, change: Callable[[list[dict]], None] | None = None) -> str:
    res = tmp_path / "results"
    res.mkdir()
    runs = []
    for s, (f, f2) in enumerate([(40.0, 40.5), (42.0, 42.9)]):
        runs += [
            pairs_run(0.2, "full", "full", {}, s, f, 0.0),
            pairs_run(0.2, "full", "full2E", {}, s, f2, 0.0, epochs=8),
            pairs_run(0.2, "full", "rule", {"noise": True}, s, f + 2 + s, 0.15, after=0.01, prec=0.95, rec=0.92),
            pairs_run(0.2, "random", "p30", {"r": 0.3}, s, f - 3, 0.3),
            pairs_run(0.2, "random", "p50", {"r": 0.5}, s, f - 6, 0.5),
            pairs_run(
                0.2,
                "random",
                "rule-p30",
                {"noise": True, "r": 0.2},
                s,
                f + 1.5 + s,
                0.31,
                after=0.06,
                prec=0.9,
                rec=0.85,
            ),
            pairs_run(
                0.2,
                "seta",
                "rule-p50",
                {"noise": True, "alpha": 0.3, "k": 10, "r": 0.0},
                s,
                f + 3.5 + 0.2 * s,
                0.45,
                after=0.02,
                prec=0.93,
                rec=0.91,
            ),
            # above the bars on the mean only: the seeds differ by more than the mean clears them
            pairs_run(
                0.2,
                "infobatch",
                "rule-p30",
                {"noise": True, "r": 0.5},
                s,
                f + 3 + 2 * s,
                0.3,
                after=0.03 + 0.03 * s,
                prec=0.93 - 0.04 * s,
                rec=0.95,
            ),
            pairs_run(0.0, "full", "full", {}, s, f + 10, 0.0),
            pairs_run(0.0, "random", "p30", {"r": 0.3}, s, f + 7, 0.3),
            pairs_run(0.0, "random", "rule-p30", {"noise": True, "r": 0.3}, s, f + 6 - 2 * s, 0.3),
        ]
    runs.append(pairs_run(0.2, "seta", "p30", {"alpha": 0.6, "k": 5, "r": 0.0}, 0, 99.0, 0.3, status="diverged"))
    other = {**MACHINE, "cpu": "Other CPU"}
    runs.append(pairs_run(0.2, "seta", "p30", {"alpha": 0.6, "k": 5, "r": 0.0}, 1, 99.0, 0.3, machine=other))
    if change is not None:
        change(runs)
    for r in runs:
        (res / f"{r['id']}.json").write_text(json.dumps(r))
    (res / "pairs-n20-E4-infobatch-p30-r0.6-s0.crashed.json").write_text(
        json.dumps(
            {
                "id": "pairs-n20-E4-infobatch-p30-r0.6-s0",
                "status": "crashed",
                "epochs_done": 2,
                "error": "Traceback (most recent call last):\nValueError: boom\n",
            }
        )
    )
    (res / "pairs-n20-E4-random-p30-r0.3-s2.cut.json").write_text(
        json.dumps({"id": "pairs-n20-E4-random-p30-r0.3-s2", "status": "cut_short", "epochs_done": 1})
    )
    ctx = ns.Ctx(results=res, out=tmp_path / "out", epochs=4, labels=False)
    ns.report(ctx, tmp_path / "pairs.md", tmp_path / "labels.md")
    return (tmp_path / "pairs.md").read_text()


def test_the_report_of_synthetic_runs(tmp_path: Path) -> None:
    doc = _synthetic(tmp_path)
    lines = doc.splitlines()
    assert lines[:4] == [
        "",
        "",
        nr.BEGIN,
        "22 finished pairs runs enter the tables below; all ran on one machine: Test CPU, 16 cores, torch 2.13.0 "
        "(AVX2).",
    ]
    expected = [
        # the convergence check, paired by seed
        "Full data at E = 4: 41.0, at 2E = 8: 41.7 (mean R@1 over seeds 0, 1); 2E - E +0.7 (+0.5, +0.9): at most 1.0 "
        "point: full data's R@1 has stopped rising at E.",
        "| E = 4 | 0 | 37.0 | 38.0 | 39.0 | 40.0 |  |  |  |  |",
        # the tables: paired gaps to full data and to random at the same pruned %
        "| rule alone | noise=True | 2 | 15.0 ± 0.0 | 43.5 ± 2.1 | 43.5 ± 2.1 | 90.0 ± 0.0 | 90.0 ± 0.0 "
        "| +2.5 (+2.0, +3.0) | +4.0 (+3.5, +4.5) | 5.9 / 1.2 | 0.95 / 0.92 |",
        "| rule + random | noise=True, r=0.2 | 2 | 31.0 ± 0.0 | 43.0 ± 2.1 | 43.0 ± 2.1 | 90.0 ± 0.0 | 90.0 ± 0.0 "
        "| +2.0 (+1.5, +2.5) | +5.1 (+4.6, +5.6) | 9.4 / 5.8 | 0.90 / 0.85 |",
        "| rule + random | noise=True, r=0.2 | 20.3 | 5.8 | 5.8 | 5.8 |",
        "| rule alone | noise=True | 0: -/- | 20: 0.95/0.92 | 20: 0.95/0.92 | 20: 0.95/0.92 |",
        # the targets: met, and missed by how much
        "| mean R@1 >= full data + 3 points at >= 25% fewer pairs (20% mismatched) | rule + random noise=True, r=0.2 "
        "| +2.0 (+1.5, +2.5) points at 31.0% pruned (2 SE = 1.0) | missed by 1.0 points |",
        "| mean R@1 >= full data + 3 points at >= 25% fewer pairs (20% mismatched) | rule + seta alpha=0.3, k=10, "
        "noise=True, r=0.0 | +3.6 (+3.5, +3.7) points at 45.0% pruned (2 SE = 0.2) | met |",
        "| mismatched < 5% of trained pairs after the warm-up | rule alone noise=True | 1.2% (1.2, 1.2) | met |",
        "| mismatched < 5% of trained pairs after the warm-up | rule + random noise=True, r=0.2 | 5.8% (5.8, 5.8) "
        "| missed by 0.8 points |",
        "| recall of the suspected set >= 0.9 | rule + random noise=True, r=0.2 | 0.850 (0.850, 0.850) "
        "| missed by 0.050 |",
        "| clean pairs: mean R@1 no worse than dynamic random at the same pruned % | rule + random noise=True, r=0.3 "
        "| -2.0 (-1.0, -3.0) points (2 SE = 2.0) | mean below, not resolved |",  # at 2 SE exactly
        # met only where mean - 2 SE clears the bar (mean + 2 SE where the bar is one to stay under)
        "| mean R@1 >= full data + 3 points at >= 25% fewer pairs (20% mismatched) | rule + infobatch noise=True, "
        "r=0.5 | +4.0 (+3.0, +5.0) points at 30.0% pruned (2 SE = 2.0) | mean above, not resolved (mean - 2 SE = "
        "2.0 points) |",
        "| mismatched < 5% of trained pairs after the warm-up | rule + infobatch noise=True, r=0.5 | 4.3% (2.9, 5.7) "
        "| mean under, not resolved (mean + 2 SE = 7.1 points) |",
        "| precision of the suspected set >= 0.9 | rule + infobatch noise=True, r=0.5 | 0.910 (0.930, 0.890) "
        "| mean above, not resolved (mean - 2 SE = 0.870) |",
        "| recall of the suspected set >= 0.9 | rule + infobatch noise=True, r=0.5 | 0.950 (0.950, 0.950) | met |",
        # left out, with the rule stated
        "* `pairs-n20-E4-seta-p30-alpha0.6-k5-r0.0-s0`: diverged (a non-finite training loss); left out",
        "* `pairs-n20-E4-seta-p30-alpha0.6-k5-r0.0-s1`: ran on another machine (Other CPU, 16 cores, torch 2.13.0 "
        "(AVX2)) than the other runs it is compared with; not compared",
        "* `pairs-n20-E4-infobatch-p30-r0.6-s0`: crashed after 2 epochs (ValueError: boom); no result",
        "* `pairs-n20-E4-random-p30-r0.3-s2`: cut short at the deadline after 1 epoch; no result",
    ]
    for line in expected:
        assert line in lines, line
    assert "crashed runs, runs cut short at a deadline, diverged runs and runs from another machine are listed" in doc
    assert "99.0" not in doc  # the excluded runs' numbers are nowhere


def test_a_clean_pairs_run_worse_than_random_beyond_the_noise_misses_by_how_much(tmp_path: Path) -> None:
    res = tmp_path / "results"
    res.mkdir()
    for s in (0, 1):
        for r in (
            pairs_run(0.0, "full", "full", {}, s, 50.0, 0.0),
            pairs_run(0.0, "random", "p30", {"r": 0.3}, s, 47.0, 0.3),
            pairs_run(0.0, "random", "rule-p30", {"noise": True, "r": 0.3}, s, 44.0 - 0.2 * s, 0.3),
        ):
            (res / f"{r['id']}.json").write_text(json.dumps(r))
        # a rule configuration whose rule suspected nothing: the gap is the policy's own
        silent = pairs_run(0.0, "seta", "rule-p30", {"noise": True, "alpha": 0.4, "k": 10, "r": 0.0}, s, 43.0, 0.3)
        for row in silent["rows"]:
            row["suspected"] = 0
        (res / f"{silent['id']}.json").write_text(json.dumps(silent))
    ctx = ns.Ctx(results=res, out=tmp_path / "out", epochs=4, labels=False)
    ns.report(ctx, tmp_path / "pairs.md", tmp_path / "labels.md")
    lines = (tmp_path / "pairs.md").read_text().splitlines()
    assert (
        "| clean pairs: mean R@1 no worse than dynamic random at the same pruned % | rule + random noise=True, r=0.3 "
        "| -3.1 (-3.0, -3.2) points (2 SE = 0.2) | missed: 3.1 points below, beyond the noise |"
    ) in lines
    assert (
        "| clean pairs: mean R@1 no worse than dynamic random at the same pruned % | rule + seta alpha=0.4, k=10, "
        "noise=True, r=0.0 | -4.0 (-4.0, -4.0) points (2 SE = 0.0) | missed: 4.0 points below, beyond the noise; the "
        "rule suspected nothing in any plan: these are seta's own plans at alpha=0.4, k=10, r=0.0 |"
    ) in lines


def test_every_table_marks_a_run_that_collapsed_or_fell_20_points(tmp_path: Path) -> None:
    """The instability scan's mark: seed 1 of rule + seta at 50% falls to chance (held-out pairs: 10,
    chance 10%) after epoch 1; every table that shows the configuration marks its row, and a
    footnote under it names the file."""

    def collapse(runs: list[dict]) -> None:
        r = next(r for r in runs if r["label"] == "rule-p50" and r["seed"] == 1)
        r["rows"][2]["i2t_r1"] = r["rows"][2]["t2i_r1"] = 0.1

    lines = _synthetic(tmp_path, collapse).splitlines()
    name = "rule + seta †"
    marked = [x for x in lines if x.startswith(("| ", "| mean R@1")) and "†" in x]
    assert {x.split(" | ")[0 if x.startswith(f"| {name}") else 1].lstrip("| ") for x in marked} == {
        name,
        f"{name} alpha=0.3, k=10, noise=True, r=0.0",
    }
    rid = "pairs-n20-E4-seta-rule-p50-alpha0.3-k10-noiseTrue-r0.0-s1"
    note = (
        "† a run of this configuration collapsed to chance, fell 20 points or more in one epoch, diverged or was cut "
        f"short (instability scan, `docs/quality-runs/instability.json`): `{rid}.json` (collapse at e2; drop at e2 "
        "(43.7 -> 10.0))."
    )
    tables = sum(1 for i, x in enumerate(lines) if x.startswith("| policy | setting") and any(
        y.startswith(f"| {name}") for y in lines[i:lines.index("", i)]))  # fmt: skip
    assert tables == 5 and lines.count(note) == tables + 1  # the main table, 4 per-epoch tables, the targets
    assert sum(x.startswith(f"| {name}") for x in lines) == 5
    assert not any("†" in x for x in lines if x.startswith("| rule alone"))


def test_the_report_replaces_only_its_own_section(tmp_path: Path) -> None:
    doc = tmp_path / "d.md"
    doc.write_text(f"# title\n\nprose\n\n{nr.BEGIN}\nold\n{nr.END}\n\nmore prose\n")
    nr.splice(doc, ["new"])
    assert doc.read_text() == f"# title\n\nprose\n\n{nr.BEGIN}\nnew\n{nr.END}\n\nmore prose\n"


@pytest.mark.parametrize(
    "values, verdict",
    [
        ([3.3, 3.5], "met"),  # mean 3.4, 2 SE = 0.2 (with 2 seeds: their difference): 3.2 clears 3
        ([3.1, 3.1], "met"),  # identical seeds: 2 SE = 0
        ([4.9, 3.4], "mean above, not resolved (mean - 2 SE = 2.6 points)"),  # issue 33's row
        ([2.0, 2.4], "missed by 0.8 points"),
        ([5.0], "open (1 seed)"),
    ],
)
def test_verdicts(values: list[float], verdict: str) -> None:
    assert nr.target_verdict(values, 3.0, "points") == verdict


def test_verdicts_on_a_bar_to_stay_under_and_at_the_bar() -> None:
    assert nr.target_verdict([0.03, 0.035], 0.05, "points", scale=100, under=True) == "met"
    assert nr.target_verdict([0.02, 0.06], 0.05, "points", scale=100, under=True) == (
        "mean under, not resolved (mean + 2 SE = 8.0 points)")  # fmt: skip
    assert nr.target_verdict([0.06, 0.06], 0.05, "points", scale=100, under=True) == "missed by 1.0 points"
    assert nr.target_verdict([0.5, -0.5], 0.0, "points", digits=2) == "missed by 0.00 points"
    assert nr.target_verdict([1.0, 1.0], 0.0, "points") == "met"
    assert nr.target_verdict([0.0, 0.0], 0.0, "points") == "at the bar"  # identical runs: neither met nor missed
    assert nr.target_verdict([1.0, 3.0], 1.0, "points") == "mean above, not resolved (mean - 2 SE = 0.0 points)"


def labels_run(dataset, policy, label, params, seed, acc, pruned, *, noisy_after=0.4, prec=None, rec=None) -> dict:
    """A noisy-label run file: 3 epochs, the rule active from epoch 1 on."""
    from studies.quality.configs import run_id

    rows = []
    for e in range(3):
        active = bool(params.get("noise")) and e >= 1
        kept = round(1000 * (1 - pruned))
        rows.append(
            {
                "epoch": e,
                "n": 1000,
                "kept": kept,
                "streamed": kept,
                "backprop": kept,
                "train_loss": 1.0,
                "plan_kept": kept,
                "plan_noisy_kept": round(kept * (noisy_after if active else 0.4)),
                "suspected": 400 if active else 0,
                "precision": prec if active else None,
                "recall": rec if active else None,
                "noise_active": active if params.get("noise") else None,
                "delivered_equals_plan": True,
            }
        )
    cfg = {"policy": policy, "params": params, "label": label, "noisy": True}
    return {
        "study": "noise-labels",
        "status": "ok",
        "dataset": dataset,
        **cfg,
        "seed": seed,
        "rows": rows,
        "pruned": pruned,
        "test_acc": acc / 100,
        "val_acc": acc / 100,
        "seconds": 5.0,
        "machine": MACHINE,
        "id": run_id(dataset, cfg, seed),
    }


def test_the_noisy_label_report_says_whether_the_rule_beats_full_data(tmp_path: Path) -> None:
    res = tmp_path / "results"
    res.mkdir()
    rule = {"noise": True}
    for s, f in ((0, 60.0), (1, 61.0)):
        for r in (
            labels_run("cifar10", "full", "nz-full", {}, s, f, 0.0),
            labels_run("cifar10", "full", "nz-rule", rule, s, f + 4 + s, 0.27, noisy_after=0.02, prec=0.97, rec=0.95),
            labels_run("cifar10", "random", "nz-rule-p50", {**rule, "r": 0.3}, s, f + 0.5 - s, 0.5),
            labels_run("cifar10", "random", "nz-p50", {"r": 0.5}, s, f - 3, 0.5),
            # another data set trained on another machine: compared only within its own data set
            {**labels_run("sst2", "full", "nz-full", {}, s, f, 0.0), "machine": {**MACHINE, "cpu": "Other CPU"}},
        ):
            (res / f"{r['id']}.json").write_text(json.dumps(r))
    ctx = ns.Ctx(results=res, out=tmp_path / "out", epochs=4, labels=True)
    ns.report(ctx, tmp_path / "pairs.md", tmp_path / "labels.md")
    lines = (tmp_path / "labels.md").read_text().splitlines()
    assert lines[3] == (
        "10 finished noisy-label runs enter the tables below; the runs of each data set ran on one machine "
        "(cifar10: Test CPU, 16 cores, torch 2.13.0 (AVX2); sst2: Other CPU, 16 cores, torch 2.13.0 (AVX2)), and "
        "only runs of one data set and schedule are compared."
    )
    assert "ran on another machine" not in "\n".join(lines)
    for line in [
        "**Loader vs plan:** in 30 of 30 run-epochs the loader delivered exactly the plan's kept samples.",
        "| rule alone | noise=True | 2 | 27.0 ± 0.0 | 65.00 ± 1.41 | 65.00 ± 1.41 | +4.50 (+4.00, +5.00) "
        "| +6.12 (+5.62, +6.62) | 14.7 / 2.1 | 0.97 / 0.95 |",
        "| CIFAR-10 with 40% noisy labels, 3 epochs: test accuracy above full data | rule alone noise=True "
        "| +4.50 (+4.00, +5.00) points (2 SE = 1.00) | met |",
        "| CIFAR-10 with 40% noisy labels, 3 epochs: test accuracy above full data | rule + random noise=True, r=0.3 "
        "| +0.00 (+0.50, -0.50) points (2 SE = 1.00) | missed by 0.00 points |",
    ]:
        assert line in lines, line


def test_the_report_shows_how_e_was_chosen(tmp_path: Path) -> None:
    (tmp_path / "e-choice").mkdir(parents=True)
    rows = [{"i2t_r1": x / 100, "t2i_r1": x / 100} for x in (10.0, 30.0, 36.0, 37.2, 36.5, 37.0, 33.0)]
    (tmp_path / "e-choice" / "n20.json").write_text(
        json.dumps({"rows": rows, "seed": 0, "data": {"noise": 0.2, "train": 10000}, "machine": MACHINE})
    )
    lines = nr.e_choice_lines(tmp_path, 3)
    assert lines[2:5] == [
        "| mismatched | pairs | seed | machine | e0 | e1 | e2 | e3 | e4 | e5 | e6 | rose for |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
        "| 20% mismatched | 10,000 | 0 | Test CPU, 16 cores, torch 2.13.0 (AVX2) | 10.0 | 30.0 | 36.0 | 37.2 | 36.5 "
        "| 37.0 | 33.0 | 4 of 7 epochs |",
    ]
    assert lines[6] == (
        "The study's E = 3 is shorter than the 4 epochs the 20% mismatched set rose for: its comparisons are before "
        "convergence (the 2E check below measures by how much)."
    )
    assert nr.e_choice_lines(tmp_path, 4)[6] == "The study's E = 4 covers the 4 epochs the 20% mismatched set rose for."


def test_the_readme_block_holds_the_targets_every_seed_measured(tmp_path: Path) -> None:
    _synthetic(tmp_path)
    files = nr.load_files(tmp_path / "results")
    lines = nr.readme_lines(files)
    assert lines[0].startswith(
        "Measured by `studies/noise_study.py` (22 finished pairs runs of 100 pairs, E = 4, seeds 0, 1, on one "
        "machine: Test CPU, 16 cores, torch 2.13.0 (AVX2);"
    )
    rows = [line for line in lines if line.startswith("| ") and not line.startswith(("| target", "| ---"))]
    assert (
        "| mismatched < 5% of trained pairs after the warm-up | rule + random noise=True, r=0.2 | 5.8% (5.8, 5.8) "
        "| missed by 0.8 points |" in rows
    )
    assert (
        "| mean R@1 >= full data + 3 points at >= 25% fewer pairs (20% mismatched) | rule + seta alpha=0.3, k=10, "
        "noise=True, r=0.0 | +3.6 (+3.5, +3.7) points at 45.0% pruned (2 SE = 0.2) | met |" in rows
    )
    assert not [row for row in rows if "open" in row.rsplit("|", 2)[-2]]  # rows waiting for seeds stay in the doc
    assert "99.0" not in "\n".join(lines)


def test_the_long_noisy_label_schedule_is_its_own_comparison_with_its_curve(tmp_path: Path) -> None:
    """Runs of the long schedule (more epochs, no augmentation) are compared only with each other;
    their test accuracy after every epoch shows whether full data stopped rising and by how much it
    fell from its best."""
    res = tmp_path / "results"
    res.mkdir()
    rule = {"noise": True}
    full_curve = [50.0, 60.0, 62.0, 58.0, 55.0]
    rule_curve = [50.0, 60.0, 63.0, 64.0, 65.0]
    for s in (0, 1):
        short = [
            labels_run("cifar10", "full", "nz-full", {}, s, 60.0, 0.0),
            labels_run("cifar10", "full", "nz-rule", rule, s, 59.0 - s, 0.1, noisy_after=0.2, prec=0.7, rec=0.9),
        ]
        long = []
        for label, params, curve, pruned in (("nz-noaug-E5", {}, full_curve, 0.0),
                                             ("nz-rule-noaug-E5", rule, rule_curve, 0.3)):  # fmt: skip
            r = labels_run("cifar10", "full", label, params, s, curve[-1] + s, pruned, noisy_after=0.05, prec=0.8,
                           rec=0.95)  # fmt: skip
            r["rows"] = [{**r["rows"][min(e, 2)], "epoch": e, "test_acc": (x + s) / 100} for e, x in enumerate(curve)]
            r.update(augment=False, n_epochs=5, curve=True)
            long.append(r)
        for r in short + long:
            (res / f"{r['id']}.json").write_text(json.dumps(r))
    ctx = ns.Ctx(results=res, out=tmp_path / "out", epochs=4, labels=True)
    ns.report(ctx, tmp_path / "pairs.md", tmp_path / "labels.md")
    lines = (tmp_path / "labels.md").read_text().splitlines()
    heads = [x for x in lines if x.startswith("#### ")]
    assert heads == [
        "#### cifar10, 40% noisy labels (3 epochs)",
        "#### cifar10, 40% noisy labels (5 epochs, no augmentation)",
        "#### Target (issue 26)",
    ]
    for line in [
        "| full | - | 2 | 0.0 ± 0.0 | 55.50 ± 0.71 | 55.50 ± 0.71 | - | - | 40.0 | - |",
        "| rule alone | noise=True | 2 | 30.0 ± 0.0 | 65.50 ± 0.71 | 65.50 ± 0.71 | +10.00 (+10.00, +10.00) | - "
        "| 12.0 / 5.0 | 0.80 / 0.95 |",
        "| full | - | 50.5 | 60.5 | 62.5 | 58.5 | 55.5 | e2 (62.5) | -7.0 |",
        "| rule alone | noise=True | 50.5 | 60.5 | 63.5 | 64.5 | 65.5 | e4 (65.5) | +0.0 |",
        "| CIFAR-10 with 40% noisy labels, 3 epochs: test accuracy above full data | rule alone noise=True "
        "| -1.50 (-1.00, -2.00) points (2 SE = 1.00) | missed by 1.50 points |",
        "| CIFAR-10 with 40% noisy labels, 5 epochs: test accuracy above full data | rule alone noise=True "
        "| +10.00 (+10.00, +10.00) points (2 SE = 0.00) | met |",
    ]:
        assert line in lines, line
    # the short schedule has no curve; the long one's table follows its own section
    assert lines.index("Test accuracy after every epoch (%, mean over seeds):") > lines.index(heads[1])
    assert lines.count("Test accuracy after every epoch (%, mean over seeds):") == 1


def test_the_long_noisy_label_runs_have_ids_of_their_own() -> None:
    from studies.quality.configs import noise_label_configs, noise_label_long_configs, run_id

    long = [run_id("cifar10", c, 0) for c in noise_label_long_configs()]
    assert long == [
        "cifar10-noisy-full-nz-noaug-E20-default-s0",
        "cifar10-noisy-full-nz-rule-noaug-E20-noiseTrue-s0",
        "cifar10-noisy-full-nz-rule-log1p-noaug-E20-noiseTrue-noise_scalelog1p-s0",
    ]
    assert not set(long) & {run_id("cifar10", c, 0) for c in noise_label_configs(None, None)}
    assert {(c["n_epochs"], c["augment"], c["curve"]) for c in noise_label_long_configs()} == {(20, False, True)}


def test_a_replica_on_another_machine_gets_a_section_of_its_own(tmp_path: Path) -> None:
    """The pairs study run again on another machine (a folder ``noise-study-<machine>`` beside the
    study's) is reported in its own section and never compared with the study's runs."""
    main, rep = tmp_path / "noise-study", tmp_path / "noise-study-2core"
    other = {**MACHINE, "cpu": "Other CPU", "cores": 2}
    for folder, machine, f in ((main, MACHINE, 40.0), (rep, other, 30.0)):
        folder.mkdir()
        for r in (
            pairs_run(0.2, "full", "full", {}, 0, f, 0.0, machine=machine),
            pairs_run(
                0.2, "full", "rule", {"noise": True}, 0, f + 5, 0.2, after=0.01, prec=0.95, rec=0.9, machine=machine
            ),  # fmt: skip
        ):
            (folder / f"{r['id']}.json").write_text(json.dumps(r))
    assert nr.pairs_folders(main) == [main, rep]
    assert nr.pairs_folders(rep) == [rep]
    assert nr.pairs_markers(rep) == ("<!-- noise:noise-study-2core:begin -->", "<!-- noise:noise-study-2core:end -->")
    doc = tmp_path / "pairs.md"
    ns.report(ns.Ctx(results=main, out=tmp_path / "out", epochs=4, labels=False), doc, tmp_path / "labels.md")
    text = doc.read_text()
    head, _, tail = text.partition("<!-- noise:noise-study-2core:begin -->")
    assert "2 finished pairs runs enter the tables below; all ran on one machine: Test CPU, 16 cores" in head
    assert "2 finished pairs runs enter the tables below; all ran on one machine: Other CPU, 2 cores" in tail
    assert "Other CPU" not in head and "Test CPU" not in tail
    assert "| rule alone | noise=True | 1 | 20.0 | 45.0 | 45.0 | 90.0 | 90.0 | +5.0 (+5.0) |" in head
    assert "| rule alone | noise=True | 1 | 20.0 | 35.0 | 35.0 | 90.0 | 90.0 | +5.0 (+5.0) |" in tail
    # the replica's report alone rewrites its own section, nothing else
    r = pairs_run(0.2, "random", "p30", {"r": 0.3}, 0, 20.0, 0.3, machine=other)
    (rep / f"{r['id']}.json").write_text(json.dumps(r))
    ns.report(ns.Ctx(results=rep, out=tmp_path / "out", epochs=4, labels=False), doc, tmp_path / "labels.md")
    head2, _, tail2 = doc.read_text().partition("<!-- noise:noise-study-2core:begin -->")
    assert head2 == head
    assert "3 finished pairs runs enter the tables below; all ran on one machine: Other CPU, 2 cores" in tail2


def test_the_rule_at_2e_is_shown_beside_full_data_at_2e_and_kept_out_of_the_e_tables(tmp_path: Path) -> None:
    rs = []
    for s in (0, 1):
        rs += [
            pairs_run(0.0, "full", "full", {}, s, 50.0 + s, 0.0),
            pairs_run(0.0, "full", "full2E", {}, s, 60.0 + s, 0.0, epochs=8),
            pairs_run(0.0, "full", "rule2E", {"noise": True}, s, 59.0 + 2 * s, 0.05, epochs=8),
        ]
    lines = nr.pairs_level(rs, 0.0)
    assert "The rule alone at 2E = 8 epochs, beside full data at 2E (same seeds):" in lines
    assert "| rule alone | noise=True | 2 | 5.0 ± 0.0 | 60.0 ± 1.4 | -0.5 (-1.0, +0.0) | 20, 20 | - | - |" in lines
    main = lines[lines.index("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |") + 1 :]
    assert [x.split(" | ")[0] for x in main[: main.index("")]] == ["| full"]  # the 2E runs stay out of E's table


def test_readme_sums_up_the_study_with_the_most_runs_and_names_the_other(tmp_path: Path) -> None:
    main, rep = tmp_path / "noise-study", tmp_path / "noise-study-2core"
    other = {**MACHINE, "cpu": "Other CPU", "cores": 2}
    for folder, machine, n in ((main, MACHINE, 1), (rep, other, 2)):
        folder.mkdir()
        for s in range(n):
            r = pairs_run(0.2, "full", "full", {}, s, 40.0, 0.0, machine=machine)
            (folder / f"{r['id']}.json").write_text(json.dumps(r))
    studies = [(n, f, nr.load_files(f)) for n, f in ((1, main), (2, rep))]
    lines = nr.readme_summary(studies, tmp_path)
    assert lines[0].startswith(
        "Measured by `studies/noise_study.py` (2 finished pairs runs of 100 pairs, E = 4, seeds 0, 1, on one "
        "machine: Other CPU, 2 cores, torch 2.13.0 (AVX2); generated from `noise-study-2core/`"
    )
    assert lines[-1] == (
        "The same study on another machine (Test CPU, 16 cores, torch 2.13.0 (AVX2), 1 finished pairs run, "
        "`noise-study/`) has its own section in docs/quality-pairs.md."
    )


def test_a_missed_mismatched_share_says_from_which_epoch_it_is_under_5_percent() -> None:
    runs = []
    for s in (0, 1):
        r = pairs_run(0.2, "random", "rule-p30", {"noise": True, "r": 0.2}, s, 40.0, 0.3, epochs=6)
        for row, share in zip(r["rows"][1:], (0.12, 0.06, 0.04, 0.03, 0.03)):
            row["mismatched_trained"] = round(row["trained"] * share)
        runs.append(r)
    assert nr.under_from(runs) == (
        "; under 5% in every epoch from e3 on, above it in the rule's first active epochs (e1 11.4%, e2 5.7%)"
    )
    row = next(x for x in nr.pairs_targets(runs) if x.startswith("| mismatched < 5%"))
    assert row.endswith("| missed by 0.4 points; under 5% in every epoch from e3 on, above it in the rule's first "
                        "active epochs (e1 11.4%, e2 5.7%) |")  # fmt: skip
