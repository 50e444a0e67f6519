"""The plan folder of an epoch, ``plans/epoch=E/``: written once by planning, read by everyone.

This module owns the folder (docs/format.md, "Plans"):

* ``plan.parquet``: one row per known sample (:data:`PLAN_SCHEMA`), a folder of Parquet parts
  in row order, rows grouped by shard;
* ``keys.arrow`` + ``lookup.arrow``: the stage's per-row key and (keep, weight[, score]),
  row-aligned with plan.parquet, uncompressed Arrow IPC so workers memory-map them;
* ``shards.arrow``: one row per shard, its row range and kept count (the stage skips a shard
  with no kept row without opening it);
* ``summary.json``: written last, so its presence means the plan is complete.

:func:`publish_plan` writes them in that order; :func:`load_plan`, :func:`load_summary` and
:func:`read_stage_lookup` read them. Nothing here decides what to keep (``policies``) or how a
stage applies it (``planview``).
"""

from __future__ import annotations

import contextlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .errors import PlanMissingError, RunFormatError
from .layout import PLANS_GLOB, epoch_of, plan_dir, plan_file
from .runfs import PendingFile, RunDir

__all__ = [
    "PLAN_SCHEMA",
    "PLAN_PART_ROWS",
    "PlanIdentities",
    "StageLookup",
    "publish_plan",
    "load_plan",
    "load_summary",
    "read_stage_lookup",
    "shard_ranges",
    "publish_summary",
    "read_summary",
    "discard_leftovers",
    "planned_epochs",
]

#: Every column is non-nullable (Parquet ``required``): a plan has a value in every cell, and
#: without definition levels to compute and encode plan.parquet is encoded about 18% faster.
PLAN_SCHEMA = pa.schema(
    [
        pa.field("shard", pa.dictionary(pa.int32(), pa.string()), nullable=False),
        pa.field("key", pa.string(), nullable=False),
        pa.field("uid", pa.uint64(), nullable=False),
        pa.field("loss", pa.float32(), nullable=False),
        pa.field("cluster", pa.int16(), nullable=False),
        pa.field("keep", pa.bool_(), nullable=False),
        pa.field("weight", pa.float32(), nullable=False),
        pa.field("reason", pa.dictionary(pa.int8(), pa.string()), nullable=False),
    ]
)
#: Rows per part of the plan.parquet folder; the parts are encoded in parallel (one thread
#: per CPU), which pays at 15M rows (docs/benchmarks.md, "Planning").
PLAN_PART_ROWS = 1 << 21
#: LZ4 (a fresh 700 MB file costs more in page-cache pages than LZ4 costs in CPU); dictionary
#: pages for the low-cardinality columns only; statistics for the numeric columns only (those of
#: the identity, keep and reason columns prune no row group and cost 10% of the encoding);
#: values in batches of 64K and pages cut by size (docs/benchmarks.md, "Planning").
_WRITE_OPTIONS: dict[str, Any] = {
    "compression": "lz4",
    "use_dictionary": ["shard", "reason"],
    "write_statistics": ["loss", "cluster", "weight"],
    "write_batch_size": 1 << 16,
    "max_rows_per_page": 1 << 20,
}
_SHARD_TYPE = pa.dictionary(pa.int32(), pa.string())


class PlanIdentities:
    """The plan's identity columns: ``shard`` with one dictionary for all chunks, ``key``, and
    the row range of each shard (rows are grouped by shard). ``keys_file`` is keys.arrow,
    prepared ahead (a hard link to the loss table's keys file) and published with the plan."""

    def __init__(self, shard: pa.ChunkedArray | pa.Array, key: pa.ChunkedArray | pa.Array) -> None:
        if isinstance(shard, pa.Array):
            shard = pa.chunked_array([shard])
        if not pa.types.is_dictionary(shard.type):  # population rows: encode like the table read
            shard = pc.dictionary_encode(shard)
        # one dictionary, so that plan.parquet keeps the shard column dictionary-encoded without
        # decoding it, and the ranges are found on the integer codes
        self.shard: pa.ChunkedArray = shard.cast(_SHARD_TYPE).unify_dictionaries()
        self.key = key if isinstance(key, pa.ChunkedArray) else pa.chunked_array([key])
        self.starts, self.stops, self.names = _shard_runs(self.shard)
        self.keys_file: PendingFile | None = None

    def discard(self) -> None:
        """Drop keys.arrow prepared ahead (the plan was not published)."""
        if self.keys_file is not None:
            with contextlib.suppress(Exception):
                self.keys_file.discard()


