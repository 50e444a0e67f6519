"""The fast paths of planning give exactly what the general code gives: the weight codes of
stage.arrow, the exact sum of sorted float32 losses, the noise rule's block-wise candidates and
suspects, a policy input taken by mask, and plan.parquet written with its keys mapped per part."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from seta_stream import RunDir, load_table, plan_epoch
from seta_stream._kernels.kmeans1d import _sorted_sum_cells, sum_cells
from seta_stream._store.planfiles import FEW_WEIGHTS, few_codes, weight_codes
from seta_stream.policies import PolicyInput
from seta_stream.policies import noise as noise_rule


def _bits(values: list[float]) -> list[int]:
    return np.array(values, dtype=np.float32).view(np.uint32).tolist()


@pytest.mark.parametrize(
    "weights",
    [
        [],
        [1.0],
        [1.0, 0.0, 0.0, 1.0],
        [0.0, -0.0, 1.0, -0.0, 0.0],  # two zeros: two weights, as dictionary_encode numbers them
        [2.5, float("nan"), 2.5, float("nan"), 0.25],
        [float(i % FEW_WEIGHTS) for i in range(3 * (1 << 20) + 5)],  # new weights in later blocks
    ],
)
def test_weight_codes_number_weights_as_dictionary_encode(weights: list[float]) -> None:
    w = pa.array(np.array(weights, dtype=np.float32))
    ref = pc.dictionary_encode(w)
    values, columns = weight_codes(w)
    assert _bits(values) == _bits(ref.dictionary.to_pylist())
    assert columns["weight_code"].to_pylist() == ref.indices.to_pylist()
    assert columns["weight_code"].type == pa.uint8()


def test_weight_codes_with_many_weights_fall_back() -> None:
    nan_payloads = np.array([0x7FC00000, 0x7FC00001], dtype=np.uint32).view(np.float32)
    w = pa.array(np.concatenate([np.arange(FEW_WEIGHTS - 1, dtype=np.float32), nan_payloads]))
    assert few_codes(w) is None  # 7 numbers and two NaNs of other bits: 9 weights
    values, columns = weight_codes(w)
    ref = pc.dictionary_encode(w)
    assert _bits(values) == _bits(ref.dictionary.to_pylist())
    assert columns["weight_code"].to_pylist() == ref.indices.to_pylist()
    big = pa.array(np.arange(300, dtype=np.float32))
    assert weight_codes(big) == (None, {"weight": big})


def test_sorted_sum_cells_are_sum_cells() -> None:
    rng = np.random.default_rng(0)
    cases = [
        np.float32([5.0]),
        np.float32([0.0, -0.0, 0.0]),
        np.float32([-3e38, -1.0, -0.0, 0.0, 1e-40, 3e38]),
        np.float32([1e-45, 2e-45, -1e-45]),
        np.float32([-np.inf, 1.0, np.inf]),
        rng.lognormal(size=300_000).astype(np.float32),
    ]
    for _ in range(100):
        c = (rng.normal(size=rng.integers(1, 400)) * 10.0 ** rng.integers(-44, 38)).astype(np.float32)
        c[rng.random(len(c)) < 0.1] = 0.0
        c[rng.random(len(c)) < 0.05] = -0.0
        cases.append(c)
    for c in cases:
        v = np.sort(c)
        assert np.array_equal(_sorted_sum_cells(v), sum_cells(v))


def _history_input(n: int, seed: int) -> PolicyInput:
    rng = np.random.default_rng(seed)
    last = rng.lognormal(size=n).astype(np.float32)
    last[rng.random(n) < 0.05] = np.nan
    mean = rng.lognormal(sigma=0.5, size=n)
    noisy = rng.random(n) < 0.2
    mean[noisy] = rng.normal(15.0, 1.0, size=int(noisy.sum()))
    last[noisy] += 15.0
    mean[rng.random(n) < 0.01] = np.nan
    mean[rng.random(n) < 0.01] = 1e39  # beyond float32: not a candidate
    mean[rng.random(n) < 0.01] = -2.0  # no log1p: not a candidate on that scale
    return PolicyInput(
        uid=rng.permutation(n).astype(np.uint64),
        last_loss=last,
        ema=np.zeros(n),
        seen=rng.integers(0, 3, n).astype(np.int32),
        last_epoch=None,
        epoch=2,
        epochs=5,
        seed=3,
        loss_count=rng.integers(0, 4, n).astype(np.int32),
        loss_mean=mean,
    )


@pytest.mark.parametrize("scale", ["loss", "log1p"])
def test_noise_candidates_and_suspects_blockwise_are_the_whole_array_expressions(scale: str) -> None:
    inp = _history_input((1 << 20) + 4321, 1)  # two blocks, the second a short one
    warmup = 2
    cand, x = noise_rule.candidate_scores(inp, warmup, scale)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        want_x = np.asarray(inp.loss_mean, dtype=np.float32)
        want = (inp.seen > 0) & np.isfinite(inp.last_loss) & (inp.loss_count >= warmup) & np.isfinite(want_x)
        want_x = want_x[want]
        if scale == "log1p":
            want_x = np.log1p(want_x.astype(np.float64)).astype(np.float32)
            want[np.flatnonzero(want)[~np.isfinite(want_x)]] = False
            want_x = want_x[np.isfinite(want_x)]
    assert np.array_equal(cand, want)
    assert np.array_equal(x.view(np.uint32), want_x.view(np.uint32))
    assert np.array_equal(noise_rule.candidate_mask(inp, warmup, scale), want)
    fit = noise_rule.noise_fit(inp, warmup, scale)
    assert fit.active
    t = fit.threshold
    idx = np.flatnonzero(want)
    above = want_x.astype(np.float64) > t
    above &= noise_rule.on_scale(np.asarray(inp.last_loss)[idx], scale) > t
    expected = np.zeros(inp.n, dtype=bool)
    expected[idx[above]] = True
    assert np.array_equal(fit.suspects(inp, warmup), expected)
    assert np.array_equal(fit.suspects(inp, warmup, (cand, x)), expected)
    assert 0 < expected.sum() < inp.n


def test_take_by_mask_is_take_by_indices() -> None:
    inp = _history_input(5000, 2)
    mask = np.random.default_rng(3).random(inp.n) < 0.7
    by_mask, by_index = inp.take(mask), inp.take(np.flatnonzero(mask))
    for name in ("uid", "last_loss", "ema", "seen", "loss_count", "loss_mean"):
        assert np.array_equal(getattr(by_mask, name), getattr(by_index, name), equal_nan=True), name
    constant = PolicyInput.from_columns({"uid": inp.uid}, epoch=0, epochs=1, seed=0).take(mask)
    assert constant.n == int(mask.sum()) and constant.seen.strides == (0,)


def _plan_digests(path) -> dict[str, str]:
    return {
        str(p.relative_to(path)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted((path / "plans").rglob("*"))
        if p.is_file()
    }


@pytest.fixture
def small_run(tmp_path):
    """A run of 4,200 samples in 6 shards, recorded and compacted by the library."""
    from seta_stream import compact
    from seta_stream.testing import LossRecorder

    run = RunDir(tmp_path / "run", create=True)
    rec = LossRecorder(run, rank=0, epoch=0, flush_rows=1000)
    rng = np.random.default_rng(0)
    for s in range(6):
        keys = [f"k{i:05d}" for i in range(700)]
        rec.record(keys, [f"/data/shard-{s:03d}.tar"] * len(keys), rng.lognormal(size=len(keys)).astype(np.float32))
    rec.close()
    compact(run)
    return run


def test_plan_parquet_with_keys_mapped_per_part_is_the_same_plan(small_run, monkeypatch) -> None:
    """Planning maps the table's keys again for each plan.parquet part (each part releases its
    key pages once written), makes each part's shard column from the shards' runs and reads its
    uid and loss again from the table; the plan folder is the same bytes as when every part is a
    slice of one table (the columns read whole: RunDir.prepare_parquet_parts)."""
    import seta_stream._planning.transaction as planning
    import seta_stream._store.planfiles as plans

    monkeypatch.setattr(plans, "PLAN_PART_ROWS", 1000)  # 5 parts
    maps, reads = [], []
    real, real_rows = planning.load_table_keys, planning.read_rows
    monkeypatch.setattr(planning, "load_table_keys", lambda *a, **k: maps.append(1) or real(*a, **k))
    monkeypatch.setattr(planning, "read_rows", lambda *a, **k: reads.append(a[3:]) or real_rows(*a, **k))
    options = plans._WRITE_OPTIONS
    path = small_run.path("")
    params = dict(r=0.2, k=4, alpha=0.5)
    plan_epoch(small_run, 1, policy="seta", params=params, epochs=4, seed=0)
    assert len(maps) == 1 + 5  # the identities, then one mapping per part
    assert sorted(reads) == [(0, 1000), (1000, 1000), (2000, 1000), (3000, 1000), (4000, 200)]  # parts: uid, loss
    mapped = _plan_digests(Path(path))
    assert sorted(k for k in mapped if "plan.parquet" in k) == [
        f"plans/epoch=1/plan.parquet/part-{i:05d}.parquet" for i in range(5)
    ]

    def one_mapping(run, rel, decisions, ids, slots=None):  # the whole table, its parts sliced from it
        values = load_table(run, ["uid", "last_loss"]).combine_chunks()
        head = [plans.PLAN_SCHEMA.field(c) for c in ("shard", "key", "uid", "loss")]
        schema = pa.schema([*head, *decisions.schema])
        arrays = [ids.shard, ids.key, values.column("uid"), values.column("last_loss"), *decisions.columns]
        return run.prepare_parquet_parts(rel, pa.Table.from_arrays(arrays, schema=schema), part_rows=1000, **options)

    monkeypatch.setattr(plans, "_prepare_parts", one_mapping)
    plan_epoch(small_run, 1, force=True)
    assert _plan_digests(Path(path)) == mapped


def test_shard_slices_from_runs_are_the_column_slices() -> None:
    """With keys mapped per part, the identities keep the shard column as runs; a slice made
    from them has the values and the chunk boundaries of the column's own slice."""
    from seta_stream._store.planfiles import PlanIdentities

    names = pa.array([f"s{i:02d}.tar" for i in range(9)])
    runs = [(3, 5), (0, 7), (8, 1), (5, 12), (1, 4), (2, 9)]  # (code, length): runs across chunks
    codes = np.concatenate([np.full(k, c, np.int32) for c, k in runs])
    cuts = [0, 6, 6, 17, 30, len(codes)]  # an empty chunk too
    column = pa.chunked_array(
        [pa.DictionaryArray.from_arrays(pa.array(codes[a:b]), names) for a, b in zip(cuts, cuts[1:])]
    )
    keys = pa.chunked_array([pa.array([f"k{i}" for i in range(len(codes))])])
    whole = PlanIdentities(column, keys)
    runs_only = PlanIdentities(column, keys, key_map=lambda: keys)
    assert runs_only.names.to_pylist() == whole.names.to_pylist()
    for lo in range(len(codes) + 1):
        for n in (0, 1, 5, 13, 40):
            got, want = runs_only.shard_slice(lo, n), whole.shard_slice(lo, n)
            assert [len(c) for c in got.chunks if len(c)] == [len(c) for c in want.chunks if len(c)]
            assert got.to_pylist() == want.to_pylist()
    assert runs_only.shard.to_pylist() == column.to_pylist()


