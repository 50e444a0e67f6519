"""The fold of compaction: the old table's columns + loss records -> the new table's columns.

A pure kernel: arrays in, arrays out; no run directory, no file reading or writing (the
transaction around it is ``compaction``). :func:`fold` takes an :class:`OldTable` (the table
before this compaction) and :class:`Records` (the pending parts' records, in fold order) and
returns :class:`Folded`: every column of the new table (docs/format.md, "Loss table") and the
counts the compaction reports. Partitioned compaction calls it once per partition.

What it does, vectorised (no Python loop per sample):

* **match**: the table is sorted by (shard, uid), so records are grouped by shard (a radix sort
  of shard codes) and looked up by binary search in their shard's uid range;
* **identity checks**: a record matched to a row must have that row's key length (same shard,
  same uid, another key = a 64-bit collision); records of samples new to the table are
  re-hashed (their uids must be ``ids.sample_uids`` of their (shard, key), else the part is
  corrupt) and a new uid may occur in no other shard of the records or of the table;
* **statistics**, per sample, one record at a time in (epoch, rank, seq) order (the records
  arrive in that order: parts sorted by epoch, rank and first seq, rows in seq order):
  ``seen`` and ``nonfinite`` count; ``last_*`` is the greatest record in (epoch, rank, seq)
  (a late part of an older epoch does not replace it); ``ema`` takes one step
  ``s <- beta2 s + (1 - beta2) loss`` per finite record in float64 (docs/algorithms.md §0.6), starting
  from ``1/n_ref`` for a new sample, where ``n_ref`` is ``dataset_size`` or else the table's
  rows after this fold; ``loss_count``, ``loss_mean`` and ``loss_m2`` take one Welford step per
  finite record in float64 (the k-th: mean = x when k = 1, else d = x - mean,
  mean += d / k, m2 += d (x - mean)), the history the noise rule reads (§12);
* **interleave**: new samples are inserted at their (shard, uid) place; old rows keep their
  relative order. With no new sample the old identity columns are passed through uncopied.

Updates run in blocks of :data:`FOLD_BLOCK_ROWS` records (large fresh temporaries are slow);
a block in which one row has several records runs in rounds, one record per row each.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .._kernels.arrays import column_to_numpy, copy_column_into, group_order, utf8_lengths
from .._store.parts import CORRUPT_HINT
from ..errors import CorruptPartError, SampleIdCollisionError
from ..ids import sample_uids

__all__ = [
    "IDENTITY_COLUMNS",
    "STAT_COLUMNS",
    "FOLD_BLOCK_ROWS",
    "KeySource",
    "ColumnSource",
    "OldTable",
    "Records",
    "Folded",
    "fold",
    "interleave_keys",
]

#: Identity columns of the table, then its per-sample statistics (TABLE_SCHEMA's order).
IDENTITY_COLUMNS = ("shard", "key", "uid")
STAT_COLUMNS = (
    "last_loss",
    "last_epoch",
    "seen",
    "nonfinite",
    "ema",
    "last_rank",
    "last_seq",
    "loss_count",
    "loss_mean",
    "loss_m2",
)
_STAT_DTYPES = {
    "last_loss": np.float32,
    "last_epoch": np.int32,
    "seen": np.int32,
    "nonfinite": np.int32,
    "ema": np.float64,
    "last_rank": np.int32,
    "last_seq": np.int64,
    "loss_count": np.int32,
    "loss_mean": np.float64,
    "loss_m2": np.float64,
}

#: Records per vectorised update step (2^20 rows).
FOLD_BLOCK_ROWS = 1 << 20
#: Above this many insertion places, new keys are merged by one take instead of slices.
_MAX_KEY_PIECES = 1 << 14
_SHARD_DICT = pa.dictionary(pa.int32(), pa.string())

ArrayLike: TypeAlias = pa.ChunkedArray | pa.Array | np.ndarray
#: ``keys_of(k)``: the key column of part ``k`` (all its rows, in order).
KeySource: TypeAlias = Callable[[int], pa.ChunkedArray | pa.Array]
#: ``column(name)``: one statistics column of the old table (all its rows, in order).
ColumnSource: TypeAlias = Callable[[str], ArrayLike]


def _chunked(col: ArrayLike, type_: pa.DataType) -> pa.ChunkedArray:
    """``col`` as a ChunkedArray (a NumPy array converted to ``type_``)."""
    if isinstance(col, pa.ChunkedArray):
        return col
    return pa.chunked_array([col if isinstance(col, pa.Array) else pa.array(col, type_)])


def _no_stats(name: str) -> np.ndarray:
    return np.zeros(0, _STAT_DTYPES[name])


# ---------------------------------------------------------------------------------- inputs
class OldTable:
    """The table before this fold: its identity columns and a source of its statistics.

    ``shard`` (dictionary or plain strings), ``key`` and ``uid`` are the table's columns,
    rows sorted by (shard, uid). ``stats(name)`` returns the statistics column ``name`` (one of
    :data:`STAT_COLUMNS`); the fold asks for each once and scatters it into the new table's
    array before asking for the next, so a caller that reads them from a file lazily holds one
    old column at a time beside the new ones instead of all seven (555 MB at 15M rows).
    """

    def __init__(self, shard: ArrayLike, key: ArrayLike, uid: ArrayLike, stats: ColumnSource) -> None:
        names = _chunked(shard, pa.string())
        if not pa.types.is_dictionary(names.type):
            names = pc.dictionary_encode(names)
        self.shard: pa.ChunkedArray = names.cast(_SHARD_DICT)
        self.key: pa.ChunkedArray = _chunked(key, pa.string())
        self.uid_column = uid
        self.uid = column_to_numpy(uid)
        self.stats = stats
        self.n = len(self.uid)
        #: shard run r covers rows [starts[r], starts[r+1]) of shard names[r]
        self.names, self.starts = _shard_runs(self.shard, self.n)

    @classmethod
    def empty(cls) -> OldTable:
        """No table yet."""
        return cls(
            pa.chunked_array([], _SHARD_DICT), pa.chunked_array([], pa.string()), np.zeros(0, np.uint64), _no_stats
        )

    @classmethod
    def from_table(cls, table: pa.Table) -> OldTable:
        """A table held whole in memory (every column of TABLE_SCHEMA)."""
        return cls(table.column("shard"), table.column("key"), table.column("uid"), table.column)


def _shard_runs(shard: pa.ChunkedArray, n: int) -> tuple[list[str], np.ndarray]:
    """(names, starts) of the shard runs of a column grouped by shard."""
    names: list[str] = []
    starts: list[int] = []
    o = 0
    for chunk in shard.chunks:
        k = len(chunk)
        if not k:
            continue
        dictionary = chunk.dictionary.to_pylist()
        idx = chunk.indices.to_numpy(zero_copy_only=False)
        change = np.flatnonzero(idx[1:] != idx[:-1]) + 1
        for s in np.concatenate([[0], change]).tolist():
            name = dictionary[idx[s]]
            if not names or names[-1] != name:
                names.append(name)
                starts.append(o + s)
        o += k
    if len(set(names)) != len(names):
        raise CorruptPartError(
            "the loss table is not grouped by shard (a shard appears in several row ranges); "
            "expected a table written by compact(). Delete table/ and compact again to rebuild it"
        )
    return names, np.array(starts + [n], dtype=np.int64)


class Records:
    """The records to fold, in fold order: the rows of ``parts`` (tables with PART_SCHEMA's
    columns; ``names[k]`` names part k in error messages), part after part.

    Kept: per-part (loss, epoch, rank, seq) columns, and for all records shard codes (one
    dictionary, ``shard_names``), uids and key lengths. Key strings are not kept: they are
    the largest column (about 25 bytes a record), and a compaction whose samples are all in
    the table already (every one after the first epoch) needs none of them: a known sample is
    checked by shard, uid and key length. Only the records of new samples, and error messages,
    need keys; ``keys_of(k)`` gives part k's key column then (the caller re-reads it from the
    part file, or passes columns it holds).
    """

    def __init__(self, parts: Sequence[pa.Table], names: Sequence[str], keys_of: KeySource) -> None:
        self.names = list(names)
        self.keys_of = keys_of
        self.offsets = np.cumsum([0] + [p.num_rows for p in parts]).astype(np.int64)
        self.n = int(self.offsets[-1])
        code_of: dict[str, int] = {}  # one shard dictionary for all records
        self.code = np.empty(self.n, dtype=np.int32)
        self.uid = np.empty(self.n, dtype=np.uint64)
        self.keylen = np.empty(self.n, dtype=np.int32)
        self.parts: list[pa.Table] = []
        for k, part in enumerate(parts):
            o = int(self.offsets[k])
            shard = part.column("shard")
            if not pa.types.is_dictionary(shard.type):
                shard = pc.dictionary_encode(shard)
            for chunk in shard.chunks:
                n = len(chunk)
                if n:
                    lut = np.array(
                        [code_of.setdefault(s, len(code_of)) for s in chunk.dictionary.to_pylist()], np.int32
                    )
                    self.code[o : o + n] = lut[chunk.indices.to_numpy(zero_copy_only=False)]
                o += n
            o = int(self.offsets[k])
            copy_column_into(self.uid[o:], part.column("uid"))
            self.keylen[o : o + part.num_rows] = utf8_lengths(part.column("key"))
            self.parts.append(part.select(["loss", "epoch", "rank", "seq"]))
        self.shard_names: list[str] = list(code_of)

    def nan_losses(self) -> int:
        """Number of records whose loss is NaN (recorders store every non-finite loss as NaN)."""
        return sum(int(pc.sum(pc.is_nan(p.column("loss"))).as_py() or 0) for p in self.parts)

    def part_of(self, i: int) -> str:
        return self.names[int(np.searchsorted(self.offsets, i, side="right")) - 1]

    def shard(self, i: int) -> str:
        return self.shard_names[int(self.code[i])]

    def key(self, i: int) -> str:
        return str(self.take_keys(np.array([i], dtype=np.int64))[0].as_py())

    def take_keys(self, idx: np.ndarray) -> pa.ChunkedArray:
        """Key strings of records ``idx`` (ascending), from ``keys_of``."""
        chunks = []
        cut = np.searchsorted(idx, self.offsets)
        for k in np.flatnonzero(np.diff(cut) > 0).tolist():
            local = idx[cut[k] : cut[k + 1]] - self.offsets[k]
            keys = _chunked(self.keys_of(k), pa.string())
            chunks.extend(keys.take(pa.array(local)).cast(pa.string()).chunks)
        return pa.chunked_array(chunks, pa.string())


@dataclass
class Folded:
    """The new table's columns (:data:`IDENTITY_COLUMNS` + :data:`STAT_COLUMNS`, in the
    table's order) and what the fold counted."""

    columns: dict[str, Any]
    new_samples: int  # rows the records added
    n_ref: int  # the EMA start denominator used for new samples
    records: int  # records folded
    nan_losses: int  # records with a NaN loss

    @property
    def rows(self) -> int:
        return len(self.columns["uid"])


