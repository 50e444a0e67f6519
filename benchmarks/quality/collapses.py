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

python -m benchmarks.quality.collapses      # rewrites docs/quality-runs/collapses.json

``collapses.json`` lists every epoch of the converged studies whose test accuracy fell to chance
(at most ``CHANCE``), in file and epoch order, with the experiments on its cause (``collapse``;
their result files are in docs/quality-runs/collapse-experiments/). Each entry: ``run_id``,
``file`` (the run file), ``study``, ``policy``, ``params``, ``epoch`` (the epoch after whose
training the accuracy was measured), ``acc`` (its test accuracy), ``acc_before`` and
``acc_after`` (the epochs around it), ``train_loss`` (mean training loss of that epoch and the
next), ``prev_epoch_plan`` (the plan trained in that epoch: ``kept``, ``n``, ``kept_fraction``,
``window`` (``seta_clusters``, None for another policy), ``max_weight``, ``final_batch``: the
samples of its last batch of 128), ``lr`` (the learning rate at the epoch's first step, its last
step (the final batch) and the schedule's peak), ``cause`` (its first sentence goes in the
report's table), ``experiment`` (``changed``, ``command``, ``result_files``, ``outcome``).
``load_experiments`` checks the keys the report reads (``EXPERIMENT_KEYS``, and in ``experiment``
``RUN_KEYS``) and rejects another shape with the entry and key it stumbled on (the report lists
"none recorded" without the file); the report flags an entry whose run id is not a collapse it found.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .collapse import experiment, parse
from .docs import ORDER
from .layout import Layout
from .train import lr_at

MARGIN = 0.02  # a collapse: at most chance + 2 points ...
LEARNED = 0.10  # ... after an epoch at least chance + 10 points
DIP = 2.0  # a dip: at most twice chance (and not a collapse) after such an epoch
EXPERIMENT_KEYS = ("run_id", "epoch", "prev_epoch_plan", "lr", "cause", "experiment")
RUN_KEYS = ("command", "result_files", "outcome")
IMAGE_PEAK_LR = 0.1  # benchmarks/quality/train.py: SGD peak of the image runs at every revision of the run files
#: collapses.json: test accuracy at or below this counts as chance (10 classes, 10,000 balanced test images).
CHANCE = 0.11
BATCH = 128
FOLDERS = ("converged", "converged-same-order")
EXPERIMENTS = "collapse-experiments"
COMMAND = "PYTHONPATH=. .venv/bin/python -m benchmarks.quality.collapse"


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


def _after_learning(metric: list[float], chance: float, low: float, high: float) -> list[int]:
    """The epochs with low < metric <= high after an earlier epoch at least chance + LEARNED."""
    out, learned = [], False
    for e, m in enumerate(metric):
        if learned and low < m <= high + 1e-12:
            out.append(e)
        learned = learned or m >= chance + LEARNED - 1e-12
    return out


def collapse_epochs(metric: list[float], chance: float) -> list[int]:
    """The epochs at most chance + MARGIN after an earlier epoch at least chance + LEARNED."""
    return _after_learning(metric, chance, -math.inf, chance + MARGIN)


def dip_epochs(metric: list[float], chance: float) -> list[int]:
    """The epochs at most DIP x chance, not collapses, after an epoch at least chance + LEARNED."""
    return _after_learning(metric, chance, chance + MARGIN + 1e-12, DIP * chance)


def seta_clusters(params: dict, epoch: int, phase: str) -> dict:
    """SeTa's window in the plan of ``epoch`` by algorithms.md §3.2 (k' = k: the losses of
    thousands of samples have k distinct values): clusters s..s+w-1 of k, 0 the easiest."""
    from seta_stream.policies.seta import window_start, window_width

    if phase != "prune":
        return {"phase": "anneal"}
    k = params.get("k", 10)
    w = window_width(k, params.get("alpha", 0.5))
    if epoch == 0:
        return {"k": k, "w": w, "s": "all", "clusters": "all"}
    s = window_start(epoch, k, w)
    return {"k": k, "w": w, "s": s, "clusters": f"{s}..{s + w - 1} of {k}", "hardest": s + w == k}


def seta_window(params: dict, epoch: int, phase: str) -> str:
    """``seta_clusters`` in words."""
    c = seta_clusters(params, epoch, phase)
    if "phase" in c:
        return "none (annealing)"
    if c["s"] == "all":
        return "every cluster (epoch 0)"
    s, w, k = c["s"], c["w"], c["k"]
    text = f"clusters {s}-{s + w - 1} of {k} ({'hard end' if c['hardest'] else 'easy end' if s == 0 else 'middle'})"
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
            f"| {window(t.policy, t.params, e, t.phase[e])} | {w:g} | {t.lr(e):.3g} -> {t.lr(e + 1):.3g} "
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


def converged_trace(r: dict, run: str, study: str, checked: dict[str, list[str]] | None = None) -> Trace | None:
    """The trace of a converged-study result (None without a per-epoch test accuracy)."""
    eps = r["epochs"]
    if not eps or any("test_acc" not in e for e in eps):
        return None
    n = r.get("n_epochs", len(eps))
    ok = None if checked is None or run not in checked else not checked[run]
    return Trace(run, study, r["policy"], r["params"], r["seed"], [e["test_acc"] for e in eps], 0.1,
                 [e["kept"] / e["n"] for e in eps], [e["phase"] for e in eps], [e["train_loss"] for e in eps],
                 lambda t: lr_at(t, n, IMAGE_PEAK_LR), r["test_acc"], ok)  # fmt: skip


def policy_counts(traces: list[Trace], col: list[Event]) -> str:
    """'seta 5 of 40, infobatch 1 of 6, ...': collapsed runs per policy among the runs with a curve."""
    hit = {id(ev.trace) for ev in col}  # a run id can stand in several studies (folders)
    runs = Counter(t.policy for t in traces)
    hits = Counter(t.policy for t in traces if id(t) in hit)
    return ", ".join(f"{p} {hits[p]} of {runs[p]}" for p in sorted(runs, key=ORDER.get))


#: The experiments behind each collapsed run (by run id): ``collapse``'s command-line arguments.
RUN_EXPERIMENTS: dict[str, list[str]] = {
    "cifar10-E36-infobatch-p30-r0.5-s0": ["--run infobatch --until 10 --fork-epochs 1,5,8,9,10"],
    "cifar10-E36-seta-p50-alpha0.6-k10-r0.1-s0": ["--run seta-p50 --until 2"],
    "cifar10-E36-seta-p70-alpha0.4-k10-r0.3-s0": [
        "--run seta-p70 --until 7 --fork-epochs 4,5,6,7",
        "--run seta-p70 --until 7 --drop-below 8 --no-forks --tag=-drop8",
        "--run seta-p70 --until 7 --drop-below 8 --no-forks --param min_keep_fraction=0.1 --tag=-drop8",
    ],
    "cifar10-E72-seta-p30-alpha0.7-k5-r0.0-s0": ["--run e72-seta-p30 --until 1 --fork-epochs 1"],
    "cifar10-E72-seta-p50-alpha0.6-k5-r0.1-s0": ["--run e72-seta-p50 --until 1 --fork-epochs 1"],
}
#: The control every entry also cites: full data, whose final batch is always 72 samples.
CONTROL = "--run full --until 3"


def lr_record(epoch: int, kept: int, epochs: int) -> dict:
    """The learning rate of the epoch's first and last step (train.train_run's schedule)."""
    steps = max(1, math.ceil(kept / BATCH))
    return {
        "first_step": round(lr_at(epoch, epochs, IMAGE_PEAK_LR), 5),
        "final_batch_step": round(lr_at(epoch + (steps - 1) / steps, epochs, IMAGE_PEAK_LR), 5),
        "peak": IMAGE_PEAK_LR,
        "schedule": f"one-cycle over E = {epochs}: linear from 0 to {IMAGE_PEAK_LR} over the first 15% of the epochs, "
        "then linear to 0; set every step",
    }


def _forks(result: dict) -> list[tuple[dict, dict]]:
    """The epochs of an experiment's result that were forked, each with its readings (``probe``)."""
    return [(e, e["probe"]) for e in result["epochs"] if "size_1" in (e.get("probe") or {})]


def _fork_lines(result: dict) -> list[str]:
    """The forked evaluations of an experiment, one line per epoch."""
    out = []
    for e, p in _forks(result):
        acc = {k: f"{100 * v:.1f}%" for k, v in p.items() if k.startswith(("size_", "one_", "without"))}
        sizes = "/".join(acc[f"size_{s}"][:-1] for s in (1, 2, 4, 8, 32, 128))
        out.append(
            f"epoch {e['epoch']} (final batch {p['final_batch']}, lr {p['lr']:.4f}): as trained "
            f"{100 * e['test_acc']:.1f}%, without the final batch {acc['without_final']}; final batch of "
            f"1/2/4/8/32/128 samples: {sizes}% (gradient norm {p['grad_norm_1']:.1f} for 1 sample, "
            f"{p['grad_norm_128']:.1f} for 128); one sample, weights only {acc['one_weights_only']}, BatchNorm "
            f"statistics only {acc['one_bn_stats_only']}, gradient scaled to the 128-sample norm {acc['one_clipped']}"
            + (f", loss divided by 128 {acc['one_nominal']}" if "one_nominal" in acc else "")
            + f", BatchNorm in eval mode {acc['one_running_stats']}"
        )
    return out


def _last_batch(e: dict) -> int:
    """An epoch's final batch (one loader worker: the samples streamed modulo 128, or 128)."""
    return (e["streamed"] - 1) % BATCH + 1


def _run_lines(result: dict) -> str:
    """The run itself: per epoch, kept count, final batch and test accuracy."""
    return "; ".join(
        f"e{e['epoch']} kept {e['kept']} ({100 * e['kept'] / e['n']:.1f}%), final batch "
        f"{_last_batch(e)}{' (not trained)' if e['backprop'] < e['streamed'] else ''}, "
        f"test {100 * e['test_acc']:.1f}%"
        for e in result["epochs"]
    )


def _headline(name: str, r: dict, epoch: int) -> str:
    """In one sentence: what the rerun's small final batches and the fork at the collapse epoch showed."""
    parts = []
    for e in r["epochs"]:
        f = _last_batch(e)
        what = f"{f} sample{'s' * (f > 1)}, not trained" if e["backprop"] < e["streamed"] else f"a batch of {f}"
        if f < 8:
            parts.append(f"e{e['epoch']} ended with {what}: {100 * e['test_acc']:.1f}%")
    at_chance = [e["epoch"] for e in r["epochs"] if e["test_acc"] <= CHANCE]
    line = f"{name}: final batches under 8 samples: {'; '.join(parts) if parts else 'none'}; epochs at chance: "
    line += ", ".join(f"e{x}" for x in at_chance) if at_chance else "none"
    fork = next((p for e, p in _forks(r) if e["epoch"] == epoch), None)
    if fork is not None:
        line += (
            f"; forked at the collapse epoch {epoch}: {100 * fork['without_final']:.1f}% without the final batch, "
            f"{100 * fork['size_1']:.1f}% with one sample in its place"
        )
    return line


def _experiment(run_id: str, folder: Path, epoch: int) -> dict:
    runs = RUN_EXPERIMENTS.get(run_id, [])
    files, outcome, reached, headlines = [], [], -1, []
    for args in [*runs, CONTROL]:
        name = experiment(parse(args.split()))[1] + ".json"
        path = folder / EXPERIMENTS / name
        if not path.exists():
            outcome.append(f"{name}: not run")
            continue
        r = json.loads(path.read_text())
        if args != CONTROL:
            reached = max(reached, r["epochs"][-1]["epoch"])
            headlines.append(_headline(name, r, epoch))
        files.append(f"docs/quality-runs/{EXPERIMENTS}/{name}")
        what = "control, full data" if args == CONTROL else "rerun"
        line = f"{name} ({what}; {COMMAND} {args}): {_run_lines(r)}"
        forks = _fork_lines(r)
        if forks:
            line += ". Forks: " + " | ".join(forks)
        outcome.append(line)
    if reached < epoch:
        headlines.insert(
            0,
            f"not rerun to epoch {epoch}: "
            + (f"the rerun stops at epoch {reached}; " if reached >= 0 else "")
            + "the mechanism is shown by the forks of the other runs (the same model, any epoch, full data "
            f"included); training this configuration to the epoch costs {epoch + 1} epochs, more than the "
            "experiments' budget allowed",
        )
    outcome = headlines + outcome
    return {
        "changed": (
            "the epoch's final batch, nothing else: the same configuration and seed rerun through the study's own "
            "code path (train.train_run, augmented, reshuffled every epoch) past the collapse epoch; at the end of an "
            "epoch the model and optimiser are forked from the state before the final batch, the final batch is "
            "left out or replaced by its first 1, 2, 4, 8, 32 or 128 samples (one SGD step, the run's learning "
            "rate and weights), and the one-sample step is repeated with only the weights moving, only the "
            "BatchNorm statistics moving, the gradient scaled to a full batch's norm, the loss divided by 128, and "
            "BatchNorm in eval mode; each fork's test accuracy. The drop8 runs train the same configuration without "
            "any final batch of fewer than 8 samples (one also with min_keep_fraction = 0.1, which holds the epochs "
            "SeTa would shrink to 5-10% at 10%). Augmentation draws are not seeded, so a rerun is another sample "
            "of the run, not a replay: its kept counts and final batches differ. The E = 72 runs were trained in "
            "the same order every epoch; their reruns here reshuffle every epoch, as the study now does"
        ),
        "command": [f"{COMMAND} {args}" for args in [*runs, CONTROL]],
        "result_files": files,
        "outcome": outcome,
    }


CAUSE = (
    "the epoch ended with a final batch of {f} sample{s} (kept {kept} = {q} x 128 + {f}); the last optimiser step of "
    "the epoch, on {f} sample{s} at lr {lr:.4f} (Nesterov momentum 0.9), threw the weights off: the test accuracy "
    "fell to {acc:.1f}%, chance for 10 balanced classes. SeTa and InfoBatch keep a different number of samples "
    "every epoch, so the final batch takes any size from 1 to 128; full data and dynamic random keep a fixed count "
    "(final batches of 72, 12, 100 and 60 samples) and never fell to chance. {forks}"
)


def _fork_stats(folder: Path) -> str:
    """What every forked epoch of the experiments shows, in numbers."""
    forks = []
    for path in sorted((folder / EXPERIMENTS).glob("*.json")):
        forks += [p for _, p in _forks(json.loads(path.read_text()))]
    if not forks:
        return "No experiment has been run yet."

    def span(key: str) -> str:
        vals = [100 * p[key] for p in forks if key in p]
        return f"{min(vals):.1f}-{max(vals):.1f}%"

    def drop(key: str) -> str:
        vals = [100 * (p[key] - p["without_final"]) for p in forks if key in p]
        return f"{min(vals):+.1f} to {max(vals):+.1f} points"

    ratio = [p["grad_norm_1"] / p["grad_norm_128"] for p in forks]
    return (
        f"In {len(forks)} forked epochs of the experiments (every configuration tried, full data included) one step on "
        f"one sample in place of the final batch left {span('size_1')} test accuracy ({drop('size_1')} against leaving "
        f"the final batch out), and {span('one_weights_only')} with only the weights moving; the sample's gradient "
        f"norm was {min(ratio):.1f}-{max(ratio):.1f} times a 128-sample batch's. Against leaving the final batch out, "
        f"the same step with its gradient scaled to a 128-sample batch's norm changed the accuracy by "
        f"{drop('one_clipped')}, with the loss divided by 128 by {drop('one_nominal')}, and the sample's BatchNorm "
        f"statistics alone by {drop('one_bn_stats_only')}: the size of the step, not BatchNorm, throws the model off"
    )


def _entry(folder: str, path: Path, r: dict, i: int, forks: str, results: Path) -> dict[str, Any]:
    """The entry of the epoch ``i`` of the run file ``path`` (in ``folder``), at chance."""
    eps, e = r["epochs"], r["epochs"][i]
    E = r.get("n_epochs") or len(eps)
    kept, n, epoch, phase = e["kept"], e["n"], e["epoch"], e["phase"]
    f = e["backprop"] % BATCH  # one loader worker: the epoch's samples in batches of 128
    lr = lr_record(epoch, kept, E)
    order = "reshuffled every epoch" if r.get("order") else "the same order every epoch"
    acc = 100 * e["test_acc"]
    cause = CAUSE.format(
        f=f, s="s" * (f != 1), kept=kept, q=kept // BATCH, lr=lr["final_batch_step"], acc=acc, forks=forks
    )
    return {
        "run_id": path.stem,
        "file": f"docs/quality-runs/{folder}/{path.name}",
        "study": f"{folder} (E = {E}, augmented, {order})",
        "policy": r["policy"],
        "params": r["params"],
        "epoch": epoch,
        "acc": e["test_acc"],
        "acc_before": eps[i - 1]["test_acc"] if i else None,
        "acc_after": eps[i + 1]["test_acc"] if i + 1 < len(eps) else None,
        "train_loss": [round(x["train_loss"], 4) for x in eps[i : i + 2]],
        "prev_epoch_plan": {
            "epoch": epoch,
            "phase": phase,
            "kept": kept,
            "n": n,
            "kept_fraction": round(kept / n, 4),
            "window": seta_clusters(r["params"], epoch, phase) if r["policy"] == "seta" else None,
            "max_weight": largest_weight(r["policy"], r["params"], epoch, phase),
            "final_batch": f,
        },
        "lr": lr,
        "cause": cause,
        "experiment": _experiment(path.stem, results, epoch),
    }


def collapses(layout: Layout | None = None) -> list[dict[str, Any]]:
    """Every epoch at chance in the converged studies' run files, in file and epoch order."""
    layout = layout or Layout()
    forks = _fork_stats(layout.results)
    out = []
    for folder in FOLDERS:
        for path in sorted((layout.results / folder).glob("*-s[0-9]*.json")):
            r = json.loads(path.read_text())
            for i, e in enumerate(r.get("epochs") or []):
                if e.get("test_acc") is not None and e["test_acc"] <= CHANCE:
                    out.append(_entry(folder, path, r, i, forks, layout.results))
    return out


def main() -> None:
    layout = Layout()
    path = layout.results / "collapses.json"
    path.write_text(json.dumps(collapses(layout), indent=1, ensure_ascii=False) + "\n")
    print(f"-> {path}")


if __name__ == "__main__":
    main()
