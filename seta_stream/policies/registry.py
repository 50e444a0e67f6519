"""The registry of policies: their specs by name, their parameters, and running one on a table.

``POLICIES`` maps each name to its :class:`~.base.PolicySpec` (each policy module's ``SPECS``,
registered below); :func:`plan_params` validates a policy's parameters and the safeguards every
policy accepts; :func:`run_policy` runs a policy on a whole table and finalizes the result
(``guard.finalize``); :func:`check_run_settings` and :func:`run_settings_for` tie a policy to the
run settings it fixes. Pure: no I/O.
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
from .random import SPECS as _RANDOM
from .safeguards import SAFEGUARD_PARAMS, Safeguards, split_params
from .seta import SPECS as _SETA

__all__ = [
    "POLICIES",
    "register",
    "get_policy",
    "describe_policies",
    "policy_params",
    "plan_params",
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
