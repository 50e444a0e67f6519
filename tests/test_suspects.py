"""`seta-stream suspects` and seta_stream.inspect's suspects report (docs/algorithms.md §12.6):
every sample a plan of the run held as suspected noise, in which epochs, the plans where the
rule was active, precision and recall per plan and over the run; real Pruner runs on real
shards, real Parquet plans, crafted losses."""

from __future__ import annotations

import json
import math
import os
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import seta_stream as seta
from seta_stream import RunDir, compact, load_plan, load_summary, plan_epoch
from seta_stream._cli import main
from seta_stream.inspect import suspect_report, suspects
from seta_stream.testing import LossRecorder
from tests.conftest import write_shards

EPOCHS = 7
#: Indices into the population (2 shards of 100; keys repeat across shards): X, 25 samples at
#: loss 7 in every epoch (the noise); Y, 20 clean samples at loss 9 in epoch 2 only (one bad
#: epoch); the others between 1.0 and 1.3.
X = set(range(0, 200, 8))
Y = set(range(3, 200, 10))
NOISE = ("suspected_noise", "noise_recheck")


def ident(i: int) -> tuple[str, str]:
    return f"part-{i // 100:04d}.tar", f"sample{i % 100:04d}"


def loss(i: int, epoch: int) -> float:
    if i in X:
        return 7.0
    if i in Y and epoch == 2:
        return 9.0
    return 1.0 + 0.3 * ((i * 37) % 100) / 100


def pruner_loop(root: Path, params: dict) -> Path:
    """A Pruner loop of 7 epochs of policy full with ``params`` over two shards of 100 samples, recording
    the loss of every sample its plan keeps (re-checks included); returns ``root`` (the run: root/run)."""
    population = seta.list_samples(write_shards(root / "shards", [100, 100]))
    keys, urls = population.column("key").to_pylist(), population.column("url").to_pylist()
    index = {(s, k): i for i, (s, k) in enumerate(zip(population.column("shard").to_pylist(), keys))}
    assert sorted(index.values()) == list(range(200)) and all(ident(i) == p for p, i in index.items())
    pruner = seta.Pruner(str(root / "run"), policy="full", params=params, epochs=EPOCHS, seed=0, population=population)
    for e in range(EPOCHS):
        pruner.start_epoch(e)
        plan = load_plan(root / "run", e, ["shard", "key", "keep"]).to_pylist()
        trained = [index[(r["shard"], r["key"])] for r in plan if r["keep"]]
        pruner.record([keys[i] for i in trained], [urls[i] for i in trained],
                      np.array([loss(i, e) for i in trained], np.float32))  # fmt: skip
    pruner.close()
    return root


@pytest.fixture(scope="module")
def noisy_run(tmp_path_factory) -> Path:
    """A Pruner loop of 7 epochs with the rule alone (full, noise=True of version 1, the default
    re-check share 0.1) that records the loss of every sample its plan keeps (re-checks included)."""
    # the rule's first version: the threshold where the components cross (the report reads either)
    root = pruner_loop(tmp_path_factory.mktemp("suspects"), {"noise": True, "noise_rule": 1})
    truth = [ident(i) for i in sorted(X | {1, 2})] + [("elsewhere.tar", "sample0000")]  # 2 clean, 1 outside
    pq.write_table(pa.table({"shard": [s for s, _ in truth], "key": [k for _, k in truth]}), root / "noise.parquet")
    return root


def plan_reasons(run: Path, epoch: int) -> dict[tuple[str, str], str]:
    """Each sample's reason in the plan of ``epoch``, read from plan.parquet with pyarrow."""
    t = pq.read_table(run / f"plans/epoch={epoch}/plan.parquet", columns=["shard", "key", "reason"])
    shard, key, reason = (t.column(c).cast(pa.string()).to_pylist() for c in ("shard", "key", "reason"))
    return dict(zip(zip(shard, key), reason))


