"""Shard index and kept-only reading: identical samples to streaming + keep_filter."""

from __future__ import annotations

import hashlib
import io
import json
import os
import random
import re
import shutil
import tarfile

import pytest
import test_stage  # noqa: F401  (registers the policy "test_drop_listed")
import webdataset as wds
from conftest import tar_samples_per_shard, web_dataset

import seta_stream as seta
from seta_stream import index_shard
from seta_stream._cli import main
from seta_stream._reading.reader import read_kept
from seta_stream._reading.shardindex import build_index
from seta_stream.errors import IndexMismatch, IndexMissing, InvalidInputError
from seta_stream.ids import sample_uid
from seta_stream.index import load_index


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
    # shard-001's only key is shard-002's first
    streamed = list(wds.DataPipeline(wds.SimpleShardList(urls), tar_samples_per_shard, seta.keep_filter(run)))
    ranged = list(wds.DataPipeline(wds.SimpleShardList(urls), read_kept(run)))
    assert ranged == streamed
    assert len({(s["__url__"], s["__key__"]) for s in ranged}) == len(ranged)
    expected = {"half": None, "all": 58, "none_in_one_shard": 57, "nothing": 1}[case]  # 1: empty-plan guard
    if expected is not None:
        assert len(ranged) == expected


def test_index_format(tmp_path):
    (url,) = awkward_shards(tmp_path / "s", [25])
    path = index_shard(url)
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
        IndexMismatch, match=r"shard shard-001.tar: index .* describes \d+ bytes, the shard has \d+ bytes; the shard"
    ):
        load_index(urls[1])
    run = str(tmp_path / "run")
    plan(run, urls, "random", {"r": 0.3})
    before = seta.stage_counters().get("index_mismatch", 0)
    with pytest.warns(UserWarning, match=r"read_kept streams .*shard-001.tar instead of reading only its kept samples"):
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


def test_an_index_copied_with_its_shard_stays_valid(tmp_path):
    # indexed where the shards are made, then both copied elsewhere (cp, rsync without -t, a
    # sync to object storage): the copy has another modification time, the index still holds
    urls = awkward_shards(tmp_path / "made", [14, 9])
    for u in urls:
        os.utime(u, ns=(1_600_000_000_000_000_000, 1_600_000_000_000_000_000))
        index_shard(u)
    (tmp_path / "copy").mkdir()
    copies = [shutil.copy(u, tmp_path / "copy") for u in urls]
    for u in urls:
        shutil.copy(u + ".idx.json", tmp_path / "copy")
    assert os.stat(copies[0]).st_mtime_ns != 1_600_000_000_000_000_000
    idx = load_index(copies[0])
    assert idx["mtime_ns"] == 1_600_000_000_000_000_000 and idx["location"] == os.path.abspath(urls[0])
    run = str(tmp_path / "run")
    plan(run, copies, "random", {"r": 0.5})
    reference = list(wds.DataPipeline(wds.SimpleShardList(copies), wds.tarfile_to_samples(), seta.keep_filter(run)))
    before = seta.stage_counters()
    ranged = list(wds.DataPipeline(wds.SimpleShardList(copies), read_kept(run)))
    after = seta.stage_counters()
    assert ranged == reference and 0 < len(ranged) < 23
    assert after.get("index_mismatch", 0) == before.get("index_mismatch", 0)
    assert after.get("index_missing", 0) == before.get("index_missing", 0)
    assert after["range_reads"] > before.get("range_reads", 0)
    # `seta-stream index` without --force rescans a shard whose time differs and records it
    assert index_shard(copies[0]) == copies[0] + ".idx.json"
    idx = load_index(copies[0])
    assert abs(idx["mtime_ns"] - os.stat(copies[0]).st_mtime_ns) < 1000  # fsspec gives float seconds
    assert idx["location"] == os.path.abspath(copies[0])
    assert idx["samples"] == load_index(urls[0])["samples"]


