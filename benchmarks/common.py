"""Shared helpers for the benchmarks: synthetic ST+MJ-sized run directories (built by the
library's own part writer and compaction), timing of a code snippet in a fresh subprocess (wall
time and peak RSS from the kernel's VmHWM), and the result file every benchmark writes
(:class:`Result`: the machine, the commit, the load, peak RSS, the baseline measured in the same
run and the command line; docs/benchmarks.md's tables are generated from these files).

How a result file names paths and judges a gap is the repository's, shared with the studies:
``tools.results``."""

from __future__ import annotations

import contextlib
import importlib.metadata
import json
import os
import resource
import shlex
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

from tools.results import argv_labels, mean_se, path_label, verdict_of, write_json

ROOT = Path(__file__).resolve().parent.parent
#: Scratch folder of the benchmarks' runs and shards (SETA_BENCH_OUT overrides it: the smoke tests
#: use a temporary one).
OUT = Path(os.environ.get("SETA_BENCH_OUT") or ROOT / "bench-out")
#: SETA_BENCH_IN_PROCESS=1: :func:`measure` runs the snippet in this interpreter instead of a
#: fresh one (the smoke tests: the same code at a tiny size, without an interpreter start per
#: step; its times and RSS mean nothing then).
IN_PROCESS_ENV = "SETA_BENCH_IN_PROCESS"
#: Records per loss part of the synthetic runs (what one flush of a LossRecorder holds at most).
PART_ROWS = 1 << 20


def st_mj_identities(n: int, shard_size: int = 5000) -> tuple[pa.Array, pa.Array]:
    """(shard, key) arrays shaped like ST+MJ: 5,000 samples per shard, MJSynth-like keys."""
    idx = np.arange(n)
    shard_ids = idx // shard_size
    n_shards = int(shard_ids[-1]) + 1 if n else 0
    names = pa.array([f"stmj-train-{s:06d}.tar" for s in range(n_shards)])
    shards = pa.DictionaryArray.from_arrays(pa.array(shard_ids.astype(np.int32)), names)
    keys = pa.array([f"mj/{i // 1000 % 3000:04d}/{i % 7}/{i:08d}_Word" for i in range(n)], pa.string())
    return shards.dictionary_decode(), keys


