"""Read-only views of a run: per-epoch kept/pruned, the plans' warnings, the clusters and window of
a plan, the shards that lost most and least, a PNG plot of the loss histogram with the cluster
boundaries, and the samples the run's plans held as suspected noise, in which epochs, with
their loss history (docs/algorithms.md §12.6).

Nothing here writes to the run directory (the plot and the suspects' file go where the caller
says, and nowhere when the caller names no file).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ._store.layout import MANIFEST, plan_file, stats_glob
from ._store.parts import read_part_records
from ._store.planfiles import load_plan, planned_epochs, read_summary
from ._store.runfs import RunDir
from ._store.state import read_state
from ._store.table import folded_parts, load_table
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
    try:
        import matplotlib
    except ImportError:  # the plot extra is optional
        raise InvalidInputError(
            f"plotting to {path} needs matplotlib, which is not installed; install it with "
            "pip install 'seta-stream[plot]' (or leave the plot out)"
        ) from None

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    run = RunDir(run)
    planned = planned_epochs(run)
    if not planned:
        raise PlanMissingError(f"{run.display('plans')}: no plan yet; nothing to plot")
    sel = planned[-1] if epoch is None else epoch
    summary = _summary(run, sel)
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
#: What the report says of each plan made with the rule (docs/algorithms.md §12.5, §12.6).
_PLAN_FIELDS = ("noise_test", "noise_active", "noise_candidates", "noise_separation", "noise_threshold")
#: The most-suspected samples the report names (all of them are in the file ``out``).
_NAMED = 10


def _read_epochs(run: RunDir, epoch: int | None) -> list[int]:
    """The planned epochs the report reads: every one (``epoch`` None) or ``epoch`` alone."""
    if epoch is not None:
        _summary(run, epoch)  # PlanMissingError with a hint
        return [epoch]
    planned = planned_epochs(run)
    if not planned:
        raise PlanMissingError(f"{run.display('plans')}: no plan yet; suspects are those of the plans")
    return planned


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


def _ids(table: pa.Table) -> pl.DataFrame:
    """``table`` as polars with ``shard`` and ``reason`` as plain strings."""
    df = pl.from_arrow(table)
    assert isinstance(df, pl.DataFrame)
    return df.with_columns([pl.col(c).cast(pl.String) for c in ("shard", "reason") if c in df.columns])


def _plan_suspects(run: RunDir, epoch: int) -> pl.DataFrame:
    """(epoch, shard, key, uid, reason) of the rows the plan of ``epoch`` holds as suspects."""
    plan = load_plan(run, epoch, columns=["shard", "key", "uid", "reason"])
    plan = plan.filter(pc.is_in(plan.column("reason").cast(pa.string()), pa.array(SUSPECT_REASONS)))
    return _ids(plan).select(pl.lit(epoch, pl.Int32).alias("epoch"), "shard", "key", "uid", "reason")


_EMPTY_ROWS = {"epoch": pl.Int32, "shard": pl.String, "key": pl.String, "uid": pl.UInt64, "reason": pl.String}


def _rule_epochs(run: RunDir, epochs: list[int]) -> list[int]:
    """Those of ``epochs`` whose plan was made with the noise rule (its summary has ``noise_test``)."""
    return [e for e in epochs if "noise_test" in _summary(run, e)]


def _suspect_rows(run: RunDir, epochs: list[int]) -> pl.DataFrame:
    pieces = [_plan_suspects(run, e) for e in _rule_epochs(run, epochs)]
    return pl.concat(pieces) if pieces else pl.DataFrame(schema=_EMPTY_ROWS)


def _by_sample(rows: pl.DataFrame) -> pl.DataFrame:
    """One row per sample of the suspect ``rows``: the epochs whose plan held it as a suspect,
    left it out, kept it with weight 0 to re-check it."""
    epochs = pl.col("epoch").sort()
    return rows.group_by(["shard", "key", "uid"]).agg(
        epochs.alias("suspected_epochs"),
        epochs.filter(pl.col("reason") == "suspected_noise").alias("left_out_epochs"),
        epochs.filter(pl.col("reason") == "noise_recheck").alias("rechecked_epochs"),
    )


def suspects(run: str | RunDir, epoch: int | None = None, *, history: bool = True) -> pa.Table:
    """Every sample a plan of the run held as suspected noise (docs/algorithms.md §12.6): left
    out (reason ``suspected_noise``) or kept with weight 0 to re-check it (``noise_recheck``)
    in at least one planned epoch; with ``epoch``, the suspects of that plan alone. One row
    per sample, sorted by (shard, key).

    Columns: ``shard``, ``key``, ``uid``; ``suspected_epochs``, ``left_out_epochs``,
    ``rechecked_epochs`` (ascending lists of the epochs whose plan held it as a suspect, left it
    out, re-checked it); ``last_plan_reason``: its reason in the last plan read (the last
    planned epoch, or ``epoch``): a noise reason while it is still suspected, the policy's own
    reason once released; from the current loss table ``loss_count``, ``loss_mean``,
    ``loss_std`` (population standard deviation of the finite losses: sqrt(loss_m2 /
    loss_count)), ``last_loss``, ``last_epoch``, ``seen``, ``nonfinite``; with ``history``,
    ``loss_e0``, ``loss_e1``, ...: each epoch's loss from the folded loss parts (NaN where none;
    reading them costs a pass over every part). Join it with your captions or URLs on (shard,
    key)."""
    run = run if isinstance(run, RunDir) else RunDir(run)
    epochs = _read_epochs(run, epoch)
    return _suspect_table(run, epochs, _suspect_rows(run, epochs), history)


def _suspect_table(run: RunDir, epochs: list[int], rows: pl.DataFrame, history: bool) -> pa.Table:
    per_sample = _by_sample(rows)
    last = _ids(load_plan(run, epochs[-1], columns=["shard", "uid", "reason"]))
    # semi joins, not is_in: polars changed is_in's reading of a column argument within 1.x
    uids = per_sample.select("uid")
    last = last.join(uids, on="uid", how="semi").rename({"reason": "last_plan_reason"})
    per_sample = per_sample.join(last, on=["shard", "uid"], how="left")
    table = pl.from_arrow(load_table(run, ["shard", "uid", *_TABLE_STATS], shard_as_dictionary=False))
    assert isinstance(table, pl.DataFrame)
    table = table.join(uids, on="uid", how="semi")
    out = per_sample.join(table, on=["shard", "uid"], how="left").with_columns(
        (pl.col("loss_m2") / pl.col("loss_count")).sqrt().alias("loss_std")
    )
    out = out.select(
        "shard",
        "key",
        "uid",
        pl.col("suspected_epochs", "left_out_epochs", "rechecked_epochs").cast(pl.List(pl.Int32)),
        "last_plan_reason",
        "loss_count",
        "loss_mean",
        "loss_std",
        "last_loss",
        "last_epoch",
        "seen",
        "nonfinite",
    )
    if history and out.height:
        out = out.join(_history(run, out["uid"].to_numpy()), on=["shard", "uid"], how="left")
    return out.sort(["shard", "key"]).to_arrow()


def _truth_ids(path: str) -> pl.DataFrame:
    t = pq.read_table(path)
    missing = {"shard", "key"} - set(t.column_names)
    if missing:
        raise InvalidInputError(
            f"{path}: no column(s) {sorted(missing)}; expected a Parquet file with the shard and key of "
            "every known-noisy sample (as tools/make_pair_shards.py's noise.parquet has)"
        )
    # typed, so that a file of no rows (a clean data set) joins as one listing no sample
    columns = {c: t.column(c).cast(pa.string()).to_pylist() for c in ("shard", "key")}
    return pl.DataFrame(columns, schema={"shard": pl.String, "key": pl.String}).unique()


def _ratio(part: int, whole: int) -> float | None:
    return part / whole if whole else None


def _plan_row(summary: dict[str, Any], epoch: int) -> dict[str, Any]:
    components = summary.get("noise_components") or {}
    return {
        "epoch": epoch,
        **{k: summary.get(k) for k in _PLAN_FIELDS},
        "noise_scale": summary.get("noise_scale", "loss"),  # plans from before noise_scale: the loss
        "noise_upper_weight": (components.get("weight") or [None, None])[1],
        "planned": summary.get("n"),
        "suspected": summary.get("noise_suspected"),
        "rechecked": summary.get("noise_rechecked"),
    }


def suspect_report(
    run: str | RunDir,
    epoch: int | None = None,
    *,
    out: str | None = None,
    truth: str | None = None,
    history: bool = True,
) -> dict[str, Any]:
    """What `seta-stream suspects` prints, as a dict (docs/algorithms.md §12.6): over every
    planned epoch (with ``epoch``, that plan alone), each plan made with the rule (``plans``:
    epoch, the two-mode test, Ashman's D, the upper component's weight, the threshold, the
    counts), the epochs where it was active, and the samples any of them held as suspects (how
    many, how many were ever left out, how many the last plan still holds; the most often
    suspected by name).

    ``out``: where :func:`suspects`' table is written as Parquet (a local path); without it
    nothing is written. ``truth``: a Parquet file with ``shard`` and ``key`` columns of the
    samples known to be noisy; each plan then gets precision (listed suspects / its suspects)
    and recall (listed suspects / listed samples the plan holds), and the run the same over the
    union of the plans' suspects and of the listed samples the plans hold."""
    run = run if isinstance(run, RunDir) else RunDir(run)
    epochs = _read_epochs(run, epoch)
    rule = _rule_epochs(run, epochs)
    rows = _suspect_rows(run, epochs)
    table = _suspect_table(run, epochs, rows, history and out is not None)
    last = table.column("last_plan_reason").to_pylist()
    named = sorted(table.select(["shard", "key", "suspected_epochs", "left_out_epochs"]).to_pylist(),
                   key=lambda r: (-len(r["suspected_epochs"]), r["shard"], r["key"]))  # fmt: skip
    plans = [_plan_row(_summary(run, e), e) for e in rule]
    report: dict[str, Any] = {
        "run": run.url,
        "policy": _summary(run, epochs[-1]).get("policy"),
        "epochs": epochs,
        "noise": bool(rule),
        "plans": plans,
        "active_epochs": [p["epoch"] for p in plans if p["noise_active"]],
        "suspected": table.num_rows,
        "left_out": sum(1 for x in table.column("left_out_epochs").to_pylist() if x),
        "last_epoch": epochs[-1],
        "suspected_in_last_plan": sum(1 for r in last if r in SUSPECT_REASONS),
        "most_suspected": named[:_NAMED],
    }
    if out is not None:
        pq.write_table(table, out)
        report["out"] = out
        report["columns"] = table.column_names
    if truth is not None:
        report.update(_truth_report(run, rule, rows, truth, plans))
    return report


