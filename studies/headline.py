"""README's headline: the noise rule against early-stopped full data and the oracle filter.

One table, generated from the result files of the three baseline studies (issue 33):

* generated image-text pairs with mismatched captions (``studies/baselines_pairs.py``, CPU:
  32-pixel images of one shape each, captions from a few templates; ``tools/make_pair_shards.py``):
  rule + dynamic random (r = 0.19, ``noise=True``), the demo's configuration, and the rule alone;
* CIFAR-10 with 40% symmetric and asymmetric noisy labels, ResNet-18 on a GPU
  (``studies/cifar_gpu.py``): the rule alone;
* SST-2 with 40% noisy labels (``studies/baselines_labels.py``, CPU): the rule alone.

Each row: the samples trained against full data's, and the paired gaps (per seed, mean, 2 SE)
of the method's last epoch against full data early-stopped on a held-out validation split
(full data at its best validation epoch) and against the oracle filter (full data without the
known noisy samples, last epoch), each cell over the seeds both of its runs have (named where
they are fewer than the row's). The verdict against early-stopped full data is
``tools.results.gap_verdict``'s (met, below, mean above/below, not resolved, at the bar, one seed).
A row with a run the instability scan flags (``studies.quality.instability``) is marked and the run named
under the table.

The same rows give docs/results.md's first finding (between ``<!-- noise-verdict:begin -->`` and
``<!-- noise-verdict:end -->``): where the rule ended above or below early-stopped full data, each
sign and verdict computed, and what random pruning on top changed.

    python -m studies headline           # rewrite README.md's block and docs/results.md's finding
    python -m studies headline --check   # exit 1 if either differs
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

from studies import baselines_labels, baselines_pairs, cifar_gpu
from studies.quality import instability
from tools.results import gap_verdict, rule_label

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
BEGIN, END = "<!-- headline:begin -->", "<!-- headline:end -->"
RESULTS_DOC = ROOT / "docs" / "results.md"
VERDICT_BEGIN, VERDICT_END = "<!-- noise-verdict:begin -->", "<!-- noise-verdict:end -->"
CIFAR = ROOT / "docs" / "quality-runs" / "cifar-gpu" / "results.json"
CIFAR_CPU = ROOT / "docs" / "quality-runs" / "cifar-cpu" / "results.json"
PAIRS_V2 = ROOT / "docs" / "quality-runs" / "baselines-pairs-v2"
PAIRS_V2_DOC = ROOT / "docs" / "baselines-v2.md"
SST2_V2 = ROOT / "docs" / "quality-runs" / "baselines-labels-v2"
SST2_V2_DOC = ROOT / "docs" / "baselines-labels-v2.md"
#: The label noise of the GPU CIFAR-10 and SST-2 studies came from a salted CRC32 (dependent pick and
#: offset, cleanlab folds holding the noisy samples together): their rows are shown, marked, and left out of
#: the findings.
CRC32 = "1, salted CRC32 label noise (superseded)"


def pairs_family() -> str:
    """How the tables name the baselines study's pairs: what they are, not what they stand in for."""
    return f"generated shape pairs ({baselines_pairs.DATA['size']}-pixel shape images, template captions)"


def cell(gaps: list[float], seeds: list[int] | None = None, of: list[int] | None = None) -> str:
    """'+0.2 (+1.0, -0.5)': the mean and each seed's gap; ``seeds`` (those of the gaps) are named where
    they differ from ``of`` (the row's)."""
    if not gaps:
        return "-"
    named = f"; seeds {', '.join(map(str, seeds))}" if seeds is not None and of is not None and seeds != of else ""
    return f"{np.mean(gaps):+.1f} ({', '.join(f'{g:+.1f}' for g in gaps)}{named})"


def rows() -> list[dict]:
    """One dict a row: data, model, configuration, trained share, gaps to early-stopped full data (``es``,
    over ``seeds``) and to the oracle (``oracle``, over ``oracle_seeds``), and every run the row reads
    (``runs``: its file under docs/quality-runs/ and its contents, for the instability mark)."""
    out = []
    for ctx in (baselines_pairs.Ctx(), baselines_pairs.Ctx(results=PAIRS_V2, doc=PAIRS_V2_DOC)):
        if ctx.results.exists():
            out += pair_rows(ctx)
    gpu = {"model": "ResNet-18, GPU", "rule": CRC32, "superseded": True, "doc": "docs/cifar-gpu.md"}
    out += [r for kind in ("sym40", "asym40") if (r := cifar_row(CIFAR, kind, "rule", **gpu))]
    if CIFAR_CPU.exists():
        out += cifar_cpu_rows()
    out += sst2_rows(baselines_labels.RESULTS, "docs/baselines-labels.md", rule=CRC32, superseded=True)
    if SST2_V2.exists():
        out += sst2_rows(SST2_V2, SST2_V2_DOC.relative_to(ROOT).as_posix())
    return out


