"""studies/baselines_labels.py: the committed report is the one its result files give, and a tiny
run of the study's runner (real shards, real pipeline) trains what each baseline claims."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from studies import baselines_labels as bl

ROOT = Path(__file__).resolve().parent.parent


def test_committed_report_is_generated_from_the_result_files() -> None:
    assert bl.DOC.read_text() == bl.render(bl.load_all(bl.RESULTS))


def test_folds_are_disjoint_cover_the_keys_and_are_stratified() -> None:
    keys = [f"{i:06d}" for i in range(1003)]
    labels = [i % 3 % 2 for i in range(1003)]  # 669 zeros, 334 ones
    folds = bl.fold_keys(keys, labels, 4, seed=1)
    assert sorted(len(f) for f in folds) == [250, 251, 251, 251]
    assert set().union(*folds) == set(keys)
    assert sum(len(f) for f in folds) == len(keys)
    label = dict(zip(keys, labels))
    ones = [sum(label[k] for k in f) for f in folds]
    assert max(ones) - min(ones) <= 1  # each label dealt evenly (stratified)
    assert bl.fold_keys(keys[::-1], labels[::-1], 4, seed=1) == folds  # fixed by the keys, not their order
    assert bl.fold_keys(keys, labels, 4, seed=2) != folds


def _shards(tmp: Path) -> object:
    import webdataset as wds

    from studies.quality.data import Dataset

    rng = random.Random(0)
    words = [f"w{i}" for i in range(40)]
    paths: dict[str, list[str]] = {"train": [], "val": [], "test": []}
    i = 0
    for split, shards, n in (("train", 3, 96), ("val", 1, 64), ("test", 1, 64)):
        for s in range(shards):
            p = tmp / f"{split}-{s:06d}.tar"
            with wds.TarWriter(str(p)) as w:
                for _ in range(n):
                    y = rng.randrange(2)
                    text = " ".join(["good" if y else "bad"] + rng.sample(words, 4))
                    w.write({"__key__": f"{i:06d}", "txt": text, "cls": str(y)})
                    i += 1
            paths[split].append(str(p))

    class Tiny(Dataset):
        name, classes, epochs, batch, workers = "sst2", 2, 3, 32, 1

    ds = Tiny(tmp, tmp)
    ds.train, ds.val, ds.test = paths["train"], paths["val"], paths["test"]
    return ds


@pytest.mark.slow
# the loop applies the remedy the short last batch's PlanWarning names (loss over the nominal batch size)
@pytest.mark.filterwarnings("ignore::seta_stream.errors.PlanWarning")
def test_smoke_run_of_the_runner(tmp_path: Path) -> None:
    import torch

    import seta_stream as seta

    torch.set_num_threads(1)
    ds = _shards(tmp_path)
    pop = seta.list_samples(ds.train)
    ctx = bl.Ctx(results=tmp_path / "results", out=tmp_path / "out", epochs=3, seeds=1, ds=ds, population=pop,
                 folds=2, keep_runs=True)  # fmt: skip
    ctx.results.mkdir()
    all_keys = set(pop.column("key").to_pylist())
    noisy = set(bl.noisy_keys(ctx, 0.4))
    assert len(noisy) == round(0.4 * 288)

    def plan_keys(run: bl.Run, epoch: int = 0) -> set[str]:
        t = seta.load_plan(str(ctx.out / "runs" / run.rid(3)), epoch, columns=["key", "keep"])
        return {k for k, keep in zip(t.column("key").to_pylist(), t.column("keep").to_pylist()) if keep}

    # the studies' runner takes the plan's jobs that --only selects, in the registry's order
    ctx.only = "n40-E3-(full|rule|oracle|fold0|fold1)-s0$"
    ran = bl.harness.worker(ctx, bl)
    assert ran == [bl.Run(0.4, m, 0).rid(3) for m in ("full", "rule", "oracle", "fold0", "fold1")]
    # the oracle trains exactly the samples whose labels are clean, in every epoch
    oracle = ctx.load(bl.Run(0.4, "oracle", 0))
    assert oracle["excluded"] == oracle["excluded_noisy"] == len(noisy)
    assert all(plan_keys(bl.Run(0.4, "oracle", 0), e) == all_keys - noisy for e in range(3))
    assert [e["backprop"] for e in oracle["epochs"]] == [288 - len(noisy)] * 3
    # the folds: disjoint, covering the training set; each trains on the others and predicts itself
    folds = bl.run_folds(ctx, bl.Run(0.4, "fold0", 0))
    assert folds[0] | folds[1] == all_keys and not folds[0] & folds[1]
    assert abs(len(folds[0]) - len(folds[1])) <= 1
    for k in range(2):
        run = bl.Run(0.4, f"fold{k}", 0)
        assert plan_keys(run) == all_keys - folds[k]
        held = bl.np.load(ctx.probs_path(run))
        assert set(held["keys"].tolist()) == folds[k] and len(held["keys"]) == len(folds[k])
        assert held["probs"].shape == (len(folds[k]), 2)
    # full data: validation accuracy after every epoch, and the signal of its loss history
    full = ctx.load(bl.Run(0.4, "full", 0))
    assert [sorted(e["probe"]) for e in full["epochs"]] == [["val_acc"]] * 3
    assert [r["epoch"] for r in full["signal"]] == [0, 1, 2]
    rule = ctx.load(bl.Run(0.4, "rule", 0))
    assert [p["epoch"] for p in rule["suspects"]["plans"]] == [0, 1, 2]
    # equal compute: exactly the rule run's samples trained (made uneven here: 2 epochs and 37 samples)
    path = ctx.path(bl.Run(0.4, "rule", 0))
    path.write_text(json.dumps({**rule, "samples_trained": 2 * 288 + 37}))
    ctx.only = "n40-E3-equal-s0$"
    assert bl.harness.worker(ctx, bl) == ["sst2-n40-E3-equal-s0"]
    equal = ctx.load(bl.Run(0.4, "equal", 0))
    assert equal["samples_trained"] == 2 * 288 + 37
    assert [e["backprop"] for e in equal["epochs"]] == [288, 288, 37]
    assert equal["budget"] == 2 * 288 + 37 and equal["n_epochs"] == 3
    # a finished run is not trained again
    before = ctx.path(bl.Run(0.4, "oracle", 0)).stat().st_mtime_ns
    ctx.only = "n40-E3-oracle-s0$"
    assert bl.harness.worker(ctx, bl) == []
    assert ctx.path(bl.Run(0.4, "oracle", 0)).stat().st_mtime_ns == before
    assert not any("/" in json.dumps(r) and str(tmp_path) in json.dumps(r) for r in (full, rule, oracle, equal))


def test_equal_compute_and_random_of_a_rule_that_pruned_nothing_are_full_data(tmp_path: Path) -> None:
    import pyarrow as pa

    pop = pa.table({"shard": ["a.tar"] * 10, "key": [f"{i:02d}" for i in range(10)]})
    ctx = bl.Ctx(results=tmp_path, out=tmp_path, epochs=3, population=pop, folds=2)
    assert bl.cfg_of(ctx, bl.Run(0.4, "equal", 1)) is None  # waits for the rule run of its seed
    rule = ctx.path(bl.Run(0.4, "rule", 1))
    rule.write_text(json.dumps({"samples_trained": 30, "pruned": 0.0}))
    assert bl.cfg_of(ctx, bl.Run(0.4, "equal", 1)) == bl.cfg_of(ctx, bl.Run(0.4, "random-eq", 1)) == bl.SAME_AS_FULL
    rule.write_text(json.dumps({"samples_trained": 25, "pruned": 1 / 6}))
    cfg, exclude = bl.cfg_of(ctx, bl.Run(0.4, "equal", 1))
    assert (cfg["policy"], cfg["budget"], cfg["n_epochs"], exclude) == ("full", 25, 3, None)
    cfg, _ = bl.cfg_of(ctx, bl.Run(0.4, "random-eq", 1))
    assert (cfg["policy"], cfg["params"]) == ("random", {"r": 0.1667})


def test_the_plan_needs_the_rule_and_the_folds_and_the_report_lists_a_crashed_run(tmp_path: Path) -> None:
    import pyarrow as pa

    pop = pa.table({"shard": ["a.tar"] * 10, "key": [f"{i:02d}" for i in range(10)]})
    ctx = bl.Ctx(results=tmp_path / "results", out=tmp_path / "out", epochs=3, seeds=1, population=pop, folds=2)
    ctx.results.mkdir()
    jobs = {j.rid: j.needs for j in bl.plan(ctx)}
    assert list(jobs) == [r.rid(3) for r in bl.registry(1, 2)]
    assert {k: v for k, v in jobs.items() if v} == {
        f"sst2-n{n}-E3-{m}-s0": needs
        for n in (20, 40)
        for m, needs in (
            ("random-eq", (f"sst2-n{n}-E3-rule-s0",)),
            ("equal", (f"sst2-n{n}-E3-rule-s0",)),
            ("cleanlab", (f"sst2-n{n}-E3-fold0-s0", f"sst2-n{n}-E3-fold1-s0")),
        )
    }
    # a rule that pruned nothing: dynamic random at its pruned % and equal compute are full data's run
    for rate in (0.2, 0.4):
        ctx.path(bl.Run(rate, "rule", 0)).write_text(json.dumps({"samples_trained": 30, "pruned": 0.0}))
    assert [r for r in (j.rid for j in bl.plan(ctx)) if "-eq" in r or "equal" in r] == []

    def crash(ctx: bl.Ctx, job: bl.Job, progress: list[str]) -> dict:
        raise RuntimeError("no sentences")

    for rate in (0.2, 0.4):
        ctx.path(bl.Run(rate, "rule", 0)).unlink()
    bl.harness.execute(ctx, bl.plan(ctx)[0], crash)  # the runner's own crash file
    data = bl.load_all(ctx.results)
    line = "`sst2-n20-E3-full-s0`: crashed after 0 epochs (RuntimeError: no sentences); no result"
    assert (data["runs"], data["unfinished"]) == ({}, [line])
    assert f"\nCrashed or cut short (run again by the next invocation): {line}.\n" in bl.render(data)


def test_the_keyed_hash_rerun_report_is_generated_from_its_result_files() -> None:
    folder, doc = ROOT / "docs" / "quality-runs" / "baselines-labels-v2", ROOT / "docs" / "baselines-labels-v2.md"
    if not folder.exists():
        pytest.skip("the keyed-hash rerun has no result files in this checkout")
    assert doc.read_text() == bl.render(bl.load_all(folder), doc)


def _run(val: list[float], test: list[float], suspected: int = 0, precision: float | None = None,
         recall: float = 0.0) -> dict:  # fmt: skip
    """A result of the study's shape: per-epoch validation and test accuracy, and the rule's suspects."""
    epochs = [{"probe": {"val_acc": v}, "test_acc": t} for v, t in zip(val, test)]
    return {"epochs": epochs, "test_acc": test[-1],
            "suspects": {"suspected": suspected, "precision": precision, "recall": recall}}  # fmt: skip


def test_targets_read_every_run_at_its_best_validation_epoch_and_apply_the_oracle_margin() -> None:
    runs = {}
    for s, (rule_es, full_es, oracle_es) in enumerate(((0.70, 0.69, 0.75), (0.71, 0.69, 0.76), (0.72, 0.69, 0.74))):
        # the best validation epoch is epoch 1 in every run: its test accuracy is what is read
        runs[(0.4, "rule", s)] = _run([0.5, 0.9, 0.6], [0.1, rule_es, 0.2], 100, 0.9, 0.8)
        runs[(0.4, "full", s)] = _run([0.5, 0.9, 0.6], [0.1, full_es, 0.99])
        runs[(0.4, "oracle", s)] = _run([0.5, 0.9, 0.6], [0.1, oracle_es, 0.0])
    runs[(0.2, "rule", 0)] = _run([0.9, 0.5], [0.60, 0.50])  # nothing suspected, one seed, no oracle run
    runs[(0.2, "full", 0)] = _run([0.9, 0.5], [0.60, 0.50])
    runs[(0.1, "rule", 0)] = _run([0.9, 0.5], [0.60, 0.50], 10, 0.5, 0.4)  # one run suspected, one did not
    runs[(0.1, "rule", 1)] = _run([0.9, 0.5], [0.60, 0.50])
    runs[(0.1, "full", 0)] = runs[(0.1, "full", 1)] = _run([0.9, 0.5], [0.60, 0.50])
    lines = bl._targets(runs)
    assert lines[-4].endswith("| 0.500 / 0.200 (precision of the 1 of 2 runs that suspected any) |")
    # 40%: gaps +1, +2, +3 (mean +2, 2 SE = 2 * 1 / sqrt(3) = 1.1547); the oracle's margin +6, +7, +5 (mean +6)
    assert lines[-3:] == [
        "| 20% | 1 | +0.00 (one seed) | - | no oracle run | no oracle run | none suspected |",
        "| 40% | 3 | +3.15 (met) | +6.00 | +0.85 (met) | -4.00 (not met) | 0.900 / 0.800 |",
        "",
    ]
