"""Generate docs/benchmarks.md's result blocks from the result files in docs/benchmarks/.

A block is the text between ``<!-- result:NAME:begin -->`` and ``<!-- result:NAME:end -->``
(each on a line of its own); this script replaces it with the rendering of
``docs/benchmarks/NAME.json`` (written by a benchmark script through ``common.Result``): a line
naming the command, the commit, the machine and its load, the table of the result's ``rows``,
the baseline measured in the same run, the peak RSS and the result's generated notes. Text
outside the blocks (prose, other helpers' sections such as ``<!-- balance:begin -->``) is left
as it is. A block whose result file is missing is an error (a table with no source).

The block between ``<!-- targets:begin -->`` and ``<!-- targets:end -->`` is the table of the
targets (:data:`TARGETS`): each row's figure taken from its result file, and whether the
figure clears the bar ("met"), or "no result" where the file is missing.

    python -m benchmarks report            # rewrite the blocks of docs/benchmarks.md
    python -m benchmarks report --check    # exit 1 if a block differs from its result file
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "benchmarks.md"
RESULTS = ROOT / "docs" / "benchmarks"

BLOCK = re.compile(
    r"^<!-- result:(?P<name>[A-Za-z0-9_.-]+):begin -->\n(?P<body>.*?)^<!-- result:(?P=name):end -->$",
    re.M | re.S,
)


TARGETS_BLOCK = re.compile(r"^<!-- targets:begin -->\n.*?^<!-- targets:end -->$", re.M | re.S)


def _row(res: dict, **match) -> dict:
    """The row of ``res['rows']`` whose fields equal ``match``."""
    found = [r for r in res.get("rows") or [] if all(r.get(k) == v for k, v in match.items())]
    if not found:
        raise KeyError(f"no row {match} in {res.get('name')}")
    return found[0]


def _n_max(res: dict) -> int:
    return max(r["n"] for r in res["rows"])


#: (target, issue, result file, figure of the result, bar, unit[, ">="]): "met" when figure <= bar
#: (with ">=": figure >= bar).
TARGETS: list[tuple] = [
    ("plan one SeTa epoch at 15M: median time of the whole plan (plan_epoch, Pruner.start_epoch)", "35",
     "plan-15000000", lambda r: r["figures"]["seta_median_s"], 1.2, "s"),
    ("plan one SeTa epoch at 15M: the whole plan's median against the floor measured beside it", "49",
     "plan-15000000", lambda r: r["figures"]["seta_median_s"] / r["figures"]["floor_median_s"], 1.6, "x"),
    ("plan one SeTa epoch at 15M: peak RSS", "35", "plan-15000000",
     lambda r: r["figures"]["seta_peak_rss_mb"], 1000, "MB"),
    ("SeTa with noise=True at 15M: time of the whole plan against SeTa's", "35", "plan-15000000",
     lambda r: r["figures"]["noise_time_ratio"], 1.25, "x"),
    ("SeTa with noise=True at 15M: peak RSS against SeTa", "35", "plan-15000000",
     lambda r: r["figures"]["noise_rss_ratio"], 1.25, "x"),
    ("SeTa with noise=True at 200M: peak RSS", "35", "scale-plan-15000000-200000000",
     lambda r: _row(r, n=_n_max(r), step="plan_seta_noise")["peak_rss_mb"], 3000, "MB"),
    ("SeTa with noise=True at 200M: time per sample against 15M, the sizes paired round by round, mean + 2 SE "
     "(flat: <= 1.3x)", "35", "scale-plan-15000000-200000000",
     lambda r: _paired_upper(_row(r, n=_n_max(r), step="plan_seta_noise")), 1.3, "x"),
    ("compact 15M records into a 15M table: time", "2", "compact-15000000",
     lambda r: r["figures"]["compact_s"], 15, "s"),
    ("compact 15M records into a 15M table: peak RSS", "2", "compact-15000000", lambda r: r["peak_rss_mb"], 4000, "MB"),
    ("recording: overhead per sample", "2", "record", lambda r: r["figures"]["overhead_us_per_sample"], 1.0, "us"),
    ("each policy's planning function at 15M: slowest", "3", "policies-15000000",
     lambda r: max(x["wall_s"] for x in r["rows"]), 3.0, "s"),
    ("ES helper per meta-batch of 512", "3", "policies-15000000", lambda r: r["figures"]["es_select_us"], 50, "us"),
    ("keep_filter after webdataset's reader, everything kept, no decode: CPU overhead, mean + 2 SE", "35", "stage",
     lambda r: 100 * _upper(r["figures"]["CPU overhead: keep_filter after webdataset's reader"]), 3, "%"),
    ("keep_filter after OpenCLIP's reader, everything kept, no decode: CPU overhead, mean + 2 SE", "35", "stage",
     lambda r: 100 * _upper(r["figures"]["CPU overhead: keep_filter after OpenCLIP's reader"]), 3, "%"),
    ("read_kept at 50% kept, no decode, CIFAR-10: over streaming + keep_filter, mean - 2 SE", "35", "reader",
     lambda r: _lower(r["figures"]["CIFAR-10: read_kept / streaming + keep_filter (wall)"]), 6, "x", ">="),
    ("read_kept at 50% kept, no decode, CIFAR-10: over kept_tar_samples, mean - 2 SE", "35", "reader",
     lambda r: _lower(r["figures"]["CIFAR-10: read_kept / kept_tar_samples (wall)"]), 1.5, "x", ">="),
    ("read_kept at 50% kept, no decode, ST+MJ-sized: over streaming + keep_filter, mean - 2 SE", "35", "reader",
     lambda r: _lower(r["figures"]["ST+MJ-sized: read_kept / streaming + keep_filter (wall)"]), 6, "x", ">="),
    ("the stage on an object store at 15M (SeTa plan): plan bytes fetched by a worker reading 10 shards", "15",
     "stage-remote-15000000", lambda r: _row(r, worker="stage")["plan bytes fetched"] / 1e6, 1.0, "MB"),
    ("the stage on an object store at 15M (SeTa plan): peak RSS against the worker without it", "15",
     "stage-remote-15000000", lambda r: _row(r, worker="stage")["peak RSS vs no stage MB"], 50, "MB"),
    ("read_kept at 50% kept, no decode, ST+MJ-sized: over kept_tar_samples, mean - 2 SE", "35", "reader",
     lambda r: _lower(r["figures"]["ST+MJ-sized: read_kept / kept_tar_samples (wall)"]), 1.5, "x", ">="),
]  # fmt: skip


def _upper(fig: dict) -> float:
    """A paired figure's mean + 2 SE (what an "at most" bar is held to)."""
    return fig["mean"] + 2 * fig["se"]


