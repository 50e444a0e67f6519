"""How the noise rule's parts find the noisy samples, on the losses full-data runs recorded (issue 50, item 4).

The rule of version 2 (docs/algorithms.md §12.12) scores each sample by the mean of its losses so far, fits
a two-component mixture to the scores, and suspects the samples whose score and last loss are both above
the point where the upper component's posterior reaches 0.9, a threshold that never falls while the rule
stays active. Issue 50 names mechanisms to examine before changing it: the mixture fitted on a whole-history
mean while the model is still learning (DivideMix fits each epoch's losses), class difficulty feeding the
high mode (a per-group normalisation from a group column such as the label), the two-mode test.

This study measures them without training anything: it reads the per-sample losses that CIFAR-10 runs of
full data recorded (``studies/cifar_gpu.py`` on the CPU: every training image trained and recorded every
epoch, so the history of each epoch is what a plan of the rule would read), and after every epoch applies
the library's own rule (``seta_stream.policies.noise``: ``noise_fit`` and its suspects, version 2 with its
floor carried from plan to plan) to four scores:

* ``mean``: each sample's mean loss so far (the rule's own score);
* ``last``: the last epoch's loss alone (each epoch's losses, as DivideMix fits them);
* ``window3``: the mean of the last 3 epochs' losses;
* ``mean-by-label``: the mean so far, standardised within the sample's recorded (noisy) label (its mean and
  standard deviation over the samples of that label), the last loss likewise: a per-group normalisation with
  the label as the group.

Each plan's suspects are set against the known noisy samples (precision, recall) beside the score's
detection AUC. The known noise is read to report, never to choose: nothing here sets a parameter. What the
rule would do to training (its suspects leave the training set, which changes every later loss) is not
simulated: these are detection figures on full data's trajectory, the upper bound of what a plan could see.

    python -m studies rule_mechanisms --work WORK [--work WORK2 ...]   # WORK: cifar_gpu's work folder
    python -m studies rule_mechanisms --report                         # docs/rule-mechanisms.md
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

import numpy as np

from studies.quality.pairs import auc_of
from tools.results import mean_cell, path_label

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "docs" / "quality-runs" / "rule-mechanisms" / "results.json"
DOC = ROOT / "docs" / "rule-mechanisms.md"
SCORES = {
    "mean": "each sample's mean loss so far (the rule's own score)",
    "last": "the last epoch's loss alone (each epoch's losses, as DivideMix fits them)",
    "window3": "the mean of the last 3 epochs' losses",
    "mean-by-label": "the mean loss so far, standardised within the sample's recorded (noisy) label",
}
WARMUP = 2  # the rule's default: candidates have 2 records or more


def loss_matrix(run_dir: Path, keys: list[str]) -> np.ndarray:
    """[sample, epoch] losses a run recorded (NaN where none), the samples in ``keys``' order."""
    import pyarrow.parquet as pq

    pos = {k: i for i, k in enumerate(keys)}
    files = sorted(run_dir.glob("losses/rank=*/epoch=*/*.parquet"))
    tables = [pq.read_table(f, columns=["key", "loss", "epoch"]) for f in files]
    epochs = 1 + max(int(t.column("epoch").to_numpy().max()) for t in tables)
    out = np.full((len(keys), epochs), np.nan)
    for t in tables:
        rows = np.fromiter((pos[k] for k in t.column("key").to_pylist()), np.int64, t.num_rows)
        out[rows, t.column("epoch").to_numpy()] = t.column("loss").to_numpy()
    return out


