"""LossRecorder: validation, dtypes, parts on disk, atexit flush, shard naming."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pyarrow.parquet as pq
import pytest

from seta_stream import RunDir, compact, load_table
from seta_stream.errors import InvalidInputError
from seta_stream.ids import sample_uid
from seta_stream.testing import LossRecorder

torch = pytest.importorskip("torch")  # the recorder's torch inputs (dtypes, devices, shapes)


def parts(run_dir):
    return sorted(p for p in run_dir.rglob("part-*.parquet"))


def test_parts_have_the_documented_schema_and_rows(tmp_path):
    rec = LossRecorder(tmp_path / "r", rank=3, epoch=2, flush_rows=4)
    rec.record(["a", "b"], ["/d/s0.tar", "/d/s0.tar"], torch.tensor([0.5, 1.5]))
    rec.record(["a", "c"], ["/d/s1.tar", "/d/s1.tar"], np.array([2.5, 3.5], dtype=np.float32))
    (part,) = parts(tmp_path / "r")
    assert part.parent.as_posix().endswith("losses/rank=3/epoch=2")
    t = pq.read_table(part)
    assert t.schema.names == ["shard", "key", "uid", "loss", "epoch", "rank", "seq"]
    assert [str(f.type) for f in t.schema] == ["string", "string", "uint64", "float", "int32", "int32", "int64"]
    assert t.schema.metadata[b"seta_stream.format_version"] == b"1"
    assert t.column("shard").to_pylist() == ["s0.tar", "s0.tar", "s1.tar", "s1.tar"]
    assert t.column("key").to_pylist() == ["a", "b", "a", "c"]
    assert t.column("loss").to_pylist() == [0.5, 1.5, 2.5, 3.5]
    assert t.column("uid").to_pylist() == [
        sample_uid("s0.tar", "a"),
        sample_uid("s0.tar", "b"),
        sample_uid("s1.tar", "a"),
        sample_uid("s1.tar", "c"),
    ]
    seq = t.column("seq").to_pylist()
    assert seq == list(range(seq[0], seq[0] + 4))
    assert rec.stats == {"records": 4, "nonfinite": 0, "parts": 1}
    rec.close()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_low_precision_losses_land_on_the_right_keys_at_large_sizes(tmp_path, dtype):
    # the reference implementation rounds sample *indices* in fp16/bf16; ids here are strings
    n = 70_001
    keys = [f"k{i:06d}" for i in range(n)]
    values = torch.arange(n, dtype=torch.float32) % 7 + 0.5  # exactly representable in bf16
    with LossRecorder(tmp_path / "r", flush_rows=30_000) as rec:
        for lo in range(0, n, 4096):
            rec.record(keys[lo : lo + 4096], ["/x/s.tar"] * len(keys[lo : lo + 4096]), values[lo : lo + 4096].to(dtype))
    compact(tmp_path / "r")
    t = load_table(tmp_path / "r").sort_by("key")
    assert t.num_rows == n
    assert t.column("key").to_pylist() == keys
    assert np.array_equal(t.column("last_loss").to_numpy(), values.numpy())


def test_nonfinite_losses_are_stored_as_nan_and_counted(tmp_path):
    with LossRecorder(tmp_path / "r") as rec:
        rec.record(["a", "b", "c"], ["s.tar"] * 3, torch.tensor([1.0, float("inf"), float("nan")]))
        rec.flush()
        assert rec.stats["nonfinite"] == 2
    report = compact(tmp_path / "r")
    assert report.nonfinite == 2
    rows = {r["key"]: r for r in load_table(tmp_path / "r").to_pylist()}
    assert rows["a"]["last_loss"] == 1.0 and rows["a"]["nonfinite"] == 0
    assert np.isnan(rows["b"]["last_loss"]) and rows["b"]["nonfinite"] == 1
    assert np.isnan(rows["c"]["last_loss"]) and rows["c"]["seen"] == 1


@pytest.mark.parametrize(
    ("keys", "urls", "loss", "message"),
    [
        (["a", "b"], ["s.tar"], torch.zeros(2), "batch has 2 keys, 1 urls and 2 losses"),
        (["a", "b"], ["s.tar"] * 2, torch.zeros(3), "batch has 2 keys, 2 urls and 3 losses"),
        (
            ["a", "b"],
            ["s.tar"] * 2,
            torch.tensor(1.0),
            r"loss has shape \(\); expected one value per sample.*reduction='none'",
        ),
        (["a", "b"], ["s.tar"] * 2, torch.zeros(2, 5), r"loss has shape \(2, 5\)"),
        (["a", "b"], ["s.tar"] * 2, torch.zeros(2, dtype=torch.long), "loss tensor has dtype torch.int64"),
        (["a", "b"], ["s.tar"] * 2, [0.1, 0.2], "loss is a list; expected a torch tensor or numpy array"),
        ([1, 2], ["s.tar"] * 2, torch.zeros(2), "keys and urls must be strings, found int and str"),
        (["a", None], ["s.tar"] * 2, torch.zeros(2), "keys and urls must be strings, found NoneType and str"),
        (["a", "b"], ["s.tar", b"t.tar"], torch.zeros(2), "keys and urls must be strings, found str and bytes"),
        (("a", "b"), ("s.tar",) * 2, np.zeros((1, 2)), r"loss has shape \(1, 2\)"),
    ],
)
def test_bad_batches_are_rejected_with_a_clear_message(tmp_path, keys, urls, loss, message):
    rec = LossRecorder(tmp_path / "r")
    with pytest.raises(InvalidInputError, match=message):
        rec.record(keys, urls, loss)
    rec.close()
    assert parts(tmp_path / "r") == []


def test_loss_of_shape_batch_by_one_is_accepted(tmp_path):
    with LossRecorder(tmp_path / "r") as rec:
        rec.record(["a", "b"], ["s.tar"] * 2, torch.tensor([[1.0], [2.0]]))
    compact(tmp_path / "r")
    assert sorted(load_table(tmp_path / "r").column("last_loss").to_pylist()) == [1.0, 2.0]


def test_same_file_name_in_two_folders_is_an_error_unless_shard_depth_is_raised(tmp_path):
    rec = LossRecorder(tmp_path / "r")
    rec.record(["a"], ["/data/train/s-000.tar"], torch.zeros(1))
    with pytest.raises(InvalidInputError, match=r"two shards have the same name 's-000.tar'.*larger shard_depth"):
        rec.record(["a"], ["/data/extra/s-000.tar"], torch.zeros(1))
    rec.close()  # the rejected batch is not buffered; the earlier one is written
    compact(tmp_path / "r")
    assert load_table(tmp_path / "r", shard_as_dictionary=False).column("shard").to_pylist() == ["s-000.tar"]
    RunDir(tmp_path / "r2", create=True, settings={"shard_depth": 2})
    with LossRecorder(tmp_path / "r2") as rec2:
        rec2.record(["a", "a"], ["/data/train/s-000.tar", "/data/extra/s-000.tar"], torch.tensor([1.0, 2.0]))
    compact(tmp_path / "r2")
    assert sorted(load_table(tmp_path / "r2").column("shard").to_pylist()) == ["extra/s-000.tar", "train/s-000.tar"]


def test_parts_are_lz4_with_a_dictionary_shard_column_and_seq_grows_across_recorders(tmp_path):
    seqs = []
    for _ in range(3):  # a restarted training opens a new recorder for the same rank
        with LossRecorder(tmp_path / "r", rank=1) as rec:
            rec.record(["a", "b"], ["s.tar"] * 2, torch.zeros(2))
        (newest,) = [p for p in parts(tmp_path / "r") if p not in {q for q, _ in seqs}]
        seqs.append((newest, pq.read_table(newest).column("seq").to_pylist()))
    flat = [s for _, ss in seqs for s in ss]
    assert flat == sorted(flat) and len(set(flat)) == 6
    meta = pq.ParquetFile(seqs[0][0]).metadata.row_group(0)
    assert meta.column(3).compression in ("LZ4", "LZ4_RAW")
    assert seqs[0][0].name.startswith("part-R00001-E000000-") and seqs[0][0].name.split("-")[3] == f"{flat[0]:020d}"


def test_losses_on_another_device_and_dtype_mix(tmp_path):
    with LossRecorder(tmp_path / "r", flush_rows=3) as rec:
        rec.record(["a"], ["s.tar"], torch.tensor([1.5], dtype=torch.float16))
        rec.record(["b"], ["s.tar"], np.array([2.5], dtype=np.float64))
        rec.record(["c"], ["s.tar"], torch.tensor([[3.5]], dtype=torch.bfloat16, requires_grad=True))
    compact(tmp_path / "r")
    rows = dict(zip(*load_table(tmp_path / "r").select(["key", "last_loss"]).to_pydict().values()))
    assert rows == {"a": 1.5, "b": 2.5, "c": 3.5}


def test_set_epoch_flushes_previous_epoch(tmp_path):
    rec = LossRecorder(tmp_path / "r", flush_rows=1000)
    rec.record(["a"], ["s.tar"], torch.tensor([1.0]))
    rec.set_epoch(1)
    rec.record(["a"], ["s.tar"], torch.tensor([2.0]))
    rec.close()
    assert [p.parent.name for p in parts(tmp_path / "r")] == ["epoch=0", "epoch=1"]
    compact(tmp_path / "r")
    (row,) = load_table(tmp_path / "r").to_pylist()
    assert (row["last_loss"], row["last_epoch"], row["seen"]) == (2.0, 1, 2)


def test_normal_exit_without_close_lands_the_buffer(tmp_path):
    code = (
        "import torch; from seta_stream.testing import LossRecorder\n"
        f"r = LossRecorder({str(tmp_path / 'r')!r}, flush_rows=10**6)\n"
        "r.record(['a', 'b'], ['s.tar', 's.tar'], torch.tensor([1.0, 2.0]))\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
    compact(tmp_path / "r")
    assert sorted(load_table(tmp_path / "r").column("key").to_pylist()) == ["a", "b"]


def test_sigkill_loses_only_the_unflushed_buffer(tmp_path):
    code = (
        "import os, signal, torch; from seta_stream.testing import LossRecorder\n"
        f"r = LossRecorder({str(tmp_path / 'r')!r}, flush_rows=4)\n"
        "for i in range(5):\n"
        "    r.record([f'k{2*i}', f'k{2*i+1}'], ['s.tar'] * 2, torch.tensor([1.0, 2.0]))\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code])
    assert proc.returncode == -9
    compact(tmp_path / "r")
    # flushed at 4 and 8 records; the 10th and 9th were in the buffer
    assert sorted(load_table(tmp_path / "r").column("key").to_pylist()) == sorted(f"k{i}" for i in range(8))
    report = compact(tmp_path / "r")
    assert report.parts_folded == 0


def test_recorder_dropped_without_close_lands_its_buffer(tmp_path):
    import gc

    def train_one_epoch():
        rec = LossRecorder(tmp_path / "r", flush_rows=1000)
        rec.record(["a", "b"], ["s.tar"] * 2, torch.tensor([1.0, 2.0]))

    train_one_epoch()
    gc.collect()
    assert len(parts(tmp_path / "r")) == 1
    compact(tmp_path / "r")
    assert sorted(load_table(tmp_path / "r").column("key").to_pylist()) == ["a", "b"]
