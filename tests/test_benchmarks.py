"""Every benchmark script in benchmarks/ (bench_*.py, ab_*.py) runs at a tiny size, so that a
change of the library's formats or APIs that breaks a benchmark fails here, not months later.

Each script runs as ``python -m benchmarks X ARGS`` would (``benchmarks/__main__.py``), with the
benchmarks' scratch folder (``SETA_BENCH_OUT``) and result folder (``SETA_BENCH_RESULTS``) in a
temporary folder, and with ``SETA_BENCH_IN_PROCESS=1`` (``common.measure`` runs its snippets in the
script's own interpreter: the same code, without an interpreter start per measured step). Most
scripts run in this process (``benchmarks.__main__.main``, which runs the module with ``runpy``);
those that change process-wide state (an S3 endpoint in the environment, a Ray cluster) run in a
subprocess. Each must exit cleanly and write its result file, whose fields are checked (the
machine, the commit, the command line, the baseline, the rows).

A new script fails :func:`test_every_script_has_a_smoke_run` until it is given tiny arguments in
:data:`RUNS`. Times and RSS at these sizes mean nothing; nothing here asserts on them.
"""

from __future__ import annotations

import gzip
import io
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "benchmarks"

#: script -> (arguments at a tiny size, result files it writes, how it runs: "here" or "subprocess").
#: "{data}" is a folder of two tiny CIFAR-like train-*.tar.gz shards (JPEG images).
RUNS: dict[str, tuple[list[str], list[str], str]] = {
    "bench_plan.py": (
        ["--n", "12000", "--repeat", "1", "--idle", "0", "--codecs"],
        ["plan-12000", "plan-codecs-12000"],
        "here",
    ),
    "ab_plan.py": ([".", ".", "--rounds", "1", "--n", "12000", "--idle", "0"], ["ab-plan-12000"], "here"),
    "ab_same_plans.py": ([".", ".", "--n", "3000"], [], "here"),  # a check, no result file
    "bench_compact.py": (["--n", "12000", "--parts", "3"], ["compact-12000"], "here"),
    "ab_compact.py": (
        [".", ".", "--rounds", "1", "--n", "12000", "--parts", "2", "--idle", "0"],
        ["ab-compact-12000"],
        "here",
    ),
    "bench_policies.py": (["--n", "3000", "--baseline-n", "1000"], ["policies-3000"], "here"),
    "bench_record.py": (["--batches", "4", "--batch-size", "16"], ["record"], "here"),
    "bench_route.py": (["--parts", "3"], ["route"], "here"),
    "bench_scale.py": (["--n", "12000", "--buckets", "2", "--keep"], ["scale-12000"], "here"),
    "bench_scale_plan.py": (["--n", "6000", "12000", "--repeat", "2"], ["scale-plan-6000-12000"], "here"),
    "bench_stall.py": (["--n", "12000", "--parts", "3", "--repeat", "1"], ["stall-12000"], "here"),
    "bench_ranks.py": (["--shards-per-rank", "1", "--samples", "40", "--epochs", "2"], ["ranks"], "here"),
    "bench_ray.py": (["--n", "12000", "--cpus", "1"], ["ray-12000"], "subprocess"),
    # the stage's and reader's scripts (another helper's) and the balance script (issue 34)
    "bench_stage.py": (["--data", "{data}", "--repeat", "1"], ["stage"], "here"),
    "bench_reader.py": (["--data", "{data}", "--repeat", "1"], ["reader"], "here"),
    "bench_stage_remote.py": (["--n", "12000", "--repeat", "1", "--no-earlier"], ["stage-remote-12000"], "subprocess"),
    "bench_balance.py": (
        ["--n", "12000", "--shards", "30", "--ranks", "2", "8", "--workers", "2", "--repeat", "1"],
        ["balance-12000"],
        "here",
    ),
}
#: scripts that run after another's output (bench_scale.py --keep made the run they read)
ORDER = ["bench_scale.py", "bench_scale_plan.py", "bench_ray.py"]

