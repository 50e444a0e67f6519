"""Balanced epochs (docs/ranks.md): the deal kernel, and every (rank, worker) slot of a pipeline
read in this process (the slot set through webdataset's RANK/WORLD_SIZE and WORKER/NUM_WORKERS,
as split_by_node/split_by_worker read them) on real tar shards and real plans.

The plans come from SeTa (k=2, a one-cluster window) on a fixed loss per shard: 0.1 for even
shard numbers, 5.0 for odd ones. Epoch 0 keeps everything, odd epochs every sample of the odd
shards and nothing of the even ones, epoch 2 the reverse: per-shard kept counts as skewed as
they get, and under split_by_node with 2 ranks rank 0's shards (0, 2, 4, 6) keep nothing in
odd epochs. tests/test_balance_ranks.py runs the same with real ranks and DataLoader workers.
"""

from __future__ import annotations

import hashlib
import itertools
from collections import Counter

import numpy as np
import pyarrow.compute as pc
import pytest
import torch
import webdataset as wds
from conftest import web_dataset, write_shards

import seta_stream as seta
from seta_stream._balance import EpochDeal, deal, deferring_half, order_keys
from seta_stream.errors import BalanceError, InvalidInputError, UnsupportedPipelineError
from seta_stream.ids import shard_name

SIZES = [5, 9, 13, 4, 20, 7, 11]  # 7 shards: not a multiple of 2x2, 4x2 or 3x1 slots
EPOCHS = 4
SLOT_ENV = ("RANK", "WORLD_SIZE", "WORKER", "NUM_WORKERS")


def planning_loss(shards: list[str]) -> np.ndarray:
    return np.array([5.0 if int(s.split("-")[1][:4]) % 2 else 0.1 for s in shards], np.float32)


def make_run(root, sizes=SIZES, *, population=True, settings=None, drop=()):
    """Shards of ``sizes`` samples and a run planned for EPOCHS epochs (losses recorded for
    every sample after each plan). ``drop``: (shard index, key) pairs left out of the population."""
    urls = write_shards(root / "shards", sizes)
    run = root / "run"
    pop = seta.list_samples(urls)
    if drop:
        names = pop.column("shard").to_pylist()
        keys = pop.column("key").to_pylist()
        gone = {(shard_name(urls[s]), k) for s, k in drop}
        pop = pop.filter(np.array([(n, k) not in gone for n, k in zip(names, keys)]))
    pruner = seta.Pruner(
        run,
        policy="seta",
        params={"r": 0.0, "k": 2, "alpha": 0.5},
        epochs=EPOCHS,
        seed=11,
        population=pop if population else None,
        settings=settings,
    )
    everything = seta.list_samples(urls)
    names = everything.column("shard").to_pylist()
    for e in range(EPOCHS):
        pruner.start_epoch(e)
        pruner.record(everything.column("key").to_pylist(), everything.column("url").to_pylist(), planning_loss(names))
    pruner.close()
    return urls, run


@pytest.fixture(scope="module")
def planned(tmp_path_factory):
    return make_run(tmp_path_factory.mktemp("balance"))


def plan_kept(run, epoch) -> dict[str, list[str]]:
    """shard -> its kept keys, in the plan's row order."""
    plan = seta.load_plan(run, epoch, columns=["shard", "key", "keep"])
    kept: dict[str, list[str]] = {}
    rows = plan.filter(pc.field("keep"))
    for s, k in zip(rows.column("shard").to_pylist(), rows.column("key").to_pylist()):
        kept.setdefault(s, []).append(k)
    return kept


def deferred_keys(run, report) -> set[tuple[str, str]]:
    kept = plan_kept(run, report.epoch)
    return {(s, k) for s, lo, hi in report.deferred_samples for k in kept[s][lo:hi]}


def webdataset_attached(urls, run, epoch):
    return seta.attach(web_dataset(urls, shardshuffle=False, nodesplitter=wds.split_by_node), run, epoch=epoch,
                       balance=True)  # fmt: skip


