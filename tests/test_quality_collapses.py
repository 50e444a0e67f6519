"""The collapse diagnosis of the accuracy study (studies/quality/collapse*.py): the list of
epochs at chance read from the committed run files, and the forks of the experiment's probe."""

from __future__ import annotations

import json

import numpy as np
import pytest

from studies.quality.collapses import collapses
from studies.quality.layout import Layout


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
    from studies.quality.collapse import Probe

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
    from studies.quality.pipeline import evaluate

    end = {k: v.clone() for k, v in model.state_dict().items()}
    acc = evaluate(model, test)
    out = probe.after_epoch(model, opts, test, "cpu")
    assert out["final_batch"] == 4 and out["size_4"] == acc  # the final step replayed from its fork: same model
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in end.items())  # the run goes on unchanged
    assert evaluate(model, test) == acc


# ------------------------------------------------------------------- the instability scan
def test_the_scan_reads_every_folder_and_finds_collapses_and_one_epoch_drops(tmp_path) -> None:
    """Result files at every depth: a converged-study curve that collapses, a pairs curve that falls
    exactly 20 points (and one 19.9 points), a noisy-label curve (rows) without events, and files
    with no curve (the short study's epochs, a calibration) counted but not read."""
    from studies.quality import instability as ins

    def conv(accs):
        return {"dataset": "cifar10", "policy": "seta", "seed": 0, "epochs": [{"test_acc": a} for a in accs]}

    def pairs(r1s, test=1000):
        return {"policy": "random", "label": "p30", "seed": 1, "data": {"test": test},
                "rows": [{"i2t_r1": x, "t2i_r1": x} for x in r1s]}  # fmt: skip

    files = {
        "converged/cifar10-E4-seta-s0.json": conv([0.5, 0.7, 0.11, 0.6]),  # collapse and drop at e2
        "noise-study/sub/pairs-a.json": pairs([0.05, 0.30, 0.10, 0.35]),  # 20 points exactly: a drop
        "noise-study/pairs-b.json": pairs([0.05, 0.30, 0.101, 0.35]),  # 19.9 points: none
        "pairs-c.json": pairs([0.2, 0.012, 0.3]),  # chance 0.1%: collapse at e1 (18.8 points)
        "noise-study/cifar10-noisy-x-s0.json": {"dataset": "cifar10", "rows": [{"test_acc": a} for a in (0.3, 0.4)]},
        "sst2-clean-full-s0.json": {"epochs": [{"kept": 10}]},  # the short study: no curve
        "noise-study/pairs-n20-cal-base.json": {"levels": {}},
        "sst2-x.json": {"dataset": "sst2", "epochs": [{"test_acc": a} for a in (0.8, 0.51, 0.9)]},  # chance 50%
    }
    for rel, d in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(json.dumps(d))
    found = ins.scan(tmp_path)
    assert (found["files"], found["with_curve"]) == (8, 6)
    assert [(r["file"], r["collapse_epochs"], [d["epoch"] for d in r["drops"]]) for r in found["runs"]] == [
        ("converged/cifar10-E4-seta-s0.json", [2], [2]),
        ("noise-study/sub/pairs-a.json", [], [2]),
        ("pairs-c.json", [1], []),
        ("sst2-x.json", [1], [1]),
    ]
    assert [ins.events_text(r) for r in found["runs"]] == [
        "collapse at e2; drop at e2 (70.0 -> 11.0)",
        "drop at e2 (30.0 -> 10.0)",
        "collapse at e1",
        "collapse at e1; drop at e1 (80.0 -> 51.0)",
    ]
    doc = tmp_path / "quality.md"
    doc.write_text(f"# q\n\n{ins.BEGIN}\nold\n{ins.END}\n\ntail\n")
    ins.write(tmp_path, doc)
    assert json.loads((tmp_path / ins.OUT).read_text()) == found  # the scan skips its own file
    text = doc.read_text()
    assert text.startswith(f"# q\n\n{ins.BEGIN}\n`python -m studies instability` read all 8 result files")
    assert "| `noise-study/sub/pairs-a.json` | random | 1 | mean R@1 | drop at e2 (30.0 -> 10.0) |" in text
    assert text.endswith(f"{ins.END}\n\ntail\n") and "\nold\n" not in text
    assert ins.scan(tmp_path) == found


def test_the_committed_scan_is_current_and_names_every_collapse() -> None:
    """docs/quality-runs/instability.json is the scan of the committed result files; it holds every
    collapse of collapses.json and the pairs run of the 2-core noise study that fell to chance at
    epoch 6 after 21.3% (a 19.7-point fall, so a collapse and no drop)."""
    from studies.quality import instability as ins

    committed = json.loads((ins.RESULTS / ins.OUT).read_text())
    assert committed == ins.scan()
    files = {r["file"]: r for r in committed["runs"]}
    for c in collapses(Layout()):
        assert any(f.endswith(f"/{c['run_id']}.json") and c["epoch"] in r["collapse_epochs"] for f, r in files.items())
    r = files["noise-study-2core/pairs-n20-E10-seta-p50-alpha0.4-k10-r0.1-s0.json"]
    assert (r["collapse_epochs"], r["drops"]) == ([6], [])
    # no full-data run fell (one cut short by its invocation's end is named as such, not as a fall)
    full = [r for r in committed["runs"] if r["policy"] == "full" and r["label"] in ("full", None)]
    assert not any(r["collapse_epochs"] or r["drops"] or r["diverged"] for r in full)