# ---------------------------------------------------------------------------------- fold
def fold(
    old: OldTable,
    records: Records,
    *,
    beta2: float,
    dataset_size: int | None = None,
    on_part: Callable[[], None] | None = None,
) -> Folded:
    """Fold ``records`` into ``old``: the columns of the new table (module docstring).

    Raises :class:`SampleIdCollisionError` if two identities share a uid, and
    :class:`CorruptPartError` (``path`` = the part's name) for a record of a new sample whose
    uid is not the hash of its (shard, key). ``on_part()`` is called after each part's records
    are applied (a progress bar)."""
    pos = _match(old, records)  # table row of each record, -1 if new
    if old.n:
        _check_known(old, records, pos)
    new = _new_samples(old, records, pos)  # pos of a new record: -1 - its row among the new rows
    n_new = len(new)
    new_dest = new.insert + np.arange(n_new, dtype=np.int64)  # rows are addressed in the new order
    old_dest: np.ndarray | None = None  # None: old row i stays row i
    if n_new and old.n:
        old_dest = np.arange(old.n, dtype=np.int64)
        old_dest += np.searchsorted(new.insert, old_dest, side="right")
    if n_new:
        _to_new_rows(pos, old_dest, new_dest)
    n_ref = int(dataset_size) if dataset_size else old.n + n_new
    stats = _Stats(old, old_dest, new_dest, n_ref)
    _apply_records(stats, records, pos, beta2, on_part)
    del pos
    identity = _identity_columns(old, new, old_dest, new_dest)
    return Folded({**identity, **stats.columns}, n_new, n_ref, records.n, records.nan_losses())


