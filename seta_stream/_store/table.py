"""The loss table: ``table/`` (table files, keys files, manifest), written and read here.

docs/format.md, "Loss table", is the authority. The table holds one row per sample ever
recorded, sorted by (shard, uid) (TABLE_SCHEMA); ``table/manifest.json`` names the current
table file, its keys file *and* the loss parts folded into it. Both change in one atomic
replacement of the manifest, which gives the invariant everything else relies on: a part's
records are in the table iff the manifest lists the part.

Readers: :func:`load_table`, :func:`load_numeric` (numeric columns as NumPy arrays, for
planning), :func:`load_table_keys` (the key column memory-mapped from the keys file),
:func:`folded_parts`, and :func:`read_identity` / :func:`read_column` (compaction's view of the
old table). Writers (called by ``compaction`` under its lock): :func:`publish_table` (a new
table file and its keys file), :func:`publish_manifest`, :func:`remove_table_files_except`.

Table files: the current one and the previous one are kept (a reader that read the previous
manifest can still open its table); older ones and leftover ``.tmp-*`` files are removed by the
next compaction. Beside each table file a keys file (``table/keys-*.arrow``) holds its key
column as memory-mappable Arrow IPC: planning and the next compaction map the keys instead of
decoding them.

``compact``, ``CompactionReport`` and ``FAULT_POINTS`` live in ``compaction``; they are also
importable from here, as they were before compaction had its own module.
"""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from .._kernels.arrays import copy_column_into, numpy_dtype, shard_runs
from ..errors import RunFormatError
from .layout import MANIFEST, TABLE_GLOBS, bucket_keys_file, bucket_table_file, keys_file, table_file, table_folder
from .parts import PART_SCHEMA
from .runfs import RunDir

__all__ = [
    "TableBucket",
    "table_buckets",
    "bucket_keys",
    "PartitionedTableWriter",
    "BucketTarget",
    "publish_bucket",
    "table_locations",
    "load_table",
    "load_table_keys",
    "load_numeric",
    "read_bucket_numeric",
    "folded_parts",
    "TABLE_SCHEMA",
    "PART_SCHEMA",
    "KEYS_SCHEMA",
    "MANIFEST",
    "TABLE_WRITE_OPTIONS",
    "read_manifest",
    "read_identity",
    "read_bucket",
    "read_rows",
    "empty_table",
    "read_column",
    "publish_table",
    "SHARD_RUNS_META",
    "ShardRuns",
    "table_shard_runs",
    "with_shard_runs",
    "make_manifest",
    "publish_manifest",
    "remove_table_files_except",
    "manifest_files",
    "HISTORY_COLUMNS",
    "absent_column",
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
        ("loss_count", pa.int32()),
        ("loss_mean", pa.float64()),
        ("loss_m2", pa.float64()),
    ],
    metadata={b"seta_stream.format_version": b"1"},  # a bucket's file is a version-1 table file
)

#: The per-sample loss history (docs/format.md, "Loss table"): table files written before these
#: columns existed lack them, and every reader here gives their rows the values of a sample
#: with no finite record folded since (``loss_count`` 0, ``loss_mean`` and ``loss_m2`` NaN).
HISTORY_COLUMNS: tuple[str, ...] = ("loss_count", "loss_mean", "loss_m2")
_ABSENT: dict[str, Any] = {"loss_count": 0, "loss_mean": np.nan, "loss_m2": np.nan}

#: Parquet options of table files: LZ4 reads about 4x faster than zstd here at 15M rows;
#: only the shard column is dictionary-encoded (keys are unique); no statistics for keys.
TABLE_WRITE_OPTIONS: dict[str, Any] = {
    "compression": "lz4",
    "use_dictionary": ["shard"],
    "write_statistics": [n for n in TABLE_SCHEMA.names if n != "key"],
}

#: Schema metadata of a table file: its shards in row order and each one's row count, as JSON
#: ``{"names": [...], "rows": [...]}`` (docs/format.md, "Loss table"). Planning takes the
#: plan's shard ranges from it instead of decoding the 15M-row shard column (0.3 s of CPU beside
#: the policy at 15M rows, which the policy's two-core sort waited for).
SHARD_RUNS_META = b"seta_stream.shard_runs"

#: Schema of the table's keys file: the ``key`` column of the table file, same rows, as
#: uncompressed Arrow IPC (memory-mapped: planning reads 15M keys in milliseconds instead of
#: decoding them from Parquet).
KEYS_SCHEMA = pa.schema([("key", pa.string())])


