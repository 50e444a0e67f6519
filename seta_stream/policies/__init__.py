"""Policies: pure functions from loss-table columns to a keep mask and weights.

One module per policy plus this registry. ``run_policy(name, inp, **params)`` validates the
parameters, runs the policy and :func:`finalize` s the result (the safeguards every policy
accepts, ``min_keep_fraction`` and ``max_weight``; the empty-plan guard; the common summary
fields and the plan's ``warnings``: :mod:`.safeguards`). Adding a policy = one module with a
params dataclass, a function and its ``SPECS``
(:class:`PolicySpec`: description, the table columns it reads, the run settings it fixes),
named in the registration loop below. Nothing outside this package names a policy.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import InvalidInputError
from . import evolved as _evolved
from . import full as _full
from . import infobatch as _infobatch
from . import random as _random
from . import seta as _seta
from .base import (
    INPUT_COLUMNS,
    PLAN_COLUMNS,
    REASONS,
    AbsentRule,
    PolicyInput,
    PolicyResult,
    PolicySpec,
    RunSetting,
    reason_code,
)
from .evolved import EsParams as EsParams
from .evolved import EswpParams as EswpParams
from .evolved import es as es
from .evolved import es_select
from .evolved import eswp as eswp
from .full import FullParams as FullParams
from .full import full as full
from .infobatch import InfoBatchParams as InfoBatchParams
from .infobatch import infobatch as infobatch
from .random import RandomParams as RandomParams
from .random import StaticParams as StaticParams
from .random import random_policy as random_policy
from .random import static_policy as static_policy
from .random_draws import STREAM_FLOOR, STREAM_GUARD, smallest_mask, uniforms
from .safeguards import SAFEGUARD_PARAMS, Safeguards, cap_weights, fill_mask, fillable, plan_warnings, split_params
from .seta import SetaParams as SetaParams
from .seta import seta as seta
from .steps import Cut, PlanContext, run_steps, smallest, total, uniform_keys

_COUNT_BLOCK_ROWS = 1 << 20  # rows per block of the summary's counts and of _zero_dropped's check

__all__ = [
    "INPUT_COLUMNS",
    "PLAN_COLUMNS",
    "POLICIES",
    "REASONS",
    "AbsentRule",
    "PolicyInput",
    "PolicyResult",
    "PolicySpec",
    "RunSetting",
    "SAFEGUARD_PARAMS",
    "Safeguards",
    "apply_guard",
    "check_run_settings",
    "describe_policies",
    "es_select",
    "finalize",
    "get_policy",
    "plan_params",
    "plan_warnings",
    "policy_params",
    "register",
    "run_policy",
    "run_settings_for",
    "summarize",
    "summary_counts",
    "summary_of",
    "SummaryCounts",
    "plan_partitioned",
]

POLICIES: dict[str, PolicySpec] = {}


def register(spec: PolicySpec) -> None:
    """Add a policy to the registry (name must be new)."""
    if spec.name in POLICIES:
        raise InvalidInputError(f"policy {spec.name!r} is already registered")
    POLICIES[spec.name] = spec


for _module in (_full, _random, _infobatch, _evolved, _seta):
    for _spec in _module.SPECS:
        register(_spec)
del _module, _spec


def get_policy(name: str) -> PolicySpec:
    """The registered policy ``name`` (InvalidInputError listing the valid names otherwise)."""
    try:
        return POLICIES[name]
    except KeyError:
        raise InvalidInputError(
            f"unknown policy {name!r}; valid policies: {', '.join(sorted(POLICIES))} "
            "(`seta-stream policies` describes them, with their parameters)"
        ) from None


def describe_policies() -> list[dict[str, Any]]:
    """Name, description and parameters (with defaults) of every policy, for the CLI; the
    safeguards every policy accepts (§0.10) come last, with ``"safeguard": True``."""
    out = []
    for name in sorted(POLICIES):
        spec = POLICIES[name]
        params = [
            {"name": f.name, "default": f.default if f.default is not dataclasses.MISSING else None}
            for f in dataclasses.fields(spec.params_type)
        ]
        params += [{"name": f, "default": None, "safeguard": True} for f in SAFEGUARD_PARAMS]
        out.append({"name": name, "description": spec.description, "params": params})
    return out


def _jsonable(x: Any) -> Any:
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, np.ndarray):
        return [_jsonable(v) for v in x.tolist()]
    if isinstance(x, np.generic):
        x = x.item()
    if isinstance(x, float) and not np.isfinite(x):
        return None  # NaN / inf are not JSON
    return x


def _weight_histogram(others: list[np.ndarray], kept: int) -> tuple[np.ndarray, np.ndarray]:
    """Distinct weights of the ``kept`` kept samples and their counts, ascending, from the kept
    weights other than 1.0 (``others``, gathered block by block). Nearly every kept weight is
    1.0, so only the others are sorted (a full np.unique sorts N values, and gathering every
    kept weight copies up to 4 bytes a sample)."""
    values, counts = np.unique(np.concatenate(others) if others else np.empty(0, np.float32), return_counts=True)
    ones = kept - int(counts.sum())
    if ones:
        at = int(np.searchsorted(values, np.float32(1.0)))
        values = np.insert(values, at, np.float32(1.0))
        counts = np.insert(counts, at, ones)
    return values, counts


def _count_codes(codes: np.ndarray, into: np.ndarray, scratch: np.ndarray) -> None:
    """Add each uint8 code's occurrences in ``codes`` to ``into`` (``scratch``: a bool buffer
    as long). A block holds few codes (a policy gives two to four reasons): one comparison pass
    per code between the block's smallest and largest, 0.007 s at 15M rows against 0.025 s for
    np.bincount, which widens every code to 8 bytes; np.bincount past 8 codes."""
    lo, hi = int(codes.min()), int(codes.max())
    if hi - lo >= 8:
        into[: hi + 1] += np.bincount(codes, minlength=hi + 1)
        return
    for v in range(lo, hi + 1):
        into[v] += np.count_nonzero(np.equal(codes, v, out=scratch))


def finalize(
    result: PolicyResult, inp: PolicyInput, name: str, params: Any, safeguards: Safeguards | None = None
) -> PolicyResult:
    """Apply the safeguards (§0.10) and the empty-plan guard (§0.7), and add the common summary
    fields."""
    guard = apply_guard(result, inp, safeguards)
    summarize(result, inp, name, params, guard, safeguards)
    return result


def apply_guard(result: PolicyResult, inp: PolicyInput, safeguards: Safeguards | None = None) -> bool:
    """The part of :func:`finalize` that changes the plan's rows: the floor on the kept count
    and the cap on the weights (``safeguards``, §0.10), the empty-plan guard (§0.7; returns
    whether it fired) and weight 0 for every sample not kept."""
    sg = safeguards or Safeguards()
    fill = None
    floor = sg.floor(inp.n)
    if floor:
        kept = int(np.count_nonzero(result.keep))
        if kept < floor:
            fill = fill_mask(result.keep, result.reason, inp.uid, inp.seed, inp.epoch, floor - kept)
    guard_rows = None
    if inp.n > 0 and not result.keep.any() and (fill is None or not fill.any()):
        # nothing kept and nothing the floor may fill (every row left out as suspected noise):
        # the guard, as plan_partitioned's loop does when its buckets keep no row
        u = uniforms(inp.uid, inp.seed, inp.epoch, STREAM_GUARD)
        guard_rows = smallest_mask(u, 1, inp.uid)  # smallest u, ties by uid
    _settle(result, guard_rows, fill, sg.cap())
    return guard_rows is not None


def _settle(
    result: PolicyResult,
    guard_rows: np.ndarray | None,
    fill_rows: np.ndarray | None = None,
    cap: np.float32 | None = None,
) -> None:
    """Keep the floor's rows (weight 1, reason ``floor_fill``) and the guard's row(s) (weight
    1, reason ``empty_plan_guard``), cap the kept weights at ``cap``, then weight 0 for every
    row not kept."""
    for rows, reason in ((fill_rows, "floor_fill"), (guard_rows, "empty_plan_guard")):
        if rows is not None:
            result.keep[rows] = True
            result.weight[rows] = 1.0
            result.reason[rows] = reason_code(reason)
    weight = np.asarray(result.weight, dtype=np.float32)
    if cap is not None:
        weight, result.capped = cap_weights(weight, result.keep, cap)
    result.weight = _zero_dropped(weight, np.asarray(result.keep, dtype=bool))


def _zero_dropped(weight: np.ndarray, keep: np.ndarray) -> np.ndarray:
    """``np.where(keep, weight, 0.0)`` (float32): ``weight`` itself (if writable) when every row
    not kept already has the bits of +0.0 (as the shipped policies leave them), checked block by block.
    Why: the new array is 60 MB of fresh memory at 15M rows, on the path to the published plan,
    and this VM pays for fresh memory page by page."""
    if not weight.flags.writeable:  # (a constant view, say): a new array, as before
        return np.where(keep, weight, np.float32(0.0))
    bits = weight.view(np.uint32)
    # one reused block buffer, two passes a block and no gather: "some bits set and not kept"
    # is (bits != 0) > keep for booleans (at 15M rows 0.007 s against 0.09 s for gathering
    # each block's dropped weights)
    stray = np.empty(min(len(keep), _COUNT_BLOCK_ROWS), dtype=bool)
    for lo in range(0, len(keep), _COUNT_BLOCK_ROWS):
        b = bits[lo : lo + _COUNT_BLOCK_ROWS]
        x = stray[: len(b)]
        np.not_equal(b, 0, out=x)
        np.greater(x, keep[lo : lo + _COUNT_BLOCK_ROWS], out=x)
        if np.count_nonzero(x):
            return np.where(keep, weight, np.float32(0.0))
    return weight


@dataclass
class SummaryCounts:
    """The counts behind a plan's common summary fields, for some rows (one bucket or all):
    merged by adding, so a partitioned plan's summary equals the whole table's."""

    n: int
    kept: int
    n_seen: int
    n_seen_finite: int
    weights: dict[float, int]  # float32 weight -> kept rows with it
    reasons: np.ndarray  # int64[2 * len(REASONS)]: rows per reason code, dropped (even) and kept (odd)
    capped: int = 0  # kept rows whose weight the cap lowered (§0.10)

    def __add__(self, other: SummaryCounts) -> SummaryCounts:
        weights = dict(self.weights)
        for w, c in other.weights.items():
            weights[w] = weights.get(w, 0) + c
        return SummaryCounts(
            self.n + other.n,
            self.kept + other.kept,
            self.n_seen + other.n_seen,
            self.n_seen_finite + other.n_seen_finite,
            weights,
            self.reasons + other.reasons,
            self.capped + other.capped,
        )


def summary_counts(result: PolicyResult, inp: PolicyInput) -> SummaryCounts:
    """The :class:`SummaryCounts` of ``inp``'s rows (reads ``result`` and ``inp`` only)."""
    keep = np.asarray(result.keep, dtype=bool)
    weight = np.asarray(result.weight)
    reason = np.asarray(result.reason, dtype=np.int8).view(np.uint8)
    seen, last = np.asarray(inp.seen), np.asarray(inp.last_loss)
    n = len(keep)
    # block by block, in reused buffers: no row-sized temporaries (each would be fresh memory,
    # which this VM pays for page by page, on the path to the published plan)
    size = min(n, _COUNT_BLOCK_ROWS)
    mask, other, code = np.empty(size, dtype=bool), np.empty(size, dtype=bool), np.empty(size, dtype=np.uint8)
    kept = n_seen = n_seen_finite = 0
    others: list[np.ndarray] = []
    reasons = np.zeros(2 * len(REASONS), dtype=np.int64)
    for lo in range(0, n, _COUNT_BLOCK_ROWS):
        hi = min(n, lo + _COUNT_BLOCK_ROWS)
        k, m, o, c = keep[lo:hi], mask[: hi - lo], other[: hi - lo], code[: hi - lo]
        kept += int(np.count_nonzero(k))
        np.greater(seen[lo:hi], 0, out=m)
        n_seen += int(np.count_nonzero(m))
        np.isfinite(last[lo:hi], out=o)
        m &= o
        n_seen_finite += int(np.count_nonzero(m))
        np.not_equal(weight[lo:hi], np.float32(1.0), out=o)
        o &= k
        if o.any():
            others.append(weight[lo:hi][o])
        # rows and kept rows per reason code in one count of 2 * reason + keep
        np.multiply(reason[lo:hi], np.uint8(2), out=c)
        c += k.view(np.uint8)
        _count_codes(c, reasons, o)
    values, counts = _weight_histogram(others, kept)
    weights = {float(v): int(c) for v, c in zip(values, counts)}
    return SummaryCounts(inp.n, kept, n_seen, n_seen_finite, weights, reasons, result.capped)


