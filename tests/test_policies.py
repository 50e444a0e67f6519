"""The policy registry and what every policy shares (docs/algorithms.md §0): registration,
parameter validation, ``finalize`` (empty-plan guard, common summary, §0.7), properties every
policy keeps, the ``PolicyInput`` built from declared columns, and the declarations themselves:
every policy reads only the columns it declares, and planning reads a policy's columns and
checks its run settings without naming it."""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from seta_stream import Pruner, RunDir, compact, load_table, plan_epoch
from seta_stream.errors import InvalidInputError
from seta_stream.policies import (
    INPUT_COLUMNS,
    PLAN_COLUMNS,
    POLICIES,
    PolicyInput,
    PolicyResult,
    PolicySpec,
    RunSetting,
    describe_policies,
    finalize,
    get_policy,
    register,
    run_policy,
    run_settings_for,
)
from seta_stream.policies.base import reason_code
from seta_stream.policies.random_draws import STREAM_GUARD, uniforms
from seta_stream.testing import LossRecorder


def lognormal_input(n=2000, epoch=2, epochs=10, seed=0, rs=0, unseen=0):
    rng = np.random.default_rng(rs)
    uid = rng.integers(0, 2**64 - 1, n, dtype=np.uint64, endpoint=True)
    loss = rng.lognormal(size=n).astype(np.float32)
    loss[:unseen] = np.nan
    return PolicyInput.from_losses(uid, loss, epoch=epoch, epochs=epochs, seed=seed)


def permuted(inp: PolicyInput, perm: np.ndarray) -> PolicyInput:
    return PolicyInput(
        inp.uid[perm], inp.last_loss[perm], inp.ema[perm], inp.seen[perm], inp.last_epoch[perm],
        inp.epoch, inp.epochs, inp.seed, inp.n_ref,
    )  # fmt: skip


# ---------------------------------------------------------------- registry
def test_registry_names_and_errors():
    assert {"full", "random", "static", "seta", "infobatch", "es", "eswp"} <= set(POLICIES)
    with pytest.raises(ValueError, match=r"unknown policy 'nope'; valid policies: es, eswp, full, infobatch"):
        get_policy("nope")
    with pytest.raises(ValueError, match=r"seta: unknown parameter\(s\) \['bogus'\]"):
        run_policy("seta", lognormal_input(n=10), bogus=1)


def test_describe_policies_lists_parameters_with_defaults():
    entries = {d["name"]: d for d in describe_policies()}
    assert set(entries) == set(POLICIES)
    assert all(d["description"] for d in entries.values())
    defaults = {p["name"]: p["default"] for p in entries["seta"]["params"]}
    assert defaults["k"] == 10 and defaults["alpha"] == 0.5 and defaults["target_keep"] is None
    assert {p["name"]: p["default"] for p in entries["eswp"]["params"]}["beta2"] == 0.8
    json.dumps(describe_policies())
    names = [d["name"] for d in describe_policies()]
    assert {"full", "random", "static", "seta"} <= set(names)
    assert get_policy("seta").make_params(k=5).k == 5


# ---------------------------------------------------------------- finalize (§0.7)
COMMON = (
    "policy", "params", "epoch", "epochs", "phase", "n", "kept", "pruned_fraction", "unseen",
    "nonfinite", "weight_histogram", "empty_plan_guard", "absent_rule", "kept_by_reason",
)  # fmt: skip


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_every_policy_summary_has_the_common_fields_and_is_json(name):
    inp = lognormal_input(n=500, epoch=3, epochs=20, unseen=20)
    res = run_policy(name, inp)
    s = res.summary
    for field in COMMON:
        assert field in s, field
    assert s["policy"] == name and s["n"] == 500 and s["kept"] == int(res.keep.sum())
    assert s["unseen"] == 20 and s["nonfinite"] == 0
    assert s["pruned_fraction"] == pytest.approx(1 - s["kept"] / 500)
    assert sum(s["weight_histogram"].values()) == s["kept"]
    assert s["phase"] in ("warmup", "prune", "anneal")
    assert np.all(res.weight[~res.keep] == 0.0) and res.weight.dtype == np.float32
    assert json.loads(json.dumps(s, allow_nan=False)) == s


