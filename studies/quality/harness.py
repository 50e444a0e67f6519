"""The one runner of every study: a plan of jobs, shared by any number of processes.

A study module gives ``plan(ctx) -> [Job]`` (every job of the study in priority order, a run id
once) and ``run(ctx, job, progress) -> dict`` (one job's result). The runner:

* **claims**: a process takes the next job ``pick`` allows under an exclusive ``flock`` held while
  the job runs (the kernel drops it when the process dies), reading the plan under a lock of its
  own, so no job runs twice and a killed study leaves no claim behind;
* **resume**: a job whose result file ``<results>/<rid>.json`` exists is done; a rerun of the same
  command skips it. A crash leaves ``<rid>.crashed.json``, a run stopped at the deadline
  ``<rid>.cut.json``: neither is a result, the report lists both, a later invocation runs them again;
* **whole-file writes** (``tools.results.write_json``: a temp file, then a rename), each result
  with the machine it ran on (``machine``);
* **deadline** (``ctx.until``): no job starts that is not expected to end by then (seconds per
  trained sample measured by this invocation's files, the study's priors before), and a running
  one is stopped there (SIGALRM); ``ctx.last_start``: no job starts after it, a running one ends;
* **order**: a job waiting for its needs (a calibration, full data of seed 0) keeps the processes
  it will want: a lower job starts only if enough processes are expected free when it is ready.
"""

from __future__ import annotations

import fcntl
import functools
import json
import os
import re
import signal
import subprocess
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import numpy as np

from studies.quality.layout import ROOT, child_env, python_m
from tools.results import label_paths, write_json


@dataclass(frozen=True)
class Job:
    """One unit of work: a training run (``kind`` names its rate: ``pairs``, ``cifar10``, ``sst2``), a
    calibration (``cal``), or a run whose setting a calibration has not decided yet (``pending``:
    never claimed; ``spec["wildcard"]``: it stands for runs not known yet, which ``--only`` may select)."""

    rid: str
    kind: str
    spec: dict = field(default_factory=dict, hash=False, compare=False)
    needs: tuple[str, ...] = ()  # result file stems that must exist before it can run
    samples: float = 0.0  # expected trained samples (the deadline's estimate)


@dataclass
class Ctx:
    """One invocation of a study: where things are, what to run, until when; ``args``: the study's own options."""

    results: Path
    out: Path
    label_data: Path = ROOT.parent / "shared" / "data"
    epochs: int = 0
    seeds: int = 2
    labels: bool = True
    only: str | None = None
    procs: int = 1  # processes taking jobs (--jobs)
    until: float | None = None  # wall-clock time after which nothing runs (--deadline)
    last_start: float | None = None  # wall-clock time after which no job starts; a running one ends
    started: float = field(default_factory=time.time)
    smoke: bool = False
    data: dict = field(default_factory=dict)
    args: Any = None

    @property
    def claims(self) -> Path:
        return self.out / "claims"

    @property
    def runs(self) -> Path:
        return self.out / "runs"


class CutShort(Exception):
    """Raised in a run when the invocation's deadline passes."""


def machine() -> dict:
    """The machine a result ran on: CPU, SIMD level, package versions, cores, torch threads."""
    import torch

    from studies.quality.machine import software

    return {**software(), "cores": os.cpu_count(), "torch_threads": torch.get_num_threads()}