def test_read_rows_reads_any_row_range_across_row_groups(tmp_path, monkeypatch) -> None:
    from seta_stream import compact
    from seta_stream._store import table as table_files
    from seta_stream.testing import LossRecorder

    monkeypatch.setitem(table_files.TABLE_WRITE_OPTIONS, "row_group_size", 700)  # 6 row groups
    run = RunDir(tmp_path / "run", create=True)
    rec = LossRecorder(run, rank=0, epoch=0, flush_rows=1000)
    keys = [f"k{i:05d}" for i in range(4200)]
    rec.record(keys, [f"/data/shard-{i % 3}.tar" for i in range(4200)], np.arange(4200, dtype=np.float32))
    rec.close()
    compact(run)
    manifest = table_files.read_manifest(run)
    whole = load_table(run, ["uid", "last_loss"]).combine_chunks()
    import pyarrow.parquet as pq

    assert pq.ParquetFile(run.path(manifest["table"])).metadata.num_row_groups == 6
    for lo, n in [(0, 4200), (0, 1), (699, 2), (700, 700), (1, 4199), (4199, 1), (1234, 2345), (4000, 1000), (10, 0)]:
        got = table_files.read_rows(run, manifest, ["uid", "last_loss"], lo, n)
        assert got.combine_chunks().equals(whole.slice(lo, n)), (lo, n)