def test_empty_plan_guard_keeps_the_smallest_u_of_stream_7():
    inp = lognormal_input(n=5, epoch=2)
    res = get_policy("random").fn(inp, get_policy("random").make_params(r=0.3))
    res.keep[:] = False
    out = finalize(res, inp, "random", get_policy("random").make_params(r=0.3))
    u = uniforms(inp.uid, inp.seed, inp.epoch, STREAM_GUARD)
    assert out.keep.sum() == 1 and out.keep[np.argmin(u)] and out.weight[np.argmin(u)] == 1.0
    assert out.summary["empty_plan_guard"] is True and out.summary["kept_by_reason"] == {"empty_plan_guard": 1}
    one = PolicyInput.from_losses(np.array([9], np.uint64), np.array([1.0], np.float32), epoch=1, epochs=10)
    assert run_policy("random", one, r=0.5).summary["empty_plan_guard"] is True  # floor(0.5) = 0 kept
    empty = PolicyInput.from_losses(np.zeros(0, np.uint64), np.zeros(0, np.float32), epoch=1, epochs=10)
    for name in POLICIES:
        s = run_policy(name, empty).summary
        assert s["kept"] == 0 and s["empty_plan_guard"] is False


def test_finalize_gives_dropped_rows_weight_plus_zero_and_keeps_kept_weights():
    inp = lognormal_input(n=6, epoch=2)
    params = get_policy("random").make_params(r=0.3)
    keep = np.array([True, False, True, False, False, True])
    cases = [(0.0, False), (-0.0, True), (np.nan, True), (2.5, True)]  # weight of the dropped rows; a new array?
    for dropped, fresh in ((np.float32(d), f) for d, f in cases):
        res = get_policy("random").fn(inp, params)
        res.keep[:] = keep
        res.weight[:] = np.where(keep, np.float32(1.5), dropped)
        given = res.weight
        out = finalize(res, inp, "random", params)
        expected = np.where(keep, np.float32(1.5), np.float32(0.0))
        assert out.weight.view(np.uint32).tolist() == expected.view(np.uint32).tolist()
        assert (out.weight is not given) == fresh  # already +0.0 everywhere dropped: the same array


def test_nonfinite_losses_count_as_unseen_and_nonfinite():
    inp = lognormal_input(n=100)
    loss = inp.last_loss.copy()
    loss[:4] = [np.inf, -np.inf, np.nan, np.nan]
    bad = PolicyInput(inp.uid, loss, inp.ema, inp.seen, inp.last_epoch, 2, 10, 0)  # seen=1 everywhere
    s = run_policy("infobatch", bad).summary
    assert s["nonfinite"] == 4 and s["unseen"] == 4


# ---------------------------------------------------------------- properties of every policy
CASES = [
    ("full", {}),
    ("random", {"r": 0.4}),
    ("random", {"r": 0.4, "delta": 0.5}),
    ("static", {"r": 0.2}),
    ("seta", {"r": 0.1, "k": 5, "alpha": 0.6}),
    ("seta", {"r": 0.2, "k": 4, "alpha": 0.5, "target_keep": 0.5}),
    ("infobatch", {"r": 0.5}),
    ("es", {}),
    ("eswp", {"r": 0.3}),
]


