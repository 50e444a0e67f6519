"""studies/baselines_pairs.py: the committed page is the report of the committed result files, and the runner
at a tiny size (a few hundred pairs, 2 epochs) trains what its registry says: the oracle's population is the
training shards less exactly the mismatched pairs, the validation shard is disjoint from training, equal compute
trains exactly the pairs rule + random trained, dynamic random takes its measured pruned fraction, and a second
call trains nothing (finished runs are skipped)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from seta_stream import list_samples
from studies import baselines_pairs as bp
from studies.quality.instability import findings
from tools.results import PROVENANCE

ROOT = Path(__file__).resolve().parent.parent
SMALL = dict(train=300, test=50, shard_size=100, size=32, seed=0)
EPOCHS, B = 2, 32


def test_the_committed_page_is_the_report_of_the_committed_result_files() -> None:
    assert bp.DOC.read_text() == bp.report(bp.Ctx())


def test_every_committed_result_file_names_no_path_of_this_machine_and_has_curves() -> None:
    files = sorted(p for p in bp.RESULTS.glob("*.json") if p.name != PROVENANCE)  # the folder's, no run
    for p in files:
        text = p.read_text()
        assert str(ROOT) not in text and "/tmp/" not in text, p.name
        d = json.loads(text)
        assert {"val_i2t_r1", "val_t2i_r1", "i2t_r1", "t2i_r1", "trained"} <= set(d["rows"][0]), p.name
        assert findings(d, p.name) is not None, p.name  # the instability scan reads it


def test_early_stopping_takes_the_first_of_tied_best_validation_epochs() -> None:
    rows = [{"val_i2t_r1": v, "val_t2i_r1": v} for v in (0.1, 0.3, 0.2, 0.3)]
    assert bp.early_stop_epoch(rows) == 1


def test_verdicts_follow_mean_and_two_se() -> None:
    def row(mean: float, se2: float | None, v: str) -> dict:
        return {"mean": mean, "se2": se2, "verdict": v}

    assert bp.verdict_text(row(3.0, 1.0, "met")) == "met"
    assert bp.verdict_text(row(0.5, 1.0, "mean above, not resolved")) == "mean above, not resolved (mean - 2 SE = -0.5)"
    v = "mean below, not resolved"
    assert bp.verdict_text(row(-0.5, 1.0, v)) == f"{v} (mean + 2 SE = +0.5)"
    assert bp.verdict_text(row(-2.0, 1.0, "below")) == "below (mean + 2 SE = -1.0)"
    v = "one seed: mean above, not resolved"
    assert bp.verdict_text(row(2.0, None, v)) == v
    # gaps() takes mean, 2 SE and the words from common.gap_verdict: gaps 1 and 3: mean 2, SE = sd / sqrt(2) = 1
    runs = {(0.2, "rule-random", s): {"final": f, "es": f} for s, f in ((0, 11.0), (1, 13.0))}
    runs |= {(0.2, "full", s): {"final": 10.0, "es": 10.0} for s in (0, 1)}
    (g,) = [g for g in bp.gaps(runs, 0.2, [0, 1]) if (g["baseline"], g["kind"]) == ("full", "final")]
    assert (g["mean"], round(g["se2"], 6), g["verdict"]) == (2.0, 2.0, "mean above, not resolved")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    import torch

    torch.set_num_threads(1)
    out = tmp_path_factory.mktemp("baselines")
    ctx = bp.Ctx(
        results=out / "results",
        out=out / "out",
        data=dict(SMALL),
        train=dict(epochs=EPOCHS, batch_size=B, lr=2e-3, workers=1),
        rounds=((0.2, 0),),
        extra=None,
        low=((0.05, 0),),
        r=0.19,
        quiet=True,
    )
    first = bp.harness.worker(ctx, bp)  # the studies' runner: the ids it ran, in order
    second = bp.harness.worker(ctx, bp)
    runs = {p.stem: json.loads(p.read_text()) for p in (out / "results").glob("*.json")}
    return ctx, first, second, runs


@pytest.mark.slow
def test_the_runner_trains_the_registry_in_order_once(tiny) -> None:
    ctx, first, second, runs = tiny
    names = ["rule-random", "full", "oracle", "full-equal", "random-same", "rule", "full-equal-rule", "random-rule"]
    assert first == [f"pairs-n20-{m}-s0" for m in names] + [f"pairs-n5-{m}-s0" for m in ("full", "oracle", "rule")]
    assert second == []  # every result file exists: nothing is trained again
    assert {d["status"] for d in runs.values()} == {"ok"}
    # the rule's runs record their suspects over the whole run and every epoch's detection AUC
    for rid in ("pairs-n20-rule-s0", "pairs-n20-rule-random-s0", "pairs-n5-rule-s0"):
        whole = runs[rid]["run_suspects"]
        assert set(whole) == {"suspected", "true_positives", "precision", "recall"}
        assert 0 <= whole["true_positives"] <= whole["suspected"]
        assert runs[rid]["rows"][0]["auc"] is None and all(0 <= r["auc"] <= 1 for r in runs[rid]["rows"][1:])
    assert "run_suspects" not in runs["pairs-n20-full-s0"]
    for rid, d in runs.items():
        text = json.dumps(d)
        assert str(ctx.out) not in text and str(ROOT) not in text, rid
        assert len(d["rows"]) == EPOCHS and {"val_i2t_r1", "val_t2i_r1"} <= set(d["rows"][0])


@pytest.mark.slow
def test_the_validation_shard_is_disjoint_from_training_and_the_oracle_drops_exactly_the_mismatched(tiny) -> None:
    ctx, _, _, runs = tiny
    base = ctx.out / "data-n20"
    shards = sorted((base / "train").glob("*.tar"))
    fit = list_samples(sorted(str(p) for p in (base / "fit" / "train").glob("*.tar")))
    oracle = list_samples(sorted(str(p) for p in (base / "oracle" / "train").glob("*.tar")))
    val = list_samples([str(shards[-1])])
    fit_ids = set(zip(fit.column("shard").to_pylist(), fit.column("key").to_pylist()))
    oracle_ids = set(zip(oracle.column("shard").to_pylist(), oracle.column("key").to_pylist()))
    val_ids = set(zip(val.column("shard").to_pylist(), val.column("key").to_pylist()))
    assert {s for s, _ in val_ids} == {"00002.tar"} and len(val_ids) == 100
    assert fit_ids & val_ids == set() and len(fit_ids) == 200
    noise = pq.read_table(base / "noise.parquet")
    mismatched = set(zip(noise.column("shard").to_pylist(), noise.column("key").to_pylist()))
    assert len(mismatched) == 60  # 20 per shard of 100
    assert oracle_ids == fit_ids - mismatched and len(oracle_ids) == 160
    assert {d["data"]["val_shard"] for d in runs.values()} == {"00002.tar"}
    assert runs["pairs-n20-oracle-s0"]["rows"][0]["n"] == 160
    assert sum(r["mismatched_trained"] for r in runs["pairs-n20-oracle-s0"]["rows"]) == 0
    assert {d["rows"][0]["n"] for k, d in runs.items() if "oracle" not in k} == {200}


@pytest.mark.slow
def test_equal_compute_and_dynamic_random_take_rule_plus_random_of_the_seed(tiny) -> None:
    _, _, _, runs = tiny
    rr, eq, rnd = (runs[f"pairs-n20-{m}-s0"] for m in ("rule-random", "full-equal", "random-same"))
    budget = rr["pairs_trained"]
    assert budget == sum(r["trained"] for r in rr["rows"]) < EPOCHS * 200
    assert (eq["budget"], eq["pairs_trained"]) == (budget, budget)
    assert eq["schedule_epochs"] == budget / 200 and len(eq["rows"]) == math.ceil(budget / 200)
    last = eq["rows"][-1]
    assert last["trained"] == budget - 200 * (len(eq["rows"]) - 1) < last["kept"]
    assert last["last_batch"] == (last["trained"] % B or B)
    assert rnd["params"] == {"r": round(rr["pruned"], 4)}
    assert rr["params"] == {"r": 0.19, "noise": True}


@pytest.mark.slow
def test_the_report_of_the_tiny_runs_holds_their_paired_gaps(tiny) -> None:
    ctx, _, _, runs = tiny
    text = bp.report(ctx)
    r1 = {k: bp.r1(d["rows"][-1]) for k, d in runs.items()}
    gap = r1["pairs-n20-rule-random-s0"] - r1["pairs-n20-full-equal-s0"]
    words = f"one seed: mean {'above' if gap > 0 else 'below' if gap < 0 else 'at the bar'}, not resolved"
    assert f"| full data, equal compute | 1 | {gap:+.1f} (s0) | {gap:+.1f} | n/a (one seed) | {words} |" in text
    assert "Not run (cut by the time limit or not reached): none." in text
    assert "* 20% mismatched (1 seed): " in text


def test_plan_readings_count_the_pairs_not_learnt_from_as_the_suspects() -> None:
    row = dict(epoch=0, n=100, kept=100, learnt=100, mismatched_trained=10, mismatched_learnt=10, noise_suspected=0)
    rows = [row, {**row, "epoch": 1, "kept": 88, "learnt": 84, "mismatched_learnt": 3, "noise_suspected": 16}]
    assert bp.plan_readings(rows) == [
        {"epoch": 0, "suspected": 0, "mismatched": 10, "precision": None, "recall": 0.0},
        {"epoch": 1, "suspected": 16, "mismatched": 10, "precision": 7 / 16, "recall": 0.7},
    ]
    assert bp.plan_readings([{k: v for k, v in row.items() if k != "noise_suspected"}]) == []
    with pytest.raises(ValueError, match="epoch 1: 15 suspected, 16 pairs not learnt from"):
        bp.plan_readings([row, {**rows[1], "noise_suspected": 15}])


@pytest.mark.slow
def test_the_low_share_section_sets_the_rule_beside_full_data(tiny) -> None:
    ctx, _, _, runs = tiny
    text = bp.report(ctx)
    rule, full = runs["pairs-n5-rule-s0"], runs["pairs-n5-full-s0"]
    final, es = bp.r1(rule["rows"][-1]), [bp.r1(r) for r in full["rows"]]
    best = bp.early_stop_epoch(full["rows"])
    # 2 epochs with noise_warmup = 2: no plan can suspect a pair yet
    assert (
        f"| 5% | 0 | 0 of {EPOCHS} (epochs none) | none | 0 (10) | n/a | 0.000 | {final:.1f} | {es[-1]:.1f} | "
        f"{es[best]:.1f} ({best}) | {final - es[best]:+.1f} |"
    ) in text
    low = "* The rule alone at low mismatched shares (its own section below): 5% (1 seed): active in 0 of 2 plans"
    assert low in text


def test_the_plan_needs_rule_random_and_the_report_lists_a_crashed_run(tmp_path: Path) -> None:
    ctx = bp.Ctx(results=tmp_path / "results", out=tmp_path / "out", rounds=((0.2, 1),), extra=None, low=(), r=0.19)
    rr, rule = ("pairs-n20-rule-random-s1",), ("pairs-n20-rule-s1",)
    assert [(j.rid, j.needs) for j in bp.plan(ctx)] == [
        ("pairs-n20-rule-random-s1", ()), ("pairs-n20-full-s1", ()), ("pairs-n20-oracle-s1", ()),
        ("pairs-n20-full-equal-s1", rr), ("pairs-n20-random-same-s1", rr), ("pairs-n20-rule-s1", ()),
        ("pairs-n20-full-equal-rule-s1", rule), ("pairs-n20-random-rule-s1", rule),
    ]  # fmt: skip
    ctx.last_start = ctx.started  # --limit: no run starts after it
    assert bp.harness.worker(ctx, bp) == [] and list(ctx.results.iterdir()) == []

    def crash(ctx: bp.Ctx, job: bp.Job, progress: list[str]) -> dict:
        progress.append("epoch 0")
        raise RuntimeError("no pairs")

    bp.harness.execute(ctx, bp.plan(ctx)[1], crash)  # the runner's own crash file
    assert [p.name for p in ctx.results.iterdir()] == ["pairs-n20-full-s1.crashed.json"]
    assert bp.read(ctx) == {}
    text = bp.report(ctx)
    assert ("* Crashed or cut short (run again by the next invocation): `pairs-n20-full-s1`: crashed after 1 epoch "
            "(RuntimeError: no pairs); no result.\n") in text  # fmt: skip
    assert "pairs-n20-full-s1`, `pairs-n20-oracle-s1" in text  # still not run


def test_the_rule_alone_has_equal_compute_and_dynamic_random_at_its_own_share(tmp_path: Path) -> None:
    """The registry holds full data at equal compute and dynamic random at the rule alone's own pairs trained
    and pruned fraction; the report says "not run" until their files exist, then shows their paired gaps."""
    ctx = bp.Ctx(results=tmp_path, out=tmp_path / "out", rounds=((0.2, 0),), extra=None, low=(), r=0.19)
    needs = {j.rid: j.needs for j in bp.plan(ctx)}
    assert needs["pairs-n20-full-equal-rule-s0"] == needs["pairs-n20-random-rule-s0"] == ("pairs-n20-rule-s0",)
    for m in ("rule-random", "full", "oracle", "full-equal", "random-same", "rule"):
        name = f"pairs-n20-{m}-s0.json"
        (tmp_path / name).write_text((bp.RESULTS / name).read_text())
    rule = json.loads((tmp_path / "pairs-n20-rule-s0.json").read_text())
    eq, rnd = ([m for m in bp.methods(0.19) if m.name == n][0] for n in ("full-equal-rule", "random-rule"))
    assert bp.params_for(ctx, 0.2, 0, eq) == ({}, rule["pairs_trained"])
    assert bp.params_for(ctx, 0.2, 0, rnd) == ({"r": round(rule["pruned"], 4)}, None)
    text = bp.report(ctx)
    label = "full data, equal compute (the rule alone's pairs)"
    assert f"| {label} | 0 | not run (`pairs-n20-full-equal-rule-s0`: no result file yet) | - | - | - |" in text
    assert f"{label}: not run; dynamic random, the rule alone's pruned %: not run." in text
    assert "`pairs-n20-full-equal-rule-s0`, `pairs-n20-random-rule-s0`." in text  # the runs not run
    fake = json.loads((tmp_path / "pairs-n20-full-equal-s0.json").read_text())
    fake.update(id="pairs-n20-full-equal-rule-s0", method="full-equal-rule", budget=rule["pairs_trained"])
    (tmp_path / "pairs-n20-full-equal-rule-s0.json").write_text(json.dumps(fake))
    text = bp.report(ctx)
    gap = bp.r1(rule["rows"][-1]) - bp.r1(fake["rows"][-1])
    assert f"| {label} | 1 | {gap:+.1f} (s0) | {gap:+.1f} | n/a (one seed) |" in text
    assert "| dynamic random, the rule alone's pruned % | 0 | not run (`pairs-n20-random-rule-s0`" in text


def test_a_results_folder_with_its_provenance_gets_its_own_page(tmp_path: Path) -> None:
    """--results/--doc: another folder's runs on another page, whose header names the command that wrote
    it and says, from the folder's provenance.json, which code, rule version and draws made the runs."""
    results = tmp_path / "runs"
    results.mkdir()
    for m in ("rule-random", "full", "oracle"):
        name = f"pairs-n20-{m}-s0.json"
        (results / name).write_text((bp.RESULTS / name).read_text())
    (results / "provenance.json").write_text(json.dumps({
        "commit": "commit abc1234", "command": "python -m studies baselines_pairs", "rule_version": 2,
        "draws": "by a keyed hash", "superseded_by": "Nothing supersedes them.", "note": "Cut at 75 minutes.",
    }))  # fmt: skip
    doc = tmp_path / "page.md"
    assert bp.main(["--report-only", "--results", str(results), "--doc", str(doc)]) == 0
    text = doc.read_text()
    from tools.results import path_label  # tmp_path is beside a checkout under /tmp, elsewhere otherwise

    assert text.splitlines()[2] == (
        f"<!-- generated by `python -m studies baselines_pairs --report-only --results {path_label(results)} --doc "
        f"{path_label(doc)}` from the result files in `runs/`; do not edit by hand -->"
    )
    assert text.splitlines()[4] == (
        "**These runs**: made at commit abc1234 (`python -m studies baselines_pairs`), the noise rule's version 2, "
        "the noise drawn by a keyed hash. Nothing supersedes them. Cut at 75 minutes."
    )
    assert "3 finished runs on one machine" in text
    assert bp.DOC.read_text() == bp.report(bp.Ctx())  # the default page is untouched


