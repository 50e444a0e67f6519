"""plan_epoch: files and dtypes, idempotence, epoch order, settings, population, crash safety."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import SETA, hold_plan_parquet, seeded_run

from seta_stream import RunDir, load_plan, load_summary, plan_epoch
from seta_stream.errors import EpochOrderError, InvalidInputError, PlanMissingError


def test_plan_files_columns_and_summary(tmp_path):
    run = seeded_run(tmp_path / "r")
    summary = plan_epoch(run, 1, **SETA)
    plan = pq.read_table(tmp_path / "r/plans/epoch=1/plan.parquet")
    assert plan.schema.names == ["shard", "key", "uid", "loss", "cluster", "keep", "weight", "reason"]
    # the types as load_plan reads them, and as pyarrow reads the file from 17 on (before, it reads
    # the reason column's dictionary with int32 indices; the file is the same)
    types = [str(t) for t in load_plan(run, 1).schema.types]
    if int(pa.__version__.split(".")[0]) >= 17:
        assert [str(t) for t in plan.schema.types] == types
    assert types == [
        "dictionary<values=string, indices=int32, ordered=0>",
        "string",
        "uint64",
        "float",
        "int16",
        "bool",
        "float",
        "dictionary<values=string, indices=int8, ordered=0>",
    ]
    assert plan.num_rows == 200 == summary["n"]
    keep = plan.column("keep").to_numpy(zero_copy_only=False)
    assert int(keep.sum()) == summary["kept"]
    assert set(plan.column("weight").to_numpy()[keep]) == {1.0}
    assert set(plan.column("weight").to_numpy()[~keep]) == {0.0}
    assert summary["policy"] == "seta" and summary["epoch"] == 1 and summary["phase"] == "prune"
    assert summary["k_eff"] == 5 and summary["w"] == 3 and summary["s"] == 1
    assert sum(summary["cluster_sizes"]) == summary["n_downsampled"] - summary["n_unseen_in_R"] == 180
    assert summary["pruned_so_far"] == pytest.approx(1 - summary["kept"] / 200)
    reasons = set(plan.column("reason").to_pylist())
    assert reasons == {"window", "outside_window", "downsampled_out"}
    clusters = plan.column("cluster").to_numpy()
    in_window = (clusters >= 1) & (clusters <= 3)
    assert np.array_equal(keep, in_window)
    # stage file: one record batch per shard, same decisions
    import pyarrow.ipc as ipc

    stage = ipc.open_file(str(tmp_path / "r/plans/epoch=1/stage.arrow"))
    shards = ipc.open_file(str(tmp_path / "r/plans/epoch=1/shards.arrow")).read_all().to_pylist()
    assert stage.schema.names == ["uid", "keep", "weight_code"] and stage.num_record_batches == 4
    weights = json.loads(
        ipc.open_file(str(tmp_path / "r/plans/epoch=1/shards.arrow")).schema.metadata[b"seta_stream.stage"]
    )
    rows = stage.read_all().to_pydict()
    assert rows["uid"] == plan.column("uid").to_pylist() and rows["keep"] == plan.column("keep").to_pylist()
    assert [weights["weights"][c] for c in rows["weight_code"]] == plan.column("weight").to_pylist()
    assert [s["shard"] for s in shards] == [f"shard-{i}.tar" for i in range(4)]
    assert sum(s["n"] for s in shards) == 200 and sum(s["kept"] for s in shards) == summary["kept"]
    for s in shards:
        part = plan.slice(s["start"], s["n"])
        assert set(part.column("shard").to_pylist()) == {s["shard"]}
        assert s["kept"] == sum(part.column("keep").to_pylist())
    assert sorted(os.listdir(tmp_path / "r/plans/epoch=1")) == [
        "plan.parquet",
        "shards.arrow",
        "stage.arrow",
        "summary.json",
    ]
    assert os.listdir(tmp_path / "r/plans/epoch=1/plan.parquet") == ["part-00000.parquet"]
    meta = pq.ParquetFile(tmp_path / "r/plans/epoch=1/plan.parquet/part-00000.parquet").metadata
    assert [meta.schema.column(i).max_definition_level for i in range(meta.num_columns)] == [0] * 8  # required
    stats = {meta.schema.column(i).name: meta.row_group(0).column(i).is_stats_set for i in range(meta.num_columns)}
    assert stats == {
        "shard": False,
        "key": False,
        "uid": False,
        "loss": True,
        "cluster": True,
        "keep": False,
        "weight": True,
        "reason": False,
    }
    state = json.loads((tmp_path / "r/state.json").read_text())
    assert state["current_epoch"] == 1 and state["last_planned_epoch"] == 1
    assert state["history"] == {"1": {"n": 200, "kept": summary["kept"]}}


def test_planning_removes_what_a_killed_planner_left(tmp_path):
    run = seeded_run(tmp_path / "r")
    d = tmp_path / "r/plans/epoch=1"
    (d / ".tmp-0123-plan.parquet").mkdir(parents=True)
    (d / ".tmp-0123-plan.parquet/part-00000.parquet").write_bytes(b"half")
    (d / ".tmp-4567-keys.arrow").write_bytes(b"half")
    plan_epoch(run, 1, **SETA)
    assert sorted(os.listdir(d)) == ["plan.parquet", "shards.arrow", "stage.arrow", "summary.json"]


def test_plans_are_deterministic_and_reused(tmp_path):
    a, b = seeded_run(tmp_path / "a"), seeded_run(tmp_path / "b")
    sa, sb = plan_epoch(a, 1, **SETA), plan_epoch(b, 1, **SETA)
    assert load_plan(a, 1).equals(load_plan(b, 1))
    before = (tmp_path / "a/plans/epoch=1/plan.parquet").stat().st_mtime_ns
    assert plan_epoch(a, 1) == sa  # settings from state.json; existing plan returned
    assert (tmp_path / "a/plans/epoch=1/plan.parquet").stat().st_mtime_ns == before
    other_seed = plan_epoch(a, 1, force=True, seed=4)
    assert other_seed["seed"] == 4
    assert not load_plan(a, 1).equals(load_plan(b, 1))
    assert sorted(os.listdir(tmp_path / "a/plans/epoch=1")) == [  # the old folder was replaced, not kept
        "plan.parquet",
        "shards.arrow",
        "stage.arrow",
        "summary.json",
    ]
    assert sb["kept"] == sa["kept"]


def test_first_plan_needs_policy_and_epochs_and_settings_are_fixed(tmp_path):
    run = seeded_run(tmp_path / "r")
    with pytest.raises(InvalidInputError, match="first plan needs policy= and epochs="):
        plan_epoch(run, 0)
    plan_epoch(run, 0, **SETA)
    with pytest.raises(InvalidInputError, match=r"planned with seed=3, this call asks seed=5.*force=True"):
        plan_epoch(run, 1, seed=5)
    with pytest.raises(InvalidInputError, match="epoch 10 is outside the run's epochs 0..9"):
        plan_epoch(run, 10)
    with pytest.raises(ValueError, match=r"seta: r=0.95 is outside the valid range 0 <= r <= 0.9"):
        plan_epoch(tmp_path / "r", 2, params=dict(r=0.95), force=True)


def test_epoch_below_the_last_planned_one(tmp_path):
    run = seeded_run(tmp_path / "r")
    plan_epoch(run, 0, **SETA)
    plan_epoch(run, 3)
    assert plan_epoch(run, 0)["epoch"] == 0  # exists: returned as is
    with pytest.raises(EpochOrderError, match=r"epoch 2 has no plan but epoch 3 was already planned"):
        plan_epoch(run, 2)


def test_missing_plan_errors(tmp_path):
    run = seeded_run(tmp_path / "r")
    with pytest.raises(
        PlanMissingError,
        match=r"plans/epoch=4/summary.json: no plan for epoch 4; call seta_stream.plan_epoch\(run, 4\)",
    ):
        load_summary(run, 4)


def test_population_adds_unseen_rows_kept_by_seta(tmp_path):
    run = seeded_run(tmp_path / "r", n=50, shards=1)
    pop = [("shard-0.tar", f"k{i:04d}") for i in range(60)] + [("new.tar", "x")]
    s = plan_epoch(run, 1, **SETA, population=pop)
    plan = load_plan(run, 1)
    assert plan.num_rows == 61 and s["unseen"] == 11 and s["population_listed"] is True
    rows = {(r["shard"], r["key"]): r for r in plan.to_pylist()}
    for ident in [("shard-0.tar", f"k{i:04d}") for i in range(50, 60)] + [("new.tar", "x")]:
        assert rows[ident]["reason"] in ("unseen", "downsampled_out")
        assert rows[ident]["keep"] == (rows[ident]["reason"] == "unseen")


def test_empty_table_plans_an_empty_plan_with_absent_rule(tmp_path):
    run = RunDir(tmp_path / "r", create=True)
    s = plan_epoch(run, 0, **SETA)
    assert (s["n"], s["kept"], s["empty_plan_guard"]) == (0, 0, False)
    assert s["absent_rule"] == {"kind": "bernoulli", "fraction": 0.9, "stream": 1, "epoch": None}


@pytest.mark.parametrize(
    ("point", "buckets"),
    [(p, b) for p in ("plan:after_plan_file", "plan:after_summary") for b in (1, 3)] + [("plan:bucket_written", 3)],
)
def test_killed_planning_converges_on_rerun(tmp_path, point, buckets):
    ref, run = seeded_run(tmp_path / "ref", buckets=buckets), seeded_run(tmp_path / "r", buckets=buckets)
    plan_epoch(ref, 1, **SETA)
    code = (
        f"from seta_stream import plan_epoch; plan_epoch({str(tmp_path / 'r')!r}, 1, policy='seta', "
        "params=dict(r=0.1, k=5, alpha=0.6), epochs=10, seed=3)"
    )
    proc = subprocess.run([sys.executable, "-c", code], env={**os.environ, "SETA_STREAM_FAULT": point})
    assert proc.returncode == -9
    s = plan_epoch(run, 1, **SETA)
    assert load_plan(run, 1).equals(load_plan(ref, 1))
    assert s["kept"] == load_summary(ref, 1)["kept"]
    state = json.loads((tmp_path / "r/state.json").read_text())
    assert state["last_planned_epoch"] == 1 and state["current_epoch"] == 1
    files = {}
    for name in ("ref", "r"):
        root = tmp_path / name / "plans/epoch=1"
        files[name] = {str(f.relative_to(root)): f.read_bytes() for f in root.rglob("*") if f.is_file()}
        files[name].pop("summary.json")
    assert files["r"] == files["ref"]  # every plan file the same bytes, no leftover of the killed planner


def test_a_failing_policy_publishes_no_stage_file(tmp_path):
    """If the policy fails no file of the plan is published."""
    run = seeded_run(tmp_path / "r")
    with pytest.raises(ValueError, match="unknown parameter"):
        plan_epoch(run, 1, policy="seta", params={"no_such": 1}, epochs=10)
    d = tmp_path / "r/plans/epoch=1"
    assert not d.exists() or os.listdir(d) == []
    plan_epoch(run, 1, **SETA)
    assert sorted(os.listdir(d)) == ["plan.parquet", "shards.arrow", "stage.arrow", "summary.json"]


def test_planning_asks_numpy_for_normal_pages_and_restores_its_setting(tmp_path, monkeypatch):
    import seta_stream._planning.transaction as T
    import seta_stream._planning.tuning as P

    setter = P._madvise_hugepage_setter()
    assert setter is not None
    seen = []
    real_plan_params = T.plan_params

    def spy(*args, **kwargs):  # called inside plan_epoch: record NumPy's setting there
        previous = setter(False)
        setter(previous)
        seen.append(previous)
        return real_plan_params(*args, **kwargs)

    monkeypatch.setattr(T, "plan_params", spy)
    monkeypatch.delenv("NUMPY_MADVISE_HUGEPAGE", raising=False)
    run = seeded_run(tmp_path / "r")
    before = setter(True)
    try:
        plan_epoch(run, 1, **SETA)
        assert seen[-1] is False and setter(True) is True  # off inside, restored after
        monkeypatch.setenv("NUMPY_MADVISE_HUGEPAGE", "1")  # the user's choice is left alone
        plan_epoch(run, 2)
        assert seen[-1] is True and setter(True) is True
    finally:
        setter(before)


def test_the_lazy_imports_are_done_when_planning_returns(tmp_path, monkeypatch):
    """Planning imports polars and pandas on a thread of its own while it reads the table; the
    thread is joined when planning ends (a fork then must not inherit an import under way), a
    module that cannot be imported changes nothing, and a plan that exists imports nothing."""
    import threading
    import time

    import seta_stream._planning.tuning as P

    (tmp_path / "slow_import_probe.py").write_text("import time\ntime.sleep(0.5)\nDONE = True\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(P, "_LAZY_IMPORTS", ("no_such_module_anywhere", "slow_import_probe"))
    monkeypatch.delitem(sys.modules, "slow_import_probe", raising=False)
    started = time.perf_counter()
    with P.imports_beside():
        assert any(t.name == "seta-stream-imports" for t in threading.enumerate())
    assert sys.modules["slow_import_probe"].DONE and time.perf_counter() - started >= 0.5
    assert not any(t.name == "seta-stream-imports" for t in threading.enumerate())

    run = seeded_run(tmp_path / "run", n=200)
    monkeypatch.delitem(sys.modules, "slow_import_probe")
    plan_epoch(run, 0, **SETA)
    assert "slow_import_probe" in sys.modules  # imported, and joined, by the plan
    monkeypatch.delitem(sys.modules, "slow_import_probe")
    plan_epoch(run, 0)  # published already: returned as it is, without the imports
    assert "slow_import_probe" not in sys.modules


def _plan_files(root):
    return {str(f.relative_to(root)): f.read_bytes() for f in root.rglob("*") if f.is_file()}


_HELD_WRITER = """
import os, signal, threading, sys, time
import seta_stream._store.planfiles as P
import seta_stream._store.runfs as R