def summary_of(
    counts: SummaryCounts,
    policy_summary: dict[str, Any],
    inp: PolicyInput | PlanContext,
    name: str,
    params: Any,
    guard: bool,
    absent_rule: AbsentRule,
    safeguards: Safeguards | None = None,
) -> dict[str, Any]:
    """The plan summary from the counts of all rows and the policy's own fields (``inp``, an
    input or the plan's context, gives the epoch, epochs and seed), with the safeguards' fields
    and the plan's ``warnings`` (§0.10)."""
    sg = safeguards or Safeguards()
    n, kept = counts.n, counts.kept
    kept_reasons = counts.reasons[1::2]
    reasons = counts.reasons[0::2] + kept_reasons
    summary = {
        "policy": name,
        "params": {
            **(
                dataclasses.asdict(params)
                if dataclasses.is_dataclass(params) and not isinstance(params, type)
                else dict(params)
            ),
            **sg.to_params(),
        },
        "epoch": inp.epoch,
        "epochs": inp.epochs,
        "seed": inp.seed,
        "n": n,
        "kept": kept,
        "pruned_fraction": (1.0 - kept / n) if n else 0.0,
        "unseen": n - counts.n_seen_finite,
        "nonfinite": counts.n_seen - counts.n_seen_finite,
        "weight_histogram": {repr(v): c for v, c in sorted(counts.weights.items())},
        "empty_plan_guard": guard,
        "absent_rule": absent_rule.to_json(),
        "rows_by_reason": {REASONS[i]: int(c) for i, c in enumerate(reasons) if c},
        "kept_by_reason": {REASONS[i]: int(c) for i, c in enumerate(kept_reasons) if c},
    }
    if sg.active:
        summary["safeguards"] = {
            "min_keep_fraction": sg.min_keep_fraction,
            "max_weight": sg.max_weight,
            "floor": sg.floor(n),
            "filled": int(kept_reasons[reason_code("floor_fill")]),
            "capped": counts.capped,
        }
    out = {**summary, **policy_summary}
    out["warnings"] = plan_warnings(_jsonable(out))
    return _jsonable(out)


