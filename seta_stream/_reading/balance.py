"""Every rank takes the same number of steps: an epoch's kept samples dealt evenly to the
(rank, DataLoader worker) slots of a job, from the plan (docs/ranks.md).

``split_by_node`` + ``split_by_worker`` deal whole shards round-robin; once a plan prunes, the
shards keep different numbers of samples, so ranks run different numbers of steps and a loss
that gathers across ranks (OpenCLIP's ``ClipLoss``) waits forever on the rank that ran out. The
plan knows every shard's kept count (with a population listing, exactly), so each slot can be
given exactly ``q = K // S`` kept samples (K kept in the epoch, S = world size x workers):

* :func:`deal` (the kernel; arrays in, arrays out): lay the shards end to end in the epoch's
  order and cut the sequence into S chunks of q samples. A shard cut between two chunks is read
  by both slots, each keeping its own range of the shard's kept samples (in the plan's row
  order), so at most S - 1 shards are read by more than one slot. The last ``K mod S`` (< S)
  samples of the sequence are *deferred*: left out of this epoch.
* The epoch's order: the shards are split once for the run into two halves by a hash of
  (seed, shard name); epoch e lays out the half e+1 mod 2 first and the half e mod 2 last, each
  in a seeded per-epoch order (hash of seed, epoch, shard name). Deferred samples come from the
  end of the sequence, so from half e mod 2; the next epoch lays that half out first, so a
  deferred sample the next plan keeps is trained there, never deferred two epochs in a row,
  whenever the deferring half keeps at least ``K mod S`` samples (reported as
  ``deferred_outside_half`` when it does not). No state is carried from epoch to epoch: any
  worker computes the deal of any epoch from that epoch's plan alone (resumes included).
* :class:`BalancedView` (a :class:`~seta_stream._reading.planview.PlanView`): the deal of the worker's
  slot; it decides only the samples of the slot's ranges, drops samples the plan does not list
  (their count is unknown to the deal), and refuses a shard the deal gave another slot.
* :func:`split_balanced` (URL stage) replaces ``split_by_node`` + ``split_by_worker``: the slot's
  shards, in deal order; ``attach(ds, run, balance=True)`` installs it and the balanced keep
  stage. :func:`balanced_epoch` is the loop's side: steps per rank, samples per rank, the
  remainder.

Rank and world size are read as webdataset reads them (``RANK``/``WORLD_SIZE``, else
torch.distributed), the worker from ``torch.utils.data.get_worker_info()`` (or
``WORKER``/``NUM_WORKERS``); slot = rank x workers + worker.

What the deal cannot see is refused where it can be known first:

* **Slots counted differently** (``num_workers`` not the same on every rank): each reader claims
  its slot and its count of the job's slots in the run directory when its iterator starts
  (:mod:`seta_stream._store.slots`), lists the epoch's claims, and stops with a :class:`BalanceError`
  before yielding a sample if another reader counted otherwise; it lists them again when its
  share ends, so a reader that started before the other claims were there stops too, and
  ``Pruner.start_epoch`` checks the epoch before on every rank (:func:`check_epoch_slots`).
* **No population listing**: in the main process, when ``attach``/``split_balanced``/a balanced
  keep stage is built for a run whose ``Pruner`` has no population, or whose current plan was
  made without one (:func:`note_balanced_reader`, :func:`note_pruner`), not in a DataLoader
  worker at the first sample.
"""

from __future__ import annotations

import hashlib
import inspect
import math
import os
import threading
import warnings
from collections.abc import Iterable, Iterator, Sequence
from functools import cached_property
from typing import Any, NamedTuple

import fsspec
import numpy as np

from .._kernels.batches import SMALL_FINAL_BATCH
from .._store import slots as slot_files
from .._store.layout import plan_file
from .._store.planfiles import read_summary
from .._store.runfs import RunDir
from .._store.state import read_state
from ..errors import BalanceError, InvalidInputError, PlanWarning, RunFormatError, UnsupportedPipelineError
from ..ids import shard_name
from .planview import Decision, PlanView, ShardDecisions, StageCounts
from .wds import resampled_source, splitter_positions

