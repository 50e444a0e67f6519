"""The report layer: every generated section of the docs, from the committed run files (nothing
between markers is written by hand; the shared helpers are in ``docs``).

docs/quality.md: the short study (``report``, ``reading_short``), the converged study, its same-order
runs and the summary at the top (``report_converged``, ``reading``), the collapses (``report_collapses``),
the noise rule and the instability scan (``noise_report``, ``studies.quality.instability``); docs/quality-pairs.md:
the pairs study, its noise study and the rule's scale (``pairs``, ``noise_report``, ``noise_scale``);
docs/results.md and README.md's tables of them; the plots under docs/quality/.
"""

from __future__ import annotations

from studies.quality import noise, noise_scale, pairs
from studies.quality.layout import Layout
from studies.quality.reading import report_readings, report_results_table
from studies.quality.reading_short import report_short_reading
from studies.quality.report import report_short
from studies.quality.report_collapses import report_collapses
from studies.quality.report_converged import SAME_ORDER, report_converged


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
