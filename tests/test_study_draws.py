"""Every seeded choice of the studies is what its name says, checked by statistical tests on the real key
sets: CIFAR-10's training keys, SST-2's keys as tools/text_to_shards.py names them, the pair keys of
tools/make_pair_shards.py, the word keys of tools/make_word_shards.py; and the library's own draws
(uniforms of a stream, random subsets, the noise rule's re-check, SeTa's down-sampling, the balance order).

Each test runs on a fixed key set, so its p-value is a fixed number: the bar (P_MIN) is met or not, the
same on every machine and run. A choice that is not what it says (a salted CRC32 whose values for two
salts differ by a constant XOR, folds cut from a hash order correlated with the noise) fails them."""

from __future__ import annotations

import csv
import gzip
from functools import cache
from pathlib import Path

import numpy as np
import pytest

stats = pytest.importorskip("scipy.stats")

from studies import baselines_labels, cifar_gpu  # noqa: E402
from studies.quality.data import ASYMMETRIC_FLIPS, NOISE_SEED, asymmetric_offsets, symmetric_offsets  # noqa: E402
from tools import draws  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT.parent / "shared" / "data"
P_MIN = 1e-3  # the bar of every test of a distribution: p above it


from tools import make_pair_shards as mps  # noqa: E402
from tools import make_word_shards as mws  # noqa: E402
from tools import text_to_shards as t2s  # noqa: E402


# ------------------------------------------------------------------------------------ the key sets
@cache
def cifar() -> tuple[list[str], np.ndarray]:
    """CIFAR-10's 50,000 training keys and their labels (the real ones from the data's manifest where
    the shared data are here, else a seeded synthetic label vector)."""
    keys = [f"train_{i:06d}" for i in range(50000)]
    manifest = DATA / "cifar10" / "manifest.tsv.gz"
    if manifest.exists():
        with gzip.open(manifest, "rt") as fh:
            label = {r["key"]: int(r["label"]) for r in csv.DictReader(fh, delimiter="\t")}
        return keys, np.array([label[k] for k in keys])
    return keys, np.random.default_rng(0).integers(0, 10, len(keys))


def cifar_train() -> tuple[list[str], np.ndarray]:
    """The studies' CIFAR-10 training population: train shards 0-8, the first 45,000 keys."""
    keys, y = cifar()
    return keys[:45000], y[:45000]


@cache
def sst2() -> tuple[list[str], np.ndarray, list[int]]:
    """SST-2's 67,349 training rows as the study shards them (``text_to_shards.py --shuffle 0``: keys are
    the row numbers, zero-padded to 6 digits): keys and labels in row order, and the rows in written order
    (the first 65,000 the training shards 0-12, the last 2,349 the validation shard)."""
    tsv = DATA / "sst2" / "train.tsv"
    if tsv.exists():
        with open(tsv, encoding="utf-8", newline="") as fh:
            y = np.array([int(r["label"]) for r in csv.DictReader(fh, delimiter="\t", quoting=csv.QUOTE_NONE)])
    else:
        y = (np.random.default_rng(0).random(67349) < 0.56).astype(int)
    keys = [f"{i:06d}" for i in range(len(y))]
    return keys, y, t2s.row_order(len(keys), 0)


def sst2_train() -> tuple[list[str], np.ndarray]:
    keys, y, order = sst2()
    rows = order[:65000]
    return [keys[i] for i in rows], y[rows]


