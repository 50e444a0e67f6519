"""The webdataset stages with real shards and real DataLoader workers (fork and spawn)."""

from __future__ import annotations

import pickle
from dataclasses import dataclass

import numpy as np
import pytest
import torch
import webdataset as wds
from conftest import write_shards

import seta_stream as seta
from seta_stream import PlanMissingError, RunDir, plan_epoch
from seta_stream.ids import sample_uid
from seta_stream.policies import POLICIES, PolicySpec, register
from seta_stream.policies.base import PolicyResult, reason_code


@dataclass(frozen=True)
class DropParams:
    """Keep every sample except those whose uid is listed; weight 2 for keys ending in 0."""

    drop: tuple = ()


def drop_listed(inp, p):
    drop = np.isin(inp.uid, np.array(list(p.drop), dtype=np.uint64))
    keep = ~drop
    weight = np.where(keep, 1.0, 0.0).astype(np.float32)
    return PolicyResult(keep, weight, np.full(inp.n, reason_code("kept"), np.int8), {"phase": "prune"})


if "test_drop_listed" not in POLICIES:
    register(PolicySpec("test_drop_listed", DropParams, drop_listed, "test policy"))


def population(urls):
    return [(u.rsplit("/", 1)[1], f"sample{i:04d}") for u in urls for i in range(30)]


def kept_set(run, epoch):
    plan = seta.load_plan(run, epoch)
    return {
        (s, k)
        for s, k, keep in zip(
            plan.column("shard").to_pylist(), plan.column("key").to_pylist(), plan.column("keep").to_pylist()
        )
        if keep
    }


def iterate(ds, workers=0, context=None, persistent=False, epochs=None, on_epoch=None):
    loader = torch.utils.data.DataLoader(
        ds,
        batch_size=None,
        num_workers=workers,
        multiprocessing_context=context if workers else None,
        persistent_workers=persistent if workers else False,
    )
    out = []
    for e in epochs or [None]:
        if on_epoch is not None:
            on_epoch(e)
        got = []
        for sample in loader:
            got.append((sample["__url__"].rsplit("/", 1)[1], sample["__key__"], float(sample["__weight__"])))
        out.append(got)
    return out


def test_keep_filter_in_a_datapipeline_yields_exactly_the_plan(tmp_path, shards):
    run = tmp_path / "run"
    plan_epoch(
        RunDir(run, create=True), 0, policy="random", params={"r": 0.5}, epochs=3, seed=1, population=population(shards)
    )
    ds = wds.DataPipeline(
        wds.SimpleShardList(shards),
        seta.skip_shards(str(run)),
        wds.tarfile_to_samples(),
        seta.keep_filter(str(run)),
    )
    (got,) = iterate(ds)
    assert {(s, k) for s, k, _ in got} == kept_set(run, 0)
    assert len(got) == 60 and {w for _, _, w in got} == {1.0}


@pytest.mark.parametrize(("context", "persistent"), [("fork", False), ("fork", True), ("spawn", True)])
def test_dataloader_workers_follow_the_current_epoch(tmp_path, shards, context, persistent):
    run = RunDir(tmp_path / "run", create=True)
    pop = population(shards)
    ds = seta.attach(wds.WebDataset(shards, shardshuffle=False, empty_check=False), str(tmp_path / "run"))

    def publish(e):
        plan_epoch(run, e, policy="random", params={"r": 0.4}, epochs=3, seed=2, population=pop)

    results = iterate(ds, workers=2, context=context, persistent=persistent, epochs=[0, 1, 2], on_epoch=publish)
    for e, got in enumerate(results):
        keys = [(s, k) for s, k, _ in got]
        assert len(keys) == len(set(keys)), "a sample was yielded twice"
        assert set(keys) == kept_set(run, e), f"epoch {e}"
    assert kept_set(run, 0) != kept_set(run, 1)  # dynamic random redraws


