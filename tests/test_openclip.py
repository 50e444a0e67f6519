"""seta_stream.openclip on a pipeline built as OpenCLIP's get_wds_dataset builds it (open-clip-torch
3.3.0, training branch), with real shards, persistent DataLoader workers and a Pruner: each
epoch delivers exactly the plan's kept pairs once, takes the exact number of steps they fill,
and the schedule position follows the steps taken. OpenCLIP itself is not installed here;
tools/openclip_check.sh runs the same change on OpenCLIP's own code (docs/openclip.md)."""

from __future__ import annotations

import collections
import math
import random
import sys
from dataclasses import dataclass
from multiprocessing import Value
from types import SimpleNamespace

import numpy as np
import pytest
import webdataset as wds
from webdataset.filters import _shuffle

import seta_stream as seta
from benchmarks.openclip_replica import log_and_continue, tarfile_to_samples_nothrow
from seta_stream import openclip
from seta_stream.errors import InvalidInputError, UnsupportedPipelineError
from seta_stream.ids import sample_uid
from seta_stream.policies import POLICIES, PolicySpec, register
from seta_stream.policies.base import PolicyResult, reason_code

torch = pytest.importorskip("torch")


# ---------------------------------------------------------------- open_clip_train.data 3.3.0
# The parts of get_wds_dataset's training pipeline, as OpenCLIP writes them; its tar reader
# (log_and_continue, group_by_keys_nothrow, tarfile_to_samples_nothrow) is the copy in
# benchmarks/openclip_replica.py, which bench_stage.py times.
class SharedEpoch:
    def __init__(self, epoch=0):
        self.shared_epoch = Value("i", epoch)

    def set_value(self, epoch):
        self.shared_epoch.value = epoch

    def get_value(self):
        return self.shared_epoch.value


class detshuffle2(wds.PipelineStage):
    def __init__(self, bufsize=1000, initial=100, seed=0, epoch=-1):
        self.bufsize, self.initial, self.seed, self.epoch = bufsize, initial, seed, epoch

    def run(self, src):
        if isinstance(self.epoch, SharedEpoch):
            epoch = self.epoch.get_value()
        else:
            self.epoch += 1
            epoch = self.epoch
        rng = random.Random()
        rng.seed(self.seed + epoch)
        return _shuffle(src, self.bufsize, self.initial, rng)


class ResampledShards2(torch.utils.data.IterableDataset):
    def __init__(self, urls, nshards=sys.maxsize, epoch=-1):
        super().__init__()
        self.urls, self.nshards, self.epoch, self.rng = urls, nshards, epoch, random.Random()

    def __iter__(self):
        for _ in range(self.nshards):
            yield dict(url=self.rng.choice(self.urls))


def filter_no_caption_or_no_image(sample):
    return "txt" in sample and ("png" in sample or "jpg" in sample or "jpeg" in sample or "webp" in sample)


def get_wds_dataset(urls, batch_size, workers, num_samples, seed=0, resampled=False, world_size=1):
    """get_wds_dataset(args, preprocess_img, is_train=True): images stay bytes (their length
    stands for the transform), captions strings."""
    shared_epoch = SharedEpoch(epoch=0)
    if resampled:
        pipeline = [ResampledShards2(urls, epoch=shared_epoch)]
    else:
        pipeline = [wds.SimpleShardList(urls)]
    if not resampled:
        pipeline.extend(
            [
                detshuffle2(bufsize=2000, initial=500, seed=seed, epoch=shared_epoch),
                wds.split_by_node,
                wds.split_by_worker,
            ]
        )
    pipeline.extend([tarfile_to_samples_nothrow, wds.shuffle(bufsize=5000, initial=1000)])
    pipeline.extend(
        [
            wds.select(filter_no_caption_or_no_image),
            wds.decode(handler=log_and_continue),
            wds.rename(image="jpg;png;jpeg;webp", text="txt"),
            wds.map_dict(image=len, text=lambda text: text),
            wds.to_tuple("image", "text"),
            wds.batched(batch_size, partial=False),
        ]
    )
    dataset = wds.DataPipeline(*pipeline)
    global_batch_size = batch_size * world_size
    num_batches = math.ceil(num_samples / global_batch_size)
    num_worker_batches = math.ceil(num_batches / max(1, workers))
    num_batches = num_worker_batches * max(1, workers)
    dataset = dataset.with_epoch(num_worker_batches)
    dataloader = wds.WebLoader(
        dataset, batch_size=None, shuffle=False, num_workers=workers, persistent_workers=workers > 0
    )
    dataloader.num_batches = num_batches
    dataloader.num_samples = num_batches * global_batch_size
    return SimpleNamespace(dataloader=dataloader, shared_epoch=shared_epoch, set_epoch=shared_epoch.set_value)


