"""Planning: run a policy on the loss table and publish the plan of an epoch.

``plan_epoch(run, e)`` reads the table columns the policy needs, adds listed-but-unrecorded
samples (``population``: :mod:`.population`) as unseen rows, runs the policy (a partitioned run:
its steps over the buckets, :mod:`.buckets`), and publishes ``plans/epoch=e/`` (written by
:mod:`seta_stream._store.planfiles`), then ``state.json`` (:mod:`seta_stream._store.state`). This
is the transaction: the settings (:class:`~.settings.PlanSettings`), the plan lock, the order of
publishing; :mod:`.tuning` holds the process tuning it runs under.

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

import os
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

import numpy as np
import pyarrow as pa

from .._kernels.arrays import column_to_numpy
from .._kernels.batches import check_batch_size, final_batch_warning
from .._kernels.engine import Engine, ThreadEngine, get_engine
from .._store import state as run_state
from .._store.faults import fault
from .._store.layout import FORMAT_FILE, MANIFEST, STATE, plan_dir
from .._store.planfiles import (
    BucketPlanFiles,
    PlanIdentities,
    discard_leftovers,
    publish_plan,
    publish_summary,
    read_summary,
)
from .._store.runfs import RunDir
from .._store.slots import clear_claims
from .._store.table import (
    load_numeric,
    load_table,
    load_table_keys,
    read_rows,
    table_buckets,
    table_shard_runs,
)
from ..errors import EpochOrderError, InvalidInputError
from ..policies import (
    REASONS,
    PolicyInput,
    PolicySpec,
    apply_guard,
    check_run_settings,
    plan_params,
    plan_partitioned,
    summarize,
)
from ..policies.noise import NoiseParams, previous_threshold, versioned_params
from ..policies.registry import planned_columns, planned_function, planned_narrow_reads, planned_table_columns
from ..policies.steps import PlanContext
from ..policies.summary import summary_params
from .buckets import Buckets
from .population import split_population, table_columns, with_population
from .settings import PlanSettings
from .tuning import imports_beside, normal_pages

__all__ = ["plan_epoch", "plan"]


def _run(run: str | RunDir) -> RunDir:
    return run if isinstance(run, RunDir) else RunDir(run)


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
    settings = PlanSettings(
        policy=policy,
        params=params,
        epochs=epochs,
        seed=seed,
        population=population,
        engine=engine,
        ray_address=ray_address,
        batch_size=batch_size,
        force=force,
    )
    return plan(run, epoch, settings)


def plan(run: str | RunDir, epoch: int, settings: PlanSettings) -> dict[str, Any]:
    """:func:`plan_epoch` with its settings in one :class:`PlanSettings` (``Pruner`` holds one)."""
    run = _run(run)
    epoch = int(epoch)
    if epoch < 0:
        raise InvalidInputError(f"epoch must be >= 0, got {epoch}")
    check_batch_size(settings.batch_size, "plan_epoch")
    chosen = get_engine(settings.engine, settings.ray_address)
    with run.lock("plan", wait=120), normal_pages():
        summary = _plan_locked(run, epoch, settings, chosen)
    clear_claims(run, epoch)  # of an earlier attempt at this epoch: its readers start after this
    return summary


def _plan_locked(run: RunDir, epoch: int, settings: PlanSettings, chosen: Engine) -> dict[str, Any]:
    """The body of :func:`plan`, holding the run's plan lock."""
    population, force, batch_size = settings.population, settings.force, settings.batch_size
    state = run_state.read_state(run)
    given = settings.run_settings()
    # the noise rule's version (§12.12): the one the run's first plan fixed, 1 for a run planned
    # before versions were stored (made explicit in its settings), the current one for a new run
    stored = state.get("params") if state.get("policy") else None
    if stored is not None:
        state = {**state, "params": versioned_params(stored, stored)}
    given["params"] = versioned_params(given.get("params"), state.get("params") if stored is not None else None)
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
    spec, params, safeguards, noise = plan_params(cfg["policy"], **cfg["params"])
    # the chain: population merge, the noise rule's stage (rule 2 holds its threshold to the
    # previous plan's, §12.12), the policy, the safeguards, the summary
    floor = previous_threshold(read_summary(run, epoch - 1) if epoch > 0 else None, noise)
    chain = _Chain(spec, params, noise, floor)
    with imports_beside():
        discard_leftovers(run, epoch)  # of a planner killed while publishing (one plans at a time)
        check_run_settings(spec, params, run.settings, run.display(FORMAT_FILE))
        manifest = dict(run.read_json(MANIFEST, default=None) or {})
        done = (batch_size, safeguards)
        if run.buckets > 1:
            return _plan_buckets(run, epoch, chain, cfg, state, manifest, population, chosen, done)
        if population is not None:
            columns = table_columns(chain.table_columns)
            table = load_table(run, columns=columns, manifest=manifest)
            table = with_population(table, population, manifest.get("shard_locations") or {}, run)
            numeric = {c: column_to_numpy(table.column(c)) for c in columns if c not in ("shard", "key")}
            ids = PlanIdentities(table.column("shard"), table.column("key"))
            del table
            result, inp, guard = _run_policy(chain, numeric, manifest, epoch, cfg, safeguards)
            listed = True
        else:
            # the policy needs only the numeric columns; the identity columns are read on the
            # other core while it runs (pyarrow and most NumPy loops release the GIL)
            numeric = load_numeric(run, chain.table_columns, manifest=manifest, dtypes=chain.narrow_reads)
            with ThreadPoolExecutor(1) as pool:
                reading = pool.submit(_read_identities, run, manifest)
                result, inp, guard = _run_policy(chain, numeric, manifest, epoch, cfg, safeguards)
                ids = reading.result()
            listed = False
        del numeric
        held = [inp]  # _publish drops the input's columns once the summary has read them
        del inp
        return _publish(
            run, epoch, ids, result, held, guard, (cfg, chain.summary_params, done), state, manifest, listed
        )


