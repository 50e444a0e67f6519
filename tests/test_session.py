"""Pruner: the epoch-boundary object (single process; ranks are in test_resume_and_ranks.py)."""

from __future__ import annotations

import json

import numpy as np
from conftest import web_dataset, write_shards

import seta_stream as seta


def test_pruner_loop_records_plans_and_reports_counts(tmp_path):
    urls = write_shards(tmp_path / "s", [20, 20])
    run = str(tmp_path / "run")
    pruner = seta.Pruner(
        run,
        policy="seta",
        params=dict(r=0.2, k=3, alpha=0.5),
        epochs=3,
        seed=1,
        population=seta.list_samples(urls),
        flush_rows=16,
    )
    ds = seta.attach(web_dataset(urls, shardshuffle=False, empty_check=False), run)
    ds = ds.to_tuple("__key__", "__url__", "__weight__").batched(8)
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
