"""The fixed label corruptions of the noisy-label studies (studies/quality/data.py)."""

from __future__ import annotations

from collections import Counter

import pytest

from studies.quality.data import ASYMMETRIC_FLIPS, asymmetric_offsets


def test_asymmetric_flips_exactly_the_named_pairs_at_the_rate() -> None:
    keys = [f"train_{i:06d}" for i in range(2003)]
    labels = [(i * 7) % 10 for i in range(2003)]
    per_class = Counter(labels)
    out = asymmetric_offsets(keys, labels, 0.4)
    label_of = dict(zip(keys, labels))
    flips = Counter((label_of[k], y) for k, y in out.items())
    assert flips == {(s, t): round(0.4 * per_class[s]) for s, t in ASYMMETRIC_FLIPS.items()}
    # truck->automobile, bird->airplane, deer->horse, cat<->dog
    assert ASYMMETRIC_FLIPS == {9: 1, 2: 0, 4: 7, 3: 5, 5: 3}
    # fixed: the same keys give the same choice whatever their order; another seed another choice
    assert asymmetric_offsets(keys[::-1], labels[::-1], 0.4) == out
    assert set(asymmetric_offsets(keys, labels, 0.4, seed=1)) != set(out)
    assert asymmetric_offsets(keys, labels, 0.0) == {}


def test_asymmetric_offsets_refuses_misaligned_labels() -> None:
    with pytest.raises(ValueError, match="3 keys but 2 labels"):
        asymmetric_offsets(["a", "b", "c"], [1, 2], 0.4)
