"""README's headline: the noise rule against early-stopped full data and the oracle filter.

One table, generated from the result files of the three baseline studies (issue 33):

* image-text pairs with mismatched captions (``benchmarks/baselines_pairs.py``, CPU): rule +
  dynamic random (r = 0.19, ``noise=True``), the demo's configuration, and the rule alone;
* CIFAR-10 with 40% symmetric and asymmetric noisy labels, ResNet-18 on a GPU
  (``benchmarks/cifar_gpu.py``): the rule alone;
* SST-2 with 40% noisy labels (``benchmarks/baselines_labels.py``, CPU): the rule alone.

Each row: the samples trained against full data's, and the paired gaps (per seed, mean, 2 SE)
of the method's last epoch against full data early-stopped on a held-out validation split
(full data at its best validation epoch) and against the oracle filter (full data without the
known noisy samples, last epoch). The verdict against early-stopped full data is
``benchmarks.common.gap_verdict``'s (met, below, mean above/below, not resolved, at the bar, one seed).

    python benchmarks/headline.py           # rewrite README.md's block
    python benchmarks/headline.py --check   # exit 1 if the block differs
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks import baselines_labels, baselines_pairs, cifar_gpu  # noqa: E402
from benchmarks.common import gap_verdict  # noqa: E402

README = ROOT / "README.md"
BEGIN, END = "<!-- headline:begin -->", "<!-- headline:end -->"
CIFAR = ROOT / "docs" / "quality-runs" / "cifar-gpu" / "results.json"


def cell(gaps: list[float]) -> str:
    if not gaps:
        return "-"
    return f"{np.mean(gaps):+.1f} ({', '.join(f'{g:+.1f}' for g in gaps)})"


def rows() -> list[dict]:
    """One dict a row: data, model, configuration, trained share, gaps to early-stopped full data and the oracle."""
    out = []
    pairs = baselines_pairs.read(baselines_pairs.Ctx())
    for noise in sorted({k[0] for k in pairs}):
        for method, config in (("rule-random", "rule + random (r=0.19)"), ("rule", "rule alone")):
            seeds = sorted(s for (n, m, s) in pairs if n == noise and m == method and (n, "full", s) in pairs)
            out.append({
                "data": f"web pairs, {round(100 * noise)}% mismatched captions", "model": "small CLIP, CPU",
                "config": config, "metric": "R@1", "seeds": seeds, "doc": "docs/baselines.md",
                "share": [pairs[(noise, method, s)]["pairs"] / pairs[(noise, "full", s)]["pairs"] for s in seeds],
                "es": [pairs[(noise, method, s)]["final"] - pairs[(noise, "full", s)]["es"] for s in seeds],
                "oracle": [pairs[(noise, method, s)]["final"] - pairs[(noise, "oracle", s)]["final"] for s in seeds
                           if (noise, "oracle", s) in pairs],
            })  # fmt: skip
    runs = json.loads(CIFAR.read_text())["runs"]
    for kind, text in (("sym40", "40% symmetric"), ("asym40", "40% asymmetric")):
        seeds = sorted(r["seed"] for r in runs.values() if r["kind"] == kind and r["method"] == "rule")
        rule = {s: runs[f"{kind}-rule-s{s}"] for s in seeds}
        full = {s: runs[f"{kind}-full-s{s}"] for s in seeds}
        oracle = {s: runs[f"{kind}-oracle-s{s}"] for s in seeds}
        fired = any(row.get("noise_test") == "two_modes" for r in rule.values() for row in r["rows"])
        out.append({"data": f"CIFAR-10, {text} noisy labels", "model": "ResNet-18, GPU",
                    "config": "rule alone" + ("" if fired else " (never active)"),
                    "metric": "accuracy",
                    "share": [rule[s]["trained"] / full[s]["trained"] for s in seeds],
                    "es": [100 * (rule[s]["rows"][-1]["test_acc"] - cifar_gpu.early_stopped(full[s])["test_acc"])
                           for s in seeds],
                    "oracle": [100 * (rule[s]["rows"][-1]["test_acc"] - oracle[s]["rows"][-1]["test_acc"])
                               for s in seeds],
                    "seeds": seeds, "doc": "docs/cifar-gpu.md"})  # fmt: skip
    data = baselines_labels.load_all(baselines_labels.RESULTS)["runs"]
    if data:
        rate = 0.4
        es = baselines_labels.paired(data, rate, "rule", "full-es")
        oracle = baselines_labels.paired(data, rate, "rule", "oracle")
        seeds = [s for s, _ in es]
        share = [data[(rate, "rule", s)]["samples_trained"] / data[(rate, "full", s)]["samples_trained"]
                 for s in seeds if "samples_trained" in data[(rate, "rule", s)]]  # fmt: skip
        fired = any(data[(rate, "rule", s)]["suspects"]["active_epochs"] for s in seeds)
        out.append({"data": "SST-2, 40% noisy labels", "model": "bag of n-grams, CPU",
                    "config": "rule alone" + ("" if fired else " (never active)"),
                    "metric": "accuracy", "share": share, "es": [g for _, g in es], "oracle": [g for _, g in oracle],
                    "seeds": seeds, "doc": "docs/baselines-labels.md"})  # fmt: skip
    return out


def block() -> str:
    lines = [
        "Generated by `python benchmarks/headline.py` from the baseline studies' result files. Each row: the"
        " method's last epoch minus full data at its best epoch on a held-out validation split (early stopping;"
        " the split is taken from the training shards and is as noisy as they are, never the test split), and"
        " minus the oracle filter (full data"
        " without the known noisy samples: what a perfect detector reaches); points of the metric, the mean"
        " over seeds paired by seed, each seed's in brackets; *verdict*: met where mean - 2 SE > 0, below where"
        " mean + 2 SE < 0, else mean above (below), not resolved.",
        "",
        "| data | model | configuration | samples trained / full data's | minus early-stopped full data | 2 SE"
        " | verdict | minus the oracle filter | seeds | details |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows():
        if not r["es"]:  # no run of full data beside it yet: no comparison to show
            continue
        _, se2, verdict = gap_verdict(r["es"])
        se2 = "-" if se2 is None else f"{se2:.1f}"
        share = f"{np.mean(r['share']):.2f}" if r["share"] else "-"
        link = f"[{Path(r['doc']).name}]({r['doc']})"
        cells = [r["data"], r["model"], r["config"], share, f"{cell(r['es'])} {r['metric']}", se2, verdict,
                 cell(r["oracle"]), ", ".join(map(str, r["seeds"])), link]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def splice(text: str, body: str) -> str:
    i, j = text.index(BEGIN) + len(BEGIN), text.index(END)
    return text[:i] + "\n" + body + text[j:]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--check", action="store_true", help="exit 1 if README's block differs from the result files")
    args = p.parse_args()
    text = README.read_text()
    new = splice(text, block())
    if args.check:
        if new != text:
            print("README.md's headline block differs from the result files: run python benchmarks/headline.py")
            return 1
        return 0
    README.write_text(new)
    return 0


if __name__ == "__main__":
    sys.exit(main())
