"""What the two training engines share: the policy options of their command line, the run directory's
name, the epoch start without the small-final-batch warning (their loops apply its remedy), and the
comparison of the chosen policy with full data that ``main`` prints."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import sys
import warnings
from collections.abc import Callable

import torch

import seta_stream as seta

#: the training order's detshuffle stages seed by seed + epoch: the shard order of run seed s takes the
#: seeds 2000 s + e, its sample order 2000 s + 1000 + e, so no two seeds, epochs (< 1000) or stages share one
#: (seed + epoch for both would give seed 1 the orders of seed 0 shifted by one epoch, both stages one stream)
ORDER_SEED = 1000


def start_epoch(pruner: seta.Pruner, epoch: int) -> dict:
    """``pruner.start_epoch(epoch)``, less its ``small_final_batch`` warning: these loops divide every
    batch's loss by the nominal batch size, the remedy that warning names. Other warnings pass."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        summary = pruner.start_epoch(epoch)
    for w in caught:
        if getattr(w.message, "code", None) != "small_final_batch":
            warnings.warn(w.message, stacklevel=2)
    return summary


def policy_params(args: argparse.Namespace) -> dict:
    """The policy's parameters from the command line: ``--params`` JSON, else ``--r``/``--k``/... of the
    policy; ``--noise`` (and ``--noise-scale``) add the noise rule."""
    if args.params:
        params = json.loads(args.params)
    elif args.policy == "seta":
        params = dict(r=args.r, k=args.k, alpha=args.alpha, delta=args.delta)
    elif args.policy in ("random", "static", "infobatch"):
        params = dict(r=args.r)
    else:
        params = {}
    if args.noise:  # leave out the samples whose loss history says "noisy" (docs/algorithms.md §12)
        params["noise"] = True
        if args.noise_scale != "loss":
            params["noise_scale"] = args.noise_scale
    return params


def run_name(policy: str, params: dict) -> str:
    """The run directory's name: the policy, then every parameter, the noise rule's last (``True``: the
    name alone, a string: the value alone): ``random`` with ``{"r": 0.19, "noise": True, "noise_scale":
    "log1p"}`` -> ``random-r0.19-noise-log1p``. Two configurations never share a run directory."""
    parts = [policy]
    for k in sorted(params, key=lambda k: (k.startswith("noise"), k)):
        v = params[k]
        parts.append(k if v is True else f"no-{k}" if v is False else str(v) if isinstance(v, str) else f"{k}{v}")
    return "".join(c if c.isalnum() or c in "._-" else "_" for c in "-".join(parts))


def seta_stream_cli() -> str:
    """The ``seta-stream`` command installed beside this Python, as an absolute path (runs from any folder)."""
    exe = os.path.join(os.path.dirname(os.path.abspath(sys.executable)), "seta-stream")
    return exe if os.path.exists(exe) else shutil.which("seta-stream") or "seta-stream"


def parser(
    description: str, *, data: str, run_dir: str, tool: str, unit: str, batch_size: int, batch_help: str | None,
    noise_scale_help: str,
) -> argparse.ArgumentParser:  # fmt: skip
    """The engines' command line: data and run folders, the policy and its parameters, the noise rule,
    the schedule and the machine (``unit``: what a sample is, in the help texts)."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--data", default=data, help=f"folder written by {tool}")
    p.add_argument("--run-dir", default=run_dir, help="parent folder of the run directories")
    p.add_argument("--epochs", type=int, default=6)
    p.add_argument("--policy", default="seta", help="policy to compare against full data")
    p.add_argument("--r", type=float, default=0.1, help="SeTa/random/InfoBatch: r")
    p.add_argument("--k", type=int, default=5, help="SeTa: number of loss clusters")
    p.add_argument("--alpha", type=float, default=0.6, help="SeTa: window scale")
    p.add_argument("--delta", type=float, default=0.875, help="SeTa: share of pruning epochs")
    p.add_argument("--params", help="policy parameters as JSON (overrides --r/--k/...), e.g. '{\"r\": 0.5}'")
    p.add_argument(
        "--noise",
        action="store_true",
        help=f"the noise rule (full, random, seta, infobatch): leave out {unit} whose loss stays in a high mode "
        "(docs/algorithms.md §12); with --policy full it is the rule alone",
    )
    p.add_argument("--noise-scale", choices=("loss", "log1p"), default="loss", help=noise_scale_help)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--batch-size", type=int, default=batch_size, help=batch_help)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: one per CPU)")
    p.add_argument("--no-compare", action="store_true", help="skip the full-data run")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    return p


def compare(
    args: argparse.Namespace,
    run: Callable[..., dict],
    report: Callable[[list[dict]], list[str]],
    keep_keys: bool = False,
    truth: str | None = None,
) -> list[dict]:
    """Train the chosen policy, then full data (same seed and initialisation), each in its run directory
    under ``--run-dir`` with its result file ``<name>.json`` beside it; print the comparison (``report``)
    and the follow-up commands (``truth``: the known-noisy list ``seta-stream suspects`` checks against,
    where it exists). ``keep_keys``: the results also hold the (shard, key) pairs delivered every epoch."""
    torch.set_num_threads(args.threads or max(1, os.cpu_count() or 1))
    params = policy_params(args)
    run_root = os.path.abspath(args.run_dir)
    name = run_name(args.policy, params)
    results = [run(args, args.policy, params, os.path.join(run_root, name), keep_keys)]
    if not args.no_compare and name != "full":
        results.append(run(args, "full", {}, os.path.join(run_root, "full"), keep_keys))
    for r in results:
        with open(r["run_dir"] + ".json", "w") as fh:  # beside its run directory
            json.dump({k: v for k, v in r.items() if k != "delivered"}, fh, indent=1)

    print("\n" + "\n".join(report(results)))
    cli, run_dir = shlex.quote(seta_stream_cli()), results[0]["run_dir"]
    print(f"\n  inspect:  {cli} inspect {shlex.quote(run_dir)} --plot {shlex.quote(run_dir + '.png')}")
    if params.get("noise"):
        print(
            f"  suspects: {cli} suspects {shlex.quote(run_dir)} --out {shlex.quote(run_dir + '-suspects.parquet')}"
            + (f" --truth {shlex.quote(truth)}" if truth and os.path.exists(truth) else "")
        )
    return results
