"""Partitioned runs (format version 2): the loss table in buckets by shard name, compacted
bucket by bucket. Every table and plan must equal the one-bucket run's, bit for bit."""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

import seta_stream._losses.route as route
import seta_stream._planning.buckets as plan_module
import seta_stream._store.parts as parts_module
from seta_stream import RunDir, compact, load_plan, load_table, plan_epoch
from seta_stream._store.table import table_buckets
from seta_stream.errors import CorruptPartError, RunFormatError
from seta_stream.ids import sample_uid, shard_bucket
from seta_stream.policies import POLICIES as ALL_POLICIES
from seta_stream.policies import PolicyResult, PolicySpec, reason_code
from seta_stream.policies.steps import Decide, Step
from seta_stream.testing import LossRecorder

SHARDS = 13


def record_epochs(run: RunDir, epochs: int = 3, seed: int = 0) -> None:
    """Two ranks, parts of 37 rows, new samples every epoch, NaN losses, a sample recorded
    twice in one part, and a late part of an older epoch."""
    rng = np.random.default_rng(seed)
    for e in range(epochs):
        for r in range(2):
            with LossRecorder(run, epoch=e, rank=r, flush_rows=37) as rec:
                ids = list(range(r, 300 + 100 * e, 2)) + [r]
                keys = [f"k{i:04d}" for i in ids]
                urls = [f"/d/train/shard-{i % SHARDS:03d}.tar" for i in ids]
                loss = rng.lognormal(size=len(ids)).astype(np.float32)
                loss[::17] = np.nan
                rec.record(keys, urls, loss)
        compact(run)
    with LossRecorder(run, epoch=0, rank=1, flush_rows=37) as rec:  # late part of epoch 0
        rec.record(["k0001", "k0999"], ["/d/train/shard-001.tar"] * 2, np.float32([0.5, 0.25]))
    compact(run)


def sorted_table(run: RunDir) -> pa.Table:
    t = load_table(run, shard_as_dictionary=False)
    return t.sort_by([("shard", "ascending"), ("uid", "ascending")]).drop_columns(["last_seq"])


def assert_bitwise_equal(a: pa.Table, b: pa.Table) -> None:
    assert a.column_names == b.column_names and a.num_rows == b.num_rows
    for name in a.column_names:
        x, y = a.column(name).to_numpy(), b.column(name).to_numpy()
        if x.dtype.kind == "f":  # NaN included, bit for bit
            assert np.array_equal(x.view(np.uint8), y.view(np.uint8)), name
        else:
            assert np.array_equal(x, y), name


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[int, RunDir]:
    out = {}
    for buckets in (1, 3, 7):
        run = RunDir(tmp_path_factory.mktemp(f"b{buckets}") / "run", create=True, settings={"buckets": buckets})
        old = route.FILE_ROWS
        route.FILE_ROWS = 101  # several scratch files per compaction
        try:
            record_epochs(run)
        finally:
            route.FILE_ROWS = old
        out[buckets] = run
    return out


def test_partitioned_tables_equal_the_one_bucket_table(runs):
    one = sorted_table(runs[1])
    assert one.num_rows == 501 and RunDir(runs[1]).version == 1
    for buckets in (3, 7):
        assert runs[buckets].version == 2
        assert_bitwise_equal(sorted_table(runs[buckets]), one)


def test_each_bucket_file_holds_whole_shards_of_its_bucket(runs):
    run = runs[7]
    m = json.loads(Path(run.path("table/manifest.json")).read_text())
    assert (m["format_version"], m["buckets"], m["generation"], m["rows"]) == (2, 7, 4, 501)
    folder = Path(run.path(m["table"]))
    assert sorted(p.name for p in folder.iterdir()) == [f"part-{b:05d}.parquet" for b in range(7)]
    for b in range(7):
        t = pq.read_table(folder / f"part-{b:05d}.parquet")
        assert t.num_rows == m["bucket_rows"][b]
        assert {shard_bucket(s, 7) for s in t.column("shard").to_pylist()} <= {b}
        keys = pa.ipc.open_file(pa.memory_map(run.path(m["keys"][b]))).read_all()
        assert keys.column("key").equals(t.column("key"))  # the keys file is row-aligned
    # one glob: pyarrow and polars read the generation's folder as the whole table
    assert pq.read_table(folder).num_rows == 501
    import polars as pl

    assert pl.read_parquet(f"{folder}/*.parquet").height == 501


