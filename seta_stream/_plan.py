"""Planning: run a policy on the loss table and publish the plan of an epoch.

``plan_epoch(run, e)`` reads the table columns the policy needs, adds listed-but-unrecorded
samples (``population``) as unseen rows, runs the policy, and publishes ``plans/epoch=e/``
(written by :mod:`seta_stream._store.planfiles`), then ``state.json`` (:mod:`seta_stream._store.state`).

Invariants: a plan, once published, is never recomputed unless ``force=True`` (a resumed run
gets exactly the plans of an uninterrupted one); the settings of a run (policy, params, seed,
epochs) are fixed by its first plan; planning an epoch below the last planned one whose plan is
missing is refused. Plans are deterministic: same table + seed + epoch -> same plan.

A plan is published by its stage files and plan.parquet (encoded on other threads while the
stage files are written), then summary.json, which completes it, then state.json: when
``plan_epoch`` returns, the plan folder holds every file. A planner killed before the summary
leaves no plan; the next plan_epoch of that epoch makes it again.

Fault injection for tests: ``SETA_STREAM_FAULT=plan:after_plan_file`` (after the stage files
and plan.parquet of a one-bucket plan, after every bucket's files of a partitioned one) or
``plan:after_summary`` SIGKILLs the process at that point.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
import tempfile
import threading
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ._kernels.arrays import column_to_numpy, group_order, is_broadcast
from ._kernels.batches import check_batch_size, final_batch_warning
from ._kernels.engine import Engine, ThreadEngine, get_engine
from ._store import state as run_state
from ._store.faults import fault
from ._store.layout import FORMAT_FILE, MANIFEST, STATE, plan_dir
from ._store.planfiles import (
    PLAN_SCHEMA,
    BucketPlanFiles,
    PlanIdentities,
    discard_leftovers,
    load_plan,
    load_summary,
    publish_plan,
    publish_summary,
    read_summary,
)
from ._store.runfs import RunDir
from ._store.slots import clear_claims
from ._store.table import (
    empty_table,
    load_numeric,
    load_table,
    load_table_keys,
    read_bucket,
    read_bucket_numeric,
    read_rows,
    table_buckets,
    table_shard_runs,
)
from .errors import EpochOrderError, InvalidInputError, PopulationLocationError, RunFormatError
from .ids import ShardLocations, sample_uids, shard_bucket, shard_location
from .policies import (
    REASONS,
    PolicyInput,
    PolicySpec,
    apply_guard,
    check_run_settings,
    plan_params,
    plan_partitioned,
    summarize,
)
from .policies.noise import narrow_reads
from .policies.steps import PlanContext

__all__ = [
    "plan_epoch",
    "load_plan",
    "load_summary",
    "read_state",
    "population_locations",
    "PLAN_SCHEMA",
]

_TABLE_COLUMNS = ["shard", "key", "uid", "last_loss", "last_epoch", "seen", "ema"]
#: Loss-history columns, read only for a policy that declares them (the noise rule).
_HISTORY_INPUTS = ["loss_count", "loss_mean"]
#: The value of each input column for a listed sample the table lacks (never recorded).
_UNSEEN: dict[str, tuple[Any, Any]] = {
    "last_loss": (np.nan, np.float32),
    "last_epoch": (-1, np.int32),
    "seen": (0, np.int32),
    "ema": (np.nan, np.float64),
    "loss_count": (0, np.int32),
    "loss_mean": (np.nan, np.float64),
}


def _table_columns(spec: PolicySpec, params: Any) -> list[str]:
    """The table columns a plan with a population reads: identities, the plan's numeric columns,
    and the history columns when the policy declares them."""
    declared = spec.table_columns(params)
    return _TABLE_COLUMNS + [c for c in _HISTORY_INPUTS if c in declared]


def _madvise_hugepage_setter() -> Any:
    """NumPy's switch for asking the kernel for transparent huge pages on large arrays (a
    private function, under numpy._core in NumPy 2 and numpy.core before), or None."""
    for name in ("numpy._core.multiarray", "numpy.core.multiarray"):
        with contextlib.suppress(ImportError, AttributeError):
            return importlib.import_module(name)._set_madvise_hugepage
    return None


@contextlib.contextmanager
def _normal_pages() -> Iterator[None]:
    """Planning allocates about 1 GB of short-lived arrays at 15M rows. NumPy asks the kernel to
    back large arrays with 2 MB transparent huge pages (madvise); on a VM whose host takes idle
    guest memory back, faulting those in cost 2.6 ms per MB here (3.1 s for 1.2 GB, against
    0.6 s with 4 KB pages; docs/benchmarks.md, "Planning"), more than planning's own work. So
    planning asks for normal pages while it runs and restores NumPy's setting afterwards, unless
    the user chose one with the NUMPY_MADVISE_HUGEPAGE environment variable."""
    setter = None if "NUMPY_MADVISE_HUGEPAGE" in os.environ else _madvise_hugepage_setter()
    if setter is None:
        yield
        return
    previous = setter(False)
    try:
        yield
    finally:
        setter(previous)


#: Modules planning imports on first use, in the order it needs them: polars (the sort of the
#: losses), pandas (which pyarrow imports at its first conversion between NumPy and Arrow) and
#: pyarrow.dataset (which ``pq.read_table`` imports: the identity columns are read with it).
_LAZY_IMPORTS = ("polars", "pandas", "pyarrow.dataset")


@contextlib.contextmanager
def _imports_beside() -> Iterator[None]:
    """Import :data:`_LAZY_IMPORTS` on a thread of their own while planning reads the table: in
    a fresh process they cost 0.3 - 0.5 s of CPU, which the reading threads, the policy and the
    identities' thread waited for, one after the other (docs/benchmarks.md, "Planning"). A module
    that planning imports meanwhile waits for this import (Python's per-module import lock), so
    nothing is imported twice; one that cannot be imported is left to fail where it is used.
    The thread is joined on the way out: no import is under way when planning returns (a
    DataLoader forking its workers then would leave them an import lock nobody releases)."""
    missing = [m for m in _LAZY_IMPORTS if m not in sys.modules]
    thread = None
    if missing:
        thread = threading.Thread(target=_import_all, args=(missing,), name="seta-stream-imports")
        thread.start()
    try:
        yield
    finally:
        if thread is not None:
            thread.join()


def _import_all(names: list[str]) -> None:
    for name in names:
        with contextlib.suppress(Exception):
            importlib.import_module(name)


def _run(run: str | RunDir) -> RunDir:
    return run if isinstance(run, RunDir) else RunDir(run)


def read_state(run: str | RunDir) -> dict[str, Any]:
    """Contents of state.json ({} for a run never planned)."""
    return run_state.read_state(_run(run))


#: how to fix a population whose locations are not the ones training recorded (the end of the error)
_POPULATION_HINT = (
    "The loss table holds the locations of the URLs training recorded, so the population and the training "
    "URLs name different locations (a mirror listed, other URLs trained?): list the population from the same "
    "URLs you train from, population=seta_stream.list_samples(<the URLs the training pipeline reads>); a run "
    "keeps the locations it first recorded, so training from shards moved elsewhere needs a new run directory"
)


def _shard_urls(t: pa.Table) -> list[dict[str, str]]:
    """The distinct (shard, url) pairs of a population table with a ``url`` column."""
    return (
        pa.table({"shard": pc.cast(t.column("shard"), pa.string()), "url": pc.cast(t.column("url"), pa.string())})
        .group_by(["shard", "url"])
        .aggregate([])
        .to_pylist()
    )


def population_locations(population: Any) -> dict[str, str]:
    """{shard name: location} of a population that carries its shards' URLs (the ``url`` column
    of ``list_samples``, in a table or a dict of columns); {} for one without (pairs are not
    consumed). A name with several locations keeps one: planning refuses such a population."""
    if isinstance(population, pa.Table):
        t = population
    elif isinstance(population, dict) and "url" in population and "shard" in population:
        t = pa.table({"shard": population["shard"], "url": population["url"]})
    else:
        return {}
    if "url" not in t.column_names or "shard" not in t.column_names or not t.num_rows:
        return {}
    out: dict[str, str] = {}
    for pair in _shard_urls(t):
        out.setdefault(pair["shard"], shard_location(pair["url"]))
    return out


def _population_table(population: Any, locations: dict[str, str], run: RunDir) -> pa.Table:
    """(shard, key) of the population; with a ``url`` column (as ``list_samples`` returns) the
    shard names are checked against their locations and the loss table's (a name standing for
    two shards stops planning with :class:`ShardNameConflictError`, one the table recorded
    elsewhere with :class:`PopulationLocationError`)."""
    if isinstance(population, pa.Table):
        t = population
    elif isinstance(population, dict):
        t = pa.table({c: population[c] for c in ("shard", "key", "url") if c in population})
    else:
        pairs = list(population)
        t = pa.table({"shard": [p[0] for p in pairs], "key": [p[1] for p in pairs]})
    missing = {"shard", "key"} - set(t.column_names)
    if missing:
        raise InvalidInputError(f"population lacks column(s) {sorted(missing)}; expected shard and key")
    if "url" in t.column_names and t.num_rows:
        seen = ShardLocations(
            locations,
            f"the loss table ({run.display(MANIFEST)})",
            "their samples would share one plan row per key, so nothing was planned",
            known_hint=_POPULATION_HINT,
            known_error=PopulationLocationError,
        )
        for pair in _shard_urls(t):
            seen.check(pair["shard"], shard_location(pair["url"]), f"the population, url {pair['url']!r}")
    return t.select(["shard", "key"]).cast(pa.schema([("shard", pa.string()), ("key", pa.string())]))


def _with_population(table: pa.Table, population: Any, locations: dict[str, str], run: RunDir) -> pa.Table:
    return _merge_population(table, _population_table(population, locations, run))


def _merge_population(table: pa.Table, pop: pa.Table) -> pa.Table:
    """``table``'s rows and the population's samples it lacks (unseen rows), grouped by shard."""
    if pop.num_rows == 0:
        return table
    uid = sample_uids(pop.column("shard"), pop.column("key"))
    uid, first = np.unique(uid, return_index=True)
    pop = pop.take(pa.array(first))
    known = np.isin(uid, table.column("uid").to_numpy())
    add = np.flatnonzero(~known)
    if len(add) == 0:
        return table
    n = len(add)
    columns = [c for c in table.column_names if c not in ("shard", "key", "uid")]
    extra = pa.table(
        {
            "shard": pop.column("shard").take(pa.array(add)),
            "key": pop.column("key").take(pa.array(add)),
            "uid": pa.array(uid[add], type=pa.uint64()),
            **{c: pa.array(np.full(n, _UNSEEN[c][0], dtype=_UNSEEN[c][1])) for c in columns},
        }
    )
    merged = pa.concat_tables([table.select(extra.column_names).cast(extra.schema), extra]).combine_chunks()
    # keep rows grouped by shard (stable: table order within a shard, then new rows)
    enc = pc.dictionary_encode(merged.column("shard")).combine_chunks()
    names = np.array(enc.dictionary.to_pylist(), dtype=object)
    rank = np.empty(len(names), dtype=np.int64)
    rank[np.argsort(names, kind="stable")] = np.arange(len(names))
    perm = group_order(rank[enc.indices.to_numpy(zero_copy_only=False)], len(names))
    return merged.take(pa.array(perm))


def plan_epoch(
    run: str | RunDir,
    epoch: int,
    *,
    policy: str | None = None,
    params: dict[str, Any] | None = None,
    epochs: int | None = None,
    seed: int | None = None,
    population: Iterable[tuple[str, str]] | pa.Table | dict[str, Any] | None = None,
    force: bool = False,
    engine: str | Engine | None = None,
    ray_address: str | None = None,
    batch_size: int | None = None,
) -> dict[str, Any]:
    """Plan ``epoch`` (0-based) and publish it; returns the summary dict.

    The first plan of a run fixes ``policy``, ``params``, ``epochs`` and ``seed`` (stored in
    state.json); later calls may omit them. If the plan of ``epoch`` exists it is returned as
    it is (plans are never recomputed silently) unless ``force=True``. ``population`` lists
    every (shard, key) of the data set so that samples never recorded are planned as unseen
    rows (otherwise the stage applies the plan's absent rule to them). The planned epoch
    becomes the stages' current epoch.

    A partitioned run (``buckets`` > 1) is planned bucket by bucket with the policy's steps
    (``policies.steps``): bit for bit the plan of the whole table. ``engine="ray"`` runs the
    per-bucket work as Ray tasks on the cluster ``ray.init(address=ray_address)`` reaches
    (every node must reach the run directory); the tasks write their buckets' plan files, and
    this process merges the small statistics and publishes the plan.

    ``params`` may also hold the safeguards every policy accepts (``min_keep_fraction``,
    ``max_weight``: docs/algorithms.md §0.10). ``batch_size``: the training loop's batch size,
    if known; the summary then records it and warns (``small_final_batch``) when the epoch's
    kept samples end with a batch of fewer than 8.
    """
    run = _run(run)
    epoch = int(epoch)
    if epoch < 0:
        raise InvalidInputError(f"epoch must be >= 0, got {epoch}")
    check_batch_size(batch_size, "plan_epoch")
    chosen = get_engine(engine, ray_address)
    with run.lock("plan", wait=120), _normal_pages():
        given = {"policy": policy, "params": params, "epochs": epochs, "seed": seed}
        summary = _plan_locked(run, epoch, given, population, force, chosen, batch_size)
    clear_claims(run, epoch)  # of an earlier attempt at this epoch: its readers start after this
    return summary


def _plan_locked(
    run: RunDir,
    epoch: int,
    given: dict[str, Any],
    population: Any,
    force: bool,
    chosen: Engine,
    batch_size: int | None,
) -> dict[str, Any]:
    """The body of :func:`plan_epoch`, holding the run's plan lock."""
    state = run_state.read_state(run)
    cfg = run_state.resolve_settings(run, state, given, force)
    if not 0 <= epoch < cfg["epochs"]:
        raise InvalidInputError(f"epoch {epoch} is outside the run's epochs 0..{cfg['epochs'] - 1}; raise epochs")
    existing = read_summary(run, epoch)
    if existing is not None and not force:
        # also completes state.json if a crash came between the summary and the state
        new_state = run_state.after_plan(state, cfg, epoch, existing)
        if new_state != state:
            run.publish_json(STATE, new_state)
        return existing
    last = int(state.get("last_planned_epoch", -1))
    if epoch < last and not force:
        raise EpochOrderError(
            f"{run.display(plan_dir(epoch))}: epoch {epoch} has no plan but epoch {last} was "
            f"already planned; plans are made in epoch order (a resumed run finds its plans "
            f"published). Plan epoch >= {last}, or pass force=True to plan it anyway"
        )
    # bad parameters fail before any reading
    spec, params, safeguards = plan_params(cfg["policy"], **cfg["params"])
    with _imports_beside():
        discard_leftovers(run, epoch)  # of a planner killed while publishing (one plans at a time)
        check_run_settings(spec, params, run.settings, run.display(FORMAT_FILE))
        manifest = dict(run.read_json(MANIFEST, default=None) or {})
        done = (batch_size, safeguards)
        if run.buckets > 1:
            return _plan_buckets(run, epoch, spec, params, cfg, state, manifest, population, chosen, done)
        if population is not None:
            columns = _table_columns(spec, params)
            table = load_table(run, columns=columns, manifest=manifest)
            table = _with_population(table, population, manifest.get("shard_locations") or {}, run)
            numeric = {c: _column(table.column(c)) for c in columns if c not in ("shard", "key")}
            ids = PlanIdentities(table.column("shard"), table.column("key"))
            del table
            result, inp, guard = _run_policy(spec, params, numeric, manifest, epoch, cfg, safeguards)
            listed = True
        else:
            # the policy needs only the numeric columns; the identity columns are read on the
            # other core while it runs (pyarrow and most NumPy loops release the GIL)
            columns = spec.table_columns(params)
            numeric = load_numeric(run, columns, manifest=manifest, dtypes=narrow_reads(spec.columns, params))
            with ThreadPoolExecutor(1) as pool:
                reading = pool.submit(_read_identities, run, manifest)
                result, inp, guard = _run_policy(spec, params, numeric, manifest, epoch, cfg, safeguards)
                ids = reading.result()
            listed = False
        del numeric
        held = [inp]  # _publish drops the input's columns once the summary has read them
        del inp
        return _publish(run, epoch, ids, result, held, guard, (cfg, params, done), state, manifest, listed)


def _run_policy(
    spec: PolicySpec,
    params: Any,
    numeric: dict[str, np.ndarray],
    manifest: dict[str, Any],
    epoch: int,
    cfg: dict[str, Any],
    safeguards: Any = None,
) -> tuple[Any, PolicyInput, Any]:
    """(result, input, guard) of the policy on the table columns it declares, with the
    safeguards (§0.10) and the empty-plan guard applied.

    The columns move from ``numeric`` (emptied) into the policy's input, and the policy gets
    the only reference to its input: the loss history (``loss_count``, ``loss_mean``), which
    only the noise rule reads, is freed as soon as the rule lets go of it (120 MB at 15M rows
    while SeTa plans the other rows). The input returned, which the guard, the summary and the
    plan files read, is the same without the history."""
    box = [
        PolicyInput.from_columns(
            {c: numeric[c] for c in spec.table_columns(params)},
            epoch=epoch,
            epochs=cfg["epochs"],
            seed=cfg["seed"],
            n_ref=int(manifest.get("n_ref") or 0),
        )
    ]
    numeric.clear()
    inp = replace(box[0], loss_count=None, loss_mean=None)
    result = spec.fn(box.pop(), params)
    return result, inp, apply_guard(result, inp, safeguards)


def _publish(
    run: RunDir,
    epoch: int,
    ids: PlanIdentities,
    result: Any,
    held: list[PolicyInput],
    guard: Any,
    settings: tuple[dict[str, Any], Any, tuple[int | None, Any]],
    state: dict[str, Any],
    manifest: dict[str, Any],
    population_listed: bool,
) -> dict[str, Any]:
    """Publish the stage files and plan.parquet, then summary.json, then state.json; returns
    the summary.

    ``held``: the policy's input, alone in a list that nothing else references: the summary is
    the last reader of the columns the plan files do not hold (``seen``, the loss history...),
    so it takes the input out of the list and they are freed while plan.parquet is written
    (240 MB at 15M rows with the noise rule)."""
    cfg, params, (batch_size, safeguards) = settings
    columns = _plan_columns(held[0], result)

    def summary() -> None:
        summarize(result, held.pop(), cfg["policy"], params, guard, safeguards)

    publish_plan(run, epoch, ids, columns, summary)
    fault("plan:after_plan_file")
    return _complete(run, epoch, dict(result.summary), cfg, state, manifest, population_listed, batch_size)


def _complete(
    run: RunDir,
    epoch: int,
    summary: dict[str, Any],
    cfg: dict[str, Any],
    state: dict[str, Any],
    manifest: dict[str, Any],
    population_listed: bool,
    batch_size: int | None = None,
) -> dict[str, Any]:
    """summary.json (which marks the plan complete for training), then state.json; returns the summary."""
    summary["pruned_so_far"] = run_state.pruned_so_far(state, epoch, int(summary["n"]), int(summary["kept"]))
    summary["phase"] = summary.get("phase", "prune")
    summary["table_generation"] = int(manifest.get("generation", 0))
    summary["population_listed"] = population_listed
    if batch_size is not None:
        summary["batch_size"] = batch_size
        small = final_batch_warning(summary, batch_size)
        if small is not None:
            summary["warnings"] = [*summary.get("warnings", []), small]
    publish_summary(run, epoch, summary)
    fault("plan:after_summary")
    run.publish_json(STATE, run_state.after_plan(state, cfg, epoch, summary))
    return summary


# ---------------------------------------------------------------------------------- buckets
#: Buckets a local partitioned plan works on at once (each pass, and the rows pass that writes
#: the plan files). Two use both cores of a small machine; each bucket in flight adds its pass's
#: transient arrays (a few bytes a row of one bucket) to the peak, so the count stays fixed
#: rather than growing with the machine's cores.
_BUCKET_THREADS = 2

#: Bytes of bucket inputs a partitioned plan keeps between its passes (buckets past it are
#: read again from their files at each pass); what the steps derive from a kept bucket
#: (``PolicyInput.memo``, up to about 0.7 of it) comes on top.
_INPUT_CACHE_BYTES = 1 << 29


class _Buckets:
    """The buckets of a partitioned plan: each bucket's policy input (its table file's rows
    plus the population's samples the table lacks), read when asked and kept while they fit
    in :data:`_INPUT_CACHE_BYTES`, and its identity columns for the plan files.

    The steps' passes get the columns the policy declares (``columns``); the rows pass, which
    writes the plan files and counts the summary, also gets the other plan columns
    (``row_columns``), read from the bucket's file with its identity columns. Why: the
    uniform-draw policies declare only the uid, and keeping or spilling the loss and seen
    columns of every bucket for their passes (16 bytes a sample instead of 8) cost about a
    fifth of a dynamic random plan at 200M samples (docs/benchmarks.md, "Web scale"). With a
    population the merged rows are kept whole (merging again would cost more)."""

    def __init__(
        self,
        run: RunDir,
        manifest: dict[str, Any],
        columns: list[str],
        population: list[pa.Table] | None,
        row_columns: list[str] | None = None,
    ) -> None:
        row_columns = row_columns or columns
        #: the table columns merged with a population (the history ones only when declared)
        self.merged_columns = _TABLE_COLUMNS + [c for c in _HISTORY_INPUTS if c in set(columns) | set(row_columns)]
        if population is not None:
            columns = sorted(set(columns) | set(row_columns))
        self.run, self.columns, self.population = run, columns, population
        #: the plan columns the rows pass reads beside the identities
        self.extra = [c for c in row_columns if c not in columns]
        self._rows_ids: dict[int, PlanIdentities] = {}
        self.count = run.buckets
        self.files = table_buckets(manifest) or [None] * self.count
        if len(self.files) != self.count:
            raise RunFormatError(
                f"{run.display(MANIFEST)}: the table has {len(self.files)} buckets, the run's settings say "
                f"{self.count}; expected the same (buckets are fixed when the run is created)"
            )
        self.context: PlanContext | None = None
        self._cache: dict[int, dict[str, np.ndarray]] = {}
        self._memo: dict[int, dict[str, Any]] = {}
        self._cached = 0
        self._lock = threading.Lock()  # buckets are read on several threads (ThreadEngine)
        #: buckets past the cache: their input columns as .npy files in a scratch folder
        #: (TMPDIR), memory-mapped by later passes: 3-4x cheaper than decoding Parquet again
        self._spill: Any = tempfile.TemporaryDirectory(prefix="seta-stream-plan-")
        self._spilled: dict[int, dict[str, str]] = {}

    def __getstate__(self) -> dict[str, Any]:
        """Without the cache or the spill (a Ray task reads the buckets it is given)."""
        return {
            **self.__dict__,
            "_cache": {},
            "_memo": {},
            "_cached": 0,
            "_spill": None,
            "_spilled": {},
            "_rows_ids": {},
            "_lock": None,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def close(self) -> None:
        if self._spill is not None:
            self._spill.cleanup()

    def _table(self, b: int, columns: list[str]) -> pa.Table:
        bucket = self.files[b]
        return empty_table(columns) if bucket is None else read_bucket(self.run, bucket, columns)[0]

    def _merged(self, b: int) -> pa.Table:
        return _merge_population(self._table(b, self.merged_columns), self.population[b])

    def numeric(self, b: int) -> dict[str, np.ndarray]:
        cols = self._cache.get(b)
        if cols is not None:
            return cols
        if b in self._spilled:
            return {name: np.load(path, mmap_mode="r") for name, path in self._spilled[b].items()}
        if self.population is not None:
            merged = self._merged(b)
            cols = {c: _column(merged.column(c)) for c in self.columns}
        elif self.files[b] is None:
            cols = {c: _column(self._table(b, self.columns).column(c)) for c in self.columns}
        else:
            cols = read_bucket_numeric(self.run, self.files[b], self.columns)
        size = sum(a.nbytes for a in cols.values())
        with self._lock:
            cache = self._cached + size <= _INPUT_CACHE_BYTES
            if cache:
                self._cached += size
        if cache:
            self._memo[b] = {}
            self._cache[b] = cols
        elif self._spill is not None:  # later passes map the arrays instead of decoding Parquet
            self._spilled[b] = self._spill_arrays(b, cols)
            self._memo[b] = _SpilledMemo(os.path.join(self._spill.name, f"b{b:05d}-memo"))
        return cols

    def release(self, b: int) -> None:
        """Forget bucket b's input and what the steps derived from it (its spilled files are
        removed), once its plan rows are written: the rows pass holds less memory and the
        scratch folder is emptied bucket by bucket instead of all at the end (about 3 s at 200M
        samples, on this process's last step). A bucket asked for again (the empty-plan guard
        writes every bucket again) is read again from its file."""
        cols = self._cache.pop(b, None)
        if cols is not None:
            with self._lock:
                self._cached -= sum(a.nbytes for a in cols.values())
        memo = self._memo.pop(b, None)
        if isinstance(memo, _SpilledMemo):
            memo.remove()
        for path in (self._spilled.pop(b, None) or {}).values():
            os.unlink(path)

    def count_rows(self, b: int) -> int:
        """Bucket b's number of rows (its input read, and kept or spilled for the passes)."""
        return len(self.numeric(b)["uid"])

    def _spill_arrays(self, b: int, cols: dict[str, np.ndarray]) -> dict[str, str]:
        paths = {}
        for name, array in cols.items():
            paths[name] = os.path.join(self._spill.name, f"b{b:05d}-{name}.npy")
            np.save(paths[name], np.ascontiguousarray(array))
        return paths

    def input(self, b: int) -> PolicyInput:
        """Bucket b's policy input; a bucket kept in memory also keeps what the policy's steps
        derive from it (``PolicyInput.memo``) until the plan is written."""
        return self._policy_input(b, self.numeric(b))

    def rows_input(self, b: int) -> PolicyInput:
        """Bucket b's input for the rows pass: :meth:`input` and the plan columns the policy
        does not declare, read with the identity columns (which :meth:`identities` then gives)."""
        cols = self.numeric(b)
        if self.extra:
            t = self._table(b, ["shard", "key", *self.extra])
            self._rows_ids[b] = PlanIdentities(t.column("shard"), t.column("key"))
            cols = {**cols, **{c: _column(t.column(c)) for c in self.extra}}
        return self._policy_input(b, cols)

    def _policy_input(self, b: int, cols: dict[str, np.ndarray]) -> PolicyInput:
        """A PolicyInput of bucket b's ``cols`` (read by :meth:`numeric`, which sets its memo)."""
        ctx = self.context
        assert ctx is not None
        return PolicyInput.from_columns(
            cols, epoch=ctx.epoch, epochs=ctx.epochs, seed=ctx.seed, n_ref=ctx.n_ref, memo=self._memo.get(b)
        )

    def identities(self, b: int) -> PlanIdentities:
        ids = self._rows_ids.pop(b, None)
        if ids is not None:
            return ids
        t = self._merged(b) if self.population is not None else self._table(b, ["shard", "key"])
        return PlanIdentities(t.column("shard"), t.column("key"))


class _SpilledMemo(dict):  # type: ignore[type-arg]
    """``PolicyInput.memo`` of a spilled bucket: what the steps derive from its rows, arrays
    saved as .npy files beside its spilled columns and memory-mapped (read-only) when a later
    pass asks; other values, and constant arrays (a broadcast value: nothing to save), kept as
    they are.

    Why: without a memo every pass derives them again, and at 100M samples (12 buckets, 11 of
    them spilled) a SeTa plan computed each bucket's uniform keys (a 64-bit mix of every uid)
    and its sets about four times: 52 calls of ``mix64_array`` (5.5 s) where one per bucket
    does (docs/benchmarks.md, "Web scale").
    """

    def __init__(self, prefix: str) -> None:
        super().__init__()
        self.prefix = prefix
        self._files = 0

    def remove(self) -> None:
        """Remove the files saved so far (the memo is not used again)."""
        for i in range(self._files):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(f"{self.prefix}-{i}.npy")
        self.clear()

    def _save(self, value: Any) -> Any:
        if isinstance(value, np.ndarray) and not is_broadcast(value):  # a constant stays one
            path = f"{self.prefix}-{self._files}.npy"
            self._files += 1
            np.save(path, np.ascontiguousarray(value))
            return _Saved(path)
        if isinstance(value, tuple):
            return tuple(self._save(v) for v in value)
        return value

    def _load(self, value: Any) -> Any:
        if isinstance(value, _Saved):
            return np.load(value.path, mmap_mode="r")
        if isinstance(value, tuple):
            return tuple(self._load(v) for v in value)
        return value

    def __setitem__(self, key: str, value: Any) -> None:
        super().__setitem__(key, self._save(value))

    def __getitem__(self, key: str) -> Any:
        return self._load(super().__getitem__(key))

    def get(self, key: str, default: Any = None) -> Any:
        return self[key] if key in self else default


@dataclass(frozen=True)
class _Saved:
    path: str


def _split_population(population: Any, locations: dict[str, str], run: RunDir) -> list[pa.Table]:
    """The population's (shard, key) rows per bucket (checked against the table's locations)."""
    pop = _population_table(population, locations, run)
    enc = pc.dictionary_encode(pop.column("shard")).combine_chunks()
    lut = np.array([shard_bucket(s, run.buckets) for s in enc.dictionary.to_pylist()], np.int64)
    where = lut[enc.indices.to_numpy(zero_copy_only=False)] if len(lut) else np.zeros(0, np.int64)
    return [pop.take(pa.array(np.flatnonzero(where == b))) for b in range(run.buckets)]


def _plan_buckets(
    run: RunDir,
    epoch: int,
    spec: PolicySpec,
    params: Any,
    cfg: dict[str, Any],
    state: dict[str, Any],
    manifest: dict[str, Any],
    population: Any,
    engine: Engine,
    done: tuple[int | None, Any] = (None, None),
) -> dict[str, Any]:
    """Plan a partitioned run: the policy's steps over the buckets (``policies.steps``); each
    bucket's rows are written where they are decided (``plans.BucketPlanFiles``: by this process,
    or by the bucket's Ray task), and this process publishes the folders and the summary."""
    engine.check_run(run, "plan", "the plan's files")
    pop = None
    if population is not None:
        pop = _split_population(population, manifest.get("shard_locations") or {}, run)
    declared = sorted(set(spec.columns(params)) | {"uid"})
    buckets = _Buckets(run, manifest, declared, pop, spec.table_columns(params))
    local = ThreadEngine(min(_BUCKET_THREADS, os.cpu_count() or 1)) if engine.name == "local" else None
    n = sum((local or Engine()).map(buckets.count_rows, range(buckets.count)))
    ctx = PlanContext(epoch, cfg["epochs"], cfg["seed"], n, int(manifest.get("n_ref") or 0) or n)
    buckets.context = ctx
    files = BucketPlanFiles(run, epoch)
    scored: set[bool] = set()
    try:
        summary = plan_partitioned(
            spec,
            params,
            ctx,
            buckets.input,
            buckets.count,
            _WriteBucket(buckets, files),
            files.restart,
            local or engine,
            lambda b, has_score: scored.add(has_score),
            buckets.rows_input,
            done[1],
        )
        files.commit()
    except BaseException:
        files.discard()
        raise
    finally:
        buckets.close()
    fault("plan:after_plan_file")
    summary["stage"] = {"buckets": buckets.count, "score": True in scored}
    return _complete(run, epoch, summary, cfg, state, manifest, population is not None, done[0])


class _WriteBucket:
    """Writes one bucket's plan rows (picklable: a Ray task writes its bucket's files)."""

    def __init__(self, buckets: _Buckets, files: BucketPlanFiles) -> None:
        self.buckets, self.files = buckets, files

    def __call__(self, b: int, inp: PolicyInput, result: Any) -> bool:
        has_score = self.files.write(b, self.buckets.identities(b), _plan_columns(inp, result))
        self.buckets.release(b)
        fault("plan:bucket_written")
        return has_score


def _plan_columns(inp: PolicyInput, result: Any) -> dict[str, Any]:
    """The columns ``plans`` writes for these rows and their decisions."""
    n = inp.n
    return {
        "uid": inp.uid,
        "loss": inp.last_loss,
        "cluster": result.cluster if result.cluster is not None else np.full(n, -1, dtype=np.int16),
        "keep": result.keep,
        "weight": result.weight,
        "reason": result.reason,
        "reason_names": list(REASONS),
        "score": result.score,
    }


def _column(col: Any) -> np.ndarray:
    return column_to_numpy(col)


def _read_identities(run: RunDir, manifest: dict[str, Any]) -> PlanIdentities:
    """Read the identity columns. Runs beside the policy, so it decodes on this thread only.

    The keys come memory-mapped from the table's keys file; a table without one (written by an
    older version) has its keys decoded from Parquet."""
    table_keys = load_table_keys(run, manifest)
    if table_keys is not None:
        if not run.is_local:
            shard = load_table(run, ["shard"], use_threads=False, manifest=manifest).column("shard")
            return PlanIdentities(shard, table_keys)
        # a one-bucket table file has its shard ranges in its footer: no column to read then
        runs = table_shard_runs(run, manifest)
        shard = None if runs else load_table(run, ["shard"], use_threads=False, manifest=manifest).column("shard")
        # each plan.parquet part maps the keys again, and releases them once written; a one-bucket
        # table's uid and last_loss are read again for each part too (the planned rows are the
        # table's rows, in its order: load_numeric read them)
        one = len(table_buckets(manifest)) == 1
        return PlanIdentities(
            shard,
            table_keys,
            lambda: load_table_keys(run, manifest),
            (lambda lo, n: read_rows(run, manifest, ["uid", "last_loss"], lo, n)) if one else None,
            (runs.names, runs.starts, runs.stops, runs.chunk_rows) if runs else None,
        )
    t = load_table(run, ["shard", "key"], use_threads=False, manifest=manifest)
    return PlanIdentities(t.column("shard"), t.column("key"))