# ---------------------------------------------------------------------------------- reading
@dataclass(frozen=True)
class TableBucket:
    """One bucket of a loss table: its Parquet file, its keys file (None: it has none) and its
    row count. A version-1 table is one bucket."""

    table: str
    keys: str | None
    rows: int


def table_buckets(manifest: dict[str, Any]) -> list[TableBucket]:
    """The buckets of ``manifest``'s table, in bucket order: one for a version-1 manifest
    (``table`` is a file), ``buckets`` for a partitioned one (``table`` is a folder); [] before
    the first compaction."""
    if not manifest.get("table"):
        return []
    if "buckets" not in manifest:
        return [TableBucket(manifest["table"], manifest.get("keys"), int(manifest.get("rows", 0)))]
    folder, keys, rows = manifest["table"], manifest["keys"], manifest["bucket_rows"]
    return [TableBucket(bucket_table_file(folder, b), keys[b], int(rows[b])) for b in range(int(manifest["buckets"]))]


def read_manifest(run: RunDir) -> dict[str, Any]:
    """The table manifest ({} before the first compaction)."""
    return dict(run.read_json(MANIFEST, default=None) or {})


def table_locations(run: RunDir) -> dict[str, str]:
    """{shard name: location} of every shard in the loss table (docs/format.md, "Loss table")."""
    return dict(read_manifest(run).get("shard_locations") or {})


def folded_parts(run: str | RunDir) -> list[str]:
    """Relative paths of the parts already folded into the current table."""
    run = run if isinstance(run, RunDir) else RunDir(run)
    return list(read_manifest(run).get("folded", []))


def empty_table(columns: list[str] | None = None) -> pa.Table:
    """An empty table with TABLE_SCHEMA's ``columns`` (all of them by default)."""
    schema = TABLE_SCHEMA if columns is None else pa.schema([TABLE_SCHEMA.field(c) for c in columns])
    return schema.empty_table()


def absent_column(name: str, n: int) -> np.ndarray:
    """The history column ``name`` (:data:`HISTORY_COLUMNS`) of ``n`` rows of a table file
    written before it existed: the value of a sample with no finite record."""
    return np.full(n, _ABSENT[name], dtype=numpy_dtype(TABLE_SCHEMA.field(name).type))


def _file_columns(run: RunDir, rel: str) -> list[str]:
    """The column names of a table file (its Parquet footer only)."""
    local = run.local_path(rel)
    if local is not None:
        return list(pq.read_schema(local).names)
    with run.open(rel) as fh:
        return list(pq.read_schema(fh).names)


def _read_table_file(run: RunDir, rel: str, columns: list[str] | None, **options: Any) -> pa.Table:
    """``columns`` (all: None) of one table file, in that order; the history columns of a file
    written before they existed are filled (:func:`absent_column`)."""
    if columns is None:
        t = run.read_parquet(rel, **options)
        absent = [c for c in HISTORY_COLUMNS if c not in t.column_names]
    elif any(c in HISTORY_COLUMNS for c in columns):
        try:
            return run.read_parquet(rel, columns=columns, **options)
        except pa.ArrowInvalid:  # "No match for FieldRef": a file without the history columns
            present = set(_file_columns(run, rel))
            absent = [c for c in columns if c in HISTORY_COLUMNS and c not in present]
            if not absent:
                raise
        t = run.read_parquet(rel, columns=[c for c in columns if c not in absent], **options)
    else:
        return run.read_parquet(rel, columns=columns, **options)
    for name in absent:
        t = t.append_column(TABLE_SCHEMA.field(name), pa.array(absent_column(name, t.num_rows)))
    names = list(TABLE_SCHEMA.names) if columns is None else list(columns)
    return t if t.column_names == names else t.select(names)


def load_table(
    run: str | RunDir,
    columns: list[str] | None = None,
    *,
    shard_as_dictionary: bool = True,
    use_threads: bool = True,
    manifest: dict[str, Any] | None = None,
) -> pa.Table:
    """The current loss table (an empty table with TABLE_SCHEMA before the first compaction);
    the buckets of a partitioned table one after the other.

    The shard column is dictionary-encoded (few distinct values); ``shard_as_dictionary=False``
    returns it as plain strings. ``use_threads=False`` decodes on the calling thread only
    (for a read that runs beside other work). ``manifest``: the table manifest already read
    (several reads of one table see the same generation).
    """
    run = run if isinstance(run, RunDir) else RunDir(run)
    m = read_manifest(run) if manifest is None else manifest
    buckets = table_buckets(m)
    if not buckets:
        table = empty_table(columns)
    else:
        parts = [_read_table_file(run, b.table, columns, use_threads=use_threads) for b in buckets]
        table = parts[0] if len(parts) == 1 else pa.concat_tables(parts)
    if not shard_as_dictionary and "shard" in table.schema.names:
        i = table.schema.get_field_index("shard")
        table = table.set_column(i, "shard", table.column("shard").cast(pa.string()))
    return table