def _to_new_rows(pos: np.ndarray, old_dest: np.ndarray | None, new_dest: np.ndarray) -> None:
    """Rewrite ``pos`` (old row, or -1 - new row) into rows of the new table, in place."""
    for lo in range(0, len(pos), FOLD_BLOCK_ROWS):
        p = pos[lo : lo + FOLD_BLOCK_ROWS]
        is_new = p < 0
        if old_dest is not None:
            p[~is_new] = old_dest[p[~is_new]]
        p[is_new] = new_dest[-1 - p[is_new]]


# ---------------------------------------------------------------------------------- match
def _match(old: OldTable, rec: Records) -> np.ndarray:
    """Table row of every record (-1 where the sample is not in the table), shard by shard."""
    if old.n == 0 or rec.n == 0:
        return np.full(rec.n, -1, dtype=np.int64)
    run_of = {name: r for r, name in enumerate(old.names)}
    n_runs = len(old.names)
    lut = np.array([run_of.get(s, n_runs) for s in rec.shard_names], dtype=np.int64)
    group = lut.astype(np.uint16 if n_runs < (1 << 16) else np.int64)[rec.code]
    order = group_order(group, n_runs + 1)
    counts = np.bincount(group, minlength=n_runs + 1)
    bounds = np.concatenate([[0], np.cumsum(counts)])
    del group
    uid_sorted = rec.uid[order]
    pos_sorted = np.empty(rec.n, dtype=np.int64)
    pos_sorted[bounds[n_runs] :] = -1  # shards the table does not have
    for r in np.flatnonzero(counts[:n_runs]).tolist():  # records of shards the table has
        lo, hi = int(bounds[r]), int(bounds[r + 1])
        start, stop = int(old.starts[r]), int(old.starts[r + 1])
        table_uid = old.uid[start:stop]
        q = uid_sorted[lo:hi]
        i = np.searchsorted(table_uid, q)
        hit = table_uid[np.minimum(i, stop - start - 1)] == q
        pos_sorted[lo:hi] = np.where(hit, i + start, -1)
    del uid_sorted
    pos = np.empty(rec.n, dtype=np.int64)
    pos[order] = pos_sorted
    return pos


