"""The noise rule (docs/algorithms.md §12): suspects from the loss history, the two-mode test,
warm-up, re-checks, the composition with full, random, seta and infobatch, and its plans on
real run directories (one bucket and partitioned)."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pyarrow as pa
import pytest
from policy_helpers import noise_suspects, two_gaussians

from seta_stream import RunDir, compact, load_plan, plan_epoch
from seta_stream._kernels.kmeans1d import points1d, points1d_steps
from seta_stream._kernels.mapreduce import run_steps
from seta_stream._kernels.mixture1d import fit_two_gaussians
from seta_stream.errors import InvalidInputError
from seta_stream.policies import REASONS, PolicyInput, plan_params, policy_params, run_policy
from seta_stream.policies.random_draws import STREAM_NOISE, uniform_of
from seta_stream.policies.registry import planned_table_columns
from seta_stream.testing import LossRecorder

NOISE_FIELDS = {
    "noise_active",
    "noise_test",
    "noise_candidates",
    "noise_suspected",
    "noise_rechecked",
    "noise_threshold",
    "noise_scale",
    "noise_separation",
    "noise_components",
}


def columns(mean, last=None, count=None, seen=None):
    """Table columns of len(mean) samples: history mean, last loss (default: the mean), finite
    records (default 3), seen (default: the count)."""
    mean = np.asarray(mean, np.float64)
    n = len(mean)
    count = np.full(n, 3, np.int32) if count is None else np.asarray(count, np.int32)
    last = mean.astype(np.float32) if last is None else np.asarray(last, np.float32)
    return {
        "uid": (np.arange(n, dtype=np.uint64) + np.uint64(1)) * np.uint64(0x9E3779B97F4A7C15),
        "last_loss": last,
        "ema": mean.copy(),
        "seen": count.copy() if seen is None else np.asarray(seen, np.int32),
        "last_epoch": np.full(n, 2, np.int32),
        "loss_count": count,
        "loss_mean": mean,
    }


def plan(name, cols, epoch=3, epochs=10, seed=7, **params):
    """The plan of ``name`` with ``params`` on ``cols``; the rule's first version (its threshold
    where the components cross) unless ``noise_rule`` is given: most tests of this file were
    written for it, and it stays what runs planned with it plan (§12.12 tests the second)."""
    if params.get("noise") and "noise_rule" not in params:
        params["noise_rule"] = 1
    spec, p, _, noise = plan_params(name, **params)
    inp = PolicyInput.from_columns(
        {c: cols[c] for c in planned_table_columns(spec, p, noise)},
        epoch=epoch,
        epochs=epochs,
        seed=seed,
    )
    return run_policy(name, inp, **params)


def reasons(result):
    return [REASONS[r] for r in result.reason]


def two_mode_table():
    """40 clean samples (means 1.00 .. 1.39), 10 noisy ones (means 8.00 .. 8.09); noisy sample
    40 has a low last loss (released), noisy sample 41 one finite record (warm-up)."""
    mean = np.r_[1.0 + 0.01 * np.arange(40), 8.0 + 0.01 * np.arange(10)]
    last = mean.astype(np.float32)
    last[40] = 0.5
    count = np.full(50, 3)
    count[41] = 1
    return columns(mean, last, count)


def test_two_modes_suspect_the_upper_mode_by_mean_and_last_loss_and_recheck_the_smallest_uniforms():
    cols = two_mode_table()
    res = plan("full", cols, noise=True, noise_recheck=0.25)
    suspects = list(range(42, 50))
    # the 2 (floor(0.25 x 8)) suspects of smallest uniform of stream 8, ties by uid
    u = {i: uniform_of(int(cols["uid"][i]), 7, 3, STREAM_NOISE) for i in suspects}
    rechecked = sorted(suspects, key=lambda i: (u[i], int(cols["uid"][i])))[:2]
    expected = ["all"] * 50
    for i in suspects:
        expected[i] = "noise_recheck" if i in rechecked else "suspected_noise"
    assert reasons(res) == expected
    assert res.keep.tolist() == [r != "suspected_noise" for r in expected]
    assert res.weight.tolist() == [0.0 if i in suspects else 1.0 for i in range(50)]  # re-checks: weight 0
    s = res.summary
    assert {k: s[k] for k in ("noise_active", "noise_test", "noise_candidates", "noise_suspected")} == {
        "noise_active": True,
        "noise_test": "two_modes",
        "noise_candidates": 49,  # sample 41 has one finite record, the warm-up asks 2
        "noise_suspected": 8,
    }
    assert (s["noise_rechecked"], s["kept"], s["rows_by_reason"]) == (
        2,
        44,
        {"all": 40 + 2, "suspected_noise": 6, "noise_recheck": 2},
    )
    assert s["weight_histogram"] == {"0.0": 2, "1.0": 42}
    # the mixture, recomputed independently by EM on the 49 candidates' scores
    w, mu, sd, d, t = two_gaussians(np.float32(cols["loss_mean"][np.r_[0:41, 42:50]]))
    comp = s["noise_components"]
    assert comp["weight"] == pytest.approx(w, rel=1e-7) and comp["mean"] == pytest.approx(mu, rel=1e-7)
    assert comp["sd"] == pytest.approx(sd, rel=1e-6) and s["noise_separation"] == pytest.approx(d, rel=1e-6)
    assert s["noise_threshold"] == pytest.approx(t, rel=1e-7) and 1.39 < t < 8.0


@pytest.mark.parametrize(
    "blocks, narrow", [(False, False), (True, False), (True, True)], ids=["whole", "blocks-of-7", "float32-mean"]
)
def test_an_independent_implementation_finds_the_same_suspects(monkeypatch, blocks, narrow):
    """Also over blocks of 7 rows, and with the mean read as float32 (as the planner reads it
    when the rule is its only reader), with means beyond float32's range (not candidates)."""
    import seta_stream.policies.noise as noise

    if blocks:
        monkeypatch.setattr(noise, "_BLOCK", 7)
    rng = np.random.default_rng(5)
    n = 3000
    noisy = rng.random(n) < 0.25
    mean = np.where(noisy, rng.normal(6.5, 0.5, n), rng.lognormal(0.2, 0.5, n))
    last = (mean + rng.normal(0, 0.8, n)).astype(np.float32)
    count = rng.integers(0, 5, n)
    mean[count == 0] = np.nan
    mean[[10, 2000]] = 1e39  # float32(mean) is inf: not a candidate
    count[[10, 2000]] = 4
    last[rng.random(n) < 0.02] = np.nan  # a non-finite last record: not a candidate
    cols = columns(mean, last, count, seen=count + 1)
    if narrow:
        with np.errstate(over="ignore"):
            cols["loss_mean"] = cols["loss_mean"].astype(np.float32)
    for name, params in [("full", {}), ("seta", dict(r=0.1, k=5, alpha=0.6)), ("infobatch", {}), ("random", {})]:
        res = plan(name, cols, noise=True, noise_warmup=2, **params)
        cand, suspect, fit = noise_suspects(cols, 2)
        got = np.isin(res.reason, [REASONS.index("suspected_noise"), REASONS.index("noise_recheck")])
        assert np.array_equal(got, suspect), name
        assert res.summary["noise_candidates"] == int(cand.sum()) and res.summary["noise_suspected"] == suspect.sum()
        assert res.summary["noise_separation"] == pytest.approx(fit[3], rel=1e-6)
        hits = (suspect & noisy).sum()  # precision, and recall among the noisy candidates
        assert 0.95 < hits / suspect.sum() and 0.9 < hits / (cand & noisy).sum()


