"""The accuracy study's plan and report (studies/quality): no training, synthetic run files."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

pytest.importorskip("matplotlib")

from studies.quality.configs import (  # noqa: E402
    conv_calibration_name,
    conv_cfg,
    conv_full,
    conv_run_id,
    converged_plan,
    equal_compute_epochs,
)
from studies.quality.layout import Layout  # noqa: E402
from studies.quality.machine import other_cpu, software  # noqa: E402
from studies.quality.report_converged import report_converged  # noqa: E402

CAL = {
    "source": "cifar10-E36-full-e36-default-s0",
    "levels": {
        "infobatch": {lv: {"params": {"r": 0.7}, "simulated": 0.29} for lv in ("30", "50", "70")},
        "seta": {
            "30": {"params": {"alpha": 0.7, "k": 10, "r": 0.1}, "simulated": 0.3},
            "50": {"params": {"alpha": 0.5, "k": 10, "r": 0.2}, "simulated": 0.5},
            "70": {"params": {"alpha": 0.3, "k": 5, "r": 0.5}, "simulated": 0.7},
        },
    },
}


def test_equal_compute_epochs_are_distinct_rounded_and_leave_out_E() -> None:
    assert equal_compute_epochs(36, [0.3, 0.306, 0.5, 0.7, 0.0, 0.49]) == [25, 18, 11]


def test_converged_plan_before_and_after_calibration() -> None:
    ids = [conv_run_id(c, s) for c, s in converged_plan(36, 2, None, [])]
    assert ids == [
        "cifar10-E36-full-e36-default-s0",
        "cifar10-E36-full-e72-default-s0",
        "cifar10-E36-full-e36-default-s1",
    ]
    ids = [conv_run_id(c, s) for c, s in converged_plan(36, 2, CAL, [0.3, 0.5])]
    seed0 = [
        "cifar10-E36-full-e36-default-s0",
        "cifar10-E36-full-e72-default-s0",
        "cifar10-E36-seta-p30-alpha0.7-k10-r0.1-s0",
        "cifar10-E36-random-p30-r0.3-s0",
        "cifar10-E36-seta-p50-alpha0.5-k10-r0.2-s0",
        "cifar10-E36-random-p50-r0.5-s0",
        "cifar10-E36-seta-p70-alpha0.3-k5-r0.5-s0",
        "cifar10-E36-random-p70-r0.7-s0",
        "cifar10-E36-infobatch-p30-r0.7-s0",
        "cifar10-E36-seta-p50tk-alpha0.5-k10-r0.2-target_keep0.5-s0",
        "cifar10-E36-full-e25-default-s0",
        "cifar10-E36-full-e18-default-s0",
    ]
    seed1 = [i.replace("-s0", "-s1") for i in seed0 if "e72" not in i] + ["cifar10-E36-full-e72-default-s1"]
    assert ids == seed0 + seed1


def _run(cfg: dict, seed: int, accs: list[float], pruned: float, other: float = 0.0) -> dict:
    n, kept = 45000, round(45000 * (1 - pruned))
    epochs = [
        {
            "epoch": e,
            "phase": "prune",
            "n": n,
            "kept": kept,
            "streamed": kept,
            "backprop": kept,
            "train_loss": 1.0,
            "seconds": 20.0,
            "other_cpu": other,
            "load1": 1.0,
            "samples": kept * (e + 1),
            "train_seconds": 20.0 * (e + 1),
            "test_acc": a,
        }  # fmt: skip
        for e, a in enumerate(accs)
    ]
    return {"dataset": "cifar10", **cfg, "seed": seed, "epochs": epochs, "pruned": pruned,
            "pruned_backprop": pruned, "val_acc": accs[-1], "test_acc": accs[-1], "seconds": 100.0}  # fmt: skip


def test_a_study_without_augmentation_has_its_own_ids_plan_and_calibration() -> None:
    assert conv_run_id(conv_full(20, 14, augment=False), 1) == "cifar10-noaug-E20-full-e14-default-s1"
    assert conv_run_id(conv_full(20, 14), 1) == "cifar10-E20-full-e14-default-s1"
    assert conv_full(20, 14) == conv_cfg(20, "full", {}, "e14", 14)  # augmented configurations unchanged
    assert "augment" not in conv_full(20, 14) and conv_full(20, 14, augment=False)["augment"] is False
    assert conv_calibration_name(20, augment=False) == "cifar10-noaug-E20-calibration.json"
    ids = [conv_run_id(c, s) for c, s in converged_plan(20, 2, CAL, [0.3], augment=False)]
    assert ids[:3] == [
        "cifar10-noaug-E20-full-e20-default-s0",
        "cifar10-noaug-E20-full-e40-default-s0",
        "cifar10-noaug-E20-seta-p30-alpha0.7-k10-r0.1-s0",
    ]
    assert ids == [i.replace("-E20-", "-noaug-E20-") for c, s in converged_plan(20, 2, CAL, [0.3])
                   for i in [conv_run_id(c, s)]]  # fmt: skip


def test_another_model_has_its_own_ids_plan_and_calibration() -> None:
    cfg = conv_full(30, 21, model="resnet18")
    assert conv_run_id(cfg, 0) == "cifar10-resnet18-E30-full-e21-default-s0"
    assert cfg == {**conv_full(30, 21), "model": "resnet18"} and "model" not in conv_full(30, 21)
    assert (
        conv_run_id(conv_full(30, 30, augment=False, model="resnet18"), 1)
        == "cifar10-resnet18-noaug-E30-full-e30-default-s1"
    )
    assert conv_calibration_name(30, model="resnet18") == "cifar10-resnet18-E30-calibration.json"
    ids = [conv_run_id(c, s) for c, s in converged_plan(30, 2, CAL, [0.3], model="resnet18")]
    assert ids == [i.replace("cifar10-E30-", "cifar10-resnet18-E30-") for c, s in converged_plan(30, 2, CAL, [0.3])
                   for i in [conv_run_id(c, s)]]  # fmt: skip
    assert all(c["model"] == "resnet18" for c, _ in converged_plan(30, 2, CAL, [0.3], model="resnet18"))


def test_resnet18_is_the_cifar_variant_of_the_papers() -> None:
    torch = pytest.importorskip("torch")
    from studies.quality.models import image_model

    model = image_model("resnet18")
    assert sum(p.numel() for p in model.parameters()) == 11_173_962  # ResNet-18 with a 3x3 stride-1 stem
    assert model[0].kernel_size == (3, 3) and model[0].stride == (1, 1)
    assert not any(isinstance(m, torch.nn.MaxPool2d) for m in model.modules())
    assert tuple(model(torch.zeros(2, 3, 32, 32)).shape) == (2, 10)
    with pytest.raises(ValueError, match="unknown image model 'resnet50'; expected one of cnn, resnet18"):
        image_model("resnet50")


def _report(tmp_path: Path, runs: list[dict], doc: str = "<!-- converged:begin -->\n<!-- converged:end -->\n",
            cal: tuple[str, dict] | None = None) -> tuple[Layout, str]:  # fmt: skip
    """Write ``runs`` as result files (and a calibration), render the converged section: (layout, page)."""
    layout = Layout(results=tmp_path / "docs" / "quality-runs", out=tmp_path / "out")
    layout.converged.mkdir(parents=True)
    layout.doc.write_text(doc)
    if cal:
        (layout.converged / cal[0]).write_text(json.dumps(cal[1]))
    for r in runs:
        (layout.converged / f"{conv_run_id(r, r['seed'])}.json").write_text(json.dumps(r))
    report_converged(layout)
    return layout, layout.doc.read_text()


def test_report_names_the_model_and_the_device_of_another_models_section(tmp_path: Path) -> None:
    gpu = [
        {**_run(conv_full(4, 4, model="resnet18"), 0, [0.8, 0.9, 0.93, 0.94], 0.0), "device": "cuda"},
        {**_run(conv_full(4, 8, model="resnet18"), 0, [0.8, 0.9, 0.93, 0.94, 0.94, 0.94, 0.943, 0.944], 0.0),
         "device": "cuda"},
    ]  # fmt: skip
    layout, doc = _report(tmp_path, [_run(conv_full(4, 4), 0, [0.5, 0.7, 0.8, 0.85], 0.0), *gpu])
    first, second = doc.split("### CIFAR-10, ResNet-18 on GPU, E = 4 epochs\n")
    assert first.startswith("<!-- converged:begin -->\n### CIFAR-10, E = 4 epochs\n")
    assert "full data at E = 4 and 2E = 8 epochs: seed 0: 94.00 -> 94.40 (+0.40);" in second
    assert "`cifar10-resnet18-E4-full-e4-default-s1`" in second and "resnet18" not in first
    assert (layout.plots / "cifar10-resnet18-E4-curves.png").exists()


def test_report_gives_the_study_without_augmentation_its_own_section(tmp_path: Path) -> None:
    runs = [
        _run(conv_full(4, 4), 0, [0.5, 0.7, 0.8, 0.85], 0.0),
        _run(conv_full(4, 4, augment=False), 0, [0.6, 0.7, 0.74, 0.75], 0.0),
        _run(conv_full(4, 8, augment=False), 0, [0.6, 0.7, 0.72, 0.73, 0.74, 0.75, 0.75, 0.752], 0.0),
    ]
    layout, doc = _report(tmp_path, runs)
    first, second = doc.split("### CIFAR-10, E = 4 epochs, no augmentation\n")
    assert first.startswith("<!-- converged:begin -->\n### CIFAR-10, E = 4 epochs\n")
    assert "full data at E = 4 and 2E = 8 epochs: 85.00% at E (seed 0); the run at 2E has not finished yet." in first
    assert (
        "full data at E = 4 and 2E = 8 epochs: seed 0: 75.00 -> 75.20 (+0.20); training loss of the last epoch "
        "1.00 -> 1.00 nats. Within 0.5 point on every seed: full data has converged at E." in second
    )
    assert "`cifar10-noaug-E4-full-e4-default-s1`" in second and "`cifar10-E4-full-e4-default-s1`" in first
    assert sorted(p.name for p in layout.plots.iterdir()) == ["cifar10-E4-curves.png", "cifar10-noaug-E4-curves.png"]


def test_each_study_of_a_folder_reports_its_own_checks_and_keeps_the_others(tmp_path: Path) -> None:
    """Two studies share docs/quality-runs/converged/checks.json: each section counts its own result
    files and run directories (found earlier, no longer on this machine), and a problem of one
    study's run directory is listed in its section only."""
    runs = [
        _run(conv_full(4, 4), 0, [0.5, 0.7, 0.8, 0.85], 0.0),
        _run(conv_full(4, 4, augment=False), 0, [0.6, 0.7, 0.74, 0.75], 0.0),
        _run(conv_full(4, 8, augment=False), 0, [0.6, 0.7, 0.72, 0.73, 0.74, 0.75, 0.75, 0.752], 0.0),
    ]
    layout, _ = _report(tmp_path, runs)
    earlier = {"cifar10-E4-full-e4-default-s0": ["cifar10-E4-full-e4-default-s0: epoch 1: wrong window"],
               "cifar10-noaug-E4-full-e4-default-s0": [], "cifar10-noaug-E4-full-e8-default-s0": [],
               "cifar10-E9-full-e9-default-s0": []}  # fmt: skip
    (layout.converged / "checks.json").write_text(json.dumps({"run_dirs": earlier}))
    report_converged(layout)
    first, second = layout.doc.read_text().split("### CIFAR-10, E = 4 epochs, no augmentation\n")
    delivered = "result files (loader delivered exactly the planned samples in every epoch) and"
    assert f"1 {delivered} 1 run directories" in first
    assert "**1 problems**:" in first and "* cifar10-E4-full-e4-default-s0: epoch 1: wrong window" in first
    assert f"2 {delivered} 2 run directories" in second
    assert "no problem found." in second and "wrong window" not in second
    assert json.loads((layout.converged / "checks.json").read_text()) == {
        "studies": {
            "E4": {"runs_checked": 1, "results_problems": []},
            "noaug-E4": {"runs_checked": 2, "results_problems": []},
        },
        "run_dirs": earlier,
    }