def test_shards_without_kept_samples_are_not_opened(tmp_path, shards):
    run = RunDir(tmp_path / "run", create=True)
    drop = tuple(sample_uid("part-0001.tar", f"sample{i:04d}") for i in range(30))
    # a listed shard that does not exist on disk would fail to open: it must be skipped
    missing = str(tmp_path / "shards" / "part-0009.tar")
    drop += tuple(sample_uid("part-0009.tar", f"sample{i:04d}") for i in range(3))
    pop = population(shards) + [("part-0009.tar", f"sample{i:04d}") for i in range(3)]
    plan_epoch(run, 0, policy="test_drop_listed", params={"drop": drop}, epochs=1, population=pop)
    opened = []

    def spy(src):
        for item in src:
            opened.append(item["url"].rsplit("/", 1)[1])
            yield item

    ds = wds.DataPipeline(
        wds.SimpleShardList(shards + [missing]),
        seta.skip_shards(str(tmp_path / "run")),
        spy,
        wds.tarfile_to_samples(),
        seta.keep_filter(str(tmp_path / "run")),
    )
    (got,) = iterate(ds)
    assert opened == ["part-0000.tar", "part-0002.tar", "part-0003.tar"]
    assert {s for s, _, _ in got} == {"part-0000.tar", "part-0002.tar", "part-0003.tar"}
    assert seta.stage_counters()["shards_skipped"] >= 2


def test_unknown_shards_and_keys_are_kept_and_counted(tmp_path, shards):
    run = RunDir(tmp_path / "run", create=True)
    # the plan knows only shard 0 (20 of its 30 samples); everything else is absent
    pop = [("part-0000.tar", f"sample{i:04d}") for i in range(20)]
    plan_epoch(run, 0, policy="full", epochs=1, population=pop)
    before = seta.stage_counters()
    ds = wds.DataPipeline(
        wds.SimpleShardList(shards), wds.tarfile_to_samples(), seta.keep_filter(str(tmp_path / "run"))
    )
    (got,) = iterate(ds)
    assert len(got) == 120
    after = seta.stage_counters()
    assert after["absent_kept"] - before.get("absent_kept", 0) == 100
    assert after["kept"] - before.get("kept", 0) == 120


def test_absent_samples_follow_the_bernoulli_rule_of_the_planner(tmp_path, shards):
    # empty table: SeTa epoch 0 keeps an absent sample iff its stream-1 uniform < 1 - r
    run = RunDir(tmp_path / "run", create=True)
    plan_epoch(run, 0, policy="seta", params={"r": 0.3}, epochs=4, seed=11)
    ds = wds.DataPipeline(
        wds.SimpleShardList(shards), wds.tarfile_to_samples(), seta.keep_filter(str(tmp_path / "run"))
    )
    (got,) = iterate(ds)
    from seta_stream.policies.random_draws import uniforms

    pop = population(shards)
    uids = np.array([sample_uid(s, k) for s, k in pop], dtype=np.uint64)
    u = uniforms(uids, 11, 0, 1)
    expected = {pop[i] for i in np.flatnonzero(u < 0.7)}
    assert {(s, k) for s, k, _ in got} == expected
    assert 60 < len(expected) < 110


def test_weights_are_attached_and_weighted_mean_divides_by_batch_size(tmp_path, shards):
    losses = torch.tensor([1.0, 2.0, 3.0, 4.0])
    assert seta.weighted_mean(losses, torch.tensor([1.0, 1.0, 2.0, 0.5])).item() == pytest.approx((1 + 2 + 6 + 2) / 4)
    assert seta.weighted_mean(losses, {"__weight__": [1.0, 1.0, 1.0, 1.0]}).item() == pytest.approx(2.5)


