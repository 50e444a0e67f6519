"""studies/rule_mechanisms.py: the committed page is the one its results file gives, and the scores and
plans it measures are what it names (on a small recorded history whose answers are known)."""

from __future__ import annotations

import json

import numpy as np

from studies import rule_mechanisms as rm


def test_committed_page_is_generated_from_the_results_file() -> None:
    assert rm.DOC.read_text() == rm.report(json.loads(rm.RESULTS.read_text()))


def test_scores_are_the_mean_the_last_epoch_the_window_and_the_per_label_standardised_mean() -> None:
    losses = np.array([[1.0, 2.0, 3.0, 6.0], [2.0, 2.0, 2.0, 2.0], [0.0, 4.0, 2.0, 2.0], [3.0, 3.0, 3.0, 1.0]])
    labels = np.array([0, 0, 1, 1])
    assert rm.scores("mean", losses, 3, labels)[0].tolist() == [3.0, 2.0, 2.0, 2.5]
    assert rm.scores("mean", losses, 1, labels)[1].tolist() == [2.0, 2.0, 4.0, 3.0]  # the last loss: epoch 1's
    assert rm.scores("last", losses, 3, labels)[0].tolist() == [6.0, 2.0, 2.0, 1.0]
    assert rm.scores("window3", losses, 3, labels)[0].tolist() == [11 / 3, 2.0, 8 / 3, 7 / 3]
    z, last = rm.scores("mean-by-label", losses, 3, labels)
    # label 0: means 3 and 2 (mean 2.5, sd 0.5); label 1: 2 and 2.5 (mean 2.25, sd 0.25)
    assert z.tolist() == [1.0, -1.0, -1.0, 1.0]
    assert last.tolist() == [(6.0 - 2.5) / 0.5, (2.0 - 2.5) / 0.5, (2.0 - 2.25) / 0.25, (1.0 - 2.25) / 0.25]


def test_trajectory_finds_a_separate_high_mode_and_holds_its_threshold() -> None:
    rng = np.random.default_rng(0)
    n, noisy_n, epochs = 4000, 800, 6
    noisy = np.zeros(n, dtype=bool)
    noisy[:noisy_n] = True
    # clean losses fall epoch by epoch, the noisy ones stay high: two modes from the second epoch on
    clean = rng.gamma(2.0, 0.15, (n, epochs)) * np.linspace(1.0, 0.4, epochs)
    losses = np.where(noisy[:, None], rng.normal(4.0, 0.3, (n, epochs)), clean)
    traj = rm.trajectory(losses, np.zeros(n, dtype=np.int64), noisy, "mean")
    assert [t["epoch"] for t in traj] == list(range(epochs))
    assert traj[0]["suspected"] == 0 and traj[0]["D"] is None  # one record each: no candidate yet
    active = [t for t in traj if t["active"]]
    assert active and all(t["precision"] == 1.0 and t["recall"] == 1.0 for t in active)
    thresholds = [t["threshold"] for t in active]
    assert thresholds == sorted(thresholds)  # version 2: the floor never lets it fall
    assert all(t["auc"] == 1.0 for t in traj)


def test_the_way_back_sentence_counts_what_the_rule_runs_gave_back() -> None:
    """way_back: of the clean (noisy) samples the rule's runs ever suspected, the share back in
    training at the last plan, each seed's and the mean; nothing where a run lacks the counts."""
    from studies.rule_mechanisms import way_back

    own = [
        {"run_suspects": {"clean_suspected": 200, "clean_back": 20, "true_positives": 1000, "noisy_back": 10}},
        {"run_suspects": {"clean_suspected": 100, "clean_back": 5, "true_positives": 900, "noisy_back": 0}},
    ]
    assert way_back(own) == (
        " Of the clean images any of its plans suspected (150, mean over the seeds), 12 were back in training at"
        " the last plan (0.075 of them; seeds 0.100, 0.050); of the noisy ones 5 of 950 (0.005)."
    )
    assert way_back([own[0], {"run_suspects": {"suspected": 3}}]) == ""
    # a run that suspected nothing has no share: out of the mean, "-" as its seed's
    nothing = {"run_suspects": {"clean_suspected": 0, "clean_back": 0, "true_positives": 0, "noisy_back": 0}}
    assert way_back([own[0], nothing]) == (
        " Of the clean images any of its plans suspected (100, mean over the seeds), 10 were back in training at"
        " the last plan (0.100 of them; seeds 0.100, -); of the noisy ones 5 of 500 (0.010)."
    )