def summarize(
    result: PolicyResult, inp: PolicyInput, name: str, params: Any, guard: bool, safeguards: Safeguards | None = None
) -> None:
    """The part of :func:`finalize` that only reads the rows: the common summary fields, merged
    with the policy's own. Reads ``result`` and ``inp`` without changing them, so it can run
    while the plan is being written."""
    counts = summary_counts(result, inp)
    result.summary = summary_of(counts, result.summary, inp, name, params, guard, result.absent_rule, safeguards)


def policy_params(name: str, **params: Any) -> tuple[PolicySpec, Any]:
    """The policy ``name`` and its validated parameters (InvalidInputError naming what is wrong
    and how to set it). ``params`` may hold the safeguards every policy accepts
    (:data:`SAFEGUARD_PARAMS`): they are validated and left out; :func:`plan_params` returns
    them too."""
    spec, p, _ = plan_params(name, **params)
    return spec, p


def plan_params(name: str, **params: Any) -> tuple[PolicySpec, Any, Safeguards]:
    """The policy ``name``, its validated parameters and the :class:`Safeguards` among
    ``params`` (§0.10)."""
    spec = get_policy(name)
    known = {f.name for f in dataclasses.fields(spec.params_type)}
    own = {k: v for k, v in params.items() if k not in SAFEGUARD_PARAMS}
    unknown = set(own) - known
    fix = "set parameters with params={'name': value} (CLI: -p name=value); `seta-stream policies` lists them"
    if unknown:
        raise InvalidInputError(
            f"{name}: unknown parameter(s) {sorted(unknown)}; valid: {sorted(known) or 'none'}, and "
            f"{', '.join(SAFEGUARD_PARAMS)} for every policy; {fix}"
        )
    try:
        _, safeguards = split_params(params)
        return spec, spec.make_params(**own), safeguards
    except InvalidInputError as exc:
        what = str(exc) if str(exc).startswith(f"{name}: ") else f"{name}: {exc}"  # the safeguards name no policy
        raise InvalidInputError(f"{what}; {fix}") from None
    except TypeError as exc:  # a value of the wrong type compared in validation
        raise InvalidInputError(f"{name}: parameters {params} do not fit ({exc}); {fix}") from None


