"""Run directory: format file and version check, atomic publish, locks, fsspec URLs."""

import json
import os
import pickle
import socket
import subprocess
import sys

import pyarrow as pa
import pytest

from seta_stream._store.runfs import FORMAT_VERSION, RunDir
from seta_stream.errors import RunFormatError, RunLockedError


def test_create_and_reopen(tmp_path):
    run = RunDir(tmp_path / "r", create=True, settings={"shard_depth": 2})
    doc = json.loads((tmp_path / "r" / "seta-stream.json").read_text())
    assert doc == {  # one bucket: format version 1, which every earlier release reads
        "format": "seta-stream-run",
        "version": 1,
        "settings": {"shard_depth": 2, "ema_beta2": 0.9, "dataset_size": None, "buckets": None},
    }
    assert RunDir(tmp_path / "r").settings["shard_depth"] == 2
    assert run.settings["ema_beta2"] == 0.9


def test_missing_run_is_refused(tmp_path):
    with pytest.raises(RunFormatError, match=r"run directory .*/nope does not exist \(no seta-stream.json\)"):
        RunDir(tmp_path / "nope")
    (tmp_path / "plain").mkdir()
    with pytest.raises(RunFormatError, match="is not a seta_stream run"):
        RunDir(tmp_path / "plain")


def test_newer_version_and_foreign_format_refused(tmp_path):
    RunDir(tmp_path / "r", create=True)
    f = tmp_path / "r" / "seta-stream.json"
    f.write_text(json.dumps({"format": "seta-stream-run", "version": FORMAT_VERSION + 1}))
    with pytest.raises(
        RunFormatError, match=r"format version 3 is newer than this seta_stream understands \(<= 2\); upgrade"
    ):
        RunDir(tmp_path / "r")
    f.write_text(json.dumps({"format": "other"}))
    with pytest.raises(RunFormatError, match="format 'other', expected 'seta-stream-run'"):
        RunDir(tmp_path / "r")


def test_settings_are_fixed_and_validated(tmp_path):
    RunDir(tmp_path / "r", create=True)
    with pytest.raises(RunFormatError, match="ema_beta2: run has 0.9, asked 0.8"):
        RunDir(tmp_path / "r", create=True, settings={"ema_beta2": 0.8})
    with pytest.raises(RunFormatError, match=r"unknown run setting\(s\) \['bogus'\]"):
        RunDir(tmp_path / "q", create=True, settings={"bogus": 1})


@pytest.mark.skipif(os.geteuid() == 0, reason="root can write anywhere")
def test_unwritable_directory(tmp_path):
    d = tmp_path / "ro"
    d.mkdir()
    d.chmod(0o500)
    with pytest.raises(RunFormatError, match="is not writable"):
        RunDir(d / "run", create=True)


def test_unwritable_directory_as_root(tmp_path):
    # A path below a regular file can never be created, whoever we are.
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(
        RunFormatError,
        match=r"run directory .*/file/run is not writable \(.*\); expected a directory this process can create",
    ):
        RunDir(f / "run", create=True)


@pytest.mark.parametrize("scheme", ["local", "file", "memory"])
def test_publish_and_read_back(tmp_path, scheme):
    url = {"local": str(tmp_path / "r"), "file": f"file://{tmp_path}/r", "memory": f"memory://{tmp_path.name}/r"}[
        scheme
    ]
    run = RunDir(url, create=True)
    run.publish_json("state.json", {"a": 1})
    run.publish_parquet("table/t.parquet", pa.table({"x": [1, 2, 3]}))
    run.publish_arrow("plans/epoch=0/lookup.arrow", pa.table({"k": ["a"]}))
    assert run.read_json("state.json") == {"a": 1}
    assert run.read_parquet("table/t.parquet").column("x").to_pylist() == [1, 2, 3]
    assert run.glob("*/*.parquet") == ["table/t.parquet"]
    assert run.read_json("missing.json", default="d") == "d"
    clone = pickle.loads(pickle.dumps(run))
    assert clone.read_json("state.json") == {"a": 1}
    if scheme != "memory":
        leftovers = [p for p in os.listdir(tmp_path / "r" / "table") if p.startswith(".tmp-")]
        assert leftovers == []


def test_lock_excludes_and_reports_holder(tmp_path):
    run = RunDir(tmp_path / "r", create=True)
    with run.lock("compact"):
        with pytest.raises(RunLockedError, match=rf"locks/compact.lock is held by pid {os.getpid()}"):
            with run.lock("compact"):
                pass
    with run.lock("compact"):  # released
        pass