def test_report_renders_partial_results(tmp_path: Path) -> None:
    runs = [
        _run(conv_full(4, 4), 0, [0.5, 0.7, 0.8, 0.85], 0.0),
        _run(conv_full(4, 8), 0, [0.5, 0.6, 0.7, 0.75, 0.8, 0.83, 0.85, 0.86], 0.0, other=0.4),
        _run(conv_cfg(4, "random", {"r": 0.5}, "p50"), 0, [0.4, 0.6, 0.7, 0.80], 0.5),
        _run(conv_full(4, 2), 0, [0.6, 0.82], 0.0),
    ]
    page = "# t\n\nintro\n\n<!-- converged:begin -->\nold\n<!-- converged:end -->\n\ntail\n"
    layout, doc = _report(tmp_path, runs, page, ("cifar10-E4-calibration.json", CAL))
    assert doc.startswith("# t\n\nintro\n\n<!-- converged:begin -->\n### CIFAR-10, E = 4 epochs\n")
    assert doc.endswith("<!-- converged:end -->\n\ntail\n")
    assert "**Status:** 4 of the 22 runs planned so far have finished." in doc
    assert "`cifar10-E4-seta-p30-alpha0.7-k10-r0.1-s0`, `cifar10-E4-random-p30-r0.3-s0`" in doc
    assert "full data at E = 4 and 2E = 8 epochs: seed 0: 85.00 -> 86.00 (+1.00);" in doc
    assert "**More than 0.5 point: full data has NOT converged at E**" in doc
    # random at 50%: -5 points against full data at E, -2 against full data trained 2 epochs
    assert "| random p50 | r=0.5 | 1 | 50.0 | 80.00 | -5.00 | 2 | 82.00 | -2.00 | - |" in doc
    assert "| full, 2 epochs | - | 1 | 50.0 (fewer epochs) | 82.00 | -3.00 | - | - | - | - | - | 0.7 | 0% |" in doc
    assert "| full, 8 epochs | - | 1 | none (2x the samples) | 86.00 | +1.00 | - | - | - | - | - | 2.7 | 40% |" in doc
    assert sorted(p.name for p in layout.plots.iterdir()) == ["cifar10-E4-curves.png", "cifar10-E4-pruned.png"]
    checks = json.loads((layout.converged / "checks.json").read_text())
    assert checks == {"studies": {"E4": {"runs_checked": 4, "results_problems": []}}, "run_dirs": {}}


