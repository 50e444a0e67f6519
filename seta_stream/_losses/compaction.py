"""Compaction: fold the pending loss parts into a new loss table, exactly once, crash-safe.

The transaction around the pure fold (``fold.fold``). Steps, and the :data:`FAULT_POINTS`
(``faults.fault``) where a test kills the process:

1. take ``locks/compact.lock`` (two compactions never interleave) -- ``compact:locked``;
2. read the manifest and every part under ``losses/`` it does not list (``parts``); a part
   that cannot be folded raises, or with ``on_corrupt="skip"`` moves to
   ``losses-quarantine/`` -- ``compact:after_quarantine``; shard locations are checked
   against the table's (a conflict stops here, before anything is written) --
   ``compact:after_read``;
3. fold the records into the old table's columns (``fold``; a part the fold finds corrupt is
   quarantined like the others and the fold runs again without it);
4. write the new table file and its keys file under fresh names (``table``) --
   ``compact:after_table_write``;
5. re-check the manifest's generation (a compaction that published meanwhile wins; this
   result is discarded), then replace the manifest: the new table and the parts it folds
   appear together -- ``compact:after_manifest``;
6. remove table files older than the previous one and temporaries -- ``compact:after_cleanup``.

A kill before step 5 leaves the previous manifest, so a rerun folds the same parts from the
same previous table once; a kill after it leaves the new one. Either way a rerun converges to
the table of an undisturbed run (tests/test_crash_compaction.py kills at every point).

A partitioned run (format version 2, ``run.buckets`` > 1) does steps 2-4 bucket by bucket:
each pending part is read once and its rows routed to their buckets' scratch files
(``route``), then each bucket's old rows and records are folded by the same ``fold`` and
written as the bucket's file of the new table folder (``table.PartitionedTableWriter``), one
bucket in memory at a time. ``compact:after_bucket`` kills after the first bucket's file.
Steps 5 and 6 are the same: one manifest names every bucket's new file at once.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import pyarrow as pa

from .._kernels.engine import Engine, get_engine
from .._store.faults import fault
from .._store.layout import MANIFEST
from .._store.parts import (
    merge_location_maps,
    merge_locations,
    part_locations,
    pending_parts,
    quarantine_part,
    quarantined_parts,
    read_part,
    read_part_keys,
)
from .._store.runfs import RunDir
from .._store.table import (
    TABLE_SCHEMA,
    PartitionedTableWriter,
    TableBucket,
    make_manifest,
    manifest_files,
    publish_bucket,
    publish_manifest,
    publish_table,
    read_column,
    read_identity,
    read_manifest,
    remove_table_files_except,
    table_buckets,
)
from ..errors import CorruptPartError, InvalidInputError, RunFormatError, RunLockedError
from .fold import Folded, OldTable, Records, fold
from .route import RoutedRecords

__all__ = ["compact", "CompactionReport", "FAULT_POINTS"]

#: Named points where ``SETA_STREAM_FAULT=<point>`` kills the compacting process (tests only):
#: after taking the lock, after reading the parts, after quarantining a corrupt part, after
#: writing the new table file, after replacing the manifest, after removing old table files.
FAULT_POINTS = (
    "compact:locked",
    "compact:after_read",
    "compact:after_quarantine",
    "compact:after_bucket",
    "compact:bucket_written",
    "compact:after_table_write",
    "compact:after_manifest",
    "compact:after_cleanup",
)


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


def compact(
    run: str | RunDir,
    *,
    on_corrupt: Literal["raise", "skip"] = "raise",
    progress: bool = False,
    lock_wait: float = 0.0,
    engine: str | Engine | None = None,
    ray_address: str | None = None,
) -> CompactionReport:
    """Fold every loss part not yet in the table into a new table and publish it.

    Holds ``locks/compact.lock`` (waits up to ``lock_wait`` seconds for another compaction,
    then raises :class:`RunLockedError`). ``on_corrupt="raise"`` raises
    :class:`CorruptPartError` naming the first unreadable or foreign part and changes nothing;
    ``on_corrupt="skip"`` moves such parts to ``losses-quarantine/`` (listed in the report and
    the manifest) and folds the others. Safe to rerun at any time: without new parts it
    changes nothing.

    ``engine="ray"`` (``pip install seta-stream[ray]``) routes and folds a partitioned run's
    buckets as Ray tasks on the cluster ``ray.init(address=ray_address)`` reaches (the run
    directory must be on a filesystem every node mounts); this process publishes the manifest.
    A one-bucket run is compacted here whatever the engine.
    """
    if on_corrupt not in ("raise", "skip"):
        raise InvalidInputError(f"on_corrupt must be 'raise' or 'skip', found {on_corrupt!r}")
    run = run if isinstance(run, RunDir) else RunDir(run)
    chosen = get_engine(engine, ray_address)
    t0 = time.perf_counter()
    with run.lock("compact", wait=lock_wait):
        fault("compact:locked")
        m = read_manifest(run)
        report = CompactionReport(generation=int(m.get("generation", 0)), samples_total=int(m.get("rows", 0)))
        pending = pending_parts(run, m.get("folded", []))
        if pending and run.buckets > 1:
            _compact_buckets(run, m, pending, on_corrupt == "skip", progress, report, chosen)
        elif pending:
            _compact_pending(run, m, pending, on_corrupt == "skip", progress, report)
        else:  # still finish the cleanup of a compaction killed after publishing
            remove_table_files_except(run, manifest_files(m))
        report.seconds = time.perf_counter() - t0
        return report


def _compact_pending(
    run: RunDir, m: dict[str, Any], pending: list[str], skip: bool, progress: bool, report: CompactionReport
) -> None:
    """Steps 2 to 6 for the ``pending`` parts of manifest ``m``; fills ``report``."""
    bar = _progress(progress, len(pending))
    parts, good = _read_parts(run, pending, skip, report, bar)
    locations = merge_locations(run, m.get("shard_locations") or {}, parts, good)
    fault("compact:after_read")
    records = Records(parts, good, _PartKeys(run, good))
    del parts  # the records keep no key strings
    folded, old_keys = _fold(run, m, records, good, skip, report, bar)
    del records
    if bar is not None:
        bar.close()
    report.parts_folded = len(good)
    report.rows_folded = folded.records
    report.nonfinite = folded.nan_losses
    report.new_samples = folded.new_samples
    report.samples_total = folded.rows
    table = pa.Table.from_pydict(folded.columns, schema=TABLE_SCHEMA)
    n_ref = folded.n_ref
    del folded

    generation = int(m.get("generation", 0))
    # same rows, same keys: the keys file stays
    table_rel, keys_rel = publish_table(run, generation + 1, table, old_keys if report.new_samples == 0 else None)
    fault("compact:after_table_write")
    _check_generation(run, m, table_rel, keys_rel)
    manifest = make_manifest(
        generation=generation + 1,
        table=table_rel,
        keys=keys_rel,
        previous=m,
        rows=table.num_rows,
        folded=list(m.get("folded", [])) + good,
        quarantined=sorted(set(m.get("quarantined", [])) | quarantined_parts(run)),
        n_ref=n_ref or int(m.get("n_ref") or 0),
        shard_locations=locations,
    )
    del table
    publish_manifest(run, manifest)
    fault("compact:after_manifest")
    remove_table_files_except(run, {table_rel, m.get("table"), keys_rel, m.get("keys")})
    fault("compact:after_cleanup")
    report.generation = generation + 1


def _read_parts(
    run: RunDir, pending: list[str], skip: bool, report: CompactionReport, bar: Any
) -> tuple[list[pa.Table], list[str]]:
    """(parts, their paths): the pending parts that pass ``parts.read_part``; the others raise
    or (``skip``) are quarantined."""
    parts: list[pa.Table] = []
    good: list[str] = []
    for rel in pending:
        try:
            parts.append(read_part(run, rel))
            good.append(rel)
        except CorruptPartError:
            if not skip:
                raise
            _quarantine(run, rel, report)
        if bar is not None:
            bar.update(1)
    return parts, good


def _quarantine(run: RunDir, rel: str, report: CompactionReport) -> None:
    quarantine_part(run, rel)
    report.quarantined.append(rel)
    fault("compact:after_quarantine")


class _PartKeys:
    """The fold's key source (``fold.KeySource``): part k's key column, re-read from its file.

    The records drop their key strings after the parts are read (see ``fold.Records``): a
    compaction of known samples needs none, and at 15M records they take about 400 MB; the
    fold asks for a part's keys only for new samples and error messages."""

    def __init__(self, run: RunDir, names: list[str]) -> None:
        self.run = run
        self.names = list(names)

    def __call__(self, k: int) -> pa.ChunkedArray:
        return read_part_keys(self.run, self.names[k])