def sst2_rows(results: Path, doc: str, **fields: Any) -> list[dict]:
    """The rule alone's rows of one SST-2 results folder, at each noise rate of study A where it and full
    data ran (``fields``: rule, superseded; the rule's version and draws otherwise from the folder's
    provenance.json)."""
    data = baselines_labels.load_all(results)["runs"]
    fields = {"rule": rule_label(results), **fields}
    sub = results.relative_to(ROOT / "docs" / "quality-runs").as_posix()
    out = []
    for rate in sorted({k[0] for k in data if k[1] == "rule"} & set(baselines_labels.RATES_A)):
        es = baselines_labels.paired(data, rate, "rule", "full-es")
        oracle = baselines_labels.paired(data, rate, "rule", "oracle")
        seeds = [s for s, _ in es]
        if not seeds:
            continue
        share = [data[(rate, "rule", s)]["samples_trained"] / data[(rate, "full", s)]["samples_trained"]
                 for s in seeds if "samples_trained" in data[(rate, "rule", s)]]  # fmt: skip
        fired = any(data[(rate, "rule", s)]["suspects"]["active_epochs"] for s in seeds)
        used = [data[k] for s in seeds for m in ("rule", "full", "oracle") if (k := (rate, m, s)) in data]
        level = f"{round(100 * rate)}% noisy labels"
        out.append({"data": f"SST-2, {level}", "model": "bag of n-grams, CPU", "family": "SST-2", "level": level,
                    "config": "rule alone" + ("" if fired else " (never active)"), "metric": "accuracy",
                    "share": share, "es": [g for _, g in es], "oracle": [g for _, g in oracle],
                    "oracle_seeds": [s for s, _ in oracle], "runs": [(f"{sub}/{r['_file']}", r) for r in used],
                    "seeds": seeds, "doc": doc, **fields})  # fmt: skip
    return out


def pair_rows(ctx: baselines_pairs.Ctx) -> list[dict]:
    """The rows of one pairs results folder: rule + random and the rule alone at each share, where full
    data ran beside them; the rule's version and the draws from the folder's provenance.json."""
    out = []
    pairs = baselines_pairs.read(ctx)
    folder = ctx.results.relative_to(ROOT / "docs" / "quality-runs").as_posix()
    rule = rule_label(ctx.results)
    doc = ctx.doc.relative_to(ROOT).as_posix()

    def pair_runs(keys: list[tuple]) -> list[tuple[str, dict]]:
        files = [pairs[k]["file"] for k in keys if k in pairs]
        return [(f"{folder}/{f}", json.loads((ctx.results / f).read_text())) for f in files]

    for noise in sorted({k[0] for k in pairs}):
        for method, config in (("rule-random", "rule + random (r=0.19)"), ("rule", "rule alone")):
            seeds = sorted(s for (n, m, s) in pairs if n == noise and m == method and (n, "full", s) in pairs)
            oseeds = [s for s in seeds if (noise, "oracle", s) in pairs]
            out.append({
                "data": f"{pairs_family()}, {round(100 * noise)}% mismatched captions", "model": "small CLIP, CPU",
                "family": pairs_family(), "level": f"{round(100 * noise)}% mismatched captions", "rule": rule,
                "config": config, "metric": "R@1", "seeds": seeds, "doc": doc,
                "share": [pairs[(noise, method, s)]["pairs"] / pairs[(noise, "full", s)]["pairs"] for s in seeds],
                "es": [pairs[(noise, method, s)]["final"] - pairs[(noise, "full", s)]["es"] for s in seeds],
                "oracle": [pairs[(noise, method, s)]["final"] - pairs[(noise, "oracle", s)]["final"] for s in oseeds],
                "oracle_seeds": oseeds,
                "runs": pair_runs([(noise, m, s) for s in seeds for m in (method, "full", "oracle")]),
            })  # fmt: skip
    return out


def last(run: dict) -> float:
    """A CIFAR-10 run's test accuracy at its last epoch."""
    return run["rows"][-1]["test_acc"]


@functools.cache
def finished_runs(results: Path) -> dict[str, dict]:
    """The finished runs of a CIFAR-10 results file, read once a process (each of its rows reads them)."""
    return {k: r for k, r in json.loads(results.read_text())["runs"].items() if r.get("status") == "done"}