def cosine_lr(base_lr, warmup_length, steps):  # open_clip_train.scheduler.cosine_lr, without the optimizer
    def _lr_adjuster(step):
        if step < warmup_length:
            return base_lr * (step + 1) / warmup_length
        e = step - warmup_length
        es = steps - warmup_length
        return 0.5 * (1 + math.cos(math.pi * e / es)) * base_lr

    return _lr_adjuster


# ---------------------------------------------------------------- the data and the plans
SHARDS, PAIRS, B, WORKERS = 6, 10, 8, 2
QUOTA = (10, 6, 3)  # pairs kept of every shard in epochs 0, 1, 2


def pair_shards(root, shards=SHARDS, pairs=PAIRS, caption_member=None):
    """img2dataset-shaped shards; ``caption_member`` (i -> member) stores some captions under
    another member than .txt (OpenCLIP's filter_no_caption_or_no_image drops those pairs)."""
    root.mkdir(parents=True)
    urls = []
    for s in range(shards):
        path = root / f"{s:05d}.tar"  # img2dataset's names and keys
        with wds.TarWriter(str(path)) as w:
            for i in range(pairs):
                key = f"{s:05d}{i:04d}"
                caption = (caption_member or {}).get(i, "txt")
                w.write({"__key__": key, "jpg": bytes(s * pairs + i + 1), caption: f"caption {key}", "json": b"{}"})
        urls.append(str(path))
    return urls


@dataclass(frozen=True)
class KeepListed:
    """Keep, in epoch e, exactly the uids listed in keep[e]."""

    keep: tuple = ()


def keep_listed(inp, p):
    keep = np.isin(inp.uid, np.array(p.keep[inp.epoch], dtype=np.uint64))
    return PolicyResult(keep, keep.astype(np.float32), np.full(inp.n, reason_code("kept"), np.int8), {})


@pytest.fixture
def keep_listed_policy():
    """The test policy, registered for one test only (the registry is global: other test files
    iterate over every registered policy)."""
    register(PolicySpec("test_keep_listed", KeepListed, keep_listed, "test policy"))
    yield "test_keep_listed"
    POLICIES.pop("test_keep_listed", None)


def quota_plans():
    """(params, kept pairs per epoch): QUOTA[e] pairs of every shard, a different draw each epoch."""
    rng = random.Random(7)
    kept = [
        {(f"{s:05d}.tar", f"{s:05d}{i:04d}") for s in range(SHARDS) for i in rng.sample(range(PAIRS), q)} for q in QUOTA
    ]
    keep = [sorted(sample_uid(s, k) for s, k in pairs) for pairs in kept]  # as state.json holds it
    return {"keep": keep}, kept


def train(data, pruner, epochs, clock=None):
    """OpenCLIP's train_one_epoch loop, reduced to what the data and the schedule see: per
    epoch the pairs delivered, the steps and the schedule positions."""
    delivered, steps, positions = [], [], []
    for epoch in range(epochs):
        summary = pruner.start_epoch(epoch)
        if clock is not None:
            clock.start_epoch(epoch, summary["kept"])
        data.set_epoch(epoch)
        pairs, n, pos = [], 0, []
        for batch in data.dataloader:
            images, texts, *ids = batch
            if ids:
                keys, urls, weights = ids
                pairs += [(seta.ids.shard_name(u), k) for u, k in zip(urls, keys)]
                assert list(texts) == [f"caption {k}" for k in keys]  # the tuple's fields stay aligned
                assert [float(w) for w in weights] == [1.0] * len(keys)
                pruner.record(keys, urls, torch.ones(len(keys)))
            else:
                pairs += [None] * len(texts)
            if clock is not None:
                pos.append(clock.step(len(texts)))
            n += 1
        delivered.append(pairs)
        steps.append(n)
        positions.append((pos, clock.position if clock is not None else None))
    pruner.close()
    return delivered, steps, positions


def stage_names(ds):
    return [getattr(getattr(st, "f", st), "__name__", type(st).__name__) for st in ds.pipeline]


