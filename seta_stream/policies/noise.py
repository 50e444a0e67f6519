"""The noise rule: a plan stage that leaves out the samples whose loss history says
"mislabelled or mismatched" (docs/algorithms.md §12), before the policy prunes the rest.

The stage has its own parameters (:class:`NoiseParams`: ``noise``, ``noise_rule``,
``noise_warmup``, ``noise_recheck``, ``noise_scale``, ``noise_posterior``), given with a policy's
as the safeguards' are and split from them by :func:`split_noise`; the registry applies it to
every policy whose :class:`~.base.PolicySpec` admits it (``noise=True``: ``full``, ``random``,
``seta``, ``infobatch``). Planning reads as one chain: population merge, this stage, the
policy, the safeguards, the summary. In every epoch, with ``noise=True``:

1. candidates C: samples with ``seen > 0``, a finite ``last_loss`` and at least
   ``noise_warmup`` finite records (``loss_count``); their history score is
   x_i = float32(``loss_mean``_i), the mean of every finite loss recorded for them, or with
   ``noise_scale="log1p"`` float32(log1p(x_i)) (the mixture is fitted on that scale, and the
   last loss is compared on it too);
2. the two-component Gaussian mixture of the scores of C (``_kernels.mixture1d``: EM from the
   exact 2-means split of kmeans1d's points); the rule is active iff Ashman's D >= 2 and it has
   a threshold t: rule 1, where the components cross between their means; rule 2 (the
   default), where the upper component's posterior reaches ``noise_posterior`` (0.9) between
   the means, and, while the rule stays active from one plan to the next, never below the
   previous plan's threshold (its ``floor``);
3. suspects: candidates with x_i > t and ``last_loss``_i > t (the history says high, and so does
   the latest measurement: a suspect whose new loss falls below t is released);
4. re-check: the floor(``noise_recheck`` x |suspects|) suspects of smallest uniform of stream 8
   (fresh every epoch) are kept with weight 0 (reason ``noise_recheck``): their loss is
   measured again without being learnt from; the other suspects are left out
   (``suspected_noise``);
5. the policy plans the other rows exactly as it plans a table without the suspects (its
   clusters, mean and counts are those of the non-suspects).

:func:`with_noise` and :func:`with_noise_steps` put the stage in front of a policy's function
and of its steps (the same numbers over buckets: the points of the scores by
``points1d_steps``, the suspect count and the re-check cut exactly), so partitioned plans are
bit for bit the whole-table plan; :func:`noise_columns` and :func:`noise_narrow_reads` declare
the table columns the stage reads. With ``noise=False`` each is the policy's own.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Generator, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from .._kernels.arrays import scatter_rows
from .._kernels.kmeans1d import points1d, points1d_steps
from .._kernels.mapreduce import Cut, Step, smallest, total
from .._kernels.mixture1d import Mixture, fit_two_gaussians, posterior_threshold
from ..errors import InvalidInputError
from .base import PolicyInput, PolicyResult, reason_code
from .random_draws import STREAM_NOISE, keep_count, uniform_subset, uniforms
from .steps import Decide, PlanContext, memo, uniform_keys

__all__ = [
    "NOISE_COLUMNS",
    "NOISE_DEFAULTS",
    "NOISE_PARAMS",
    "NOISE_RULE",
    "NOISE_RULES",
    "NOISE_SCALES",
    "NoiseFit",
    "NoiseParams",
    "split_noise",
    "versioned_params",
    "previous_threshold",
    "candidate_scores",
    "candidate_mask",
    "noise_fit",
    "on_scale",
    "with_noise",
    "with_noise_steps",
    "noise_columns",
    "noise_narrow_reads",
]

#: The table columns the rule reads.
NOISE_COLUMNS = frozenset({"uid", "seen", "last_loss", "loss_count", "loss_mean"})
#: The rule's versions (§12.12): 1, its threshold where the fitted components cross; 2, where
#: the noise mode's posterior reaches ``noise_posterior``, never below the previous plan's
#: threshold while the rule stays active.
NOISE_RULES = (1, 2)
#: The version a run gets when its first plan does not name one.
NOISE_RULE = 2
#: Rule 2's default ``noise_posterior``: a sample is suspected only where the fitted mixture
#: gives the noise mode at least 9 to 1 odds over the clean one (§12.12).
DEFAULT_POSTERIOR = 0.9
#: Default warm-up (finite records a sample needs before it can be suspected) and re-check share.
NOISE_DEFAULTS = {"noise": False, "noise_warmup": 2, "noise_recheck": 0.1, "noise_scale": "loss"}
#: The scales the mixture can be fitted on (§12.2): the loss itself, or log1p of it.
NOISE_SCALES = ("loss", "log1p")


@dataclass(frozen=True)
class NoiseParams:
    """The stage's parameters (§12.7). ``noise_rule`` None: the current version
    (:data:`NOISE_RULE`); ``noise_posterior`` None: rule 2's default (rule 1 has none)."""

    noise: bool = False
    noise_rule: int | None = None
    noise_warmup: int = 2
    noise_recheck: float = 0.1
    noise_scale: str = "loss"
    noise_posterior: float | None = None

    def __post_init__(self) -> None:
        if self.noise_rule is None:
            object.__setattr__(self, "noise_rule", NOISE_RULE)
        if self.noise_posterior is None and self.noise_rule == 2:
            object.__setattr__(self, "noise_posterior", DEFAULT_POSTERIOR)

    def check(self, name: str) -> None:
        """Validate the parameters (InvalidInputError naming ``name``, the policy)."""
        if not isinstance(self.noise, (bool, np.bool_)):
            raise InvalidInputError(f"{name}: noise={self.noise!r}, expected True or False")
        rule = self.noise_rule
        if isinstance(rule, bool) or rule not in NOISE_RULES:
            raise InvalidInputError(f"{name}: noise_rule={rule!r}, expected one of {', '.join(map(str, NOISE_RULES))}")
        w = self.noise_warmup
        if isinstance(w, bool) or not isinstance(w, (int, np.integer)) or w < 1:
            raise InvalidInputError(f"{name}: noise_warmup={w!r} is outside the valid range: integer >= 1")
        if not 0 <= self.noise_recheck <= 1:
            raise InvalidInputError(
                f"{name}: noise_recheck={self.noise_recheck} is outside the valid range 0 <= noise_recheck <= 1"
            )
        if self.noise_scale not in NOISE_SCALES:
            raise InvalidInputError(
                f"{name}: noise_scale={self.noise_scale!r}, expected one of {', '.join(map(repr, NOISE_SCALES))}"
            )
        q = self.noise_posterior
        if rule == 1 and q is not None:
            raise InvalidInputError(
                f"{name}: noise_posterior={q!r} with noise_rule=1, whose threshold is where the components cross; "
                "leave noise_posterior out, or use noise_rule=2"
            )
        if rule == 2 and not (isinstance(q, (int, float)) and not isinstance(q, bool) and 0.5 <= q < 1):
            raise InvalidInputError(
                f"{name}: noise_posterior={q!r} is outside the valid range 0.5 <= noise_posterior < 1"
            )

    def to_params(self) -> dict[str, Any]:
        """The parameters as a plan summary lists them (§12.5): the four of rule 1 always, and
        ``noise_rule`` and ``noise_posterior`` where the rule is on and of version 2 (a plan
        made by rule 1 lists what it always listed)."""
        out = {k: getattr(self, k) for k in ("noise", "noise_warmup", "noise_recheck", "noise_scale")}
        if self.noise and self.noise_rule != 1:
            out.update(noise_rule=self.noise_rule, noise_posterior=self.noise_posterior)
        return out