def test_a_stopped_section_renders_its_own_folder_without_missing_runs_or_run_directories(tmp_path: Path) -> None:
    """The same-order runs: their own folder, markers, figures and checks; the current run
    directories (same ids) are not checked against them, and no missing run is listed."""
    from studies.quality.report_converged import SAME_ORDER

    runs = [_run(conv_full(4, 4), 0, [0.5, 0.7, 0.8, 0.85], 0.0), _run(conv_full(4, 2), 0, [0.6, 0.82], 0.0)]
    page = "<!-- converged:begin -->\nnew\n<!-- converged:end -->\n"
    page += "<!-- converged-same-order:begin -->\n<!-- converged-same-order:end -->\n"
    layout = Layout(results=tmp_path / "docs" / "quality-runs", out=tmp_path / "out")
    folder = layout.results / "converged-same-order"
    folder.mkdir(parents=True)
    layout.doc.write_text(page)
    for r in runs:
        (folder / f"{conv_run_id(r, 0)}.json").write_text(json.dumps(r))
    (folder / "cifar10-E4-calibration.json").write_text(json.dumps(CAL))
    (layout.runs / conv_run_id(runs[0], 0)).mkdir(parents=True)  # a current run's directory under the same id
    (layout.runs / conv_run_id(runs[0], 0) / "state.json").write_text("{}")
    report_converged(layout, SAME_ORDER)
    doc = layout.doc.read_text()
    new, old = doc.split("<!-- converged-same-order:begin -->\n")
    assert new == "<!-- converged:begin -->\nnew\n<!-- converged:end -->\n"
    assert old.startswith(
        "### CIFAR-10, E = 4 epochs\n\n**Status:** 2 of the 20 runs planned so far have finished.\n The study was "
        "stopped: its runs trained every epoch in the same order (see above), and it was not continued.\n\n"
    )
    assert "Still missing" not in old and "](quality/same-order/cifar10-E4-curves.png)" in old
    assert "written to `docs/quality-runs/converged-same-order/checks.json`): 2 result files" in old
    assert json.loads((folder / "checks.json").read_text())["run_dirs"] == {}
    figures = sorted(p.name for p in (layout.plots / "same-order").iterdir())
    assert figures == ["cifar10-E4-curves.png", "cifar10-E4-pruned.png"]
    assert not layout.converged.exists()