def test_each_part_is_read_once_per_compaction(tmp_path, monkeypatch):
    reads: list[str] = []
    real = parts_module.read_part

    def counting(run, rel):
        reads.append(rel)
        return real(run, rel)

    monkeypatch.setattr("seta_stream._losses.compaction.read_part", counting)
    run = RunDir(tmp_path / "r", create=True, settings={"buckets": 5})
    record_epochs(run, epochs=2)
    all_parts = sorted(json.loads(Path(run.path("table/manifest.json")).read_text())["folded"])
    assert sorted(reads) == all_parts and len(set(reads)) == len(reads)


def test_routing_gives_each_bucket_its_rows_in_part_order_with_their_own_shard_names(tmp_path):
    """Every (part, bucket) piece holds exactly that part's rows of that bucket's shards, in
    row order, and its shard dictionary names exactly the shards of those rows (the fold looks
    every name of a piece's dictionary up: all the compaction's names would cost pieces x shards)."""
    rng = np.random.default_rng(5)
    parts = []
    for k in range(4):  # parts over overlapping ranges of 30 shards, as ranks record them
        shard = [f"/d/s-{s:03d}.tar" for s in rng.integers(10 * k, 10 * k + 30, 200)]
        key = [f"k{k}-{i}" for i in range(200)]
        t = pa.table(
            {
                "shard": pa.array(shard).dictionary_encode(),
                "key": key,
                "uid": pa.array([sample_uid(s, x) for s, x in zip(shard, key)], pa.uint64()),
                "loss": pa.array(rng.random(200), pa.float32()),
                "epoch": pa.array([1] * 200, pa.int32()),
                "rank": pa.array([k % 2] * 200, pa.int32()),
                "seq": pa.array(np.arange(200) + 1000 * k, pa.int64()),
            }
        )
        parts.append(t)
    records = route.RoutedRecords(5, file_rows=300, folder=str(tmp_path / "scratch"))
    try:
        for k, t in enumerate(parts):
            records.add(k, t)
        records.close()
        seen = 0
        for b in range(5):
            pieces = records.bucket(b)
            assert [k for k, _ in pieces] == sorted({k for k, _ in pieces})  # fold order
            for k, piece in pieces:
                whole = parts[k].to_pylist()
                expected = [r for r in whole if shard_bucket(r["shard"], 5) == b]
                got = piece.to_pylist()
                assert got == expected and len(got) > 0
                names = piece.column("shard").chunk(0).dictionary.to_pylist()
                assert sorted(names) == sorted({r["shard"] for r in expected})
                seen += len(got)
            uids = [u for _, piece in pieces for u in piece.column("uid").to_pylist()]
            assert records.bucket_uids(b).tolist() == uids
        assert seen == 800
    finally:
        records.remove()
    assert not (tmp_path / "scratch").exists()


def test_scratch_files_are_removed_after_compaction_and_after_an_error(tmp_path, monkeypatch):
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    run = RunDir(tmp_path / "r", create=True, settings={"buckets": 3})
    record_epochs(run, epochs=1)
    assert list(scratch.iterdir()) == []
    bad = pa.table(
        {
            "shard": ["shard-000.tar"],
            "key": ["x"],
            "uid": pa.array([sample_uid("shard-000.tar", "x") ^ 1], pa.uint64()),  # not its hash
            "loss": pa.array([1.0], pa.float32()),
            "epoch": pa.array([1], pa.int32()),
            "rank": pa.array([0], pa.int32()),
            "seq": pa.array([0], pa.int64()),
        }
    ).replace_schema_metadata({b"seta_stream.format_version": b"1"})
    rel = "losses/rank=0/epoch=1/part-R00000-E000001-00000000000000000000-badbad00.parquet"
    os.makedirs(os.path.dirname(run.path(rel)), exist_ok=True)
    pq.write_table(bad, run.path(rel))
    before = json.loads(Path(run.path("table/manifest.json")).read_text())
    with pytest.raises(CorruptPartError, match="part-R00000-E000001-00000000000000000000-badbad00.parquet"):
        compact(run)
    assert list(scratch.iterdir()) == []
    assert json.loads(Path(run.path("table/manifest.json")).read_text()) == before
    assert sorted(f"table/{p.name}" for p in Path(run.path("table")).glob("gen-*")) == sorted(
        [before["previous_table"], before["table"]]
    )  # the folder the failed compaction began is gone
    report = compact(run, on_corrupt="skip")  # set aside, the rest folded again without it
    assert report.quarantined == [rel] and report.parts_folded == 0
    assert list(scratch.iterdir()) == []


