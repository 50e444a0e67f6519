"""Crash safety with real processes: compactions SIGKILLed at every write step, concurrent
compactions, recorders killed or exiting without close(). After any crash a rerun must give
exactly the table of an undisturbed run, with every part folded once."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from seta_stream import RunDir, compact, load_table
from seta_stream._losses.compaction import FAULT_POINTS
from seta_stream.errors import RunLockedError
from seta_stream.testing import LossRecorder


def python(code: str, fault: str | None = None, **kwargs: object) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "SETA_STREAM_FAULT"}
    if fault is not None:
        env["SETA_STREAM_FAULT"] = fault
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, **kwargs)


def full_table(path: Path) -> pa.Table:
    return load_table(str(path), shard_as_dictionary=False)


def assert_same_table(a: pa.Table, b: pa.Table) -> None:
    assert a.schema.equals(b.schema) and a.num_rows == b.num_rows
    for name in a.column_names:
        x, y = a.column(name), b.column(name)
        if pa.types.is_floating(x.type):  # NaN-aware, bit for bit otherwise
            assert np.array_equal(x.to_numpy(), y.to_numpy(), equal_nan=True), name
        else:
            assert x.equals(y), name


def manifest(path: Path) -> dict:
    return json.loads((path / "table/manifest.json").read_text())


def url(key: str) -> str:
    return f"/d/s{int(key[1:]) % 3}.tar"


RECORDED: dict[tuple[str, str], list[tuple[int, int, float]]] = {}  # identity -> (epoch, rank, loss)


def record(run: RunDir, rank: int, epoch: int, keys: list[str], loss: np.ndarray, flush_rows: int) -> None:
    with LossRecorder(run, rank=rank, epoch=epoch, flush_rows=flush_rows) as rec:
        for lo in range(0, len(keys), 5):
            rec.record(keys[lo : lo + 5], [url(k) for k in keys[lo : lo + 5]], loss[lo : lo + 5])
    for k, v in zip(keys, loss.tolist()):
        RECORDED.setdefault((url(k).rsplit("/", 1)[1], k), []).append((epoch, rank, v))


@pytest.fixture(scope="module", params=[1, 3], ids=["one-bucket", "3-buckets"])
def template(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Path:
    """A run with a compacted epoch 0 (40 samples) and pending parts of epoch 1 (2 ranks, 2
    parts each: 10 new samples, a NaN per rank, k0 recorded twice by rank 0 and once by rank 1)
    plus a part with a foreign schema; one bucket (format version 1) or three (version 2)."""
    RECORDED.clear()  # the same records for either template
    root = tmp_path_factory.mktemp("template") / "run"
    run = RunDir(root, create=True, settings={"ema_beta2": 0.8, "buckets": request.param})
    for rank in range(2):
        keys = [f"k{i}" for i in range(rank, 40, 2)]
        record(run, rank, 0, keys, np.arange(len(keys), dtype=np.float32) / np.float32(7.0), flush_rows=9)
    compact(run)
    for rank in range(2):
        keys = [f"k{i}" for i in range(rank, 50, 2)] + ["k0"]
        loss = np.arange(len(keys), dtype=np.float32) / np.float32(3.0) + np.float32(rank)
        loss[3] = float("nan")
        record(run, rank, 1, keys, loss, flush_rows=11)
    bad = root / "losses/rank=1/epoch=1/part-R00001-E000001-00000000000000000001-deadbeef.parquet"
    pq.write_table(pa.table({"shard": ["s0.tar"], "key": ["x"]}), bad)  # foreign schema
    return root


def clone(template: Path, dst: Path) -> Path:
    shutil.copytree(template, dst)
    return dst


@pytest.fixture(scope="module")
def reference(template: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    ref = clone(template, tmp_path_factory.mktemp("ref") / "run")
    report = compact(str(ref), on_corrupt="skip")
    assert (report.parts_folded, report.rows_folded, report.new_samples) == (4, 52, 10)
    return ref


COMPACT = "from seta_stream import compact; compact({path!r}, on_corrupt='skip')"


@pytest.mark.parametrize("point", FAULT_POINTS)
def test_compaction_killed_at_each_step_converges_on_rerun(template, reference, tmp_path, point):
    buckets = RunDir(template).buckets
    if point in ("compact:after_bucket", "compact:bucket_written") and buckets == 1:
        pytest.skip("a one-bucket run has no bucket step")
    victim = clone(template, tmp_path / "run")
    before = manifest(victim)
    proc = python(COMPACT.format(path=str(victim)), fault=point)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    after_kill = manifest(victim)
    if point in ("compact:after_manifest", "compact:after_cleanup"):
        assert after_kill["generation"] == before["generation"] + 1  # published before the kill
    else:
        assert after_kill == before  # nothing published: the old table is still the table
        assert full_table(victim).num_rows == 40
    # a killed writer's leftovers: temporaries are ignored by readers and cleaned up
    (victim / "table/.tmp-0123-table-000009-dead.parquet").write_bytes(b"partial")
    (victim / "losses/rank=0/epoch=1/.tmp-0123-part.parquet").write_bytes(b"partial")

    again = compact(str(victim), on_corrupt="skip")  # the dead process's lock is broken (pid gone)
    assert_same_table(full_table(victim), full_table(reference))
    m, m_ref = manifest(victim), manifest(reference)
    assert sorted(m["folded"]) == sorted(m_ref["folded"]) and len(set(m["folded"])) == len(m["folded"]) == 8
    assert (
        m["quarantined"]
        == m_ref["quarantined"]
        == ["losses/rank=1/epoch=1/part-R00001-E000001-00000000000000000001-deadbeef.parquet"]
    )
    assert (m["rows"], m["n_ref"]) == (50, 50)
    if point in ("compact:after_manifest", "compact:after_cleanup"):
        assert again.parts_folded == 0
    else:
        assert (again.parts_folded, again.rows_folded, again.new_samples) == (4, 52, 10)
    assert not list((victim / "table").glob(".tmp-*"))
    # current + previous table (a file, or a folder of bucket files), and their keys files
    assert len(list((victim / "table").glob("table-*.parquet" if buckets == 1 else "gen-*"))) == 2
    if buckets > 1:
        assert sorted(p.name for p in (victim / "table").glob("gen-*/*")) == sorted(
            [f"part-{b:05d}.parquet" for b in range(3)] * 2
        )
        named = set(m["keys"]) | set(m["previous_keys"])
        assert {f"table/keys/{p.name}" for p in (victim / "table/keys").iterdir()} == named
    assert compact(str(victim)).parts_folded == 0


def test_reference_table_values(reference):
    """The table the crash tests converge to equals a direct per-record computation."""
    rows = {(r["shard"], r["key"]): r for r in full_table(reference).to_pylist()}
    assert set(rows) == set(RECORDED) and len(rows) == 50
    for ident, recs in RECORDED.items():
        s = 1 / 40 if int(ident[1][1:]) < 40 else 1 / 50  # n_ref of the compaction that first folds it
        finite = [v for _, _, v in recs if v == v]
        for v in finite:  # recs are in (epoch, rank, seq) order by construction
            s = 0.8 * s + (1 - 0.8) * v
        r = rows[ident]
        last = recs[-1]
        assert (r["seen"], r["nonfinite"], r["last_epoch"], r["last_rank"]) == (
            len(recs),
            len(recs) - len(finite),
            last[0],
            last[1],
        )
        assert r["ema"] == s  # exactly: the same float64 steps in the same order
        assert r["last_loss"] == last[2] or (r["last_loss"] != r["last_loss"] and last[2] != last[2])
    k0 = rows[("s0.tar", "k0")]
    assert (k0["seen"], k0["last_rank"], k0["last_loss"]) == (4, 1, pytest.approx(25 / 3 + 1))


def test_quarantine_then_kill_keeps_the_part_listed(template, reference, tmp_path):
    victim = clone(template, tmp_path / "run")
    proc = python(COMPACT.format(path=str(victim)), fault="compact:after_quarantine")
    assert proc.returncode == -signal.SIGKILL
    assert (victim / "losses-quarantine/rank=1/epoch=1").is_dir()
    report = compact(str(victim))  # nothing corrupt left under losses/: on_corrupt='raise' is fine
    assert report.quarantined == []  # moved by the killed run, still listed in the manifest
    assert manifest(victim)["quarantined"] == manifest(reference)["quarantined"]
    assert_same_table(full_table(victim), full_table(reference))


def test_second_compaction_is_refused_or_waits_for_the_lock(template, tmp_path):
    victim = clone(template, tmp_path / "run")
    code = (
        "import sys; from seta_stream import compact; from seta_stream.errors import RunLockedError\n"
        f"try:\n    r = compact({str(victim)!r}, on_corrupt='skip', lock_wait={{wait}})\n"
        "except RunLockedError as e:\n    print('LOCKED', e); sys.exit(3)\n"
        "print('FOLDED', r.parts_folded)\n"
    )
    run = RunDir(victim)
    with run.lock("compact"):  # this process is "the other compaction"
        refused = python(code.format(wait=0))
        assert refused.returncode == 3 and f"locks/compact.lock is held by pid {os.getpid()}" in refused.stdout
        waiting = subprocess.Popen([sys.executable, "-c", code.format(wait=60)], stdout=subprocess.PIPE, text=True)
        time.sleep(2.5)
        assert waiting.poll() is None  # still waiting for the lock
    out, _ = waiting.communicate(timeout=60)
    assert waiting.returncode == 0 and out.strip() == "FOLDED 4"
    with pytest.raises(RunLockedError):
        with run.lock("compact"):
            compact(run)


def test_killed_recorder_loses_only_its_buffer_and_nothing_is_folded_twice(tmp_path):
    path = str(tmp_path / "run")
    code = (
        "import os, signal, numpy as np; from seta_stream.testing import LossRecorder\n"
        f"r = LossRecorder({path!r}, flush_rows=6)\n"
        "for i in range(8):\n"
        "    r.record([f'k{4*i+j}' for j in range(4)], ['/d/s.tar'] * 4, np.full(4, float(i), np.float32))\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    assert python(code).returncode == -signal.SIGKILL
    # the buffer reaches 6 rows after every 2nd batch of 4: 4 parts of 8 rows, nothing lost
    first = compact(path)
    assert (first.parts_folded, first.rows_folded) == (4, 32)
    t = full_table(tmp_path / "run")
    assert sorted(t.column("key").to_pylist(), key=lambda k: int(k[1:])) == [f"k{i}" for i in range(32)]
    assert set(t.column("seen").to_pylist()) == {1}
    # the restarted training records again; its seq continues above the killed recorder's
    with LossRecorder(path, flush_rows=6) as rec:
        rec.record(["k0", "k1"], ["/d/s.tar"] * 2, np.array([9.0, 9.0], np.float32))
    second = compact(path)
    assert (second.parts_folded, second.rows_folded, second.new_samples) == (1, 2, 0)
    rows = {r["key"]: r for r in full_table(tmp_path / "run").to_pylist()}
    assert (rows["k0"]["seen"], rows["k0"]["last_loss"], rows["k2"]["seen"]) == (2, 9.0, 1)
    assert rows["k0"]["last_seq"] > rows["k31"]["last_seq"]
    assert compact(path).parts_folded == 0


def test_recorder_without_close_flushes_at_normal_exit(tmp_path):
    pytest.importorskip("torch")  # bfloat16 losses
    path = str(tmp_path / "run")
    code = (
        "import torch; from seta_stream.testing import LossRecorder\n"
        f"r = LossRecorder({path!r}, flush_rows=1000, epoch=2)\n"
        "r.record(['a', 'b', 'c'], ['/d/s.tar'] * 3, torch.tensor([1.0, 2.0, 3.0], dtype=torch.bfloat16))\n"
        "del_me = [r]  # still referenced at exit: atexit must flush it\n"
    )
    proc = python(code)
    assert proc.returncode == 0, proc.stderr
    assert compact(path).rows_folded == 3
    rows = {r["key"]: (r["last_loss"], r["last_epoch"]) for r in full_table(tmp_path / "run").to_pylist()}
    assert rows == {"a": (1.0, 2), "b": (2.0, 2), "c": (3.0, 2)}
