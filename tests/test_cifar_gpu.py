"""studies/cifar_gpu.py: the committed report is what its result file gives, and a tiny CPU run
of the study's runner keeps its promises (the oracle, dynamic random and equal compute)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from studies import cifar_gpu

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT.parent / "shared" / "data" / "cifar10"


def test_committed_report_is_generated_from_the_result_file() -> None:
    results = ROOT / "docs" / "quality-runs" / "cifar-gpu" / "results.json"
    assert (ROOT / "docs" / "cifar-gpu.md").read_text() == cifar_gpu.report(results)


def test_job_list_order_and_inputs() -> None:
    jobs = cifar_gpu.job_list(("sym40",), (0,), 3)
    ids = [j["id"] for j in jobs]
    assert ids == [
        "sym40-full-s0", "sym40-rule-s0", "sym40-oracle-s0", "sym40-rulerand-s0", "sym40-rule1-s0",
        "sym40-dynrand-s0", "sym40-equal-s0",
        "sym40-clfold0-s0", "sym40-clfold1-s0", "sym40-clfold2-s0", "sym40-clfold3-s0", "sym40-cleanlab-s0",
    ]  # fmt: skip
    needs = {j["id"]: j.get("needs") for j in jobs if j.get("needs")}
    assert needs == {
        "sym40-dynrand-s0": ["sym40-rule-s0"],
        "sym40-equal-s0": ["sym40-rule-s0"],
        "sym40-cleanlab-s0": [f"sym40-clfold{k}-s0" for k in range(4)],
    }


def test_folds_are_disjoint_cover_every_key_and_are_stratified() -> None:
    keys = np.array([f"train_{i:06d}" for i in range(4003)])
    labels = np.arange(4003) * 7 % 10
    folds = cifar_gpu.fold_of(keys, labels, 4, 0)
    assert set(folds.tolist()) == {0, 1, 2, 3}  # each key in exactly one fold, of sizes within one
    assert sorted(np.bincount(folds).tolist()) == [1000, 1001, 1001, 1001]
    for c in range(10):
        per = np.bincount(folds[labels == c], minlength=4)
        assert per.max() - per.min() <= 1  # each label dealt evenly (stratified)
    assert np.array_equal(cifar_gpu.fold_of(keys[::-1], labels[::-1], 4, 0)[::-1], folds)  # not the order
    assert not np.array_equal(cifar_gpu.fold_of(keys, labels, 4, 1), folds)  # another seed, other folds


@pytest.mark.slow
def test_tiny_cpu_run(tmp_path: Path) -> None:
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "studies", "cifar_gpu", "--model", "cnn", "--data", str(DATA),
           "--out", str(out), "--kinds", "sym40", "--seeds", "0", "--jobs", "2", "--limit", "300", "--epochs", "2",
           "--only=-(full|rule|oracle|dynrand|equal)-s0"]  # fmt: skip
    subprocess.run(cmd, check=True, capture_output=True, timeout=600, cwd=ROOT)
    # the rule's suspects over the run, read back from its plans; a copy of the result file that
    # records other suspects than the run directory's plans hold is another run: left as it was
    other = json.loads((out / "results.json").read_text())
    other["runs"]["sym40-rule-s0"]["rows"][1]["suspected"] = 1
    (tmp_path / "other.json").write_text(json.dumps(other))
    assert cifar_gpu.add_run_suspects(tmp_path / "other.json", out / "work") == [
        f"{out / 'work' / 'run-sym40-rule-s0'}: not the run {tmp_path / 'other.json'} recorded as sym40-rule-s0 "
        "(epoch 1's plan suspects 0, the result 1); left as it was"
    ]
    assert "run_suspects" not in json.loads((tmp_path / "other.json").read_text())["runs"]["sym40-rule-s0"]
    assert cifar_gpu.add_run_suspects(out / "results.json", out / "work") == []
    runs = json.loads((out / "results.json").read_text())["runs"]
    assert sorted(runs) == sorted(f"sym40-{m}-s0" for m in ("full", "rule", "oracle", "dynrand", "equal"))
    assert {r["status"] for r in runs.values()} == {"done"}
    cache = np.load(out / "work" / "cifar10.npz")
    noisy = cifar_gpu.noisy_labels("sym40", cache["train_keys"], cache["train_y"]) != cache["train_y"]
    full, rule, oracle = runs["sym40-full-s0"], runs["sym40-rule-s0"], runs["sym40-oracle-s0"]
    assert full["population"] == 300 and [r["trained"] for r in full["rows"]] == [300, 300]
    assert full["noisy_in_population"] == int(noisy.sum()) == round(0.4 * 300)
    # the oracle trains exactly the clean samples, every epoch
    assert oracle["population"] == 300 - int(noisy.sum()) and oracle["noisy_in_population"] == 0
    assert [r["noisy_trained"] for r in oracle["rows"]] == [0, 0]
    # dynamic random at the rule's pruned share; equal compute trains exactly the rule's samples
    assert runs["sym40-dynrand-s0"]["params"] == {"r": round(rule["pruned"], 4)}
    assert runs["sym40-equal-s0"]["trained"] == rule["trained"] == runs["sym40-equal-s0"]["budget"]
    assert rule["params"] == {"noise": True} and rule["policy"] == "full"
    # two epochs: the rule (warm-up 2) suspected nothing, and says so over the run
    assert rule["run_suspects"] == {"suspected": 0, "true_positives": 0, "precision": None, "recall": 0.0,
                                    "clean_suspected": 0, "clean_back": 0, "noisy_back": 0}  # fmt: skip
    # a new results folder over the same work folder: the rule's finished run there is dynamic random's input
    (out / "work" / "sym40-dynrand-s0.result.json").unlink()
    again = [*cmd[: cmd.index("--out") + 1], str(tmp_path / "again"), *cmd[cmd.index("--out") + 2 : -1],
             "--work", str(out / "work"), "--only=-dynrand-s0"]  # fmt: skip
    subprocess.run(again, check=True, capture_output=True, timeout=600, cwd=ROOT)
    rerun = json.loads((tmp_path / "again" / "results.json").read_text())["runs"]
    assert rerun["sym40-dynrand-s0"]["status"] == "done"
    assert rerun["sym40-dynrand-s0"]["params"] == runs["sym40-dynrand-s0"]["params"]


def test_suspects_over_the_run_and_their_way_back():
    """suspect_history on a hand-made run of 3 plans: a sample any plan suspected counts once;
    one not suspected at the last plan is back in training, clean and noisy counted apart."""
    suspected = np.array([[1, 1, 1], [1, 0, 0], [0, 0, 0], [0, 1, 1], [1, 1, 0], [0, 0, 0]], dtype=bool)
    noisy = np.array([1, 0, 1, 0, 1, 0], dtype=bool)
    assert cifar_gpu.suspect_history(suspected, noisy) == {
        "suspected": 4, "true_positives": 2, "precision": 0.5, "recall": 2 / 3,
        "clean_suspected": 2, "clean_back": 1, "noisy_back": 1,
    }  # fmt: skip
    none = cifar_gpu.suspect_history(np.zeros((6, 3), dtype=bool), noisy)
    assert none == {"suspected": 0, "true_positives": 0, "precision": None, "recall": 0.0,
                    "clean_suspected": 0, "clean_back": 0, "noisy_back": 0}  # fmt: skip


def test_the_detection_auc_is_the_mann_whitney_statistic_with_ties_at_half():
    """auc_of, which the study reports per epoch beside precision and recall, equals
    scikit-learn's roc_auc_score on scores with ties, and is None without both classes."""
    from sklearn.metrics import roc_auc_score

    from studies.cifar_gpu import auc_of

    rng = np.random.default_rng(0)
    for ties in (False, True):
        s = rng.normal(size=2000)
        s = np.round(s, 1) if ties else s
        y = rng.random(2000) < 0.3
        s[y] += 0.7
        assert auc_of(s, y) == pytest.approx(roc_auc_score(y, s), abs=1e-12)
    assert auc_of(np.array([1.0, 2.0]), np.array([True, False])) == 0.0
    assert auc_of(np.array([1.0, 2.0]), np.array([True, True])) is None