def datapipeline_attached(urls, run, epoch):  # OpenCLIP's shape
    ds = wds.DataPipeline(wds.SimpleShardList(urls), wds.split_by_node, wds.split_by_worker, wds.tarfile_to_samples())
    return seta.attach(ds, run, epoch=epoch, balance=True)


def manual_kept_tar_samples(urls, run, epoch):
    return wds.DataPipeline(
        wds.SimpleShardList(urls), seta.split_balanced(run, epoch), seta.kept_tar_samples(run, epoch, balance=True)
    )


def manual_keep_filter(urls, run, epoch):
    return wds.DataPipeline(
        wds.SimpleShardList(urls),
        seta.split_balanced(run, epoch),
        wds.tarfile_to_samples(),
        seta.keep_filter(run, epoch, balance=True),
    )


PIPELINES = [webdataset_attached, datapipeline_attached, manual_kept_tar_samples, manual_keep_filter]


def read_slots(monkeypatch, build, urls, run, epoch, world, workers):
    """(rank, worker) -> the (shard, key) of the samples the slot's pipeline yields."""
    out = {}
    for rank, worker in itertools.product(range(world), range(workers)):
        for name, value in zip(SLOT_ENV, (rank, world, worker, workers)):
            monkeypatch.setenv(name, str(value))
        out[rank, worker] = [(shard_name(s["__url__"]), s["__key__"]) for s in build(urls, run, epoch)]
    for name in SLOT_ENV:
        monkeypatch.delenv(name)
    return out


# ---------------------------------------------------------------------------------- the kernel
def test_deal_cuts_the_sequence_into_equal_chunks_and_defers_the_tail():
    kept = [3, 0, 5, 2]
    order = np.array([4, 1, 2, 3], np.uint64)
    defer_last = np.array([False, False, True, False])
    d = deal(kept, order, defer_last, 3)
    # sequence: shard 3 (2), shard 0 (3) [first half, by order], then shard 2 (5) [deferring half]
    assert (d.per_slot, d.kept, d.deferred, d.deferred_outside_half) == (3, 10, 1, 0)
    pieces = list(zip(d.shard.tolist(), d.slot.tolist(), d.lo.tolist(), d.hi.tolist()))
    assert pieces == [(3, 0, 0, 2), (0, 0, 0, 1), (0, 1, 1, 3), (2, 1, 0, 1), (2, 2, 1, 4), (2, 3, 4, 5)]


def test_deal_properties_on_random_plans():
    rng = np.random.default_rng(0)
    for case in range(300):
        n = int(rng.integers(1, 40))
        kept = rng.integers(0, 30, n) * (rng.random(n) < 0.8)
        slots = int(rng.integers(1, 25))
        defer_last = rng.random(n) < 0.5
        d = deal(kept, rng.integers(0, 2**63, n).astype(np.uint64), defer_last, slots)
        total = int(kept.sum())
        q = total // slots
        assert (d.per_slot, d.kept, d.deferred) == (q, total, total - q * slots), case
        sizes = np.bincount(d.slot, weights=d.hi - d.lo, minlength=slots + 1)
        assert np.array_equal(sizes[:slots], np.full(slots, q)), case
        assert sizes[slots] == total - q * slots < slots, case
        # per shard the pieces tile [0, kept) in order
        for s in range(n):
            mine = np.flatnonzero(d.shard == s)
            if kept[s] == 0:
                assert len(mine) == 0
                continue
            assert d.lo[mine[0]] == 0 and d.hi[mine[-1]] == kept[s]
            assert np.array_equal(d.lo[mine[1:]], d.hi[mine[:-1]]) and np.all(d.hi[mine] > d.lo[mine]), case
        # at most slots - 1 cuts inside shards, and the deferred pieces come last
        opened = int((d.slot < slots).sum())
        assert opened <= int((kept > 0).sum()) + slots - 1, case
        assert np.all(np.diff(d.slot) >= 0), case
        outside = int(((d.hi - d.lo) * ((d.slot == slots) & ~defer_last[d.shard])).sum())
        assert d.deferred_outside_half == outside, case
        if defer_last[kept > 0].any() and kept[defer_last].sum() >= d.deferred:
            assert outside == 0, case