def _truth_report(
    run: RunDir, rule: list[int], rows: pl.DataFrame, truth: str, plans: list[dict[str, Any]]
) -> dict[str, Any]:
    """Precision and recall of each plan's suspects and of their union against the listed
    samples (``plans`` get theirs in place)."""
    listed = _truth_ids(truth)
    held = pl.DataFrame(schema={"shard": pl.String, "key": pl.String})
    for plan in plans:
        e = plan["epoch"]
        in_plan = _ids(load_plan(run, e, columns=["shard", "key"])).join(listed, on=["shard", "key"], how="semi")
        held = pl.concat([held, in_plan]).unique()
        found = rows.filter(pl.col("epoch") == e)
        tp = found.join(listed, on=["shard", "key"], how="semi").height
        plan.update(
            true_positives=tp,
            truth_in_plan=in_plan.height,
            precision=_ratio(tp, found.height),
            recall=_ratio(tp, in_plan.height),
        )
    union = rows.select("shard", "key").unique()
    tp = union.join(listed, on=["shard", "key"], how="semi").height
    return {
        "truth": truth,
        "truth_listed": listed.height,
        "truth_in_plans": held.height,
        "true_positives": tp,
        "precision": _ratio(tp, union.height),
        "recall": _ratio(tp, held.height),
    }


