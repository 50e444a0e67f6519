"""The training-loop integration: one object that records, compacts and plans at epoch boundaries.

:class:`Pruner` owns no logic of its own; it calls
:class:`~seta_stream._losses.record.LossRecorder`, :func:`~seta_stream._losses.compaction.compact`
and :func:`~seta_stream._planning.transaction.plan` (with its :class:`PlanSettings`) in the right
order and on the right rank::

    pruner = seta_stream.Pruner(run_dir, policy="seta", params=dict(r=0.1, k=5, alpha=0.9),
                                epochs=E, seed=0)
    for epoch in range(start_epoch, E):
        pruner.start_epoch(epoch)          # before iter(loader): publishes the plan of `epoch`
        for batch in loader:
            losses = criterion(model(x), y)            # reduction="none"
            pruner.record(batch["__key__"], batch["__url__"], losses)
            seta_stream.weighted_mean(losses, batch["__weight__"]).backward()
        pruner.flush()                     # the epoch's records on disk, then
        save_checkpoint(epoch)             # the checkpoint, before the next start_epoch
    pruner.close()

Epoch boundary contract (also under torch.distributed): every rank flushes its recorder; rank
0 compacts the new parts and plans ``epoch`` while the other ranks wait in a collective; then
every rank reads the same published plan. If rank 0 fails, every rank raises the same error
instead of hanging.

Resume contract: after a restart from the checkpoint of epoch e-1 (saved after
:meth:`Pruner.flush`, so that every record of e-1 is on disk), call ``start_epoch(e)``.
The plan of e is read back (plans are never recomputed), and loss parts recorded in epoch >= e
by the interrupted attempt are moved to ``losses-superseded/`` (kept, reported, not folded),
because epoch e is being trained again and records each sample anew. Parts of earlier epochs
are folded exactly once, so no flushed loss is lost or counted twice.
"""

from __future__ import annotations

import contextlib
import time
import warnings
from collections.abc import Sequence
from typing import Any

import pyarrow.compute as pc

from . import errors
from ._kernels.batches import check_batch_size
from ._losses.compaction import compact
from ._losses.record import LossRecorder
from ._planning.population import population_locations
from ._planning.settings import PlanSettings
from ._planning.transaction import plan
from ._reading.balance import check_epoch_slots, note_pruner, read_balanced
from ._store.layout import PARTS_GLOB, SUPERSEDED, epoch_of, moved_part, plan_file, stats_file, stats_glob
from ._store.planfiles import load_plan, load_summary
from ._store.runfs import RunDir, new_run_buckets
from ._store.slots import clear_claims
from ._store.state import set_current_epoch
from ._store.table import folded_parts, load_table
from .errors import PlanWarning, RunFormatError, SetaStreamError
from .policies import run_settings_for

__all__ = ["Pruner", "supersede_parts", "undelivered_warning"]


def supersede_parts(run: RunDir, from_epoch: int) -> list[str]:
    """Move unfolded loss parts of epochs >= ``from_epoch`` to ``losses-superseded/``.

    Used when a run resumes at ``from_epoch``: those parts come from an interrupted attempt
    of an epoch that is trained again. Returns the moved parts (relative paths).
    """
    folded = set(folded_parts(run))
    moved = []
    for rel in run.glob(PARTS_GLOB):
        if rel in folded or epoch_of(rel) < from_epoch:
            continue
        run.move(rel, moved_part(rel, SUPERSEDED))
        moved.append(rel)
    return moved


def _dist() -> Any:
    try:
        import torch.distributed as dist
    except ImportError:  # torch is optional for the core
        return None
    return dist if dist.is_available() and dist.is_initialized() else None


