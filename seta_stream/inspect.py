"""Read-only views of a run: per-epoch kept/pruned, the plans' warnings, the clusters and window of
a plan, the shards that lost most and least, and a PNG plot of the loss histogram with the
cluster boundaries.

Nothing here writes to the run directory (the plot goes where the caller says).
"""

from __future__ import annotations

import math
from typing import Any

import polars as pl

from ._layout import MANIFEST, plan_file, stats_glob
from ._plans import planned_epochs, read_summary
from ._runfs import RunDir
from ._state import read_state
from .errors import PlanMissingError

__all__ = ["run_summary", "format_summary", "plot_epoch"]


def _summary(run: RunDir, epoch: int) -> dict[str, Any]:
    s = read_summary(run, epoch)
    if s is None:
        raise PlanMissingError(
            f"{run.display(plan_file(epoch, 'summary.json'))} does not exist; planned epochs: "
            f"{planned_epochs(run)}. Plan it with `seta-stream plan {run.url} --epoch {epoch}`"
        )
    return s


def _shard_losses(run: RunDir, epoch: int, top: int) -> dict[str, list[dict[str, Any]]]:
    plan = pl.from_arrow(run.read_parquet(plan_file(epoch, "plan.parquet"), columns=["shard", "keep"]))
    assert isinstance(plan, pl.DataFrame)
    per_shard = (
        plan.group_by("shard")
        .agg(pl.len().alias("n"), pl.col("keep").sum().alias("kept"))
        .with_columns((1 - pl.col("kept") / pl.col("n")).alias("pruned_fraction"))
    )
    most = per_shard.sort(["pruned_fraction", "shard"], descending=[True, False]).head(top)
    least = per_shard.sort(["pruned_fraction", "shard"]).head(top)
    return {"shards_lost_most": most.to_dicts(), "shards_lost_least": least.to_dicts()}


def run_summary(run: str | RunDir, epoch: int | None = None, *, top_shards: int = 5) -> dict[str, Any]:
    """Everything `seta-stream inspect` shows, as a JSON-serialisable dict.

    ``epochs``: one entry per planned epoch (phase, n, kept, pruned_fraction, pruned_so_far,
    and the codes of its plan's ``warnings``, docs/algorithms.md §0.10); ``warnings``: every
    planned epoch's warnings (each with its ``epoch``);
    ``selected``: the full summary of ``epoch`` (default: the last planned one) plus the
    shards that lost most and least of their samples in it; ``table``: rows of the loss table.
    """
    run = RunDir(run)
    planned = planned_epochs(run)
    state = read_state(run)
    manifest = run.read_json(MANIFEST, default={}) or {}
    epochs: list[dict[str, Any]] = []
    warned: list[dict[str, Any]] = []
    for e in planned:
        s = _summary(run, e)
        counts = [run.read_json(rel) or {} for rel in run.glob(stats_glob(e))]
        epochs.append(
            {
                "epoch": e,
                "phase": s.get("phase"),
                "n": s.get("n"),
                "kept": s.get("kept"),
                "pruned_fraction": s.get("pruned_fraction"),
                "pruned_so_far": s.get("pruned_so_far"),
                # what the training loop reported (Pruner): samples recorded and back-propagated
                "recorded": sum(c.get("recorded", 0) for c in counts) if counts else None,
                "trained": sum(c.get("trained", 0) for c in counts) if counts else None,
                "warnings": [w.get("code") for w in s.get("warnings") or []],
            }
        )
        warned += [{"epoch": e, **w} for w in s.get("warnings") or []]
    trained = [e for e in epochs if e["trained"] is not None and e["n"]]
    if trained:
        out_trained = 1 - sum(e["trained"] for e in trained) / sum(e["n"] for e in trained)
    else:
        out_trained = None
    out: dict[str, Any] = {
        "run": run.url,
        "policy": state.get("policy"),
        "params": state.get("params"),
        "seed": state.get("seed"),
        "epochs_total": state.get("epochs"),
        "current_epoch": state.get("current_epoch"),
        "table": {"rows": manifest.get("rows", 0), "generation": manifest.get("generation", 0)},
        "epochs": epochs,
        "warnings": warned,
        "pruned_by_training": out_trained,  # 1 - back-propagated / known samples (ES: b/B)
    }
    if planned or epoch is not None:
        sel = planned[-1] if epoch is None else epoch
        selected = _summary(run, sel)
        selected.update(_shard_losses(run, sel, top_shards))
        out["selected"] = selected
    return out


