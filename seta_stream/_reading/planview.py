"""How a reader applies the plan of an epoch: one :class:`Decision` per sample, decided shard by
shard through one :class:`PlanView`, and counted per iterator.

The three readers (``keep_filter``, ``kept_tar_samples``, ``read_kept``) share this module:

* :class:`PlanView` reads the summary and shards.arrow of an epoch (``plans.read_stage_lookup``;
  the current epoch from ``state.json`` unless one is pinned) and answers per shard:
  :meth:`PlanView.shard` gives a :class:`ShardDecisions` with the decision of every sample the
  plan knows and the plan's absent rule for the others, ``is_empty`` (nothing to open) and
  ``keeps_all`` (nothing to skip). The rows of a shard are read the first time one of its
  samples is decided (one record batch of stage.arrow: a slice of the memory-mapped file, or
  one range request on an object store), and only the last shard asked is held, so what a
  worker reads and holds grows with the shards it opens, not with the plan.
* :class:`Decision` is (keep, weight, score, known): what is attached to a kept sample
  (``__weight__``, ``__score__``) and how it is counted.
* :class:`StageCounts` is one iterator's counts (kept, dropped, absent_kept, absent_dropped,
  shards skipped...). Each stage iterator owns one; :func:`stage_counters` adds up the counts
  of every stage iterator started in this process (a DataLoader worker counts its own).

Samples absent from the plan (new data, or never recorded) follow the plan's absent rule: kept
with weight 1 (default), or, for score-free policies, kept iff their per-sample uniform is
below the keep fraction (the same draw the planner makes, docs/algorithms.md §0.2).

A sample is found in the plan by its uid (``ids.sample_uid(shard, key)``, computed per sample:
1.4 - 4 us in pure Python, against 0.1 us for the key dict of plans written by earlier
versions, which are read by key; a shard's decisions load in about 4 ms against 25 ms by key;
docs/benchmarks.md, "Stage on an object store"). Two cases skip it:

* a shard whose every sample, listed or not, gets the same decision (kept, weight 1, no score:
  a full-data epoch, a shard a policy keeps whole) is decided once (:attr:`ShardDecisions.uniform`);
  which of its samples the plan lists, for the counts, is worked out afterwards from the keys
  seen, hashed all at once (:meth:`ShardDecisions.count_unlisted`);
* a reader that knows a shard's keys before reading it (``read_kept``, from the shard's index)
  decides them all at once (:meth:`ShardDecisions.decide_all`, uids hashed with NumPy).

Either way every sample gets exactly the decision :meth:`ShardDecisions.decide` gives it.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from functools import cached_property
from itertools import chain, islice
from typing import Any, NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .._kernels.arrays import one_array
from .._kernels.draws import uniform_of
from .._store.planfiles import read_stage_lookup
from .._store.runfs import RunDir
from .._store.state import current_epoch
from ..ids import sample_uid, sample_uids, shard_name

__all__ = [
    "Decision",
    "ShardDecisions",
    "KnownByKey",
    "PlanView",
    "StageCounts",
    "stage_counters",
    "tally",
    "tally_all",
    "kept_samples",
]


class Decision(NamedTuple):
    """The plan's decision for one sample."""

    keep: bool
    weight: float
    score: float | None  # ES/ESWP plans only
    known: bool  # False: absent from the plan, decided by its absent rule

    def attach(self, sample: dict[str, Any], has_score: bool) -> None:
        """Set ``__weight__`` (and ``__score__``, NaN if unknown) on a kept sample."""
        sample["__weight__"] = self.weight
        if has_score:
            sample["__score__"] = self.score if self.score is not None else float("nan")


class StageCounts(Counter):
    """Counts of one stage iterator; :func:`stage_counters` adds up those of a process."""

    def __init__(self) -> None:
        super().__init__()
        with _LOCK:
            _ITERATORS.append(self)

    def count(self, decision: Decision) -> None:
        """Count one sample (see :func:`tally`)."""
        tally(self, decision)


def tally(counts: Counter[str], decision: Decision) -> None:
    """Count one sample as kept/dropped (and absent_kept/absent_dropped if not in the plan)."""
    if not decision.known:
        counts["absent_kept" if decision.keep else "absent_dropped"] += 1
    counts["kept" if decision.keep else "dropped"] += 1


def tally_all(counts: Counter[str], decisions: Iterable[Decision]) -> None:
    """:func:`tally` of many decisions at once."""
    pairs = Counter((d.keep, d.known) for d in decisions)
    kept = pairs[True, True] + pairs[True, False]
    dropped = pairs[False, True] + pairs[False, False]
    counts.update(kept=kept, dropped=dropped, absent_kept=pairs[True, False], absent_dropped=pairs[False, False])


#: keys held at most before the keys of a uniformly decided shard are counted (bounds memory)
_PENDING_KEYS = 1 << 16

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


