"""The short study's findings in docs/quality.md: a table of each finding and the figures it rests on,
generated from the run files, so that the findings and the tables cannot drift apart (the explanations,
which state no measured number, are written around the markers). The numbers are the tables' own: means
over seeds of the same rounding (``docs.scaled_mean``), the same interpolation against dynamic random
(``report.vs_random``)."""

from __future__ import annotations

import math

import numpy as np

from studies.quality.data import DATASETS
from studies.quality.docs import and_list, group, last_loss, load_results, mean_acc, row, scaled_mean, table_head
from studies.quality.layout import Layout
from studies.quality.report import splice, vs_random

DISPLAY = {
    "full": "full data",
    "random": "dynamic random",
    "static": "static",
    "infobatch": "InfoBatch",
    "seta": "SeTa",
    "es": "ES",
    "eswp": "ESWP",
}
NOISE = 0.4  # the short study's label noise (data.noise_offsets): 40% of the training labels
CLASSES = {"cifar10": 10, "sst2": 2}


def noise_entropy(noise: float, classes: int) -> float:
    """The training loss (nats) that the noise alone costs a model predicting the true class's
    label distribution: labels stay with 1 - noise, else a uniform other class."""
    return -((1 - noise) * math.log(1 - noise) + noise * math.log(noise / (classes - 1)))


def pruned(rs: list[dict], key: str = "pruned") -> float:
    return scaled_mean([r[key] for r in rs])


def spread(rs: list[dict]) -> float:
    a = [100 * r["test_acc"] for r in rs]
    return max(a) - min(a)


def sd(rs: list[dict]) -> float:
    return float(np.std([100 * r["test_acc"] for r in rs], ddof=1))


def time_saved(rs: list[dict], full: list[dict]) -> str:
    """The share of full data's wall time the runs ``rs`` saved (fastest seeds)."""
    return f"{100 * (1 - min(r['seconds'] for r in rs) / min(r['seconds'] for r in full)):.0f}%"