def bucket_keys(run: RunDir, bucket: TableBucket) -> pa.ChunkedArray | None:
    """A bucket's ``key`` column memory-mapped from its keys file; None when it has no usable
    keys file (written before keys files existed, removed, unreadable, or another row count
    than the bucket's): read the keys from the table file then (it holds the same keys)."""
    if not bucket.keys:
        return None
    try:
        keys = run.read_arrow(bucket.keys)
    except (OSError, pa.ArrowInvalid):  # missing (FileNotFoundError) or unreadable
        return None
    if keys.schema != KEYS_SCHEMA or keys.num_rows != bucket.rows:
        return None
    return keys.column("key")


def load_table_keys(run: str | RunDir, manifest: dict[str, Any] | None = None) -> pa.ChunkedArray | None:
    """The current table's ``key`` column (buckets in order) memory-mapped from its keys
    files; None when a bucket has no usable keys file (:func:`bucket_keys`) or there is no
    table: read the keys from the table files then."""
    run = run if isinstance(run, RunDir) else RunDir(run)
    m = read_manifest(run) if manifest is None else manifest
    buckets = table_buckets(m)
    if not buckets:
        return None
    chunks: list[pa.Array] = []
    for bucket in buckets:
        keys = bucket_keys(run, bucket)
        if keys is None:
            return None
        chunks.extend(keys.chunks)
    return pa.chunked_array(chunks, pa.string())


def load_numeric(
    run: str | RunDir,
    columns: list[str],
    *,
    manifest: dict[str, Any] | None = None,
    dtypes: dict[str, Any] | None = None,
) -> dict[str, np.ndarray]:
    """Numeric columns of the current table (or of ``manifest``'s) as contiguous NumPy arrays
    (no nulls), the buckets one after the other; ``dtypes``: columns to convert to another
    dtype as they are read (NumPy's cast, value by value: float64 to float32 rounds to nearest).

    Read row group by row group into preallocated arrays, so the table's Arrow buffers and
    the NumPy copies never coexist whole (planning reads 15M rows this way).
    """
    run = run if isinstance(run, RunDir) else RunDir(run)
    m = read_manifest(run) if manifest is None else manifest
    buckets = table_buckets(m)
    fields, out = _numeric_arrays(columns, sum(b.rows for b in buckets), dtypes)
    o = 0
    for bucket in buckets:
        views = {name: col[o : o + bucket.rows] for name, col in out.items()}
        _read_file_numeric(run, bucket.table, columns, fields, views)
        o += bucket.rows
    return out


def read_bucket_numeric(
    run: RunDir, bucket: TableBucket, columns: list[str], dtypes: dict[str, Any] | None = None
) -> dict[str, np.ndarray]:
    """:func:`load_numeric` of one bucket's table file: its numeric ``columns`` as NumPy arrays,
    read row group by row group into them (on two threads for a local file), not decoded whole
    and then copied out of Arrow's chunks (what a partitioned plan's passes read per bucket)."""
    fields, out = _numeric_arrays(columns, bucket.rows, dtypes)
    _read_file_numeric(run, bucket.table, columns, fields, out)
    return out


def _numeric_arrays(
    columns: list[str], rows: int, dtypes: dict[str, Any] | None
) -> tuple[list[pa.Field], dict[str, np.ndarray]]:
    """(the table fields of ``columns``, an empty array of ``rows`` for each): the output of
    :func:`load_numeric` and :func:`read_bucket_numeric`, numeric columns only (ValueError)."""
    fields = [TABLE_SCHEMA.field(c) for c in columns]
    native = {f.name: numpy_dtype(f.type) for f in fields}
    if any(dtype is None for dtype in native.values()):  # (a NumPy dtype compares equal to None)
        raise ValueError(f"load_numeric reads numeric columns only; asked for {columns}")
    dtypes = dtypes or {}
    return fields, {name: np.empty(rows, dtype=dtypes.get(name, dtype)) for name, dtype in native.items()}


