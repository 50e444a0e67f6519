"""Read-only views of a run: per-epoch kept/pruned, the plans' warnings, the clusters and window of
a plan, the shards that lost most and least, a PNG plot of the loss histogram with the cluster
boundaries, and the samples a plan holds as suspected noise with their loss history
(docs/algorithms.md §12.6).

Nothing here writes to the run directory (the plot and the suspects' file go where the caller
says).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from ._layout import MANIFEST, plan_file, stats_glob
from ._parts import read_part_records
from ._plans import load_plan, planned_epochs, read_summary
from ._runfs import RunDir
from ._state import read_state
from ._table import folded_parts, load_table
from .errors import InvalidInputError, PlanMissingError

__all__ = ["run_summary", "format_summary", "plot_epoch", "suspects", "suspect_report", "format_suspects"]

#: Plan reasons of the samples the noise rule suspects (docs/algorithms.md §12).
SUSPECT_REASONS = ("suspected_noise", "noise_recheck")
#: Loss-table columns the suspects' file carries (docs/format.md, "Loss table").
_TABLE_STATS = ["last_loss", "last_epoch", "seen", "nonfinite", "loss_count", "loss_mean", "loss_m2"]


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


# ---------------------------------------------------------------------------------- suspects
def _selected_epoch(run: RunDir, epoch: int | None) -> int:
    planned = planned_epochs(run)
    if epoch is None:
        if not planned:
            raise PlanMissingError(f"{run.display('plans')}: no plan yet; suspects are those of a plan")
        return planned[-1]
    _summary(run, epoch)  # PlanMissingError with a hint
    return epoch


def _history(run: RunDir, uids: np.ndarray) -> pl.DataFrame:
    """(shard, uid, loss_e0, loss_e1, ...) of the samples ``uids``: each epoch's loss from the
    loss parts folded into the table (the greatest (rank, seq) record of the epoch; NaN where
    none), for every epoch from 0 to the last one any of them was recorded in."""
    pieces = [read_part_records(run, rel, uids) for rel in folded_parts(run)]
    pieces = [p for p in pieces if p.num_rows]
    if not pieces:
        return pl.DataFrame(schema={"shard": pl.String, "uid": pl.UInt64})
    records = pl.from_arrow(pa.concat_tables(pieces))
    assert isinstance(records, pl.DataFrame)
    last = (
        records.sort(["shard", "uid", "epoch", "rank", "seq"])
        .group_by(["shard", "uid", "epoch"], maintain_order=True)
        .agg(pl.col("loss").last())
    )
    top = int(last["epoch"].max())  # type: ignore[arg-type]
    wide = last.pivot(on="epoch", index=["shard", "uid"], values="loss")
    names = {str(e): f"loss_e{e}" for e in range(top + 1)}
    for e in range(top + 1):
        if str(e) not in wide.columns:
            wide = wide.with_columns(pl.lit(None, dtype=pl.Float32).alias(str(e)))
    wide = wide.select(["shard", "uid", *names]).rename(names)
    return wide.with_columns(pl.col(list(names.values())).cast(pl.Float32).fill_null(float("nan")))


def suspects(run: str | RunDir, epoch: int | None = None, *, history: bool = True) -> pa.Table:
    """The samples the plan of ``epoch`` (default: the last planned one) holds as suspected
    noise: left out (reason ``suspected_noise``) or kept with weight 0 to re-check them
    (``noise_recheck``), one row each, sorted by (shard, key).

    Columns: ``shard``, ``key``, ``uid``, ``reason``, ``kept``; from the current loss table
    ``loss_count``, ``loss_mean``, ``loss_std`` (population standard deviation of the finite
    losses: sqrt(loss_m2 / loss_count)), ``last_loss``, ``last_epoch``, ``seen``,
    ``nonfinite``; with ``history``, ``loss_e0``, ``loss_e1``, ...: each epoch's loss from the
    folded loss parts (NaN where none; reading them costs a pass over every part). Join it with
    your captions or URLs on (shard, key)."""
    run = run if isinstance(run, RunDir) else RunDir(run)
    sel = _selected_epoch(run, epoch)
    plan = pl.from_arrow(load_plan(run, sel, columns=["shard", "key", "uid", "keep", "reason"]))
    assert isinstance(plan, pl.DataFrame)
    rows = (
        plan.with_columns(pl.col("shard").cast(pl.String), pl.col("reason").cast(pl.String))
        .filter(pl.col("reason").is_in(list(SUSPECT_REASONS)))
        .rename({"keep": "kept"})
        .select(["shard", "key", "uid", "reason", "kept"])
    )
    table = pl.from_arrow(load_table(run, ["shard", "uid", *_TABLE_STATS], shard_as_dictionary=False))
    assert isinstance(table, pl.DataFrame)
    table = table.filter(pl.col("uid").is_in(rows["uid"].implode()))
    out = rows.join(table, on=["shard", "uid"], how="left").with_columns(
        (pl.col("loss_m2") / pl.col("loss_count")).sqrt().alias("loss_std")
    )
    out = out.select(
        [
            "shard",
            "key",
            "uid",
            "reason",
            "kept",
            "loss_count",
            "loss_mean",
            "loss_std",
            "last_loss",
            "last_epoch",
            "seen",
            "nonfinite",
        ]
    )
    if history and out.height:
        out = out.join(_history(run, out["uid"].to_numpy()), on=["shard", "uid"], how="left")
    return out.sort(["shard", "key"]).to_arrow()


def _truth_pairs(path: str) -> set[tuple[str, str]]:
    t = pq.read_table(path)
    missing = {"shard", "key"} - set(t.column_names)
    if missing:
        raise InvalidInputError(
            f"{path}: no column(s) {sorted(missing)}; expected a Parquet file with the shard and key of "
            "every known-noisy sample (as tools/make_pair_shards.py's noise.parquet has)"
        )
    shard = t.column("shard").cast(pa.string()).to_pylist()
    key = t.column("key").cast(pa.string()).to_pylist()
    return set(zip(shard, key))


def suspect_report(
    run: str | RunDir,
    epoch: int | None = None,
    *,
    out: str | None = None,
    truth: str | None = None,
    history: bool = True,
) -> dict[str, Any]:
    """What `seta-stream suspects` prints, as a dict: the plan's rule statistics and counts, and
    with ``truth`` (a Parquet file with ``shard`` and ``key`` columns of the samples known to be
    noisy) precision (listed suspects / suspects) and recall (listed suspects / listed samples
    the plan holds). ``out``: where :func:`suspects`' table is written as Parquet (a local
    path; ``{epoch}`` in it is replaced by the epoch)."""
    run = run if isinstance(run, RunDir) else RunDir(run)
    sel = _selected_epoch(run, epoch)
    summary = _summary(run, sel)
    table = suspects(run, sel, history=history)
    report: dict[str, Any] = {
        "run": run.url,
        "epoch": sel,
        "policy": summary.get("policy"),
        "noise": bool((summary.get("params") or {}).get("noise")),
        "planned": summary.get("n"),
        "suspected": table.num_rows,
        "rechecked": int(sum(r == "noise_recheck" for r in table.column("reason").to_pylist())),
    }
    for k in ("noise_active", "noise_test", "noise_candidates", "noise_separation", "noise_threshold"):
        report[k] = summary.get(k)
    report["noise_scale"] = summary.get("noise_scale", "loss")  # plans from before noise_scale: the loss
    if out is not None:
        out = out.replace("{epoch}", str(sel))
        pq.write_table(table, out)
        report["out"] = out
        report["columns"] = table.column_names
    if truth is not None:
        listed = _truth_pairs(truth)
        planned = load_plan(run, sel, columns=["shard", "key"])
        in_plan = listed & set(
            zip(planned.column("shard").cast(pa.string()).to_pylist(), planned.column("key").to_pylist())
        )
        found = set(zip(table.column("shard").to_pylist(), table.column("key").to_pylist()))
        tp = len(found & listed)
        report.update(
            truth=truth,
            truth_listed=len(listed),
            truth_in_plan=len(in_plan),
            true_positives=tp,
            precision=tp / len(found) if found else None,
            recall=tp / len(in_plan) if in_plan else None,
        )
    return report


def _threshold_text(r: dict[str, Any]) -> str:
    """The threshold in loss units, and on the rule's scale where that is not the loss itself."""
    t = r["noise_threshold"]
    if r.get("noise_scale", "loss") == "log1p":
        return f"{math.expm1(t):.6g} (loss; {t:.6g} on the log1p scale the mixture was fitted on)"
    return f"{t:.6g}"