def test_the_report_covers_every_plan_of_the_run(noisy_run: Path, capsys) -> None:
    """X is suspected from the first plan with two records on (epochs 2-6), Y in the plan after
    its bad epoch only (epoch 3); the last plan holds X alone, so a report of the last plan
    would not show Y at all. Every suspect's epochs, its left-out and re-checked epochs (as
    the plan files say), its last reason and its history, exactly."""
    run = noisy_run / "run"
    out = noisy_run / "all.parquet"
    assert main(["suspects", str(run), "--truth", str(noisy_run / "noise.parquet"), "--out", str(out), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    summaries = [load_summary(run, e) for e in range(EPOCHS)]
    assert [p["epoch"] for p in report["plans"]] == list(range(EPOCHS)) and report["epochs"] == list(range(EPOCHS))
    assert [p["noise_test"] for p in report["plans"]] == ["too_few"] * 2 + ["two_modes"] * 5
    assert report["active_epochs"] == [2, 3, 4, 5, 6]
    assert [p["suspected"] for p in report["plans"]] == [0, 0, 25, 45, 25, 25, 25]
    assert [p["rechecked"] for p in report["plans"]] == [0, 0, 2, 4, 2, 2, 2]  # floor(0.1 x suspected)
    for p, s in zip(report["plans"], summaries):
        assert (p["noise_separation"], p["noise_threshold"], p["noise_candidates"], p["noise_scale"]) == (
            s["noise_separation"], s["noise_threshold"], s["noise_candidates"], "loss")  # fmt: skip
        components = s["noise_components"]
        assert p["noise_upper_weight"] == (None if components is None else components["weight"][1])
    assert report["plans"][2]["noise_upper_weight"] == pytest.approx(25 / 200, abs=1e-6)

    reasons = [plan_reasons(run, e) for e in range(EPOCHS)]
    rows = {(r["shard"], r["key"]): r for r in pq.read_table(out).to_pylist()}
    assert set(rows) == {ident(i) for i in X | Y}
    for i in X | Y:
        r = rows[ident(i)]
        assert r["suspected_epochs"] == ([2, 3, 4, 5, 6] if i in X else [3])
        assert r["left_out_epochs"] == [e for e in r["suspected_epochs"] if reasons[e][ident(i)] == "suspected_noise"]
        assert r["rechecked_epochs"] == [e for e in r["suspected_epochs"] if reasons[e][ident(i)] == "noise_recheck"]
        assert r["last_plan_reason"] == (reasons[6][ident(i)] if i in X else "all")  # Y released: full's reason
        trained = [e for e in range(EPOCHS) if reasons[e][ident(i)] not in ("suspected_noise",)]
        assert r["loss_count"] == len(trained) and r["last_epoch"] == trained[-1]
        assert [r[f"loss_e{e}"] for e in range(EPOCHS)] == pytest.approx(
            [loss(i, e) if e in trained else math.nan for e in range(EPOCHS)], nan_ok=True
        )
    assert sum(len(rows[ident(i)]["rechecked_epochs"]) for i in X | Y) == 2 + 4 + 2 + 2 + 2
    left_out = sum(1 for r in rows.values() if r["left_out_epochs"])
    assert (report["suspected"], report["left_out"], report["suspected_in_last_plan"]) == (45, left_out, 25)
    assert [(m["shard"], m["key"]) for m in report["most_suspected"]] == sorted(ident(i) for i in X)[:10]

    # precision and recall per plan and over the run: 27 of the 28 listed samples are in the plans
    assert (report["truth_listed"], report["truth_in_plans"], report["true_positives"]) == (28, 27, 25)
    assert (report["precision"], report["recall"]) == (25 / 45, 25 / 27)
    assert [(p["precision"], p["recall"]) for p in report["plans"]] == [(None, 0.0)] * 2 + [(1.0, 25 / 27),
        (25 / 45, 25 / 27)] + [(1.0, 25 / 27)] * 3  # fmt: skip


def test_the_text_names_the_active_plans_and_writes_nothing_without_out(noisy_run: Path, tmp_path, monkeypatch,
                                                                        capsys) -> None:  # fmt: skip
    """Without --out the command prints and writes nothing: not in the current folder, not in
    the run directory."""
    run = noisy_run / "run"
    before = {p: p.stat().st_mtime_ns for p in run.rglob("*")}
    monkeypatch.chdir(tmp_path)
    assert main(["suspects", str(run), "--truth", str(noisy_run / "noise.parquet")]) == 0
    text = capsys.readouterr().out.splitlines()
    assert os.listdir(tmp_path) == [] and {p: p.stat().st_mtime_ns for p in run.rglob("*")} == before
    s3 = load_summary(run, 3)
    assert text[0] == f"run {run} (full), 7 plans: the noise rule in 7, active in 5 (epochs 2-6)"
    assert text[1].split() == ["epoch", "test", "D", "upper", "w", "threshold", "candidates", "suspected",
                               "rechecked", "precision", "recall"]  # fmt: skip
    assert text[5].split() == ["3", "two_modes", f"{s3['noise_separation']:.3f}",
                               f"{s3['noise_components']['weight'][1]:.3f}", f"{s3['noise_threshold']:.6g}", "200",
                               "45", "4", f"{25 / 45:.3f}", f"{25 / 27:.3f}"]  # fmt: skip
    left_out = suspect_report(run)["left_out"]
    assert (
        f"  45 samples suspected in some plan, {left_out} of them left out in at least one epoch; 25 still "
        "suspected in the last plan (epoch 6)"
    ) in text
    assert (
        f"  over the run: precision {25 / 45:.3f} (25 of the 45 samples ever suspected are listed in "
        f"{noisy_run / 'noise.parquet'}), recall {25 / 27:.3f} (25 of the 27 listed samples the plans hold)"
    ) in text
    assert text[-1] == "  nothing written: --out FILE.parquet writes every suspect with its epochs, losses and history"
    assert "    part-0000.tar sample0000: epochs 2-6 (" in "\n".join(text)


def test_one_epoch_alone(noisy_run: Path) -> None:
    """--epoch 3 reports that plan only: X and Y, each suspected in epoch 3, with their reason there."""
    run = noisy_run / "run"
    table = suspects(run, 3, history=False).to_pylist()
    reasons = plan_reasons(run, 3)
    assert [(r["shard"], r["key"]) for r in table] == sorted(ident(i) for i in X | Y)
    assert all(r["suspected_epochs"] == [3] and r["last_plan_reason"] == reasons[(r["shard"], r["key"])]
               for r in table)  # fmt: skip
    assert {r["last_plan_reason"] for r in table} == set(NOISE)
    assert "loss_e0" not in table[0]
    report = suspect_report(run, 3)
    assert (report["epochs"], report["active_epochs"], report["suspected"], report["last_epoch"]) == ([3], [3], 45, 3)
    assert "out" not in report and report["suspected_in_last_plan"] == 45


def test_a_run_planned_without_the_rule(tmp_path, capsys) -> None:
    run = RunDir(tmp_path / "r", create=True)
    with LossRecorder(run, epoch=0) as rec:
        rec.record([f"k{i}" for i in range(30)], ["/d/a.tar"] * 30, np.linspace(0.1, 3, 30).astype(np.float32))
    compact(run)
    plan_epoch(run, 1, policy="random", params={"r": 0.5}, epochs=3, seed=0)
    assert main(["suspects", str(tmp_path / "r"), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert (report["noise"], report["plans"], report["suspected"], report["most_suspected"]) == (False, [], 0, [])
    assert main(["suspects", str(tmp_path / "r")]) == 0
    assert capsys.readouterr().out.splitlines() == [
        f"run {tmp_path / 'r'} (random), epoch 1: the noise rule in 0, active in 0",
        "  made without the noise rule (noise=False): nothing is suspected",
    ]
    assert main(["suspects", str(tmp_path / "r"), "--epoch", "4"]) == 2
    assert "plans/epoch=4/summary.json does not exist; planned epochs: [1]" in capsys.readouterr().err


def test_suspects_on_a_pairs_data_set_prints_precision_and_recall(tmp_path, capsys):
    """`seta-stream suspects` on the pairs generator's shards and its noise.parquet: losses
    recorded for 4 epochs (the mismatched pairs stay high, a few clean ones too), the rule
    alone (policy full, noise=True) planned at epoch 4; the file, the plan's row and
    precision/recall exact; then epoch 5 planned on the log1p scale."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "make_pair_shards", Path(__file__).resolve().parent.parent / "tools" / "make_pair_shards.py"
    )
    mps = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mps)
    data = tmp_path / "pairs"
    mps.main(["--out", str(data), "--train", "400", "--test", "10", "--shard-size", "100", "--noise", "0.2",
              "--seed", "3", "--workers", "1"])  # fmt: skip
    samples = seta.list_samples(sorted(str(p) for p in (data / "train").glob("*.tar")))
    truth = {(r["shard"], r["key"]) for r in pq.read_table(data / "noise.parquet").to_pylist()}
    assert len(truth) == 80
    capsys.readouterr()  # the generator's line
    pairs = list(zip(samples.column("shard").to_pylist(), samples.column("key").to_pylist()))
    urls = samples.column("url").to_pylist()
    rng = np.random.default_rng(0)
    hard = {p for p in pairs if p not in truth and rng.random() < 0.03}  # clean pairs whose loss stays high
    run = RunDir(tmp_path / "run", create=True)
    for e in range(4):
        high = np.array([p in truth or p in hard for p in pairs])
        loss = np.where(high, rng.normal(6.8, 0.4, len(pairs)), rng.lognormal(np.log(3.0 / (1 + e)), 0.5, len(pairs)))
        with LossRecorder(run, epoch=e) as rec:
            rec.record([k for _, k in pairs], urls, loss.astype(np.float32))
        compact(run)
    plan_epoch(run, 4, policy="full", params={"noise": True}, epochs=6, seed=0, population=samples)
    out = tmp_path / "suspects.parquet"
    assert main(["suspects", str(tmp_path / "run"), "--truth", str(data / "noise.parquet"), "--out", str(out)]) == 0
    text = capsys.readouterr().out.splitlines()
    plan = load_plan(run, 4).to_pylist()
    found = {(r["shard"], r["key"]) for r in plan if r["reason"] in NOISE}
    rechecked = sum(r["reason"] == "noise_recheck" for r in plan)
    tp = len(found & truth)
    assert found and tp and rechecked == len(found) // 10
    summary = load_summary(run, 4)
    assert text[0] == f"run {tmp_path / 'run'} (full), epoch 4: the noise rule in 1, active in 1 (epochs 4)"
    weight = summary["noise_components"]["weight"][1]
    assert text[2].split() == ["4", "two_modes", f"{summary['noise_separation']:.3f}", f"{weight:.3f}",
                               f"{summary['noise_threshold']:.6g}", "400", str(len(found)), str(rechecked),
                               f"{tp / len(found):.3f}", f"{tp / 80:.3f}"]  # fmt: skip
    assert (
        f"  over the run: precision {tp / len(found):.3f} ({tp} of the {len(found)} samples ever suspected are listed "
        f"in {data / 'noise.parquet'}), recall {tp / 80:.3f} ({tp} of the 80 listed samples the plans hold)"
    ) in text
    t = pq.read_table(out)
    assert t.column_names == [
        "shard", "key", "uid", "suspected_epochs", "left_out_epochs", "rechecked_epochs", "last_plan_reason",
        "loss_count", "loss_mean", "loss_std", "last_loss", "last_epoch", "seen", "nonfinite",
        "loss_e0", "loss_e1", "loss_e2", "loss_e3",
    ]  # fmt: skip
    rows = t.to_pylist()
    assert {(r["shard"], r["key"]) for r in rows} == found and all(r["loss_count"] == 4 for r in rows)
    assert sum(r["rechecked_epochs"] == [4] for r in rows) == rechecked
    table = {(r["shard"], r["key"]): r for r in seta.load_table(run, shard_as_dictionary=False).to_pylist()}
    for r in rows:
        history = [r[f"loss_e{e}"] for e in range(4)]
        assert r["loss_mean"] == table[(r["shard"], r["key"])]["loss_mean"]
        assert r["loss_mean"] == pytest.approx(np.mean(history), rel=1e-12)
        assert r["loss_std"] == pytest.approx(np.std(history), rel=1e-9)
    assert main(["inspect", str(tmp_path / "run")]) == 0
    assert (
        f"  noise rule: two_modes (Ashman's D {summary['noise_separation']:.3f}, 400 candidates), {len(found)} "
        f"suspected, {rechecked} re-checked with weight 0 (seta-stream suspects lists them)"
    ) in capsys.readouterr().out.splitlines()
    # the same history planned with the mixture on the log1p scale: the threshold is printed in
    # loss units and on the scale it was fitted on
    plan_epoch(run, 5, policy="full", params={"noise": True, "noise_scale": "log1p"}, epochs=6, seed=0,
               population=samples, force=True)  # fmt: skip
    assert main(["suspects", str(tmp_path / "run"), "--json", "--epoch", "5"]) == 0
    report = json.loads(capsys.readouterr().out)
    t5 = report["plans"][0]["noise_threshold"]
    assert (report["epochs"], report["plans"][0]["noise_scale"], report["plans"][0]["noise_test"]) == (
        [5], "log1p", "two_modes")  # fmt: skip
    assert main(["suspects", str(tmp_path / "run")]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].split()[6] == "(log1p)" and lines[3].split()[:6] == ["5", "two_modes",
        f"{report['plans'][0]['noise_separation']:.3f}", f"{report['plans'][0]['noise_upper_weight']:.3f}",
        f"{math.expm1(t5):.6g}", f"{t5:.4g}"]  # fmt: skip
    assert lines[2].split()[5] == "-"  # epoch 4 was fitted on the loss scale


def _pair_tool():
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "make_pair_shards", Path(__file__).resolve().parent.parent / "tools" / "make_pair_shards.py"
    )
    mps = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mps)
    return mps


def test_an_empty_truth_file_of_a_clean_data_set_gives_no_ratio(tmp_path, capsys):
    """A clean data set (the pairs generator at --noise 0) lists no noisy sample: its
    noise.parquet has 0 rows, typed string. The rule suspects nothing on unimodal losses, so
    precision and recall are n/a over 0 listed samples: one line each, no traceback."""
    data = tmp_path / "pairs"
    _pair_tool().main(["--out", str(data), "--train", "200", "--test", "10", "--shard-size", "100", "--noise", "0",
                       "--seed", "3", "--workers", "1"])  # fmt: skip
    truth = pq.read_table(data / "noise.parquet")
    assert truth.num_rows == 0 and truth.schema.field("shard").type == pa.string()
    samples = seta.list_samples(sorted(str(p) for p in (data / "train").glob("*.tar")))
    keys, urls = samples.column("key").to_pylist(), samples.column("url").to_pylist()
    run = RunDir(tmp_path / "run", create=True)
    rng = np.random.default_rng(0)
    for e in range(3):
        with LossRecorder(run, epoch=e) as rec:
            rec.record(keys, urls, rng.lognormal(np.log(3.0 / (1 + e)), 0.3, len(keys)).astype(np.float32))
        compact(run)
    plan_epoch(run, 3, policy="full", params={"noise": True}, epochs=5, seed=0, population=samples)
    capsys.readouterr()
    assert main(["suspects", str(tmp_path / "run"), "--truth", str(data / "noise.parquet"), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert (report["suspected"], report["truth_listed"], report["truth_in_plans"], report["true_positives"]) == (
        0, 0, 0, 0)  # fmt: skip
    assert (report["precision"], report["recall"]) == (None, None)
    assert [(p["epoch"], p["suspected"], p["precision"], p["recall"]) for p in report["plans"]] == [(3, 0, None, None)]
    assert main(["suspects", str(tmp_path / "run"), "--truth", str(data / "noise.parquet")]) == 0
    text = capsys.readouterr().out.splitlines()
    assert text[2].split()[-2:] == ["n/a", "n/a"]
    assert (
        f"  over the run: precision n/a (0 of the 0 samples ever suspected are listed in {data / 'noise.parquet'}), "
        "recall n/a (0 of the 0 listed samples the plans hold)"
    ) in text


def test_an_empty_truth_file_makes_every_suspect_a_false_positive(noisy_run: Path, tmp_path) -> None:
    """The run that suspected 45 samples, against a truth file of 0 rows: precision 0 (none of
    the 45 is listed), recall n/a (no listed sample), per plan and over the run."""
    empty = tmp_path / "none.parquet"
    pq.write_table(pa.table({"shard": pa.array([], pa.string()), "key": pa.array([], pa.string())}), empty)
    report = suspect_report(noisy_run / "run", truth=str(empty))
    assert (report["suspected"], report["truth_listed"], report["true_positives"]) == (45, 0, 0)
    assert (report["precision"], report["recall"]) == (0.0, None)
    assert [(p["precision"], p["recall"]) for p in report["plans"]] == [(None, None)] * 2 + [(0.0, None)] * 5


# ------------------------------------------------------------- the rule's version 2 (§12.12)
@pytest.fixture(scope="module")
def rule2_run(tmp_path_factory) -> Path:
    """The Pruner loop of :func:`noisy_run` with the rule's current version (``noise=True``, no
    ``noise_rule``: version 2, posterior 0.9, each threshold held to the plan before's)."""
    return pruner_loop(tmp_path_factory.mktemp("suspects2"), {"noise": True})


def test_a_run_of_the_rules_version_2(rule2_run: Path, capsys) -> None:
    """Each plan's row names its version, the posterior asked, the fit's own threshold and the
    floor it was held to, as its summary says; the text keeps one table (a single version: no
    version column) and says where the threshold was held at the previous plan's."""
    run = rule2_run / "run"
    summaries = [load_summary(run, e) for e in range(EPOCHS)]
    assert all(s["params"]["noise_rule"] == 2 for s in summaries)
    assert main(["suspects", str(run), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert [p["epoch"] for p in report["plans"]] == list(range(EPOCHS))
    for p, s in zip(report["plans"], summaries):
        assert (p["noise_rule"], p["noise_posterior"]) == (2, 0.9)
        assert (p["noise_test"], p["noise_threshold"], p["noise_fit_threshold"], p["noise_floor"]) == (
            s["noise_test"], s["noise_threshold"], s["noise_fit_threshold"], s["noise_floor"])  # fmt: skip
    held = [p["epoch"] for p in report["plans"] if p["noise_floor"] is not None and p["noise_fit_threshold"] is not None
            and p["noise_floor"] > p["noise_fit_threshold"]]  # fmt: skip
    assert held and report["active_epochs"] == [2, 3, 4, 5, 6]
    # the suspects are those of the plan files, as with version 1
    suspected = {(r["shard"], r["key"]) for e in range(EPOCHS) for (r) in load_plan(run, e, ["shard", "key", "reason"])
                 .to_pylist() if r["reason"] in NOISE}  # fmt: skip
    assert report["suspected"] == len(suspected) and suspected <= {ident(i) for i in X | Y}
    assert main(["suspects", str(run)]) == 0
    text = capsys.readouterr().out.splitlines()
    assert text[1].split() == ["epoch", "test", "D", "upper", "w", "threshold", "candidates", "suspected",
                               "rechecked"]  # fmt: skip
    s2 = summaries[2]
    assert text[4].split() == ["2", "two_modes", f"{s2['noise_separation']:.3f}",
                               f"{s2['noise_components']['weight'][1]:.3f}", f"{s2['noise_threshold']:.6g}", "200",
                               str(s2["noise_suspected"]), str(s2["noise_rechecked"])]  # fmt: skip
    assert (
        "  (the rule's version 2: the threshold is where the noise mode's posterior reaches 0.9, never below the "
        "previous plan's; docs/algorithms.md §12.12)"
    ) in text
    from seta_stream.inspect.noise import _epochs_text

    assert any(line.startswith(f"  held at the previous plan's threshold in epoch{'s' if len(held) > 1 else ''} "
                               f"{_epochs_text(held)} (") for line in text)  # fmt: skip


def test_a_run_with_plans_of_both_versions_shows_each_plans_version(rule2_run: Path, tmp_path, capsys) -> None:
    """The run of version 2 with its last plan made again by version 1 (force=True): the table
    gets a column naming each plan's version."""
    shutil.copytree(rule2_run / "run", tmp_path / "run")
    run = tmp_path / "run"
    plan_epoch(run, EPOCHS - 1, params={"noise": True, "noise_rule": 1}, force=True)
    report = suspect_report(run)
    assert [p["noise_rule"] for p in report["plans"]] == [2] * (EPOCHS - 1) + [1]
    last = report["plans"][-1]
    assert (last["noise_posterior"], last["noise_fit_threshold"], last["noise_floor"]) == (None, None, None)
    assert main(["suspects", str(run)]) == 0
    text = capsys.readouterr().out.splitlines()
    assert text[1].split()[:3] == ["epoch", "rule", "test"]
    assert [line.split()[:3] for line in text[2 : 2 + EPOCHS]] == [[str(e), "2", "too_few"] for e in (0, 1)] + [
        [str(e), "2", "two_modes"] for e in range(2, EPOCHS - 1)
    ] + [[str(EPOCHS - 1), "1", "two_modes"]]
    assert (
        "  (rule 2: the threshold is where the noise mode's posterior reaches 0.9, never below the previous plan's; "
        "rule 1: where the components cross; docs/algorithms.md §12.12)"
    ) in text


def test_low_posterior_two_modes_whose_posterior_never_reaches_the_one_asked(tmp_path, capsys) -> None:
    """Two modes (Ashman's D about 3.6) whose noise mode is narrower than the clean one: its
    posterior peaks below 0.99, so version 2 with noise_posterior=0.99 suspects nothing
    (noise_test low_posterior); the report and inspect say so in a line each."""
    from statistics import NormalDist

    clean = [NormalDist(6, 1.5).inv_cdf((i + 0.5) / 900) for i in range(900)]
    noisy = [NormalDist(10, 0.5).inv_cdf((i + 0.5) / 100) for i in range(100)]
    run = RunDir(tmp_path / "r", create=True)
    for e in range(2):
        with LossRecorder(run, epoch=e) as rec:
            rec.record([f"k{i:04d}" for i in range(1000)], ["/d/a.tar"] * 1000, np.array(clean + noisy, np.float32))
        compact(run)
    s = plan_epoch(run, 2, policy="full", params={"noise": True, "noise_posterior": 0.99}, epochs=4, seed=0)
    assert (s["noise_test"], s["noise_active"], s["noise_threshold"], s["noise_suspected"]) == (
        "low_posterior", False, None, 0)  # fmt: skip
    assert s["noise_separation"] >= 2
    report = suspect_report(run)
    assert ([p["noise_test"] for p in report["plans"]], report["active_epochs"], report["suspected"]) == (
        ["low_posterior"], [], 0)  # fmt: skip
    assert main(["suspects", str(tmp_path / "r")]) == 0
    text = capsys.readouterr().out.splitlines()
    assert text[0] == f"run {tmp_path / 'r'} (full), epoch 2: the noise rule in 1, active in 0"
    assert text[2].split() == ["2", "low_posterior", f"{s['noise_separation']:.3f}",
                               f"{s['noise_components']['weight'][1]:.3f}", "-", "1000", "0", "0"]  # fmt: skip
    assert (
        "  low_posterior in epoch 2: two modes, but the noise mode's posterior never reaches 0.99, so nothing is "
        "suspected there"
    ) in text
    assert main(["inspect", str(tmp_path / "r")]) == 0
    assert (
        f"  noise rule: low_posterior (Ashman's D {s['noise_separation']:.3f}, 1000 candidates), 0 suspected, "
        "0 re-checked with weight 0 (seta-stream suspects lists them)"
    ) in capsys.readouterr().out.splitlines()