class _Chain:
    """A plan's policy with the noise rule's stage in front of it (``noise``, ``floor``: rule
    2's previous threshold): the function, the steps, the table columns they read and the
    parameters the summary lists."""

    def __init__(self, spec: PolicySpec, params: Any, noise: NoiseParams, floor: float | None) -> None:
        self.spec, self.params, self.noise, self.floor = spec, params, noise, floor
        self.declared = planned_columns(spec, params, noise)
        self.table_columns = planned_table_columns(spec, params, noise)
        self.narrow_reads = planned_narrow_reads(spec, params, noise)
        self.summary_params = summary_params(params, noise, spec)

    def fn(self) -> Any:
        """The whole-table function, called ``fn(inp, chain.params)``. It is handed out rather
        than called here so that no frame of the chain holds the input while the function runs:
        the noise stage lets go of the loss history once it has read it, and the history is only
        freed if the stage held the last reference (120 MB at 15M rows while SeTa plans; on CPython
        3.11 and later: before 3.11 a call's arguments stay on the caller's stack until it returns)."""
        return planned_function(self.spec, self.noise, self.floor)


def _run_policy(
    chain: _Chain,
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
            {c: numeric[c] for c in chain.table_columns},
            epoch=epoch,
            epochs=cfg["epochs"],
            seed=cfg["seed"],
            n_ref=int(manifest.get("n_ref") or 0),
        )
    ]
    numeric.clear()
    inp = replace(box[0], loss_count=None, loss_mean=None)
    fn = chain.fn()
    result = fn(box.pop(), chain.params)  # the input's only reference goes to the function
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


def _plan_buckets(
    run: RunDir,
    epoch: int,
    chain: _Chain,
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
        pop = split_population(population, manifest.get("shard_locations") or {}, run)
    declared = sorted(chain.declared | {"uid"})
    buckets = Buckets(run, manifest, declared, pop, chain.table_columns)
    local = ThreadEngine(min(_BUCKET_THREADS, os.cpu_count() or 1)) if engine.name == "local" else None
    n = sum((local or Engine()).map(buckets.count_rows, range(buckets.count)))
    ctx = PlanContext(epoch, cfg["epochs"], cfg["seed"], n, int(manifest.get("n_ref") or 0) or n)
    buckets.context = ctx
    files = BucketPlanFiles(run, epoch)
    scored: set[bool] = set()
    try:
        summary = plan_partitioned(
            chain.spec,
            chain.params,
            ctx,
            buckets.input,
            buckets.count,
            _WriteBucket(buckets, files),
            files.restart,
            local or engine,
            lambda b, has_score: scored.add(has_score),
            buckets.rows_input,
            done[1],
            chain.noise,
            chain.floor,
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

    def __init__(self, buckets: Buckets, files: BucketPlanFiles) -> None:
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
