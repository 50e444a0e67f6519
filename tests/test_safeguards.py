"""The plan safeguards every policy accepts (docs/algorithms.md §0.10): the floor on an epoch's
kept count (``min_keep_fraction``), the cap on weights (``max_weight``), and the warnings of a plan
(summary ``warnings``, ``inspect``, ``Pruner.start_epoch``)."""

from __future__ import annotations

import dataclasses
import json
import math
import warnings

import numpy as np
import pytest
import webdataset as wds
from conftest import seeded_run, write_shards
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from policy_helpers import split_plan, whole_plan
from test_policy_steps import assert_same, table

import seta_stream as seta
from seta_stream.policies import (
    REASONS,
    PolicyInput,
    PolicyResult,
    describe_policies,
    finalize,
    get_policy,
    plan_params,
    policy_params,
    reason_code,
    run_policy,
)
from seta_stream.policies.steps import Decide

MASK = (1 << 64) - 1


def mix(x: int) -> int:
    """SplitMix64's finalizer (§0.4), written out again here: the reference the plans are held to."""
    z = (x + 0x9E3779B97F4A7C15) & MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return z ^ (z >> 31)


def u_of(uid: int, seed: int, epoch: int, stream: int) -> float:
    salt = mix(mix(mix(seed) ^ epoch) ^ stream)
    return (mix(int(uid) ^ salt) >> 11) * 2.0**-53


def reference_fill(
    keep: np.ndarray, uid: np.ndarray, seed: int, epoch: int, floor: int, among: np.ndarray | None = None
) -> set[int]:
    """Rows the floor adds: the (floor - kept) dropped rows of smallest stream-9 u, ties by uid
    (``among``: only these rows may be added, the rows not left out as suspected noise)."""
    need = floor - int(keep.sum())
    if need <= 0:
        return set()
    may = ~keep if among is None else ~keep & among
    dropped = sorted((u_of(int(uid[i]), seed, epoch, 9), int(uid[i]), i) for i in np.flatnonzero(may))
    return {i for _, _, i in dropped[:need]}


def lognormal(n: int, epoch: int = 3, epochs: int = 10, seed: int = 0) -> PolicyInput:
    rng = np.random.default_rng(7)
    uid = rng.integers(0, 2**64 - 1, n, dtype=np.uint64, endpoint=True)
    return PolicyInput.from_losses(uid, rng.lognormal(size=n).astype(np.float32), epoch=epoch, epochs=epochs, seed=seed)


# ---------------------------------------------------------------- the floor
def test_the_floor_fills_a_small_seta_epoch_up_to_floor_f_n_with_the_smallest_stream_9_draws():
    inp = lognormal(1000, epoch=5)
    params = dict(r=0.3, k=10, alpha=0.3)  # w = 3 of 10 clusters: epoch 5's window is clusters 5..7
    plain = run_policy("seta", inp, **params)
    assert plain.summary["kept"] == sum(plain.summary["cluster_sizes"][5:8]) == 33  # of the 700 drawn
    floored = run_policy("seta", inp, **params, min_keep_fraction=0.25)
    added = np.flatnonzero(floored.keep & ~plain.keep)
    assert set(added.tolist()) == reference_fill(plain.keep, inp.uid, 0, 5, 250)
    assert floored.summary["kept"] == 250 and len(added) == 217
    assert np.all(floored.keep[plain.keep])  # what the policy kept stays kept, as it was
    assert np.array_equal(floored.reason[plain.keep], plain.reason[plain.keep])
    assert np.all(floored.reason[added] == reason_code("floor_fill")) and np.all(floored.weight[added] == 1.0)
    assert np.all(floored.weight[~floored.keep] == 0.0)
    s = floored.summary
    assert s["safeguards"] == {"min_keep_fraction": 0.25, "max_weight": None, "floor": 250, "filled": 217, "capped": 0}
    assert s["params"] == {**plain.summary["params"], "min_keep_fraction": 0.25}
    assert s["kept_by_reason"]["floor_fill"] == 217 and s["rows_by_reason"]["floor_fill"] == 217
    assert [w["code"] for w in plain.summary["warnings"]] == ["low_keep"] and s["warnings"] == []
    for f in ("k_eff", "w", "s", "cluster_sizes", "n_downsampled"):  # the policy's own fields are the policy's
        assert s[f] == plain.summary[f]


