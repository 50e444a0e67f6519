"""Process tuning while planning: normal memory pages, and the imports planning needs done beside it.

Two speed tricks, measured in docs/benchmarks.md ("Planning"), each behind one context manager
that ``plan_epoch`` enters (``seta_stream._planning.transaction``): :func:`normal_pages` asks
NumPy for 4 KB pages instead of transparent huge pages while planning runs, and
:func:`imports_beside` imports polars, pandas and pyarrow.dataset on a thread of their own while
planning reads the table. Neither changes what is planned.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
import threading
from collections.abc import Iterator
from typing import Any

__all__ = ["normal_pages", "imports_beside"]


def _madvise_hugepage_setter() -> Any:
    """NumPy's switch for asking the kernel for transparent huge pages on large arrays (a
    private function, under numpy._core in NumPy 2 and numpy.core before), or None."""
    for name in ("numpy._core.multiarray", "numpy.core.multiarray"):
        with contextlib.suppress(ImportError, AttributeError):
            return importlib.import_module(name)._set_madvise_hugepage
    return None


@contextlib.contextmanager
def normal_pages() -> Iterator[None]:
    """Planning allocates about 1 GB of short-lived arrays at 15M rows. NumPy asks the kernel to
    back large arrays with 2 MB transparent huge pages (madvise); on a VM whose host takes idle
    guest memory back, faulting those in cost 2.6 ms per MB here (3.1 s for 1.2 GB, against
    0.6 s with 4 KB pages; docs/benchmarks.md, "Planning"), more than planning's own work. So
    planning asks for normal pages while it runs and restores NumPy's setting afterwards, unless
    the user chose one with the NUMPY_MADVISE_HUGEPAGE environment variable."""
    setter = None if "NUMPY_MADVISE_HUGEPAGE" in os.environ else _madvise_hugepage_setter()
    if setter is None:
        yield
        return
    previous = setter(False)
    try:
        yield
    finally:
        setter(previous)


#: Modules planning imports on first use, in the order it needs them: polars (the sort of the
#: losses), pandas (which pyarrow imports at its first conversion between NumPy and Arrow) and
#: pyarrow.dataset (which ``pq.read_table`` imports: the identity columns are read with it).
_LAZY_IMPORTS = ("polars", "pandas", "pyarrow.dataset")


@contextlib.contextmanager
def imports_beside() -> Iterator[None]:
    """Import :data:`_LAZY_IMPORTS` on a thread of their own while planning reads the table: in
    a fresh process they cost 0.3 - 0.5 s of CPU, which the reading threads, the policy and the
    identities' thread waited for, one after the other (docs/benchmarks.md, "Planning"). A module
    that planning imports meanwhile waits for this import (Python's per-module import lock), so
    nothing is imported twice; one that cannot be imported is left to fail where it is used.
    The thread is joined on the way out: no import is under way when planning returns (a
    DataLoader forking its workers then would leave them an import lock nobody releases)."""
    missing = [m for m in _LAZY_IMPORTS if m not in sys.modules]
    thread = None
    if missing:
        thread = threading.Thread(target=_import_all, args=(missing,), name="seta-stream-imports")
        thread.start()
    try:
        yield
    finally:
        if thread is not None:
            thread.join()


def _import_all(names: list[str]) -> None:
    for name in names:
        with contextlib.suppress(Exception):
            importlib.import_module(name)
