"""The PNG plot of :mod:`seta_stream.inspect` (``seta-stream inspect --plot``): a plan's loss
histogram with the cluster boundaries and the kept window, and the kept fraction of every planned
epoch. matplotlib is the ``plot`` extra, imported when a plot is asked for.
"""

from __future__ import annotations

import math

import numpy as np

from .._store.planfiles import load_plan, planned_epochs
from .._store.runfs import RunDir
from ..errors import InvalidInputError, PlanMissingError
from .runs import epoch_summary

__all__ = ["plot_epoch"]


def plot_epoch(run: str | RunDir, path: str, epoch: int | None = None) -> str:
    """Write a PNG: loss histogram of ``epoch``'s plan with cluster boundaries and the kept window
    marked (left), and the kept fraction of every planned epoch (right). Returns ``path``."""
    try:
        import matplotlib
    except ImportError:  # the plot extra is optional
        raise InvalidInputError(
            f"plotting to {path} needs matplotlib, which is not installed; install it with "
            "pip install 'seta-stream[plot]' (or leave the plot out)"
        ) from None

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    run = RunDir(run)
    planned = planned_epochs(run)
    if not planned:
        raise PlanMissingError(f"{run.display('plans')}: no plan yet; nothing to plot")
    sel = planned[-1] if epoch is None else epoch
    summary = epoch_summary(run, sel)
    plan = load_plan(run, sel, columns=["loss", "keep"])
    loss = plan.column("loss").to_numpy(zero_copy_only=False).astype(np.float64)
    keep = plan.column("keep").to_numpy(zero_copy_only=False)
    finite = np.isfinite(loss)
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(12, 4.2), gridspec_kw={"width_ratios": [2, 1]})
    if finite.any():
        lo, hi = float(loss[finite].min()), float(loss[finite].max())
        use_log = lo > 0 and hi / max(lo, 1e-30) > 100
        bins = np.geomspace(lo, hi, 80) if use_log else np.linspace(lo, hi if hi > lo else lo + 1, 80)
        ax.hist(loss[finite], bins=bins, color="#bbbbbb", label="all seen samples")
        ax.hist(loss[finite & keep], bins=bins, color="#2a7ab0", alpha=0.8, label="kept")
        if use_log:
            ax.set_xscale("log")
        for b in (summary.get("cluster_max") or [])[:-1]:
            ax.axvline(b, color="#d62728", lw=0.8, ls="--")
        s, w = summary.get("s"), summary.get("w")
        if isinstance(s, int) and w and summary.get("cluster_min"):
            ax.axvspan(
                summary["cluster_min"][s],
                summary["cluster_max"][s + w - 1],
                color="#2ca02c",
                alpha=0.12,
                label=f"window: clusters {s}..{s + w - 1}",
            )
        ax.legend(loc="upper right", fontsize=8)
    ax.set_title(f"epoch {sel}: loss histogram ({summary.get('policy')}, {summary.get('phase')})")
    ax.set_xlabel("last recorded loss")
    ax.set_ylabel("samples")
    fracs = []
    for e in planned:
        se = epoch_summary(run, e)
        fracs.append(se["kept"] / se["n"] if se.get("n") else math.nan)
    ax2.bar(planned, fracs, color="#2a7ab0")
    ax2.set_ylim(0, 1.05)
    ax2.set_xlabel("epoch")
    ax2.set_ylabel("kept fraction")
    ax2.set_title("kept fraction per epoch")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