def _old_table(run: RunDir, bucket: TableBucket | None) -> tuple[OldTable, str | None]:
    """The fold's view of one bucket of the old table (statistics columns read one at a time,
    when the fold asks for them), and the keys file its key column was mapped from (None:
    decoded from the table file, or no table)."""
    if bucket is None:
        return OldTable.empty(), None
    identity, mapped = read_identity(run, bucket)
    old = OldTable(identity.column("shard"), identity.column("key"), identity.column("uid"), _StatColumns(run, bucket))
    return old, bucket.keys if mapped else None


class _StatColumns:
    """The fold's ``OldTable.stats`` source: one column of the old bucket's file per call."""

    def __init__(self, run: RunDir, bucket: TableBucket) -> None:
        self.run, self.bucket = run, bucket

    def __call__(self, name: str) -> pa.ChunkedArray:
        return read_column(self.run, self.bucket, name)


def _fold(
    run: RunDir, m: dict[str, Any], records: Records, good: list[str], skip: bool, report: CompactionReport, bar: Any
) -> tuple[Folded, str | None]:
    """(the fold of ``records`` into ``m``'s table, the old table's keys file); a part the fold
    finds corrupt is quarantined (``skip``) and the fold runs again without it."""
    settings = run.settings
    while True:
        if bar is not None:
            bar.reset(total=len(good))
            bar.set_description("compact: folding parts")
        buckets = table_buckets(m)
        old, old_keys = _old_table(run, buckets[0] if buckets else None)
        try:
            folded = fold(
                old,
                records,
                beta2=float(settings["ema_beta2"]),
                dataset_size=settings.get("dataset_size"),
                on_part=None if bar is None else lambda: bar.update(1),
            )
            return folded, old_keys
        except CorruptPartError as exc:  # a part whose uids are not the hash of its ids
            if not skip or exc.path not in good:
                raise
            good.remove(exc.path)
            _quarantine(run, exc.path, report)
            records = Records([read_part(run, rel) for rel in good], good, _PartKeys(run, good))
        finally:
            del old