def test_on_the_log1p_scale_an_independent_implementation_finds_the_same_suspects():
    """noise_scale="log1p": the mixture fitted on float32(log1p(mean)) and the last loss compared
    on that scale, recomputed row by row with math.log1p; on skewed clean losses the log1p scale
    keeps the upper component to the mismatched ones where the loss scale widens it into the
    clean tail."""
    rng = np.random.default_rng(11)
    n = 4000
    noisy = rng.random(n) < 0.2
    mean = np.where(noisy, rng.normal(6.5, 0.4, n), rng.lognormal(0.0, 0.6, n))
    last = (mean * rng.lognormal(0.0, 0.1, n)).astype(np.float32)
    count = np.full(n, 3)
    cols = columns(mean, last, count, seen=count)
    got = {}
    for scale in ("loss", "log1p"):
        res = plan("full", cols, noise=True, noise_scale=scale)
        cand, suspect, fit = noise_suspects(cols, 2, scale=scale)
        sus = np.isin(res.reason, [REASONS.index("suspected_noise"), REASONS.index("noise_recheck")])
        assert np.array_equal(sus, suspect), scale
        assert res.summary["noise_scale"] == scale and res.summary["noise_test"] == "two_modes"
        assert res.summary["noise_threshold"] == pytest.approx(fit[4], rel=1e-7)
        assert res.summary["noise_separation"] == pytest.approx(fit[3], rel=1e-6)
        got[scale] = (suspect & noisy).sum() / suspect.sum(), res.summary["noise_components"]["weight"][1]
    assert got["log1p"][0] > got["loss"][0] and abs(got["log1p"][1] - noisy.mean()) < abs(got["loss"][1] - noisy.mean())


