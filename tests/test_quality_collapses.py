"""The collapse diagnosis of the accuracy study (benchmarks/quality/collapse*.py): the list of
epochs at chance read from the committed run files, and the forks of the experiment's probe."""

from __future__ import annotations

import json

import numpy as np
import pytest

from benchmarks.quality.collapse_list import collapses
from benchmarks.quality.layout import Layout


def test_the_list_is_every_epoch_at_chance_of_the_converged_studies_with_its_final_batch():
    got = [(c["run_id"], c["epoch"], c["acc"], c["prev_epoch_plan"]["final_batch"]) for c in collapses(Layout())]
    assert got == [
        ("cifar10-E36-infobatch-p30-r0.5-s0", 9, 0.1, 1),
        ("cifar10-E36-seta-p50-alpha0.6-k10-r0.1-s0", 1, 0.1, 1),
        ("cifar10-E36-seta-p70-alpha0.4-k10-r0.3-s0", 6, 0.1, 1),
        ("cifar10-E72-seta-p30-alpha0.7-k5-r0.0-s0", 1, 0.1005, 6),
        ("cifar10-E72-seta-p50-alpha0.6-k5-r0.1-s0", 1, 0.1008, 3),
        ("cifar10-E72-seta-p50-alpha0.6-k5-r0.1-s0", 42, 0.1006, 1),
        ("cifar10-E72-seta-p70-alpha0.3-k10-r0.1-s0", 30, 0.1066, 1),
    ]


def test_each_entry_names_the_plan_the_learning_rate_and_the_committed_list_is_current():
    entries = collapses(Layout())
    p70 = entries[2]
    assert p70["prev_epoch_plan"] == {
        "epoch": 6, "phase": "prune", "kept": 1921, "n": 45000, "kept_fraction": 0.0427,
        "window": {"k": 10, "w": 4, "s": 6, "clusters": "6..9 of 10", "hardest": True}, "max_weight": 1.0,
        "final_batch": 1,
    }  # fmt: skip
    # lr at t = 6 + 15/16 of the one-cycle over 36 epochs: 0.1 * (36 - t) / (36 - 5.4)
    assert p70["lr"]["final_batch_step"] == round(0.1 * (36 - (6 + 15 / 16)) / 30.6, 5) == 0.09498
    assert entries[0]["prev_epoch_plan"]["max_weight"] == 2.0 and entries[0]["prev_epoch_plan"]["window"] is None
    assert p70["cause"].startswith("the epoch ended with a final batch of 1 sample (kept 1921 = 15 x 128 + 1)")
    committed = json.loads((Layout().results / "collapses.json").read_text())
    assert committed == json.loads(json.dumps(entries))


def test_the_probe_replays_the_final_step_exactly_and_forks_leave_the_run_as_it_was():
    torch = pytest.importorskip("torch")
    from benchmarks.quality.collapse import Probe

    torch.manual_seed(0)
    nn = torch.nn
    model = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.AdaptiveMaxPool2d(1),
                          nn.Flatten(), nn.Linear(4, 3))  # fmt: skip
    opts = [torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9, nesterov=True)]
    rng = np.random.default_rng(0)
    batches = [(torch.tensor(rng.normal(size=(4, 1, 4, 4)), dtype=torch.float32), torch.tensor(rng.integers(0, 3, 4)))
               for _ in range(5)]  # fmt: skip
    test = [(torch.tensor(rng.normal(size=(50, 1, 4, 4)), dtype=torch.float32), list(rng.integers(0, 3, 50)))]
    probe = Probe(4, sizes=(1, 4))
    for x, y in batches:
        assert probe.train_batch(model, opts, x, y, [1.0] * 4)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        for o in opts:
            o.zero_grad()
        loss.backward()
        for o in opts:
            o.step()
    from benchmarks.quality.pipeline import evaluate

    end = {k: v.clone() for k, v in model.state_dict().items()}
    acc = evaluate(model, test)
    out = probe.after_epoch(model, opts, test, "cpu")
    assert out["final_batch"] == 4 and out["size_4"] == acc  # the final step replayed from its fork: same model
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in end.items())  # the run goes on unchanged
    assert evaluate(model, test) == acc