def run_policy(name: str, inp: PolicyInput, **params: Any) -> PolicyResult:
    """Validate ``params`` for policy ``name`` (its own and the safeguards, §0.10), run it and
    finalize the result."""
    spec, p, safeguards = plan_params(name, **params)
    return finalize(spec.fn(inp, p), inp, name, p, safeguards)


def check_run_settings(spec: PolicySpec, params: Any, run_settings: dict[str, Any], where: str) -> None:
    """Raise InvalidInputError if a run setting the policy declares (``spec.settings``) differs
    from its parameter; ``where`` names the run's settings file in the message."""
    for setting in spec.settings:
        asked, has = getattr(params, setting.param), run_settings.get(setting.name)
        if asked != has:
            raise InvalidInputError(
                f"{where}: {setting.governs} uses {setting.param}={has}, policy {spec.name} asks "
                f"{setting.param}={asked}; {setting.name} is fixed when the run is created. Create the run "
                f"with settings={{'{setting.name}': {asked}}} (Pruner does this for policy {spec.name}), or "
                f"pass the run's {setting.param}"
            )


def run_settings_for(
    name: str, params: dict[str, Any] | None, settings: dict[str, Any] | None
) -> dict[str, Any] | None:
    """``settings`` of a run to create for policy ``name``, completed with the run settings its
    parameters fix (a setting given wins). An unknown policy name changes nothing: planning
    reports it."""
    spec = POLICIES.get(name)
    missing = [s for s in spec.settings if not (settings or {}).get(s.name)] if spec else []
    if not missing:
        return settings
    p = spec.make_params(**(params or {}))
    return {**(settings or {}), **{s.name: getattr(p, s.param) for s in missing}}