def test_on_the_log1p_scale_an_upper_mode_holding_most_candidates_suspects_nothing():
    """A small lower component split off (early losses of clean data on the log1p scale): two
    modes, but the upper one holds 82% of the candidates; nothing is suspected and the plan is
    the policy's own (`noise_test` "upper_majority"); on the loss scale the same table is judged
    by the two-mode test alone."""
    rng = np.random.default_rng(4)
    n = 3000
    low = rng.random(n) < 0.18
    mean = np.expm1(np.where(low, rng.normal(0.67, 0.12, n), rng.normal(1.17, 0.2, n)))
    cols = columns(mean, mean.astype(np.float32), np.full(n, 2), seen=np.full(n, 2))
    res = plan("random", cols, noise=True, noise_scale="log1p", r=0.3)
    plain = plan("random", cols, r=0.3)
    assert res.summary["noise_test"] == "upper_majority" and not res.summary["noise_active"]
    assert res.summary["noise_separation"] >= 2 and res.summary["noise_components"]["weight"][1] >= 0.5
    assert res.summary["noise_suspected"] == 0 and np.array_equal(res.keep, plain.keep)
    assert not noise_suspects(cols, 2, scale="log1p")[1].any()


@pytest.mark.parametrize(
    "draw",
    [
        lambda rng, n: rng.normal(3.0, 1.0, n),
        lambda rng, n: rng.lognormal(0.0, 0.25, n),
        lambda rng, n: rng.lognormal(0.0, 0.5, n),
        lambda rng, n: rng.lognormal(0.0, 1.0, n),
        lambda rng, n: rng.gamma(2.0, 1.0, n),
        lambda rng, n: rng.exponential(1.0, n),
        lambda rng, n: rng.lognormal(0.0, 1.0, (5, n)).mean(0),  # the mean of 5 skewed records
    ],
    ids=["normal", "lognormal-0.25", "lognormal-0.5", "lognormal-1", "gamma-2", "exponential", "mean-of-5"],
)
def test_one_mode_suspects_nothing_and_plans_as_without_the_rule(draw):
    """Clean data: unimodal (also right-skewed) loss histories fail the two-mode test (fitted
    components with Ashman's D < 2), so the rule never turns into "drop the hardest x%"."""
    rng = np.random.default_rng(11)
    mean = draw(rng, 20_000)
    cols = columns(mean, (mean * rng.uniform(0.8, 1.2, len(mean))).astype(np.float32))
    for name, params in [("full", {}), ("seta", dict(r=0.1, k=5, alpha=0.6)), ("infobatch", {})]:
        res = plan(name, cols, noise=True, **params)
        s = res.summary
        assert (s["noise_test"], s["noise_active"], s["noise_suspected"], s["noise_threshold"]) == (
            "one_mode",
            False,
            0,
            None,
        )
        assert s["noise_separation"] < 2.0
        plain = plan(name, cols, **params)
        assert np.array_equal(res.keep, plain.keep) and np.array_equal(res.reason, plain.reason)
        assert {k: v for k, v in s.items() if k not in NOISE_FIELDS and k != "params"} == {
            k: v for k, v in plain.summary.items() if k != "params"
        }


