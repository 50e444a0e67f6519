"""Compaction: exact folding, EMA, idempotence, corrupt parts, locks, crash safety (real kills)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from seta_stream import RunDir, compact, load_table
from seta_stream._store.table import TABLE_SCHEMA
from seta_stream.errors import CorruptPartError, RunLockedError, SampleIdCollisionError
from seta_stream.testing import LossRecorder


def f32(values):
    """Per-sample losses as a NumPy training loop passes them to LossRecorder."""
    return np.asarray(values, dtype=np.float32)


def record_epochs(run, epochs=3, ranks=2, n=12, flush_rows=5):
    """Deterministic records: loss = (rank + 1) * 10 + epoch + i / 100 for key k{i} of s{rank}."""
    expected = {}
    for e in range(epochs):
        for rank in range(ranks):
            with LossRecorder(run, rank=rank, epoch=e, flush_rows=flush_rows) as rec:
                for i in range(0, n, 4):
                    keys = [f"k{j}" for j in range(i, min(n, i + 4))]
                    urls = [f"/data/s{j % 2}.tar" for j in range(i, min(n, i + 4))]
                    losses = f32([(rank + 1) * 10 + e + j / 100 for j in range(i, i + len(keys))])
                    rec.record(keys, urls, losses)
                    for k, u, v in zip(keys, urls, losses.tolist()):
                        expected.setdefault((u.rsplit("/", 1)[1], k), []).append((e, rank, v))
    return expected


def test_table_rows_match_a_direct_computation(tmp_path):
    run = RunDir(tmp_path / "r", create=True, settings={"ema_beta2": 0.8})
    expected = record_epochs(run)
    report = compact(run)
    assert report.new_samples == len(expected) and report.rows_folded == 72
    table = load_table(run)
    assert table.schema.names == [
        "shard",
        "key",
        "uid",
        "last_loss",
        "last_epoch",
        "seen",
        "nonfinite",
        "ema",
        "last_rank",
        "last_seq",
        "loss_count",
        "loss_mean",
        "loss_m2",
    ]
    rows = {(r["shard"], r["key"]): r for r in table.to_pylist()}
    assert set(rows) == set(expected)
    n_ref = len(expected)
    for ident, recs in expected.items():
        recs = sorted(recs, key=lambda x: (x[0], x[1]))
        s = 1.0 / n_ref
        for _, _, v in recs:  # decoupled EMA, one step per record in (epoch, rank, seq) order
            s = 0.8 * s + (1 - 0.8) * float(np.float32(v))
        r = rows[ident]
        assert r["seen"] == len(recs)
        assert r["last_loss"] == pytest.approx(recs[-1][2], abs=1e-6)
        assert (r["last_epoch"], r["last_rank"]) == recs[-1][:2]
        assert r["ema"] == s  # exactly: the same float64 steps in the same order
        k, mean, m2 = 0, 0.0, 0.0
        for _, _, v in recs:  # Welford, one step per finite record in the same order
            x = float(np.float32(v))
            k += 1
            d = x - mean
            mean = x if k == 1 else mean + d / k
            m2 = 0.0 if k == 1 else m2 + d * (x - mean)
        assert (r["loss_count"], r["loss_mean"], r["loss_m2"]) == (len(recs), mean, m2)
    # sorted by (shard, uid)
    pairs = list(zip(table.column("shard").to_pylist(), table.column("uid").to_pylist()))
    assert pairs == sorted(pairs)


def test_incremental_equals_one_shot_and_is_idempotent(tmp_path):
    # with a fixed dataset_size the EMA start value 1/n does not depend on when a sample is folded
    settings = {"dataset_size": 100}
    a = RunDir(tmp_path / "a", create=True, settings=settings)
    b = RunDir(tmp_path / "b", create=True, settings=settings)
    for e in range(3):
        for run in (a, b):
            with LossRecorder(run, epoch=e) as rec:
                rec.record(["x", "y", f"new{e}"], ["s.tar"] * 3, f32([1.0 + e, 2.0, 3.0]))
        compact(a)  # after every epoch
    compact(b)  # once at the end
    cols = ["shard", "key", "uid", "last_loss", "last_epoch", "seen", "nonfinite", "ema", "last_rank"]
    cols += ["loss_count", "loss_mean", "loss_m2"]
    ta, tb = load_table(a).select(cols), load_table(b).select(cols)
    assert ta.to_pylist() == tb.to_pylist()  # same rows, same order, EMA bit for bit
    again = compact(a)
    assert (again.parts_folded, again.rows_folded) == (0, 0)
    assert load_table(a).equals(load_table(a))
    manifest = json.loads((tmp_path / "a/table/manifest.json").read_text())
    assert len(manifest["folded"]) == 3 and manifest["generation"] == 3
    assert (manifest["rows"], manifest["n_ref"]) == (5, 100)


def test_empty_run_and_empty_table(tmp_path):
    run = RunDir(tmp_path / "r", create=True)
    assert load_table(run).schema.equals(TABLE_SCHEMA) and load_table(run).num_rows == 0
    assert load_table(run, columns=["uid", "ema"]).schema.names == ["uid", "ema"]
    report = compact(run)
    assert (report.parts_folded, report.samples_total, report.generation) == (0, 0, 0)
    assert not (tmp_path / "r/table/manifest.json").exists()


def test_n_ref_is_the_table_size_after_the_first_fold_of_each_sample(tmp_path):
    run = RunDir(tmp_path / "r", create=True, settings={"ema_beta2": 0.5})
    with LossRecorder(run) as rec:
        rec.record(["a", "b"], ["s.tar"] * 2, f32([1.0, 2.0]))
    compact(run)
    with LossRecorder(run, epoch=1) as rec:
        rec.record(["a", "c", "d"], ["s.tar"] * 3, f32([3.0, 4.0, float("inf")]))
    report = compact(run)
    assert (report.new_samples, report.samples_total, report.nonfinite) == (2, 4, 1)
    rows = {r["key"]: r for r in load_table(run, shard_as_dictionary=False).to_pylist()}
    assert rows["a"]["ema"] == 0.5 * (0.5 * (1 / 2) + 0.5 * 1.0) + 0.5 * 3.0
    assert rows["c"]["ema"] == 0.5 * (1 / 4) + 0.5 * 4.0  # first folded when the table had 4 rows
    assert rows["d"]["ema"] == 1 / 4 and rows["d"]["nonfinite"] == 1 and rows["d"]["seen"] == 1
    assert json.loads((tmp_path / "r/table/manifest.json").read_text())["n_ref"] == 4
    # rows stay sorted by (shard, uid) when new samples are merged in
    t = load_table(run, shard_as_dictionary=False)
    pairs = list(zip(t.column("shard").to_pylist(), t.column("uid").to_pylist()))
    assert pairs == sorted(pairs)


def test_late_part_of_an_older_epoch_does_not_replace_last_loss(tmp_path):
    run = RunDir(tmp_path / "r", create=True)
    with LossRecorder(run, rank=0, epoch=1) as rec:
        rec.record(["a"], ["s.tar"], f32([5.0]))
    compact(run)
    with LossRecorder(run, rank=1, epoch=0) as rec:  # a slow rank's part of epoch 0 arrives late
        rec.record(["a"], ["s.tar"], f32([7.0]))
    compact(run)
    (row,) = load_table(run).to_pylist()
    assert (row["last_loss"], row["last_epoch"], row["last_rank"], row["seen"]) == (5.0, 1, 0, 2)


def write_part(run_dir, name, table, metadata=None):
    path = run_dir / "losses/rank=0/epoch=0" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    if metadata is not None:
        table = table.replace_schema_metadata(metadata)
    pq.write_table(table, path)
    return path


def good_part_table(keys=("a",)):
    from seta_stream.ids import sample_uid

    n = len(keys)
    return pa.table(
        {
            "shard": ["s.tar"] * n,
            "key": list(keys),
            "uid": pa.array([sample_uid("s.tar", k) for k in keys], pa.uint64()),
            "loss": pa.array([1.0] * n, pa.float32()),
            "epoch": pa.array([0] * n, pa.int32()),
            "rank": pa.array([0] * n, pa.int32()),
            "seq": pa.array(list(range(n)), pa.int64()),
        }
    )


META = {b"seta_stream.format_version": b"1"}


@pytest.mark.parametrize(
    ("kind", "message"),
    [
        ("truncated", r"part-bad.parquet: cannot be read as Parquet .*truncated or foreign file"),
        ("schema", r"part-bad.parquet: wrong schema: missing column 'loss' \(float\)"),
        ("dtype", r"part-bad.parquet: wrong schema: column 'loss' is string, expected float"),
        ("newer", r"part-bad.parquet: part format version '2', this seta_stream reads versions 1..1; upgrade"),
        ("foreign", r"part-bad.parquet: no 'seta_stream.format_version' metadata"),
    ],
)
def test_corrupt_parts_are_named_and_can_be_quarantined(tmp_path, kind, message):
    run = RunDir(tmp_path / "r", create=True)
    with LossRecorder(run) as rec:
        rec.record(["good"], ["s.tar"], f32([1.0]))
    t = good_part_table()
    if kind == "truncated":
        path = write_part(tmp_path / "r", "part-bad.parquet", t, META)
        path.write_bytes(path.read_bytes()[:-40])
    elif kind == "schema":
        write_part(tmp_path / "r", "part-bad.parquet", t.drop_columns(["loss"]), META)
    elif kind == "dtype":
        write_part(tmp_path / "r", "part-bad.parquet", t.set_column(3, "loss", pa.array(["x"])), META)
    elif kind == "newer":
        write_part(tmp_path / "r", "part-bad.parquet", t, {b"seta_stream.format_version": b"2"})
    else:
        write_part(tmp_path / "r", "part-bad.parquet", t, {})
    with pytest.raises(CorruptPartError, match=message) as info:
        compact(run)
    assert "on_corrupt='skip'" in str(info.value)
    assert not (tmp_path / "r/table/manifest.json").exists()  # nothing half-done
    report = compact(run, on_corrupt="skip")
    assert report.quarantined == ["losses/rank=0/epoch=0/part-bad.parquet"]
    assert (tmp_path / "r/losses-quarantine/rank=0/epoch=0/part-bad.parquet").exists()
    assert load_table(run).column("key").to_pylist() == ["good"]
    manifest = json.loads((tmp_path / "r/table/manifest.json").read_text())
    assert manifest["quarantined"] == ["losses/rank=0/epoch=0/part-bad.parquet"]


def test_a_compaction_whose_only_part_is_quarantined_publishes_an_empty_table(tmp_path):
    run = RunDir(tmp_path / "r", create=True)
    write_part(tmp_path / "r", "part-bad.parquet", good_part_table().drop_columns(["loss"]), META)
    report = compact(run, on_corrupt="skip")
    assert report.quarantined == ["losses/rank=0/epoch=0/part-bad.parquet"]
    assert (report.parts_folded, report.rows_folded, report.samples_total, report.generation) == (0, 0, 0, 1)
    assert load_table(run).num_rows == 0 and load_table(run).schema.equals(TABLE_SCHEMA)
    manifest = json.loads((tmp_path / "r/table/manifest.json").read_text())
    assert (manifest["folded"], manifest["rows"], manifest["n_ref"]) == ([], 0, 0)
    with LossRecorder(run) as rec:
        rec.record(["good"], ["s.tar"], f32([1.0]))
    assert compact(run).new_samples == 1
    assert load_table(run).column("key").to_pylist() == ["good"]


def test_part_with_wrong_uids_is_rejected(tmp_path):
    run = RunDir(tmp_path / "r", create=True)
    t = good_part_table(("a",)).set_column(2, "uid", pa.array([12345], pa.uint64()))
    write_part(tmp_path / "r", "part-x.parquet", t, META)
    with pytest.raises(
        CorruptPartError,
        match=r"part-x.parquet: record \('s.tar', 'a'\) carries uid 0x0000000000003039, expected 0x.*incompatible",
    ):
        compact(run)
    with LossRecorder(run) as rec:
        rec.record(["good"], ["s.tar"], f32([1.0]))
    report = compact(run, on_corrupt="skip")
    assert report.quarantined == ["losses/rank=0/epoch=0/part-x.parquet"] and report.parts_folded == 1
    assert load_table(run).column("key").to_pylist() == ["good"]


def test_uid_collisions_are_rejected(tmp_path, monkeypatch):
    # a real 64-bit collision cannot be constructed; make every key of the same shard collide
    import seta_stream.ids as ids

    fake = lambda shards, keys: np.full(len(keys), 42, dtype=np.uint64)  # noqa: E731
    monkeypatch.setattr(ids, "sample_uids", fake)
    monkeypatch.setattr("seta_stream._store.parts.sample_uids", fake)
    monkeypatch.setattr("seta_stream._losses.fold.sample_uids", fake)
    run = RunDir(tmp_path / "r", create=True)
    with LossRecorder(run) as rec:
        rec.record(["a"], ["s.tar"], f32([1.0]))
    compact(run)
    with LossRecorder(run) as rec:
        rec.record(["bb"], ["s.tar"], f32([1.0]))
    with pytest.raises(
        SampleIdCollisionError,
        match=r"\('s.tar', 'bb'\) \(recorded in .*\) has uid 0x0+2a, which the table already holds for \('s.tar', 'a'",
    ):
        compact(run)
    run2 = RunDir(tmp_path / "r2", create=True)
    with LossRecorder(run2) as rec:
        rec.record(["a", "bb"], ["s.tar", "t.tar"], f32([1.0, 2.0]))
    with pytest.raises(
        SampleIdCollisionError, match=r"has uid 0x000000000000002a, which \(.t.tar., .bb.\) \(recorded in .*\) also has"
    ):
        compact(run2)


def test_same_key_in_two_shards_is_two_samples(tmp_path):
    with LossRecorder(tmp_path / "r") as rec:
        rec.record(["k", "k"], ["/a/one.tar", "/a/two.tar"], f32([1.0, 2.0]))
    compact(tmp_path / "r")
    rows = sorted((r["shard"], r["key"], r["last_loss"]) for r in load_table(tmp_path / "r").to_pylist())
    assert rows == [("one.tar", "k", 1.0), ("two.tar", "k", 2.0)]


def test_keys_with_dots_slashes_spaces_and_unicode_round_trip(tmp_path):
    keys = ["a.b.c", "dir/sub/x", "with space", "ключ-ü", "emoji🙂"]
    with LossRecorder(tmp_path / "r") as rec:
        rec.record(keys, ["s.tar"] * 5, np.arange(5, dtype=np.float32))
    compact(tmp_path / "r")
    t = load_table(tmp_path / "r")
    assert dict(zip(t.column("key").to_pylist(), t.column("last_loss").to_pylist())) == {
        k: float(i) for i, k in enumerate(keys)
    }


def test_concurrent_compaction_is_refused_with_the_holder_named(tmp_path):
    run = RunDir(tmp_path / "r", create=True)
    with run.lock("compact"):
        with pytest.raises(RunLockedError, match=rf"locks/compact.lock is held by pid {os.getpid()}"):
            compact(run)


def test_two_compaction_processes_at_once_leave_a_consistent_table(tmp_path):
    run = RunDir(tmp_path / "r", create=True)
    with LossRecorder(run, flush_rows=500) as rec:
        for i in range(0, 20000, 500):
            rec.record(
                [f"k{j}" for j in range(i, i + 500)],
                ["s.tar"] * 500,
                np.random.default_rng(i).random(500, dtype=np.float32),
            )
    code = (
        "import sys; from seta_stream import compact; from seta_stream.errors import RunLockedError\n"
        f"try:\n    r = compact({str(tmp_path / 'r')!r}); print('done', r.parts_folded)\n"
        "except RunLockedError as e:\n    print('locked', e)\n"
    )
    procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=120)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs)
    done = [o for o in outs if o.startswith("done")]
    assert len(done) >= 1 and all(o.startswith(("done", "locked")) for o in outs)
    assert load_table(run).num_rows == 20000
    assert compact(run).parts_folded == 0


@pytest.mark.parametrize("point", ["compact:after_read", "compact:after_table_write", "compact:after_manifest"])
def test_killed_compaction_converges_on_rerun(tmp_path, point):
    def make(path):
        run = RunDir(path, create=True)
        for e in range(2):
            with LossRecorder(run, epoch=e, flush_rows=7) as rec:
                rec.record([f"k{i}" for i in range(20)], ["s.tar"] * 20, np.arange(20, dtype=np.float32) + e)
        return run

    ref, run = make(tmp_path / "ref"), make(tmp_path / "r")
    compact(ref)
    code = f"from seta_stream import compact; compact({str(tmp_path / 'r')!r})"
    proc = subprocess.run([sys.executable, "-c", code], env={**os.environ, "SETA_STREAM_FAULT": point})
    assert proc.returncode == -9
    compact(run, lock_wait=0)  # the dead process's lock is broken (same host, pid gone)
    cols = ["shard", "key", "uid", "last_loss", "last_epoch", "seen", "nonfinite", "ema"]
    assert load_table(run).select(cols).equals(load_table(ref).select(cols))
    m_ref = json.loads((tmp_path / "ref/table/manifest.json").read_text())
    m = json.loads((tmp_path / "r/table/manifest.json").read_text())
    assert len(m["folded"]) == len(m_ref["folded"]) == len(set(m["folded"])) == 2
    assert m["rows"] == 20


@pytest.mark.parametrize("scheme", ["memory", "file"])
def test_record_compact_plan_on_fsspec_urls(tmp_path, scheme):
    from seta_stream import load_plan, plan_epoch

    url = f"memory://fsspec-{tmp_path.name}/run" if scheme == "memory" else f"file://{tmp_path}/run"
    with LossRecorder(url, flush_rows=3) as rec:
        rec.record(["a", "b", "c", "d"], ["s0.tar"] * 4, f32([1.0, 2.0, 3.0, 4.0]))
    report = compact(url)
    assert (report.parts_folded, report.samples_total) == (1, 4)
    plan_epoch(url, 1, policy="infobatch", params={"r": 0.5}, epochs=4, seed=0)
    plan = load_plan(url, 1)
    assert sorted(plan.column("key").to_pylist()) == ["a", "b", "c", "d"]
    # mu = 2.5: a, b below the mean, floor(0.5 * 2) = 1 of them kept with weight 2
    weights = dict(zip(plan.column("key").to_pylist(), plan.column("weight").to_pylist()))
    assert weights["c"] == weights["d"] == 1.0 and sorted([weights["a"], weights["b"]]) == [0.0, 2.0]


def test_a_sample_repeated_within_one_part_is_folded_step_by_step(tmp_path):
    # e.g. a sampler that draws with replacement: the records of one part are applied in seq order
    run = RunDir(tmp_path / "r", create=True, settings={"ema_beta2": 0.7, "dataset_size": 10})
    keys = ["a", "b", "a", "c", "a", "b"]
    values = [1.0, 2.0, 3.0, 4.0, float("nan"), 6.0]
    with LossRecorder(run, flush_rows=100) as rec:
        rec.record(keys, ["s.tar"] * 6, f32(values))
    report = compact(run)
    assert (report.parts_folded, report.rows_folded, report.new_samples, report.nonfinite) == (1, 6, 3, 1)
    rows = {r["key"]: r for r in load_table(run).to_pylist()}
    for key in "abc":
        s = 1 / 10
        mine = [v for k, v in zip(keys, values) if k == key]
        for v in mine:
            if v == v:
                s = 0.7 * s + (1 - 0.7) * v
        assert rows[key]["ema"] == s and rows[key]["seen"] == len(mine)
    assert np.isnan(rows["a"]["last_loss"]) and rows["a"]["nonfinite"] == 1 and rows["b"]["last_loss"] == 6.0
    assert rows["b"]["last_seq"] - rows["a"]["last_seq"] == 1  # records 4 and 5 of the part


def test_progress_bar_reports_parts(tmp_path, capsys):
    with LossRecorder(tmp_path / "r", flush_rows=2) as rec:
        rec.record(["a", "b"], ["s.tar"] * 2, np.arange(2, dtype=np.float32))
        rec.record(["c", "d"], ["s.tar"] * 2, np.arange(2, dtype=np.float32))
    report = compact(tmp_path / "r", progress=True)
    assert report.parts_folded == 2
    err = capsys.readouterr().err
    assert "compact: folding parts" in err and "2/2" in err


@pytest.mark.parametrize("max_pieces", [0, 1 << 14])
def test_new_samples_are_merged_in_order_by_slices_or_by_one_take(tmp_path, monkeypatch, max_pieces):
    monkeypatch.setattr("seta_stream._losses.fold._MAX_KEY_PIECES", max_pieces)
    run = RunDir(tmp_path / "r", create=True)
    with LossRecorder(run) as rec:
        rec.record(
            [f"k{i}" for i in range(0, 40, 2)], [f"/d/s{i % 4}.tar" for i in range(0, 40, 2)], np.zeros(20, np.float32)
        )
    compact(run)
    with LossRecorder(run, epoch=1) as rec:  # new keys in existing shards, a new shard, known keys
        keys = [f"k{i}" for i in range(40)] + ["z0", "z1"]
        rec.record(keys, [f"/d/s{i % 4}.tar" for i in range(40)] + ["/d/a-new.tar"] * 2, np.ones(42, np.float32))
    assert compact(run).new_samples == 22
    t = load_table(run, shard_as_dictionary=False)
    rows = list(zip(t.column("shard").to_pylist(), t.column("uid").to_pylist()))
    assert rows == sorted(rows) and len(rows) == 42
    expected = {(f"s{i % 4}.tar", f"k{i}"): 2 - i % 2 for i in range(40)} | {
        ("a-new.tar", "z0"): 1,
        ("a-new.tar", "z1"): 1,
    }
    assert (
        dict(zip(zip(t.column("shard").to_pylist(), t.column("key").to_pylist()), t.column("seen").to_pylist()))
        == expected
    )
    from seta_stream.ids import sample_uids

    assert np.array_equal(sample_uids(t.column("shard"), t.column("key")), t.column("uid").to_numpy())


@pytest.mark.parametrize("buckets", [1, 2])
def test_a_table_written_before_the_history_columns_opens_and_starts_its_history(tmp_path, buckets):
    """Table files of earlier releases lack loss_count, loss_mean and loss_m2: every reader gives
    their rows no history (count 0, NaN), and the next compaction starts it with its records."""
    from seta_stream._store.table import load_numeric, read_manifest, table_buckets

    run = RunDir(tmp_path / "r", create=True, settings={"buckets": buckets})
    with LossRecorder(run, epoch=0) as rec:
        rec.record(["x", "y", "z"], ["/d/s.tar", "/d/s.tar", "/d/t.tar"], f32([1.0, 2.0, 3.0]))
    compact(run)
    for bucket in table_buckets(read_manifest(run)):  # as an earlier release wrote them
        path = tmp_path / "r" / bucket.table
        pq.write_table(pq.read_table(path).drop_columns(["loss_count", "loss_mean", "loss_m2"]), path)
    t = load_table(run)
    assert t.schema.names == TABLE_SCHEMA.names and t.num_rows == 3
    assert t["loss_count"].to_pylist() == [0, 0, 0]
    assert np.isnan(t["loss_mean"].to_numpy()).all() and np.isnan(t["loss_m2"].to_numpy()).all()
    assert load_table(run, columns=["loss_mean", "key"]).schema.names == ["loss_mean", "key"]
    numeric = load_numeric(run, ["uid", "loss_count", "loss_mean"])
    assert numeric["loss_count"].tolist() == [0, 0, 0] and np.isnan(numeric["loss_mean"]).all()
    with LossRecorder(run, epoch=1) as rec:
        rec.record(["x", "x"], ["/d/s.tar", "/d/s.tar"], f32([4.0, 6.0]))
    compact(run)
    rows = {r["key"]: r for r in load_table(run).to_pylist()}
    assert (rows["x"]["seen"], rows["x"]["loss_count"], rows["x"]["loss_mean"], rows["x"]["loss_m2"]) == (
        3,
        2,
        5.0,
        2.0,
    )
    assert (rows["y"]["seen"], rows["y"]["loss_count"]) == (1, 0) and np.isnan(rows["y"]["loss_mean"])


def test_load_numeric_converts_the_columns_given_dtypes_as_numpy_casts(tmp_path):
    """load_numeric(dtypes=...): a float64 column read into float32 holds NumPy's cast of every
    value (rounded to nearest, inf beyond float32's range); the other columns keep the table's
    dtypes."""
    from conftest import seeded_run

    from seta_stream._store.table import load_numeric

    run = seeded_run(tmp_path / "run", n=300)
    wide = load_numeric(run, ["uid", "last_loss", "ema"])
    narrow = load_numeric(run, ["uid", "last_loss", "ema"], dtypes={"ema": np.float32})
    assert narrow["ema"].dtype == np.float32 and wide["ema"].dtype == np.float64
    assert np.array_equal(narrow["ema"], wide["ema"].astype(np.float32), equal_nan=True)
    assert narrow["uid"].dtype == np.uint64 and np.array_equal(narrow["uid"], wide["uid"])
    assert np.array_equal(narrow["last_loss"], wide["last_loss"], equal_nan=True)