def _read_file_numeric(
    run: RunDir, rel: str, columns: list[str], fields: list[pa.Field], out: dict[str, np.ndarray]
) -> None:
    """``columns`` of the table file ``rel`` into ``out`` (arrays of its row count)."""
    local = run.local_path(rel)
    if local is None:
        with run.open(rel) as fh:
            remote = pq.ParquetFile(fh)
            _check_rows(run, rel, remote, out)
            _read_numeric(remote, columns, range(remote.num_row_groups), out, lambda: contextlib.nullcontext(remote))
        return
    with contextlib.closing(pq.ParquetFile(local, memory_map=True)) as pf:
        _check_rows(run, rel, pf, out)

    def mapped() -> contextlib.closing[pq.ParquetFile]:
        # a mapping a row group: the file's pages it touched leave the process's RSS when it
        # is closed, instead of staying mapped until the whole file is read (at 15M rows, the
        # noise rule's 280 MB of table pages on top of the arrays they are read into)
        return contextlib.closing(pq.ParquetFile(local, memory_map=True, metadata=pf.metadata))

    groups = pf.metadata.num_row_groups
    if groups < 4:
        _read_numeric(pf, columns, range(groups), out, mapped)
        return
    # two halves of the row groups on two threads (decoding and copying release the GIL)
    with ThreadPoolExecutor(2) as pool:
        halves = (range(0, groups // 2), range(groups // 2, groups))
        list(pool.map(lambda h: _read_numeric(pf, columns, h, out, mapped), halves))


def _check_rows(run: RunDir, rel: str, pf: pq.ParquetFile, out: dict[str, np.ndarray]) -> None:
    """The file holds as many rows as the manifest gave it (``out``'s arrays), or RunFormatError."""
    expected = len(next(iter(out.values()))) if out else pf.metadata.num_rows
    if pf.metadata.num_rows != expected:
        raise RunFormatError(
            f"{run.display(rel)}: table file has {pf.metadata.num_rows:,} rows, the manifest says {expected:,}; "
            "expected the same (compaction never rewrites a table file: it was changed or replaced since). "
            "Restore the run's table folder from a copy"
        )


def _read_numeric(
    pf: pq.ParquetFile,
    columns: list[str],
    groups: range,
    out: dict[str, np.ndarray],
    open_file: Callable[[], AbstractContextManager[pq.ParquetFile]],
) -> None:
    """Row groups ``groups`` of ``columns`` into ``out`` (at their row offsets), each read
    through the file ``open_file()`` gives for it (``pf``: the file's metadata and schema); a
    history column the file lacks (written before it existed) is filled (:func:`absent_column`)."""
    meta = pf.metadata
    names = set(pf.schema_arrow.names)
    present = [c for c in columns if c in names]
    for name in columns:
        if name not in names:
            if name not in HISTORY_COLUMNS:
                raise KeyError(f"table file has no column {name!r}")
            lo = sum(meta.row_group(i).num_rows for i in range(groups.start))
            hi = lo + sum(meta.row_group(i).num_rows for i in groups)
            out[name][lo:hi] = _ABSENT[name]
    o = sum(meta.row_group(i).num_rows for i in range(groups.start))
    for i in groups:
        if present:
            with open_file() as f:
                group = f.read_row_group(i, columns=present, use_threads=False)
                for name in present:
                    with np.errstate(over="ignore"):  # a value beyond a narrower dtype (dtypes) becomes inf
                        copy_column_into(out[name][o:], group.column(name))
                del group
        o += meta.row_group(i).num_rows


def read_rows(run: RunDir, manifest: dict[str, Any], columns: list[str], lo: int, n: int) -> pa.Table:
    """Rows ``lo .. lo + n - 1`` of ``columns`` of ``manifest``'s table, a local one-bucket table
    (read from the row groups that hold them, without memory-mapping the file)."""
    (bucket,) = table_buckets(manifest)
    local = run.local_path(bucket.table)
    if local is None:
        raise ValueError(f"{run.display(bucket.table)}: read_rows reads local tables only")
    pf = pq.ParquetFile(local)
    ends = np.cumsum([pf.metadata.row_group(i).num_rows for i in range(pf.metadata.num_row_groups)])
    first, last = int(np.searchsorted(ends, lo, side="right")), int(np.searchsorted(ends, lo + n - 1, side="right"))
    groups = list(range(first, min(last, len(ends) - 1) + 1)) if n > 0 and len(ends) else []
    if not groups:
        return empty_table(columns)
    start = int(ends[first - 1]) if first else 0
    return pf.read_row_groups(groups, columns=columns, use_threads=False).slice(lo - start, n)


def read_bucket(run: RunDir, bucket: TableBucket, columns: list[str]) -> tuple[pa.Table, bool]:
    """``columns`` of one bucket's file, and whether its key column (if asked for) was
    memory-mapped from the bucket's keys file (False: decoded from the table file)."""
    if "key" in columns:
        keys = bucket_keys(run, bucket)
        if keys is not None:
            t = _read_table_file(run, bucket.table, [c for c in columns if c != "key"])
            return t.add_column(columns.index("key"), "key", keys), True
    return _read_table_file(run, bucket.table, columns), False


def read_identity(run: RunDir, bucket: TableBucket) -> tuple[pa.Table, bool]:
    """(shard, key, uid) columns of one bucket's file (:func:`read_bucket`)."""
    return read_bucket(run, bucket, ["shard", "key", "uid"])


def read_column(run: RunDir, bucket: TableBucket, name: str) -> pa.ChunkedArray:
    """One column of a bucket's table file (a history column it lacks: filled)."""
    return _read_table_file(run, bucket.table, [name]).column(name)


# ---------------------------------------------------------------------------------- writing
def with_shard_runs(table: pa.Table) -> pa.Table:
    """``table`` (rows grouped by shard) with :data:`SHARD_RUNS_META` in its schema metadata."""
    shard = table.column("shard")
    if not pa.types.is_dictionary(shard.type):
        shard = shard.dictionary_encode()
    starts, stops, names, _ = shard_runs(shard.unify_dictionaries())
    runs = json.dumps({"names": names.to_pylist(), "rows": (stops - starts).tolist()}, separators=(",", ":"))
    return table.replace_schema_metadata({**(table.schema.metadata or {}), SHARD_RUNS_META: runs.encode()})


@dataclass(frozen=True)
class ShardRuns:
    """A one-bucket table's shards in row order (:data:`SHARD_RUNS_META`): ``names``, the row
    range ``[starts, stops)`` of each, and ``chunk_rows``, the rows of each of the table file's
    row groups (the chunks a read of its shard column has)."""

    names: list[str]
    starts: np.ndarray
    stops: np.ndarray
    chunk_rows: list[int]


def table_shard_runs(run: RunDir, manifest: dict[str, Any]) -> ShardRuns | None:
    """The :class:`ShardRuns` of a one-bucket table from its file's footer; None for a
    partitioned table, a table file written without them (earlier versions), or runs that do
    not cover the manifest's rows exactly once (the shard column is read instead then)."""
    buckets = table_buckets(manifest)
    if len(buckets) != 1:
        return None
    meta = run.parquet_footer(run.path(buckets[0].table))
    raw = (meta.schema.to_arrow_schema().metadata or {}).get(SHARD_RUNS_META)
    if raw is None:
        return None
    runs = json.loads(raw)
    names, rows = list(runs["names"]), np.asarray(runs["rows"], dtype=np.int64)
    ok = len(names) == len(rows) == len(set(names)) and bool((rows > 0).all())
    if not ok or int(rows.sum()) != meta.num_rows or meta.num_rows != buckets[0].rows:
        return None
    stops = np.cumsum(rows, dtype=np.int64)
    chunk_rows = [meta.row_group(i).num_rows for i in range(meta.num_row_groups)]
    return ShardRuns(names, stops - rows, stops, chunk_rows)


def publish_table(run: RunDir, generation: int, table: pa.Table, keys: str | None = None) -> tuple[str, str]:
    """Write ``table`` (TABLE_SCHEMA) as the table file of ``generation`` and its keys file,
    both under fresh names (format version 1, one bucket); returns their paths. ``keys``: an
    existing keys file that holds the table's key column already (same rows, same order), kept
    instead of a new one."""
    token = uuid.uuid4().hex[:8]
    table_rel = table_file(generation, token)
    run.publish_parquet(table_rel, with_shard_runs(table), **TABLE_WRITE_OPTIONS)
    if keys is None:
        keys = keys_file(generation, token)
        run.publish_arrow(keys, pa.table({"key": table.column("key")}, schema=KEYS_SCHEMA))
    return table_rel, keys


@dataclass(frozen=True)
class BucketTarget:
    """Where the buckets of a new partitioned table go: its generation and token (the folder
    and the keys files' names derive from them)."""

    generation: int
    token: str

    @property
    def folder(self) -> str:
        return table_folder(self.generation, self.token)


def publish_bucket(run: RunDir, target: BucketTarget, bucket: int, table: pa.Table, keys: str | None = None) -> str:
    """Write bucket ``bucket``'s file of the new table ``target`` and its keys file (any process
    may write any bucket: nobody reads the folder until a manifest names it); ``keys``: the
    bucket's current keys file, kept when it holds the same key column. Returns the keys file."""
    run.publish_parquet(bucket_table_file(target.folder, bucket), table, **TABLE_WRITE_OPTIONS)
    if keys is None:
        keys = bucket_keys_file(bucket, target.generation, target.token)
        run.publish_arrow(keys, pa.table({"key": table.column("key")}, schema=KEYS_SCHEMA))
    return keys


class PartitionedTableWriter:
    """The buckets of a partitioned table (format version 2) of ``generation``, written into a
    fresh folder (:func:`publish_bucket`, here or by an engine's tasks) and recorded here in
    bucket order: nobody reads the folder until a manifest names it, so a killed writer leaves
    only an unnamed folder (removed by the next compaction)."""

    def __init__(self, run: RunDir, generation: int) -> None:
        self.run, self.generation = run, generation
        self.token = uuid.uuid4().hex[:8]
        self.folder = table_folder(generation, self.token)
        self.keys: list[str] = []
        self.rows: list[int] = []

    def target(self) -> BucketTarget:
        return BucketTarget(self.generation, self.token)

    def record(self, bucket: int, rows: int, keys: str) -> None:
        """Record bucket ``bucket`` (the next one), written with :func:`publish_bucket`."""
        if bucket != len(self.rows):
            raise ValueError(f"bucket {bucket} recorded out of order (expected {len(self.rows)})")
        self.keys.append(keys)
        self.rows.append(rows)

    def remove(self, keep: Iterable[str]) -> None:
        """Remove what was written for this table except the files in ``keep`` (a discarded
        result): the folder and the keys files of its generation and token."""
        kept = set(keep)
        self.run.remove(self.folder)
        for rel in self.run.glob(f"table/keys/b*-{self.generation:06d}-{self.token}.arrow"):
            if rel not in kept:
                self.run.remove(rel)


def make_manifest(
    *,
    generation: int,
    table: str,
    keys: str | list[str],
    previous: dict[str, Any],
    rows: int,
    folded: list[str],
    quarantined: list[str],
    n_ref: int,
    shard_locations: dict[str, str],
    bucket_rows: list[int] | None = None,
) -> dict[str, Any]:
    """The manifest naming ``table`` and ``keys`` after the manifest ``previous``: version 1
    (``table`` and ``keys`` are files) or, with ``bucket_rows``, version 2 (``table`` is the
    folder of the buckets' files, ``keys`` one keys file per bucket)."""
    manifest = {
        "generation": generation,
        "table": table,
        "previous_table": previous.get("table"),
        "keys": keys,
        "previous_keys": previous.get("keys"),
        "rows": rows,
        "folded": folded,
        "quarantined": quarantined,
        "n_ref": n_ref,
        "shard_locations": {s: shard_locations[s] for s in sorted(shard_locations)},
        "format_version": 1,
    }
    if bucket_rows is not None:
        manifest.update(buckets=len(bucket_rows), bucket_rows=list(bucket_rows), format_version=2)
    return manifest


def publish_manifest(run: RunDir, manifest: dict[str, Any]) -> None:
    """Replace ``table/manifest.json`` atomically: readers see the old table or the new one."""
    run.publish_json(MANIFEST, manifest)


def manifest_files(manifest: dict[str, Any]) -> set[str]:
    """Every table file, folder and keys file ``manifest`` names (current and previous)."""
    names: set[str] = set()
    for field in ("table", "previous_table", "keys", "previous_keys"):
        value = manifest.get(field)
        if isinstance(value, str):
            names.add(value)
        elif isinstance(value, list):
            names.update(v for v in value if v)
    return names


def remove_table_files_except(run: RunDir, keep: Iterable[Any]) -> None:
    """Remove table files and folders, keys files and temporaries of killed compactions other
    than ``keep`` (call it holding the compaction lock, so that no other writer is using them)."""
    keep_set = {k for k in keep if k}
    for rel in [p for pattern in TABLE_GLOBS for p in run.glob(pattern)]:
        if rel not in keep_set:
            run.remove(rel)
