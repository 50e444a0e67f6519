"""Shard index and kept-only reading: identical samples to streaming + keep_filter."""

from __future__ import annotations

import json
import os
import random
import time

import pytest
import test_stage  # noqa: F401  (registers the policy "test_drop_listed")
import webdataset as wds

import seta_stream as seta
from seta_stream.cli import main
from seta_stream.ids import sample_uid
from seta_stream.index import IndexMismatch, build_index, index_shard, load_index
from seta_stream.reader import read_kept


def awkward_shards(root, sizes):
    """Members of several sizes (0 B .. 20 KB, a 512-byte-aligned one), several fields, keys with dirs."""
    root.mkdir(parents=True, exist_ok=True)
    rnd = random.Random(0)
    urls = []
    for s, n in enumerate(sizes):
        path = root / f"shard-{s:03d}.tar"
        with wds.TarWriter(str(path)) as w:
            for i in range(n):
                w.write(
                    {
                        "__key__": f"d{i % 3}/sample{i:04d}",
                        "jpg": os.urandom(rnd.choice([0, 1, 511, 512, 513, 20000])),
                        "cls": str(i),
                        "txt": "x" * rnd.randint(0, 700),
                    }
                )
        urls.append(str(path))
    return urls


def plan(run, urls, policy, params, drop=()):
    pop = seta.list_samples(urls)
    if policy == "test_drop_listed":
        params = {"drop": tuple(drop)}
    seta.plan_epoch(
        seta.RunDir(run, create=True), 0, policy=policy, params=params, epochs=1, seed=4, population=pop, force=True
    )


@pytest.mark.parametrize("case", ["half", "all", "none_in_one_shard", "nothing"])
def test_kept_only_reader_equals_streaming_plus_stage(tmp_path, case):
    urls = awkward_shards(tmp_path / "s", [17, 1, 40])
    for u in urls:
        index_shard(u)
    run = str(tmp_path / "run")
    if case == "half":
        plan(run, urls, "random", {"r": 0.5})
    elif case == "all":
        plan(run, urls, "full", {})
    else:
        shards = (
            ["shard-001.tar"] if case == "none_in_one_shard" else ["shard-000.tar", "shard-001.tar", "shard-002.tar"]
        )
        drop = [sample_uid(s, f"d{i % 3}/sample{i:04d}") for s in shards for i in range(40)]
        plan(run, urls, "test_drop_listed", {}, drop)
    streamed = list(wds.DataPipeline(wds.SimpleShardList(urls), wds.tarfile_to_samples(), seta.keep_filter(run)))
    ranged = list(wds.DataPipeline(wds.SimpleShardList(urls), read_kept(run)))
    assert ranged == streamed
    assert len({(s["__url__"], s["__key__"]) for s in ranged}) == len(ranged)
    expected = {"half": None, "all": 58, "none_in_one_shard": 57, "nothing": 1}[case]  # 1: empty-plan guard
    if expected is not None:
        assert len(ranged) == expected


def test_index_format_and_speed(tmp_path):
    (url,) = awkward_shards(tmp_path / "s", [25])
    t0 = time.perf_counter()
    path = index_shard(url)
    assert time.perf_counter() - t0 < 1.0
    idx = json.loads(open(path).read())
    assert idx["format"] == "seta-stream-tar-index" and idx["version"] == 1 and idx["shard"] == "shard-000.tar"
    assert idx["size"] == os.path.getsize(url) and len(idx["samples"]) == 25
    key, members = idx["samples"][3]
    assert key == "d0/sample0003" and [m[0] for m in members] == [f"{key}.cls", f"{key}.jpg", f"{key}.txt"]
    with open(url, "rb") as fh:
        fh.seek(members[0][1])
        assert fh.read(members[0][2]) == b"3"
    assert index_shard(url) == path  # idempotent
    assert build_index(url) == idx


def test_mismatched_index_is_detected_and_falls_back_or_raises(tmp_path):
    urls = awkward_shards(tmp_path / "s", [10, 10])
    for u in urls:
        index_shard(u)
    with open(urls[1], "ab") as fh:  # the shard changes after indexing
        fh.write(b"\0" * 1024)
    with pytest.raises(
        IndexMismatch, match=r"shard shard-001.tar: index .* describes \d+ bytes .* the shard changed after indexing"
    ):
        load_index(urls[1])
    run = str(tmp_path / "run")
    plan(run, urls, "random", {"r": 0.3})
    before = seta.stage_counters().get("index_mismatch", 0)
    ranged = list(wds.DataPipeline(wds.SimpleShardList(urls), read_kept(run)))
    streamed = list(wds.DataPipeline(wds.SimpleShardList(urls), wds.tarfile_to_samples(), seta.keep_filter(run)))
    assert ranged == streamed
    assert seta.stage_counters()["index_mismatch"] == before + 1
    with pytest.raises(IndexMismatch):
        list(wds.DataPipeline(wds.SimpleShardList(urls), read_kept(run, on_mismatch="raise")))
    os.remove(urls[0] + ".idx.json")
    assert (
        list(wds.DataPipeline(wds.SimpleShardList(urls[:1]), read_kept(run)))
        == streamed[: len([s for s in streamed if s["__url__"] == urls[0]])]
    )


def test_cli_index(tmp_path, capsys):
    urls = awkward_shards(tmp_path / "s", [5, 6])
    assert main(["index", *urls, "--index-dir", str(tmp_path / "idx"), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [o["index"] for o in out] == [
        str(tmp_path / "idx" / "shard-000.tar.idx.json"),
        str(tmp_path / "idx" / "shard-001.tar.idx.json"),
    ]
    assert len(load_index(urls[1], str(tmp_path / "idx"))["samples"]) == 6


def test_index_while_streaming_writes_missing_indexes(tmp_path):
    from seta_stream.index import index_while_streaming

    urls = awkward_shards(tmp_path / "s", [4, 6])
    assert not os.path.exists(urls[0] + ".idx.json")
    first = list(wds.DataPipeline(wds.SimpleShardList(urls), index_while_streaming(), wds.tarfile_to_samples()))
    assert len(first) == 10
    assert [len(load_index(u)["samples"]) for u in urls] == [4, 6]


def test_kept_only_reader_with_fsspec_urls(tmp_path):
    urls = awkward_shards(tmp_path / "s", [12, 9])
    for u in urls:
        index_shard(u)
    file_urls = [f"file://{u}" for u in urls]
    run = str(tmp_path / "run")
    plan(run, urls, "random", {"r": 0.5})
    streamed = list(wds.DataPipeline(wds.SimpleShardList(urls), wds.tarfile_to_samples(), seta.keep_filter(run)))
    ranged = list(wds.DataPipeline(wds.SimpleShardList(file_urls), read_kept(run)))
    assert [(s["__key__"], s["jpg"], s["cls"]) for s in ranged] == [
        (s["__key__"], s["jpg"], s["cls"]) for s in streamed
    ]
    assert [s["__url__"] for s in ranged] == [f"file://{s['__url__']}" for s in streamed]
