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

__all__ = ["FAULT_ENV", "fault"]

FAULT_ENV = "SETA_STREAM_FAULT"


def fault(point: str) -> None:
    """SIGKILL this process at ``point`` if ``SETA_STREAM_FAULT`` names it (tests only)."""
    if os.environ.get(FAULT_ENV) == point:
        os.kill(os.getpid(), signal.SIGKILL)