def _pct(x: Any) -> str:
    return "-" if x is None else f"{100 * float(x):.1f}%"


def format_summary(s: dict[str, Any]) -> str:
    """Human-readable text of :func:`run_summary`."""
    lines = [
        f"run {s['run']}: policy {s.get('policy')} {s.get('params')}, seed {s.get('seed')}, "
        f"{s.get('epochs_total')} epochs; loss table: {s['table']['rows']} samples",
        "",
        f"{'epoch':>5}  {'phase':<8} {'n':>10} {'kept':>10} {'pruned':>8} {'so far':>8} {'trained':>10}  warnings",
    ]
    for e in s["epochs"]:
        lines.append(
            f"{e['epoch']:>5}  {str(e['phase']):<8} {e['n']:>10} {e['kept']:>10} "
            f"{_pct(e['pruned_fraction']):>8} {_pct(e['pruned_so_far']):>8} "
            f"{'-' if e.get('trained') is None else e['trained']:>10}  {', '.join(e.get('warnings') or []) or '-'}"
        )
    if s.get("pruned_by_training") is not None:
        lines.append(f"pruned by training (1 - back-propagated / known samples): {_pct(s['pruned_by_training'])}")
    if s.get("warnings"):
        lines += ["", f"warnings ({len(s['warnings'])}; docs/algorithms.md §0.10):"]
        lines += [f"  epoch {w['epoch']} [{w.get('code')}] {w.get('message')}" for w in s["warnings"]]
    sel = s.get("selected")
    if not sel:
        lines.append("(no plan yet)")
        return "\n".join(lines)
    lines += ["", f"epoch {sel.get('epoch')} ({sel.get('policy')}, phase {sel.get('phase')}):"]
    if sel.get("centroids"):
        w, start = sel.get("w"), sel.get("s")
        window = "all clusters" if start in (None, "all") else f"clusters {start}..{start + w - 1}"
        lines.append(f"  k' = {sel.get('k_eff')}, window width {w}, window: {window}")
        lines.append(f"  {'cluster':>7} {'size':>10} {'centroid':>10} {'min':>10} {'max':>10}")
        for i, c in enumerate(sel["centroids"]):
            lines.append(
                f"  {i:>7} {sel['cluster_sizes'][i]:>10} {c:>10.4g} "
                f"{sel['cluster_min'][i]:>10.4g} {sel['cluster_max'][i]:>10.4g}"
            )
    for k in ("unseen", "nonfinite", "empty_plan_guard", "mu", "n_below_mean", "weight", "safeguards", "batch_size"):
        if k in sel:
            lines.append(f"  {k}: {sel[k]}")
    if sel.get("kept_by_reason"):
        lines.append(f"  kept by reason: {sel['kept_by_reason']}")
    for title, key in (("lost most", "shards_lost_most"), ("lost least", "shards_lost_least")):
        rows = sel.get(key) or []
        if rows:
            lines.append(
                f"  shards that {title}: "
                + ", ".join(f"{r['shard']} ({_pct(r['pruned_fraction'])} of {r['n']})" for r in rows)
            )
    return "\n".join(lines)


def plot_epoch(run: str | RunDir, path: str, epoch: int | None = None) -> str:
    """Write a PNG: loss histogram of ``epoch``'s plan with cluster boundaries and the kept window
    marked (left), and the kept fraction of every planned epoch (right). Returns ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    run = RunDir(run)
    planned = planned_epochs(run)
    if not planned:
        raise PlanMissingError(f"{run.display('plans')}: no plan yet; nothing to plot")
    sel = planned[-1] if epoch is None else epoch
    summary = _summary(run, sel)
    plan = run.read_parquet(plan_file(sel, "plan.parquet"), columns=["loss", "keep"])
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
        se = _summary(run, e)
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