def test_cli_index(tmp_path, capsys):
    urls = awkward_shards(tmp_path / "s", [5, 6])
    assert main(["index", *urls, "--index-dir", str(tmp_path / "idx"), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    digests = [hashlib.sha256(os.path.abspath(u).encode()).hexdigest()[:16] for u in urls]
    assert [o["index"] for o in out] == [
        str(tmp_path / "idx" / f"shard-000.tar.{digests[0]}.idx.json"),
        str(tmp_path / "idx" / f"shard-001.tar.{digests[1]}.idx.json"),
    ]
    idx = load_index(urls[1], str(tmp_path / "idx"))
    assert len(idx["samples"]) == 6 and idx["location"] == os.path.abspath(urls[1])


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


def three_readers_and_reference(urls, run, index_dir=None):
    """(reference, kept_tar_samples, attach, read_kept) sample lists for the same shards and plan."""

    def pipe(*stages):
        return list(wds.DataPipeline(wds.SimpleShardList(urls), *stages))

    return (
        pipe(wds.tarfile_to_samples(), seta.keep_filter(run)),
        pipe(seta.skip_shards(run), seta.kept_tar_samples(run)),
        list(seta.attach(web_dataset(urls, shardshuffle=False), run)),
        pipe(read_kept(run, index_dir=index_dir)),
    )


def fields(samples):
    return [(s["__url__"], s["__key__"], s.get("txt"), s.get("cls"), s["__weight__"]) for s in samples]


@pytest.mark.parametrize(
    "drop, expected",
    [
        ((), [("a", b"1"), ("b", b"2"), ("a", b"3"), ("c", b"4"), ("a", b"5")]),
        (("b",), [("a", b"1"), ("a", b"3"), ("c", b"4"), ("a", b"5")]),
        (("b", "c"), [("a", b"1"), ("a", b"3"), ("a", b"5")]),
        (("a",), [("b", b"2"), ("c", b"4")]),
    ],
)
def test_key_repeated_non_adjacently_is_separate_samples_in_every_reader(tmp_path, drop, expected):
    # a, b, a, c, a: webdataset yields five samples; the plan decides (shard, key) once for all "a"
    path = tmp_path / "s" / "shard-000.tar"
    path.parent.mkdir()
    with wds.TarWriter(str(path)) as w:
        for i, k in enumerate("abaca", start=1):
            w.write({"__key__": k, "txt": str(i), "cls": str(i)})
    urls = [str(path)]
    index_shard(urls[0])
    run = str(tmp_path / "run")
    seta.plan_epoch(
        seta.RunDir(run, create=True),
        0,
        policy="test_drop_listed",
        params={"drop": tuple(sample_uid("shard-000.tar", k) for k in drop)},
        epochs=1,
        seed=0,
        population=[("shard-000.tar", k) for k in "abc"],
    )
    before = seta.stage_counters()
    reference, kts, attached, ranged = three_readers_and_reference(urls, run)
    assert [(s["__key__"], s["txt"]) for s in reference] == expected
    assert all(s["cls"] == s["txt"] for s in reference)  # members never cross samples
    assert fields(kts) == fields(reference)
    assert fields(attached) == fields(reference)
    assert ranged == reference
    after = seta.stage_counters()
    assert after.get("index_missing", 0) == before.get("index_missing", 0)
    assert after.get("index_mismatch", 0) == before.get("index_mismatch", 0)


def test_members_webdataset_skips_do_not_split_a_sample(tmp_path):
    # a.txt, __meta__/x.json, a.cls: webdataset skips the meta member and yields one sample "a"
    path = tmp_path / "shard-000.tar"
    with tarfile.open(path, "w") as tar:
        for name, data in [("a.txt", b"1"), ("__meta__/x.json", b"{}"), ("a.cls", b"1"), ("b.txt", b"2")]:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    index_shard(str(path))
    run = str(tmp_path / "run")
    plan(run, [str(path)], "full", {})
    reference = list(
        wds.DataPipeline(wds.SimpleShardList([str(path)]), wds.tarfile_to_samples(), seta.keep_filter(run))
    )
    ranged = list(wds.DataPipeline(wds.SimpleShardList([str(path)]), read_kept(run)))
    assert [(s["__key__"], sorted(k for k in s if not k.startswith("__"))) for s in reference] == [
        ("a", ["cls", "txt"]),
        ("b", ["txt"]),
    ]
    assert ranged == reference


def twin_shards(tmp_path):
    """train/shard-000.tar and val/shard-000.tar: same file name, same size, same mtime, same
    member sizes, other keys and bytes (as two folders unpacked from one archive)."""
    urls = []
    for split in ("train", "val"):
        path = tmp_path / split / "shard-000.tar"
        path.parent.mkdir(parents=True)
        with wds.TarWriter(str(path)) as w:
            for i in range(8):
                w.write({"__key__": f"{split[0]}{i:03d}", "txt": f"{split}-{i}", "cls": str(i % 2)})
        os.utime(path, ns=(1_700_000_000_000_000_000, 1_700_000_000_000_000_000))
        urls.append(str(path))
    assert os.path.getsize(urls[0]) == os.path.getsize(urls[1])
    return urls


def test_index_dir_keeps_same_named_shards_apart(tmp_path, capsys):
    urls = twin_shards(tmp_path)
    idx_dir = str(tmp_path / "idx")
    assert main(["index", *urls, "--index-dir", idx_dir, "--json"]) == 0
    written = [o["index"] for o in json.loads(capsys.readouterr().out)]
    assert len(set(written)) == 2 and sorted(os.listdir(idx_dir)) == sorted(os.path.basename(p) for p in written)
    assert [load_index(u, idx_dir)["samples"][0][0] for u in urls] == ["t000", "v000"]
    run = str(tmp_path / "run")
    seta.plan_epoch(
        seta.RunDir(run, create=True, settings={"shard_depth": 2}),
        0,
        policy="random",
        params={"r": 0.5},
        epochs=1,
        seed=3,
        population=[(f"{s}/shard-000.tar", f"{s[0]}{i:03d}") for s in ("train", "val") for i in range(8)],
    )
    reference = list(wds.DataPipeline(wds.SimpleShardList(urls), wds.tarfile_to_samples(), seta.keep_filter(run)))
    before = seta.stage_counters()
    ranged = list(wds.DataPipeline(wds.SimpleShardList(urls), read_kept(run, index_dir=idx_dir)))
    assert ranged == reference and 0 < len(ranged) < 16
    assert {s["txt"].decode().split("-")[0] for s in ranged if s["__url__"] == urls[1]} == {"val"}
    after = seta.stage_counters()
    assert after.get("index_mismatch", 0) == before.get("index_mismatch", 0)
    assert after["range_reads"] > before.get("range_reads", 0)

    # the train index put where val's belongs (e.g. written by an older version): refused, val streamed
    shutil.copy(written[0], written[1])
    with pytest.raises(
        IndexMismatch,
        match=rf"shard {re.escape(os.path.abspath(urls[1]))}: index .* describes the shard at "
        rf"'{re.escape(os.path.abspath(urls[0]))}', expected .* belongs to another shard",
    ):
        load_index(urls[1], idx_dir)
    with pytest.warns(UserWarning, match=r"read_kept streams .*val/shard-000.tar .* belongs to another shard"):
        assert list(wds.DataPipeline(wds.SimpleShardList(urls), read_kept(run, index_dir=idx_dir))) == reference
    assert seta.stage_counters()["index_mismatch"] == after.get("index_mismatch", 0) + 1
    with pytest.raises(IndexMismatch):
        list(wds.DataPipeline(wds.SimpleShardList(urls), read_kept(run, index_dir=idx_dir, on_mismatch="raise")))


def test_index_of_another_shard_beside_it_is_caught_by_the_tar_headers(tmp_path):
    # val's sidecar is a copy of train's: same size and mtime, so only the member headers differ
    urls = twin_shards(tmp_path)
    index_shard(urls[0])
    shutil.copy(urls[0] + ".idx.json", urls[1] + ".idx.json")
    load_index(urls[1])  # the size agrees: only reading can tell
    run = str(tmp_path / "run")
    seta.plan_epoch(
        seta.RunDir(run, create=True, settings={"shard_depth": 2}),
        0,
        policy="full",
        params={},
        epochs=1,
        seed=0,
        population=[(f"{s}/shard-000.tar", f"{s[0]}{i:03d}") for s in ("train", "val") for i in range(8)],
    )
    reference = list(wds.DataPipeline(wds.SimpleShardList(urls), wds.tarfile_to_samples(), seta.keep_filter(run)))
    before = seta.stage_counters().get("index_mismatch", 0)
    with pytest.warns(UserWarning, match=r"read_kept streams .*val/shard-000.tar .*: the tar header at byte"):
        ranged = list(wds.DataPipeline(wds.SimpleShardList(urls), read_kept(run)))
    assert ranged == reference and [s["__key__"] for s in ranged[8:]] == [f"v{i:03d}" for i in range(8)]
    assert seta.stage_counters()["index_mismatch"] == before + 1
    with pytest.raises(
        IndexMismatch,
        match=r"val/shard-000.tar: the tar header at byte \d+ is not that of member 't000.cls' \(1 bytes\) as "
        r"the index says; .* belongs to another shard: rebuild it with `seta-stream index .*val/shard-000.tar --force`",
    ):
        list(wds.DataPipeline(wds.SimpleShardList(urls[1:]), read_kept(run, on_mismatch="raise")))


def test_pipe_cat_urls_range_read_with_an_index_and_run_the_command_without(tmp_path):
    urls = awkward_shards(tmp_path / "s", [12, 9])
    index_shard(urls[0])  # shard-001 has no index
    pipes = [f"pipe:cat {u} || true" for u in urls]
    run = str(tmp_path / "run")
    plan(run, urls, "random", {"r": 0.5})
    reference = list(wds.DataPipeline(wds.SimpleShardList(pipes), wds.tarfile_to_samples(), seta.keep_filter(run)))
    before = seta.stage_counters()
    ranged = list(wds.DataPipeline(wds.SimpleShardList(pipes), read_kept(run)))
    after = seta.stage_counters()
    assert ranged == reference and {s["__url__"] for s in ranged} == set(pipes)
    assert after["index_missing"] == before.get("index_missing", 0) + 1
    assert 0 < after["bytes_read"] - before.get("bytes_read", 0) < os.path.getsize(urls[0])
    with pytest.raises(IndexMissing, match=r"no index at .*shard-001.tar.idx.json; write it with `seta-stream index"):
        list(wds.DataPipeline(wds.SimpleShardList(pipes), read_kept(run, on_missing="raise")))


def test_bad_reader_options_are_input_errors(tmp_path):
    urls = awkward_shards(tmp_path / "s", [3])
    run = str(tmp_path / "run")
    plan(run, urls, "full", {})
    with pytest.raises(InvalidInputError, match=r"on_missing='skip'.*expected 'stream' or 'raise'"):
        list(wds.DataPipeline(wds.SimpleShardList(urls), read_kept(run, on_missing="skip")))


SIZES = [100, 600, 3000, 0, 511, 512, 513, 1500] * 5  # jpg bytes of the 40 samples of a shard


def sized_shard(path, sizes, keys=None):
    with wds.TarWriter(str(path)) as w:
        for i, size in enumerate(sizes):
            key = keys[i] if keys is not None else f"s{i:04d}"
            w.write({"__key__": key, "jpg": bytes([i]) * size, "cls": str(i)})
    return str(path)


def rewritten(path, change):
    """The shard at ``path`` written again after indexing, changed only in its last samples (so
    that only reading them can tell): the same size, except ``truncated``."""
    keys = [f"s{i:04d}" for i in range(len(SIZES))]
    sizes = list(SIZES)
    if change == "renamed":  # a key of the same length: every header where the index says
        keys[37] = "t0037"
    elif change == "resized":  # 100 -> 600 and 600 -> 100 bytes: members between them move
        sizes[32], sizes[33] = sizes[33], sizes[32]
    elif change == "reordered":  # two samples swapped
        keys[38], keys[39], sizes[38], sizes[39] = keys[39], keys[38], sizes[39], sizes[38]
    size = os.path.getsize(path)
    last = build_index(str(path))["samples"][-1][1][-1]  # the last member: (name, data offset, size)
    sized_shard(path, sizes, keys)
    if change == "truncated":  # cut inside its last member, as a copy or upload cut short
        with open(path, "r+b") as fh:
            fh.truncate(last[1] + last[2] // 2)
    else:
        assert os.path.getsize(path) == size
    return str(path)


@pytest.mark.parametrize("gap", [0, 1 << 16])
@pytest.mark.parametrize("change", ["renamed", "resized", "reordered", "truncated"])
def test_a_shard_changed_after_indexing_is_refused_before_any_sample_of_it(tmp_path, change, gap):
    url = sized_shard(tmp_path / "shard-000.tar", SIZES)
    index_shard(url)
    run = str(tmp_path / "run")
    plan(run, [url], "full", {})
    rewritten(tmp_path / "shard-000.tar", change)
    message = {
        "renamed": r"the tar header at byte \d+ is not that of member 's0037.cls' .* index is stale",
        "resized": r"the tar header at byte \d+ is not that of member 's0032.jpg' \(100 bytes\) .* index is stale",
        "reordered": r"the tar header at byte \d+ is not that of member 's0038.cls' .* index is stale",
        "truncated": r"index .* describes \d+ bytes, the shard has \d+ bytes; the shard changed after indexing",
    }[change]
    samples = iter(wds.DataPipeline(wds.SimpleShardList([url]), read_kept(run, gap=gap, on_mismatch="raise")))
    with pytest.raises(IndexMismatch, match=message):
        next(samples)  # nothing of the shard was yielded
    # by default the shard is streamed and filtered instead: what the streaming reader gives
    streaming = wds.DataPipeline(wds.SimpleShardList([url]), tar_samples_per_shard, seta.keep_filter(run))
    before = seta.stage_counters().get("index_mismatch", 0)
    with pytest.warns(UserWarning, match=r"read_kept streams .*shard-000.tar instead of reading only its kept"):
        if change == "truncated":  # the stream ends inside a member: streaming fails there, as webdataset does
            with pytest.raises(tarfile.ReadError, match="unexpected end of data"):
                list(wds.DataPipeline(wds.SimpleShardList([url]), read_kept(run, gap=gap)))
        else:
            assert list(wds.DataPipeline(wds.SimpleShardList([url]), read_kept(run, gap=gap))) == list(streaming)
    assert seta.stage_counters()["index_mismatch"] == before + 1
    if change == "truncated":
        with pytest.raises(tarfile.ReadError, match="unexpected end of data"):
            list(streaming)
        return
    assert [s["__key__"] for s in streaming][36:] == {
        "renamed": ["s0036", "t0037", "s0038", "s0039"],
        "resized": ["s0036", "s0037", "s0038", "s0039"],
        "reordered": ["s0036", "s0037", "s0039", "s0038"],
    }[change]


def test_a_change_found_in_a_later_batch_stops_after_the_samples_already_checked(tmp_path, monkeypatch):
    # a shard larger than a batch of reads: its first batch is checked and delivered before the
    # later ones are read; a change there stops the epoch rather than cut samples wrongly
    from seta_stream._reading import reader as _reader

    monkeypatch.setattr(_reader, "_MAX_BATCH", 8192)
    url = sized_shard(tmp_path / "shard-000.tar", SIZES)
    index_shard(url)
    run = str(tmp_path / "run")
    plan(run, [url], "full", {})
    reference = list(wds.DataPipeline(wds.SimpleShardList([url]), wds.tarfile_to_samples(), seta.keep_filter(run)))
    rewritten(tmp_path / "shard-000.tar", "renamed")
    got = []
    with pytest.raises(
        IndexMismatch,
        match=r"not that of member 's0037.cls' .* The shard changed while it was read \(samples of it were already "
        r"delivered\): rebuild the index with `seta-stream index .*shard-000.tar --force`",
    ):
        for sample in wds.DataPipeline(wds.SimpleShardList([url]), read_kept(run, gap=0)):
            got.append(sample)
    assert 0 < len(got) < 37 and got == reference[: len(got)]