#: The names of the stage's parameters, given with a policy's.
NOISE_PARAMS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(NoiseParams))


def split_noise(name: str, params: Mapping[str, Any]) -> tuple[dict[str, Any], NoiseParams]:
    """(the other parameters, the stage's :class:`NoiseParams`) of ``params``, validated."""
    own = {k: v for k, v in params.items() if k not in NOISE_PARAMS}
    try:
        noise = NoiseParams(**{k: v for k, v in params.items() if k in NOISE_PARAMS})
    except TypeError as exc:  # a value of the wrong type compared in __post_init__
        raise InvalidInputError(f"{name}: noise parameters do not fit ({exc})") from None
    noise.check(name)
    return own, noise


def versioned_params(given: Mapping[str, Any] | None, stored: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """``given`` parameters completed with the rule's version (§12.12), so that a run keeps the
    version its first plan with the rule on fixed: with ``noise`` on and no ``noise_rule``, the
    run's stored one; a run planned with the rule before versions were stored (its stored
    parameters have ``noise`` on and name no version) has rule 1; a new run, or one whose stored
    parameters have the rule off (it has fixed no version), gets :data:`NOISE_RULE`. None stays
    None (the run's own)."""
    if given is None or not given.get("noise") or "noise_rule" in given:
        return None if given is None else dict(given)
    if stored is None or not stored.get("noise"):
        return {**given, "noise_rule": NOISE_RULE}
    return {**given, "noise_rule": stored.get("noise_rule", 1)}


def previous_threshold(summary: Mapping[str, Any] | None, noise: NoiseParams) -> float | None:
    """Rule 2's floor (§12.12): the threshold of the previous epoch's plan ``summary`` where it
    was made by rule 2 on the same scale and the rule was active there; else None."""
    if summary is None or not noise.noise or noise.noise_rule != 2:
        return None
    params = summary.get("params") or {}
    if params.get("noise_rule") != 2 or not summary.get("noise_active"):
        return None
    if summary.get("noise_scale", "loss") != noise.noise_scale:
        return None
    t = summary.get("noise_threshold")
    return None if t is None else float(t)


def on_scale(values: np.ndarray, scale: str) -> np.ndarray:
    """float64 ``values`` on the rule's scale (§12.2): themselves, or log1p of them (NumPy's
    ``log1p``; a loss below -1 has no log1p and becomes NaN, which is never above a threshold)."""
    v = np.asarray(values, dtype=np.float64)
    if scale == "loss":
        return v
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.log1p(v)


def candidate_scores(inp: PolicyInput, warmup: int, scale: str = "loss") -> tuple[np.ndarray, np.ndarray]:
    """(candidate mask, their history scores in row order) (§12.2): x = float32(loss_mean), on
    the ``log1p`` scale float32(log1p(float64(x))).

    Block by block (:data:`_BLOCK` rows): the temporaries are a block's, and the scores array
    is touched only as far as the candidates go (at 15M rows, about 300 MB of temporaries and
    page faults less than whole-column expressions)."""
    cand, x = _candidates(inp, warmup, scale, with_scores=True)
    assert x is not None
    return cand, x


def candidate_mask(inp: PolicyInput, warmup: int, scale: str = "loss") -> np.ndarray:
    """The candidate mask of :func:`candidate_scores` alone, without gathering the scores (what
    a partitioned plan's suspects pass needs, the scores of its buckets being kept apart)."""
    return _candidates(inp, warmup, scale, with_scores=False)[0]


def _candidates(inp: PolicyInput, warmup: int, scale: str, with_scores: bool) -> tuple[np.ndarray, np.ndarray | None]:
    """(candidate mask, their scores in row order, or None without ``with_scores``)."""
    n = inp.n
    seen, last, count, mean = (np.asarray(a) for a in (inp.seen, inp.last_loss, inp.loss_count, inp.loss_mean))
    cand = np.empty(n, dtype=bool)
    # an upper bound: the pages past the candidates are never touched
    x = np.empty(n, dtype=np.float32) if with_scores else None
    k = 0
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        for lo in range(0, n, _BLOCK):
            hi = min(n, lo + _BLOCK)
            c = cand[lo:hi]
            np.greater(seen[lo:hi], 0, out=c)
            c &= np.isfinite(last[lo:hi])
            c &= count[lo:hi] >= warmup
            xb = mean[lo:hi].astype(np.float32)  # a mean beyond float32's range becomes inf: not a candidate
            c &= np.isfinite(xb)
            if scale != "loss":
                xb = on_scale(xb[c], scale).astype(np.float32)
                finite = np.isfinite(xb)  # a mean below -1 has no log1p: not a candidate
                c[np.flatnonzero(c)[~finite]] = False
                xb = xb[finite]
            elif x is not None:
                xb = xb[c]
            if x is not None:
                x[k : k + len(xb)] = xb
                k += len(xb)
    return cand, None if x is None else x[:k]


#: Rows per block of the rule's row-wise passes.
_BLOCK = 1 << 20


@dataclass(frozen=True)
class NoiseFit:
    """The rule's global part: candidates, the mixture of their scores, the threshold.

    ``posterior``: rule 2's ``noise_posterior`` (None: rule 1, the threshold where the
    components cross); ``floor``: rule 2's previous threshold, below which the threshold does
    not fall (:func:`previous_threshold`)."""

    candidates: int
    mixture: Mixture | None
    scale: str = "loss"
    posterior: float | None = None
    floor: float | None = None

    @property
    def two_modes(self) -> bool:
        """Ashman's D >= 2 and a crossing, not an upper majority on the log1p scale."""
        return self.mixture is not None and self.mixture.two_modes and not self.upper_majority

    @property
    def fit_threshold(self) -> float | None:
        """The mixture's own threshold where the test passes (before the floor): the crossing
        (rule 1), the point of posterior ``posterior`` (rule 2, None if none)."""
        m = self.mixture
        if m is None or not self.two_modes:
            return None
        return m.threshold if self.posterior is None else posterior_threshold(m, self.posterior)

    @property
    def active(self) -> bool:
        return self.fit_threshold is not None

    @property
    def upper_majority(self) -> bool:
        """On the log1p scale, two modes whose upper component holds at least half the
        candidates (§12.11): the early losses' lower tail split off, not a noisy minority; the
        rule suspects nothing then. (On the loss scale the test is as measured, without it.)"""
        m = self.mixture
        return self.scale == "log1p" and m is not None and m.two_modes and m.weight[1] >= 0.5

    @property
    def threshold(self) -> float | None:
        t = self.fit_threshold
        if t is None or self.floor is None:
            return t
        return max(t, self.floor)

    def suspects(
        self, inp: PolicyInput, warmup: int, scores: tuple[np.ndarray, np.ndarray] | None = None
    ) -> np.ndarray:
        """Bool mask of the suspects among ``inp``'s rows (none when not active): candidates
        whose score and last loss are both above the threshold, compared in float64.
        ``scores``: :func:`candidate_scores` of ``inp``, if already computed."""
        t = self.threshold
        if t is None:
            return np.zeros(inp.n, dtype=bool)
        cand = candidate_mask(inp, warmup, self.scale) if scores is None else scores[0]
        return _both_above(cand, np.asarray(inp.loss_mean), np.asarray(inp.last_loss), t, self.scale)

    @property
    def test(self) -> str:
        """``noise_test`` (§12.5)."""
        if self.mixture is None:
            return "too_few"
        if self.active:
            return "two_modes"
        if self.upper_majority:
            return "upper_majority"
        return "low_posterior" if self.two_modes else "one_mode"

    def summary(self, suspected: int, rechecked: int) -> dict[str, Any]:
        m = self.mixture
        out = {
            "noise_active": self.active,
            "noise_test": self.test,
            "noise_scale": self.scale,
            "noise_candidates": self.candidates,
            "noise_suspected": suspected,
            "noise_rechecked": rechecked,
            "noise_threshold": self.threshold,
            "noise_separation": None if m is None else m.separation,
            "noise_components": None
            if m is None
            else {"weight": list(m.weight), "mean": list(m.mean), "sd": list(m.sd), "iterations": m.iterations},
        }
        if self.posterior is not None:  # rule 2: the fit's own threshold and the floor it was held to
            out.update(noise_fit_threshold=self.fit_threshold, noise_floor=self.floor)
        return out


def _both_above(cand: np.ndarray, mean: np.ndarray, last: np.ndarray, t: float, scale: str) -> np.ndarray:
    """Bool mask of the rows of ``cand`` whose score and last loss are both above ``t`` on the
    rule's scale, compared in float64 (the suspects, §12.4): the score float32(``mean``), on the
    log1p scale float32(log1p(float64(float32(``mean``)))) (as :func:`candidate_scores` makes
    it), the last loss float64(``last``), on the log1p scale log1p of it.

    Row by row in reused block buffers, without gathering the candidates' values or assigning
    through a mask: at 15M rows 0.05 s against 0.13 s, on the path to a published plan."""
    n = len(cand)
    out = np.empty(n, dtype=bool)
    size = min(n, _BLOCK)
    wide, narrow, above = np.empty(size, np.float64), np.empty(size, np.float32), np.empty(size, bool)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        # beyond float32's range: inf, not a candidate; below -1: no log1p, not a candidate
        for lo in range(0, n, _BLOCK):
            hi = min(n, lo + _BLOCK)
            o, w, f, a = out[lo:hi], wide[: hi - lo], narrow[: hi - lo], above[: hi - lo]
            np.copyto(f, mean[lo:hi], casting="same_kind")  # float32(mean), rounded to nearest
            np.copyto(w, f)
            if scale != "loss":
                np.log1p(w, out=w)
                np.copyto(f, w, casting="same_kind")
                np.copyto(w, f)
            np.greater(w, t, out=o)
            np.copyto(w, last[lo:hi])
            if scale != "loss":
                np.log1p(w, out=w)
            np.greater(w, t, out=a)
            o &= a
            o &= cand[lo:hi]
    return out


def noise_fit(inp: PolicyInput, noise: NoiseParams | int, scale: str = "loss", floor: float | None = None) -> NoiseFit:
    """:class:`NoiseFit` of a whole table: ``noise`` the stage's parameters (or, as earlier, the
    warm-up alone: rule 1 on ``scale``)."""
    if not isinstance(noise, NoiseParams):
        noise = NoiseParams(noise=True, noise_rule=1, noise_warmup=int(noise), noise_scale=scale)
    return _fit(candidate_scores(inp, noise.noise_warmup, noise.noise_scale), noise, floor)


def _fit(scores: tuple[np.ndarray, np.ndarray], noise: NoiseParams, floor: float | None = None) -> NoiseFit:
    """:func:`noise_fit` from the candidates' scores (:func:`candidate_scores`)."""
    _, x = scores
    n = len(x)
    return NoiseFit(n, fit_two_gaussians(points1d(x)) if n else None, noise.noise_scale, noise.noise_posterior, floor)


def _recheck(inp: PolicyInput, suspect: np.ndarray, m: int) -> np.ndarray:
    """The m suspects of smallest uniform of stream 8, ties by smaller uid (§12, step 4): the
    uniforms are drawn for the suspects alone (the same values, a uniform being a function of
    the uid alone), and the m smallest among them are the m smallest among all rows' suspects."""
    idx = np.flatnonzero(suspect)
    uid = np.asarray(inp.uid)[idx]
    chosen = uniform_subset(np.ones(len(idx), dtype=bool), m, uniforms(uid, inp.seed, inp.epoch, STREAM_NOISE), uid)
    out = np.zeros(inp.n, dtype=bool)
    out[idx[chosen]] = True
    return out


# ---------------------------------------------------------------------------------- rows
def _merge(n: int, rest: np.ndarray, r: PolicyResult, suspect: np.ndarray, recheck: np.ndarray) -> PolicyResult:
    """The rows of the whole input: the policy's result ``r`` on the rows ``rest`` (the
    non-suspects: a bool mask, or their indices in ascending order), the suspects (every other
    row) left out or kept for re-checking with weight 0."""
    keep = np.zeros(n, dtype=bool)
    weight = np.zeros(n, dtype=np.float32)
    # every row is a suspect or in ``rest``: the suspects' reason first, the others' over it
    reason = np.full(n, reason_code("suspected_noise"), dtype=np.int8)
    pairs = [(keep, r.keep), (weight, r.weight), (reason, r.reason)]
    cluster = None
    if r.cluster is not None:
        cluster = np.full(n, -1, dtype=np.int16)
        pairs.append((cluster, r.cluster))
    score = None
    if r.score is not None:
        score = np.full(n, np.nan, dtype=np.float64)
        pairs.append((score, r.score))
    if rest.dtype == bool:
        scatter_rows(pairs, rest)
    else:
        for dst, values in pairs:
            dst[rest] = values
    keep |= recheck
    reason[recheck] = reason_code("noise_recheck")
    return PolicyResult(keep, weight, reason, r.summary, cluster, score, r.absent_rule)


def with_noise(
    fn: Callable[[PolicyInput, Any], PolicyResult], noise: NoiseParams, floor: float | None = None
) -> Callable[[PolicyInput, Any], PolicyResult]:
    """``fn`` (a policy's function) with the stage in front of it when ``noise.noise``; ``floor``:
    rule 2's previous threshold (:func:`previous_threshold`)."""
    if not noise.noise:
        return fn

    def policy(inp: PolicyInput, p: Any) -> PolicyResult:
        scores = candidate_scores(inp, noise.noise_warmup, noise.noise_scale)
        fit = _fit(scores, noise, floor)
        suspect = fit.suspects(inp, noise.noise_warmup, scores)
        del scores
        # the rule is the loss history's only reader: from here on the input without it, so
        # that a caller handing over its only reference frees the history columns here
        inp = replace(inp, loss_count=None, loss_mean=None, memo=None)
        n_sus = int(np.count_nonzero(suspect))
        if not n_sus:
            result = fn(inp, p)
            result.summary.update(fit.summary(0, 0))
            return result
        m = keep_count(noise.noise_recheck, n_sus)
        rest = ~suspect  # a mask, not indices: 8 bytes a row less at the plan's peak
        del suspect  # ~rest: made again after the policy (the masks' bytes are the peak's)
        # the policy reads no loss history (the rule is its only reader): its input is the other
        # rows' own columns, without copies of the history columns, and ``seen`` as the mask
        # seen > 0, which is all the policies the stage admits read of it (1 byte a row instead of 4)
        own = replace(inp, seen=np.asarray(inp.seen) > 0)
        sub = own.take(rest)
        del own
        planned = fn(sub, p)
        del sub
        suspect = ~rest
        result = _merge(inp.n, rest, planned, suspect, _recheck(inp, suspect, m))
        result.summary.update(fit.summary(n_sus, m))
        return result

    policy.__name__ = getattr(fn, "__name__", "policy").lstrip("_")
    policy.__doc__ = fn.__doc__
    return policy


def noise_columns(own: Iterable[str], noise: NoiseParams) -> frozenset[str]:
    """The table columns a policy reading ``own`` reads with the stage in front: the stage's
    (:data:`NOISE_COLUMNS`) too when ``noise.noise``."""
    return frozenset(own) | NOISE_COLUMNS if noise.noise else frozenset(own)


def noise_narrow_reads(own: Iterable[str], noise: NoiseParams) -> dict[str, Any]:
    """{column: dtype} a planner may read narrower than the table holds it: ``loss_mean`` as
    float32 when the stage is on and its only reader (the policy's own columns ``own`` do not
    hold it), since the stage reads nothing of it but x = float32(``loss_mean``) (§12.2; the
    same cast, made while reading). Why: at 15M rows the float64 column is 120 MB of fresh
    memory beside the plan's peak; as float32, 60 MB."""
    if not noise.noise or "loss_mean" in set(own):
        return {}
    return {"loss_mean": np.dtype(np.float32)}


# ---------------------------------------------------------------------------------- steps
class _Namespaced:
    """A bucket's memo seen through a prefix: the policy's steps on the bucket's non-suspects
    keep what they derive apart from what they derive for all its rows."""

    def __init__(self, parent: Any, prefix: str) -> None:
        self.parent, self.prefix = parent, prefix

    def __contains__(self, key: str) -> bool:
        return self.prefix + key in self.parent

    def __getitem__(self, key: str) -> Any:
        return self.parent[self.prefix + key]

    def __setitem__(self, key: str, value: Any) -> None:
        self.parent[self.prefix + key] = value

    def get(self, key: str, default: Any = None) -> Any:
        return self.parent.get(self.prefix + key, default)


@dataclass(frozen=True)
class _Rule:
    """The rule's decisions over all buckets: the fit, the number of suspects, the re-check cut."""

    fit: NoiseFit
    warmup: int
    seed: int
    epoch: int
    suspected: int = 0
    rechecked: int = 0
    recheck: Cut | None = None

    def suspect(self, inp: PolicyInput) -> np.ndarray:
        return memo(inp, f"noise/suspect/{self.warmup}/{self.fit.scale}", lambda: self.fit.suspects(inp, self.warmup))

    def recheck_keys(self, inp: PolicyInput) -> tuple[np.ndarray, np.ndarray, None, None]:
        """The bucket's suspects' (key, uid) for the re-check cut: their uniform keys of stream 8,
        drawn for the suspects alone (as :func:`_recheck` draws them; a key is a function of the
        uid alone): a fifth of the rows hashed and kept in the memo instead of every row."""

        def make() -> tuple[np.ndarray, np.ndarray]:
            uid = np.asarray(inp.uid, np.uint64)[self.suspect(inp)]
            return uniform_keys(uid, self.seed, self.epoch, STREAM_NOISE), uid

        keys, uid = memo(inp, f"noise/recheck/{self.warmup}/{self.fit.scale}/{self.seed}/{self.epoch}", make)
        return keys, uid, None, None

    def recheck_mask(self, inp: PolicyInput, suspect: np.ndarray) -> np.ndarray:
        """The bucket's rows the re-check cut keeps (a mask over all its rows)."""
        assert self.recheck is not None
        out = np.zeros(inp.n, dtype=bool)
        out[suspect] = self.recheck.mask(*self.recheck_keys(inp))
        return out

    def rest(self, inp: PolicyInput) -> PolicyInput:
        """The bucket's non-suspects, as the policy's steps see them: their own columns, without
        the loss history and with ``seen`` as the mask seen > 0 (what the policies read of it;
        as in :func:`with_noise`).

        With a memo, the columns are gathered once and kept in it (a spilled bucket's as .npy
        files, memory-mapped by the later passes): the policy's steps ask for the rest about six
        times a bucket, and gathering it each time was the largest share of a partitioned noise
        plan's page faults (1.5M of 5.4M at 200M samples; docs/benchmarks.md, "Web scale")."""
        rows = memo(inp, "noise/rest-mask", lambda: ~self.suspect(inp))  # a key outside noise/rest/

        def taken() -> PolicyInput:
            own = replace(inp, loss_count=None, loss_mean=None, memo=None, seen=np.asarray(inp.seen) > 0)
            return own.take(rows)

        if inp.memo is None:
            return taken()
        # the mask seen > 0 and the gather are made once, with the memo's columns
        kept = memo(inp, "noise/rest-columns", lambda: _rest_columns(taken()))
        columns = dict(zip(_REST_COLUMNS, kept))
        return replace(inp, **columns, loss_count=None, loss_mean=None, memo=_Namespaced(inp.memo, "noise/rest/"))


#: The columns of :meth:`_Rule.rest` (a PolicyInput's, without the loss history).
_REST_COLUMNS = ("uid", "last_loss", "ema", "seen", "last_epoch")


def _rest_columns(taken: PolicyInput) -> tuple[np.ndarray | None, ...]:
    """The columns of ``taken`` to keep in a memo, in :data:`_REST_COLUMNS` order (a constant
    column stays a constant there: a spilled memo saves no file for it)."""
    return tuple(getattr(taken, name) for name in _REST_COLUMNS)


def _rule_steps(ctx: PlanContext, noise: NoiseParams, floor: float | None) -> Generator[Step, Any, _Rule]:
    """The rule over buckets: the candidates, the points of their scores, the mixture (here,
    from the points alone), the suspects and the re-check cut."""
    warmup, scale = noise.noise_warmup, noise.noise_scale

    def scores(inp: PolicyInput) -> np.ndarray:
        return memo(inp, f"noise/scores/{warmup}/{scale}", lambda: candidate_scores(inp, warmup, scale)[1])

    n_cand = yield total(lambda inp: len(scores(inp)))
    mixture = None
    if n_cand:
        mixture = fit_two_gaussians((yield from points1d_steps(scores, n_cand)))
    rule = _Rule(NoiseFit(n_cand, mixture, scale, noise.noise_posterior, floor), warmup, ctx.seed, ctx.epoch)
    if not rule.fit.active:
        return rule
    n_sus = yield total(lambda inp: int(np.count_nonzero(rule.suspect(inp))))
    if not n_sus:
        return rule
    m = keep_count(noise.noise_recheck, n_sus)
    cut = yield from smallest(rule.recheck_keys, m, n_sus)
    return replace(rule, suspected=n_sus, rechecked=m, recheck=cut)


class _OnRest:
    """A step's map applied to the bucket's non-suspects (picklable with its rule)."""

    def __init__(self, fn: Callable[[PolicyInput], Any], rule: _Rule) -> None:
        self.fn, self.rule = fn, rule

    def __call__(self, inp: PolicyInput) -> Any:
        return self.fn(self.rule.rest(inp))


class _MergedRows:
    """A bucket's rows: the policy's decisions on its non-suspects, its suspects left out or
    re-checked."""

    def __init__(self, rows: Callable[[PolicyInput], PolicyResult], rule: _Rule) -> None:
        self.rows, self.rule = rows, rule

    def __call__(self, inp: PolicyInput) -> PolicyResult:
        rule = self.rule
        suspect = rule.suspect(inp)
        return _merge(inp.n, ~suspect, self.rows(rule.rest(inp)), suspect, rule.recheck_mask(inp, suspect))


def _on_rest(steps: Generator[Step, Any, Decide], rule: _Rule) -> Generator[Step, Any, Decide]:
    """``steps`` with every map applied to the buckets' non-suspects."""
    try:
        step = next(steps)
        while True:
            value = yield Step(_OnRest(step.map, rule), step.reduce, step.streamed)
            step = steps.send(value)
    except StopIteration as stop:
        return stop.value


def with_noise_steps(
    steps: Callable[[PlanContext, Any], Generator[Step, Any, Decide]], noise: NoiseParams, floor: float | None = None
) -> Callable[[PlanContext, Any], Generator[Step, Any, Decide]]:
    """``steps`` (a policy's steps form) with the stage in front when ``noise.noise``: the
    rule's steps, then the policy's steps on the non-suspects (a context of their number)."""
    if not noise.noise:
        return steps

    def noisy(ctx: PlanContext, p: Any) -> Generator[Step, Any, Decide]:
        rule = yield from _rule_steps(ctx, noise, floor)
        if not rule.suspected:
            decide = yield from steps(ctx, p)
            return Decide(decide.rows, {**decide.summary, **rule.fit.summary(0, 0)}, decide.absent_rule)
        decide = yield from _on_rest(steps(replace(ctx, n=ctx.n - rule.suspected), p), rule)
        summary = {**decide.summary, **rule.fit.summary(rule.suspected, rule.rechecked)}
        return Decide(_MergedRows(decide.rows, rule), summary, decide.absent_rule)

    noisy.__name__ = getattr(steps, "__name__", "steps").lstrip("_")
    noisy.__doc__ = steps.__doc__
    return noisy
