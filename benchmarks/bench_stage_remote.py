"""The stage with its run directory on an S3 API (issue 15, item 5): what one DataLoader worker
reading 10 shards of a 15M-sample plan fetches and holds.

A synthetic ST+MJ-shaped run (5,000 samples per shard, MJSynth-like keys; benchmarks/common.py)
is planned locally (SeTa), then its run files (seta-stream.json, state.json, the plan's
summary.json, shards.arrow, stage.arrow) are uploaded to moto's S3 server on loopback, behind a
WSGI wrapper that counts the body bytes of every answer by path. Ten real tar shards of that
plan (5,000 samples each, small payloads) are written to local disk. Each variant runs as a
fresh worker process that iterates those 10 shards once:

* ``no stage``: ``wds.WebDataset(urls)`` alone (the same imports, s3fs included);
* ``stage``: ``seta_stream.attach`` (skip_shards + kept_tar_samples) with the run on S3;
* ``earlier layout``: the same, with the plan in the layout of earlier versions (keys.arrow +
  lookup.arrow, read whole by every worker), uploaded beside it (``--no-earlier`` skips it).

``--run PATH`` takes the plan of epoch 1 of an existing run instead (a partitioned run that
bench_scale.py kept: its per-bucket stage files, stage/, are uploaded; no earlier layout).

Reported: bytes of plan data fetched (server side), peak RSS (VmHWM) of the worker, its wall
time; and, in one process on the local plan, the time per sample of the decision lookup the
readers make (``ShardDecisions.known.get(key)``, keep_filter's hot loop): by uid (this version)
against by key (earlier layout), and the time to load one shard's decisions.

    python -m benchmarks bench_stage_remote --n 15000000 --repeat 3
    python -m benchmarks bench_stage_remote --n 15000000 --repeat 3 --policy eswp --no-earlier
    python -m benchmarks bench_stage_remote --run bench-out/scale-100000000 --repeat 3
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pyarrow as pa

from benchmarks.common import OUT, ROOT, Result, machine, make_table_run, st_mj_identities
from tools.results import path_label

SHARD = 5000
READ = 10


class Counter:
    """WSGI middleware: body bytes and GET count of every answer, by path."""

    def __init__(self, app) -> None:
        self.app, self.lock, self.by_path = app, threading.Lock(), {}

    def __call__(self, environ, start_response):
        body = self.app(environ, start_response)
        sent = 0
        try:
            for chunk in body:
                sent += len(chunk)
                yield chunk
        finally:
            if hasattr(body, "close"):
                body.close()
            if environ["REQUEST_METHOD"] == "GET":
                with self.lock:
                    n, b = self.by_path.get(environ.get("PATH_INFO", ""), (0, 0))
                    self.by_path[environ.get("PATH_INFO", "")] = (n + 1, b + sent)

    def take(self) -> dict[str, tuple[int, int]]:
        with self.lock:
            out, self.by_path = self.by_path, {}
        return out


@contextlib.contextmanager
def s3_server():
    import logging

    import fsspec.config
    from moto.server import DomainDispatcherApplication, create_backend_app
    from werkzeug.serving import make_server

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # no line per request

    counter = Counter(DomainDispatcherApplication(create_backend_app))
    httpd = make_server("127.0.0.1", 0, counter, True)
    endpoint = f"http://127.0.0.1:{httpd.server_address[1]}"
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    env = {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "FSSPEC_S3_ENDPOINT_URL": endpoint,  # fsspec's config from the environment (worker processes)
        "FSSPEC_S3_USE_SSL": "false",
    }
    os.environ.update(env)
    fsspec.config.conf["s3"] = {"endpoint_url": endpoint, "use_ssl": False}
    try:
        yield counter
    finally:
        httpd.shutdown()
        httpd.server_close()


POLICIES = {
    "seta": {"r": 0.3, "k": 5, "alpha": 0.6},
    "eswp": {"r": 0.3, "beta2": 0.9},  # a plan with a score column (the table's EMA has beta2 0.9)
}


def build(n: int, policy: str) -> tuple[str, str]:
    """The local run (table + plan of epoch 1) and the 10 tar shards the worker reads."""

    import seta_stream as seta

    path = OUT / f"stage-remote-{n}" if policy == "seta" else OUT / f"stage-remote-{n}-{policy}"
    make_table_run(path, n)
    run = seta.RunDir(path)
    seta.plan_epoch(run, 1, policy=policy, params=POLICIES[policy], epochs=10, seed=0)
    return str(path), read_shards()


def read_shards() -> str:
    """The 10 tar shards the worker reads (the first 10 of every synthetic run)."""
    import webdataset as wds

    shards_dir = OUT / "stage-remote-shards"
    if not (shards_dir / "done").exists():
        shutil.rmtree(shards_dir, ignore_errors=True)
        shards_dir.mkdir(parents=True)
        shard, key = st_mj_identities(READ * SHARD)
        names, keys = shard.to_pylist(), key.to_pylist()
        for s in range(READ):
            with wds.TarWriter(str(shards_dir / names[s * SHARD])) as w:
                for i in range(s * SHARD, (s + 1) * SHARD):
                    w.write({"__key__": keys[i], "txt": f"{i}", "cls": str(i % 10)})
        (shards_dir / "done").write_text("")
    return str(shards_dir)


def upload(fs, local: str, bucket: str, earlier: bool) -> dict[str, int]:
    """Copy what a worker reads to s3://bucket/NAME; returns the plan files' sizes."""
    import pyarrow.ipc as ipc
    import pyarrow.parquet as pq

    d = "plans/epoch=1"
    for rel in ("seta-stream.json", "state.json", f"{d}/summary.json"):
        fs.put_file(f"{local}/{rel}", f"{bucket}/stage/{rel}")
        if earlier:
            fs.put_file(f"{local}/{rel}", f"{bucket}/earlier/{rel}")
    if os.path.isdir(f"{local}/{d}/stage"):  # a partitioned plan: per-bucket stage files
        names = sorted(os.listdir(f"{local}/{d}/stage"))
        for name in names:
            fs.put_file(f"{local}/{d}/stage/{name}", f"{bucket}/stage/{d}/stage/{name}")
        sizes = {
            f"stage/stage/{kind}-*.arrow ({sum(n.startswith(kind) for n in names)} files)": sum(
                os.path.getsize(f"{local}/{d}/stage/{n}") for n in names if n.startswith(kind)
            )
            for kind in ("shards", "stage")
        }
        return sizes
    for rel in ("shards.arrow", "stage.arrow"):
        fs.put_file(f"{local}/{d}/{rel}", f"{bucket}/stage/{d}/{rel}")
    sizes = {f"stage/{rel}": os.path.getsize(f"{local}/{d}/{rel}") for rel in ("shards.arrow", "stage.arrow")}
    if earlier:  # keys.arrow + lookup.arrow as planning wrote them before stage.arrow
        tmp = OUT / "stage-remote-earlier"
        tmp.mkdir(exist_ok=True)
        plan = pq.read_table(f"{local}/{d}/plan.parquet", columns=["key", "keep", "weight"])
        shards = ipc.open_file(f"{local}/{d}/shards.arrow").read_all()
        files = {
            "keys.arrow": plan.select(["key"]),
            "lookup.arrow": plan.select(["keep", "weight"]),
            "shards.arrow": shards.select(["shard", "start", "stop", "n", "kept"]).replace_schema_metadata(None),
        }
        for name, table in files.items():
            with pa.OSFile(str(tmp / name), "wb") as sink, ipc.new_file(sink, table.schema) as w:
                w.write_table(table)
            fs.put_file(str(tmp / name), f"{bucket}/earlier/{d}/{name}")
            sizes[f"earlier/{name}"] = os.path.getsize(tmp / name)
        for rel in ("seta-stream.json", "state.json"):
            shutil.copy(f"{local}/{rel}", tmp / rel)
        (tmp / d).mkdir(parents=True, exist_ok=True)
        shutil.copy(f"{local}/{d}/summary.json", tmp / d / "summary.json")
        for name in files:
            os.replace(tmp / name, tmp / d / name)
    return sizes


