"""The Ray engine on a real local Ray cluster (2 CPUs, started here, shut down after): the
same tables and plans as the local engine bit for bit, a Pruner loop delivering exactly the
plans' kept samples, and compactions whose driver or Ray worker is SIGKILLed converging."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pytest
import webdataset as wds
from conftest import write_shards

import seta_stream as seta
from seta_stream import RunDir, compact, load_plan, load_table, plan_epoch
from seta_stream.testing import LossRecorder

ray = pytest.importorskip("ray")

POLICIES = {
    "seta": dict(r=0.1, k=5, alpha=0.6),
    "infobatch": {},
    "random": dict(r=0.4),
    "eswp": dict(beta2=0.9),
}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ray")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, _temp_dir=str(tmp))
    yield
    ray.shutdown()


def record_epochs(run: RunDir, epochs: int) -> None:
    rng = np.random.default_rng(7)
    for e in range(epochs):
        for r in range(2):
            with LossRecorder(run, epoch=e, rank=r, flush_rows=53) as rec:
                ids = list(range(r, 400 + 50 * e, 2))
                loss = rng.lognormal(size=len(ids)).astype(np.float32)
                loss[::29] = np.nan
                rec.record([f"k{i:04d}" for i in ids], [f"/d/shard-{i % 11:03d}.tar" for i in ids], loss)


def sorted_rows(t: pa.Table, key: list[str]) -> pa.Table:
    t = t.set_column(t.schema.get_field_index("shard"), "shard", t.column("shard").cast(pa.string()))
    return t.sort_by([(k, "ascending") for k in key])


def same(a: pa.Table, b: pa.Table) -> bool:
    return a.column_names == b.column_names and all(
        np.array_equal(
            np.asarray(a.column(c).to_numpy(zero_copy_only=False)).view(np.uint8),
            np.asarray(b.column(c).to_numpy(zero_copy_only=False)).view(np.uint8),
        )
        if a.column(c).type in (pa.float32(), pa.float64())
        else a.column(c).equals(b.column(c))
        for c in a.column_names
    )


def test_ray_engine_gives_the_local_engine_tables_and_plans(cluster, tmp_path):
    runs = {}
    for engine in ("local", "ray"):
        run = RunDir(tmp_path / engine, create=True, settings={"buckets": 3})
        for e in range(2):
            record_epochs(run, 1) if e == 0 else None
            if e == 1:
                with LossRecorder(run, epoch=1, rank=0, flush_rows=53) as rec:
                    ids = list(range(0, 450))
                    rec.record(
                        [f"k{i:04d}" for i in ids],
                        [f"/d/shard-{i % 11:03d}.tar" for i in ids],
                        np.linspace(0.1, 3, len(ids), dtype=np.float32),
                    )
            report = compact(run, engine=engine)
            assert report.parts_folded > 0
        runs[engine] = run
    key = ["shard", "uid"]
    assert same(
        sorted_rows(load_table(runs["local"]), key).drop_columns(["last_seq"]),
        sorted_rows(load_table(runs["ray"]), key).drop_columns(["last_seq"]),
    )
    for policy, params in POLICIES.items():
        s = {
            e: plan_epoch(runs[e], 1, policy=policy, params=params, epochs=10, seed=5, force=True, engine=e)
            for e in runs
        }
        assert s["ray"] == s["local"], policy
        plans = {e: sorted_rows(load_plan(runs[e], 1), ["uid"]) for e in runs}
        assert same(plans["ray"], plans["local"]), policy
        # the tasks wrote the same plan files, byte for byte (plan parts, per-bucket stage files)
        assert plan_files(runs["ray"], 1) == plan_files(runs["local"], 1), policy


def plan_files(run: RunDir, epoch: int) -> dict[str, bytes]:
    root = run.path(f"plans/epoch={epoch}")
    return {
        os.path.relpath(os.path.join(d, f), root): open(os.path.join(d, f), "rb").read()
        for d, _, files in os.walk(root)
        for f in files
        if f != "summary.json"
    }


def test_ray_engine_refuses_a_run_directory_nodes_cannot_mount(cluster):
    run = RunDir("memory://ray-plan/run", create=True, settings={"buckets": 2})
    record_epochs(run, 1)
    needs = r"engine='ray' needs the run directory on a filesystem every node mounts \(the tasks write "
    with pytest.raises(seta.errors.InvalidInputError, match=needs + r"routing scratch .* Compact with engine='local'"):
        compact(run, engine="ray")
    assert not run.exists("table/manifest.json")
    compact(run)
    with pytest.raises(seta.errors.InvalidInputError, match=needs + r"the plan's files .* Plan with engine='local'"):
        plan_epoch(run, 1, policy="random", params=dict(r=0.4), epochs=3, engine="ray")
    assert not run.exists("plans/epoch=1")


def test_pruner_loop_on_ray_delivers_the_plans_kept_samples(cluster, tmp_path):
    urls = write_shards(tmp_path / "s", [40, 40, 40, 40, 40])
    run = str(tmp_path / "run")
    pruner = seta.Pruner(
        run,
        policy="seta",
        params=dict(r=0.2, k=3, alpha=0.5),
        epochs=3,
        seed=1,
        population=seta.list_samples(urls),
        settings={"buckets": 3},
        flush_rows=16,
        engine="ray",
    )
    assert RunDir(run).buckets == 3
    ds = seta.attach(wds.WebDataset(urls, shardshuffle=False, empty_check=False), run)
    loader = wds.WebLoader(ds.to_tuple("__key__", "__url__").batched(8), batch_size=None, num_workers=2)
    for epoch in range(3):
        summary = pruner.start_epoch(epoch)
        plan = load_plan(run, epoch).to_pydict()
        kept = {(s, k) for s, k, keep in zip(plan["shard"], plan["key"], plan["keep"]) if keep}
        got = set()
        for keys, urls_ in loader:
            got |= {(u.rsplit("/", 1)[1], k) for k, u in zip(keys, urls_)}
            pruner.record(keys, urls_, np.random.default_rng(len(got)).random(len(keys), dtype=np.float32))
        assert got == kept and len(got) == summary["kept"] and summary["n"] == 200
    pruner.close()
    assert load_table(run).num_rows == 200


def python(code: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], env={**os.environ, **env}, capture_output=True, text=True)


def test_a_ray_worker_killed_while_writing_its_buckets_plan_is_retried(cluster, tmp_path):
    """plan:bucket_written kills the Ray worker that has just written a bucket's plan files
    (once): Ray retries the task, which writes them again, and the plan equals the local one."""
    runs = {}
    for name in ("ref", "victim"):
        runs[name] = RunDir(tmp_path / name, create=True, settings={"buckets": 3})
        record_epochs(runs[name], 2)
        compact(runs[name])
    args = dict(policy="seta", params=POLICIES["seta"], epochs=4, seed=2)
    plan_epoch(runs["ref"], 1, **args)
    flag = tmp_path / "fired"
    env = {"SETA_STREAM_FAULT": "plan:bucket_written", "SETA_STREAM_FAULT_ONCE": str(flag)}
    address = ray.get_runtime_context().gcs_address
    code = (
        f"import ray; ray.init(address={address!r}, runtime_env={{'env_vars': {env!r}}}, log_to_driver=False)\n"
        f"from seta_stream import plan_epoch; plan_epoch({str(runs['victim'].path())!r}, 1, engine='ray', **{args!r})"
    )
    proc = python(code, {})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert flag.exists()
    assert plan_files(runs["victim"], 1) == plan_files(runs["ref"], 1)
    assert not [n for n in os.listdir(runs["victim"].path("plans/epoch=1")) if n.startswith(".tmp-")]


@pytest.mark.parametrize("point", ["compact:bucket_written", "compact:after_bucket"])
def test_killed_ray_worker_or_driver_converges(cluster, tmp_path, point):
    """compact:bucket_written kills the Ray worker folding the first bucket (once: the task is
    retried); compact:after_bucket kills the driver (a separate process joining this cluster)."""
    template = RunDir(tmp_path / "template", create=True, settings={"buckets": 3})
    record_epochs(template, 1)
    compact(template)
    record_epochs(template, 1)
    ref = tmp_path / "ref"
    shutil.copytree(tmp_path / "template", ref)
    compact(str(ref))
    victim = tmp_path / "victim"
    shutil.copytree(tmp_path / "template", victim)
    flag = tmp_path / "fired"
    env = {"SETA_STREAM_FAULT": point, "SETA_STREAM_FAULT_ONCE": str(flag)}
    address = ray.get_runtime_context().gcs_address
    if point == "compact:bucket_written":  # the tasks' workers get the fault through the job's runtime env
        code = (
            f"import ray; ray.init(address={address!r}, runtime_env={{'env_vars': {env!r}}}, log_to_driver=False)\n"
            f"from seta_stream import compact; compact({str(victim)!r}, engine='ray')"
        )
        proc = python(code, {})
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert flag.exists()  # a worker was killed; its task was retried and the compaction finished
    else:
        code = f"from seta_stream import compact; compact({str(victim)!r}, engine='ray', ray_address={address!r})"
        proc = python(code, env)
        assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
        before = json.loads((tmp_path / "template/table/manifest.json").read_text())
        assert json.loads((victim / "table/manifest.json").read_text()) == before
        compact(str(victim), engine="ray")
    key = ["shard", "uid"]
    assert same(
        sorted_rows(load_table(str(victim)), key).drop_columns(["last_seq"]),
        sorted_rows(load_table(str(ref)), key).drop_columns(["last_seq"]),
    )
    assert not list((victim / "table").glob(".tmp-*"))
    assert compact(str(victim), engine="ray").parts_folded == 0