def _threshold_text(t: float | None, scale: str) -> str:
    """A threshold in loss units (expm1 of it where the mixture was fitted on the log1p scale)."""
    if t is None:
        return "-"
    return f"{math.expm1(t) if scale == 'log1p' else t:.6g}"


def _epochs_text(epochs: list[int]) -> str:
    """Ascending epochs, runs of consecutive ones as a range: [2, 3, 4, 7] -> '2-4, 7'."""
    runs: list[list[int]] = []
    for e in epochs:
        if runs and e == runs[-1][-1] + 1:
            runs[-1].append(e)
        else:
            runs.append([e])
    return ", ".join(str(r[0]) if len(r) == 1 else f"{r[0]}-{r[-1]}" for r in runs)


def format_suspects(r: dict[str, Any]) -> str:
    """Human-readable text of :func:`suspect_report`."""
    plans = r["plans"]
    read = f"epoch {r['epochs'][0]}" if len(r["epochs"]) == 1 else f"{len(r['epochs'])} plans"
    active = r["active_epochs"]
    lines = [
        f"run {r['run']} ({r.get('policy')}), {read}: the noise rule in {len(plans)}, active in {len(active)}"
        + (f" (epochs {_epochs_text(active)})" if active else "")
    ]
    if not plans:
        lines.append("  made without the noise rule (noise=False): nothing is suspected")
        return "\n".join(lines)
    log1p = any(p["noise_scale"] == "log1p" for p in plans)
    truth = "precision" in plans[0]
    head = f"  {'epoch':>5}  {'test':<14} {'D':>7} {'upper w':>8} {'threshold':>10}"
    head += f" {'(log1p)':>9}" if log1p else ""
    head += f" {'candidates':>10} {'suspected':>9} {'rechecked':>9}"
    head += f" {'precision':>9} {'recall':>7}" if truth else ""
    lines.append(head)
    for p in plans:
        d, w, t = p["noise_separation"], p["noise_upper_weight"], p["noise_threshold"]
        line = (
            f"  {p['epoch']:>5}  {p['noise_test']:<14} {'-' if d is None else f'{d:.3f}':>7} "
            f"{'-' if w is None else f'{w:.3f}':>8} {_threshold_text(t, p['noise_scale']):>10}"
        )
        if log1p:
            line += f" {'-' if t is None or p['noise_scale'] != 'log1p' else f'{t:.4g}':>9}"
        line += f" {p['noise_candidates']:>10} {p['suspected']:>9} {p['rechecked']:>9}"
        if truth:
            line += f" {_ratio_text(p['precision']):>9} {_ratio_text(p['recall']):>7}"
        lines.append(line)
    lines.append(
        "  (the rule acts where the test is two_modes: Ashman's D >= 2 and a threshold, in loss units"
        + (", and on the log1p scale the mixture was fitted on" if log1p else "")
        + "; docs/algorithms.md §12.3)"
    )
    lines.append(
        f"  {r['suspected']} samples suspected in some plan, {r['left_out']} of them left out in at least one "
        f"epoch; {r['suspected_in_last_plan']} still suspected in the last plan (epoch {r['last_epoch']})"
    )
    if r.get("truth"):
        lines.append(
            f"  over the run: precision {_ratio_text(r['precision'])} ({r['true_positives']} of the {r['suspected']} "
            f"samples ever suspected are listed in {r['truth']}), recall {_ratio_text(r['recall'])} "
            f"({r['true_positives']} of the {r['truth_in_plans']} listed samples the plans hold)"
        )
    if r["most_suspected"]:
        lines.append(f"  most often suspected ({len(r['most_suspected'])} of {r['suspected']}):")
        for s in r["most_suspected"]:
            lines.append(
                f"    {s['shard']} {s['key']}: epochs {_epochs_text(s['suspected_epochs'])}"
                + (f" (left out {_epochs_text(s['left_out_epochs'])})" if s["left_out_epochs"] else " (re-checked)")
            )
    if r.get("out"):
        lines.append(f"  wrote {r['out']} ({', '.join(r['columns'])})")
    elif r["suspected"]:
        lines.append("  nothing written: --out FILE.parquet writes every suspect with its epochs, losses and history")
    return "\n".join(lines)


def _ratio_text(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.3f}"