class Pruner:
    """Record per-sample losses and publish each epoch's plan (see the module docstring).

    Args:
        run: run directory (path or fsspec URL).
        policy: policy name (``seta_stream.policies.POLICIES``), e.g. ``"seta"``, ``"full"``.
        params: policy parameters (``dict(r=0.1, k=5, alpha=0.9)``).
        epochs: total epochs E of the run (schedules such as SeTa's annealing depend on it).
        seed: run seed; same table + seed + epoch gives the same plan on any machine.
        rank: this process's rank (default: torch.distributed rank, else 0).
        population: optional listing of every (shard, key) of the data set, so that epoch 0
            can be planned exactly (see plan_epoch).
        settings: run settings for a new run directory (``shard_depth``...).
        flush_rows: records buffered per rank before a part is written (what a crash can lose).
        verbose: print one line per epoch boundary (kept, pruned, compaction/planning time).
        engine: ``"local"`` (default) or ``"ray"``: where compaction and planning run the
            buckets of a partitioned run (``ray_address`` as ``ray.init`` takes it).
        batch_size: the training loop's batch size, if known: each plan summary then records
            it and warns when the epoch's kept samples, batched in order by one loader, end with a
            batch of fewer than 8 (``small_final_batch``). With several ranks or DataLoader
            workers each ends its share with a partial batch of its own, which no plan can tell:
            drop partial batches, or use ``weighted_mean(..., batch_size=...)``. For a run this
            process reads balanced (``attach(..., balance=True)``) that warning is left to
            ``balanced_epoch``, which counts each worker's share (docs/ranks.md).
        check_delivered: the loader delivers every kept sample once per epoch
            (``one_pass_per_epoch``, ``seta_stream.openclip.adapt``): at the next
            :meth:`start_epoch` and at :meth:`close`, rank 0 compares the samples recorded in the
            epoch (all ranks) with the plan's kept ones and, if some were never recorded, emits a
            :class:`~seta_stream.errors.PlanWarning` (code ``undelivered``) naming how many, their
            shards and the fix: the pipeline drops samples the plan counts as kept.

    :meth:`start_epoch` emits a :class:`~seta_stream.errors.PlanWarning` (rank 0) for every
    entry of the plan summary's ``warnings``: an epoch keeping less than 10% of the data, a
    weight above 4, a last batch of a few samples; each message names its remedy
    (docs/algorithms.md §0.10).

    A new run with a population of more than 16,777,216 samples (and no ``buckets`` or
    ``dataset_size`` setting) is partitioned into one bucket per 8,388,608 samples.
    """

    def __init__(
        self,
        run: str | RunDir,
        *,
        policy: str = "seta",
        params: dict[str, Any] | None = None,
        epochs: int,
        seed: int = 0,
        rank: int | None = None,
        population: Any = None,
        settings: dict[str, Any] | None = None,
        flush_rows: int = 65536,
        storage_options: dict[str, Any] | None = None,
        verbose: bool = False,
        engine: str | None = None,
        ray_address: str | None = None,
        batch_size: int | None = None,
        check_delivered: bool = False,
    ) -> None:
        batch_size = check_batch_size(batch_size, "Pruner")
        self.check_delivered = check_delivered
        dist = _dist()
        self.rank = rank if rank is not None else (dist.get_rank() if dist else 0)
        # a new run gets the run settings its policy declares (such as the loss table's EMA factor)
        settings = run_settings_for(policy, params, settings)
        settings = _with_buckets(run, settings, population, storage_options)
        #: what every plan of the run is asked (planned with :func:`plan`, as ``plan_epoch`` would)
        self.plan_settings = PlanSettings(
            policy=policy,
            params=dict(params or {}),
            epochs=epochs,
            seed=seed,
            population=population,
            engine=engine,
            ray_address=ray_address,
            batch_size=batch_size,
        )
        self.run = RunDir(run, create=True, settings=settings, storage_options=storage_options)
        self.verbose = verbose
        # a population listed from other locations than the URLs trained stops the first record
        self.recorder = LossRecorder(
            self.run, rank=self.rank, flush_rows=flush_rows, population_locations=population_locations(population)
        )
        note_pruner(self.run, population is not None)  # a balanced reader of the run needs the listing
        self.epoch: int | None = None
        self.superseded: list[str] = []
        self._recorded = 0  # samples recorded in the current epoch by this rank
        self._trained = 0  # of which back-propagated (ES selects a share of each meta-batch)
        #: timings of the last epoch boundary: compact_s, plan_s, wait_s (seconds)
        self.last_boundary: dict[str, float] = {}

    # ------------------------------------------------------------------ settings (read-only)
    @property
    def policy(self) -> str:
        return self.plan_settings.policy  # type: ignore[return-value]

    @property
    def params(self) -> dict[str, Any]:
        return self.plan_settings.params  # type: ignore[return-value]

    @property
    def epochs(self) -> int:
        return self.plan_settings.epochs  # type: ignore[return-value]

    @property
    def seed(self) -> int:
        return self.plan_settings.seed  # type: ignore[return-value]

    @property
    def population(self) -> Any:
        return self.plan_settings.population

    @property
    def engine(self) -> Any:
        return self.plan_settings.engine

    @property
    def ray_address(self) -> str | None:
        return self.plan_settings.ray_address

    @property
    def batch_size(self) -> int | None:
        return self.plan_settings.batch_size

    # ------------------------------------------------------------------ loop API
    def start_epoch(self, epoch: int) -> dict[str, Any]:
        """Flush, compact and publish the plan of ``epoch``; call before ``iter(loader)``.

        Returns the plan summary (``kept``, ``n``, ``pruned_fraction``, ``phase``, ``warnings``...);
        on rank 0, each of its ``warnings`` is also emitted as a
        :class:`~seta_stream.errors.PlanWarning`.
        """
        first_call = self.epoch is None
        trained = self.epoch  # the epoch this object trained last, checked after its records are folded
        self.flush()
        self._recorded = self._trained = 0
        t0 = time.perf_counter()
        timings: dict[str, float] = {}
        undelivered: list[PlanWarning] = []

        def work() -> None:
            if epoch > 0:  # the readers of the epoch before counted the job's slots alike (balanced runs)
                check_epoch_slots(self.run, epoch - 1)
            clear_claims(self.run)
            if first_call:
                self.superseded = supersede_parts(self.run, epoch)
            t = time.perf_counter()
            compact(self.run, engine=self.engine, ray_address=self.ray_address)
            timings["compact_s"] = time.perf_counter() - t
            if self.check_delivered and trained is not None:
                undelivered.extend(undelivered_warning(self.run, trained))
            t = time.perf_counter()
            plan(self.run, epoch, self.plan_settings)
            set_current_epoch(self.run, epoch)
            timings["plan_s"] = time.perf_counter() - t

        self._on_rank0(work)
        summary = load_summary(self.run, epoch)
        self.recorder.set_epoch(epoch)
        self.epoch = epoch
        self.last_boundary = {
            "compact_s": timings.get("compact_s", 0.0),
            "plan_s": timings.get("plan_s", 0.0),
            "wait_s": time.perf_counter() - t0,
        }
        for w in undelivered:
            warnings.warn(w, stacklevel=2)
        if self.rank == 0:
            where = self.run.display(plan_file(epoch, "summary.json"))
            balanced = read_balanced(self.run)
            for w in summary.get("warnings") or []:
                if balanced and w["code"] == "small_final_batch":
                    continue  # each slot batches its own share: balanced_epoch() warns per slot
                message = f"{where}: {w['message']}"
                warnings.warn(PlanWarning(message, w["code"], w.get("value"), w.get("limit"), epoch), stacklevel=2)
        if self.verbose and self.rank == 0:
            print(
                f"[seta_stream] epoch {epoch}: keep {summary['kept']}/{summary['n']} "
                f"({summary['phase']}), pruned so far {100 * summary.get('pruned_so_far', 0):.1f}%,"
                f" compact {self.last_boundary['compact_s']:.2f}s,"
                f" plan {self.last_boundary['plan_s']:.2f}s"
            )
        return summary

    def record(self, keys: Sequence[str], urls: Sequence[str], losses: Any, trained: Any = None) -> None:
        """Record the unweighted per-sample losses of a batch (see LossRecorder.record).

        ``trained``: optional bool mask of the samples that were back-propagated (ES records
        the losses of the whole meta-batch but trains a selection); default: all of them. The
        counts per epoch and rank go to ``stats/`` and ``inspect`` reports them.
        """
        self.recorder.record(keys, urls, losses)
        self._recorded += len(keys)
        if trained is None:
            self._trained += len(keys)
        else:
            self._trained += int(trained.sum()) if hasattr(trained, "sum") else int(sum(bool(t) for t in trained))

    def _publish_counts(self) -> None:
        if self.epoch is None or self._recorded == 0:
            return
        self.run.publish_json(
            stats_file(self.epoch, self.rank),
            {"epoch": self.epoch, "rank": self.rank, "recorded": self._recorded, "trained": self._trained},
        )

    def flush(self) -> None:
        """Write this rank's buffered records (and its counts) of the current epoch to the run
        directory; call it at the end of an epoch, before saving the checkpoint a resume starts
        from.

        Records are buffered (``flush_rows``) and otherwise written by the next
        :meth:`start_epoch`: a process killed between the checkpoint and that call would lose
        the last records of the epoch it checkpointed, and the resumed run would plan without
        them. After ``flush()`` they are in a part, folded by the resumed ``start_epoch``.
        Calling it again in the same epoch writes what came since (the counts are cumulative).
        """
        self._publish_counts()
        self.recorder.flush()

    def close(self) -> None:
        """Flush every rank and fold the last epoch's losses into the table (rank 0)."""
        self.flush()
        undelivered: list[PlanWarning] = []

        def work() -> None:
            compact(self.run, engine=self.engine, ray_address=self.ray_address)
            if self.check_delivered and self.epoch is not None:
                undelivered.extend(undelivered_warning(self.run, self.epoch))

        self._on_rank0(work)
        self.recorder.close()
        for w in undelivered:
            warnings.warn(w, stacklevel=2)

    def __enter__(self) -> Pruner:
        return self

    def __exit__(self, *exc: object) -> None:
        if exc[0] is None:
            self.close()
        else:
            self.recorder.close()

    # ------------------------------------------------------------------ ranks
    def _on_rank0(self, fn: Any) -> None:
        """Run ``fn`` on rank 0 while the other ranks wait; re-raise rank 0's error everywhere."""
        dist = _dist()
        if dist is None:
            fn()
            return
        dist.barrier()  # every rank has flushed its parts
        status: list[Any] = [None]
        if self.rank == 0:
            try:
                fn()
            except Exception as exc:  # propagated to every rank below
                status = [(type(exc).__name__, str(exc))]
                dist.broadcast_object_list(status, src=0)
                raise
        dist.broadcast_object_list(status, src=0)
        if status[0] is not None:
            raise _rank0_error(*status[0])


