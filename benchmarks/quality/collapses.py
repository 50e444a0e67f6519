"""Runs whose held-out accuracy fell to chance during training (collapses), found in the run
files, and the experiments on their cause listed in ``docs/quality-runs/collapses.json``.

The rule (``collapse_epochs``): a run *collapsed at epoch e* when its held-out metric after
epoch e is at most chance + ``MARGIN`` (2 points) while an earlier epoch of the same run had
reached at least chance + ``LEARNED`` (10 points): the model had learned and lost it. A *dip*
(``dip_epochs``) is an epoch at most ``DIP`` x chance (twice chance) after such an epoch that is
not a collapse; dips are listed beside the collapses, not marked in the tables. The metric is the
test accuracy after every epoch (CIFAR-10, 10 classes: chance 10%, a collapse at <= 12%, a dip
at <= 20%) or the pairs study's mean of the image->text and text->image recall@1 over its held-out
pairs (chance 1 / the number of held-out pairs). The short study's run files record no
per-epoch test accuracy, so a collapse inside one of its runs cannot be seen.

For each collapse the report gives the plan that trained just before the evaluation (the plan
of epoch e): its phase and kept fraction (from the run file); SeTa's cluster window and the
largest sample weight, which the run files do not record, from the policy's rule for the run's
parameters and epoch (docs/algorithms.md §3.2, §4.2; ``checks.py`` verified that rule on the
run's directory where ``checks.json`` lists it, and the report says where it did not); the
learning rate over that epoch from the training loop's schedule (the files do not record it);
and the training loss of the epoch before and of that epoch.

``collapses.json`` (optional; the report lists "none recorded" without it, written by
``collapse_list.py``) holds one object per epoch at chance with the experiments on its cause::

    [{"run_id": "cifar10-E36-infobatch-p30-r0.5-s0", "file": "docs/quality-runs/converged/...json",
      "epoch": 9, "acc": 0.1, "prev_epoch_plan": {"kept_fraction": 0.64, "window": null, "max_weight": 2.0,
      "final_batch": 1, ...}, "lr": {"final_batch_step": 0.085, ...},
      "cause": "the epoch ended with a final batch of 1 sample ...",     # first sentence goes in the table
      "experiment": {"changed": "...", "command": ["python -m ..."], "result_files": ["docs/...json"],
                     "outcome": ["...", ...]}, ...}]

``load_experiments`` checks the keys the report reads (``EXPERIMENT_KEYS``, and in ``experiment``
``command``, ``result_files`` and ``outcome``) and rejects another shape with the entry and key it
stumbled on; the report flags an entry whose run id is not a collapse it found.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

MARGIN = 0.02  # a collapse: at most chance + 2 points ...
LEARNED = 0.10  # ... after an epoch at least chance + 10 points
DIP = 2.0  # a dip: at most twice chance (and not a collapse) after such an epoch
EXPERIMENT_KEYS = ("run_id", "epoch", "prev_epoch_plan", "lr", "cause", "experiment")
RUN_KEYS = ("command", "result_files", "outcome")
IMAGE_PEAK_LR = 0.1  # benchmarks/quality/train.py: SGD peak of the image runs at every revision of the run files


@dataclass
class Trace:
    """One run's per-epoch record, whatever study it comes from."""

    run: str  # the run id (its file name without .json)
    study: str  # the folder (or study) it belongs to
    policy: str
    params: dict
    seed: int
    metric: list[float]  # held-out metric after each epoch (fractions)
    chance: float
    kept: list[float]  # the plan's kept fraction of each epoch
    phase: list[str]
    train_loss: list[float]
    lr: Callable[[float], float]  # the learning rate at position t (epoch + fraction of its steps)
    final: float
    checked: bool | None = None  # the policy rule verified on its run directory (None: not checked)
    extra: list[str] = field(default_factory=list)  # per epoch, an extra note on the plan (pairs: mismatched share)


@dataclass(frozen=True)
class Event:
    trace: Trace
    epoch: int

    @property
    def acc(self) -> float:
        return self.trace.metric[self.epoch]


def collapse_epochs(metric: list[float], chance: float) -> list[int]:
    """The epochs at most chance + MARGIN after an earlier epoch at least chance + LEARNED."""
    out, learned = [], False
    for e, m in enumerate(metric):
        if learned and m <= chance + MARGIN + 1e-12:
            out.append(e)
        learned = learned or m >= chance + LEARNED - 1e-12
    return out


def dip_epochs(metric: list[float], chance: float) -> list[int]:
    """The epochs at most DIP x chance, not collapses, after an epoch at least chance + LEARNED."""
    out, learned = [], False
    for e, m in enumerate(metric):
        if learned and chance + MARGIN + 1e-12 < m <= DIP * chance + 1e-12:
            out.append(e)
        learned = learned or m >= chance + LEARNED - 1e-12
    return out