def test_other_cpu_is_the_share_of_all_cores_used_by_other_processes() -> None:
    cores = os.cpu_count() or 1
    # 10 s, the machine busy for 6 CPU-seconds of which 2 are ours: 4 CPU-seconds over 10 s x cores
    assert other_cpu((0.0, 100.0, 50.0), (10.0, 106.0, 52.0)) == pytest.approx(4 / (10 * cores))
    assert other_cpu((0.0, 100.0, 50.0), (10.0, 101.0, 52.0)) == 0.0


def test_a_result_records_the_cpu_and_package_versions_its_numbers_depend_on() -> None:
    from importlib.metadata import version

    import numpy as np
    import torch

    sw = software()
    assert set(sw) == {"cpu", "cpu_capability", "torch", "numpy", "pillow", "webdataset", "pyarrow", "polars"}
    assert (sw["torch"], sw["numpy"]) == (torch.__version__, np.__version__)
    assert (sw["pillow"], sw["webdataset"]) == (version("pillow"), version("webdataset"))
    assert sw["cpu_capability"] == str(torch.backends.cpu.get_cpu_capability())
    model = [ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
             if ln.startswith("model name")]  # fmt: skip
    assert sw["cpu"] == (model[0] if model else "unknown")


def test_convergence_check_reports_every_seed_at_2e_and_their_mean(tmp_path: Path) -> None:
    runs = [
        _run(conv_full(4, 4), 0, [0.5, 0.7, 0.8, 0.80], 0.0),
        _run(conv_full(4, 8), 0, [0.5, 0.6, 0.7, 0.75, 0.8, 0.8, 0.8, 0.806], 0.0),
        _run(conv_full(4, 4), 1, [0.5, 0.7, 0.8, 0.81], 0.0),
        _run(conv_full(4, 8), 1, [0.5, 0.6, 0.7, 0.75, 0.8, 0.8, 0.8, 0.812], 0.0),
    ]
    _, doc = _report(tmp_path, runs)
    assert (  # the mean gains less than 0.5 point, seed 0 more: not converged
        "**Convergence check:** full data at E = 4 and 2E = 8 epochs: seed 0: 80.00 -> 80.60 (+0.60), seed 1: "
        "81.00 -> 81.20 (+0.20); over 2 seeds 80.50% -> 80.90% (+0.40 points); training loss of the last epoch "
        "1.00 -> 1.00 nats. **More than 0.5 point: full data has NOT converged at E**; the next step is a larger E "
        "(`--epochs`).\n"
    ) in doc