def cifar_row(results: Path, kind: str, method: str, **fields: Any) -> dict | None:
    """The row of a CIFAR-10 study's ``method`` at ``kind`` (``fields``: model, rule, doc, ...), over
    the seeds where it and full data both finished (the oracle where it finished too); None if none."""
    runs = finished_runs(results)
    where = results.relative_to(ROOT / "docs" / "quality-runs").as_posix()
    seeds = sorted(r["seed"] for r in runs.values() if r["kind"] == kind and r["method"] == method
                   and f"{kind}-full-s{r['seed']}" in runs)  # fmt: skip
    if not seeds:
        return None
    got = {s: runs[f"{kind}-{method}-s{s}"] for s in seeds}
    full = {s: runs[f"{kind}-full-s{s}"] for s in seeds}
    oracle = {s: runs[f"{kind}-oracle-s{s}"] for s in seeds if f"{kind}-oracle-s{s}" in runs}
    fired = any(row.get("noise_test") == "two_modes" for r in got.values() for row in r["rows"])
    level = cifar_gpu.KIND_TEXT[kind].split(" (")[0]
    return {"data": f"CIFAR-10, {level}", "family": "CIFAR-10", "level": level,
            "config": "rule alone" + ("" if fired else " (never active)"), "metric": "accuracy",
            "share": [got[s]["trained"] / full[s]["trained"] for s in seeds],
            "es": [100 * (last(got[s]) - cifar_gpu.early_stopped(full[s])["test_acc"]) for s in seeds],
            "oracle": [100 * (last(got[s]) - last(oracle[s])) for s in oracle], "oracle_seeds": list(oracle),
            "runs": [(f"{where}#{r['id']}", r) for s in seeds for r in (got[s], full[s], oracle.get(s)) if r],
            "seeds": seeds, **fields}  # fmt: skip


def cifar_cpu_rows() -> list[dict]:
    """The CPU CIFAR-10 study's rows (ResNet-8, the keyed-hash label noise): the rule of version 2 and of
    version 1, each over the seeds where it and full data finished."""
    cpu = {"model": "ResNet-8, CPU", "doc": "docs/cifar-cpu.md"}
    rows = (cifar_row(CIFAR_CPU, kind, method, rule=rule, **cpu) for kind in ("sym20", "sym40", "asym40")
            for method, rule in (("rule", "2, keyed hash"), ("rule1", "1, keyed hash")))  # fmt: skip
    return [r for r in rows if r]


def unstable_runs(r: dict) -> list[tuple[str, dict]]:
    """The runs of a row that the instability scan flags: (file under docs/quality-runs/, contents)."""
    return [(f, d) for f, d in r["runs"] if instability.unstable(d, f.rsplit("/", 1)[-1].split("#")[0])]


