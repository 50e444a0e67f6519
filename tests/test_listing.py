"""list_samples: every shard spec wds.WebDataset takes, pipe: URLs, and same-name shards."""

from __future__ import annotations

import shutil

import pytest
from conftest import web_dataset, write_shards

import seta_stream as seta
from seta_stream.errors import ShardNameConflictError, ShardNameError


def webdataset_samples(urls):
    ds = web_dataset(urls, shardshuffle=False, empty_check=False)
    return [(seta.ids.shard_name(s["__url__"]), s["__key__"], s["__url__"]) for s in ds]


def listed(table):
    return list(
        zip(table.column("shard").to_pylist(), table.column("key").to_pylist(), table.column("url").to_pylist())
    )


def test_brace_string_lists_what_webdataset_reads(tmp_path):
    write_shards(tmp_path / "d", [3, 4, 2], prefix="shard")
    spec = str(tmp_path / "d" / "shard-{0000..0002}.tar")
    table = seta.list_samples(spec)
    assert table.column_names == ["shard", "key", "url"]
    assert listed(table) == webdataset_samples(spec)
    assert table.num_rows == 9
    # '::' separated specs, as webdataset splits them
    two = str(tmp_path / "d" / "shard-0000.tar") + "::" + str(tmp_path / "d" / "shard-0002.tar")
    assert [k for _, k, _ in listed(seta.list_samples(two))] == [f"sample{i:04d}" for i in (0, 1, 2, 0, 1)]


@pytest.mark.parametrize("suffix", ["", " || true", " | cat"])
def test_pipe_urls_are_listed_by_running_their_command(tmp_path, suffix):
    urls = write_shards(tmp_path / "d", [3, 2], prefix="shard")
    pipes = [f"pipe:cat {u}{suffix}" for u in urls]
    table = seta.list_samples(pipes)
    assert listed(table) == webdataset_samples(pipes)
    assert set(table.column("shard").to_pylist()) == {"shard-0000.tar", "shard-0001.tar"}
    assert table.column("url").to_pylist() == [pipes[0]] * 3 + [pipes[1]] * 2


def test_compressed_shards_and_file_urls(tmp_path):
    urls = write_shards(tmp_path / "d", [3], prefix="shard")
    with open(urls[0], "rb") as src:
        import gzip

        with gzip.open(str(tmp_path / "d" / "shard-0001.tar.gz"), "wb") as dst:
            shutil.copyfileobj(src, dst)
    table = seta.list_samples(["file://" + urls[0], str(tmp_path / "d" / "shard-0001.tar.gz")])
    assert [(s, k) for s, k, _ in listed(table)] == [("shard-0000.tar", f"sample{i:04d}") for i in range(3)] + [
        ("shard-0001.tar.gz", f"sample{i:04d}") for i in range(3)
    ]


def test_same_file_name_in_two_folders_stops_the_listing_with_both_urls(tmp_path):
    a = write_shards(tmp_path / "train", [3], prefix="shard")[0]
    b = write_shards(tmp_path / "val", [3], prefix="shard")[0]
    with pytest.raises(ShardNameConflictError) as err:
        seta.list_samples([a, b])
    msg = str(err.value)
    assert f"two shards have the same name 'shard-0000.tar' at shard_depth=1: {a!r} and {b!r}" in msg
    assert "shard_depth': 2" in msg
    # the fix it names works: 6 rows for 6 samples, under two names
    table = seta.list_samples([a, b], shard_depth=2)
    assert sorted({*table.column("shard").to_pylist()}) == ["train/shard-0000.tar", "val/shard-0000.tar"]
    assert table.num_rows == 6
    # a pipe: URL and a plain path of the same file are one shard, not a conflict
    assert seta.list_samples([a, f"pipe:cat {a} || true"]).num_rows == 6


def test_pipe_url_without_a_shard_stops_with_how_to_name_it(tmp_path):
    with pytest.raises(ShardNameError, match=r"cannot tell which shard the pipe: URL 'pipe:true' reads"):
        seta.list_samples(["pipe:true"])