def seta_window(params: dict, epoch: int, phase: str) -> str:
    """SeTa's window in the plan of ``epoch`` by algorithms.md §3.2 (k' = k: the losses of
    thousands of samples have k distinct values): clusters s..s+w-1 of k, 0 the easiest."""
    if phase != "prune":
        return "none (annealing)"
    if epoch == 0:
        return "every cluster (epoch 0)"
    k = int(params.get("k", 10))
    w = min(k, max(1, round(float(params.get("alpha", 0.5)) * k)))
    s = epoch % (k - w + 1)
    where = "hard end" if s + w == k else ("easy end" if s == 0 else "middle")
    text = f"clusters {s}-{s + w - 1} of {k} ({where})"
    if params.get("target_keep") is not None:
        text += f", band of {params['target_keep']:g} N centred on them"
    return text


def window(policy: str, params: dict, epoch: int, phase: str) -> str:
    if policy == "seta":
        return seta_window(params, epoch, phase)
    return "-"


def largest_weight(policy: str, params: dict, epoch: int, phase: str) -> float:
    """The largest sample weight of the plan by the policy's rule: InfoBatch's 1/(1-r) on its
    drawn below-mean samples in pruning epochs after epoch 0 (algorithms.md §4.2); 1 otherwise
    (SeTa never rescales, §3.3)."""
    if policy == "infobatch" and phase == "prune" and epoch > 0:
        return 1.0 / (1.0 - float(params.get("r", 0.5)))
    return 1.0


def events(traces: list[Trace]) -> tuple[list[Event], list[Event]]:
    """(collapses, dips) of every trace, in the traces' order."""
    col = [Event(t, e) for t in traces for e in collapse_epochs(t.metric, t.chance)]
    dips = [Event(t, e) for t in traces for e in dip_epochs(t.metric, t.chance)]
    return col, dips


def load_experiments(path: Path) -> list[dict]:
    """The entries of ``collapses.json`` ([] when the file does not exist); ValueError on another
    shape than the module docstring's."""
    if not path.exists():
        return []
    data = json.loads(path.read_text())
    if not isinstance(data, list):
        raise ValueError(f"{path}: expected a list of collapse entries")
    for i, x in enumerate(data):
        name = f"#{i} ({x.get('run_id', '?')}, epoch {x.get('epoch', '?')})" if isinstance(x, dict) else f"#{i}"
        missing = [k for k in EXPERIMENT_KEYS if not isinstance(x, dict) or k not in x]
        if missing:
            raise ValueError(f"{path}: entry {name}: missing {missing}, expected the keys {list(EXPERIMENT_KEYS)}")
        exp = x["experiment"]
        lacking = [k for k in RUN_KEYS if not isinstance(exp, dict) or not isinstance(exp.get(k), list)]
        if lacking:
            raise ValueError(f"{path}: entry {name}: experiment needs the lists {lacking}")
        if not isinstance(x["cause"], str):
            raise ValueError(f"{path}: entry {name}: 'cause' must be a string")
    return data


def _pct(x: float, digits: int = 1) -> str:
    return f"{100 * x:.{digits}f}"


def _lr(x: float) -> str:
    return f"{x:.3g}"