class HeldParquet:  # plan.parquet's parts are never written: the kill comes while they are held
    def __getattr__(self, name):
        return getattr(P.__dict__['_real_pq'], name)
    def write_table(self, *args, **kwargs):
        if 'plans/epoch=1/' in str(args[1] if len(args) > 1 else kwargs.get('where')):
            threading.Timer(1.0, lambda: os.kill(os.getpid(), signal.SIGKILL)).start()
            threading.Event().wait()
        return P.__dict__['_real_pq'].write_table(*args, **kwargs)

P._real_pq = P.pq
P.pq = R.pq = HeldParquet()
from seta_stream import plan_epoch
plan_epoch({run!r}, 1, policy='seta', params=dict(r=0.1, k=5, alpha=0.6), epochs=10, seed=3)
"""


def test_a_planner_killed_while_plan_parquet_is_written_publishes_no_plan(tmp_path):
    """plan.parquet is published before the summary: a planner killed while its parts are
    written leaves the stage files at most, no summary, so no plan for training or for a
    query; the next plan_epoch of that epoch makes the whole plan, the same bytes."""
    ref, run = seeded_run(tmp_path / "ref"), seeded_run(tmp_path / "r")
    plan_epoch(ref, 1, **SETA)
    proc = subprocess.run([sys.executable, "-c", _HELD_WRITER.format(run=str(tmp_path / "r"))])
    assert proc.returncode == -9
    root = tmp_path / "r/plans/epoch=1"
    left = _plan_files(root)
    assert {k for k in left if not k.startswith(".tmp-")} == {"shards.arrow", "stage.arrow"}
    assert not (tmp_path / "r/state.json").exists()
    for read in (lambda: load_summary(run, 1), lambda: load_plan(run, 1)):
        with pytest.raises(PlanMissingError, match=r"plans/epoch=1/summary\.json: no plan for epoch 1"):
            read()
    s = plan_epoch(run, 1, **SETA)  # the lock of the killed planner is broken (its pid is gone)
    assert s == load_summary(ref, 1)
    assert _plan_files(root) == _plan_files(tmp_path / "ref/plans/epoch=1")  # the same bytes; no leftover
    assert not list((tmp_path / "r/locks").iterdir())


def test_plan_epoch_returns_once_plan_parquet_is_published(tmp_path, monkeypatch):
    """plan_epoch does not return, and no summary is published, while plan.parquet's parts are
    still being written; when it returns, the folder holds every file and the lock is free."""
    import threading

    release = threading.Event()
    written = hold_plan_parquet(monkeypatch, 1, release)
    run = seeded_run(tmp_path / "r")
    out: list[dict] = []
    planner = threading.Thread(target=lambda: out.append(plan_epoch(run, 1, **SETA)))
    planner.start()
    root = tmp_path / "r/plans/epoch=1"
    deadline = time.monotonic() + 30
    while not (root / "shards.arrow").exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.3)
    assert planner.is_alive() and not out and not (root / "summary.json").exists()
    assert not any("plans/epoch=1" in w for w in written)
    release.set()
    planner.join(30)
    assert sorted(p.name for p in root.iterdir()) == ["plan.parquet", "shards.arrow", "stage.arrow", "summary.json"]
    assert any("plans/epoch=1" in w for w in written)
    assert load_plan(run, 1).num_rows == out[0]["n"] == 200
    assert not list((tmp_path / "r/locks").iterdir())


def test_a_plan_parquet_lost_or_cut_is_named_and_force_makes_the_plan_again(tmp_path, capsys):
    """A plan folder whose plan.parquet is missing (as an earlier version could leave it) or
    lost rows by hand: training is unaffected, load_plan and `seta-stream inspect` name the
    file and the fix in one line, plan_epoch returns the published plan as it is (plans are
    never recomputed silently), and force=True makes the whole plan again, the same bytes."""
    import shutil

    from seta_stream._cli import main
    from seta_stream._store.planfiles import read_stage_lookup

    run = seeded_run(tmp_path / "r")
    s = plan_epoch(run, 1, **SETA)
    root = tmp_path / "r/plans/epoch=1"
    before = _plan_files(root)
    stage = read_stage_lookup(run, 1)
    part = root / "plan.parquet/part-00000.parquet"
    pq.write_table(pq.read_table(part).slice(0, 150), part)  # rows lost
    with pytest.raises(PlanMissingError, match=r"plan\.parquet: 150 rows, its summary says 200; expected"):
        load_plan(run, 1)
    shutil.rmtree(root / "plan.parquet")
    with pytest.raises(PlanMissingError) as err:
        load_plan(run, 1)
    assert str(err.value) == (
        f"{root / 'plan.parquet'}: missing; expected the plan's rows, published before its summary.json. A plan "
        "published by an earlier version of seta_stream can lack it (that version published plan.parquet after the "
        "summary, and its planner was stopped in between), or the folder was changed by hand. Training is unaffected "
        "(the stage reads stage.arrow); plan_epoch(run, 1, force=True) makes the whole plan again, the same plan "
        "while the loss table is the one it was made from (before the epoch's losses are compacted)"
    )
    assert read_stage_lookup(run, 1).shards == stage.shards
    assert plan_epoch(run, 1) == s and not (root / "plan.parquet").exists()
    assert main(["inspect", str(tmp_path / "r"), "--epoch", "1"]) == 2  # one line, no traceback
    err_text = capsys.readouterr().err.strip()
    assert len(err_text.splitlines()) == 1 and f"{root / 'plan.parquet'}: missing; expected" in err_text
    assert plan_epoch(run, 1, force=True) == s
    assert _plan_files(root) == before


def test_the_plan_from_the_table_files_shard_runs_is_the_plan_from_its_shard_column(tmp_path, monkeypatch):
    """Planning takes the shard ranges from the table file's footer (written by compaction)
    instead of reading its shard column: every plan file is the same bytes either way, also
    with a table file of several row groups (the chunks a read of the column has)."""
    import seta_stream._planning.transaction as PL
    import seta_stream._store.table as T
    from seta_stream._store.table import table_shard_runs

    monkeypatch.setitem(T.TABLE_WRITE_OPTIONS, "row_group_size", 64)
    run = seeded_run(tmp_path / "r", n=300, shards=7)
    manifest = json.loads((tmp_path / "r/table/manifest.json").read_text())
    runs = table_shard_runs(run, manifest)
    assert runs is not None
    assert runs.names == [f"shard-{i}.tar" for i in range(7)]
    assert runs.stops.tolist() == np.cumsum([43, 43, 43, 43, 43, 43, 42]).tolist()
    assert runs.starts.tolist() == [0, *runs.stops[:-1].tolist()]
    assert runs.chunk_rows == [64, 64, 64, 64, 44]
    plan_epoch(run, 1, **SETA)
    root = tmp_path / "r/plans/epoch=1"
    fast = _plan_files(root)
    read_columns = []
    monkeypatch.setattr(PL, "table_shard_runs", lambda run, manifest: read_columns.append(1))  # None: the column
    plan_epoch(run, 1, force=True)
    assert read_columns == [1]
    assert _plan_files(root) == fast


def test_a_table_file_without_shard_runs_is_planned_from_its_shard_column(tmp_path):
    from seta_stream._store.table import SHARD_RUNS_META, table_shard_runs

    ref, run = seeded_run(tmp_path / "ref"), seeded_run(tmp_path / "r")
    manifest = json.loads((tmp_path / "r/table/manifest.json").read_text())
    path = tmp_path / "r" / manifest["table"]
    table = pq.read_table(path)
    meta = dict(table.schema.metadata)
    del meta[SHARD_RUNS_META]  # a table file of an earlier version
    pq.write_table(table.replace_schema_metadata(meta), path)
    assert table_shard_runs(run, manifest) is None
    bad = {**meta, SHARD_RUNS_META: b'{"names":["shard-0.tar","shard-1.tar"],"rows":[100,99]}'}
    pq.write_table(table.replace_schema_metadata(bad), path)  # runs that miss a row: not used
    assert table_shard_runs(run, manifest) is None
    plan_epoch(ref, 1, **SETA)
    plan_epoch(run, 1, **SETA)
    assert load_plan(run, 1).equals(load_plan(ref, 1))
