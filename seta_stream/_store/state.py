"""``state.json``: the run's policy settings, per-epoch history and current epoch.

This module owns the file (docs/format.md, "state.json"): planning writes it after each plan,
``set_current_epoch`` moves the current epoch, the stages read the current epoch when a
DataLoader iterator starts, and ``inspect`` reads the rest. It is a small JSON pointer, replaced
whole (``RunDir.publish_json``), never edited in place.

Invariant: the settings of a run (policy, params, seed, epochs) are fixed by its first plan;
a later plan that asks for others is refused unless it says ``force``.
"""

from __future__ import annotations

from typing import Any

from ..errors import InvalidInputError, PlanMissingError
from .layout import STATE
from .planfiles import load_summary
from .runfs import RunDir

__all__ = [
    "read_state",
    "current_epoch",
    "with_current_epoch",
    "set_current_epoch",
    "after_plan",
    "resolve_settings",
    "pruned_so_far",
]

SETTINGS = ("policy", "params", "epochs", "seed")


def read_state(run: RunDir) -> dict[str, Any]:
    """Contents of state.json ({} for a run never planned)."""
    return dict(run.read_json(STATE, default=None) or {})


def current_epoch(run: RunDir) -> int:
    """The epoch the stages filter by (set by the last plan or ``set_current_epoch``)."""
    epoch = read_state(run).get("current_epoch")
    if epoch is None:
        raise PlanMissingError(
            f"{run.display(STATE)}: no epoch has been planned in this run; call "
            "pruner.start_epoch(e) (or seta_stream.plan_epoch(run, e)) before iter(loader)"
        )
    return int(epoch)


def with_current_epoch(run: RunDir, epoch: int) -> None:
    """Publish state.json with ``current_epoch = epoch`` (unchanged if it already is)."""
    state = read_state(run)
    if state.get("current_epoch") != epoch:
        state["current_epoch"] = int(epoch)
        run.publish_json(STATE, state)


def set_current_epoch(run: str | RunDir, epoch: int) -> None:
    """Mark ``epoch`` as the one the stages use when a DataLoader iterator starts (its plan must
    be published: :class:`~seta_stream.errors.PlanMissingError` otherwise)."""
    run = run if isinstance(run, RunDir) else RunDir(run)
    load_summary(run, epoch)
    with_current_epoch(run, int(epoch))


def resolve_settings(
    run: RunDir,
    state: dict[str, Any],
    given: dict[str, Any],
    force: bool,
) -> dict[str, Any]:
    """The run's settings after a plan call that passes ``given`` (None = keep the run's)."""
    if not state.get("policy"):
        if given.get("policy") is None or given.get("epochs") is None:
            raise InvalidInputError(
                f"{run.display(STATE)}: this run has no plan yet, so its first plan needs "
                "policy= and epochs= (CLI: --policy NAME --epochs N); seed defaults to 0"
            )
        return {
            "policy": given["policy"],
            "params": dict(given.get("params") or {}),
            "epochs": int(given["epochs"]),
            "seed": int(given.get("seed") or 0),
        }
    resolved = {k: state[k] for k in SETTINGS}
    for k in SETTINGS:
        v = given.get(k)
        if v is None:
            continue
        if isinstance(v, dict):  # params
            v = dict(v)
        if v != resolved[k]:
            if not force:
                raise InvalidInputError(
                    f"{run.display(STATE)}: the run was planned with {k}={resolved[k]!r}, "
                    f"this call asks {k}={v!r}; a run's settings are fixed by its first plan. Use "
                    "a new run directory, or pass force=True (CLI: --force) to change them from "
                    "this epoch on"
                )
            resolved[k] = v
    return resolved


def _history_with(state: dict[str, Any], epoch: int, n: int, kept: int) -> dict[str, dict[str, int]]:
    history = dict(state.get("history", {}))
    history[str(epoch)] = {"n": int(n), "kept": int(kept)}
    return history


def pruned_so_far(state: dict[str, Any], epoch: int, n: int, kept: int) -> float:
    """1 - kept / n over epochs 0..``epoch``, with ``epoch`` planned as (n, kept)."""
    upto = [v for k, v in _history_with(state, epoch, n, kept).items() if int(k) <= epoch]
    total = sum(v["n"] for v in upto)
    return (1.0 - sum(v["kept"] for v in upto) / total) if total else 0.0


def after_plan(state: dict[str, Any], settings: dict[str, Any], epoch: int, summary: dict[str, Any]) -> dict[str, Any]:
    """state.json after publishing the plan of ``epoch`` (which becomes the current epoch)."""
    return {
        **state,
        **{k: settings[k] for k in SETTINGS},
        "history": _history_with(state, epoch, summary["n"], summary["kept"]),
        "last_planned_epoch": max(epoch, int(state.get("last_planned_epoch", -1))),
        "current_epoch": epoch,
    }