def collapse_rows(col: list[Event], experiments: list[dict], metric: str = "acc %") -> list[str]:
    """The table of collapses: one row per collapse event."""
    L = [
        f"| run | study | epoch | held-out {metric}: epoch before -> that epoch -> after | plan of that epoch: "
        "phase, kept fraction | SeTa window (rule) | largest weight (rule) | lr over the epoch (schedule) "
        "| training loss: epoch before -> that epoch -> after | final | rule checked on its run directory "
        "| cause experiments |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for ev in col:
        t, e = ev.trace, ev.epoch
        after = _pct(t.metric[e + 1]) if e + 1 < len(t.metric) else "(last epoch)"
        before = _pct(t.metric[e - 1]) if e > 0 else "-"
        plan = f"{t.phase[e]}, {t.kept[e]:.2f}" + (f"; {t.extra[e]}" if t.extra else "")
        loss = " -> ".join(f"{t.train_loss[i]:.2f}" if 0 <= i < len(t.train_loss) else "-" for i in (e - 1, e, e + 1))
        w = largest_weight(t.policy, t.params, e, t.phase[e])
        checked = {None: "not kept", True: "yes, no problem", False: "**problems** (checks.json)"}[t.checked]
        hits = [x for x in experiments if x["run_id"] == t.run and x["epoch"] == ev.epoch]
        exps = ("final batch of " + ", ".join(str(x["prev_epoch_plan"].get("final_batch", "?")) for x in hits)
                + " (see the causes below)") if hits else "none yet"  # fmt: skip
        L.append(
            f"| `{t.run}` | {t.study} | {e} | {before} -> **{_pct(t.metric[e])}** -> {after} | {plan} "
            f"| {window(t.policy, t.params, e, t.phase[e])} | {w:g} | {_lr(t.lr(e))} -> {_lr(t.lr(e + 1))} "
            f"| {loss} | {_pct(t.final)} | {checked} | {exps} |"
        )
    return L


def dip_line(dips: list[Event]) -> str:
    if not dips:
        return "Dips (at most twice chance, not a collapse): none."
    by_run: dict[tuple[str, str], list[Event]] = {}
    for ev in dips:
        by_run.setdefault((ev.trace.study, ev.trace.run), []).append(ev)
    items = [
        f"`{run}` ({study}; {', '.join(f'epoch {ev.epoch}: {_pct(ev.acc)}%' for ev in evs)})"
        for (study, run), evs in by_run.items()
    ]
    return (f"Dips (held-out metric at most {DIP:g} x chance but above the collapse line, after the run had "
            f"learned; not marked in the tables), {len(dips)} in {len(by_run)} runs: "
            + "; ".join(items) + ".")  # fmt: skip


def experiment_lines(experiments: list[dict], collapsed: set[tuple[str, int]], source: str) -> list[str]:
    """The causes and the experiments of ``collapses.json``, one row per epoch at chance, or the
    place they go. ``collapsed``: the (run id, epoch) pairs the rule found."""
    if not experiments:
        return [f"Experiments on the cause: none recorded yet (`{source}`; its schema is in the docstring of "
                "`benchmarks/quality/collapses.py`).", ""]  # fmt: skip
    L = [f"Causes and experiments (`{source}`; each experiment's outcome in full there):", "",
         "| run | epoch | final batch | lr at its step | cause | experiments | result files |",
         "| --- | --- | --- | --- | --- | --- | --- |"]  # fmt: skip
    for x in experiments:
        mark = "" if (x["run_id"], x["epoch"]) in collapsed else " (not a collapse the rule found)"
        plan, lr, exp = x["prev_epoch_plan"], x["lr"], x["experiment"]
        batch = plan.get("final_batch", "-") if isinstance(plan, dict) else "-"
        step = lr.get("final_batch_step") if isinstance(lr, dict) else None
        cause = x["cause"].split("; ")[0].split(". ")[0]
        cmds = "<br>".join(f"`{c}`" for c in exp["command"]) or "- (not rerun)"
        files = ", ".join(f"`{f.rsplit('/', 1)[-1]}`" for f in exp["result_files"]) or "-"
        L.append(f"| `{x['run_id']}`{mark} | {x['epoch']} | {batch} | {'-' if step is None else f'{step:.4f}'} "
                 f"| {cause} | {cmds} | {files} |")  # fmt: skip
    return L + [""]


def image_lr(n_epochs: int) -> Callable[[float], float]:
    from .train import lr_at

    return lambda t: lr_at(t, n_epochs, IMAGE_PEAK_LR)


def converged_trace(r: dict, run: str, study: str, checked: dict[str, list[str]] | None = None) -> Trace | None:
    """The trace of a converged-study result (None without a per-epoch test accuracy)."""
    eps = r["epochs"]
    if not eps or any("test_acc" not in e for e in eps):
        return None
    n = r.get("n_epochs", len(eps))
    ok = None if checked is None or run not in checked else not checked[run]
    return Trace(run, study, r["policy"], r["params"], r["seed"], [e["test_acc"] for e in eps], 0.1,
                 [e["kept"] / e["n"] for e in eps], [e["phase"] for e in eps], [e["train_loss"] for e in eps],
                 image_lr(n), r["test_acc"], ok)  # fmt: skip


def chance_note(metric_name: str, chance: float) -> str:
    return f"{metric_name} chance {100 * chance:g}%, collapse at most {100 * (chance + MARGIN):g}%"


def policy_counts(traces: list[Trace], col: list[Event]) -> str:
    """'seta 5 of 40, infobatch 1 of 6, ...': collapsed runs per policy among the runs with a curve."""
    hit = {id(ev.trace) for ev in col}  # a run id can stand in several studies (folders)
    order = ("full", "random", "static", "infobatch", "seta", "es", "eswp")
    per: dict[str, list[int]] = {}
    for t in traces:
        c = per.setdefault(t.policy, [0, 0])
        c[0] += id(t) in hit
        c[1] += 1
    return ", ".join(f"{p} {per[p][0]} of {per[p][1]}" for p in sorted(per, key=lambda p: order.index(p)))


def finite(x: float) -> bool:
    return x is not None and math.isfinite(x)