RESULT_FIELDS = {
    "name",
    "title",
    "command",
    "started",
    "machine",
    "commit",
    "subject",
    "uncommitted",
    "load_start",
    "load_end",
    "elapsed_s",
    "params",
    "peak_rss_mb",
    "process_rss",
    "baseline",
    "rows",
    "figures",
    "notes",
}


def scripts() -> list[str]:
    return sorted(p.name for p in BENCH.glob("*.py") if p.name.startswith(("bench_", "ab_")))


def test_every_script_has_a_smoke_run() -> None:
    missing = sorted(set(scripts()) - set(RUNS))
    assert missing == [], f"benchmark scripts without tiny arguments in tests/test_benchmarks.py RUNS: {missing}"


@pytest.fixture(scope="module")
def bench_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The scratch and result folders shared by the module's runs (bench_scale_plan.py reads the
    run bench_scale.py kept), and the tiny CIFAR-like data folder."""
    base = tmp_path_factory.mktemp("bench")
    data = base / "data"
    data.mkdir()
    _cifar_like(data)
    return {"out": str(base / "out"), "results": str(base / "results"), "data": str(data)}


def _cifar_like(folder: Path, shards: int = 2, per_shard: int = 12) -> None:
    """train-NNNNNN.tar.gz shards of tiny JPEG images with a class label, as CIFAR-10's are."""
    from PIL import Image

    for s in range(shards):
        raw = io.BytesIO()
        with tarfile.open(fileobj=raw, mode="w") as tar:
            for i in range(per_shard):
                img = io.BytesIO()
                Image.new("RGB", (8, 8), (i * 20 % 256, s * 60, 90)).save(img, format="JPEG")
                for ext, payload in (("jpg", img.getvalue()), ("cls", str(i % 10).encode())):
                    info = tarfile.TarInfo(f"s{s}-{i:05d}.{ext}")
                    info.size = len(payload)
                    tar.addfile(info, io.BytesIO(payload))
        (folder / f"train-{s:06d}.tar.gz").write_bytes(gzip.compress(raw.getvalue()))


def _argv(script: str, env: dict[str, str]) -> list[str]:
    return [a.format(**env) for a in RUNS[script][0]]


def _run_here(script: str, argv: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    from benchmarks.__main__ import main

    monkeypatch.setattr(sys, "argv", list(sys.argv))  # restored after the test (the dispatch sets it)
    monkeypatch.chdir(ROOT)
    try:
        assert main([script.removesuffix(".py"), *argv]) == 0
    except SystemExit as exc:  # argparse errors, or a script's own exit
        assert exc.code in (0, None), f"{script} exited with {exc.code}"


def _run_subprocess(script: str, argv: list[str]) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks", script.removesuffix(".py"), *argv],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=dict(os.environ),
        timeout=240,
    )
    assert proc.returncode == 0, f"{script} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"


#: over ~20 s at any size here (interpreters and a Ray cluster started; bench_stage_remote.py writes
#: 10 shards of 5,000 samples whatever --n)
SLOW = {"bench_ray.py", "bench_ranks.py", "bench_stage_remote.py"}