def _guard_key(ctx: PlanContext) -> Any:
    def key_of(inp: PolicyInput) -> tuple[np.ndarray, np.ndarray, None, None]:
        return uniform_keys(inp.uid, ctx.seed, ctx.epoch, STREAM_GUARD), np.asarray(inp.uid, np.uint64), None, None

    return key_of


def _fill_key(ctx: PlanContext, decide: Any) -> Any:
    """The floor's keys (§0.10): the uniforms of stream 9 of the rows it may fill (:func:`fillable`:
    not kept by the policy, not suspected noise; ``result``: the policy's rows of this bucket,
    None: decided again here)."""

    def key_of(inp: PolicyInput, result: PolicyResult | None = None) -> tuple[np.ndarray, np.ndarray, None, np.ndarray]:
        if result is None:
            result = decide.rows(inp)
        uid = np.asarray(inp.uid, np.uint64)
        return uniform_keys(uid, ctx.seed, ctx.epoch, STREAM_FLOOR), uid, None, fillable(result.keep, result.reason)

    return key_of


def _kept(decide: Any) -> Any:
    """Steps counting the rows the policy keeps over every bucket."""
    return (yield total(lambda inp: int(np.count_nonzero(decide.rows(inp).keep))))


def _fillable(decide: Any) -> Any:
    """Steps counting the rows the floor may add (:func:`fillable`) over every bucket."""

    def count(inp: PolicyInput) -> int:
        result = decide.rows(inp)
        return int(np.count_nonzero(fillable(result.keep, result.reason)))

    return (yield total(count))


def _bucket_rows(
    decide: Any,
    inp: PolicyInput,
    guard: Cut | None,
    key_of: Any,
    fill: Cut | None = None,
    fill_key_of: Any = None,
    cap: np.float32 | None = None,
) -> PolicyResult:
    """One bucket's rows: the policy's decisions, the floor's rows and the guard's row if they
    are here, weights capped, weight 0 where not kept (as :func:`apply_guard` does for a whole
    table)."""
    result = decide.rows(inp)
    fill_rows = None if fill is None else fill.mask(*fill_key_of(inp, result))
    _settle(result, None if guard is None else guard.mask(*key_of(inp)), fill_rows, cap)
    return result


