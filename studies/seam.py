"""The library's private names the accuracy studies need: the only module of ``studies/`` that imports a
private module of seta_stream (tests/test_tree_shape.py checks it). When the library moves one, this file
is the one place to change.

* ``points1d`` (``_kernels.kmeans1d``) and ``fit_two_gaussians`` (``_kernels.mixture1d``): the noise rule's
  two-mode test, fitted to values a study chooses rather than to a plan's candidates, with the library's
  own code so that the study reads what the rule would: the per-sample mean loss of a labelled run's
  recorded epochs (``baselines_labels.history_signal``: Ashman's D and the upper mode's weight as the
  epochs go), and a full-data run's recorded losses replayed on both of the rule's scales
  (``quality.noise_scale.replay``). The public ``policies.noise.noise_fit`` fits the candidates of a
  ``PolicyInput`` only: its candidate rule and warm-up would change what these readings measure.
"""

from __future__ import annotations

from seta_stream._kernels.kmeans1d import points1d
from seta_stream._kernels.mixture1d import fit_two_gaussians

__all__ = ["fit_two_gaussians", "points1d"]