__all__ = [
    "Deal",
    "deal",
    "order_keys",
    "deferring_half",
    "EpochDeal",
    "BalancedEpoch",
    "BalancedView",
    "balanced_epoch",
    "slot_info",
    "ranks_here",
    "split_balanced",
    "split_slot",
    "replace_splitters",
    "check_epoch_slots",
    "note_balanced_reader",
    "note_pruner",
    "read_balanced",
    "noting_stage",
]

#: Decision for a sample the plan does not list, in a balanced epoch (dropped: the deal counts
#: only the plan's kept rows)
_ABSENT_DROPPED = Decision(False, 1.0, None, False)


# ---------------------------------------------------------------------------------- the kernel
class Deal(NamedTuple):
    """The pieces of an epoch's deal, one row per (shard, slot) piece, in sequence order."""

    shard: np.ndarray  # int64: index of the piece's shard in the kernel's input arrays
    slot: np.ndarray  # int64: 0 .. slots-1, or ``slots`` for the deferred remainder
    lo: np.ndarray  # int64: first kept ordinal of the piece within its shard
    hi: np.ndarray  # int64: one past its last
    slots: int
    per_slot: int  # q = kept // slots
    kept: int
    deferred: int  # kept - q * slots (< slots)
    deferred_outside_half: int  # deferred samples of shards outside the epoch's deferring half


