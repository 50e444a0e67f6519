"""Loss parts: what make_part/write_part write is what read_part reads back, validated; names,
fold order, shard locations and quarantine (real Parquet files in a real run directory)."""

from __future__ import annotations

import json
import re

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from seta_stream import RunDir
from seta_stream._store.parts import (
    LOCATIONS_METADATA,
    PART_SCHEMA,
    fold_order,
    make_part,
    merge_locations,
    part_locations,
    pending_parts,
    quarantine_part,
    quarantined_parts,
    read_part,
    read_part_keys,
    write_part,
)
from seta_stream.errors import CorruptPartError, ShardNameConflictError
from seta_stream.ids import sample_uid


def a_part(keys=("a", "b", "c"), shards=("s1.tar", "s0.tar", "s1.tar"), seq0=7, epoch=3, rank=2, locations=None):
    shard = pa.array(list(shards)).dictionary_encode()
    loss = np.arange(len(keys), dtype=np.float32)
    locations = locations or {"s1.tar": "/d/s1.tar", "s0.tar": "/d/s0.tar"}
    return make_part(shard, pa.array(list(keys)), loss, epoch=epoch, rank=rank, seq0=seq0, locations=locations)


def test_written_part_reads_back_validated(tmp_path):
    run = RunDir(tmp_path / "r", create=True)
    rel = write_part(run, 2, 3, a_part())
    assert re.fullmatch(r"losses/rank=2/epoch=3/part-R00002-E000003-00000000000000000007-[0-9a-f]{8}\.parquet", rel)
    on_disk = pq.read_table(tmp_path / "r" / rel)
    assert on_disk.schema.remove_metadata().equals(PART_SCHEMA.remove_metadata())
    assert on_disk.schema.metadata[b"seta_stream.format_version"] == b"1"
    assert on_disk.schema.metadata[LOCATIONS_METADATA] == b'{"s0.tar":"/d/s0.tar","s1.tar":"/d/s1.tar"}'
    assert pq.ParquetFile(tmp_path / "r" / rel).metadata.row_group(0).column(0).compression == "LZ4"
    part = read_part(run, rel)
    assert part.schema.field("shard").type == pa.dictionary(pa.int32(), pa.string())
    assert part.schema.metadata == {LOCATIONS_METADATA: b'{"s0.tar": "/d/s0.tar", "s1.tar": "/d/s1.tar"}'}
    assert part_locations(part.schema) == {"s0.tar": "/d/s0.tar", "s1.tar": "/d/s1.tar"}
    assert part.to_pydict() | {"shard": part["shard"].cast(pa.string()).to_pylist()} == {
        "shard": ["s1.tar", "s0.tar", "s1.tar"],
        "key": ["a", "b", "c"],
        "uid": [sample_uid("s1.tar", "a"), sample_uid("s0.tar", "b"), sample_uid("s1.tar", "c")],
        "loss": [0.0, 1.0, 2.0],
        "epoch": [3, 3, 3],
        "rank": [2, 2, 2],
        "seq": [7, 8, 9],
    }
    assert read_part_keys(run, rel).to_pylist() == ["a", "b", "c"]


def test_pending_parts_come_in_epoch_rank_seq_order(tmp_path):
    run = RunDir(tmp_path / "r", create=True)
    made = {}
    for epoch, rank, seq0 in [(1, 0, 50), (0, 1, 5), (0, 0, 900), (0, 0, 30), (1, 10, 1), (1, 2, 99)]:
        made[(epoch, rank, seq0)] = write_part(run, rank, epoch, a_part(seq0=seq0, epoch=epoch, rank=rank))
    (tmp_path / "r/losses/rank=0/epoch=0/.tmp-1-part.parquet").write_bytes(b"partial")
    order = [(0, 0, 30), (0, 0, 900), (0, 1, 5), (1, 0, 50), (1, 2, 99), (1, 10, 1)]
    assert pending_parts(run, []) == [made[k] for k in order]
    assert pending_parts(run, [made[(0, 0, 30)], made[(1, 2, 99)]]) == [
        made[k] for k in order if k[1:] not in [(0, 30), (2, 99)]
    ]
    assert sorted(made.values(), key=fold_order) == [made[k] for k in order]


