"""Real processes: SIGKILL mid-epoch and resume, and torch.distributed (gloo) with 2 ranks.

Both drive tests/scripts/fake_train.py, whose per-sample loss is a fixed function of the sample
and the epoch, so plans and tables of different runs can be compared exactly.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest
import webdataset as wds

SCRIPT = Path(__file__).parent / "scripts" / "fake_train.py"
PY = sys.executable


def write_shards(root: Path, n_shards: int, per_shard: int) -> list[str]:
    root.mkdir(parents=True, exist_ok=True)
    urls = []
    for s in range(n_shards):
        path = root / f"part-{s:04d}.tar"
        with wds.TarWriter(str(path)) as w:
            for i in range(per_shard):
                # the same key in every shard: identity is (shard, key)
                w.write({"__key__": f"sample{i:04d}", "txt": f"{s}-{i}"})
        urls.append(str(path))
    return urls


def run_script(*args: str, env: dict | None = None, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        [PY, str(SCRIPT), *args],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=300,
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"exit {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}")
    return proc


def plan_frame(run: Path, epoch: int) -> pl.DataFrame:
    return (
        pl.read_parquet(run / f"plans/epoch={epoch}/plan.parquet")
        .select("shard", "key", "keep", "weight", "cluster")
        .sort("shard", "key")
    )


def table_frame(run: Path) -> pl.DataFrame:
    manifest = json.loads((run / "table/manifest.json").read_text())
    return (
        pl.read_parquet(run / manifest["table"])
        .select("shard", "key", "last_loss", "last_epoch", "seen", "ema")
        .sort("shard", "key")
    )


def trained(out: Path, rank: int, epoch: int) -> list[tuple[str, str]]:
    data = json.loads((out / f"rank{rank}-epoch{epoch}.json").read_text())
    return [tuple(x) for x in data["trained"]]


@pytest.mark.slow
def test_sigkill_mid_epoch_then_resume_equals_uninterrupted_run(tmp_path):
    urls = write_shards(tmp_path / "shards", 3, 40)
    epochs = "5"
    run_a, run_b = tmp_path / "run_a", tmp_path / "run_b"
    run_script(
        "--run",
        str(run_a),
        "--shards",
        *urls,
        "--out",
        str(tmp_path / "out_a"),
        "--epochs",
        epochs,
        "--flush-rows",
        "8",
    )
    killed = run_script(
        "--run",
        str(run_b),
        "--shards",
        *urls,
        "--out",
        str(tmp_path / "out_b"),
        "--epochs",
        epochs,
        "--kill-epoch",
        "2",
        "--kill-batch",
        "3",
        "--flush-rows",
        "8",
        check=False,
    )
    assert killed.returncode == -9, killed.stderr
    # the interrupted attempt of epoch 2 flushed parts (flush every 8 records)
    assert list((run_b / "losses/rank=0/epoch=2").glob("part-*.parquet"))
    run_script(
        "--run",
        str(run_b),
        "--shards",
        *urls,
        "--out",
        str(tmp_path / "out_b"),
        "--epochs",
        epochs,
        "--start-epoch",
        "2",
        "--flush-rows",
        "8",
    )
    resumed = json.loads((tmp_path / "out_b" / "rank0-epoch2.json").read_text())
    assert resumed["superseded"], "the interrupted epoch's parts must be set aside"
    assert all("epoch=2" in p for p in resumed["superseded"])
    for e in range(int(epochs)):
        assert plan_frame(run_a, e).equals(plan_frame(run_b, e)), f"plan of epoch {e} differs"
        assert sorted(trained(tmp_path / "out_a", 0, e)) == sorted(trained(tmp_path / "out_b", 0, e))
        sa = json.loads((run_a / f"plans/epoch={e}/summary.json").read_text())
        sb = json.loads((run_b / f"plans/epoch={e}/summary.json").read_text())
        for field in ("kept", "n", "phase", "pruned_so_far", "s", "w", "cluster_sizes"):
            assert sa.get(field) == sb.get(field), (e, field)
    # every loss of the final run reached the table once: identical tables
    assert table_frame(run_a).equals(table_frame(run_b))
    # the superseded parts are kept on disk, not lost
    assert list((run_b / "losses-superseded").rglob("part-*.parquet"))


@pytest.mark.slow
def test_sigkill_after_a_flushed_checkpoint_loses_no_record(tmp_path):
    """Killed between the checkpoint of epoch 2 and start_epoch(3), with records buffered (the
    flush threshold is above an epoch's 120 samples): pruner.flush() before the checkpoint put
    epoch 2's records on disk, so the resumed run plans epochs 3 and 4 and folds its table
    exactly as the uninterrupted run does."""
    urls = write_shards(tmp_path / "shards", 3, 40)
    common = ["--shards", *urls, "--epochs", "5", "--flush-rows", "100000"]
    run_a, run_b = tmp_path / "run_a", tmp_path / "run_b"
    run_script("--run", str(run_a), "--out", str(tmp_path / "out_a"), *common)
    killed = run_script(
        "--run", str(run_b), "--out", str(tmp_path / "out_b"), "--kill-after-epoch", "2", *common, check=False
    )
    assert killed.returncode == -9, killed.stderr
    assert not (run_b / "plans/epoch=3").exists()
    # epoch 2's records (the samples its plan kept) are in one part written by flush(), not folded yet
    kept = len(trained(tmp_path / "out_b", 0, 2))
    assert 0 < kept < 120
    parts = list((run_b / "losses/rank=0/epoch=2").glob("part-*.parquet"))
    assert len(parts) == 1 and pl.read_parquet(parts[0]).height == kept
    assert json.loads((run_b / "stats/epoch=2/rank=0.json").read_text())["recorded"] == kept
    run_script("--run", str(run_b), "--out", str(tmp_path / "out_b"), "--start-epoch", "3", *common)
    resumed = json.loads((tmp_path / "out_b" / "rank0-epoch3.json").read_text())
    assert resumed["superseded"] == []
    for e in range(5):
        assert plan_frame(run_a, e).equals(plan_frame(run_b, e)), f"plan of epoch {e} differs"
    assert table_frame(run_a).equals(table_frame(run_b))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_two_gloo_ranks_train_exactly_the_plan(tmp_path, context):
    urls = write_shards(tmp_path / "shards", 4, 30)  # 4 shards = 2 ranks x 2 workers
    run, out = tmp_path / "run", tmp_path / "out"
    port = str(free_port())
    epochs = 4 if context == "fork" else 2
    procs = []
    for rank in range(2):
        env = {
            **os.environ,
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": port,
            "RANK": str(rank),
            "WORLD_SIZE": "2",
            "LOCAL_RANK": str(rank),
        }
        procs.append(
            subprocess.Popen(
                [
                    PY,
                    str(SCRIPT),
                    "--run",
                    str(run),
                    "--shards",
                    *urls,
                    "--out",
                    str(out),
                    "--epochs",
                    str(epochs),
                    "--dist",
                    "--context",
                    context,
                ],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    for p in procs:
        stdout, stderr = p.communicate(timeout=300)
        assert p.returncode == 0, f"stdout:\n{stdout}\nstderr:\n{stderr}"
    for e in range(epochs):
        plan = pl.read_parquet(run / f"plans/epoch={e}/plan.parquet")
        kept = set(map(tuple, plan.filter(pl.col("keep")).select("shard", "key").rows()))
        r0, r1 = trained(out, 0, e), trained(out, 1, e)
        assert len(r0) == len(set(r0)) and len(r1) == len(set(r1)), "a sample trained twice"
        assert not set(r0) & set(r1), "ranks overlap"
        assert set(r0) | set(r1) == kept, f"epoch {e}: trained != plan"
        assert json.loads((run / f"plans/epoch={e}/summary.json").read_text())["n"] == 120
        # every trained sample's loss reached the table, with the epoch it was trained in
    table = table_frame(run)
    last = {(s, k): le for s, k, le in table.select("shard", "key", "last_epoch").rows()}
    for e in range(epochs):
        for sample in trained(out, 0, e) + trained(out, 1, e):
            assert last[sample] >= e
    final = set(trained(out, 0, epochs - 1)) | set(trained(out, 1, epochs - 1))
    assert {s for s, le in last.items() if le == epochs - 1} == final
    # the waiting rank's idle time is reported
    b1 = json.loads((out / f"rank1-epoch{epochs - 1}.json").read_text())["boundary"]
    assert set(b1) == {"compact_s", "plan_s", "wait_s"}