def _collision(found: str) -> SampleIdCollisionError:
    return SampleIdCollisionError(
        f"{found}; expected distinct uids for distinct samples (shard, key). Rename one of the "
        "keys (a genuine 64-bit collision is astronomically rare; check that the keys and the "
        "part files are not corrupted)"
    )


def _check_known(old: OldTable, rec: Records, pos: np.ndarray) -> None:
    """Records matched to a table row (same shard, same uid) must have that row's key length."""
    table_keylen = utf8_lengths(old.key)
    for lo in range(0, rec.n, FOLD_BLOCK_ROWS):
        p = pos[lo : lo + FOLD_BLOCK_ROWS]
        m = p >= 0
        bad = np.flatnonzero(table_keylen[p[m]] != rec.keylen[lo : lo + FOLD_BLOCK_ROWS][m])
        if len(bad):
            i = lo + int(np.flatnonzero(m)[bad[0]])
            row = int(pos[i])
            shard = rec.shard(i)
            raise _collision(
                f"{(shard, rec.key(i))!r} (recorded in {rec.part_of(i)}) has uid {int(rec.uid[i]):#018x}, "
                f"which the table already holds for {(shard, str(old.key[row].as_py()))!r}"
            )


# ---------------------------------------------------------------------------------- new samples
@dataclass
class _NewRows:
    """Samples new to the table, in (shard name, uid) order: one row each."""

    uid: np.ndarray  # uint64, sorted within each shard
    first: np.ndarray  # index of each new sample's first record
    shard_names: list[str]  # shard of each group of rows, ascending by name
    group_sizes: np.ndarray  # number of new rows of each shard
    insert: np.ndarray  # number of old rows that sort before each new row
    keys: pa.ChunkedArray  # key of each new row

    def __len__(self) -> int:
        return len(self.uid)


