"""The seta-stream command line and inspect (text, JSON, PNG) on a real run directory."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import numpy as np
import pytest

from seta_stream import LossRecorder, RunDir
from seta_stream._cli import main

CLI = [sys.executable, "-m", "seta_stream._cli"]


def recorded_run(path, n=300):
    run = RunDir(path, create=True)
    rng = np.random.default_rng(0)
    with LossRecorder(run, epoch=0) as rec:
        rec.record(
            [f"k{i:04d}" for i in range(n)],
            [f"/d/shard-{i % 3}.tar" for i in range(n)],
            rng.lognormal(size=n).astype(np.float32),
        )
    return run


def test_compact_plan_inspect_round_trip(tmp_path, capsys):
    recorded_run(tmp_path / "r")
    assert main(["compact", str(tmp_path / "r"), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert (report["parts_folded"], report["rows_folded"], report["samples_total"]) == (1, 300, 300)
    assert (
        main(
            [
                "plan",
                str(tmp_path / "r"),
                "--epoch",
                "1",
                "--policy",
                "seta",
                "--epochs",
                "8",
                "--seed",
                "2",
                "-p",
                "r=0.1",
                "-p",
                "k=4",
                "-p",
                "alpha=0.5",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert out.startswith("epoch 1 (seta, prune): keep ")
    assert main(["inspect", str(tmp_path / "r"), "--json", "--plot", str(tmp_path / "p.png")]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["policy"] == "seta" and summary["params"] == {"alpha": 0.5, "k": 4, "r": 0.1}
    assert [e["epoch"] for e in summary["epochs"]] == [1]
    sel = summary["selected"]
    assert sel["k_eff"] == 4 and sel["w"] == 2 and sel["s"] == 1
    assert {r["shard"] for r in sel["shards_lost_most"]} == {"shard-0.tar", "shard-1.tar", "shard-2.tar"}
    assert (tmp_path / "p.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert main(["inspect", str(tmp_path / "r")]) == 0
    text = capsys.readouterr().out
    assert "k' = 4, window width 2, window: clusters 1..2" in text
    assert "shards that lost most:" in text


def test_policies_listing(capsys):
    assert main(["policies", "--json"]) == 0
    names = {p["name"] for p in json.loads(capsys.readouterr().out)}
    assert {"full", "random", "static", "seta"} <= names
    assert main(["policies"]) == 0
    assert "seta: SeTa: random down-sampling" in capsys.readouterr().out


def test_errors_exit_2_with_the_message(tmp_path):
    proc = subprocess.run(CLI + ["compact", str(tmp_path / "missing")], capture_output=True, text=True)
    assert proc.returncode == 2
    assert "seta-stream compact: error: run directory" in proc.stderr and "does not exist" in proc.stderr
    recorded_run(tmp_path / "r")
    proc = subprocess.run(CLI + ["plan", str(tmp_path / "r"), "--epoch", "0"], capture_output=True, text=True)
    assert proc.returncode == 2 and "first plan needs policy= and epochs=" in proc.stderr
    proc = subprocess.run(CLI + ["inspect", str(tmp_path / "r"), "--epoch", "3"], capture_output=True, text=True)
    assert proc.returncode == 2 and "plans/epoch=3/summary.json does not exist" in proc.stderr


def test_suspects_on_a_pairs_data_set_prints_precision_and_recall(tmp_path, capsys):
    """`seta-stream suspects` on the pairs generator's shards and its noise.parquet: losses
    recorded for 4 epochs (the mismatched pairs stay high, a few clean ones too), the rule
    alone (policy full, noise=True); the file, the test line and precision/recall exact."""
    import importlib.util
    from pathlib import Path

    import pyarrow.parquet as pq

    from seta_stream import compact, list_samples, load_plan, load_summary, plan_epoch

    spec = importlib.util.spec_from_file_location(
        "make_pair_shards", Path(__file__).resolve().parent.parent / "tools" / "make_pair_shards.py"
    )
    mps = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mps)
    data = tmp_path / "pairs"
    mps.main(["--out", str(data), "--train", "400", "--test", "10", "--shard-size", "100", "--noise", "0.2",
              "--seed", "3", "--workers", "1"])  # fmt: skip
    samples = list_samples(sorted(str(p) for p in (data / "train").glob("*.tar")))
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
    found = {(r["shard"], r["key"]) for r in plan if r["reason"] in ("suspected_noise", "noise_recheck")}
    rechecked = sum(r["reason"] == "noise_recheck" for r in plan)
    tp = len(found & truth)
    assert found and tp and rechecked == len(found) // 10
    assert text[0] == (
        f"run {tmp_path / 'run'}, epoch 4 (full): {len(found)} of 400 planned samples suspected as noise "
        f"({rechecked} of them kept with weight 0 to re-check them)"
    )
    assert text[1].startswith("  two-mode test over 400 candidates: Ashman's D = ") and "passed: active" in text[1]
    assert (
        text[-2]
        == f"  precision {tp / len(found):.3f} ({tp} of {len(found)} suspects are listed in {data / 'noise.parquet'})"
    )
    assert text[-1] == f"  recall {tp / 80:.3f} ({tp} of the 80 listed samples the plan holds)"
    t = pq.read_table(out)
    assert t.column_names == [
        "shard", "key", "uid", "reason", "kept", "loss_count", "loss_mean", "loss_std", "last_loss", "last_epoch",
        "seen", "nonfinite", "loss_e0", "loss_e1", "loss_e2", "loss_e3",
    ]  # fmt: skip
    rows = t.to_pylist()
    assert {(r["shard"], r["key"]) for r in rows} == found and all(r["loss_count"] == 4 for r in rows)
    table = {(r["shard"], r["key"]): r for r in seta_table(run)}
    for r in rows:
        history = [r[f"loss_e{e}"] for e in range(4)]
        assert r["loss_mean"] == table[(r["shard"], r["key"])]["loss_mean"]
        assert r["loss_mean"] == pytest.approx(np.mean(history), rel=1e-12)
        assert r["loss_std"] == pytest.approx(np.std(history), rel=1e-9)
    assert main(["inspect", str(tmp_path / "run")]) == 0
    summary = load_summary(run, 4)
    assert (
        f"  noise rule: two_modes (Ashman's D {summary['noise_separation']:.3f}, 400 candidates), {len(found)} "
        f"suspected, {rechecked} re-checked with weight 0 (seta-stream suspects lists them)"
    ) in capsys.readouterr().out.splitlines()
    assert main(["suspects", str(tmp_path / "run"), "--json", "--no-history", "--out", str(out)]) == 0
    report = json.loads(capsys.readouterr().out)
    assert (report["suspected"], report["noise_test"], report["columns"][-1]) == (len(found), "two_modes", "nonfinite")
    assert report["noise_scale"] == "loss" and f"; threshold {report['noise_threshold']:.6g}" in text[1]
    # the same history planned with the mixture on the log1p scale: the threshold is printed in
    # loss units and on the scale it was fitted on
    plan_epoch(run, 5, policy="full", params={"noise": True, "noise_scale": "log1p"}, epochs=6, seed=0,
               population=samples, force=True)  # fmt: skip
    assert main(["suspects", str(tmp_path / "run"), "--json", "--no-history", "--out", str(out)]) == 0
    report = json.loads(capsys.readouterr().out)
    t5 = report["noise_threshold"]
    assert (report["epoch"], report["noise_scale"], report["noise_test"]) == (5, "log1p", "two_modes")
    assert main(["suspects", str(tmp_path / "run"), "--out", str(out)]) == 0
    line = capsys.readouterr().out.splitlines()[1]
    assert line.endswith(
        f"; threshold {math.expm1(t5):.6g} (loss; {t5:.6g} on the log1p scale the mixture was fitted on)"
    )


def seta_table(run):
    from seta_stream import load_table

    return load_table(run, shard_as_dictionary=False).to_pylist()