def test_the_floor_leaves_an_epoch_that_keeps_enough_alone_and_rounds_down():
    inp = lognormal(1000, epoch=3)
    plain = run_policy("random", inp, r=0.7)  # keeps floor(0.3 * 1000) = 300
    same = run_policy("random", inp, r=0.7, min_keep_fraction=0.3)
    assert np.array_equal(same.keep, plain.keep) and np.array_equal(same.reason, plain.reason)
    assert same.summary["safeguards"]["floor"] == 300 and same.summary["safeguards"]["filled"] == 0
    more = run_policy("random", inp, r=0.7, min_keep_fraction=0.3005)  # floor(300.5) = 300: nothing to add
    assert more.summary["kept"] == 300 and more.summary["safeguards"]["filled"] == 0
    everything = run_policy("random", inp, r=0.7, min_keep_fraction=1.0)
    assert everything.keep.all() and everything.summary["kept_by_reason"] == {"kept": 300, "floor_fill": 700}


def test_the_floor_replaces_the_empty_plan_guard_and_the_guard_still_keeps_one_below_it():
    inp = lognormal(5, epoch=2)
    none_kept = run_policy("random", inp, r=0.9)  # floor(0.1 * 5) = 0 kept: the guard keeps one
    assert none_kept.summary["empty_plan_guard"] is True and none_kept.summary["kept"] == 1
    floored = run_policy("random", inp, r=0.9, min_keep_fraction=0.4)  # floor(2) = 2
    assert floored.summary["empty_plan_guard"] is False
    assert set(np.flatnonzero(floored.keep).tolist()) == reference_fill(np.zeros(5, bool), inp.uid, 0, 2, 2)
    below = run_policy("random", inp, r=0.9, min_keep_fraction=0.1)  # floor(0.5) = 0: the guard as before
    assert np.array_equal(below.keep, none_kept.keep) and below.summary["empty_plan_guard"] is True


def test_the_floor_is_row_order_free():
    inp = lognormal(600, epoch=5)
    perm = np.random.default_rng(3).permutation(600)
    shuffled = PolicyInput(
        inp.uid[perm], inp.last_loss[perm], inp.ema[perm], inp.seen[perm], inp.last_epoch[perm], 5, 10, 0
    )
    a = run_policy("seta", inp, r=0.2, k=8, alpha=0.25, min_keep_fraction=0.3)
    b = run_policy("seta", shuffled, r=0.2, k=8, alpha=0.25, min_keep_fraction=0.3)
    assert a.summary["safeguards"]["filled"] > 0
    assert np.array_equal(a.keep[perm], b.keep) and np.array_equal(a.reason[perm], b.reason)
    assert a.summary == b.summary


# ---------------------------------------------------------------- the cap
def test_the_cap_lowers_infobatch_weights_and_the_summary_counts_them():
    inp = lognormal(1000, epoch=3)
    plain = run_policy("infobatch", inp, r=0.9)
    m = plain.summary["m"]
    assert plain.summary["weight_histogram"] == {"1.0": 1000 - plain.summary["n_below_mean"], "10.0": m}
    capped = run_policy("infobatch", inp, r=0.9, max_weight=3)
    assert np.array_equal(capped.keep, plain.keep) and np.array_equal(capped.reason, plain.reason)
    assert capped.summary["weight_histogram"] == {"1.0": 1000 - plain.summary["n_below_mean"], "3.0": m}
    assert capped.summary["safeguards"] == {"min_keep_fraction": None, "max_weight": 3, "floor": 0, "filled": 0,
                                            "capped": m}  # fmt: skip
    assert capped.summary["weight"] == 10.0  # the policy's own field says what InfoBatch asked for
    assert capped.weight.dtype == np.float32 and set(np.unique(capped.weight).tolist()) == {0.0, 1.0, 3.0}
    assert run_policy("infobatch", inp, r=0.5, max_weight=3).summary["safeguards"]["capped"] == 0  # 2 <= 3


