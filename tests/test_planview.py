"""The plan's stage files (stage.arrow, shards.arrow) and PlanView: one record batch per shard,
read only when a sample of that shard is decided; plans of earlier versions (keys.arrow +
lookup.arrow, or lookup.arrow with a key column) decide alike."""

from __future__ import annotations

import json
import os
import shutil
from collections import Counter
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc
import pyarrow.parquet as pq
import pytest

from seta_stream import RunDir, compact, load_plan, plan_epoch
from seta_stream._reading import planview
from seta_stream._reading.planview import Decision, KnownByKey, PlanView, kept_samples, tally
from seta_stream.errors import RunFormatError
from seta_stream.policies import POLICIES, PolicySpec, register
from seta_stream.policies.base import PolicyResult, reason_code
from seta_stream.testing import LossRecorder


@dataclass(frozen=True)
class VariedParams:
    """Keep uid % 3 != 0, weight 1 + (uid % 5) / 4, score (uid % 1000) / 7."""


def varied(inp, p):
    uid = np.asarray(inp.uid, dtype=np.uint64)
    keep = uid % np.uint64(3) != 0
    weight = np.where(keep, 1.0 + (uid % np.uint64(5)).astype(np.float32) / 4, 0.0).astype(np.float32)
    score = (uid % np.uint64(1000)).astype(np.float64) / 7.0
    return PolicyResult(keep, weight, np.full(inp.n, reason_code("kept"), np.int8), {"phase": "prune"}, score=score)


if "test_varied" not in POLICIES:
    register(PolicySpec("test_varied", VariedParams, varied, "test policy with weights and scores"))

SIZES = (100, 70, 130, 90)  # samples per shard: each shard's record batch has its own length


def recorded_run(path):
    run = RunDir(path, create=True)
    keys, urls = [], []
    for s, n in enumerate(SIZES):
        keys += [f"img/{s}/{i:05d}_word_{i % 7}" for i in range(n)]
        urls += [f"/data/shard-{s:03d}.tar"] * n
    with LossRecorder(run, epoch=0) as rec:
        rec.record(keys, urls, np.random.default_rng(0).lognormal(size=len(keys)).astype(np.float32))
    compact(run)
    return run


def shard_table(path):
    return ipc.open_file(str(path / "shards.arrow")).read_all()


def stage_meta(d):
    return json.loads(shard_table(d).schema.metadata[b"seta_stream.stage"])


def with_weights(batch, meta):
    """stage.arrow's rows with weight_code replaced by the weights it indexes, as Python lists."""
    rows = batch.to_pydict()
    if "weight_code" in rows:
        rows["weight"] = [meta["weights"][c] for c in rows.pop("weight_code")]
    return rows


@dataclass(frozen=True)
class ManyWeightsParams:
    """Keep everything, with weights 1 + (uid % 1000) / 1000 (more than 256 distinct ones)."""


def many_weights(inp, p):
    uid = np.asarray(inp.uid, dtype=np.uint64)
    weight = (1.0 + (uid % np.uint64(1000)).astype(np.float32) / 1000).astype(np.float32)
    return PolicyResult(np.ones(inp.n, bool), weight, np.full(inp.n, reason_code("kept"), np.int8), {"phase": "prune"})


if "test_many_weights" not in POLICIES:
    register(PolicySpec("test_many_weights", ManyWeightsParams, many_weights, "test policy with 1,000 weights"))