@settings(max_examples=25, deadline=None)
@given(
    st.sampled_from(CASES),
    st.integers(0, 300),
    st.integers(0, 9),
    st.integers(0, 2**64 - 1),
    st.integers(0, 50),
    st.sampled_from(["lognormal", "ties", "equal"]),
)
def test_policy_properties(case, n, epoch, seed, unseen_pct, dist):
    name, params = case
    rng = np.random.default_rng(seed % 997)
    uid = rng.choice(2**62, size=n, replace=False).astype(np.uint64)
    if dist == "lognormal":
        loss = rng.lognormal(size=n).astype(np.float32)
    elif dist == "ties":
        loss = rng.integers(0, 3, n).astype(np.float32)
    else:
        loss = np.full(n, 2.5, np.float32)
    n_unseen = n * unseen_pct // 100
    loss[:n_unseen] = np.nan
    inp = PolicyInput.from_losses(uid, loss, epoch=epoch, epochs=10, seed=seed)
    a = run_policy(name, inp, **params)
    assert 0 <= a.summary["kept"] <= n and (n == 0 or a.summary["kept"] >= 1)
    assert a.keep.dtype == bool and len(a.keep) == n == len(a.weight) == len(a.reason)
    again = run_policy(name, inp, **params)
    assert np.array_equal(a.keep, again.keep) and np.array_equal(a.weight, again.weight)
    perm = rng.permutation(n)
    b = run_policy(name, permuted(inp, perm), **params)
    assert np.array_equal(a.keep[perm], b.keep) and np.array_equal(a.weight[perm], b.weight)
    if name in ("infobatch", "eswp", "es"):  # score-based: unseen samples always kept (§0.5)
        assert a.keep[:n_unseen].all()


# ---------------------------------------------------------------- validation through the registry
@pytest.mark.parametrize(
    ("policy", "params", "message"),
    [
        ("seta", {"r": 0.95}, r"seta: r=0.95 is outside the valid range 0 <= r <= 0.9"),
        ("seta", {"k": 0}, r"seta: k=0 is outside the valid range: integer 1 <= k <= 256"),
        ("seta", {"alpha": 0.0}, r"seta: alpha=0.0 is outside the valid range 0 < alpha <= 1"),
        ("seta", {"alpha": 0.05, "k": 5}, r"round\(alpha\*k\) = 0"),
        ("seta", {"delta": 1.5}, r"seta: delta=1.5 is outside the valid range 0 <= delta <= 1"),
        ("seta", {"order": "x"}, r"seta: order='x', expected 'e2h' or 'h2e'"),
        (
            "seta",
            {"r": 0.5, "target_keep": 0.6},
            r"target_keep=0.6 is outside the valid range 0 < target_keep <= 1 - r = 0.5",
        ),
        ("random", {"r": 1.0}, r"random: r=1.0 is outside the valid range 0 <= r < 1"),
        ("random", {"mode": "x"}, r"random: mode='x', expected 'dynamic' or 'static'"),
        ("seta", {"bogus": 1}, r"seta: unknown parameter\(s\) \['bogus'\]"),
        ("nope", {}, r"unknown policy 'nope'; valid policies: "),
        ("infobatch", {"r": 0.95}, r"infobatch: r=0.95 is outside the valid range 0 <= r <= 0.9"),
        ("infobatch", {"score": "x"}, r"infobatch: score='x', expected 'last' or 'ema'"),
        ("infobatch", {"rescale": "y"}, r"infobatch: rescale='y', expected 'reference' or 'exact'"),
        ("eswp", {"beta2": 1.0}, r"eswp: beta2=1.0 is outside the valid range 0 <= beta2 < 1"),
        ("eswp", {"mini_ratio": 0}, r"eswp: mini_ratio=0 is outside the valid range 0 < mini_ratio <= 1"),
        ("es", {"anneal_ratio": 0.6}, r"es: anneal_ratio=0.6 is outside the valid range 0 <= anneal_ratio <= 0.5"),
        ("es", {"r": 0.2}, r"es: r=0.2; ES has no set-level pruning"),
        ("eswp", {"beta1": -0.1}, r"eswp: beta1=-0.1 is outside the valid range 0 <= beta1 <= 1"),
    ],
)
def test_parameters_out_of_range_are_rejected(policy, params, message):
    with pytest.raises(ValueError, match=message):
        run_policy(policy, lognormal_input(n=10), **params)