#: One DataLoader worker's reading, in a fresh interpreter. It imports seta_stream from this checkout: the
#: path setting is the child process's own, part of what is measured, not of how the repository imports.
WORKER = """
import json, sys, time
sys.path.insert(0, {root!r})
import s3fs, webdataset as wds
import seta_stream as seta
def hwm():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
mode, run, urls = {mode!r}, {run!r}, {urls!r}
before = hwm()
t0 = time.perf_counter()
ds = wds.WebDataset(urls, shardshuffle=False, empty_check=False)
if mode != "no stage":
    ds = seta.attach(ds, run)
n = sum(1 for _ in ds)
print("RESULT" + json.dumps({{"samples": n, "wall_s": time.perf_counter() - t0, "rss_mb": hwm(),
      "rss_imports_mb": before, "counters": seta.stage_counters()}}))
"""


def worker(mode: str, run: str, urls: list[str]) -> dict:
    prog = textwrap.dedent(WORKER.format(root=str(ROOT), mode=mode, run=run, urls=urls))
    proc = subprocess.run([sys.executable, "-c", prog], capture_output=True, text=True, cwd=ROOT)
    if proc.returncode != 0:
        raise RuntimeError(f"worker failed:\n{proc.stderr[-3000:]}")
    return json.loads(next(x for x in proc.stdout.splitlines() if x.startswith("RESULT"))[len("RESULT") :])