@pytest.mark.parametrize(
    ("policy", "columns"),
    [
        ("test_varied", ["uid", "keep", "weight_code", "score"]),
        ("random", ["uid", "keep", "weight_code"]),
        ("test_many_weights", ["uid", "keep", "weight"]),  # more than 256 weights: float32 weights
    ],
)
def test_stage_arrow_holds_one_batch_per_shard_at_the_byte_ranges_of_shards_arrow(tmp_path, policy, columns):
    run = recorded_run(tmp_path / "r")
    plan_epoch(run, 1, policy=policy, epochs=3)
    d = tmp_path / "r/plans/epoch=1"
    assert sorted(os.listdir(d)) == ["plan.parquet", "shards.arrow", "stage.arrow", "summary.json"]
    plan = load_plan(run, 1)
    decisions = [c for c in ("uid", "keep", "weight", "score") if c in plan.column_names]
    reader = ipc.open_file(str(d / "stage.arrow"))
    assert reader.schema.names == columns and reader.num_record_batches == len(SIZES)
    assert [reader.get_batch(i).num_rows for i in range(len(SIZES))] == list(SIZES)
    shards = shard_table(d)
    assert shards.column_names == ["shard", "start", "stop", "n", "kept", "offset", "length"]
    meta = stage_meta(d)
    assert meta["columns"] == columns
    weights = set(plan.column("weight").to_pylist())
    if "weight_code" in columns:
        assert sorted(meta) == ["columns", "weights"] and sorted(meta["weights"]) == sorted(weights)
    else:
        assert sorted(meta) == ["columns"] and len(weights) > 256
    assert with_weights(reader.read_all(), meta) == plan.select(decisions).to_pydict()
    data = (d / "stage.arrow").read_bytes()
    ends = []
    for row in shards.to_pylist():
        part = plan.slice(row["start"], row["n"])
        assert set(part.column("shard").to_pylist()) == {row["shard"]}
        message = ipc.read_message(pa.py_buffer(data[row["offset"] : row["offset"] + row["length"]]))
        batch = ipc.read_record_batch(message, reader.schema)
        assert with_weights(batch, meta) == part.select(decisions).to_pydict()
        assert row["kept"] == sum(part.column("keep").to_pylist())
        ends.append((row["offset"], row["offset"] + row["length"]))
    ends.sort()
    assert all(a[1] == b[0] for a, b in zip(ends, ends[1:]))  # the batches follow one another
    view = PlanView(run, 1)  # and the stage decides as the plan says
    assert view.has_score == ("score" in columns)
    for s, k, keep, weight in zip(*(plan.column(c).to_pylist() for c in ("shard", "key", "keep", "weight"))):
        assert view.decide(s, k)[:2] == (keep, weight)


def to_earlier_layout(src, dst, epoch, key_in_lookup):
    """Copy run ``src`` to ``dst`` with the plan of ``epoch`` in the layout of earlier versions:
    keys.arrow + lookup.arrow (or lookup.arrow with a key column) and shards.arrow without byte
    ranges, uncompressed, no stage.arrow."""
    shutil.copytree(src, dst)
    d = dst / f"plans/epoch={epoch}"
    plan = pq.read_table(d / "plan.parquet")
    decisions = [c for c in ("keep", "weight", "score") if c in plan.column_names]
    lookup = plan.select((["key"] if key_in_lookup else []) + decisions)
    tables = {"lookup.arrow": lookup}
    if not key_in_lookup:
        tables["keys.arrow"] = plan.select(["key"])
    old_shards = shard_table(d).select(["shard", "start", "stop", "n", "kept"]).replace_schema_metadata(None)
    tables["shards.arrow"] = old_shards
    for name, table in tables.items():
        table = pa.Table.from_arrays(table.columns, table.column_names)  # plain, non-nullable flags dropped
        with pa.OSFile(str(d / name), "wb") as sink, ipc.new_file(sink, table.schema) as w:
            w.write_table(table)
    os.remove(d / "stage.arrow")


@pytest.mark.parametrize(
    ("policy", "params"),
    [("test_varied", {}), ("random", {"r": 0.4}), ("seta", {"r": 0.3, "k": 3})],
)
def test_every_layout_decides_every_sample_alike(tmp_path, policy, params):
    run = recorded_run(tmp_path / "r")
    if policy == "seta":  # a planned epoch that has a bernoulli absent rule: unknown samples are drawn
        plan_epoch(RunDir(tmp_path / "empty", create=True), 0, policy="seta", params=params, epochs=5, seed=2)
        run, epoch = RunDir(tmp_path / "empty"), 0
        src = tmp_path / "empty"
    else:
        plan_epoch(run, 1, policy=policy, params=params, epochs=5, seed=2)
        epoch, src = 1, tmp_path / "r"
    to_earlier_layout(src, tmp_path / "keys", epoch, key_in_lookup=False)
    to_earlier_layout(src, tmp_path / "oldest", epoch, key_in_lookup=True)
    views = {
        "stage.arrow": PlanView(src, epoch),
        "keys.arrow": PlanView(tmp_path / "keys", epoch),
        "key column": PlanView(tmp_path / "oldest", epoch),
    }
    assert [v.identity for v in views.values()] == ["uid", "key", "key"]
    assert len({v.has_score for v in views.values()}) == 1
    plan = load_plan(run, epoch)
    listed = list(zip(plan.column("shard").to_pylist(), plan.column("key").to_pylist()))
    unknown = [(f"shard-{s:03d}.tar", f"new/{i}") for s in range(len(SIZES) + 1) for i in range(20)]
    expected = {
        (s, k): (keep, weight, score)
        for s, k, keep, weight, score in zip(
            *(plan.column(c).to_pylist() for c in ("shard", "key", "keep", "weight")),
            plan.column("score").to_pylist() if "score" in plan.column_names else [None] * plan.num_rows,
        )
    }
    decided = {}
    for name, view in views.items():
        # shard by shard, as the readers go, and once more in another order
        got = {(s, k): view.decide(s, k) for s, k in listed + unknown}
        assert got == {(s, k): view.decide(s, k) for s, k in reversed(listed + unknown)}
        decided[name] = got
        for s, k in listed:
            d = got[(s, k)]
            assert d.known and (d.keep, d.weight, d.score) == expected[(s, k)], (name, s, k)
        assert not any(got[i].known for i in unknown)
    assert decided["stage.arrow"] == decided["keys.arrow"] == decided["key column"]
    absent_keeps = {decided["stage.arrow"][i].keep for i in unknown}
    assert absent_keeps == ({True} if policy == "test_varied" else {True, False})  # random, seta: drawn


