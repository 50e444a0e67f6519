"""The library's private names the speed benchmarks time or build with: the only module of
``benchmarks/`` that imports a private module of seta_stream (tests/test_tree_shape.py checks it). When
the library moves one, this file is the one place to change.

Each name, and why a benchmark needs it rather than the public API:

* ``make_part``, ``write_part`` (``_store.parts``): the synthetic runs' loss parts, written as
  ``LossRecorder`` writes them (``common.write_epoch_parts``) without a training loop recording 15M-200M
  samples one batch at a time.
* ``TABLE_SCHEMA``, ``read_manifest``, ``table_buckets`` (``_store.table``): whether a kept synthetic run's
  table is this version's (``common.make_table_run``), and the table's files in bucket order for the
  floor a plan is compared with (``common.table_files_code``: read the losses and sort them).
* ``load_numeric`` (``_store.table``): the columns read as planning reads them, untimed, before the noise
  rule's own work is timed alone (``bench_plan.fit_code``).
* ``kmeans1d``, ``_sorted_values``, ``_polars_sorts_faster`` (``_kernels.kmeans1d``): the exact 1-D k-means
  timed beside scikit-learn's (``bench_policies``), and the large-float sort the library uses, timed alone
  (``bench_plan.sort_code``).
* ``EpochDeal`` (``_reading.balance``): one DataLoader worker's share of a balanced epoch, timed at 15M samples
  without a pipeline around it (``bench_balance``).
* ``RoutedRecords`` (``_losses.route``): compaction's routing of parts to buckets, timed alone against the number
  of shard names (``bench_route``).

Code run in a fresh interpreter (``common.measure``) imports these names with :func:`imports`: the lines
name each name's defining module as this import found it, so the child process imports exactly that
module, and no module path is written anywhere else. A child importing seta_stream from another
source tree (``common.tree_setup``, A/B runs) finds them there under the same paths.
"""

from __future__ import annotations

from seta_stream._kernels.kmeans1d import _polars_sorts_faster, _sorted_values, kmeans1d
from seta_stream._losses.route import RoutedRecords
from seta_stream._reading.balance import EpochDeal
from seta_stream._store.parts import make_part, write_part
from seta_stream._store.table import TABLE_SCHEMA, load_numeric, read_manifest, table_buckets

__all__ = [
    "TABLE_SCHEMA",
    "EpochDeal",
    "RoutedRecords",
    "_polars_sorts_faster",
    "_sorted_values",
    "imports",
    "kmeans1d",
    "load_numeric",
    "make_part",
    "read_manifest",
    "table_buckets",
    "write_part",
]


def imports(*names: str) -> str:
    """``from MODULE import NAME`` lines (one per name, newline-terminated) for code run in a fresh
    interpreter: MODULE is the module defining the name (its ``__module__``)."""
    return "".join(f"from {globals()[name].__module__} import {name}\n" for name in names)