@pytest.mark.parametrize(
    ("name", "params"),
    [
        ("full", {}),
        ("random", dict(r=0.3)),
        ("random", dict(r=0.4, mode="static")),
        ("seta", dict(r=0.1, k=5, alpha=0.6)),
        ("seta", dict(r=0.2, k=4, alpha=0.5, target_keep=0.5)),
        ("seta", dict(r=0.1, prune_epochs=2)),  # annealing: the rule still holds
        ("infobatch", dict(r=0.5)),
        ("infobatch", dict(r=0.3, score="ema", rescale="exact")),
    ],
)
def test_the_policy_plans_the_rest_as_it_plans_a_table_without_the_suspects(name, params):
    rng = np.random.default_rng(3)
    n = 2000
    noisy = rng.random(n) < 0.2
    mean = np.where(noisy, rng.normal(7.0, 0.4, n), rng.lognormal(0.0, 0.5, n))
    count = rng.integers(1, 4, n)
    cols = columns(mean, (mean * rng.uniform(0.9, 1.1, n)).astype(np.float32), count)
    res = plan(name, cols, noise=True, noise_recheck=0.1, **params)
    _, suspect, _ = noise_suspects(cols, 2)
    assert res.summary["noise_suspected"] == suspect.sum() > 250
    rest = np.flatnonzero(~suspect)
    alone = plan(name, {c: v[rest] for c, v in cols.items()}, **params)
    for f in ("keep", "weight", "reason", "cluster"):
        a, b = getattr(res, f), getattr(alone, f)
        assert (a is None) == (b is None), f
        if a is not None:
            assert np.array_equal(a[rest], b), f
    m = math.floor(0.1 * suspect.sum() + 1e-9)
    assert res.summary["noise_rechecked"] == m == int(np.count_nonzero(res.keep & suspect))
    assert res.summary["kept"] == alone.summary["kept"] + m
    own, theirs = dict(res.summary), dict(alone.summary)
    for k in ("n", "kept", "pruned_fraction", "unseen", "weight_histogram", "rows_by_reason", "kept_by_reason"):
        own.pop(k), theirs.pop(k)  # counted over every row, suspects included
    assert {k: v for k, v in own.items() if k not in NOISE_FIELDS | {"params"}} == {
        k: v for k, v in theirs.items() if k != "params"
    }
    assert not res.weight[suspect].any()
    if res.cluster is not None:
        assert (res.cluster[suspect] == -1).all()


def test_warmup_recheck_share_and_fresh_draws():
    cols = two_mode_table()
    early = plan("full", cols, noise=True, noise_warmup=4)  # nobody has 4 finite records
    assert (early.summary["noise_test"], early.summary["noise_candidates"], early.summary["noise_suspected"]) == (
        "too_few",
        0,
        0,
    )
    assert early.summary["noise_separation"] is None and early.keep.all()
    one = plan("full", cols, noise=True, noise_warmup=1)  # sample 41 is a candidate now
    assert one.summary["noise_suspected"] == 9 and REASONS[one.reason[41]] in ("suspected_noise", "noise_recheck")
    none = plan("full", cols, noise=True, noise_recheck=0.0)
    assert reasons(none).count("suspected_noise") == 8 and none.summary["kept"] == 42
    every = plan("full", cols, noise=True, noise_recheck=1.0)
    assert reasons(every).count("noise_recheck") == 8 and every.keep.all() and every.weight.sum() == 42
    draws = {
        tuple(np.flatnonzero(plan("full", cols, epoch=e, seed=s, noise=True, noise_recheck=0.5).keep[42:]))
        for e in (3, 4, 5)
        for s in (7, 8)
    }
    assert len(draws) > 1  # a fresh draw every epoch (and seed): one bad epoch is not for good


def test_a_suspect_whose_last_loss_falls_is_released():
    cols = two_mode_table()
    before = plan("full", cols, noise=True, noise_recheck=0.0)
    assert REASONS[before.reason[45]] == "suspected_noise"
    cols["last_loss"][45] = np.float32(1.2)  # re-measured: now in the lower mode
    after = plan("full", cols, noise=True, noise_recheck=0.0)
    assert REASONS[after.reason[45]] == "all" and after.keep[45] and after.summary["noise_suspected"] == 7


def test_noise_parameters_are_validated_and_declare_the_history_columns():
    """The stage's parameters are its own, split from the policy's (which hold none of them),
    and its columns are declared by the stage (the registry adds them to the policy's)."""
    from seta_stream.policies.noise import NoiseParams

    for name in ("full", "random", "seta", "infobatch"):
        spec, p, _, noise = plan_params(name, noise=True)
        assert noise == NoiseParams(True, 2, 2, 0.1, "loss", 0.9)  # a new run's version: 2
        assert not {f.name for f in dataclasses.fields(p)} & {f.name for f in dataclasses.fields(noise)}
        assert {"loss_count", "loss_mean", "last_loss", "seen", "uid"} <= set(planned_table_columns(spec, p, noise))
        assert not {"loss_count", "loss_mean"} & set(spec.table_columns(p))
        _, p, _, off = plan_params(name)
        assert off == NoiseParams() and not off.noise
        assert not {"loss_count", "loss_mean"} & set(planned_table_columns(spec, p, off))
        assert plan_params(name, noise=True, noise_rule=1)[3] == NoiseParams(True, 1, 2, 0.1, "loss", None)
    for bad, match in [
        (dict(noise="yes"), r"full: noise='yes', expected True or False"),
        (dict(noise_warmup=0), r"full: noise_warmup=0 is outside the valid range: integer >= 1"),
        (dict(noise_warmup=True), r"noise_warmup=True is outside the valid range"),
        (dict(noise_recheck=1.5), r"noise_recheck=1.5 is outside the valid range 0 <= noise_recheck <= 1"),
        (dict(noise_scale="log"), r"full: noise_scale='log', expected one of 'loss', 'log1p'"),
        (dict(noise_rule=3), r"full: noise_rule=3, expected one of 1, 2"),
        (dict(noise_posterior=0.4), r"full: noise_posterior=0.4 is outside the valid range 0.5 <= noise_posterior < 1"),
        (dict(noise_rule=1, noise_posterior=0.9), r"full: noise_posterior=0.9 with noise_rule=1, whose threshold is"),
    ]:
        with pytest.raises(InvalidInputError, match=match):
            policy_params("full", **bad)
    with pytest.raises(InvalidInputError, match=r"unknown parameter\(s\) \['noise'\]"):
        policy_params("static", noise=True)


