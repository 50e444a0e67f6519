"""The report layer: every generated section of the docs, from the committed run files.

``report_all`` rewrites every section the studies generate:

* docs/quality.md: the short study (``report``, ``reading_short``), the converged study and its
  same-order runs (``report_converged``, ``reading``: prose and the summary at the top), the
  collapses (``report_collapses``), the noise rule on noisy labels and the instability scan
  (``noise_report``, ``benchmarks.instability``);
* docs/quality-pairs.md: the pairs study (``pairs``), the noise study on pairs and its replicas
  (``noise_report``), the rule's scale (``noise_scale``);
* docs/results.md: the tables of the converged study (``reading``), the pairs study, the noise
  study and the scale; README.md: the results table (``noise_report``);
* the plots under docs/quality/.

Every number in those sections comes from the run files; nothing between markers is written by hand.
The helpers they share are in ``docs``.
"""

from __future__ import annotations

from . import noise, noise_scale, pairs
from .layout import Layout
from .reading import report_readings, report_results_table
from .reading_short import report_short_reading
from .report import report_short
from .report_collapses import report_collapses
from .report_converged import SAME_ORDER, report_converged


def report_quality(layout: Layout | None = None) -> None:
    """docs/quality.md's sections of the short and converged studies and the collapses, and
    docs/results.md's table of the converged study."""
    layout = layout or Layout()
    report_short(layout)
    report_converged(layout)
    report_converged(layout, SAME_ORDER)
    report_collapses(layout)
    report_readings(layout)
    report_results_table(layout)
    report_short_reading(layout)


def report_all() -> None:
    """Every generated section of the docs, from the committed run files."""
    report_quality()
    noise.report(noise.Ctx())
    pairs.report()
    noise_scale.report()