@dataclass
class StageLookup:
    """What a stage reads of a plan: the summary, per-row keys and decisions, per-shard ranges."""

    summary: dict[str, Any]
    keys: pa.ChunkedArray
    decisions: pa.Table  # keep, weight[, score]; row-aligned with keys
    shards: dict[str, tuple[int, int, int]] = field(default_factory=dict)  # shard -> (start, stop, kept)


def publish_plan(
    run: RunDir,
    epoch: int,
    ids: PlanIdentities,
    columns: dict[str, np.ndarray | pa.Array],
    summarize: Any,
) -> None:
    """Publish plan.parquet, keys.arrow, lookup.arrow and shards.arrow of ``epoch`` (not the
    summary: :func:`publish_summary` completes the plan).

    ``columns`` holds uid, loss, cluster, keep, weight, reason (int8 codes with
    ``reason_names``) and optionally score. ``summarize()`` is called while the parts are
    encoded (the summary costs about as much as one part)."""
    names = columns.pop("reason_names")
    reason = pa.DictionaryArray.from_arrays(pa.array(columns["reason"], type=pa.int8()), pa.array(names, pa.string()))
    keep = pa.array(columns["keep"], type=pa.bool_())
    weight = pa.array(columns["weight"], type=pa.float32())
    arrays = [
        ids.shard,
        ids.key,
        pa.array(columns["uid"], type=pa.uint64()),
        pa.array(columns["loss"], type=pa.float32()),
        pa.array(columns["cluster"], type=pa.int16()),
        keep,
        weight,
        reason,
    ]
    lookup = {"keep": keep, "weight": weight}
    schema = PLAN_SCHEMA
    if columns.get("score") is not None:
        score = pa.array(columns["score"], type=pa.float64())
        arrays.append(score)
        lookup["score"] = score
        schema = schema.append(pa.field("score", pa.float64(), nullable=False))
    plan = pa.Table.from_arrays(arrays, schema=schema)
    del arrays
    keep_np = np.asarray(columns["keep"])

    def stage_files() -> None:  # the summary and the stage's files, while plan.parquet is encoded
        summarize()
        keys = ids.keys_file or run.prepare_arrow(plan_file(epoch, "keys.arrow"), pa.table({"key": ids.key}))
        keys.commit()
        run.publish_arrow(plan_file(epoch, "lookup.arrow"), pa.table(lookup))
        run.publish_arrow(plan_file(epoch, "shards.arrow"), shard_ranges(ids, keep_np))

    _publish_beside(run, plan_file(epoch, "plan.parquet"), plan, stage_files)


def _publish_beside(run: RunDir, rel: str, table: pa.Table, work: Any) -> None:
    """Publish ``table`` as a Parquet folder, encoded on other threads while ``work()`` runs
    on this one (pyarrow releases the GIL while encoding): the summary and the stage files then
    cost no wall time at 15M rows (docs/benchmarks.md, "Planning"). An error on either side
    publishes nothing of the folder."""
    with ThreadPoolExecutor(1) as pool:
        future = pool.submit(run.prepare_parquet_parts, rel, table, part_rows=PLAN_PART_ROWS, **_WRITE_OPTIONS)
        try:
            work()
        except BaseException:
            with contextlib.suppress(BaseException):
                future.result().discard()
            raise
        future.result().commit()


def publish_summary(run: RunDir, epoch: int, summary: dict[str, Any]) -> None:
    """summary.json: written last, it marks the plan of ``epoch`` complete."""
    run.publish_json(plan_file(epoch, "summary.json"), summary)


def read_summary(run: RunDir, epoch: int) -> dict[str, Any] | None:
    """The summary of ``epoch``, or None if it has no complete plan."""
    s = run.read_json(plan_file(epoch, "summary.json"), default=None)
    return None if s is None else dict(s)


def load_summary(run: str | RunDir, epoch: int) -> dict[str, Any]:
    """The summary of the plan of ``epoch`` (PlanMissingError if it was never planned)."""
    run = run if isinstance(run, RunDir) else RunDir(run)
    s = read_summary(run, epoch)
    if s is None:
        raise PlanMissingError(
            f"{run.display(plan_file(epoch, 'summary.json'))}: no plan for epoch {epoch}; call "
            f"seta_stream.plan_epoch(run, {epoch}) (or pruner.start_epoch({epoch})) before "
            "iterating the loader of that epoch"
        )
    return s


