"""Planning: run a policy on the loss table and publish the plan of an epoch.

``plan_epoch(run, e)`` reads the table columns the policies need, adds listed-but-unrecorded
samples (``population``) as unseen rows, runs the policy, and publishes ``plans/epoch=e/``:

* ``plan.parquet``: one row per known sample, a folder of Parquet parts written in parallel
  (docs/format.md, "Plans");
* ``keys.arrow`` + ``lookup.arrow`` + ``shards.arrow``: what the stage memory-maps (rows
  grouped by shard; keys.arrow is a hard link to the table's keys file, or written while the
  policy runs, and published after it);
* ``summary.json``: written last, so its presence means the plan is complete;

then ``state.json`` (policy, params, seed, epochs, per-epoch history, ``current_epoch``).

Invariants: a plan, once published, is never recomputed unless ``force=True`` (a resumed run
gets exactly the plans of an uninterrupted one); the settings of a run (policy, params, seed,
epochs) are fixed by its first plan; planning an epoch below the last planned one whose plan is
missing is refused. Plans are deterministic: same table + seed + epoch -> same plan.

Fault injection for tests: ``SETA_STREAM_FAULT=plan:after_plan_file`` or
``plan:after_summary`` SIGKILLs the process at that point.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import signal
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .errors import EpochOrderError, InvalidInputError, PlanMissingError, RunFormatError, ShardNameConflictError
from .ids import depth_hint, sample_uids, shard_location
from .policies import REASONS, PolicyInput, PolicySpec, apply_guard, policy_params, summarize
from .runfs import PendingFile, RunDir
from .table import MANIFEST, load_numeric, load_table, load_table_keys

__all__ = ["plan_epoch", "load_plan", "load_summary", "set_current_epoch", "read_state", "PLAN_SCHEMA"]

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

_TABLE_COLUMNS = ["shard", "key", "uid", "last_loss", "last_epoch", "seen", "ema"]
_NUMERIC_COLUMNS = ["uid", "last_loss", "last_epoch", "seen", "ema"]
_SHARD_TYPE = pa.dictionary(pa.int32(), pa.string())
#: Rows per part of the plan.parquet folder. The parts are encoded in parallel: at 15M rows
#: (8 parts) planning takes about 0.25 s less on 2 CPUs than with one file encoded on one
#: thread (docs/benchmarks.md, "Planning").
PLAN_PART_ROWS = 1 << 21
#: plan.parquet: LZ4, like the loss table. At 15M rows it is 320 MB instead of 715 MB
#: uncompressed, and every megabyte of a new file costs page-cache pages: on the benchmark VM a
#: fresh 700 MB file takes 1.6 s to write however it is encoded, far more than LZ4's CPU time
#: (docs/benchmarks.md, "Planning"). Dictionary pages only for the low-cardinality columns;
#: statistics only for the numeric columns (those of the identity columns and of the few-valued
#: keep and reason columns cannot prune a row group and cost 10% of the encoding); values
#: encoded in batches of 64K and pages cut by size (1 MB) rather than every 20K rows
#: (pyarrow's defaults, 1K and 20K rows, cost about a quarter of the write time at 15M rows).
_PLAN_WRITE_OPTIONS: dict[str, Any] = {
    "compression": "lz4",
    "use_dictionary": ["shard", "reason"],
    "write_statistics": ["loss", "cluster", "weight"],
    "write_batch_size": 1 << 16,
    "max_rows_per_page": 1 << 20,
}


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


def _fault(point: str) -> None:
    if os.environ.get("SETA_STREAM_FAULT") == point:
        os.kill(os.getpid(), signal.SIGKILL)


def _run(run: str | RunDir) -> RunDir:
    return run if isinstance(run, RunDir) else RunDir(run)


def read_state(run: str | RunDir) -> dict[str, Any]:
    """Contents of state.json ({} for a run never planned)."""
    return dict(_run(run).read_json("state.json", default=None) or {})


def plan_dir(epoch: int) -> str:
    return f"plans/epoch={int(epoch)}"


def load_summary(run: str | RunDir, epoch: int) -> dict[str, Any]:
    """The summary of the plan of ``epoch`` (PlanMissingError if it was never planned)."""
    run = _run(run)
    s = run.read_json(f"{plan_dir(epoch)}/summary.json", default=None)
    if s is None:
        raise PlanMissingError(
            f"{run.display(plan_dir(epoch), 'summary.json')}: no plan for epoch {epoch}; call "
            f"seta_stream.plan_epoch(run, {epoch}) (or pruner.start_epoch({epoch})) before "
            "iterating the loader of that epoch"
        )
    return dict(s)


def load_plan(run: str | RunDir, epoch: int, columns: list[str] | None = None) -> pa.Table:
    """plan.parquet of ``epoch`` as an Arrow table."""
    run = _run(run)
    load_summary(run, epoch)  # raises PlanMissingError with a hint
    return run.read_parquet(f"{plan_dir(epoch)}/plan.parquet", columns=columns)


def set_current_epoch(run: str | RunDir, epoch: int) -> None:
    """Mark ``epoch`` as the one the stages use when a DataLoader iterator starts."""
    run = _run(run)
    load_summary(run, epoch)
    state = read_state(run)
    if state.get("current_epoch") != epoch:
        state["current_epoch"] = int(epoch)
        run.publish_json("state.json", state)


def _population_table(population: Any, locations: dict[str, str], run: RunDir) -> pa.Table:
    """(shard, key) of the population; with a ``url`` column (as ``list_samples`` returns) the
    shard names are checked against their locations and the loss table's (a name standing for
    two shards stops planning with :class:`ShardNameConflictError`)."""
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
        pairs = (
            pa.table({"shard": pc.cast(t.column("shard"), pa.string()), "url": pc.cast(t.column("url"), pa.string())})
            .group_by(["shard", "url"])
            .aggregate([])
            .to_pylist()
        )
        seen = {s: (loc, f"the loss table ({run.display(MANIFEST)})") for s, loc in locations.items()}
        for pair in pairs:
            shard, url = pair["shard"], pair["url"]
            location = shard_location(url)
            other = seen.setdefault(shard, (location, f"the population ({url!r})"))
            if other[0] != location:
                raise ShardNameConflictError(
                    f"shard name {shard!r} stands for two shards: {other[0]!r} (in {other[1]}) and {location!r} "
                    f"(in the population, url {url!r}); their samples would share one plan row per key, so "
                    f"nothing was planned. {depth_hint(other[0], location)}"
                )
    return t.select(["shard", "key"]).cast(pa.schema([("shard", pa.string()), ("key", pa.string())]))


def _with_population(table: pa.Table, population: Any, locations: dict[str, str], run: RunDir) -> pa.Table:
    pop = _population_table(population, locations, run)
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
    extra = pa.table(
        {
            "shard": pop.column("shard").take(pa.array(add)),
            "key": pop.column("key").take(pa.array(add)),
            "uid": pa.array(uid[add], type=pa.uint64()),
            "last_loss": pa.array(np.full(n, np.nan, dtype=np.float32)),
            "last_epoch": pa.array(np.full(n, -1, dtype=np.int32)),
            "seen": pa.array(np.zeros(n, dtype=np.int32)),
            "ema": pa.array(np.full(n, np.nan)),
        }
    )
    merged = pa.concat_tables([table.select(_TABLE_COLUMNS).cast(extra.schema), extra]).combine_chunks()
    # keep rows grouped by shard (stable: table order within a shard, then new rows)
    enc = pc.dictionary_encode(merged.column("shard")).combine_chunks()
    names = np.array(enc.dictionary.to_pylist(), dtype=object)
    rank = np.empty(len(names), dtype=np.int64)
    rank[np.argsort(names, kind="stable")] = np.arange(len(names))
    perm = np.argsort(rank[enc.indices.to_numpy(zero_copy_only=False)], kind="stable")
    return merged.take(pa.array(perm))


def _resolve_settings(
    state: dict[str, Any],
    policy: str | None,
    params: dict[str, Any] | None,
    epochs: int | None,
    seed: int | None,
    force: bool,
    run: RunDir,
) -> dict[str, Any]:
    given = {"policy": policy, "params": params, "epochs": epochs, "seed": seed}
    if not state.get("policy"):
        if policy is None or epochs is None:
            raise InvalidInputError(
                f"{run.display('state.json')}: this run has no plan yet, so its first plan needs "
                "policy= and epochs= (CLI: --policy NAME --epochs N); seed defaults to 0"
            )
        return {"policy": policy, "params": dict(params or {}), "epochs": int(epochs), "seed": int(seed or 0)}
    resolved = {k: state[k] for k in ("policy", "params", "epochs", "seed")}
    for k, v in given.items():
        if v is None:
            continue
        if isinstance(v, dict):  # params
            v = dict(v)
        if v != resolved[k]:
            if not force:
                raise InvalidInputError(
                    f"{run.display('state.json')}: the run was planned with {k}={resolved[k]!r}, "
                    f"this call asks {k}={v!r}; a run's settings are fixed by its first plan. Use "
                    "a new run directory, or pass force=True (CLI: --force) to change them from "
                    "this epoch on"
                )
            resolved[k] = v
    return resolved


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
) -> dict[str, Any]:
    """Plan ``epoch`` (0-based) and publish it; returns the summary dict.

    The first plan of a run fixes ``policy``, ``params``, ``epochs`` and ``seed`` (stored in
    state.json); later calls may omit them. If the plan of ``epoch`` exists it is returned as
    it is (plans are never recomputed silently) unless ``force=True``. ``population`` lists
    every (shard, key) of the data set so that samples never recorded are planned as unseen
    rows (otherwise the stage applies the plan's absent rule to them). The planned epoch
    becomes the stages' current epoch.
    """
    run = _run(run)
    epoch = int(epoch)
    if epoch < 0:
        raise InvalidInputError(f"epoch must be >= 0, got {epoch}")
    with run.lock("plan", wait=120), _normal_pages():
        state = read_state(run)
        cfg = _resolve_settings(state, policy, params, epochs, seed, force, run)
        if not 0 <= epoch < cfg["epochs"]:
            raise InvalidInputError(f"epoch {epoch} is outside the run's epochs 0..{cfg['epochs'] - 1}; raise epochs")
        existing = run.read_json(f"{plan_dir(epoch)}/summary.json", default=None)
        if existing is not None and not force:
            # also completes state.json if a crash came between the summary and the state
            new_state = _state_with(state, cfg, epoch, existing)
            if new_state != state:
                run.publish_json("state.json", new_state)
            return dict(existing)
        last = int(state.get("last_planned_epoch", -1))
        if epoch < last and not force:
            raise EpochOrderError(
                f"{run.display(plan_dir(epoch))}: epoch {epoch} has no plan but epoch {last} was "
                f"already planned; plans are made in epoch order (a resumed run finds its plans "
                f"published). Plan epoch >= {last}, or pass force=True to plan it anyway"
            )
        spec, params = policy_params(cfg["policy"], **cfg["params"])  # bad parameters fail before any reading
        # files and folders a planner killed while publishing left (only one plans at a time)
        for rel in run.glob(f"{plan_dir(epoch)}/.tmp-*"):
            run.remove(rel)
        _check_ema_setting(run, cfg["policy"], params)
        manifest = dict(run.read_json(MANIFEST, default=None) or {})
        if population is not None:
            table = load_table(run, columns=_TABLE_COLUMNS, manifest=manifest)
            table = _with_population(table, population, manifest.get("shard_locations") or {}, run)
            numeric = {c: _np(table.column(c)) for c in _NUMERIC_COLUMNS}
            ids = _Identities(table.column("shard"), table.column("key"))
            del table
            return _plan_and_publish(run, manifest, numeric, ids, epoch, cfg, (spec, params), state, True)
        # the policy needs only the numeric columns; the identity columns are read on the
        # other core while it runs (pyarrow and most NumPy loops release the GIL)
        numeric = load_numeric(run, _policy_columns(cfg), manifest=manifest)
        with ThreadPoolExecutor(1) as pool:
            strings = pool.submit(_read_identities, run, manifest, plan_dir(epoch))
            return _plan_and_publish(run, manifest, numeric, strings, epoch, cfg, (spec, params), state, False)


def _policy_columns(cfg: dict[str, Any]) -> list[str]:
    """The table columns the run's policy reads: no policy reads ``last_epoch``, and only ES,
    ESWP and InfoBatch with ``score="ema"`` read ``ema`` (skipping them saves 12 bytes a row)."""
    needs_ema = cfg["policy"] in ("es", "eswp") or (
        cfg["policy"] == "infobatch" and cfg["params"].get("score", "last") == "ema"
    )
    return ["uid", "last_loss", "seen"] + (["ema"] if needs_ema else [])


def _unread(n: int, value: float | int, dtype: Any) -> np.ndarray:
    """A column the policy does not read, as a read-only constant view (no memory)."""
    return np.broadcast_to(np.array(value, dtype=dtype), (n,))


def _np(col: Any) -> np.ndarray:
    return col.to_numpy() if isinstance(col, pa.ChunkedArray) else col.to_numpy(zero_copy_only=False)


class _Identities:
    """The plan's identity columns: ``shard`` with one dictionary for all chunks, ``key``, and
    the row ranges of the shards (rows are grouped by shard)."""

    def __init__(self, shard: pa.ChunkedArray | pa.Array, key: pa.ChunkedArray | pa.Array) -> None:
        if isinstance(shard, pa.Array):
            shard = pa.chunked_array([shard])
        if not pa.types.is_dictionary(shard.type):  # population rows: encode like the table read
            shard = pc.dictionary_encode(shard)
        # one dictionary, so that plan.parquet keeps the shard column dictionary-encoded
        # without decoding it, and the ranges are found on the integer codes
        shard = shard.cast(_SHARD_TYPE).unify_dictionaries()
        self.shard: pa.ChunkedArray = shard
        self.key = key if isinstance(key, pa.ChunkedArray) else pa.chunked_array([key])
        self.starts, self.stops, self.names = _shard_runs(shard)
        self.keys_file: PendingFile | None = None  # keys.arrow, written ahead of the plan


def _read_identities(run: RunDir, manifest: dict[str, Any], d: str) -> _Identities:
    """Read the identity columns and prepare keys.arrow, unpublished (the policy may still
    fail). Runs beside the policy, so it decodes on this thread only.

    The keys come memory-mapped from the table's keys file, and keys.arrow is a hard link to
    it; a table without one (written by an older version) has its keys decoded from Parquet
    and written out."""
    table_keys = load_table_keys(run, manifest)
    if table_keys is not None:
        shard = load_table(run, ["shard"], use_threads=False, manifest=manifest).column("shard")
        ids = _Identities(shard, table_keys[0])
        with contextlib.suppress(FileNotFoundError):  # removed by compactions meanwhile: write it
            ids.keys_file = run.prepare_link(table_keys[1], f"{d}/keys.arrow")
    else:
        t = load_table(run, ["shard", "key"], use_threads=False, manifest=manifest)
        ids = _Identities(t.column("shard"), t.column("key"))
    if ids.keys_file is None:
        ids.keys_file = run.prepare_arrow(f"{d}/keys.arrow", pa.table({"key": ids.key}))
    return ids


def _plan_and_publish(
    run: RunDir,
    manifest: dict[str, Any],
    numeric: dict[str, np.ndarray],
    ids: _Identities | Future[_Identities],
    epoch: int,
    cfg: dict[str, Any],
    policy: tuple[PolicySpec, Any],
    state: dict[str, Any],
    population_listed: bool,
) -> dict[str, Any]:
    spec, params = policy  # validated by plan_epoch
    uid = numeric["uid"]
    n = len(uid)
    try:
        inp = PolicyInput(
            uid=uid,
            last_loss=numeric["last_loss"],
            ema=numeric["ema"] if "ema" in numeric else _unread(n, np.nan, np.float64),
            seen=numeric["seen"],
            last_epoch=numeric["last_epoch"] if "last_epoch" in numeric else _unread(n, -1, np.int32),
            epoch=epoch,
            epochs=cfg["epochs"],
            seed=cfg["seed"],
            n_ref=int(manifest.get("n_ref") or 0),
        )
        del numeric
        result = spec.fn(inp, params)
        guard = apply_guard(result, inp)
    except BaseException:
        if isinstance(ids, Future):  # drop the keys written ahead
            with contextlib.suppress(Exception):
                pending = ids.result().keys_file
                if pending is not None:
                    pending.discard()
        raise

    d = plan_dir(epoch)
    reason = pa.DictionaryArray.from_arrays(
        pa.array(result.reason, type=pa.int8()), pa.array(list(REASONS), type=pa.string())
    )
    cluster = result.cluster if result.cluster is not None else np.full(n, -1, dtype=np.int16)
    if isinstance(ids, Future):
        ids = ids.result()
    keep = pa.array(result.keep, type=pa.bool_())
    weight = pa.array(result.weight, type=pa.float32())
    cols = [
        ids.shard,
        ids.key,
        pa.array(uid, type=pa.uint64()),
        pa.array(inp.last_loss, type=pa.float32()),
        pa.array(cluster, type=pa.int16()),
        keep,
        weight,
        reason,
    ]
    lookup = {"keep": keep, "weight": weight}
    schema = PLAN_SCHEMA
    if result.score is not None:
        score = pa.array(result.score, type=pa.float64())
        cols.append(score)
        lookup["score"] = score
        schema = schema.append(pa.field("score", pa.float64(), nullable=False))
    plan = pa.Table.from_arrays(cols, schema=schema)
    del cols

    def meanwhile() -> None:  # the summary and the stage's files, while plan.parquet is encoded
        summarize(result, inp, cfg["policy"], params, guard)
        _publish_stage_files(run, d, ids, pa.table(lookup), result.keep)

    run.publish_parquet_parts(
        f"{d}/plan.parquet", plan, part_rows=PLAN_PART_ROWS, meanwhile=meanwhile, **_PLAN_WRITE_OPTIONS
    )
    summary = dict(result.summary)
    _fault("plan:after_plan_file")

    history = dict(state.get("history", {}))
    history[str(epoch)] = {"n": n, "kept": int(summary["kept"])}
    upto = [v for k, v in history.items() if int(k) <= epoch]
    total_n = sum(v["n"] for v in upto)
    summary["pruned_so_far"] = (1.0 - sum(v["kept"] for v in upto) / total_n) if total_n else 0.0
    summary["phase"] = summary.get("phase", "prune")
    summary["table_generation"] = int(manifest.get("generation", 0))
    summary["population_listed"] = population_listed
    run.publish_json(f"{d}/summary.json", summary)
    _fault("plan:after_summary")
    run.publish_json("state.json", _state_with(state, cfg, epoch, summary))
    return summary


def _publish_stage_files(run: RunDir, d: str, ids: _Identities, lookup: pa.Table, keep: np.ndarray) -> None:
    """keys.arrow + lookup.arrow (row-aligned with plan.parquet) and shards.arrow."""
    keys = ids.keys_file or run.prepare_arrow(f"{d}/keys.arrow", pa.table({"key": ids.key}))
    keys.commit()
    run.publish_arrow(f"{d}/lookup.arrow", lookup)
    run.publish_arrow(f"{d}/shards.arrow", _shard_ranges(ids, keep))


def _state_with(state: dict[str, Any], cfg: dict[str, Any], epoch: int, summary: dict[str, Any]) -> dict[str, Any]:
    """state.json after publishing the plan of ``epoch`` (which becomes the current epoch)."""
    history = dict(state.get("history", {}))
    history[str(epoch)] = {"n": int(summary["n"]), "kept": int(summary["kept"])}
    return {
        **state,
        "policy": cfg["policy"],
        "params": cfg["params"],
        "seed": cfg["seed"],
        "epochs": cfg["epochs"],
        "history": history,
        "last_planned_epoch": max(epoch, int(state.get("last_planned_epoch", -1))),
        "current_epoch": epoch,
    }


def _check_ema_setting(run: RunDir, name: str, params: Any) -> None:
    """ES/ESWP read the table's EMA, whose beta2 is fixed by the run; the two must agree."""
    if name not in ("es", "eswp"):
        return
    beta2 = params.beta2
    if beta2 != run.settings["ema_beta2"]:
        raise InvalidInputError(
            f"{run.display('seta-stream.json')}: the loss table's EMA uses beta2="
            f"{run.settings['ema_beta2']}, policy {name} asks beta2={beta2}; beta2 is fixed "
            f"when the run is created. Create the run with settings={{'ema_beta2': {beta2}}} "
            "(Pruner does this for es/eswp), or pass the run's beta2"
        )


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


def _shard_ranges(ids: _Identities, keep: np.ndarray) -> pa.Table:
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