def write_raw(tmp_path, table, metadata):
    path = tmp_path / "r/losses/rank=0/epoch=0/part-x.parquet"
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table.replace_schema_metadata(metadata), path)
    return "losses/rank=0/epoch=0/part-x.parquet"


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda t: t.set_column(1, "key", pa.array(["a", None, "c"])), r"null values in column\(s\) \['key'\]"),
        (
            lambda t: t.set_column(4, "epoch", pa.array([3, 3, 3], pa.int64())),
            r"wrong schema: column 'epoch' is int64, expected int32",
        ),
    ],
)
def test_part_with_nulls_or_wrong_types_is_corrupt(tmp_path, change, message):
    run = RunDir(tmp_path / "r", create=True)
    rel = write_raw(tmp_path, change(a_part()), {b"seta_stream.format_version": b"1"})
    with pytest.raises(CorruptPartError, match=r"part-x.parquet: " + message + r".*on_corrupt='skip'") as info:
        read_part(run, rel)
    assert info.value.path == rel


def test_part_with_bad_locations_json_is_corrupt_and_large_strings_are_read(tmp_path):
    run = RunDir(tmp_path / "r", create=True)
    meta = {b"seta_stream.format_version": b"1", LOCATIONS_METADATA: b"{not json"}
    rel = write_raw(tmp_path, a_part(), meta)
    with pytest.raises(CorruptPartError, match=r"part-x.parquet: its shard locations metadata is not valid JSON"):
        read_part(run, rel)
    large = a_part().set_column(1, "key", pa.array(["a", "b", "c"], pa.large_string()))
    rel = write_raw(tmp_path, large, {b"seta_stream.format_version": b"1"})  # a part written before locations
    part = read_part(run, rel)
    assert part.schema.field("key").type == pa.string() and part.schema.metadata is None
    assert part["key"].to_pylist() == ["a", "b", "c"]


def test_merge_locations_refuses_one_name_for_two_locations(tmp_path):
    run = RunDir(tmp_path / "r", create=True)
    one = a_part(locations={"s1.tar": "/d/s1.tar", "s0.tar": "/d/s0.tar"})
    two = a_part(locations={"s1.tar": "/e/s1.tar", "s0.tar": "/d/s0.tar"})
    merged = merge_locations(run, {"s9.tar": "/d/s9.tar"}, [one, one], ["p1", "p2"])
    assert merged == {"s9.tar": "/d/s9.tar", "s1.tar": "/d/s1.tar", "s0.tar": "/d/s0.tar"}
    with pytest.raises(
        ShardNameConflictError, match=r"shard name 's1.tar' stands for two shards: '/d/s1.tar' \(in .*p1\)"
    ):
        merge_locations(run, {}, [one, two], ["p1", "p2"])
    with pytest.raises(ShardNameConflictError, match=r"'/e/s1.tar' \(in the loss table \(.*manifest.json\)\)"):
        merge_locations(run, {"s1.tar": "/e/s1.tar"}, [one], ["p1"])


def test_quarantine_moves_a_part_and_remembers_its_path(tmp_path):
    run = RunDir(tmp_path / "r", create=True)
    rel = write_part(run, 1, 4, a_part(rank=1, epoch=4))
    quarantine_part(run, rel)
    assert not (tmp_path / "r" / rel).exists()
    assert (tmp_path / "r/losses-quarantine" / rel[len("losses/") :]).exists()
    assert quarantined_parts(run) == {rel} and pending_parts(run, []) == []
    assert json.loads(
        pq.read_schema(tmp_path / "r/losses-quarantine" / rel[len("losses/") :]).metadata[LOCATIONS_METADATA]
    )
