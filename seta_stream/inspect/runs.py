"""The run views of :mod:`seta_stream.inspect`: per-epoch kept/pruned, what the training loop
reported, the plans' warnings, the clusters and window of a plan, the shards that lost most and
least (``seta-stream inspect``). Nothing here writes to the run directory.
"""

from __future__ import annotations

from typing import Any

import polars as pl

from .._store.layout import MANIFEST, plan_file, stats_glob
from .._store.planfiles import load_plan, planned_epochs, read_summary
from .._store.runfs import RunDir
from .._store.state import read_state
from ..errors import PlanMissingError

__all__ = ["run_summary", "format_summary", "epoch_summary"]


def epoch_summary(run: RunDir, epoch: int) -> dict[str, Any]:
    """The summary of ``epoch``'s plan; PlanMissingError naming the planned epochs and the
    command that plans it where there is none (the views and the suspects report read it)."""
    s = read_summary(run, epoch)
    if s is None:
        raise PlanMissingError(
            f"{run.display(plan_file(epoch, 'summary.json'))} does not exist; planned epochs: "
            f"{planned_epochs(run)}. Plan it with `seta-stream plan {run.url} --epoch {epoch}`"
        )
    return s


def _shard_losses(run: RunDir, epoch: int, top: int) -> dict[str, list[dict[str, Any]]]:
    plan = pl.from_arrow(load_plan(run, epoch, columns=["shard", "keep"]))
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
        s = epoch_summary(run, e)
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
        selected = epoch_summary(run, sel)
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
    if "noise_test" in sel:  # the noise rule (docs/algorithms.md §12)
        d = sel.get("noise_separation")
        lines.append(
            f"  noise rule: {sel['noise_test']} (Ashman's D {'-' if d is None else f'{d:.3f}'}, "
            f"{sel.get('noise_candidates')} candidates), {sel.get('noise_suspected')} suspected, "
            f"{sel.get('noise_rechecked')} re-checked with weight 0 (seta-stream suspects lists them)"
        )
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
