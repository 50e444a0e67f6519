"""End to end per local URL idiom (plain, file://, pipe:cat, pipe:cat ... || true, ... | cat):
3 epochs of Pruner + attach(wds.WebDataset) / skip_shards + kept_tar_samples deliver exactly
each plan's kept samples, and an epoch whose plan empties a DataLoader worker still trains."""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import webdataset as wds  # noqa: E402
from conftest import web_dataset, write_shards  # noqa: E402

import seta_stream as seta  # noqa: E402
from seta_stream import index_shard  # noqa: E402

IDIOMS = {
    "plain": "{}",
    "file": "file://{}",
    "pipe_cat": "pipe:cat {}",
    "pipe_or_true": "pipe:cat {} || true",
    "pipe_to_cat": "pipe:cat {} | cat",
}


def kept_set(run, epoch):
    plan = seta.load_plan(run, epoch, columns=["shard", "key", "keep"]).to_pydict()
    return {(s, k) for s, k, keep in zip(plan["shard"], plan["key"], plan["keep"]) if keep}


def attach_reader(urls, run):
    ds = seta.attach(web_dataset(urls, shardshuffle=False), run)
    return ds.to_tuple("__key__", "__url__", "__weight__").batched(5)


def pipeline_reader(urls, run):
    return wds.DataPipeline(
        wds.SimpleShardList(urls),
        wds.split_by_worker,
        seta.skip_shards(run),
        seta.kept_tar_samples(run),
        wds.to_tuple("__key__", "__url__", "__weight__"),
        wds.batched(5),
    )


def read_kept_reader(urls, run):
    return wds.DataPipeline(
        wds.SimpleShardList(urls),
        wds.split_by_worker,
        seta.read_kept(run),
        wds.to_tuple("__key__", "__url__", "__weight__"),
        wds.batched(5),
    )


@pytest.mark.parametrize(
    "reader", [attach_reader, pipeline_reader, read_kept_reader], ids=["attach", "datapipeline", "read_kept"]
)
@pytest.mark.parametrize(
    ("idiom", "buckets"),  # the pipe: idioms also with a partitioned run (per-bucket stage files)
    [(i, 1) for i in IDIOMS] + [(i, 3) for i in IDIOMS if i.startswith("pipe")],
)
def test_each_epoch_delivers_exactly_the_plan(tmp_path, idiom, buckets, reader):
    paths = write_shards(tmp_path / "shards", [12, 12, 12, 12], prefix="shard")
    if reader is read_kept_reader:
        for p in paths[:3]:  # the fourth shard has no index: streamed and filtered
            index_shard(p)
    urls = [IDIOMS[idiom].format(p) for p in paths]
    run = str(tmp_path / "run")
    pruner = seta.Pruner(
        run,
        policy="infobatch",
        params={"r": 0.5},
        epochs=3,
        seed=3,
        population=seta.list_samples(urls),
        settings={"buckets": buckets},
    )
    assert seta.RunDir(run).buckets == buckets
    loader = torch.utils.data.DataLoader(
        reader(urls, run),
        batch_size=None,
        num_workers=2,
        multiprocessing_context="fork",
    )
    weights_seen = set()
    for epoch in range(3):
        pruner.start_epoch(epoch)
        got = []
        for keys, batch_urls, weights in loader:
            assert set(batch_urls) <= set(urls)  # __url__ is the URL as given
            got += [(seta.ids.shard_name(u), k) for u, k in zip(batch_urls, keys)]
            # InfoBatch: below-mean losses kept with weight 2, loss = index of the key
            losses = np.array([int(k[-4:]) for k in keys], dtype=np.float32)
            pruner.record(list(keys), list(batch_urls), losses)
            weights_seen |= {float(w) for w in weights}
        assert len(got) == len(set(got)), "a sample was delivered twice"
        assert set(got) == kept_set(run, epoch), f"epoch {epoch}: delivered != plan"
    pruner.close()
    assert {(s, k) for s in ("shard-0000.tar",) for k in ["sample0000"]} <= kept_set(run, 0)
    assert weights_seen == {1.0, 2.0}  # the plan's weights reached the loop
    table = seta.load_table(run, shard_as_dictionary=False)
    assert set(table.column("shard").to_pylist()) == {f"shard-{i:04d}.tar" for i in range(4)}


def test_an_epoch_where_the_plan_empties_a_worker_trains(tmp_path):
    from seta_stream.policies import POLICIES, PolicySpec, register
    from seta_stream.policies.base import PolicyResult, reason_code

    paths = write_shards(tmp_path / "shards", [8, 8], prefix="shard")
    pop = seta.list_samples(paths)
    dropped = np.array(
        [
            seta.ids.sample_uid(s, k)
            for s, k in zip(pop.column("shard").to_pylist(), pop.column("key").to_pylist())
            if s == "shard-0001.tar"
        ],
        dtype=np.uint64,
    )

    def drop_listed(inp, p):
        keep = ~np.isin(inp.uid, dropped)
        return PolicyResult(keep, keep.astype(np.float32), np.full(inp.n, reason_code("kept"), np.int8), {})

    if "test_drop_shard_1" not in POLICIES:
        register(PolicySpec("test_drop_shard_1", NoParams, drop_listed, "test policy"))
    run = str(tmp_path / "run")
    seta.plan_epoch(seta.RunDir(run, create=True), 0, policy="test_drop_shard_1", epochs=1, population=pop)
    kept = kept_set(run, 0)
    assert {s for s, _ in kept} == {"shard-0000.tar"} and len(kept) == 8
    # webdataset's default empty_check is on; worker 1 of 2 gets shard-0001.tar only
    ds = seta.attach(web_dataset(paths, shardshuffle=False), run).to_tuple("__key__", "__url__")
    loader = wds.WebLoader(ds, batch_size=None, num_workers=2, multiprocessing_context="spawn")
    got = [(seta.ids.shard_name(u), k) for k, u in loader]
    assert len(got) == 8 and set(got) == kept
    if "empty_check" not in inspect.signature(wds.WebDataset.__init__).parameters:
        return  # webdataset 0.2.x has no such check
    # two workers for one shard: webdataset's own error still stops a worker given no shard
    one = seta.attach(web_dataset(paths[:1], shardshuffle=False), run).to_tuple("__key__", "__url__")
    loader1 = wds.WebLoader(one, batch_size=None, num_workers=2, multiprocessing_context="spawn")
    with pytest.raises(ValueError, match="No samples found in dataset; perhaps you have fewer shards than workers"):
        list(loader1)


@dataclass(frozen=True)
class NoParams:
    pass
