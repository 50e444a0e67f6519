"""Compaction: fold loss parts into the loss table, exactly once, crash-safe.

The loss table has one row per sample ever recorded (docs/format.md, "Loss table"), sorted by
(shard, uid): plans keep that order, so their rows come grouped by shard for the stage.
``table/manifest.json`` names the current table file *and* the parts folded into it; both
change in one atomic replacement of the manifest, so:

* a part is in the table iff the manifest lists it (exactly-once folding);
* a compaction killed at any point leaves the previous manifest, and a rerun folds the same
  parts again from the previous table, converging to the table of an undisturbed run;
* two compactions cannot interleave: ``locks/compact.lock`` excludes them, and the manifest's
  generation is re-checked just before publishing.

Per sample, records are applied in (epoch, rank, seq) order: ``last_loss`` is the loss of the
greatest record; ``ema`` follows algorithms.md §0.6 (s <- beta2 s + (1 - beta2) loss for each
finite record, starting from 1/n_ref). A part of an older epoch folded after newer ones (a
late rank) still updates ``last_loss`` only if its record is greater, but its EMA steps are
applied when it is folded.

Fault injection for tests: the environment variable ``SETA_STREAM_FAULT`` set to one of
``compact:after_read``, ``compact:after_table_write``, ``compact:after_manifest`` makes the
process SIGKILL itself at that point.
"""

from __future__ import annotations

import os
import signal
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from .errors import CorruptPartError, RunLockedError, SampleIdCollisionError
from .ids import sample_uids
from .record import PART_SCHEMA
from .runfs import FORMAT_VERSION, RunDir

__all__ = ["compact", "load_table", "folded_parts", "CompactionReport", "TABLE_SCHEMA", "PART_SCHEMA"]

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

MANIFEST = "table/manifest.json"
_PART_READ_SCHEMA = PART_SCHEMA.remove_metadata().set(0, pa.field("shard", pa.dictionary(pa.int32(), pa.string())))
PARTS_GLOB = "losses/rank=*/epoch=*/part-*.parquet"


def _fault(point: str) -> None:
    if os.environ.get("SETA_STREAM_FAULT") == point:
        os.kill(os.getpid(), signal.SIGKILL)


@dataclass
class CompactionReport:
    """What one compaction did."""

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


def folded_parts(run: RunDir) -> list[str]:
    """Relative paths of the parts already folded into the current table."""
    return list(_manifest(run).get("folded", []))


def load_table(run: str | RunDir, columns: list[str] | None = None, *, shard_as_dictionary: bool = False) -> pa.Table:
    """The current loss table (an empty table with TABLE_SCHEMA before the first compaction).

    ``shard_as_dictionary`` reads the shard column dictionary-encoded (few distinct values:
    much less memory and time at 15M rows).
    """
    run = run if isinstance(run, RunDir) else RunDir(run)
    m = _manifest(run)
    if not m.get("table"):
        schema = TABLE_SCHEMA if columns is None else pa.schema([TABLE_SCHEMA.field(c) for c in columns])
        return schema.empty_table()
    return run.read_parquet(m["table"], columns=columns)