def scores(name: str, losses: np.ndarray, e: int, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(score, last loss on the score's scale) of every sample after epoch ``e`` (0-based) under ``name``."""
    seen = losses[:, : e + 1]
    last = seen[:, -1]
    if name == "last":
        return last, last
    if name == "window3":
        return np.nanmean(seen[:, -3:], axis=1), last
    mean = np.nanmean(seen, axis=1)
    if name == "mean":
        return mean, last
    z_mean, z_last = np.empty_like(mean), np.empty_like(last)
    for c in np.unique(labels):
        rows = labels == c
        mu, sd = float(np.mean(mean[rows])), float(np.std(mean[rows]))
        z_mean[rows] = (mean[rows] - mu) / sd
        z_last[rows] = (last[rows] - mu) / sd
    return z_mean, z_last


def trajectory(losses: np.ndarray, labels: np.ndarray, noisy: np.ndarray, name: str) -> list[dict]:
    """Per epoch e: the score's AUC and the plan rule version 2 would make after it (for epoch e + 1), its
    floor the previous plan's threshold while the rule stays active."""
    from seta_stream.policies.base import PolicyInput
    from seta_stream.policies.noise import NoiseParams, noise_fit

    noise = NoiseParams(noise=True, noise_rule=2)
    n, epochs = losses.shape
    out, floor = [], None
    for e in range(epochs):
        score, last = scores(name, losses, e, labels)
        count = np.full(n, e + 1, dtype=np.int32)
        inp = PolicyInput(uid=np.arange(n, dtype=np.uint64), last_loss=last.astype(np.float32),
                          ema=score, seen=count, last_epoch=None, epoch=e + 1, epochs=epochs + 1, seed=0,
                          loss_count=count, loss_mean=score)  # fmt: skip
        fit = noise_fit(inp, noise, floor=floor)
        sus = fit.suspects(inp, WARMUP)
        summary = fit.summary(int(sus.sum()), 0)
        hit = int(np.count_nonzero(sus & noisy))
        comps = summary["noise_components"]
        out.append({
            "epoch": e, "auc": auc_of(score, noisy), "D": summary["noise_separation"],
            "upper_weight": None if comps is None else comps["weight"][1], "active": summary["noise_active"],
            "threshold": summary["noise_threshold"], "suspected": int(sus.sum()),
            "precision": hit / int(sus.sum()) if sus.any() else None, "recall": hit / int(noisy.sum()),
            "suspects": np.flatnonzero(sus),
        })  # fmt: skip
        floor = summary["noise_threshold"] if summary["noise_active"] else None
    return out


def study_run(work: Path, kind: str, seed: int) -> dict:
    """The four scores' trajectories over one full-data run of ``cifar_gpu`` (its work folder ``work``)."""
    from studies.cifar_gpu import noisy_labels

    data = np.load(work / "cifar10.npz")
    keys, y = data["train_keys"], data["train_y"]
    recorded = noisy_labels(kind, keys, y)
    noisy = recorded != y
    losses = loss_matrix(work / f"run-{kind}-full-s{seed}", keys.tolist())
    out: dict[str, Any] = {"kind": kind, "seed": seed, "samples": len(keys), "noisy": int(noisy.sum()),
                           "epochs": losses.shape[1], "scores": {}}  # fmt: skip
    for name in SCORES:
        traj = trajectory(losses, recorded, noisy, name)
        union = np.unique(np.concatenate([t.pop("suspects") for t in traj]))
        hit = int(np.count_nonzero(noisy[union]))
        clean = union[~noisy[union]]
        out["scores"][name] = {
            "epochs": traj,
            "run_suspects": len(union),
            "run_precision": hit / len(union) if len(union) else None,
            "run_recall": hit / int(noisy.sum()),
            # the clean samples the run suspected, by their true class: which classes feed the high mode
            "clean_by_class": np.bincount(y[clean], minlength=10).tolist(),
        }
    return out


# ------------------------------------------------------------------------------------ the report
CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")


def report(results: dict) -> str:
    runs = results["runs"]
    L = [
        "# The noise rule's parts, measured on recorded losses",
        "",
        "<!-- generated by `python -m studies rule_mechanisms --report` from "
        "`docs/quality-runs/rule-mechanisms/results.json`; do not edit -->",
        "",
        " ".join(__doc__.split("\n\n")[1].split()),
        "",
        " ".join(__doc__.split("\n\n")[2].split()),
        "",
        *[f"* `{k}`: {v}" for k, v in SCORES.items()],
        "",
        " ".join(__doc__.split("\n\n")[4].split()),
        "",
        f"Runs read: {', '.join(r['kind'] + ' seed ' + str(r['seed']) for r in runs)} (ResNet-8, 15 epochs, "
        f"docs/cifar-cpu.md's full-data runs; made by `{results['command']}`).",
        "",
    ]
    for kind in dict.fromkeys(r["kind"] for r in runs):
        rs = [r for r in runs if r["kind"] == kind]
        L += [f"## {kind}: {rs[0]['noisy']:,} of {rs[0]['samples']:,} training labels noisy "
              f"(seeds {', '.join(str(r['seed']) for r in rs)})", "",
              "Over the whole run (every sample any plan suspected; means over the seeds):", "",
              "| score | first active plan (made after epoch) | suspected | precision | recall | clean suspects by "
              "true class (largest first) |", "| --- | --- | --- | --- | --- | --- |"]  # fmt: skip
        for name in SCORES:
            s = [r["scores"][name] for r in rs]
            first = [next((t["epoch"] for t in x["epochs"] if t["active"]), None) for x in s]
            by = np.sum([x["clean_by_class"] for x in s], axis=0) / len(s)
            top = ", ".join(f"{CLASSES[c]} {by[c]:.0f}" for c in np.argsort(-by, kind="stable")[:4] if by[c] > 0)
            L.append(f"| `{name}` | {', '.join('-' if f is None else str(f) for f in first)} | "
                     f"{mean_cell([x['run_suspects'] for x in s], 0)} | {mean_cell([x['run_precision'] for x in s])} | "
                     f"{mean_cell([x['run_recall'] for x in s])} | {top or '-'} |")  # fmt: skip
        L += ["", "Per epoch (the plan made after it), means over the seeds: the score's detection AUC, the "
              "mixture's D and upper weight, and the plan's suspects:", ""]  # fmt: skip
        head = "| epoch | " + " | ".join(f"`{n}`: AUC | D | suspected | precision | recall" for n in SCORES) + " |"
        L += [head, "| --- |" + " --- | --- | --- | --- | --- |" * len(SCORES)]
        for e in range(rs[0]["epochs"]):
            cells = []
            for name in SCORES:
                t = [r["scores"][name]["epochs"][e] for r in rs]
                cells += [mean_cell([x["auc"] for x in t]), mean_cell([x["D"] for x in t], 2),
                          mean_cell([x["suspected"] for x in t], 0), mean_cell([x["precision"] for x in t]),
                          mean_cell([x["recall"] for x in t])]  # fmt: skip
            L.append(f"| {e} | " + " | ".join(cells) + " |")
        L += ["", *own_runs(kind, rs)]
    return "\n".join(L)


def own_runs(kind: str, rs: list[dict]) -> list[str]:
    """A paragraph setting the rule's own runs of ``kind`` (docs/cifar-cpu.md, where its suspects leave the
    training set) beside the ``mean`` score on full data's trajectory, at the last plan; [] without them."""
    cpu = ROOT / "docs" / "quality-runs" / "cifar-cpu" / "results.json"
    runs = json.loads(cpu.read_text())["runs"] if cpu.exists() else {}
    own = [r for r in runs.values() if r["kind"] == kind and r["method"] == "rule" and r.get("status") == "done"]
    if not own:
        return []
    last = [r["rows"][-1] for r in own]
    traj = [r["scores"]["mean"]["epochs"][-1] for r in rs]
    if not any(row.get("noise_active") for r in own for row in r["rows"]):
        return [
            f"The rule's own runs at {kind} (docs/cifar-cpu.md, seeds {', '.join(str(r['seed']) for r in own)}) "
            "never became active: they trained what full data trained.",
            "",
        ]
    return [
        f"The rule's own runs at {kind} (docs/cifar-cpu.md, seeds "
        f"{', '.join(str(r['seed']) for r in own)}; its suspects leave the training set), at their last plan: "
        f"{mean_cell([x['suspected'] for x in last], 0)} suspected at precision "
        f"{mean_cell([x['precision'] for x in last])} "
        f"and recall {mean_cell([x['recall'] for x in last])}, the mixture's upper weight "
        f"{mean_cell([x['noise_components']['weight'][1] for x in last], 2)} and its own threshold "
        f"{mean_cell([x['noise_fit_threshold'] for x in last], 2)} under the floor "
        f"{mean_cell([x['noise_floor'] for x in last], 2)}. On full data's trajectory the same score's last plan: "
        f"{mean_cell([x['suspected'] for x in traj], 0)} suspected at precision "
        f"{mean_cell([x['precision'] for x in traj])} "
        f"and recall {mean_cell([x['recall'] for x in traj])}, its upper weight "
        f"{mean_cell([x['upper_weight'] for x in traj], 2)}. Leaving out changes the trajectory: a clean image left "
        "out is only re-checked at weight 0 from then on and not learnt from, while on full data's trajectory "
        f"it goes on being trained.{way_back(own)}",
        "",
    ]


def way_back(own: list[dict]) -> str:
    """A sentence on how many of the samples the rule's own runs ever suspected were back in
    training at their last plan, clean and noisy apart (``run_suspects``, docs/cifar-cpu.md's
    result file); "" where a run lacks the counts."""
    whole = [r.get("run_suspects") or {} for r in own]
    if not whole or not all("clean_back" in w for w in whole):
        return ""
    # a run that suspected no clean (noisy) sample has no share of them: left out of the mean, "-" as a seed's
    clean = [w["clean_back"] / w["clean_suspected"] if w["clean_suspected"] else None for w in whole]
    noisy = [w["noisy_back"] / w["true_positives"] if w["true_positives"] else None for w in whole]
    seeds = ", ".join("-" if c is None else f"{c:.3f}" for c in clean)
    return (
        f" Of the clean images any of its plans suspected ({mean_cell([w['clean_suspected'] for w in whole], 0)}, "
        f"mean over the seeds), {mean_cell([w['clean_back'] for w in whole], 0)} were back in training at the "
        f"last plan ({mean_cell(clean)} of them; seeds {seeds}); of the noisy ones "
        f"{mean_cell([w['noisy_back'] for w in whole], 0)} of {mean_cell([w['true_positives'] for w in whole], 0)} "
        f"({mean_cell(noisy)})."
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--work", action="append", type=Path, default=[], help="a cifar_gpu work folder (repeatable)")
    p.add_argument("--report", action="store_true", help="write docs/rule-mechanisms.md from the results file")
    a = p.parse_args(argv)
    if a.work:
        runs = []
        for work in a.work:
            for d in sorted(work.glob("run-*-full-s*")):
                m = re.fullmatch(r"run-(\w+)-full-s(\d+)", d.name)
                if m and m.group(1) != "clean":
                    runs.append(study_run(work, m.group(1), int(m.group(2))))
                    print(f"read {d.name}", flush=True)
        command = "python -m studies rule_mechanisms " + " ".join(f"--work {path_label(w)}" for w in a.work)
        RESULTS.parent.mkdir(parents=True, exist_ok=True)
        RESULTS.write_text(json.dumps({"command": command, "runs": runs}, indent=1) + "\n")
    DOC.write_text(report(json.loads(RESULTS.read_text())))
    print(f"wrote {DOC.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