# ---------------------------------------------------------------- warnings in the summary
def test_low_keep_and_high_weight_warnings_say_what_where_and_the_remedy():
    seta_plan = run_policy("seta", lognormal(1000, epoch=5), r=0.3, k=10, alpha=0.3).summary
    assert seta_plan["warnings"] == [
        {
            "code": "low_keep",
            "value": 0.033,
            "limit": 0.1,
            "message": "plan of epoch 5 (seta): keeps 33 of 1000 samples (3.3%, below 10%; window: loss clusters "
            "5..7 of 10): the epoch trains few steps on a narrow part of the data, and accuracy may fall while it "
            "does. To keep at least a fraction f of every epoch, add min_keep_fraction=f to the policy's params "
            "(docs/algorithms.md §0.10)",
        }
    ]
    ib = run_policy("infobatch", lognormal(1000, epoch=3), r=0.9).summary
    assert ib["warnings"] == [
        {
            "code": "high_weight",
            "value": 10.0,
            "limit": 4.0,
            "message": "plan of epoch 3 (infobatch): kept samples weigh up to 10, above 4: their loss is multiplied "
            "by 10, as if they trained at 10 times the learning rate. To cap the weights at c, add max_weight=c to "
            "the policy's params (docs/algorithms.md §0.10)",
        }
    ]
    assert run_policy("infobatch", lognormal(1000, epoch=3), r=0.75).summary["warnings"] == []  # weight 4: at the limit


def test_hardest_window_is_named_and_annealing_or_full_epochs_do_not_warn():
    inp = lognormal(1000, epoch=7)  # k=10, w=3: s = 7 mod 8 = 7, clusters 7..9, the hardest
    s = run_policy("seta", inp, r=0.3, k=10, alpha=0.3).summary
    assert s["s"] == 7 and s["kept"] == sum(s["cluster_sizes"][7:]) == 11
    assert "(1.1%, below 10%; window: loss clusters 7..9 of 10 (the hardest)):" in s["warnings"][0]["message"]
    assert run_policy("seta", lognormal(1000, epoch=9), r=0.3, k=10, alpha=0.3).summary["warnings"] == []  # anneal
    assert run_policy("random", lognormal(1000), r=0.95).summary["warnings"][0]["value"] == 0.05


# ---------------------------------------------------------------- parameters
@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"min_keep_fraction": 0}, "min_keep_fraction=0 is outside the valid range 0 < min_keep_fraction <= 1"),
        ({"min_keep_fraction": 1.5}, "min_keep_fraction=1.5 is outside the valid range"),
        ({"min_keep_fraction": True}, "min_keep_fraction=True is outside the valid range"),
        ({"max_weight": 0.5}, "max_weight=0.5 is outside the valid range max_weight >= 1"),
        ({"max_weight": math.inf}, "max_weight=inf is outside the valid range"),
        ({"max_weight": math.nan}, "max_weight=nan is outside the valid range"),
    ],
)
def test_bad_safeguards_are_refused_naming_the_policy_the_value_and_the_range(params, message):
    with pytest.raises(seta.errors.InvalidInputError, match=f"^random: {message}") as err:
        policy_params("random", r=0.3, **params)
    assert "`seta-stream policies` lists them" in str(err.value)


def test_safeguards_are_listed_for_every_policy_and_split_from_the_policy_parameters():
    for entry in describe_policies():
        assert entry["params"][-2:] == [
            {"name": "min_keep_fraction", "default": None, "safeguard": True},
            {"name": "max_weight", "default": None, "safeguard": True},
        ]
    spec, p, sg, _ = plan_params("infobatch", r=0.9, max_weight=2.5)
    assert (spec.name, p.r, sg.max_weight, sg.min_keep_fraction, sg.to_params()) == (
        "infobatch", 0.9, 2.5, None, {"max_weight": 2.5}
    )  # fmt: skip


