"""Fault injection for crash tests: kill the process at a named write step.

A writer that publishes in several steps (compaction, planning) calls :func:`fault` between
them. When the environment variable ``SETA_STREAM_FAULT`` names that point, the process sends
itself SIGKILL there, so a test can check that a rerun after a real kill converges to the
result of an undisturbed run. Without the variable nothing happens. The points each writer
offers are listed beside it (``compaction.FAULT_POINTS``, the ``plan:*`` points in ``plan``).
"""

from __future__ import annotations

import os
import signal

__all__ = ["FAULT_ENV", "FAULT_ONCE_ENV", "fault"]

FAULT_ENV = "SETA_STREAM_FAULT"
#: A file path: the fault fires only in the process that creates it first (a Ray task whose
#: worker is killed is retried; the retry must not be killed again).
FAULT_ONCE_ENV = "SETA_STREAM_FAULT_ONCE"


def fault(point: str) -> None:
    """SIGKILL this process at ``point`` if ``SETA_STREAM_FAULT`` names it (tests only)."""
    if os.environ.get(FAULT_ENV) != point:
        return
    once = os.environ.get(FAULT_ONCE_ENV)
    if once:
        try:
            os.close(os.open(once, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            return
    os.kill(os.getpid(), signal.SIGKILL)
