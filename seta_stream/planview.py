"""How a reader applies the plan of an epoch: one :class:`Decision` per sample, decided shard by
shard through one :class:`PlanView`, and counted per iterator.

The three readers (``keep_filter``, ``kept_tar_samples``, ``read_kept``) share this module:

* :class:`PlanView` reads the stage files of an epoch (``plans.read_stage_lookup``; the
  current epoch from ``state.json`` unless one is pinned) and answers per shard:
  :meth:`PlanView.shard` gives a :class:`ShardDecisions` with the decision of every sample the
  plan knows and the plan's absent rule for the others, ``is_empty`` (nothing to open) and
  ``keeps_all`` (nothing to skip).
* :class:`Decision` is (keep, weight, score, known): what is attached to a kept sample
  (``__weight__``, ``__score__``) and how it is counted.
* :class:`StageCounts` is one iterator's counts (kept, dropped, absent_kept, absent_dropped,
  shards skipped...). Each stage iterator owns one; :func:`stage_counters` adds up the counts
  of every stage iterator started in this process (a DataLoader worker counts its own).

Samples absent from the plan (new data, or never recorded) follow the plan's absent rule: kept
with weight 1 (default), or, for score-free policies, kept iff their per-sample uniform is
below the keep fraction (the same draw the planner makes, docs/algorithms.md §0.2).
"""

from __future__ import annotations

import threading
from collections import Counter
from functools import cached_property
from typing import Any, NamedTuple

from .ids import sample_uid, shard_name
from .plans import read_stage_lookup
from .policies.random_draws import uniform_of
from .runfs import RunDir
from .state import current_epoch

__all__ = ["Decision", "ShardDecisions", "PlanView", "StageCounts", "stage_counters"]


class Decision(NamedTuple):
    """The plan's decision for one sample."""

    keep: bool
    weight: float
    score: float | None  # ES/ESWP plans only
    known: bool  # False: absent from the plan, decided by its absent rule

    def fields(self, has_score: bool) -> dict[str, Any]:
        """What a kept sample gets attached: ``__weight__`` (and ``__score__``, NaN if unknown)."""
        if not has_score:
            return {"__weight__": self.weight}
        return {"__weight__": self.weight, "__score__": self.score if self.score is not None else float("nan")}


class StageCounts(Counter):
    """Counts of one stage iterator; :func:`stage_counters` adds up those of a process."""

    def __init__(self) -> None:
        super().__init__()
        with _LOCK:
            _ITERATORS.append(self)

    def count(self, decision: Decision) -> None:
        """Count one sample as kept/dropped (and absent_kept/absent_dropped if not in the plan)."""
        if not decision.known:
            self["absent_kept" if decision.keep else "absent_dropped"] += 1
        self["kept" if decision.keep else "dropped"] += 1


_LOCK = threading.Lock()
_ITERATORS: list[StageCounts] = []


def stage_counters() -> dict[str, int]:
    """Counts of the stages in this process, added up over their iterators (a DataLoader
    worker counts its own)."""
    total: Counter[str] = Counter()
    with _LOCK:
        for counts in _ITERATORS:
            total.update(counts)
    return {k: v for k, v in total.items() if v}


class ShardDecisions:
    """The plan of one shard: ``decide(key)`` for any sample of it."""

    def __init__(self, view: PlanView, shard: str) -> None:
        self.view, self.shard = view, shard
        self.is_empty = view.shard_is_empty(shard)  # no sample of it is kept: it need not be opened
        self.keeps_all = view.shard_keeps_all(shard)  # every sample of it is kept: nothing to skip

    @cached_property
    def known(self) -> dict[str, Decision]:
        """key -> Decision of the samples the plan lists (built on first use)."""
        return self.view.known_decisions(self.shard)

    def decide(self, key: str) -> Decision:
        hit = self.known.get(key)
        return hit if hit is not None else self.view.absent(self.shard, key)


class PlanView:
    """Read-only view of one epoch's plan (the current epoch unless ``epoch`` is given)."""

    def __init__(self, run: str | RunDir, epoch: int | None = None) -> None:
        self.run = run if isinstance(run, RunDir) else RunDir(run)
        self.epoch = current_epoch(self.run) if epoch is None else int(epoch)
        stage = read_stage_lookup(self.run, self.epoch)
        summary = stage.summary
        self.depth = int(self.run.settings["shard_depth"])
        rule = summary.get("absent_rule") or {"kind": "keep"}
        self.absent_kind = rule.get("kind", "keep")
        self.absent_fraction = float(rule.get("fraction", 1.0))
        self.absent_stream = int(rule.get("stream", 1))
        self.absent_epoch = self.epoch if rule.get("epoch") is None else int(rule["epoch"])
        self.seed = int(summary.get("seed", 0))
        # with a population listing every sample of a known shard is a plan row, so a shard
        # with no kept row holds nothing to train; without one it may hold unknown samples
        self.population_listed = bool(summary.get("population_listed", False))
        self.lookup = stage.decisions
        self.keys = stage.keys
        self.shards = stage.shards
        self.has_score = "score" in self.lookup.column_names
        self._last: ShardDecisions | None = None

    def shard_of(self, url: str) -> ShardDecisions:
        """The decisions of the shard ``url`` reads."""
        return self.shard(shard_name(url, self.depth))

    def shard(self, shard: str) -> ShardDecisions:
        """The decisions of ``shard`` (the last one asked is kept: readers go shard by shard)."""
        if self._last is not None and self._last.shard == shard:
            return self._last
        self._last = ShardDecisions(self, shard)
        return self._last

    def shard_is_empty(self, shard: str) -> bool:
        """True if the plan knows the shard and keeps none of its samples, and samples the
        plan does not know would be dropped too (so the shard need not be opened)."""
        entry = self.shards.get(shard)
        if entry is None or entry[2] > 0:
            return False
        return self.population_listed or (self.absent_kind == "bernoulli" and self.absent_fraction <= 0.0)

    def shard_keeps_all(self, shard: str) -> bool:
        """True if the plan keeps every sample of ``shard`` it knows and every one it does not
        (so nothing in the shard can be dropped)."""
        absent_kept = self.absent_kind == "keep" or self.absent_fraction >= 1.0  # u < 1 always
        entry = self.shards.get(shard)
        return absent_kept and (entry is None or entry[2] == entry[1] - entry[0])

    def decide(self, shard: str, key: str) -> Decision:
        """The decision for one sample."""
        return self.shard(shard).decide(key)

    def absent(self, shard: str, key: str) -> Decision:
        """The plan's absent rule for a sample it does not list."""
        if self.absent_kind == "keep":
            return Decision(True, 1.0, None, False)
        u = uniform_of(sample_uid(shard, key), self.seed, self.absent_epoch, self.absent_stream)
        return Decision(bool(u < self.absent_fraction), 1.0, None, False)

    def known_decisions(self, shard: str) -> dict[str, Decision]:
        """key -> Decision of every sample of ``shard`` the plan lists."""
        entry = self.shards.get(shard)
        if entry is None:
            return {}
        a, b, _ = entry
        part = self.lookup.slice(a, b - a)
        # key -> Decision as Python objects: one dict look-up per sample
        scores = part.column("score").to_pylist() if self.has_score else [None] * (b - a)
        return {
            k: Decision(keep, weight, score, True)
            for k, keep, weight, score in zip(
                self.keys.slice(a, b - a).to_pylist(),
                part.column("keep").to_pylist(),
                part.column("weight").to_pylist(),
                scores,
            )
        }
