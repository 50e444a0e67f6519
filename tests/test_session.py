"""Pruner: the epoch-boundary object (single process; ranks are in test_resume_and_ranks.py)."""

from __future__ import annotations

import json

import numpy as np
from conftest import hold_plan_parquet, web_dataset, write_shards

import seta_stream as seta


def _pruner_loop(tmp_path, run: str, epochs: int, fields: tuple[str, ...]):
    """A Pruner (SeTa, a listed population of 40 samples in 2 shards) and its loader's
    batches of 8 as tuples of ``fields``."""
    urls = write_shards(tmp_path / "s", [20, 20])
    pruner = seta.Pruner(
        run,
        policy="seta",
        params=dict(r=0.2, k=3, alpha=0.5),
        epochs=epochs,
        seed=1,
        population=seta.list_samples(urls),
        flush_rows=16,
    )
    ds = seta.attach(web_dataset(urls, shardshuffle=False, empty_check=False), run)
    return pruner, ds.to_tuple(*fields).batched(8)


def test_pruner_loop_records_plans_and_reports_counts(tmp_path):
    run = str(tmp_path / "run")
    pruner, ds = _pruner_loop(tmp_path, run, epochs=3, fields=("__key__", "__url__", "__weight__"))
    for epoch in range(3):
        summary = pruner.start_epoch(epoch)
        assert summary["epoch"] == epoch and summary["n"] == 40
        got = 0
        for keys, urls_, _w in ds:
            losses = np.random.default_rng(len(keys)).random(len(keys), dtype=np.float32)
            mask = np.arange(len(keys)) % 2 == 0  # "back-propagate" every other sample
            pruner.record(keys, urls_, losses, trained=mask)
            got += len(keys)
        assert got == summary["kept"]
    pruner.close()
    assert seta.load_table(run).num_rows == 40
    s = seta.inspect.run_summary(run)
    for e in s["epochs"]:
        assert e["recorded"] == e["kept"]
        assert e["trained"] == sum((len(b) + 1) // 2 for b in [range(8)] * (e["kept"] // 8)) + (
            (e["kept"] % 8 + 1) // 2
        )
    assert 0 < s["pruned_by_training"] < 1
    counts = json.loads((tmp_path / "run/stats/epoch=2/rank=0.json").read_text())
    assert counts["recorded"] == s["epochs"][2]["kept"]


def test_es_and_eswp_runs_get_the_policy_beta2(tmp_path):
    seta.Pruner(tmp_path / "a", policy="eswp", epochs=20)
    seta.Pruner(tmp_path / "b", policy="es", epochs=20)
    assert seta.RunDir(tmp_path / "a").settings["ema_beta2"] == 0.8
    assert seta.RunDir(tmp_path / "b").settings["ema_beta2"] == 0.9


def test_start_epoch_returns_a_complete_plan_folder_a_user_can_query(tmp_path, monkeypatch):
    """start_epoch returns once the whole plan folder is published: with plan.parquet's parts
    of epoch 1 held for 0.5 s, it does not return before they are written, and a webdataset
    user's Parquet query of RUN/plans/epoch=E/plan.parquet right after it (polars, as
    docs/format.md shows it) reads every row of every epoch."""
    import threading

    import polars as pl

    release = threading.Event()
    written = hold_plan_parquet(monkeypatch, 1, release)
    run = str(tmp_path / "run")
    pruner, ds = _pruner_loop(tmp_path, run, epochs=3, fields=("__key__", "__url__"))
    plan_dir = tmp_path / "run/plans"
    for epoch in range(3):
        if epoch == 1:
            threading.Timer(0.5, release.set).start()
        summary = pruner.start_epoch(epoch)
        if epoch == 1:
            assert release.is_set() and any("plans/epoch=1" in w for w in written)
        assert sorted(p.name for p in (plan_dir / f"epoch={epoch}").iterdir()) == [
            "plan.parquet", "shards.arrow", "stage.arrow", "summary.json"]  # fmt: skip
        assert not list((tmp_path / "run/locks").iterdir())
        plan = pl.read_parquet(plan_dir / f"epoch={epoch}/plan.parquet")
        assert (plan.height, int(plan["keep"].sum())) == (40, summary["kept"]) and summary["n"] == 40
        got = 0
        for keys, urls_ in ds:
            pruner.record(keys, urls_, np.linspace(0.1, 2.0, len(keys), dtype=np.float32))
            got += len(keys)
        assert got == summary["kept"]
    pruner.close()
    table = seta.load_table(run).to_pydict()
    last = {(s, k): e for s, k, e in zip(table["shard"], table["key"], table["last_epoch"])}
    plan = seta.load_plan(run, 2).to_pydict()  # epoch 2's losses folded: exactly its kept samples
    assert [last.get(sk) == 2 for sk in zip(plan["shard"], plan["key"])] == plan["keep"]
