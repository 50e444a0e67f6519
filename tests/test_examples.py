"""The examples a user copies (examples/train_pairs.py, examples/train_words.py), end to end on shards
written by the generators in tools/, through a real DataLoader worker: every epoch trains exactly the
plan's kept samples, once each, and every step divides its loss by the nominal batch size (the
small-final-batch remedy), the short last batch of a full epoch included. And each is a program to copy:
it imports the standard library, numpy, torch, webdataset and seta_stream's public API, nothing of this
repository, and runs from any folder.

The data sets hold 260 training samples and the loops batch 32 at a time, so a full-data epoch ends on a
batch of 260 % 32 = 4 samples. ``seta.weighted_mean`` and ``seta.Pruner.record`` are wrapped (the real
functions still run) to record each step's batch length and divisor and the samples each epoch delivered.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("PIL")

import seta_stream as seta  # noqa: E402
from seta_stream.ids import shard_name  # noqa: E402
from tools import make_pair_shards as mps  # noqa: E402
from tools import make_word_shards as mws  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = {"pairs": ROOT / "examples" / "train_pairs.py", "words": ROOT / "examples" / "train_words.py"}
N, B = 260, 32  # a full-data epoch ends on a batch of N % B = 4


def _load(name: str, path: Path):  # noqa: ANN202 - a script loaded as a module
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # DataLoader workers (fork) find the collate function by module
    spec.loader.exec_module(mod)
    return mod


tp = _load("example_train_pairs", EXAMPLES["pairs"])
tw = _load("example_train_words", EXAMPLES["words"])


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
def seen(monkeypatch: pytest.MonkeyPatch) -> dict[str, list]:
    """``steps``: (batch length, divisor) of every ``seta.weighted_mean`` call (the divisor is ``batch_size``,
    or the batch's own length where the call leaves it out); ``delivered``: per epoch, the (shard, key) of
    every sample the loop recorded."""
    out: dict[str, list] = {"steps": [], "delivered": []}
    weighted_mean, record = seta.weighted_mean, seta.Pruner.record

    def spy_mean(losses, weights, batch_size=None):  # noqa: ANN001, ANN202
        out["steps"].append((len(losses), batch_size if batch_size is not None else len(losses)))
        return weighted_mean(losses, weights, batch_size=batch_size)

    def spy_record(self, keys, urls, losses, trained=None):  # noqa: ANN001, ANN202
        while len(out["delivered"]) <= self.epoch:
            out["delivered"].append([])
        out["delivered"][self.epoch] += [(shard_name(u), k) for u, k in zip(urls, keys)]
        return record(self, keys, urls, losses, trained)

    monkeypatch.setattr(seta, "weighted_mean", spy_mean)
    monkeypatch.setattr(seta.Pruner, "record", spy_record)
    return out


def _argv(data: Path, run_dir: Path, epochs: int, policy: str, params: dict) -> list[str]:
    return ["--data", str(data), "--run-dir", str(run_dir), "--epochs", str(epochs), "--batch-size", str(B),
            "--workers", "1", "--policy", policy, "--params", json.dumps(params)]  # fmt: skip


def _check(run_dir: Path, rows: list[dict], seen: dict[str, list]) -> list[int]:
    """Every epoch delivered exactly its plan's kept samples, once each, in steps of B whose losses were
    all divided by B; returns the kept counts."""
    kept_counts, expected = [], []
    assert len(seen["delivered"]) == len(rows)
    for e, (row, got) in enumerate(zip(rows, seen["delivered"])):
        plan = seta.load_plan(run_dir, e, columns=["shard", "key", "keep"]).to_pylist()
        assert len(plan) == N  # the population: every sample of the three shards
        kept = {(r["shard"], r["key"]) for r in plan if r["keep"]}
        assert len(got) == len(set(got)) and set(got) == kept  # through a real DataLoader worker
        assert row["trained"] == row["kept"] == len(kept)
        kept_counts.append(len(kept))
        expected += [(B, B)] * (len(kept) // B) + ([(len(kept) % B, B)] if len(kept) % B else [])
    assert seen["steps"] == expected
    return kept_counts


def test_the_pairs_example_trains_the_kept_pairs_with_the_remedy(
    pairs: Path, tmp_path: Path, seen: dict, capsys: pytest.CaptureFixture
) -> None:
    torch.set_num_threads(1)
    rows = tp.main(_argv(pairs, tmp_path / "rule", 2, "random", {"r": 0.19, "noise": True}))
    assert _check(tmp_path / "rule", rows, seen) == [210, 210]  # random keeps floor(0.81 * 260); the rule warms up
    assert all(0.0 <= r["r1"] <= 1.0 and math.isfinite(r["loss"]) for r in rows)
    assert "epoch 1: trained 210 of 260 pairs" in capsys.readouterr().out
    seen["steps"].clear(), seen["delivered"].clear()
    full = tp.main(_argv(pairs, tmp_path / "full", 1, "full", {}))
    assert _check(tmp_path / "full", full, seen) == [N]
    assert seen["steps"][-1] == (N % B, B)  # the short last batch steps in proportion to its 4 pairs


def test_the_words_example_trains_the_kept_samples_with_the_remedy(words: Path, tmp_path: Path, seen: dict) -> None:
    torch.set_num_threads(1)
    rows = tw.main(_argv(words, tmp_path / "seta", 2, "seta", {"r": 0.1, "k": 3}))
    assert min(_check(tmp_path / "seta", rows, seen)) < N  # SeTa pruned some epoch
    assert all(0.0 <= r["acc"] <= 1.0 for r in rows)
    # each loss landed on its sample: epoch 1's plan holds a loss for exactly the samples epoch 0 trained
    plan1 = seta.load_plan(tmp_path / "seta", 1, columns=["shard", "key", "loss"]).to_pylist()
    assert {(r["shard"], r["key"]) for r in plan1 if not math.isnan(r["loss"])} == set(seen["delivered"][0])


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_an_example_imports_nothing_of_the_repository_and_no_private_name(name: str) -> None:
    tree = ast.parse(EXAMPLES[name].read_text())
    allowed = set(sys.stdlib_module_names) | {"numpy", "torch", "webdataset", "seta_stream"}
    modules = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0
            modules.add(node.module)
            assert not any(a.name.startswith("_") for a in node.names)
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "seta":
            assert not node.attr.startswith("_"), f"seta.{node.attr}"
    assert {m.split(".")[0] for m in modules} <= allowed, modules
    assert not any(part.startswith("_") for m in modules if m.startswith("seta_stream") for part in m.split("."))


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_an_example_runs_as_a_script_from_any_folder(name: str, tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, str(EXAMPLES[name]), "--help"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "--policy" in proc.stdout and "--params" in proc.stdout


def test_pair_losses_are_the_rows_and_columns_cross_entropies() -> None:
    logits = torch.tensor([[2.0, 0.0, 1.0], [0.5, 1.0, 0.0], [0.0, 3.0, 0.0]])

    def ce(v: list[float], i: int) -> float:
        return -v[i] + math.log(sum(math.exp(x) for x in v))

    rows, cols = logits.tolist(), logits.t().tolist()
    assert tp.pair_losses(logits).tolist() == pytest.approx([0.5 * (ce(rows[i], i) + ce(cols[i], i)) for i in range(3)])
    target = torch.arange(3)
    clip = 0.5 * (
        torch.nn.functional.cross_entropy(logits, target) + torch.nn.functional.cross_entropy(logits.t(), target)
    )
    assert float(tp.pair_losses(logits).mean()) == pytest.approx(float(clip), abs=1e-6)  # the batch mean: CLIP's
