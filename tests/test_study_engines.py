"""The studies' training engines end to end (studies/engines/pairs.py, studies/engines/words.py) on shards
written by the generators in tools/, through real DataLoader workers: exactly the plan's kept samples per
epoch, the small-final-batch remedy in every step, one run directory per configuration, printed commands
that run from any folder, and the demo's settings (tools/demo.sh runs the pairs engine).

The data sets hold 260 training samples and the loops batch 32 at a time, so every full-data epoch
ends on a batch of 260 % 32 = 4 samples, under the 8 the library warns about (``small_final_batch``).
``seta.weighted_mean`` is wrapped (the real function still computes every loss) to record, for each
step, the batch's length and the divisor its loss used: a loop that averages a short last batch over
its own length (``batch_size`` left out, or ``losses.mean()``, which never calls it) fails.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("PIL")

import seta_stream as seta  # noqa: E402
from seta_stream.policies.safeguards import SMALL_FINAL_BATCH  # noqa: E402
from studies.engines import common  # noqa: E402
from studies.engines import pairs as tp  # noqa: E402
from studies.engines import words as tw  # noqa: E402
from tools import make_pair_shards as mps  # noqa: E402
from tools import make_word_shards as mws  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
N, B = 260, 32  # every full-data epoch ends on a batch of N % B = 4


@pytest.fixture(scope="module")
def pairs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("pairs") / "data"
    mps.main(["--out", str(out), "--train", str(N), "--test", "40", "--shard-size", "100", "--noise", "0.2",
              "--seed", "1", "--workers", "1"])  # fmt: skip
    return out


@pytest.fixture(scope="module")
def words(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("words") / "data"
    mws.main(["--out", str(out), "--train", str(N), "--test", "40", "--shard-size", "100", "--vocab", "10",
              "--seed", "1", "--workers", "1"])  # fmt: skip
    return out


@pytest.fixture
def steps(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int | None]]:
    """(batch length, divisor) of every ``seta.weighted_mean`` call; the divisor is ``batch_size``,
    or the batch's own length where the call leaves it out."""
    calls: list[tuple[int, int | None]] = []
    real = seta.weighted_mean

    def spy(losses, weights, batch_size=None):
        calls.append((len(losses), batch_size if batch_size is not None else len(losses)))
        return real(losses, weights, batch_size=batch_size)

    monkeypatch.setattr(seta, "weighted_mean", spy)
    return calls


def _keys(run_dir: str, epoch: int, kept_only: bool = True) -> set[tuple[str, str]]:
    plan = seta.load_plan(run_dir, epoch, columns=["shard", "key", "keep"]).to_pylist()
    assert len(plan) == N  # the population: every sample of the three shards
    return {(r["shard"], r["key"]) for r in plan if r["keep"] or not kept_only}


def _check_run(res: dict, epochs: int) -> list[int]:
    """Exactly the plan's kept samples in every epoch, once each; returns the kept counts."""
    kept_counts = []
    assert len(res["rows"]) == len(res["delivered"]) == epochs
    for e, (row, got) in enumerate(zip(res["rows"], res["delivered"])):
        kept = _keys(res["run_dir"], e)
        assert len(got) == len(set(got))  # no sample twice in an epoch
        assert set(got) == kept  # exactly the kept samples, through a real DataLoader worker
        assert row["trained"] == row["kept"] == len(kept)
        assert (row["steps"], row["last_batch"]) == (math.ceil(len(kept) / B), len(kept) % B or B)
        assert seta.load_summary(res["run_dir"], e)["batch_size"] == B  # Pruner(batch_size=B) reached the plan
        kept_counts.append(len(kept))
    assert res["pruned"] == pytest.approx(1 - sum(kept_counts) / (N * epochs))
    return kept_counts