class _BucketRows:
    """Bucket b's rows, handed to ``emit`` where they are decided, and its summary counts
    (picklable, for a Ray engine: only what ``emit`` returns and the counts travel back)."""

    def __init__(
        self,
        decide: Any,
        inputs: Any,
        guard: Cut | None,
        key_of: Any,
        emit: Any,
        fill: Cut | None = None,
        fill_key_of: Any = None,
        cap: np.float32 | None = None,
    ) -> None:
        self.decide, self.inputs, self.guard, self.key_of, self.emit = decide, inputs, guard, key_of, emit
        self.fill, self.fill_key_of, self.cap = fill, fill_key_of, cap

    def __call__(self, b: int) -> tuple[Any, SummaryCounts]:
        inp = self.inputs(b)
        result = _bucket_rows(self.decide, inp, self.guard, self.key_of, self.fill, self.fill_key_of, self.cap)
        return self.emit(b, inp, result), summary_counts(result, inp)


def plan_partitioned(
    spec: PolicySpec,
    params: Any,
    ctx: PlanContext,
    inputs: Any,
    buckets: int,
    emit: Any,
    restart: Any,
    engine: Any = None,
    received: Any = None,
    row_inputs: Any = None,
    safeguards: Safeguards | None = None,
) -> dict[str, Any]:
    """Plan ``buckets`` buckets (``inputs(b)``: bucket b's :class:`PolicyInput` for the steps;
    ``row_inputs(b)``, default ``inputs``: its input for the pass that decides its rows, with
    every column the plan files and the summary read) with the policy's steps.
    ``emit(b, inp, result)`` receives each bucket's rows where they are decided:
    in this process, in bucket order, or with an ``engine`` where it runs bucket b's map (a
    Ray task, then ``emit`` must be picklable and writes the rows wherever they go; a thread of
    ``ThreadEngine``, then buckets are emitted several at a time); ``received(b, value)``,
    if given, gets here, in bucket order, what ``emit`` returned. If no row is kept anywhere,
    the empty-plan guard keeps the row of smallest guard uniform (ties by uid) exactly as
    :func:`finalize` would: ``restart()`` is called and every bucket is emitted again. Returns
    the summary, equal to :func:`finalize`'s on the whole table.

    ``safeguards`` (§0.10): with a floor, the rows the policy keeps are counted first; if they
    are fewer than the floor, the dropped rows of smallest stream-9 uniform (ties by uid) that
    fill up to it are found over all buckets (the m smallest keys, as for the guard) before any
    bucket is emitted. The cap applies row by row."""
    if spec.steps is None:
        raise InvalidInputError(
            f"policy {spec.name!r} has no partitioned form (PolicySpec.steps), so it cannot plan a run "
            "with several buckets; use a run with buckets=1"
        )
    sg = safeguards or Safeguards()
    decide = run_steps(spec.steps(ctx, params), inputs, buckets, engine)
    key_of = _guard_key(ctx)
    guard: Cut | None = None
    fill: Cut | None = None
    fill_key_of = _fill_key(ctx, decide)
    floor = sg.floor(ctx.n)
    if floor:
        kept = run_steps(_kept(decide), inputs, buckets, engine)
        if kept < floor:
            candidates = run_steps(_fillable(decide), inputs, buckets, engine)
            fill = run_steps(smallest(fill_key_of, floor - kept, candidates), inputs, buckets, engine)
    while True:
        counts: SummaryCounts | None = None
        rows = _BucketRows(decide, row_inputs or inputs, guard, key_of, emit, fill, fill_key_of, sg.cap())
        done = engine.map(rows, range(buckets)) if engine is not None else (rows(b) for b in range(buckets))
        for b, (value, piece) in enumerate(done):
            counts = piece if counts is None else counts + piece
            if received is not None:
                received(b, value)
        assert counts is not None
        if guard is not None or counts.n == 0 or counts.kept > 0:
            break
        guard = run_steps(smallest(key_of, 1, counts.n), inputs, buckets, engine)
        restart()
    return summary_of(counts, decide.summary, ctx, spec.name, params, guard is not None, decide.absent_rule, sg)