def kept_samples(
    samples: Iterable[dict[str, Any]], view: PlanView | Callable[[], PlanView], counts: Counter[str]
) -> Iterator[dict[str, Any]]:
    """The samples (with ``__url__`` and ``__key__``) that ``view`` keeps, with ``__weight__``
    (and ``__score__``) attached, each counted into ``counts``: what ``keep_filter`` does, and
    ``read_kept`` on a shard it streams. ``view`` may be a function that opens the view: it is
    called when the iterator starts (a stage returns this generator itself, with no generator
    of its own around it: each one costs every sample a step).

    The samples are taken in runs of one URL, each with the decisions of its shard, looked up
    once a run. A shard whose every sample gets the same decision (:attr:`ShardDecisions.uniform`)
    is not looked up per sample: its run only sets the weight, and the run's keys are counted as
    listed or absent when it ends (every ``_PENDING_KEYS`` keys in a longer run)."""
    if not isinstance(view, PlanView):
        view = view()
    has_score = view.has_score
    # hot loops: the counts are local integers, added to ``counts`` at the end
    kept = dropped = absent_kept = absent_dropped = 0
    plan: ShardDecisions | None = None
    pending: list[str] = []  # keys of kept samples of a uniformly decided shard, not counted yet

    def settle() -> None:  # counts the pending keys (kept; absent among them) and clears them
        nonlocal kept, absent_kept
        assert plan is not None
        kept += len(pending)
        absent_kept += plan.count_unlisted(pending)
        pending.clear()

    source = iter(samples)
    sample: dict[str, Any] | None = next(source, None)
    try:
        while sample is not None:  # one run of samples of one URL a turn; ``sample`` is its first
            url = sample["__url__"]
            plan = view.shard_of(url)
            uniform = plan.uniform
            run = chain((sample,), source)
            sample = None  # the first sample of the next run, once met
            if uniform is not None:  # kept, weight 1.0, no score, whatever the key
                weight, push = uniform.weight, pending.append
                while True:
                    chunk = _PENDING_KEYS  # pending is empty here
                    for s in islice(run, chunk):
                        if s["__url__"] != url:
                            sample = s
                            break
                        push(s["__key__"])
                        s["__weight__"] = weight
                        yield s
                    else:
                        if len(pending) == chunk:  # the run may go on: count these keys first
                            settle()
                            continue
                    break
                settle()
                continue
            decide = plan.decide
            for s in run:
                if s["__url__"] != url:
                    sample = s
                    break
                decision = decide(s["__key__"])
                if not decision.known:  # absent from the plan: decided by the plan's absent rule
                    if decision.keep:
                        absent_kept += 1
                    else:
                        absent_dropped += 1
                if not decision.keep:
                    dropped += 1
                    continue
                kept += 1
                decision.attach(s, has_score)
                yield s
    finally:
        if pending:
            settle()
        counts.update(kept=kept, dropped=dropped, absent_kept=absent_kept, absent_dropped=absent_dropped)


class ShardDecisions:
    """The plan of one shard: ``decide(key)`` for any sample of it."""

    def __init__(self, view: PlanView, shard: str) -> None:
        self.view, self.shard = view, shard
        self.is_empty = view.shard_is_empty(shard)  # no sample of it is kept: it need not be opened
        self.keeps_all = view.shard_keeps_all(shard)  # every sample of it is kept: nothing to skip

    @cached_property
    def rows(self) -> pa.RecordBatch | pa.Table | None:
        """The plan's rows of the shard (None if it lists none), read on first use."""
        return self.view.stage.shard_rows(self.shard)

    @cached_property
    def listed(self) -> dict[Any, Decision]:
        """uid (or key, for plans written by earlier versions) -> Decision of the samples the
        plan lists (read on first use)."""
        return self.view.decisions_of(self.rows)

    @cached_property
    def known(self) -> KnownByKey | dict[str, Decision]:
        """key -> Decision of the samples the plan lists (``known.get(key)``; None if absent)."""
        if self.view.identity == "key":
            return self.listed
        return KnownByKey(self.shard, self.listed)

    @cached_property
    def uniform(self) -> Decision | None:
        """The decision of every sample of the shard when all get the same one: kept with
        weight 1.0 and no score, listed or not (``known`` is that of a listed sample); None
        otherwise. The plan's rows are checked once (all kept, every weight 1.0)."""
        view = self.view
        if not self.keeps_all or view.has_score or view.identity != "uid":
            return None
        rows = self.rows
        if rows is not None and rows.num_rows:
            weight = rows.column("weight").to_numpy(zero_copy_only=False)
            if not (np.all(weight == 1.0) and rows.column("keep").to_numpy(zero_copy_only=False).all()):
                return None
        return _KEPT_WHOLE

    @cached_property
    def listed_uids(self) -> pa.Array:
        """uids of the samples the plan lists (uint64)."""
        rows = self.rows
        if rows is None:
            return pa.array([], pa.uint64())
        uids = rows.column("uid")
        return one_array(uids)

    def count_unlisted(self, keys: list[str]) -> int:
        """How many of ``keys`` (samples of this shard, repeats counted) the plan does not list
        (uids hashed all at once; plans of earlier versions: looked up by key)."""
        if not keys:
            return 0
        if self.view.identity == "key":
            listed = self.listed
            return sum(1 for k in keys if k not in listed)
        listed = self.listed_uids
        if not len(listed):  # a shard the plan does not list: every key is absent
            return len(keys)
        found = pc.is_in(pa.array(self._uids(keys)), value_set=listed)
        return len(keys) - pc.sum(found).as_py()

    def _uids(self, keys: list[str]) -> np.ndarray:
        names = pa.array([self.shard], pa.string())
        shards = pa.DictionaryArray.from_arrays(pa.array(np.zeros(len(keys), np.int32)), names)
        return sample_uids(shards, pa.array(keys, pa.string()))

    def decide(self, key: str) -> Decision:
        if self.view.identity == "key":
            hit = self.listed.get(key)
            return hit if hit is not None else self.view.absent(self.shard, key)
        uid = sample_uid(self.shard, key)
        hit = self.listed.get(uid)
        return hit if hit is not None else self.view.absent_uid(uid)

    def decide_all(self, keys: list[str]) -> list[Decision]:
        """``[decide(k) for k in keys]``, the uids hashed all at once (for a reader that knows
        the shard's keys before reading it)."""
        if self.view.identity == "key" or len(keys) < 16:
            return [self.decide(k) for k in keys]
        uids = self._uids(keys).tolist()
        out = list(map(self.listed.get, uids))
        if None in out:
            absent = self.view.absent_uid
            out = [d if d is not None else absent(u) for d, u in zip(out, uids)]
        return out