# ---------------------------------------------------------------- tests
def test_adapted_openclip_epochs_deliver_each_kept_pair_once_in_proportional_steps(tmp_path, keep_listed_policy):
    urls = pair_shards(tmp_path / "pairs")
    params, kept = quota_plans()
    pruner = seta.Pruner(
        str(tmp_path / "run"), policy="test_keep_listed", params=params, epochs=3, population=seta.list_samples(urls)
    )
    data = get_wds_dataset(urls, B, WORKERS, num_samples=SHARDS * PAIRS)
    assert data.dataloader.num_batches == 8  # OpenCLIP's full-data epoch: 2 workers x 4 batches
    ds = openclip.adapt(data, str(tmp_path / "run"))
    names = stage_names(ds)
    assert names[names.index("split_by_worker") + 1 : names.index("split_by_worker") + 4] == [
        "_skip_shards_of",
        "tarfile_to_samples_nothrow",
        "_keep_filter_of",
    ]
    assert ds.repetitions == 1 and ds.pipeline[-1].kw["partial"] is True
    clock = seta.EpochClock(steps_per_epoch=data.dataloader.num_batches)
    delivered, steps, positions = train(data, pruner, 3, clock)
    for e in range(3):
        assert len(delivered[e]) == len(set(delivered[e])), f"epoch {e}: a pair was delivered twice"
        assert set(delivered[e]) == kept[e], f"epoch {e}"
    assert [len(d) for d in delivered] == [60, 36, 18]
    # each worker holds 3 shards, 3 x QUOTA[e] kept pairs, in ceil(3 x QUOTA[e] / 8) batches
    assert steps == [2 * math.ceil(3 * q / B) for q in QUOTA] == [8, 6, 4]
    for e, s in enumerate(steps):
        fewest, most = seta.epoch_steps(len(kept[e]), B, workers=WORKERS)
        assert fewest <= s <= most
    # the schedule: epoch e spans [8e, 8e + 8) whatever its steps, advancing by the pairs trained
    for e, (pos, end) in enumerate(positions):
        assert pos[0] == 8 * e and end == 8 * (e + 1)
        assert all(a < b for a, b in zip(pos, pos[1:]))
    # epoch 2: each worker's 9 pairs in batches of 8 and 1, the workers taking turns
    assert positions[2][0] == pytest.approx([16, 16 + 8 * 8 / 18, 16 + 8 * 16 / 18, 16 + 8 * 17 / 18])
    lr = cosine_lr(1.0, 0, 8 * 3)  # OpenCLIP's schedule, sized from num_batches x epochs
    assert lr(positions[2][1]) == pytest.approx(0.0, abs=1e-12)  # it ends with the last epoch


def test_without_one_pass_a_pruned_openclip_epoch_rereads_kept_pairs(tmp_path, keep_listed_policy):
    """What adapt() fixes: attach alone keeps OpenCLIP's with_epoch, so a pruned epoch still
    takes the full-data 8 steps of 8 pairs, re-reading its 18 kept pairs."""
    urls = pair_shards(tmp_path / "pairs")
    params, kept = quota_plans()
    pruner = seta.Pruner(
        str(tmp_path / "run"), policy="test_keep_listed", params=params, epochs=3, population=seta.list_samples(urls)
    )
    data = get_wds_dataset(urls, B, WORKERS, num_samples=SHARDS * PAIRS)
    ds = openclip.training_pipeline(data)
    seta.attach(ds, str(tmp_path / "run"))
    ds.pipeline[-2].args = (*ds.pipeline[-2].args, "__key__", "__url__", "__weight__")
    delivered, steps, _ = train(data, pruner, 3)
    assert steps == [8, 8, 8]
    # each worker's 9 kept pairs, re-read in 4 passes of one full batch each: OpenCLIP's
    # unseeded sample shuffle picks which pair a pass's dropped partial batch leaves out, so
    # each pass delivers 8 distinct pairs of the 9 and no pair comes more than once a pass
    times = collections.Counter(delivered[2])
    assert len(delivered[2]) == 64 and set(times) <= kept[2] and max(times.values()) <= 4
    assert len(times) >= 16  # at least 46 re-reads of at most 18 pairs


def snapshot(data):
    """Everything adapt() may change, deep-copied: the stage list (each stage's identity, type,
    args and kw) and the epoch limits."""
    ds = openclip.training_pipeline(data)
    stages = [(id(st), type(st), getattr(st, "args", None), dict(getattr(st, "kw", {}) or {})) for st in ds.pipeline]
    return stages, ds.repetitions, ds.nsamples