def test_bucket_setting(tmp_path):
    assert RunDir(tmp_path / "a", create=True).buckets == 1
    assert RunDir(tmp_path / "a").version == 1
    sized = RunDir(tmp_path / "b", create=True, settings={"dataset_size": 20_000_000})
    assert (sized.buckets, sized.version) == (3, 2)  # one bucket per 8,388,608 samples
    assert json.loads((tmp_path / "b/seta-stream.json").read_text())["version"] == 2
    with pytest.raises(RunFormatError, match=r"run setting buckets=0; expected an integer from 1 to 4096"):
        RunDir(tmp_path / "c", create=True, settings={"buckets": 0})


@pytest.mark.parametrize(
    "settings, buckets",
    [
        ({"dataset_size": 15_000_000}, 1),  # ST+MJ's size: it plans faster in one bucket than in two
        ({"dataset_size": 16_777_216}, 1),  # ONE_BUCKET_ROWS
        ({"dataset_size": 16_777_217}, 3),  # past it: one bucket per 8,388,608 samples
        ({"dataset_size": 200_000_000}, 24),
        ({"dataset_size": 15_000_000, "buckets": 2}, 2),  # an explicit count wins
        ({"buckets": 1, "dataset_size": 200_000_000}, 1),
    ],
)
def test_new_runs_stay_in_one_bucket_up_to_16_777_216_samples(tmp_path, settings, buckets):
    run = RunDir(tmp_path / "r", create=True, settings=settings)
    assert (run.buckets, run.version) == (buckets, 2 if buckets > 1 else 1)
    again = RunDir(tmp_path / "r")  # as recorded in seta-stream.json
    assert (again.buckets, again.version) == (buckets, 2 if buckets > 1 else 1)
    assert json.loads((tmp_path / "r/seta-stream.json").read_text())["settings"] == {
        "shard_depth": 1,
        "ema_beta2": 0.9,
        "dataset_size": None,
        "buckets": None,
        **settings,
    }


def test_a_run_keeps_the_buckets_an_earlier_release_created_it_with(tmp_path):
    """A run created partitioned below 16,777,216 samples (an earlier release made one bucket per
    8,388,608 samples of any dataset_size) keeps its two buckets: its table and plans are split so."""
    (tmp_path / "r").mkdir()
    settings = {"shard_depth": 1, "ema_beta2": 0.9, "dataset_size": 15_000_000, "buckets": None}
    doc = {"format": "seta-stream-run", "version": 2, "settings": settings}
    (tmp_path / "r/seta-stream.json").write_text(json.dumps(doc))
    run = RunDir(tmp_path / "r")
    assert (run.buckets, run.version, run.settings) == (2, 2, settings)


POLICIES = {
    "seta": dict(r=0.1, k=5, alpha=0.6),
    "infobatch": {},
    "random": {},
    "static": {},
    "full": {},
    "eswp": dict(beta2=0.9),
    "es": dict(beta2=0.9),
}