# ---------------------------------------------------------------- partitioned plans
CASES = [
    ("seta", {"r": 0.3, "k": 10, "alpha": 0.3, "min_keep_fraction": 0.2}),
    ("seta", {"r": 0.1, "k": 5, "alpha": 0.6, "target_keep": 0.05, "min_keep_fraction": 0.5, "max_weight": 1.0}),
    ("random", {"r": 0.9, "min_keep_fraction": 0.3}),
    ("random", {"r": 0.5, "min_keep_fraction": 1.0}),
    ("static", {"r": 0.7, "min_keep_fraction": 0.01}),
    ("infobatch", {"r": 0.9, "max_weight": 2.0, "min_keep_fraction": 0.8}),
    ("infobatch", {"r": 0.6, "rescale": "exact", "max_weight": 1.5}),
    ("eswp", {"beta2": 0.9, "r": 0.8, "min_keep_fraction": 0.4}),
    ("full", {"min_keep_fraction": 0.5, "max_weight": 1.0}),
    ("seta", {"r": 0.3, "k": 10, "alpha": 0.3, "noise": True, "min_keep_fraction": 0.6, "max_weight": 1.0}),
    ("infobatch", {"r": 0.9, "noise": True, "noise_recheck": 0.5, "max_weight": 2.0, "min_keep_fraction": 0.7}),
    ("random", {"r": 0.9, "noise": True, "min_keep_fraction": 0.95}),
    ("full", {"noise": True, "noise_recheck": 0.0, "min_keep_fraction": 1.0}),
]


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    case=st.sampled_from(CASES),
    n=st.integers(0, 300),
    seed=st.integers(0, 2**16),
    buckets=st.integers(1, 7),
    epoch=st.integers(0, 9),
    ties=st.booleans(),
    unseen=st.sampled_from([0.0, 0.2, 1.0]),
    noisy=st.sampled_from([0.0, 0.25]),
)
def test_steps_with_safeguards_equal_the_whole_table_plan(case, n, seed, buckets, epoch, ties, unseen, noisy):
    name, params = case
    cols = table(n, seed, ties, unseen, 0.05, noisy)
    whole = whole_plan(name, params, cols, epoch, 10, seed)
    rows, summary = split_plan(name, params, cols, epoch, 10, seed, buckets, np.random.default_rng(seed + 1))
    assert_same(whole, rows, summary, n)
    if n and "min_keep_fraction" in params:
        # the floor, less the suspects it may not fill with (§0.10)
        left_out = whole.summary["rows_by_reason"].get("suspected_noise", 0)
        assert whole.summary["kept"] >= min(math.floor(params["min_keep_fraction"] * n + 1e-9), n - left_out)


@pytest.mark.parametrize("buckets", [1, 3])
def test_one_bucket_and_partitioned_floors_are_bit_identical_and_fill_exactly(buckets):
    cols = table(3000, 5, ties=False, unseen=0.1, nan=0.01)
    params = {"r": 0.3, "k": 10, "alpha": 0.3, "min_keep_fraction": 0.15}
    whole = whole_plan("seta", params, cols, 4, 10, 5)
    rows, summary = split_plan("seta", params, cols, 4, 10, 5, buckets, np.random.default_rng(9))
    assert_same(whole, rows, summary, 3000)
    plain = whole_plan("seta", {k: v for k, v in params.items() if k != "min_keep_fraction"}, cols, 4, 10, 5)
    assert plain.summary["kept"] < 450 == whole.summary["kept"]
    added = set(np.flatnonzero(whole.keep & ~plain.keep).tolist())
    assert added == reference_fill(plain.keep, cols["uid"], 5, 4, 450)


# ---------------------------------------------------------------- the run: plan_epoch, Pruner, inspect
def small_epochs_run(tmp_path, params, batch_size=None, batches=7):
    """The first 3 of 4 epochs (3 pruning epochs) of a SeTa run over 2 shards of 60 samples."""
    urls = write_shards(tmp_path / "s", [60, 60])
    run = str(tmp_path / "run")
    pruner = seta.Pruner(
        run, policy="seta", params=params, epochs=4, seed=1, population=seta.list_samples(urls),
        batch_size=batch_size,
    )  # fmt: skip
    ds = seta.attach(wds.WebDataset(urls, shardshuffle=False, empty_check=False), run)
    ds = ds.to_tuple("__key__", "__url__", "__weight__").batched(batches)
    summaries = []
    for epoch in range(3):
        summaries.append(pruner.start_epoch(epoch))
        for keys, urls_, _w in ds:
            losses = np.array([(int(k[-4:]) * 37 % 120) / 10 + 0.1 for k in keys], np.float32)
            pruner.record(keys, urls_, losses)
    pruner.close()
    return run, summaries


