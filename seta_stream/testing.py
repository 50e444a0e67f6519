"""Not the API: the library's internals that its own tests, benchmarks and tools drive directly,
at a path without an underscore (code outside the package imports no private module but through
benchmarks/seam.py and studies/seam.py). What a training script needs is ``seta_stream.__all__``.

* :class:`LossRecorder`: what ``Pruner.record`` writes with, one loss part per flush, driven
  without a Pruner (a run's losses written in a test, the recorder timed alone);
* :func:`set_current_epoch`: point the stages at an epoch whose plan is published, without
  planning (``plan_epoch`` and ``Pruner.start_epoch`` do it as they publish or find a plan);
* :class:`PlanView`: a plan as the stages read it (what a DataLoader worker decides with).
"""

from __future__ import annotations

from ._losses.record import LossRecorder
from ._reading.planview import PlanView
from ._store.state import set_current_epoch

__all__ = ["LossRecorder", "PlanView", "set_current_epoch"]