def test_deal_with_fewer_samples_than_slots_defers_everything():
    d = deal([2, 1], np.array([1, 2], np.uint64), np.array([True, False]), 4)
    assert (d.per_slot, d.deferred) == (0, 3)
    assert d.slot.tolist() == [4, 4] and d.shard.tolist() == [1, 0]


def test_deal_refuses_bad_input():
    with pytest.raises(InvalidInputError, match="slots >= 1 and kept >= 0"):
        deal([1, -1], np.zeros(2, np.uint64), np.zeros(2, bool), 2)
    with pytest.raises(InvalidInputError, match="slots >= 1"):
        deal([1], np.zeros(1, np.uint64), np.zeros(1, bool), 0)
    with pytest.raises(InvalidInputError, match="one length"):
        deal([1, 2], np.zeros(1, np.uint64), np.zeros(2, bool), 2)


def test_epoch_order_is_a_hash_and_the_deferring_half_alternates():
    names = [f"part-{i:04d}.tar" for i in range(50)]
    keys = order_keys(names, 11, 3)
    assert np.array_equal(order_keys(names[::-1], 11, 3), keys[::-1])  # per name, not per position
    assert not np.array_equal(order_keys(names, 11, 4), keys)
    assert not np.array_equal(order_keys(names, 12, 3), keys)
    for e in range(4):
        assert np.array_equal(deferring_half(names, 11, e), ~deferring_half(names, 11, e + 1))
    assert 10 < deferring_half(names, 11, 0).sum() < 40
    # pinned: the deal must not change with the machine or a library version
    digest = hashlib.blake2b(b"seta_stream.balance/order/0/0/part-0000.tar", digest_size=8).digest()
    assert int(order_keys(["part-0000.tar"], 0, 0)[0]) == int.from_bytes(digest, "little")


# ---------------------------------------------------------------------------------- the pipelines
@pytest.mark.parametrize("build", PIPELINES, ids=lambda f: f.__name__)
@pytest.mark.parametrize(("world", "workers"), [(2, 2), (4, 2), (3, 1)])
def test_every_slot_reads_exactly_its_share_of_every_epoch(planned, monkeypatch, build, world, workers):
    urls, run = planned
    for epoch in range(EPOCHS):
        report = seta.balanced_epoch(run, epoch, workers=workers, world_size=world)
        kept = plan_kept(run, epoch)
        plan_set = {(s, k) for s, ks in kept.items() for k in ks}
        assert report.kept == len(plan_set) == seta.load_summary(run, epoch)["kept"]
        slots = read_slots(monkeypatch, build, urls, run, epoch, world, workers)
        assert {len(v) for v in slots.values()} == {report.per_slot}, (epoch, {k: len(v) for k, v in slots.items()})
        every = [x for v in slots.values() for x in v]
        assert len(every) == len(set(every)), "a sample read by two slots"
        deferred = deferred_keys(run, report)
        assert len(deferred) == report.deferred == report.kept % (world * workers)
        assert set(every) == plan_set - deferred
        assert report.per_rank == report.per_slot * workers and report.slots == world * workers