_WORKER = r"""
import os, sys, time
from pathlib import Path
import studies.quality.harness as H
import studies.quality.study as study
from studies.quality.__main__ import parser

root = Path(sys.argv[1])

def fake_run(ctx, job, progress):
    with open(root / "log", "a") as f:
        f.write(f"{os.getpid()} {job.rid}\n")
    time.sleep(0.3)  # long enough that the other process looks for work meanwhile
    return {"pruned": 0.3}

study.run = fake_run
argv = ["--study", "converged", "--results", str(root / "results"), "--out", str(root / "out"), "--data",
        str(root / "data"), "--procs", "2"]
H.worker(study.context(parser().parse_args(argv)), study)
"""


def test_two_study_processes_share_the_plan_and_train_each_run_once(tmp_path: Path) -> None:
    """The converged study run as two processes (one per core): every run of the plan is trained by
    exactly one of them, and both take part."""
    import subprocess
    import sys

    from studies.quality.configs import conv_calibration_name

    layout = Layout(results=tmp_path / "results", out=tmp_path / "out", data=tmp_path / "data")
    layout.converged.mkdir(parents=True)
    (layout.converged / conv_calibration_name(36)).write_text(json.dumps(CAL))
    # full data at E, seed 0 is in: the calibration exists, so the plan has every pruned run
    (layout.converged / "cifar10-E36-full-e36-default-s0.json").write_text(json.dumps({"pruned": 0.0}))
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    procs = [subprocess.Popen([sys.executable, "-c", _WORKER, str(tmp_path)], env=env) for _ in range(2)]
    assert [p.wait(timeout=120) for p in procs] == [0, 0]
    log = [line.split() for line in (tmp_path / "log").read_text().splitlines()]
    ran = [rid for _, rid in log]
    measured = [json.loads(p.read_text())["pruned"] for p in layout.converged.glob("*-s0.json") if "full" not in p.name]
    planned = {conv_run_id(c, s) for c, s in converged_plan(36, 2, CAL, measured)} - {"cifar10-E36-full-e36-default-s0"}
    assert sorted(ran) == sorted(planned)  # each run once, none left
    assert {pid for pid, _ in log} == {str(p.pid) for p in procs}


