"""Do two source trees of seta_stream plan the same? Each tree plans epochs 3 and 4 of the same run
(a copy of one table ``common.make_table_run`` builds: N samples, 3 epochs recorded, 20% with a high
persistent loss) with SeTa, InfoBatch, random, ES with set-level pruning and the noise rule (in front of
SeTa and alone), each in a fresh process importing seta_stream from its tree; every plan's rows
(plan.parquet, as a table) and summary (timings aside) must be equal.

A check of behaviour, not of speed: a restructuring that moves code must leave every plan as it was.
The noise rule's cases plan its version 1 in both trees: ``noise=True`` in a tree from before the rule
had versions, ``noise=True, noise_rule=1`` in a tree that has them.

    git worktree add /tmp/prev <commit>
    python -m benchmarks ab_same_plans /tmp/prev . [--n 300000]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from benchmarks.common import OUT, make_table_run

#: (policy, params, the same params in a tree whose noise rule has versions, where they differ)
CASES = (
    ("seta", "dict(r=0.3, k=10, alpha=0.5)", None),
    ("infobatch", "dict(r=0.5)", None),
    ("random", "dict(r=0.4)", None),
    ("eswp", "dict(r=0.5, beta2=0.9)", None),
    ("seta", "dict(r=0.0, k=10, alpha=0.5, noise=True)", "dict(r=0.0, k=10, alpha=0.5, noise=True, noise_rule=1)"),
    ("full", "dict(noise=True)", "dict(noise=True, noise_rule=1)"),
)
EPOCHS = (3, 4)


def plans_of(tree: Path, src: Path, run: Path, policy: str, params: str) -> list[tuple[object, dict]]:
    """Epochs 3 and 4 of a copy of ``src`` planned by ``tree``'s seta_stream in a fresh process:
    each plan's rows and summary."""
    import pyarrow.parquet as pq

    shutil.rmtree(run, ignore_errors=True)
    shutil.copytree(src, run, ignore=shutil.ignore_patterns("plans", "state.json", "locks"))
    code = (
        "import seta_stream as S\n"
        f"for e in {EPOCHS}:\n"
        f"    S.plan_epoch(S.RunDir({str(run)!r}), e, policy={policy!r}, params={params}, epochs=8, seed=3,\n"
        "                 force=True)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(tree)}
    proc = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", code], env=env, cwd=tree, capture_output=True, text=True
    )
    if proc.returncode:
        raise SystemExit(f"{tree}: planning {policy} {params} failed:\n{proc.stderr[-2000:]}")
    out = []
    for e in EPOCHS:
        d = run / "plans" / f"epoch={e}"
        out.append((pq.read_table(d / "plan.parquet"), json.loads((d / "summary.json").read_text())))
    return out


def has_versions(tree: Path) -> bool:
    """Whether ``tree``'s noise rule has versions (``noise_rule``, docs/algorithms.md §12.12)."""
    noise = tree / "seta_stream" / "policies" / "noise.py"
    return noise.exists() and "noise_rule" in noise.read_text(encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("a", type=Path, help="source tree A (holds seta_stream/)")
    p.add_argument("b", type=Path, help="source tree B")
    p.add_argument("--n", type=int, default=300_000)
    args = p.parse_args(argv)
    base = OUT / f"same-plans-{args.n}"
    src = make_table_run(base / "src", args.n, epochs=3, noisy=0.2)
    differ = 0
    trees = {"a": args.a.resolve(), "b": args.b.resolve()}
    for i, (policy, params, versioned) in enumerate(CASES):
        chosen = {k: versioned if versioned and has_versions(t) else params for k, t in trees.items()}
        a = plans_of(trees["a"], src, base / f"a-{i}", policy, chosen["a"])
        b = plans_of(trees["b"], src, base / f"b-{i}", policy, chosen["b"])
        rows = all(ta.equals(tb) for (ta, _), (tb, _) in zip(a, b))
        keys = sorted({k for (_, sa), (_, sb) in zip(a, b) for k in set(sa) | set(sb)
                       if sa.get(k) != sb.get(k) and "time" not in k and not k.endswith("_s")})  # fmt: skip
        kept = [int(t.column("keep").to_numpy().sum()) for t, _ in b]
        differ += (not rows) or bool(keys)
        same = chosen["a"] == chosen["b"]
        print(f"{policy} {chosen['a']}{'' if same else ' (B: ' + chosen['b'] + ')'}: rows "
              f"{'identical' if rows else 'DIFFER'}, kept {kept} of {args.n:,}, summary keys differing: "
              f"{', '.join(keys) or 'none'}")  # fmt: skip
    print(f"{len(CASES) - differ} of {len(CASES)} cases plan the same in both trees")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