def _paired_upper(row: dict) -> float:
    """bench_scale_plan.py's ratio of the time per sample, paired round by round: mean + 2 SE."""
    return row["per_sample_vs_smallest_n_paired_mean"] + 2 * row["per_sample_vs_smallest_n_paired_se"]


def _lower(fig: dict) -> float:
    """A paired figure's mean - 2 SE (what an "at least" bar is held to)."""
    return fig["mean"] - 2 * fig["se"]


def targets(results: Path) -> str:
    """The targets table (:data:`TARGETS`) from the result files in ``results``."""
    lines = [
        "<!-- generated by benchmarks/report.py from docs/benchmarks/*.json (TARGETS): do not edit -->",
        "",
        "| target | issue | bar | measured | status | result file (commit, load at the start) |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for text, issue, name, figure, bar, unit, *op in TARGETS:
        at_least = op == [">="]
        sign = ">=" if at_least else "<="
        path = results / f"{name}.json"
        if not path.exists():
            lines.append(f"| {text} | #{issue} | {sign} {number(bar)} {unit} | - | no result | {name}.json missing |")
            continue
        res = json.loads(path.read_text())
        try:
            value = float(figure(res))  # type: ignore[operator]
        except (KeyError, ValueError, TypeError) as exc:
            raise ReportError(f"{path}: target {text!r}: {exc}") from exc
        load = ((res.get("load_start") or {}).get("loadavg") or ["?"])[0]
        where = f"{name}.json ({(res.get('commit') or '?')[:10]}, load {number(load)})"
        status = "met" if (value >= bar if at_least else value <= bar) else "not met"
        cells = [text, f"#{issue}", f"{sign} {number(bar)} {unit}", f"{number(value)} {unit}", status, where]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


class ReportError(Exception):
    """A block without its result file, or a malformed result file."""


def number(value) -> str:
    """A table cell: integers with thousands separators, floats to about 3 significant digits."""
    if isinstance(value, bool) or value is None:
        return "-" if value is None else str(value).lower()
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        a = abs(value)
        if a >= 1000:
            return f"{value:,.0f}"
        if a >= 100:
            return f"{value:.0f}"
        if a >= 10:
            return f"{value:.1f}"
        if a >= 1 or a == 0:
            return f"{value:.2f}"
        return f"{value:.3g}"
    if isinstance(value, (list, tuple)):
        return ", ".join(number(v) for v in value)
    return str(value).replace("|", "\\|").replace("\n", " ")


def table(rows: list[dict]) -> list[str]:
    """A Markdown table of ``rows`` (columns: the keys of every row, first seen first)."""
    if not rows:
        return []
    columns: list[str] = []
    for row in rows:
        columns.extend(k for k in row if k not in columns)
    lines = ["| " + " | ".join(c.replace("_", " ") for c in columns) + " |", "|" + " --- |" * len(columns)]
    lines += ["| " + " | ".join(number(row.get(c)) for c in columns) + " |" for row in rows]
    return lines


def header(res: dict) -> str:
    m = res.get("machine") or {}
    commit = (res.get("commit") or "unknown")[:10]
    dirty = res.get("uncommitted") or []
    code = f"commit {commit}" + (f" with uncommitted changes to {', '.join(dirty)}" if dirty else "")
    load = (res.get("load_start") or {}).get("loadavg") or [None]
    load_end = (res.get("load_end") or {}).get("loadavg") or [None]
    where = f"{m.get('cpu', '?')}, {m.get('cores', '?')} cores, {number(m.get('ram_gb'))} GB RAM"
    libs = ", ".join(f"{k} {m[k]}" for k in ("python", "numpy", "pyarrow") if m.get(k))
    return (
        f"`{res.get('command', '?')}` ({code}; {where}; {libs}; load average {number(load[0])} at the start, "
        f"{number(load_end[0])} at the end, on {m.get('cores', '?')} cores; {str(res.get('started', ''))[:10]})"
    )


def baseline(res: dict) -> str:
    b = dict(res.get("baseline") or {})
    what = b.pop("what", "baseline")
    parts = [f"{k.replace('_', ' ')} {number(v)}" for k, v in b.items() if not isinstance(v, (dict, list))]
    return f"Baseline measured in the same run: {what}" + (f" ({'; '.join(parts)})." if parts else ".")


def render(name: str, res: dict) -> str:
    """The block's body for the result file ``res`` of ``name``."""
    if res.get("name") != name:
        raise ReportError(f"{RESULTS / (name + '.json')}: its name is {res.get('name')!r}; expected {name!r}")
    lines = [f"<!-- generated by benchmarks/report.py from docs/benchmarks/{name}.json: do not edit -->", ""]
    if res.get("title"):
        lines += [f"**{res['title']}**", ""]
    lines += [header(res), ""]
    lines += table(res.get("rows") or [])
    lines += ["", baseline(res)]
    peak = res.get("peak_rss_mb")
    if peak is not None:
        lines += [f"Peak RSS of the measured code: {number(peak)} MB."]
    for note in res.get("notes") or []:
        lines += ["", note]
    return "\n".join(lines) + "\n"


def load_result(name: str, results: Path) -> dict:
    path = results / f"{name}.json"
    if not path.exists():
        raise ReportError(
            f"{path}: no such result file, but docs/benchmarks.md has a block <!-- result:{name}:begin -->; "
            f"run the benchmark that writes it (its command is in the section), or remove the block"
        )
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ReportError(f"{path}: not JSON ({exc}); expected a file written by common.Result") from exc


def generate(text: str, results: Path = RESULTS) -> str:
    """``text`` with every result block rendered from its result file."""

    def one(match: re.Match) -> str:
        name = match.group("name")
        body = render(name, load_result(name, results))
        return f"<!-- result:{name}:begin -->\n{body}<!-- result:{name}:end -->"

    text = BLOCK.sub(one, text)
    if TARGETS_BLOCK.search(text):
        table = targets(results)
        text = TARGETS_BLOCK.sub(lambda _: f"<!-- targets:begin -->\n{table}<!-- targets:end -->", text)
    return text


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--doc", type=Path, default=DOC)
    p.add_argument("--results", type=Path, default=RESULTS)
    p.add_argument("--check", action="store_true", help="exit 1 if a block differs from its result file")
    args = p.parse_args(argv)
    text = args.doc.read_text()
    try:
        new = generate(text, args.results)
    except ReportError as exc:
        print(f"report.py: {exc}", file=sys.stderr)
        return 2
    blocks = [m.group("name") for m in BLOCK.finditer(text)]
    if args.check:
        if new != text:
            stale = f"{args.doc}: result blocks differ from their files; run python -m benchmarks report"
            print(stale, file=sys.stderr)
            return 1
        print(f"{args.doc}: {len(blocks)} result blocks up to date")
        return 0
    if new != text:
        args.doc.write_text(new)
    print(f"{args.doc}: {len(blocks)} result blocks generated ({', '.join(blocks)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
