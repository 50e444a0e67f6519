"""Compaction: fold loss parts into the loss table, exactly once, crash-safe.

This module owns ``table/``: the loss table (one row per sample ever recorded, sorted by
(shard, uid); docs/format.md, "Loss table") and ``table/manifest.json``, which names the current
table file *and* the parts folded into it. Both change in one atomic replacement of the
manifest, which gives the invariant everything else relies on:

* a part's records are in the table iff the manifest lists the part (exactly-once folding);
* a compaction killed at any point leaves the previous manifest (or the new one, complete), so
  a rerun folds the same parts from the same previous table and converges to the table of an
  undisturbed run;
* two compactions cannot interleave: ``locks/compact.lock`` excludes them, and the manifest's
  generation is re-checked just before publishing.

Per sample, records are applied in (epoch, rank, seq) order (parts sorted by epoch, rank and
first seq; rows of a part in seq order): ``last_loss`` is the loss of the greatest record;
``ema`` follows algorithms.md §0.6 exactly, one step ``s <- beta2 s + (1 - beta2) loss`` per
finite record in float64, starting from ``1/n_ref``. A late part (an older epoch folded after
newer ones) updates ``last_loss`` only where its record is greater, but its EMA steps are
applied when it is folded. ``n_ref`` is the ``dataset_size`` run setting, else the number of
table rows after the compaction that first folds the sample; the manifest's ``n_ref`` is the
value of the latest compaction (the planner uses it for samples never recorded).

Table files: the current one and the previous one are kept (a reader that read the previous
manifest can still open its table); older ones and leftover ``.tmp-*`` files are removed by the
next compaction. Beside each table file a keys file (``table/keys-*.arrow``, named by the
manifest) holds its key column as memory-mappable Arrow IPC: planning and the next compaction
map the keys instead of decoding them, and a plan's ``keys.arrow`` is a hard link to it.

How it stays fast at 15M rows (vectorised, no Python loop per sample): records are matched to
table rows shard by shard (the table is sorted by (shard, uid): one radix sort of the records by
shard, then a binary search inside each shard's uid range); only records of samples not yet in
the table are re-hashed (their uids verified with ``ids.sample_uids``), known samples are checked
by shard and key length; updates run part by part in blocks of at most 2^20 rows (large fresh
temporaries are slow); when no sample is new the identity columns of the old table are written
back without being copied or re-sorted.

Fault injection for tests: the environment variable ``SETA_STREAM_FAULT`` set to one of
:data:`FAULT_POINTS` makes the process SIGKILL itself at that point (see ``_fault``).
"""

from __future__ import annotations

import bisect
import json
import os
import signal
import time
import uuid
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from .errors import (
    CorruptPartError,
    InvalidInputError,
    RunLockedError,
    SampleIdCollisionError,
    ShardNameConflictError,
)
from .ids import depth_hint, sample_uids
from .record import LOCATIONS_METADATA, PART_SCHEMA, part_locations
from .runfs import FORMAT_VERSION, RunDir

__all__ = [
    "compact",
    "load_table",
    "load_table_keys",
    "folded_parts",
    "CompactionReport",
    "TABLE_SCHEMA",
    "PART_SCHEMA",
    "TABLE_WRITE_OPTIONS",
    "FAULT_POINTS",
]

TABLE_SCHEMA = pa.schema(
    [
        ("shard", pa.dictionary(pa.int32(), pa.string())),
        ("key", pa.string()),
        ("uid", pa.uint64()),
        ("last_loss", pa.float32()),
        ("last_epoch", pa.int32()),
        ("seen", pa.int32()),
        ("nonfinite", pa.int32()),
        ("ema", pa.float64()),
        ("last_rank", pa.int32()),
        ("last_seq", pa.int64()),
    ],
    metadata={b"seta_stream.format_version": str(FORMAT_VERSION).encode()},
)

#: Parquet options of table files: LZ4 reads about 4x faster than zstd here at 15M rows;
#: only the shard column is dictionary-encoded (keys are unique); no statistics for keys.
TABLE_WRITE_OPTIONS: dict[str, Any] = {
    "compression": "lz4",
    "use_dictionary": ["shard"],
    "write_statistics": [n for n in TABLE_SCHEMA.names if n != "key"],
}

MANIFEST = "table/manifest.json"
#: Schema of the table's keys file: the ``key`` column of the table file, same rows, as
#: uncompressed Arrow IPC (memory-mapped: planning reads 15M keys in milliseconds instead of
#: decoding them from Parquet, and a plan's ``keys.arrow`` is a hard link to it).
KEYS_SCHEMA = pa.schema([("key", pa.string())])
PARTS_GLOB = "losses/rank=*/epoch=*/part-*.parquet"
QUARANTINE = "losses-quarantine/"