@pytest.mark.parametrize("few", [False, True], ids=["every-reason", "two-reasons"])
def test_summary_counts_are_exact_across_blocks(monkeypatch, few):
    """The reason counts are made block by block and the weight histogram from the kept
    weights other than 1.0: both equal plain counts, here over 286 blocks of 7 rows, with
    every reason (blocks counted by np.bincount or code by code) or two (code by code)."""
    import seta_stream.policies.summary as policies
    from seta_stream.policies import REASONS, summarize

    monkeypatch.setattr(policies, "_COUNT_BLOCK_ROWS", 7)
    rng = np.random.default_rng(5)
    inp = lognormal_input()
    n = inp.n
    keep = rng.random(n) < 0.6
    weight = np.where(keep, rng.choice(np.array([1.0, 2.0, 0.5], np.float32), n), np.float32(0.0))
    weight[~keep & (rng.random(n) < 0.5)] = 3.0  # not kept: not counted, whatever the weight
    reason = rng.integers(0, len(REASONS), n).astype(np.int8)
    if few:
        reason = np.where(keep, reason_code("window"), reason_code("outside_window")).astype(np.int8)
    result = PolicyResult(keep, weight, reason, {}, None)
    summarize(result, inp, "test", {}, False)
    s = result.summary
    assert s["weight_histogram"] == {
        repr(float(v)): int(np.count_nonzero(keep & (weight == v))) for v in (np.float32(0.5), 1.0, 2.0)
    }
    assert s["rows_by_reason"] == {
        REASONS[i]: int(np.count_nonzero(reason == i)) for i in range(len(REASONS)) if (reason == i).any()
    }
    assert s["kept_by_reason"] == {
        REASONS[i]: int(np.count_nonzero(keep & (reason == i)))
        for i in range(len(REASONS))
        if (keep & (reason == i)).any()
    }


# ---------------------------------------------------------------- PolicyInput from declared columns
def test_from_columns_fills_undeclared_columns_with_constants_and_last_epoch_with_none():
    uid = np.arange(5, dtype=np.uint64)
    inp = PolicyInput.from_columns({"uid": uid}, epoch=1, epochs=3, seed=7, n_ref=10)
    assert inp.uid is uid and (inp.epoch, inp.epochs, inp.seed, inp.n_ref) == (1, 3, 7, 10)
    assert np.isnan(inp.last_loss).all() and inp.last_loss.dtype == np.float32
    assert np.isnan(inp.ema).all() and inp.ema.dtype == np.float64
    assert inp.seen.tolist() == [0] * 5 and inp.seen.dtype == np.int32
    assert inp.last_epoch is None
    for column in (inp.last_loss, inp.ema, inp.seen):  # a constant view: no memory, read-only
        assert len(column) == 5 and column.strides == (0,) and not column.flags.writeable
    given = {c: np.zeros(5, dtype=np.int32) for c in ("seen", "last_epoch")}
    both = PolicyInput.from_columns({"uid": uid, **given}, epoch=0, epochs=1, seed=0)
    assert both.seen is given["seen"] and both.last_epoch is given["last_epoch"]


def test_from_columns_and_the_constructor_check_the_columns():
    uid = np.arange(3, dtype=np.uint64)
    with pytest.raises(InvalidInputError, match=r"PolicyInput has no column\(s\) \['nonfinite'\]; a policy may read "):
        PolicyInput.from_columns({"uid": uid, "nonfinite": uid}, epoch=0, epochs=1, seed=0)
    with pytest.raises(InvalidInputError, match=r"PolicyInput.last_epoch has 2 rows, uid has 3"):
        PolicyInput.from_columns({"uid": uid, "last_epoch": np.zeros(2, np.int32)}, epoch=0, epochs=1, seed=0)
    loss = np.ones(3, np.float32)
    positional = PolicyInput(uid, loss, loss.astype(np.float64), np.ones(3, np.int32), None, 0, 2, 0)
    assert positional.last_epoch is None and run_policy("seta", positional).summary["kept"] == 3


