"""_plans: the plan folder as written and read (parts in row order, earlier layouts, shard ranges)."""

from __future__ import annotations

import json
import os

import numpy as np
import pyarrow.parquet as pq
import pytest
from conftest import SETA, seeded_run

from seta_stream import load_plan, load_summary, plan_epoch
from seta_stream.errors import RunFormatError


def test_plan_parts_read_back_in_row_order_by_every_reader(tmp_path, monkeypatch):
    """plan.parquet is a folder of parts, encoded in parallel; pyarrow, polars (one epoch and
    every epoch with hive partitioning, as in the README) and load_plan read its rows in order."""
    import polars as pl

    import seta_stream._store.planfiles as plans_module

    monkeypatch.setattr(plans_module, "PLAN_PART_ROWS", 7)
    run = seeded_run(tmp_path / "r")
    plan_epoch(run, 1, **SETA)
    plan_epoch(run, 2)
    folder = tmp_path / "r/plans/epoch=1/plan.parquet"
    assert sorted(os.listdir(folder)) == [f"part-{i:05d}.parquet" for i in range(29)]  # ceil(200 / 7)
    assert [pq.ParquetFile(folder / f"part-{i:05d}.parquet").metadata.num_rows for i in (0, 27, 28)] == [7, 7, 4]
    plan = load_plan(run, 1)
    table_keys = pq.read_table(tmp_path / "r" / json.loads((tmp_path / "r/table/manifest.json").read_text())["table"])
    assert plan.column("key").to_pylist() == table_keys.column("key").to_pylist()
    assert pq.read_table(folder).column("key").to_pylist() == plan.column("key").to_pylist()
    assert pl.read_parquet(folder)["key"].to_list() == plan.column("key").to_pylist()
    both = pl.read_parquet(tmp_path / "r/plans/epoch=*/plan.parquet/*.parquet", hive_partitioning=True)
    assert both.group_by("epoch").agg(pl.col("keep").sum()).sort("epoch").rows() == [
        (1, load_summary(run, 1)["kept"]),
        (2, load_summary(run, 2)["kept"]),
    ]
    assert both.filter(pl.col("epoch") == 2)["keep"].to_list() == load_plan(run, 2).column("keep").to_pylist()


def test_plan_written_as_one_file_by_earlier_versions_is_read(tmp_path):
    run = seeded_run(tmp_path / "r")
    plan_epoch(run, 1, **SETA)
    folder = tmp_path / "r/plans/epoch=1/plan.parquet"
    plan = load_plan(run, 1)
    for part in os.listdir(folder):
        os.unlink(folder / part)
    with pytest.raises(RunFormatError, match=r"plans/epoch=1/plan.parquet: a folder without Parquet parts"):
        load_plan(run, 1)
    os.rmdir(folder)
    pq.write_table(plan, folder)  # the single file of earlier versions
    assert load_plan(run, 1, columns=["key", "keep"]).equals(plan.select(["key", "keep"]))


@pytest.mark.parametrize("sizes", [[1, 2, 3, 1], [300, 1, 700, 256, 5000], [1024] * 8, [70_000]])
def test_kept_rows_per_shard_are_counted_alike_for_large_and_small_shards(sizes):
    """shards.arrow's kept counts: shards of 256 rows or more on average are counted one by
    one, many small ones by reduceat; both give each range's kept rows."""
    from seta_stream._store.planfiles import kept_per_shard

    stops = np.cumsum(sizes)
    starts = stops - np.array(sizes)
    keep = np.random.default_rng(len(sizes)).random(int(stops[-1])) < 0.4
    got = kept_per_shard(keep, starts, stops)
    assert got.dtype == np.int64
    assert got.tolist() == [int(keep[a:b].sum()) for a, b in zip(starts, stops)]


def test_shard_ranges_span_table_chunks_with_different_dictionaries():
    """The table is read in row-group chunks, each with its own shard dictionary; a shard cut
    by a chunk boundary is one range."""
    import pyarrow as pa

    from seta_stream._store.planfiles import PlanIdentities as _Identities
    from seta_stream._store.planfiles import shard_ranges as _shard_ranges

    shard = pa.chunked_array(
        [
            pa.DictionaryArray.from_arrays(pa.array([0, 0, 1], pa.int32()), pa.array(["a.tar", "b.tar"])),
            pa.DictionaryArray.from_arrays(pa.array([0, 1, 1], pa.int32()), pa.array(["b.tar", "c.tar"])),
            pa.DictionaryArray.from_arrays(pa.array([0], pa.int32()), pa.array(["c.tar"])),
        ]
    )
    ids = _Identities(shard, pa.chunked_array([["k0", "k1", "k2"], ["k3", "k4", "k5"], ["k6"]]))
    assert ids.shard.num_chunks == 3 and len({str(c.dictionary) for c in ids.shard.chunks}) == 1
    assert ids.shard.to_pylist() == ["a.tar", "a.tar", "b.tar", "b.tar", "c.tar", "c.tar", "c.tar"]
    keep = np.array([1, 0, 1, 1, 0, 0, 1], dtype=bool)
    assert _shard_ranges(ids, keep).to_pylist() == [
        {"shard": "a.tar", "start": 0, "stop": 2, "n": 2, "kept": 1},
        {"shard": "b.tar", "start": 2, "stop": 4, "n": 2, "kept": 2},
        {"shard": "c.tar", "start": 4, "stop": 7, "n": 3, "kept": 1},
    ]
    ungrouped = pa.chunked_array([pa.array(["a.tar", "b.tar", "a.tar"]).dictionary_encode()])
    with pytest.raises(Exception, match="not grouped by shard"):
        _Identities(ungrouped, pa.chunked_array([["k0", "k1", "k2"]]))
