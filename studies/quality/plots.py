"""The figures of docs/quality.md (matplotlib, no display)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from studies.quality.docs import ORDER, fmt_params


def _pyplot():  # type: ignore[no-untyped-def]
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path: Path) -> None:  # type: ignore[no-untyped-def]
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    _pyplot().close(fig)


def acc_point(rs: list[dict]) -> tuple[float, float]:
    """The runs' mean test accuracy % and its sd over seeds (ddof 1; 0 for one run): a point and its error bar."""
    y = np.array([100 * r["test_acc"] for r in rs])
    return float(y.mean()), float(y.std(ddof=1)) if len(y) > 1 else 0.0


def _errorbar(ax, pts: list[tuple[float, float, float]], **style) -> None:  # type: ignore[no-untyped-def]
    """Points (x, mean, sd) with their error bars."""
    ax.errorbar([p[0] for p in pts], [p[1] for p in pts], yerr=[p[2] for p in pts], capsize=3, **style)


def plot_short(path: Path, dataset: str, noisy: bool, groups: dict, keys: list) -> None:
    """Accuracy against measured pruned % per policy, and the kept fraction per epoch."""
    fig, (a, b) = _pyplot().subplots(1, 2, figsize=(12, 4.5))
    by_policy: dict[str, list] = {}
    for k in keys:
        x = np.mean([r["pruned_backprop" if k[2] in ("es", "eswp") else "pruned"] for r in groups[k]]) * 100
        by_policy.setdefault(k[2], []).append((x, *acc_point(groups[k])))
    for policy, pts in sorted(by_policy.items(), key=lambda kv: ORDER[kv[0]]):
        _errorbar(a, sorted(pts), marker="o", label=policy)
    a.set_xlabel("measured pruned % (ES/ESWP: back-propagated)")
    a.set_ylabel("test accuracy %")
    a.set_title(f"{dataset}, {'40% noisy labels' if noisy else 'clean'}: accuracy vs pruned")
    a.grid(alpha=0.3)
    a.legend(fontsize=8)
    for k in keys:
        r = groups[k][0]
        b.plot([e["epoch"] for e in r["epochs"]], [e["kept"] / e["n"] for e in r["epochs"]], marker=".",
               label=f"{k[2]} {fmt_params(r['params'], 'defaults')}")  # fmt: skip
    b.set_xlabel("epoch")
    b.set_ylabel("kept fraction (plan)")
    b.set_title("kept fraction per epoch")
    b.grid(alpha=0.3)
    b.legend(fontsize=6, ncol=2)
    _save(fig, path)


COLORS = {"full": "black", "random": "tab:blue", "infobatch": "tab:green", "seta": "tab:red"}
DASHES = {"p30": "-", "p50": "--", "p70": ":", "p50tk": "-."}


def run_label(r: dict) -> str:
    if r["policy"] == "full":
        return f"full, {r['n_epochs']} epochs"
    return f"{r['policy']} {r['label']} ({100 * r['pruned']:.0f}% pruned)"


def _style(r: dict) -> dict:
    if r["policy"] != "full":
        return {"color": COLORS[r["policy"]], "ls": DASHES.get(r["label"], "-"), "lw": 1.2}
    if r["n_epochs"] == r["E"]:
        return {"color": "black", "ls": "-", "lw": 2.0}
    if r["n_epochs"] == 2 * r["E"]:
        return {"color": "black", "ls": "--", "lw": 2.0}
    return {"color": "grey", "ls": "-", "lw": 1.0}  # equal compute


def plot_curves(path: Path, runs: list[dict], title: str) -> None:
    """Test accuracy after every epoch against samples trained and against training wall time,
    one line per run (full data at E thick black, at 2E thick dashed; equal-compute full data grey)."""
    fig, axes = _pyplot().subplots(1, 2, figsize=(13, 5.5))
    for r in sorted(runs, key=lambda r: (ORDER[r["policy"]], r["label"])):
        ep = r["epochs"]
        for ax, xkey, scale in ((axes[0], "samples", 1e6), (axes[1], "train_seconds", 60.0)):
            ax.plot([e[xkey] / scale for e in ep], [100 * e["test_acc"] for e in ep], label=run_label(r), **_style(r))
    axes[0].set_xlabel("samples trained (millions)")
    axes[1].set_xlabel("training wall time, minutes (evaluation excluded)")
    accs = [100 * e["test_acc"] for r in runs for e in r["epochs"]]
    for ax in axes:
        ax.set_ylabel("test accuracy %")
        ax.grid(alpha=0.3)
        ax.set_ylim(max(min(accs) - 1, max(accs) - 25), max(accs) + 1)  # the late epochs, where runs differ
    axes[0].set_title(title)
    axes[1].legend(fontsize=6, ncol=2, loc="lower right")
    _save(fig, path)


Point = tuple[float, float, float]  # x, mean, sd


def plot_vs_pruned(path: Path, points: dict[str, list[Point]], equal: list[Point], full: tuple[float, float] | None,
                   title: str) -> None:  # fmt: skip
    """Test accuracy against measured pruned % per policy (mean ± sd over seeds), with full data at
    equal compute (x = 1 - n/E) and full data at E (x = 0) on the same axes."""
    fig, a = _pyplot().subplots(figsize=(8, 5))
    for policy, pts in points.items():
        style = {"color": COLORS.get(policy.split()[0], "purple"), "ls": "-" if "target" not in policy else "none"}
        _errorbar(a, sorted(pts), marker="o", label=policy, **style)
    if equal:
        _errorbar(a, sorted(equal), marker="s", color="black", ls="--", label="full data, fewer epochs (equal compute)")
    if full:
        _errorbar(a, [(0.0, *full)], marker="*", ms=12, color="black", ls="none", label="full data at E")
    a.set_xlabel("measured pruned % of the samples (equal compute: 1 - epochs / E)")
    a.set_ylabel("test accuracy %")
    a.set_title(title)
    a.grid(alpha=0.3)
    a.legend(fontsize=7)
    _save(fig, path)