@pytest.mark.parametrize("spilled", [False, True], ids=["in-memory", "spilled"])
@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_partitioned_plans_equal_the_one_bucket_plan(runs, policy, spilled, monkeypatch):
    """``spilled``: no bucket input fits the planner's cache, so every bucket is spilled to
    .npy files after the first pass and what the steps derive from it is memoised on disk."""
    if spilled:
        monkeypatch.setattr(plan_module, "_INPUT_CACHE_BYTES", 0)
    plans, summaries = {}, {}
    for buckets, run in runs.items():
        summaries[buckets] = plan_epoch(run, 2, policy=policy, params=POLICIES[policy], epochs=10, seed=3, force=True)
        t = load_plan(run, 2)
        plans[buckets] = t.set_column(0, "shard", t.column("shard").cast(pa.string())).sort_by("uid")
    for buckets in (3, 7):
        assert_bitwise_equal(plans[buckets].drop_columns(["reason"]), plans[1].drop_columns(["reason"]))
        assert plans[buckets].column("reason").to_pylist() == plans[1].column("reason").to_pylist()
        # the same summary, plus where a partitioned plan's stage files are (docs/format.md)
        assert summaries[buckets].pop("stage") == {"buckets": buckets, "score": policy in ("es", "eswp")}
        assert summaries[buckets] == summaries[1]
    assert "stage" not in summaries[1]


@dataclass(frozen=True)
class _NoParams:
    pass


#: what the test policy below saw: per map, whether the undeclared columns were constants;
#: per rows pass, (uid, last_loss, seen) of the bucket
_SEEN: dict[str, list] = {"maps": [], "rows": []}


def _uid_only_steps(ctx, params):
    def look(inp):
        return bool(np.isnan(inp.last_loss).all() and not inp.seen.any() and not inp.last_loss.flags.writeable)

    _SEEN["maps"].extend((yield Step(look, list)))

    def rows(inp):
        _SEEN["rows"].append((np.array(inp.uid), np.array(inp.last_loss), np.array(inp.seen)))
        keep = np.asarray(inp.uid) % np.uint64(2) == 0
        return PolicyResult(keep, keep.astype(np.float32), np.full(inp.n, reason_code("kept"), np.int8), {})

    return Decide(rows, {"phase": "prune"})


@pytest.mark.parametrize("spilled", [False, True], ids=["in-memory", "spilled"])
@pytest.mark.parametrize("population", [False, True], ids=["table", "population"])
def test_steps_see_the_declared_columns_and_the_rows_pass_every_plan_column(tmp_path, spilled, population, monkeypatch):
    """A policy declaring only uid: its maps get the loss and seen columns as constants (so no
    bucket keeps or spills them; with a population the merged rows are kept whole), its rows
    pass the bucket's real columns, row-aligned with the uids, and the plan's loss column and
    summary counts are the table's."""
    if spilled:
        monkeypatch.setattr(plan_module, "_INPUT_CACHE_BYTES", 0)
    # registered for this test only (it has no whole-table function)
    spec = PolicySpec("test_uid_only", _NoParams, None, "test policy", lambda p: {"uid"}, steps=_uid_only_steps)
    monkeypatch.setitem(ALL_POLICIES, spec.name, spec)
    run = RunDir(tmp_path / "r", create=True, settings={"buckets": 4})
    record_epochs(run, epochs=2)
    table = load_table(run, shard_as_dictionary=False).sort_by("uid")
    pop = None
    if population:  # the table's samples and 20 never recorded
        keys = table.column("key").to_pylist() + [f"new{i}" for i in range(20)]
        shards = table.column("shard").to_pylist() + [f"shard-{i % SHARDS:03d}.tar" for i in range(20)]
        pop = {"shard": shards, "key": keys}
    _SEEN["maps"].clear()
    _SEEN["rows"].clear()
    summary = plan_epoch(run, 2, policy="test_uid_only", params={}, epochs=5, population=pop)
    assert _SEEN["maps"] == [not population] * 4
    uid, loss, seen = (np.concatenate(c) for c in zip(*_SEEN["rows"]))
    order = np.argsort(uid)
    extra = 20 if population else 0
    assert len(uid) == table.num_rows + extra
    known = np.isin(uid[order], table.column("uid").to_numpy())
    assert np.array_equal(uid[order][known], table.column("uid").to_numpy())
    assert np.array_equal(loss[order][known].view(np.uint32), table.column("last_loss").to_numpy().view(np.uint32))
    assert np.array_equal(seen[order][known], table.column("seen").to_numpy())
    assert np.isnan(loss[order][~known]).all() and not seen[order][~known].any()
    plan = load_plan(run, 2).sort_by("uid")
    assert np.array_equal(plan.column("loss").to_numpy().view(np.uint32), loss[order].view(np.uint32))
    finite = np.isfinite(table.column("last_loss").to_numpy()) & (table.column("seen").to_numpy() > 0)
    assert (summary["n"], summary["unseen"]) == (table.num_rows + extra, table.num_rows + extra - int(finite.sum()))


