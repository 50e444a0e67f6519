"""The full baseline (docs/algorithms.md §1): every sample, weight 1, every epoch; no column read."""

from __future__ import annotations

import numpy as np

from seta_stream.policies import PolicyInput, get_policy, run_policy
from seta_stream.policies.base import reason_code
from seta_stream.policies.full import FullParams


def test_full_keeps_every_sample_with_weight_one_in_every_epoch():
    uid = np.arange(100, dtype=np.uint64)
    loss = np.random.default_rng(0).lognormal(size=100).astype(np.float32)
    loss[:10] = np.nan
    for epoch in (0, 4, 9):
        res = run_policy("full", PolicyInput.from_losses(uid, loss, epoch=epoch, epochs=10))
        assert res.keep.all() and res.weight.tolist() == [1.0] * 100
        assert res.reason.tolist() == [reason_code("all")] * 100
        assert res.summary["phase"] == "prune" and res.summary["kept"] == 100 and res.summary["unseen"] == 10
        assert res.summary["absent_rule"] == {"kind": "keep", "fraction": 1.0, "stream": 1, "epoch": None}
        assert res.cluster is None and res.score is None


def test_full_reads_no_column():
    spec = get_policy("full")
    assert set(spec.columns(FullParams())) == set() and spec.settings == ()
    assert spec.table_columns(FullParams()) == ["uid", "last_loss", "seen"]  # the plan's own columns
    only_rows = PolicyInput.from_columns({"uid": np.arange(7, dtype=np.uint64)}, epoch=0, epochs=1, seed=0)
    assert spec.fn(only_rows, FullParams()).keep.sum() == 7
