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
from seta_stream._reading.balance import EpochDeal, deal, deferring_half, order_keys
from seta_stream._store.slots import clear_claims
from seta_stream.errors import BalanceError, InvalidInputError, UnsupportedPipelineError
from seta_stream.ids import shard_name
from seta_stream.testing import LossRecorder

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
    """(rank, worker) -> the (shard, key) of the samples the slot's pipeline yields. The slot
    claims of earlier reads of the run are cleared first, as a job's start_epoch clears them:
    these tests read one plan as jobs of several shapes would, one after the other."""
    clear_claims(seta.RunDir(run))
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


# ---------------------------------------------------------------------------------- what the deal cannot see
def loader_keys(ds, workers: int) -> list[tuple[str, str]]:
    """The (shard, key) a real DataLoader yields. Its workers are shut down (joined) before this
    returns or raises: when one worker raises, a sibling still starting writes its slot claim a
    moment later, and the exception's traceback keeps the loader alive, so without the shutdown
    that claim could land after the test had cleared the claims and moved on to another shape."""
    batches = iter(torch.utils.data.DataLoader(ds, batch_size=None, num_workers=workers))
    try:
        return [(shard_name(s["__url__"]), s["__key__"]) for s in batches]
    finally:
        shutdown = getattr(batches, "_shutdown_workers", None)  # torch's own __del__ step; absent for num_workers=0
        if shutdown is not None:
            shutdown()


@pytest.mark.filterwarnings("ignore:This DataLoader will create 3 worker processes")
def test_a_rank_reading_with_other_num_workers_is_refused_before_its_first_sample(tmp_path, monkeypatch):
    """Rank 0 of 2 reads epoch 1 with 2 real DataLoader workers (its share, exactly), then rank
    1 with 3: its readers find rank 0's claims and stop before yielding a sample; the next
    start_epoch refuses the epoch for every rank. num_workers=0 counts as one slot, as 1 worker does."""
    urls, run = make_run(tmp_path)
    clear_claims(seta.RunDir(run))
    expected = read_slots(monkeypatch, webdataset_attached, urls, run, 1, 2, 2)
    clear_claims(seta.RunDir(run))
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    got = loader_keys(webdataset_attached(urls, run, 1), 2)
    assert sorted(got) == sorted(expected[0, 0] + expected[0, 1])
    assert sorted(p.name for p in (run / "slots/epoch=1").iterdir()) == [
        "world=2-workers=2-rank=0-worker=0", "world=2-workers=2-rank=0-worker=1"]  # fmt: skip
    monkeypatch.setenv("RANK", "1")
    with pytest.raises(BalanceError) as err:
        loader_keys(webdataset_attached(urls, run, 1), 3)
    assert "Caught BalanceError in DataLoader worker process" in str(err.value)
    assert (f"{run / 'slots'}: balanced epoch 1, as its share starts: this reader (rank 1, worker ") in str(err.value)
    assert (
        "count the job's (rank, worker) slots differently: rank 0 with 2 workers a rank (world size 2: 4 slots); "
        "rank 1 with 3 workers a rank (world size 2: 6 slots). Their chunks of the epoch would not tile its kept "
        "samples (some read by two ranks, others by none) and the ranks would take different numbers of steps; "
        "expected every reader of every rank to count the same slots: the same DataLoader num_workers on every rank "
        "(0 counts as one slot per rank, the main process) and one world size (docs/ranks.md)"
    ) in str(err.value)
    monkeypatch.delenv("RANK")
    monkeypatch.delenv("WORLD_SIZE")
    pruner = seta.Pruner(run, epochs=EPOCHS, population=seta.list_samples(urls))
    with pytest.raises(BalanceError, match=r"slots: balanced epoch 1 was read by readers that counted the job's "
                                           r"\(rank, worker\) slots differently: rank 0 with 2 workers a rank \(world "
                                           r"size 2: 4 slots\); rank 1 with 3 workers a rank"):  # fmt: skip
        pruner.start_epoch(2)

    expected = read_slots(monkeypatch, webdataset_attached, urls, run, 1, 2, 1)
    clear_claims(seta.RunDir(run))  # one slot per rank whether the main process or one worker reads
    monkeypatch.setenv("WORLD_SIZE", "2")
    for rank, workers in ((0, 0), (1, 1)):
        monkeypatch.setenv("RANK", str(rank))
        assert loader_keys(webdataset_attached(urls, run, 1), workers) == expected[rank, 0]
    assert sorted(p.name for p in (run / "slots/epoch=1").iterdir()) == [
        "world=2-workers=1-rank=0-worker=0", "world=2-workers=1-rank=1-worker=0"]  # fmt: skip