def test_the_view_reads_the_rows_of_a_shard_when_one_of_its_samples_is_decided(tmp_path):
    run = recorded_run(tmp_path / "r")
    plan_epoch(run, 1, policy="test_varied", epochs=3)
    lengths = {r["shard"]: r["length"] for r in shard_table(tmp_path / "r/plans/epoch=1").to_pylist()}
    view = PlanView(run, 1)
    for s in lengths:  # what skip_shards asks reads no row
        assert not view.shard(s).is_empty and not view.shard(s).keeps_all
    assert view.stage.bytes_read == 0
    view.decide("shard-002.tar", "img/2/00003_word_3")
    assert view.stage.bytes_read == lengths["shard-002.tar"]
    for i in range(60):
        view.decide("shard-002.tar", f"img/2/{i:05d}_word_{i % 7}")
    view.decide("shard-009.tar", "not/listed")  # a shard the plan does not list: nothing to read
    assert view.stage.bytes_read == lengths["shard-002.tar"]
    view.decide("shard-000.tar", "img/0/00000_word_0")
    assert view.stage.bytes_read == lengths["shard-002.tar"] + lengths["shard-000.tar"]


def test_known_looks_listed_samples_up_by_key(tmp_path):
    run = recorded_run(tmp_path / "r")
    plan_epoch(run, 1, policy="test_varied", epochs=3)
    plan = load_plan(run, 1).filter(
        pa.compute.equal(pa.compute.cast(load_plan(run, 1)["shard"], pa.string()), "shard-001.tar")
    )
    shard = PlanView(run, 1).shard("shard-001.tar")
    known = shard.known
    assert isinstance(known, KnownByKey) and len(known) == 70
    for key, keep, weight in zip(*(plan.column(c).to_pylist() for c in ("key", "keep", "weight"))):
        assert key in known and (known.get(key).keep, known.get(key).weight) == (keep, weight)
        assert known.get(key) == shard.decide(key)
    assert known.get("img/1/99999_word_0") is None and "img/1/99999_word_0" not in known
    assert known.get("img/0/00000_word_0") is None  # a key of another shard


def test_a_stage_file_that_does_not_match_shards_arrow_is_refused(tmp_path):
    run = recorded_run(tmp_path / "r")
    plan_epoch(run, 1, policy="test_varied", epochs=3)
    d = tmp_path / "r/plans/epoch=1"
    shards = shard_table(d)
    rows = {r["shard"]: r for r in shards.to_pylist()}
    # shard-000's range pointing at shard-001's batch (70 rows, not 100)
    offset = pa.array(
        [rows["shard-001.tar"]["offset"] if r["shard"] == "shard-000.tar" else r["offset"] for r in shards.to_pylist()],
        pa.int64(),
    )
    length = pa.array(
        [rows["shard-001.tar"]["length"] if r["shard"] == "shard-000.tar" else r["length"] for r in shards.to_pylist()],
        pa.int64(),
    )
    swapped = shards.set_column(5, "offset", offset).set_column(6, "length", length)
    with pa.OSFile(str(d / "shards.arrow"), "wb") as sink, ipc.new_file(sink, swapped.schema) as w:
        w.write_table(swapped)
    with pytest.raises(
        RunFormatError, match=r"stage.arrow: shard 'shard-000.tar' has 70 rows at bytes .*shards.arrow says 100"
    ):
        PlanView(run, 1).decide("shard-000.tar", "img/0/00000_word_0")
    # a stage.arrow cut short
    data = (d / "stage.arrow").read_bytes()
    (d / "stage.arrow").write_bytes(data[: rows["shard-003.tar"]["offset"] + 16])
    with pytest.raises(RunFormatError, match=r"cannot read the rows of shard 'shard-003.tar' at bytes \[\d+, \d+\)"):
        PlanView(run, 1).decide("shard-003.tar", "img/3/00000_word_0")