def _read_part(run: RunDir, rel: str) -> pa.Table:
    where = run.display(rel)
    hint = (
        "Delete or repair it, or pass on_corrupt='skip' (CLI: --skip-corrupt) to move it to "
        "losses-quarantine/ and continue"
    )
    try:
        local = run.local_path(rel)
        if local is not None:  # memory-mapped, shard column kept dictionary-encoded
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
            f"complete part written by LossRecorder (a truncated or foreign file?). {hint}",
            path=rel,
        ) from exc
    meta = schema.metadata or {}
    version = meta.get(b"seta_stream.format_version")
    if version is None:
        raise CorruptPartError(
            f"{where}: no 'seta_stream.format_version' metadata; expected a part written by "
            f"LossRecorder (this file was written by another tool). {hint}",
            path=rel,
        )
    try:
        v = int(version)
    except ValueError:
        v = -1
    if v > FORMAT_VERSION or v < 1:
        raise CorruptPartError(
            f"{where}: part format version {version.decode(errors='replace')!r}, this seta_stream "
            f"reads versions 1..{FORMAT_VERSION}; upgrade seta_stream to fold it. {hint}",
            path=rel,
        )
    # the shard column is read dictionary-encoded; compare its value type
    found = {f.name: (f.type.value_type if pa.types.is_dictionary(f.type) else f.type) for f in schema}
    problems = []
    for f in PART_SCHEMA:
        if f.name not in found:
            problems.append(f"missing column {f.name!r} ({f.type})")
        elif found[f.name] != f.type and not (f.type == pa.string() and found[f.name] == pa.large_string()):
            problems.append(f"column {f.name!r} is {found[f.name]}, expected {f.type}")
    if problems:
        raise CorruptPartError(f"{where}: wrong schema: {'; '.join(problems)}. {hint}", path=rel)
    target = PART_SCHEMA.remove_metadata().set(0, pa.field("shard", pa.dictionary(pa.int32(), pa.string())))
    table = table.select(PART_SCHEMA.names)
    if not pa.types.is_dictionary(table.schema.field("shard").type):
        table = table.set_column(0, "shard", pc.dictionary_encode(table.column("shard")))
    return table.cast(target)


def _part_order(rel: str) -> tuple[int, int, str]:
    # losses/rank=R/epoch=E/part-...-{seq0}-token: fold in (epoch, rank, seq) order
    rank = int(rel.split("rank=", 1)[1].split("/", 1)[0])
    epoch = int(rel.split("epoch=", 1)[1].split("/", 1)[0])
    return (epoch, rank, rel.rsplit("/", 1)[1])


