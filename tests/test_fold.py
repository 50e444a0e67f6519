"""The compaction fold on plain Arrow/NumPy columns: no run directory, no files."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from seta_stream._losses.fold import IDENTITY_COLUMNS, STAT_COLUMNS, OldTable, Records, fold, interleave_keys
from seta_stream._store.table import TABLE_SCHEMA
from seta_stream.errors import CorruptPartError, SampleIdCollisionError
from seta_stream.ids import sample_uid

I32_MIN = np.iinfo(np.int32).min


def part(*rows: tuple[str, str, float, int, int, int], uid: dict[tuple[str, str], int] | None = None) -> pa.Table:
    """A part table from (shard, key, loss, epoch, rank, seq) rows; uids are sample_uid's unless
    ``uid`` overrides some."""
    uid = uid or {}
    shard, key, loss, epoch, rank, seq = (list(c) for c in zip(*rows))
    return pa.table(
        {
            "shard": pa.array(shard).dictionary_encode(),
            "key": key,
            "uid": pa.array([uid.get((s, k), sample_uid(s, k)) for s, k in zip(shard, key)], pa.uint64()),
            "loss": pa.array(loss, pa.float32()),
            "epoch": pa.array(epoch, pa.int32()),
            "rank": pa.array(rank, pa.int32()),
            "seq": pa.array(seq, pa.int64()),
        }
    )


def records(*parts: pa.Table) -> Records:
    return Records(list(parts), [f"losses/part-{k}.parquet" for k in range(len(parts))], lambda k: parts[k]["key"])


def rows(columns: dict) -> dict[tuple[str, str], dict]:
    table = pa.Table.from_pydict(columns, schema=TABLE_SCHEMA)
    return {(r["shard"], r["key"]): r for r in table.to_pylist()}


def table_of(columns: dict) -> pa.Table:
    return pa.Table.from_pydict(columns, schema=TABLE_SCHEMA)


def test_first_fold_gives_exact_columns_in_shard_uid_order():
    a = part(("s1.tar", "x", 1.0, 0, 0, 10), ("s0.tar", "y", 2.0, 0, 0, 11), ("s1.tar", "x", 3.0, 0, 0, 12))
    b = part(("s0.tar", "y", 4.0, 0, 1, 5), ("s1.tar", "z", float("nan"), 0, 1, 6))
    out = fold(OldTable.empty(), records(a, b), beta2=0.5)
    assert (out.new_samples, out.rows, out.records, out.nan_losses, out.n_ref) == (3, 3, 5, 1, 3)
    assert list(out.columns) == list(IDENTITY_COLUMNS + STAT_COLUMNS) == TABLE_SCHEMA.names
    t = table_of(out.columns)
    ids = [("s0.tar", "y"), *sorted([("s1.tar", "x"), ("s1.tar", "z")], key=lambda i: sample_uid(*i))]
    assert list(zip(t["shard"].to_pylist(), t["key"].to_pylist())) == ids
    assert t["uid"].to_pylist() == [sample_uid(*i) for i in ids]
    got = rows(out.columns)
    s = 1 / 3  # n_ref = rows after the fold
    assert {k: v for k, v in got[("s1.tar", "x")].items() if k in STAT_COLUMNS} == {
        "last_loss": 3.0,
        "last_epoch": 0,
        "seen": 2,
        "nonfinite": 0,
        "ema": 0.5 * (0.5 * s + 0.5 * 1.0) + 0.5 * 3.0,
        "last_rank": 0,
        "last_seq": 12,
        "loss_count": 2,  # Welford over the finite records 1.0, 3.0
        "loss_mean": 2.0,
        "loss_m2": 2.0,
    }
    y = got[("s0.tar", "y")]  # rank 1's record comes after rank 0's in the same epoch
    assert (y["last_loss"], y["last_rank"], y["last_seq"], y["seen"]) == (4.0, 1, 5, 2)
    assert y["ema"] == 0.5 * (0.5 * s + 0.5 * 2.0) + 0.5 * 4.0
    z = got[("s1.tar", "z")]  # only a NaN record: counted, no EMA step, last_loss NaN
    assert np.isnan(z["last_loss"]) and (z["seen"], z["nonfinite"], z["ema"], z["last_seq"]) == (1, 1, s, 6)
    assert z["loss_count"] == 0 and np.isnan(z["loss_mean"]) and np.isnan(z["loss_m2"])  # no finite record


def test_ema_steps_follow_record_order_also_within_one_part():
    # one sample recorded 5 times in one part (a sampler drawing with replacement) and twice later
    p1 = part(*[("s.tar", "a", float(v), 0, 0, i) for i, v in enumerate([1, 2, 3, 4, 5])], ("s.tar", "b", 9.0, 0, 0, 9))
    p2 = part(("s.tar", "a", 6.0, 1, 0, 20), ("s.tar", "a", float("nan"), 1, 0, 21))
    out = fold(OldTable.empty(), records(p1, p2), beta2=0.7, dataset_size=10)
    s = 1 / 10
    for v in [1, 2, 3, 4, 5, 6]:
        s = 0.7 * s + (1 - 0.7) * v
    a = rows(out.columns)[("s.tar", "a")]
    assert a["ema"] == s  # bit for bit: the same float64 steps in the same order
    k, mean, m2 = 0, 0.0, 0.0
    for v in [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]:  # Welford, one step per finite record, in order
        k += 1
        d = v - mean
        mean = v if k == 1 else mean + d / k
        m2 = 0.0 if k == 1 else m2 + d * (v - mean)
    assert (a["loss_count"], a["loss_mean"], a["loss_m2"]) == (6, mean, m2) == (6, 3.5, 17.5)
    assert (a["seen"], a["nonfinite"], a["last_epoch"], a["last_seq"]) == (7, 1, 1, 21)
    assert np.isnan(a["last_loss"]) and (out.n_ref, out.nan_losses) == (10, 1)


def test_known_samples_update_in_place_and_identity_columns_pass_through():
    first = fold(OldTable.empty(), records(part(("s.tar", "a", 1.0, 0, 0, 1), ("t.tar", "b", 2.0, 0, 0, 2))), beta2=0.5)
    old = OldTable.from_table(table_of(first.columns))
    asked: list[str] = []

    def stats(name):
        asked.append(name)
        return table_of(first.columns).column(name)

    old.stats = stats

    def no_keys(k):
        raise AssertionError("a fold of known samples needs no key strings")

    rec = Records([part(("t.tar", "b", 8.0, 1, 0, 3))], ["losses/p.parquet"], no_keys)
    out = fold(old, rec, beta2=0.5)
    assert asked == list(STAT_COLUMNS)  # each old column fetched once
    assert out.columns["key"] is old.key and out.columns["shard"] is old.shard  # not copied
    assert (out.new_samples, out.rows, out.n_ref) == (0, 2, 2)
    got = rows(out.columns)
    assert got[("s.tar", "a")] == rows(first.columns)[("s.tar", "a")]
    b = got[("t.tar", "b")]
    assert (b["seen"], b["last_loss"], b["last_epoch"], b["last_seq"]) == (2, 8.0, 1, 3)
    assert b["ema"] == 0.5 * (0.5 * 0.5 + 0.5 * 2.0) + 0.5 * 8.0


def test_late_record_of_an_older_epoch_steps_the_ema_but_not_last_loss():
    first = fold(OldTable.empty(), records(part(("s.tar", "a", 5.0, 1, 0, 100))), beta2=0.5)
    late = part(("s.tar", "a", 7.0, 0, 1, 1))  # rank 1, epoch 0, folded after epoch 1
    out = fold(OldTable.from_table(table_of(first.columns)), records(late), beta2=0.5)
    (a,) = rows(out.columns).values()
    assert (a["last_loss"], a["last_epoch"], a["last_rank"], a["last_seq"], a["seen"]) == (5.0, 1, 0, 100, 2)
    assert a["ema"] == 0.5 * (0.5 * 1.0 + 0.5 * 5.0) + 0.5 * 7.0


def test_new_samples_interleave_with_old_rows_in_shard_uid_order():
    old_ids = [("s1.tar", f"k{i}") for i in range(6)] + [("s3.tar", f"k{i}") for i in range(4)]
    first = fold(
        OldTable.empty(), records(part(*[(s, k, 1.0, 0, 0, i) for i, (s, k) in enumerate(old_ids)])), beta2=0.5
    )
    new_ids = [("s0.tar", "n0"), ("s2.tar", "n1"), ("s3.tar", "n2"), ("s1.tar", "n3"), ("s9.tar", "n4")]
    rec = records(part(*[(s, k, 2.0, 1, 0, i) for i, (s, k) in enumerate(new_ids + old_ids[:2])]))
    out = fold(OldTable.from_table(table_of(first.columns)), rec, beta2=0.5)
    t = table_of(out.columns)
    ids = list(zip(t["shard"].to_pylist(), t["key"].to_pylist()))
    assert ids == sorted(old_ids + new_ids, key=lambda i: (i[0], sample_uid(*i)))
    assert (out.new_samples, out.rows, out.n_ref) == (5, 15, 15)
    seen = dict(zip(ids, t["seen"].to_pylist()))
    assert seen == {i: 1 for i in old_ids + new_ids} | {old_ids[0]: 2, old_ids[1]: 2}
    ema = dict(zip(ids, t["ema"].to_pylist()))
    assert ema[("s9.tar", "n4")] == 0.5 * (1 / 15) + 0.5 * 2.0 and ema[old_ids[5]] == 0.5 * (1 / 10) + 0.5


@pytest.mark.parametrize("max_pieces", [0, 1, 1 << 14])
def test_interleave_keys_by_slices_or_one_take(max_pieces):
    old = pa.chunked_array([["a", "c"], ["d", "f", "g"]])
    new = pa.chunked_array([["0", "b"], ["e", "h", "i"]])
    insert = np.array([0, 1, 3, 5, 5])
    out = interleave_keys(old, new, insert, max_pieces=max_pieces)
    assert out.to_pylist() == ["0", "a", "b", "c", "d", "e", "f", "g", "h", "i"]


def test_a_new_record_whose_uid_is_not_the_hash_of_its_identity_is_a_corrupt_part():
    both = {("s.tar", "a"): 42, ("t.tar", "bb"): 42}
    rec = records(part(("s.tar", "a", 1.0, 0, 0, 1), ("t.tar", "bb", 1.0, 0, 0, 2), uid=both))
    with pytest.raises(
        CorruptPartError, match=r"losses/part-0.parquet: record \('s.tar', 'a'\) carries uid 0x0+2a, expected 0x"
    ) as info:
        fold(OldTable.empty(), rec, beta2=0.5)
    assert info.value.path == "losses/part-0.parquet"


def test_collisions_with_the_table_and_between_keys_of_one_shard(monkeypatch):
    # a real 64-bit collision cannot be built: make every identity hash to 42
    fake = lambda shards, keys: np.full(len(keys), 42, dtype=np.uint64)  # noqa: E731
    monkeypatch.setattr("seta_stream._losses.fold.sample_uids", fake)
    u = {("s.tar", "a"): 42, ("s.tar", "bb"): 42, ("t.tar", "cc"): 42}
    first = fold(OldTable.empty(), records(part(("s.tar", "a", 1.0, 0, 0, 1), uid=u)), beta2=0.5)
    old = table_of(first.columns)
    # same shard, same uid, another key length: matched to the row, then refused
    with pytest.raises(
        SampleIdCollisionError,
        match=r"\('s.tar', 'bb'\) \(recorded in losses/part-0.parquet\) has uid 0x0+2a, "
        r"which the table already holds for \('s.tar', 'a'\)",
    ):
        fold(OldTable.from_table(old), records(part(("s.tar", "bb", 1.0, 1, 0, 2), uid=u)), beta2=0.5)
    # another shard: a new sample whose uid the table holds
    with pytest.raises(SampleIdCollisionError, match=r"\('t.tar', 'cc'\) .* which the table already holds for"):
        fold(OldTable.from_table(old), records(part(("t.tar", "cc", 1.0, 1, 0, 2), uid=u)), beta2=0.5)
    # two new keys of one shard with one uid
    with pytest.raises(SampleIdCollisionError, match=r"records \('s.tar', 'bb'\) and \('s.tar', 'a'\) carry the same"):
        fold(
            OldTable.empty(),
            records(part(("s.tar", "a", 1.0, 0, 0, 1), ("s.tar", "bb", 1.0, 0, 0, 2), uid=u)),
            beta2=0.5,
        )


def test_a_table_not_grouped_by_shard_is_refused():
    shard = pa.array(["s.tar", "t.tar", "s.tar"]).dictionary_encode()
    with pytest.raises(CorruptPartError, match="the loss table is not grouped by shard"):
        OldTable(shard, pa.array(["a", "b", "c"]), np.arange(3, dtype=np.uint64), lambda name: None)


def test_nothing_to_fold_gives_an_empty_table():
    out = fold(OldTable.empty(), records(), beta2=0.5)
    assert table_of(out.columns).equals(TABLE_SCHEMA.empty_table())
    assert (out.rows, out.new_samples, out.records, out.n_ref) == (0, 0, 0, 0)