def _new_samples(old: OldTable, rec: Records, pos: np.ndarray) -> _NewRows:
    """Group the records of samples not in the table (``pos == -1``) into new rows.

    Verifies every new record's uid against the hash of its (shard, key), rejects uid
    collisions, and sets ``pos`` of the new records to ``-1 - (their row's index among the new
    rows)``.
    """
    ni = np.flatnonzero(pos < 0)
    if len(ni) == 0:
        z = np.zeros(0, dtype=np.int64)
        return _NewRows(np.zeros(0, dtype=np.uint64), z, [], z, z, pa.chunked_array([], pa.string()))
    keys = rec.take_keys(ni)
    _verify_uids(rec, ni, keys)
    rows, row_of, first_in_ni = _group_new(old, rec, ni)
    rows.keys = keys.take(pa.array(first_in_ni))
    del keys
    # records of one new row must share the key (shard is shared by construction; uids were just
    # verified, so a mismatch is a genuine hash collision between two recorded identities)
    bad = np.flatnonzero(rec.keylen[ni] != rec.keylen[rows.first[row_of]])
    if len(bad):
        i, j = int(ni[bad[0]]), int(rows.first[row_of[bad[0]]])
        raise _collision(
            f"records {(rec.shard(i), rec.key(i))!r} and {(rec.shard(j), rec.key(j))!r} carry the same "
            f"uid {int(rec.uid[i]):#018x}"
        )
    _check_new_uids_unique(old, rec, rows)
    pos[ni] = -1 - row_of  # new rows are encoded as -1 - (index among the new rows)
    return rows


def _verify_uids(rec: Records, ni: np.ndarray, keys: pa.ChunkedArray) -> None:
    """Records ``ni`` (keys ``keys``) must carry the uid of their (shard, key)."""
    names = pa.array(rec.shard_names, pa.string())
    for lo in range(0, len(ni), FOLD_BLOCK_ROWS):
        idx = ni[lo : lo + FOLD_BLOCK_ROWS]
        shards = pa.DictionaryArray.from_arrays(pa.array(rec.code[idx]), names)
        expected = sample_uids(shards, keys.slice(lo, len(idx)))
        got = rec.uid[idx]
        bad = np.flatnonzero(expected != got)
        if len(bad):
            i = int(idx[bad[0]])
            raise CorruptPartError(
                f"{rec.part_of(i)}: record ({rec.shard(i)!r}, {rec.key(i)!r}) carries uid "
                f"{int(got[bad[0]]):#018x}, expected {int(expected[bad[0]]):#018x} "
                "(seta_stream.ids.sample_uid); the part was written by an incompatible writer or is "
                f"corrupted. Re-record it with LossRecorder. {CORRUPT_HINT}",
                path=rec.part_of(i),
            )