def test_resampled_and_split_by_node(tmp_path, shards):
    run = RunDir(tmp_path / "run", create=True)
    plan_epoch(run, 0, policy="random", params={"r": 0.5}, epochs=1, seed=5, population=population(shards))
    kept = kept_set(tmp_path / "run", 0)
    ds = seta.attach(wds.WebDataset(shards, resampled=True, shardshuffle=False, seed=1), str(tmp_path / "run"))
    got = [(s["__url__"].rsplit("/", 1)[1], s["__key__"]) for s in ds.with_epoch(200)]
    assert len(got) == 200 and set(got) <= kept
    union = set()
    for rank in range(2):

        def node_split(src, rank=rank):
            for i, item in enumerate(src):
                if i % 2 == rank:
                    yield item

        ds = seta.attach(
            wds.WebDataset(shards, shardshuffle=False, nodesplitter=node_split, empty_check=False),
            str(tmp_path / "run"),
        )
        keys = {(s["__url__"].rsplit("/", 1)[1], s["__key__"]) for s in ds}
        assert not keys & union
        union |= keys
    assert union == kept


def test_stages_pickle_and_missing_plan_is_reported(tmp_path, shards):
    run = RunDir(tmp_path / "run", create=True)
    stage = seta.keep_filter(str(tmp_path / "run"))
    clone = pickle.loads(pickle.dumps(stage))
    ds = wds.DataPipeline(wds.SimpleShardList(shards), wds.tarfile_to_samples(), clone)
    with pytest.raises(PlanMissingError, match=r"no epoch has been planned in this run; call pruner.start_epoch\(e\)"):
        next(iter(ds))
    plan_epoch(run, 0, policy="full", epochs=2)
    ds = wds.DataPipeline(wds.SimpleShardList(shards), wds.tarfile_to_samples(), seta.keep_filter(run, epoch=1))
    with pytest.raises(PlanMissingError, match=r"no plan for epoch 1; call pruner.start_epoch\(1\)"):
        next(iter(ds))


@pytest.mark.parametrize(("scheme", "context"), [("memory", "fork"), ("file", "spawn")])
def test_fsspec_run_directories_in_workers(tmp_path, shards, scheme, context):
    url = f"memory://stage-{tmp_path.name}/run" if scheme == "memory" else f"file://{tmp_path}/run"
    run = RunDir(url, create=True)
    plan_epoch(run, 0, policy="random", params={"r": 0.5}, epochs=1, seed=3, population=population(shards))
    ds = seta.attach(wds.WebDataset(shards, shardshuffle=False, empty_check=False), url)
    (got,) = iterate(ds, workers=2, context=context)
    assert {(s, k) for s, k, _ in got} == kept_set(run, 0)


def test_an_empty_shard_is_harmless(tmp_path):
    urls = write_shards(tmp_path / "s", [5, 0, 5])
    run = RunDir(tmp_path / "run", create=True)
    plan_epoch(run, 0, policy="full", epochs=1)
    ds = wds.DataPipeline(wds.SimpleShardList(urls), wds.tarfile_to_samples(), seta.keep_filter(run))
    assert len(list(ds)) == 10


def test_plans_with_keys_in_lookup_arrow_are_still_read(tmp_path, shards):
    """Plans written before keys.arrow existed carry the key column in lookup.arrow."""
    import os

    import pyarrow as pa
    import pyarrow.ipc as ipc

    run = tmp_path / "run"
    plan_epoch(
        RunDir(run, create=True), 0, policy="random", params={"r": 0.5}, epochs=3, seed=1, population=population(shards)
    )
    d = run / "plans/epoch=0"
    keys = ipc.open_file(str(d / "keys.arrow")).read_all().column("key")
    lookup = ipc.open_file(str(d / "lookup.arrow")).read_all()
    old = pa.table({"key": keys, "keep": lookup.column("keep"), "weight": lookup.column("weight")})
    os.remove(d / "keys.arrow")
    with pa.OSFile(str(d / "lookup.arrow"), "wb") as sink, ipc.new_file(sink, old.schema) as w:
        w.write_table(old)
    ds = wds.DataPipeline(wds.SimpleShardList(shards), wds.tarfile_to_samples(), seta.keep_filter(str(run)))
    (got,) = iterate(ds)
    assert {(s, k) for s, k, _ in got} == kept_set(run, 0) and len(got) == 60