def test_start_epoch_warns_with_the_plan_summarys_warnings_and_inspect_shows_them(tmp_path):
    params = dict(r=0.0, k=12, alpha=0.1)  # w = 1: epochs 1 and 2 keep one loss cluster of twelve
    with pytest.warns(seta.errors.PlanWarning) as caught:
        run, summaries = small_epochs_run(tmp_path, params)
    caught = [w for w in caught if issubclass(w.category, seta.errors.PlanWarning)]  # not webdataset's ResourceWarnings
    codes = [(w.message.code, w.message.epoch) for w in caught]
    assert codes == [("low_keep", 1), ("low_keep", 2)]
    first = caught[0].message
    assert str(first) == (
        f"{run}/plans/epoch=1/summary.json: plan of epoch 1 (seta): keeps 8 of 120 samples (6.7%, below 10%; "
        "window: loss clusters 1..1 of 12): the epoch trains few steps on a narrow part of the data, and accuracy "
        "may fall while it does. To keep at least a fraction f of every epoch, add min_keep_fraction=f to the "
        "policy's params (docs/algorithms.md §0.10)"
    )
    assert (first.value, first.limit) == (8 / 120, 0.1) and caught[0].filename == __file__
    assert [s["kept"] for s in summaries] == [120, summaries[1]["cluster_sizes"][1], summaries[2]["cluster_sizes"][2]]
    assert [s["kept"] for s in summaries] == [120, 8, 10]
    on_disk = json.loads((tmp_path / "run/plans/epoch=1/summary.json").read_text())
    assert on_disk["warnings"] == summaries[1]["warnings"] and on_disk["warnings"][0]["code"] == "low_keep"
    s = seta.inspect.run_summary(run)
    assert [e["warnings"] for e in s["epochs"]] == [[], ["low_keep"], ["low_keep"]]
    assert [(w["epoch"], w["code"]) for w in s["warnings"]] == [(1, "low_keep"), (2, "low_keep")]
    text = seta.inspect.format_summary(s)
    assert text.splitlines()[2:6] == [
        "epoch  phase             n       kept   pruned   so far    trained  warnings",
        "    0  prune           120        120     0.0%     0.0%        120  -",
        "    1  prune           120          8    93.3%    46.7%          8  low_keep",
        "    2  prune           120         10    91.7%    61.7%         10  low_keep",
    ]
    assert f"  epoch 1 [low_keep] {summaries[1]['warnings'][0]['message']}" in text.splitlines()
    assert json.loads(json.dumps(s)) == s


