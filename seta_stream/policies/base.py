"""The policy contract: table columns + epoch + parameters + seed in, keep mask and weights out.

A policy is a pure function ``fn(inp: PolicyInput, params) -> PolicyResult``; ``params`` is a
frozen dataclass validated in ``__post_init__``. No I/O, no globals, no process-wide RNG:
every random draw comes from the per-sample uniforms of ``seta_stream.policies.random_draws``
(docs/algorithms.md §0.4). Everything with side effects (reading the table, writing the plan)
is in ``seta_stream._planning``.

A policy declares what it needs on its :class:`PolicySpec`: the loss-table columns it reads
(``columns``) and the run settings its parameters must agree with (``settings``). The planner
reads exactly those columns (plus :data:`PLAN_COLUMNS`) and checks those settings, so it never
names a policy.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from .._kernels.arrays import gather_rows, is_broadcast
from ..errors import InvalidInputError

__all__ = [
    "PolicyInput",
    "PolicyResult",
    "AbsentRule",
    "PolicySpec",
    "RunSetting",
    "REASONS",
    "INPUT_COLUMNS",
    "PLAN_COLUMNS",
    "reason_code",
    "reason_codes",
]

#: The loss-table columns a :class:`PolicyInput` carries (docs/format.md, loss table).
INPUT_COLUMNS: tuple[str, ...] = ("uid", "last_loss", "ema", "seen", "last_epoch", "loss_count", "loss_mean")
#: Columns every plan reads, whatever its policy: ``uid`` (identity), ``last_loss`` (the
#: plan's ``loss`` column) and ``seen`` (the summary's ``unseen`` and ``nonfinite`` counts).
PLAN_COLUMNS: tuple[str, ...] = ("uid", "last_loss", "seen")

#: Every reason a plan row can carry (stored as a dictionary column in plan.parquet).
REASONS: tuple[str, ...] = (
    "all",  # full policy / warm-up / nothing to prune
    "kept",  # generic keep (random subsets)
    "dropped",  # generic drop (random subsets)
    "unseen",  # kept because never seen (score-based steps skip unseen samples)
    "no_window",  # SeTa epoch 0 or no seen sample: every cluster kept
    "window",  # SeTa: inside the sliding window
    "outside_window",  # SeTa: outside the window
    "downsampled_out",  # SeTa/random: removed by the uniform down-sampling
    "anneal",  # annealing epoch keep
    "anneal_dropped",  # annealing epoch drop (SeTa partial annealing)
    "above_mean",  # InfoBatch: score >= mean, kept
    "below_mean_drawn",  # InfoBatch: below mean, drawn, rescaled
    "below_mean_pruned",  # InfoBatch: below mean, pruned
    "drawn",  # ESWP: in the weighted draw
    "not_drawn",  # ESWP: outside the weighted draw
    "empty_plan_guard",  # the single sample kept by the empty-plan guard
    "suspected_noise",  # noise rule: left out as suspected noise (§12)
    "noise_recheck",  # noise rule: a suspect kept (weight 0) so that its loss is measured again (§12)
    "floor_fill",  # kept by the floor on an epoch's kept count (min_keep_fraction, §0.10)
)


def reason_code(name: str) -> int:
    """Index of a reason name in :data:`REASONS` (raises KeyError-like ValueError if unknown)."""
    return REASONS.index(name)


def reason_codes(mask: np.ndarray, yes: str, no: str) -> np.ndarray:
    """int8 reason codes: ``yes``'s where ``mask`` (bool) is true, else ``no``'s.

    Arithmetic on the mask's bytes (no + mask x (yes - no)), which gives np.where's codes: at
    15M rows 0.002 s against 0.05 s for np.where, on the path to a published plan."""
    a, b = reason_code(yes), reason_code(no)
    out = np.multiply(np.asarray(mask, dtype=bool).view(np.int8), np.int8(a - b))
    out += np.int8(b)
    return out


@dataclass(frozen=True)
class PolicyInput:
    """Columns of the loss table (one row per known sample) plus the planning context.

    Row order is irrelevant to every policy (docs/algorithms.md §0.4). ``last_epoch`` is read
    by no built-in policy: the planner passes it (else None) only to a policy that declares it
    among its columns. ``loss_count`` and ``loss_mean`` (the loss history the noise rule reads,
    §12) default to no history: 0 finite records, mean NaN.
    """

    uid: np.ndarray  # uint64[N]
    last_loss: np.ndarray  # float32[N], NaN = never recorded / non-finite
    ema: np.ndarray  # float64[N], NaN = never recorded
    seen: np.ndarray  # int32[N]
    last_epoch: np.ndarray | None  # int32[N], -1 = never; None = not read
    epoch: int  # e, 0-based epoch being planned
    epochs: int  # E, total epochs of the run
    seed: int  # run seed (uint64)
    n_ref: int = 0  # n for the ES start score 1/n (0: use N)
    #: Arrays a partitioned plan derives from these rows once and reuses in its later passes
    #: (``policies.steps.memo``); None: derive them each time.
    memo: dict[str, Any] | None = field(default=None, compare=False, repr=False)
    loss_count: np.ndarray | None = None  # int32[N], finite records folded (None: 0 for every row)
    #: float64[N], their mean (None: NaN for every row); float32 when the planner reads it for the
    #: noise rule alone, which reads only float32(loss_mean) (``noise.noise_narrow_reads``)
    loss_mean: np.ndarray | None = None

    def __post_init__(self) -> None:
        n = len(self.uid)
        if self.loss_count is None:
            object.__setattr__(self, "loss_count", _constant(n, 0, np.int32))
        if self.loss_mean is None:
            object.__setattr__(self, "loss_mean", _constant(n, np.nan, np.float64))
        for name in ("last_loss", "ema", "seen", "last_epoch", "loss_count", "loss_mean"):
            if getattr(self, name) is not None and len(getattr(self, name)) != n:
                raise InvalidInputError(f"PolicyInput.{name} has {len(getattr(self, name))} rows, uid has {n}")
        if self.epochs < 1:
            raise InvalidInputError(f"epochs must be >= 1, got {self.epochs}")
        if not 0 <= self.epoch < self.epochs:
            raise InvalidInputError(f"epoch must be in [0, epochs={self.epochs}), got {self.epoch}")

    @property
    def n(self) -> int:
        return len(self.uid)

    def take(self, rows: np.ndarray, memo: Any = None) -> PolicyInput:
        """The input of the rows ``rows`` (ascending indices, or a bool mask over the rows) alone,
        with the same context and the given ``memo``; a constant column (not read) stays a
        constant."""
        count = int(np.count_nonzero(rows)) if rows.dtype == bool else len(rows)
        names = ("uid", "last_loss", "ema", "seen", "last_epoch", "loss_count", "loss_mean")
        columns: dict[str, np.ndarray | None] = {name: getattr(self, name) for name in names}
        taken = {}
        for name, a in columns.items():
            if a is not None and is_broadcast(a) and len(a):  # a constant stays one
                taken[name] = np.broadcast_to(a[:1], (count,))
        rest = [name for name, a in columns.items() if a is not None and name not in taken]
        if rows.dtype == bool:  # the mask's indices found once for every column
            taken.update(zip(rest, gather_rows([np.asarray(columns[c]) for c in rest], rows, count)))
        else:
            taken.update((c, np.asarray(columns[c])[rows]) for c in rest)
        return PolicyInput(
            uid=taken["uid"],
            last_loss=taken["last_loss"],
            ema=taken["ema"],
            seen=taken["seen"],
            last_epoch=taken.get("last_epoch"),
            epoch=self.epoch,
            epochs=self.epochs,
            seed=self.seed,
            n_ref=self.n_ref,
            memo=memo,
            loss_count=taken.get("loss_count"),
            loss_mean=taken.get("loss_mean"),
        )

    @classmethod
    def from_losses(
        cls, uid: np.ndarray, last_loss: np.ndarray, *, epoch: int, epochs: int, seed: int = 0
    ) -> PolicyInput:
        """Convenience for tests and notebooks: seen iff the loss is finite."""
        last_loss = np.asarray(last_loss, dtype=np.float32)
        finite = np.isfinite(last_loss)
        return cls(
            uid=np.asarray(uid, dtype=np.uint64),
            last_loss=last_loss,
            ema=np.where(finite, last_loss.astype(np.float64), np.nan),
            seen=finite.astype(np.int32),
            last_epoch=np.where(finite, max(epoch - 1, 0), -1).astype(np.int32),
            epoch=epoch,
            epochs=epochs,
            seed=seed,
        )

    @classmethod
    def from_columns(
        cls,
        columns: Mapping[str, np.ndarray],
        *,
        epoch: int,
        epochs: int,
        seed: int,
        n_ref: int = 0,
        memo: dict[str, Any] | None = None,
    ) -> PolicyInput:
        """The input of a policy from the table columns it declared (``uid`` is required).

        A column not given is a read-only constant that allocates nothing: ``last_loss``,
        ``ema`` and ``loss_mean`` NaN, ``seen`` and ``loss_count`` 0 (never recorded);
        ``last_epoch`` is None."""
        unknown = set(columns) - set(INPUT_COLUMNS)
        if unknown:
            raise InvalidInputError(
                f"PolicyInput has no column(s) {sorted(unknown)}; a policy may read {list(INPUT_COLUMNS)}"
            )
        uid = columns["uid"]
        n = len(uid)
        return cls(
            uid=uid,
            last_loss=columns["last_loss"] if "last_loss" in columns else _constant(n, np.nan, np.float32),
            ema=columns["ema"] if "ema" in columns else _constant(n, np.nan, np.float64),
            seen=columns["seen"] if "seen" in columns else _constant(n, 0, np.int32),
            last_epoch=columns.get("last_epoch"),
            epoch=epoch,
            epochs=epochs,
            seed=seed,
            n_ref=n_ref,
            memo=memo,
            loss_count=columns.get("loss_count"),
            loss_mean=columns.get("loss_mean"),
        )


def _constant(n: int, value: float | int, dtype: Any) -> np.ndarray:
    """A column nobody reads, as a read-only constant view (no memory)."""
    return np.broadcast_to(np.array(value, dtype=dtype), (n,))


@dataclass(frozen=True)
class AbsentRule:
    """What the stage does with a sample that is not in the plan (new data, or no listing).

    ``keep``: keep it with weight 1 (architecture contract). ``bernoulli``: keep it iff its
    uniform u_i of ``stream`` for this epoch is < ``fraction`` (score-free policies, §0.2).
    """

    kind: Literal["keep", "bernoulli"] = "keep"
    fraction: float = 1.0
    stream: int = 1
    epoch: int | None = None  # epoch of the uniform; None = the planned epoch

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "fraction": self.fraction, "stream": self.stream, "epoch": self.epoch}


@dataclass
class PolicyResult:
    """Output of a policy for N samples.

    ``summary`` holds the policy-specific fields (docs/algorithms.md names them per policy) plus
    ``phase``; the common fields (n, kept, pruned_fraction, unseen, nonfinite,
    weight_histogram, empty_plan_guard) are added by :func:`seta_stream.policies.finalize`.
    """

    keep: np.ndarray  # bool[N]
    weight: np.ndarray  # float32[N]; 0.0 where not kept
    reason: np.ndarray  # int8[N], codes into REASONS
    summary: dict[str, Any]
    cluster: np.ndarray | None = None  # int16[N], -1 = not clustered
    score: np.ndarray | None = None  # float64[N] (ES/ESWP)
    absent_rule: AbsentRule = field(default_factory=AbsentRule)
    #: kept rows whose weight the cap (``max_weight``, §0.10) lowered; set by ``finalize``
    capped: int = 0


@dataclass(frozen=True)
class RunSetting:
    """A run setting (fixed when the run is created, stored in seta-stream.json) that must equal
    a parameter of the policy, e.g. ES's ``beta2`` is the loss table's ``ema_beta2``."""

    name: str  # the run setting, e.g. "ema_beta2"
    param: str  # the field of the params dataclass, e.g. "beta2"
    governs: str  # what the setting governs, for messages, e.g. "the loss table's EMA"


def _every_column(params: Any) -> frozenset[str]:
    return frozenset(INPUT_COLUMNS)


@dataclass(frozen=True)
class PolicySpec:
    """A registered policy: name, parameter dataclass, pure function, one-line description,
    and what it needs from the run.

    ``columns(params)``: the :data:`INPUT_COLUMNS` the function reads with these parameters
    (default: all of them; a column not declared reaches the policy as a constant, see
    :meth:`PolicyInput.from_columns`). The function and ``Decide.rows`` also get
    :data:`PLAN_COLUMNS`; the maps of the steps get the declared columns and ``uid`` only.
    ``settings``: the run settings its parameters must
    agree with; the planner refuses a mismatch and ``Pruner`` creates a new run with them.
    ``steps``: the same policy over a partitioned table (:mod:`seta_stream.policies.steps`),
    bit for bit the plan of ``fn``; a policy without it plans one-bucket runs only. ``noise``:
    the policy admits the noise rule's stage (the registry puts it in front of ``fn`` and
    ``steps``; the policy itself knows nothing of it).
    """

    name: str
    params_type: type
    fn: Callable[[PolicyInput, Any], PolicyResult]
    description: str
    columns: Callable[[Any], Iterable[str]] = _every_column
    settings: tuple[RunSetting, ...] = ()
    #: The policy as map/reduce rounds over buckets (``policies.steps``): ``steps(ctx, params)``
    #: is a generator of Steps returning a Decide; plans of a partitioned run need it.
    steps: Callable[[Any, Any], Any] | None = None
    #: Whether the noise rule's stage (``policies.noise``) may run in front of the policy: its
    #: parameters (``noise=True``...) are then accepted with the policy's own.
    noise: bool = False

    def make_params(self, **kwargs: Any) -> Any:
        return self.params_type(**kwargs)

    def table_columns(self, params: Any, declared: Iterable[str] | None = None) -> list[str]:
        """The loss-table columns a plan of this policy reads: :data:`PLAN_COLUMNS` and the
        declared ones (``declared``: instead of the policy's own, those of the stages in front
        of it too), in :data:`INPUT_COLUMNS` order."""
        declared = set(self.columns(params) if declared is None else declared)
        unknown = declared - set(INPUT_COLUMNS)
        if unknown:
            raise InvalidInputError(
                f"policy {self.name!r} declares column(s) {sorted(unknown)}; a policy may read {list(INPUT_COLUMNS)}"
            )
        wanted = declared | set(PLAN_COLUMNS)
        return [c for c in INPUT_COLUMNS if c in wanted]

    def run_settings(self, params: Any) -> dict[str, Any]:
        """The values of the run settings these parameters require (``{}`` for most policies)."""
        return {s.name: getattr(params, s.param) for s in self.settings}