def test_a_refused_adapt_leaves_the_pipeline_exactly_as_it_was(tmp_path):
    urls = pair_shards(tmp_path / "pairs")
    run = str(tmp_path / "run")
    seta.plan_epoch(seta.RunDir(run, create=True), 0, policy="full", epochs=1)
    data = get_wds_dataset(urls, B, 0, num_samples=60, resampled=True)
    before = snapshot(data)
    for _ in range(2):  # refused again for the same reason, not as "adapted before"
        with pytest.raises(UnsupportedPipelineError) as refused:
            openclip.adapt(data, run)
        message = str(refused.value)
        assert message.startswith("seta_stream.openclip.adapt: this training data draws shards with replacement")
        assert "(ResampledShards2, OpenCLIP's --dataset-resampled)" in message
        assert "Fix: drop --dataset-resampled (OpenCLIP then reads each shard once per epoch)" in message
        assert "one_pass_per_epoch" not in message and "with_epoch" not in message and "adapted before" not in message
        assert snapshot(data) == before
    # the user trains without pruning: OpenCLIP's own pairs, not seta_stream's 5-tuples
    images, texts = next(iter(data.dataloader))
    assert len(images) == B and all(t.startswith("caption ") for t in texts)

    # any other refusal: no run directory (attach's own check), tried before any change
    data = get_wds_dataset(urls, B, WORKERS, num_samples=60)
    before = snapshot(data)
    with pytest.raises(seta.errors.RunFormatError):
        openclip.adapt(data, str(tmp_path / "no-run"))
    assert snapshot(data) == before
    ds = openclip.adapt(data, run)  # the same data, adapted once the run exists
    assert snapshot(data) != before and ds.pipeline[-2].args == ("image", "text", *openclip.IDS)


def test_started_workers_and_a_second_adapt_are_refused(tmp_path):
    urls = pair_shards(tmp_path / "pairs")
    seta.plan_epoch(seta.RunDir(tmp_path / "run", create=True), 0, policy="full", epochs=1)
    data = get_wds_dataset(urls, B, WORKERS, num_samples=60)
    next(iter(data.dataloader))
    with pytest.raises(UnsupportedPipelineError, match="persistent workers have started"):
        openclip.adapt(data, str(tmp_path / "run"))
    data = get_wds_dataset(urls, B, 0, num_samples=60)
    openclip.adapt(data, str(tmp_path / "run"))
    adapted = snapshot(data)
    with pytest.raises(UnsupportedPipelineError, match="adapted before; adapt it once"):
        openclip.adapt(data, str(tmp_path / "run"))
    assert snapshot(data) == adapted


def test_workers_0_reads_each_kept_pair_once_in_the_main_process(tmp_path, keep_listed_policy):
    """OpenCLIP's --workers 0: the main process is the one reader (epoch_steps as workers=1)."""
    urls = pair_shards(tmp_path / "pairs")
    params, kept = quota_plans()
    pruner = seta.Pruner(
        str(tmp_path / "run"), policy="test_keep_listed", params=params, epochs=3, population=seta.list_samples(urls)
    )
    data = get_wds_dataset(urls, B, 0, num_samples=SHARDS * PAIRS)
    assert data.dataloader.num_batches == 8
    openclip.adapt(data, str(tmp_path / "run"))
    clock = seta.EpochClock(steps_per_epoch=data.dataloader.num_batches)
    delivered, steps, positions = train(data, pruner, 3, clock)
    assert [sorted(d) for d in delivered] == [sorted(k) for k in kept]
    assert steps == [math.ceil(6 * q / B) for q in QUOTA] == [8, 5, 3]
    assert [seta.epoch_steps(len(k), B, workers=0) for k in kept] == [(8, 8), (5, 5), (3, 3)]
    assert [end for _, end in positions] == [8, 16, 24]


def test_epoch_steps_counts_workers_0_as_one_reader():
    assert seta.epoch_steps(18, 8, workers=0) == seta.epoch_steps(18, 8, workers=1) == (3, 3)
    assert seta.epoch_steps(0, 8, workers=0) == (0, 0)
    with pytest.raises(InvalidInputError, match=r"workers=-1, .*workers >= 0 \(0: the main process reads\)"):
        seta.epoch_steps(18, 8, workers=-1)