def test_a_missing_population_is_refused_where_the_pipeline_or_the_pruner_is_built(tmp_path):
    """attach(balance=True), split_balanced and a balanced keep stage refuse a run whose Pruner
    has no population, or whose current plan was made without one, in the calling process; a
    Pruner without one refuses a run this process reads balanced."""
    urls = write_shards(tmp_path / "shards", [5, 6])
    fix = (
        "so its kept count per shard leaves out the samples never recorded; a balanced epoch needs exact counts. "
        "Pass the listing to every plan: Pruner(..., population=seta_stream.list_samples(urls)) (or plan_epoch(..., "
        "population=...)), with the URLs the pipeline reads"
    )
    run = tmp_path / "a"
    seta.Pruner(run, policy="full", epochs=2)  # no population
    for build, what in (
        (lambda: seta.attach(web_dataset(urls), run, balance=True), "attach(balance=True)"),
        (lambda: seta.split_balanced(run), "split_balanced(run)"),
        (lambda: seta.kept_tar_samples(run, balance=True), "kept_tar_samples(run, balance=True)"),
        (lambda: seta.keep_filter(str(run), None, True), "keep_filter(run, balance=True)"),
    ):
        with pytest.raises(BalanceError) as err:
            build()
        assert str(err.value) == f"{run}: {what}: the run's Pruner was given no population listing, {fix}"
    seta.kept_tar_samples(run)  # not balanced: nothing to refuse
    seta.keep_filter(run, balance=False)

    run = tmp_path / "b"  # the pipeline first, then the Pruner
    seta.Pruner(run, policy="full", epochs=2, population=seta.list_samples(urls))
    seta.attach(web_dataset(urls), run, balance=True)
    with pytest.raises(BalanceError) as err:
        seta.Pruner(run, policy="full", epochs=2)
    assert str(err.value) == (
        f"{run}: Pruner (the run is read by attach(balance=True)): the Pruner was given no population listing, {fix}"
    )

    run = tmp_path / "c"  # planned without a population, no Pruner in this process
    seta.plan_epoch(seta.RunDir(run, create=True), 0, policy="full", epochs=2)
    with pytest.raises(BalanceError) as err:
        seta.attach(web_dataset(urls), run, balance=True)
    assert str(err.value) == (
        f"{run}: attach(balance=True): its current plan (epoch 0) was made without a population listing, {fix}"
    )


def test_the_small_final_batch_warning_of_a_balanced_epoch_is_each_slots(tmp_path, monkeypatch):
    """69 kept samples in batches of 16 end with a batch of 5 when one loader batches them; dealt
    to 2 ranks x 2 workers, every worker batches its 17 and ends with a batch of 1. The Pruner of
    a run read balanced leaves the first out; balanced_epoch gives the second, on rank 0 only."""
    import warnings

    urls = write_shards(tmp_path / "shards", SIZES)
    run = tmp_path / "run"
    pruner = seta.Pruner(run, policy="full", epochs=2, population=seta.list_samples(urls), batch_size=16)
    with pytest.warns(
        seta.errors.PlanWarning, match="keeps 69 samples, so batches of 16 end with a batch of 5 samples"
    ):
        seta.Pruner(tmp_path / "plain", policy="full", epochs=2, population=seta.list_samples(urls),
                    batch_size=16).start_epoch(0)  # fmt: skip
    seta.attach(web_dataset(urls), run, balance=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        summary = pruner.start_epoch(0)
    assert [w["code"] for w in summary["warnings"]] == ["small_final_batch"]  # the plan's, on disk
    assert [str(w.message) for w in caught] == []
    with pytest.warns(seta.errors.PlanWarning) as got:
        report = seta.balanced_epoch(run, 0, workers=2, world_size=2)
    assert report.batch_sizes(16)[-2:] == [1, 1] and report.per_slot == 17
    (w,) = [x.message for x in got]
    assert (w.code, w.value, w.limit, w.epoch) == ("small_final_batch", 1.0, 8.0, 0)
    assert str(w) == (
        f"{run / 'plans/epoch=0/summary.json'}: balanced epoch 0: each of the 4 (rank, worker) slots (2 ranks x 2 "
        "DataLoader workers) delivers 17 samples, so its batches of 16 end with a batch of 1 sample: 2 optimiser "
        "steps a rank on 1 sample each (a gradient about 4 times a full batch's) can throw the model off at the end "
        "of the epoch. Drop each worker's last partial batch (batched(..., partial=False): steps(batch_size, "
        "partial=False) counts the steps then), or scale each batch's loss by its size: "
        "seta_stream.weighted_mean(losses, weights, batch_size=...)"
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert seta.balanced_epoch(run, 0, workers=1, world_size=3, batch_size=12).batch_sizes(12) == [12, 11]
        monkeypatch.setenv("RANK", "1")  # rank 1: no warning of its own
        monkeypatch.setenv("WORLD_SIZE", "2")
        seta.balanced_epoch(run, 0, workers=2)


@pytest.mark.parametrize("buckets", [1, 3])
def test_the_plan_row_order_of_a_shard_is_recorded_samples_then_listed_ones_each_by_uid(tmp_path, buckets):
    """docs/ranks.md's row order, which the deal's kept ordinals (deferred_samples' lo, hi) count
    in: a shard's samples the loss table holds, by uid, then the population's samples never
    recorded, by uid; not the shard's rows sorted by uid."""
    from seta_stream.ids import sample_uid

    urls = write_shards(tmp_path / "shards", [12, 9, 7])
    population = seta.list_samples(urls)
    run = seta.RunDir(tmp_path / "run", create=True, settings={"buckets": buckets})
    names, keys = population.column("shard").to_pylist(), population.column("key").to_pylist()
    recorded = [i for i in range(len(keys)) if i % 3 != 1]
    with LossRecorder(run, epoch=0) as rec:
        rec.record([keys[i] for i in recorded], [population.column("url")[i].as_py() for i in recorded],
                   np.linspace(0.5, 2.0, len(recorded)).astype(np.float32))  # fmt: skip
    seta.compact(run)
    seta.plan_epoch(run, 1, policy="full", epochs=3, population=population)
    plan = seta.load_plan(run, 1, columns=["shard", "key", "uid"]).to_pylist()
    in_table = {(names[i], keys[i]) for i in recorded}
    for shard in sorted(set(names)):
        rows = [(r["key"], r["uid"]) for r in plan if r["shard"] == shard]
        old = sorted((r for r in rows if (shard, r[0]) in in_table), key=lambda r: r[1])
        new = sorted((r for r in rows if (shard, r[0]) not in in_table), key=lambda r: r[1])
        assert rows == old + new and old and new
        assert all(uid == sample_uid(shard, key) for key, uid in rows)
        assert rows != sorted(rows, key=lambda r: r[1])  # sorted by uid, the deferred ranges would be others