def test_a_rank_whose_own_shards_are_all_pruned_gets_its_share(planned, monkeypatch):
    urls, run = planned
    epoch = 1  # keeps the odd shards only
    kept = plan_kept(run, epoch)
    natural = read_slots(
        monkeypatch,
        lambda u, r, e: seta.attach(web_dataset(u, shardshuffle=False, nodesplitter=wds.split_by_node), r, epoch=e),
        urls, run, epoch, 2, 2,
    )  # fmt: skip
    assert not any(shard_name(u) in kept for u in urls[0::2])  # rank 0's shards under split_by_node
    assert len(natural[0, 0]) + len(natural[0, 1]) == 0 and len(natural[1, 0]) + len(natural[1, 1]) == 20
    balanced = read_slots(monkeypatch, webdataset_attached, urls, run, epoch, 2, 2)
    assert {k: len(v) for k, v in balanced.items()} == {(0, 0): 5, (0, 1): 5, (1, 0): 5, (1, 1): 5}
    report = seta.balanced_epoch(run, epoch, workers=2, world_size=2)
    assert (report.per_rank, report.steps(3), report.batch_sizes(3)) == (10, 4, [3, 3, 2, 2])
    assert report.steps(3, partial=False) == 2 and report.batch_sizes(3, partial=False) == [3, 3]


@pytest.mark.parametrize(("world", "workers"), [(5, 1), (3, 2)])
def test_a_deferred_sample_is_trained_in_the_next_epoch(tmp_path, monkeypatch, world, workers):
    # every epoch keeps all 64 samples ("full"): the deferred remainder is the only gap
    urls = write_shards(tmp_path / "shards", [7, 3, 12, 5, 9, 6, 10, 4, 8])
    run = tmp_path / "run"
    with seta.Pruner(run, policy="full", epochs=6, seed=5, population=seta.list_samples(urls)) as pruner:
        for epoch in range(6):
            pruner.start_epoch(epoch)
    slots = world * workers
    previous: set[tuple[str, str]] = set()
    for epoch in range(6):
        report = seta.balanced_epoch(run, epoch, workers=workers, world_size=world)
        read = read_slots(monkeypatch, webdataset_attached, urls, run, epoch, world, workers)
        trained = {x for v in read.values() for x in v}
        deferred = deferred_keys(run, report)
        assert len(deferred) == report.deferred == 64 % slots and report.deferred_outside_half == 0
        assert len(trained) == 64 - 64 % slots and not trained & deferred
        assert previous <= trained, f"epoch {epoch}: samples deferred in epoch {epoch - 1} not trained"
        previous = deferred


def test_samples_missing_from_the_population_are_dropped_and_counted(tmp_path, monkeypatch):
    urls, run = make_run(tmp_path, drop=[(4, "sample0000"), (4, "sample0007"), (2, "sample0012")])
    before = seta.stage_counters().get("absent_dropped", 0)
    report = seta.balanced_epoch(run, 0, workers=2, world_size=2)
    read = read_slots(monkeypatch, manual_kept_tar_samples, urls, run, 0, 2, 2)
    every = {x for v in read.values() for x in v}
    assert report.kept == sum(SIZES) - 3 and {len(v) for v in read.values()} == {report.per_slot}
    assert not every & {(shard_name(urls[4]), "sample0000"), (shard_name(urls[2]), "sample0012")}
    assert len(every) + report.deferred == report.kept
    assert seta.stage_counters().get("absent_dropped", 0) - before == 3


def test_a_partitioned_plan_is_dealt_over_all_its_buckets(tmp_path, monkeypatch):
    urls, run = make_run(tmp_path, settings={"buckets": 3})
    assert seta.load_summary(run, 1)["stage"]["buckets"] == 3
    report = seta.balanced_epoch(run, 1, workers=2, world_size=2)
    read = read_slots(monkeypatch, datapipeline_attached, urls, run, 1, 2, 2)
    assert report.kept == 20 and {len(v) for v in read.values()} == {5}
    assert {x for v in read.values() for x in v} == {(s, k) for s, ks in plan_kept(run, 1).items() for k in ks}


# ---------------------------------------------------------------------------------- attach and refusals
def stage_names(ds):
    return [getattr(getattr(st, "f", st), "__name__", type(st).__name__) for st in ds.pipeline]


