"""`seta-stream` command line: thin wrappers that parse arguments and call library functions.

seta-stream compact RUN_DIR [--skip-corrupt] [--wait S] [--json]
seta-stream plan RUN_DIR --epoch E [--policy seta --epochs N --seed S -p k=5 -p alpha=0.9]
seta-stream policies [--json]
seta-stream inspect RUN_DIR [--epoch E] [--plot out.png] [--json]
seta-stream suspects RUN_DIR [--epoch E] [--out FILE.parquet] [--truth FILE.parquet] [--no-history] [--json]
seta-stream index SHARD.tar... [--index-dir DIR] [--force]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from typing import Any

from .errors import SetaStreamError

__all__ = ["main"]


def _parse_value(text: str) -> Any:
    low = text.lower()
    if low in ("none", "null"):
        return None
    if low in ("true", "false"):
        return low == "true"
    for conv in (int, float):
        try:
            return conv(text)
        except ValueError:
            pass
    return text


def _parse_params(items: list[str]) -> dict[str, Any]:
    params: dict[str, Any] = {}
    for item in items:
        if "=" not in item:
            raise SetaStreamError(f"-p {item!r}: expected NAME=VALUE, e.g. -p k=5")
        name, value = item.split("=", 1)
        params[name.strip()] = _parse_value(value.strip())
    return params


def _policies_text() -> str:
    from .policies import describe_policies

    lines = []
    for entry in describe_policies():
        lines.append(f"{entry['name']}: {entry['description']}")
        for p in entry["params"]:
            lines.append(f"    {p['name']} = {p['default']!r}")
    return "\n".join(lines)


def _engine_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--engine",
        choices=("local", "ray"),
        default="local",
        help="where a partitioned run's buckets are processed: this process, or Ray tasks (pip install "
        "'seta-stream[ray]'; the run directory must be on storage every node mounts)",
    )
    p.add_argument("--ray-address", help="the Ray cluster to join, as ray.init takes it ('auto', 'ray://head:10001')")


def _cmd_compact(args: argparse.Namespace) -> dict[str, Any]:
    from ._losses.compaction import compact
    from ._store.runfs import RunDir

    report = compact(
        RunDir(args.run_dir),
        on_corrupt="skip" if args.skip_corrupt else "raise",
        progress=not args.json,
        lock_wait=args.wait,
        engine=args.engine,
        ray_address=args.ray_address,
    )
    out = dataclasses.asdict(report) if dataclasses.is_dataclass(report) else dict(report)
    if not args.json:
        print(
            f"folded {out.get('parts_folded')} part(s), {out.get('rows_folded')} record(s); table: "
            f"{out.get('samples_total')} samples ({out.get('new_samples')} new), generation "
            f"{out.get('generation')}" + (f"; quarantined {len(out['quarantined'])}" if out.get("quarantined") else "")
        )
    return out


def _cmd_plan(args: argparse.Namespace) -> dict[str, Any]:
    from ._planning.transaction import plan_epoch
    from ._store.runfs import RunDir

    params = _parse_params(args.param) if args.param else None
    summary = plan_epoch(
        RunDir(args.run_dir),
        args.epoch,
        policy=args.policy,
        params=params,
        epochs=args.epochs,
        seed=args.seed,
        force=args.force,
        engine=args.engine,
        ray_address=args.ray_address,
    )
    if not args.json:
        print(
            f"epoch {args.epoch} ({summary.get('policy')}, {summary.get('phase')}): keep "
            f"{summary.get('kept')}/{summary.get('n')}, pruned "
            f"{100 * float(summary.get('pruned_fraction') or 0):.1f}%, pruned so far "
            f"{100 * float(summary.get('pruned_so_far') or 0):.1f}%"
        )
    return summary


def _cmd_policies(args: argparse.Namespace) -> Any:
    from .policies import describe_policies

    if not args.json:
        print(_policies_text())
    return describe_policies()


def _cmd_inspect(args: argparse.Namespace) -> dict[str, Any]:
    from .inspect import format_summary, plot_epoch, run_summary

    summary = run_summary(args.run_dir, args.epoch)
    if args.plot:
        plot_epoch(args.run_dir, args.plot, args.epoch)
        summary["plot"] = args.plot
    if not args.json:
        print(format_summary(summary))
        if args.plot:
            print(f"plot written to {args.plot}")
    return summary


def _cmd_suspects(args: argparse.Namespace) -> dict[str, Any]:
    from .inspect import format_suspects, suspect_report

    # without --out nothing is written: the report is printed (the run directory is only read)
    report = suspect_report(args.run_dir, args.epoch, out=args.out, truth=args.truth, history=not args.no_history)
    if not args.json:
        print(format_suspects(report))
    return report


def _cmd_index(args: argparse.Namespace) -> list[dict[str, Any]]:
    import time

    from ._reading.shardindex import index_shard

    out = []
    for shard in args.shards:
        t0 = time.perf_counter()
        path = index_shard(shard, args.index_dir, force=args.force)
        out.append({"shard": shard, "index": path, "seconds": round(time.perf_counter() - t0, 4)})
        if not args.json:
            print(f"{shard}: {path} ({out[-1]['seconds']:.3f}s)")
    return out


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="seta-stream",
        description="Loss-guided data pruning for WebDataset shards: compact recorded losses, "
        "plan epochs, inspect plans.",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("compact", help="fold new loss parts into the loss table")
    p.add_argument("run_dir", help="run directory (path or fsspec URL)")
    p.add_argument(
        "--skip-corrupt", action="store_true", help="move unreadable parts to losses-quarantine/ and continue"
    )
    p.add_argument(
        "--wait",
        type=float,
        default=0.0,
        help="seconds to wait for another compaction to finish (default: fail at once)",
    )
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    _engine_arguments(p)
    p.set_defaults(fn=_cmd_compact)

    p = sub.add_parser(
        "plan",
        help="plan an epoch with a policy",
        description="Plan an epoch. Policies and their parameters:\n\n" + _policies_text_safe(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("run_dir")
    p.add_argument("--epoch", type=int, required=True, help="0-based epoch to plan")
    p.add_argument("--policy", help="policy name (first plan of a run; later taken from state.json)")
    p.add_argument("--epochs", type=int, help="total epochs of the run (first plan of a run)")
    p.add_argument("--seed", type=int, help="run seed (first plan of a run)")
    p.add_argument(
        "-p",
        "--param",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="policy parameter, repeatable: -p r=0.1 -p k=5",
    )
    p.add_argument(
        "--force", action="store_true", help="re-plan even if the plan exists or the settings differ from state.json"
    )
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    _engine_arguments(p)
    p.set_defaults(fn=_cmd_plan)

    p = sub.add_parser("policies", help="list policies with their parameters and defaults")
    p.add_argument("--json", action="store_true")
    p.set_defaults(fn=_cmd_policies)

    p = sub.add_parser("inspect", help="summarise a run (kept/pruned per epoch, clusters, shards)")
    p.add_argument("run_dir")
    p.add_argument("--epoch", type=int, help="epoch to detail (default: last planned)")
    p.add_argument("--plot", metavar="PNG", help="write the loss histogram with clusters and window")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.set_defaults(fn=_cmd_inspect)

    p = sub.add_parser(
        "suspects",
        help="report the samples the plans held as suspected noise over the whole run",
        description="Report, over every plan of the run (policies with noise=True), where the noise rule was "
        "active (epoch, Ashman's D, upper weight, threshold, counts) and every sample a plan left out as "
        "suspected noise or kept to re-check it, in which epochs; with --truth, precision and recall per plan "
        "and over the run against a list of known-noisy samples. With --out, write the suspects with their "
        "epochs, loss statistics and per-epoch losses as Parquet: join them on (shard, key) with your "
        "captions or URLs to clean the data set. Without --out nothing is written.",
    )
    p.add_argument("run_dir")
    p.add_argument("--epoch", type=int, help="report the plan of this epoch alone (default: every planned epoch)")
    p.add_argument("--out", metavar="FILE.parquet", help="write the suspects here (default: print only, write nothing)")
    p.add_argument(
        "--truth",
        metavar="FILE.parquet",
        help="Parquet with shard and key columns of known-noisy samples (make_pair_shards.py's noise.parquet): "
        "print precision and recall",
    )
    p.add_argument(
        "--no-history", action="store_true", help="leave out the per-epoch losses (they take a pass over the parts)"
    )
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(fn=_cmd_suspects)

    p = sub.add_parser("index", help="write byte-offset indexes of tar shards (for kept-only reading)")
    p.add_argument("shards", nargs="+", help="uncompressed .tar shards (paths or fsspec URLs)")
    p.add_argument("--index-dir", help="write the indexes here instead of next to the shards")
    p.add_argument("--force", action="store_true", help="rebuild even if an index is up to date")
    p.add_argument("--json", action="store_true")
    p.set_defaults(fn=_cmd_index)
    return parser


def _policies_text_safe() -> str:
    try:
        return _policies_text()
    except Exception:  # the parser must build even if a policy module fails to import
        return "(run `seta-stream policies`)"


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        result = args.fn(args)
    except (SetaStreamError, OSError) as exc:
        # one line, no traceback: every error the library raises on purpose says what to fix
        text = " ".join(str(exc).split()) or type(exc).__name__
        print(f"seta-stream {args.command}: error: {text}", file=sys.stderr)
        return 2
    if getattr(args, "json", False):
        print(json.dumps(result, indent=1, sort_keys=True, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
