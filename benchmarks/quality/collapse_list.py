"""docs/quality-runs/collapses.json: every epoch of the converged studies whose test accuracy fell
to chance, the plan that preceded it, the learning rate, the cause, and the experiments that show it
(``collapse``; their result files are in docs/quality-runs/collapse-experiments/).

python -m benchmarks.quality.collapse_list      # rewrites docs/quality-runs/collapses.json

Each entry: ``run_id``, ``file`` (the run file), ``study``, ``policy``, ``params``, ``epoch`` (the
epoch after whose training the accuracy was measured), ``acc`` (its test accuracy), ``acc_before``
and ``acc_after`` (the epochs around it), ``train_loss`` (mean training loss of that epoch and the
next), ``prev_epoch_plan`` (the plan trained in that epoch: ``kept``, ``n``, ``kept_fraction``,
``window`` (SeTa's loss clusters, None for InfoBatch), ``max_weight``, ``final_batch``: the
samples of its last batch of 128), ``lr`` (the learning rate at the epoch's first step, its last
step (the final batch) and the schedule's peak), ``cause``, ``experiment`` (``changed``,
``command``, ``result_files``, ``outcome``).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from .layout import Layout
from .train import lr_at

#: Test accuracy at or below this counts as chance (10 classes, 10,000 balanced test images).
CHANCE = 0.11
BATCH = 128
PEAK = 0.1
FOLDERS = ("converged", "converged-same-order")
EXPERIMENTS = "collapse-experiments"
COMMAND = "PYTHONPATH=. .venv/bin/python -m benchmarks.quality.collapse"

#: The experiments behind each collapsed run (by run id): the command-line arguments of
#: ``collapse`` and the result files they wrote.
RUN_EXPERIMENTS: dict[str, list[tuple[str, str]]] = {
    "cifar10-E36-infobatch-p30-r0.5-s0": [
        ("--run infobatch --until 10 --fork-epochs 1,5,8,9,10",
         "collapse-cifar10-E36-infobatch-p30-r0.5-s0-until10.json"),
    ],
    "cifar10-E36-seta-p50-alpha0.6-k10-r0.1-s0": [
        ("--run seta-p50 --until 2", "collapse-cifar10-E36-seta-p50-alpha0.6-k10-r0.1-s0-until2.json"),
    ],
    "cifar10-E36-seta-p70-alpha0.4-k10-r0.3-s0": [
        ("--run seta-p70 --until 7 --fork-epochs 4,5,6,7",
         "collapse-cifar10-E36-seta-p70-alpha0.4-k10-r0.3-s0-until7.json"),
        ("--run seta-p70 --until 7 --drop-below 8 --no-forks --tag=-drop8",
         "collapse-cifar10-E36-seta-p70-alpha0.4-k10-r0.3-s0-until7-drop8.json"),
        ("--run seta-p70 --until 7 --drop-below 8 --no-forks --param min_keep_fraction=0.1 --tag=-drop8",
         "collapse-cifar10-E36-seta-p70-alpha0.4-k10-min_keep_fraction0.1-r0.3-s0-until7-drop8.json"),
    ],
    "cifar10-E72-seta-p30-alpha0.7-k5-r0.0-s0": [
        ("--run e72-seta-p30 --until 1 --fork-epochs 1",
         "collapse-cifar10-E72-seta-p30-alpha0.7-k5-r0.0-s0-until1.json"),
    ],
    "cifar10-E72-seta-p50-alpha0.6-k5-r0.1-s0": [
        ("--run e72-seta-p50 --until 1 --fork-epochs 1",
         "collapse-cifar10-E72-seta-p50-alpha0.6-k5-r0.1-s0-until1.json"),
    ],
}  # fmt: skip
#: The control every entry also cites: full data, whose final batch is always 72 samples.
CONTROL = ("--run full --until 3", "collapse-cifar10-E36-full-e36-default-s0-until3.json")


def _window(policy: str, params: dict, epoch: int, epochs: int) -> dict | None:
    """SeTa's window of ``epoch`` (k' = k: the losses have far more than k distinct values)."""
    if policy != "seta":
        return None
    from seta_stream.policies.random_draws import prune_epochs
    from seta_stream.policies.seta import window_start, window_width

    k = params.get("k", 10)
    if epoch >= prune_epochs(params.get("delta", 0.875), epochs, params.get("prune_epochs")):
        return {"phase": "anneal"}
    w = window_width(k, params.get("alpha", 0.5))
    if epoch == 0:
        return {"k": k, "w": w, "s": "all", "clusters": "all"}
    s = window_start(epoch, k, w)
    return {"k": k, "w": w, "s": s, "clusters": f"{s}..{s + w - 1} of {k}", "hardest": s + w == k}


def _max_weight(policy: str, params: dict, epoch: int, epochs: int) -> float:
    if policy != "infobatch" or epoch == 0:  # InfoBatch's epoch 0 has no seen sample: weight 1
        return 1.0
    from seta_stream.policies.random_draws import prune_epochs

    if epoch >= prune_epochs(params.get("delta", 0.875), epochs, params.get("prune_epochs")):
        return 1.0
    return float(1.0 / (1.0 - params.get("r", 0.5)))


def _lr(epoch: int, kept: int, epochs: int) -> dict:
    """The learning rate of the epoch's first and last step (train.train_run's schedule)."""
    steps = max(1, math.ceil(kept / BATCH))
    return {
        "first_step": round(lr_at(epoch, epochs, PEAK), 5),
        "final_batch_step": round(lr_at(epoch + (steps - 1) / steps, epochs, PEAK), 5),
        "peak": PEAK,
        "schedule": f"one-cycle over E = {epochs}: linear from 0 to {PEAK} over the first 15% of the epochs, "
        "then linear to 0; set every step",
    }


def _fork_lines(result: dict) -> list[str]:
    """The forked evaluations of an experiment, one line per epoch."""
    out = []
    for e in result["epochs"]:
        p = e.get("probe") or {}
        if "size_1" not in p:
            continue
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


def _run_lines(result: dict) -> str:
    """The run itself: per epoch, kept count, final batch (one loader worker: the kept count modulo
    128, or 128) and test accuracy."""
    return "; ".join(
        f"e{e['epoch']} kept {e['kept']} ({100 * e['kept'] / e['n']:.1f}%), final batch "
        f"{(e['streamed'] - 1) % BATCH + 1}{' (not trained)' if e['backprop'] < e['streamed'] else ''}, "
        f"test {100 * e['test_acc']:.1f}%"
        for e in result["epochs"]
    )


def _headline(name: str, r: dict, epoch: int) -> str:
    """In one sentence: what the rerun's small final batches and the fork at the collapse epoch showed."""
    small = [e for e in r["epochs"] if (e["streamed"] - 1) % BATCH + 1 < 8]
    parts = []
    for e in small:
        f = (e["streamed"] - 1) % BATCH + 1
        if e["backprop"] < e["streamed"]:
            parts.append(f"e{e['epoch']} ended with {f} sample{'s' * (f > 1)}, not trained: {100 * e['test_acc']:.1f}%")
        else:
            parts.append(f"e{e['epoch']} ended with a batch of {f}: {100 * e['test_acc']:.1f}%")
    at_chance = [e["epoch"] for e in r["epochs"] if e["test_acc"] <= CHANCE]
    line = f"{name}: final batches under 8 samples: {'; '.join(parts) if parts else 'none'}; epochs at chance: "
    line += ", ".join(f"e{x}" for x in at_chance) if at_chance else "none"
    fork = next((e["probe"] for e in r["epochs"] if e["epoch"] == epoch and "size_1" in (e.get("probe") or {})), None)
    if fork is not None:
        line += (
            f"; forked at the collapse epoch {epoch}: {100 * fork['without_final']:.1f}% without the final batch, "
            f"{100 * fork['size_1']:.1f}% with one sample in its place"
        )
    return line


