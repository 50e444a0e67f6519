"""studies/words_noise.py: the committed page is the report of the committed result files; at a tiny size
(400 word images, 3 epochs) the runner trains the registry once in order through the studies' harness, the
wrong labels it reads from the shards are exactly the ones the generator counted, every plan's reading is
there, and the report's rows hold the files' figures."""

from __future__ import annotations

import json

import pytest

from studies import words_noise as wn

SMALL = dict(train=400, test=100, seed=0)
EPOCHS = 3


def test_the_committed_page_is_the_report_of_the_committed_result_files() -> None:
    assert wn.DOC.read_text() == wn.report(wn.context())


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    import torch

    torch.set_num_threads(1)
    out = tmp_path_factory.mktemp("words")
    train = dict(epochs=EPOCHS, batch_size=32, lr=2e-3, workers=1)
    ctx = wn.context(results=out / "results", out=out / "out", rounds=((0.2, 0),), data=SMALL, train=train)
    wn.harness.worker(ctx, wn)
    first = sorted(p.name for p in (out / "results").glob("*.json"))
    wn.harness.worker(ctx, wn)  # every result file exists: nothing runs again
    runs = {p.stem: json.loads(p.read_text()) for p in (out / "results").glob("*.json")}
    return ctx, first, runs


@pytest.mark.slow
def test_the_runner_trains_full_data_and_the_rule_once(tiny) -> None:
    ctx, first, runs = tiny
    assert first == ["words-n20-full-s0.json", "words-n20-rule-s0.json"]
    assert set(runs) == {"words-n20-full-s0", "words-n20-rule-s0"}
    full, rule = runs["words-n20-full-s0"], runs["words-n20-rule-s0"]
    assert (full["params"], rule["params"]) == ({}, {"noise": True})
    assert [len(full["rows"]), len(rule["rows"])] == [EPOCHS, EPOCHS]
    assert full["plans"] == [] and [p["epoch"] for p in rule["plans"]] == list(range(EPOCHS))
    info = json.loads((ctx.out / "data-n20" / "info.json").read_text())
    assert rule["wrong_labels"] == full["wrong_labels"] == info["train"]["noisy_label"] > 0
    for p in rule["plans"]:  # a plan that suspects nothing has no precision; recall is then 0
        assert p["suspected"] == rule["rows"][p["epoch"]]["noise_suspected"]
        assert (p["precision"] is None) == (p["suspected"] == 0)


@pytest.mark.slow
def test_the_report_of_the_tiny_runs_holds_their_rows(tiny) -> None:
    ctx, _, runs = tiny
    text = wn.report(ctx)
    full, rule = runs["words-n20-full-s0"], runs["words-n20-rule-s0"]
    gap = 100 * (rule["rows"][-1]["acc"] - full["rows"][-1]["acc"])
    active = [p["epoch"] for p in rule["plans"] if p["active"]]
    assert f"| 20% | 0 | {rule['wrong_labels']:,} | {len(active)} of {EPOCHS}" in text
    assert f"| {100 * rule['rows'][-1]['acc']:.1f} | {100 * full['rows'][-1]['acc']:.1f} | {gap:+.1f} |" in text
    assert (
        f"* 20% wrong labels (1 seed): the rule active in {len(active)} of {EPOCHS} plans; rule minus full data "
        in text
    )
    assert "* Not run (cut or not reached): none." in text
