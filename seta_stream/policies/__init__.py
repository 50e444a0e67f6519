"""Policies: pure functions from loss-table columns to a keep mask and weights.

One module per policy (``full``, ``random``, ``infobatch``, ``evolved``, ``seta``), the noise
rule's stage (``noise``: its own parameters, put in front of the policies that admit it) and the
modules every policy goes through: ``registry`` (``POLICIES``; ``run_policy(name, inp, **params)``
validates the parameters, runs the stage and the policy and :func:`finalize` s the result),
``guard`` (``finalize``: the safeguards every policy accepts, ``min_keep_fraction`` and
``max_weight``, :mod:`.safeguards`; the empty-plan guard), ``summary`` (the common summary
fields and the plan's ``warnings``, from mergeable counts), ``partitioned``
(``plan_partitioned``: a policy's steps over the buckets of a partitioned table, ``steps``),
``base`` (``PolicyInput``, ``PolicyResult``, ``PolicySpec``) and ``random_draws``. This module is
the package's face: it imports what the others define. Adding a policy = one module with a
params dataclass, a function and its ``SPECS`` (:class:`PolicySpec`: description, the table
columns it reads, the run settings it fixes), named in ``registry``'s registration loop.
Nothing outside this package names a policy.
"""

from __future__ import annotations

from .base import (
    INPUT_COLUMNS,
    PLAN_COLUMNS,
    REASONS,
    AbsentRule,
    PolicyInput,
    PolicyResult,
    PolicySpec,
    RunSetting,
)
from .base import reason_code as reason_code
from .evolved import EsParams as EsParams
from .evolved import EswpParams as EswpParams
from .evolved import es as es
from .evolved import es_select
from .evolved import eswp as eswp
from .full import FullParams as FullParams
from .full import full as full
from .guard import apply_guard, finalize
from .infobatch import InfoBatchParams as InfoBatchParams
from .infobatch import infobatch as infobatch
from .partitioned import plan_partitioned
from .random import RandomParams as RandomParams
from .random import StaticParams as StaticParams
from .random import random_policy as random_policy
from .random import static_policy as static_policy
from .random_draws import STREAM_FLOOR as STREAM_FLOOR
from .random_draws import STREAM_GUARD as STREAM_GUARD
from .random_draws import smallest_mask as smallest_mask
from .random_draws import uniforms as uniforms
from .registry import (
    POLICIES,
    check_run_settings,
    describe_policies,
    get_policy,
    plan_params,
    policy_params,
    register,
    run_policy,
    run_settings_for,
)
from .safeguards import SAFEGUARD_PARAMS, Safeguards, plan_warnings
from .safeguards import cap_weights as cap_weights
from .safeguards import fill_mask as fill_mask
from .safeguards import fillable as fillable
from .safeguards import split_params as split_params
from .seta import SetaParams as SetaParams
from .seta import seta as seta
from .steps import Cut as Cut
from .steps import PlanContext as PlanContext
from .steps import run_steps as run_steps
from .steps import smallest as smallest
from .steps import total as total
from .steps import uniform_keys as uniform_keys
from .summary import SummaryCounts, summarize, summary_counts, summary_of

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