def _rank0_error(name: str, message: str) -> SetaStreamError:
    """The error of another rank for rank 0's: the same class where it is one of seta_stream's
    (``except BalanceError`` catches it on every rank), else :class:`SetaStreamError`."""
    text = f"rank 0 failed at the epoch boundary: {name}: {message}"
    cls = getattr(errors, name, None)
    if isinstance(cls, type) and issubclass(cls, SetaStreamError):
        with contextlib.suppress(TypeError):
            return cls(text)
    return SetaStreamError(text)


def undelivered_warning(run: RunDir, epoch: int, shown: int = 5) -> list[PlanWarning]:
    """A PlanWarning (code ``undelivered``) if the losses recorded in ``epoch`` (every rank's
    stats) are fewer than its plan kept, naming the kept samples never recorded by shard; [] if
    not. Call after the epoch's parts are folded."""
    recorded = sum(int((run.read_json(rel) or {}).get("recorded", 0)) for rel in run.glob(stats_glob(epoch)))
    kept = int(load_summary(run, epoch)["kept"])
    if recorded >= kept:
        return []
    plan = load_plan(run, epoch, columns=["shard", "key", "uid", "keep"])
    plan = plan.filter(plan["keep"])
    table = load_table(run, columns=["uid", "last_epoch"])
    seen = table.filter(pc.equal(table["last_epoch"], epoch))["uid"].combine_chunks()
    missing = plan.filter(pc.invert(pc.is_in(plan["uid"], value_set=seen)))
    by_shard: dict[str, list[str]] = {}
    for shard, key in zip(missing["shard"].to_pylist(), missing["key"].to_pylist()):
        by_shard.setdefault(shard, []).append(key)
    worst = sorted(by_shard.items(), key=lambda kv: (-len(kv[1]), kv[0]))
    listed = ", ".join(f"{s}: {len(k)} (first {min(k)!r})" for s, k in worst[:shown])
    more = len(worst) - shown
    more = f" and {more} more shard{'s' if more > 1 else ''}" if more > 0 else ""
    message = (
        f"{run.display(plan_file(epoch, 'summary.json'))}: epoch {epoch} recorded {recorded} losses, its plan kept "
        f"{kept} samples: {missing.num_rows} kept samples never reached the loss, in {len(worst)} shards ({listed}"
        f"{more}). The training pipeline drops samples the plan counts as kept (OpenCLIP drops a pair without a "
        ".txt caption or an image), so the epoch ran short of its plan and a schedule that follows it "
        "(EpochClock) ended the epoch early. Fix: list the population with only the samples the pipeline uses, "
        "list_samples(urls, members=...) (seta_stream.openclip.MEMBERS for OpenCLIP), or fix those shards"
    )
    return [PlanWarning(message, "undelivered", float(recorded), float(kept), epoch)]


def _population_size(population: Any) -> int | None:
    if hasattr(population, "num_rows"):
        return int(population.num_rows)
    if isinstance(population, dict):
        return len(population.get("key", ()))
    return len(population) if hasattr(population, "__len__") else None


def _with_buckets(
    run: Any, settings: dict[str, Any] | None, population: Any, storage_options: dict[str, Any] | None
) -> dict[str, Any] | None:
    """``settings`` of a new run, partitioned as a run of its population's ``dataset_size``
    would be (``new_run_buckets``; an existing run keeps the buckets it was created with)."""
    given = settings or {}
    if population is None or given.get("buckets") or given.get("dataset_size"):
        return settings
    buckets = new_run_buckets({"dataset_size": _population_size(population)})
    if buckets == 1:
        return settings
    try:
        RunDir(run, storage_options=storage_options)
        return settings  # the run exists
    except RunFormatError:
        return {**given, "buckets": buckets}