_HOLDER = r"""
import sys, time
from pathlib import Path
from studies.quality.harness import claim
held = claim(Path(sys.argv[1]), wait=False)
print("held" if held else "refused", flush=True)
time.sleep(60)
"""


def test_the_short_study_plan_waits_for_its_calibration_and_only_pulls_in_what_a_run_needs(tmp_path: Path) -> None:
    """The short study through the runner: before the calibration exists its runs are one placeholder
    per seed (which ``--only`` may select, pulling in full data of seed 0 and the calibration), after
    it the configurations it decides; a result file (not a crashed one) marks a run done."""
    import studies.quality.harness as H
    import studies.quality.study as study
    from studies.quality.__main__ import parser
    from studies.quality.configs import configs, run_id

    argv = ["--datasets", "sst2", "--seeds", "2", "--results", str(tmp_path / "r"), "--out", str(tmp_path / "o")]
    ctx = study.context(parser().parse_args([*argv, "--only", "sst2-clean-random-p30"]))
    ctx.results.mkdir(parents=True)
    jobs = study.plan(ctx)
    assert [(j.rid, j.kind, j.needs) for j in jobs] == [
        ("sst2-clean-full-full-default-s0", "sst2", ()),
        ("sst2-calibration", "cal", ("sst2-clean-full-full-default-s0",)),
        ("sst2-tbd-s0", "pending", ("sst2-calibration",)),
        ("sst2-tbd-s1", "pending", ("sst2-calibration",)),
    ]
    assert [j.rid for j in H.todo(ctx, jobs)] == [j.rid for j in jobs]
    H.write_json(ctx.results / "sst2-calibration.json", CAL)
    H.write_json(ctx.results / "sst2-clean-full-full-default-s0.json", {"pruned": 0.0})
    (ctx.results / "sst2-clean-random-p30-r0.3-s1.crashed.json").write_text(json.dumps({"invocation": 0.0}))
    jobs = study.plan(ctx)
    rids = [j.rid for j in jobs]
    runs = [run_id("sst2", c, s) for s in (0, 1) for c in configs(CAL)]  # full data of seed 0: once, first
    assert rids == ["sst2-clean-full-full-default-s0", "sst2-calibration", *runs[1:]] and len(set(rids)) == len(rids)
    # a crash of an earlier invocation does not hold its run back
    assert [j.rid for j in H.todo(ctx, jobs)] == ["sst2-clean-random-p30-r0.3-s0", "sst2-clean-random-p30-r0.3-s1"]
    assert all(j.needs == ("sst2-calibration",) for j in jobs[2:])