def test_mixture_points_are_the_same_whole_and_over_buckets_and_binned():
    rng = np.random.default_rng(2)
    for n in (500, 100_000):  # distinct values, then 65,536 bins
        x = np.r_[rng.lognormal(0, 0.5, n - n // 5), rng.normal(6, 0.5, n // 5)].astype(np.float32)
        whole = points1d(x)
        pieces = np.array_split(rng.permutation(x), 5)
        split = run_steps(points1d_steps(pieces.__getitem__, len(x)), lambda b: b, 5)
        assert whole.binned == (n > 65_536) == split.binned
        for f in ("counts", "s1", "s2", "lower", "upper"):
            assert np.array_equal(getattr(whole, f), getattr(split, f)), f
        assert whole.mean == split.mean and whole.total == n
        a, b = fit_two_gaussians(whole), fit_two_gaussians(split)
        assert a == b and a is not None and a.two_modes and a.separation > 5


# ---------------------------------------------------------------------------------- run directories
def record_two_modes(run: RunDir, epochs: int, n: int = 600, shards: int = 7) -> set[str]:
    """Losses of ``epochs`` epochs: a fifth of the keys stay near 7 (mismatched), the others fall
    from 4 towards 1; returns the mismatched keys."""
    rng = np.random.default_rng(0)
    keys = [f"k{i:04d}" for i in range(n)]
    urls = [f"/d/s-{i % shards}.tar" for i in range(n)]
    noisy = rng.random(n) < 0.2
    for e in range(epochs):
        loss = np.where(noisy, rng.normal(7.0, 0.4, n), rng.lognormal(np.log(4.0 / (1 + e)), 0.4, n))
        with LossRecorder(run, epoch=e, flush_rows=97) as rec:
            rec.record(keys, urls, loss.astype(np.float32))
        compact(run)
    return {k for k, z in zip(keys, noisy) if z}


@pytest.mark.parametrize("spilled", [False, True], ids=["in-memory", "spilled"])
@pytest.mark.parametrize(
    "name,params",
    [
        ("seta", dict(r=0.1, k=5, alpha=0.6)),
        ("infobatch", {}),
        ("full", {}),
        ("random", dict(r=0.3, noise_scale="log1p")),
    ],
)
@pytest.mark.parametrize("rule", [1, 2])
def test_partitioned_run_plans_the_rule_bit_for_bit_like_a_one_bucket_run(
    tmp_path, name, params, spilled, rule, monkeypatch
):
    """``spilled``: every bucket spilled to .npy files after the first pass, what the steps
    derive from its rows (and from its non-suspects) memoised on disk; with a population that
    lists 50 samples never recorded (unseen: never suspected)."""
    import seta_stream._planning.buckets as plan_module

    if spilled:
        monkeypatch.setattr(plan_module, "_INPUT_CACHE_BYTES", 0)
    population = [(f"s-{i % 7}.tar", f"k{i:04d}") for i in range(650)]
    plans, summaries = {}, {}
    for buckets in (1, 3):
        run = RunDir(tmp_path / f"b{buckets}", create=True, settings={"buckets": buckets})
        noisy = record_two_modes(run, 3)
        summaries[buckets] = plan_epoch(
            run, 3, policy=name, params={**params, "noise": True, "noise_rule": rule}, epochs=6, seed=1,
            population=population
        )  # fmt: skip
        summaries[buckets].pop("stage", None)
        t = load_plan(run, 3)
        rows = t.set_column(0, "shard", t.column("shard").cast(pa.string())).sort_by("uid").to_pylist()
        plans[buckets] = [{k: "NaN" if v != v else v for k, v in r.items()} for r in rows]  # NaN == NaN here
    assert summaries[3] == summaries[1]
    assert plans[3] == plans[1]
    s = summaries[1]
    assert s["noise_active"] and s["noise_suspected"] == sum(
        r["reason"] in ("suspected_noise", "noise_recheck") for r in plans[1]
    )
    found = {r["key"] for r in plans[1] if r["reason"] in ("suspected_noise", "noise_recheck")}
    if rule == 2:  # the posterior's threshold, above the crossing: fewer found, none clean
        assert found <= noisy and len(found) >= 0.9 * len(noisy)
    elif params.get("noise_scale") == "log1p":  # a last loss of one noisy sample fell below the threshold
        assert found <= noisy and len(noisy - found) == 1
    else:
        assert found == noisy  # these histories separate cleanly
    assert len(plans[1]) == 650 and s["unseen"] == 50


def test_a_run_whose_table_has_no_history_yet_suspects_nothing(tmp_path):
    """A table written before the history columns: every sample has loss_count 0, so the rule
    waits for its warm-up instead of failing."""
    import pyarrow.parquet as pq

    from seta_stream._store.table import read_manifest, table_buckets

    run = RunDir(tmp_path / "r", create=True)
    record_two_modes(run, 3)
    for bucket in table_buckets(read_manifest(run)):
        path = tmp_path / "r" / bucket.table
        pq.write_table(pq.read_table(path).drop_columns(["loss_count", "loss_mean", "loss_m2"]), path)
    s = plan_epoch(run, 3, policy="full", params={"noise": True}, epochs=6, seed=1)
    assert (s["noise_test"], s["noise_candidates"], s["noise_suspected"], s["kept"]) == ("too_few", 0, 0, 600)


def test_the_planner_may_read_loss_mean_as_float32_only_when_the_rule_is_its_only_reader():
    """noise_narrow_reads: loss_mean as float32 for the policies behind the stage with noise=True
    (the rule reads float32(loss_mean) alone), nothing without the rule or when the policy itself
    declares loss_mean; and the candidates' scores are the same from either column."""
    from seta_stream.policies.noise import candidate_scores, noise_narrow_reads
    from seta_stream.policies.registry import planned_narrow_reads

    for name, params in [
        ("seta", dict(r=0.1, k=5, alpha=0.5)),
        ("random", dict(r=0.3)),
        ("infobatch", {}),
        ("full", {}),
    ]:
        spec, p, _, noise = plan_params(name, **params, noise=True)
        assert planned_narrow_reads(spec, p, noise) == {"loss_mean": np.dtype(np.float32)}
        spec, p, _, noise = plan_params(name, **params)
        assert planned_narrow_reads(spec, p, noise) == {}
    noise = plan_params("seta", r=0.1, k=5, alpha=0.5, noise=True)[3]
    assert noise_narrow_reads({"uid", "loss_mean"}, noise) == {}  # the policy reads the history itself
    assert noise_narrow_reads({"uid"}, noise) == {"loss_mean": np.dtype(np.float32)}

    rng = np.random.default_rng(5)
    n = 5000
    mean = np.r_[rng.lognormal(size=n - 4) * 3, [1e39, -1e39, np.nan, 2.0**-140]]  # beyond float32, subnormal
    base = dict(
        uid=np.arange(n, dtype=np.uint64),
        last_loss=rng.lognormal(size=n).astype(np.float32),
        ema=np.full(n, np.nan),
        seen=np.full(n, 2, np.int32),
        last_epoch=None,
        epoch=2,
        epochs=10,
        seed=0,
        loss_count=np.full(n, 2, np.int32),
    )
    for scale in ("loss", "log1p"):
        wide = candidate_scores(PolicyInput(**base, loss_mean=mean), 2, scale)
        with np.errstate(over="ignore"):  # the planner's read makes the same cast (inf beyond float32)
            as_read = mean.astype(np.float32)
        narrow = candidate_scores(PolicyInput(**base, loss_mean=as_read), 2, scale)
        assert np.array_equal(wide[0], narrow[0]) and wide[0].sum() == n - 3
        assert np.array_equal(wide[1].view(np.uint32), narrow[1].view(np.uint32))


# ---------------------------------------------------------------------------------- version 2
@pytest.mark.parametrize("floor", [None, 5.0, 7.5], ids=["no-floor", "floor-below", "floor-above"])
@pytest.mark.parametrize("blocks", [False, True], ids=["whole", "blocks-of-7"])
def test_version_2_an_independent_implementation_finds_the_same_suspects(monkeypatch, blocks, floor):
    """§12.12: the threshold where the noise mode's posterior reaches 0.9, raised to the previous
    plan's threshold; recomputed by the independent EM and bisection of tests/policy_helpers.py,
    row by row; above the crossing, fewer suspects and none more clean."""
    import seta_stream.policies.noise as noise
    from seta_stream.policies.registry import planned_function

    if blocks:
        monkeypatch.setattr(noise, "_BLOCK", 7)
    rng = np.random.default_rng(5)
    n = 3000
    noisy = rng.random(n) < 0.25
    mean = np.where(noisy, rng.normal(6.5, 0.5, n), rng.lognormal(0.2, 0.5, n))
    last = (mean + rng.normal(0, 0.8, n)).astype(np.float32)
    count = rng.integers(1, 5, n)
    cols = columns(mean, last, count, seen=count + 1)
    for name, params in [("full", {}), ("seta", dict(r=0.1, k=5, alpha=0.6)), ("random", {})]:
        spec, p, _, nz = plan_params(name, noise=True, **params)
        assert (nz.noise_rule, nz.noise_posterior) == (2, 0.9)
        inp = PolicyInput.from_columns({c: cols[c] for c in planned_table_columns(spec, p, nz)}, epoch=3, epochs=10,
                                       seed=7)  # fmt: skip
        res = planned_function(spec, nz, floor)(inp, p)
        cand, suspect, fit = noise_suspects(cols, 2, posterior=0.9, floor=floor)
        got = np.isin(res.reason, [REASONS.index("suspected_noise"), REASONS.index("noise_recheck")])
        assert np.array_equal(got, suspect), name
        s = res.summary
        own = two_gaussians(np.float32(mean[cand]), posterior=0.9)[4]
        assert s["noise_fit_threshold"] == pytest.approx(own, rel=1e-9) and s["noise_floor"] == floor
        assert s["noise_threshold"] == pytest.approx(own if floor is None else max(own, floor), rel=1e-9)
        v1 = plan(name, cols, noise=True, noise_rule=1, **params)
        one = np.isin(v1.reason, [REASONS.index("suspected_noise"), REASONS.index("noise_recheck")])
        assert suspect.sum() < one.sum() and not (suspect & ~one).any()  # a subset of version 1's
        assert (suspect & ~noisy).sum() <= (one & ~noisy).sum()
    assert floor != 7.5 or s["noise_threshold"] == 7.5  # held to the floor above the fit's own


def test_version_2_at_posterior_one_half_is_the_crossing_bit_for_bit():
    from seta_stream._kernels.mixture1d import posterior_threshold

    rng = np.random.default_rng(3)
    for n in (300, 100_000):
        x = np.r_[rng.lognormal(0, 0.5, n - n // 5), rng.normal(6, 0.5, n // 5)].astype(np.float32)
        m = fit_two_gaussians(points1d(x))
        assert posterior_threshold(m, 0.5) == m.threshold  # the same float
        assert m.threshold < posterior_threshold(m, 0.9) < posterior_threshold(m, 0.99) < m.mean[1]
    one = fit_two_gaussians(points1d(rng.normal(size=5000).astype(np.float32)))
    assert posterior_threshold(one, 0.9) is None or one.separation < 2


def test_version_2_holds_its_threshold_while_active_and_a_run_keeps_its_version(tmp_path):
    """A run of version 2 planned epoch by epoch: its threshold never falls while the rule stays
    active (the fit's own may: noise_fit_threshold), each plan's floor is the plan before's
    threshold; a run whose first plan was made before versions were stored (its state names
    none) keeps version 1, and says so in its state; a resumed Pruner's params need no version."""
    import json

    run = RunDir(tmp_path / "r", create=True)
    rng = np.random.default_rng(0)
    n = 2000
    keys = [f"k{i:04d}" for i in range(n)]
    urls = [f"/d/s-{i % 5}.tar" for i in range(n)]
    population = [(f"s-{i % 5}.tar", k) for i, k in enumerate(keys)]
    noisy = rng.random(n) < 0.3
    summaries = []
    for e in range(7):
        summaries.append(plan_epoch(run, e, policy="full", params={"noise": True}, epochs=8, seed=1,
                                    population=population))  # fmt: skip
        kept = {k for k, kp in zip(*load_plan(run, e, ["key", "keep"]).to_pydict().values()) if kp}
        idx = [i for i in range(n) if keys[i] in kept]
        loss = np.where(noisy, rng.normal(3.0, 0.4, n), rng.lognormal(np.log(2.5 / (1 + 2 * e)), 0.5, n))
        with LossRecorder(run, epoch=e) as rec:
            rec.record([keys[i] for i in idx], [urls[i] for i in idx], loss[idx].astype(np.float32))
        compact(run)
    active = [s for s in summaries if s["noise_active"]]
    assert len(active) >= 4 and all(s["params"]["noise_rule"] == 2 for s in summaries)
    thresholds = [s["noise_threshold"] for s in active]
    assert thresholds == sorted(thresholds)  # never falling
    fits = [s["noise_fit_threshold"] for s in active]
    assert fits != sorted(fits)  # while the fit's own does fall
    for before, s in zip(active, active[1:]):
        assert s["noise_floor"] == before["noise_threshold"]
        assert s["noise_threshold"] == max(s["noise_fit_threshold"], s["noise_floor"])
    assert active[0]["noise_floor"] is None
    assert json.loads((tmp_path / "r/state.json").read_text())["params"] == {"noise": True, "noise_rule": 2}

    old = RunDir(tmp_path / "old", create=True)
    record_two_modes(old, 3)
    plan_epoch(old, 3, policy="full", params={"noise": True, "noise_rule": 1}, epochs=6, seed=1)
    state = json.loads((tmp_path / "old/state.json").read_text())
    state["params"] = {"noise": True}  # as a run planned before versions were stored
    (tmp_path / "old/state.json").write_text(json.dumps(state))
    s = plan_epoch(old, 4, params={"noise": True})  # a resumed Pruner gives its params again
    assert "noise_rule" not in s["params"] and "noise_floor" not in s  # version 1's summary, as ever
    assert json.loads((tmp_path / "old/state.json").read_text())["params"] == {"noise": True, "noise_rule": 1}
    with pytest.raises(
        InvalidInputError, match=r"planned with params=.*'noise_rule': 1.*asks params=.*'noise_rule': 2"
    ):
        plan_epoch(old, 5, params={"noise": True, "noise_rule": 2})


def test_a_run_whose_plans_had_the_rule_off_takes_the_current_version_when_it_turns_it_on(tmp_path):
    """The version is fixed by the first plan with the rule on: a run planned without it (its
    stored parameters have no noise) that turns it on (force=True, as a changed setting needs)
    plans with the current version, and keeps it from then on."""
    import json

    from seta_stream.policies.noise import NOISE_RULE

    run = RunDir(tmp_path / "r", create=True)
    record_two_modes(run, 3)
    plan_epoch(run, 3, policy="full", epochs=8, seed=1)
    s = plan_epoch(run, 4, policy="full", params={"noise": True}, force=True)
    assert NOISE_RULE == 2 and s["params"]["noise_rule"] == 2 and "noise_floor" in s
    assert json.loads((tmp_path / "r/state.json").read_text())["params"] == {"noise": True, "noise_rule": 2}
    s = plan_epoch(run, 5, params={"noise": True})
    assert s["params"]["noise_rule"] == 2


@pytest.mark.skipif(
    __import__("sys").version_info < (3, 11),
    reason="CPython before 3.11 keeps a call's arguments on the caller's stack until the call returns, so there "
    "the history is freed when the plan's policy returns, not before it runs",
)
def test_planning_frees_the_loss_history_before_the_policy_plans_the_other_rows(tmp_path, monkeypatch):
    """The noise stage is the loss history's only reader: by the time the policy behind it runs,
    no frame of the planning transaction holds the history columns any more (120 MB at 15M rows;
    a frame that kept the input alive cost that in peak RSS)."""
    import gc
    import weakref

    from seta_stream.policies.registry import POLICIES

    history: list[weakref.ref] = []
    made = PolicyInput.from_columns.__func__

    def from_columns(cls, columns, **kw):
        inp = made(cls, columns, **kw)
        if inp.loss_mean is not None:
            history.append(weakref.ref(inp.loss_mean))
        return inp

    monkeypatch.setattr(PolicyInput, "from_columns", classmethod(from_columns))
    alive: list[bool] = []
    full = POLICIES["full"]

    def probe(inp, p):
        gc.collect()
        alive.append(any(ref() is not None for ref in history))
        return full.fn(inp, p)

    monkeypatch.setitem(POLICIES, "probe", dataclasses.replace(full, name="probe", fn=probe, steps=None))
    run = RunDir(tmp_path / "r", create=True)
    record_two_modes(run, 3)
    s = plan_epoch(run, 3, policy="probe", params={"noise": True}, epochs=6, seed=1)
    assert s["noise_active"] and s["noise_suspected"] > 0
    assert len(history) == 1 and alive == [False]