def _group_new(old: OldTable, rec: Records, ni: np.ndarray) -> tuple[_NewRows, np.ndarray, np.ndarray]:
    """(new rows without keys, new row of each record ``ni``, position in ``ni`` of each new
    row's first record).

    Groups by shard name (a radix sort of the name ranks keeps record order within a shard),
    then sorts each shard's uids: new rows come out in table order, (shard, uid)."""
    name_rank = np.empty(len(rec.shard_names), dtype=np.int64)
    name_rank[np.argsort(np.array(rec.shard_names, dtype=object), kind="stable")] = np.arange(len(rec.shard_names))
    codes = rec.code[ni]
    ranks = name_rank[codes]
    order = group_order(ranks, len(name_rank))
    sorted_ranks = ranks[order]
    cuts = np.flatnonzero(np.concatenate([[True], sorted_ranks[1:] != sorted_ranks[:-1], [True]])).tolist()
    run_of = {s: r for r, s in enumerate(old.names)}
    row_of = np.empty(len(ni), dtype=np.int64)  # new row of each new record
    uids, firsts, inserts, group_names, sizes = [], [], [], [], []
    base = 0
    for a, b in zip(cuts[:-1], cuts[1:]):
        seg = order[a:b]
        unique, first, inverse = np.unique(rec.uid[ni[seg]], return_index=True, return_inverse=True)
        row_of[seg] = base + inverse.reshape(-1)
        name = rec.shard_names[int(codes[seg[0]])]
        r = run_of.get(name)
        if r is None:  # a shard the table does not have: before the first old shard with a greater name
            inserts.append(np.full(len(unique), old.starts[bisect.bisect(old.names, name)], dtype=np.int64))
        else:
            start, stop = int(old.starts[r]), int(old.starts[r + 1])
            inserts.append(start + np.searchsorted(old.uid[start:stop], unique))
        uids.append(unique)
        firsts.append(seg[first])  # positions in ni
        group_names.append(name)
        sizes.append(len(unique))
        base += len(unique)
    first_in_ni = np.concatenate(firsts)
    no_keys = pa.chunked_array([], pa.string())
    rows = _NewRows(
        np.concatenate(uids), ni[first_in_ni], group_names, np.array(sizes, np.int64), np.concatenate(inserts), no_keys
    )
    return rows, row_of, first_in_ni


def _first_clash(new_uid: np.ndarray, old_uid: np.ndarray) -> np.uint64 | None:
    """A uid that occurs twice in ``new_uid`` or also in ``old_uid`` (None if all are distinct)."""
    su = np.sort(new_uid)
    dup = np.flatnonzero(su[1:] == su[:-1])
    if len(dup):
        return su[dup[0]]
    if len(old_uid) and len(su):
        so = np.sort(old_uid)
        i = np.minimum(np.searchsorted(so, su), len(so) - 1)
        hit = np.flatnonzero(so[i] == su)
        if len(hit):
            return su[hit[0]]
    return None


def _check_new_uids_unique(old: OldTable, rec: Records, rows: _NewRows) -> None:
    """A new uid must not exist elsewhere: in another shard of these records or of the table."""
    clash = _first_clash(rows.uid, old.uid)
    if clash is None:
        return
    u = int(clash)
    k = np.flatnonzero(rows.uid == clash)
    i = int(rows.first[k[0]])
    in_table = np.flatnonzero(old.uid == clash)
    if len(in_table):
        row = int(in_table[0])
        other = (str(old.shard[row].as_py()), str(old.key[row].as_py()))
        found = f"which the table already holds for {other!r}"
    else:
        j = int(rows.first[k[1]])
        found = f"which {(rec.shard(j), rec.key(j))!r} (recorded in {rec.part_of(j)}) also has"
    raise _collision(f"{(rec.shard(i), rec.key(i))!r} (recorded in {rec.part_of(i)}) has uid {u:#018x}, {found}")