# ---------------------------------------------------------------- declarations of the policies
def test_every_policy_declares_its_columns_and_settings():
    declared = {
        name: (set(spec.columns(spec.make_params())), [(s.name, s.param) for s in spec.settings])
        for name, spec in POLICIES.items()
        if not name.startswith("test_")
    }
    assert declared == {
        "full": (set(), []),
        "random": ({"uid"}, []),
        "static": ({"uid"}, []),
        "seta": ({"uid", "last_loss", "seen"}, []),
        "infobatch": ({"uid", "last_loss", "seen"}, []),
        "es": ({"uid", "seen", "ema"}, [("ema_beta2", "beta2")]),
        "eswp": ({"uid", "seen", "ema"}, [("ema_beta2", "beta2")]),
    }
    assert PLAN_COLUMNS == ("uid", "last_loss", "seen") and set(PLAN_COLUMNS) <= set(INPUT_COLUMNS)
    for spec in POLICIES.values():  # no built-in policy makes a plan read last_epoch
        assert "last_epoch" not in spec.table_columns(spec.make_params()) or spec.name.startswith("test_")


def _input_with_distinct_columns(epoch: int) -> PolicyInput:
    """Every column carries its own information: an EMA unrelated to the last loss, some
    unseen rows, last epochs that vary."""
    rng = np.random.default_rng(epoch)
    n = 600
    uid = rng.choice(2**62, size=n, replace=False).astype(np.uint64)
    loss = rng.lognormal(size=n).astype(np.float32)
    ema = rng.lognormal(size=n)
    seen = rng.integers(1, 4, n).astype(np.int32)
    seen[:50] = 0
    loss[:50], ema[:50] = np.nan, np.nan
    last_epoch = np.where(seen > 0, rng.integers(0, max(epoch, 1), n), -1).astype(np.int32)
    return PolicyInput(uid, loss, ema, seen, last_epoch, epoch, 10, 3, n_ref=1000)


@pytest.mark.parametrize("epoch", [0, 3, 9])
@pytest.mark.parametrize(
    "case",
    [
        *[("full", {}), ("random", {"r": 0.4}), ("random", {"r": 0.4, "delta": 0.5}), ("static", {"r": 0.2})],
        *[("seta", {"r": 0.1, "k": 5, "alpha": 0.6}), ("seta", {"r": 0.2, "k": 4, "target_keep": 0.5})],
        *[("infobatch", {"r": 0.5}), ("infobatch", {"r": 0.5, "score": "ema"})],
        *[("es", {}), ("eswp", {"r": 0.3}), ("eswp", {"r": 0.3, "anneal_ratio": 0.0})],
    ],
)
def test_every_policy_reads_only_the_columns_it_declares(case, epoch):
    """The policy's own result from its declared columns alone (the others constant, as the
    planner passes them) equals its result from every column."""
    name, params = case
    spec, p = get_policy(name), get_policy(name).make_params(**params)
    inp = _input_with_distinct_columns(epoch)
    declared = {c: getattr(inp, c) for c in {"uid", *spec.columns(p)}}
    only = PolicyInput.from_columns(declared, epoch=inp.epoch, epochs=inp.epochs, seed=inp.seed, n_ref=inp.n_ref)
    a, b = spec.fn(inp, p), spec.fn(only, p)
    assert np.array_equal(a.keep, b.keep) and np.array_equal(a.weight, b.weight)
    assert np.array_equal(a.reason, b.reason) and a.absent_rule == b.absent_rule
    assert (a.cluster is None) == (b.cluster is None) and (a.cluster is None or np.array_equal(a.cluster, b.cluster))
    assert (a.score is None) == (b.score is None) and (a.score is None or np.array_equal(a.score, b.score))
    assert json.dumps(a.summary, sort_keys=True) == json.dumps(b.summary, sort_keys=True)


