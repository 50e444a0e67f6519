"""Runs whose held-out metric fell to chance during training (collapses), and
``docs/quality-runs/collapses.json``: the converged studies' epochs at chance with the experiments on
their cause (``collapse.py``, results in docs/quality-runs/collapse-experiments/).

The rule (``collapse_epochs``): a run *collapsed at epoch e* when its held-out metric after epoch e
is at most chance + ``MARGIN`` while an earlier epoch of the run had reached at least chance +
``LEARNED``: the model had learned and lost it. A *dip* (``dip_epochs``) is an epoch at most ``DIP``
x chance after such an epoch that is not a collapse. The metric: the test accuracy after every epoch,
or the pairs study's mean recall@1 of both directions over its held-out pairs (chance 1 / their
number). The run files record the plan's phase and kept fraction; SeTa's window and the largest
weight come from the policy's rule (docs/algorithms.md §3.2, §4.2), the learning rate from the
training loop's schedule.

python -m studies.quality.collapses      # rewrites docs/quality-runs/collapses.json (so does the report)

``collapses.json``: every converged-study epoch with test accuracy at most ``CHANCE``, in file and
epoch order, each with ``run_id``, ``file``, ``study``, ``policy``, ``params``, ``epoch``, ``acc``
(``acc_before``, ``acc_after``), ``train_loss`` (that epoch and the next), ``prev_epoch_plan`` (the
plan trained in that epoch: ``kept``, ``n``, ``kept_fraction``, ``window`` (``seta_clusters``),
``max_weight``, ``final_batch``: its last batch of 128), ``lr`` (``lr_record``), ``cause`` and
``experiment`` (``command``, ``result_files``, ``outcome``: each result file's small final batches,
epochs at chance and fork at the collapse epoch).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from studies.quality.collapse import experiment, parse
from studies.quality.layout import Layout
from studies.quality.train import lr_at

MARGIN = 0.02  # a collapse: at most chance + 2 points ...
LEARNED = 0.10  # ... after an epoch at least chance + 10 points
DIP = 2.0  # a dip: at most twice chance (and not a collapse) after such an epoch
IMAGE_PEAK_LR = 0.1  # studies/quality/train.py: SGD peak of the image runs at every revision of the run files
#: collapses.json: test accuracy at or below this counts as chance (10 classes, 10,000 balanced test images).
CHANCE = 0.11
BATCH = 128
FOLDERS = ("converged", "converged-same-order")
EXPERIMENTS = "collapse-experiments"
COMMAND = ".venv/bin/python -m studies.quality.collapse"


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


def events(traces: list[Trace]) -> tuple[list[Event], list[Event]]:
    """(collapses, dips) of every trace, in the traces' order."""
    col = [Event(t, e) for t in traces for e in collapse_epochs(t.metric, t.chance)]
    dips = [Event(t, e) for t in traces for e in dip_epochs(t.metric, t.chance)]
    return col, dips


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
    return seta_window(params, epoch, phase) if policy == "seta" else "-"


def largest_weight(policy: str, params: dict, epoch: int, phase: str) -> float:
    """The largest sample weight of the plan by the policy's rule: InfoBatch's 1/(1-r) on its
    drawn below-mean samples in pruning epochs after epoch 0 (algorithms.md §4.2); 1 otherwise
    (SeTa never rescales, §3.3)."""
    if policy == "infobatch" and phase == "prune" and epoch > 0:
        return 1.0 / (1.0 - float(params.get("r", 0.5)))
    return 1.0


def converged_trace(r: dict, run: str, study: str, checked: dict[str, list[str]] | None = None) -> Trace | None:
    """The trace of a converged-study result (None without a per-epoch test accuracy); ``checked``:
    checks.json's run id -> the problems found on its run directory."""
    eps = r["epochs"]
    if not eps or any("test_acc" not in e for e in eps):
        return None
    n = r.get("n_epochs", len(eps))
    ok = None if checked is None or run not in checked else not checked[run]
    return Trace(run, study, r["policy"], r["params"], r["seed"], [e["test_acc"] for e in eps], 0.1,
                 [e["kept"] / e["n"] for e in eps], [e["phase"] for e in eps], [e["train_loss"] for e in eps],
                 lambda t: lr_at(t, n, IMAGE_PEAK_LR), r["test_acc"], ok)  # fmt: skip