def test_the_floor_in_a_run_removes_the_warning_and_keeps_the_fraction(tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("error", seta.errors.SetaStreamWarning)  # no PlanWarning
        run, summaries = small_epochs_run(tmp_path, dict(r=0.0, k=12, alpha=0.1, min_keep_fraction=0.25))
    assert [s["kept"] for s in summaries] == [120, 30, 30]
    assert [s["kept_by_reason"].get("floor_fill", 0) for s in summaries] == [0, 22, 20]
    plan = seta.load_plan(run, 1)
    assert plan.filter(plan.column("keep")).num_rows == 30
    assert seta.inspect.run_summary(run)["warnings"] == []


def test_a_known_batch_size_warns_of_a_final_batch_of_a_few_samples(tmp_path):
    params = dict(r=0.0, k=12, alpha=0.1, min_keep_fraction=0.25)  # 120, 30, 30 kept
    with pytest.warns(seta.errors.PlanWarning) as caught:
        run, summaries = small_epochs_run(tmp_path, params, batch_size=29)
    caught = [w for w in caught if issubclass(w.category, seta.errors.PlanWarning)]
    assert [(w.message.code, w.message.epoch, w.message.value) for w in caught] == [
        ("small_final_batch", 0, 4), ("small_final_batch", 1, 1), ("small_final_batch", 2, 1)
    ]  # fmt: skip
    assert summaries[1]["batch_size"] == 29 and summaries[1]["warnings"][0]["message"] == (
        "plan of epoch 1 (seta): keeps 30 samples, so batches of 29 end with a batch of 1 sample: one optimiser "
        "step on 1 sample (a gradient about 5 times a full batch's) can throw the model off at the end of the epoch "
        "(test accuracy at chance in docs/quality-runs/collapses.json). Drop the last partial batch (webdataset "
        "batched(..., partial=False), DataLoader drop_last=True), or scale each batch's loss by its size: "
        "seta_stream.weighted_mean(losses, weights, batch_size=...)"
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error", seta.errors.SetaStreamWarning)
        small_epochs_run(tmp_path / "b", params, batch_size=30)  # 120, 30, 30: no partial batch
    with pytest.raises(
        seta.errors.InvalidInputError, match=r"^Pruner: batch_size=0, expected an integer >= 1 or None$"
    ):
        seta.Pruner(tmp_path / "c", policy="full", epochs=1, batch_size=0)


def test_plan_epoch_of_a_partitioned_run_gives_the_one_bucket_plan_with_safeguards_and_batch_size(tmp_path):
    params = dict(r=0.3, k=10, alpha=0.3, min_keep_fraction=0.2, max_weight=1.0)
    plans = {}
    for buckets in (1, 2):
        run = seeded_run(tmp_path / f"b{buckets}", n=400, shards=8, buckets=buckets)
        s = seta.plan_epoch(run, 5, policy="seta", params=params, epochs=10, seed=3, batch_size=16)
        plans[buckets] = (s, seta.load_plan(run, 5).sort_by("uid"))
    (one, p1), (two, p2) = plans[1], plans[2]
    assert one["kept"] == 80 and one["safeguards"]["filled"] == 80 - one["kept_by_reason"]["window"] > 0
    assert one["batch_size"] == 16 and one["warnings"] == []  # 80 = 5 x 16: no partial batch
    drop = {"stage", "table_generation"}
    assert {k: v for k, v in one.items() if k not in drop} == {k: v for k, v in two.items() if k not in drop}
    for c in ("uid", "keep", "weight", "reason"):
        assert p1.column(c).to_pylist() == p2.column(c).to_pylist(), c


# ---------------------------------------------------------------- weighted_mean's nominal batch size
def test_weighted_mean_with_a_nominal_batch_size_divides_by_it():
    losses, weights = np.array([1.0, 2.0, 4.0], np.float32), [1.0, 2.0, 0.5]
    assert seta.weighted_mean(losses, weights) == pytest.approx(7.0 / 3)
    assert seta.weighted_mean(losses, weights, batch_size=8) == 0.875
    torch = pytest.importorskip("torch")
    t = torch.tensor([1.0, 2.0, 4.0])
    assert float(seta.weighted_mean(t, weights, batch_size=8)) == 0.875
    assert float(seta.weighted_mean(t, {"__weight__": weights})) == pytest.approx(7.0 / 3)
    with pytest.raises(seta.errors.InvalidInputError, match="weighted_mean: batch_size=0"):
        seta.weighted_mean(losses, weights, batch_size=0)


@pytest.mark.parametrize("buckets", [1, 3])
def test_the_floor_never_refills_an_epoch_with_suspected_noise(buckets):
    cols = table(3000, 11, ties=False, unseen=0.0, nan=0.0, noisy=0.2)
    params = {"r": 0.9, "noise": True, "noise_recheck": 0.1, "min_keep_fraction": 0.95}
    whole = whole_plan("random", params, cols, 4, 10, 11)
    rows, summary = split_plan("random", params, cols, 4, 10, 11, buckets, np.random.default_rng(3))
    assert_same(whole, rows, summary, 3000)
    plain = whole_plan("random", {k: v for k, v in params.items() if k != "min_keep_fraction"}, cols, 4, 10, 11)
    why = np.array([REASONS[r] for r in whole.reason])
    suspected = np.array([REASONS[r] for r in plain.reason]) == "suspected_noise"
    assert suspected.sum() > 200 and whole.summary["noise_active"]
    # the floor (2,850 rows) asks for more than the rows the policy pruned: it takes every one of
    # them and not one suspect, which stay left out as suspected noise
    assert set(np.flatnonzero(why == "floor_fill").tolist()) == set(np.flatnonzero(~plain.keep & ~suspected).tolist())
    assert (why[suspected] == "suspected_noise").all()
    assert whole.summary["kept"] == int(plain.keep.sum() + (~plain.keep & ~suspected).sum()) < 2850
    # the re-checked suspects keep their weight 0 under a cap
    capped = whole_plan("random", {**params, "max_weight": 1.0}, cols, 4, 10, 11)
    assert (capped.weight[np.array([REASONS[r] for r in capped.reason]) == "noise_recheck"] == 0).all()


def reasons_of(result):
    return np.array([REASONS[r] for r in result.reason])


@pytest.mark.parametrize("buckets", [1, 3])
def test_the_floor_fills_among_the_non_suspects_exactly_counting_the_re_checks_as_kept(buckets):
    cols = table(3000, 11, ties=False, unseen=0.0, nan=0.0, noisy=0.2)
    params = {"r": 0.9, "noise": True, "noise_recheck": 0.1, "min_keep_fraction": 0.5}
    plain = whole_plan("random", {k: v for k, v in params.items() if k != "min_keep_fraction"}, cols, 4, 10, 11)
    why = reasons_of(plain)
    suspected = (why == "suspected_noise") | (why == "noise_recheck")
    rechecked = int((why == "noise_recheck").sum())
    assert plain.summary["noise_active"] and plain.summary["noise_suspected"] == int(suspected.sum()) > 200
    assert rechecked == plain.summary["noise_rechecked"] > 0
    kept = plain.summary["kept"]
    assert kept == math.floor(0.1 * (3000 - suspected.sum()) + 1e-9) + rechecked  # the plan's count
    whole = whole_plan("random", params, cols, 4, 10, 11)
    rows, summary = split_plan("random", params, cols, 4, 10, 11, buckets, np.random.default_rng(5))
    assert_same(whole, rows, summary, 3000)  # one bucket and three: the whole table's plan, bit for bit
    added = set(np.flatnonzero(whole.keep & ~plain.keep).tolist())
    # F = 1500 and the re-checks count as kept: 1500 - kept rows, the smallest stream-9 draws
    # among the rows the policy dropped that are not suspects
    assert added == reference_fill(plain.keep, cols["uid"], 11, 4, 1500, among=~suspected)
    assert len(added) == 1500 - kept == whole.summary["safeguards"]["filled"] and whole.summary["kept"] == 1500
    # the suspects' own draws would have taken places: the exclusion is what makes the fill
    assert added != reference_fill(plain.keep, cols["uid"], 11, 4, 1500)
    assert np.array_equal(reasons_of(whole)[suspected], why[suspected])  # suspects stay as the rule left them
    assert (whole.weight[why == "noise_recheck"] == 0).all() and (whole.weight[sorted(added)] == 1).all()
    assert whole.summary["kept_by_reason"]["noise_recheck"] == rechecked


@pytest.mark.parametrize("buckets", [1, 3])
def test_the_cap_leaves_the_re_checks_at_weight_0_and_does_not_count_them(buckets):
    cols = table(3000, 11, ties=False, unseen=0.0, nan=0.0, noisy=0.2)
    params = {"r": 0.9, "noise": True, "noise_recheck": 0.5}
    plain = whole_plan("infobatch", params, cols, 4, 10, 11)
    capped = whole_plan("infobatch", {**params, "max_weight": 2.0}, cols, 4, 10, 11)
    rows, summary = split_plan(
        "infobatch", {**params, "max_weight": 2.0}, cols, 4, 10, 11, buckets, np.random.default_rng(8)
    )
    assert_same(capped, rows, summary, 3000)
    recheck = reasons_of(plain) == "noise_recheck"
    assert recheck.sum() > 100 and (capped.weight[recheck] == 0).all() and capped.keep[recheck].all()
    over = plain.keep & (plain.weight > 2.0)
    assert over.sum() > 0 and capped.summary["safeguards"]["capped"] == int(over.sum())
    assert (capped.weight[over] == np.float32(2.0)).all()
    assert np.array_equal(capped.weight[~over], plain.weight[~over]) and np.array_equal(capped.keep, plain.keep)
    assert capped.summary["weight_histogram"]["0.0"] == int(recheck.sum())
    assert [w["code"] for w in plain.summary["warnings"]] == ["high_weight"] and capped.summary["warnings"] == []


def test_low_keep_counts_the_kept_samples_as_the_plan_does_re_checks_included():
    cols = table(3000, 11, ties=False, unseen=0.0, nan=0.0, noisy=0.2)
    params = {"r": 0.95, "noise": True, "noise_recheck": 0.1}
    plain = whole_plan("random", params, cols, 4, 10, 11)
    s = plain.summary
    rechecked = s["kept_by_reason"]["noise_recheck"]
    assert rechecked > 0 and s["kept"] == s["kept_by_reason"]["kept"] + rechecked == int(plain.keep.sum())
    (warning,) = s["warnings"]
    assert warning["code"] == "low_keep" and warning["value"] == s["kept"] / 3000 < 0.1
    assert f"keeps {s['kept']} of 3000 samples" in warning["message"]
    floored = whole_plan("random", {**params, "min_keep_fraction": 0.1}, cols, 4, 10, 11)
    assert floored.summary["kept"] == 300 and floored.summary["safeguards"]["filled"] == 300 - s["kept"]
    assert floored.summary["warnings"] == []


def _all_suspects(inp, p):
    """Every row left out as suspected noise: nothing kept, nothing the floor may fill."""
    return PolicyResult(
        keep=np.zeros(inp.n, bool),
        weight=np.zeros(inp.n, np.float32),
        reason=np.full(inp.n, reason_code("suspected_noise"), np.int8),
        summary={"phase": "prune"},
    )


def _all_suspects_steps(ctx, p):
    return Decide(lambda inp: _all_suspects(inp, p), {"phase": "prune"})
    yield  # a generator with no step


@pytest.mark.parametrize("buckets", [1, 3])
def test_with_nothing_kept_and_nothing_to_fill_the_guard_keeps_one_row_as_over_buckets(buckets):
    spec = dataclasses.replace(get_policy("full"), fn=_all_suspects, steps=_all_suspects_steps)
    cols = table(200, 4, ties=False, unseen=0.0, nan=0.0)
    whole = whole_plan("full", {"min_keep_fraction": 0.5}, cols, 3, 10, 4, spec=spec)
    assert whole.summary["empty_plan_guard"] is True and whole.summary["kept"] == 1
    assert whole.summary["kept_by_reason"] == {"empty_plan_guard": 1} and whole.summary["safeguards"]["filled"] == 0
    rows, summary = split_plan("full", {"min_keep_fraction": 0.5}, cols, 3, 10, 4, buckets, np.random.default_rng(2),
                               spec=spec)  # fmt: skip
    assert_same(whole, rows, summary, 200)


@pytest.mark.parametrize(
    "stray", [None, (5, -0.0), ((1 << 20) + 3, 0.5), (2_100_000 - 1, 1e-45)], ids=["clean", "neg-zero", "half", "tiny"]
)
def test_finalize_gives_every_row_not_kept_weight_plus_zero_across_blocks(stray):
    """A policy may leave a weight on a row it does not keep (-0.0, 0.5, the smallest
    subnormal), in any block of 2^20 rows: finalize zeroes it, and only it; clean weights are
    kept as they are, in the same array."""
    n = 2_100_000
    rng = np.random.default_rng(4)
    keep = rng.random(n) < 0.5
    weight = keep.astype(np.float32)
    keep[[5, (1 << 20) + 3, n - 1]] = False
    weight[[5, (1 << 20) + 3, n - 1]] = 0.0
    if stray is not None:
        weight[stray[0]] = np.float32(stray[1])
    want = np.where(keep, weight, np.float32(0.0))
    inp = PolicyInput.from_losses(np.arange(n, dtype=np.uint64), np.ones(n, np.float32), epoch=1, epochs=3, seed=0)
    result = PolicyResult(keep, weight, np.zeros(n, np.int8), {})
    finalize(result, inp, "seta", {})
    assert result.weight.view(np.uint32).tobytes() == want.view(np.uint32).tobytes()
    assert (result.weight is weight) == (stray is None)
    if stray is not None:
        assert weight[stray[0]] == np.float32(stray[1])  # the policy's own array is left as it was