def test_an_undeclared_column_would_change_the_plan():
    """The test above can fail: InfoBatch on the EMA, given only the last loss, plans otherwise."""
    inp = _input_with_distinct_columns(3)
    spec, p = get_policy("infobatch"), get_policy("infobatch").make_params(r=0.5, score="ema")
    wrong = {c: getattr(inp, c) for c in ("uid", "seen", "last_loss")}
    only = PolicyInput.from_columns(wrong, epoch=3, epochs=10, seed=3)
    assert not np.array_equal(spec.fn(inp, p).keep, spec.fn(only, p).keep)


def test_table_columns_refuse_a_column_no_policy_input_carries():
    spec = PolicySpec("bad", dict, lambda inp, p: None, "reads a column the table has but PolicyInput lacks",
                      lambda p: {"uid", "nonfinite"})  # fmt: skip
    with pytest.raises(
        InvalidInputError, match=r"policy 'bad' declares column\(s\) \['nonfinite'\]; a policy may read"
    ):
        spec.table_columns({})
    undeclared = PolicySpec("open", dict, lambda inp, p: None, "declares nothing: reads every column")
    assert undeclared.table_columns({}) == list(INPUT_COLUMNS) and undeclared.settings == ()


def test_run_settings_for_completes_the_settings_of_a_new_run():
    assert run_settings_for("seta", {"k": 5}, None) is None
    assert run_settings_for("seta", None, {"shard_depth": 2}) == {"shard_depth": 2}
    assert run_settings_for("no_such_policy", {"x": 1}, None) is None  # planning reports the name
    assert run_settings_for("es", None, None) == {"ema_beta2": 0.9}
    assert run_settings_for("eswp", {"beta2": 0.6}, {"shard_depth": 2}) == {"shard_depth": 2, "ema_beta2": 0.6}
    assert run_settings_for("eswp", {"beta2": 0.6}, {"ema_beta2": 0.7}) == {"ema_beta2": 0.7}  # given wins
    with pytest.raises(InvalidInputError, match=r"eswp: beta2=1.0 is outside the valid range"):
        run_settings_for("eswp", {"beta2": 1.0}, None)


# ---------------------------------------------------------------- planning a policy registered here
@dataclass(frozen=True)
class ProbeParams:
    """A test policy's one parameter, tied to the run setting ``dataset_size``."""

    size: int | None = None


INPUTS: list[PolicyInput] = []


def probe(inp: PolicyInput, p: ProbeParams) -> PolicyResult:
    """Keep every sample; remember what the planner passed."""
    INPUTS.append(inp)
    n = inp.n
    return PolicyResult(
        np.ones(n, bool), np.ones(n, np.float32), np.full(n, reason_code("all"), np.int8), {"phase": "prune"}
    )


SIZE = RunSetting("dataset_size", "size", "the run's data set size")


@pytest.fixture
def probes():
    """Policies registered by a test, as a user would: none is named in plan.py or session.py."""
    specs = [
        PolicySpec("test_last_epoch", ProbeParams, probe, "reads last_epoch", lambda p: {"uid", "last_epoch"}),
        PolicySpec("test_every_column", ProbeParams, probe, "declares nothing"),
        PolicySpec("test_sized", ProbeParams, probe, "fixes dataset_size", lambda p: {"uid"}, (SIZE,)),
    ]
    for spec in specs:
        register(spec)
    INPUTS.clear()
    try:
        yield
    finally:
        for spec in specs:
            POLICIES.pop(spec.name)
        INPUTS.clear()


def recorded_run(path):
    """k0..k29 recorded in epoch 0, k20..k39 in epoch 1: last_epoch 0 or 1, seen 1 or 2."""
    run = RunDir(path, create=True)
    for epoch, keys in ((0, range(0, 30)), (1, range(20, 40))):
        with LossRecorder(run, epoch=epoch) as rec:
            rec.record(
                [f"k{i}" for i in keys], ["s.tar"] * len(keys), np.linspace(0.1, 2.0, len(keys), dtype=np.float32)
            )
        compact(run)
    return run