def _experiment(run_id: str, folder: Path, epoch: int) -> dict:
    runs = RUN_EXPERIMENTS.get(run_id, [])
    files, outcome, reached, headlines = [], [], -1, []
    for args, name in [*runs, CONTROL]:
        path = folder / EXPERIMENTS / name
        if not path.exists():
            outcome.append(f"{name}: not run")
            continue
        r = json.loads(path.read_text())
        if (args, name) != CONTROL:
            reached = max(reached, r["epochs"][-1]["epoch"])
            headlines.append(_headline(name, r, epoch))
        files.append(f"docs/quality-runs/{EXPERIMENTS}/{name}")
        what = "control, full data" if (args, name) == CONTROL else "rerun"
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
        "command": [f"{COMMAND} {args}" for args, _ in [*runs, CONTROL]],
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
        forks += [e["probe"] for e in json.loads(path.read_text())["epochs"] if "size_1" in (e.get("probe") or {})]
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


def collapses(layout: Layout | None = None) -> list[dict[str, Any]]:
    """Every epoch at chance in the converged studies' run files, in file and epoch order."""
    layout = layout or Layout()
    forks = _fork_stats(layout.results)
    out = []
    for sub in FOLDERS:
        for path in sorted((layout.results / sub).glob("*-s[0-9]*.json")):
            r = json.loads(path.read_text())
            eps = r.get("epochs") or []
            for i, e in enumerate(eps):
                if e.get("test_acc") is None or e["test_acc"] > CHANCE:
                    continue
                E = r.get("n_epochs") or len(eps)
                kept, n, epoch = e["kept"], e["n"], e["epoch"]
                f = e["backprop"] % BATCH  # one loader worker: the epoch's samples in batches of 128
                lr = _lr(epoch, kept, E)
                run_id = path.stem
                out.append(
                    {
                        "run_id": run_id,
                        "file": f"docs/quality-runs/{sub}/{path.name}",
                        "study": f"{sub} (E = {E}, augmented, "
                        f"{'reshuffled every epoch' if r.get('order') else 'the same order every epoch'})",
                        "policy": r["policy"],
                        "params": r["params"],
                        "epoch": epoch,
                        "acc": e["test_acc"],
                        "acc_before": eps[i - 1]["test_acc"] if i else None,
                        "acc_after": eps[i + 1]["test_acc"] if i + 1 < len(eps) else None,
                        "train_loss": [round(x["train_loss"], 4) for x in eps[i : i + 2]],
                        "prev_epoch_plan": {
                            "epoch": epoch,
                            "phase": e["phase"],
                            "kept": kept,
                            "n": n,
                            "kept_fraction": round(kept / n, 4),
                            "window": _window(r["policy"], r["params"], epoch, E),
                            "max_weight": _max_weight(r["policy"], r["params"], epoch, E),
                            "final_batch": f,
                        },
                        "lr": lr,
                        "cause": CAUSE.format(
                            f=f,
                            s="" if f == 1 else "s",
                            kept=kept,
                            q=kept // BATCH,
                            lr=lr["final_batch_step"],
                            acc=100 * e["test_acc"],
                            forks=forks,
                        ),
                        "experiment": _experiment(run_id, layout.results, epoch),
                    }
                )
    return out


def main() -> None:
    layout = Layout()
    path = layout.results / "collapses.json"
    path.write_text(json.dumps(collapses(layout), indent=1, ensure_ascii=False) + "\n")
    print(f"-> {path}")


if __name__ == "__main__":
    main()