def claim(path: Path, wait: bool) -> IO[str] | None:
    """An open file holding an exclusive ``flock`` on ``path`` (closing it releases the lock), or
    None when another process holds it and ``wait`` is false."""
    path.parent.mkdir(parents=True, exist_ok=True)
    f = open(path, "a")  # noqa: SIM115 - the caller holds it open for as long as the claim lasts
    try:
        fcntl.flock(f, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
    except BlockingIOError:
        f.close()
        return None
    return f


def busy(path: Path) -> bool:
    """Whether another process holds the claim at ``path`` now."""
    if not path.exists():
        return False
    held = claim(path, wait=False)
    if held is not None:
        held.close()
    return held is None


def done(ctx: Ctx, stem: str) -> bool:
    return (ctx.results / f"{stem}.json").exists()


def load(ctx: Ctx, stem: str) -> dict | None:
    return json.loads((ctx.results / f"{stem}.json").read_text()) if done(ctx, stem) else None


def failed_here(ctx: Ctx, rid: str) -> bool:
    """A crash of this invocation (any process; the file names the invocation's start): not tried
    again until the next invocation."""
    p = ctx.results / f"{rid}.crashed.json"
    return p.exists() and json.loads(p.read_text()).get("invocation") == ctx.started


@functools.cache
def _rate_of(path: Path, mtime_ns: int) -> tuple[str, float | None]:
    """(kind of run, seconds per trained sample) of the result file at ``path`` as of ``mtime_ns``
    (read once), or ("cal", seconds) of a calibration; None where the file does not tell."""
    r = json.loads(path.read_text())
    if "-cal-" in path.name:
        return "cal", r.get("seconds")
    trained = sum(row.get("trained", row.get("streamed", 0)) for row in r.get("rows") or r.get("epochs") or [])
    kind = "pairs" if str(r.get("study", "")).endswith("pairs") else str(r.get("dataset"))
    return kind, r["seconds"] / trained if trained and "seconds" in r else None


def rates(ctx: Ctx, prior: dict[str, float]) -> dict[str, float]:
    """Seconds per trained sample of each kind of run and seconds per calibration (``cal``): the
    median over the files this invocation wrote; ``prior`` where none."""
    got: dict[str, list[float]] = {}
    for p in ctx.results.glob("*.json"):
        stem = p.name[: -len(".json")]
        if not (re.search(r"-s\d+$", stem) or "-cal-" in stem) or stem.endswith((".cut", ".crashed")):
            continue
        try:
            st = p.stat()
            if st.st_mtime < ctx.started:
                continue
            kind, rate = _rate_of(p, st.st_mtime_ns)
        except (OSError, ValueError, KeyError):
            continue
        if rate is not None:
            got.setdefault(kind, []).append(float(rate))
    return {k: float(np.median(got[k])) if got.get(k) else v for k, v in prior.items()}


def estimate(job: Job, rate: dict[str, float]) -> float:
    """Expected seconds of ``job`` at the ``rates``."""
    return rate["cal"] if job.kind == "cal" else job.samples * rate.get(job.kind, 1e-3)


def todo(ctx: Ctx, jobs: list[Job]) -> list[Job]:
    """The jobs without a result, in priority order: runnable ones and pending ones; with
    ``ctx.only``, the matching runs and what they need (calibrations, full data of seed 0), recursively."""
    if ctx.only:
        by_rid = {j.rid: j for j in jobs}
        selected = [j for j in jobs if j.kind != "cal" and (j.spec.get("wildcard") or re.search(ctx.only, j.rid))]
        wanted, stack = {j.rid for j in selected}, [n for j in selected for n in j.needs]
        while stack:
            n = stack.pop()
            if n in by_rid and n not in wanted:
                wanted.add(n)
                stack += list(by_rid[n].needs)
        jobs = [j for j in jobs if j.rid in wanted]
    return [j for j in jobs if j.kind == "pending" or not (done(ctx, j.rid) or failed_here(ctx, j.rid))]


def execute(ctx: Ctx, job: Job, run: Any) -> None:
    """Run ``job`` (``run(ctx, job, progress)``) and write its file: the result, ``.crashed.json`` or ``.cut.json``."""
    progress: list[str] = []
    t0 = time.perf_counter()
    print(f"== {job.rid}  ({time.strftime('%H:%M:%S')})", flush=True)
    if ctx.until is not None:
        signal.alarm(max(1, int(ctx.until - time.time())))
    try:
        result = run(ctx, job, progress)
    except Exception as exc:
        cut = isinstance(exc, CutShort)
        info: dict[str, Any] = {"id": job.rid, "status": "cut_short" if cut else "crashed"}
        if not cut:  # the invocation: not tried again until the next one (``failed_here``)
            print(tb := traceback.format_exc(), flush=True)
            info.update(invocation=ctx.started, error=label_paths(tb[-3000:]))  # no folder of this machine
        info.update(spec=job.spec, epochs_done=len(progress), seconds=round(time.perf_counter() - t0, 1))
        info.update(machine=machine(), **({"progress": progress} if cut else {}))
        write_json(ctx.results / f"{job.rid}.{'cut' if cut else 'crashed'}.json", info)
        what = "CUT SHORT at the deadline" if cut else "CRASHED"
        print(f"   -> {what}: {job.rid} after {len(progress)} epochs", flush=True)
        return
    finally:
        signal.alarm(0)
    result.setdefault("machine", machine())
    write_json(ctx.results / f"{job.rid}.json", result)
    print(f"   -> {job.rid} done in {time.perf_counter() - t0:.0f}s", flush=True)


def unfinished(results: Path) -> list[str]:
    """The ``.crashed.json`` and ``.cut.json`` files of ``results`` whose run has no result file, as a report
    lists them: "`<id>`: crashed after k epochs (the error's last line); no result" or "... cut short at the
    deadline after k epochs; no result" (name order)."""
    out = []
    for p in sorted(results.glob("*.json")) if results.exists() else []:
        stem, _, what = p.name[: -len(".json")].rpartition(".")
        if what not in ("crashed", "cut") or (results / f"{stem}.json").exists():
            continue
        c = json.loads(p.read_text())
        k = int(c.get("epochs_done", 0))
        epochs = f"{k} epoch" + ("" if k == 1 else "s")
        if what == "cut":
            out.append(f"`{stem}`: cut short at the deadline after {epochs}; no result")
            continue
        lines = [x for x in str(c.get("error", "")).strip().splitlines() if x.strip()]
        last = lines[-1].strip().replace("|", "/").replace("`", "'")[:160] if lines else "no message"
        out.append(f"`{stem}`: crashed after {epochs} ({last}); no result")
    return out


def on_alarm(signum: int, frame: Any) -> None:
    raise CutShort()


def _training_ends(ctx: Ctx, job: Job, now: float, rate: dict[str, float]) -> float:
    """When ``job``, being trained, is expected to end: its start (now if unknown) + its estimate, not before now."""
    try:
        started = float((ctx.claims / f"{job.rid}.started").read_text())
    except (OSError, ValueError):
        started = now
    return max(now, started + estimate(job, rate))


def unblock_times(ctx: Ctx, left: list[Job], now: float, rate: dict[str, float]) -> dict[str, float | None]:
    """For every job of ``left``: when it is expected to be able to start (its needs done), from the
    estimated finish of each need (one being trained: its start + its estimate; one waiting:
    recursively); None when a need is neither done nor left to run."""
    by_rid = {j.rid: j for j in left}
    memo: dict[str, float | None] = {}

    def finish(rid: str) -> float | None:
        if done(ctx, rid):
            return now
        j = by_rid.get(rid)
        if j is None:
            return None
        if busy(ctx.claims / f"{rid}.lock"):
            return _training_ends(ctx, j, now, rate)
        start = ready_at(j)
        return None if start is None else start + estimate(j, rate)

    def ready_at(j: Job) -> float | None:
        if j.rid not in memo:
            memo[j.rid] = now  # guards the recursion
            times = [finish(n) for n in j.needs]
            memo[j.rid] = None if any(t is None for t in times) else max([now, *times])
        return memo[j.rid]

    return {j.rid: ready_at(j) for j in left}


def pick(ctx: Ctx, left: list[Job], now: float, prior: dict[str, float]) -> list[Job]:
    """The jobs a free process may start now, in priority order: needs done, nobody trains it,
    expected to end before the deadline, and, for each time t at which more important waiting jobs
    are expected to become ready, either ending by t or leaving enough other processes free by t."""
    rate = rates(ctx, prior)
    times = unblock_times(ctx, left, now, rate)
    taken = {j.rid for j in left if j.kind != "pending" and busy(ctx.claims / f"{j.rid}.lock")}
    ends = [_training_ends(ctx, j, now, rate) for j in left if j.rid in taken]
    idle = max(0, ctx.procs - 1 - len(ends))
    out: list[Job] = []
    waiting: list[float] = []
    for j in left:
        if j.kind == "pending" or not all(done(ctx, n) for n in j.needs):
            if times[j.rid] is not None:
                waiting.append(times[j.rid])
            continue
        if j.rid in taken:
            continue
        end = now + estimate(j, rate)
        if ctx.until is not None and end > ctx.until:
            continue  # it would not finish: left for another invocation
        free = lambda t: idle + sum(e <= t for e in ends)  # noqa: E731
        if all(end <= t or free(t) >= min(ctx.procs - 1, sum(w <= t for w in waiting)) for t in set(waiting)):
            out.append(j)
    return out


def worker(ctx: Ctx, study: Any) -> list[str]:
    """Take the next unclaimed job ``pick`` allows until none is left (or the deadline); returns the
    ids of the jobs this process ran, in order (crashed and cut ones included)."""
    import torch

    torch.set_num_threads(getattr(ctx.args, "threads", 1) or 1)
    signal.signal(signal.SIGALRM, on_alarm)
    ctx.results.mkdir(parents=True, exist_ok=True)
    ran: list[str] = []
    while True:
        if any(t is not None and time.time() >= t for t in (ctx.until, ctx.last_start)):
            return ran
        with claim(ctx.claims / "plan.lock", wait=True):
            left = todo(ctx, study.plan(ctx))
            held, job = None, None
            for j in pick(ctx, left, time.time(), study.PRIOR_RATE):
                if (held := claim(ctx.claims / f"{j.rid}.lock", wait=False)) is not None:
                    job = j
                    (ctx.claims / f"{j.rid}.started").write_text(repr(time.time()))
                    break
            # nothing to take now: wait while others train runs that may unlock more
            others = job is None and any(busy(ctx.claims / f"{j.rid}.lock") for j in left if j.kind != "pending")
        if held is None or job is None:
            if others:
                time.sleep(2.0)
                continue
            return ran
        with held:
            if not done(ctx, job.rid):  # another process may have finished it meanwhile
                execute(ctx, job, study.run)
                ran.append(job.rid)


def launch(ctx: Ctx, study: Any, argv: list[str], jobs: int) -> list[str] | None:
    """Run the study: this process alone (``jobs`` <= 1), or ``jobs`` worker processes of the same
    command (``argv``, the study's own arguments) sharing the plan."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    ctx.results.mkdir(parents=True, exist_ok=True)
    study.prepare(ctx, jobs)
    if jobs <= 1:
        return worker(ctx, study)
    rest = [a for i, a in enumerate(argv) if a != "--jobs" and not (i and argv[i - 1] == "--jobs")]
    rest = [a for a in rest if not a.startswith("--jobs=")]
    cmd = python_m("studies.quality", *rest, "--worker", "--started", repr(ctx.started), "--procs", ctx.procs,
                   *(["--until", repr(ctx.until)] if ctx.until else []))  # fmt: skip
    procs = [subprocess.Popen(cmd, env=child_env()) for _ in range(jobs)]
    try:
        for p in procs:
            p.wait()
    except KeyboardInterrupt:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGINT)
        raise


def context(args: Any, results: Path, out: Path, **kw: Any) -> Ctx:
    """The invocation's context from the command line's common options (``--only``, ``--jobs``,
    ``--deadline`` and the workers' ``--started``/``--procs``/``--until``)."""
    ctx = Ctx(results=results, out=out, only=args.only, smoke=args.smoke, args=args, **kw)
    ctx.procs = args.procs or max(1, args.jobs)
    ctx.started = args.started or ctx.started
    ctx.until = args.until or (ctx.started + args.deadline if args.deadline else None)
    return ctx


_DATASETS: dict[str, Any] = {}


def dataset(ctx: Ctx, name: str) -> tuple[Any, Any]:
    """The data set ``name`` (prepared once per process; smoke: one shard, 3 epochs) and its population."""
    if name not in _DATASETS:
        from seta_stream import list_samples
        from studies.quality.data import DATASETS

        ds = DATASETS[name](ctx.label_data, ctx.out)
        with claim(ctx.out / "claims" / "prepare.lock", wait=True):
            ds.prepare()  # once, if several processes start together
        if ctx.smoke:
            ds.train, ds.epochs = ds.train[:1], 3
        if ctx.args is not None and getattr(ctx.args, "workers", 0):
            ds.workers = ctx.args.workers
        _DATASETS[name] = (ds, list_samples(ds.train))
    return _DATASETS[name]
