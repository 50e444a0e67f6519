"""Shared helpers for the benchmarks: synthetic ST+MJ-sized run directories, and timing of a
code snippet in a fresh subprocess (wall time and peak RSS from the kernel's ru_maxrss)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "bench-out"


def write_json(path: Path, obj: dict) -> None:
    """Write a result file whole (a temp file, then a rename): a study process reading the results
    meanwhile sees either no file or the complete one, never a half-written file."""
    tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")
    tmp.write_text(json.dumps(obj, indent=1) + "\n")
    os.replace(tmp, path)


def st_mj_identities(n: int, shard_size: int = 5000) -> tuple[pa.Array, pa.Array]:
    """(shard, key) arrays shaped like ST+MJ: 5,000 samples per shard, MJSynth-like keys."""
    idx = np.arange(n)
    shard_ids = idx // shard_size
    n_shards = int(shard_ids[-1]) + 1 if n else 0
    names = pa.array([f"stmj-train-{s:06d}.tar" for s in range(n_shards)])
    shards = pa.DictionaryArray.from_arrays(pa.array(shard_ids.astype(np.int32)), names)
    keys = pa.array([f"mj/{i // 1000 % 3000:04d}/{i % 7}/{i:08d}_Word" for i in range(n)], pa.string())
    return shards.dictionary_decode(), keys


def make_table_run(path: Path, n: int, seed: int = 0) -> Path:
    """A run directory whose loss table has n rows (log-normal losses), built directly."""
    from seta_stream._runfs import RunDir
    from seta_stream._table import TABLE_SCHEMA
    from seta_stream.ids import sample_uids

    if (path / "table/manifest.json").exists():
        _add_keys_file(path)  # a run made before tables had keys files
        return path
    run = RunDir(path, create=True)
    shards, keys = st_mj_identities(n)
    rng = np.random.default_rng(seed)
    loss = rng.lognormal(size=n).astype(np.float32)
    table = pa.Table.from_pydict(
        {
            "shard": shards.dictionary_encode(),
            "key": keys,
            "uid": sample_uids(shards, keys),
            "last_loss": loss,
            "last_epoch": np.zeros(n, np.int32),
            "seen": np.ones(n, np.int32),
            "nonfinite": np.zeros(n, np.int32),
            "ema": loss.astype(np.float64),
            "last_rank": np.zeros(n, np.int32),
            "last_seq": np.arange(n, dtype=np.int64),
        },
        schema=TABLE_SCHEMA,
    )
    table = sort_by_shard(table)
    rel = "table/table-000001-bench.parquet"
    run.publish_parquet(rel, table)
    run.publish_json(
        "table/manifest.json",
        {"generation": 1, "table": rel, "rows": n, "folded": [], "quarantined": [], "n_ref": n, "format_version": 1},
    )
    _add_keys_file(path)
    return path


def sort_by_shard(table: pa.Table) -> pa.Table:
    """Rows ordered by (shard, uid), shard names in code-point order: the order of a loss table
    (docs/format.md), for tables built directly instead of by compaction."""
    shard = table.column("shard")
    if not pa.types.is_dictionary(shard.type):
        shard = shard.dictionary_encode()
    shard = shard.combine_chunks()
    names = shard.dictionary.to_pylist()
    rank = np.empty(len(names), dtype=np.int64)
    rank[np.argsort(np.array(names, dtype=object), kind="stable")] = np.arange(len(names))
    codes = rank[shard.indices.to_numpy(zero_copy_only=False)]
    perm = np.lexsort((table.column("uid").to_numpy(), codes))
    return table.take(pa.array(perm)).combine_chunks()


def _add_keys_file(path: Path) -> None:
    """Give the run's table the keys file compact() writes beside every table file."""
    from seta_stream._runfs import RunDir
    from seta_stream._table import KEYS_SCHEMA, load_table_keys

    run = RunDir(path)
    m = run.read_json("table/manifest.json")
    if load_table_keys(run, m) is not None:
        return
    rel = "table/keys-000001-bench.arrow"
    keys = run.read_parquet(m["table"], columns=["key"])
    run.publish_arrow(rel, keys.cast(KEYS_SCHEMA))
    run.publish_json("table/manifest.json", {**m, "keys": rel})


def measure(code: str, setup: str = "") -> dict:
    """Run ``setup`` then ``code`` in a fresh interpreter; wall time of ``code`` and peak RSS.

    Peak RSS is the kernel's VmHWM of the child (not ru_maxrss, which Linux carries over from
    the forking parent across exec). ``rss_before`` is the peak after ``setup``.
    """
    prog = textwrap.dedent(f"""
        import json, time, sys
        def hwm():
            for line in open("/proc/self/status"):
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
        sys.path.insert(0, {str(ROOT)!r})
        {textwrap.indent(textwrap.dedent(setup), "        ").strip()}
        before = hwm()
        t0 = time.perf_counter()
        {textwrap.indent(textwrap.dedent(code), "        ").strip()}
        wall = time.perf_counter() - t0
        peak = hwm()
        print("RESULT" + json.dumps({{"wall_s": wall, "rss_before_mb": before / 1024, "peak_rss_mb": peak / 1024}}))
    """)
    proc = subprocess.run([sys.executable, "-c", prog], capture_output=True, text=True, cwd=ROOT)
    if proc.returncode != 0:
        raise RuntimeError(f"benchmark subprocess failed:\n{proc.stderr[-3000:]}")
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT"))
    return json.loads(line[len("RESULT") :])


def tree_setup(tree: Path) -> str:
    """``measure`` setup importing seta_stream (as ``P``) from the source tree ``tree``, checked
    (the editable install would otherwise win): for A/B runs between two trees."""
    root = str(Path(tree).resolve())
    return f"""
        sys.path.insert(0, {root!r})
        import seta_stream as P
        assert P.__file__.startswith({root!r}), P.__file__
    """


def machine() -> str:
    import platform

    return f"{platform.python_version()}, {os.cpu_count()} CPUs, {time.strftime('%Y-%m-%d')}"