@pytest.mark.parametrize(
    "script",
    [
        pytest.param(s, marks=[pytest.mark.slow] if s in SLOW else [])
        for s in sorted(RUNS, key=lambda s: (ORDER.index(s) if s in ORDER else -1, s))
    ],
)
def test_script_runs_at_a_tiny_size(script: str, bench_env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    if not (BENCH / script).exists():
        pytest.skip(f"{script} is not in this checkout")
    if script == "bench_ray.py":
        pytest.importorskip("ray")
    if script == "bench_stage_remote.py":
        pytest.importorskip("moto")
    monkeypatch.setenv("SETA_BENCH_OUT", bench_env["out"])
    monkeypatch.setenv("SETA_BENCH_RESULTS", bench_env["results"])
    monkeypatch.setenv("SETA_BENCH_IN_PROCESS", "1")
    # common.py reads SETA_BENCH_OUT when imported: a fresh import in this process per script
    for name in [m for m in sys.modules if m.startswith("benchmarks.") and m != "benchmarks.__main__"]:
        monkeypatch.delitem(sys.modules, name)
    argv = _argv(script, bench_env)
    if RUNS[script][2] == "subprocess":
        _run_subprocess(script, argv)
    else:
        _run_here(script, argv, monkeypatch)
    for name in RUNS[script][1]:
        path = Path(bench_env["results"]) / f"{name}.json"
        assert path.exists(), f"{script} wrote no result file {path.name}"
        res = json.loads(path.read_text())
        assert set(res) == RESULT_FIELDS
        assert res["name"] == name
        assert res["command"].startswith(f"python -m benchmarks {script.removesuffix('.py')} ")
        assert res["commit"] and len(res["commit"]) == 40
        assert {"cpu", "cores", "ram_gb", "python", "numpy", "pyarrow"} <= set(res["machine"])
        assert len(res["load_start"]["loadavg"]) == 3
        assert res["baseline"] and res["baseline"].get("what")
        assert res["rows"] and all(isinstance(r, dict) and r for r in res["rows"])
        if script == "bench_stage_remote.py":  # --no-earlier: the worker without and with the stage, 10 shards
            assert [r["worker"] for r in res["rows"]] == ["no stage", "stage"]
            assert [r["samples out"] for r in res["rows"]][0] == 50_000
            # summary.json and shards.arrow once, one range of stage.arrow per planned shard (3 of 12,000 samples)
            assert res["rows"][0]["plan GETs"] == 0 and res["rows"][1]["plan GETs"] == 2 + 3


def test_report_renders_and_checks_result_blocks(tmp_path: Path) -> None:
    """report.py replaces a result block with its file's rendering, keeps other text (another
    section's markers included) as it is, and --check fails on a block that differs."""
    from benchmarks import report

    results = tmp_path / "results"
    results.mkdir()
    res = {
        "name": "demo",
        "title": "Demo",
        "command": "python benchmarks/bench_demo.py --n 5",
        "started": "2026-01-02T03:04:05+0000",
        "machine": {"cpu": "CPU X", "cores": 2, "ram_gb": 23.5, "python": "3.11.7", "numpy": "2.4", "pyarrow": "26"},
        "commit": "a" * 40,
        "uncommitted": [],
        "load_start": {"loadavg": [1.5, 1.0, 0.5]},
        "load_end": {"loadavg": [2.25, 1.0, 0.5]},
        "baseline": {"what": "the floor", "wall_s": 0.5},
        "rows": [{"what": "ours", "wall_s": 1.25, "peak_rss_mb": 1234.0}, {"what": "floor", "wall_s": 0.5}],
        "peak_rss_mb": 1234.0,
        "notes": ["Ours is 2.50x the floor."],
    }
    (results / "demo.json").write_text(json.dumps(res))
    doc = tmp_path / "benchmarks.md"
    text = (
        "# B\n\nprose\n\n<!-- result:demo:begin -->\nold table\n<!-- result:demo:end -->\n\n"
        "<!-- balance:begin -->\nkept as it is\n<!-- balance:end -->\n"
    )
    doc.write_text(text)
    assert report.main(["--doc", str(doc), "--results", str(results), "--check"]) == 1
    assert report.main(["--doc", str(doc), "--results", str(results)]) == 0
    new = doc.read_text()
    body = new.split("<!-- result:demo:begin -->\n")[1].split("<!-- result:demo:end -->")[0]
    assert body.splitlines() == [
        "<!-- generated by benchmarks/report.py from docs/benchmarks/demo.json: do not edit -->",
        "",
        "**Demo**",
        "",
        "`python benchmarks/bench_demo.py --n 5` (commit aaaaaaaaaa; CPU X, 2 cores, 23.5 GB RAM; python 3.11.7, "
        "numpy 2.4, pyarrow 26; load average 1.50 at the start, 2.25 at the end, on 2 cores; 2026-01-02)",
        "",
        "| what | wall s | peak rss mb |",
        "| --- | --- | --- |",
        "| ours | 1.25 | 1,234 |",
        "| floor | 0.5 | - |",
        "",
        "Baseline measured in the same run: the floor (wall s 0.5).",
        "Peak RSS of the measured code: 1,234 MB.",
        "",
        "Ours is 2.50x the floor.",
    ]
    assert new.startswith("# B\n\nprose\n\n") and new.endswith(
        "<!-- balance:begin -->\nkept as it is\n<!-- balance:end -->\n"
    )
    assert report.main(["--doc", str(doc), "--results", str(results), "--check"]) == 0
    (results / "demo.json").unlink()
    assert report.main(["--doc", str(doc), "--results", str(results)]) == 2  # a block without its file


def test_report_renders_the_targets_table(tmp_path: Path) -> None:
    from benchmarks import report

    results = tmp_path / "results"
    results.mkdir()
    record = {"name": "record", "commit": "b" * 40, "load_start": {"loadavg": [3.0, 2.0, 1.0]}}
    (results / "record.json").write_text(json.dumps({**record, "figures": {"overhead_us_per_sample": 0.625}}))
    doc = tmp_path / "benchmarks.md"
    doc.write_text("x\n<!-- targets:begin -->\n<!-- targets:end -->\ny\n")
    assert report.main(["--doc", str(doc), "--results", str(results)]) == 0
    rows = [line for line in doc.read_text().splitlines() if line.startswith("| ")]
    assert rows[0] == "| target | issue | bar | measured | status | result file (commit, load at the start) |"
    assert len(rows) == 2 + len(report.TARGETS)  # the header, the separator, a row per target
    met = "| recording: overhead per sample | #2 | <= 1.00 us | 0.625 us | met | record.json (bbbbbbbbbb, load 3.00) |"
    missing = "| plan one SeTa epoch at 15M: median time of the whole plan (plan_epoch, Pruner.start_epoch) | #35 "
    missing += "| <= 1.20 s "
    missing += "| - | no result | plan-15000000.json "
    missing += "missing |"
    assert met in rows and missing in rows
    (results / "record.json").write_text(json.dumps({**record, "figures": {"overhead_us_per_sample": 1.5}}))
    assert report.main(["--doc", str(doc), "--results", str(results), "--check"]) == 1
    report.main(["--doc", str(doc), "--results", str(results)])
    assert "| 1.50 us | not met |" in doc.read_text()


def test_docs_benchmarks_blocks_are_what_their_result_files_give() -> None:
    """docs/benchmarks.md's generated blocks are up to date with docs/benchmarks/*.json (after
    changing a result file, run python -m benchmarks report)."""
    from benchmarks import report

    assert report.main(["--check"]) == 0


def test_ab_same_plans_names_every_case_and_fails_where_the_trees_plan_otherwise(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """The same tree twice plans the same in every case, the noise rule's at version 1 (exit 0);
    where tree B is taken for one from before the rule's versions, its noise=True plans version 2,
    and the check names the rows and summary keys that differ and exits 1."""
    monkeypatch.setenv("SETA_BENCH_OUT", str(tmp_path))
    for name in [m for m in sys.modules if m.startswith("benchmarks.") and m != "benchmarks.__main__"]:
        monkeypatch.delitem(sys.modules, name)
    from benchmarks import ab_same_plans

    assert ab_same_plans.main([str(ROOT), str(ROOT), "--n", "2000"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) == len(ab_same_plans.CASES) + 1
    assert [line for line in out[:-1] if ": rows identical, " not in line or not line.endswith("differing: none")] == []
    assert out[4].startswith("seta dict(r=0.0, k=10, alpha=0.5, noise=True, noise_rule=1): rows identical")
    assert out[-1] == "6 of 6 cases plan the same in both trees"
    monkeypatch.setattr(ab_same_plans, "CASES", (ab_same_plans.CASES[4],))
    answers = iter([True, False])  # tree A has versions, tree B (the same tree) is taken for an older one
    monkeypatch.setattr(ab_same_plans, "has_versions", lambda tree: next(answers))
    assert ab_same_plans.main([str(ROOT), str(ROOT), "--n", "2000"]) == 1
    line, last = capsys.readouterr().out.splitlines()
    assert line.startswith(
        "seta dict(r=0.0, k=10, alpha=0.5, noise=True, noise_rule=1) (B: dict(r=0.0, k=10, alpha=0.5, noise=True)): "
    )
    assert line.endswith("summary keys differing: noise_fit_threshold, noise_floor, noise_threshold, params")
    assert last == "0 of 1 cases plan the same in both trees"