#: Named points where ``SETA_STREAM_FAULT=<point>`` kills the compacting process (tests only):
#: after taking the lock, after reading the parts, after quarantining a corrupt part, after
#: writing the new table file, after replacing the manifest, after removing old table files.
FAULT_POINTS = (
    "compact:locked",
    "compact:after_read",
    "compact:after_quarantine",
    "compact:after_table_write",
    "compact:after_manifest",
    "compact:after_cleanup",
)

_BLOCK = 1 << 20
_SHARD_DICT = pa.dictionary(pa.int32(), pa.string())
_CORRUPT_HINT = (
    "Delete or repair it, or pass on_corrupt='skip' (CLI: --skip-corrupt) to move it to losses-quarantine/ and continue"
)


def _fault(point: str) -> None:
    """Test hook: SIGKILL this process at ``point`` if ``SETA_STREAM_FAULT`` names it."""
    if os.environ.get("SETA_STREAM_FAULT") == point:
        os.kill(os.getpid(), signal.SIGKILL)


@dataclass
class CompactionReport:
    """What one compaction did.

    ``quarantined`` lists the parts this compaction moved to ``losses-quarantine/`` (their
    original relative paths); ``generation`` is the table generation after the call.
    """

    parts_folded: int = 0
    rows_folded: int = 0
    samples_total: int = 0
    new_samples: int = 0
    nonfinite: int = 0
    quarantined: list[str] = field(default_factory=list)
    generation: int = 0
    seconds: float = 0.0


def _manifest(run: RunDir) -> dict[str, Any]:
    return dict(run.read_json(MANIFEST, default=None) or {})


def folded_parts(run: str | RunDir) -> list[str]:
    """Relative paths of the parts already folded into the current table."""
    run = run if isinstance(run, RunDir) else RunDir(run)
    return list(_manifest(run).get("folded", []))


def load_table(
    run: str | RunDir,
    columns: list[str] | None = None,
    *,
    shard_as_dictionary: bool = True,
    use_threads: bool = True,
    manifest: dict[str, Any] | None = None,
) -> pa.Table:
    """The current loss table (an empty table with TABLE_SCHEMA before the first compaction).

    The shard column is dictionary-encoded (few distinct values); ``shard_as_dictionary=False``
    returns it as plain strings. ``use_threads=False`` decodes on the calling thread only
    (for a read that runs beside other work). ``manifest``: the table manifest already read
    (several reads of one table see the same generation).
    """
    run = run if isinstance(run, RunDir) else RunDir(run)
    m = _manifest(run) if manifest is None else manifest
    if not m.get("table"):
        schema = TABLE_SCHEMA if columns is None else pa.schema([TABLE_SCHEMA.field(c) for c in columns])
        table = schema.empty_table()
    else:
        table = run.read_parquet(m["table"], columns=columns, use_threads=use_threads)
    if not shard_as_dictionary and "shard" in table.schema.names:
        i = table.schema.get_field_index("shard")
        table = table.set_column(i, "shard", table.column("shard").cast(pa.string()))
    return table


def load_table_keys(run: str | RunDir, manifest: dict[str, Any] | None = None) -> tuple[pa.ChunkedArray, str] | None:
    """The current table's ``key`` column memory-mapped from its keys file, and the file's
    path in the run; None when the table has no keys file (a table written before keys files
    existed, or the file was removed): read the keys from the table file then.

    A keys file whose row count is not the table's is not used (the table file holds the
    same keys, so nothing is lost)."""
    run = run if isinstance(run, RunDir) else RunDir(run)
    m = _manifest(run) if manifest is None else manifest
    rel = m.get("keys")
    if not rel:
        return None
    try:
        keys = run.read_arrow(rel)
    except (OSError, pa.ArrowInvalid):  # missing (FileNotFoundError) or unreadable
        return None
    if keys.schema != KEYS_SCHEMA or keys.num_rows != int(m.get("rows", -1)):
        return None
    return keys.column("key"), rel