def load_plan(run: str | RunDir, epoch: int, columns: list[str] | None = None) -> pa.Table:
    """plan.parquet of ``epoch`` as an Arrow table."""
    run = run if isinstance(run, RunDir) else RunDir(run)
    load_summary(run, epoch)  # raises PlanMissingError with a hint
    return run.read_parquet(plan_file(epoch, "plan.parquet"), columns=columns)


def planned_epochs(run: RunDir) -> list[int]:
    """Epochs with a complete plan (a summary.json), ascending."""
    return sorted(epoch_of(rel) for rel in run.glob(PLANS_GLOB))


def discard_leftovers(run: RunDir, epoch: int) -> None:
    """Remove the ``.tmp-*`` files and folders a planner killed while publishing left."""
    for rel in run.glob(f"{plan_dir(epoch)}/.tmp-*"):
        run.remove(rel)


def read_stage_lookup(run: RunDir, epoch: int) -> StageLookup:
    """The stage's view of the plan of ``epoch`` (memory-mapped locally)."""
    d = plan_dir(epoch)
    summary = read_summary(run, epoch)
    if summary is None:
        raise PlanMissingError(
            f"{run.display(d, 'summary.json')}: no plan for epoch {epoch}; call "
            f"pruner.start_epoch({epoch}) (or plan_epoch) before iter(loader)"
        )
    decisions = run.read_arrow(plan_file(epoch, "lookup.arrow"))
    if "key" in decisions.column_names:  # a plan written before keys.arrow existed
        keys = decisions.column("key")
    else:
        keys = run.read_arrow(plan_file(epoch, "keys.arrow")).column("key")
        if len(keys) != decisions.num_rows:
            raise RunFormatError(
                f"{run.display(d)}: keys.arrow has {len(keys)} rows, lookup.arrow "
                f"{decisions.num_rows}; expected the same rows. The plan directory is "
                f"inconsistent: plan the epoch again with force=True"
            )
    shards = run.read_arrow(plan_file(epoch, "shards.arrow")).to_pydict()
    ranges = {s: (a, b, k) for s, a, b, k in zip(shards["shard"], shards["start"], shards["stop"], shards["kept"])}
    return StageLookup(summary, keys, decisions, ranges)


def _shard_runs(shard: pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray, pa.Array]:
    """Row ranges [start, stop) of the shards and their names (one dictionary for all chunks)."""
    n = len(shard)
    if n == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64), pa.array([], pa.string())
    starts, codes, o = [], [], 0
    for chunk in shard.chunks:
        c = chunk.indices.to_numpy(zero_copy_only=False)
        if len(c):
            change = np.flatnonzero(c[1:] != c[:-1]) + 1
            first = np.concatenate([[0], change])
            starts.append(first + o)
            codes.append(c[first])
        o += len(chunk)
    start = np.concatenate(starts).astype(np.int64)
    code = np.concatenate(codes)
    joined = np.concatenate([[True], code[1:] != code[:-1]])  # a shard spanning chunks is one run
    start, code = start[joined], code[joined]
    if len(np.unique(code)) != len(code):
        raise RunFormatError("plan rows are not grouped by shard; the loss table is not sorted")
    stop = np.concatenate([start[1:], [n]]).astype(np.int64)
    return start, stop, shard.chunk(0).dictionary.take(pa.array(code))


def shard_ranges(ids: PlanIdentities, keep: np.ndarray) -> pa.Table:
    """One row per shard: row range [start, stop) in lookup.arrow, n, kept; sorted by shard."""
    kept = np.add.reduceat(keep, ids.starts, dtype=np.int64) if len(ids.starts) else np.zeros(0, np.int64)
    t = pa.table(
        {
            "shard": ids.names.cast(pa.string()),
            "start": pa.array(ids.starts, pa.int64()),
            "stop": pa.array(ids.stops, pa.int64()),
            "n": pa.array(ids.stops - ids.starts, pa.int64()),
            "kept": pa.array(kept, pa.int64()),
        }
    )
    return t.sort_by("shard")