def by_uid(inp, column):
    return dict(zip(inp.uid.tolist(), getattr(inp, column).tolist()))


def test_a_registered_policy_gets_the_extra_column_it_declares_from_plan_epoch(tmp_path, probes):
    run = recorded_run(tmp_path / "r")
    table = load_table(run, ["key", "uid", "last_epoch", "seen"]).to_pylist()
    last_epoch = {r["uid"]: r["last_epoch"] for r in table}
    assert sorted(set(last_epoch.values())) == [0, 1]
    plan_epoch(run, 2, policy="test_last_epoch", epochs=4)
    (inp,) = INPUTS
    assert by_uid(inp, "last_epoch") == last_epoch
    assert by_uid(inp, "seen") == {r["uid"]: r["seen"] for r in table}  # the plan's own columns
    assert np.isnan(inp.ema).all() and inp.ema.strides == (0,)  # not declared: not read
    # listed samples never recorded are unseen rows with last_epoch -1
    listed = [("s.tar", f"k{i}") for i in range(45)]
    plan_epoch(run, 3, population=listed)
    rows = {int(u): int(e) for u, e in zip(INPUTS[1].uid, INPUTS[1].last_epoch)}
    assert len(rows) == 45 and sorted(rows.values()).count(-1) == 5
    assert {u: e for u, e in rows.items() if e >= 0} == last_epoch


def test_a_policy_that_declares_nothing_gets_every_column_and_seta_gets_no_last_epoch(tmp_path, probes):
    run = recorded_run(tmp_path / "r")
    table = load_table(run, ["uid", "ema", "last_epoch"]).to_pylist()
    plan_epoch(run, 2, policy="test_every_column", epochs=4)
    (inp,) = INPUTS
    assert by_uid(inp, "ema") == {r["uid"]: r["ema"] for r in table}
    assert by_uid(inp, "last_epoch") == {r["uid"]: r["last_epoch"] for r in table}
    captured = []
    seta = POLICIES["seta"]
    POLICIES["seta"] = PolicySpec(
        "seta", seta.params_type, lambda i, p: captured.append(i) or seta.fn(i, p), seta.description, seta.columns
    )
    try:
        plan_epoch(recorded_run(tmp_path / "s"), 2, policy="seta", epochs=4)
    finally:
        POLICIES["seta"] = seta
    (inp,) = captured
    assert inp.last_epoch is None and inp.ema.strides == (0,) and inp.last_loss.strides != (0,)


def test_a_registered_policy_fixes_its_run_setting_without_edits_to_plan_or_session(tmp_path, probes):
    Pruner(tmp_path / "a", policy="test_sized", params={"size": 123}, epochs=3)
    assert RunDir(tmp_path / "a").settings["dataset_size"] == 123
    Pruner(tmp_path / "b", policy="test_sized", params={"size": 123}, epochs=3, settings={"dataset_size": 7})
    assert RunDir(tmp_path / "b").settings["dataset_size"] == 7  # a setting given wins
    run = recorded_run(tmp_path / "r")  # dataset_size None
    with pytest.raises(InvalidInputError) as info:
        plan_epoch(run, 2, policy="test_sized", params={"size": 40}, epochs=4)
    assert str(info.value) == (
        f"{run.display('seta-stream.json')}: the run's data set size uses size=None, policy test_sized asks "
        "size=40; dataset_size is fixed when the run is created. Create the run with settings={'dataset_size': 40} "
        "(Pruner does this for policy test_sized), or pass the run's size"
    )
    assert INPUTS == []  # refused before the policy ran
    summary = plan_epoch(run, 2, policy="test_sized", epochs=4)  # size None = the run's
    assert summary["kept"] == 40 and len(INPUTS) == 1