def findings(groups: dict) -> list[str]:
    """The findings table: a row per finding, its figures beside it."""

    def runs(ds: str, noisy: bool, policy: str) -> list[list[dict]]:
        """The configurations of a policy (one list of runs per setting), by label."""
        return [rs for k, rs in sorted(groups.items(), key=lambda kv: kv[0][3]) if k[:3] == (ds, noisy, policy)]

    def one(ds: str, noisy: bool, policy: str, label: str | None = None) -> list[dict] | None:
        return next((rs for rs in runs(ds, noisy, policy) if label in (None, rs[0]["label"])), None)

    c, s = "cifar10", "sst2"
    full, noisy_full = one(c, False, "full"), one(c, True, "full")
    if not full:
        return []
    clean = [rs for k, rs in groups.items() if k[:2] == (c, False)]
    policies = sorted({rs[0]["policy"] for rs in clean} - {"full", "random"})

    def ahead_everywhere(p: str) -> bool:
        vs = [vs_random(groups, c, rs) for rs in runs(c, False, p)]
        return len(vs) > 1 and all(v != "-" and float(v) > 0 for v in vs)

    ahead = [DISPLAY[p] for p in policies if ahead_everywhere(p)]
    seta, ib = runs(c, False, "seta"), runs(c, False, "infobatch")
    margins = [float(vs_random(groups, c, rs)) for rs in seta]
    larger = [max(spread(rs), spread(one(c, False, "random", rs[0]["label"]) or rs)) for rs in seta]
    resolved = sum(abs(m) > d + 1e-9 for m, d in zip(margins, larger))
    same_sign = len(margins) > 1 and (all(m > 0 for m in margins) or all(m < 0 for m in margins))
    top = max(ib, key=lambda rs: rs[0]["params"]["r"])
    below = [(1 - e["kept"] / e["n"]) / rs[0]["params"]["r"] for rs in ib for r in rs for e in r["epochs"][1:]
             if e["phase"] == "prune"]  # fmt: skip  # |L|/N, from the kept fraction 1 - r |L| / N
    largest_sd = max((rs for rs in clean if len(rs) > 1), key=sd) is top
    L = table_head("| finding | figures (means over seeds; the tables above give the rest) |")
    L += [
        row(
            [
                f"CIFAR-10, clean labels: ahead of dynamic random at every level run at: **{and_list(ahead) or 'none'}"
                f"** (not so: {and_list([DISPLAY[p] for p in policies if DISPLAY[p] not in ahead])})",
                f"SeTa's margins {' / '.join(f'{m:+.2f}' for m in margins)} against the larger seed difference of SeTa "
                f"and random at that level, {' / '.join(f'{d:.2f}' for d in larger)}: {resolved} of {len(margins)} "
                "larger" + (", all of the same sign" if same_sign else ""),
            ]
        ),
        row(
            [
                f"SeTa against full data ({mean_acc(full):.2f}%), CIFAR-10, clean",
                " / ".join(f"{mean_acc(full) - mean_acc(rs):.2f}" for rs in seta) + " points lost",
            ]
        ),  # fmt: skip
        row(
            [
                f"InfoBatch at r = {top[0]['params']['r']:g}, the largest r: below 50% pruned (one run stands for both "
                "upper levels); the weight 1/(1-r) on the drawn below-mean samples",
                f"share of below-mean samples {100 * min(below):.0f}-{100 * max(below):.0f}% of N in its pruning "
                "epochs; weight "
                f"{1 / (1 - top[0]['params']['r']):g}; sd over seeds {sd(top):.2f}"
                + (", the largest of the clean CIFAR-10 configurations" if largest_sd else ""),
            ]
        ),  # fmt: skip
    ]
    diffs = [abs(mean_acc(rs) - mean_acc(rnd)) for rs in runs(c, False, "static")
             if (rnd := one(c, False, "random", rs[0]["label"]))]  # fmt: skip
    if diffs:
        L.append(row(["static against dynamic random, every level", f"within {max(diffs):.2f} points"]))
    es, eswp = one(c, False, "es"), one(c, False, "eswp")
    if es and eswp:
        L.append(row(["ES and ESWP (CIFAR-10, clean): back-propagated share, gap to full data, wall time saved",
                      f"ES {100 - pruned(es, 'pruned_backprop'):.1f}% back-propagated, "
                      f"{mean_acc(full) - mean_acc(es):.2f} points below full data, {time_saved(es, full)} less time; "
                      f"ESWP {pruned(eswp):.1f}% not loaded at all, {time_saved(eswp, full)} less time"]))  # fmt: skip
    if noisy_full:
        worse = all(mean_acc(rs) < mean_acc(noisy_full) for k, rs in groups.items() if k[:2] == (c, True)
                    and rs is not noisy_full)  # fmt: skip
        L.append(row([f"CIFAR-10, {100 * NOISE:.0f}% noisy labels: **{'every' if worse else 'not every'} other "
                      "policy does worse than full data**; full data has not memorised the noise",
                      f"full data's final training loss {last_loss(noisy_full):.2f} nats, above the "
                      f"{noise_entropy(NOISE, CLASSES[c]):.2f} the noise alone costs"]))  # fmt: skip
    sfull, snf = one(s, False, "full"), one(s, True, "full")
    if sfull and snf:
        sclean = [rs for k, rs in groups.items() if k[:2] == (s, False)]
        sn = [mean_acc(rs) - mean_acc(snf) for k, rs in groups.items() if k[:2] == (s, True) and k[2] != "full"]
        worst = max(abs(mean_acc(rs) - mean_acc(sfull)) for rs in sclean)
        sds = [sd(rs) for rs in sclean if len(rs) > 1]
        L += [
            row(["SST-2 (clean labels): **this study does not separate the policies**",
                 f"every policy within {worst:.2f} points of full data ({mean_acc(sfull):.2f}%); sd over seeds "
                 f"{min(sds):.2f}-{max(sds):.2f}"]),
            row([f"SST-2 ({100 * NOISE:.0f}% noisy labels): every pruning policy "
                 + ("**beats full data**" if min(sn) > 0 else "lands on both sides of full data")
                 + "; full data partly memorises the noise",
                 (f"by {min(sn):.2f}-{max(sn):.2f}" if min(sn) > 0 else f"{min(sn):+.2f} to {max(sn):+.2f}")
                 + f" points (full data {mean_acc(snf):.2f}%); full data's final training loss {last_loss(snf):.2f} "
                 "nats, "
                 f"below the {noise_entropy(NOISE, CLASSES[s]):.2f} the noise alone costs"]),
        ]  # fmt: skip
        if r50 := one(s, False, "random", "p50"):
            L.append(
                row(
                    [
                        "SST-2 wall time: reading and tokenising every shard dominate",
                        f"dynamic random at {pruned(r50):.0f}% pruned saves {time_saved(r50, sfull)}",
                    ]
                )
            )
    return L + [""]


def report_short_reading(layout: Layout) -> None:
    groups = group(load_results(layout.results, tuple(f"{d}-" for d in DATASETS)))
    if groups:
        splice(layout.doc, "<!-- short-findings:begin -->", "<!-- short-findings:end -->", findings(groups))
