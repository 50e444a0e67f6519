"""How every committed result file of the repository is written and judged, for the speed benchmarks
(``benchmarks/``) and the accuracy studies (``studies/``) alike: whole-file writes (:func:`write_json`), no
folder of this machine in a committed file (:func:`path_label`, :func:`argv_labels`, :func:`label_paths`;
tests/test_results_paths.py checks every file under docs/), and the one verdict rule and wording of every
report (:func:`gap_verdict`: the baselines pages, the CIFAR GPU page, README's headline, the benchmarks'
paired-ratio notes). Standard library only."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def write_json(path: Path, obj: dict) -> None:
    """Write a result file whole (a temp file, then a rename): a study process reading the results
    meanwhile sees either no file or the complete one, never a half-written file."""
    tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")
    tmp.write_text(json.dumps(obj, indent=1) + "\n")
    os.replace(tmp, path)


def path_label(path: str | os.PathLike) -> str:
    """A path as a result file names it: relative to the repository where it is inside it or
    beside it (``bench-out/x``, ``../shared/data/cifar10``, ``.`` for the checkout itself), else
    a neutral label (``<elsewhere>/NAME``): no folder of this machine goes into a committed file."""
    text = os.fspath(path)
    if "://" in text:  # a URL: not a path of this machine
        return text
    resolved = Path(text).expanduser().resolve()
    for base, prefix in ((ROOT, ""), (ROOT.parent, "../")):
        if resolved.is_relative_to(base):
            rel = resolved.relative_to(base).as_posix()
            return prefix + rel if rel != "." else (prefix.rstrip("/") or ".")
    return f"<elsewhere>/{resolved.name}"


#: An absolute path of a machine in a text (a result file, a log line, a traceback, a page): a POSIX path
#: under /tmp, /root, /home, /work or /Users, or under the folder that holds this checkout (wherever a
#: machine put it, e.g. a CI clone under /check), or a Windows drive path (``C:\\Users\\...``, its
#: backslashes single or JSON-escaped). No committed file holds one (tests/test_results_paths.py).
MACHINE_PATH = re.compile(
    r"(?<![\w.~/\\-])(?:/(?:tmp|root|home|work|Users)/|"
    + re.escape(ROOT.parent.as_posix().rstrip("/") + "/")
    + r"|[A-Z]:\\{1,2}[\w$.~-]{2,}\\)[^\s\"'`,;|()<>\[\]{}]*"
)


def label_paths(text: str) -> str:
    """``text`` with every absolute path of a machine in it (:data:`MACHINE_PATH`) as :func:`path_label`
    names it (a Windows path: ``<elsewhere>/NAME``); a trailing ``.``, ``:`` stays after the label."""

    def label(m: re.Match) -> str:
        path = m.group(0).rstrip(".:")
        tail = m.group(0)[len(path) :]
        if path.startswith("/"):
            return path_label(path) + tail
        return "<elsewhere>/" + re.split(r"[\\/]+", path.rstrip("\\/"))[-1] + tail

    return MACHINE_PATH.sub(label, text)


def argv_labels(argv: list[str]) -> list[str]:
    """The command line with every argument that names an existing path (or an absolute one)
    as :func:`path_label` names it, ``--opt=PATH`` included."""
    out = []
    for arg in argv:
        opt, eq, value = arg.partition("=") if arg.startswith("--") else ("", "", arg)
        if value and ("/" in value or value in (".", "..")) and (os.path.isabs(value) or os.path.exists(value)):
            value = path_label(value)
        out.append(opt + eq + value)
    return out


# ---------------------------------------------------------------------------------- the verdict
def mean_se(values: list[float]) -> tuple[float, float | None]:
    """The mean of ``values`` and its standard error (None for a single value)."""
    m = sum(values) / len(values)
    if len(values) < 2:
        return m, None
    var = sum((v - m) ** 2 for v in values) / (len(values) - 1)
    return m, (var / len(values)) ** 0.5


def gap_verdict(
    gaps: list[float], bar: float = 0.0, floor: float | None = None, *, at_most: bool = False, unit: str = "seed"
) -> tuple[float, float | None, str]:
    """(mean, 2 SE, verdict) of per-seed gaps (or per-round values) against ``bar``: the one verdict rule and
    wording of every report. SE = sample standard deviation (ddof 1) / sqrt(n); 2 SE is None for one value.

    The verdict is one of (``bar`` is cleared in the direction that is good: above it; ``at_most``: under it):

    * ``met``: the mean clears the bar by 2 SE (mean - 2 SE > bar; ``at_most``: mean + 2 SE < bar);
    * ``below``: mean + 2 SE < bar (not ``at_most``); ``above``: mean - 2 SE > bar (``at_most``);
    * ``mean above, not resolved`` / ``mean below, not resolved``: the bar is within mean ± 2 SE, the mean on
      that side of it (``mean at the bar, not resolved`` where the mean equals it);
    * ``at the bar``: every value equals the bar (2 SE = 0: e.g. two identical runs);
    * ``one seed: mean above, not resolved`` (``below``, ``at the bar``): one value, no SE (``unit`` names it:
      ``one round: ...``);
    * ``within the run-to-run floor``: with a ``floor``, where the mean is resolved from the bar (met, below or
      above) but |mean| <= floor: no larger than two identical runs differ, so not read as a gap.
    """
    m, se = mean_se(list(gaps))
    se2 = None if se is None else 2 * se
    return m, se2, verdict_of(m, se2, bar, floor, at_most=at_most, unit=unit)


def verdict_of(
    m: float, se2: float | None, bar: float = 0.0, floor: float | None = None, *, at_most: bool = False,
    unit: str = "seed",
) -> str:  # fmt: skip
    """:func:`gap_verdict`'s verdict from the mean ``m`` and 2 SE ``se2`` (None: one value) where only those are
    kept (a result file's paired figure)."""
    side = "above" if m > bar else "below" if m < bar else "at the bar"
    if se2 is None:
        return f"one {unit}: mean {side}, not resolved"
    if se2 == 0 and m == bar:
        return "at the bar"
    good, bad = (m + se2 < bar, m - se2 > bar) if at_most else (m - se2 > bar, m + se2 < bar)
    if not (good or bad):
        return f"mean {side}, not resolved"
    if floor is not None and abs(m) <= floor:
        return "within the run-to-run floor"
    return "met" if good else ("above" if at_most else "below")


def mean_cell(xs: list[float | None], d: int = 3) -> str:
    """A table cell: the mean of the values that are not None to ``d`` decimals, or '-' if none is."""
    got = [x for x in xs if x is not None]
    return f"{sum(got) / len(got):.{d}f}" if got else "-"


def precision_recall(records: list[dict]) -> str:
    """'precision / recall' of a rule's suspects, one record a run (its suspects over the run, or its last
    plan's): the precision is the mean over the runs that suspected something (``precision`` not None: a run
    that suspected nothing has none), the recall the mean over all (None read as 0). The one wording of
    every study's page."""
    found = [x["precision"] for x in records if x.get("precision") is not None]
    r = sum(x["recall"] or 0.0 for x in records) / len(records)
    if not found:
        return f"- / {r:.3f} (nothing suspected)"
    text = f"{sum(found) / len(found):.3f} / {r:.3f}"
    if len(found) < len(records):
        text += f" (precision of the {len(found)} of {len(records)} runs that suspected any)"
    return text


def rule_targets(gaps: list[float], margins: list[float], to_oracle: list[float], point: float = 1.0) -> dict:
    """The targets of a rule that never costs accuracy (docs/algorithms.md §12.12), one rule for every
    study's page. ``gaps``: the rule minus full data per seed, ``margins``: the oracle filter minus full data,
    ``to_oracle``: the rule minus the oracle filter, all early-stopped and in the same unit, of which
    ``point`` is one point of accuracy (0.01 for fractions). Returns:

    * ``mean``, ``se2`` (2 SE, None for one seed) of ``gaps`` (both None where there are none);
    * ``upper`` = mean + 2 SE and ``upper_met`` (>= 0), None for one seed: the rule never costs accuracy;
    * ``margin``: the mean of ``margins`` (None without an oracle run); ``applies`` where it is 2 points or
      more, and then ``lower`` = mean - 2 SE with ``lower_met`` (> 0; not met for one seed, ``lower`` None)
      and ``to_oracle`` (its mean) with ``to_oracle_met`` (within 1 point of the oracle filter).
    """
    t: dict = dict.fromkeys(("mean", "se2", "upper", "upper_met", "margin", "lower", "lower_met", "to_oracle",
                             "to_oracle_met"))  # fmt: skip
    if gaps:
        t["mean"], t["se2"], _ = gap_verdict(gaps)
        if t["se2"] is not None:
            t["upper"] = t["mean"] + t["se2"]
            t["upper_met"] = t["upper"] >= 0
    if margins:
        t["margin"] = float(sum(margins) / len(margins))
    t["applies"] = t["margin"] is not None and t["margin"] >= 2 * point
    if t["applies"] and gaps:
        t["lower"] = None if t["se2"] is None else t["mean"] - t["se2"]
        t["lower_met"] = t["lower"] is not None and t["lower"] > 0
        if to_oracle:
            t["to_oracle"] = float(sum(to_oracle) / len(to_oracle))
            t["to_oracle_met"] = t["to_oracle"] >= -point
    return t


#: A results folder's provenance file (not a run: every reader of the folder's runs passes it by)
PROVENANCE = "provenance.json"


def read_provenance(results: Path) -> dict:
    """The folder's :data:`PROVENANCE` (which code made its runs: ``commit``, in words such as "commit
    5a8e19d", and ``command``; the noise rule's ``rule_version``; the ``draws`` and their ``short`` name;
    ``superseded_by``, ``note``), or {}."""
    path = results / PROVENANCE
    return json.loads(path.read_text()) if path.exists() else {}


def rule_label(results: Path) -> str:
    """'<rule version>, <draws' short name>' of a results folder's :data:`PROVENANCE`, or '-' without one:
    the rule column of the headline's rows."""
    p = read_provenance(results)
    return f"{p['rule_version']}, {p['short']}" if p else "-"


def provenance_lines(results: Path) -> list[str]:
    """The paragraph a study page opens with from its results folder's :data:`PROVENANCE`, if it has
    one (:func:`read_provenance`): which code, rule version and draws made the runs, what supersedes them."""
    p = read_provenance(results)
    if not p:
        return []
    text = (f"**These runs**: made at {p['commit']} (`{p['command']}`), the noise rule's version "
            f"{p['rule_version']}, the noise drawn {p['draws']}.")  # fmt: skip
    if p.get("superseded_by"):
        text += f" {p['superseded_by']}"
    if p.get("note"):
        text += f" {p['note']}"
    return [text, ""]