# ---------------------------------------------------------------------------------- statistics
class _Stats:
    """The new table's per-sample statistics as writable NumPy arrays, in the new row order:
    the old table's values moved to their new rows, new rows at their never-recorded start."""

    def __init__(self, old: OldTable, old_dest: np.ndarray | None, new_dest: np.ndarray, n_ref: int) -> None:
        n = old.n + len(new_dest)
        self.columns: dict[str, np.ndarray] = {}
        for name in STAT_COLUMNS:
            arr = self.columns[name] = np.empty(n, _STAT_DTYPES[name])
            if old.n:  # one column at a time: never the old column and its copy of every column
                _scatter_into(arr, old_dest, old.stats(name))
        c = self.columns
        self.last_loss, self.last_epoch, self.last_rank, self.last_seq = (
            c[name] for name in ("last_loss", "last_epoch", "last_rank", "last_seq")
        )
        self.seen, self.nonfinite, self.ema = c["seen"], c["nonfinite"], c["ema"]
        self.loss_count, self.loss_mean, self.loss_m2 = c["loss_count"], c["loss_mean"], c["loss_m2"]
        # never-recorded start values: every new row gets at least one record
        self.last_loss[new_dest] = np.nan
        self.last_epoch[new_dest] = np.iinfo(np.int32).min
        self.last_rank[new_dest] = np.iinfo(np.int32).min
        self.last_seq[new_dest] = np.iinfo(np.int64).min
        self.seen[new_dest] = 0
        self.nonfinite[new_dest] = 0
        self.loss_count[new_dest] = 0  # no finite record: mean and m2 undefined until the first
        self.loss_mean[new_dest] = np.nan
        self.loss_m2[new_dest] = np.nan
        if len(new_dest):  # n_ref >= 1 then
            self.ema[new_dest] = 1.0 / n_ref  # ES eq. 2.5: s_i(0) = 1/n

    def apply(
        self, p: np.ndarray, loss: np.ndarray, epoch: np.ndarray, rank: np.ndarray, seq: np.ndarray, beta2: float
    ) -> None:
        """One record per row ``p`` (no repeats), in (epoch, rank, seq) order per row."""
        finite = np.isfinite(loss)
        if finite.all():
            pf, lf = p, loss
        else:
            pf, lf = p[finite], loss[finite]
            self.nonfinite[p[~finite]] += 1
        x = lf.astype(np.float64)
        self.ema[pf] = beta2 * self.ema[pf] + (1.0 - beta2) * x  # §0.6
        self._welford(pf, x)
        self.seen[p] += 1
        ce, cr, cs = self.last_epoch[p], self.last_rank[p], self.last_seq[p]
        newer = (epoch > ce) | ((epoch == ce) & ((rank > cr) | ((rank == cr) & (seq > cs))))
        if not newer.all():
            p, loss, epoch, rank, seq = p[newer], loss[newer], epoch[newer], rank[newer], seq[newer]
        self.last_loss[p] = loss
        self.last_epoch[p] = epoch
        self.last_rank[p] = rank
        self.last_seq[p] = seq

    def _welford(self, p: np.ndarray, x: np.ndarray) -> None:
        """One Welford step of rows ``p`` (no repeats) with their finite losses ``x``
        (docs/algorithms.md §12.1): the k-th finite record sets mean = x when k = 1, else
        d = x - mean, mean += d / k, m2 += d (x - mean); float64, in record order."""
        k = self.loss_count[p] + 1
        mean = self.loss_mean[p]
        d = x - mean  # NaN where k = 1 (no mean yet): replaced below
        new_mean = mean + d / k
        m2 = self.loss_m2[p] + d * (x - new_mean)
        first = k == 1
        new_mean[first] = x[first]
        m2[first] = 0.0
        self.loss_count[p] = k
        self.loss_mean[p] = new_mean
        self.loss_m2[p] = m2


def _scatter_into(dst: np.ndarray, dest: np.ndarray | None, column: ArrayLike) -> None:
    """``dst[dest[i]] = column[i]`` (``dst[i]`` when ``dest`` is None), chunk by chunk."""
    if dest is None:
        copy_column_into(dst, column)
        return
    if isinstance(column, np.ndarray):
        dst[dest] = column
        return
    o = 0
    for chunk in _chunked(column, pa.from_numpy_dtype(dst.dtype)).chunks:
        dst[dest[o : o + len(chunk)]] = chunk.to_numpy(zero_copy_only=False)
        o += len(chunk)


