"""Read-only views of a run: per-epoch kept/pruned, the plans' warnings, the clusters and window of
a plan, the shards that lost most and least (:func:`run_summary`, :func:`format_summary`), a PNG
plot of the loss histogram with the cluster boundaries (:func:`plot_epoch`), and the samples the
run's plans held as suspected noise, in which epochs, with their loss history (:func:`suspects`,
:func:`suspect_report`, :func:`format_suspects`; docs/algorithms.md §12.6).

This package's face is these six names; its modules are its parts: ``runs`` (the run views),
``plots`` (the plot; matplotlib, the ``plot`` extra, imported when asked for) and ``noise`` (the
suspects report of the noise rule, whose stage is seta_stream/policies/noise.py). Nothing here
writes to the run directory (the plot and the suspects' file go where the caller says, and
nowhere when the caller names no file). It imports polars: ``seta_stream`` imports it on first
use of ``seta_stream.inspect``.
"""

from .noise import format_suspects, suspect_report, suspects
from .plots import plot_epoch
from .runs import format_summary, run_summary

__all__ = ["run_summary", "format_summary", "plot_epoch", "suspects", "suspect_report", "format_suspects"]