# ------------------------------------------------------------------ collapses.json
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

CAUSE = (
    "the epoch ended with a final batch of {f} sample{s} (kept {kept} = {q} x 128 + {f}); the last optimiser step of "
    "the epoch, on {f} sample{s} at lr {lr:.4f} (Nesterov momentum 0.9), threw the weights off: the test accuracy "
    "fell to {acc:.1f}%, chance for 10 balanced classes. SeTa and InfoBatch keep a different number of samples "
    "every epoch, so the final batch takes any size from 1 to 128; full data and dynamic random keep a fixed count "
    "(final batches of 72, 12, 100 and 60 samples) and never fell to chance. {forks}"
)


def control_file() -> str:
    """The result file's name of the full-data control."""
    return experiment(parse(CONTROL.split()))[1] + ".json"


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


def _forks(result: dict) -> list[tuple[int, dict]]:
    """The forked epochs of an experiment's result, each with its readings (``collapse.Probe``)."""
    return [(e["epoch"], e["probe"]) for e in result["epochs"] if "size_1" in (e.get("probe") or {})]


def _last_batch(e: dict) -> int:
    """An epoch's final batch (one loader worker: the samples streamed modulo 128, or 128)."""
    return (e["streamed"] - 1) % BATCH + 1


def _reading(r: dict, epoch: int) -> str:
    """An experiment's result at a glance: its final batches under 8 samples, its epochs at chance,
    and its fork at the collapse ``epoch``."""
    small = [
        f"e{e['epoch']}: {_last_batch(e)} samples, {'not trained, ' * (e['backprop'] < e['streamed'])}"
        f"{100 * e['test_acc']:.1f}%"
        for e in r["epochs"]
        if _last_batch(e) < 8
    ]
    at_chance = [f"e{e['epoch']}" for e in r["epochs"] if e["test_acc"] <= CHANCE]
    text = f"final batches under 8 samples: {', '.join(small) or 'none'}; epochs at chance: "
    text += ", ".join(at_chance) or "none"
    fork = dict(_forks(r)).get(epoch)
    if fork is not None:
        text += (f"; forked at the collapse epoch {epoch}: {100 * fork['without_final']:.1f}% without the final "
                 f"batch, {100 * fork['size_1']:.1f}% with one sample in its place")  # fmt: skip
    return text


def _experiment(run_id: str, results: Path, epoch: int) -> dict:
    """The experiments on the collapse of ``run_id`` at ``epoch``: commands, result files, readings."""
    argv = [*RUN_EXPERIMENTS.get(run_id, []), CONTROL]
    files, outcome, reached = [], [], -1
    for args in argv:
        name = experiment(parse(args.split()))[1] + ".json"
        path = results / EXPERIMENTS / name
        if not path.exists():
            outcome.append(f"{name}: not run")
            continue
        r = json.loads(path.read_text())
        if args != CONTROL:
            reached = max(reached, r["epochs"][-1]["epoch"])
        files.append(f"docs/quality-runs/{EXPERIMENTS}/{name}")
        outcome.append(f"{name}: {_reading(r, epoch)}")
    if reached < epoch:
        outcome.insert(0, f"not rerun to epoch {epoch} ({epoch + 1} epochs of training, beyond the experiments' "
                          "budget): the forks of the other runs, full data included, show the mechanism")  # fmt: skip
    return {"command": [f"{COMMAND} {args}" for args in argv], "result_files": files, "outcome": outcome}


