"""Helpers shared by the policy tests."""

from __future__ import annotations

import itertools

import numpy as np


def successive_inclusion(w, m):
    """Exact inclusion probabilities of successive sampling without replacement (small N)."""
    w = np.asarray(w, float)
    probs = np.zeros(len(w))
    for order in itertools.permutations(range(len(w)), m):
        p, left = 1.0, w.sum()
        for i in order:
            p *= w[i] / left
            left -= w[i]
        probs[list(order)] += p
    return probs
