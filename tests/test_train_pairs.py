"""examples/train_pairs.py end to end: contrastive training through the stage, exact kept pairs per epoch."""

from __future__ import annotations

import argparse
import importlib.util
import math
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

torch = pytest.importorskip("torch")

import seta_stream as seta  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def _load(name: str, rel: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / rel)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # DataLoader workers (fork) find the collate function by module
    spec.loader.exec_module(mod)
    return mod


tp = _load("train_pairs", "examples/train_pairs.py")
mps = _load("make_pair_shards", "tools/make_pair_shards.py")


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("pairs") / "data"
    mps.main(["--out", str(out), "--train", "300", "--test", "40", "--shard-size", "100", "--noise", "0.2",
              "--seed", "1", "--workers", "1"])  # fmt: skip
    return out


def _args(data: Path, **kw) -> argparse.Namespace:
    base = dict(data=str(data), epochs=3, batch_size=32, lr=2e-3, workers=1, seed=0, quiet=True)
    return argparse.Namespace(**{**base, **kw})


@pytest.mark.parametrize(
    "policy,params",
    [
        ("seta", dict(r=0.2, k=3, alpha=0.5, delta=0.875)),
        ("infobatch", dict(r=0.5)),
        ("infobatch", dict(r=0.5, noise=True, noise_warmup=1, noise_recheck=0.5)),
    ],
)
def test_delivered_pairs_are_exactly_the_plans_kept_pairs(
    data: Path, tmp_path: Path, policy: str, params: dict
) -> None:
    torch.set_num_threads(1)
    run_dir = str(tmp_path / policy)
    res = tp.run(_args(data), policy, params, run_dir, keep_keys=True, log=lambda s: None)
    noise = {(r["shard"], r["key"]) for r in pq.read_table(data / "noise.parquet").to_pylist()}
    assert len(noise) == 60
    pruned_somewhere = False
    for e, got in enumerate(res["delivered"]):
        plan = seta.load_plan(run_dir, e, columns=["shard", "key", "keep", "weight"]).to_pylist()
        assert len(plan) == 300  # the population: every pair of the three shards
        kept = {(r["shard"], r["key"]) for r in plan if r["keep"]}
        assert len(got) == len(set(got))  # no pair twice in an epoch
        assert set(got) == kept  # exactly the kept pairs, through a real DataLoader worker
        row = res["rows"][e]
        assert row["trained"] == len(kept) == row["kept"]
        learnt = {(r["shard"], r["key"]) for r in plan if r["keep"] and r["weight"] > 0}  # re-checks: weight 0
        assert (row["learnt"], row["mismatched_learnt"]) == (len(learnt), len(learnt & noise))
        assert row["noise_suspected"] == (seta.load_summary(run_dir, e).get("noise_suspected"))
        assert row["mismatched_trained"] == len(kept & noise)
        assert row["mismatched_share"] == pytest.approx(len(kept & noise) / len(kept))
        pruned_somewhere |= len(kept) < 300
    assert pruned_somewhere
    assert res["pruned"] == pytest.approx(1 - sum(len(g) for g in res["delivered"]) / 900)
    assert res["mismatched_in_data"] == pytest.approx(0.2)
    for k in ("i2t_r1", "i2t_r5", "t2i_r1", "t2i_r5"):
        assert 0.0 <= res[k] <= 1.0
    # every delivered pair's loss landed on its own key: epoch 1's plan holds a loss for
    # exactly the pairs trained in epoch 0
    plan1 = seta.load_plan(run_dir, 1, columns=["shard", "key", "loss"]).to_pylist()
    with_loss = {(r["shard"], r["key"]) for r in plan1 if not math.isnan(r["loss"])}
    assert with_loss == set(res["delivered"][0])


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


def test_noise_option_adds_noise_to_the_policy_parameters() -> None:
    p = tp.parser()
    assert tp.policy_params(p.parse_args(["--policy", "full", "--noise"])) == {"noise": True}
    assert tp.policy_params(p.parse_args(["--policy", "infobatch", "--r", "0.6", "--noise"])) == {
        "r": 0.6,
        "noise": True,
    }
    assert tp.policy_params(p.parse_args(["--policy", "seta", "--params", '{"r": 0.2}', "--noise"])) == {
        "r": 0.2,
        "noise": True,
    }
    assert tp.policy_params(p.parse_args(["--policy", "full"])) == {}