def deal(kept: Any, order: Any, defer_last: Any, slots: int) -> Deal:
    """Deal ``kept[i]`` samples of shard i to ``slots`` slots, q = sum // slots each.

    The shards with kept > 0 are laid end to end, those with ``defer_last`` False first, each
    group in ascending ``order`` (ties by index); slot s gets the samples at positions
    [s q, (s + 1) q) of that sequence, and positions from ``slots * q`` on are deferred
    (pieces with slot == ``slots``). O(shards + slots)."""
    kept = np.asarray(kept, dtype=np.int64)
    order = np.asarray(order)
    defer_last = np.asarray(defer_last, dtype=bool)
    if not (kept.shape == order.shape == defer_last.shape) or kept.ndim != 1:
        raise InvalidInputError(
            f"deal(): kept, order and defer_last must be 1-D arrays of one length, got shapes {kept.shape}, "
            f"{order.shape}, {defer_last.shape}"
        )
    if int(slots) < 1 or (len(kept) and int(kept.min()) < 0):
        raise InvalidInputError(f"deal(): expected slots >= 1 and kept >= 0, got slots={slots}, min kept "
                                f"{int(kept.min()) if len(kept) else None}")  # fmt: skip
    slots = int(slots)
    idx = np.flatnonzero(kept > 0)
    seq = idx[np.lexsort((idx, order[idx], defer_last[idx]))]
    counts = kept[seq]
    ends = np.cumsum(counts)
    starts = ends - counts
    total = int(ends[-1]) if len(ends) else 0
    q = total // slots
    if q == 0:  # everything is deferred: one piece per shard
        first = last = np.full(len(seq), slots, np.int64)
    else:
        first = np.minimum(starts // q, slots)
        last = np.minimum((ends - 1) // q, slots)
    n = last - first + 1
    piece_shard = np.repeat(seq, n)
    within = np.arange(int(n.sum()), dtype=np.int64) - np.repeat(np.cumsum(n) - n, n)
    slot = np.repeat(first, n) + within
    s0, s1 = np.repeat(starts, n), np.repeat(ends, n)
    lo = np.maximum(s0, slot * q) - s0
    hi = np.minimum(s1, np.where(slot < slots, (slot + 1) * q, total)) - s0
    out = slot == slots
    outside = int((hi - lo)[out & ~defer_last[piece_shard]].sum())
    return Deal(piece_shard, slot, lo, hi, slots, q, total, total - q * slots, outside)


def _hashes(names: Sequence[str], prefix: str) -> np.ndarray:
    head = prefix.encode()
    digests = b"".join(hashlib.blake2b(head + n.encode("utf-8"), digest_size=8).digest() for n in names)
    return np.frombuffer(digests, dtype="<u8").astype(np.uint64)


def order_keys(names: Sequence[str], seed: int, epoch: int) -> np.ndarray:
    """uint64 per shard name: its place in epoch ``epoch``'s sequence (ascending), a hash of
    (seed, epoch, name): the same on every machine and in every process."""
    return _hashes(names, f"seta_stream.balance/order/{int(seed)}/{int(epoch)}/")


def deferring_half(names: Sequence[str], seed: int, epoch: int) -> np.ndarray:
    """bool per shard name: whether it is in the half laid out last in epoch ``epoch`` (the
    half whose samples may be deferred). The halves are fixed for a run (a hash of seed and
    name) and take turns: epoch e defers from the half e mod 2."""
    return (_hashes(names, f"seta_stream.balance/half/{int(seed)}/") & np.uint64(1)) == np.uint64(int(epoch) % 2)


class EpochDeal:
    """The deal of one epoch's plan: shard names (sorted), their kept counts and :func:`deal`."""

    def __init__(self, counts: dict[str, int], seed: int, epoch: int, slots: int) -> None:
        self.names = sorted(counts)
        self.kept = np.fromiter((counts[n] for n in self.names), np.int64, len(self.names))
        self.deal = deal(self.kept, order_keys(self.names, seed, epoch), deferring_half(self.names, seed, epoch), slots)

    def pieces(self, slot: int) -> list[tuple[str, int, int, int]]:
        """(shard, lo, hi, kept) of each piece dealt to ``slot`` (``slots``: the deferred ones),
        in sequence order."""
        d = self.deal
        at = np.flatnonzero(d.slot == slot)
        return [(self.names[d.shard[i]], int(d.lo[i]), int(d.hi[i]), int(self.kept[d.shard[i]])) for i in at]


# ---------------------------------------------------------------------------------- slots
def slot_info(rank: int | None = None, world_size: int | None = None) -> tuple[int, int, int, int]:
    """(rank, world_size, worker, workers) of this process, as webdataset's split_by_node and
    split_by_worker read them (``webdataset.utils.pytorch_worker_info``); ``rank`` and
    ``world_size`` given (both) replace the rank's part."""
    from webdataset.utils import pytorch_worker_info

    found_rank, found_world, worker, workers = pytorch_worker_info()
    if (rank is None) != (world_size is None):
        raise InvalidInputError(f"balance: give rank and world_size together, got rank={rank}, world_size={world_size}")
    if world_size is not None:
        found_rank, found_world = int(rank), int(world_size)  # type: ignore[arg-type]
    if not (0 <= found_rank < found_world and 0 <= worker < workers):
        raise InvalidInputError(
            f"balance: rank {found_rank} of world size {found_world}, worker {worker} of {workers}: expected "
            "0 <= rank < world_size and 0 <= worker < workers"
        )
    return found_rank, found_world, worker, workers


def ranks_here() -> dict[str, int]:
    """``{"rank": r, "world_size": w}`` of the calling process when it is one of several ranks
    (torch.distributed initialised, or RANK/WORLD_SIZE set), else ``{}``: what attach() hands to
    the DataLoader workers, which a spawned worker could not read itself (torch.distributed is
    not initialised there)."""
    rank, world, _, _ = slot_info()
    return {"rank": rank, "world_size": world} if world > 1 else {}


def _population_required(view: PlanView, what: str) -> None:
    if not view.population_listed:
        raise BalanceError(
            f"{view.run.display()}: {what}: the plan of epoch {view.epoch} was made without a population "
            "listing, so its kept count per shard leaves out the samples never recorded; a balanced epoch needs "
            "exact counts. Pass the listing to every plan: Pruner(..., population=seta_stream.list_samples(urls)) "
            "(or plan_epoch(..., population=...)), with the URLs the pipeline reads"
        )


def _epoch_deal(view: PlanView, slots: int, what: str) -> EpochDeal:
    _population_required(view, what)
    d = EpochDeal(view.stage.kept_counts(), view.seed, view.epoch, slots)
    if d.deal.per_slot == 0 and d.deal.kept > 0:
        raise BalanceError(
            f"{view.run.display()}: {what}: epoch {view.epoch} keeps {d.deal.kept} samples, fewer than the "
            f"{slots} slots (ranks x DataLoader workers) it is dealt to, so no slot could get a sample; use fewer "
            "DataLoader workers (or ranks), or a plan that keeps more"
        )
    return d


# ---------------------------------------------------------------------------------- slots counted alike
_FIX_SLOTS = (
    "expected every reader of every rank to count the same slots: the same DataLoader num_workers on every rank "
    "(0 counts as one slot per rank, the main process) and one world size (docs/ranks.md)"
)


def _describe(configs: dict[tuple[int, int], list[slot_files.Claim]]) -> str:
    """'rank 0 with 2 workers (world size 2); rank 1 with 3 workers (world size 2)'."""
    parts = []
    for (world, workers), found in configs.items():
        ranks = sorted({c.rank for c in found})
        shown = ", ".join(map(str, ranks[:4])) + (f" and {len(ranks) - 4} more" if len(ranks) > 4 else "")
        parts.append(f"rank{'s' if len(ranks) > 1 else ''} {shown} with {workers} worker{'s' if workers > 1 else ''} "
                     f"a rank (world size {world}: {world * workers} slots)")  # fmt: skip
    return "; ".join(parts)


def _check_claims(run: RunDir, epoch: int, own: slot_files.Claim, when: str) -> None:
    """Raise if a reader of ``epoch`` counted the job's slots otherwise than ``own``."""
    configs = slot_files.configurations(slot_files.claims(run, epoch))
    if not set(configs) - {(own.world_size, own.workers)}:
        return
    configs.setdefault((own.world_size, own.workers), [own])
    raise BalanceError(
        f"{run.display(slot_files.SLOTS)}: balanced epoch {epoch}, {when}: this reader (rank {own.rank}, worker "
        f"{own.worker} of {own.workers}) and others count the job's (rank, worker) slots differently: "
        f"{_describe(configs)}. Their chunks of the epoch would not tile its kept samples (some read by two ranks, "
        f"others by none) and the ranks would take different numbers of steps; {_FIX_SLOTS}"
    )


def check_epoch_slots(run: RunDir, epoch: int) -> None:
    """Raise :class:`BalanceError` if the readers of balanced epoch ``epoch`` counted the job's
    slots differently (what ``Pruner.start_epoch`` checks of the epoch before the one it starts,
    on rank 0, for every rank)."""
    configs = slot_files.configurations(slot_files.claims(run, epoch))
    if len(configs) > 1:
        raise BalanceError(
            f"{run.display(slot_files.SLOTS)}: balanced epoch {epoch} was read by readers that counted the job's "
            f"(rank, worker) slots differently: {_describe(configs)}, so some of its kept samples were read by two "
            f"ranks and others by none; {_FIX_SLOTS}. Resume from the checkpoint before epoch {epoch} to train it again"
        )


# ---------------------------------------------------------------------------------- balanced runs of this process
#: what this process set up, by run: the balanced readers built (attach(balance=True),
#: split_balanced, a balanced keep stage) and whether the run's Pruner lists the population, so
#: that a balanced epoch without a population listing is refused where the pipeline or the
#: Pruner is built, in the main process, rather than in a DataLoader worker at its first sample
_READERS: dict[tuple[str, str], str] = {}
_PRUNERS: dict[tuple[str, str], bool] = {}
_REGISTRY_LOCK = threading.Lock()


def _run_key(run: str | RunDir) -> tuple[str, str]:
    if isinstance(run, RunDir):
        return (type(run.fs).__name__, run.root)
    fs, root = fsspec.core.url_to_fs(os.fspath(run))
    return (type(fs).__name__, root.rstrip("/") or "/")


def _no_population(run: RunDir, what: str, why: str) -> BalanceError:
    return BalanceError(
        f"{run.display()}: {what}: {why}, so its kept count per shard leaves out the samples never recorded; a "
        "balanced epoch needs exact counts. Pass the listing to every plan: Pruner(..., "
        "population=seta_stream.list_samples(urls)) (or plan_epoch(..., population=...)), with the URLs the pipeline "
        "reads"
    )


def note_balanced_reader(run: str | RunDir, what: str) -> None:
    """Record that this process reads ``run`` balanced (``what`` built it); raise
    :class:`BalanceError` now if its ``Pruner`` lists no population or its current plan was made
    without one."""
    key = _run_key(run)
    with _REGISTRY_LOCK:
        _READERS[key] = what
        listed = _PRUNERS.get(key)
    if not isinstance(run, RunDir):
        try:
            run = RunDir(run)
        except RunFormatError:  # not created yet: no Pruner of it, no plan
            return
    if listed is False:
        raise _no_population(run, what, "the run's Pruner was given no population listing")
    epoch = read_state(run).get("current_epoch")
    summary = None if epoch is None else read_summary(run, int(epoch))
    if summary is not None and not summary.get("population_listed", False):
        raise _no_population(run, what, f"its current plan (epoch {epoch}) was made without a population listing")


def note_pruner(run: RunDir, population_listed: bool) -> None:
    """Record whether ``run``'s ``Pruner`` lists the population; raise :class:`BalanceError` if
    it does not and this process reads the run balanced."""
    key = _run_key(run)
    with _REGISTRY_LOCK:
        _PRUNERS[key] = population_listed
        what = _READERS.get(key)
    if what is not None and not population_listed:
        raise _no_population(run, f"Pruner (the run is read by {what})", "the Pruner was given no population listing")


def read_balanced(run: str | RunDir) -> bool:
    """Whether this process built a balanced reader of ``run``."""
    with _REGISTRY_LOCK:
        return _run_key(run) in _READERS


# ---------------------------------------------------------------------------------- the loop's side
class BalancedEpoch(NamedTuple):
    """What a balanced epoch gives each rank (:func:`balanced_epoch`)."""

    epoch: int
    world_size: int
    workers: int  # DataLoader workers per rank (0 counted as 1: the main process reads)
    slots: int  # world_size x workers
    kept: int  # the plan's kept samples
    per_slot: int  # samples every worker of every rank delivers: kept // slots
    per_rank: int  # per_slot x workers
    deferred: int  # kept - per_slot x slots, left out of this epoch (< slots)
    deferred_outside_half: int  # of which outside the epoch's deferring half (0: none deferred twice in a row)
    shards: int  # shards with a kept sample
    opens: int  # shard opens over all slots (shards + shards cut between slots)
    split: int  # shards read by more than one slot or partly deferred
    deferred_samples: tuple[tuple[str, int, int], ...]  # (shard, lo, hi): kept ordinals (plan row order) deferred

    def steps(self, batch_size: int, *, partial: bool = True) -> int:
        """Optimiser steps every rank takes: each worker batches its ``per_slot`` samples
        (``partial``: the last batch short, as ``one_pass_per_epoch`` makes it; else dropped)."""
        if int(batch_size) < 1:
            raise InvalidInputError(f"BalancedEpoch.steps(batch_size={batch_size}): expected batch_size >= 1")
        per = math.ceil(self.per_slot / batch_size) if partial else self.per_slot // batch_size
        return self.workers * per

    def batch_sizes(self, batch_size: int, *, partial: bool = True) -> list[int]:
        """The size of every step's batch, in order, the same on every rank (the DataLoader takes
        one batch from each worker in turn, and every worker batches the same number of samples)."""
        full, last = divmod(self.per_slot, int(batch_size))
        one = [int(batch_size)] * full + ([last] if last and partial else [])
        return [b for b in one for _ in range(self.workers)]


def balanced_epoch(
    run: str | RunDir,
    epoch: int | None = None,
    *,
    workers: int,
    world_size: int | None = None,
    batch_size: int | None = None,
) -> BalancedEpoch:
    """The balanced deal of ``epoch`` (default: the current one) for ``world_size`` ranks
    (default: as webdataset reads it) of ``workers`` DataLoader workers each: every rank
    delivers ``per_rank`` samples in ``steps(batch_size)`` steps. Call it after
    ``pruner.start_epoch(epoch)``; pass ``per_rank`` to ``EpochClock.start_epoch``.

    ``batch_size`` (default: the one the plan's summary records, ``Pruner(batch_size=...)``):
    every worker batches its own ``per_slot`` samples, so when they end with a batch of fewer
    than 8 a :class:`~seta_stream.errors.PlanWarning` (``small_final_batch``) says so, on rank
    0 (``Pruner.start_epoch`` leaves this warning to this function for a run read balanced: the
    plan counts the epoch's kept samples as one loader would batch them)."""
    if int(workers) < 0:
        raise InvalidInputError(f"balanced_epoch(workers={workers}): expected the DataLoader's num_workers (>= 0)")
    world = slot_info()[1] if world_size is None else int(world_size)
    if world < 1:
        raise InvalidInputError(f"balanced_epoch(world_size={world_size}): expected >= 1")
    readers = max(int(workers), 1)
    view = PlanView(run, epoch)
    d = _epoch_deal(view, world * readers, "balanced_epoch()")
    pieces = d.deal
    used = pieces.slot < pieces.slots
    partial = (pieces.lo > 0) | (pieces.hi < d.kept[pieces.shard])
    size = batch_size if batch_size is not None else view.stage.summary.get("batch_size")
    if size is not None and slot_info()[0] == 0:  # one warning a job
        small = slot_batch_warning(view, pieces.per_slot, world, readers, int(size))
        if small is not None:
            warnings.warn(small, stacklevel=2)
    return BalancedEpoch(
        epoch=view.epoch,
        world_size=world,
        workers=readers,
        slots=pieces.slots,
        kept=pieces.kept,
        per_slot=pieces.per_slot,
        per_rank=pieces.per_slot * readers,
        deferred=pieces.deferred,
        deferred_outside_half=pieces.deferred_outside_half,
        shards=int((d.kept > 0).sum()),
        opens=int(used.sum()),
        split=len(np.unique(pieces.shard[partial])),
        deferred_samples=tuple((name, lo, hi) for name, lo, hi, _ in d.pieces(pieces.slots)),
    )


def slot_batch_warning(view: PlanView, per_slot: int, world: int, workers: int, batch_size: int) -> PlanWarning | None:
    """``small_final_batch`` of a balanced epoch: every slot batches its ``per_slot`` samples
    ``batch_size`` at a time and ends with a batch of ``per_slot mod batch_size``."""
    if int(batch_size) < 1:
        raise InvalidInputError(f"balanced_epoch(batch_size={batch_size}): expected batch_size >= 1")
    last = per_slot % batch_size
    if not 0 < last < SMALL_FINAL_BATCH:
        return None
    samples = f"sample{'s' if last != 1 else ''}"
    where = view.run.display(plan_file(view.epoch, "summary.json"))
    return PlanWarning(
        f"{where}: balanced epoch {view.epoch}: each of the {world * workers} (rank, "
        f"worker) slots ({world} rank{'s' if world > 1 else ''} x {workers} DataLoader worker"
        f"{'s' if workers > 1 else ''}) delivers {per_slot} samples, so its batches of {batch_size} end with a batch "
        f"of {last} {samples}: {workers} optimiser step{'s' if workers > 1 else ''} a rank on {last} {samples} "
        f"each (a gradient about {math.sqrt(batch_size / last):.0f} times a full batch's) can throw the model off "
        "at the end of the epoch. Drop each worker's last partial batch (batched(..., partial=False): "
        "steps(batch_size, partial=False) counts the steps then), or scale each batch's loss by its size: "
        "seta_stream.weighted_mean(losses, weights, batch_size=...)",
        "small_final_batch",
        float(last),
        float(SMALL_FINAL_BATCH),
        view.epoch,
    )


# ---------------------------------------------------------------------------------- the stages' side
class SlotShard(ShardDecisions):
    """The decisions of one shard dealt to this slot: the plan's, restricted to the kept
    samples of the slot's range [lo, hi) (kept ordinals in the plan's row order); samples the
    plan does not list are dropped (the view's absent rule)."""

    def __init__(self, view: BalancedView, shard: str, lo: int, hi: int, kept: int) -> None:
        super().__init__(view, shard)
        self.lo, self.hi, self.kept = lo, hi, kept

    @cached_property
    def listed(self) -> dict[Any, Decision]:
        listed = ShardDecisions.listed.func(self)  # type: ignore[attr-defined]
        if self.lo == 0 and self.hi == self.kept:
            return listed
        ordinal = 0  # the dict is in the plan's row order
        for ident, d in listed.items():
            if d.keep:
                if not self.lo <= ordinal < self.hi:
                    listed[ident] = Decision(False, d.weight, d.score, True)
                ordinal += 1
        if ordinal != self.kept:
            raise RunFormatError(
                f"{self.view.run.display()}: plan of epoch {self.view.epoch}, shard {self.shard!r}: {ordinal} kept "
                f"rows, its shard index says {self.kept}; expected the same. Plan the epoch again with force=True"
            )
        return listed


class BalancedView(PlanView):
    """A plan view for one (rank, worker) slot of a balanced epoch: ``pieces`` (shard -> its
    kept range and count) are the slot's share of :func:`deal`. ``shard(name)`` refuses a
    shard dealt to another slot; samples the plan does not list are dropped."""

    def __init__(
        self, run: str | RunDir, epoch: int | None = None, *, rank: int | None = None, world_size: int | None = None
    ) -> None:
        self.rank, self.world_size, self.worker, self.workers = slot_info(rank, world_size)
        super().__init__(run, epoch)
        self.slots = self.world_size * self.workers
        self.slot = self.rank * self.workers + self.worker

    @cached_property
    def deal(self) -> EpochDeal:
        d = _epoch_deal(self, self.slots, "a balanced epoch")
        slot_files.claim(self.run, self.epoch, self.claim)
        _check_claims(self.run, self.epoch, self.claim, "as its share starts")
        return d

    @property
    def claim(self) -> slot_files.Claim:
        """This reader's slot claim (:mod:`seta_stream._store.slots`)."""
        return slot_files.Claim(self.world_size, self.workers, self.rank, self.worker)

    def check_slots(self) -> None:
        """Raise if a reader of this epoch counted the job's slots otherwise (the claims again)."""
        _check_claims(self.run, self.epoch, self.claim, "as its share ends")

    @cached_property
    def pieces(self) -> dict[str, tuple[int, int, int]]:
        """shard -> (lo, hi, kept) of the pieces dealt to this slot, in deal order."""
        return {name: (lo, hi, kept) for name, lo, hi, kept in self.deal.pieces(self.slot)}

    def shard(self, shard: str) -> ShardDecisions:
        if self._last is not None and self._last.shard == shard:
            return self._last
        piece = self.pieces.get(shard)
        if piece is None:
            raise BalanceError(
                f"{self.run.display()}: a balanced epoch ({self.epoch}) met shard {shard!r} in slot {self.slot} "
                f"(rank {self.rank} of {self.world_size}, worker {self.worker} of {self.workers}), which the deal "
                "gave another slot (or none); expected only this slot's shards: put seta_stream.split_balanced(run) "
                "in place of split_by_node/split_by_worker (attach(ds, run, balance=True) does)"
            )
        self._last = SlotShard(self, shard, *piece)
        return self._last

    def shard_is_empty(self, shard: str) -> bool:
        return shard not in self.pieces

    def shard_keeps_all(self, shard: str) -> bool:
        return False  # samples the plan does not list are dropped: each is decided

    def absent(self, shard: str, key: str) -> Decision:
        return _ABSENT_DROPPED

    def absent_uid(self, uid: int) -> Decision:
        return _ABSENT_DROPPED


def split_slot(src: Iterable[Any], view: BalancedView) -> Iterator[Any]:
    """The shard list (webdataset's ``{"url": ...}`` dicts, or URLs) -> the items of this
    slot's shards, in deal order. Checks that the list names exactly the plan's shards: each
    shard the plan keeps samples of, and no shard the plan does not know."""
    by_name: dict[str, Any] = {}
    for item in src:
        url = item["url"] if isinstance(item, dict) else item
        name = shard_name(url, view.depth)
        if name in by_name:
            raise BalanceError(
                f"split_balanced: the shard list names shard {name!r} twice ({url!r}); expected each shard once "
                "(a balanced epoch deals every kept sample to one slot)"
            )
        by_name[name] = item
    d = view.deal
    counts = dict(zip(d.names, d.kept.tolist()))
    unknown = sorted(n for n in by_name if n not in counts)
    missing = sorted(n for n, k in counts.items() if k > 0 and n not in by_name)
    if unknown or missing:
        found = []
        if unknown:
            found.append(f"{len(unknown)} shard(s) the plan does not know (e.g. {unknown[0]!r})")
        if missing:
            found.append(f"{len(missing)} shard(s) the plan keeps samples of are not in the list (e.g. {missing[0]!r})")
        raise BalanceError(
            f"split_balanced ({view.run.display()}, epoch {view.epoch}): the pipeline's shard list and the plan "
            f"differ: {'; '.join(found)}; expected the shards of the population the plans are made with: list the "
            "population from the URLs the pipeline reads, Pruner(..., population=seta_stream.list_samples(urls))"
        )
    counts_here = StageCounts()
    dealt = split = 0
    try:
        for name, (lo, hi, kept) in view.pieces.items():
            dealt += 1
            split += lo > 0 or hi < kept
            yield by_name[name]
    finally:
        counts_here.update(shards_dealt=dealt, shards_dealt_in_part=split)
    view.check_slots()  # a reader of another rank that claimed after this one's start


def _split_balanced(
    src: Iterable[Any], run: str | RunDir, epoch: int | None = None, rank: int | None = None,
    world_size: int | None = None,
) -> Iterator[Any]:  # fmt: skip
    yield from split_slot(src, BalancedView(run, epoch, rank=rank, world_size=world_size))


def _split_balanced_of(src: Iterable[Any], views: Any) -> Iterator[Any]:
    """The URL stage attach() installs: the view the sample stage opened (``views.take()``)."""
    yield from split_slot(src, views.take())


def _pipelinefilter(f: Any) -> Any:
    from webdataset.filters import pipelinefilter

    return pipelinefilter(f)


def noting_stage(f: Any, what: str, always: bool = False) -> Any:
    """``webdataset``'s ``pipelinefilter(f)``, whose stages, when built with ``balance=True`` (or
    ``always``), note a balanced reader of their run in this process (:func:`note_balanced_reader`:
    a missing population listing is refused there, not in a DataLoader worker)."""
    stage = _pipelinefilter(f)
    signature = inspect.signature(f)

    def build(*args: Any, **kw: Any) -> Any:
        given = signature.bind_partial(None, *args, **kw).arguments  # None: the source, given later
        if always or given.get("balance"):
            note_balanced_reader(given["run"], what)
        return stage(*args, **kw)

    build.__name__ = build.__qualname__ = f.__name__.lstrip("_")
    return build


split_balanced = noting_stage(_split_balanced, "split_balanced(run)", always=True)
split_balanced.__doc__ = """URL stage: ``split_balanced(run, epoch=None, rank=None, world_size=None)``;
put it in place of ``split_by_node`` + ``split_by_worker``, and pass ``balance=True`` to the
keep stage (``kept_tar_samples(run, balance=True)`` or ``keep_filter(run, balance=True)``). Each
(rank, worker) slot gets exactly ``kept // (world_size x workers)`` kept samples of the current
plan (docs/ranks.md). Needs plans made with the population listing."""
split_balanced_shared = _pipelinefilter(_split_balanced_of)


def replace_splitters(pipeline: list[Any], stage: Any) -> None:
    """Put ``stage`` in place of the pipeline's first shard splitter (``wds.splitter_positions``)
    and drop the others (right after the shard source when it has none). Refuses shards drawn
    with replacement."""
    resampled = resampled_source(pipeline)
    if resampled is not None:
        raise UnsupportedPipelineError(
            f"attach(balance=True): the pipeline draws shards with replacement ({resampled}), so "
            "an epoch is not one pass over the plan's kept samples and cannot be dealt evenly; expected a shard "
            "list read once per epoch (wds.SimpleShardList(urls), wds.WebDataset(urls) without resampled=True)"
        )
    at = splitter_positions(pipeline)
    if not at:
        pipeline.insert(1 if pipeline else 0, stage)
        return
    pipeline[at[0]] = stage
    for i in reversed(at[1:]):
        del pipeline[i]