_KEPT_WHOLE = Decision(True, 1.0, None, True)


class KnownByKey:
    """The decisions of one shard's listed samples looked up by key: ``get(key)`` finds the
    sample's uid (``ids.sample_uid``) among the plan's rows of the shard."""

    __slots__ = ("shard", "by_uid")

    def __init__(self, shard: str, by_uid: dict[int, Decision]) -> None:
        self.shard, self.by_uid = shard, by_uid

    def get(self, key: str, default: Decision | None = None) -> Decision | None:
        return self.by_uid.get(sample_uid(self.shard, key), default)

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and sample_uid(self.shard, key) in self.by_uid

    def __len__(self) -> int:
        return len(self.by_uid)


class PlanView:
    """Read-only view of one epoch's plan (the current epoch unless ``epoch`` is given)."""

    def __init__(self, run: str | RunDir, epoch: int | None = None) -> None:
        # a remote run is opened again here: an fsspec filesystem made before a fork (the
        # RunDir handed to attach) is not fork-safe, and fsspec gives each process its own
        self.run = run if isinstance(run, RunDir) and run.is_local else RunDir(run)
        self.epoch = current_epoch(self.run) if epoch is None else int(epoch)
        self.stage = read_stage_lookup(self.run, self.epoch)
        summary = self.stage.summary
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
        self.shards = self.stage.shards
        self.has_score = self.stage.has_score
        self.identity = self.stage.identity  # "uid", or "key" for plans of earlier versions
        self._last: ShardDecisions | None = None
        self._last_url: tuple[str, ShardDecisions] | None = None

    def shard_of(self, url: str) -> ShardDecisions:
        """The decisions of the shard ``url`` reads (the url of the last call is remembered:
        readers ask once per sample, and naming a shard parses its url)."""
        if self._last_url is not None and self._last_url[0] == url and self._last_url[1] is self._last:
            return self._last_url[1]
        shard = self.shard(shard_name(url, self.depth))
        self._last_url = (url, shard)
        return shard

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
        return self.absent_uid(sample_uid(shard, key))

    def absent_uid(self, uid: int) -> Decision:
        """The plan's absent rule for the unlisted sample with this uid."""
        if self.absent_kind == "keep":
            return Decision(True, 1.0, None, False)
        u = uniform_of(uid, self.seed, self.absent_epoch, self.absent_stream)
        return Decision(bool(u < self.absent_fraction), 1.0, None, False)

    def decisions_of(self, rows: pa.RecordBatch | pa.Table | None) -> dict[Any, Decision]:
        """identity (uid, or key for plans of earlier versions: see ``identity``) -> Decision of
        the plan's rows of one shard."""
        if rows is None:
            return {}
        idents = rows.column(self.identity).to_pylist()
        keep = rows.column("keep").to_pylist()
        weight = rows.column("weight").to_pylist()
        if self.has_score:
            scores = rows.column("score").to_pylist()
            return {i: Decision(k, w, sc, True) for i, k, w, sc in zip(idents, keep, weight, scores)}
        # without scores a plan has a few distinct (keep, weight) pairs: one shared Decision
        # each, so a shard's rows cost a dict entry rather than a new object (the stage loads a
        # shard's decisions every time it opens one)
        shared: dict[tuple[bool, float], Decision] = {}
        for pair in set(zip(keep, weight)):
            shared[pair] = Decision(pair[0], pair[1], None, True)
        return dict(zip(idents, map(shared.__getitem__, zip(keep, weight))))