def format_suspects(r: dict[str, Any]) -> str:
    """Human-readable text of :func:`suspect_report`."""
    lines = [
        f"run {r['run']}, epoch {r['epoch']} ({r.get('policy')}): {r['suspected']} of {r.get('planned')} planned "
        f"samples suspected as noise ({r['rechecked']} of them kept with weight 0 to re-check them)"
    ]
    if not r["noise"]:
        lines.append("  this plan was made without the noise rule (noise=False): nothing is suspected")
    elif r.get("noise_separation") is None:
        lines.append(
            f"  two-mode test: not run ({r.get('noise_candidates')} candidates with enough history: "
            "fewer than two distinct loss means)"
        )
    else:
        passed = (
            "passed: active"
            if r.get("noise_active")
            else "passed, but the upper mode holds half the candidates or more: nothing suspected"
            if r.get("noise_test") == "upper_majority"
            else "failed: one mode, nothing suspected"
        )
        threshold = r.get("noise_threshold")
        lines.append(
            f"  two-mode test over {r.get('noise_candidates')} candidates: Ashman's D = {r['noise_separation']:.3f} "
            f"(>= 2 required) {passed}" + ("" if threshold is None else f"; threshold {_threshold_text(r)}")
        )
    if r.get("out"):
        lines.append(f"  wrote {r['out']} ({', '.join(r['columns'])})")
    if r.get("truth"):

        def ratio(x: float | None) -> str:
            return "n/a" if x is None else f"{x:.3f}"

        lines.append(
            f"  precision {ratio(r['precision'])} ({r['true_positives']} of {r['suspected']} suspects are listed in "
            f"{r['truth']})"
        )
        lines.append(
            f"  recall {ratio(r['recall'])} ({r['true_positives']} of the {r['truth_in_plan']} listed samples "
            "the plan holds)"
        )
    return "\n".join(lines)