def _check_generation(run: RunDir, m: dict[str, Any], table_rel: str, keys_rel: str) -> None:
    """Raise :class:`RunLockedError` (removing the files just written) if another compaction
    published since ``m`` was read."""

    def discard() -> None:
        run.remove(table_rel)
        if keys_rel != m.get("keys"):
            run.remove(keys_rel)

    _same_generation(run, m, discard)


def _same_generation(run: RunDir, m: dict[str, Any], discard: Any) -> None:
    """Call ``discard()`` and raise :class:`RunLockedError` if the manifest's generation is no
    longer ``m``'s (another compaction published meanwhile)."""
    generation = int(m.get("generation", 0))
    current = int(read_manifest(run).get("generation", 0))
    if current == generation:
        return
    discard()
    raise RunLockedError(
        f"{run.display(MANIFEST)} changed while compacting: generation {current}, expected "
        f"{generation} (another compaction published meanwhile, its lock broken or not "
        "honoured by the storage); this result was discarded and nothing was lost. Run "
        "compact again, and run one compaction at a time"
    )


# ---------------------------------------------------------------------------------- buckets
def _compact_buckets(
    run: RunDir,
    m: dict[str, Any],
    pending: list[str],
    skip: bool,
    progress: bool,
    report: CompactionReport,
    engine: Engine,
) -> None:
    """Steps 2 to 6 of a partitioned run: route, fold bucket by bucket (on ``engine``), publish
    once from this process."""
    n_buckets = run.buckets
    old = table_buckets(m)
    if old and len(old) != n_buckets:
        raise RunFormatError(
            f"{run.display(MANIFEST)}: the table has {len(old)} buckets, the run's settings say "
            f"{n_buckets}; expected the same (buckets are fixed when the run is created). Restore "
            "the run's seta-stream.json"
        )
    generation = int(m.get("generation", 0))
    while True:  # once, unless the fold finds a corrupt part to set aside (skip)
        bar = _progress(progress, n_buckets)
        scratch = _scratch(run, engine)
        routed: list[_Routed] = []
        try:
            if not scratch:  # routing happens here (the local engine)
                routed = [_Route(run, n_buckets, None)((0, pending))]
            else:
                routed = list(engine.map(_Route(run, n_buckets, scratch), list(enumerate(_chunks(pending, engine)))))
            good, locations = _routed_parts(run, m, routed, skip, report)
            fault("compact:after_read")
            writer = PartitionedTableWriter(run, generation + 1)
            fold = _FoldBucket(run, old, [r.records for r in routed], [r.offset for r in routed], good, writer)
            try:
                totals = _fold_buckets(run, fold, engine, writer, bar)
            except CorruptPartError as exc:  # a part whose uids are not the hash of its ids
                writer.remove(manifest_files(m))
                if not skip or exc.path not in good:
                    raise
                _quarantine(run, exc.path, report)
                pending = [p for p in good if p != exc.path]
                continue
        finally:
            for r in routed:
                r.records.remove()
            if scratch:
                run.remove(run.rel(scratch))
            if bar is not None:
                bar.close()
        break
    fault("compact:after_table_write")
    _same_generation(run, m, lambda: writer.remove(manifest_files(m)))
    report.parts_folded = len(good)
    report.rows_folded, report.nonfinite, report.new_samples, n_ref = totals
    report.samples_total = sum(writer.rows)
    manifest = make_manifest(
        generation=generation + 1,
        table=writer.folder,
        keys=writer.keys,
        previous=m,
        rows=report.samples_total,
        folded=list(m.get("folded", [])) + good,
        quarantined=sorted(set(m.get("quarantined", [])) | quarantined_parts(run)),
        n_ref=n_ref or int(m.get("n_ref") or 0),
        shard_locations=locations,
        bucket_rows=writer.rows,
    )
    publish_manifest(run, manifest)
    fault("compact:after_manifest")
    remove_table_files_except(run, manifest_files(manifest))
    fault("compact:after_cleanup")
    report.generation = generation + 1


