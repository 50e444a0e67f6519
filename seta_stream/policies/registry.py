"""The registry of policies: their specs by name, their parameters, and running one on a table.

``POLICIES`` maps each name to its :class:`~.base.PolicySpec` (each policy module's ``SPECS``,
registered below); :func:`plan_params` validates a policy's parameters, the noise rule's stage's
(``policies.noise``, for a policy that admits it) and the safeguards every policy accepts, and
splits them; :func:`planned_function`, :func:`planned_steps` and :func:`planned_columns` put the
stage in front of the policy; :func:`run_policy` runs a policy on a whole table and finalizes the
result (``guard.finalize``); :func:`check_run_settings` and :func:`run_settings_for` tie a policy
to the run settings it fixes. Pure: no I/O.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ..errors import InvalidInputError
from .base import PolicyInput, PolicyResult, PolicySpec
from .evolved import SPECS as _EVOLVED
from .full import SPECS as _FULL
from .guard import finalize
from .infobatch import SPECS as _INFOBATCH
from .noise import (
    NOISE_PARAMS,
    NoiseParams,
    noise_columns,
    noise_narrow_reads,
    split_noise,
    with_noise,
    with_noise_steps,
)
from .random import SPECS as _RANDOM
from .safeguards import SAFEGUARD_PARAMS, Safeguards, split_params
from .seta import SPECS as _SETA
from .summary import summary_params

__all__ = [
    "POLICIES",
    "register",
    "get_policy",
    "describe_policies",
    "policy_params",
    "plan_params",
    "planned_function",
    "planned_steps",
    "planned_columns",
    "planned_table_columns",
    "planned_narrow_reads",
    "run_policy",
    "check_run_settings",
    "run_settings_for",
]

POLICIES: dict[str, PolicySpec] = {}


def register(spec: PolicySpec) -> None:
    """Add a policy to the registry (name must be new)."""
    if spec.name in POLICIES:
        raise InvalidInputError(f"policy {spec.name!r} is already registered")
    POLICIES[spec.name] = spec


# each policy module's SPECS, imported from the module itself (the package binds ``full``, ``seta``...
# to the policy functions of those names)
for _spec in (*_FULL, *_RANDOM, *_INFOBATCH, *_EVOLVED, *_SETA):
    register(_spec)
del _spec


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
    """Name, description and parameters (with defaults) of every policy, for the CLI; the noise
    rule's stage's (with ``"noise": True``) for a policy that admits it, then the safeguards
    every policy accepts (§0.10), with ``"safeguard": True``."""
    out = []
    for name in sorted(POLICIES):
        spec = POLICIES[name]
        params = [
            {"name": f.name, "default": f.default if f.default is not dataclasses.MISSING else None}
            for f in dataclasses.fields(spec.params_type)
        ]
        if spec.noise:
            defaults = dataclasses.asdict(NoiseParams())
            params += [{"name": f, "default": defaults[f], "noise": True} for f in NOISE_PARAMS]
        params += [{"name": f, "default": None, "safeguard": True} for f in SAFEGUARD_PARAMS]
        out.append({"name": name, "description": spec.description, "params": params})
    return out


def policy_params(name: str, **params: Any) -> tuple[PolicySpec, Any]:
    """The policy ``name`` and its own validated parameters (InvalidInputError naming what is
    wrong and how to set it). ``params`` may hold the noise rule's (for a policy that admits
    it) and the safeguards every policy accepts (:data:`SAFEGUARD_PARAMS`): they are validated
    and left out; :func:`plan_params` returns them too."""
    spec, p, _, _ = plan_params(name, **params)
    return spec, p


def plan_params(name: str, **params: Any) -> tuple[PolicySpec, Any, Safeguards, NoiseParams]:
    """The policy ``name``, its own validated parameters, the :class:`Safeguards` (§0.10) and the
    noise rule's :class:`~.noise.NoiseParams` (§12; off for a policy that does not admit it)
    among ``params``."""
    spec = get_policy(name)
    known = {f.name for f in dataclasses.fields(spec.params_type)}
    stages = set(SAFEGUARD_PARAMS) | (set(NOISE_PARAMS) if spec.noise else set())
    unknown = {k for k in params if k not in stages} - known
    fix = "set parameters with params={'name': value} (CLI: -p name=value); `seta-stream policies` lists them"
    if unknown:
        noise = f"{', '.join(NOISE_PARAMS)} (the noise rule), " if spec.noise else ""
        raise InvalidInputError(
            f"{name}: unknown parameter(s) {sorted(unknown)}; valid: {sorted(known) or 'none'}, and "
            f"{noise}{', '.join(SAFEGUARD_PARAMS)} for every policy; {fix}"
        )
    try:
        rest, safeguards = split_params(params)
        own, noise = split_noise(name, rest) if spec.noise else (rest, NoiseParams())
        return spec, spec.make_params(**own), safeguards, noise
    except InvalidInputError as exc:
        what = str(exc) if str(exc).startswith(f"{name}: ") else f"{name}: {exc}"  # the safeguards name no policy
        raise InvalidInputError(f"{what}; {fix}") from None
    except TypeError as exc:  # a value of the wrong type compared in validation
        raise InvalidInputError(f"{name}: parameters {params} do not fit ({exc}); {fix}") from None


def planned_function(spec: PolicySpec, noise: NoiseParams, floor: float | None = None) -> Any:
    """The policy's whole-table function with the noise rule's stage in front (``floor``: rule
    2's previous threshold, ``noise.previous_threshold``)."""
    return with_noise(spec.fn, noise, floor)


def planned_steps(spec: PolicySpec, noise: NoiseParams, floor: float | None = None) -> Any:
    """The policy's steps with the noise rule's stage in front (None if it has none)."""
    return None if spec.steps is None else with_noise_steps(spec.steps, noise, floor)


def planned_columns(spec: PolicySpec, params: Any, noise: NoiseParams) -> frozenset[str]:
    """The input columns the policy and the stage in front of it declare."""
    return noise_columns(spec.columns(params), noise)


def planned_table_columns(spec: PolicySpec, params: Any, noise: NoiseParams) -> list[str]:
    """The loss-table columns a plan of the policy with the stage reads (``PolicySpec.table_columns``)."""
    return spec.table_columns(params, planned_columns(spec, params, noise))


def planned_narrow_reads(spec: PolicySpec, params: Any, noise: NoiseParams) -> dict[str, Any]:
    """{column: dtype} a planner may read narrower (``noise.noise_narrow_reads``)."""
    return noise_narrow_reads(spec.columns(params), noise)


def run_policy(name: str, inp: PolicyInput, **params: Any) -> PolicyResult:
    """Validate ``params`` for policy ``name`` (its own, the noise rule's and the safeguards,
    §0.10, §12), run it with the noise rule's stage in front and finalize the result."""
    spec, p, safeguards, noise = plan_params(name, **params)
    result = planned_function(spec, noise)(inp, p)
    return finalize(result, inp, name, summary_params(p, noise, spec), safeguards)


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
    p = plan_params(name, **(params or {}))[1]
    return {**(settings or {}), **{s.name: getattr(p, s.param) for s in missing}}