def _apply_records(
    stats: _Stats, rec: Records, pos: np.ndarray, beta2: float, on_part: Callable[[], None] | None
) -> None:
    """Apply every record to its row, in order; a block with a repeated row runs in rounds."""
    mark = np.empty(len(stats.seen), dtype=np.int64)  # only read where this block wrote it
    for k, part in enumerate(rec.parts):
        base = int(rec.offsets[k])
        columns = [column_to_numpy(part.column(name)) for name in ("loss", "epoch", "rank", "seq")]
        for lo in range(0, part.num_rows, FOLD_BLOCK_ROWS):
            hi = min(part.num_rows, lo + FOLD_BLOCK_ROWS)
            p = pos[base + lo : base + hi]
            loss, epoch, rank, seq = (c[lo:hi] for c in columns)
            ids = np.arange(base + lo, base + hi, dtype=np.int64)
            mark[p] = ids
            if (mark[p] == ids).all():  # no row twice in this block: one vectorised step
                stats.apply(p, loss, epoch, rank, seq, beta2)
                continue
            # k-th record of a row in this block goes to round k (keeps per-row order)
            order = np.argsort(p, kind="stable")
            sp = p[order]
            start = np.concatenate([[True], sp[1:] != sp[:-1]])
            first = np.maximum.accumulate(np.where(start, np.arange(len(sp)), 0))
            occurrence = np.empty(len(p), dtype=np.int64)
            occurrence[order] = np.arange(len(sp)) - first
            for r in range(int(occurrence.max()) + 1):
                sel = np.flatnonzero(occurrence == r)
                stats.apply(p[sel], loss[sel], epoch[sel], rank[sel], seq[sel], beta2)
        if on_part is not None:
            on_part()


# ---------------------------------------------------------------------------------- identity
def _identity_columns(
    old: OldTable, new: _NewRows, old_dest: np.ndarray | None, new_dest: np.ndarray
) -> dict[str, Any]:
    """shard, key and uid of the new table: the old columns themselves when no sample is new."""
    n_new = len(new)
    if n_new == 0:
        return {"shard": old.shard, "key": old.key, "uid": old.uid_column}
    names = list(old.names)
    code_of = {s: i for i, s in enumerate(names)}
    for s in new.shard_names:
        if s not in code_of:
            code_of[s] = len(names)
            names.append(s)
    n = old.n + n_new
    codes = np.empty(n, dtype=np.int32)
    uid = np.empty(n, dtype=np.uint64)
    codes[new_dest] = np.repeat(np.array([code_of[s] for s in new.shard_names], np.int32), new.group_sizes)
    uid[new_dest] = new.uid
    if old_dest is None:
        keys = new.keys
    else:
        codes[old_dest] = np.repeat(np.arange(len(old.names), dtype=np.int32), np.diff(old.starts))
        uid[old_dest] = old.uid
        keys = interleave_keys(old.key, new.keys, new.insert)
    shard = pa.DictionaryArray.from_arrays(pa.array(codes), pa.array(names, pa.string()))
    return {"shard": shard, "key": keys, "uid": uid}


def interleave_keys(
    old_keys: pa.ChunkedArray, new_keys: pa.ChunkedArray, insert: np.ndarray, *, max_pieces: int | None = None
) -> pa.ChunkedArray:
    """Old keys with the new ones inserted (``insert[j]`` old rows precede new row j; ascending).

    Zero-copy slices when the new rows fall into fewer than ``max_pieces`` places (new shards,
    a few shards; default 2^14); otherwise one take (a copy of every key string)."""
    n_old, n_new = len(old_keys), len(new_keys)
    cuts = (np.flatnonzero(np.diff(insert)) + 1).tolist()
    if len(cuts) < (_MAX_KEY_PIECES if max_pieces is None else max_pieces):
        pieces: list[pa.ChunkedArray] = []
        prev = 0
        for a, b in zip([0, *cuts], [*cuts, n_new]):
            at = int(insert[a])
            if at > prev:
                pieces.append(old_keys.slice(prev, at - prev))
            pieces.append(new_keys.slice(a, b - a))
            prev = at
        if prev < n_old:
            pieces.append(old_keys.slice(prev))
        return pa.chunked_array([c for piece in pieces for c in piece.chunks], pa.string())
    perm = np.empty(n_old + n_new, dtype=np.int64)
    new_dest = insert + np.arange(n_new)
    perm[new_dest] = n_old + np.arange(n_new)
    old_mask = np.ones(n_old + n_new, dtype=bool)
    old_mask[new_dest] = False
    perm[old_mask] = np.arange(n_old)
    both = pa.chunked_array(list(old_keys.chunks) + list(new_keys.chunks), pa.string())
    return both.take(pa.array(perm))