def test_stale_lock_of_killed_process_is_broken(tmp_path):
    run = RunDir(tmp_path / "r", create=True)
    code = (
        "import os, signal, sys; from seta_stream._store.runfs import RunDir\n"
        f"r = RunDir({str(tmp_path / 'r')!r})\n"
        "cm = r.lock('compact'); cm.__enter__(); os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code])
    assert proc.returncode == -9
    assert (tmp_path / "r" / "locks" / "compact.lock").exists()
    with run.lock("compact"):
        pass


def test_an_unreadable_lock_file_left_by_a_dead_writer_is_broken(tmp_path):
    """A lock file that is not JSON (empty: a writer of an earlier release killed between
    creating and writing it) is broken, not an error; lock files are now published whole."""
    run = RunDir(tmp_path / "r", create=True)
    (tmp_path / "r" / "locks").mkdir()
    (tmp_path / "r" / "locks" / "compact.lock").write_bytes(b"")
    with run.lock("compact"):
        holder = json.loads((tmp_path / "r" / "locks" / "compact.lock").read_text())
        assert (holder["pid"], holder["host"]) == (os.getpid(), socket.gethostname())
    assert sorted(os.listdir(tmp_path / "r" / "locks")) == []  # released; no temporary file left


def test_a_contended_lock_file_is_never_seen_partial(tmp_path):
    """Two processes take and release one lock 300 times each while this one reads the lock
    file: every read finds it absent or whole (the race that made two compactions at once fail:
    a reader found the file created but not yet written and took it for a dead holder's)."""
    RunDir(tmp_path / "r", create=True)
    code = (
        "from seta_stream._store.runfs import RunDir\n"
        f"r = RunDir({str(tmp_path / 'r')!r})\n"
        "for _ in range(300):\n    with r.lock('compact', wait=60, poll=0.001):\n        pass\n"
    )
    procs = [subprocess.Popen([sys.executable, "-c", code], stderr=subprocess.PIPE, text=True) for _ in range(2)]
    path, seen = tmp_path / "r" / "locks" / "compact.lock", []
    while any(p.poll() is None for p in procs):
        try:
            seen.append(path.read_bytes())
        except FileNotFoundError:
            pass
    errors = [p.communicate()[1] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], errors
    assert all(json.loads(data)["pid"] in {p.pid for p in procs} for data in seen)


@pytest.mark.parametrize("scheme", ["file", "memory"])
def test_parquet_parts_are_written_whole_in_row_order(tmp_path, scheme):
    import numpy as np
    import pyarrow.parquet as pq

    url = str(tmp_path / "r") if scheme == "file" else f"memory://parts-{tmp_path.name}"
    run = RunDir(url, create=True)
    n = 200_000
    table = pa.table({"x": np.arange(n), "s": pa.array([f"key-{i}" for i in range(n)])})
    pending = run.prepare_parquet_parts("out.parquet", table, part_rows=30_000, workers=2, compression="lz4")
    assert not run.exists("out.parquet")  # nothing visible before commit
    pending.commit()
    names = [f"part-{i:05d}.parquet" for i in range(7)]  # ceil(200,000 / 30,000)
    assert sorted(p.rsplit("/", 1)[-1] for p in run.fs.ls(run.path("out.parquet"), detail=False)) == names
    assert run.read_parquet("out.parquet").equals(table)
    assert run.read_parquet("out.parquet", columns=["s"]).column("s").to_pylist()[29_999:30_001] == [
        "key-29999",
        "key-30000",
    ]
    if scheme == "file":
        assert sorted(os.listdir(tmp_path / "r")) == ["out.parquet", "seta-stream.json"]
        meta = pq.ParquetFile(tmp_path / "r/out.parquet/part-00006.parquet").metadata
        assert meta.num_rows == 20_000 and meta.row_group(0).column(0).compression == "LZ4"
    # an empty table is one empty part with the schema
    run.publish_parquet_parts("empty.parquet", table.slice(0, 0), part_rows=10)
    assert run.fs.ls(run.path("empty.parquet"), detail=False)[0].endswith("/part-00000.parquet")
    assert run.read_parquet("empty.parquet").schema == table.schema
    with pytest.raises(ValueError, match="part_rows must be >= 1, got 0"):
        run.publish_parquet_parts("bad.parquet", table, part_rows=0)


@pytest.mark.parametrize("old", ["file", "folder"])
def test_parquet_parts_replace_an_old_file_or_folder(tmp_path, old):
    run = RunDir(tmp_path / "r", create=True)
    if old == "file":
        run.publish_parquet("out.parquet", pa.table({"x": [9, 9]}))
    else:
        run.publish_parquet_parts("out.parquet", pa.table({"x": list(range(10))}), part_rows=2)
    run.publish_parquet_parts("out.parquet", pa.table({"x": [1, 2, 3]}), part_rows=2)
    assert run.read_parquet("out.parquet").column("x").to_pylist() == [1, 2, 3]
    assert sorted(os.listdir(tmp_path / "r/out.parquet")) == ["part-00000.parquet", "part-00001.parquet"]
    assert sorted(os.listdir(tmp_path / "r")) == ["out.parquet", "seta-stream.json"]  # the old one is gone


@pytest.mark.parametrize("scheme", ["file", "memory"])
def test_parquet_parts_discarded_or_failing_leave_the_old_folder(tmp_path, scheme):
    import numpy as np

    url = str(tmp_path / "r") if scheme == "file" else f"memory://discard-{tmp_path.name}"
    run = RunDir(url, create=True)
    run.publish_parquet_parts("out.parquet", pa.table({"x": [1, 2, 3]}), part_rows=2)
    table = pa.table({"x": np.arange(500_000)})
    run.prepare_parquet_parts("out.parquet", table, part_rows=100_000).discard()  # e.g. the summary failed
    assert run.read_parquet("out.parquet").column("x").to_pylist() == [1, 2, 3]
    with pytest.raises(pa.ArrowException, match="no-such-codec"):  # an encoding error surfaces too
        run.prepare_parquet_parts("out.parquet", table, part_rows=100_000, compression="no-such-codec")
    if scheme == "memory":
        assert run.read_parquet("out.parquet").column("x").to_pylist() == [1, 2, 3]
        return
    with pytest.raises(pa.ArrowException, match="no-such-codec"):
        run.publish_parquet_parts("new.parquet", table, part_rows=100_000, compression="no-such-codec")
    assert sorted(os.listdir(tmp_path / "r")) == ["out.parquet", "seta-stream.json"]  # no temporary left
    assert run.read_parquet("out.parquet").column("x").to_pylist() == [1, 2, 3]