CAPTIONED = {2: "caption", 9: "caption", 15: "caption"}  # 3 of 20 pairs: caption in .caption, not .txt


def test_list_samples_members_leaves_out_the_pairs_openclip_drops(tmp_path):
    urls = pair_shards(tmp_path / "pairs", shards=2, pairs=20, caption_member=CAPTIONED)
    everything = seta.list_samples(urls)
    usable = seta.list_samples(urls, members=openclip.MEMBERS)
    dropped = {(f"{s:05d}.tar", f"{s:05d}{i:04d}") for s in range(2) for i in CAPTIONED}
    assert everything.num_rows == 40
    pairs = set(zip(usable["shard"].to_pylist(), usable["key"].to_pylist()))
    assert pairs == set(zip(everything["shard"].to_pylist(), everything["key"].to_pylist())) - dropped
    assert usable["key"].to_pylist() == [k for k in everything["key"].to_pylist() if int(k[-4:]) not in CAPTIONED]
    assert seta.list_samples(urls, members=["caption"])["key"].to_pylist() == [
        f"{s:05d}{i:04d}" for s in range(2) for i in sorted(CAPTIONED)
    ]
    assert seta.list_samples(urls, members="JSON").num_rows == 40  # one member, case as webdataset lowers it
    assert seta.list_samples(urls, members=["webp;png"]).num_rows == 0


def test_pairs_openclip_drops_are_named_at_the_next_epoch_or_left_out_of_the_plan(tmp_path):
    urls = pair_shards(tmp_path / "pairs", shards=2, pairs=20, caption_member=CAPTIONED)
    # the population lists every sample: OpenCLIP's filter drops 6 of the 40 planned pairs
    run = str(tmp_path / "run-all")
    pruner = seta.Pruner(run, policy="full", epochs=2, population=seta.list_samples(urls), check_delivered=True)
    data = get_wds_dataset(urls, B, WORKERS, num_samples=40)
    openclip.adapt(data, run)
    clock = seta.EpochClock(steps_per_epoch=data.dataloader.num_batches)
    summary = pruner.start_epoch(0)
    clock.start_epoch(0, summary["kept"])
    data.set_epoch(0)
    for _images, texts, keys, urls_, _weights in data.dataloader:
        pruner.record(keys, urls_, torch.ones(len(keys)))
        clock.step(len(texts))
    assert summary["kept"] == 40 and clock.done == 34
    assert clock.position == pytest.approx(6 * 34 / 40)  # the schedule ended epoch 0 early: 5.1 of 6
    with pytest.warns(seta.errors.PlanWarning) as caught:
        pruner.start_epoch(1)
    (w,) = [w.message for w in caught]
    assert (w.code, w.value, w.limit, w.epoch) == ("undelivered", 34.0, 40.0, 0)
    assert str(w).startswith(f"{run}/plans/epoch=0/summary.json: epoch 0 recorded 34 losses, its plan kept 40")
    assert "6 kept samples never reached the loss, in 2 shards (00000.tar: 3 (first '000000002'), " in str(w)
    assert "00001.tar: 3 (first '000010002'))" in str(w)
    assert "list_samples(urls, members=...) (seta_stream.openclip.MEMBERS for OpenCLIP), or fix those shards" in str(w)
    data.set_epoch(1)
    for _images, _texts, keys, urls_, _weights in data.dataloader:
        pruner.record(keys, urls_, torch.ones(len(keys)))
    with pytest.warns(seta.errors.PlanWarning, match="epoch 1 recorded 34 losses, its plan kept 40"):
        pruner.close()

    # the population lists only the pairs OpenCLIP keeps: plans, epochs and the schedule agree
    run = str(tmp_path / "run-members")
    pruner = seta.Pruner(
        run, policy="full", epochs=2, population=seta.list_samples(urls, members=openclip.MEMBERS), check_delivered=True
    )
    data = get_wds_dataset(urls, B, WORKERS, num_samples=40)
    openclip.adapt(data, run)
    clock = seta.EpochClock(steps_per_epoch=data.dataloader.num_batches)
    delivered, _steps, positions = train(data, pruner, 2, clock)  # warnings are errors here: none
    assert [len(d) for d in delivered] == [34, 34] and [end for _, end in positions] == [6, 12]