def one_by_one(view, samples):
    """What kept_samples yields and counts, decided sample by sample with ``view.decide``."""
    out, counts = [], Counter()
    for s in samples:
        d = view.decide(s["__url__"].rsplit("/", 1)[1], s["__key__"])
        tally(counts, d)
        if d.keep:
            s = dict(s)
            d.attach(s, view.has_score)
            out.append(s)
    return [no_nan(s) for s in out], +counts


def no_nan(sample):
    return {k: "NaN" if v != v else v for k, v in sample.items()}


def streamed(run, epoch, samples):
    counts = Counter()
    out = list(kept_samples(iter([dict(s) for s in samples]), PlanView(run, epoch), counts))
    return [no_nan(s) for s in out], +counts


def samples_of(shards):
    """Samples as a tar reader yields them (no data): listed keys, unknown ones, a key that comes
    back later in its shard (another sample of the same identity), shards in runs."""
    out = []
    for s, n in shards:
        keys = [f"img/{s}/{i:05d}_word_{i % 7}" for i in range(n)] + [f"new/{s}/{i}" for i in range(5)]
        keys.append(keys[0])
        out += [{"__key__": k, "__url__": f"/data/shard-{s:03d}.tar"} for k in keys]
    return out


@pytest.mark.parametrize("policy", ["full", "test_many_weights", "random", "test_varied"])
def test_kept_samples_decides_each_sample_as_decide_does(tmp_path, policy, monkeypatch):
    run = recorded_run(tmp_path / "r")
    plan_epoch(run, 1, policy=policy, params={"r": 0.4} if policy == "random" else {}, epochs=3, seed=1)
    view = PlanView(run, 1)
    uniform = {s: view.shard(f"shard-{s:03d}.tar").uniform for s in range(5)}
    # full: every sample of every shard kept with weight 1, listed or not: one decision a shard. The
    # others keep with other weights than 1 (many_weights keeps everything) or drop; shard 4, which the
    # plan does not list, is kept whole where the absent rule keeps (not random's, which draws);
    # test_varied's plans have scores, one a sample
    whole = Decision(True, 1.0, None, True)
    expected_uniform = {"full": [whole] * 5, "test_many_weights": [None] * 4 + [whole]}
    assert list(uniform.values()) == expected_uniform.get(policy, [None] * 5)
    # shard 4 is unknown to the plan; shard 1 comes back after shard 2
    samples = samples_of([(0, 100), (1, 70), (2, 130), (1, 70), (4, 3), (3, 90)])
    expected = one_by_one(PlanView(run, 1), samples)
    assert streamed(run, 1, samples) == expected
    if policy == "full":
        # 6 runs of a shard with 5 new keys each; shard 4's 3 keys and its repeated first key
        assert expected[1] == {"kept": 499, "absent_kept": 6 * 5 + 4}
    monkeypatch.setattr(planview, "_PENDING_KEYS", 7)  # the keys of a shard counted in several parts
    assert streamed(run, 1, samples) == expected


@pytest.mark.parametrize("policy", ["random", "test_varied", "seta"])
def test_decide_all_equals_decide(tmp_path, policy):
    run = recorded_run(tmp_path / "r")
    if policy == "seta":  # a bernoulli absent rule: unknown samples are drawn
        plan_epoch(RunDir(tmp_path / "e", create=True), 0, policy="seta", params={"r": 0.3, "k": 3}, epochs=5, seed=2)
        run, epoch = RunDir(tmp_path / "e"), 0
    else:
        plan_epoch(run, 1, policy=policy, params={"r": 0.4} if policy == "random" else {}, epochs=3, seed=1)
        epoch = 1
    decided = []
    for s, n in [(0, 100), (2, 130), (7, 20)]:
        keys = [f"img/{s}/{i:05d}_word_{i % 7}" for i in range(n)] + [f"new/{i}" for i in range(40)] + ["", "é/ü"]
        decisions = PlanView(run, epoch).shard(f"shard-{s:03d}.tar").decide_all(keys)
        assert decisions == [PlanView(run, epoch).decide(f"shard-{s:03d}.tar", k) for k in keys]
        decided += decisions
    assert {(d.keep, d.known) for d in decided} == {(True, True), (False, True), (True, False), (False, False)} - (
        {(False, False)} if policy == "test_varied" else set()  # its absent rule keeps
    ) - ({(True, True), (False, True)} if policy == "seta" else set())  # an empty run: nothing listed