def _expected_steps(results: list[dict]) -> list[tuple[int, int]]:
    """One loader batching each epoch's kept samples in order, every loss divided by B."""
    out = []
    for res in results:
        for row in res["rows"]:
            out += [(B, B)] * (row["kept"] // B) + ([(row["kept"] % B, B)] if row["kept"] % B else [])
    return out


def _commands(stdout: str) -> dict[str, list[str]]:
    """The follow-up commands main printed: {"inspect": argv, "suspects": argv}."""
    return {
        line.split(":", 1)[0].strip(): shlex.split(line.split(":", 1)[1])
        for line in stdout.splitlines()
        if line.strip().startswith(("inspect:", "suspects:"))
    }


def _argv(data: Path, run_dir: Path, epochs: int, *extra: str) -> list[str]:
    return ["--data", str(data), "--run-dir", str(run_dir), "--epochs", str(epochs), "--batch-size", str(B),
            "--workers", "1", "--threads", "1", "--quiet", *extra]  # fmt: skip


def test_pairs_engine_trains_the_kept_pairs_with_the_remedy_and_prints_commands_that_run_anywhere(
    pairs: Path, tmp_path: Path, steps: list, capsys: pytest.CaptureFixture
) -> None:
    runs = tmp_path / "runs"
    results = tp.main(_argv(pairs, runs, 2, "--policy", "random", "--params", '{"r": 0.19}', "--noise"), keep_keys=True)
    out = capsys.readouterr().out
    assert [r["run_dir"] for r in results] == [str(runs / "random-r0.19-noise"), str(runs / "full")]
    rule, full = (_check_run(r, 2) for r in results)
    assert full == [N, N]  # every full-data epoch ends on a batch of 4 ...
    assert [r["last_batch"] for r in results[1]["rows"]] == [4, 4]
    assert 0 < N % B < SMALL_FINAL_BATCH
    assert rule == [210, 210]  # random keeps floor(0.81 * 260); the rule is in its warm-up (2 epochs)
    assert steps == _expected_steps(results)  # ... and its loss, like every step's, was divided by B
    noise = {(r["shard"], r["key"]) for r in pq.read_table(pairs / "noise.parquet").to_pylist()}
    assert len(noise) == 52
    for res in results:
        for row, got in zip(res["rows"], res["delivered"]):
            assert row["mismatched_trained"] == len(set(got) & noise)
    for name in ("random-r0.19-noise", "full"):  # a result file beside each run directory
        saved = json.loads((runs / f"{name}.json").read_text())
        assert saved["run_dir"] == str(runs / name) and "delivered" not in saved
    assert f"random-r0.19-noise trained {100 * sum(rule) / (2 * N):.1f}% of the pairs full data trained" in out

    # the printed commands run from another folder and write where they say
    cmds = _commands(out)
    assert set(cmds) == {"inspect", "suspects"}
    exe = str(Path(sys.executable).parent / "seta-stream")
    plot, table = runs / "random-r0.19-noise.png", runs / "random-r0.19-noise-suspects.parquet"
    assert cmds["inspect"] == [exe, "inspect", str(runs / "random-r0.19-noise"), "--plot", str(plot)]
    assert cmds["suspects"] == [exe, "suspects", str(runs / "random-r0.19-noise"), "--out", str(table),
                                "--truth", str(pairs / "noise.parquet")]  # fmt: skip
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    procs = [subprocess.Popen(argv, cwd=elsewhere, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for argv in cmds.values()]  # fmt: skip
    for proc in procs:
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
    assert plot.stat().st_size > 0
    assert set(zip(*pq.read_table(table, columns=["shard", "key"]).to_pydict().values())) <= _keys(
        results[0]["run_dir"], 1, kept_only=False
    )

    # another configuration gets its own run directory: the first one stays as it was
    before = (runs / "random-r0.19-noise" / "plans").stat().st_mtime_ns, sorted(os.listdir(runs / "random-r0.19-noise"))
    steps.clear()
    (log1p,) = tp.main(_argv(pairs, runs, 1, "--policy", "random", "--params", '{"r": 0.19}', "--noise",
                             "--noise-scale", "log1p", "--no-compare"), keep_keys=True)  # fmt: skip
    assert log1p["run_dir"] == str(runs / "random-r0.19-noise-log1p")
    assert log1p["params"] == {"r": 0.19, "noise": True, "noise_scale": "log1p"}
    assert _check_run(log1p, 1) == [210]
    assert steps == _expected_steps([log1p])
    after = (runs / "random-r0.19-noise" / "plans").stat().st_mtime_ns, sorted(os.listdir(runs / "random-r0.19-noise"))
    assert after == before
    assert sorted(p.name for p in runs.iterdir() if p.is_dir()) == ["full", "random-r0.19-noise",
                                                                     "random-r0.19-noise-log1p"]  # fmt: skip


def test_words_engine_trains_the_kept_samples_with_the_remedy(
    words: Path, tmp_path: Path, steps: list, capsys: pytest.CaptureFixture
) -> None:
    runs = tmp_path / "runs"
    results = tw.main(_argv(words, runs, 2, "--policy", "seta", "--params", '{"r": 0.1, "k": 3}'), keep_keys=True)
    out = capsys.readouterr().out
    assert [r["run_dir"] for r in results] == [str(runs / "seta-k3-r0.1"), str(runs / "full")]
    seta_kept, full = (_check_run(r, 2) for r in results)
    assert full == [N, N]
    assert [r["last_batch"] for r in results[1]["rows"]] == [4, 4]
    assert min(seta_kept) < N  # SeTa pruned some epoch
    assert steps == _expected_steps(results)
    # the loss of every sample landed on its own key: epoch 1's plan holds a loss for exactly the
    # samples trained in epoch 0
    plan1 = seta.load_plan(results[0]["run_dir"], 1, columns=["shard", "key", "loss"]).to_pylist()
    assert {(r["shard"], r["key"]) for r in plan1 if not math.isnan(r["loss"])} == set(results[0]["delivered"][0])
    cmds = _commands(out)
    exe = str(Path(sys.executable).parent / "seta-stream")
    assert cmds == {"inspect": [exe, "inspect", str(runs / "seta-k3-r0.1"), "--plot", str(runs / "seta-k3-r0.1.png")]}
    assert json.loads((runs / "full.json").read_text())["rows"] == results[1]["rows"]


@pytest.mark.parametrize(
    "policy,params",
    [("infobatch", dict(r=0.5, noise=True, noise_warmup=1, noise_recheck=0.5))],  # weights 2 and 0 (re-checks)
)
def test_pairs_engine_delivers_exactly_the_plans_kept_pairs(
    pairs: Path, tmp_path: Path, steps: list, policy: str, params: dict
) -> None:
    torch.set_num_threads(1)
    run_dir = str(tmp_path / policy)
    args = argparse.Namespace(data=str(pairs), epochs=3, batch_size=B, lr=2e-3, workers=1, seed=0, quiet=True)
    res = tp.run(args, policy, params, run_dir, keep_keys=True, log=lambda s: None)
    noise = {(r["shard"], r["key"]) for r in pq.read_table(pairs / "noise.parquet").to_pylist()}
    kept_counts = _check_run(res, 3)
    assert min(kept_counts) < N
    assert steps == _expected_steps([res])
    for e in range(3):
        plan = seta.load_plan(run_dir, e, columns=["shard", "key", "keep", "weight"]).to_pylist()
        kept = {(r["shard"], r["key"]) for r in plan if r["keep"]}
        row = res["rows"][e]
        learnt = {(r["shard"], r["key"]) for r in plan if r["keep"] and r["weight"] > 0}  # re-checks: weight 0
        assert (row["learnt"], row["mismatched_learnt"]) == (len(learnt), len(learnt & noise))
        assert row["noise_suspected"] == (seta.load_summary(run_dir, e).get("noise_suspected"))
        assert row["mismatched_trained"] == len(kept & noise)
        assert row["mismatched_share"] == pytest.approx(len(kept & noise) / len(kept))
    assert res["mismatched_in_data"] == pytest.approx(52 / N)
    for k in ("i2t_r1", "i2t_r5", "t2i_r1", "t2i_r5"):
        assert 0.0 <= res[k] <= 1.0
    plan1 = seta.load_plan(run_dir, 1, columns=["shard", "key", "loss"]).to_pylist()
    assert {(r["shard"], r["key"]) for r in plan1 if not math.isnan(r["loss"])} == set(res["delivered"][0])


def test_run_names_encode_the_policy_and_every_parameter() -> None:
    run_name = common.run_name
    assert run_name("full", {}) == "full"
    assert run_name("full", {"noise": True}) == "full-noise"
    assert run_name("random", {"noise": True, "r": 0.19}) == "random-r0.19-noise"
    assert run_name("random", {"noise_scale": "log1p", "r": 0.19, "noise": True}) == "random-r0.19-noise-log1p"
    assert run_name("seta", {"r": 0.1, "k": 5, "alpha": 0.6, "delta": 0.875}) == "seta-alpha0.6-delta0.875-k5-r0.1"
    assert run_name("infobatch", {"r": 0.5, "noise": False, "x": "a/b"}) == "infobatch-r0.5-a_b-no-noise"


@pytest.mark.parametrize("mod", [tp, tw], ids=["pairs", "words"])
def test_noise_options_add_the_rule_to_the_policy_parameters(mod) -> None:
    p, policy_params = mod.parser(), common.policy_params
    assert policy_params(p.parse_args(["--policy", "full", "--noise"])) == {"noise": True}
    assert policy_params(p.parse_args(["--policy", "infobatch", "--r", "0.6", "--noise"])) == {"r": 0.6, "noise": True}
    assert policy_params(p.parse_args(["--policy", "seta", "--params", '{"r": 0.2}', "--noise"])) == {
        "r": 0.2,
        "noise": True,
    }
    assert policy_params(p.parse_args(["--policy", "random", "--noise", "--noise-scale", "log1p"])) == {
        "r": 0.1,
        "noise": True,
        "noise_scale": "log1p",
    }
    assert policy_params(p.parse_args(["--policy", "full"])) == {}
    assert (p.parse_args([]).batch_size, p.parse_args([]).data) == (
        (128, "demo-out/pairs") if mod is tp else (64, "demo-out/data")
    )


def test_pair_losses_are_the_rows_and_columns_cross_entropies() -> None:
    logits = torch.tensor([[2.0, 0.0, 1.0], [0.5, 1.0, 0.0], [0.0, 3.0, 0.0]])
    got = tp.pair_losses(logits)

    def ce(v: list[float], i: int) -> float:
        return -v[i] + math.log(sum(math.exp(x) for x in v))

    rows = logits.tolist()
    cols = logits.t().tolist()
    expected = [0.5 * (ce(rows[i], i) + ce(cols[i], i)) for i in range(3)]
    assert got.tolist() == pytest.approx(expected, abs=1e-6)
    target = torch.arange(3)
    clip = 0.5 * (
        torch.nn.functional.cross_entropy(logits, target) + torch.nn.functional.cross_entropy(logits.t(), target)
    )
    assert float(got.mean()) == pytest.approx(float(clip), abs=1e-6)  # the batch mean is CLIP's loss
    w = torch.tensor([1.0, 2.0, 1.0])
    assert float(seta.weighted_mean(got, w)) == pytest.approx(sum(a * b for a, b in zip(expected, w.tolist())) / 3)


def test_recall_at_counts_rank_of_the_own_column() -> None:
    sim = torch.tensor([[0.9, 0.1, 0.0], [0.8, 0.7, 0.1], [0.5, 0.6, 0.2]])
    # ranks of the diagonal: row 0 first, row 1 second, row 2 third
    assert tp.recall_at(sim, (1, 2, 3)) == {1: pytest.approx(1 / 3), 2: pytest.approx(2 / 3), 3: 1.0}


def test_tokens_are_hashed_words_and_word_pairs() -> None:
    a = tp.tokens("A red circle, top left")
    assert len(a) == 5 + 4 and all(0 <= t < tp.BUCKETS for t in a)
    assert tp.tokens("a RED circle top-left") == a  # case and punctuation do not matter
    assert tp.tokens("") == [0]


def test_the_demo_trains_the_noise_studys_calibrated_setting_into_the_run_directory_it_reads() -> None:
    """tools/demo.sh: its settings are the study's calibration for the rule + random at 30% pruned, and
    the run directory it inspects afterwards is the one the pairs engine trains them into."""
    script = (ROOT / "tools" / "demo.sh").read_text()
    lines = {line.split("=", 1)[0]: line.split("=", 1)[1] for line in script.splitlines() if "=" in line}
    settings = shlex.split(lines["SETTINGS"].strip("()"))
    args = tp.parser().parse_args(settings)
    assert common.run_name(args.policy, common.policy_params(args)) == lines["NAME"] == "random-r0.19-noise"
    assert "$PY -m studies.engines.pairs " in script
    cal = json.loads((ROOT / "docs/quality-runs/noise-study-2core/pairs-n20-E10-cal-rule-random.json").read_text())
    assert (args.policy, cal["levels"]["30"]["params"]) == ("random", common.policy_params(args))
    # the study's data and schedule, which that calibration replayed
    import studies.quality.noise as ns

    data, train = ns.DATA, ns.TRAIN
    assert (
        f"--train {data['train']} --test {data['test']} --shard-size {data['shard_size']} --noise 0.2 "
        f"--seed {data['seed']}" in script
    )
    assert data["size"] == 32 and "--size" not in script  # make_pair_shards.py's default
    assert f"--epochs {train['epochs']} --batch-size {train['batch_size']}" in script
    assert (cal["source"], data["train"], train["epochs"]) == ("pairs-n20-E10-full-full-default-s0", 10000, 10)