def test_epoch_clock_names_the_population_when_the_first_plan_keeps_nothing(tmp_path):
    pruner = seta.Pruner(str(tmp_path / "run"), policy="full", epochs=1)  # no population
    summary = pruner.start_epoch(0)
    assert summary["kept"] == 0
    with pytest.raises(InvalidInputError, match=r"population=seta_stream.list_samples\(urls\)\)$"):
        seta.EpochClock(steps_per_epoch=4).start_epoch(0, summary["kept"])
    pruner.close()


def test_attach_takes_a_named_reader_and_refuses_a_missing_one(tmp_path):
    urls = pair_shards(tmp_path / "pairs")
    seta.plan_epoch(seta.RunDir(tmp_path / "run", create=True), 0, policy="full", epochs=1)

    def my_reader(src):
        return tarfile_to_samples_nothrow(src)

    ds = seta.attach(wds.DataPipeline(wds.SimpleShardList(urls), my_reader), str(tmp_path / "run"), reader=my_reader)
    assert stage_names(ds) == ["SimpleShardList", "_skip_shards_of", "my_reader", "_keep_filter_of"]
    assert len(list(ds)) == 60
    with pytest.raises(UnsupportedPipelineError, match=r"attach\(reader=.len.\): that stage is not in"):
        seta.attach(wds.DataPipeline(wds.SimpleShardList(urls), my_reader), str(tmp_path / "run"), reader=len)
    with pytest.raises(UnsupportedPipelineError, match="no tar reader found in this pipeline"):
        seta.attach(wds.DataPipeline(wds.SimpleShardList(urls), my_reader), str(tmp_path / "run"))


def test_epoch_clock_and_epoch_steps():
    clock = seta.EpochClock(steps_per_epoch=10)
    with pytest.raises(InvalidInputError, match="call clock.start_epoch"):
        clock.step(4)
    clock.start_epoch(2, kept=20)
    assert [clock.step(8), clock.step(8), clock.step(4)] == [20.0, 24.0, 28.0]
    assert clock.position == 30.0
    assert clock.step(3) == 30.0 and clock.position == 30.0  # a rank past its share stays at the end
    with pytest.raises(InvalidInputError, match=r"kept=0\): expected the epoch's kept samples"):
        clock.start_epoch(3, kept=0)
    assert seta.epoch_steps(60, 8) == (8, 8)
    assert seta.epoch_steps(18, 8, workers=2) == (3, 4)
    assert seta.epoch_steps(100, 8, workers=4, world_size=2) == (7, 10)
    assert seta.epoch_steps(2, 8, workers=4) == (1, 2)
    with pytest.raises(InvalidInputError, match="expected kept >= 0, batch_size >= 1"):
        seta.epoch_steps(10, 0)


def test_pair_losses_average_to_clip_loss():
    g = torch.Generator().manual_seed(0)
    img = torch.nn.functional.normalize(torch.randn(6, 4, generator=g), dim=-1)
    txt = torch.nn.functional.normalize(torch.randn(6, 4, generator=g), dim=-1)
    scale = torch.tensor(3.0)
    losses = openclip.pair_losses(img, txt, scale)
    logits = scale * img @ txt.T
    labels = torch.arange(6)
    clip = (torch.nn.functional.cross_entropy(logits, labels) + torch.nn.functional.cross_entropy(logits.T, labels)) / 2
    assert losses.shape == (6,) and torch.allclose(losses.mean(), clip)
    row0 = -torch.log_softmax(logits[0], 0)[0]
    col0 = -torch.log_softmax(logits[:, 0], 0)[0]
    assert torch.allclose(losses[0], (row0 + col0) / 2)


def test_the_docs_result_section_is_what_the_committed_check_result_gives():
    """docs/openclip.md's result section is generated from docs/openclip-check.json (written by
    tools/openclip_check.sh with OpenCLIP's own code), and that run passed every check."""
    import importlib.util
    import json
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    spec = importlib.util.spec_from_file_location("openclip_report", root / "tools" / "openclip_report.py")
    report = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(report)
    result = json.loads((root / "docs" / "openclip-check.json").read_text())
    doc = (root / "docs" / "openclip.md").read_text()
    assert report.rewrite(doc, report.render(result)) == doc, "run tools/openclip_report.py"
    assert result["failures"] == []
    assert set(result["run"]["versions"]) == {"open_clip", "torch", "webdataset", "seta_stream", "python"}
    assert [w["code"] for w in result["caption"]["all_listed"]["warnings"]] == ["undelivered"]
    assert result["caption"]["members"]["warnings"] == [] and result["resampled"]["unchanged_after_each"] == [True] * 2
