"""Pruning settings that land near 30/50/70% pruned, chosen on training losses only."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

LEVELS = (0.3, 0.5, 0.7)


def calibrate(full_run: Path, population: Any, epochs: int) -> dict:
    """InfoBatch and SeTa settings whose pruned % lands nearest 30/50/70%, chosen on training losses.

    Replays the policy over the per-epoch losses that the full-data run of seed 0 recorded
    (plan of epoch e sees the losses of epoch e-1) for a grid of settings, and takes per
    level the setting whose simulated pruned % is nearest. Pruned runs see stale losses for
    samples they skipped, so the measured % differs somewhat; the report shows the measured one.
    """
    import pyarrow.parquet as pq

    from seta_stream.ids import sample_uids

    uid = sample_uids(population.column("shard"), population.column("key"))
    order = np.argsort(uid)
    per_epoch = []
    for e in range(epochs):
        t = pq.read_table(sorted((full_run / "losses" / "rank=0" / f"epoch={e}").glob("*.parquet")), partitioning=None)
        u = sample_uids(t.column("shard"), t.column("key"))
        loss = np.full(len(uid), np.nan, np.float32)
        pos = order[np.searchsorted(uid[order], u)]
        loss[pos] = t.column("loss").to_numpy(zero_copy_only=False)
        per_epoch.append(loss)
    nan = np.full(len(uid), np.nan, np.float32)
    return choose(uid, [nan, *per_epoch[:-1]], LEVELS, 0.6, full_run.name)


def choose(uid: np.ndarray, lasts: list[np.ndarray], levels: tuple[float, ...], r_max: float, source: str) -> dict:
    """Per policy and level, the grid's setting whose pruned % simulated over ``lasts`` (the last
    losses each epoch's plan sees, every sample trained every epoch) lands nearest the level."""
    from seta_stream.policies import PolicyInput, run_policy

    n, epochs = len(uid), len(lasts)

    def simulate(policy: str, params: dict) -> float:
        kept = 0
        for e, last in enumerate(lasts):
            seen = np.isfinite(last).astype(np.int32)
            inp = PolicyInput(uid=uid, last_loss=last, ema=last.astype(np.float64), seen=seen,
                              last_epoch=np.where(seen > 0, e - 1, -1).astype(np.int32), epoch=e, epochs=epochs,
                              seed=0)  # fmt: skip
            kept += int(run_policy(policy, inp, **params).keep.sum())
        return 1 - kept / (n * epochs)

    rs = [round(0.1 * i, 1) for i in range(round(10 * r_max) + 1)]
    grids = {
        "infobatch": [dict(r=r) for r in (0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)],
        "seta": [dict(r=r, k=k, alpha=a) for r in rs for k in (5, 10) for a in (0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)],
    }
    chosen: dict[str, Any] = {"source": source, "levels": {}}
    for policy, grid in grids.items():
        sims = [(simulate(policy, p), p) for p in grid]
        for level in levels:
            # nearest; among near-equal (within 2 points) prefer the paper's ranges: small r, k=5
            best = min(sims, key=lambda s: (round(abs(s[0] - level) / 0.02), s[1].get("r", 0), s[1].get("k", 0)))
            chosen["levels"].setdefault(policy, {})[f"{int(level * 100)}"] = {"params": best[1], "simulated": best[0]}
    return chosen