def test_targets_take_precision_over_the_runs_that_suspected_something() -> None:
    def run(es: float, suspects: dict | None = None) -> dict:
        return {"es": es, "run_suspects": suspects}

    runs = {(0.03, "full", s): run(40.0) for s in range(3)}
    runs |= {(0.03, "oracle", s): run(43.0) for s in range(3)}
    runs[(0.03, "rule", 0)] = run(41.0, {"suspected": 239, "true_positives": 228, "precision": 0.954, "recall": 0.844})
    for s in (1, 2):
        runs[(0.03, "rule", s)] = run(40.0, {"suspected": 0, "true_positives": 0, "precision": None, "recall": 0.0})
    runs |= {(0.1, m, 0): run(50.0, {"suspected": 0, "true_positives": 0, "precision": None, "recall": 0.0})
             for m in ("full", "rule")}  # fmt: skip
    lines = bp.targets_section(runs, [0.03, 0.1])
    # 3%: gaps +1, 0, 0 (mean 0.33, 2 SE 0.67); recall over every run, precision over the one that suspected
    assert lines[-3].endswith("| 0.954 / 0.281 (precision of the 1 of 3 runs that suspected any) |")
    assert lines[-2] == "| 10% | 1 | one seed | - | no oracle run | no oracle run | - / 0.000 (nothing suspected) |"
