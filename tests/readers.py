"""One shared check for the three readers of a plan (torchdata's idea of one resume helper):
``tarfile_to_samples + keep_filter``, ``kept_tar_samples`` and ``read_kept`` (indexed shards)
must yield the same samples (keys, fields, bytes, __weight__/__score__, order) and count the
same, and a second iterator (a restarted loader) must yield and count the same again."""

from __future__ import annotations

import webdataset as wds

import seta_stream as seta
from seta_stream import index_shard

COUNTS = ("kept", "dropped", "absent_kept", "absent_dropped")


def _run(stages):
    before = seta.stage_counters()
    got = list(wds.DataPipeline(*stages))
    after = seta.stage_counters()
    return got, {k: after.get(k, 0) - before.get(k, 0) for k in COUNTS}


def readers(urls, run):
    """name -> pipeline stages of each reader (indexes written for read_kept)."""
    for url in urls:
        index_shard(url)
    run = str(run)
    return {
        "keep_filter": [wds.SimpleShardList(urls), wds.tarfile_to_samples(), seta.keep_filter(run)],
        "kept_tar_samples": [wds.SimpleShardList(urls), seta.kept_tar_samples(run)],
        "read_kept": [wds.SimpleShardList(urls), seta.read_kept(run, on_missing="raise", on_mismatch="raise")],
    }


def check_readers_agree(urls, run):
    """Assert the three readers agree, twice over; returns (samples, counts) of keep_filter."""
    results = {}
    for name, stages in readers(urls, run).items():
        first = _run(stages)
        again = _run(stages)  # a new iterator: a restarted DataLoader iterates the same epoch
        assert again == first, f"{name}: a second iterator yields or counts differently"
        results[name] = first
    reference = results["keep_filter"]
    for name, result in results.items():
        assert [_comparable(s) for s in result[0]] == [_comparable(s) for s in reference[0]], f"{name} samples differ"
        assert result[1] == reference[1], f"{name} counts {result[1]} != keep_filter's {reference[1]}"
    return reference


def _comparable(sample):
    return {k: v for k, v in sample.items() if k != "__local_path__"}
