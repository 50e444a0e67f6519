"""The webdataset stages with real shards and real DataLoader workers (fork and spawn)."""

from __future__ import annotations

import pickle
import shutil
from dataclasses import dataclass

import numpy as np
import pytest
import webdataset as wds
from conftest import web_dataset, write_shards

import seta_stream as seta
from seta_stream import RunDir, plan_epoch
from seta_stream.errors import PlanMissingError
from seta_stream.ids import sample_uid
from seta_stream.policies import POLICIES, PolicySpec, register
from seta_stream.policies.base import PolicyResult, reason_code

torch = pytest.importorskip("torch")


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
    ds = seta.attach(web_dataset(shards, shardshuffle=False, empty_check=False), str(tmp_path / "run"))

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
    ds = seta.attach(web_dataset(shards, resampled=True, shardshuffle=False, seed=1), str(tmp_path / "run"))
    got = [(s["__url__"].rsplit("/", 1)[1], s["__key__"]) for s in ds.with_epoch(200)]
    assert len(got) == 200 and set(got) <= kept
    union = set()
    for rank in range(2):

        def node_split(src, rank=rank):
            for i, item in enumerate(src):
                if i % 2 == rank:
                    yield item

        ds = seta.attach(
            web_dataset(shards, shardshuffle=False, nodesplitter=node_split, empty_check=False),
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
    ds = seta.attach(web_dataset(shards, shardshuffle=False, empty_check=False), url)
    (got,) = iterate(ds, workers=2, context=context)
    assert {(s, k) for s, k, _ in got} == kept_set(run, 0)


def test_an_empty_shard_is_harmless(tmp_path):
    urls = write_shards(tmp_path / "s", [5, 0, 5])
    run = RunDir(tmp_path / "run", create=True)
    plan_epoch(run, 0, policy="full", epochs=1)
    ds = wds.DataPipeline(wds.SimpleShardList(urls), wds.tarfile_to_samples(), seta.keep_filter(run))
    assert len(list(ds)) == 10


def test_plans_with_keys_in_lookup_arrow_are_still_read(tmp_path, shards):
    """Plans written before keys.arrow and stage.arrow existed carry the key column in
    lookup.arrow, and shards.arrow has no byte ranges."""
    import os

    import pyarrow as pa
    import pyarrow.ipc as ipc

    run = tmp_path / "run"
    plan_epoch(
        RunDir(run, create=True), 0, policy="random", params={"r": 0.5}, epochs=3, seed=1, population=population(shards)
    )
    d = run / "plans/epoch=0"
    plan = seta.load_plan(str(run), 0)
    shards_arrow = ipc.open_file(str(d / "shards.arrow")).read_all()
    old = {
        "lookup.arrow": pa.table(
            {"key": plan.column("key"), "keep": plan.column("keep"), "weight": plan.column("weight")}
        ),
        "shards.arrow": pa.table({c: shards_arrow.column(c) for c in ("shard", "start", "stop", "n", "kept")}),
    }
    os.remove(d / "stage.arrow")
    for name, table in old.items():
        with pa.OSFile(str(d / name), "wb") as sink, ipc.new_file(sink, table.schema) as w:
            w.write_table(table)
    ds = wds.DataPipeline(wds.SimpleShardList(shards), wds.tarfile_to_samples(), seta.keep_filter(str(run)))
    (got,) = iterate(ds)
    assert {(s, k) for s, k, _ in got} == kept_set(run, 0) and len(got) == 60


# ------------------------------------------------------------------ kept_tar_samples
def _samples(pipeline_stages):
    before = seta.stage_counters()
    got = list(wds.DataPipeline(*pipeline_stages))
    after = seta.stage_counters()
    counted = {k: after.get(k, 0) - before.get(k, 0) for k in ("kept", "dropped", "absent_kept", "absent_dropped")}
    return got, counted


def _both(urls, run, **tar_kw):
    """(samples, counters) of tarfile_to_samples + keep_filter, and of kept_tar_samples."""
    slow = _samples([wds.SimpleShardList(urls), wds.tarfile_to_samples(**tar_kw), seta.keep_filter(str(run))])
    fast = _samples([wds.SimpleShardList(urls), seta.kept_tar_samples(str(run), **tar_kw)])
    return slow, fast


def _drop_plan(run, shards, drop_pairs, pop=None):
    drop = tuple(sample_uid(s, k) for s, k in drop_pairs)
    plan_epoch(
        RunDir(run, create=True),
        0,
        policy="test_drop_listed",
        params={"drop": drop},
        epochs=1,
        population=pop if pop is not None else population(shards),
    )


@pytest.mark.parametrize("case", ["all_kept", "half", "shard_none_kept", "absent_bernoulli", "absent_keep"])
def test_kept_tar_samples_equals_tarfile_to_samples_and_keep_filter(tmp_path, shards, case):
    run = tmp_path / "run"
    if case == "all_kept":
        plan_epoch(RunDir(run, create=True), 0, policy="full", epochs=1, population=population(shards))
    elif case == "half":
        plan_epoch(
            RunDir(run, create=True),
            0,
            policy="random",
            params={"r": 0.5},
            epochs=1,
            seed=2,
            population=population(shards),
        )
    elif case == "shard_none_kept":  # every sample of part-0001 and the odd ones of part-0002 dropped
        drop = [("part-0001.tar", f"sample{i:04d}") for i in range(30)]
        drop += [("part-0002.tar", f"sample{i:04d}") for i in range(1, 30, 2)]
        _drop_plan(run, shards, drop)
    elif case == "absent_bernoulli":  # empty table: every sample absent, kept iff u < 0.6
        plan_epoch(RunDir(run, create=True), 0, policy="seta", params={"r": 0.4}, epochs=4, seed=5)
    else:  # the plan knows 20 samples of part-0000, drops 5 of them; the rest are absent (kept)
        pop = [("part-0000.tar", f"sample{i:04d}") for i in range(20)]
        _drop_plan(run, shards, [("part-0000.tar", f"sample{i:04d}") for i in range(5)], pop=pop)
    (slow, slow_counts), (fast, fast_counts) = _both(shards, run)
    assert fast == slow  # same samples, order, fields, bytes, __weight__
    assert fast_counts == slow_counts
    expected_kept = {
        "all_kept": 120,
        "half": 60,
        "shard_none_kept": 120 - 30 - 15,
        "absent_keep": 115,
    }.get(case)
    if expected_kept is not None:
        assert len(fast) == expected_kept == fast_counts["kept"]
    assert fast_counts["kept"] + fast_counts["dropped"] == 120
    if case.startswith("absent"):
        assert fast_counts["absent_kept"] + fast_counts["absent_dropped"] == (
            120 if case == "absent_bernoulli" else 100
        )
        assert 0 < fast_counts["absent_kept"]


@pytest.mark.parametrize("pending_keys", [1 << 16, 7])
def test_readers_hash_no_sample_of_a_shard_kept_whole_one_by_one(tmp_path, shards, monkeypatch, pending_keys):
    """A shard every sample of which the plan keeps with weight 1 is decided once: neither
    kept_tar_samples nor keep_filter computes a sample's uid on its own (ids.sample_uid, 1.4-4 us
    each); the samples the plan does not list are still counted exactly (their keys hashed at once,
    a shard's keys in parts of ``pending_keys``)."""
    import seta_stream._reading.planview as planview_module
    import seta_stream._reading.stages as stage_module

    run = tmp_path / "run"
    # the plan lists 20 samples of part-0000 and every one of part-0001/0002; part-0003 is unknown
    pop = [p for p in population(shards) if p[0] in ("part-0001.tar", "part-0002.tar")]
    pop += [("part-0000.tar", f"sample{i:04d}") for i in range(20)]
    plan_epoch(RunDir(run, create=True), 0, policy="full", epochs=1, population=pop)
    (slow, slow_counts), _ = _both(shards, run)
    calls = []

    def counted(shard, key):
        calls.append((shard, key))
        return sample_uid(shard, key)

    monkeypatch.setattr(planview_module, "sample_uid", counted)
    monkeypatch.setattr(planview_module, "_PENDING_KEYS", pending_keys)
    monkeypatch.setattr(stage_module, "_PENDING_KEYS", pending_keys)
    (slow_again, slow_again_counts), (fast, fast_counts) = _both(shards, run)
    assert calls == []
    assert fast == slow == slow_again
    expected = {"kept": 120, "dropped": 0, "absent_kept": 10 + 30, "absent_dropped": 0}
    assert fast_counts == slow_counts == slow_again_counts == expected
    assert {s["__weight__"] for s in fast} == {1.0}


def test_kept_tar_samples_with_file_urls_and_directories_in_member_names(tmp_path):
    root = tmp_path / "shards"
    root.mkdir()
    urls = []
    for s in range(3):
        path = root / f"d-{s}.tar"
        with wds.TarWriter(str(path)) as w:
            for i in range(10):
                w.write({"__key__": f"train/cls{i % 2}/img{i:03d}", "txt": f"{s}/{i}", "cls": str(i % 2)})
        urls.append("file://" + str(path))
    pop = [(f"d-{s}.tar", f"train/cls{i % 2}/img{i:03d}") for s in range(3) for i in range(10)]
    run = tmp_path / "run"
    plan_epoch(RunDir(run, create=True), 0, policy="random", params={"r": 0.5}, epochs=1, seed=3, population=pop)
    (slow, slow_counts), (fast, fast_counts) = _both(urls, run)
    assert fast == slow and fast_counts == slow_counts
    assert len(fast) == 15 and {s["__key__"].split("/")[0] for s in fast} == {"train"}
    assert all(s["__url__"].startswith("file://") for s in fast)


def test_kept_tar_samples_with_repeated_keys_and_members_without_extension(tmp_path):
    """A key that comes back after a dropped sample is a new sample (as group_by_keys sees it);
    members webdataset cannot name (no extension) and meta files are ignored by both readers."""
    import io
    import tarfile

    path = tmp_path / "odd.tar"
    members = ["a.txt", "a.cls", "README", "b.txt", "b.cls", "a.txt", "a.cls", "__meta__", "c.txt", "b.txt"]
    with tarfile.open(path, "w") as tar:
        for i, name in enumerate(members):
            data = f"{name}#{i}".encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    run = tmp_path / "run"
    for dropped in (["b"], ["a"], []):
        shutil.rmtree(run, ignore_errors=True)
        pop = [("odd.tar", k) for k in ("a", "b", "c")]
        _drop_plan(run, None, [("odd.tar", k) for k in dropped] or [("other.tar", "x")], pop=pop)
        (slow, slow_counts), (fast, fast_counts) = _both([str(path)], run)
        assert fast == slow and fast_counts == slow_counts
        assert [s["__key__"] for s in fast] == [k for k in ["a", "b", "a", "c", "b"] if k not in dropped]


def test_kept_tar_samples_reads_only_members_of_kept_samples(tmp_path, shards, monkeypatch):
    """The data of dropped samples' members is seeked over, never read."""
    import tarfile

    import seta_stream._reading.stages as stage_module

    run = tmp_path / "run"
    drop = [(f"part-{s:04d}.tar", f"sample{i:04d}") for s in range(4) for i in range(30) if i % 3]
    _drop_plan(run, shards, drop)
    reads: dict[str, list[tuple[int, int]]] = {url: [] for url in shards}

    class Recording:
        def __init__(self, url):
            self.url, self.fh = url, open(url, "rb")

        def read(self, n=-1):
            start = self.fh.tell()
            data = self.fh.read(n)
            reads[self.url].append((start, start + len(data)))
            return data

        def seek(self, n, whence=0):
            return self.fh.seek(n, whence)

        def tell(self):
            return self.fh.tell()

        def seekable(self):
            return True

        def close(self):
            self.fh.close()

    def opener(src, handler=None):
        for item in src:
            yield {**item, "stream": Recording(item["url"])}

    monkeypatch.setattr(stage_module, "url_opener", opener)
    got = list(wds.DataPipeline(wds.SimpleShardList(shards), seta.kept_tar_samples(str(run))))
    assert len(got) == 40
    for url in shards:
        with tarfile.open(url) as tar:
            members = tar.getmembers()
        for m in members:
            data = (m.offset_data, m.offset_data + m.size)
            read = [r for r in reads[url] if r[0] < data[1] and data[0] < r[1]]
            if int(m.name[len("sample") : len("sample") + 4]) % 3 == 0:  # kept: read whole
                assert read == [data]
            else:
                assert read == [], (url, m.name)


def test_attach_swaps_the_tar_reader_of_a_webdataset(tmp_path, shards):
    from webdataset.tariterators import group_by_keys, tar_file_expander, tarfile_samples

    run = tmp_path / "run"
    plan_epoch(
        RunDir(run, create=True), 0, policy="random", params={"r": 0.5}, epochs=1, seed=4, population=population(shards)
    )
    ds = seta.attach(web_dataset(shards, shardshuffle=False, empty_check=False), str(run))
    fs = [getattr(st, "f", None) for st in ds.pipeline]
    assert tar_file_expander not in fs and group_by_keys not in fs and tarfile_samples not in fs
    names = [getattr(f, "__name__", "") for f in fs]
    # webdataset 1.x: opener + expander + grouper; 0.2.x: tarfile_to_samples
    reader = "_kept_samples_of_streams" if "_kept_samples_of_streams" in names else "_kept_tar_samples_of"
    assert names.count("_skip_shards_of") == 1 and names.count(reader) == 1
    assert names.index("_skip_shards_of") < names.index(reader)
    reference = web_dataset(shards, shardshuffle=False, empty_check=False).compose(seta.keep_filter(str(run)))
    for workers in (0, 2):
        (got,) = iterate(ds, workers=workers, context="fork")
        (want,) = iterate(reference, workers=workers, context="fork")
        assert got == want and len(got) == 60
        assert {(s, k) for s, k, _ in got} == kept_set(run, 0)
    # a DataPipeline's tarfile_to_samples(handler=...) is swapped too, keeping its handler
    pipe = seta.attach(
        wds.DataPipeline(
            wds.SimpleShardList(shards), wds.split_by_worker, wds.tarfile_to_samples(handler=wds.warn_and_continue)
        ),
        str(run),
    )
    names = [getattr(getattr(st, "f", st), "__name__", "") for st in pipe.pipeline]
    assert names[2:] == ["_skip_shards_of", "_kept_tar_samples_of"]  # skip_shards after the worker split
    assert pipe.pipeline[3].kw["handler"] is wds.warn_and_continue
    (got,) = iterate(pipe, workers=2, context="spawn")
    assert sorted(got) == sorted(want)


def test_member_keys_are_webdatasets_keys():
    from webdataset.tariterators import base_plus_ext

    from seta_stream._reading.stages import _BASE_PLUS_EXT

    names = ["a.txt", "a.b.c", "dir/x.y.z", "dir/.hidden", "a.b/c", "README", "d/e/f.jpg", "x/y.", ".z", "é/ü.txt"]
    for name in names:
        m = _BASE_PLUS_EXT.match(name)
        assert (m.group(1) if m else None) == base_plus_ext(name)[0], name


def test_readers_grouper_ends_a_sample_at_the_marker_on_every_webdataset_release():
    from webdataset.handlers import ignore_and_stop

    from seta_stream._reading.wds import group_by_keys

    def member(name):
        return {"fname": name, "data": name.encode(), "__url__": "u"}

    files = [member("a.x"), {}, member("a.y"), member("b.x"), {}, {}, member("b.x"), member("c.x")]
    got = [{k: v for k, v in s.items() if k != "__url__"} for s in group_by_keys(iter(files))]
    assert got == [
        {"__key__": "a", "x": b"a.x"},
        {"__key__": "a", "y": b"a.y"},
        {"__key__": "b", "x": b"b.x"},
        {"__key__": "b", "x": b"b.x"},
        {"__key__": "c", "x": b"c.x"},
    ]
    # a handler that says stop ends the whole stream (webdataset yields the sample it was
    # building, then stops), not only the run between two markers
    duplicate = [member("a.x"), member("a.x"), {}, member("b.x")]
    assert [s["__key__"] for s in group_by_keys(iter(duplicate), handler=ignore_and_stop)] == ["a"]
