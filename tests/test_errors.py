"""The error contract: every user error is a SetaStreamError subclass (a ValueError where it was
one), and the CLI prints it on one line, no traceback, exit status 2."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import webdataset as wds

import seta_stream as seta
from seta_stream import errors
from seta_stream.testing import LossRecorder

CLI = [sys.executable, "-m", "seta_stream._cli"]


def run_cli(*args):
    return subprocess.run(CLI + [str(a) for a in args], capture_output=True, text=True, timeout=120)


@pytest.fixture
def recorded(tmp_path):
    run = tmp_path / "run"
    with LossRecorder(run) as rec:
        rec.record([f"k{i}" for i in range(20)], ["/d/shard-0.tar"] * 20, np.arange(20, dtype=np.float32))
    seta.compact(run)
    return run


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--policy", "nosuch", "--epochs", "3"],
            "seta-stream plan: error: unknown policy 'nosuch'; valid policies: es, eswp, full, infobatch, random, "
            "seta, static (`seta-stream policies` describes them, with their parameters)",
        ),
        (
            ["--policy", "seta", "--epochs", "3", "-p", "r=2"],
            "seta-stream plan: error: seta: r=2 is outside the valid range 0 <= r <= 0.9; set parameters with "
            "params={'name': value} (CLI: -p name=value); `seta-stream policies` lists them",
        ),
        (
            ["--policy", "seta", "--epochs", "3", "-p", "q=1"],
            "seta-stream plan: error: seta: unknown parameter(s) ['q']; valid: ['alpha', 'delta', 'k', 'order', "
            "'prune_epochs', 'r', 'target_keep', 'unseen_score'], and noise, noise_rule, noise_warmup, "
            "noise_recheck, noise_scale, noise_posterior (the noise rule), "
            "min_keep_fraction, max_weight for every policy; set parameters with params={'name': value} "
            "(CLI: -p name=value); "
            "`seta-stream policies` lists them",
        ),
        (
            ["--policy", "infobatch", "--epochs", "3", "-p", "max_weight=0.5"],
            "seta-stream plan: error: infobatch: max_weight=0.5 is outside the valid range max_weight >= 1 (None: "
            "no cap); set parameters with params={'name': value} (CLI: -p name=value); `seta-stream policies` "
            "lists them",
        ),
    ],
)
def test_cli_prints_policy_errors_on_one_line_and_exits_2(recorded, args, message):
    proc = run_cli("plan", recorded, "--epoch", 0, *args)
    assert (proc.returncode, proc.stdout) == (2, "")
    assert proc.stderr == message + "\n"
    assert not (recorded / "plans").exists()


def test_policy_errors_are_set_errors_and_still_value_errors():
    for call in (
        lambda: seta.policies.run_policy("nosuch", None),
        lambda: seta.policies.policy_params("infobatch", r=5),
        lambda: seta.policies.policy_params("seta", k="five"),
    ):
        with pytest.raises(seta.errors.InvalidInputError) as err:
            call()
        assert isinstance(err.value, ValueError) and isinstance(err.value, seta.errors.SetaStreamError)


def test_attach_rejects_what_it_cannot_filter_with_a_set_error_that_is_a_type_error(tmp_path):
    with pytest.raises(errors.UnsupportedPipelineError) as err:
        seta.attach([1, 2, 3], seta.RunDir(tmp_path, create=True))
    assert isinstance(err.value, TypeError)
    assert str(err.value).startswith("attach() needs a wds.WebDataset or wds.DataPipeline, got list; wrap the shard")
    with pytest.raises(errors.UnsupportedPipelineError, match=r"no tar reader found in this pipeline"):
        seta.attach(wds.DataPipeline(wds.SimpleShardList(["a.tar"])), seta.RunDir(tmp_path))


def test_index_mismatch_is_in_the_tree():
    from seta_stream.errors import IndexMismatch

    assert issubclass(IndexMismatch, seta.errors.InvalidInputError)


def test_every_error_class_derives_from_the_base():
    classes = [v for v in vars(errors).values() if isinstance(v, type) and issubclass(v, Exception)]
    classes = [c for c in classes if not issubclass(c, Warning)]
    assert {c.__name__ for c in classes} >= {
        "SetaStreamError",
        "ShardNameError",
        "ShardNameConflictError",
        "UnsupportedPipelineError",
        "InvalidInputError",
    }
    assert all(issubclass(c, seta.errors.SetaStreamError) for c in classes)


def test_every_warning_class_derives_from_the_warning_base_and_is_a_user_warning():
    classes = [v for v in vars(errors).values() if isinstance(v, type) and issubclass(v, Warning)]
    assert {c.__name__ for c in classes} == {"SetaStreamWarning", "PlanWarning"}
    assert all(issubclass(c, seta.errors.SetaStreamWarning) and issubclass(c, UserWarning) for c in classes)
    w = seta.errors.PlanWarning("run/plans/epoch=3/summary.json: ...", "low_keep", 0.04, 0.1, 3)
    assert (w.code, w.value, w.limit, w.epoch) == ("low_keep", 0.04, 0.1, 3)
    assert str(w) == "run/plans/epoch=3/summary.json: ..."