def pair_keys(n: int = 10000, shard_size: int = 1000) -> list[list[str]]:
    """The noise study's pair set (10,000 pairs, 1,000 a shard): its keys, shard by shard."""
    shards = -(-n // shard_size)
    return [[mps.compute_key(i, s, shard_size, shards) for i in range(min(shard_size, n - s * shard_size))]
            for s in range(shards)]  # fmt: skip


# ------------------------------------------------------------------------------------ helpers
def uniform_p(counts: np.ndarray) -> float:
    """Chi-square goodness of fit of ``counts`` to equal cells."""
    return float(stats.chisquare(np.asarray(counts)).pvalue)


def independent_p(a: np.ndarray, b: np.ndarray) -> float:
    """Chi-square test of independence of two categorical arrays (their contingency table)."""
    ua, ia = np.unique(np.asarray(a), return_inverse=True)
    ub, ib = np.unique(np.asarray(b), return_inverse=True)
    table = np.zeros((len(ua), len(ub)), dtype=np.int64)
    np.add.at(table, (ia, ib), 1)
    return float(stats.chi2_contingency(table, correction=False).pvalue)


def deciles(positions: np.ndarray, n: int) -> np.ndarray:
    """Counts of ``positions`` (0..n-1) per tenth of the range."""
    return np.bincount(np.asarray(positions) * 10 // n, minlength=10)


def binomial_z(k: int, n: int, p: float) -> float:
    return abs(k - n * p) / np.sqrt(n * p * (1 - p))


def noisy_mask(keys: list[str], offsets: dict) -> np.ndarray:
    return np.array([k in offsets for k in keys])


# ------------------------------------------------------------------------------------ symmetric noise
def test_symmetric_noise_picks_exactly_the_rate_and_offsets_uniform_over_the_other_classes() -> None:
    keys, _ = cifar_train()
    out = symmetric_offsets(keys, 10, 0.4)
    assert len(out) == 18000
    offsets = np.array(list(out.values()))
    assert set(offsets.tolist()) == set(range(1, 10))
    assert uniform_p(np.bincount(offsets, minlength=10)[1:]) > P_MIN  # every offset 1..9 alike
    # the validation split (train shard 9) takes its own 40%, by the same rule
    val = symmetric_offsets(cifar()[0][45000:], 10, 0.4)
    assert len(val) == 2000 and uniform_p(np.bincount(list(val.values()), minlength=10)[1:]) > P_MIN


def test_symmetric_noise_rate_is_the_same_in_every_class() -> None:
    for keys, y, classes in (cifar_train() + (10,), sst2_train() + (2,)):
        offsets = symmetric_offsets(keys, classes, 0.4)
        noisy = noisy_mask(keys, offsets)
        assert independent_p(y, noisy) > P_MIN  # class x noisy: the noisy share alike in every class
        new = np.array([(v + offsets.get(k, 0)) % classes for k, v in zip(keys, y)])
        assert np.all((new != y) == noisy)  # a noisy label is always another class


def test_symmetric_noise_choice_is_independent_of_its_offsets_and_of_the_key_order() -> None:
    keys, _ = cifar_train()
    chosen = noisy_mask(keys, symmetric_offsets(keys, 10, 0.4))
    every = symmetric_offsets(keys, 10, 1.0)  # a key's offset does not depend on the rate: every key's
    offset = np.array([every[k] for k in keys])
    assert independent_p(chosen, offset) > P_MIN  # chosen at 40% x offset
    assert uniform_p(deciles(np.flatnonzero(chosen), len(keys))) > P_MIN  # chosen spread over the key order
    half = np.arange(len(keys)) >= len(keys) // 2
    assert independent_p(half[chosen], offset[chosen]) > P_MIN  # offsets alike in both halves of the keys
    sst_keys, _ = sst2_train()
    sst_chosen = noisy_mask(sst_keys, symmetric_offsets(sst_keys, 2, 0.4))
    rows = np.array([int(k) for k in sst_keys])  # the source row (the tool's key) of each training sample
    assert independent_p(rows * 10 // len(rows), sst_chosen) > P_MIN  # source-row deciles x chosen


def test_a_lower_rate_corrupts_a_subset_of_a_higher_rates_samples_with_the_same_offsets() -> None:
    keys, _ = cifar_train()
    rates = (0.03, 0.05, 0.1, 0.2, 0.4)
    outs = [symmetric_offsets(keys, 10, r) for r in rates]
    assert [len(o) for o in outs] == [round(r * len(keys)) for r in rates]
    for low, high in zip(outs, outs[1:]):
        assert all(high[k] == v for k, v in low.items())
    assert symmetric_offsets(keys[::-1], 10, 0.4) == outs[-1]  # the keys decide, not their order
    other = symmetric_offsets(keys, 10, 0.4, seed=NOISE_SEED + 1)
    assert independent_p(noisy_mask(keys, outs[-1]), noisy_mask(keys, other)) > P_MIN  # another seed: unrelated


# ------------------------------------------------------------------------------------ asymmetric noise
def test_asymmetric_noise_flips_exactly_the_named_pairs_at_the_rate_per_source_class() -> None:
    keys, y = cifar_train()
    out = asymmetric_offsets(keys, y.tolist(), 0.4)
    label = dict(zip(keys, y.tolist()))
    counts = np.bincount(y, minlength=10)
    pairs: dict[tuple[int, int], int] = {}
    for k, new in out.items():
        pairs[(label[k], new)] = pairs.get((label[k], new), 0) + 1
    assert pairs == {(s, t): round(0.4 * counts[s]) for s, t in ASYMMETRIC_FLIPS.items()}  # no other class touched
    low = asymmetric_offsets(keys, y.tolist(), 0.2)
    assert set(low) <= set(out) and all(out[k] == v for k, v in low.items())
    # within a source class, the flipped samples spread over the key order, and the choice is not the
    # symmetric noise's (a purpose of its own)
    sym = noisy_mask(keys, symmetric_offsets(keys, 10, 0.4))
    for s in ASYMMETRIC_FLIPS:
        members = np.flatnonzero(y == s)
        flipped = np.array([keys[i] in out for i in members])
        assert uniform_p(deciles(np.flatnonzero(flipped), len(members))) > P_MIN
        assert independent_p(flipped, sym[members]) > P_MIN


# ------------------------------------------------------------------------------------ cleanlab's folds
def _fold_sets() -> list[tuple[str, list[str], np.ndarray, np.ndarray, np.ndarray]]:
    """(name, keys, noisy labels, noisy mask, folds of seed 0) of every study that runs cleanlab."""
    out = []
    keys, y = cifar_train()
    for kind in ("sym40", "asym40"):
        noisy_y = cifar_gpu.noisy_labels(kind, np.array(keys), y)
        out.append((f"cifar-gpu {kind}", keys, noisy_y, noisy_y != y, cifar_gpu.fold_of(np.array(keys), noisy_y, 4, 0)))
    keys, y = sst2_train()
    offsets = symmetric_offsets(keys, 2, 0.4)
    noisy_y = np.array([(v + offsets.get(k, 0)) % 2 for k, v in zip(keys, y)])
    parts = baselines_labels.fold_keys(keys, noisy_y.tolist(), 4, 0)
    fold = np.array([next(i for i, p in enumerate(parts) if k in p) for k in keys])
    out.append(("baselines-labels sst2 n40", keys, noisy_y, noisy_y != y, fold))
    return out


def test_cleanlab_folds_are_stratified_by_the_noisy_label_and_even() -> None:
    for name, _, noisy_y, _, fold in _fold_sets():
        sizes = np.bincount(fold, minlength=4)
        assert sizes.max() - sizes.min() <= 1, name
        for c in np.unique(noisy_y):
            per = np.bincount(fold[noisy_y == c], minlength=4)
            assert per.max() - per.min() <= 1, (name, c)


def test_cleanlab_folds_are_independent_of_the_noisy_set_and_the_key_order() -> None:
    for name, keys, _, noisy, fold in _fold_sets():
        assert independent_p(noisy, fold) > P_MIN, name  # noisy x fold
        assert independent_p(np.arange(len(keys)) * 10 // len(keys), fold) > P_MIN, name  # key-order deciles x fold


def test_cleanlab_folds_are_cleanlabs_split_of_the_sorted_keys_new_for_every_seed() -> None:
    from sklearn.model_selection import StratifiedKFold

    keys, y = cifar_train()
    noisy_y = cifar_gpu.noisy_labels("sym40", np.array(keys), y)
    fold0 = cifar_gpu.fold_of(np.array(keys), noisy_y, 4, 0)
    # cleanlab.count.estimate_cv_predicted_probabilities' split: StratifiedKFold(shuffle=True, random_state)
    pos = np.argsort(np.array(keys))
    split = StratifiedKFold(4, shuffle=True, random_state=draws.seed_int(draws.CLEANLAB_FOLDS, 0, bits=32))
    for k, (_, held) in enumerate(split.split(np.zeros((len(keys), 1)), noisy_y[pos])):
        assert np.all(fold0[pos[held]] == k)
    rev = cifar_gpu.fold_of(np.array(keys[::-1]), noisy_y[::-1], 4, 0)
    assert np.array_equal(rev[::-1], fold0)  # the keys decide, not their order
    fold1 = cifar_gpu.fold_of(np.array(keys), noisy_y, 4, 1)
    assert independent_p(fold0, fold1) > P_MIN  # another seed: other folds, unrelated to the first


# ------------------------------------------------------------------------------------ the data tools
def test_pair_sets_mismatch_exactly_the_share_at_uniform_places_independent_of_the_scenes() -> None:
    shards = pair_keys()
    places, donors, chosen_all, shapes = [], [], [], []
    for s, keys in enumerate(shards):
        picked = mps.mismatched(keys, 0.2, 0)
        assert len(picked) == round(0.2 * len(keys))
        low = mps.mismatched(keys, 0.1, 0)
        assert set(low) <= set(picked)  # a lower level: a subset
        rng = mps.scene_rng(0, False, s)
        attrs = [mps.draw_attrs(rng) for _ in keys]  # the tool's scenes of the shard (its first draws)
        for i in picked:
            d = mps.donor(keys, attrs, i, 0)
            assert d is not None and d != i
            assert (attrs[d]["shape"], attrs[d]["colour"]) != (attrs[i]["shape"], attrs[i]["colour"])
            donors.append(d)
        places += picked
        mask = np.zeros(len(keys), bool)
        mask[picked] = True
        chosen_all.append(mask)
        shapes += [a["shape"] for a in attrs]
    n = len(shards[0])
    assert uniform_p(deciles(np.array(places), n)) > P_MIN  # the mismatched pairs' places in their shard
    assert uniform_p(deciles(np.array(donors), n)) > P_MIN  # their donors' places
    assert independent_p(np.concatenate(chosen_all), np.array(shapes)) > P_MIN  # mismatched x the scene's shape
    assert independent_p(np.array(places) * 10 // n, np.array(donors) * 10 // n) > P_MIN  # place x donor place


def test_text_shuffle_is_a_uniform_permutation_independent_of_the_labels_and_the_noise() -> None:
    keys, y, order = sst2()
    n = len(keys)
    pos = np.empty(n, dtype=np.int64)
    pos[order] = np.arange(n)  # the written position of each source row
    assert sorted(order) == list(range(n))
    assert independent_p(np.arange(n) * 10 // n, pos * 10 // n) > P_MIN  # source decile x written decile
    val = pos >= 65000  # the validation shard
    assert int(val.sum()) == n - 65000
    assert independent_p(val, y) > P_MIN  # the validation split's labels like the training split's
    train = [keys[i] for i in order[:65000]]
    noisy = noisy_mask(train, symmetric_offsets(train, 2, 0.4))
    assert independent_p(pos[order[:65000]] * 10 // 65000, noisy) > P_MIN  # the noise x the written order
    assert t2s.row_order(n, 1) != order  # another seed, another order


def test_word_sets_show_a_random_label_to_the_share_independent_of_the_word() -> None:
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 50, 24000)
    keys = [f"mj/{i // 1000:04d}/{i % 7}/{i:07d}_{mws.VOCAB[v]}" for i, v in enumerate(labels)]
    for share in (0.03, 0.2):
        shown = [mws.random_label(k, share, 0, 50) for k in keys]
        picked = np.array([s is not None for s in shown])
        assert binomial_z(int(picked.sum()), len(keys), share) < 4
        assert uniform_p(np.bincount([s for s in shown if s is not None], minlength=50)) > P_MIN
        assert independent_p(picked, labels // 5) > P_MIN  # picked x the true word (in ten groups)
        assert uniform_p(deciles(np.flatnonzero(picked), len(keys))) > P_MIN
    low = {k: mws.random_label(k, 0.03, 0, 50) for k in keys}
    assert all(mws.random_label(k, 0.2, 0, 50) == v for k, v in low.items() if v is not None)


def test_training_crops_and_flips_are_uniform_and_new_every_epoch() -> None:
    from studies.quality.pipeline import crop_and_flip

    keys, _ = cifar_train()
    e0 = np.array([crop_and_flip(0, 0, k) for k in keys], dtype=np.int64)
    e1 = np.array([crop_and_flip(0, 1, k) for k in keys], dtype=np.int64)
    s1 = np.array([crop_and_flip(1, 0, k) for k in keys], dtype=np.int64)
    for col in (0, 1):  # row and column offsets 0..8
        assert uniform_p(np.bincount(e0[:, col], minlength=9)) > P_MIN
    assert binomial_z(int(e0[:, 2].sum()), len(keys), 0.5) < 4
    assert independent_p(e0[:, 0], e0[:, 1]) > P_MIN and independent_p(e0[:, 0] * 9 + e0[:, 1], e0[:, 2]) > P_MIN
    for other in (e1, s1):  # the next epoch, another seed: unrelated draws
        assert independent_p(e0[:, 0] * 9 + e0[:, 1], other[:, 0] * 9 + other[:, 1]) > P_MIN
        assert independent_p(e0[:, 2], other[:, 2]) > P_MIN


# ------------------------------------------------------------------------------------ the library's draws
def _uids() -> tuple[np.ndarray, np.ndarray]:
    """The uids of CIFAR-10's 50,000 training samples as the library names them, and their shard index."""
    from seta_stream.ids import sample_uids, shard_name

    keys, _ = cifar()
    shard = np.arange(len(keys)) // 5000
    names = [shard_name(f"/data/cifar10/train-{s:06d}.tar.gz") for s in shard.tolist()]
    return sample_uids(names, keys), shard


def test_library_uniforms_are_uniform_and_independent_across_epochs_seeds_and_streams() -> None:
    from seta_stream.policies import random_draws as rd

    uid, _ = _uids()
    base = rd.uniforms(uid, 0, 3, rd.STREAM_RANDOM)
    assert rd.uniform_of(int(uid[17]), 0, 3, rd.STREAM_RANDOM) == base[17]
    others = {
        "next epoch": rd.uniforms(uid, 0, 4, rd.STREAM_RANDOM),
        "next seed": rd.uniforms(uid, 1, 3, rd.STREAM_RANDOM),
        **{f"stream {s}": rd.uniforms(uid, 0, 3, s) for s in (rd.STREAM_ANNEAL, rd.STREAM_STATIC, rd.STREAM_NOISE,
                                                                  rd.STREAM_INFOBATCH, rd.STREAM_FLOOR)},
    }  # fmt: skip
    for u in (base, *others.values()):
        assert stats.kstest(u, "uniform").pvalue > P_MIN
        assert uniform_p(deciles((u * len(u)).astype(np.int64), len(u))) > P_MIN
    for name, u in others.items():
        assert stats.pearsonr(base, u).pvalue > P_MIN, name
        assert independent_p(base < 0.3, u < 0.3) > P_MIN, name  # 2x2: kept at r = 0.7 in both


def test_random_policy_keeps_the_share_in_every_shard_a_new_subset_every_epoch() -> None:
    from seta_stream.policies.base import PolicyInput
    from seta_stream.policies.random import RandomParams, StaticParams, random_policy, static_policy
    from seta_stream.policies.seta import SetaParams, seta

    uid, shard = _uids()
    n = len(uid)

    def inp(epoch: int) -> PolicyInput:
        nan = np.full(n, np.nan)
        return PolicyInput(uid, nan.astype(np.float32), nan, np.zeros(n, np.int32), None, epoch, 10, 0)

    keeps = [random_policy(inp(e), RandomParams(r=0.3)).keep for e in (0, 1)]
    for keep in keeps:
        assert int(keep.sum()) == int(0.7 * n)  # exactly floor((1 - r) N)
        assert independent_p(shard, keep) > P_MIN  # shard x kept: the share alike in every shard
        assert all(binomial_z(int(keep[shard == s].sum()), 5000, 0.7) < 4 for s in range(10))
    assert independent_p(keeps[0], keeps[1]) > P_MIN  # epoch 0 and 1: unrelated subsets
    static = static_policy(inp(0), StaticParams(r=0.3)).keep
    assert independent_p(static, keeps[0]) > P_MIN  # static random (stream 5) and dynamic random (stream 1)
    # SeTa's down-sampling R is dynamic random's draw (stream 1, the same seed and epoch): at epoch 0 every
    # sample is unseen and SeTa keeps R, the very samples dynamic random keeps (a paired draw by design)
    assert np.array_equal(seta(inp(0), SetaParams(r=0.3)).keep, keeps[0])


def test_noise_recheck_draws_uniformly_among_the_suspects_anew_every_epoch() -> None:
    from seta_stream.policies.base import PolicyInput
    from seta_stream.policies.noise import _recheck
    from seta_stream.policies.random_draws import STREAM_RANDOM, uniforms

    uid, _ = _uids()
    n = len(uid)
    suspect = np.arange(n) % 5 < 2  # a structured set of suspects (2 in 5, by key order)
    m = int(0.1 * suspect.sum())

    def inp(epoch: int) -> PolicyInput:
        nan = np.full(n, np.nan)
        return PolicyInput(uid, nan.astype(np.float32), nan, np.ones(n, np.int32), None, epoch, 10, 0)

    chosen = [_recheck(inp(e), suspect, m) for e in (2, 3)]
    idx = np.flatnonzero(suspect)
    for c in chosen:
        assert int(c.sum()) == m and not (c & ~suspect).any()
        assert uniform_p(deciles(np.flatnonzero(c[idx]), len(idx))) > P_MIN  # spread over the suspects
    assert independent_p(chosen[0][idx], chosen[1][idx]) > P_MIN  # epoch 2 and 3: unrelated
    kept = uniforms(uid, 0, 2, STREAM_RANDOM) < 0.7  # dynamic random's draw in the same epoch
    assert independent_p(chosen[0][idx], kept[idx]) > P_MIN


def test_balance_halves_split_the_shards_evenly_and_the_epoch_order_is_uniform() -> None:
    from seta_stream._reading.balance import deferring_half, order_keys

    names = [f"shard-{i:06d}.tar" for i in range(4000)]
    half0 = deferring_half(names, 0, 0)
    assert binomial_z(int(half0.sum()), len(names), 0.5) < 4
    assert np.array_equal(deferring_half(names, 0, 1), ~half0)  # the halves take turns
    assert np.array_equal(deferring_half(names, 0, 2), half0)  # fixed for the run
    assert independent_p(half0, deferring_half(names, 1, 0)) > P_MIN  # another seed: other halves
    assert uniform_p(deciles(np.flatnonzero(half0), len(names))) > P_MIN
    u = [order_keys(names, 0, e).astype(np.float64) / 2.0**64 for e in (0, 1)]
    for x in u:
        assert stats.kstest(x, "uniform").pvalue > P_MIN
        assert stats.spearmanr(np.arange(len(names)), x).pvalue > P_MIN  # the order is not the names'
    assert stats.spearmanr(u[0], u[1]).pvalue > P_MIN  # epoch 0 and 1: unrelated orders
    assert stats.spearmanr(u[0], order_keys(names, 1, 0).astype(np.float64)).pvalue > P_MIN  # nor seeds


# ------------------------------------------------------------------------------------ the keyed hash itself
def test_the_keyed_hash_has_no_linear_structure_across_purposes_or_seeds() -> None:
    """The property CRC32 lacks: for keys of one length, digest(a, k) XOR digest(b, k) takes as many values
    as there are keys (CRC32: one), and its bits are fair coins."""
    keys, _ = cifar()
    for a, b in (((draws.NOISE_PICK, NOISE_SEED), (draws.NOISE_OFFSET, NOISE_SEED)),
                 ((draws.NOISE_PICK, NOISE_SEED), (draws.NOISE_PICK, NOISE_SEED + 1))):  # fmt: skip
        x = draws.digests(*a, keys) ^ draws.digests(*b, keys)
        assert len(np.unique(x)) == len(keys)
        bits = ((x[:, None] >> np.arange(64, dtype=np.uint64)) & np.uint64(1)).sum(axis=0)
        assert max(binomial_z(int(c), len(keys), 0.5) for c in bits) < 5
    u = draws.uniforms(draws.NOISE_PICK, NOISE_SEED, keys)
    assert stats.kstest(u, "uniform").pvalue > P_MIN
    # a purpose's generator: the same stream for the same (purpose, seed), unrelated to another purpose's
    a, b = draws.generator(draws.GPU_ORDER, 0).random(50000), draws.generator(draws.TEXT_SHUFFLE, 0).random(50000)
    assert np.array_equal(a, draws.generator(draws.GPU_ORDER, 0).random(50000))
    assert (
        stats.pearsonr(a, b).pvalue > P_MIN
        and stats.pearsonr(a, draws.generator(draws.GPU_ORDER, 1).random(50000)).pvalue > P_MIN
    )
    assert draws.seed_int(draws.SHARD_ORDER, 0) != draws.seed_int(draws.SAMPLE_ORDER, 0)
