"""Slot claims of balanced epochs, ``slots/epoch=E/``: which (rank, worker) slots read an epoch,
and how each counted the job's slots.

A balanced epoch deals its kept samples to world size x DataLoader workers slots
(docs/ranks.md); every reader of every rank must count the same slots, or the ranks' chunks no
longer tile the epoch (a sample read by two ranks, others by none, and a collective that waits
forever on the rank that ran out). No rank can see another rank's ``num_workers``, so each
reader leaves a claim in the run directory when its iterator starts: an empty file named for its
count and its slot, ``slots/epoch=E/world=W-workers=N-rank=R-worker=K``. One listing of the
epoch's folder then tells every configuration that read it (:func:`configurations`); a reader
lists it after writing its own claim, so of any two readers that counted differently the later
one sees the other's claim before it yields a sample.

This module owns the folder (writes, lists, removes); :mod:`seta_stream._reading.balance` claims and
checks, ``Pruner.start_epoch`` checks the epoch before and clears the folder, and ``plan_epoch``
clears the claims of the epoch it plans and later ones: both run before the epoch's readers
start, and a resumed epoch's claims of an earlier attempt, perhaps at another world size, would
otherwise look like a mismatch.
"""

from __future__ import annotations

import contextlib
import re
from typing import NamedTuple

from .layout import SLOTS, epoch_of, slot_claim_file, slot_claims_glob
from .runfs import RunDir

__all__ = ["Claim", "claim", "claims", "configurations", "clear_claims"]

_NAME = re.compile(r"world=(\d+)-workers=(\d+)-rank=(\d+)-worker=(\d+)$")


class Claim(NamedTuple):
    """One reader's claim: its slot (rank, worker) and how it counted the job's slots."""

    world_size: int
    workers: int
    rank: int
    worker: int


def claim(run: RunDir, epoch: int, c: Claim) -> None:
    """Leave ``c`` for ``epoch`` (an empty file; the same claim again replaces it)."""
    run.publish_bytes(slot_claim_file(epoch, *c), b"")


def claims(run: RunDir, epoch: int) -> list[Claim]:
    """Every claim left for ``epoch``, read from one listing of its folder (fresh: another
    process's claims are not in a cached listing)."""
    with contextlib.suppress(Exception):  # a filesystem without a listing cache
        run.fs.invalidate_cache(run.path(SLOTS))
    found = []
    for rel in run.glob(slot_claims_glob(epoch)):
        match = _NAME.search(rel)
        if match is not None:
            found.append(Claim(*(int(g) for g in match.groups())))
    return found


def configurations(found: list[Claim]) -> dict[tuple[int, int], list[Claim]]:
    """(world size, workers) -> the claims that counted the slots so."""
    out: dict[tuple[int, int], list[Claim]] = {}
    for c in sorted(found):
        out.setdefault((c.world_size, c.workers), []).append(c)
    return out


def clear_claims(run: RunDir, from_epoch: int | None = None) -> None:
    """Remove every epoch's claims, or those of the epochs from ``from_epoch`` on."""
    if from_epoch is None:
        run.remove(SLOTS)
        return
    for rel in run.glob(f"{SLOTS}/epoch=*"):
        if epoch_of(rel) >= from_epoch:
            run.remove(rel)
