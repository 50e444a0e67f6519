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

import uuid
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from ._arrays import copy_column_into
from ._layout import MANIFEST, TABLE_GLOBS, keys_file, table_file
from ._parts import PART_SCHEMA
from ._runfs import FORMAT_VERSION, RunDir

__all__ = [
    "table_locations",
    "load_table",
    "load_table_keys",
    "load_numeric",
    "folded_parts",
    "TABLE_SCHEMA",
    "PART_SCHEMA",
    "KEYS_SCHEMA",
    "MANIFEST",
    "TABLE_WRITE_OPTIONS",
    "read_manifest",
    "read_identity",
    "read_column",
    "publish_table",
    "make_manifest",
    "publish_manifest",
    "remove_table_files_except",
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

#: Schema of the table's keys file: the ``key`` column of the table file, same rows, as
#: uncompressed Arrow IPC (memory-mapped: planning reads 15M keys in milliseconds instead of
#: decoding them from Parquet).
KEYS_SCHEMA = pa.schema([("key", pa.string())])


# ---------------------------------------------------------------------------------- reading
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
    m = read_manifest(run) if manifest is None else manifest
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
    m = read_manifest(run) if manifest is None else manifest
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
    m = read_manifest(run) if manifest is None else manifest
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
            copy_column_into(out[name][o:], group.column(name))
        o += group.num_rows
        del group
    return out


def read_identity(run: RunDir, manifest: dict[str, Any]) -> tuple[pa.Table | None, str | None]:
    """(shard, key, uid) columns of ``manifest``'s table (None without a table), and the keys
    file the key column was memory-mapped from (None when it was decoded from the table file)."""
    rel = manifest.get("table")
    if not rel:
        return None, None
    keys = load_table_keys(run, manifest)
    if keys is None:
        return run.read_parquet(rel, columns=["shard", "key", "uid"]), None
    t = run.read_parquet(rel, columns=["shard", "uid"])
    return pa.table({"shard": t.column("shard"), "key": keys[0], "uid": t.column("uid")}), keys[1]


def read_column(run: RunDir, manifest: dict[str, Any], name: str) -> pa.ChunkedArray:
    """One column of ``manifest``'s table file."""
    return run.read_parquet(manifest["table"], columns=[name]).column(name)


# ---------------------------------------------------------------------------------- writing
def publish_table(run: RunDir, generation: int, table: pa.Table, keys: str | None = None) -> tuple[str, str]:
    """Write ``table`` (TABLE_SCHEMA) as the table file of ``generation`` and its keys file,
    both under fresh names; returns their paths. ``keys``: an existing keys file that holds
    the table's key column already (same rows, same order), kept instead of a new one."""
    token = uuid.uuid4().hex[:8]
    table_rel = table_file(generation, token)
    run.publish_parquet(table_rel, table, **TABLE_WRITE_OPTIONS)
    if keys is None:
        keys = keys_file(generation, token)
        run.publish_arrow(keys, pa.table({"key": table.column("key")}, schema=KEYS_SCHEMA))
    return table_rel, keys


def make_manifest(
    *,
    generation: int,
    table: str,
    keys: str,
    previous: dict[str, Any],
    rows: int,
    folded: list[str],
    quarantined: list[str],
    n_ref: int,
    shard_locations: dict[str, str],
) -> dict[str, Any]:
    """The manifest naming ``table`` and ``keys`` after the manifest ``previous``."""
    return {
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
        "format_version": FORMAT_VERSION,
    }


def publish_manifest(run: RunDir, manifest: dict[str, Any]) -> None:
    """Replace ``table/manifest.json`` atomically: readers see the old table or the new one."""
    run.publish_json(MANIFEST, manifest)


def remove_table_files_except(run: RunDir, keep: Iterable[Any]) -> None:
    """Remove table and keys files other than ``keep`` and temporaries of killed compactions
    (call it holding the compaction lock, so that no other writer is using them)."""
    keep_set = set(keep)
    for rel in [p for pattern in TABLE_GLOBS for p in run.glob(pattern)]:
        if rel not in keep_set:
            run.remove(rel)