def load_numeric(
    run: str | RunDir, columns: list[str], *, manifest: dict[str, Any] | None = None
) -> dict[str, np.ndarray]:
    """Numeric columns of the current table (or of ``manifest``'s) as contiguous NumPy arrays
    (no nulls).

    Read row group by row group into preallocated arrays, so the table's Arrow buffers and
    the NumPy copies never coexist whole (planning reads 15M rows this way).
    """
    run = run if isinstance(run, RunDir) else RunDir(run)
    fields = [TABLE_SCHEMA.field(c) for c in columns]
    m = _manifest(run) if manifest is None else manifest
    if not m.get("table"):
        return {f.name: np.zeros(0, dtype=f.type.to_pandas_dtype()) for f in fields}
    local = run.local_path(m["table"])
    if local is None:
        with run.open(m["table"]) as fh:
            remote = pq.ParquetFile(fh)
            return _read_numeric(remote, columns, fields, range(remote.num_row_groups))
    pf = pq.ParquetFile(local, memory_map=True)
    groups = pf.metadata.num_row_groups
    if groups < 4:
        return _read_numeric(pf, columns, fields, range(groups))
    # two halves of the row groups on two threads (decoding and copying release the GIL)
    out = {f.name: np.empty(pf.metadata.num_rows, dtype=f.type.to_pandas_dtype()) for f in fields}
    with ThreadPoolExecutor(2) as pool:
        halves = (range(0, groups // 2), range(groups // 2, groups))
        files = (pf, pq.ParquetFile(local, memory_map=True))
        list(pool.map(lambda h, f: _read_numeric(f, columns, fields, h, out), halves, files))
    return out


def _read_numeric(
    pf: pq.ParquetFile,
    columns: list[str],
    fields: list[pa.Field],
    groups: range,
    out: dict[str, np.ndarray] | None = None,
) -> dict[str, np.ndarray]:
    """Row groups ``groups`` of ``columns`` into ``out`` (at their row offsets), new arrays if None."""
    meta = pf.metadata
    if out is None:
        out = {f.name: np.empty(meta.num_rows, dtype=f.type.to_pandas_dtype()) for f in fields}
    o = sum(meta.row_group(i).num_rows for i in range(groups.start))
    for i in groups:
        group = pf.read_row_group(i, columns=columns, use_threads=False)
        for name in columns:
            _into(out[name][o:], group.column(name))
        o += group.num_rows
        del group
    return out


# ---------------------------------------------------------------------------------- parts
def _read_part(run: RunDir, rel: str) -> pa.Table:
    """Read and validate one part: PART_SCHEMA columns, shard dictionary-encoded."""
    where = run.display(rel)
    try:
        local = run.local_path(rel)
        if local is not None:
            pf = pq.ParquetFile(local, memory_map=True, read_dictionary=["shard"])
            schema = pf.schema_arrow
            table = pf.read()
        else:
            with run.open(rel) as fh:
                pf = pq.ParquetFile(fh, read_dictionary=["shard"])
                schema = pf.schema_arrow
                table = pf.read()
    except Exception as exc:  # pyarrow raises ArrowInvalid/OSError for truncated files
        raise CorruptPartError(
            f"{where}: cannot be read as Parquet ({type(exc).__name__}: {exc}); expected a "
            f"complete part written by LossRecorder (a truncated or foreign file?). {_CORRUPT_HINT}",
            path=rel,
        ) from exc
    version = (schema.metadata or {}).get(b"seta_stream.format_version")
    if version is None:
        raise CorruptPartError(
            f"{where}: no 'seta_stream.format_version' metadata; expected a part written by "
            f"LossRecorder (this file was written by another tool). {_CORRUPT_HINT}",
            path=rel,
        )
    try:
        v = int(version)
    except ValueError:
        v = -1
    if not 1 <= v <= FORMAT_VERSION:
        raise CorruptPartError(
            f"{where}: part format version {version.decode(errors='replace')!r}, this seta_stream "
            f"reads versions 1..{FORMAT_VERSION}; upgrade seta_stream to fold it. {_CORRUPT_HINT}",
            path=rel,
        )
    found = {f.name: (f.type.value_type if pa.types.is_dictionary(f.type) else f.type) for f in schema}
    problems = []
    for f in PART_SCHEMA:
        if f.name not in found:
            problems.append(f"missing column {f.name!r} ({f.type})")
        elif found[f.name] != f.type and not (f.type == pa.string() and found[f.name] == pa.large_string()):
            problems.append(f"column {f.name!r} is {found[f.name]}, expected {f.type}")
    if problems:
        raise CorruptPartError(f"{where}: wrong schema: {'; '.join(problems)}. {_CORRUPT_HINT}", path=rel)
    table = table.select(PART_SCHEMA.names)
    nulls = [name for name in PART_SCHEMA.names if name != "loss" and table.column(name).null_count]
    if nulls:
        raise CorruptPartError(
            f"{where}: null values in column(s) {nulls}; expected none (only 'loss' may be NaN). {_CORRUPT_HINT}",
            path=rel,
        )
    shard = table.column("shard")
    if not pa.types.is_dictionary(shard.type):
        shard = pc.dictionary_encode(shard)
    table = table.set_column(0, "shard", shard.cast(_SHARD_DICT))
    if table.column("key").type != pa.string():
        table = table.set_column(1, "key", table.column("key").cast(pa.string()))
    try:
        locations = part_locations(schema)
    except ValueError as exc:
        raise CorruptPartError(
            f"{where}: its shard locations metadata is not valid JSON ({exc}). {_CORRUPT_HINT}", path=rel
        ) from exc
    # keep only the locations metadata: compaction checks names against it
    raw = {LOCATIONS_METADATA: json.dumps(locations).encode()} if locations else None
    return table.replace_schema_metadata(raw)


def _check_locations(run: RunDir, known: dict[str, str], parts: list[pa.Table], names: list[str]) -> dict[str, str]:
    """{shard: location} of the table after folding ``parts``; raises
    :class:`ShardNameConflictError` (before anything is written) if one shard name stands for
    two locations: two different shards whose samples would be merged."""
    merged = dict(known)
    where = {name: "the loss table (" + run.display(MANIFEST) + ")" for name in known}
    for part, rel in zip(parts, names):
        for shard, location in part_locations(part.schema).items():
            other = merged.setdefault(shard, location)
            where.setdefault(shard, run.display(rel))
            if other != location:
                raise ShardNameConflictError(
                    f"shard name {shard!r} stands for two shards: {other!r} (in {where[shard]}) and {location!r} "
                    f"(in {run.display(rel)}); their samples would be merged into one table row per key, so "
                    f"nothing was compacted. {depth_hint(other, location)}; the parts recorded under the "
                    f"conflicting name stay in {run.display('losses')}"
                )
    return merged


def _part_order(rel: str) -> tuple[int, int, str]:
    # losses/rank=R/epoch=E/part-R..-E..-{seq0:020d}-token: fold in (epoch, rank, seq) order
    rank = int(rel.split("rank=", 1)[1].split("/", 1)[0])
    epoch = int(rel.split("epoch=", 1)[1].split("/", 1)[0])
    return (epoch, rank, rel.rsplit("/", 1)[1])


def _np(col: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """A numeric column without nulls as one NumPy array (zero-copy for a single chunk)."""
    if isinstance(col, pa.ChunkedArray):
        if col.num_chunks == 1:
            return col.chunk(0).to_numpy(zero_copy_only=False)
        return col.to_numpy()
    return col.to_numpy(zero_copy_only=False)


def _into(dst: np.ndarray, col: pa.ChunkedArray) -> None:
    """Copy a numeric column into ``dst[:len(col)]`` chunk by chunk (no whole-column temporary)."""
    o = 0
    for chunk in col.chunks:
        n = len(chunk)
        dst[o : o + n] = chunk.to_numpy(zero_copy_only=False)
        o += n


def _key_lengths(col: pa.ChunkedArray) -> np.ndarray:
    """UTF-8 byte length of every string (int32), from the offsets buffers, no string copies."""
    out = np.empty(len(col), dtype=np.int32)
    o = 0
    for chunk in col.chunks:
        n = len(chunk)
        if n:
            width = np.int64 if pa.types.is_large_string(chunk.type) else np.int32
            offsets = np.frombuffer(chunk.buffers()[1], dtype=width)[chunk.offset : chunk.offset + n + 1]
            np.subtract(offsets[1:], offsets[:-1], out=out[o : o + n], casting="unsafe")
        o += n
    return out


class _Records:
    """The pending parts' records: per-part NumPy views (loss, epoch, rank, seq) plus global
    shard codes, uids and key lengths. Key strings are not kept (they are re-read from the
    parts only for samples new to the table)."""

    def __init__(self, run: RunDir, parts: list[pa.Table], names: list[str]) -> None:
        self.run = run
        self.names = names
        self.offsets = np.cumsum([0] + [p.num_rows for p in parts]).astype(np.int64)
        self.n = int(self.offsets[-1])
        code_of: dict[str, int] = {}  # one shard dictionary for all records
        self.code = np.empty(self.n, dtype=np.int32)
        self.uid = np.empty(self.n, dtype=np.uint64)
        self.keylen = np.empty(self.n, dtype=np.int32)
        self.parts: list[pa.Table] = []
        for k, part in enumerate(parts):
            o = int(self.offsets[k])
            for chunk in part.column("shard").chunks:
                n = len(chunk)
                if n:
                    lut = np.array(
                        [code_of.setdefault(s, len(code_of)) for s in chunk.dictionary.to_pylist()], np.int32
                    )
                    self.code[o : o + n] = lut[chunk.indices.to_numpy(zero_copy_only=False)]
                o += n
            o = int(self.offsets[k])
            _into(self.uid[o:], part.column("uid"))
            self.keylen[o : o + part.num_rows] = _key_lengths(part.column("key"))
            self.parts.append(part.select(["loss", "epoch", "rank", "seq"]))
        self.shard_names: list[str] = list(code_of)

    def part_index(self, i: int) -> int:
        return int(np.searchsorted(self.offsets, i, side="right")) - 1

    def part_of(self, i: int) -> str:
        return self.names[self.part_index(i)]

    def shard(self, i: int) -> str:
        return self.shard_names[int(self.code[i])]

    def key(self, i: int) -> str:
        return str(self.take_keys(np.array([i], dtype=np.int64))[0].as_py())

    def take_keys(self, idx: np.ndarray) -> pa.ChunkedArray:
        """Key strings of records ``idx`` (ascending), re-read from their parts."""
        chunks = []
        cut = np.searchsorted(idx, self.offsets)
        for k in np.flatnonzero(np.diff(cut) > 0).tolist():
            local = idx[cut[k] : cut[k + 1]] - self.offsets[k]
            keys = self.run.read_parquet(self.names[k], columns=["key"]).column("key")
            chunks.extend(keys.take(pa.array(local)).cast(pa.string()).chunks)
        return pa.chunked_array(chunks, pa.string())


class _OldTable:
    """The current table's identity columns and shard runs (the table is sorted by shard)."""

    def __init__(self, run: RunDir, m: dict[str, Any]) -> None:
        rel = m.get("table")
        self.rel = rel
        self.keys_rel: str | None = None  # the keys file the key column was mapped from, if any
        table = None
        if rel:
            keys = load_table_keys(run, m)
            if keys is None:
                table = run.read_parquet(rel, columns=["shard", "key", "uid"])
            else:  # the keys memory-mapped from the keys file, not decoded from Parquet
                t = run.read_parquet(rel, columns=["shard", "uid"])
                table = pa.table({"shard": t.column("shard"), "key": keys[0], "uid": t.column("uid")})
                self.keys_rel = keys[1]
        self.table = table
        self.n = 0 if table is None else table.num_rows
        self.names: list[str] = []  # run r covers rows [starts[r], starts[r+1]) of shard names[r]
        self.starts = np.zeros(1, dtype=np.int64)
        self.uid = np.zeros(0, dtype=np.uint64)
        if table is None or self.n == 0:
            return
        shard = table.column("shard")
        o = 0
        names: list[str] = []
        starts: list[int] = []
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
        self.names = names
        self.starts = np.array(starts + [self.n], dtype=np.int64)
        self.uid = _np(table.column("uid"))


def _match(old: _OldTable, rec: _Records) -> np.ndarray:
    """Table row of every record (-1 where the sample is not in the table), shard by shard."""
    if old.n == 0 or rec.n == 0:
        return np.full(rec.n, -1, dtype=np.int64)
    run_of = {name: r for r, name in enumerate(old.names)}
    n_runs = len(old.names)
    lut = np.array([run_of.get(s, n_runs) for s in rec.shard_names], dtype=np.int64)
    group = lut.astype(np.uint16 if n_runs < (1 << 16) else np.int64)[rec.code]
    order = np.argsort(group, kind="stable")  # a radix sort for uint16
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


def _check_known(old: _OldTable, rec: _Records, pos: np.ndarray) -> None:
    """Records matched to a table row (same shard, same uid) must have that row's key length."""
    assert old.table is not None
    table_keylen = _key_lengths(old.table.column("key"))
    for lo in range(0, rec.n, _BLOCK):
        p = pos[lo : lo + _BLOCK]
        m = p >= 0
        bad = np.flatnonzero(table_keylen[p[m]] != rec.keylen[lo : lo + _BLOCK][m])
        if len(bad):
            i = lo + int(np.flatnonzero(m)[bad[0]])
            row = int(pos[i])
            shard = rec.shard(i)
            raise _collision(
                f"{(shard, rec.key(i))!r} (recorded in {rec.part_of(i)}) has uid {int(rec.uid[i]):#018x}, "
                f"which the table already holds for {(shard, str(old.table.column('key')[row].as_py()))!r}"
            )


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


def _new_samples(old: _OldTable, rec: _Records, pos: np.ndarray) -> _NewRows:
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
    names = pa.array(rec.shard_names, pa.string())
    for lo in range(0, len(ni), _BLOCK):
        idx = ni[lo : lo + _BLOCK]
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
                f"corrupted. Re-record it with LossRecorder. {_CORRUPT_HINT}",
                path=rec.part_of(i),
            )
    # group by shard name (a radix sort of the name ranks keeps record order within a shard),
    # then sort each shard's uids: new rows come out in table order, (shard, uid)
    name_rank = np.empty(len(rec.shard_names), dtype=np.int64)
    name_rank[np.argsort(np.array(rec.shard_names, dtype=object), kind="stable")] = np.arange(len(rec.shard_names))
    codes = rec.code[ni]
    ranks = name_rank[codes]
    order = np.argsort(ranks.astype(np.uint16) if len(name_rank) < (1 << 16) else ranks, kind="stable")
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
    rows = _NewRows(
        np.concatenate(uids),
        ni[first_in_ni],
        group_names,
        np.array(sizes, np.int64),
        np.concatenate(inserts),
        keys.take(pa.array(first_in_ni)),
    )
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
    # a new uid must not exist elsewhere: in another shard of this compaction or of the table
    clash = _first_clash(rows.uid, old.uid)
    if clash is not None:
        u = int(clash)
        k = np.flatnonzero(rows.uid == clash)
        i = int(rows.first[k[0]])
        in_table = np.flatnonzero(old.uid == clash)
        if len(in_table):
            assert old.table is not None
            row = int(in_table[0])
            other = (str(old.table.column("shard")[row].as_py()), str(old.table.column("key")[row].as_py()))
            found = f"which the table already holds for {other!r}"
        else:
            j = int(rows.first[k[1]])
            found = f"which {(rec.shard(j), rec.key(j))!r} (recorded in {rec.part_of(j)}) also has"
        raise _collision(f"{(rec.shard(i), rec.key(i))!r} (recorded in {rec.part_of(i)}) has uid {u:#018x}, {found}")
    pos[ni] = -1 - row_of  # new rows are encoded as -1 - (index among the new rows)
    return rows


# ---------------------------------------------------------------------------------- folding
class _Stats:
    """The new table's per-sample statistics as writable NumPy arrays, in the new row order."""

    def __init__(
        self,
        run: RunDir,
        old_rel: str | None,
        n_old: int,
        old_dest: np.ndarray | None,
        new_dest: np.ndarray,
        n_ref: int,
    ) -> None:
        n = n_old + len(new_dest)
        self.last_loss = np.empty(n, np.float32)
        self.last_epoch = np.empty(n, np.int32)
        self.seen = np.empty(n, np.int32)
        self.nonfinite = np.empty(n, np.int32)
        self.ema = np.empty(n, np.float64)
        self.last_rank = np.empty(n, np.int32)
        self.last_seq = np.empty(n, np.int64)
        for name in ("last_loss", "last_epoch", "seen", "nonfinite", "ema", "last_rank", "last_seq"):
            if n_old:  # one column at a time: never the old column and its copy of every column
                assert old_rel is not None
                column = run.read_parquet(old_rel, columns=[name]).column(name)
                arr = getattr(self, name)
                if old_dest is None:
                    _into(arr, column)
                else:
                    o = 0
                    for chunk in column.chunks:
                        arr[old_dest[o : o + len(chunk)]] = chunk.to_numpy(zero_copy_only=False)
                        o += len(chunk)
        # never-recorded start values: every new row gets at least one record below
        self.last_loss[new_dest] = np.nan
        self.last_epoch[new_dest] = np.iinfo(np.int32).min
        self.last_rank[new_dest] = np.iinfo(np.int32).min
        self.last_seq[new_dest] = np.iinfo(np.int64).min
        self.seen[new_dest] = 0
        self.nonfinite[new_dest] = 0
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
        self.ema[pf] = beta2 * self.ema[pf] + (1.0 - beta2) * lf.astype(np.float64)  # §0.6
        self.seen[p] += 1
        ce, cr, cs = self.last_epoch[p], self.last_rank[p], self.last_seq[p]
        newer = (epoch > ce) | ((epoch == ce) & ((rank > cr) | ((rank == cr) & (seq > cs))))
        if not newer.all():
            p, loss, epoch, rank, seq = p[newer], loss[newer], epoch[newer], rank[newer], seq[newer]
        self.last_loss[p] = loss
        self.last_epoch[p] = epoch
        self.last_rank[p] = rank
        self.last_seq[p] = seq

    def columns(self) -> dict[str, np.ndarray]:
        names = ("last_loss", "last_epoch", "seen", "nonfinite", "ema", "last_rank", "last_seq")
        return {n: getattr(self, n) for n in names}


def _fold_records(stats: _Stats, rec: _Records, pos: np.ndarray, beta2: float, progress: Any) -> None:
    """Apply every record to its row, in order; a block with a repeated row runs in rounds."""
    mark = np.empty(len(stats.seen), dtype=np.int64)  # only read where this block wrote it
    for k, part in enumerate(rec.parts):
        base = int(rec.offsets[k])
        loss_all = _np(part.column("loss"))
        epoch_all = _np(part.column("epoch"))
        rank_all = _np(part.column("rank"))
        seq_all = _np(part.column("seq"))
        for lo in range(0, part.num_rows, _BLOCK):
            hi = min(part.num_rows, lo + _BLOCK)
            p = pos[base + lo : base + hi]
            loss, epoch, rank, seq = loss_all[lo:hi], epoch_all[lo:hi], rank_all[lo:hi], seq_all[lo:hi]
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
        if progress is not None:
            progress.update(1)


_MAX_KEY_PIECES = 1 << 14


def _interleave(old_keys: pa.ChunkedArray, new_keys: pa.ChunkedArray, insert: np.ndarray) -> pa.ChunkedArray:
    """Old keys with the new ones inserted (``insert[j]`` old rows precede new row j).

    Zero-copy slices when the new rows fall into few places (new shards, a few shards);
    otherwise one take (a copy of every key string)."""
    n_old, n_new = len(old_keys), len(new_keys)
    cuts = (np.flatnonzero(np.diff(insert)) + 1).tolist()
    if len(cuts) < _MAX_KEY_PIECES:
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


def _fold(run: RunDir, m: dict[str, Any], rec: _Records, progress: Any) -> tuple[pa.Table, int, int, str | None]:
    """(new table, number of new samples, n_ref, keys file): the table of manifest ``m`` updated
    with the records, and the old table's keys file when it holds the new table's keys too (no
    new sample, and the old keys were mapped from it), else None.

    Rows are addressed in the new table's order from the start: old row i moves to
    ``old_dest[i]`` (identity when no sample is new), new row j to ``new_dest[j]``.
    """
    beta2 = float(run.settings["ema_beta2"])
    old_rel = m.get("table")
    old = _OldTable(run, m)
    pos = _match(old, rec)
    if old.n:
        _check_known(old, rec, pos)
    new = _new_samples(old, rec, pos)  # pos of new records: index among the new rows
    n_new = len(new)
    new_dest = new.insert + np.arange(n_new, dtype=np.int64)
    old_dest: np.ndarray | None = None
    if n_new and old.n:
        old_dest = np.arange(old.n, dtype=np.int64)
        old_dest += np.searchsorted(new.insert, old_dest, side="right")
    if n_new:  # record -> row of the new table
        for lo in range(0, rec.n, _BLOCK):
            p = pos[lo : lo + _BLOCK]
            is_new = p < 0
            if old_dest is not None:
                p[~is_new] = old_dest[p[~is_new]]
            p[is_new] = new_dest[-1 - p[is_new]]
    dataset_size = run.settings.get("dataset_size")
    n_ref = int(dataset_size) if dataset_size else old.n + n_new
    stats = _Stats(run, old_rel, old.n, old_dest, new_dest, n_ref)
    _fold_records(stats, rec, pos, beta2, progress)
    del pos

    if n_new == 0:
        if old.table is None:  # nothing recorded and nothing compacted yet
            return TABLE_SCHEMA.empty_table(), 0, n_ref, None
        identity = {name: old.table.column(name) for name in ("shard", "key", "uid")}
        table = pa.Table.from_pydict({**identity, **stats.columns()}, schema=TABLE_SCHEMA)
        return table, 0, n_ref, old.keys_rel
    # identity columns in the new order
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
        assert old.table is not None
        codes[old_dest] = np.repeat(np.arange(len(old.names), dtype=np.int32), np.diff(old.starts))
        uid[old_dest] = old.uid
        keys = _interleave(old.table.column("key"), new.keys, new.insert)
    del old, new  # the old key strings are not needed while the new table is written
    shard = pa.DictionaryArray.from_arrays(pa.array(codes), pa.array(names, pa.string()))
    table = pa.Table.from_pydict({"shard": shard, "key": keys, "uid": uid, **stats.columns()}, schema=TABLE_SCHEMA)
    return table, n_new, n_ref, None


# ---------------------------------------------------------------------------------- compact
def compact(
    run: str | RunDir,
    *,
    on_corrupt: Literal["raise", "skip"] = "raise",
    progress: bool = False,
    lock_wait: float = 0.0,
) -> CompactionReport:
    """Fold every loss part not yet in the table into a new table and publish it.

    Holds ``locks/compact.lock`` (waits up to ``lock_wait`` seconds for another compaction,
    then raises :class:`RunLockedError`). ``on_corrupt="raise"`` raises
    :class:`CorruptPartError` naming the first unreadable or foreign part and changes nothing;
    ``on_corrupt="skip"`` moves such parts to ``losses-quarantine/`` (listed in the report and
    the manifest) and folds the others. Safe to rerun at any time: without new parts it
    changes nothing.
    """
    if on_corrupt not in ("raise", "skip"):
        raise InvalidInputError(f"on_corrupt must be 'raise' or 'skip', found {on_corrupt!r}")
    run = run if isinstance(run, RunDir) else RunDir(run)
    t0 = time.perf_counter()
    with run.lock("compact", wait=lock_wait):
        _fault("compact:locked")
        m = _manifest(run)
        generation = int(m.get("generation", 0))
        folded = list(m.get("folded", []))
        folded_set = set(folded)
        pending = sorted((p for p in run.glob(PARTS_GLOB) if p not in folded_set), key=_part_order)
        report = CompactionReport(generation=generation, samples_total=int(m.get("rows", 0)))
        if not pending:  # still finish the cleanup of a compaction killed after publishing
            _cleanup(run, keep={m.get(f) for f in ("table", "previous_table", "keys", "previous_keys")})
            report.seconds = time.perf_counter() - t0
            return report
        bar = _progress(progress, len(pending))
        parts: list[pa.Table] = []
        good: list[str] = []
        for rel in pending:
            try:
                parts.append(_read_part(run, rel))
                good.append(rel)
            except CorruptPartError:
                if on_corrupt == "raise":
                    raise
                run.move(rel, QUARANTINE + rel[len("losses/") :])
                report.quarantined.append(rel)
                _fault("compact:after_quarantine")
            if bar is not None:
                bar.update(1)
        locations = _check_locations(run, m.get("shard_locations") or {}, parts, good)
        _fault("compact:after_read")
        rec = _Records(run, parts, good)
        del parts  # the records keep no key strings
        while True:
            if bar is not None:
                bar.reset(total=len(good))
                bar.set_description("compact: folding parts")
            try:
                new_table, new_samples, n_ref, same_keys = _fold(run, m, rec, bar)
                break
            except CorruptPartError as exc:  # a part whose uids are not the hash of its ids
                if on_corrupt == "raise" or exc.path not in good:
                    raise
                good.remove(exc.path)
                run.move(exc.path, QUARANTINE + exc.path[len("losses/") :])
                report.quarantined.append(exc.path)
                _fault("compact:after_quarantine")
                rec = _Records(run, [_read_part(run, rel) for rel in good], good)
        if bar is not None:
            bar.close()
        report.parts_folded = len(good)
        report.rows_folded = rec.n
        report.nonfinite = sum(int(pc.sum(pc.is_nan(p.column("loss"))).as_py() or 0) for p in rec.parts)
        del rec
        report.new_samples = new_samples
        report.samples_total = new_table.num_rows

        gen = generation + 1
        token = uuid.uuid4().hex[:8]
        table_rel = f"table/table-{gen:06d}-{token}.parquet"
        run.publish_parquet(table_rel, new_table, **TABLE_WRITE_OPTIONS)
        if same_keys is not None:
            keys_rel = same_keys  # same rows, same keys: the keys file stays
        else:
            keys_rel = f"table/keys-{gen:06d}-{token}.arrow"
            run.publish_arrow(keys_rel, pa.table({"key": new_table.column("key")}, schema=KEYS_SCHEMA))
        _fault("compact:after_table_write")
        current = int(_manifest(run).get("generation", 0))
        if current != generation:
            run.remove(table_rel)
            if keys_rel != m.get("keys"):
                run.remove(keys_rel)
            raise RunLockedError(
                f"{run.display(MANIFEST)} changed while compacting: generation {current}, expected "
                f"{generation} (another compaction published meanwhile, its lock broken or not "
                "honoured by the storage); this result was discarded and nothing was lost. Run "
                "compact again, and run one compaction at a time"
            )
        manifest = {
            "generation": gen,
            "table": table_rel,
            "previous_table": m.get("table"),
            "keys": keys_rel,
            "previous_keys": m.get("keys"),
            "rows": new_table.num_rows,
            "folded": folded + good,
            "quarantined": _quarantined(run, m),
            "n_ref": n_ref or int(m.get("n_ref") or 0),
            "shard_locations": {s: locations[s] for s in sorted(locations)},
            "format_version": FORMAT_VERSION,
        }
        run.publish_json(MANIFEST, manifest)
        _fault("compact:after_manifest")
        _cleanup(run, keep={table_rel, m.get("table"), keys_rel, m.get("keys")})
        _fault("compact:after_cleanup")
        report.generation = gen
        report.seconds = time.perf_counter() - t0
        return report


def _progress(enabled: bool, total: int) -> Any:
    if not enabled:
        return None
    from tqdm import tqdm

    return tqdm(total=total, desc="compact: reading parts", unit="part")


def _quarantined(run: RunDir, m: dict[str, Any]) -> list[str]:
    """Every part ever quarantined (original paths), also those of a killed compaction."""
    listed = set(m.get("quarantined", []))
    listed.update("losses/" + p[len(QUARANTINE) :] for p in run.glob(QUARANTINE + "rank=*/epoch=*/*.parquet"))
    return sorted(listed)


def _cleanup(run: RunDir, keep: Iterable[Any]) -> None:
    """Remove table and keys files other than ``keep`` and temporaries of killed compactions
    (the compaction lock is held, so no other writer is using them)."""
    keep_set = set(keep)
    for rel in run.glob("table/table-*.parquet") + run.glob("table/keys-*.arrow") + run.glob("table/.tmp-*"):
        if rel not in keep_set:
            run.remove(rel)


def _sort_by_shard(table: pa.Table) -> pa.Table:
    """Order rows by (shard, uid) (used to build tables directly, e.g. in benchmarks)."""
    shard = table.column("shard")
    enc = (shard if pa.types.is_dictionary(shard.type) else pc.dictionary_encode(shard)).cast(_SHARD_DICT)
    enc = enc.combine_chunks() if isinstance(enc, pa.ChunkedArray) else enc
    names = enc.dictionary.to_pylist()
    rank = np.empty(len(names), dtype=np.int64)
    rank[np.argsort(np.array(names, dtype=object), kind="stable")] = np.arange(len(names))
    codes = rank[enc.indices.to_numpy(zero_copy_only=False)]
    perm = np.lexsort((_np(table.column("uid")), codes))
    return table.take(pa.array(perm)).combine_chunks()