def test_attach_replaces_the_shard_splitters(planned):
    urls, run = planned
    ds = datapipeline_attached(urls, run, None)
    assert stage_names(ds)[:3] == ["SimpleShardList", "_split_balanced_of", "_skip_shards_of"]
    assert "split_by_node" not in stage_names(ds) and "split_by_worker" not in stage_names(ds)
    plain = wds.DataPipeline(wds.SimpleShardList(urls), wds.tarfile_to_samples())  # no splitter: one is added
    assert stage_names(seta.attach(plain, run, balance=True))[1] == "_split_balanced_of"
    webds = web_dataset(urls, shardshuffle=False, nodesplitter=wds.split_by_node)
    names = stage_names(seta.attach(webds, run, balance=True))
    assert names.count("_split_balanced_of") == 1 and not {"split_by_node", "split_by_worker"} & set(names)


def test_attach_refuses_resampled_shards_and_leaves_the_pipeline_as_it_was(planned):
    urls, run = planned
    ds = wds.DataPipeline(wds.ResampledShards(urls), wds.split_by_worker, wds.tarfile_to_samples())
    before = list(ds.pipeline)
    with pytest.raises(UnsupportedPipelineError, match=r"draws shards with replacement \(ResampledShards\)"):
        seta.attach(ds, run, balance=True)
    assert ds.pipeline == before


def test_without_a_population_a_balanced_epoch_is_refused(tmp_path, monkeypatch):
    urls, run = make_run(tmp_path, population=False)
    fix = r"Pruner\(\.\.\., population=seta_stream\.list_samples\(urls\)\)"
    with pytest.raises(BalanceError, match=r"balanced_epoch\(\): the plan of epoch 1 was made without a population"):
        seta.balanced_epoch(run, 1, workers=2, world_size=2)
    with pytest.raises(BalanceError, match=fix):
        read_slots(monkeypatch, webdataset_attached, urls, run, 1, 2, 2)


def test_a_shard_list_that_differs_from_the_plan_is_refused(planned, tmp_path, monkeypatch):
    urls, run = planned
    with pytest.raises(BalanceError, match=r"1 shard\(s\) the plan keeps samples of are not in the list \(e.g. "
                                           r"'part-0006.tar'\)"):  # fmt: skip
        read_slots(monkeypatch, manual_kept_tar_samples, urls[:-1], run, 0, 2, 2)
    extra = write_shards(tmp_path / "other", [3], prefix="extra")
    with pytest.raises(BalanceError, match=r"1 shard\(s\) the plan does not know \(e.g. 'extra-0000.tar'\)"):
        read_slots(monkeypatch, manual_kept_tar_samples, urls + extra, run, 0, 2, 2)
    with pytest.raises(BalanceError, match="names shard 'part-0001.tar' twice"):
        read_slots(monkeypatch, manual_kept_tar_samples, urls + urls[1:2], run, 0, 2, 2)


def test_a_balanced_keep_stage_without_the_balanced_split_is_refused(planned, monkeypatch):
    urls, run = planned

    def unbalanced_split(u, r, e):
        return wds.DataPipeline(
            wds.SimpleShardList(u), wds.split_by_node, wds.split_by_worker, seta.kept_tar_samples(r, e, balance=True)
        )

    with pytest.raises(BalanceError, match=r"which the deal gave another slot .*put seta_stream.split_balanced"):
        read_slots(monkeypatch, unbalanced_split, urls, run, 0, 2, 2)


def test_an_epoch_keeping_fewer_samples_than_slots_is_refused(planned):
    urls, run = planned
    with pytest.raises(BalanceError, match=r"epoch 1 keeps 20 samples, fewer than the 24 slots"):
        seta.balanced_epoch(run, 1, workers=2, world_size=12)


def test_rank_and_world_size_come_together():
    with pytest.raises(InvalidInputError, match="give rank and world_size together"):
        seta.split_balanced("x", rank=1)(iter([])).__next__()