@pytest.mark.parametrize("policy", ["seta", "eswp"])
def test_stage_readers_deliver_the_same_samples_from_a_partitioned_plan(tmp_path, policy):
    """Real shards; the three readers agree on the partitioned plan (stage files per bucket)
    and deliver exactly what the one-bucket plan delivers."""
    from conftest import write_shards
    from readers import check_readers_agree

    import seta_stream as seta

    urls = write_shards(tmp_path / "shards", [40, 35, 30, 25, 20])
    params = dict(r=0.2, k=4, alpha=0.5) if policy == "seta" else dict(beta2=0.9, r=0.4)
    delivered = {}
    for buckets in (1, 3):
        run = RunDir(tmp_path / f"run{buckets}", create=True, settings={"buckets": buckets, "ema_beta2": 0.9})
        pop = seta.list_samples(urls)
        with LossRecorder(run, epoch=0) as rec:
            keys, locs = pop.column("key").to_pylist(), pop.column("url").to_pylist()
            rec.record(keys, locs, np.random.default_rng(3).lognormal(size=len(keys)).astype(np.float32))
        compact(run)
        plan_epoch(run, 1, policy=policy, params=params, epochs=6, seed=2, population=pop)
        samples, counts = check_readers_agree(urls, tmp_path / f"run{buckets}")
        assert counts["kept"] == len(samples) == plan_epoch(run, 1)["kept"] and counts["dropped"] == 150 - len(samples)
        delivered[buckets] = [(s["__url__"], s["__key__"], s["__weight__"]) for s in samples]
    assert delivered[3] == delivered[1] and 0 < len(delivered[1]) < 150


@pytest.mark.parametrize("policy", ["infobatch", "eswp"])
def test_a_partitioned_plan_has_a_stage_file_and_a_shard_index_per_bucket(runs, policy):
    """plans/epoch=E/stage/: per bucket, stage-BBBBB.arrow (one record batch per shard of the
    bucket) and shards-BBBBB.arrow (those shards only, their row ranges within the bucket and
    byte ranges); no stage file of the whole plan. Each shard's batch is its plan rows."""
    import pyarrow.ipc as ipc

    run = runs[7]
    plan_epoch(run, 2, policy=policy, params=POLICIES[policy], epochs=10, seed=3, force=True)
    d = Path(run.path("plans/epoch=2"))
    assert sorted(os.listdir(d)) == ["plan.parquet", "stage", "summary.json"]
    assert sorted(os.listdir(d / "stage")) == sorted(
        f"{kind}-{b:05d}.arrow" for b in range(7) for kind in ("shards", "stage")
    )
    plan = load_plan(run, 2).to_pydict()
    rows: dict[str, list] = {}
    for s, u, k, w in zip(plan["shard"], plan["uid"], plan["keep"], plan["weight"]):
        rows.setdefault(s, []).append((u, k, w))
    seen = set()
    for b in range(7):
        index = ipc.open_file(str(d / f"stage/shards-{b:05d}.arrow")).read_all()
        meta = json.loads(index.schema.metadata[b"seta_stream.stage"])
        assert meta["columns"] == ["uid", "keep", "weight_code"] + (["score"] if policy == "eswp" else [])
        data = (d / f"stage/stage-{b:05d}.arrow").read_bytes()
        schema = ipc.open_file(str(d / f"stage/stage-{b:05d}.arrow")).schema
        for r in index.to_pylist():
            assert shard_bucket(r["shard"], 7) == b and r["shard"] not in seen
            seen.add(r["shard"])
            batch = ipc.read_record_batch(
                ipc.read_message(pa.py_buffer(data[r["offset"] : r["offset"] + r["length"]])), schema
            )
            weights = [meta["weights"][c] for c in batch.column("weight_code").to_pylist()]
            got = list(zip(batch.column("uid").to_pylist(), batch.column("keep").to_pylist(), weights))
            assert got == rows[r["shard"]] and r["n"] == len(got) == r["stop"] - r["start"]
            assert r["kept"] == sum(k for _, k, _ in got)
    assert seen == set(rows)