def _run(kind, method, seed, finals, val=None, suspects=None, **extra):
    rows = [
        {"epoch": e, "test_acc": a, "val_acc": (val or finals)[e], "noisy_learnt": 0, "learnt": 100, "suspected": 0,
         "precision": None, "recall": 0.0, "auc": 0.9 + 0.01 * e, "noise_threshold": None}
        for e, a in enumerate(finals)
    ]  # fmt: skip
    return {"id": f"{kind}-{method}-s{seed}", "kind": kind, "method": method, "seed": seed, "epochs": len(finals),
            "status": "done", "rows": rows, "trained": 100 * len(finals), "noisy_in_population": 40,
            **({"run_suspects": suspects} if suspects else {}), **extra}  # fmt: skip


def cpu_page(tmp_path, runs: dict) -> str:
    """report_cpu's page of a results file (tmp_path/cifar-cpu/results.json) holding ``runs``."""
    meta = {"batch": 256, "lr": 0.1, "weight_decay": 5e-4, "threads": 1, "torch": "x", "commit": "abc", "argv": []}
    path = tmp_path / "cifar-cpu" / "results.json"
    path.parent.mkdir()
    path.write_text(json.dumps({"meta": meta, "runs": runs}))
    return cifar_gpu.report_cpu(path)


def test_the_cpu_page_holds_the_rule_to_its_targets(tmp_path):
    """report_cpu's targets table from a results file: rule minus full data, both early-stopped,
    mean + 2 SE >= 0; the oracle's margin; where it is 2 points or more, mean - 2 SE > 0 and within
    1 point of the oracle; the suspects over the whole run (precision and recall >= 0.9)."""
    runs = {}
    for s, (full, rule, oracle) in enumerate([(0.60, 0.62, 0.70), (0.61, 0.625, 0.71), (0.59, 0.605, 0.69)]):
        for method, acc in (("full", full), ("rule", rule), ("oracle", oracle)):
            sus = {"suspected": 10, "true_positives": 9, "precision": 0.9, "recall": 0.95} if method == "rule" else None
            r = _run("sym40", method, s, [acc - 0.1, acc], suspects=sus)
            runs[r["id"]] = r
    page = cpu_page(tmp_path, runs)
    assert (
        "| rule (early-stopped) minus full data (early-stopped): mean + 2 SE >= 0 | +1.67 + 0.33 = +2.00 | met |"
        in page
    )
    assert (
        "| the oracle filter minus full data, both early-stopped (the margin noise leaves) | +10.00 | 2 points or "
        "more: the two targets below apply |"
    ) in page
    assert "| rule minus full data, both early-stopped: mean - 2 SE > 0 | +1.33 | met |" in page
    assert "| rule within 1 point of the oracle filter (both early-stopped, mean) | -8.33 | not met |" in page
    assert (
        "| the rule's suspects over the whole run: precision >= 0.9 at recall >= 0.9 (mean over seeds) | "
        "0.900 / 0.950 | met |"
    ) in page
    assert "| 1 | 0.910 | - | 0 | - | 0.000 | - | - | - | - |" in page  # the per-epoch table


