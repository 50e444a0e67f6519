"""Two shards with one name (same file name in two folders) stop wherever their URLs meet:
the recorders of two real rank processes, compaction (also an epoch later), planning; and a
population listed from another location than the one trained from stops the first record."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import webdataset as wds
from conftest import web_dataset, write_shards
from servers import range_http_server

import seta_stream as seta
from seta_stream.errors import PopulationLocationError, ShardNameConflictError
from seta_stream.testing import LossRecorder

RECORD = textwrap.dedent(
    """
    import sys
    import numpy as np
    import webdataset as wds
    from seta_stream.testing import LossRecorder
    run, rank, epoch, url = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    samples = list(wds.WebDataset(url, shardshuffle=False))
    with LossRecorder(run, rank=rank, epoch=epoch) as rec:
        rec.record([s["__key__"] for s in samples], [s["__url__"] for s in samples],
                   np.arange(len(samples), dtype=np.float32) + rank)
    """
)


def record_in_process(run, rank, epoch, url):
    subprocess.run([sys.executable, "-c", RECORD, str(run), str(rank), str(epoch), url], check=True, timeout=120)


@pytest.fixture
def two_folders(tmp_path):
    a = write_shards(tmp_path / "train", [6], prefix="shard")[0]
    b = write_shards(tmp_path / "val", [6], prefix="shard")[0]
    return a, b


def test_two_ranks_recording_same_name_shards_stop_compaction(tmp_path, two_folders):
    a, b = two_folders
    run = tmp_path / "run"
    seta.RunDir(run, create=True)
    record_in_process(run, 0, 0, a)
    record_in_process(run, 1, 0, f"pipe:cat {b} || true")
    with pytest.raises(ShardNameConflictError) as err:
        seta.compact(run)
    msg = str(err.value)
    assert msg.startswith(f"shard name 'shard-0000.tar' stands for two shards: {a!r} (in ")
    assert f"and {b!r} (in " in msg and "rank=1/epoch=0/part-R00001-E000000-" in msg
    assert "nothing was compacted" in msg and "settings={'shard_depth': 2}" in msg
    assert not (run / "table" / "manifest.json").exists()
    assert seta.load_table(run).num_rows == 0
    assert len(list((run / "losses").rglob("*.parquet"))) == 2  # nothing recorded is lost


def test_a_same_name_shard_recorded_an_epoch_later_is_caught_against_the_table(tmp_path, two_folders):
    a, b = two_folders
    run = tmp_path / "run"
    seta.RunDir(run, create=True)
    record_in_process(run, 0, 0, a)
    report = seta.compact(run)
    assert (report.rows_folded, report.samples_total) == (6, 6)
    # the recorder of any rank checks new shards against the table: nothing is recorded
    with pytest.raises(subprocess.CalledProcessError):
        subprocess.run(
            [sys.executable, "-c", RECORD, str(run), "1", "1", b], check=True, timeout=120, capture_output=True
        )
    rec = LossRecorder(run, rank=1, epoch=1)
    with pytest.raises(ShardNameConflictError) as err:
        rec.record(["sample0000"], [b], np.ones(1, np.float32))
    rec.close()
    assert str(err.value).startswith(f"shard name 'shard-0000.tar' stands for two shards: {a!r} (in the loss table")
    assert "settings={'shard_depth': 2}" in str(err.value)
    assert sorted(p.parent.name for p in (run / "losses").rglob("*.parquet")) == ["epoch=0"]
    # a part written by a recorder that never saw the table (a version without the check, or
    # a part recorded before the table grew) is still stopped by compaction
    from seta_stream._store.parts import write_part

    write_part(seta.RunDir(run), 1, 1, _part_of(b))
    with pytest.raises(ShardNameConflictError, match=rf"stands for two shards: {a!r} \(in the loss table"):
        seta.compact(run)
    table = seta.load_table(run, shard_as_dictionary=False)
    assert (table.num_rows, set(table.column("seen").to_pylist())) == (6, {1})


def _part_of(url):
    import pyarrow as pa

    from seta_stream._store.parts import make_part
    from seta_stream.ids import shard_location, shard_name

    keys = [s["__key__"] for s in wds.WebDataset(url, shardshuffle=False)]
    shard = pa.array([shard_name(url)] * len(keys)).dictionary_encode()
    locations = {shard_name(url): shard_location(url)}
    return make_part(
        shard, pa.array(keys), np.ones(len(keys), np.float32), epoch=1, rank=1, seq0=1, locations=locations
    )


def test_signed_urls_of_one_shard_are_one_shard(tmp_path, two_folders):
    a, _ = two_folders
    run = tmp_path / "run"
    with LossRecorder(run) as rec:
        rec.record(["k0"], [f"file://{a}?X-Amz-Signature=1"], __import__("numpy").ones(1, "float32"))
        rec.record(["k0"], [f"file://{a}?X-Amz-Signature=2"], __import__("numpy").ones(1, "float32"))
    seta.compact(run)
    assert seta.load_table(run).column("seen").to_pylist() == [2]


def test_planning_stops_when_the_population_names_another_shard_than_the_table(tmp_path, two_folders):
    a, b = two_folders
    run = tmp_path / "run"
    seta.RunDir(run, create=True)
    record_in_process(run, 0, 0, a)
    seta.compact(run)
    population = seta.list_samples([b])  # same name, other folder
    with pytest.raises(ShardNameConflictError) as err:
        seta.plan_epoch(run, 1, policy="full", epochs=2, population=population)
    assert str(err.value).startswith(f"shard name 'shard-0000.tar' stands for two shards: {a!r} (in the loss table (")
    assert f"and {b!r} (in the population, url {b!r}); their samples would share one plan row" in str(err.value)
    assert not (run / "plans" / "epoch=1").exists()
    # the same shard through a pipe: URL is no conflict
    pipe = seta.list_samples([f"pipe:cat {a} || true"])
    assert seta.plan_epoch(run, 1, policy="full", epochs=2, population=pipe)["n"] == 6


@pytest.mark.skipif(shutil.which("curl") is None, reason="webdataset reads http:// shards with curl")
def test_a_population_listed_from_a_mirror_stops_the_first_record_of_epoch_0(tmp_path):
    # listed from the local copy, trained from http:// URLs of the same files
    local = write_shards(tmp_path / "www" / "data", [10, 10], prefix="shard")
    run = str(tmp_path / "run")
    population = seta.list_samples(local)
    with range_http_server(tmp_path / "www") as server:
        urls = [f"{server.url}/data/{os.path.basename(p)}" for p in local]
        pruner = seta.Pruner(run, policy="random", params={"r": 0.5}, epochs=2, seed=0, population=population)
        pruner.start_epoch(0)
        ds = seta.attach(web_dataset(urls, shardshuffle=False, empty_check=False), run)
        batches = iter(ds.to_tuple("__key__", "__url__").batched(4))
        keys, batch_urls = next(batches)
        with pytest.raises(PopulationLocationError) as err:
            pruner.record(keys, batch_urls, np.ones(len(keys), np.float32))
        pruner.close()
    msg = str(err.value)
    assert isinstance(err.value, ShardNameConflictError) and isinstance(err.value, seta.errors.SetaStreamError)
    assert msg.startswith(
        f"shard 'shard-0000.tar': the population lists it at {local[0]!r}, but training reads it from "
        f"{urls[0]!r}; the population and the training URLs name different locations"
    )
    assert "List the population from the same URLs you train from" in msg and "list_samples" in msg
    assert "shard_depth" not in msg and "\n" not in msg
    assert not list((tmp_path / "run" / "losses").rglob("*.parquet"))  # nothing recorded for epoch 0
    assert seta.load_table(run).num_rows == 0

    # a table recorded from the URLs (a recorder given no population): planning says the same
    with LossRecorder(run, epoch=0) as rec:
        rec.record(["sample0000"], [urls[0]], np.ones(1, np.float32))
    seta.compact(run)
    with pytest.raises(PopulationLocationError) as err:
        seta.plan_epoch(run, 1, policy="random", params={"r": 0.5}, epochs=2, seed=0, population=population)
    msg = str(err.value)
    assert msg.startswith(f"shard name 'shard-0000.tar' stands for two shards: {urls[0]!r} (in the loss table (")
    assert "the population and the training URLs name different locations" in msg and "shard_depth" not in msg


def test_a_population_of_the_training_urls_records_and_two_folders_still_suggest_shard_depth(tmp_path, two_folders):
    a, b = two_folders
    run = tmp_path / "run"
    pruner = seta.Pruner(run, policy="full", epochs=1, population=seta.list_samples([f"file://{a}"]))
    pruner.start_epoch(0)
    pruner.record(["sample0000"], [f"pipe:cat {a} || true"], np.ones(1, np.float32))  # the same location
    # b is another shard with a's file name: the population does not list it where training reads it
    with pytest.raises(PopulationLocationError, match=r"List the population from the same URLs you train from"):
        pruner.record(["sample0000"], [b], np.ones(1, np.float32))
    pruner.close()
    # listing the training URLs, or training them without a population: the genuine two-folder
    # conflict, whose fix is a larger shard_depth
    with pytest.raises(ShardNameConflictError, match=r"settings=\{'shard_depth': 2\}") as err:
        seta.list_samples([a, b])
    assert not isinstance(err.value, PopulationLocationError)
    with LossRecorder(tmp_path / "run2") as rec, pytest.raises(ShardNameConflictError) as err:
        rec.record(["sample0000", "sample0000"], [a, b], np.ones(2, np.float32))
    assert not isinstance(err.value, PopulationLocationError)
    assert "settings={'shard_depth': 2}" in str(err.value)