def _scratch(run: RunDir, engine: Engine) -> str | None:
    """Where a Ray engine's tasks route records: a temporary folder in the run directory
    (every node reaches it); None for the local engine (a folder in TMPDIR)."""
    if engine.name == "local":
        return None
    engine.check_run(run, "compact", "routing scratch files")
    return run.path(f"table/.tmp-route-{uuid.uuid4().hex[:8]}")


def _chunks(pending: list[str], engine: Engine) -> list[list[str]]:
    """Consecutive groups of parts, one routing task each (the local engine: one group)."""
    if engine.name == "local":
        return [pending]
    size = max(1, -(-len(pending) // 64))
    return [pending[i : i + size] for i in range(0, len(pending), size)]


@dataclass
class _Routed:
    """What routing a group of parts gave: the parts routed and their shard locations, the
    parts that cannot be folded (with their errors), the scratch files, the group's offset."""

    offset: int
    good: list[str]
    maps: list[dict[str, str]]
    corrupt: list[tuple[str, CorruptPartError]]
    records: RoutedRecords


class _Route:
    """Route group ``i``'s parts to bucket scratch files (a task of the engine)."""

    def __init__(self, run: RunDir, buckets: int, scratch: str | None) -> None:
        self.run, self.buckets, self.scratch = run, buckets, scratch

    def __call__(self, item: tuple[int, list[str]]) -> _Routed:
        i, parts = item
        folder = None if self.scratch is None else f"{self.scratch}/chunk-{i:05d}"
        records = RoutedRecords(self.buckets, folder=folder)
        good: list[str] = []
        maps: list[dict[str, str]] = []
        corrupt: list[tuple[str, CorruptPartError]] = []
        for rel in parts:
            try:
                part = read_part(self.run, rel)
            except CorruptPartError as exc:
                corrupt.append((rel, exc))
                continue
            records.add(len(good), part)
            good.append(rel)
            maps.append(part_locations(part.schema))
        records.close()
        return _Routed(0, good, maps, corrupt, records)


def _routed_parts(
    run: RunDir, m: dict[str, Any], routed: list[_Routed], skip: bool, report: CompactionReport
) -> tuple[list[str], dict[str, str]]:
    """The parts routed (in fold order) and the shard locations after them; a part that cannot
    be folded raises, or (``skip``) is quarantined; a name standing for two locations stops
    here, before anything is written to the run."""
    good: list[str] = []
    maps: list[dict[str, str]] = []
    for r in routed:
        for rel, exc in r.corrupt:
            if not skip:
                raise exc
            _quarantine(run, rel, report)
        r.offset = len(good)
        good.extend(r.good)
        maps.extend(r.maps)
    return good, merge_location_maps(run, m.get("shard_locations") or {}, maps, good)


class _FoldBucket:
    """Fold bucket b and write its file (a task of the engine); ``count(b)`` counts its new
    samples first when n_ref is the table's rows after the compaction."""

    def __init__(
        self,
        run: RunDir,
        old: list[TableBucket],
        routed: list[RoutedRecords],
        offsets: list[int],
        good: list[str],
        writer: PartitionedTableWriter,
    ) -> None:
        self.run, self.old, self.routed, self.offsets, self.good = run, old, routed, offsets, good
        self.target = writer.target()
        self.n_ref: int | None = None

    def _old(self, b: int) -> TableBucket | None:
        return self.old[b] if self.old else None

    def count(self, b: int) -> int:
        uids = [r.bucket_uids(b) for r in self.routed]
        return _count_new(self.run, self._old(b), np.concatenate(uids) if uids else np.zeros(0, np.uint64))

    def __call__(self, b: int) -> tuple[int, str, int, int, int]:
        """(rows, keys file, records, NaN losses, new samples) of bucket b's new file."""
        pieces = [(o + k, t) for r, o in zip(self.routed, self.offsets) for k, t in r.bucket(b)]
        tables = [t for _, t in pieces]
        records = Records(tables, [self.good[k] for k, _ in pieces], lambda j, tables=tables: tables[j].column("key"))
        old_b, old_keys = _old_table(self.run, self._old(b))
        beta2 = float(self.run.settings["ema_beta2"])
        folded = fold(old_b, records, beta2=beta2, dataset_size=self.n_ref)
        del old_b, records, tables, pieces
        table = pa.Table.from_pydict(folded.columns, schema=TABLE_SCHEMA)
        same_rows = table.num_rows == (self._old(b).rows if self._old(b) else 0)
        keys = publish_bucket(self.run, self.target, b, table, old_keys if same_rows else None)
        fault("compact:bucket_written")
        return table.num_rows, keys, folded.records, folded.nan_losses, folded.new_samples


def _fold_buckets(
    run: RunDir, fold_bucket: _FoldBucket, engine: Engine, writer: PartitionedTableWriter, bar: Any
) -> tuple[int, int, int, int]:
    """Fold and write every bucket; returns (records, NaN losses, new samples, n_ref).

    ``n_ref`` (the EMA start 1/n_ref of new samples) is ``dataset_size`` or the table's rows
    after this compaction, so without ``dataset_size`` the new samples of every bucket are
    counted first (uids of its records not in its old rows)."""
    n_buckets = run.buckets
    new_counts = None
    n_ref = run.settings.get("dataset_size")
    if not n_ref:
        new_counts = list(engine.map(fold_bucket.count, range(n_buckets)))
        n_ref = sum(b.rows for b in fold_bucket.old) + sum(new_counts)
    fold_bucket.n_ref = int(n_ref)
    totals = np.zeros(3, np.int64)
    for b, (rows, keys, records, nan_losses, new) in enumerate(engine.map(fold_bucket, range(n_buckets))):
        if new_counts is not None and new != new_counts[b]:
            raise RuntimeError(
                f"bucket {b}: the fold added {new} samples, {new_counts[b]} were counted before it; "
                "nothing was published"
            )
        writer.record(b, rows, keys)
        totals += (records, nan_losses, new)
        if b == 0:
            fault("compact:after_bucket")
        if bar is not None:
            bar.update(1)
    return int(totals[0]), int(totals[1]), int(totals[2]), int(n_ref)


def _count_new(run: RunDir, bucket: TableBucket | None, uids: np.ndarray) -> int:
    """How many samples of a bucket's records are not among its old rows (by uid: two
    identities with one uid stop the fold itself)."""
    unique = np.unique(uids)
    if bucket is None or bucket.rows == 0:
        return len(unique)
    old_uid = read_column(run, bucket, "uid").to_numpy()
    return int(len(unique) - np.count_nonzero(np.isin(unique, old_uid)))


def _progress(enabled: bool, total: int) -> Any:
    if not enabled:
        return None
    from tqdm import tqdm

    return tqdm(total=total, desc="compact: reading parts", unit="part")
