"""state: settings fixed by the first plan, per-epoch history, the current epoch."""

import pytest

from seta_stream import RunDir
from seta_stream._store import state
from seta_stream.errors import InvalidInputError, PlanMissingError


def test_first_plan_fixes_the_settings_and_later_calls_must_agree(tmp_path):
    run = RunDir(tmp_path / "r", create=True)
    with pytest.raises(
        InvalidInputError, match=r"this run has no plan yet, so its first plan needs policy= and epochs="
    ):
        state.resolve_settings(run, {}, {"policy": "seta"}, force=False)
    first = state.resolve_settings(run, {}, {"policy": "seta", "params": {"r": 0.1}, "epochs": 5}, force=False)
    assert first == {"policy": "seta", "params": {"r": 0.1}, "epochs": 5, "seed": 0}
    planned = state.after_plan({}, first, 0, {"n": 100, "kept": 90})
    assert state.resolve_settings(run, planned, {}, force=False) == first
    with pytest.raises(InvalidInputError, match=r"the run was planned with epochs=5, this call asks epochs=6"):
        state.resolve_settings(run, planned, {"epochs": 6}, force=False)
    assert state.resolve_settings(run, planned, {"epochs": 6}, force=True)["epochs"] == 6


def test_history_current_epoch_and_pruned_so_far(tmp_path):
    run = RunDir(tmp_path / "r", create=True)
    with pytest.raises(PlanMissingError, match=r"state.json: no epoch has been planned in this run"):
        state.current_epoch(run)
    settings = {"policy": "random", "params": {"r": 0.5}, "epochs": 3, "seed": 1}
    s0 = state.after_plan({}, settings, 0, {"n": 100, "kept": 50})
    s1 = state.after_plan(s0, settings, 1, {"n": 100, "kept": 70})
    assert s1["history"] == {"0": {"n": 100, "kept": 50}, "1": {"n": 100, "kept": 70}}
    assert (s1["last_planned_epoch"], s1["current_epoch"]) == (1, 1)
    assert state.pruned_so_far(s0, 1, 100, 70) == pytest.approx(1 - 120 / 200)
    run.publish_json("state.json", s1)
    assert state.current_epoch(run) == 1
    state.with_current_epoch(run, 0)
    assert state.read_state(run) == {**s1, "current_epoch": 0}