def test_the_cpu_page_names_what_was_not_run_and_leaves_out_cut_runs(tmp_path):
    """A kind whose matrix is partial: the methods with no finished run are named, as are the seeds a
    method lacks, and a run cut short (status not done) is counted as not finished, never tabled."""
    runs = {}
    for s in (0, 1, 2):
        r = _run("sym20", "full", s, [0.5, 0.6 + 0.01 * s])
        runs[r["id"]] = r
    r = _run("sym20", "rule", 0, [0.5, 0.61])
    runs[r["id"]] = r
    cut = _run("sym20", "rule", 1, [0.5, 0.99], status="running")
    runs[cut["id"]] = cut
    page = cpu_page(tmp_path, runs)
    assert "not finished: sym20-rule-s1." in page
    assert "| the noise rule (full, noise=True) | 61.00 | 61.00 |" in page  # seed 1's cut run is not in the table
    assert "99.00" not in page
    absent = [cifar_gpu.METHODS[m] for m in ("oracle", "rulerand", "rule1", "dynrand", "equal", "cleanlab")]
    assert f"Not run for this kind of noise in the time the study had: {'; '.join(absent)}." in page
    assert "Run on fewer seeds: the noise rule (full, noise=True) (no finished run on seed 1, 2)." in page


def test_merged_results_keep_each_run_once_finished_first_and_every_invocation():
    inv = [{"commit": c, "argv": [c]} for c in ("a", "b", "c")]
    one = {
        "meta": {"commit": "a", "invocations": inv[:2]},
        "runs": {
            "x": {"id": "x", "status": "done", "rows": [1, 2]},
            "y": {"id": "y", "status": "running", "rows": [1]},
        },
    }
    two = {"meta": {"commit": "c", "invocations": [inv[1], inv[2]]},
           "runs": {"x": {"id": "x", "status": "running", "rows": [1, 2, 3]}, "y": {"id": "y", "status": "done",
                                                                                  "rows": [1, 2]},
                    "z": {"id": "z", "status": "cut", "rows": []}}}  # fmt: skip
    merged = cifar_gpu.merge_results([one, two])
    assert merged["meta"] == {"commit": "c", "invocations": inv}
    assert {k: (r["status"], len(r["rows"])) for k, r in merged["runs"].items()} == {
        "x": ("done", 2),
        "y": ("done", 2),
        "z": ("cut", 0),
    }


def test_a_merged_run_keeps_its_invocation_where_a_later_copy_has_none():
    stamped = {"commit": "a", "argv": ["a"]}
    suspects = {"suspected": 3, "precision": 1.0}
    one = {"meta": {"invocations": [stamped]},
           "runs": {"x": {"id": "x", "status": "done", "rows": [1], "invocation": stamped, "run_suspects": suspects},
                    "y": {"id": "y", "status": "cut", "rows": [1], "invocation": stamped}}}  # fmt: skip
    copy = {"meta": {"invocations": []}, "runs": {"x": {"id": "x", "status": "done", "rows": [1]},
                                                  "y": {"id": "y", "status": "done", "rows": [1, 2]},
                                                  "n": {"id": "n", "status": "done", "rows": [1]}}}  # fmt: skip
    merged = cifar_gpu.merge_results([one, copy])["runs"]
    assert merged["x"] == {"id": "x", "status": "done", "rows": [1], "invocation": stamped, "run_suspects": suspects}
    # a finished run over a cut one is another run: nothing of the cut one's record stays
    assert merged["y"] == {"id": "y", "status": "done", "rows": [1, 2]} and "invocation" not in merged["n"]
