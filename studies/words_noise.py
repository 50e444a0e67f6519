"""Does the noise rule find a few percent of wrong labels in the word-image demo's data (issue 33)?

The word-image demo (``bash tools/demo.sh words``: ``tools.make_word_shards``, 24,000 rendered word images
of 50 classes, a small CNN, 6 epochs, ``studies.engines.words``) generates its training labels with a share
of random ones (``--label-noise``, 3% by default). Here the demo's own training (same data sizes, schedule,
batch size, one loader worker, one torch thread) runs with full data and with the rule alone (``full``,
``noise=True``) at 3%, 10% and 20% wrong labels, 2 seeds each, settings fixed before the runs (the demo's and
the rule's defaults). Each run's file holds every epoch's row and, per plan, the rule's test (Ashman's D, the
upper component's weight, active or not) and what it left out: the suspected samples' precision and recall
against the generator's wrong labels (a sample whose shown class is not the word it renders; a random label
that happens to be the right one is not wrong).

The question is detection (does the rule fire, and on whom), so accuracy is read as the last epoch's test
accuracy against full data's of the same seed; no validation split is held out (where the rule never fires the
two runs train the same samples in the same order).

Runs go through the studies' one runner (``studies/quality/harness.py``: resume by result file, whole-file
writes with the machine, ``.crashed`` files); result files ``docs/quality-runs/words-noise/<id>.json``;
``--report-only`` writes docs/words-noise.md from them alone.

    python -m studies words_noise                  # the runs whose result file is missing, then the page
                                                      # (start it twice to train two runs at a time)
    python -m studies words_noise --report-only    # docs/words-noise.md from the result files
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

from studies.quality import harness
from studies.quality.harness import Job
from studies.quality.layout import child_env, python_m
from tools import draws
from tools.results import gap_verdict

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "docs" / "quality-runs" / "words-noise"
OUT = ROOT / "bench-out" / "words-noise"
DOC = ROOT / "docs" / "words-noise.md"
DATA = dict(train=24000, test=2400, seed=0)  # the demo's set (tools/demo.sh words)
TRAIN = dict(epochs=6, batch_size=64, lr=2e-3, workers=1)  # the demo's schedule
#: (wrong-label share, seed) in queue order: both low shares of seed 0 first
ROUNDS = ((0.03, 0), (0.1, 0), (0.03, 1), (0.1, 1), (0.2, 0), (0.2, 1))
METHODS = {"full": ("full", {}), "rule": ("full", {"noise": True})}
PRIOR_RATE = {"words": 1.5e-3, "cal": 60.0}


def pct(x: float) -> int:
    return round(100 * x)


def run_id(share: float, method: str, seed: int) -> str:
    return f"words-n{pct(share)}-{method}-s{seed}"


def plan(ctx: harness.Ctx) -> list[Job]:
    """Every run, full data before the rule within a (share, seed)."""
    rounds, data, train = ctx.data["rounds"], ctx.data["set"], ctx.data["train"]
    return [
        Job(run_id(share, m, s), "words", {"share": share, "method": m, "seed": s}, (), data["train"] * train["epochs"])
        for share, s in rounds
        for m in METHODS
    ]


def data_dir(ctx: harness.Ctx, share: float) -> Path:
    """The generated set at ``share`` wrong labels (made once, under a lock: several processes may share the
    plan, each a ``python -m studies words_noise`` of the same folders)."""
    d, D = ctx.out / f"data-n{pct(share)}", ctx.data["set"]
    with harness.claim(ctx.claims / f"data-n{pct(share)}.lock", wait=True):
        _generate(d, share, D)
    return d


def _generate(d: Path, share: float, D: dict) -> None:
    if not draws.made_with_these_draws(d / "info.json"):
        shutil.rmtree(d, ignore_errors=True)  # none yet, or made with an older tool's draws: made again
        args = ["--out", d, "--train", D["train"], "--test", D["test"], "--seed", D["seed"], "--label-noise", share]
        args += ["--workers", 1]
        subprocess.run(
            python_m("tools.make_word_shards", *args), check=True, stdout=subprocess.DEVNULL, env=child_env()
        )


def wrong_labels(data: Path) -> set[tuple[str, str]]:
    """(shard, key) of the training samples whose shown class is not the word they render (the key ends in
    ``_<word>``, the generator's true label; ``.cls`` is the class shown)."""
    vocab = json.loads((data / "info.json").read_text())["vocab"]
    out = set()
    for shard in sorted(data.glob("stmj-train-*.tar")):
        with tarfile.open(shard) as tar:
            for m in tar:
                if m.name.endswith(".cls"):
                    key = m.name[: -len(".cls")]
                    shown = int(tar.extractfile(m).read())  # type: ignore[union-attr]
                    if vocab[shown] != key.rsplit("_", 1)[1]:
                        out.add((shard.name, key))
    return out


def plan_readings(run_dir: Path, epochs: int, wrong: set[tuple[str, str]]) -> list[dict]:
    """Per planned epoch: the rule's test and what it left out (suspected or kept to re-check), with precision
    and recall against ``wrong``: the noise study's reading of a plan (``quality.noise.plan_noise``), in the
    fields this study's result files keep."""
    from studies.quality.noise import plan_noise

    return [
        {
            "epoch": r["epoch"],
            "test": r["noise_test"],
            "active": bool(r["noise_active"]),
            "separation": r["noise_separation"],
            "upper_weight": r["noise_upper_weight"],
            "suspected": r["suspected"],
            "precision": r["precision"],
            "recall": r["recall"],
        }
        for r in plan_noise(str(run_dir), epochs, wrong)
    ]


def run(ctx: harness.Ctx, job: Job, progress: list[str]) -> dict:
    """Train one run with the demo's training (``studies.engines.words.run``) and read its plans."""
    from studies.engines import words as tw

    share, method, seed = job.spec["share"], job.spec["method"], job.spec["seed"]
    data = data_dir(ctx, share)
    wrong = wrong_labels(data)
    policy, params = METHODS[method]
    T = ctx.data["train"]
    args = argparse.Namespace(data=str(data), seed=seed, quiet=True, **T)
    run_dir = ctx.runs / job.rid
    res = tw.run(args, policy, dict(params), str(run_dir), log=lambda line: progress.append(line.strip()))
    res.pop("delivered", None)
    res.pop("run_dir", None)
    result = {
        "study": "words-noise",
        "dataset": "words",
        "id": job.rid,
        "method": method,
        "share": share,
        "wrong_labels": len(wrong),
        **res,
        "plans": plan_readings(run_dir, T["epochs"], wrong) if params.get("noise") else [],
        "data": {**ctx.data["set"], "label_noise": share},
        "train": dict(T),
        "status": "ok",
    }
    shutil.rmtree(run_dir, ignore_errors=True)
    return result


def context(results: Path = RESULTS, out: Path = OUT, rounds: tuple = ROUNDS, data: dict | None = None,
            train: dict | None = None) -> harness.Ctx:  # fmt: skip
    ctx = harness.Ctx(results=results, out=out, args=argparse.Namespace(threads=1))
    ctx.data = {"rounds": rounds, "set": dict(data or DATA), "train": dict(train or TRAIN)}
    return ctx


# ------------------------------------------------------------------------------------ the report
def read(folder: Path) -> dict[tuple[float, str, int], dict]:
    out = {}
    for p in sorted(folder.glob("words-*.json")):
        if p.name.endswith((".crashed.json", ".cut.json")):
            continue
        d = json.loads(p.read_text())
        out[(d["share"], d["method"], d["seed"])] = {**d, "file": p.name, "final": 100 * d["rows"][-1]["acc"]}
    return out


def _f(x: float | None, d: int = 3) -> str:
    return "n/a" if x is None else f"{x:.{d}f}"


def report(ctx: harness.Ctx) -> str:
    """docs/words-noise.md, every number from the result files of ``ctx.results``."""
    runs = read(ctx.results)
    rel = ctx.results.relative_to(ROOT).as_posix() if ctx.results.is_relative_to(ROOT) else ctx.results.name
    D, T = ctx.data["set"], ctx.data["train"]
    shares = sorted({s for s, _ in ctx.data["rounds"]})
    machines = sorted({f"{v['machine']['cpu']}, {v['machine']['cores']} cores, torch {v['machine']['torch']}"
                       for v in runs.values() if "machine" in v})  # fmt: skip
    missing = [j.rid for j in plan(ctx) if not (ctx.results / f"{j.rid}.json").exists()]
    L = [
        "# Does the noise rule find wrong labels in the word-image demo's data?",
        "",
        f"<!-- generated by `python -m studies words_noise --report-only` from the result files in `{rel}/`; "
        "do not edit by hand -->",
        "",
        f"The word-image demo (`bash tools/demo.sh words`) trains a small CNN on {D['train']:,} rendered word images "
        "whose labels carry a share of random ones (`tools/make_word_shards.py --label-noise`, 3% by default). "
        "Here its own training (E = {epochs}, batch {bs}, AdamW lr {lr}, {w} loader worker, one torch thread, "
        "every step over the nominal batch) runs with full data and with the rule alone (`full`, `noise=True`, "
        "its defaults) at {shares} wrong labels, paired by seed, on one machine ({mach}). Settings are the demo's "
        "and the rule's defaults, fixed before the runs. Per plan: the rule's test (Ashman's D of the two-component "
        "mixture of the loss means; the rule is active from D >= 2, docs/algorithms.md §12.3; n/a: no sample has "
        "the records the warm-up asks for yet), the weight of its "
        "upper component, and what it left out (suspected or kept to re-check) against the generator's wrong "
        "labels (a shown class that is not the rendered word). Accuracy: the last epoch's test accuracy (%), the "
        "rule minus full data of the same seed (no validation split: detection is the question here, and where "
        "the rule never fires both runs train the same samples in the same order).".format(
            epochs=T["epochs"],
            bs=T["batch_size"],
            lr=T["lr"],
            w=T["workers"],
            shares=", ".join(f"{pct(s)}%" for s in shares),
            mach="; ".join(machines) or "none yet",
        ),  # fmt: skip
        "",
        "| wrong labels | seed | wrong labels in the data | plans with the rule active | D per plan | upper weight, "
        "last plan | left out, last plan | precision | recall | rule, test % | full data, test % | rule minus full |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    summary = []
    for share in shares:
        gaps, active, plans = [], 0, 0
        for seed in sorted({s for (sh, m, s) in runs if sh == share and m == "rule"}):
            rule, full = runs[(share, "rule", seed)], runs.get((share, "full", seed))
            p = rule["plans"]
            on = [x["epoch"] for x in p if x["active"]]
            active, plans = active + len(on), plans + len(p)
            ds = ", ".join(_f(x["separation"], 2) for x in p)
            last = p[-1] if p else {}
            gap = None if full is None else rule["final"] - full["final"]
            if gap is not None:
                gaps.append(gap)
            epochs = " (epochs " + ", ".join(map(str, on)) + ")" if on else ""
            full_acc = "n/a" if full is None else f"{full['final']:.1f}"
            gap_text = "n/a" if gap is None else f"{gap:+.1f}"
            L.append(
                f"| {pct(share)}% | {seed} | {rule['wrong_labels']:,} | {len(on)} of {len(p)}{epochs} | {ds} | "
                f"{_f(last.get('upper_weight'))} | {last.get('suspected', 0):,} | {_f(last.get('precision'))} | "
                f"{_f(last.get('recall'))} | {rule['final']:.1f} | {full_acc} | {gap_text} |"
            )
        if gaps:
            mean, se2, v = gap_verdict(gaps)
            se = "" if se2 is None else f", 2 SE {se2:.1f}"
            seeds = f"{len(gaps)} seed{'s' if len(gaps) != 1 else ''}"
            summary.append(
                f"* {pct(share)}% wrong labels ({seeds}): the rule active in {active} of {plans} plans; "
                f"rule minus full data {mean:+.1f}{se} points: {v}."
            )
    L += ["", "In short:", "", *(summary or ["* no finished pair of runs yet."]), ""]
    L += ["## Runs failed or not run", ""]
    unfinished = harness.unfinished(ctx.results)  # the runner's .crashed/.cut files without a result
    L.append("* Crashed or cut short: " + ("; ".join(unfinished) if unfinished else "none") + ".")
    L.append("* Not run (cut or not reached): " + (", ".join(f"`{r}`" for r in missing) if missing else "none") + ".")
    L += ["", "## Reproduce", "", "```",
          "python -m studies words_noise                 # the runs whose result file is missing, then this page",
          "python -m studies words_noise --report-only   # this page from the result files", "```"]  # fmt: skip
    return "\n".join(L) + "\n"


def write_report(ctx: harness.Ctx, doc: Path = DOC) -> str:
    text = report(ctx)
    doc.write_text(text)
    return text


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--report-only", action="store_true", help="write docs/words-noise.md from the result files")
    p.add_argument("--deadline", type=float, help="seconds from now: start no run that would not end by then")
    a = p.parse_args(argv)
    ctx = context()
    if not a.report_only:
        if a.deadline:
            ctx.until = ctx.started + a.deadline
        harness.worker(ctx, sys.modules[__name__])
    write_report(ctx)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