def test_counts_of_the_split_stage(planned, monkeypatch):
    urls, run = planned
    before = Counter(seta.stage_counters())
    read_slots(monkeypatch, datapipeline_attached, urls, run, 1, 2, 2)
    after = Counter(seta.stage_counters())
    report = seta.balanced_epoch(run, 1, workers=2, world_size=2)
    dealt = EpochDeal({shard_name(u): 0 for u in urls} | kept_counts(run, 1), seed=11, epoch=1, slots=4)
    d = dealt.deal
    in_part = int(((d.slot < 4) & ((d.lo > 0) | (d.hi < dealt.kept[d.shard]))).sum())
    assert after["shards_dealt"] - before["shards_dealt"] == report.opens == int((d.slot < 4).sum())
    assert after["shards_dealt_in_part"] - before["shards_dealt_in_part"] == in_part > 0


def kept_counts(run, epoch) -> dict[str, int]:
    return {s: len(ks) for s, ks in plan_kept(run, epoch).items()}


def test_a_spawned_worker_gets_its_rank_from_attach(planned, monkeypatch):
    """In a spawned DataLoader worker torch.distributed is not initialised, and scripts started
    by mp.spawn have no RANK/WORLD_SIZE in the environment: attach() hands the worker the rank
    and world size of the process that calls it."""
    urls, run = planned
    expected = read_slots(monkeypatch, webdataset_attached, urls, run, 2, 2, 1)
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    ds = webdataset_attached(urls, run, 2)
    monkeypatch.delenv("RANK")
    monkeypatch.delenv("WORLD_SIZE")
    loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=1, multiprocessing_context="spawn")
    got = [(shard_name(s["__url__"]), s["__key__"]) for s in loader]
    assert got == expected[1, 0] and len(got) == 49 // 2


# ---------------------------------------------------------------------------------- OpenCLIP
def test_openclip_adapt_balances_every_rank_of_its_pipeline(tmp_path, monkeypatch):
    """OpenCLIP's get_wds_dataset (tests/test_openclip.py's replica: detshuffle2, split_by_node,
    split_by_worker, tarfile_to_samples_nothrow, select, batched(partial=False), with_epoch)
    adapted under 2 ranks x 2 workers: every slot the same pairs in batches of the same sizes."""
    from test_openclip import get_wds_dataset, pair_shards

    urls = pair_shards(tmp_path / "pairs", shards=5, pairs=7)  # 35 pairs: 8 each, 3 deferred
    run = tmp_path / "run"
    population = seta.list_samples(urls, members=seta.openclip.MEMBERS)
    with seta.Pruner(run, policy="full", epochs=1, seed=3, population=population) as pruner:
        pruner.start_epoch(0)
    report = seta.balanced_epoch(run, 0, workers=2, world_size=2)
    assert (report.per_slot, report.deferred) == (8, 3)
    pairs, sizes = [], []
    for rank, worker in itertools.product(range(2), range(2)):
        for name, value in zip(SLOT_ENV, (rank, 2, worker, 2)):
            monkeypatch.setenv(name, str(value))
        data = get_wds_dataset(urls, batch_size=3, workers=0, num_samples=35, world_size=2)
        ds = seta.openclip.adapt(data, run)  # several ranks: balanced without being asked
        assert "split_by_node" not in stage_names(ds) and "_split_balanced_of" in stage_names(ds)
        batches = list(data.dataloader)
        sizes.append([len(b[0]) for b in batches])
        pairs += [(shard_name(u), k) for _, _, keys, us, _ in batches for k, u in zip(keys, us)]
    assert sizes == [[3, 3, 2]] * 4
    assert len(pairs) == len(set(pairs)) == 32
    assert set(pairs) == {(s, k) for s, ks in plan_kept(run, 0).items() for k in ks} - deferred_keys(run, report)
    for name in SLOT_ENV:
        monkeypatch.delenv(name)
    one_rank = seta.openclip.adapt(get_wds_dataset(urls, batch_size=3, workers=0, num_samples=35), run)
    assert "split_by_node" in stage_names(one_rank) and "_split_balanced_of" not in stage_names(one_rank)