def test_partitioned_run_on_fsspec_storage_plans_like_a_local_one(tmp_path):
    """memory:// goes through fsspec (uploads of the plan folder and stage file, bucket files
    published one by one): the same table and plan as on local disk."""
    import uuid

    url = f"memory://buckets-{uuid.uuid4().hex[:8]}/run"
    remote = RunDir(url, create=True, settings={"buckets": 3})
    local = RunDir(tmp_path / "local", create=True, settings={"buckets": 3})
    for run in (remote, local):
        record_epochs(run, epochs=2)
        plan_epoch(run, 1, policy="seta", params=dict(r=0.1, k=4, alpha=0.5), epochs=6, seed=1)
    assert_bitwise_equal(sorted_table(remote), sorted_table(local))
    a = load_plan(remote, 1)
    b = load_plan(local, 1)
    a = a.set_column(0, "shard", a.column("shard").cast(pa.string())).sort_by("uid")
    b = b.set_column(0, "shard", b.column("shard").cast(pa.string())).sort_by("uid")
    assert_bitwise_equal(a, b)
    assert sorted(
        p.rsplit("/", 1)[1] for p in remote.fs.ls(remote.path("plans/epoch=1/plan.parquet"), detail=False)
    ) == [
        "part-00000-0000.parquet",
        "part-00001-0000.parquet",
        "part-00002-0000.parquet",
    ]


def test_partitioned_compaction_stops_on_one_name_for_two_shards(tmp_path):
    """Two ranks record shard-000.tar from two folders: the partitioned compaction stops, naming
    both locations, before any bucket file is written (the names route to one bucket)."""
    from seta_stream.errors import ShardNameConflictError

    run = RunDir(tmp_path / "r", create=True, settings={"buckets": 3})
    for rank, folder in enumerate(("/data/a", "/data/b")):
        with LossRecorder(run, epoch=0, rank=rank) as rec:
            rec.record(["k0", "k1"], [f"{folder}/shard-000.tar"] * 2, np.float32([1.0, 2.0]))
    with pytest.raises(ShardNameConflictError, match=r"/data/a/shard-000.tar.*/data/b/shard-000.tar"):
        compact(run)
    table = Path(run.path("table"))
    assert not (table / "manifest.json").exists()
    assert not table.exists() or list(table.glob("gen-*")) == []


@pytest.mark.parametrize("size, buckets", [(16_777_216, 1), (16_777_217, 3)])
def test_pruner_partitions_a_new_run_past_16_777_216_population_samples(tmp_path, size, buckets):
    from seta_stream import Pruner

    keys = pc.cast(pa.array(np.arange(size, dtype=np.int64)), pa.string())
    shard = pa.DictionaryArray.from_arrays(np.zeros(size, dtype=np.int32), pa.array(["s-000000.tar"]))
    population = pa.table({"shard": shard, "key": keys})
    Pruner(tmp_path / "r", policy="seta", params=dict(r=0.1, k=5, alpha=0.6), epochs=3, population=population)
    run = RunDir(tmp_path / "r")
    expected = (buckets, 2, buckets) if buckets > 1 else (1, 1, None)  # a one-bucket run records no count
    assert (run.buckets, run.version, run.settings["buckets"]) == expected