def block() -> str:
    lines = [
        "Generated by `python -m studies headline` from the baseline studies' result files. Each row: the"
        " method's last epoch minus full data at its best epoch on a held-out validation split (early stopping;"
        " a training shard, as noisy as the rest, never the test split), and minus the oracle filter (full data"
        " without the known noisy samples); points of the metric, the mean over seeds paired by seed, each seed's"
        " in brackets (its seeds named where fewer than the row's); *verdict*: met where mean - 2 SE > 0, below"
        " where mean + 2 SE < 0, else mean above (below), not resolved.",
        "",
        "*Rule, draws*: the noise rule's version (docs/policies.md#versions-noise_rule) and where the noise came"
        " from; rows on the salted CRC32 label noise (its pick and offsets dependent, cleanlab's folds holding the"
        " noisy samples together) are superseded and left out of the findings.",
        "",
        "| data | model | configuration | rule, draws | samples trained / full data's | minus early-stopped full data"
        " | 2 SE | verdict | minus the oracle filter | seeds | details |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    marked: list[tuple[str, dict]] = []
    for r in rows():
        if not r["es"]:  # no run of full data beside it yet: no comparison to show
            continue
        _, se2, verdict = gap_verdict(r["es"])
        se2 = "-" if se2 is None else f"{se2:.1f}"
        share = f"{np.mean(r['share']):.2f}" if r["share"] else "-"
        link = f"[{Path(r['doc']).name}]({r['doc']})"
        bad = unstable_runs(r)
        marked += bad
        config = r["config"] + (f" {instability.MARK}" if bad else "")
        oracle = cell(r["oracle"], r["oracle_seeds"], r["seeds"])
        cells = [r["data"], r["model"], config, r.get("rule", "-"), share, f"{cell(r['es'])} {r['metric']}", se2,
                 verdict, oracle, ", ".join(map(str, r["seeds"])), link]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    if marked:
        lines += ["", instability.footnote(marked)]
    return "\n".join(lines) + "\n"


def _kind(verdict: str) -> str:
    """'above', 'below' or 'open' (not resolved, at the bar, one seed) of a gap_verdict verdict."""
    return {"met": "above", "below": "below"}.get(verdict, "open")


def _gap(r: dict) -> str:
    """'-7.4 accuracy points (below; 0.63 of the samples trained)': a row's mean gap, verdict and share."""
    m, _, verdict = gap_verdict(r["es"])
    share = f"; {np.mean(r['share']):.2f} of the samples trained" if r["share"] else ""
    version = f"; rule version {r['rule'].split(',')[0]}" if r.get("rule") else ""
    return f"{m:+.1f} {r['metric']} points ({verdict}{share}{version})"


def _names(xs: list[dict]) -> str:
    """The rows ``xs`` by data set: 'CIFAR-10, ResNet-18, GPU, with 40% symmetric noisy labels: -7.4 ...'."""
    out: dict[tuple[str, str], list[str]] = {}
    for x in xs:
        out.setdefault((x["family"], x["model"]), []).append(f"{x['level']}: {_gap(x)}")
    return "; ".join(f"{family}, {model}, with {', '.join(parts)}" for (family, model), parts in out.items())


def verdict_block() -> str:
    """docs/results.md's first finding, every sign and verdict computed from :func:`rows`."""
    rs = [r for r in rows() if r["es"] and not r.get("superseded")]
    alone = [r for r in rs if r["config"].startswith("rule alone")]
    groups: dict[str, list[dict]] = {"above": [], "below": [], "open": []}
    for r in alone:
        groups[_kind(gap_verdict(r["es"])[2])].append(r)
    off = [r for r in alone if "never active" in r["config"]]

    L = ["* **Where some samples are wrong** (a caption of another image, a wrong label), leaving out the samples "
         "whose loss stays in a separate high mode (`noise=True`, [policies.md](policies.md#leaving-noisy-samples-"
         "out-noisetrue)), the rule alone, against full data early-stopped on a held-out split (README's table, "
         "generated by `studies/headline.py` from the baseline studies; mean over seeds, verdict by 2 "
         "SE):"]  # fmt: skip
    if groups["above"]:
        L.append(f"  ended **above** it on {_names(groups['above'])}.")
    if groups["below"]:
        L.append(f"  It ended **below** it on {_names(groups['below'])}.")
    if groups["open"]:
        L.append(f"  Its gap is not resolved on {_names(groups['open'])}.")
    if off:
        L.append("  Where the wrong samples formed no second loss mode (" + "; ".join(x["data"] for x in off)
                 + ") the rule never became active and pruned nothing: it trained what full data trained, and its "
                 "gap is full data's last epoch against its early-stopped one.")  # fmt: skip
    both = []
    for r in rs:
        if not r["config"].startswith("rule + random"):
            continue
        a = next(
            (x for x in alone if (x["data"], x["model"], x.get("rule")) == (r["data"], r["model"], r.get("rule"))), None
        )  # the rule alone of the same version and draws
        if a is not None and a["share"] and r["share"]:
            both.append((r, a))
    if both:
        parts = []
        for r, a in both:
            (mr, _, vr), (ma, _, va) = gap_verdict(r["es"]), gap_verdict(a["es"])
            kept = "kept all of" if mr >= ma else "kept part of" if mr > 0 else "lost"
            version = r["rule"].split(",")[0]
            parts.append(f"{r['level']} (rule version {version}): {mr:+.1f} ({vr}) at {np.mean(r['share']):.2f} "
                         f"of the samples trained, against the rule alone's {ma:+.1f} ({va}) at "
                         f"{np.mean(a['share']):.2f}, so it {kept} the rule's gain")  # fmt: skip
        where = " and ".join(dict.fromkeys(f"{r['family']}, {r['model']}" for r, _ in both))
        L.append(f"  Random pruning on top (r=0.19), on the {where}: " + "; ".join(parts) + ".")
    gone = sorted({f"{r['family']}, {r['model']}" for r in rows() if r.get("superseded")})
    if gone:
        L.append(f"  The rows on the salted CRC32 label noise ({'; '.join(gone)}) are superseded and not part of "
                 "this finding (README's table shows them, marked).")  # fmt: skip
    L.append("  README's table shows each row with its seeds; the targets below give the noise study's rows.")
    return "\n".join(L) + "\n"


def splice(text: str, body: str, begin: str = BEGIN, end: str = END) -> str:
    i, j = text.index(begin) + len(begin), text.index(end)
    return text[:i] + "\n" + body + text[j:]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--check", action="store_true", help="exit 1 if a block differs from the result files")
    args = p.parse_args()
    stale = []
    for path, body, begin, end in ((README, block(), BEGIN, END),
                                   (RESULTS_DOC, verdict_block(), VERDICT_BEGIN, VERDICT_END)):  # fmt: skip
        text = path.read_text()
        new = splice(text, body, begin, end)
        if new == text:
            continue
        stale.append(path.relative_to(ROOT).as_posix())
        if not args.check:
            path.write_text(new)
    if args.check and stale:
        print(f"{', '.join(stale)}: a generated block differs from the result files: run python -m studies headline")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