def _group_bounds(sorted_uid: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(start, end exclusive) of runs of equal values."""
    n = len(sorted_uid)
    change = np.flatnonzero(sorted_uid[1:] != sorted_uid[:-1]) + 1
    starts = np.concatenate([[0], change]).astype(np.int64)
    ends = np.concatenate([change, [n]]).astype(np.int64)
    return starts, ends


def _np(col: pa.ChunkedArray | pa.Array) -> np.ndarray:
    return col.to_numpy() if isinstance(col, pa.ChunkedArray) else col.to_numpy(zero_copy_only=False)


def compact(
    run: str | RunDir,
    *,
    on_corrupt: Literal["raise", "skip"] = "raise",
    progress: bool = False,
    lock_wait: float = 0.0,
) -> CompactionReport:
    """Fold every loss part not yet in the table into a new table and publish it.

    ``on_corrupt="skip"`` moves unreadable or foreign parts to ``losses-quarantine/`` (listed
    in the report and the manifest) instead of raising :class:`CorruptPartError`.
    """
    if on_corrupt not in ("raise", "skip"):
        raise ValueError(f"on_corrupt must be 'raise' or 'skip', got {on_corrupt!r}")
    run = run if isinstance(run, RunDir) else RunDir(run)
    t0 = time.perf_counter()
    with run.lock("compact", wait=lock_wait):
        m = _manifest(run)
        generation = int(m.get("generation", 0))
        folded = list(m.get("folded", []))
        folded_set = set(folded)
        pending = sorted((p for p in run.glob(PARTS_GLOB) if p not in folded_set), key=_part_order)
        report = CompactionReport(generation=generation)
        if not pending:
            report.samples_total = int(m.get("rows", 0))
            report.seconds = time.perf_counter() - t0
            return report
        parts: list[pa.Table] = []
        good: list[str] = []
        iterator: Any = pending
        if progress:
            from tqdm import tqdm

            iterator = tqdm(pending, desc="compact: reading parts", unit="part")
        for rel in iterator:
            try:
                parts.append(_read_part(run, rel))
                good.append(rel)
            except CorruptPartError:
                if on_corrupt == "raise":
                    raise
                run.move(rel, "losses-quarantine/" + rel[len("losses/") :])
                report.quarantined.append(rel)
        _fault("compact:after_read")
        records = pa.concat_tables(parts) if parts else _PART_READ_SCHEMA.empty_table()
        old = load_table(run) if m.get("table") else None
        new_table, new_samples = _fold(run, old, records)
        report.parts_folded = len(good)
        report.rows_folded = records.num_rows
        report.nonfinite = int(pc.sum(pc.is_nan(records.column("loss"))).as_py() or 0)
        report.new_samples = new_samples
        report.samples_total = new_table.num_rows

        gen = generation + 1
        table_rel = f"table/table-{gen:06d}-{uuid.uuid4().hex[:8]}.parquet"
        run.publish_parquet(table_rel, new_table)
        _fault("compact:after_table_write")
        if int(_manifest(run).get("generation", 0)) != generation:
            run.remove(table_rel)
            raise RunLockedError(
                f"{run.display(MANIFEST)} changed while compacting (another compaction published "
                f"generation {_manifest(run).get('generation')}); this result was discarded. "
                "Run compact again"
            )
        manifest = {
            "generation": gen,
            "table": table_rel,
            "rows": new_table.num_rows,
            "folded": folded + good,
            "quarantined": list(m.get("quarantined", [])) + report.quarantined,
            "n_ref": int(m.get("n_ref") or 0),
            "format_version": FORMAT_VERSION,
        }
        run.publish_json(MANIFEST, manifest)
        _fault("compact:after_manifest")
        # keep the previous table for readers that still hold the old manifest
        keep = {table_rel, m.get("table")}
        for rel in run.glob("table/table-*.parquet"):
            if rel not in keep:
                run.remove(rel)
        report.generation = gen
        report.seconds = time.perf_counter() - t0
        return report


def _as_dictionary(col: pa.ChunkedArray | pa.Array) -> pa.DictionaryArray:
    """A string column as one dictionary array (chunk dictionaries unified; strings not copied
    when the column is already dictionary-encoded)."""
    chunks = col.chunks if isinstance(col, pa.ChunkedArray) else [col]
    enc = [c if pa.types.is_dictionary(c.type) else pc.dictionary_encode(c) for c in chunks]
    typ = pa.dictionary(pa.int32(), pa.string())
    enc = [c.cast(typ) for c in enc]
    if not enc:
        return pa.array([], typ)
    return pa.chunked_array(enc, type=typ).combine_chunks()


def _key_lengths(col: pa.ChunkedArray | pa.Array) -> np.ndarray:
    return _np(pc.binary_length(col)).astype(np.int64)


def _verify_uids(records: pa.Table) -> None:
    """Every record's uid must be the hash of its (shard, key): parts from an incompatible writer
    or with corrupted ids are rejected. Blockwise, so no 15M-string copies are made."""
    offset = 0
    for batch in records.select(["shard", "key", "uid"]).to_batches(max_chunksize=1 << 20):
        expected = sample_uids(batch.column(0), batch.column(1))
        got = batch.column(2).to_numpy(zero_copy_only=False)
        bad = np.flatnonzero(expected != got)
        if len(bad):
            b = int(bad[0])
            raise CorruptPartError(
                f"records of ({batch.column(0)[b].as_py()!r}, {batch.column(1)[b].as_py()!r}) carry uid "
                f"{int(got[b]):#018x}, expected {int(expected[b]):#018x} (seta_stream.ids.sample_uid); "
                "the part was written by an incompatible writer or is corrupted. Re-record it with "
                "LossRecorder, or pass on_corrupt='skip'",
            )
        offset += batch.num_rows


def _fold(run: RunDir, old: pa.Table | None, records: pa.Table) -> tuple[pa.Table, int]:
    """New table = old table updated with ``records`` (which are in (epoch, rank, seq) order).

    Identity checks without copying strings: every record's uid is verified against the hash
    of its (shard, key); two identities sharing a uid (a 64-bit collision) are detected by
    comparing shard and key length with the sample's other records and its table row. (A
    collision between two keys of equal length in the same shard, probability about 2^-64 per
    pair, is not detected.)
    """
    beta2 = float(run.settings["ema_beta2"])
    dataset_size = run.settings.get("dataset_size")
    if records.num_rows == 0:
        return (old if old is not None else TABLE_SCHEMA.empty_table()), 0
    _verify_uids(records)
    r_uid = _np(records.column("uid"))
    order = np.argsort(r_uid, kind="stable")  # keeps (epoch, rank, seq) order within a sample
    su = r_uid[order]
    starts, ends = _group_bounds(su)
    sizes = ends - starts
    last = ends - 1
    src = order[last]  # index in `records` of each sample's last record
    loss = _np(records.column("loss"))[order].astype(np.float64)
    finite = np.isfinite(loss)

    r_shard = _as_dictionary(records.column("shard"))
    r_names = r_shard.dictionary.to_pylist()
    r_codes = r_shard.indices.to_numpy(zero_copy_only=False)
    r_len = _key_lengths(records.column("key"))
    single = bool(sizes.max() == 1)  # one record per sample (one epoch folded): the common case
    rep = order if single else np.repeat(src, sizes)  # each sorted record's group representative
    diff = np.zeros(1, dtype=bool) if single else (r_codes[order] != r_codes[rep]) | (r_len[order] != r_len[rep])
    if diff.any():
        i, j = int(order[np.flatnonzero(diff)[0]]), int(rep[np.flatnonzero(diff)[0]])
        raise SampleIdCollisionError(
            f"records ({r_names[r_codes[i]]!r}, {records.column('key')[i].as_py()!r}) and "
            f"({r_names[r_codes[j]]!r}, {records.column('key')[j].as_py()!r}) carry the same uid "
            f"{int(r_uid[i]):#018x}; expected one uid per identity. Two keys collide: rename one"
        )

    g_uid = su[starts]
    g_count = sizes.astype(np.int32)
    g_nonfinite = (
        (~finite).astype(np.int32) if single else np.add.reduceat((~finite).astype(np.int32), starts).astype(np.int32)
    )
    g_loss = loss[last].astype(np.float32)
    g_epoch = _np(records.column("epoch"))[src]
    g_rank = _np(records.column("rank"))[src]
    g_seq = _np(records.column("seq"))[src]
    # EMA over finite records: s_new = b^n s_old + (1-b) sum_j b^(n-1-j) l_j  (§0.6)
    if single:
        g_sum = np.where(finite, (1.0 - beta2) * loss, 0.0)
        g_decay = np.where(finite, beta2, 1.0)
    else:
        fin_after = np.cumsum(finite[::-1].astype(np.int64))[::-1]  # finite records at >= i
        fin_after_next = np.append(fin_after[1:], 0)
        group_end_after = np.repeat(np.append(fin_after, 0)[ends], sizes)
        after_i = fin_after_next - group_end_after  # finite records after i within its group
        contrib = np.where(finite, (1.0 - beta2) * np.power(beta2, after_i) * np.where(finite, loss, 0.0), 0.0)
        g_sum = np.add.reduceat(contrib, starts)
        g_nfin = (fin_after[starts] - np.append(fin_after, 0)[ends]).astype(np.float64)
        g_decay = np.power(beta2, g_nfin)

    if old is None or old.num_rows == 0:
        matched = np.zeros(len(g_uid), dtype=bool)
        idx = np.zeros(len(g_uid), dtype=np.int64)
        n_old = 0
    else:
        t_uid = _np(old.column("uid"))
        n_old = len(t_uid)
        t_order = np.argsort(t_uid)  # the table is sorted by (shard, uid), not by uid
        t_sorted = t_uid[t_order]
        pos = np.searchsorted(t_sorted, g_uid)
        pos_c = np.minimum(pos, n_old - 1)
        matched = (pos < n_old) & (t_sorted[pos_c] == g_uid)
        idx = t_order[pos_c]
    new_mask = ~matched
    n_new = int(new_mask.sum())
    n_ref = int(dataset_size) if dataset_size else n_old + n_new

    if n_old == 0:
        sel = pa.array(src)
        cols = {
            "shard": _as_dictionary(records.column("shard").take(sel)),
            "key": records.column("key").take(sel),
            "uid": g_uid,
            "last_loss": g_loss,
            "last_epoch": g_epoch.astype(np.int32),
            "seen": g_count,
            "nonfinite": g_nonfinite,
            "ema": g_decay * (1.0 / n_ref) + g_sum,
            "last_rank": g_rank.astype(np.int32),
            "last_seq": g_seq.astype(np.int64),
        }
        return _sort_by_shard(pa.Table.from_pydict(cols, schema=TABLE_SCHEMA)), n_new

    # matched samples: same shard and key length as their table row (else a uid collision)
    assert old is not None
    ti = idx[matched]
    gm = np.flatnonzero(matched)
    t_shard = _as_dictionary(old.column("shard"))
    t_code_of = {name: code for code, name in enumerate(t_shard.dictionary.to_pylist())}
    r_to_t = np.array([t_code_of.get(name, -1) for name in r_names], dtype=np.int64)
    t_codes = t_shard.indices.to_numpy(zero_copy_only=False)
    t_len = _key_lengths(old.column("key"))
    bad = (r_to_t[r_codes[src[gm]]] != t_codes[ti]) | (r_len[src[gm]] != t_len[ti])
    if bad.any():
        k = int(np.flatnonzero(bad)[0])
        r_i, t_i = int(src[gm[k]]), int(ti[k])
        raise SampleIdCollisionError(
            f"({r_names[r_codes[r_i]]!r}, {records.column('key')[r_i].as_py()!r}) has uid "
            f"{int(g_uid[gm[k]]):#018x}, which the table already holds for "
            f"({t_shard[t_i].as_py()!r}, {old.column('key')[t_i].as_py()!r}); "
            "expected distinct uids for distinct samples. Rename one of the keys"
        )
    last_loss = _np(old.column("last_loss")).copy()
    last_epoch = _np(old.column("last_epoch")).copy()
    last_rank = _np(old.column("last_rank")).copy()
    last_seq = _np(old.column("last_seq")).copy()
    seen = _np(old.column("seen")).copy()
    nonfin = _np(old.column("nonfinite")).copy()
    ema = _np(old.column("ema")).copy()
    newer = (g_epoch[gm], g_rank[gm], g_seq[gm])
    cur = (last_epoch[ti], last_rank[ti], last_seq[ti])
    is_newer = (newer[0] > cur[0]) | (
        (newer[0] == cur[0]) & ((newer[1] > cur[1]) | ((newer[1] == cur[1]) & (newer[2] > cur[2])))
    )
    upd = ti[is_newer]
    srcm = gm[is_newer]
    last_loss[upd] = g_loss[srcm]
    last_epoch[upd] = g_epoch[srcm]
    last_rank[upd] = g_rank[srcm]
    last_seq[upd] = g_seq[srcm]
    seen[ti] += g_count[gm]
    nonfin[ti] += g_nonfinite[gm]
    ema[ti] = g_decay[gm] * ema[ti] + g_sum[gm]
    updated = pa.Table.from_pydict(
        {
            "shard": t_shard,
            "key": old.column("key"),
            "uid": _np(old.column("uid")),
            "last_loss": last_loss,
            "last_epoch": last_epoch,
            "seen": seen,
            "nonfinite": nonfin,
            "ema": ema,
            "last_rank": last_rank,
            "last_seq": last_seq,
        },
        schema=TABLE_SCHEMA,
    )
    if not n_new:
        return updated, 0
    gn = np.flatnonzero(new_mask)
    sel = pa.array(src[gn])
    added = pa.Table.from_pydict(
        {
            "shard": _as_dictionary(records.column("shard").take(sel)),
            "key": records.column("key").take(sel),
            "uid": g_uid[gn],
            "last_loss": g_loss[gn],
            "last_epoch": g_epoch[gn].astype(np.int32),
            "seen": g_count[gn],
            "nonfinite": g_nonfinite[gn],
            "ema": g_decay[gn] * (1.0 / n_ref) + g_sum[gn],
            "last_rank": g_rank[gn].astype(np.int32),
            "last_seq": g_seq[gn].astype(np.int64),
        },
        schema=TABLE_SCHEMA,
    )
    return _sort_by_shard(pa.concat_tables([updated, added]).combine_chunks()), n_new


def _sort_by_shard(table: pa.Table) -> pa.Table:
    """Order rows by (shard, uid)."""
    enc = _as_dictionary(table.column("shard"))
    names = enc.dictionary.to_pylist()
    rank = np.empty(len(names), dtype=np.int64)
    rank[np.argsort(np.array(names, dtype=object), kind="stable")] = np.arange(len(names))
    codes = rank[enc.indices.to_numpy(zero_copy_only=False)]
    perm = np.lexsort((_np(table.column("uid")), codes))
    return table.take(pa.array(perm)).combine_chunks()