def st_mj_range(lo: int, hi: int, shard_size: int = 5000) -> tuple[pa.DictionaryArray, pa.Array]:
    """(shard, key) of samples lo..hi-1 as :func:`st_mj_identities` names them, the shard column
    dictionary-encoded (the shards these samples fall in)."""
    idx = np.arange(lo, hi)
    first, last = lo // shard_size, (hi - 1) // shard_size
    names = pa.array([f"stmj-train-{s:06d}.tar" for s in range(first, last + 1)])
    shards = pa.DictionaryArray.from_arrays(pa.array((idx // shard_size - first).astype(np.int32)), names)
    keys = pa.array([f"mj/{i // 1000 % 3000:04d}/{i % 7}/{i:08d}_Word" for i in range(lo, hi)], pa.string())
    return shards, keys


def write_epoch_parts(
    path: Path,
    n: int,
    epoch: int,
    *,
    seed: int = 0,
    noisy: float = 0.0,
    part_rows: int = PART_ROWS,
    start: int = 0,
) -> float:
    """Loss parts of one epoch of the ST+MJ-shaped run at ``path``: samples ``start`` .. n-1 once,
    in sample order, ``part_rows`` records a part (rank = part parity), written by the library's
    own part writer (``make_part`` + ``write_part``: what ``LossRecorder`` writes). Log-normal(0, 1) losses
    (``seed`` + ``epoch``); with ``noisy`` > 0, every sample whose index i has i mod 1000 <
    1000 ``noisy`` is a "mislabelled" one: its loss is normal(12, 1) in every epoch (the high,
    persistent mode the noise rule looks for, docs/algorithms.md §12). Returns seconds."""
    from benchmarks.seam import make_part, write_part
    from seta_stream import RunDir
    from seta_stream.ids import shard_location

    t0 = time.perf_counter()
    run = RunDir(path)
    rng = np.random.default_rng(seed + epoch)
    seq0 = 10**18 + epoch * 10**12
    for p, lo in enumerate(range(start, n, part_rows)):
        hi = min(n, lo + part_rows)
        shards, keys = st_mj_range(lo, hi)
        names = shards.dictionary.to_pylist()
        loss = rng.lognormal(size=hi - lo).astype(np.float32)
        if noisy > 0:
            bad = np.arange(lo, hi) % 1000 < round(1000 * noisy)
            loss[bad] = rng.normal(12.0, 1.0, size=int(bad.sum())).astype(np.float32)
        table = make_part(
            shards,
            keys,
            loss,
            epoch=epoch,
            rank=p % 2,
            seq0=seq0 + lo,
            locations={s: shard_location(shard_url(s)) for s in names},
        )
        write_part(run, p % 2, epoch, table)
    return time.perf_counter() - t0


def shard_url(name: str) -> str:
    """The ``__url__`` the synthetic runs' shard ``name`` is read from (recorded as its location)."""
    return f"/bench/stmj/{name}"


def make_table_run(
    path: Path, n: int, seed: int = 0, settings: dict | None = None, *, epochs: int = 1, noisy: float = 0.0
) -> Path:
    """A run directory whose loss table has n rows: ``epochs`` epochs recorded (every sample
    once an epoch, :func:`write_epoch_parts`), each compacted.

    Built by the library itself: the parts written as ``LossRecorder`` writes them, then
    ``compact()``, so the table (schema, columns, write options, keys file, manifest) is whatever
    this version's compaction writes and cannot drift from it. A run made by another version,
    whose table lacks a column of this version's schema, or with other ``epochs``/``noisy``, is
    made again."""
    from seta_stream import RunDir, compact

    recipe = {"n": n, "seed": seed, "epochs": epochs, "noisy": noisy, "settings": settings or {}}
    made = path / "bench-recipe.json"
    if made.exists() and json.loads(made.read_text()) == recipe and _current_table(path):
        return path
    shutil.rmtree(path, ignore_errors=True)
    RunDir(path, create=True, settings=settings)
    for epoch in range(epochs):
        write_epoch_parts(path, n, epoch, seed=seed, noisy=noisy)
        compact(path)
        for rel in RunDir(path).glob("losses/rank=*/epoch=*/*.parquet"):  # folded: only the table is needed
            (path / rel).unlink()
    write_json(made, recipe)
    return path


def table_files_code(run: Path) -> str:
    """Setup code (for :func:`measure`) naming the current table's files in ``files``, in bucket
    order, from the run's manifest."""
    from benchmarks.seam import imports

    return (
        "from seta_stream import RunDir\n"
        + imports("read_manifest", "table_buckets")
        + textwrap.dedent(f"""
        files = [{str(run)!r} + '/' + b.table for b in table_buckets(read_manifest(RunDir({str(run)!r})))]
    """)
    )


def _current_table(path: Path) -> bool:
    """Whether the run's table files have every column of this version's TABLE_SCHEMA."""
    import pyarrow.parquet as pq

    from benchmarks.seam import TABLE_SCHEMA, read_manifest, table_buckets
    from seta_stream import RunDir

    run = RunDir(path)
    buckets = table_buckets(read_manifest(run))
    if not buckets or any(not b.keys for b in buckets):
        return False
    return all(pq.read_schema(path / b.table).names == TABLE_SCHEMA.names for b in buckets)


def measure(code: str, setup: str = "", *, reset_peak: bool = False) -> dict:
    """Run ``setup`` then ``code`` in a fresh interpreter: the wall time of ``code``, its CPU
    time (every thread, user + system: on a machine shared with other work, the figure that
    depends least on the load) and its peak RSS. ``code`` may set ``marks``, a dict of more
    figures for the result (e.g. ``marks = {"fit_s": time.perf_counter() - t0}``: ``t0``
    is the start of ``code``).

    Peak RSS is the kernel's VmHWM of the child (not ru_maxrss, which Linux carries over from
    the forking parent across exec). ``rss_before_mb`` is the peak after ``setup``; with
    ``reset_peak`` the peak is reset after ``setup`` (writing 5 to /proc/self/clear_refs) and
    ``rss_before_mb`` is the RSS then, so ``peak_rss_mb - rss_before_mb`` is what ``code`` added.
    ``sys_s`` is the system part of the CPU time and ``minflt`` the minor page faults of ``code``
    (every thread): on this VM a fault costs several microseconds, so fresh memory is a large part
    of a short step's time.
    """
    if os.environ.get(IN_PROCESS_ENV) == "1":
        return _measure_here(code, setup)
    reset = "open('/proc/self/clear_refs', 'w').write('5')" if reset_peak else "pass"
    before_key = "VmRSS:" if reset_peak else "VmHWM:"
    prog = textwrap.dedent(f"""
        import gc, json, resource, time, sys
        def hwm(key="VmHWM:"):
            for line in open("/proc/self/status"):
                if line.startswith(key):
                    return int(line.split()[1])
        # the child imports seta_stream from this checkout: the path setting is part of what is
        # measured (the child process), not of how the repository imports
        sys.path.insert(0, {str(ROOT)!r})
        {textwrap.indent(textwrap.dedent(setup), "        ").strip()}
        gc.collect()
        {reset}
        before = hwm({before_key!r})
        r0 = resource.getrusage(resource.RUSAGE_SELF)
        t0, c0 = time.perf_counter(), time.process_time()
        {textwrap.indent(textwrap.dedent(code), "        ").strip()}
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        r1 = resource.getrusage(resource.RUSAGE_SELF)
        peak = hwm()
        out = {{"wall_s": wall, "cpu_s": cpu, "sys_s": r1.ru_stime - r0.ru_stime, "minflt": r1.ru_minflt - r0.ru_minflt,
               "rss_before_mb": before / 1024, "peak_rss_mb": peak / 1024}}
        out.update(globals().get("marks") or {{}})
        print("RESULT" + json.dumps(out))
    """)
    proc = subprocess.run([sys.executable, "-c", prog], capture_output=True, text=True, cwd=ROOT)
    if proc.returncode != 0:
        raise RuntimeError(f"benchmark subprocess failed:\n{proc.stderr[-3000:]}")
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT"))
    return json.loads(line[len("RESULT") :])


def _measure_here(code: str, setup: str) -> dict:
    """:func:`measure` in this interpreter (SETA_BENCH_IN_PROCESS=1)."""
    namespace: dict = {"__name__": "__bench__", "sys": sys, "json": json, "time": time}
    exec(textwrap.dedent(setup), namespace)
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    t0, c0 = time.perf_counter(), time.process_time()
    namespace["t0"] = t0
    exec(textwrap.dedent(code), namespace)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    peak = own_peak_rss_mb()["process_mb"]
    return {
        "wall_s": wall,
        "cpu_s": cpu,
        "sys_s": r1.ru_stime - r0.ru_stime,
        "minflt": r1.ru_minflt - r0.ru_minflt,
        "rss_before_mb": peak,
        "peak_rss_mb": peak,
        **(namespace.get("marks") or {}),
    }


def tree_setup(tree: Path) -> str:
    """``measure`` setup importing seta_stream (as ``P``) from the source tree ``tree``, checked
    (the editable install would otherwise win): for A/B runs between two trees. The ``sys.path``
    setting is the child process's own (the tree it measures), part of what is measured."""
    root = str(Path(tree).resolve())
    return f"""
        sys.path.insert(0, {root!r})
        import seta_stream as P
        assert P.__file__.startswith({root!r}), P.__file__
    """


def timed_plan_code(run: Path, args: str) -> str:
    """``measure`` code planning ``run`` with ``plan_epoch``'s arguments ``args`` (the epoch,
    then keywords): it returns with the whole plan folder published (what ``Pruner.start_epoch``
    waits for too). The setup imports seta_stream (as ``P``: :func:`tree_setup` or ``import
    seta_stream as P``)."""
    return f"P.plan_epoch(P.RunDir({str(run)!r}), {args})"


def tree_commit(tree: Path) -> str | None:
    """The commit checked out in the source tree ``tree`` (a clone or ``git worktree``), or None."""
    proc = subprocess.run(["git", "-C", str(tree), "rev-parse", "HEAD"], capture_output=True, text=True)
    return proc.stdout.strip() or None if proc.returncode == 0 else None


def tree_label(tree: str | os.PathLike) -> str:
    """A source tree of an A/B run as a result file names it: ``this checkout``, or the commit
    checked out there (``tree at 1a2b3c4d5e``; the folder is this machine's: left out)."""
    if Path(tree).resolve() == ROOT:
        return "this checkout"
    commit = tree_commit(Path(tree))
    return f"tree at {commit[:10]}" if commit else path_label(tree)


def machine() -> str:
    import platform

    return f"{platform.python_version()}, {os.cpu_count()} CPUs, {time.strftime('%Y-%m-%d')}"


# ---------------------------------------------------------------------------------- result files
#: Where result files go: docs/benchmarks/ (committed; docs/benchmarks.md's tables are generated
#: from them by report.py), or the folder SETA_BENCH_RESULTS names (the smoke tests use a
#: temporary one, so that a run at a tiny N never replaces a committed result).
RESULTS = ROOT / "docs" / "benchmarks"
RESULTS_ENV = "SETA_BENCH_RESULTS"


def results_dir() -> Path:
    return Path(os.environ.get(RESULTS_ENV) or RESULTS)


def machine_info() -> dict:
    """The machine a result was measured on: CPU model, cores, RAM, Python and the libraries
    whose speed the figures depend on."""
    import platform

    cpu = ""
    with contextlib.suppress(OSError):
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    ram_gb = None
    with contextlib.suppress(OSError):
        for line in open("/proc/meminfo"):
            if line.startswith("MemTotal:"):
                ram_gb = round(int(line.split()[1]) / 2**20, 1)
    versions = {}
    for name in ("numpy", "pyarrow", "polars", "torch", "webdataset"):
        with contextlib.suppress(Exception):
            versions[name] = importlib.metadata.version(name)
    return {
        "cpu": cpu or platform.processor(),
        "cores": os.cpu_count(),
        "ram_gb": ram_gb,
        "kernel": platform.release(),
        "python": platform.python_version(),
        **versions,
    }


def commit_info() -> dict:
    """The commit of the measured code, and the files of the package and benchmarks/ that differed
    from it (a result of uncommitted code says so)."""

    def git(*args: str) -> str:
        proc = subprocess.run(["git", *args], capture_output=True, text=True, cwd=ROOT)
        return proc.stdout if proc.returncode == 0 else ""

    changed = git("status", "--porcelain", "--", "seta_stream", "benchmarks")  # lines "XY path"
    return {
        "commit": git("rev-parse", "HEAD").strip() or None,
        "subject": git("log", "-1", "--format=%s").strip()[:100] or None,
        "uncommitted": sorted(line[3:] for line in changed.splitlines() if line[3:].endswith(".py")),
    }


def load_info() -> dict:
    """The machine's load (1, 5, 15-minute averages, as ``uptime`` prints them) and its CPUs."""
    one, five, fifteen = os.getloadavg()
    return {"loadavg": [round(one, 2), round(five, 2), round(fifteen, 2)], "cpus": os.cpu_count()}


def own_peak_rss_mb() -> dict:
    """Peak RSS of this process (VmHWM) and the largest of its waited-for children (ru_maxrss)."""
    import resource

    own = 0.0
    with contextlib.suppress(OSError):
        for line in open("/proc/self/status"):
            if line.startswith("VmHWM:"):
                own = int(line.split()[1]) / 1024
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    return {"process_mb": round(own, 1), "children_max_mb": round(children, 1)}


def command_of(script: str) -> list[str]:
    """How a result file names the script that made it: ``-m benchmarks NAME`` for a module of this wing
    (run as ``python -m benchmarks NAME`` or ``python -m benchmarks.NAME``), else the script's path
    relative to the repository where it is in it, else as given."""
    path = Path(script).resolve()
    if path.parent == Path(__file__).resolve().parent and path.suffix == ".py":
        return ["-m", "benchmarks", path.stem]
    return [str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else script]


class Result:
    """The result file of one benchmark run (``docs/benchmarks/<name>.json``): what
    docs/benchmarks.md's tables are generated from (``benchmarks/report.py``).

    Made when the script starts (the command line, machine, commit and load then), filled, and
    written once at the end with :meth:`write`::

        res = Result("plan-15000000")                  # at the start of main()
        ...                                            # measure
        res.write(
            baseline={"what": "sklearn KMeans fit, 1M samples", "wall_s": 0.74, "peak_rss_mb": 178},
            rows=[{"what": "plan_epoch", "wall_s": 2.1, "peak_rss_mb": 1260, "ratio": 0.35}, ...],
            peak_rss_mb=1260,                          # the measured code's peak (VmHWM)
            figures={"median_s": 2.1},                 # named numbers a prose sentence may quote
            notes=["Speed-up vs the baseline: 5.1x"],  # generated sentences, shown under the table
        )

    Every result names its baseline, measured in the same run (a figure compared with nothing
    measured beside it says little on a machine whose speed drifts 30%): ``baseline`` is required;
    pass a dict saying why there is none only where no baseline can exist. ``rows`` is the table
    report.py renders (one dict per row, the first row's keys are the columns). The file also
    holds ``process_rss``: the peak RSS of the script and of its largest child.
    """

    def __init__(self, name: str, *, title: str | None = None, argv: list[str] | None = None) -> None:
        if not name or "/" in name or name.startswith("."):
            raise ValueError(f"result name {name!r}: expected a file name without folders")
        self.name = name
        self.title = title
        argv = list(sys.argv if argv is None else argv)
        head = command_of(argv[0]) if argv else []
        argv = head + argv_labels(argv[1:])  # no path of this machine in a committed file
        self.started = {
            "command": " ".join(shlex.quote(a) for a in ["python", *argv]),
            "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "machine": machine_info(),
            **commit_info(),
            "load_start": load_info(),
        }
        self._t0 = time.perf_counter()

    def path(self) -> Path:
        return results_dir() / f"{self.name}.json"

    def write(
        self,
        *,
        baseline: dict,
        rows: list[dict],
        peak_rss_mb: float | None,
        figures: dict | None = None,
        notes: list[str] | None = None,
        params: dict | None = None,
    ) -> Path:
        """Write the result file (whole: a temp file, then a rename); returns its path."""
        if not isinstance(baseline, dict) or not baseline:
            raise ValueError("a result names its baseline measured in the same run (a dict), or why it has none")
        obj = {
            "name": self.name,
            "title": self.title,
            **self.started,
            "load_end": load_info(),
            "elapsed_s": round(time.perf_counter() - self._t0, 2),
            "params": params or {},
            "peak_rss_mb": None if peak_rss_mb is None else round(float(peak_rss_mb), 1),
            "process_rss": own_peak_rss_mb(),
            "baseline": baseline,
            "rows": rows,
            "figures": figures or {},
            "notes": list(notes or []),
        }
        out = self.path()
        out.parent.mkdir(parents=True, exist_ok=True)
        write_json(out, _rounded(obj))
        print(f"result: {out}", flush=True)
        return out


def _rounded(value, digits: int = 6):
    """Floats to ``digits`` significant digits (result files stay small and diff cleanly)."""
    if isinstance(value, float):
        return float(f"{value:.{digits}g}") if np.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): _rounded(v, digits) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_rounded(v, digits) for v in value]
    if isinstance(value, np.generic):
        return _rounded(value.item(), digits)
    return value


# ---------------------------------------------------------------------------------- paired ratios
def read_through(folder: Path) -> None:
    """Read every file under ``folder`` once, untimed (into the page cache, as far as it fits)."""
    for path in sorted(folder.rglob("*")):
        if path.is_file():
            with open(path, "rb") as fh:
                while fh.read(1 << 24):
                    pass


def paired(results: dict, a: str, b: str, key: str) -> list[float]:
    """Per pair (round, or round and part): ``a``'s ``key`` over ``b``'s, measured together."""
    return [x[key] / y[key] for x, y in zip(results[a], results[b])]


def fmt(m: float, se: float | None, pct: bool = False) -> str:
    if pct:
        return f"{100 * m:+.1f}%" + (f" (SE {100 * se:.1f}%)" if se is not None else "")
    return f"{m:.2f}x" + (f" (SE {se:.2f})" if se is not None else "")


def paired_ratio(results: dict, a: str, b: str, key: str, *, overhead: bool = False) -> dict:
    """``a``'s ``key`` over ``b``'s, pair by pair (minus 1 with ``overhead``: the fraction ``a``
    costs more): the mean over the pairs, its SE, the median and the number of pairs."""
    values = [x - 1 for x in paired(results, a, b, key)] if overhead else paired(results, a, b, key)
    m, se = mean_se(values)
    return {"mean": m, "se": se, "median": sorted(values)[len(values) // 2], "pairs": len(values)}


def ratio_note(text: str, fig: dict, bar: float | None, *, at_most: bool = True, pct: bool = False) -> str:
    """One generated sentence: ``text``, the paired figure (mean, SE, median of n pairs) and
    whether it meets the target (``<= bar`` with ``at_most``, else ``>= bar``; no target: None)."""
    median = f"{100 * fig['median']:+.1f}%" if pct else f"{fig['median']:.2f}x"
    out = f"{text}: {fmt(fig['mean'], fig['se'], pct)}, median {median} of {fig['pairs']} pairs"
    if bar is None:
        return out
    bar_text = f"{100 * bar:+.0f}%" if pct else f"{bar}x"
    return f"{out}; target {'<=' if at_most else '>='} {bar_text}: {_ratio_verdict(fig, bar, at_most)}"


def _ratio_verdict(fig: dict, bar: float, at_most: bool) -> str:
    se2 = None if fig["se"] is None else 2 * fig["se"]
    return verdict_of(fig["mean"], se2, bar, at_most=at_most, unit="round")