def test_a_bucket_file_whose_rows_differ_from_the_manifest_stops_the_plan(tmp_path):
    """A partitioned plan reads each bucket's numeric columns into arrays of the manifest's row
    count: a table file replaced by one of another length stops it before anything is planned."""
    run = RunDir(tmp_path / "run", create=True, settings={"buckets": 3})
    record_epochs(run, epochs=1)
    bucket = table_buckets(json.loads((tmp_path / "run/table/manifest.json").read_text()))[1]
    rel = bucket.table
    path = tmp_path / "run" / rel
    t = pq.read_table(path)
    pq.write_table(t.slice(0, t.num_rows - 1), path)
    expected = (
        f"{run.display(rel)}: table file has {t.num_rows - 1:,} rows, the manifest says {t.num_rows:,}; expected "
        "the same (compaction never rewrites a table file: it was changed or replaced since). Restore the run's "
        "table folder from a copy"
    )
    with pytest.raises(RunFormatError) as err:
        plan_epoch(run, 1, policy="seta", params=POLICIES["seta"], epochs=10, seed=3)
    assert str(err.value) == expected
    assert not (tmp_path / "run/plans/epoch=1/summary.json").exists()


def _keep_none(inp, params):
    dropped = np.full(inp.n, reason_code("dropped"), np.int8)
    return PolicyResult(np.zeros(inp.n, bool), np.zeros(inp.n, np.float32), dropped, {"phase": "prune"})


def _keep_none_steps(ctx, params):
    return Decide(lambda inp: _keep_none(inp, params), {"phase": "prune"})
    yield  # a generator with no step


@pytest.mark.parametrize("spilled", [False, True], ids=["in-memory", "spilled"])
def test_a_partitioned_plan_keeping_nothing_writes_every_bucket_again_with_the_guard(runs, spilled, monkeypatch):
    """A policy that keeps no row: the rows pass writes every bucket (each bucket's input and
    spilled files released once its rows are written), finds nothing kept, and writes every
    bucket again with the empty-plan guard, reading the buckets again: the one-bucket plan, and
    no scratch file left behind."""
    if spilled:
        monkeypatch.setattr(plan_module, "_INPUT_CACHE_BYTES", 0)
    spec = PolicySpec("test_keep_none", _NoParams, _keep_none, "test policy", lambda p: {"uid"}, steps=_keep_none_steps)
    monkeypatch.setitem(ALL_POLICIES, spec.name, spec)
    scratch = Path(tempfile.mkdtemp())
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    plans, summaries = {}, {}
    for buckets in (1, 3):
        summaries[buckets] = plan_epoch(runs[buckets], 2, policy=spec.name, params={}, epochs=10, seed=3, force=True)
        plans[buckets] = load_plan(runs[buckets], 2).sort_by("uid")
    assert summaries[3].pop("stage") == {"buckets": 3, "score": False}
    assert summaries[3] == summaries[1]
    assert summaries[1]["kept"] == 1 and summaries[1]["kept_by_reason"] == {"empty_plan_guard": 1}
    assert_bitwise_equal(plans[3].drop_columns(["shard", "reason"]), plans[1].drop_columns(["shard", "reason"]))
    assert plans[3].column("reason").to_pylist() == plans[1].column("reason").to_pylist()
    assert os.listdir(scratch) == []


def test_a_spilled_memo_saves_arrays_as_files_and_keeps_constants_as_they_are(tmp_path):
    """What a spilled bucket's memo holds: an array as a memory-mapped .npy file, a constant
    (a broadcast value, as PolicyInput's unread columns are) and other values as they are."""
    from seta_stream._planning.buckets import _SpilledMemo

    memo = _SpilledMemo(str(tmp_path / "b00000-memo"))
    values = np.arange(5, dtype=np.float32)
    constant = np.broadcast_to(np.array(np.nan, np.float64), (7,))
    memo["cols"] = (values, constant, None)
    memo["n"] = 3
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b00000-memo-0.npy"]
    got, kept, none = memo["cols"]
    assert isinstance(got, np.memmap) and got.tolist() == [0.0, 1.0, 2.0, 3.0, 4.0] and not got.flags.writeable
    assert kept is constant and none is None and memo["n"] == 3
    memo.remove()
    assert list(tmp_path.iterdir()) == [] and "cols" not in memo
