"""The seta-stream command line and inspect (text, JSON, PNG) on a real run directory."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import numpy as np

from seta_stream import RunDir
from seta_stream._cli import main
from seta_stream.testing import LossRecorder

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
    plot = importlib.util.find_spec("matplotlib") is not None  # the plot extra
    if not plot:  # the core without its extras (tools/test.sh's oldest-versions run)
        assert main(["inspect", str(tmp_path / "r"), "--plot", str(tmp_path / "p.png")]) == 2
        err = capsys.readouterr().err
        assert err.strip().endswith(
            f"plotting to {tmp_path / 'p.png'} needs matplotlib, which is not installed; install it with "
            "pip install 'seta-stream[plot]' (or leave the plot out)"
        )
        assert len(err.strip().splitlines()) == 1
        assert main(["inspect", str(tmp_path / "r"), "--json"]) == 0
    else:
        assert main(["inspect", str(tmp_path / "r"), "--json", "--plot", str(tmp_path / "p.png")]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["policy"] == "seta" and summary["params"] == {"alpha": 0.5, "k": 4, "r": 0.1}
    assert [e["epoch"] for e in summary["epochs"]] == [1]
    sel = summary["selected"]
    assert sel["k_eff"] == 4 and sel["w"] == 2 and sel["s"] == 1
    assert {r["shard"] for r in sel["shards_lost_most"]} == {"shard-0.tar", "shard-1.tar", "shard-2.tar"}
    assert not plot or (tmp_path / "p.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
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