def _fork_stats(results: Path) -> str:
    """What every forked epoch of the experiments shows, in numbers."""
    runs = [_forks(json.loads(path.read_text())) for path in sorted((results / EXPERIMENTS).glob("*.json"))]
    forks = [p for run in runs for _, p in run]
    if not forks:
        return "No experiment has been run yet."

    def span(key: str, against: str | None = None) -> str:
        vals = [100 * (p[key] - (p[against] if against else 0)) for p in forks if key in p]
        if against is None:
            return f"{min(vals):.1f}-{max(vals):.1f}%"
        return f"{min(vals):+.1f} to {max(vals):+.1f} points"

    ratio = [p["grad_norm_1"] / p["grad_norm_128"] for p in forks]
    lrs = [p["lr"] for p in forks]
    off = "without_final"
    return (
        f"In {len(forks)} forked epochs of {sum(map(bool, runs))} experiment runs (every configuration tried, full "
        f"data included; learning rates {min(lrs):.4f}-{max(lrs):.4f}) one step on "
        f"one sample in place of the final batch left {span('size_1')} test accuracy ({span('size_1', off)} against "
        f"leaving the final batch out), and {span('one_weights_only')} with only the weights moving; the sample's "
        f"gradient norm was {min(ratio):.1f}-{max(ratio):.1f} times a 128-sample batch's. Against leaving the final "
        f"batch out, the same step with its gradient scaled to a 128-sample batch's norm changed the accuracy by "
        f"{span('one_clipped', off)}, with the loss divided by 128 by {span('one_nominal', off)}, and the sample's "
        f"BatchNorm statistics alone by {span('one_bn_stats_only', off)}: the size of the step, not BatchNorm, throws "
        "the model off"
    )


def _entry(folder: str, path: Path, r: dict, i: int, forks: str, results: Path) -> dict[str, Any]:
    """The entry of the epoch ``i`` of the run file ``path`` (in ``folder``), at chance."""
    eps, e = r["epochs"], r["epochs"][i]
    E = r.get("n_epochs") or len(eps)
    kept, n, epoch, phase, policy, params = e["kept"], e["n"], e["epoch"], e["phase"], r["policy"], r["params"]
    f = e["backprop"] % BATCH  # one loader worker: the epoch's samples in batches of 128
    lr = lr_record(epoch, kept, E)
    order = "reshuffled every epoch" if r.get("order") else "the same order every epoch"
    cause = CAUSE.format(f=f, s="s" * (f != 1), kept=kept, q=kept // BATCH, lr=lr["final_batch_step"],
                         acc=100 * e["test_acc"], forks=forks)  # fmt: skip
    plan = {"epoch": epoch, "phase": phase, "kept": kept, "n": n, "kept_fraction": round(kept / n, 4),
            "window": seta_clusters(params, epoch, phase) if policy == "seta" else None,
            "max_weight": largest_weight(policy, params, epoch, phase), "final_batch": f}  # fmt: skip
    return {
        "run_id": path.stem,
        "file": f"docs/quality-runs/{folder}/{path.name}",
        "study": f"{folder} (E = {E}, augmented, {order})",
        "policy": policy,
        "params": params,
        "epoch": epoch,
        "acc": e["test_acc"],
        "acc_before": eps[i - 1]["test_acc"] if i else None,
        "acc_after": eps[i + 1]["test_acc"] if i + 1 < len(eps) else None,
        "train_loss": [round(x["train_loss"], 4) for x in eps[i : i + 2]],
        "prev_epoch_plan": plan,
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


def write(layout: Layout | None = None) -> list[dict[str, Any]]:
    """Rewrite ``collapses.json``; returns its entries."""
    layout = layout or Layout()
    entries = collapses(layout)
    (layout.results / "collapses.json").write_text(json.dumps(entries, indent=1, ensure_ascii=False) + "\n")
    return entries


def main() -> None:
    write()
    print(f"-> {Layout().results / 'collapses.json'}")


if __name__ == "__main__":
    main()
