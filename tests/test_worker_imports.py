"""A loader worker that reads a plan imports neither pandas nor polars: each costs a fresh (spawned)
worker about 0.4 s and tens of MB, and the stage has no use for them (docs/benchmarks.md, the
stage on an object store: the worker's peak RSS against the worker without the stage)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import webdataset as wds

import seta_stream as seta

WORKER = """
import json, sys
import webdataset as wds
import seta_stream as seta
urls, run, mode = json.loads(sys.argv[1])
if mode == "attach":
    ds = seta.attach(wds.WebDataset(urls, shardshuffle=False), run, epoch=1)
else:
    ds = wds.DataPipeline(wds.SimpleShardList(urls), wds.tarfile_to_samples(), seta.keep_filter(run, epoch=1))
keys = sorted(s["__key__"] for s in ds)
print(json.dumps({"keys": keys, "pandas": "pandas" in sys.modules, "polars": "polars" in sys.modules}))
"""


def test_a_worker_reading_a_plan_imports_neither_pandas_nor_polars(tmp_path: Path) -> None:
    urls = []
    for s in range(2):
        url = str(tmp_path / f"s-{s}.tar")
        with wds.TarWriter(url) as w:
            for i in range(40):
                w.write({"__key__": f"k{s}_{i:03d}", "cls": b"1"})
        urls.append(url)
    run = str(tmp_path / "run")
    p = seta.Pruner(run, policy="infobatch", params={"r": 0.5}, epochs=3, seed=0, population=seta.list_samples(urls))
    p.start_epoch(0)
    for s, url in enumerate(urls):
        p.record([f"k{s}_{i:03d}" for i in range(40)], [url] * 40, np.linspace(0, 1, 40, dtype=np.float32))
    p.start_epoch(1)
    p.close()
    plan = seta.load_plan(run, 1, columns=["key", "keep"])
    expected = sorted(k for k, keep in zip(plan.column("key").to_pylist(), plan.column("keep").to_pylist()) if keep)
    assert 40 < len(expected) < 80  # InfoBatch dropped some of the below-mean samples
    for mode in ("attach", "keep_filter"):
        out = subprocess.run([sys.executable, "-c", WORKER, json.dumps([urls, run, mode])], check=True,
                             capture_output=True, text=True).stdout  # fmt: skip
        got = json.loads(out.strip().splitlines()[-1])
        assert got == {"keys": expected, "pandas": False, "polars": False}, mode


READER = """
import json, sys
from seta_stream._reading.stages import keep_filter
import webdataset as wds
urls, run = json.loads(sys.argv[1])
ds = wds.DataPipeline(wds.SimpleShardList(urls), wds.tarfile_to_samples(), keep_filter(run))
keys = sorted(s["__key__"] for s in ds)
planning = ("seta_stream.policies", "seta_stream._planning", "seta_stream._losses", "seta_stream._session")
print(json.dumps({"keys": keys, "planning": sorted(m for m in sys.modules if m.startswith(planning))}))
"""


def test_the_reading_side_imports_no_policy_and_nothing_of_planning_or_recording(tmp_path: Path) -> None:
    """A worker that imports the stages (as unpickling them does) and reads a plan imports no
    policy, nothing of planning and nothing of recording or compaction: the package imports
    those on first use of one of their names, and ``_reading`` imports none of them."""
    url = str(tmp_path / "s-0.tar")
    with wds.TarWriter(url) as w:
        for i in range(20):
            w.write({"__key__": f"k{i:03d}", "cls": b"1"})
    run = str(tmp_path / "run")
    p = seta.Pruner(run, policy="random", params={"r": 0.5}, epochs=2, seed=0, population=seta.list_samples([url]))
    p.start_epoch(0)
    p.close()
    plan = seta.load_plan(run, 0, columns=["key", "keep"])
    expected = sorted(k for k, keep in zip(plan.column("key").to_pylist(), plan.column("keep").to_pylist()) if keep)
    assert 0 < len(expected) < 20
    out = subprocess.run([sys.executable, "-c", READER, json.dumps([[url], run])], check=True,
                         capture_output=True, text=True).stdout  # fmt: skip
    assert json.loads(out.strip().splitlines()[-1]) == {"keys": expected, "planning": []}
