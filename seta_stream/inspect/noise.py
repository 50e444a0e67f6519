"""The suspects report of :mod:`seta_stream.inspect` (``seta-stream suspects``, docs/algorithms.md
§12.6): the samples the run's plans held as suspected noise, in which epochs, with their loss
history, the plans where the rule was active, and precision and recall against a list of
known-noisy samples. The rule itself is a plan stage, seta_stream/policies/noise.py; this report
reads what its plans recorded (each plan's reasons, its summary's ``noise_*`` fields, docs/format.md),
of either version of the rule (§12.12). It reads run files, which the pure policies do not.

Nothing here writes to the run directory (the suspects' file goes where the caller says, and
nowhere when the caller names no file).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from .._store.parts import read_part_records
from .._store.planfiles import load_plan, planned_epochs
from .._store.runfs import RunDir
from .._store.table import folded_parts, load_table
from ..errors import InvalidInputError, PlanMissingError
from .runs import epoch_summary

__all__ = ["suspects", "suspect_report", "format_suspects", "SUSPECT_REASONS"]

#: Plan reasons of the samples the noise rule suspects (docs/algorithms.md §12).
SUSPECT_REASONS = ("suspected_noise", "noise_recheck")
#: Loss-table columns the suspects' file carries (docs/format.md, "Loss table").
_TABLE_STATS = ["last_loss", "last_epoch", "seen", "nonfinite", "loss_count", "loss_mean", "loss_m2"]

#: What the report says of each plan made with the rule (docs/algorithms.md §12.5, §12.6).
_PLAN_FIELDS = ("noise_test", "noise_active", "noise_candidates", "noise_separation", "noise_threshold")
#: What a plan of the rule's version 2 adds (§12.12; None in a plan of version 1).
_RULE2_FIELDS = ("noise_posterior", "noise_fit_threshold", "noise_floor")
#: The most-suspected samples the report names (all of them are in the file ``out``).
_NAMED = 10


def _read_epochs(run: RunDir, epoch: int | None) -> list[int]:
    """The planned epochs the report reads: every one (``epoch`` None) or ``epoch`` alone."""
    if epoch is not None:
        epoch_summary(run, epoch)  # PlanMissingError with a hint
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
    return [e for e in epochs if "noise_test" in epoch_summary(run, e)]


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
    params = summary.get("params") or {}
    return {
        "epoch": epoch,
        # the rule's version (§12.12): a plan of version 2 names it in its parameters, one of
        # version 1 lists what it always listed
        "noise_rule": params.get("noise_rule", 1),
        **{k: summary.get(k) for k in _PLAN_FIELDS},
        # version 2: the posterior asked, the fit's own threshold and the floor it was held to
        **{k: (params if k == "noise_posterior" else summary).get(k) for k in _RULE2_FIELDS},
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
    plans = [_plan_row(epoch_summary(run, e), e) for e in rule]
    report: dict[str, Any] = {
        "run": run.url,
        "policy": epoch_summary(run, epochs[-1]).get("policy"),
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


def _in_epochs(epochs: list[int]) -> str:
    return f"epoch{'s' if len(epochs) > 1 else ''} {_epochs_text(epochs)}"


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
    rules = sorted({p.get("noise_rule", 1) for p in plans})  # reports written before versions: 1
    head = (
        f"  {'epoch':>5}  "
        + (f"{'rule':>4}  " if len(rules) > 1 else "")
        + f"{'test':<14} {'D':>7} {'upper w':>8} {'threshold':>10}"
    )
    head += f" {'(log1p)':>9}" if log1p else ""
    head += f" {'candidates':>10} {'suspected':>9} {'rechecked':>9}"
    head += f" {'precision':>9} {'recall':>7}" if truth else ""
    lines.append(head)
    for p in plans:
        d, w, t = p["noise_separation"], p["noise_upper_weight"], p["noise_threshold"]
        line = (
            f"  {p['epoch']:>5}  "
            + (f"{p.get('noise_rule', 1):>4}  " if len(rules) > 1 else "")
            + f"{p['noise_test']:<14} {'-' if d is None else f'{d:.3f}':>7} "
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
    lines += _rule2_text([p for p in plans if p.get("noise_rule", 1) == 2], both=len(rules) > 1)
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


def _rule2_text(plans: list[dict[str, Any]], both: bool) -> list[str]:
    """What the table's rows of version 2 mean (§12.12): where the threshold lies, the epochs whose
    threshold was held at the previous plan's, and what ``low_posterior`` says."""
    if not plans:
        return []
    posterior = sorted({p["noise_posterior"] for p in plans if p.get("noise_posterior") is not None})
    asked = ", ".join(f"{q:g}" for q in posterior) or "noise_posterior"
    where = f"where the noise mode's posterior reaches {asked}, never below the previous plan's"
    out = [
        f"  (rule 2: the threshold is {where}; rule 1: where the components cross; docs/algorithms.md §12.12)"
        if both
        else f"  (the rule's version 2: the threshold is {where}; docs/algorithms.md §12.12)"
    ]
    held = [
        p["epoch"]
        for p in plans
        if p.get("noise_floor") is not None
        and p.get("noise_fit_threshold") is not None
        and p["noise_floor"] > p["noise_fit_threshold"]
    ]
    if held:
        out.append(
            f"  held at the previous plan's threshold in {_in_epochs(held)} (the fit's own is lower: "
            "noise_fit_threshold in --json)"
        )
    low = [p["epoch"] for p in plans if p["noise_test"] == "low_posterior"]
    if low:
        out.append(
            f"  low_posterior in {_in_epochs(low)}: two modes, but the noise mode's posterior never "
            f"reaches {asked}, so nothing is suspected there"
        )
    return out


def _ratio_text(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.3f}"
