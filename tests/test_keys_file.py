"""The loss table's keys file (table/keys-*.arrow), which planning reads the plan's keys from."""

from __future__ import annotations

import json
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from seta_stream import RunDir, compact, load_plan, plan_epoch
from seta_stream._store.table import KEYS_SCHEMA, load_table_keys
from seta_stream.testing import LossRecorder

SETA = dict(policy="seta", params=dict(r=0.2, k=4, alpha=0.5), epochs=10, seed=1)


def record(run, epoch, keys, shards=3):
    rng = np.random.default_rng(epoch)
    with LossRecorder(run, epoch=epoch) as rec:
        urls = [f"/d/shard-{int(k[1:]) % shards}.tar" for k in keys]
        rec.record(keys, urls, rng.lognormal(size=len(keys)).astype(np.float32))


def manifest(path):
    return json.loads((path / "table/manifest.json").read_text())


def table_keys_in_file(path, m):
    return pa.ipc.open_file(pa.memory_map(str(path / m["keys"]))).read_all()


def test_compaction_writes_the_keys_file_row_aligned_with_the_table(tmp_path):
    run = RunDir(tmp_path / "r", create=True)
    record(run, 0, [f"k{i:03d}" for i in range(50)])
    compact(run)
    m1 = manifest(tmp_path / "r")
    assert m1["keys"].startswith("table/keys-000001-") and m1["keys"].endswith(".arrow")
    assert m1["previous_keys"] is None
    keys = table_keys_in_file(tmp_path / "r", m1)
    assert keys.schema == KEYS_SCHEMA
    assert keys.column("key").to_pylist() == pq.read_table(tmp_path / "r" / m1["table"]).column("key").to_pylist()

    # the same samples again: a new table file, the same keys file
    record(run, 1, [f"k{i:03d}" for i in range(50)])
    compact(run)
    m2 = manifest(tmp_path / "r")
    assert m2["generation"] == 2 and m2["keys"] == m1["keys"] == m2["previous_keys"]

    # new samples: a new keys file; the previous one is kept, older ones are removed
    record(run, 2, [f"k{i:03d}" for i in range(40, 80)])
    compact(run)
    m3 = manifest(tmp_path / "r")
    assert m3["keys"].startswith("table/keys-000003-") and m3["previous_keys"] == m1["keys"]
    keys = table_keys_in_file(tmp_path / "r", m3)
    assert keys.column("key").to_pylist() == pq.read_table(tmp_path / "r" / m3["table"]).column("key").to_pylist()
    assert keys.num_rows == 80
    record(run, 3, [f"k{i:03d}" for i in range(80, 90)])
    compact(run)
    m4 = manifest(tmp_path / "r")
    assert sorted(os.listdir(tmp_path / "r/table")) == sorted(
        ["manifest.json", *(p.split("/")[1] for p in (m4["table"], m4["previous_table"], m4["keys"], m3["keys"]))]
    )


def test_plans_from_the_keys_file_match_plans_of_a_table_without_one(tmp_path):
    keys = [f"k{i:03d}" for i in range(120)]
    runs = []
    for name in ("with", "without"):
        run = RunDir(tmp_path / name, create=True)
        record(run, 0, keys)
        compact(run)
        runs.append(run)
    # a table written before keys files existed: no "keys" in its manifest
    m = manifest(tmp_path / "without")
    os.remove(tmp_path / "without" / m.pop("keys"))
    m.pop("previous_keys")
    (tmp_path / "without/table/manifest.json").write_text(json.dumps(m))
    assert load_table_keys(runs[1]) is None

    for run in runs:
        plan_epoch(run, 1, **SETA)
    a, b = (load_plan(run, 1) for run in runs)
    assert a.equals(b)
    for name in ("with", "without"):
        assert (tmp_path / name / "plans/epoch=1/stage.arrow").read_bytes() == (
            tmp_path / "with/plans/epoch=1/stage.arrow"
        ).read_bytes()


def test_keys_file_that_does_not_match_the_table_is_not_used(tmp_path):
    run = RunDir(tmp_path / "r", create=True)
    record(run, 0, [f"k{i:03d}" for i in range(30)])
    compact(run)
    m = manifest(tmp_path / "r")
    table_keys = pq.read_table(tmp_path / "r" / m["table"]).column("key").to_pylist()
    assert load_table_keys(run).to_pylist() == table_keys and sorted(table_keys) == [f"k{i:03d}" for i in range(30)]
    with pa.OSFile(str(tmp_path / "r" / m["keys"]), "wb") as sink, pa.ipc.new_file(sink, KEYS_SCHEMA) as w:
        w.write_table(pa.table({"key": ["only", "two"]}, schema=KEYS_SCHEMA))
    assert load_table_keys(run) is None  # 2 rows, the table has 30: the table's own keys are read
    plan_epoch(run, 1, **SETA)
    assert (
        load_plan(run, 1).column("key").to_pylist()
        == pq.read_table(tmp_path / "r" / m["table"]).column("key").to_pylist()
    )
    (tmp_path / "r" / m["keys"]).write_bytes(b"not arrow")
    assert load_table_keys(run) is None


@pytest.mark.parametrize("scheme", ["memory"])
def test_keys_file_on_fsspec_storage(tmp_path, scheme):
    url = f"{scheme}://keys-file-{os.getpid()}"
    run = RunDir(url, create=True)
    record(run, 0, [f"k{i:03d}" for i in range(40)])
    compact(run)
    m = run.read_json("table/manifest.json")
    assert run.exists(m["keys"])
    plan_epoch(run, 1, **SETA)
    assert load_plan(run, 1).column("key").to_pylist() == run.read_arrow(m["keys"]).column("key").to_pylist()