def test_a_run_claim_is_exclusive_and_dies_with_its_holder(tmp_path: Path) -> None:
    import signal
    import subprocess
    import sys

    from studies.quality.harness import claim

    lock = tmp_path / "claims" / "run.lock"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    holder = subprocess.Popen([sys.executable, "-c", _HOLDER, str(lock)], env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        assert claim(lock, wait=False) is None
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    mine = claim(lock, wait=False)
    assert mine is not None
    mine.close()


@pytest.mark.parametrize("augment", [False, True])
def test_the_training_loader_crops_and_flips_only_when_augmenting(tmp_path: Path, augment: bool) -> None:
    """Real shard, real loader worker: without augmentation every image arrives exactly as decoded
    (normalised); with it, the crops and flips change most of them, each image cropped and flipped as
    ``crop_and_flip`` of the seed, the epoch and its key says (the same in every run of the seed)."""
    import io

    import numpy as np
    import webdataset as wds
    from PIL import Image

    from studies.quality.data import Dataset
    from studies.quality.pipeline import MEAN, STD, crop_and_flip, train_loader

    rng = np.random.default_rng(0)
    images = {f"{i:04d}": rng.integers(0, 256, (32, 32, 3), dtype=np.uint8) for i in range(40)}
    shard = tmp_path / "train-0.tar"
    with wds.TarWriter(str(shard)) as w:
        for key, im in images.items():
            buf = io.BytesIO()
            Image.fromarray(im).save(buf, format="PNG")
            w.write({"__key__": key, "jpg": buf.getvalue(), "cls": b"3"})  # lossless bytes under the jpg field

    class Tiny(Dataset):
        name, classes, epochs, batch, workers = "cifar10", 10, 1, 16, 1

    ds = Tiny(tmp_path, tmp_path)
    ds.train = [str(shard)]
    import seta_stream as seta

    run = str(tmp_path / "run")
    pruner = seta.Pruner(run, policy="full", params={}, epochs=1, seed=0, population=seta.list_samples(ds.train))
    pruner.start_epoch(0)
    seen = {}
    for x, _y, keys, _urls, _w in train_loader(ds, run, 0, None, False, 16, augment=augment):
        for k, xi in zip(keys, x.permute(0, 2, 3, 1).numpy()):
            seen[k] = xi
    assert set(seen) == set(images)
    same = sum(np.array_equal(seen[k], (im.astype(np.float32) - MEAN) / STD) for k, im in images.items())
    pruner.close()
    if augment:
        assert same < 10  # the identity crop without a flip has probability 1/162 per image
        for k, im in images.items():
            dy, dx, flip = crop_and_flip(0, 0, k)
            pad = np.zeros((40, 40, 3), np.uint8)
            pad[4:36, 4:36] = im
            want = pad[dy : dy + 32, dx : dx + 32]
            want = want[:, ::-1] if flip else want
            assert np.allclose(seen[k], (want.astype(np.float32) - MEAN) / STD)
    else:
        assert same == len(images)


def test_the_training_loader_reorders_every_epoch_reproducibly(tmp_path: Path) -> None:
    """Real shards, a real persistent loader worker, full data for 3 epochs: every epoch delivers
    every sample once, in an order (and batches) of its own; the same seed gives the same orders,
    another seed others, and a loader started at epoch 2 (a resumed run) replays epoch 2's order."""
    import webdataset as wds

    import seta_stream as seta
    from studies.quality.data import Dataset
    from studies.quality.pipeline import train_loader

    urls = []
    for s in range(3):
        urls.append(str(tmp_path / f"train-{s}.tar"))
        with wds.TarWriter(urls[-1]) as w:
            for i in range(20):
                w.write({"__key__": f"{s}-{i:02d}", "txt": b"a b", "cls": b"1"})

    class Tiny(Dataset):
        name, classes, epochs, batch, workers = "sst2", 2, 3, 8, 1
        image = False

    ds = Tiny(tmp_path, tmp_path)
    ds.train = urls
    population = seta.list_samples(urls)

    def orders(name: str, seed: int, start: int = 0) -> list[list[list[str]]]:
        run = str(tmp_path / name)
        pruner = seta.Pruner(run, policy="full", params={}, epochs=3, seed=seed, population=population)
        loader = train_loader(ds, run, seed, None, False, 8, start_epoch=start)
        out = []
        for epoch in range(start, 3):
            pruner.start_epoch(epoch)
            out.append([list(batch[2]) for batch in loader])
        pruner.close()
        return out

    a = orders("a", 0)
    flat = [[k for b in ep for k in b] for ep in a]
    assert [sorted(ep) for ep in flat] == [sorted(f"{s}-{i:02d}" for s in range(3) for i in range(20))] * 3
    assert flat[0] != flat[1] and flat[1] != flat[2] and flat[0] != flat[2]
    assert set(a[0][0]) != set(a[1][0]) and set(a[1][0]) != set(a[2][0])  # batches of their own
    assert orders("b", 0) == a
    assert orders("c", 1)[0] != a[0]
    assert orders("d", 0, start=2) == a[2:]