def lookup_times(local: str, earlier: str | None, shard_names: list[str], repeat: int) -> dict[str, float]:
    """Seconds per sample of ``known.get(key)`` over the 10 shards' keys, and per shard load."""
    from seta_stream.testing import PlanView

    keys = {s: [] for s in shard_names}
    shard, key = st_mj_identities(READ * SHARD)
    for s, k in zip(shard.to_pylist(), key.to_pylist()):
        keys[s].append(k)
    runs = {"by uid (stage.arrow)": local}
    if earlier is not None:
        runs["by key (earlier layout)"] = earlier
    best: dict[str, float] = {}
    for _ in range(repeat):
        for name, run in runs.items():
            view = PlanView(run, 1)
            t_load = t_get = 0.0
            for s in shard_names:
                t0 = time.perf_counter()
                known = view.shard(s).known
                known.get("")  # loads the shard's decisions
                t1 = time.perf_counter()
                get = known.get
                for k in keys[s]:
                    get(k)
                t_get += time.perf_counter() - t1
                t_load += t1 - t0
            for label, value in ((f"{name}: get", t_get / (READ * SHARD)), (f"{name}: load", t_load / READ)):
                best[label] = min(best.get(label, float("inf")), value)
    return best


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=15_000_000)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--no-earlier", action="store_true", help="skip the earlier layout (480 MB more at 15M)")
    p.add_argument("--policy", choices=sorted(POLICIES), default="seta")
    p.add_argument("--run", help="an existing run with a plan of epoch 1 (e.g. bench-out/scale-100000000)")
    args = p.parse_args()
    import s3fs

    name = f"stage-remote-{os.path.basename(os.path.abspath(args.run))}" if args.run else f"stage-remote-{args.n}"
    res = Result(name if args.policy == "seta" or args.run else f"{name}-{args.policy}", title=__doc__.split("\n")[0])
    t0 = time.perf_counter()
    if args.run:
        local, shards_dir = os.path.abspath(args.run), read_shards()
        args.no_earlier = True
        args.n = json.load(open(f"{local}/plans/epoch=1/summary.json"))["n"]
        args.policy = json.load(open(f"{local}/plans/epoch=1/summary.json"))["policy"]
    else:
        local, shards_dir = build(args.n, args.policy)
    print(f"built in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    urls = sorted(str(os.path.join(shards_dir, f)) for f in os.listdir(shards_dir) if f.endswith(".tar"))
    shard_names = [os.path.basename(u) for u in urls]
    earlier = not args.no_earlier
    with s3_server() as counter:
        fs = s3fs.S3FileSystem()
        fs.mkdir("bench")
        sizes = upload(fs, local, "bench", earlier)
        modes = {"no stage": "s3://bench/stage", "stage": "s3://bench/stage"}
        if earlier:
            modes["earlier layout"] = "s3://bench/earlier"
        results: dict[str, list[dict]] = {m: [] for m in modes}
        for _ in range(args.repeat):
            for mode, run in modes.items():
                counter.take()
                r = worker(mode, run, urls)
                r["fetched"] = {k: v for k, v in counter.take().items() if "/plans/" in k}
                results[mode].append(r)
    times = lookup_times(local, str(OUT / "stage-remote-earlier") if earlier else None, shard_names, args.repeat)

    report(res, args, sizes, results, times, earlier)


def report(res: Result, args: argparse.Namespace, sizes: dict, results: dict, times: dict, earlier: bool) -> None:
    """Print the tables and write the result file: one row per worker (the best of its runs), the
    plan files' sizes and the decision lookup's times as generated notes."""
    title = (
        f"Stage on an object store: {args.n:,} samples, {args.policy} plan, "
        f"one worker reading {READ} shards of {SHARD:,} samples"
    )
    res.title = title
    print(f"## {title}\n({machine()})\n")
    rows, summary = [], {}
    for mode, rs in results.items():
        best = min(rs, key=lambda r: r["rss_mb"])  # plan bytes were the same in every run
        by_file = {path.split("/plans/")[1]: nb for path, nb in sorted(best["fetched"].items())}
        fetched = sum(b for _, b in by_file.values())
        gets = sum(n for n, _ in by_file.values())
        wall = min(r["wall_s"] for r in rs)
        summary[mode] = {"fetched": fetched, "gets": gets, "rss": best["rss_mb"], "wall": wall, "by_file": by_file}
        rows.append(
            {
                "worker": mode,
                "samples out": best["samples"],
                "plan bytes fetched": fetched,
                "plan GETs": gets,
                "fetched by file, bytes (GETs)": "; ".join(
                    f"{os.path.basename(f)} {b:,} ({n})" for f, (n, b) in by_file.items()
                )
                or "-",
                "peak RSS MB": best["rss_mb"],
                "RSS after imports MB": best["rss_imports_mb"],
                "wall s (best)": wall,
            }
        )
    base = summary["no stage"]
    for row in rows:
        row["peak RSS vs no stage MB"] = row["peak RSS MB"] - base["rss"]
    print("| " + " | ".join(rows[0]) + " |\n|" + " --- |" * len(rows[0]))
    for row in rows:
        cells = [
            f"{v:,.2f}" if isinstance(v, float) else f"{v:,}" if isinstance(v, int) else str(v) for v in row.values()
        ]
        print("| " + " | ".join(cells) + " |")

    stage = summary["stage"]
    plan_n = args.n  # with --run: the plan's own n (its summary.json)
    file_notes = "; ".join(f"{k} {v:,} ({v / plan_n:.3g} bytes a sample)" for k, v in sizes.items())
    notes = [f"Plan files ({plan_n:,} samples): {file_notes}."]
    stage_file = next((f for f in stage["by_file"] if os.path.basename(f).startswith("stage")), None)
    if stage_file is not None:
        n, b = stage["by_file"][stage_file]
        notes.append(
            f"stage: {n} range requests of {os.path.basename(stage_file)} for {READ} shards opened, "
            f"{b / n / 1e3:.1f} KB each ({SHARD:,} samples a shard); plan bytes fetched in all "
            f"{stage['fetched'] / 1e6:.3f} MB; target <= 1 MB: {'met' if stage['fetched'] <= 1e6 else 'not met'}"
        )
    added = stage["rss"] - base["rss"]
    notes.append(
        f"stage: peak RSS {added:+.1f} MB against the same worker without the stage (the lowest of "
        f"{args.repeat} runs each); target <= +50 MB: {'met' if added <= 50 else 'not met'}"
    )
    if earlier:
        old = summary["earlier layout"]
        notes.append(
            f"earlier layout: plan bytes fetched {old['fetched'] / 1e6:.1f} MB in {old['gets']} GETs, "
            f"peak RSS {old['rss'] - base['rss']:+.1f} MB against the worker without the stage"
        )
    per_sample = base["wall"] / max(1, results["no stage"][0]["samples"])
    lookup = []
    for k, v in times.items():
        lookup.append(f"{k} {v * 1e6:.3f} us per sample" if k.endswith("get") else f"{k} {v * 1e3:.2f} ms per shard")
    notes.append(f"Decision lookup on the local plan, one process, best of {args.repeat}: " + "; ".join(lookup) + ".")
    get_uid = times["by uid (stage.arrow): get"]
    notes.append(
        f"by uid, per sample: {get_uid * 1e6:.2f} us, {100 * get_uid / per_sample:.1f}% of the worker's "
        f"{per_sample * 1e6:.0f} us a sample without the stage (reading tar shards, no decode)"
    )
    if earlier:
        ratio = get_uid / times["by key (earlier layout): get"]
        notes.append(f"decision lookup by uid / by key (earlier layout), per sample: {ratio:.1f}x")
    for line in notes:
        print(line)
    res.write(
        baseline={
            "what": "the same worker process reading the same shards without the stage (wds.WebDataset alone)",
            "peak RSS MB": base["rss"],
            "wall s (best)": base["wall"],
        },
        rows=rows,
        peak_rss_mb=stage["rss"],
        figures={"plan file bytes": sizes, "decision lookup s": times, "worker s per sample without stage": per_sample},
        notes=notes,
        params={
            "n": args.n,
            "policy": args.policy,
            "repeat": args.repeat,
            "shards read": READ,
            "run": path_label(args.run) if args.run else None,
        },
    )


if __name__ == "__main__":
    np.seterr(all="ignore")
    main()