def test_the_scan_reads_the_word_image_runs_against_their_chance() -> None:
    from studies.quality import instability as ins

    run = {"study": "words-noise", "dataset": "words", "rows": [{"acc": 0.5}, {"acc": 0.8}, {"acc": 0.02}]}
    assert ins.curve(run, "words-n3-full-s0.json") == ([0.5, 0.8, 0.02], 0.02, "test accuracy")
    found = ins.findings(run, "words-n3-full-s0.json")
    assert found["collapse_epochs"] == [2] and found["drops"]
    assert ins.curve({"study": "other", "rows": [{"acc": 0.5}]}, "x.json") is None  # no data set: no chance


def test_the_scan_reads_each_run_of_a_file_of_many_runs_and_names_it_by_id(tmp_path) -> None:
    """A file that nests its runs ({"meta", "runs": {id: run}}, studies/cifar_gpu.py) is read run by
    run; the committed cifar-gpu file's 40 runs all have a curve."""
    from studies.quality import instability as ins

    def run(accs: list[float]) -> dict:
        return {"dataset": "cifar10", "policy": "full", "seed": 0, "rows": [{"test_acc": a} for a in accs]}

    doc = {"meta": {"commit": "x"}, "runs": {"a-s0": run([0.5, 0.7, 0.45]), "b-s0": run([0.5, 0.6, 0.65])}}
    (tmp_path / "gpu").mkdir()
    (tmp_path / "gpu" / "results.json").write_text(json.dumps(doc))
    found = ins.scan(tmp_path)
    assert (found["files"], found["with_curve"]) == (1, 2)
    assert [(r["file"], [d["epoch"] for d in r["drops"]]) for r in found["runs"]] == [("gpu/results.json#a-s0", [2])]
    gpu = ins.scan(ins.RESULTS / "cifar-gpu")
    assert gpu["with_curve"] == 40
    committed = json.loads((ins.RESULTS / ins.OUT).read_text())
    assert committed["with_curve"] >= 40 and "stopped" in committed["rule"] and "diverged" in committed["rule"]


def test_a_run_that_diverged_or_was_cut_short_is_unstable_and_named_so() -> None:
    from studies.quality import instability as ins

    rows = [{"test_acc": a, "loss": x} for a, x in ((0.5, 1.0), (0.6, 0.9), (0.62, float("nan")))]
    diverged = {"dataset": "cifar10", "rows": rows}
    cut = {"dataset": "cifar10", "status": "cut", "rows": [{"test_acc": a} for a in (0.5, 0.6, 0.62)]}
    fine = {"dataset": "cifar10", "status": "done", "rows": [{"test_acc": a} for a in (0.5, 0.6, 0.62)]}
    assert ins.findings(diverged, "x.json")["diverged"] and ins.unstable(diverged)
    assert ins.findings(cut, "x.json")["stopped"] == "cut short after 3 epochs" and ins.unstable(cut)
    assert not ins.unstable(fine) and not ins.unstable({**fine, "status": "ok"})
    assert ins.events_text(ins.findings({**cut, "rows": rows}, "x.json")) == "diverged; cut short after 3 epochs"
    note = ins.footnote([("a.json", diverged), "b.json", ("a.json", diverged)])
    assert note == (
        "† a run of this configuration collapsed to chance, fell 20 points or more in one epoch, diverged or was cut "
        "short (instability scan, `docs/quality-runs/instability.json`): `a.json` (diverged), `b.json`."
    )


def test_the_pages_mark_the_unstable_runs_they_show() -> None:
    """The second set of the converged study (converged-reruns/) feeds docs/results.md's and docs/quality.md's
    table and summary; the SST-2 schedule pilot's test accuracy is shown in docs/baselines-labels.md: each
    such run is marked and named with its events."""
    from studies.quality.instability import ROOT

    results = (ROOT / "docs" / "results.md").read_text()
    quality = (ROOT / "docs" / "quality.md").read_text()
    random_s0 = "`converged-reruns/cifar10-noaug-E20-random-p30-r0.3-s0.json` (drop at e9 (71.3 -> 49.7))"
    seta_s0 = "`converged-reruns/cifar10-noaug-E20-seta-p30-alpha0.9-k10-r0.1-s0.json` (drop at e9 (73.1 -> 22.5))"
    study = "| CIFAR-10, E = 20, no augmentation |"
    for page in (results, quality):
        (row,) = [x for x in page.splitlines() if x.startswith(f"{study} dynamic random p30")]
        assert row.endswith("| -1.25 (seed 0) † | - |")
        (row,) = [x for x in page.splitlines() if x.startswith(f"{study} SeTa p30 |")]
        assert "| -1.15 / +0.10 (seed 0) † |" in row
        notes = [x for x in page.splitlines() if x.startswith("† ") and random_s0 in x]
        assert notes and all(seta_s0 in x for x in notes)
    assert "dynamic random p30 -1.25 († unstable rerun: dynamic random p30 drop at e9 (71.3 -> 49.7))" in quality
    labels = (ROOT / "docs" / "baselines-labels.md").read_text()
    assert "\n| test acc % † | 53.6 |" in labels
    assert "`schedule-sst2-n40-E20-full-s0.json` (collapse at e5, e11, e15, e17, e18, e19)." in labels
