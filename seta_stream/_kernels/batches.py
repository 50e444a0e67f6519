"""The batch size a training loop gives, and the warning of an epoch that ends with a small batch.

``check_batch_size`` validates the ``batch_size`` that ``plan_epoch``, ``Pruner`` and
``weighted_mean`` take; :data:`SMALL_FINAL_BATCH` and :func:`final_batch_warning` make the plan
summary's ``small_final_batch`` warning (planning), and the balanced readers warn per slot with
the same limit (``_reading.balance``). Planning and the readers both use them, so they live
here, below both. Pure: no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from ..errors import InvalidInputError

__all__ = ["SMALL_FINAL_BATCH", "check_batch_size", "final_batch_warning"]

#: An epoch whose last batch would hold fewer samples than this is warned about
#: (``small_final_batch``; only when the batch size is known: ``Pruner(batch_size=...)``).
SMALL_FINAL_BATCH = 8


def check_batch_size(batch_size: Any, where: str) -> int | None:
    """``batch_size`` if it is None or an integer >= 1 (InvalidInputError naming ``where``)."""
    if batch_size is not None and (isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1):
        raise InvalidInputError(f"{where}: batch_size={batch_size!r}, expected an integer >= 1 or None")
    return batch_size


def final_batch_warning(summary: Mapping[str, Any], batch_size: int) -> dict[str, Any] | None:
    """``small_final_batch``: the epoch's kept samples, batched ``batch_size`` at a time by one
    loader, end with a batch of fewer than :data:`SMALL_FINAL_BATCH` samples (None otherwise)."""
    kept = int(summary.get("kept") or 0)
    last = kept % batch_size
    if not 0 < last < SMALL_FINAL_BATCH:
        return None
    return {
        "code": "small_final_batch",
        "value": last,
        "limit": SMALL_FINAL_BATCH,
        "message": (
            f"plan of epoch {summary.get('epoch')} ({summary.get('policy')}): keeps {kept} samples, so batches "
            f"of {batch_size} end with a batch of {last} sample{'s' if last != 1 else ''}: one optimiser step "
            f"on {last} sample{'s' if last != 1 else ''} (a gradient about {math.sqrt(batch_size / last):.0f} "
            "times a full batch's) can throw the model off at the end of the epoch (test accuracy at chance "
            "in docs/quality-runs/collapses.json). Drop the last partial batch (webdataset "
            "batched(..., partial=False), DataLoader drop_last=True), or scale each batch's loss by its "
            "size: seta_stream.weighted_mean(losses, weights, batch_size=...)"
        ),
    }
