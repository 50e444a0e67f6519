"""Loss parts: the immutable Parquet files under ``losses/``, written and read here.

docs/format.md, "Loss parts", is the authority. A part holds the records one rank flushed at
once (PART_SCHEMA), its shard names' locations in the schema metadata, and is named
``losses/rank=R/epoch=E/part-R..-E..-{seq0}-{token}.parquet`` (``layout.part_path``), so that
sorting paths by (epoch, rank, file name) sorts parts by (epoch, rank, seq): the order in which
compaction applies records. Writers: ``record.LossRecorder`` (through :func:`make_part` and
:func:`write_part`). Readers: ``compaction`` (through :func:`read_part`, which validates a
part and raises :class:`CorruptPartError` for anything compaction must not fold, and
:func:`read_part_keys`). Parts set aside by ``compact(on_corrupt="skip")`` move to
``losses-quarantine/`` under the same relative path.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ..errors import CorruptPartError
from ..ids import ShardLocations, sample_uids
from .layout import LOSSES, MANIFEST, PARTS_GLOB, QUARANTINE, epoch_of, moved_part, part_path, rank_of
from .runfs import RunDir

__all__ = [
    "PART_SCHEMA",
    "PART_WRITE_OPTIONS",
    "LOCATIONS_METADATA",
    "CORRUPT_HINT",
    "part_locations",
    "part_name",
    "make_part",
    "write_part",
    "fold_order",
    "pending_parts",
    "read_part",
    "read_part_keys",
    "read_part_records",
    "merge_locations",
    "merge_location_maps",
    "quarantine_part",
    "quarantined_parts",
]

#: Version of the part file format (unchanged by the partitioned run format, version 2).
PART_FORMAT_VERSION = 1

PART_SCHEMA = pa.schema(
    [
        ("shard", pa.string()),
        ("key", pa.string()),
        ("uid", pa.uint64()),
        ("loss", pa.float32()),
        ("epoch", pa.int32()),
        ("rank", pa.int32()),
        ("seq", pa.int64()),
    ],
    metadata={b"seta_stream.format_version": str(PART_FORMAT_VERSION).encode()},
)

#: Parquet options of parts: LZ4 (compaction reads it several times faster than zstd), the
#: shard column dictionary-encoded (a few distinct values per part), no statistics for keys.
PART_WRITE_OPTIONS: dict[str, Any] = {
    "compression": "lz4",
    "use_dictionary": ["shard"],
    "write_statistics": ["epoch", "rank", "seq"],
}

#: Schema metadata key of a part: JSON object {shard name: shard location} of the shards whose
#: records the part holds (``ids.shard_location`` of their ``__url__``). Compaction checks that
#: one name never stands for two locations (two folders holding the same file name).
LOCATIONS_METADATA = b"seta_stream.shard_locations"

#: How to get past a part compaction refuses; ends every :class:`CorruptPartError` message.
CORRUPT_HINT = (
    "Delete or repair it, or pass on_corrupt='skip' (CLI: --skip-corrupt) to move it to losses-quarantine/ and continue"
)

_SHARD_DICT = pa.dictionary(pa.int32(), pa.string())


# ---------------------------------------------------------------------------------- writing
def part_name(rank: int, epoch: int, seq0: int) -> str:
    """Relative path of a new part (docs/format.md): a fresh random token for every call."""
    return part_path(rank, epoch, seq0, uuid.uuid4().hex[:8])


def make_part(
    shard: pa.DictionaryArray,
    key: pa.Array,
    loss: np.ndarray,
    *,
    epoch: int,
    rank: int,
    seq0: int,
    locations: Mapping[str, str],
) -> pa.Table:
    """The part table of one flush: records ``seq0, seq0 + 1, ...`` of ``rank`` in ``epoch``.

    ``shard`` (dictionary-encoded names) and ``key`` are the samples' identities, one per
    record; their uids are computed here (``ids.sample_uids``). ``loss`` is float32 with
    non-finite values already NaN; ``locations`` maps each shard name to its location."""
    n = len(key)
    located = json.dumps({s: locations[s] for s in sorted(locations)}, separators=(",", ":")).encode()
    schema = PART_SCHEMA.with_metadata({**PART_SCHEMA.metadata, LOCATIONS_METADATA: located})
    return pa.Table.from_arrays(
        [
            shard.dictionary_decode(),
            key,
            pa.array(sample_uids(shard, key), type=pa.uint64()),
            pa.array(loss, type=pa.float32()),
            pa.array(np.full(n, epoch, dtype=np.int32)),
            pa.array(np.full(n, rank, dtype=np.int32)),
            pa.array(np.arange(seq0, seq0 + n, dtype=np.int64)),
        ],
        schema=schema,
    )


def write_part(run: RunDir, rank: int, epoch: int, table: pa.Table) -> str:
    """Publish ``table`` (PART_SCHEMA, first ``seq`` = its seq0) as a new part; returns its path."""
    rel = part_name(rank, epoch, int(table.column("seq")[0].as_py()) if table.num_rows else 0)
    run.publish_parquet(rel, table, **PART_WRITE_OPTIONS)
    return rel


# ---------------------------------------------------------------------------------- reading
def part_locations(schema: pa.Schema) -> dict[str, str]:
    """{shard name: location} recorded in a part's schema metadata ({} for parts written
    before locations were recorded). Raises ValueError if the metadata is not JSON."""
    raw = (schema.metadata or {}).get(LOCATIONS_METADATA)
    if not raw:
        return {}
    value = json.loads(raw)
    return {str(k): str(v) for k, v in value.items()} if isinstance(value, dict) else {}


def fold_order(rel: str) -> tuple[int, int, str]:
    """Sort key of a part path: (epoch, rank, file name), which orders a rank's parts by their
    first ``seq`` (zero-padded in the name)."""
    return (epoch_of(rel), rank_of(rel), rel.rsplit("/", 1)[1])


def pending_parts(run: RunDir, folded: Iterable[str]) -> list[str]:
    """The parts under ``losses/`` not in ``folded``, in fold order (temporaries excluded)."""
    done = set(folded)
    return sorted((p for p in run.glob(PARTS_GLOB) if p not in done), key=fold_order)


def read_part(run: RunDir, rel: str) -> pa.Table:
    """Read and validate one part: PART_SCHEMA columns, shard dictionary-encoded, key plain
    string, schema metadata reduced to the shard locations (when the part has them).

    Raises :class:`CorruptPartError` (``path=rel``) for a file that is not readable Parquet,
    lacks the format version or has a newer one, misses a column or has another type, holds
    nulls (except in ``loss``) or has unreadable locations metadata."""
    schema, table = _read_parquet(run, rel)
    where = run.display(rel)
    _check_version(schema, where, rel)
    _check_columns(schema, where, rel)
    table = table.select(PART_SCHEMA.names)
    nulls = [name for name in PART_SCHEMA.names if name != "loss" and table.column(name).null_count]
    if nulls:
        raise CorruptPartError(
            f"{where}: null values in column(s) {nulls}; expected none (only 'loss' may be NaN). {CORRUPT_HINT}",
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
            f"{where}: its shard locations metadata is not valid JSON ({exc}). {CORRUPT_HINT}", path=rel
        ) from exc
    # keep only the locations metadata: compaction checks names against it
    raw = {LOCATIONS_METADATA: json.dumps(locations).encode()} if locations else None
    return table.replace_schema_metadata(raw)


def read_part_keys(run: RunDir, rel: str) -> pa.ChunkedArray:
    """The ``key`` column of a part already read once by :func:`read_part`, as plain strings."""
    return run.read_parquet(rel, columns=["key"]).column("key").cast(pa.string())


def read_part_records(run: RunDir, rel: str, uids: np.ndarray) -> pa.Table:
    """(shard as string, uid, loss, epoch, rank, seq) of the records of part ``rel`` whose uid
    is among ``uids`` (a report's look-up: the part is not validated again)."""
    t = run.read_parquet(rel, columns=["shard", "uid", "loss", "epoch", "rank", "seq"])
    t = t.filter(pc.is_in(t.column("uid"), value_set=pa.array(uids, pa.uint64())))
    return t.set_column(0, "shard", t.column("shard").cast(pa.string()))


def _read_parquet(run: RunDir, rel: str) -> tuple[pa.Schema, pa.Table]:
    try:
        local = run.local_path(rel)
        if local is not None:
            pf = pq.ParquetFile(local, memory_map=True, read_dictionary=["shard"])
            return pf.schema_arrow, pf.read()
        with run.open(rel) as fh:
            pf = pq.ParquetFile(fh, read_dictionary=["shard"])
            return pf.schema_arrow, pf.read()
    except Exception as exc:  # pyarrow raises ArrowInvalid/OSError for truncated files
        raise CorruptPartError(
            f"{run.display(rel)}: cannot be read as Parquet ({type(exc).__name__}: {exc}); expected a "
            f"complete part written by LossRecorder (a truncated or foreign file?). {CORRUPT_HINT}",
            path=rel,
        ) from exc


def _check_version(schema: pa.Schema, where: str, rel: str) -> None:
    version = (schema.metadata or {}).get(b"seta_stream.format_version")
    if version is None:
        raise CorruptPartError(
            f"{where}: no 'seta_stream.format_version' metadata; expected a part written by "
            f"LossRecorder (this file was written by another tool). {CORRUPT_HINT}",
            path=rel,
        )
    try:
        v = int(version)
    except ValueError:
        v = -1
    if not 1 <= v <= PART_FORMAT_VERSION:
        raise CorruptPartError(
            f"{where}: part format version {version.decode(errors='replace')!r}, this seta_stream "
            f"reads versions 1..{PART_FORMAT_VERSION}; upgrade seta_stream to fold it. {CORRUPT_HINT}",
            path=rel,
        )


def _check_columns(schema: pa.Schema, where: str, rel: str) -> None:
    found = {f.name: (f.type.value_type if pa.types.is_dictionary(f.type) else f.type) for f in schema}
    problems = []
    for f in PART_SCHEMA:
        if f.name not in found:
            problems.append(f"missing column {f.name!r} ({f.type})")
        elif found[f.name] != f.type and not (f.type == pa.string() and found[f.name] == pa.large_string()):
            problems.append(f"column {f.name!r} is {found[f.name]}, expected {f.type}")
    if problems:
        raise CorruptPartError(f"{where}: wrong schema: {'; '.join(problems)}. {CORRUPT_HINT}", path=rel)


def merge_locations(
    run: RunDir, known: Mapping[str, str], parts: Iterable[pa.Table], names: Iterable[str]
) -> dict[str, str]:
    """{shard: location} of the table after folding ``parts`` (read by :func:`read_part`, paths
    ``names``) into a table whose manifest maps ``known``; raises
    :class:`ShardNameConflictError` (before anything is written) if one shard name stands for
    two locations: two different shards whose samples would be merged."""
    return merge_location_maps(run, known, (part_locations(part.schema) for part in parts), names)


def merge_location_maps(
    run: RunDir, known: Mapping[str, str], maps: Iterable[Mapping[str, str]], names: Iterable[str]
) -> dict[str, str]:
    """:func:`merge_locations` from each part's ``{shard: location}`` (:func:`part_locations`)."""
    seen = ShardLocations(
        known,
        f"the loss table ({run.display(MANIFEST)})",
        "their samples would be merged into one table row per key, so nothing was compacted; the parts "
        f"recorded under the conflicting name stay in {run.display(LOSSES)}",
    )
    for locations, rel in zip(maps, names):
        for shard, location in locations.items():
            seen.check(shard, location, run.display(rel))
    return seen.locations()


# ---------------------------------------------------------------------------------- quarantine
def quarantine_part(run: RunDir, rel: str) -> None:
    """Move a part compaction refuses to ``losses-quarantine/`` (same relative path)."""
    run.move(rel, moved_part(rel, QUARANTINE))


def quarantined_parts(run: RunDir) -> set[str]:
    """Original paths (under ``losses/``) of the parts now in ``losses-quarantine/``."""
    return {LOSSES + p[len(QUARANTINE) :] for p in run.glob(QUARANTINE + "rank=*/epoch=*/*.parquet")}
